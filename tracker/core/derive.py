"""Derive a run's history (phases, attempts, status) from its facts.

Theory of operation
===================

``derive`` is a pure function of ``RunFacts``: the same facts always give the same history, whatever order the
objects that produced them arrived in, and however often it is called. Times come only from the objects (and
from TauGrid's intake events), never from a clock. Nothing here remembers anything between calls: the facts
(``facts.py``) are merged commutatively as records arrive, and every history is computed again from all of them.
That is why the rules below read sets of facts (every condition a Workload ever carried, keyed by type, status,
reason and lastTransitionTime; every pod; every RayJob deployment) rather than a sequence of changes: a watch
restarted after a ``410 Gone`` loses intermediate states, and streams of different kinds are not ordered with
respect to each other (``shared/reference/lifecycle.md`` §5.1).

A history is built in five steps, each a table or a function below:

1. **Intake** (``_intake``): TauGrid's Resolution and Rendering events give the first two phases
   (``INTAKE_PHASES``), the provenance fields used when the root object does not carry them, and an intake
   failure.
2. **Attempts**: an attempt is one admission of the run. ``_kueue_attempts`` cuts the Workload's conditions into
   admission / eviction cycles (Kueue keeps one Workload through evictions and requeues: lifecycle.md §7, "cross
   object rules"); ``_split_ray_retries`` cuts an admission again where KubeRay retried the RayJob on a new
   RayCluster; ``_assign_pods`` gives each pod to the attempt it ran in.
3. **Final status** (``FINAL_STATUS_RULES``): the first rule whose evidence is present decides whether and how the
   run finished. The order is the precedence: an object's own terminal condition beats the Workload's
   ``Finished``, which beats a deactivation, which beats a deletion.
4. **Phase entries** (``ATTEMPT_PHASES``): for each attempt, in Phase order, when it entered Admission,
   Scheduling, Runtime and Progress, and (for a deactivation a reactivation undid) Completion. Then Completion
   once for the run, at the final status's time. Within an attempt a phase is never entered before the one
   before it: a time that would go back is raised to the previous entry's (clocks of different nodes and
   controllers disagree by a little).
5. **Run record**: the status of an unfinished run (running once it is in ``RUNNING_PHASES`` and a container of
   its current attempt started, else pending), why it waits (``WAIT_RULES``), counts, and provenance.

Each table is ordered and holds the rules of one decision; a reader can check each row against lifecycle.md
(§1.7 for Kueue, §2 for Jobs, §3 for Pods, §4 for KubeRay, §7 for the mapping to the seven phases).
``tests/test_derive_tables.py`` checks their invariants.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tracker.core import gpu
from tracker.core.facts import CondFacts, PodFacts, RayAttemptFacts, RunFacts
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
    Attempt,
    MetricSummary,
    Phase,
    PodFailure,
    PodPlacement,
    ResumeLink,
    RunHistory,
    RunRecord,
    Status,
    Transition,
    utc,
)

# Workload Evicted=True reasons (prefixes) of a deactivation (spec.active=false): Kueue's ``InactiveWorkload`` and
# the ``Deactivated...`` reasons of newer versions. A deactivated run is stopped, unless a reactivation follows.
DEACTIVATION_REASONS = ("InactiveWorkload", "Deactivated")
# Requeued=True/Reactivated: Kueue's workload controller queues a deactivated Workload again after spec.active
# went back to true (pkg/controller/core/workload_controller.go)
REACTIVATED = "Reactivated"

# Attempt triggers (``Attempt.trigger``) other than a Kueue eviction or deactivation reason
SUBMITTED = "Submitted"  # the first attempt of a run queued by Kueue
CREATED = "Created"  # the first attempt of a run without Kueue
RAYJOB_RETRY = "RayJobRetry"  # KubeRay retried the RayJob on a new RayCluster (lifecycle.md §4.4)
EVICTION_NOT_OBSERVED = "EvictionNotObserved"  # re-admitted, but the eviction before it was lost to a relist
_NOT_OBSERVED_MESSAGE = "evicted before this re-admission; the eviction itself was not observed"

INTAKE_SOURCE = "TauGrid/intake"


def is_deactivation(reason: str | None) -> bool:
    return reason is not None and reason.startswith(DEACTIVATION_REASONS)


def may_reopen(r: RunFacts, run: RunRecord) -> bool:
    """Whether a run that looks finished may still come back: stopped by a Kueue deactivation while its Job or
    RayJob still exists, so that a reactivation reopens it. Such a run is not finished for good (a consumer
    that frees finished runs must keep it); once its root is deleted it is."""
    return run.status is Status.STOPPED and is_deactivation(run.reason) and r.root_deleted is None


# ------------------------------------------------------------------------------------------ values


class Cond(NamedTuple):
    """One condition a Kubernetes object carried with a given status, and its message."""

    at: int  # lastTransitionTime
    reason: str
    message: str


def _true(conds: CondFacts, ctype: str) -> list[Cond]:
    """Every ``ctype=True`` condition seen, earliest first."""
    hits = [Cond(at, reason, msg) for (t, status, reason, at), msg in conds.items() if t == ctype and status == "True"]
    hits.sort()
    return hits


def _true_times(conds: CondFacts, ctype: str) -> list[int]:
    """When a ``ctype=True`` condition was seen, earliest first, each time once."""
    return sorted({at for t, status, _reason, at in conds if t == ctype and status == "True"})


def _first_true(conds: CondFacts, ctype: str) -> Cond | None:
    """The earliest ``ctype=True`` condition seen (of those at the same time, the least by reason, then message)."""
    hits = [(at, reason, msg) for (t, status, reason, at), msg in conds.items() if t == ctype and status == "True"]
    return Cond(*min(hits)) if hits else None


@dataclass(slots=True)
class Entry:
    """A phase entry before it becomes a ``Transition``: when, why, and the object that evidences it. (A plain
    slotted class: made for every transition, it is built twice as fast as a NamedTuple.)"""

    at: int | None  # None: not entered
    reason: str
    message: str
    source: str


class Reason(NamedTuple):
    reason: str
    message: str


@dataclass(slots=True)
class _Att:
    """An attempt while it is worked out; times in microseconds."""

    trigger: str  # why it began: SUBMITTED, CREATED, an eviction or deactivation reason, RAYJOB_RETRY, ...
    trigger_message: str = ""
    queued: int | None = None  # Admission entry
    admitted: int | None = None
    start: int | None = None  # Scheduling entry: admitted, or created (no Kueue), or a RayJob retry's deployment
    end: int | None = None
    end_reason: str | None = None
    end_message: str = ""
    cause: str | None = None  # the eviction's underlying cause, from Kueue's eviction counts
    cq: str | None = None
    ray_cluster: str | None = None
    ray_start: int | None = None  # the RayJob deployment (its status.startTime) this attempt ran
    pods: list[str] = field(default_factory=list)
    # the reason of the Admission entry when it is not the trigger: a reactivation
    reopened: Reason | None = None


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
    pods: list[PodFacts]
    scheduled: int  # pods of the attempt scheduled (RayJob: pods of its RayClusters)
    started_at: int | None  # the expected number of pods scheduled (or the RayCluster ready)
    runtime_at: int | None  # started_at if the attempt had not ended before: the Runtime entry
    progress_at: int | None  # first progress report or Ray app start inside the attempt: Progress


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


# ------------------------------------------------------------------------------------------ 2. attempts

_ADMIT, _EVICT = 0, 1  # kinds of a Workload cycle event; an admission sorts before an eviction at the same time


class _CycleEvent(NamedTuple):
    at: int
    kind: int  # _ADMIT or _EVICT
    reason: str
    message: str


def _kueue_attempts(r: RunFacts) -> list[_Att]:
    """Attempts from the Workload's admission and eviction cycles (or one attempt without Kueue).

    An admission (``Admitted=True``; ``QuotaReserved=True`` for a Workload that carries no Admitted condition at
    all) begins the Scheduling of an attempt; an eviction (``Evicted=True``) of an admitted attempt ends it, and the
    next attempt is queued at once with the eviction's reason as its trigger. A deactivation ends an attempt; a
    later reactivation (``Requeued=True/Reactivated``) opens the next one, queued at the reactivation and triggered
    by the deactivation. A re-admission after a deactivation whose reactivation was not seen opens it too, without a
    queue time. Nothing reopens a run after its root was deleted."""
    queued0 = r.created if r.created is not None else r.wl_created
    if not r.wl_conds and not r.wl_uid:
        if r.kind is None:
            return []
        # no Workload (yet): queued if the root names a queue, else not managed by Kueue and scheduled at creation
        a = _Att(SUBMITTED if r.wl_queue else CREATED, queued=queued0 if r.wl_queue else None)
        a.start = None if r.wl_queue else r.created
        return [a]
    admits = _true_times(r.wl_conds, "Admitted")
    if not admits and not any(key[0] == "Admitted" for key in r.wl_conds):
        admits = _true_times(r.wl_conds, "QuotaReserved")
    evicts = _true(r.wl_conds, "Evicted")
    reactivations = [c for c in _true(r.wl_conds, "Requeued")
                     if c.reason == REACTIVATED and (r.root_deleted is None or c.at < r.root_deleted)]
    # underlying causes of the evictions Kueue counted, per eviction reason (facts: "reason\x1fcause" -> count)
    causes: dict[str, list[str]] = {}
    for key in sorted(r.wl_evictions):
        reason, _, cause = key.partition("\x1f")
        causes.setdefault(reason, []).append(cause)
    seen_reasons: dict[str, int] = {}
    timeline = sorted([_CycleEvent(at, _ADMIT, "", "") for at in admits]
                      + [_CycleEvent(e.at, _EVICT, e.reason, e.message) for e in evicts])
    atts = [_Att(SUBMITTED, queued=queued0)]
    todo = list(reversed(reactivations))  # the earliest last

    def reopen(until: int | None, inclusive: bool) -> _Att | None:
        """The attempt a reactivation up to ``until`` opens after the current one, if there is one."""
        cur = atts[-1]
        if cur.end is not None and is_deactivation(cur.end_reason):
            after, trigger, message = cur.end, cur.end_reason or "", cur.end_message
        elif cur.end is None and cur.admitted is not None:
            # admitted, and reactivated later: deactivated in between, and the eviction was not seen
            after, trigger, message = cur.admitted, "Deactivated", ""
        else:
            return None
        while todo and todo[-1].at < after:
            todo.pop()  # a reactivation of an earlier cycle, or one that nothing we saw was deactivated for
        if not todo or (until is not None and (todo[-1].at > until or (todo[-1].at == until and not inclusive))):
            return None
        react = todo.pop()
        return _Att(trigger, trigger_message=message, queued=react.at, reopened=Reason(REACTIVATED, react.message))

    for ev in timeline:
        nxt = reopen(ev.at, inclusive=ev.kind == _ADMIT)
        if nxt is not None:
            atts.append(nxt)
        cur = atts[-1]
        if ev.kind == _ADMIT:
            if cur.admitted is not None:
                if cur.end is not None and is_deactivation(cur.end_reason):
                    # re-admitted after a deactivation whose reactivation was not seen
                    atts.append(_Att(cur.end_reason or "", trigger_message=cur.end_message))
                else:
                    # re-admitted without an observed eviction (intermediate states lost to a relist): the attempt
                    # before it was evicted at the latest when it was admitted again (docs/limits.md)
                    cur.end, cur.end_reason, cur.end_message, cur.cause = ev.at, *_missed_eviction(r, evicts, causes)
                    atts.append(_Att(EVICTION_NOT_OBSERVED))
                cur = atts[-1]
            cur.admitted = cur.start = ev.at
            cur.cq = r.cq_by_admission.get(ev.at)
            continue
        if cur.end is not None:
            continue  # deactivated: nothing counts as a new attempt until it is reactivated
        if cur.admitted is None and not is_deactivation(ev.reason):
            continue  # evicted while queued (e.g. a PodsReady-timeout write seen late): not a new attempt
        # the n-th eviction with a reason gets the n-th underlying cause Kueue counted for it
        n = seen_reasons.get(ev.reason, 0)
        seen_reasons[ev.reason] = n + 1
        cause_list = causes.get(ev.reason) or [""]
        cur.end, cur.end_reason, cur.end_message = ev.at, ev.reason, ev.message
        cur.cause = cause_list[min(n, len(cause_list) - 1)] or None
        if not is_deactivation(ev.reason):
            atts.append(_Att(ev.reason, trigger_message=ev.message, queued=ev.at))
    nxt = reopen(None, inclusive=True)
    if nxt is not None:
        atts.append(nxt)
    return atts


class _AttemptEnd(NamedTuple):
    reason: str
    message: str
    cause: str | None


def _missed_eviction(r: RunFacts, evicts: list[Cond], causes: dict[str, list[str]]) -> _AttemptEnd:
    """How an attempt whose eviction was not observed ended: the reason Kueue's eviction counts
    (``status.schedulingStats.evictions``) have more of than the Evicted=True transitions seen, when there is
    exactly one such reason; else ``EvictionNotObserved``."""
    unseen: dict[str, int] = {}
    for key, count in r.wl_evictions.items():
        reason = key.partition("\x1f")[0]
        unseen[reason] = unseen.get(reason, 0) + count
    for e in evicts:
        if e.reason in unseen:
            unseen[e.reason] -= 1
    reasons = sorted(reason for reason, n in unseen.items() if n > 0)
    if len(reasons) != 1:
        return _AttemptEnd(EVICTION_NOT_OBSERVED, _NOT_OBSERVED_MESSAGE, None)
    found = set(causes.get(reasons[0], ()))
    cause = found.pop() if len(found) == 1 else ""
    return _AttemptEnd(reasons[0], _NOT_OBSERVED_MESSAGE, cause or None)


def _failed_before(a: RayAttemptFacts) -> int:
    """KubeRay's count of failed deployments (``status.failed``) when this deployment started: its own failure
    is counted in the status that reports it (Retrying, Failed, or a FAILED Ray job), not in the earlier ones."""
    out = a.outcome
    own = out is not None and (out.deployment_status in ("Retrying", "Failed") or out.job_status == "FAILED")
    return a.failed - 1 if own and a.failed > 0 else a.failed


def _split_ray_retries(r: RunFacts, atts: list[_Att]) -> list[_Att]:
    """A RayJob retry (a new deployment with a new RayCluster inside one admission) is a new attempt.

    A deployment is a retry only when KubeRay says the one before it failed: that one ended ``Retrying``, or the
    RayJob's ``status.failed`` grew between them. Another deployment inside one attempt is that of a Kueue
    admission the watcher missed (suspended and resumed): it stays in the attempt, which keeps its first
    deployment's RayCluster."""
    if not r.ray:
        return atts
    starts = sorted(r.ray)
    out: list[_Att] = []
    for a in atts:
        lo = a.start if a.start is not None else (a.queued if a.queued is not None else -1)
        inside = [x for x in starts if x >= lo and (a.end is None or x < a.end)] if a.start is not None else []
        if not inside:
            out.append(a)
            continue
        cur = a
        for j, st in enumerate(inside):
            if j > 0:
                prev = r.ray[inside[j - 1]]
                retried = (prev.outcome is not None and prev.outcome.deployment_status == "Retrying") or \
                    _failed_before(r.ray[st]) > _failed_before(prev)
                if not retried:
                    continue
                reason = prev.outcome.reason if prev.outcome else "Unknown"
                message = prev.outcome.message if prev.outcome else ""
                nxt = _Att(RAYJOB_RETRY, trigger_message=f"{reason}: {message}" if message else reason,
                           start=st, end=cur.end, end_reason=cur.end_reason, end_message=cur.end_message,
                           cause=cur.cause, cq=cur.cq)
                cur.end, cur.end_reason, cur.end_message, cur.cause = st, reason, message, None
                if prev.outcome and prev.outcome.end > 0:
                    cur.end = min(prev.outcome.end, st)
                out.append(cur)
                cur = nxt
            cur.ray_start = st
            cur.ray_cluster = r.ray[st].cluster
        out.append(cur)
    return out


