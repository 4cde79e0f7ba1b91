"""The reducer's snapshot codec: its state as JSON values, and back.

Two forms, both versioned (``SNAPSHOT_VERSION``; a version this tracker cannot continue from is an
``errors.StoredStateError``):

- ``snapshot_run`` / ``restore_run``: one run's state for a per-run changelog (the ``run-state`` topic, the index's
  reducer state): its facts without its pods, its owner bindings, and apart the facts of each pod that changed since
  the run's previous snapshot, so a change of one pod of a wide run rewrites that pod only; a retired run's is a
  marker (its ordinal and owners). Version 1 kept the pods inside the facts and is still read. Version 4 (the
  ``run-state`` topic: ``points_apart``) keeps the metric points apart too, each point the last flush changed
  (``point_state``), and its progress minutes, a record per minute whose remembered report ids, earliest report or
  step records changed (``minute_state``), so a progress report rewrites its points and its minute only; version 3
  kept the minutes inside and is still read; version 2 (the index) keeps both inside.
- ``snapshot`` / ``Reducer.restore``: the whole reducer in one document (pods inside their runs' facts), with what
  is pending until the next flush.

Each carries the watermark (``marks``): restoring takes the later of each stream's. Restoring is the inverse of
snapshotting: the resumability law (``tests/core/test_reducer_laws.py``) folds a prefix, snapshots, restores and
folds the rest. ``Snapshots`` is a part of ``tracker.core.reducer.Reducer`` (a mixin on ``Retirement``, sharing the
reducer's state). Pure, as the reducer is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracker import errors
from tracker.core.correlate import Correlator, lost_key
from tracker.core.facts import PROGRESS_BUCKET_US, PodFacts, RunFacts, seen_minute
from tracker.core.ledger_facts import StepTrail
from tracker.core.model import HistoryUpdate, load, to_json
from tracker.core.nodes import NodeBook
from tracker.core.queues import QueueBook
from tracker.core.retire import Retirement
from tracker.core.run_table import RunTable
from tracker.core.snapshot_shape import check_pod, check_run_snapshot

SNAPSHOT_VERSION = 2  # 2: a run's snapshot holds its pods apart (``snapshot_run``: "pods"); 1 inside its facts
POINTS_APART_VERSION = 3  # 3: its metric points apart too (``snapshot_run(points_apart=True)``: "points")
MINUTES_APART_VERSION = 4  # 4: and its progress minutes ("minutes"; points are still version 3 records)


def point_state(run_id: str, value: float, at: int) -> dict[str, Any]:
    """A metric point's record in a per-run changelog (``snapshot_run(points_apart=True)``; its metric and step are
    in its key): of snapshot version 3, so that a tracker that keeps points inside its runs' facts refuses it."""
    return {"version": POINTS_APART_VERSION, "run_id": run_id, "point": [value, at]}


def point_of_state(doc: Any, run_id: str) -> list[Any]:
    """[value, at] of a point's record (``point_state``) of run ``run_id`` (``restore_run`` checks the values); a
    StoredStateError if it is not one."""
    if not (isinstance(doc, dict) and doc.get("version") == POINTS_APART_VERSION and doc.get("run_id") == run_id
            and isinstance(doc.get("point"), list) and len(doc["point"]) == 2):
        text = repr(doc)
        raise errors.StoredStateError(f"{text[:200]} is not a metric point's record of run {run_id[:200]!r} "
                                      f"(version {POINTS_APART_VERSION}: run_id, point [value, at])")
    return list(doc["point"])


Minute = tuple[list[Any], int | None, list[Any]]  # a progress minute: its report ids, earliest report, step records


def minute_state(run_id: str, minute: Minute) -> dict[str, Any]:
    """The record of one progress minute of a run (``snapshot_run(points_apart=True)``; the minute is in its key): the
    report ids it remembers of that minute, [[event id, at], ...] by time, the time of the minute's earliest report
    (``first``; None if the run no longer keeps it) and its step records of that minute ([[at, step], ...] by time),
    of snapshot version 4."""
    ids, first, steps = minute
    return {"version": MINUTES_APART_VERSION, "run_id": run_id, "seen": [list(p) for p in ids], "first": first,
            "steps": [list(r) for r in steps]}


