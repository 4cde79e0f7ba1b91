"""A run's records on the ``run-state`` topic, as ``tracker reduce`` writes them and reads them back at a restore.

A run's state is its snapshot (``Reducer.snapshot_run(points_apart=True)``, snapshot version 4) keyed by its run id,
and apart from it a record per pod (``<run id>/pod/<uid>``), per metric point (``<run id>/point/<step>/<metric>``)
and per progress minute (``<run id>/minute/<minute>``: the report ids it remembers of it, its earliest report, its
step records), so that a change rewrites what it changed only; a tombstone deletes one (deploy/kafka/topics.md). The
keys and headers are ``tracker.core.wire``'s, the values ``tracker.core.snapshot``'s. A record that is not what its
key says is a StoredStateError naming the key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracker import errors
from tracker.core import wire
from tracker.core.snapshot import Minute, minute_of_state, minute_state, point_of_state, point_state
from tracker.shell import jsonio

Headers = tuple[tuple[str, bytes], ...]
Record = tuple[str, bytes, Headers]  # key, value, headers


def run_records(run_id: str, snap: dict[str, Any]) -> tuple[list[tuple[str, Headers]], list[Record]]:
    """The tombstones (key and headers) and the records of a run's snapshot kept apart: ``snap`` loses its parts
    (``pods``, ``points``, ``minutes`` and what was removed of them) and is the first record."""
    pods, removed = snap.pop("pods"), snap.pop("pods_removed")
    points, gone = snap.pop("points"), snap.pop("points_removed")
    minutes, minutes_gone = snap.pop("minutes"), snap.pop("minutes_removed")
    pod_h, point_h, minute_h = wire.POD_STATE_HEADERS, wire.POINT_STATE_HEADERS, wire.MINUTE_STATE_HEADERS
    tombs: list[tuple[str, Headers]] = [(wire.record_key(run_id, wire.POD, uid), pod_h) for uid in removed]
    tombs.extend((wire.point_key(run_id, metric, step), point_h) for metric, step in gone)
    tombs.extend((wire.minute_key(run_id, minute), minute_h) for minute in minutes_gone)
    out: list[Record] = [(run_id, jsonio.dumps(snap), ())]
    out.extend((wire.record_key(run_id, wire.POD, uid), jsonio.dumps(doc), pod_h) for uid, doc in pods.items())
    out.extend((wire.point_key(run_id, metric, step), jsonio.dumps(point_state(run_id, value, at)), point_h)
               for metric, pts in points.items() for step, value, at in pts)
    out.extend((wire.minute_key(run_id, minute), jsonio.dumps(minute_state(run_id, m)), minute_h)
               for minute, m in minutes.items())
    return tombs, out


@dataclass
class Restored:
    """The runs' records read back from a partition of ``run-state`` (``add`` each; ``Reducer.restore_run`` each
    of ``docs`` with its run's ``pods``, ``points`` and ``minutes``)."""

    docs: list[dict[str, Any]] = field(default_factory=list)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    points: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    minutes: dict[str, dict[int, Minute]] = field(default_factory=dict)

    def add(self, key: str, value: bytes) -> None:
        """A run's record (not a queue's, a position's or a Node's), by its key."""
        point = wire.point_of_key(key)  # before pods: a metric's name may hold "/pod/" (or "/minute/")
        if point is not None:
            run_id, metric, step = point
            doc = _decoded(key, value, lambda d: point_of_state(d, run_id))
            self.points.setdefault(run_id, {}).setdefault(metric, []).append([step, *doc])
            return
        minute = wire.minute_of_key(key)
        if minute is not None:
            run_id, m = minute
            self.minutes.setdefault(run_id, {})[m] = _decoded(key, value, lambda d: minute_of_state(d, run_id, m))
            return
        pod = wire.pod_of_key(key)
        if pod is not None:
            self.pods.setdefault(pod[0], {})[pod[1]] = jsonio.loads(value)
        else:
            self.docs.append(jsonio.loads(value))


def _decoded(key: str, value: bytes, read: Any) -> Any:
    try:
        out = read(jsonio.loads(value))
    except ValueError as exc:  # invalid JSON, or not the record its key says (StoredStateError is a ValueError)
        raise errors.StoredStateError(f"run-state record {key[:200]!r}: {exc}") from None
    return out
