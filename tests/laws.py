"""Helpers for the reducer's laws: group a capture by object, fold it, compare the histories."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from tracker.core.reducer import Reducer

Event = dict[str, Any]


def object_key(ev: Event) -> str:
    """Identity of the object a record is about (intake events: their own id)."""
    if "schema" in ev:
        return f"intake/{ev['event_id']}"
    meta = ev["object"]["metadata"]
    return f"{ev['object']['kind']}/{meta.get('uid') or meta['name']}"


def by_object(streams: dict[str, list[Event]]) -> list[list[Event]]:
    """Per-object sequences, each in its own order (the only order the watch API guarantees)."""
    seqs: dict[str, list[Event]] = {}
    for stream in streams.values():
        for ev in stream:
            seqs.setdefault(object_key(ev), []).append(ev)
    return list(seqs.values())


def fold(records: Iterable[Event], reducer: Reducer | None = None) -> Reducer:
    red = reducer or Reducer()
    for rec in records:
        red.apply(rec, "law")
    return red


def histories(red: Reducer) -> dict[str, Any]:
    """Every run's derived history, as plain JSON values."""
    out = {}
    for run_id in sorted(red.runs):
        h = red.history(run_id)
        assert h is not None
        out[run_id] = h.model_dump(mode="json")
    return out


def relist(seen: Sequence[Event]) -> list[Event]:
    """What a re-list returns at this point: the latest state of every live object, as ADDED."""
    latest: dict[str, Event] = {}
    for ev in seen:
        if "schema" in ev:
            continue
        k = object_key(ev)
        if ev["type"] == "DELETED":
            latest.pop(k, None)
        else:
            latest[k] = ev
    return [{"type": "ADDED", "object": ev["object"]} for ev in latest.values()]


def roundtrip(red: Reducer) -> Reducer:
    """Snapshot through JSON text and restore, as a restart would."""
    return Reducer.restore(json.loads(json.dumps(red.snapshot())))
