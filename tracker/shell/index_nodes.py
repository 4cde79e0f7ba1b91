"""Writing Nodes to the experiment index (table ``nodes``, ``schemas/index/README.md``). Newest wins in SQL too, as
for queues (``tracker.shell.index_queues``): a node's row is replaced only by a version with a larger
resourceVersion (or its deletion), so writing the same or older states again, in any order, changes nothing. The
table's DDL is ``tracker.shell.index_ddl.NODES``."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from tracker.core.model import iso
from tracker.core.nodes import LABEL_AGENT_POOL, LABEL_GPU_MEMORY, LABEL_INSTANCE_TYPE, LABEL_ZONE, NodeState

_COLUMNS = ("name", "uid", "resource_version", "created_at", "updated_at", "gpu_product", "gpu_count",
            "gpu_memory_mib", "instance_type", "zone", "agent_pool", "ready", "ready_since", "unschedulable", "labels",
            "capacity", "allocatable", "conditions", "taints", "deleted", "deleted_at")
_UPSERT = (
    f"INSERT INTO nodes ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))}) "
    f"ON CONFLICT (name) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in _COLUMNS[1:])} "
    "WHERE (excluded.resource_version IS NULL OR nodes.resource_version IS NULL "
    "OR excluded.resource_version > nodes.resource_version "
    "OR (excluded.resource_version = nodes.resource_version AND excluded.deleted > nodes.deleted)) "
    f"AND ({' OR '.join(f'excluded.{c} IS NOT nodes.{c}' for c in _COLUMNS[1:])})")


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() and len(text) < 19 else None


def node_row(n: NodeState) -> tuple[object, ...]:
    ready = n.condition("Ready")
    return (n.name, n.uid, n.resource_version, iso(n.created_at), iso(n.updated_at), n.gpu_product, n.gpu_count,
            _int(n.label(LABEL_GPU_MEMORY)), n.label(LABEL_INSTANCE_TYPE), n.label(LABEL_ZONE),
            n.label(LABEL_AGENT_POOL), None if n.ready is None else int(n.ready),
            None if ready is None else iso(ready.since), int(n.unschedulable), _json(dict(n.labels)),
            _json(dict(n.capacity)), _json(dict(n.allocatable)), _json([c.to_json() | {"since": iso(c.since)}
                                                                         for c in n.conditions]),
            _json([list(t) for t in n.taints]), int(n.deleted), iso(n.deleted_at))


def write(conn: sqlite3.Connection, nodes: Sequence[NodeState]) -> int:
    """Upsert newest-wins, inside the caller's transaction; the number of rows inserted or updated."""
    return sum(conn.execute(_UPSERT, node_row(n)).rowcount for n in nodes)
