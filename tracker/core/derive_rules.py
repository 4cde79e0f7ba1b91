"""The rule tables of ``derive`` (``derive.py``): steps 1, 3, 4 and 5 of its theory of operation.

``INTAKE_PHASES`` (the phases TauGrid reports itself), ``FINAL_STATUS_RULES`` (whether and how a run finished, in
precedence order), ``ATTEMPT_PHASES`` (when each attempt entered each phase) and ``WAIT_RULES`` (why an unfinished
run waits), each with the functions its rows name, and the values those functions read. Each table is ordered and
holds the rules of one decision; ``tests/core/test_derive_tables.py`` checks their invariants.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from tracker.core.derive_attempts import (
    RAYJOB_RETRY,
    REACTIVATED,
    SUBMITTED,
    Reason,
    _Att,
    _first_true,
    is_deactivation,
)
from tracker.core.derive_pods import AttemptPods
from tracker.core.facts import RunFacts, Unschedulable
from tracker.core.model import Phase, Status

INTAKE_SOURCE = "TauGrid/intake"


# ------------------------------------------------------------------------------------------ values


@dataclass(slots=True)
class Entry:
    """A phase entry before it becomes a ``Transition``: when, why, and the object that evidences it. (A plain
    slotted class: made for every transition, it is built twice as fast as a NamedTuple.)"""

    at: int | None  # None: not entered
    reason: str
    message: str
    source: str


@dataclass(slots=True)
class _Final:
    status: Status
    reason: str
    message: str
    at: int | None
    source: str


class _IntakeFailure(NamedTuple):
    at: int
    reason: str
    message: str
    kind: str


@dataclass(slots=True)
class _Intake:
    """What TauGrid's Resolution and Rendering events say of a run."""

    phases: dict[Phase, Entry]  # in the order they were entered
    prov: dict[str, Any]  # provenance fields, the earliest value of each
    failure: _IntakeFailure | None


@dataclass(slots=True)
class _Run:
    """What every rule of one derivation reads besides the attempt at hand."""

    r: RunFacts
    atts: list[_Att]
    root_src: str
    wl_src: str


@dataclass(slots=True)
class _AttemptView:
    """One attempt with the times its phase entries are read from."""

    number: int  # from 1
    att: _Att
    pods: AttemptPods  # the sums over its pods
    scheduled: int  # pods of the attempt scheduled (RayJob: pods of its RayClusters)
    started_at: int | None  # the expected number of pods scheduled (or the RayCluster ready)
    runtime_at: int | None  # started_at if the attempt had not ended before: the Runtime entry
    progress_at: int | None  # first progress report or Ray app start inside the attempt: Progress
    # where its progress reports are looked for (``first_report``): (from, to or None, before or None), None: nowhere
    # yet; and the first report found there (what the shape reads of the progress times: ``derive._Shape.holds``)
    window: tuple[int, int | None, int | None] | None
    reported_at: int | None


def _source(kind: str | None, ns: str | None, name: str | None) -> str:
    return f"{kind or '?'}/{ns or '?'}/{name or '?'}"


# ------------------------------------------------------------------------------------------ 1. intake


class IntakePhase(NamedTuple):
    """A phase TauGrid reports itself, before the Kubernetes object exists: entered at the first intake event of
    its kind (``started``, or directly ``succeeded``/``failed``), with the reason ``<kind><Status>``."""

    kind: str  # the intake event's kind
    phase: Phase
    reasons: tuple[str, ...]


INTAKE_PHASES: tuple[IntakePhase, ...] = (
    IntakePhase("Resolution", Phase.RESOLUTION, ("ResolutionStarted", "ResolutionSucceeded", "ResolutionFailed")),
    IntakePhase("Rendering", Phase.RENDERING, ("RenderingStarted", "RenderingSucceeded", "RenderingFailed")),
)
_INTAKE_PHASE = {p.kind: p.phase for p in INTAKE_PHASES}