def _assign_pods(r: RunFacts, atts: list[_Att]) -> None:
    """Each pod to an attempt: a RayCluster's pods to the attempt that ran that RayCluster; any other pod to the
    last attempt that began (Scheduling, else Admission) no later than the pod was created."""
    if not atts:
        return
    cluster_att = {a.ray_cluster: a for a in atts if a.ray_cluster}
    bounds = [a.start if a.start is not None else (a.queued if a.queued is not None else -(1 << 62)) for a in atts]
    for uid, p in sorted(r.pods.items(), key=lambda kv: (kv[1].created or 0, kv[0])):
        target = cluster_att.get(p.ray_cluster) if p.ray_cluster else None
        if target is None:
            c = p.created if p.created is not None else 0
            idx = 0
            for j, b in enumerate(bounds):
                if b is not None and b <= c:
                    idx = j
            target = atts[idx]
        target.pods.append(uid)


def _failures(pods: list[PodFacts]) -> tuple[list[PodFailure], int]:
    """The pod failures of an attempt's pods (a pod killed from outside, by a disruption or a deletion, did not
    fail), and how many of them the Job replaced (a pod of the attempt was created after the failure)."""
    fails = []
    last_created: int | None = None  # computed at the first failure
    retries = 0
    for p in pods:
        end = p.finished
        if end is None or end.phase != "Failed":
            continue
        killed = p.disrupted or (p.delete_requested is not None and p.delete_requested <= end.at)
        if killed:
            continue
        fails.append((end.at, p.name, end.reason, end.exit_code, end.message))
        if last_created is None:
            last_created = max(q.created or 0 for q in pods)
        if last_created > end.at:
            retries += 1
    fails.sort()
    return [PodFailure(pod=n, at=utc(at), reason=reason, exit_code=None if code < 0 else code, message=msg)
            for at, n, reason, code, msg in fails], retries


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


