"""Derive a run's history (phases, attempts, status) from its facts.

Theory of operation
===================

``derive`` is a pure function of ``RunFacts``: the same facts always give the same history, whatever order the
objects that produced them arrived in, and however often it is called. Times come only from the objects (and
from TauGrid's intake events), never from a clock. The facts (``facts.py``) are merged commutatively as records
arrive, and a history is a function of all of them: the rules below read sets of facts (every condition a
Workload ever carried, keyed by type, status, reason and lastTransitionTime; every pod; every RayJob deployment)
rather than a sequence of changes: a watch restarted after a ``410 Gone`` loses intermediate states, and streams of
different kinds are not ordered with respect to each other (``shared/reference/lifecycle.md`` §5.1).

What is worked out from a run's pods is kept between changes (``Derivation``, ``derive_pods.PodSide``): per pod its
row and what it adds to its attempt's sums, so that a change of one pod re-derives that pod and its attempt's sums,
not every pod of the run; the cost of a change does not grow with the run's width. What is kept is itself a function
of the facts (a pod's row of its own facts and of its attempt's layout; a change of the layout rebuilds every row),
so an incremental derivation equals one from scratch (``derive``), which the laws check.

A history is built in five steps, each a table or a function. ``derive`` (below) runs them and assembles the
history and its run record (``_record``); the attempts of step 2 are worked out in ``derive_attempts.py``, and
the rule tables of steps 1, 3, 4 and 5, with the functions their rows name, are in ``derive_rules.py``:

1. **Intake** (``_intake``): TauGrid's Resolution and Rendering events give the first two phases
   (``INTAKE_PHASES``), the provenance fields used when the root object does not carry them, and an intake
   failure.
2. **Attempts**: an attempt is one admission of the run. ``_kueue_attempts`` cuts the Workload's conditions into
   admission / eviction cycles (Kueue keeps one Workload through evictions and requeues: lifecycle.md §7, "cross
   object rules"); ``_split_ray_retries`` cuts an admission again where KubeRay retried the RayJob on a new
   RayCluster (``derive_attempts.py``); each pod ran in one attempt, and the attempts' sums over their pods are
   what steps 4 and 5 and the GPU accounting read (``derive_pods.py``).
3. **Final status** (``FINAL_STATUS_RULES``): the first rule whose evidence is present decides whether and how the
   run finished. The order is the precedence: an object's own terminal condition beats the Workload's
   ``Finished``, which beats a deactivation, which beats a deletion.
4. **Phase entries** (``ATTEMPT_PHASES``): for each attempt, in Phase order, when it entered Admission,
   Scheduling, Runtime and Progress, and (for a deactivation a reactivation undid) Completion. Then Completion
   once for the run, at the final status's time. Within an attempt a phase is never entered before the one
   before it: a time that would go back is raised to the previous entry's (clocks of different nodes and
   controllers disagree by a little).
5. **Run record**: the status of an unfinished run (running once it is in ``RUNNING_PHASES`` and a container of
   its current attempt started, else pending), why it waits (``WAIT_RULES``), counts, and provenance
   (``_record``, below; what ran, its images, entrypoint and hyperparameters: ``tracker.core.provenance``).

Each table is ordered and holds the rules of one decision; a reader can check each row against lifecycle.md
(§1.7 for Kueue, §2 for Jobs, §3 for Pods, §4 for KubeRay, §7 for the mapping to the seven phases).
``tests/core/test_derive_tables.py`` checks their invariants.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import pairwise

from tracker.core import gpu, provenance
from tracker.core.curves import MetricPoints
from tracker.core.derive_attempts import (
    EVICTION_NOT_OBSERVED,
    RAYJOB_RETRY,
    Reason,
    _Att,
    _kueue_attempts,
    _split_ray_retries,
    is_deactivation,
)
from tracker.core.derive_ledger import attempt_fields, checkpoint_rows, record_fields, restores, run_ledger
from tracker.core.derive_ledger import spans as ledger_spans
from tracker.core.derive_pods import _BEFORE_ALL, AttemptContext, AttemptPods, Layout, PodSide
from tracker.core.derive_rules import (
    ATTEMPT_PHASES,
    RUNNING_PHASES,
    Entry,
    _Final,
    _final,
    _Intake,
    _intake,
    _pending_reason,
    _Run,
    _source,
    _view,
    first_report,
)
from tracker.core.facts import RunFacts
from tracker.core.ledger import Stretches
from tracker.core.model import (
    ANN_CONFIG_DIGEST,
    ANN_CONFIG_REF,
    ANN_GIT_COMMIT,
    ANN_INPUT_REFS,
    ANN_OUTPUT,
    ANN_RESUME_OF,
    LABEL_PROJECT,
    LABEL_TARGET,
    LABEL_WORKSPACE,
    MAX_FAILURES_LISTED,
    Attempt,
    HistoryUpdate,
    MetricPoint,
    MetricSummary,
    Phase,
    PodFailure,
    ResumeLink,
    RunHistory,
    RunRecord,
    Status,
    Transition,
    utc,
)
from tracker.core.pending import AttemptPending, attempt_pending


def may_reopen(r: RunFacts, run: RunRecord) -> bool:
    """Whether a run that looks finished may still come back: stopped by a Kueue deactivation while its Job or
    RayJob still exists, so that a reactivation reopens it. Such a run is not finished for good (a consumer
    that frees finished runs must keep it); once its root is deleted it is."""
    return run.status is Status.STOPPED and is_deactivation(run.reason) and r.root_deleted is None


# ------------------------------------------------------------------------------------------ derive


def derive(r: RunFacts) -> RunHistory:
    """The complete history of a run (with its metric points and pods), derived from scratch."""
    d = Derivation()
    d.update(r)
    return d.document()


class Derivation:
    """One run's derivation, kept between changes: ``update`` after the run's facts changed gives its history (without
    metric points and pods); ``take`` what changed since the previous take; ``document`` the complete history.

    What an update costs does not grow with the run's width: the pod side (``derive_pods.PodSide``) recomputes only
    the pods named as changed, and the metric curves, summaries and progress times are rebuilt only when a progress
    report changed them (``RunFacts.progress_seq``). The rest (intake, attempts, final status, phase entries, the
    run record: its ``_Shape``) is recomputed from the facts when anything but a progress report changed them
    (``RunFacts.shape_seq``), or when a progress report changed what the shape reads of progress: the latest
    checkpoint (``RunFacts.latest_checkpoint`` counts it as a change of shape), or an attempt's first progress report
    (``_Shape.holds``: a report in a new progress minute after its attempt's first changes none); it reads the run's
    conditions, deployments, events and intake events, which do not grow with its pods.
    A progress report that changed nothing else (most of a running run's changes) costs the goodput ledger, the
    checkpoints and the metrics only. The shape is kept only while the run is running: a pending or finished run
    rarely reports progress, and its derivation stays the size it was."""

    __slots__ = ("_facts", "_metrics", "_points_of", "_progress", "_seq", "_shape", "_shape_seq", "_steps",
                 "_stretches", "_taken", "history", "pods", "shapes")

    def __init__(self) -> None:
        self.pods = PodSide()
        self.history: RunHistory | None = None
        self._facts: RunFacts | None = None
        self._seq = -1  # the progress_seq the cached metric parts are of
        self._metrics: list[MetricSummary] = []
        self._progress: list[int] = []
        self._steps: list[tuple[int, int]] = []  # the step records (the ledger's), as of progress_seq
        self._stretches: Stretches | None = None  # their stretches, as the last update found them (running runs)
        self._shape: _Shape | None = None
        self._shape_seq = -1  # the shape_seq the shape is of
        self.shapes = 0  # shapes derived (the cost the progress-only path saves: its tests count them)
        # the metric points object whose changes the last take drained (another one: every point goes out)
        self._points_of: MetricPoints | None = None
        self._taken: RunHistory | None = None  # the history the last take gave

    def update(self, r: RunFacts, changed: Iterable[str] | None = None) -> RunHistory:
        """Derive the history of ``r``; ``changed``: the uids of the pods whose facts changed since the last update
        (None: anything may have; also when ``r`` is not the facts object of the last update)."""
        # the shape still holds if nothing it reads changed: the same facts, no pod, no change of shape, and each
        # attempt's first progress report the same (``_Shape.holds``)
        same = r is self._facts and changed is not None and not changed and r.shape_seq == self._shape_seq
        if same and r.progress_seq == self._seq and self.history is not None:
            return self.history  # nothing changed since the last update
        shape = self._shape
        if r is not self._facts or r.progress_seq != self._seq:
            if r is not self._facts:
                changed = None
            self._facts, self._seq = r, r.progress_seq
            self._metrics = _metrics(r)
            self._progress = sorted(r.progress_buckets.values())
            self._steps = r.steps.records()
            same = same and shape is not None and shape.holds(self._progress)
        if shape is None or not same:
            shape = _shape(r, self.pods, changed, self._progress)
            self._shape_seq = r.shape_seq
            self.shapes += 1
        # kept for the next update while the run runs (what reports progress); not for the others, which would keep
        # about 2 KiB each for a change that rarely comes; nor are the ledger's stretches (about 250 bytes)
        running = shape.record.status is Status.RUNNING
        if not running:
            self._stretches = None
        elif self._stretches is None and self._steps:
            self._stretches = Stretches()
        history = self.history = _derive(r, shape, self.pods, self._metrics, self._steps, self._stretches)
        # the shape kept holds the history's attempts, record and transitions, not copies of its own: the next
        # ``_derive`` sets every ledger field of them anew, and reads only what the ledger does not set (and the
        # record's own ``resume_of`` and ``last_checkpoint``, kept apart), so it gives what the shape's own would
        self._shape = _Shape(shape.atts, shape.losses, shape.final, history.transitions, history.attempts,
                             history.run, shape.reports, shape.own) if running else None
        return history

    def take(self) -> HistoryUpdate:
        """What changed since the last take: the history of the last update (None if it is the one the last take
        gave), the pods that changed, the metric points added or changed and those no longer kept (the first take:
        all the pods and points, ``full``; all the points, ``points_full``, if the facts' points are another object
        than the last take's)."""
        assert self.history is not None and self._facts is not None, "update before take"
        rows, removed, full = self.pods.take()
        mp = self._facts.points
        changed, gone = mp.drain()
        whole = full or mp is not self._points_of
        self._points_of = mp
        points: list[MetricPoint] | None
        if whole:
            points = _points(self._facts)
        else:
            run_id = self._facts.run_id
            points = [MetricPoint(run_id=run_id, metric=k, step=step, value=value, at=utc(at))
                      for k, s in sorted(changed) for step, value, at in (mp.point(k, s),)] or None
        history: RunHistory | None = self.history
        if not full and history == self._taken:  # a change of pods that moved nothing of the run's own history
            history = None
        else:
            self._taken = history
        # the points gone since the last take are named even when all the points go out: the records of a
        # sink that reads the points one by one (Kafka's transitions) are replaced point by point
        return HistoryUpdate(run_id=self.history.run.run_id, history=history, points=points, pods=rows,
                             removed_pods=removed, removed_points=tuple(sorted(gone)), full=full,
                             points_full=whole and not full)

    @property
    def taken(self) -> bool:
        """Whether a take gave this derivation's history out (a sink holds what it gave)."""
        return self._taken is not None

    def document(self) -> RunHistory:
        """The complete history of the last update."""
        assert self.history is not None and self._facts is not None, "update before document"
        return replace(self.history, metric_points=_points(self._facts), pods=self.pods.rows())


@dataclass(slots=True, frozen=True)
class _Shape:
    """What a run's history is before the goodput ledger (steps 1 to 5; ``_derive`` sets the ledger's fields): all of
    it a function of the facts other than its metrics, step records and checkpoint saves and restores, and of each
    attempt's first progress report, so a progress report that changed none of those nor the latest checkpoint leaves
    it as it was (``Derivation.update``)."""

    atts: list[_Att]
    losses: list[str | None]
    final: _Final | None
    transitions: list[Transition]
    attempts: list[Attempt]  # the ledger's fields as the last ``_derive`` set them (none before), which sets them anew
    record: RunRecord  # the same
    # what it read of the progress times: each attempt's window and the first report found in it (``_view``)
    reports: list[tuple[tuple[int, int | None, int | None] | None, int | None]]
    own: tuple[str | None, str | None]  # the record's resume_of and last_checkpoint before the ledger's fields

    def holds(self, progress_times: list[int]) -> bool:
        """Whether the shape is the same with these progress times (and the same facts otherwise): each attempt's
        first report is the one it read. A report in a minute not seen yet, after its attempt's first, changes none."""
        return all(first_report(progress_times, window) == at for window, at in self.reports)


def _derive(r: RunFacts, shape: _Shape, side: PodSide, metrics: list[MetricSummary],
            steps: list[tuple[int, int]], kept: Stretches | None) -> RunHistory:
    """The history of the run of ``shape``: the shape with the goodput ledger's fields, the metrics and checkpoints."""
    atts, final = shape.atts, shape.final
    rs = restores(r.ckpts)
    led = run_ledger(r, steps, rs, atts, shape.losses, side.attempts, shape.attempts, final.at if final else None,
                     kept)
    attempts_out = [replace(a, **attempt_fields(led, i)) for i, a in enumerate(shape.attempts)]
    record = record_fields(r, led, shape.record, rs, shape.own)
    links = [ResumeLink(run_id=r.run_id, resume_of=record.resume_of)] if record.resume_of else []
    return RunHistory(run=record, transitions=list(shape.transitions), attempts=attempts_out, metrics=metrics,
                      resume_links=links, checkpoints=checkpoint_rows(r, rs, atts), ledger=ledger_spans(led))


def _shape(r: RunFacts, side: PodSide, changed: Iterable[str] | None, progress_times: list[int]) -> _Shape:
    """Steps 1 to 5 of the module docstring, without the goodput ledger (``_derive`` adds it)."""
    intake = _intake(r)
    atts = _split_ray_retries(r, _kueue_attempts(r))
    run = _Run(r, atts, _source(r.kind, r.namespace, r.name), _source("Workload", r.namespace, r.wl_name))
    final = _final(run, intake)
    # close the last attempt at completion
    if final is not None and atts and atts[-1].end is None:
        atts[-1].end, atts[-1].end_reason, atts[-1].end_message = final.at, final.reason, final.message
    losses = gpu.attempt_losses([a.trigger for a in atts], [a.end_reason for a in atts],
                                [a.end is not None for a in atts], final.status if final else None,
                                final.reason if final else None)
    side.update(r, _layout(r, atts, losses), changed)

    transitions: list[Transition] = []
    last_attempt = last_at = 0  # of the last entry

    def add(attempt: int, phase: Phase, e: Entry) -> None:
        nonlocal last_attempt, last_at
        at = e.at
        if at is None:
            return
        if last_attempt == attempt and at < last_at:
            at = last_at  # never before the attempt's previous entry
        last_attempt, last_at = attempt, at
        transitions.append(Transition(run_id=r.run_id, attempt=attempt, phase=phase, at=utc(at),
                                      reason=e.reason, message=e.message, source=e.source))

    for phase, entry in intake.phases.items():
        add(1, phase, entry)

    attempts_out: list[Attempt] = []
    reports: list[tuple[tuple[int, int | None, int | None] | None, int | None]] = []
    total_retries = 0
    pend: AttemptPending | None = None
    for i, a in enumerate(atts, start=1):
        pods = side.attempts[i - 1]
        v = _view(run, i, a, pods, progress_times)
        reports.append((v.window, v.reported_at))
        for rule in ATTEMPT_PHASES:
            e = rule.enter(run, v)
            if e is not None:
                add(i, rule.phase, e)
        retries = pods.retries()
        total_retries += retries
        wait = None
        if a.queued is not None and a.admitted is not None:
            wait = (a.admitted - a.queued) / 1_000_000
        pend = attempt_pending(r, a, i, pods, v.runtime_at, v.progress_at)
        attempts_out.append(_attempt(r.run_id, i, a, v.started_at, v.progress_at, wait, retries, pods,
                                     side.failures(i - 1, MAX_FAILURES_LISTED), pend))

    if final is not None:
        add(max(1, len(atts)), Phase.COMPLETION, Entry(final.at, final.reason, final.message, final.source))

    pending = Reason(*r.wl_pending) if r.wl_pending else None  # the Workload's QuotaReserved=False, now
    if final is None and pend is not None and pend.check is not None:
        # quota reserved, an admission check not Ready: the check is what the run waits for
        name, state, msg = pend.check
        pending = Reason(f"AdmissionCheck{state}", f"{name}: {msg}" if msg else name)
    if pending and atts and atts[-1].reopened and atts[-1].admitted is None and \
            pending.message == atts[-1].trigger_message:
        # Kueue leaves the deactivation's message in QuotaReserved=False until its scheduler has tried again
        pending = None
    reason: str | None
    if final is not None:
        status, reason, message = final.status, final.reason, final.message
    else:
        last_phase = transitions[-1].phase if transitions else Phase.ADMISSION
        started = bool(attempts_out) and (attempts_out[-1].progress_at is not None or side.attempts[-1].started > 0)
        status = Status.RUNNING if last_phase in RUNNING_PHASES and started else Status.PENDING
        reason, message = _pending_reason(r, atts, side.attempts[-1] if side.attempts else None, last_phase, pending)
    phase = transitions[-1].phase if transitions else (Phase.ADMISSION if r.kind else Phase.RESOLUTION)

    record = _record(run, intake, final, attempts_out, status, reason, message, phase, pending, total_retries)
    return _Shape(atts, losses, final, transitions, attempts_out, record, reports,
                  (record.resume_of, record.last_checkpoint))


def _layout(r: RunFacts, atts: list[_Att], losses: list[str | None]) -> Layout:
    """What the pods read of the attempts (``derive_pods.Layout``)."""
    return Layout(r.kind == "RayJob", r.namespace, tuple(
        AttemptContext(a.start if a.start is not None else (a.queued if a.queued is not None else _BEFORE_ALL),
                       a.ray_cluster, a.end, loss) for a, loss in zip(atts, losses, strict=True)))


_US_PER_HOUR = gpu.US_PER_HOUR


def _attempt(run_id: str, i: int, a: _Att, started_at: int | None, progress_at: int | None, wait: float | None,
             retries: int, pods: AttemptPods, failures: list[PodFailure], pend: AttemptPending) -> Attempt:
    open_gpus = pods.open_gpus
    return Attempt(
        run_id=run_id, attempt=i, trigger=a.trigger, queued_at=utc(a.queued), admitted_at=utc(a.admitted),
        scheduled_at=utc(a.start), started_at=utc(started_at), progress_at=utc(progress_at),
        ended_at=utc(a.end), end_reason=a.end_reason, end_message=a.end_message, underlying_cause=a.cause,
        admission_wait_s=wait, cluster_queue=a.cq, ray_cluster=a.ray_cluster, retries=retries,
        failures=failures, failed_pods=len(pods.failures), pod_count=pods.count,
        gpus=pods.peak.peak(), gpu_hours=pods.held / _US_PER_HOUR, lost_gpu_hours=pods.lost / _US_PER_HOUR,
        lost_gpu_hours_by={k: v[0] / _US_PER_HOUR for k, v in sorted(pods.by.items())}, gpus_open=open_gpus,
        open_since=utc(pods.open_weight // open_gpus) if open_gpus else None,
        quota_reserved_at=utc(pend.reserved), admission_steps=pend.steps, pending=pend.spans, pending_s_by=pend.by)


def _evictions_by(atts: list[_Att], final: _Final | None, counted: int) -> dict[str, int]:
    """A run's Kueue evictions by reason: each attempt ended by an eviction that the next attempt re-queued (its
    reason: how the attempt ended, else the next one's trigger), a final deactivation, and what Kueue counted
    (``counted``: its Workloads' status.evictions) beyond those, as ``EvictionNotObserved``."""
    out: dict[str, int] = {}
    for prev, nxt in pairwise(atts):
        if nxt.trigger not in (RAYJOB_RETRY, EVICTION_NOT_OBSERVED):
            why = prev.end_reason or nxt.trigger
            out[why] = out.get(why, 0) + 1
    if final is not None and atts and atts[-1].end_reason == final.reason and is_deactivation(final.reason):
        out[final.reason] = out.get(final.reason, 0) + 1
    missing = counted - sum(out.values())
    if missing > 0:
        out[EVICTION_NOT_OBSERVED] = out.get(EVICTION_NOT_OBSERVED, 0) + missing
    return dict(sorted(out.items()))


def _record(run: _Run, intake: _Intake, final: _Final | None, attempts_out: list[Attempt], status: Status,
            reason: str | None, message: str, phase: Phase, pending: Reason | None, retries: int) -> RunRecord:
    r, atts = run.r, run.atts
    cur = attempts_out[-1] if attempts_out else None
    queued_cur = next((x for x in reversed(attempts_out) if x.queued_at is not None), None)
    evictions_by = _evictions_by(atts, final, sum(r.wl_evictions.values()))
    evictions = sum(evictions_by.values())
    # provenance: the root's labels and annotations (what tau rendered), else what the intake events said
    prov = intake.prov
    ann = r.annotations
    input_refs = [x for x in ann.get(ANN_INPUT_REFS, "").split(",") if x] or prov.get("input_refs") or []
    images, entrypoint = provenance.merged(r.workload, prov.get("image"), prov.get("entrypoint"))  # what ran
    waiting = pending if pending and final is None and cur and cur.admitted_at is None else None
    pending_s_by: dict[str, float] = {}
    for att in attempts_out:
        for k, secs in att.pending_s_by.items():
            pending_s_by[k] = pending_s_by.get(k, 0.0) + secs
    open_span = cur.pending[-1] if final is None and cur and cur.pending and cur.pending[-1].end is None else None
    return RunRecord(
        run_id=r.run_id, kind=r.kind or prov.get("workload_kind"), namespace=r.namespace or prov.get("namespace"),
        name=r.name or prov.get("name"), uid=r.uid,
        project=r.labels.get(LABEL_PROJECT) or prov.get("project"),
        workspace=r.labels.get(LABEL_WORKSPACE) or prov.get("workspace"),
        target=r.labels.get(LABEL_TARGET) or prov.get("target"),
        queue=r.wl_queue or prov.get("queue"), cluster_queue=next((a.cq for a in reversed(atts) if a.cq), None),
        status=status, reason=reason, message=message, phase=phase, attempts=len(atts), retries=retries,
        evictions=evictions, evictions_by=evictions_by, created_at=utc(r.created),
        queued_at=queued_cur.queued_at if queued_cur else None,
        admitted_at=queued_cur.admitted_at if queued_cur else None,
        started_at=next((a.started_at for a in attempts_out if a.started_at is not None), None),
        finished_at=utc(final.at) if final else None,
        admission_wait_s=queued_cur.admission_wait_s if queued_cur else None,
        pending_reason=waiting.reason if waiting else None,
        pending_message=waiting.message if waiting else "",
        git_commit=ann.get(ANN_GIT_COMMIT) or prov.get("git_commit"),
        config_digest=ann.get(ANN_CONFIG_DIGEST) or prov.get("config_digest"),
        config_ref=ann.get(ANN_CONFIG_REF) or prov.get("config_ref"),
        input_refs=input_refs, output_uri=ann.get(ANN_OUTPUT) or prov.get("output_uri"),
        resume_of=ann.get(ANN_RESUME_OF), last_checkpoint=r.checkpoint[2] if r.checkpoint else None,  # (step, at, uri)
        **gpu.totals(attempts_out),
        pending_s_by=dict(sorted(pending_s_by.items())),
        pending_category=open_span.category if open_span else None,
        pending_since=open_span.start if open_span else None,
        quota_reserved_at=queued_cur.quota_reserved_at if queued_cur else None,
        images=list(images), entrypoint=entrypoint, hyperparameters=prov.get("hyperparameters") or {},
        hyperparameters_omitted=prov.get("hyperparameters_omitted") or 0,
    )


def _metrics(r: RunFacts) -> list[MetricSummary]:
    return [MetricSummary(run_id=r.run_id, metric=k, first_step=m.first[0], first_value=m.first[1],
                          latest_step=m.latest[0], latest_value=m.latest[1], min_value=m.lo, max_value=m.hi,
                          points=m.points) for k, m in sorted(r.metrics.items())]


def _points(r: RunFacts) -> list[MetricPoint]:
    return [MetricPoint(run_id=r.run_id, metric=k, step=step, value=value, at=utc(at))
            for k, curve in sorted(r.points.curves.items()) for step, value, at in sorted(curve.values())]
