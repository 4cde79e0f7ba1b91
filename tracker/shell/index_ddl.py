"""DDL of the experiment index's migrations kept apart from ``tracker.shell.index_schema`` (which holds its
migrations in order, its version and its opening-time checks, and would outgrow a module's size with them): each
constant is the text of one migration, named there. Standard library only, as ``index_schema`` is: the readers'
slow path opens an index through it without loading the tracker's models."""

NODES = """\

-- Nodes (schema 12, issue 28; schemas/index/README.md, "Nodes"): the newest version of each Node runs' pods ran on,
-- by resourceVersion; a deleted node keeps its row with deleted = 1, so that a late older version does not revive
-- it. No foreign keys: nodes are no part of a run (pod_placements.node names them).
CREATE TABLE nodes (
    name             TEXT PRIMARY KEY, -- metadata.name (pod_placements.node)
    uid              TEXT NOT NULL,
    resource_version INTEGER, -- of the version the row is from (NULL when not an integer: last written wins)
    created_at       TEXT,
    updated_at       TEXT, -- the object's latest time: creation, a condition's lastTransitionTime, deletion
    gpu_product      TEXT, -- label nvidia.com/gpu.product, else amd.com/gpu.product
    gpu_count        INTEGER, -- label nvidia.com/gpu.count, else the sum of its accelerator capacity
    gpu_memory_mib   INTEGER, -- label nvidia.com/gpu.memory (per GPU)
    instance_type    TEXT, -- label node.kubernetes.io/instance-type
    zone             TEXT, -- label topology.kubernetes.io/zone
    agent_pool       TEXT, -- label kubernetes.azure.com/agentpool
    ready            INTEGER CHECK (ready IN (0, 1)), -- the Ready condition (NULL: none, or Unknown)
    ready_since      TEXT, -- the Ready condition's lastTransitionTime
    unschedulable    INTEGER NOT NULL CHECK (unschedulable IN (0, 1)), -- spec.unschedulable: cordoned
    labels           TEXT NOT NULL, -- JSON object: the labels kept (tracker.core.nodes.NODE_LABELS)
    capacity         TEXT NOT NULL, -- JSON object: accelerator resource -> quantity
    allocatable      TEXT NOT NULL, -- JSON object: accelerator resource -> quantity
    conditions       TEXT NOT NULL, -- JSON array of {type, status, reason, message, since}
    taints           TEXT NOT NULL, -- JSON array of [key, effect]
    deleted          INTEGER NOT NULL CHECK (deleted IN (0, 1)),
    deleted_at       TEXT -- metadata.deletionTimestamp, when it had one
) WITHOUT ROWID;
CREATE INDEX nodes_by_gpu_product ON nodes (gpu_product);
"""