def _root_deleted(run: _Run, intake: _Intake) -> _Final | None:
    if run.r.root_deleted is None:
        return None
    return _Final(Status.STOPPED, "Deleted", "the workload was deleted before it finished", run.r.root_deleted,
                  run.root_src)


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


def _view(run: _Run, number: int, a: _Att, progress_times: list[int]) -> _AttemptView:
    r, atts = run.r, run.atts
    pods = [r.pods[u] for u in a.pods]
    # a RayJob's own pods (the submitter) do not count: its RayCluster's do
    real_pods = [p for p in pods if r.kind != "RayJob" or p.ray_cluster]
    sched_times = sorted(p.scheduled for p in real_pods if p.scheduled is not None)
    started_at = sched_times[r.expected_pods - 1] if len(sched_times) >= r.expected_pods else None
    if started_at is None and a.ray_cluster and a.ray_cluster in r.ray_clusters:
        started_at = r.ray_clusters[a.ray_cluster].ready
    if number > 1 and a.start is None:
        # re-queued (after an eviction or a reactivation) and not admitted yet: Kueue keeps the Job suspended,
        # so no pod runs for this attempt, whatever creation times say of the pods placed in it
        started_at = None
    progress_at = None
    lo = started_at if started_at is not None else a.start
    # a progress point from the next attempt's start on is that attempt's, whatever this one's end says
    below = atts[number].start if number < len(atts) else None
    if lo is not None:
        progress_at = next((x for x in progress_times if x >= lo and (a.end is None or x <= a.end)
                            and (below is None or x < below)), None)
    if a.ray_start is not None:
        ray_app = r.ray[a.ray_start].app_started
        if ray_app is not None and (progress_at is None or ray_app < progress_at):
            progress_at = ray_app
    runtime_at = started_at if started_at is not None and (a.end is None or started_at <= a.end) else None
    return _AttemptView(number, a, pods, len(sched_times), started_at, runtime_at, progress_at)


