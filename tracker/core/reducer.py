"""The reducer: folds watch events and intake events into per-run facts, and derives run histories.

``Reducer`` is the functional core of the tracker. It does no I/O, reads no clock, draws no random numbers
and logs nothing: its output is a deterministic function of the records given to it (and of a snapshot it
was restored from). The shell (replay, the Kafka consumer) feeds it records, calls ``flush`` to collect
what changed in each run (``HistoryUpdate``: its history, and the pods and metric points that changed), and
persists ``snapshot`` (or ``snapshot_run`` per run) when it commits. Each live run's derivation is kept between
flushes (``derive.Derivation``), so that a change costs the same whatever the run's width; a finished run's is
freed at the flush that wrote it when the run is narrow (``ReducerLimits.finished_derivation_rows``: a late record
of it derives it again from its facts), or whatever its width in a replay that does not retire; from the next flush on,
its facts are packed (``tracker.core.run_table``: a read unpacks them).

Laws (proved by the hypothesis tests in ``tests/core/test_reducer_laws.py``):
- determinism: the same records give the same histories;
- idempotence: duplicated records and full relists change nothing;
- commutativity across objects: any interleaving that keeps each object's own order gives the same histories;
- resumability: fold(prefix); snapshot; restore; fold(rest) equals fold(everything).

Split by job: this module folds (``apply``: validation, correlation, the run-id claims between roots, intake
events) and flushes; ``tracker.core.retire`` retires finished runs (the event-time watermark, the due heap) and
``tracker.core.snapshot`` is the snapshot codec. Both are parts of ``Reducer`` (mixins sharing its state).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tracker.core import extract as x
from tracker.core import provenance
from tracker.core import validate as v
from tracker.core.correlate import KINDS, ROOT_KINDS, Correlator, Link, link, lost_key, taken_run_id
from tracker.core.curves import MetricFacts
from tracker.core.derive import Derivation, may_reopen
from tracker.core.facts import RunFacts
from tracker.core.gpu import Accelerators
from tracker.core.limits import ReducerLimits, Stats
from tracker.core.model import (
    EXCERPT_MAX,
    FINAL_STATUSES,
    INTAKE_SCHEMAS,
    CheckpointRestoreEvent,
    CheckpointSaveEvent,
    DeadLetter,
    HistoryUpdate,
    IntakeEnvelope,
    ProgressEvent,
    ResumeEvent,
    RunHistory,
    iso,
)
from tracker.core.nodes import NODE_KINDS, NodeBook, NodeState
from tracker.core.queues import QUEUE_KINDS, QUEUE_POSITION_SCHEMA, QueueBook, QueuePosition, QueueState
from tracker.core.redact import identity, redact_inline, redact_object, redact_value
from tracker.core.retire import STREAM_COUNT
from tracker.core.run_table import RunTable
from tracker.core.snapshot import Snapshots
from tracker.core.timefmt import BadTimestamp, ts

_EXCERPT_READ = 2 * EXCERPT_MAX  # of a record's text, what a dead letter redacts (then keeps EXCERPT_MAX of)
# Kinds held outside runs (tuples: `in` compares, so an unhashable kind is simply not one); a List of them too.
_OBJECT_KINDS: tuple[str, ...] = (*QUEUE_KINDS, *NODE_KINDS)
_OBJECT_LIST_KINDS: tuple[str, ...] = (*_OBJECT_KINDS, "List")


@dataclass(slots=True)
class Flushed:
    updates: list[HistoryUpdate] = field(default_factory=list)  # one per changed run, by run id
    dead_letters: list[DeadLetter] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)  # runs retired since the last flush, in retirement order
    forgotten: list[str] = field(default_factory=list)  # retired runs no longer remembered (``max_retired``)
    # Kueue's queues (``tracker.core.queues``): the queues whose newest state changed, the runs whose position did
    queues: list[QueueState] = field(default_factory=list)
    positions: list[QueuePosition] = field(default_factory=list)
    # their retirement ordinals: a store that keeps retirement markers (the index) writes one for a run retired and
    # forgotten between two flushes, whose marker it has not written yet
    forgotten_seq: dict[str, int] = field(default_factory=dict)
    # Kubernetes Nodes (``tracker.core.nodes``): the nodes whose kept state changed
    nodes: list[NodeState] = field(default_factory=list)

    @property
    def histories(self) -> list[RunHistory]:
        """The updates' histories (without metric points and pods), by run id."""
        return [u.history for u in self.updates if u.history is not None]


