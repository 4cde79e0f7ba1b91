"""The reducer: folds watch events and intake events into per-run facts, and derives run histories.

``Reducer`` is the functional core of the tracker. It does no I/O, reads no clock, draws no random numbers
and logs nothing: its output is a deterministic function of the records given to it (and of a snapshot it
was restored from). The shell (replay, the Kafka consumer) feeds it records, calls ``flush`` to collect
the histories of runs that changed, and persists ``snapshot`` when it commits.

Laws (proved by the hypothesis tests in ``tests/test_reducer_laws.py``):
- determinism: the same records give the same histories;
- idempotence: duplicated records and full relists change nothing;
- commutativity across objects: any interleaving that keeps each object's own order gives the same histories;
- resumability: fold(prefix); snapshot; restore; fold(rest) equals fold(everything).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tracker.core import extract as x
from tracker.core.correlate import KINDS, ROOT_KINDS, Correlator, link
from tracker.core.derive import derive
from tracker.core.facts import MetricFacts, RunFacts
from tracker.core.model import (
    INTAKE_SCHEMA,
    DeadLetter,
    IntakeEnvelope,
    ProgressEvent,
    RunHistory,
)
from tracker.core.timefmt import ts

SNAPSHOT_VERSION = 1


@dataclass(frozen=True, slots=True)
class ReducerLimits:
    """Explicit bounds on the reducer's memory."""

    max_held: int = 100_000  # records waiting for their owner to be seen
    max_dead_letters: int = 10_000  # dead letters kept until the next flush
    max_retired: int = 1_000_000  # finished runs remembered (ids and owner uids) after their facts are freed


@dataclass(slots=True)
class Stats:
    records: int = 0
    bookmarks: int = 0
    watch_errors: int = 0
    ignored: int = 0
    dead_letters: int = 0
    held: int = 0
    released: int = 0
    dropped_uncorrelated: int = 0
    after_retirement: int = 0

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(slots=True)
class Flushed:
    histories: list[RunHistory] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)


