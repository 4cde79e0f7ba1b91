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
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tracker.core import extract as x
from tracker.core.derive import derive
from tracker.core.facts import MetricFacts, RunFacts
from tracker.core.model import (
    INTAKE_SCHEMA,
    LABEL_CONTROLLER_UID,
    LABEL_JOB_UID,
    LABEL_RUN_ID,
    DeadLetter,
    IntakeEnvelope,
    ProgressEvent,
    RunHistory,
)
from tracker.core.timefmt import ts

ROOT_KINDS = ("Job", "RayJob")
HOLDABLE_EVENT_KINDS = frozenset({"Job", "Pod", "Workload", "RayJob", "RayCluster"})
SNAPSHOT_VERSION = 1


@dataclass(frozen=True, slots=True)
class ReducerLimits:
    """Explicit bounds on the reducer's memory."""

    max_held: int = 100_000  # records waiting for their owner to be seen
    max_dead_letters: int = 10_000  # dead letters kept until the next flush


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

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]


@dataclass(slots=True)
class Flushed:
    histories: list[RunHistory] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)


class Reducer:
    def __init__(self, limits: ReducerLimits | None = None) -> None:
        self.limits = limits or ReducerLimits()
        self.runs: dict[str, RunFacts] = {}
        self.owner_run: dict[str, str] = {}  # uid of a Job/RayJob/RayCluster/Workload/Pod -> run id
        self.submitters: set[str] = set()  # uids of KubeRay submitter Jobs
        self.held: OrderedDict[tuple[str, int], tuple[str, dict[str, Any], str]] = OrderedDict()
        self.held_by_owner: dict[str, list[tuple[str, int]]] = {}
        self.hold_seq = 0
        self.dirty: set[str] = set()
        self.dead: list[DeadLetter] = []
        self.stats = Stats()

    # ------------------------------------------------------------------------------------ input
    def apply(self, record: Any, source: str = "") -> None:
        """Fold one record: a watch event ``{"type", "object"}`` or a TauGrid intake event."""
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
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            self._dead(source, "unknown kind", record, f"apiVersion={obj.get('apiVersion')!r} kind={kind!r}")
            return
        try:
            handler(self, etype, obj, source)
        except x.Malformed as exc:
            self._dead(source, f"malformed {kind}", record, str(exc))

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

    # ------------------------------------------------------------------------------------ correlation
    def _hold(self, owner: str, etype: str, obj: dict[str, Any], source: str) -> None:
        key = (owner, self.hold_seq)
        self.hold_seq += 1
        self.held[key] = (etype, obj, source)
        self.held_by_owner.setdefault(owner, []).append(key)
        self.stats.held += 1
        while len(self.held) > self.limits.max_held:
            (old_owner, seq), (_e, old_obj, old_src) = self.held.popitem(last=False)
            keys = self.held_by_owner.get(old_owner)
            if keys:
                keys.remove((old_owner, seq))
                if not keys:
                    del self.held_by_owner[old_owner]
            self.stats.dropped_uncorrelated += 1
            self._dead(old_src, "uncorrelated", {"object": old_obj},
                       f"owner uid {old_owner} was not seen while {self.limits.max_held} records were held")

    def _bind(self, uid: str, run_id: str) -> None:
        """Record that ``uid`` belongs to ``run_id`` and fold anything that was waiting for it."""
        if not uid or self.owner_run.get(uid) == run_id:
            return
        self.owner_run[uid] = run_id
        keys = self.held_by_owner.pop(uid, None)
        if not keys:
            return
        for key in keys:
            etype, obj, source = self.held.pop(key)
            self.stats.released += 1
            _HANDLERS[obj["kind"]](self, etype, obj, source)

    # ------------------------------------------------------------------------------------ kinds
    def _root(self, etype: str, obj: dict[str, Any], source: str) -> None:
        meta = x.d(obj, "metadata")
        uid = x.s(meta, "uid")
        if not uid:
            raise x.Malformed("metadata.uid is missing")
        owner = x.controller_owner(meta)
        if obj["kind"] == "Job" and owner is not None and owner[0] == "RayJob":
            # the KubeRay submitter Job: part of its RayJob's run, not a run
            run_id = self.owner_run.get(owner[1])
            if run_id is None:
                self._hold(owner[1], etype, obj, source)
                return
            self.submitters.add(uid)
            self._run(run_id)
            self._bind(uid, run_id)
            return
        labels = x.d(meta, "labels")
        run_id = labels.get(LABEL_RUN_ID) if isinstance(labels.get(LABEL_RUN_ID), str) else None
        run_id = run_id or uid
        x.merge_root(self._run(run_id), obj["kind"], etype, obj)
        self._bind(uid, run_id)

    def _workload(self, etype: str, obj: dict[str, Any], source: str) -> None:
        meta = x.d(obj, "metadata")
        owner = x.controller_owner(meta)
        owner_uid = owner[1] if owner and owner[0] in ROOT_KINDS else x.s(x.d(meta, "labels"), LABEL_JOB_UID)
        if not owner_uid:
            raise x.Malformed("Workload has no Job/RayJob owner reference and no kueue.x-k8s.io/job-uid label")
        run_id = self.owner_run.get(owner_uid)
        if run_id is None:
            self._hold(owner_uid, etype, obj, source)
            return
        x.merge_workload(self._run(run_id), etype, obj)
        self._bind(x.s(meta, "uid"), run_id)

    def _pod(self, etype: str, obj: dict[str, Any], source: str) -> None:
        meta = x.d(obj, "metadata")
        labels = x.d(meta, "labels")
        owner = x.controller_owner(meta)
        owner_uid = owner[1] if owner else x.s(labels, LABEL_CONTROLLER_UID)
        run_id = self.owner_run.get(owner_uid) if owner_uid else None
        if run_id is None:
            label_run = labels.get(LABEL_RUN_ID)
            if isinstance(label_run, str) and label_run and label_run in self.runs:
                run_id = label_run
        if run_id is None:
            if not owner_uid:
                self.stats.ignored += 1  # not owned by anything a run is made of
                return
            self._hold(owner_uid, etype, obj, source)
            return
        x.merge_pod(self._run(run_id), etype, obj, owner_uid)
        self._bind(x.s(meta, "uid"), run_id)

    def _raycluster(self, etype: str, obj: dict[str, Any], source: str) -> None:
        meta = x.d(obj, "metadata")
        owner = x.controller_owner(meta)
        if owner is None or owner[0] != "RayJob":
            self.stats.ignored += 1  # a RayCluster not created by a RayJob is not a run
            return
        run_id = self.owner_run.get(owner[1])
        if run_id is None:
            self._hold(owner[1], etype, obj, source)
            return
        x.merge_raycluster(self._run(run_id), etype, obj)
        self._bind(x.s(meta, "uid"), run_id)

    def _event(self, etype: str, obj: dict[str, Any], source: str) -> None:
        involved = x.d(obj, "regarding") or x.d(obj, "involvedObject")
        uid = x.s(involved, "uid")
        run_id = self.owner_run.get(uid) if uid else None
        if run_id is None:
            if uid and x.s(involved, "kind") in HOLDABLE_EVENT_KINDS:
                self._hold(uid, etype, obj, source)
            else:
                self.stats.ignored += 1
            return
        x.merge_event(self._run(run_id), obj, involved)

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
        r = self._run(ev.run_id)
        if isinstance(ev, ProgressEvent):
            if ev.event_id in r.progress_seen:
                return
            r.progress_seen.add(ev.event_id)
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
        """Forget a finished run's facts (its history is already written). Late records recreate it."""
        self.runs.pop(run_id, None)
        self.dirty.discard(run_id)

    # ------------------------------------------------------------------------------------ snapshot
    def snapshot(self) -> dict[str, Any]:
        return {
            "version": SNAPSHOT_VERSION,
            "runs": [r.to_json() for r in self.runs.values()],
            "owner_run": self.owner_run,
            "submitters": sorted(self.submitters),
            "held": [[k[0], k[1], v[0], v[1], v[2]] for k, v in self.held.items()],
            "hold_seq": self.hold_seq,
            "dirty": sorted(self.dirty),
        }

    @classmethod
    def restore(cls, snap: dict[str, Any], limits: ReducerLimits | None = None) -> Reducer:
        if snap.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported reducer snapshot version {snap.get('version')!r}")
        red = cls(limits)
        red.runs = {d["run_id"]: RunFacts.from_json(d) for d in snap["runs"]}
        red.owner_run = dict(snap["owner_run"])
        red.submitters = set(snap["submitters"])
        for owner, seq, etype, obj, source in snap["held"]:
            red.held[(owner, seq)] = (etype, obj, source)
            red.held_by_owner.setdefault(owner, []).append((owner, seq))
        red.hold_seq = snap["hold_seq"]
        red.dirty = set(snap["dirty"])
        return red


_HANDLERS = {
    "Job": Reducer._root,
    "RayJob": Reducer._root,
    "Workload": Reducer._workload,
    "Pod": Reducer._pod,
    "RayCluster": Reducer._raycluster,
    "Event": Reducer._event,
}


def _excerpt(record: Any) -> str:
    try:
        text = json.dumps(record, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(record)
    return text[:2048]


def _validation_detail(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
