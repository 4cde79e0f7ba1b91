-- TauGrid experiment index, schema version 12.
-- The contract Stellar reads: every table and column is documented in README.md next to this file.
-- Times are ISO-8601 UTC text, 'YYYY-MM-DDTHH:MM:SSZ' ('YYYY-MM-DDTHH:MM:SS.ffffffZ' when sub-second).
-- JSON columns hold compact JSON text (query them with json_each / json_extract).

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    kind             TEXT,
    namespace        TEXT,
    name             TEXT,
    uid              TEXT,
    project          TEXT,
    workspace        TEXT,
    target           TEXT,
    queue            TEXT,
    cluster_queue    TEXT,
    status           TEXT NOT NULL
        CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'stopped')),
    reason           TEXT,
    message          TEXT NOT NULL,
    phase            TEXT NOT NULL
        CHECK (phase IN ('Resolution', 'Rendering', 'Admission', 'Scheduling', 'Runtime', 'Progress',
                         'Completion')),
    attempts         INTEGER NOT NULL,
    retries          INTEGER NOT NULL,
    evictions        INTEGER NOT NULL,
    created_at       TEXT,
    queued_at        TEXT,
    admitted_at      TEXT,
    started_at       TEXT,
    finished_at      TEXT,
    admission_wait_s REAL,
    pending_reason   TEXT,
    pending_message  TEXT NOT NULL,
    git_commit       TEXT,
    config_digest    TEXT,
    config_ref       TEXT,
    input_refs       TEXT NOT NULL, -- JSON array of strings
    output_uri       TEXT,
    resume_of        TEXT,
    last_checkpoint  TEXT,
    updated_seq      INTEGER NOT NULL
);
CREATE INDEX runs_by_status ON runs (status, phase, queued_at);
CREATE INDEX runs_by_phase ON runs (phase);
CREATE INDEX runs_by_queued_at ON runs (queued_at);
CREATE INDEX runs_by_created_at ON runs (created_at);
CREATE INDEX runs_by_workspace ON runs (workspace, project);
CREATE INDEX runs_by_project ON runs (project);
CREATE INDEX runs_by_config ON runs (config_digest);
CREATE INDEX runs_by_git_commit ON runs (git_commit);
CREATE INDEX runs_by_updated_seq ON runs (updated_seq);

CREATE TABLE transitions (
    run_id  TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL CHECK (attempt >= 1),
    phase   TEXT NOT NULL
        CHECK (phase IN ('Resolution', 'Rendering', 'Admission', 'Scheduling', 'Runtime', 'Progress',
                         'Completion')),
    at      TEXT NOT NULL,
    reason  TEXT NOT NULL,
    message TEXT NOT NULL,
    source  TEXT NOT NULL,
    ordinal INTEGER NOT NULL, -- position in the run's timeline, 0-based
    PRIMARY KEY (run_id, attempt, phase)
) WITHOUT ROWID;

CREATE TABLE attempts (
    run_id           TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    attempt          INTEGER NOT NULL CHECK (attempt >= 1),
    "trigger"        TEXT NOT NULL,
    queued_at        TEXT,
    admitted_at      TEXT,
    scheduled_at     TEXT,
    started_at       TEXT,
    progress_at      TEXT,
    ended_at         TEXT,
    end_reason       TEXT,
    end_message      TEXT NOT NULL,
    underlying_cause TEXT,
    admission_wait_s REAL,
    cluster_queue    TEXT,
    ray_cluster      TEXT,
    retries          INTEGER NOT NULL CHECK (retries >= 0),
    failures         TEXT NOT NULL, -- JSON array of {pod, at, reason, exit_code, message}
    pods             TEXT NOT NULL, -- JSON array of {pod, node, created_at, scheduled_at, finished_at}
    PRIMARY KEY (run_id, attempt)
) WITHOUT ROWID;

CREATE TABLE metric_summaries (
    run_id       TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    metric       TEXT NOT NULL,
    first_step   INTEGER NOT NULL,
    first_value  REAL, -- NULL only when the value is NaN
    latest_step  INTEGER NOT NULL,
    latest_value REAL, -- NULL only when the value is NaN
    min_value    REAL, -- NULL only when the value is NaN
    max_value    REAL, -- NULL only when the value is NaN
    points       INTEGER NOT NULL,
    PRIMARY KEY (run_id, metric)
) WITHOUT ROWID;
CREATE INDEX metric_summaries_by_metric ON metric_summaries (metric);