# ------------------------------------------------------------------------------------------ 5. unfinished runs

# An unfinished run is running when the last phase it entered is one of these and a container of its current
# attempt started (or it reported progress); else it is pending.
RUNNING_PHASES = (Phase.RUNTIME, Phase.PROGRESS)


@dataclass(slots=True)
class _Waiting:
    """What the evidence of a wait reads: the current attempt's pods, the Workload's QuotaReserved=False, and the
    Warning Events since the attempt entered the phase it waits in."""

    r: RunFacts
    pods: list[PodFacts]
    since: int | None
    quota: Reason | None
    warnings: tuple[str, ...]


WaitEvidence = Callable[[_Waiting], Reason | None]


def _quota_pending(w: _Waiting) -> Reason | None:
    return w.quota


def _unschedulable_pod(w: _Waiting) -> Reason | None:
    """The latest PodScheduled=False of a pod not scheduled since."""
    unsched = [p.unschedulable for p in w.pods if p.unschedulable and p.scheduled is None]
    if not unsched:
        return None
    latest = max(unsched)
    return Reason(latest.reason, latest.message)


def _waiting_container(w: _Waiting) -> Reason | None:
    """A container's state.waiting.reason (ImagePullBackOff, CrashLoopBackOff, ...): the first by name."""
    waiting = [p.waiting_reason for p in w.pods if p.waiting_reason]
    return Reason(min(waiting), "") if waiting else None


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