def minute_of_state(doc: Any, run_id: str, minute: int) -> Minute:
    """The report ids ([[event id, at], ...]), the earliest report's time and the step records ([[at, step], ...]) of
    a progress minute's record (``minute_state``) of run ``run_id``, every time of that minute; a StoredStateError if
    it is not one."""
    ids = doc.get("seen") if isinstance(doc, dict) else None
    first = doc.get("first") if isinstance(doc, dict) else None
    steps = doc.get("steps") if isinstance(doc, dict) else None
    if not (isinstance(doc, dict) and doc.get("version") == MINUTES_APART_VERSION and doc.get("run_id") == run_id
            and isinstance(ids, list) and all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and type(p[1]) is int
                and seen_minute(p[1]) == minute for p in ids)
            and (first is None or (type(first) is int and seen_minute(first) == minute))
            and isinstance(steps, list) and all(
                isinstance(r, list) and len(r) == 2 and type(r[0]) is int and type(r[1]) is int
                and seen_minute(r[0]) == minute for r in steps)):
        text = repr(doc)
        raise errors.StoredStateError(f"{text[:200]} is not a record of run {run_id[:200]!r}'s progress minute "
                                      f"{minute} (version {MINUTES_APART_VERSION}: run_id, seen [[event id, at], "
                                      "...], first: at or null, steps [[at, step], ...], every at in that minute)")
    return ids, first, steps


