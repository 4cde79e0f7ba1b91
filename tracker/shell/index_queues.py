"""Writing Kueue's queues and pending runs' positions to the experiment index (tables ``queues`` and
``queue_positions``, ``schemas/index/README.md``). Newest wins in SQL too: a queue's row is replaced only by a version
with a larger resourceVersion (or its deletion), a position only by a later poll, so writing the same or older
states again, in any order, changes nothing."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from tracker.core.model import iso
from tracker.core.queues import QueuePosition, QueueState

_QUEUE_COLUMNS = ("key", "kind", "namespace", "name", "uid", "resource_version", "updated_at", "cluster_queue",
                  "cohort", "stop_policy", "stopped", "active", "active_reason", "active_message", "pending",
                  "reserving", "admitted", "admission_checks", "resources", "deleted")
_QUEUE_UPSERT = (
    f"INSERT INTO queues ({', '.join(_QUEUE_COLUMNS)}) VALUES ({', '.join('?' * len(_QUEUE_COLUMNS))}) "
    f"ON CONFLICT (key) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in _QUEUE_COLUMNS[1:])} "
    "WHERE (excluded.resource_version IS NULL OR queues.resource_version IS NULL "
    "OR excluded.resource_version > queues.resource_version "
    "OR (excluded.resource_version = queues.resource_version AND excluded.deleted > queues.deleted)) "
    f"AND ({' OR '.join(f'excluded.{c} IS NOT queues.{c}' for c in _QUEUE_COLUMNS[1:])})")
_POSITION_COLUMNS = ("run_id", "namespace", "workload", "cluster_queue", "local_queue", "position_in_cluster_queue",
                     "position_in_local_queue", "polled_at", "polled_us")
_POSITION_UPSERT = (
    f"INSERT INTO queue_positions ({', '.join(_POSITION_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_POSITION_COLUMNS))}) "
    f"ON CONFLICT (run_id) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in _POSITION_COLUMNS[1:])} "
    "WHERE excluded.polled_us > queue_positions.polled_us")


def queue_row(q: QueueState) -> tuple[object, ...]:
    return (q.key, q.kind, q.namespace, q.name, q.uid, q.resource_version, iso(q.updated_at), q.cluster_queue,
            q.cohort, q.stop_policy, int(q.stopped), None if q.active is None else int(q.active), q.active_reason,
            q.active_message, q.pending, q.reserving, q.admitted,
            json.dumps(list(q.admission_checks), separators=(",", ":")),
            json.dumps([r.to_json() for r in q.resources], separators=(",", ":")), int(q.deleted))


def position_row(p: QueuePosition) -> tuple[object, ...]:
    return (p.run_id, p.namespace, p.workload, p.cluster_queue, p.local_queue, p.position_in_cluster_queue,
            p.position_in_local_queue, iso(p.polled_at), p.polled_at)


def write(conn: sqlite3.Connection, queues: Sequence[QueueState], positions: Sequence[QueuePosition]) -> int:
    """Upsert newest-wins, inside the caller's transaction; the number of rows inserted or updated."""
    changed = 0
    for q in queues:
        changed += conn.execute(_QUEUE_UPSERT, queue_row(q)).rowcount
    for p in positions:
        changed += conn.execute(_POSITION_UPSERT, position_row(p)).rowcount
    return changed