def _intake(r: RunFacts) -> _Intake:
    phases: dict[Phase, Entry] = {}
    prov: dict[str, Any] = {}
    failure: _IntakeFailure | None = None
    # facts.RunFacts.intake: event id -> (kind, status, at, data); in time order, then by event id
    for _eid, (kind, status, at, data) in sorted(r.intake.items(), key=lambda kv: (kv[1][2], kv[0])):
        phase = _INTAKE_PHASE[kind]
        if phase not in phases:
            reason = f"{kind}Started" if status == "started" else f"{kind}{status.capitalize()}"
            phases[phase] = Entry(at, reason, "", INTAKE_SOURCE)
        for k, v in data.items():
            if v not in (None, "", []) and k not in ("reason", "message"):
                prov.setdefault(k, v)
        if status == "failed" and failure is None:
            failure = _IntakeFailure(at, data.get("reason") or f"{kind}Failed", data.get("message") or "", kind)
    return _Intake(phases, prov, failure)


# ------------------------------------------------------------------------------------------ 3. final status
# Each rule returns the final status if its evidence is present. lifecycle.md §7, Completion: Job Complete/Failed,
# RayJob jobDeploymentStatus Complete/Failed (with jobStatus), Workload Finished=True (Succeeded or Failed); terminal
# without Finished: a deactivation, the root deleted.


def _intake_failed(run: _Run, intake: _Intake) -> _Final | None:
    f = intake.failure
    if f is None or run.r.kind is not None:
        return None  # once the object exists, the object says how the run ends
    return _Final(Status.FAILED, f.reason, f.message, f.at, INTAKE_SOURCE)


def _job_condition(ctype: str, status: Status, default_reason: str) -> Callable[[_Run, _Intake], _Final | None]:
    def rule(run: _Run, intake: _Intake) -> _Final | None:
        first = _first_true(run.r.job_conds, ctype)
        if first is None:
            return None
        return _Final(status, first.reason or default_reason, first.message, first.at, run.root_src)
    return rule


def _rayjob_finished(run: _Run, intake: _Intake) -> _Final | None:
    r = run.r
    if not r.ray:
        return None
    out = r.ray[max(r.ray)].outcome  # the latest deployment's: an earlier one's Failed is retried
    if out is None or out.deployment_status not in ("Complete", "Failed"):
        return None
    ok = Status.SUCCEEDED if out.deployment_status == "Complete" and out.job_status == "SUCCEEDED" else Status.FAILED
    return _Final(ok, out.reason or ("Succeeded" if ok is Status.SUCCEEDED else out.job_status or "Failed"),
                  out.message, out.end if out.end > 0 else None, run.root_src)


def _workload_finished(run: _Run, intake: _Intake) -> _Final | None:
    first = _first_true(run.r.wl_conds, "Finished")
    if first is None:
        return None
    return _Final(Status.SUCCEEDED if first.reason == "Succeeded" else Status.FAILED, first.reason, first.message,
                  first.at, run.wl_src)


def _deactivated(run: _Run, intake: _Intake) -> _Final | None:
    a = run.atts[-1] if run.atts else None
    if a is None or not a.end_reason or not is_deactivation(a.end_reason):
        return None
    return _Final(Status.STOPPED, a.end_reason or "Deactivated", a.end_message, a.end, run.wl_src)


def deletion_time(r: RunFacts, atts: list[_Att]) -> int | None:
    """When a deleted run ended: the best evidence the objects hold, in this order: the root's deletionTimestamp,
    the Workload's, the latest deletion asked for of its pods (less their grace period), the last container
    ``finishedAt`` (both only from the last attempt on: an earlier eviction's deletions say nothing of this one).
    None if the root was not deleted or no object recorded when (then ``latest_carried`` is the best bound)."""
    if r.root_deleted is None:
        return None
    for evidence in (r.root_deletion, r.wl_deletion):
        if evidence is not None:
            return evidence
    last = atts[-1] if atts else None
    if last is None or last.start is not None:  # an attempt still queued has no pods: theirs are an earlier one's
        lo = last.start if last else r.created
        for evidence in (r.pods_deleted, r.pods_finished):
            if evidence is not None and (lo is None or evidence >= lo):
                return evidence
    return None


def latest_carried(r: RunFacts) -> int | None:
    """The latest time the run's objects carry (a lower bound of a deletion no object recorded): the deleted root's
    (``root_deleted``), its Workload's conditions and admission checks, its Events' last times."""
    times = [r.root_deleted, *(k[3] for k in r.wl_conds), *(k[3] for k in r.wl_checks),
             *(e.last for e in r.events.values())]
    found = [x for x in times if x is not None]
    return max(found) if found else None