class Reducer:
    def __init__(self, limits: ReducerLimits | None = None) -> None:
        self.limits = limits or ReducerLimits()
        self.runs: dict[str, RunFacts] = {}
        self.corr = Correlator(self.limits.max_held)
        self.retired: dict[str, None] = {}  # insertion-ordered: oldest first
        self.dirty: set[str] = set()
        self.dead: list[DeadLetter] = []
        self.stats = Stats()

    # ------------------------------------------------------------------------------------ input
    def apply(self, record: Any, source: str = "", run_hint: str | None = None) -> None:
        """Fold one record: a watch event ``{"type", "object"}`` or a TauGrid intake event.

        ``run_hint`` is the run a watcher already correlated the record to (the Kafka record key); it is used
        only when the reducer cannot correlate the object itself, so records need not wait for their owner.
        """
        self.stats.records += 1
        if not isinstance(record, dict):
            self._dead(source, "not a JSON object", record)
            return
        if "schema" in record:
            self._intake(record, source)
            return
        etype = record.get("type")
        obj = record.get("object")
        if etype == "BOOKMARK":
            self.stats.bookmarks += 1
            return
        if etype == "ERROR":
            self.stats.watch_errors += 1
            return
        if etype not in ("ADDED", "MODIFIED", "DELETED"):
            self._dead(source, "not a watch event", record, f"type={etype!r}")
            return
        if not isinstance(obj, dict):
            self._dead(source, "watch event without an object", record)
            return
        kind = obj.get("kind")
        if kind not in KINDS:
            self._dead(source, "unknown kind", record, f"apiVersion={obj.get('apiVersion')!r} kind={kind!r}")
            return
        try:
            self._object(etype, obj, source, run_hint)
        except x.Malformed as exc:
            self._dead(source, f"malformed {kind}", record, str(exc))

    def reject(self, source: str, reason: str, excerpt: str) -> None:
        """Count an input the shell could not even decode (bad JSON, oversized value) as a dead letter."""
        self.stats.records += 1
        self.stats.dead_letters += 1
        if len(self.dead) < self.limits.max_dead_letters:
            self.dead.append(DeadLetter(source=source, reason=reason, excerpt=excerpt[:2048]))

    def _dead(self, source: str, reason: str, record: Any, detail: str = "") -> None:
        self.stats.dead_letters += 1
        if len(self.dead) < self.limits.max_dead_letters:
            self.dead.append(DeadLetter(source=source, reason=reason, detail=detail[:1024],
                                        excerpt=_excerpt(record)))

    def _run(self, run_id: str) -> RunFacts:
        r = self.runs.get(run_id)
        if r is None:
            r = self.runs[run_id] = RunFacts(run_id)
        self.dirty.add(run_id)
        return r

    # ------------------------------------------------------------------------------------ objects
    def _object(self, etype: str, obj: dict[str, Any], source: str, run_hint: str | None) -> None:
        ln = link(obj)
        if ln is None:
            self.stats.ignored += 1
            return
        run_id = self.corr.run_of(ln) or run_hint
        if run_id is None:
            assert ln.owner is not None
            self.stats.held += 1
            for owner, (_e, old_obj, old_src) in self.corr.hold(ln.owner, (etype, obj, source)):
                self.stats.dropped_uncorrelated += 1
                self._dead(old_src, "uncorrelated", {"object": old_obj},
                           f"owner uid {owner} was not seen while {self.limits.max_held} records were held")
            return
        if run_id in self.retired:
            self.stats.after_retirement += 1
            return
        # A run is created, and marked changed, only once its first object merged: a malformed first record
        # (``Malformed`` is raised before anything is merged) leaves no empty run behind.
        r = self.runs.get(run_id)
        new = r is None
        if r is None:
            r = RunFacts(run_id)
        kind = ln.kind
        if kind in ROOT_KINDS and not ln.submitter:
            x.merge_root(r, kind, etype, obj)
        elif kind == "Workload":
            x.merge_workload(r, etype, obj)
        elif kind == "Pod":
            x.merge_pod(r, etype, obj, ln.owner)
        elif kind == "RayCluster":
            x.merge_raycluster(r, etype, obj)
        elif kind == "Event":
            x.merge_event(r, obj, x.d(obj, "regarding") or x.d(obj, "involvedObject"))
        if new:
            self.runs[run_id] = r
        self.dirty.add(run_id)
        if ln.uid:
            for held_etype, held_obj, held_source in self.corr.bind(ln.uid, run_id):
                self.stats.released += 1
                self._object(held_etype, held_obj, held_source, None)

    def _intake(self, record: dict[str, Any], source: str) -> None:
        if record.get("schema") != INTAKE_SCHEMA:
            self._dead(source, "unknown intake schema version", record, f"schema={record.get('schema')!r}")
            return
        try:
            ev = IntakeEnvelope.model_validate({"event": record}).event
        except ValidationError as exc:
            self._dead(source, "invalid intake event", record, _validation_detail(exc))
            return
        at = ts(ev.at)
        assert at is not None
        if ev.run_id in self.retired:
            self.stats.after_retirement += 1
            return
        r = self._run(ev.run_id)
        if isinstance(ev, ProgressEvent):
            if r.seen_progress(ev.event_id, at):
                return
            r.progress_time(at)
            for name, value in ev.metrics.items():
                m = r.metrics.get(name)
                if m is None:
                    r.metrics[name] = MetricFacts((ev.step, value), (ev.step, value), value, value, 1)
                else:
                    m.add(ev.step, value)
            if ev.checkpoint_uri:
                cp = (ev.step, at, ev.checkpoint_uri)
                if r.checkpoint is None or cp > r.checkpoint:
                    r.checkpoint = cp
            return
        data = ev.model_dump(exclude={"schema_", "event_id", "run_id", "at", "kind", "status"}, mode="json")
        r.intake[ev.event_id] = (ev.kind, ev.status, at, data)

    # ------------------------------------------------------------------------------------ output
    def flush(self) -> Flushed:
        """Histories of every run changed since the last flush (sorted by run id), and dead letters."""
        out = Flushed([derive(self.runs[k]) for k in sorted(self.dirty)], self.dead)
        self.dirty = set()
        self.dead = []
        return out

    def history(self, run_id: str) -> RunHistory | None:
        r = self.runs.get(run_id)
        return derive(r) if r is not None else None

    def retire(self, run_id: str) -> None:
        """Free a finished run's facts once its history is written. Its id and owner bindings are remembered
        (bounded by ``max_retired``) so that late records (TTL deletions, expiring Events) are recognised and
        ignored instead of starting a partial history that would overwrite the real one."""
        self.runs.pop(run_id, None)
        self.dirty.discard(run_id)
        self.retired[run_id] = None
        while len(self.retired) > self.limits.max_retired:
            oldest = next(iter(self.retired))
            del self.retired[oldest]
            self.corr.forget_run(oldest)

    def snapshot_run(self, run_id: str) -> dict[str, Any] | None:
        """One run's state (facts and owner bindings), for a per-run changelog."""
        owners = self.corr.owners_of(run_id)
        if run_id in self.retired:
            return {"version": SNAPSHOT_VERSION, "run_id": run_id, "retired": True, "owners": owners}
        r = self.runs.get(run_id)
        if r is None:
            return None
        return {"version": SNAPSHOT_VERSION, "run_id": run_id, "facts": r.to_json(), "owners": owners}

    def restore_run(self, snap: dict[str, Any]) -> None:
        """Load one run's state written by ``snapshot_run`` (replacing what was known of it)."""
        if snap.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported run snapshot version {snap.get('version')!r}")
        run_id = snap["run_id"]
        if snap.get("retired"):
            self.runs.pop(run_id, None)
            self.retired[run_id] = None
        else:
            self.runs[run_id] = RunFacts.from_json(snap["facts"])
        for uid in snap["owners"]:
            for etype, obj, source in self.corr.bind(uid, run_id):
                self._object(etype, obj, source, None)

    # ------------------------------------------------------------------------------------ snapshot
    def snapshot(self) -> dict[str, Any]:
        return {
            "version": SNAPSHOT_VERSION,
            "runs": [r.to_json() for r in self.runs.values()],
            "correlator": self.corr.to_json(),
            "retired": list(self.retired),
            "dirty": sorted(self.dirty),
        }

    @classmethod
    def restore(cls, snap: dict[str, Any], limits: ReducerLimits | None = None) -> Reducer:
        if snap.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported reducer snapshot version {snap.get('version')!r}")
        red = cls(limits)
        red.runs = {d["run_id"]: RunFacts.from_json(d) for d in snap["runs"]}
        red.corr = Correlator.from_json(snap["correlator"], red.limits.max_held)
        red.retired = dict.fromkeys(snap["retired"])
        red.dirty = set(snap["dirty"])
        return red


def _excerpt(record: Any) -> str:
    try:
        text = json.dumps(record, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(record)
    return text[:2048]


def _validation_detail(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