class Reducer(Snapshots):
    """The fold (``apply``), the run-id claims between roots, and ``flush``; retirement (``retire``, the watermark)
    is ``tracker.core.retire``'s part of it, the snapshot codec ``tracker.core.snapshot``'s."""

    def __init__(self, limits: ReducerLimits | None = None) -> None:
        self.limits = limits or ReducerLimits()
        self.accelerators = Accelerators(self.limits.accelerator_resources)
        self.runs = RunTable()
        self.corr = Correlator(self.limits.max_held)
        self.retired: dict[str, int] = {}  # run id -> retirement ordinal; insertion-ordered: oldest first
        self.retirements = 0  # the ordinal of the latest retirement
        self.dirty: set[str] = set()
        self.dead: list[DeadLetter] = []
        self.stats = Stats()
        # Own retirement (``limits.retire_after_us``): the event-time watermark, and for each live run the
        # watermark when it last changed: it is looked at again once the watermark is the grace past that.
        # The watermark is the earliest of the latest creationTimestamp (the API server's clock, not a controller's
        # or an application's) seen in each watch stream (roots, Workloads, Pods, Events) that has been seen: a
        # stream that lags behind the others holds retirement back instead of losing its records.
        self.marks = [0] * STREAM_COUNT
        self.quiet: dict[str, int] = {}
        self._due_heap: list[tuple[int, str]] = []  # (quiet + grace, run id); stale unless it matches ``quiet``
        self._touched: list[str] = []  # runs changed by the record being folded
        self._retired_updates: dict[str, HistoryUpdate] = {}  # final updates of runs retired before a flush
        # each live run's derivation, and the pods merged since it was last updated
        self.derivations: dict[str, Derivation] = {}
        # the finished runs whose derivation was freed (``_frees``), untouched since: whether each was final for good
        # (``derive.may_reopen``), so that retiring one derives nothing (not in snapshots: a restored run has none)
        self._freed_final: dict[str, bool] = {}
        # the runs freed since the last flush, and the finished narrow runs read without a derivation (restored ones),
        # whose facts the next flush packs (``tracker.core.run_table``) if they still have none then and no record
        # changed them (not in snapshots either)
        self._pack_next: set[str] = set()
        self._pods_changed: dict[str, set[str]] = {}
        # for ``snapshot_run``: the pods whose facts changed since the run's last snapshot, and the pods it no
        # longer has (a root that lost the run id took them; a retired run's)
        self._state_pods: dict[str, set[str]] = {}
        self._state_removed: dict[str, set[str]] = {}
        # for ``snapshot_run(points_apart=True)``: the (metric, step) of the points each run's update of the last
        # flush changed and removed (of a run retired since the flush before: all its points, ``_retiring_points``),
        # and the runs restored from a snapshot that kept their points inside their facts (not in snapshots: read
        # after the flush only; bounded by what one flush changed)
        self._state_points: dict[str, tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]] = {}
        self._retiring_points: dict[str, tuple[tuple[str, int], ...]] = {}
        self._points_inside: set[str] = set()
        # and the progress minutes of a run retired since the flush before (``_retiring_minutes``; ``_state_minutes``
        # from the flush on), whose records it tombstones
        self._state_minutes: dict[str, tuple[int, ...]] = {}
        self._retiring_minutes: dict[str, tuple[int, ...]] = {}
        self._retired_now: list[str] = []
        self._forgotten_now: list[str] = []
        self._forgotten_seq: dict[str, int] = {}  # (not in snapshots: read at the next flush only)
        self.queues = QueueBook()  # ClusterQueues, LocalQueues and pending runs' positions (not parts of a run)
        self.nodes = NodeBook()  # the Nodes pods run on (no part of a run either)

    # ------------------------------------------------------------------------------------ input
    def apply(self, record: Any, source: str = "", run_hint: str | None = None) -> None:
        """Fold one record: a watch event ``{"type", "object"}`` or a TauGrid intake event.

        ``run_hint`` is the run a watcher already correlated the record to (the Kafka record key); it is used
        only when the reducer cannot correlate the object itself, so records need not wait for their owner.
        """
        self.stats.records += 1
        self._apply(record, source, run_hint)
        if self.limits.retire_after_us is not None:
            self._retire_due(record)

    def _apply(self, record: Any, source: str, run_hint: str | None) -> None:
        # A record may be any JSON value: nothing below looks at one whole except through ``validate`` (a dead
        # letter's excerpt and a held record are pruned, a reason shows values by ``brief``).
        if not isinstance(record, dict):
            self._dead(source, "not a JSON object", v.pruned(record))
            return
        if "schema" in record:
            if record["schema"] == QUEUE_POSITION_SCHEMA:
                self._queue_position(record, source)
                return
            self._intake(record, source)
            return
        etype = record.get("type")
        obj = record.get("object")
        if etype is None and "object" not in record and record.get("kind") in _OBJECT_LIST_KINDS:
            self._queue_objects(record, source)  # ``kubectl get clusterqueues,nodes -o json``: no watch event
            return
        if etype == "BOOKMARK":
            self.stats.bookmarks += 1
            return
        if etype == "ERROR":
            self.stats.watch_errors += 1
            return
        if etype not in ("ADDED", "MODIFIED", "DELETED"):
            self._dead(source, "not a watch event", v.pruned(record), f"type={v.brief(etype)}")
            return
        if not isinstance(obj, dict):
            self._dead(source, "watch event without an object", v.pruned(record))
            return
        kind = obj.get("kind")
        if isinstance(kind, str) and kind in QUEUE_KINDS:
            try:
                self.queues.apply(etype, obj)
            except x.Malformed as exc:
                self._dead(source, f"malformed {kind}", v.pruned(record), str(exc))
            return
        if isinstance(kind, str) and kind in NODE_KINDS:
            try:
                self.nodes.apply(etype, obj, self.accelerators)
            except x.Malformed as exc:
                self._dead(source, f"malformed {kind}", v.pruned(record), str(exc))
            return
        if kind.__class__ is not str or kind not in KINDS:
            self._dead(source, "unknown kind", v.pruned(record),
                       f"apiVersion={v.brief(obj.get('apiVersion'))} kind={v.brief(kind)}")
            return
        try:
            self._object(etype, obj, source, run_hint)
        except x.Malformed as exc:
            self._dead(source, f"malformed {kind}", v.pruned(record), str(exc))

    def _queue_objects(self, record: dict[str, Any], source: str) -> None:
        """A queue object as ``kubectl get -o json`` prints it, or a List of them: each is its current state. A List
        item of another kind is a dead letter (run objects are captured as watch events, in their order)."""
        items = record.get("items") if record.get("kind") == "List" else [record]
        if not isinstance(items, list):
            self._dead(source, "not a watch event", v.pruned(record), "a List without items")
            return
        for item in items:
            kind = item.get("kind") if isinstance(item, dict) else None
            if not isinstance(kind, str) or kind not in _OBJECT_KINDS:
                self._dead(source, "not a watch event", v.pruned(item),
                           f"a bare {v.brief(kind)} object: only ClusterQueues, LocalQueues and Nodes may be captured "
                           "without --output-watch-events")
                continue
            try:
                if kind in NODE_KINDS:
                    self.nodes.apply("MODIFIED", item, self.accelerators)
                else:
                    self.queues.apply("MODIFIED", item)
            except x.Malformed as exc:
                self._dead(source, f"malformed {kind}", v.pruned(item), str(exc))

    def _queue_position(self, record: dict[str, Any], source: str) -> None:
        """A pending run's position in its queues (a poll of Kueue's visibility API), kept apart from its facts."""
        run_id = record.get("run_id")
        if isinstance(run_id, str) and run_id in self.retired:
            self.stats.after_retirement += 1
            return
        try:
            self.queues.position(record)
        except x.Malformed as exc:
            self._dead(source, "malformed queue position", v.pruned(record), str(exc))

    @property
    def dead_letters_full(self) -> bool:
        """Whether the dead letters kept until the next flush reached ``max_dead_letters``: a further one would be
        counted but not kept, so a caller that folds long batches flushes now."""
        return len(self.dead) >= self.limits.max_dead_letters

    def reject(self, source: str, reason: str, excerpt: str) -> None:
        """Count an input the shell could not even decode (bad JSON, oversized value) as a dead letter."""
        self.stats.records += 1
        self.stats.dead_letters += 1
        if len(self.dead) < self.limits.max_dead_letters:  # redacted by DeadLetter, its identity read from it
            self.dead.append(DeadLetter(source=source, reason=reason, excerpt=excerpt[:_EXCERPT_READ]))

    def _dead(self, source: str, reason: str, record: Any, detail: str = "") -> None:
        self.stats.dead_letters += 1
        if len(self.dead) < self.limits.max_dead_letters:
            self.dead.append(DeadLetter(source=source, reason=reason, detail=detail[:1024],
                                        identity=identity(record), excerpt=_excerpt(record)))

    def _run(self, run_id: str, progress: bool = False) -> RunFacts:
        """The run's facts (new ones if it has none), marked changed; ``progress``: by a progress report or a
        checkpoint event, which count as a change of the history's shape only where they change what it reads
        (``RunFacts.shape_seq``)."""
        r = self.runs.get(run_id)
        if r is None:
            r = self.runs[run_id] = RunFacts(run_id)
        elif run_id in self._freed_final:
            self._revive(run_id, r)
        if not progress:
            r.shape_seq += 1
        self._mark(run_id)
        return r

    def _revive(self, run_id: str, r: RunFacts) -> None:
        """Derive again, before a record changes it, a run whose derivation a flush freed (``_frees``), and take it as
        that flush did: unchanged since, its facts give the history, pod rows and points that flush wrote, so the
        update of the change goes out as if the derivation had been kept (only what changed; a pod the change takes
        from the run named as removed), at the cost of one derivation from the facts."""
        del self._freed_final[run_id]
        d = self.derivations[run_id] = Derivation()
        d.update(r)
        d.take()

    def _mark(self, run_id: str) -> None:
        self.dirty.add(run_id)
        if self.limits.retire_after_us is not None:
            self._touched.append(run_id)

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
            # a held record is kept with the reducer's state (the index, run-state): its free text redacted
            held = (etype, redact_object(v.pruned(obj)), source)
            for owner, (_e, old_obj, old_src) in self.corr.hold(ln.owner, held):
                self.stats.dropped_uncorrelated += 1
                self._dead(old_src, "uncorrelated", {"object": old_obj},
                           f"owner uid {owner} was not seen while {self.limits.max_held} records were held")
            return
        taken = taken_run_id(run_id)
        if taken is not None:
            # its root lost the run id to another one: this record, and the ones waiting for it, are dead letters
            self._conflict(source, {"type": etype, "object": v.pruned(obj)},
                           f"its owner (uid {ln.owner}) claims taugrid.io/run-id {taken!r}, which belongs to a root "
                           "created before it")
            self._release(ln.uid, run_id)
            return
        if run_id in self.retired:
            self._merge(RunFacts(run_id), ln, etype, obj)  # not kept; a malformed record is still a dead letter
            if ln.kind in ROOT_KINDS and not ln.submitter and self.corr.owner_run.get(ln.uid) != run_id:
                self._conflict(source, {"type": etype, "object": v.pruned(obj)},
                               f"taugrid.io/run-id {run_id!r} belongs to a run that has finished (another root, uid "
                               f"{', '.join(self.corr.owners_of(run_id)) or 'forgotten'}), not to this "
                               f"{ln.kind} (uid {ln.uid})")
                self._release(ln.uid, lost_key(run_id))
                return
            self.stats.after_retirement += 1
            return
        # A run is created, and marked changed, only once its first object merged: a malformed first record
        # (``Malformed`` is raised before anything is merged) leaves no empty run behind.
        r = self.runs.get(run_id)
        new = r is None
        if r is None:
            r = RunFacts(run_id)
        elif run_id in self._freed_final:
            self._revive(run_id, r)
        kind = ln.kind
        if kind in ROOT_KINDS and not ln.submitter:
            if r.uid is not None and r.uid != ln.uid:
                r = self._claim(r, kind, etype, obj, source)
                if r is None:
                    self._release(ln.uid, lost_key(run_id))
                    return
            else:
                x.merge_root(r, kind, etype, obj)
        else:
            self._merge(r, ln, etype, obj)
        if new:
            self.runs[run_id] = r
        r.shape_seq += 1
        self._mark(run_id)
        self._release(ln.uid, run_id)

    def _merge(self, r: RunFacts, ln: Link, etype: str, obj: dict[str, Any]) -> None:
        kind = ln.kind
        if kind in ROOT_KINDS and not ln.submitter:
            x.merge_root(r, kind, etype, obj)
        elif kind == "Workload":
            x.merge_workload(r, etype, obj)
        elif kind == "Pod":
            uid = x.merge_pod(r, obj, ln.owner, self.accelerators)
            if r.run_id not in self.retired:  # not the scratch facts a late record of a retired run is checked on
                self._pods_changed.setdefault(r.run_id, set()).add(uid)
                self._state_pods.setdefault(r.run_id, set()).add(uid)
        elif kind == "RayCluster":
            x.merge_raycluster(r, obj)
        elif kind == "Event":
            x.merge_event(r, obj, x.obj_at(obj, "regarding") or x.obj_at(obj, "involvedObject"))

    def _release(self, uid: str, run_id: str) -> None:
        """Bind ``uid`` to ``run_id`` and fold the records that were waiting for it; each one that cannot be used
        is a dead letter of its own (it was held before it was read)."""
        if not uid:
            return
        for held_etype, held_obj, held_source in self.corr.bind(uid, run_id):
            self.stats.released += 1
            try:
                self._object(held_etype, held_obj, held_source, None)
            except x.Malformed as exc:
                self._dead(held_source, f"malformed {held_obj.get('kind')}", {"type": held_etype, "object": held_obj},
                           str(exc))

    def _claim(self, r: RunFacts, kind: str, etype: str, obj: dict[str, Any], source: str) -> RunFacts | None:
        """A second root (another uid) claims the run id of ``r``: the root created first keeps it (then the smaller
        uid), whatever arrived first. Returns the run's facts with ``obj`` merged when it wins (the facts of the root
        it displaces are dropped: only the intake events, which belong to the run id, are kept), None when it loses.
        Either way the loser is a dead letter, and its uids are bound to ``lost_key`` so that its records are too."""
        meta = x.obj_at(obj, "metadata")
        mine = _claim_key(x.time_at(meta, "creationTimestamp"), x.str_at(meta, "uid"))
        theirs = _claim_key(r.created, r.uid or "")
        newcomer = f"{kind} {x.str_at(meta, 'namespace')}/{x.str_at(meta, 'name')} (uid {mine[2]}, created " \
                   f"{'never' if mine[0] else iso(mine[1])})"
        holder = f"{r.kind} {r.namespace}/{r.name} (uid {r.uid}, created {iso(r.created) or 'never'})"
        rule = "the root created first keeps a run id (at the same time: the smaller uid)"
        if mine > theirs:
            x.merge_root(RunFacts(r.run_id), kind, etype, obj)  # a malformed root is a malformed one first
            self._conflict(source, {"type": etype, "object": v.pruned(obj)},
                           f"taugrid.io/run-id {r.run_id!r} belongs to {holder}, not to this {newcomer}: {rule}")
            return None
        fresh = RunFacts(r.run_id)
        x.merge_root(fresh, kind, etype, obj)
        # the intake events belong to the run id, whichever root has it
        fresh.intake, fresh.progress_seen, fresh.progress_buckets = r.intake, r.progress_seen, r.progress_buckets
        fresh.metrics, fresh.checkpoint, fresh.points = r.metrics, r.checkpoint, r.points
        fresh.steps, fresh.ckpts = r.steps, r.ckpts
        fresh.seen_order, fresh.seen_of, fresh.minutes_changed = r.seen_order, r.seen_of, r.minutes_changed
        self.corr.rebind_run(r.run_id, lost_key(r.run_id))
        # the displaced root's pods are no longer the run's (the derivation sees the new facts and drops their rows)
        self._state_removed.setdefault(r.run_id, set()).update(r.pods)
        self._state_pods.pop(r.run_id, None)
        self._pods_changed.pop(r.run_id, None)
        self._conflict(source, {"object": {"kind": r.kind, "metadata": {
            "namespace": r.namespace, "name": r.name, "uid": r.uid}}},
            f"taugrid.io/run-id {r.run_id!r} belongs to {newcomer}, not to {holder}, which had it until then: {rule}; "
            "what was folded from its objects is dropped")
        self.runs[r.run_id] = fresh
        return fresh

    def _conflict(self, source: str, record: dict[str, Any], detail: str) -> None:
        self.stats.run_id_conflicts += 1
        self._dead(source, "run id taken by another root", record, detail)

    def _intake(self, record: dict[str, Any], source: str) -> None:
        schema = record.get("schema")
        if not isinstance(schema, str) or schema not in INTAKE_SCHEMAS:  # (a list or a dict is not hashable)
            self._dead(source, "unknown intake schema version", v.pruned(record),
                       f"schema={v.brief(record.get('schema'))}")
            return
        if v.too_deep(record):
            self._dead(source, "invalid intake event", v.pruned(record), f"nested more than {v.MAX_DEPTH} levels")
            return
        try:
            ev = IntakeEnvelope.model_validate({"event": record}).event
            at = ts(ev.at)
        except ValidationError as exc:
            self._dead(source, "invalid intake event", record, _validation_detail(exc))
            return
        except BadTimestamp as exc:
            self._dead(source, "invalid intake event", record, f"at: {exc}")
            return
        assert at is not None
        if taken_run_id(ev.run_id) is not None:
            self._dead(source, "invalid intake event", record, "run_id: starts with a NUL character")
            return
        if ev.run_id in self.retired:
            self.stats.after_retirement += 1
            return
        r = self._run(ev.run_id, progress=isinstance(ev, ProgressEvent | CheckpointSaveEvent | CheckpointRestoreEvent |
                                                      ResumeEvent))
        if isinstance(ev, CheckpointSaveEvent | CheckpointRestoreEvent | ResumeEvent):
            r.progress_seq += 1  # each merge is idempotent: no repeat check needed
            if isinstance(ev, CheckpointSaveEvent):
                r.ckpts.save(ev.step, redact_inline(ev.uri), ev.phase, at, ev.bytes)
            elif isinstance(ev, CheckpointRestoreEvent):
                r.ckpts.restore(ev.step, redact_inline(ev.uri), ev.phase, at)
            else:
                r.ckpts.resumed(at, ev.resume_of, _uri(ev.checkpoint_uri), ev.step)
            return
        if isinstance(ev, ProgressEvent):
            r.progress_seq += 1
            cap = self.limits.metric_points_per_run
            for name, value in ev.metrics.items():  # idempotent on its own: before the repeat check
                r.points.add(name, ev.step, value, at, cap)
            r.step(at, ev.step)  # idempotent too
            if ev.checkpoint_uri:  # v1's completed checkpoint (no duration)
                r.ckpts.save(ev.step, redact_inline(ev.checkpoint_uri), "completed", at, None)
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
                r.latest_checkpoint(ev.step, at, redact_inline(ev.checkpoint_uri))
            return
        data = redact_value(ev.model_dump(exclude={"schema_", "event_id", "run_id", "at", "kind", "status"},
                                          mode="json"))  # messages, input refs, the output URI: redacted
        r.intake[ev.event_id] = (ev.kind, ev.status, at, provenance.intake_data(data))

    # ------------------------------------------------------------------------------------ output
    def flush(self) -> Flushed:
        """What changed in every run changed since the last flush (sorted by run id), dead letters, and the runs
        retired since (their last updates are among the updates)."""
        # packed after the run-state snapshot read them; a run a record changed since (dirty), or that keeps its
        # derivation, is not. In run-id order: the first run packed gives the table its dictionary, the same in every
        # process (a set's order changes with the hash seed)
        for k in sorted(self._pack_next | self.runs.take_unpacked()):
            if k not in self.dirty and k not in self.derivations:
                self.runs.pack(k)
        self._pack_next = set()
        updates = {}
        state_points: dict[str, tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]] = {
            k: ((), keys) for k, keys in self._retiring_points.items()}
        for k in self.dirty:
            h = self._update(k)
            u = updates[k] = self.derivations[k].take()
            if u.points or u.removed_points:
                state_points[k] = (tuple((p.metric, p.step) for p in u.points or ()), u.removed_points)
            if self._frees(k, h):  # derived again from the facts before a late record changes the run
                del self.derivations[k]
                self._freed_final[k] = not may_reopen(self.runs[k], h.run)
                self._pack_next.add(k)
        self._state_points, self._retiring_points = state_points, {}
        self._state_minutes, self._retiring_minutes = self._retiring_minutes, {}
        updates.update(self._retired_updates)
        queues, positions = self.queues.take()
        out = Flushed([updates[k] for k in sorted(updates)], self.dead, self._retired_now, self._forgotten_now,
                      queues, positions, self._forgotten_seq, self.nodes.take())
        self.dirty = set()
        self.dead = []
        self._retired_updates = {}
        self._retired_now = []
        self._forgotten_now = []
        self._forgotten_seq = {}
        return out

    def _update(self, run_id: str) -> RunHistory:
        """The run's derivation brought up to date with its facts."""
        d = self.derivations.get(run_id)
        if d is None:
            self._freed_final.pop(run_id, None)
            d = self.derivations[run_id] = Derivation()
        return d.update(self.runs[run_id], self._pods_changed.pop(run_id, ()))

    def _frees(self, run_id: str, h: RunHistory) -> bool:
        """Whether the run's derivation goes once its history ``h`` is written: the run finished and is narrow
        (``ReducerLimits.finished_derivation_rows``)."""
        if h.run.status not in FINAL_STATUSES:
            return False
        rows = self.limits.finished_derivation_rows
        r = self.runs[run_id]
        return rows is None or len(r.pods) + r.points.size <= rows

    def current(self, run_id: str) -> RunHistory | None:
        """The current history of a live run, without its metric points and pods (cheap: ``Derivation.update``)."""
        return self._read(run_id).history if run_id in self.runs else None

    def history(self, run_id: str) -> RunHistory | None:
        """The complete current history of a live run (with its metric points and pods)."""
        return self._read(run_id).document() if run_id in self.runs else None

    def _read(self, run_id: str) -> Derivation:
        """The live run's derivation, up to date: its kept one (kept from now on for a live run read without one, as
        a restored run); for a run whose derivation a flush frees (``_frees``), one of its own, dropped after, so that
        reading it does not keep one again (its facts packed at the next flush, if a restored run's were not yet)."""
        if run_id in self.derivations or run_id in self.dirty:
            self._update(run_id)
            return self.derivations[run_id]
        d = Derivation()
        h = d.update(self.runs[run_id])
        if run_id not in self._freed_final:
            if not self._frees(run_id, h):
                self.derivations[run_id] = d
            else:  # finished and narrow, never derived here (a restored run): packed at the next flush too
                self._pack_next.add(run_id)
        return d

    # ------------------------------------------------------------------------------------ snapshot
    @classmethod
    def restore(cls, snap: dict[str, Any], limits: ReducerLimits | None = None) -> Reducer:
        """A reducer from a whole ``snapshot`` (``tracker.core.snapshot``)."""
        red = cls(limits)
        red._load(snap)
        return red

def _uri(uri: str | None) -> str | None:
    """A checkpoint URI as the tracker keeps it: its credentials (a SAS signature, a password) redacted."""
    return None if uri is None else redact_inline(uri)


def _excerpt(record: Any) -> str:
    """The record's JSON, cut short: ``DeadLetter`` redacts it (a cut anywhere is fine) and cuts it again."""
    try:
        text = json.dumps(record, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(record)
    return text[:_EXCERPT_READ]


def _claim_key(created: int | None, uid: str) -> tuple[bool, int, str]:
    """Order of two roots claiming one run id: the one created first (one without a creation time last), then uid."""
    return created is None, created or 0, uid


def _validation_detail(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