_DELETED = "the workload was deleted before it finished"
_DELETED_UNRECORDED = (f"{_DELETED} (when is not recorded: no object carries its deletion; this is the latest time "
                       "its objects carry)")


def _root_deleted(run: _Run, intake: _Intake) -> _Final | None:
    r = run.r
    if r.root_deleted is None:
        return None
    at = deletion_time(r, run.atts)
    if at is not None:
        return _Final(Status.STOPPED, "Deleted", _DELETED, at, run.root_src)
    return _Final(Status.STOPPED, "Deleted", _DELETED_UNRECORDED, latest_carried(r), run.root_src)


class FinalRule(NamedTuple):
    """A row of the final-status precedence."""

    name: str
    evidence: str  # what the rule reads, in the objects' words
    statuses: frozenset[Status]  # the statuses it may decide
    decide: Callable[[_Run, _Intake], _Final | None]


# The first rule that decides, decides. No rule: the run is not finished (pending or running).
FINAL_STATUS_RULES: tuple[FinalRule, ...] = (
    FinalRule("intake-failed", "a Resolution or Rendering intake event failed, and no Job/RayJob exists",
              frozenset({Status.FAILED}), _intake_failed),
    FinalRule("job-complete", "Job condition Complete=True (the earliest)",
              frozenset({Status.SUCCEEDED}), _job_condition("Complete", Status.SUCCEEDED, "Completed")),
    FinalRule("job-failed", "Job condition Failed=True (the earliest)",
              frozenset({Status.FAILED}), _job_condition("Failed", Status.FAILED, "Failed")),
    FinalRule("rayjob-finished", "the latest RayJob deployment's jobDeploymentStatus Complete (succeeded if jobStatus "
              "is SUCCEEDED) or Failed", frozenset({Status.SUCCEEDED, Status.FAILED}), _rayjob_finished),
    FinalRule("workload-finished", "Workload condition Finished=True (the earliest): reason Succeeded, else failed",
              frozenset({Status.SUCCEEDED, Status.FAILED}), _workload_finished),
    FinalRule("deactivated", "the last attempt ended by a deactivation (Evicted=True/InactiveWorkload or "
              "Deactivated*) that no reactivation undid", frozenset({Status.STOPPED}), _deactivated),
    FinalRule("root-deleted", "the Job/RayJob was deleted (or its Workload, when the Job/RayJob was never seen)",
              frozenset({Status.STOPPED}), _root_deleted),
)


def _final(run: _Run, intake: _Intake) -> _Final | None:
    for rule in FINAL_STATUS_RULES:
        final = rule.decide(run, intake)
        if final is not None:
            return final
    return None


# ------------------------------------------------------------------------------------------ 4. phase entries
# Each rule returns a phase entry of one attempt, or None when the attempt did not enter that phase. An entry
# with no time (at None) is not entered either.


def _enter_admission(run: _Run, v: _AttemptView) -> Entry | None:
    a = v.att
    if a.queued is None:
        return None
    reason, msg = a.reopened or (a.trigger, a.trigger_message)
    return Entry(a.queued, reason, msg, run.wl_src if v.number > 1 else run.root_src)


def _enter_scheduling(run: _Run, v: _AttemptView) -> Entry | None:
    a = v.att
    if a.start is None:
        return None
    if a.admitted is not None and a.start == a.admitted:
        return Entry(a.start, "Admitted", f"Admitted by ClusterQueue {a.cq}" if a.cq else "", run.wl_src)
    if a.trigger == RAYJOB_RETRY:
        return Entry(a.start, RAYJOB_RETRY, a.trigger_message, run.root_src)
    return Entry(a.start, "Created", "", run.root_src)


def _enter_runtime(run: _Run, v: _AttemptView) -> Entry | None:
    at = v.runtime_at
    if at is None:
        return None
    r, a = run.r, v.att
    n = min(v.scheduled, r.expected_pods)
    return Entry(at, "PodsScheduled", f"{n}/{r.expected_pods} pods scheduled",
                 _source("RayCluster", r.namespace, a.ray_cluster) if a.ray_cluster else run.root_src)