def _pending_reason(r: RunFacts, atts: list[_Att], phase: Phase, quota: Reason | None) -> tuple[str | None, str]:
    rule = _WAIT_RULE.get(phase)
    if rule is None:
        return _NO_REASON
    cur = atts[-1] if atts else None
    since = None if cur is None else (cur.queued if phase is Phase.ADMISSION else cur.start)
    pods = [r.pods[u] for u in cur.pods] if cur else []
    w = _Waiting(r, pods, since, quota, rule.warnings)
    for evidence in rule.evidence:
        found = evidence(w)
        if found is not None:
            return found.reason, found.message
    return rule.otherwise


# ------------------------------------------------------------------------------------------ derive


def derive(r: RunFacts) -> RunHistory:
    intake = _intake(r)
    atts = _split_ray_retries(r, _kueue_attempts(r))
    _assign_pods(r, atts)
    run = _Run(r, atts, _source(r.kind, r.namespace, r.name), _source("Workload", r.namespace, r.wl_name))
    final = _final(run, intake)
    # close the last attempt at completion
    if final is not None and atts and atts[-1].end is None:
        atts[-1].end, atts[-1].end_reason, atts[-1].end_message = final.at, final.reason, final.message

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
    total_retries = 0
    progress_times = sorted(r.progress_buckets.values())
    for i, a in enumerate(atts, start=1):
        v = _view(run, i, a, progress_times)
        for rule in ATTEMPT_PHASES:
            e = rule.enter(run, v)
            if e is not None:
                add(i, rule.phase, e)
        failures, retries = _failures(v.pods)
        total_retries += retries
        placements = [PodPlacement(pod=p.name, node=p.node, created_at=utc(p.created), scheduled_at=utc(p.scheduled),
                                   finished_at=utc(p.finished.at) if p.finished else None)
                      for p in sorted(v.pods, key=lambda p: (p.created or 0, p.name))]
        wait = None
        if a.queued is not None and a.admitted is not None:
            wait = (a.admitted - a.queued) / 1_000_000
        attempts_out.append(Attempt(
            run_id=r.run_id, attempt=i, trigger=a.trigger, queued_at=utc(a.queued), admitted_at=utc(a.admitted),
            scheduled_at=utc(a.start), started_at=utc(v.started_at), progress_at=utc(v.progress_at),
            ended_at=utc(a.end), end_reason=a.end_reason, end_message=a.end_message, underlying_cause=a.cause,
            admission_wait_s=wait, cluster_queue=a.cq, ray_cluster=a.ray_cluster, retries=retries,
            failures=failures, pods=placements))

    if final is not None:
        add(max(1, len(atts)), Phase.COMPLETION, Entry(final.at, final.reason, final.message, final.source))

    pending = Reason(*r.wl_pending) if r.wl_pending else None  # the Workload's QuotaReserved=False, now
    if pending and atts and atts[-1].reopened and atts[-1].admitted is None and \
            pending.message == atts[-1].trigger_message:
        # Kueue leaves the deactivation's message in QuotaReserved=False until its scheduler has tried again
        pending = None
    reason: str | None
    if final is not None:
        status, reason, message = final.status, final.reason, final.message
    else:
        last_phase = transitions[-1].phase if transitions else Phase.ADMISSION
        started = bool(attempts_out) and (attempts_out[-1].progress_at is not None or any(
            r.pods[u].started is not None for u in atts[-1].pods))
        status = Status.RUNNING if last_phase in RUNNING_PHASES and started else Status.PENDING
        reason, message = _pending_reason(r, atts, last_phase, pending)
    phase = transitions[-1].phase if transitions else (Phase.ADMISSION if r.kind else Phase.RESOLUTION)

    record = _record(run, intake, final, attempts_out, status, reason, message, phase, pending, total_retries)
    links = [ResumeLink(run_id=r.run_id, resume_of=record.resume_of)] if record.resume_of else []
    return gpu.account(RunHistory(run=record, transitions=transitions, attempts=attempts_out, metrics=_metrics(r),
                                  resume_links=links), r, [a.pods for a in atts])