CREATE TABLE resume_links (
    run_id    TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    resume_of TEXT NOT NULL,
    PRIMARY KEY (run_id, resume_of)
) WITHOUT ROWID;
CREATE INDEX resume_links_by_resume_of ON resume_links (resume_of);

CREATE TABLE pod_placements (
    run_id       TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    pod          TEXT NOT NULL,
    node         TEXT,
    created_at   TEXT,
    scheduled_at TEXT,
    finished_at  TEXT,
    PRIMARY KEY (run_id, attempt, pod),
    FOREIGN KEY (run_id, attempt) REFERENCES attempts (run_id, attempt) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE INDEX pod_placements_by_node ON pod_placements (node, scheduled_at);
CREATE INDEX pod_placements_by_pod ON pod_placements (pod);

CREATE TABLE consumer_offsets (
    consumer_group TEXT NOT NULL,
    topic          TEXT NOT NULL,
    "partition"    INTEGER NOT NULL CHECK ("partition" >= 0),
    next_offset    INTEGER NOT NULL CHECK (next_offset >= 0),
    PRIMARY KEY (consumer_group, topic, "partition")
) WITHOUT ROWID;

-- The tracker's own state, not part of what readers use: the reducer's facts of each run (zlib-compressed JSON)
-- and the records still waiting for their owner object, written in the same transaction as the rows above so
-- that a later replay into this index continues from them instead of replacing the histories.
CREATE TABLE reducer_runs (
    run_id TEXT PRIMARY KEY,
    state  BLOB NOT NULL
) WITHOUT ROWID;

CREATE TABLE reducer_held (
    seq    INTEGER PRIMARY KEY, -- arrival order among held records
    owner  TEXT NOT NULL,       -- the uid of the owner object the record waits for
    record BLOB NOT NULL
);

-- Retirement: the reducer frees the facts of a finished run once the event time is well past its last record,
-- and its row here becomes a marker with the retirement's ordinal. The markers are the lasting memory of which
-- runs ended (the reducer remembers the latest ones only): a record that arrives for a run after it was
-- forgotten never replaces its history.
ALTER TABLE reducer_runs ADD COLUMN retired_seq INTEGER; -- the retirement ordinal of a retired run, else NULL

CREATE INDEX reducer_runs_by_retired_seq ON reducer_runs (retired_seq) WHERE retired_seq IS NOT NULL;

-- GPU accounting (schemas/gpu-accounting.md): GPUs, GPU-hours held and lost, per run, attempt and pod. Rows
-- written before version 4 read 0 until their run is written again (a replay of its captures rewrites it).
ALTER TABLE runs ADD COLUMN gpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN gpu_hours REAL NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN lost_gpu_hours REAL NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN lost_gpu_hours_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: reason -> GPU-hours
ALTER TABLE runs ADD COLUMN gpus_open INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN open_since TEXT;
ALTER TABLE attempts ADD COLUMN gpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN gpu_hours REAL NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN lost_gpu_hours REAL NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN lost_gpu_hours_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: reason -> GPU-hours
ALTER TABLE attempts ADD COLUMN gpus_open INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN open_since TEXT;
ALTER TABLE pod_placements ADD COLUMN gpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pod_placements ADD COLUMN released_at TEXT;
ALTER TABLE pod_placements ADD COLUMN gpu_hours REAL; -- NULL while the pod holds its GPUs
ALTER TABLE pod_placements ADD COLUMN lost TEXT;
CREATE INDEX runs_by_lost_gpu_hours ON runs (lost_gpu_hours);

-- Metric history (schemas/index/README.md, "Metric points"): each run's metric points, bounded and downsampled,
-- replaced with the run's other rows. Runs written before version 5 have none until they are written again.
CREATE TABLE metric_points (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    metric TEXT NOT NULL,
    step   INTEGER NOT NULL,
    value  REAL NOT NULL,
    at     TEXT NOT NULL, -- the time of the progress event that reported the point
    PRIMARY KEY (run_id, metric, step)
) WITHOUT ROWID;
CREATE INDEX metric_points_by_metric ON metric_points (metric, run_id);

-- Which index this is: meta also holds created_at (below), tracker_version (the tracker that last opened it for
-- writing), and cluster and workspace when the writer is configured with them (TRACKER_INDEX__CLUSTER, ...).
INSERT INTO meta (key, value) VALUES ('created_at', strftime('%Y-%m-%dT%H:%M:%SZ', 'now'))
    ON CONFLICT (key) DO NOTHING;

-- Bounded writes (schema 6): each pod is a row of its own, keyed by its uid and written when it changes, so that a
-- change of one pod of a wide run rewrites that row only. Rows written before version 6 keep 'v5:<attempt>:<pod>'
-- as uid until their run is written again. attempts.pods (every pod of the attempt as JSON) is gone: the attempt's
-- pods are the pod_placements rows with its number, and attempts.pod_count counts them. A run's pods and metric
-- points are written apart from its history (on the transitions topic they are records of their own), so their rows
-- no longer reference runs: an index built from a compacted topic may hold them before the run's row.
CREATE TABLE pod_placements_v6 (
    run_id       TEXT NOT NULL, -- no foreign key: built from a compacted topic, a pod may come before its run
    uid          TEXT NOT NULL, -- the pod's metadata.uid
    namespace    TEXT, -- the run's
    attempt      INTEGER NOT NULL CHECK (attempt >= 1),
    pod          TEXT NOT NULL,
    node         TEXT,
    created_at   TEXT,
    scheduled_at TEXT,
    finished_at  TEXT,
    gpus         INTEGER NOT NULL DEFAULT 0,
    released_at  TEXT,
    gpu_hours    REAL, -- NULL while the pod holds its GPUs
    lost         TEXT,
    PRIMARY KEY (run_id, uid)
) WITHOUT ROWID;
INSERT INTO pod_placements_v6 (run_id, uid, namespace, attempt, pod, node, created_at, scheduled_at, finished_at,
                               gpus, released_at, gpu_hours, lost)
    SELECT p.run_id, 'v5:' || p.attempt || ':' || p.pod, r.namespace, p.attempt, p.pod, p.node, p.created_at,
           p.scheduled_at, p.finished_at, p.gpus, p.released_at, p.gpu_hours, p.lost
    FROM pod_placements p JOIN runs r ON r.run_id = p.run_id;
DROP TABLE pod_placements;
ALTER TABLE pod_placements_v6 RENAME TO pod_placements;
CREATE INDEX pod_placements_by_attempt ON pod_placements (run_id, attempt);
CREATE INDEX pod_placements_by_node ON pod_placements (node, scheduled_at);
CREATE INDEX pod_placements_by_pod ON pod_placements (pod);
ALTER TABLE attempts ADD COLUMN pod_count INTEGER NOT NULL DEFAULT 0; -- its pods (pod_placements rows)
ALTER TABLE attempts ADD COLUMN failed_pods INTEGER NOT NULL DEFAULT 0; -- its failed pods (failures lists <= 64)
UPDATE attempts SET pod_count = json_array_length(pods), failed_pods = json_array_length(failures);
ALTER TABLE attempts DROP COLUMN pods;
CREATE TABLE metric_points_v6 (
    run_id TEXT NOT NULL, -- no foreign key, as pod_placements
    metric TEXT NOT NULL,
    step   INTEGER NOT NULL,
    value  REAL NOT NULL,
    at     TEXT NOT NULL, -- the time of the progress event that reported the point
    PRIMARY KEY (run_id, metric, step)
) WITHOUT ROWID;
INSERT INTO metric_points_v6 (run_id, metric, step, value, at)
    SELECT run_id, metric, step, value, at FROM metric_points;
DROP TABLE metric_points;
ALTER TABLE metric_points_v6 RENAME TO metric_points;
CREATE INDEX metric_points_by_metric ON metric_points (metric, run_id);

-- The reducer's state of each pod, apart from its run's (reducer_runs): zlib-compressed JSON.
CREATE TABLE reducer_pods (
    run_id TEXT NOT NULL,
    uid    TEXT NOT NULL,
    state  BLOB NOT NULL,
    PRIMARY KEY (run_id, uid)
) WITHOUT ROWID;

-- Admission in steps and every pending second explained (schema 7, history/v3; README "Every pending second"):
-- Admission lasts until Kueue's Admitted=True; the quota reservation and each admission check's states are its
-- steps, and each attempt's time before its application started is split into categories. Rows written before
-- version 7 read the defaults until their run is written again (a replay of its captures rewrites it).
ALTER TABLE runs ADD COLUMN pending_s_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: category -> seconds (ended spans)
ALTER TABLE runs ADD COLUMN pending_category TEXT; -- the category of the span still going on (from pending_since)
ALTER TABLE runs ADD COLUMN pending_since TEXT;
ALTER TABLE runs ADD COLUMN quota_reserved_at TEXT;
ALTER TABLE attempts ADD COLUMN quota_reserved_at TEXT;
ALTER TABLE attempts ADD COLUMN admission_steps TEXT NOT NULL DEFAULT '[]'; -- JSON array of steps
ALTER TABLE attempts ADD COLUMN pending TEXT NOT NULL DEFAULT '[]'; -- JSON array of {category, detail, start, end}
ALTER TABLE attempts ADD COLUMN pending_s_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: category -> seconds

-- Kueue's queues (schemas/index/README.md, "Queues"): the newest version of each ClusterQueue and LocalQueue, by
-- resourceVersion; a deleted queue keeps its row with deleted = 1, so that a late older version does not revive it.
CREATE TABLE queues (
    key              TEXT PRIMARY KEY, -- 'queue:<ClusterQueue>' or 'queue:<namespace>/<LocalQueue>'
    kind             TEXT NOT NULL CHECK (kind IN ('ClusterQueue', 'LocalQueue')),
    namespace        TEXT, -- a LocalQueue's
    name             TEXT NOT NULL,
    uid              TEXT NOT NULL,
    resource_version INTEGER, -- of the version the row is from (NULL when not an integer: last written wins)
    updated_at       TEXT, -- the object's latest time: its creation or a condition's lastTransitionTime
    cluster_queue    TEXT, -- a ClusterQueue's own name; a LocalQueue's spec.clusterQueue
    cohort           TEXT,
    stop_policy      TEXT, -- spec.stopPolicy: None, Hold, HoldAndDrain
    stopped          INTEGER NOT NULL CHECK (stopped IN (0, 1)), -- stopPolicy not None, or Active=False/Stopped
    active           INTEGER CHECK (active IN (0, 1)), -- the Active condition (NULL: none)
    active_reason    TEXT NOT NULL,
    active_message   TEXT NOT NULL,
    pending          INTEGER NOT NULL, -- status.pendingWorkloads
    reserving        INTEGER NOT NULL, -- status.reservingWorkloads
    admitted         INTEGER NOT NULL, -- status.admittedWorkloads
    admission_checks TEXT NOT NULL, -- JSON array of the admission checks a ClusterQueue names
    resources        TEXT NOT NULL, -- JSON array of {flavor, resource, nominal, borrowing_limit, reserved, used}
    deleted          INTEGER NOT NULL CHECK (deleted IN (0, 1))
) WITHOUT ROWID;
CREATE INDEX queues_by_cluster_queue ON queues (cluster_queue);

-- Each pending run's place in its queues at the latest poll of Kueue's visibility API (newest poll wins); NULL
-- positions: the run was listed at a previous poll and no longer is.
CREATE TABLE queue_positions (
    run_id                    TEXT PRIMARY KEY, -- no foreign key: a position may come before its run's row
    namespace                 TEXT NOT NULL,
    workload                  TEXT NOT NULL, -- the Workload's name
    cluster_queue             TEXT NOT NULL,
    local_queue               TEXT,
    position_in_cluster_queue INTEGER,
    position_in_local_queue   INTEGER,
    polled_at                 TEXT NOT NULL, -- the poll's time, as the watcher recorded it
    polled_us                 INTEGER NOT NULL -- the same in microseconds since the epoch (ordering)
) WITHOUT ROWID;

-- The goodput ledger (schema 8, history/v4; schemas/goodput.md): where each run's and attempt's time and GPU-time
-- went, by category, its ETTR and goodput, and the run's checkpoints and ledger spans. Rows written before version 8
-- read the defaults (an accounting ledger with nothing in it) until their run is written again.
ALTER TABLE runs ADD COLUMN ledger_basis TEXT NOT NULL DEFAULT 'accounting'
    CHECK (ledger_basis IN ('progress', 'accounting'));
ALTER TABLE runs ADD COLUMN ledger_gpu_hours_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: category -> GPU-hours
ALTER TABLE runs ADD COLUMN ledger_wall_s_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: category -> seconds
ALTER TABLE runs ADD COLUMN ledger_until TEXT; -- the open pods' GPU-time is in the ledger up to this time
ALTER TABLE runs ADD COLUMN ledger_open TEXT; -- the category the run is in at ledger_until while it goes on
ALTER TABLE runs ADD COLUMN ettr REAL;
ALTER TABLE runs ADD COLUMN goodput REAL;
ALTER TABLE runs ADD COLUMN resumed_from TEXT; -- the checkpoint URI this run resumed from
ALTER TABLE runs ADD COLUMN checkpoints_saved INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN ledger_gpu_hours_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: category -> GPU-hours
ALTER TABLE attempts ADD COLUMN ledger_wall_s_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: category -> seconds

-- A run's checkpoint saves and restores, replaced with its history. Keyed by (run_id, kind, step, uri, started_at);
-- started_at is NULL for a save whose start was not reported (a v1 Progress event's checkpoint_uri), of which a run
-- has one per (step, uri): the key treats NULL as one value.
CREATE TABLE checkpoints (
    run_id     TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    kind       TEXT NOT NULL CHECK (kind IN ('save', 'restore')),
    step       INTEGER NOT NULL,
    uri        TEXT NOT NULL,
    started_at TEXT, -- NULL: the start was not reported
    ended_at   TEXT, -- completed or failed at; NULL: not reported yet
    status     TEXT NOT NULL CHECK (status IN ('started', 'completed', 'failed')),
    bytes      INTEGER,
    attempt    INTEGER -- the attempt it happened in
);
CREATE UNIQUE INDEX checkpoints_by_key ON checkpoints (run_id, kind, step, uri, ifnull(started_at, ''));
CREATE INDEX checkpoints_by_uri ON checkpoints (uri);

-- A run's wasted-progress, infrastructure-recovery and checkpoint-restore spans (for timelines), replaced with its
-- history.
CREATE TABLE ledger_spans (
    run_id   TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    category TEXT NOT NULL CHECK (category IN ('productive', 'scheduling', 'startup', 'checkpoint-save',
                                               'checkpoint-restore', 'wasted-progress', 'infrastructure-recovery',
                                               'unclassified')),
    start    TEXT NOT NULL,
    "end"    TEXT NOT NULL,
    PRIMARY KEY (run_id, category, start)
) WITHOUT ROWID;

-- Evictions by reason (schema 9, history/v5): the reducer's count of each run's Kueue evictions by reason (sums to
-- evictions). NULL in rows written before version 9 (the index keeps no history to derive it from): readers derive
-- it from the run's attempts rows until the run is written again.
ALTER TABLE runs ADD COLUMN evictions_by TEXT; -- JSON object: reason -> evictions; NULL: written before version 9

-- A run by the NAMESPACE/NAME of its Job or RayJob (schema 10): `tracker show`, `compare` and the web view find the
-- latest run of a root by its namespace and name without reading every run.
CREATE INDEX runs_by_name ON runs (namespace, name);

-- What ran (schema 11, history/v5 with optional fields; tracker.core.provenance): each run's container images, its
-- entrypoint and its hyperparameters. Rows written before version 11 read the defaults (nothing known) until their
-- run is written again.
ALTER TABLE runs ADD COLUMN images TEXT NOT NULL DEFAULT '[]'; -- JSON array of image references, in order
ALTER TABLE runs ADD COLUMN entrypoint TEXT; -- command and args joined shell-style, or a RayJob's entrypoint
ALTER TABLE runs ADD COLUMN hyperparameters TEXT NOT NULL DEFAULT '{}'; -- JSON object: name -> scalar (<= 64 names)
ALTER TABLE runs ADD COLUMN hyperparameters_omitted INTEGER NOT NULL DEFAULT 0; -- names left out past the first 64

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