def _enter_progress(run: _Run, v: _AttemptView) -> Entry | None:
    if v.runtime_at is None or v.progress_at is None:
        return None  # progress counts only once the attempt is in Runtime
    a = v.att
    ray_app = a.ray_start is not None and v.progress_at == run.r.ray[a.ray_start].app_started
    if ray_app:
        return Entry(v.progress_at, "RayJobRunning", "", run.root_src)
    return Entry(v.progress_at, "FirstStep", "", INTAKE_SOURCE)


def _enter_completion_undone(run: _Run, v: _AttemptView) -> Entry | None:
    a = v.att
    if v.number >= len(run.atts) or not is_deactivation(a.end_reason):
        return None
    # stopped by a deactivation that did not last: the run was in Completion until the next attempt
    return Entry(a.end, a.end_reason or "", a.end_message, run.wl_src)


class AttemptPhase(NamedTuple):
    """A row of the phase-entry rules of one attempt."""

    phase: Phase
    when: str  # the evidence, as lifecycle.md §7 names it
    reasons: tuple[str, ...]  # the reasons it gives
    other_reasons: str  # and, if not empty, which others
    enter: Callable[[_Run, _AttemptView], Entry | None]


# In Phase order: an attempt's entries are made in this order.
ATTEMPT_PHASES: tuple[AttemptPhase, ...] = (
    AttemptPhase(Phase.ADMISSION, "queued: the root created with a queue label (first attempt), the eviction that "
                 "requeued it, or Requeued=True/Reactivated after a deactivation",
                 (SUBMITTED, REACTIVATED), "the Kueue eviction reason (Evicted=True) that requeued it",
                 _enter_admission),
    AttemptPhase(Phase.SCHEDULING, "Workload Admitted=True (QuotaReserved=True if it has no Admitted condition); "
                 "without Kueue the root's creation; a RayJob retry's new deployment",
                 ("Admitted", RAYJOB_RETRY, "Created"), "", _enter_scheduling),
    AttemptPhase(Phase.RUNTIME, "as many pods PodScheduled=True as the root expects (when the last of those was), or "
                 "the RayCluster ready, before the attempt ended", ("PodsScheduled",), "", _enter_runtime),
    AttemptPhase(Phase.PROGRESS, "in Runtime, the first progress report inside the attempt, or the Ray app's start "
                 "(RayJob jobStatus RUNNING) if earlier", ("FirstStep", "RayJobRunning"), "", _enter_progress),
    AttemptPhase(Phase.COMPLETION, "an attempt but the last ended by a deactivation that a reactivation undid",
                 (), "the deactivation's reason", _enter_completion_undone),
)


def _view(run: _Run, number: int, a: _Att, pods: AttemptPods, progress_times: list[int]) -> _AttemptView:
    r, atts = run.r, run.atts
    # a RayJob's own pods (the submitter) do not count: its RayCluster's do (``pods.sched`` holds the others' binds)
    sched_times = pods.sched
    started_at = sched_times[r.expected_pods - 1] if len(sched_times) >= r.expected_pods else None
    if started_at is None and a.ray_cluster and a.ray_cluster in r.ray_clusters:
        started_at = r.ray_clusters[a.ray_cluster].ready
    if number > 1 and a.start is None:
        # re-queued (after an eviction or a reactivation) and not admitted yet: Kueue keeps the Job suspended,
        # so no pod runs for this attempt, whatever creation times say of the pods placed in it
        started_at = None
    lo = started_at if started_at is not None else a.start
    # a progress point from the next attempt's start on is that attempt's, whatever this one's end says
    window = None if lo is None else (lo, a.end, atts[number].start if number < len(atts) else None)
    progress_at = reported_at = first_report(progress_times, window)
    if a.ray_start is not None:
        ray_app = r.ray[a.ray_start].app_started
        if ray_app is not None and (progress_at is None or ray_app < progress_at):
            progress_at = ray_app
    runtime_at = started_at if started_at is not None and (a.end is None or started_at <= a.end) else None
    return _AttemptView(number, a, pods, len(sched_times), started_at, runtime_at, progress_at, window, reported_at)


def first_report(progress_times: list[int], window: tuple[int, int | None, int | None] | None) -> int | None:
    """The first of the run's progress times (in order) in ``window``: at or after its start, at or before its end
    and before the next attempt's start (the bounds that are not None); None if none is, or there is no window."""
    if window is None:
        return None
    lo, end, below = window
    i = bisect_left(progress_times, lo)
    if i == len(progress_times):
        return None
    x = progress_times[i]  # the only candidate: the later ones are later still
    return x if (end is None or x <= end) and (below is None or x < below) else None


