"""Helpers for the reducer's laws: group a capture by object, fold it, compare the histories with each other and
with what the lifecycle generator says each run must become (its oracle)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sim.lifecycles import ExpectedRun
from tracker.core.model import RunHistory, to_json
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


def interleave(seqs: Sequence[Sequence[Event]], rng: random.Random) -> list[Event]:
    """A random merge of the per-object sequences that keeps each one's own order."""
    cursors = [0] * len(seqs)
    live = [i for i, s in enumerate(seqs) if s]
    out: list[Event] = []
    while live:
        j = rng.randrange(len(live))
        i = live[j]
        out.append(seqs[i][cursors[i]])
        cursors[i] += 1
        if cursors[i] == len(seqs[i]):
            live[j] = live[-1]
            live.pop()
    return out


def fold(records: Iterable[Event], reducer: Reducer | None = None) -> Reducer:
    red = reducer or Reducer()
    for rec in records:
        red.apply(rec, "law")
    return red


def run_histories(red: Reducer) -> dict[str, RunHistory]:
    """Every run's derived history, by run id."""
    out = {}
    for run_id in sorted(red.runs):
        h = red.history(run_id)
        assert h is not None
        out[run_id] = h
    return out


def histories(red: Reducer) -> dict[str, Any]:
    """Every run's derived history, as plain JSON values."""
    return {run_id: to_json(h) for run_id, h in run_histories(red).items()}


def noisy(order: Sequence[Event], rng: random.Random) -> list[Event]:
    """``order`` as an at-least-once pipeline may deliver it: changes again, relists that missed nothing, a
    consumer restart replaying a suffix, and a complete relist at the end."""
    out: list[Event] = []
    for n, ev in enumerate(order):
        out.append(ev)
        roll = rng.randrange(10)
        if roll == 0:
            out.append(ev)  # at-least-once delivery: the same change again
        elif roll == 1:
            out.extend(relist(order[: n + 1]))  # a relist that missed nothing
        elif roll == 2 and n >= 3:
            out.extend(order[n - 2: n + 1])  # a consumer restart replays a suffix
    out.extend(relist(order))
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


def watch_with_gaps(stream: Sequence[Event], gaps: Iterable[tuple[int, int]]) -> list[Event]:
    """What a watcher of one stream publishes when it is away for each ``[start, end)`` of the stream's records
    and the server answers ``410 Gone`` when it comes back (tracker.shell.watch, step 4): the changes made while
    it was away are lost; the re-list at ``end`` gives the latest state of every object that changed (MODIFIED
    if the watcher knew it, else ADDED), and a synthetic DELETED carrying the last state it knew for every known
    object that is gone. An object created and deleted while it was away is never seen. Events' deletions (their
    expiry) are not published."""
    cuts = sorted((s, e) for s, e in gaps if s < e)
    known: dict[str, Event] = {}  # uid -> the last object the watcher published
    out: list[Event] = []

    def publish(etype: str, obj: Event) -> None:
        key = object_key({"object": obj})
        if etype == "DELETED":
            known.pop(key, None)
        else:
            known[key] = obj
        out.append({"type": etype, "object": obj})

    pos = 0
    for start, end in cuts:
        start = max(start, pos)
        if start >= end:
            continue
        for ev in stream[pos:start]:
            publish(ev["type"], ev["object"])
        latest: dict[str, Event] = {}  # what the re-list shows of each object the missed changes touched
        for ev in stream[start:end]:
            latest[object_key(ev)] = ev
        for key, ev in latest.items():
            if ev["type"] != "DELETED":
                publish("MODIFIED" if key in known else "ADDED", ev["object"])
            elif key in known and ev["object"]["kind"] != "Event":
                publish("DELETED", known[key])  # the last state the watcher knew, not the deleted one
        pos = end
    for ev in stream[pos:]:
        publish(ev["type"], ev["object"])
    return out


def roundtrip(red: Reducer) -> Reducer:
    """Snapshot through JSON text and restore, as a restart would."""
    return Reducer.restore(json.loads(json.dumps(red.snapshot())))


# ------------------------------------------------------------------------------------------ the oracle


def ms(text: str | None) -> int | None:
    """A history's RFC 3339 time in milliseconds (the generator's unit)."""
    if text is None:
        return None
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def check_history(h: dict[str, Any], exp: ExpectedRun) -> list[str]:
    """How a run's history differs from what the generator says the run must become ([] if it does not)."""
    bad: list[str] = []

    def same(what: str, got: Any, want: Any) -> None:
        if got != want:
            bad.append(f"{exp.run_id} {what}: got {got!r}, expected {want!r}")

    run = h["run"]
    for key in ("kind", "namespace", "name", "uid", "status", "reason", "phase", "evictions", "retries",
                "ledger_basis", "resume_of", "resumed_from", "checkpoints_saved", "last_checkpoint"):
        same(key, run[key], getattr(exp, key))
    same("finished_at", ms(run["finished_at"]), exp.finished_at)
    same("attempts", run["attempts"], len(exp.attempts))
    same("attempt rows", len(h["attempts"]), len(exp.attempts))
    for i, (got, want) in enumerate(zip(h["attempts"], exp.attempts, strict=False), start=1):
        for key in ("trigger", "end_reason", "retries"):
            same(f"attempt {i} {key}", got[key], getattr(want, key))
        for key in ("queued_at", "admitted_at", "ended_at"):
            same(f"attempt {i} {key}", ms(got[key]), getattr(want, key))
        same(f"attempt {i} phases", [t["phase"] for t in h["transitions"] if t["attempt"] == i], want.phases)
    queued = [a for a in exp.attempts if a.queued_at is not None]
    same("run admitted_at (latest attempt queued by Kueue)", ms(run["admitted_at"]),
         queued[-1].admitted_at if queued else None)
    return bad


def check_cluster(hists: dict[str, Any], expected: dict[str, ExpectedRun]) -> list[str]:
    """How the histories of a generated cluster differ from what the generator says ([] if they do not)."""
    bad = [f"runs: got {sorted(hists)}, expected {sorted(expected)}"] if sorted(hists) != sorted(expected) else []
    for run_id, exp in expected.items():
        if run_id in hists:
            bad.extend(check_history(hists[run_id], exp))
    return bad
