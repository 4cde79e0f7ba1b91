"""A run-state changelog in memory, written and read back as ``tracker reduce`` does (``tracker.runtime.run_state``):
each key's latest value, a tombstone deleting its key, so the reducer's laws can restart from it anywhere."""

from __future__ import annotations

import json
from typing import Any

from tracker.core.limits import ReducerLimits
from tracker.core.reducer import Reducer
from tracker.runtime import run_state

Changelog = dict[str, bytes]


def write(log: Changelog, red: Reducer, run_id: str) -> None:
    """What ``tracker reduce`` writes for ``run_id`` after a flush: the run's snapshot and its parts kept apart, and
    the tombstones of the parts it no longer has."""
    snap = red.snapshot_run(run_id, points_apart=True)
    assert snap is not None
    tombs, records = run_state.run_records(run_id, snap)
    for key, _headers in tombs:
        log.pop(key, None)
    for key, value, _headers in records:
        log[key] = value


def restore(log: Changelog, limits: ReducerLimits | None = None) -> Reducer:
    """A new reducer restored from the changelog as ``tracker reduce`` restores a partition."""
    red = Reducer(limits) if limits is not None else Reducer()
    kept = run_state.Restored()
    for key, value in log.items():
        kept.add(key, value)
    for doc in kept.docs:
        run_id = doc["run_id"]
        red.restore_run(doc, kept.pods.get(run_id, {}), kept.points.get(run_id), kept.minutes.get(run_id))
    return red


def doc(log: Changelog, key: str) -> Any:
    return json.loads(log[key])