# ------------------------------------------------------------------------------------------ 5. unfinished runs

# An unfinished run is running when the last phase it entered is one of these and a container of its current
# attempt started (or it reported progress); else it is pending.
RUNNING_PHASES = (Phase.RUNTIME, Phase.PROGRESS)


@dataclass(slots=True)
class _Waiting:
    """What the evidence of a wait reads: the current attempt's pods, the Workload's QuotaReserved=False, and the
    Warning Events since the attempt entered the phase it waits in."""

    r: RunFacts
    pods: AttemptPods | None  # the current attempt's
    since: int | None
    quota: Reason | None
    warnings: tuple[str, ...]


WaitEvidence = Callable[[_Waiting], Reason | None]


def _quota_pending(w: _Waiting) -> Reason | None:
    return w.quota


def _unschedulable_pod(w: _Waiting) -> Reason | None:
    """The latest PodScheduled=False of a pod not scheduled since."""
    if w.pods is None or not w.pods.unschedulable.items:
        return None
    latest = w.pods.unschedulable.items[-1]
    assert isinstance(latest, Unschedulable)
    return Reason(latest.reason, latest.message)


def _waiting_container(w: _Waiting) -> Reason | None:
    """A container's state.waiting.reason (ImagePullBackOff, CrashLoopBackOff, ...): the first by name."""
    if w.pods is None or not w.pods.waiting.items:
        return None
    return Reason(str(w.pods.waiting.items[0]), "")


def _warning_event(w: _Waiting) -> Reason | None:
    """The latest Warning Event with one of the phase's reasons since the phase was entered. Events are best-effort
    evidence (lifecycle.md §5.1): used only when the objects' own status says nothing."""
    hits = [(e.last, e.reason, e.message) for e in w.r.events.values()
            if e.type == "Warning" and e.reason in w.warnings and (w.since is None or e.last >= w.since)]
    if not hits:
        return None
    _last, reason, message = max(hits)
    return Reason(reason, message)


class WaitRule(NamedTuple):
    """Why an unfinished run waits in a phase: the first evidence present, else ``otherwise``."""

    phase: Phase
    evidence: tuple[WaitEvidence, ...]  # in precedence order
    warnings: tuple[str, ...]  # the Warning Event reasons that explain a wait in this phase
    otherwise: tuple[str | None, str]


WAIT_RULES: tuple[WaitRule, ...] = (
    # lifecycle.md §7, Admission stalls: QuotaReserved=False reason/message, Inadmissible
    WaitRule(Phase.ADMISSION, (_quota_pending, _warning_event), ("Pending", "Inadmissible"), ("Queued", "")),
    # Scheduling stalls: Unschedulable / FailedScheduling; pods not created
    WaitRule(Phase.SCHEDULING, (_unschedulable_pod, _waiting_container, _warning_event),
             ("FailedScheduling", "FailedCreate"), ("WaitingForPods", "")),
    # Runtime failures: ImagePullBackOff, CrashLoopBackOff, ...
    WaitRule(Phase.RUNTIME, (_waiting_container, _warning_event), ("Failed", "BackOff", "FailedMount", "Unhealthy"),
             (None, "")),
)
_WAIT_RULE = {w.phase: w for w in WAIT_RULES}
_NO_REASON: tuple[str | None, str] = (None, "")


def _pending_reason(r: RunFacts, atts: list[_Att], pods: AttemptPods | None, phase: Phase,
                    quota: Reason | None) -> tuple[str | None, str]:
    """Why an unfinished run waits in ``phase``; ``pods``: the sums over its current attempt's pods."""
    rule = _WAIT_RULE.get(phase)
    if rule is None:
        return _NO_REASON
    cur = atts[-1] if atts else None
    since = None if cur is None else (cur.queued if phase is Phase.ADMISSION else cur.start)
    w = _Waiting(r, pods, since, quota, rule.warnings)
    for evidence in rule.evidence:
        found = evidence(w)
        if found is not None:
            return found.reason, found.message
    return rule.otherwise