def _record(run: _Run, intake: _Intake, final: _Final | None, attempts_out: list[Attempt], status: Status,
            reason: str | None, message: str, phase: Phase, pending: Reason | None, retries: int) -> RunRecord:
    r, atts = run.r, run.atts
    cur = attempts_out[-1] if attempts_out else None
    queued_cur = next((x for x in reversed(attempts_out) if x.queued_at is not None), None)
    # Kueue evictions: attempts ended by an eviction (the next attempt re-queued), plus a final deactivation
    evictions = sum(1 for nxt in atts[1:] if nxt.trigger not in (RAYJOB_RETRY, EVICTION_NOT_OBSERVED))
    if final is not None and atts and atts[-1].end_reason == final.reason and is_deactivation(final.reason):
        evictions += 1
    evictions = max(evictions, sum(r.wl_evictions.values()))
    # provenance: the root's labels and annotations (what tau rendered), else what the intake events said
    prov = intake.prov
    ann = r.annotations
    input_refs = [x for x in ann.get(ANN_INPUT_REFS, "").split(",") if x] or prov.get("input_refs") or []
    waiting = pending if pending and final is None and cur and cur.admitted_at is None else None
    return RunRecord(
        run_id=r.run_id, kind=r.kind or prov.get("workload_kind"), namespace=r.namespace or prov.get("namespace"),
        name=r.name or prov.get("name"), uid=r.uid,
        project=r.labels.get(LABEL_PROJECT) or prov.get("project"),
        workspace=r.labels.get(LABEL_WORKSPACE) or prov.get("workspace"),
        target=r.labels.get(LABEL_TARGET) or prov.get("target"),
        queue=r.wl_queue or prov.get("queue"), cluster_queue=next((a.cq for a in reversed(atts) if a.cq), None),
        status=status, reason=reason, message=message, phase=phase, attempts=len(atts), retries=retries,
        evictions=evictions, created_at=utc(r.created),
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
    )


def _metrics(r: RunFacts) -> list[MetricSummary]:
    return [MetricSummary(run_id=r.run_id, metric=k, first_step=m.first[0], first_value=m.first[1],
                          latest_step=m.latest[0], latest_value=m.latest[1], min_value=m.lo, max_value=m.hi,
                          points=m.points) for k, m in sorted(r.metrics.items())]