class Snapshots(Retirement):
    """The snapshot codec of the reducer (module docstring); the attributes are the reducer's."""

    def _release(self, uid: str, run_id: str) -> None:
        raise NotImplementedError  # the reducer's

    def retired_marker(self, run_id: str, seq: int, owners: list[str] | None = None,
                       version: int = SNAPSHOT_VERSION) -> dict[str, Any]:
        """A retired run's state: its retirement ordinal and owner bindings, no facts (also for a run retired and
        forgotten since the last flush, ``Flushed.forgotten_seq``, whose bindings are gone)."""
        return {"version": version, "run_id": run_id, "retired": True, "owners": owners or [],
                "retired_seq": seq, "marks": self.marks, "pods": {}}

    def snapshot_run(self, run_id: str, forgotten_seq: Mapping[str, int] | None = None, *,
                     points_apart: bool = False) -> dict[str, Any] | None:
        """One run's state, for a per-run changelog: its facts without its pods, its owner bindings (and the uids of
        roots that lost its run id to another and of their objects, when there are any; its pods' uids, which are owners
        too, are bound again from its pods: ``pods_own``), and apart, in ``pods``,
        the facts of each pod that changed since the run's previous ``snapshot_run`` (uid -> ``PodFacts.to_json``)
        and in ``pods_removed`` the uids of pods it no longer has. A changelog keeps each pod in a record of its
        own (``restore_run`` takes them back), so that a change of one pod of a wide run rewrites that pod only.
        Taking a snapshot clears what it reports of the pods. A run of ``forgotten_seq`` (retired and forgotten since
        the last flush: ``Flushed.forgotten_seq``) is given its retirement marker all the same.

        ``points_apart`` (version 4; the ``run-state`` topic): the facts leave the metric points out (their width
        stays), and ``points`` holds the points the last flush changed (metric -> [[step, value, at], ...]: every
        point for a run restored from a version that kept them inside), ``points_removed`` the [metric, step] of
        those it dropped (of a run retired since: all its points), so that a changelog keeps each point in a record
        of its own and a progress report rewrites its points, not the run's every point. So too its progress
        minutes (the report ids it remembers, the earliest report and the step records, by minute): ``minutes``
        holds, for each minute changed since the last such snapshot (every minute, the first time), minute ->
        ``Minute``, ``minutes_removed`` the minutes left with nothing (of a run retired since: all of them); the
        facts keep the step records' width only. Without it (version 2; the index's reducer state, written once a
        replay's flush) the points and minutes stay inside the facts."""
        owners = self.corr.owners_of(run_id)
        lost = self.corr.owners_of(lost_key(run_id))
        changed = self._state_pods.pop(run_id, set())
        removed = self._state_removed.pop(run_id, set())
        points_changed, points_removed = self._state_points.pop(run_id, ((), ()))
        whole = run_id in self._points_inside
        self._points_inside.discard(run_id)
        minutes_gone: list[int] = list(self._state_minutes.pop(run_id, ()))
        version = MINUTES_APART_VERSION if points_apart else SNAPSHOT_VERSION
        seq = self.retired.get(run_id)
        if seq is None and forgotten_seq is not None:
            seq = forgotten_seq.get(run_id)
        if seq is not None:
            snap = self.retired_marker(run_id, seq, owners, version)
            if points_apart:
                snap["points"] = {}
        else:
            r = self.runs.get(run_id)
            if r is None:
                return None
            # the pods' own uids are bound to the run as owners (of their Events): restore binds them from the pods,
            # so that the run's record does not grow with its width
            snap = {"version": version, "run_id": run_id, "facts": r.to_json(pods=False, points=not points_apart),
                    "owners": [u for u in owners if u not in r.pods], "pods_own": True, "marks": self.marks,
                    "pods": {u: r.pods[u].to_json() for u in sorted(changed) if u in r.pods}}
            removed = {u for u in removed if u not in r.pods}
            if run_id in self.quiet:
                snap["quiet"] = self.quiet[run_id]
            if points_apart:
                mp = r.points
                if whole:
                    snap["points"] = mp.to_json()[1]
                else:
                    out: dict[str, list[tuple[int, float, int]]] = {}
                    for k, step in points_changed:
                        if mp.holds(k, step):
                            out.setdefault(k, []).append(mp.point(k, step))
                    snap["points"] = out
                points_removed = tuple(p for p in points_removed if not mp.holds(*p))
                snap["minutes"], minutes_gone = self._minutes_apart(r)
        snap["pods_removed"] = sorted(removed)
        if points_apart:
            snap["points_removed"] = [list(p) for p in sorted(points_removed)]
            snap.setdefault("minutes", {})
            snap["minutes_removed"] = sorted(minutes_gone)
        if lost:
            snap["lost"] = lost
        return snap

    @staticmethod
    def _minutes_apart(r: RunFacts) -> tuple[dict[int, Minute], list[int]]:
        """The progress minutes changed since the run's last snapshot apart (all, the first time), minute -> its
        report ids, earliest report's time and step records, and the minutes left with none of them; from now on the
        run notes the minutes changed (``RunFacts.minutes_changed``)."""
        changed, r.minutes_changed = r.minutes_changed, set()
        if changed is None:
            changed = r.minutes()
        buckets, trail = r.progress_buckets, r.steps
        out: dict[int, Minute] = {}
        gone = []
        for m in sorted(changed):
            minute = (r.seen_in(m), buckets.get(m), trail.records_in(m * PROGRESS_BUCKET_US,
                                                                   (m + 1) * PROGRESS_BUCKET_US))
            if minute[0] or minute[1] is not None or minute[2]:
                out[m] = minute
            else:
                gone.append(m)
        return out, gone

    def restore_run(self, snap: Any, pods: Mapping[str, Any] | None = None,
                    points: Mapping[str, list[Any]] | None = None,
                    minutes: Mapping[int, Minute] | None = None) -> None:
        """Load one run's state written by ``snapshot_run`` (replacing what was known of it): ``pods`` holds the
        run's pods, uid -> facts, as the changelog kept them (a version-1 snapshot holds them in its facts);
        ``points`` its metric points, metric -> [[step, value, at], ...], as the changelog kept them (a version-3
        snapshot's facts hold their width only; earlier ones hold them, and the run's next version-4 snapshot
        writes them all); ``minutes`` its progress minutes, minute -> its report ids, earliest report's time and step
        records (``minute_of_state``), as the changelog kept them (a version-4 snapshot's facts hold none of them
        but the step records' width; earlier ones hold them all, and the run's next version-4 snapshot writes every
        minute).

        The snapshot and the pods are checked first (``tracker.core.snapshot_shape``): a value of a wrong type, out
        of range or missing is a StoredStateError naming it, raised before anything of the reducer changes. ``snap``
        is typed ``Any``: it is checked here, and a compiled core would check a declared type at the call first,
        with a TypeError instead of the error naming the value."""
        apart = isinstance(snap, dict) and snap.get("version") in (POINTS_APART_VERSION, MINUTES_APART_VERSION)
        if apart and isinstance(snap.get("facts"), dict):  # what was kept apart goes back (then checked with the rest)
            facts = snap["facts"]
            width = facts.get("points")
            facts["points"] = [width[0] if isinstance(width, list) and width else 1, dict(points or {})]
            if snap["version"] == MINUTES_APART_VERSION:
                by_minute = sorted((minutes or {}).items())
                facts["progress_seen"] = [p for _m, (ids, _first, _steps) in by_minute for p in ids]
                facts["progress_buckets"] = [[m, first] for m, (_ids, first, _steps) in by_minute if first is not None]
                trail = facts.get("steps")
                if isinstance(trail, list) and trail and type(trail[0]) is int and trail[0] > 0:
                    facts["steps"] = StepTrail.of_records(trail[0], [r for _m, (_i, _f, steps) in by_minute
                                                                     for r in steps])
        check_run_snapshot(snap)  # StoredStateError naming the first value that is not the format's
        for uid, pod in (pods or {}).items():
            check_pod(pod, f"pods.{uid}")
        version = snap["version"]
        run_id = snap["run_id"]
        marks = snap.get("marks")
        if marks is not None:  # the watermark when the state was kept
            self.marks = [max(a, b) for a, b in zip(self.marks, marks, strict=True)]
        self.derivations.pop(run_id, None)
        self._freed_final.pop(run_id, None)
        self._pods_changed.pop(run_id, None)
        self._points_inside.discard(run_id)
        if snap.get("retired"):
            self.runs.discard(run_id)  # its facts, packed or not, are not read
            self.quiet.pop(run_id, None)
            seq = snap["retired_seq"]
            self.retirements = max(self.retirements, seq)
            self.retired.pop(run_id, None)
            self.retired[run_id] = seq
        else:
            r = self.runs[run_id] = RunFacts.from_json(snap["facts"])
            kept = pods if pods is not None else snap.get("pods") if version != 1 else None
            if kept:
                r.pods.update((uid, PodFacts.from_json(v)) for uid, v in kept.items())
            if version == 1 and r.pods:  # its pods were in its facts: the next snapshot keeps each apart
                self._state_pods[run_id] = set(r.pods)
            if not apart and r.points.size:  # so were its points
                self._points_inside.add(run_id)
            if version == MINUTES_APART_VERSION:  # its minutes are in the changelog (else: all written next time)
                r.minutes_changed = set()
            if self.limits.retire_after_us is not None and self.watermark:
                quiet = snap.get("quiet")  # none: kept by a tracker that did not retire; quiet from now
                self._schedule(run_id, self.watermark if quiet is None else quiet)
        owners = list(snap["owners"])
        if snap.get("pods_own") and run_id in self.runs:
            owners += sorted(self.runs[run_id].pods)
        for uid in owners:
            self._release(uid, run_id)
        for uid in snap.get("lost", ()):
            self._release(uid, lost_key(run_id))

    def snapshot(self) -> dict[str, Any]:
        """The whole reducer, pods inside their runs' facts (``restore`` takes it back)."""
        return {
            "version": SNAPSHOT_VERSION,
            "runs": self.runs.docs(),
            "correlator": self.corr.to_json(),
            "retired": list(self.retired.items()),
            "retirements": self.retirements,
            "dirty": sorted(self.dirty),
            "marks": self.marks,
            "quiet": sorted(self.quiet.items()),
            "retired_updates": [to_json(u) for _k, u in sorted(self._retired_updates.items())],
            "retired_now": self._retired_now,
            "forgotten_now": self._forgotten_now,
            "state_pods": {k: sorted(v) for k, v in sorted(self._state_pods.items())},
            "state_removed": {k: sorted(v) for k, v in sorted(self._state_removed.items())},
            "queues": self.queues.to_json(),
            "nodes": self.nodes.to_json(),
        }

    def _load(self, snap: dict[str, Any]) -> None:
        """Take back a whole ``snapshot`` into this (new) reducer."""
        if snap.get("version") != SNAPSHOT_VERSION:
            raise errors.StoredStateError(f"unsupported reducer snapshot version {snap.get('version')!r}")
        self.runs = RunTable(RunFacts.from_json(d) for d in snap["runs"])
        self.corr = Correlator.from_json(snap["correlator"], self.limits.max_held)
        self.retired = {k: seq for k, seq in snap["retired"]}
        self.retirements = snap["retirements"]
        self.dirty = set(snap["dirty"])
        self.marks = list(snap["marks"])
        if self.limits.retire_after_us is not None:
            for run_id, quiet in snap["quiet"]:
                self._schedule(run_id, quiet)
        self._retired_updates = {u.run_id: u for u in (load(HistoryUpdate, d) for d in snap["retired_updates"])}
        self._retired_now = list(snap["retired_now"])
        self._forgotten_now = list(snap["forgotten_now"])
        self._state_pods = {k: set(v) for k, v in snap["state_pods"].items()}
        self._state_removed = {k: set(v) for k, v in snap["state_removed"].items()}
        if "queues" in snap:  # a snapshot from before queues were kept has none
            self.queues = QueueBook.from_json(snap["queues"])
        if "nodes" in snap:  # nor one from before Nodes were
            self.nodes = NodeBook.from_json(snap["nodes"])
