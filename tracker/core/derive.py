"""Derive a run's history (phases, attempts, status) from its facts.

A pure function of ``RunFacts``: the same facts always give the same history, whatever order the objects
that produced them arrived in. Times come only from the objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracker.core.facts import RayAttemptFacts, RunFacts
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
from tracker.core.timefmt import micros

DEACTIVATION_REASONS = ("InactiveWorkload", "Deactivated")
# Requeued=True/Reactivated: Kueue's workload controller queues a deactivated Workload again after spec.active
# went back to true (pkg/controller/core/workload_controller.go)
REACTIVATED = "Reactivated"


def is_deactivation(reason: str | None) -> bool:
    return reason is not None and reason.startswith(DEACTIVATION_REASONS)


def may_reopen(r: RunFacts, run: RunRecord) -> bool:
    """Whether a run that looks finished may still come back: stopped by a Kueue deactivation while its Job or
    RayJob still exists, so that a reactivation reopens it. Such a run is not finished for good (a consumer
    that frees finished runs must keep it); once its root is deleted it is."""
    return run.status is Status.STOPPED and is_deactivation(run.reason) and r.root_deleted is None


@dataclass(slots=True)
class _Att:
    trigger: str
    trigger_message: str = ""
    queued: int | None = None
    admitted: int | None = None
    start: int | None = None  # Scheduling entry
    end: int | None = None
    end_reason: str | None = None
    end_message: str = ""
    cause: str | None = None
    cq: str | None = None
    ray_cluster: str | None = None
    ray_start: int | None = None
    pods: list[str] = field(default_factory=list)
    # (reason, message) of the Admission transition when it is not the trigger: a reactivation
    reopened: tuple[str, str] | None = None


@dataclass(slots=True)
class _Final:
    status: Status
    reason: str
    message: str
    at: int | None
    source: str


def _source(kind: str | None, ns: str | None, name: str | None) -> str:
    return f"{kind or '?'}/{ns or '?'}/{name or '?'}"


def derive(r: RunFacts) -> RunHistory:
    root_src = _source(r.kind, r.namespace, r.name)
    wl_src = _source("Workload", r.namespace, r.wl_name)
    intake = _intake(r)
    atts = _kueue_attempts(r)
    atts = _split_ray_retries(r, atts)
    _assign_pods(r, atts)
    final = _final(r, atts, intake)
    # close the last attempt at completion
    if final is not None and atts and atts[-1].end is None:
        atts[-1].end, atts[-1].end_reason, atts[-1].end_message = final.at, final.reason, final.message

    transitions: list[Transition] = []

    def add(attempt: int, phase: Phase, at: int | None, reason: str, message: str, source: str) -> None:
        if at is None:
            return
        if transitions and transitions[-1].attempt == attempt:
            prev = micros(transitions[-1].at)
            at = max(at, prev)
        transitions.append(Transition(run_id=r.run_id, attempt=attempt, phase=phase, at=utc(at),
                                      reason=reason, message=message, source=source))

    for phase, (at, reason, msg) in intake["phases"].items():
        add(1, phase, at, reason, msg, "TauGrid/intake")

    attempts_out: list[Attempt] = []
    total_retries = 0
    progress_times = sorted(r.progress_buckets.values())
    for i, a in enumerate(atts, start=1):
        pods = [r.pods[u] for u in a.pods]
        real_pods = [p for p in pods if r.kind != "RayJob" or p.ray_cluster]
        sched_times = sorted(p.scheduled for p in real_pods if p.scheduled is not None)
        scheduled_at = sched_times[r.expected_pods - 1] if len(sched_times) >= r.expected_pods else None
        if scheduled_at is None and a.ray_cluster and a.ray_cluster in r.ray_clusters:
            scheduled_at = r.ray_clusters[a.ray_cluster][2]
        if i > 1 and a.start is None:
            # re-queued (after an eviction or a reactivation) and not admitted yet: Kueue keeps the Job suspended,
            # so no pod runs for this attempt, whatever creation times say of the pods placed in it
            scheduled_at = None
        progress_at = None
        lo = scheduled_at if scheduled_at is not None else a.start
        # a progress point from the next attempt's start on is that attempt's, whatever this one's end says
        below = atts[i].start if i < len(atts) else None
        if lo is not None:
            progress_at = next((x for x in progress_times if x >= lo and (a.end is None or x <= a.end)
                                and (below is None or x < below)), None)
        if a.ray_start is not None:
            ray_app = r.ray[a.ray_start].app_started
            if ray_app is not None and (progress_at is None or ray_app < progress_at):
                progress_at = ray_app
        failures, retries = _failures(r, a)
        total_retries += retries
        if a.queued is not None:
            reason, msg = a.reopened or (a.trigger, a.trigger_message)
            add(i, Phase.ADMISSION, a.queued, reason, msg, wl_src if i > 1 else root_src)
        if a.start is not None:
            if a.admitted is not None and a.start == a.admitted:
                reason, msg, src = "Admitted", f"Admitted by ClusterQueue {a.cq}" if a.cq else "", wl_src
            elif a.trigger == "RayJobRetry":
                reason, msg, src = "RayJobRetry", a.trigger_message, root_src
            else:
                reason, msg, src = "Created", "", root_src
            add(i, Phase.SCHEDULING, a.start, reason, msg, src)
        if scheduled_at is not None and (a.end is None or scheduled_at <= a.end):
            n = min(len(sched_times), r.expected_pods)
            add(i, Phase.RUNTIME, scheduled_at, "PodsScheduled", f"{n}/{r.expected_pods} pods scheduled",
                _source("RayCluster", r.namespace, a.ray_cluster) if a.ray_cluster else root_src)
            if progress_at is not None:
                ray_app = a.ray_start is not None and progress_at == r.ray[a.ray_start].app_started
                add(i, Phase.PROGRESS, progress_at, "RayJobRunning" if ray_app else "FirstStep", "",
                    root_src if ray_app else "TauGrid/intake")
        if i < len(atts) and is_deactivation(a.end_reason):
            # stopped by a deactivation that did not last: the run was in Completion until the next attempt
            add(i, Phase.COMPLETION, a.end, a.end_reason or "", a.end_message, wl_src)
        placements = [PodPlacement(pod=p.name, node=p.node, created_at=utc(p.created), scheduled_at=utc(p.scheduled),
                                   finished_at=utc(p.finished[0]) if p.finished else None)
                      for p in sorted(pods, key=lambda p: (p.created or 0, p.name))]
        wait = None
        if a.queued is not None and a.admitted is not None:
            wait = (a.admitted - a.queued) / 1_000_000
        attempts_out.append(Attempt(
            run_id=r.run_id, attempt=i, trigger=a.trigger, queued_at=utc(a.queued), admitted_at=utc(a.admitted),
            scheduled_at=utc(a.start), started_at=utc(scheduled_at), progress_at=utc(progress_at),
            ended_at=utc(a.end), end_reason=a.end_reason, end_message=a.end_message, underlying_cause=a.cause,
            admission_wait_s=wait, cluster_queue=a.cq, ray_cluster=a.ray_cluster, retries=retries,
            failures=failures, pods=placements))

    if final is not None:
        add(max(1, len(atts)), Phase.COMPLETION, final.at, final.reason, final.message, final.source)

    pending = r.wl_pending
    if pending and atts and atts[-1].reopened and atts[-1].admitted is None and pending[1] == atts[-1].trigger_message:
        # Kueue leaves the deactivation's message in QuotaReserved=False until its scheduler has tried again
        pending = None
    if final is not None:
        status, reason, message = final.status, final.reason, final.message
    else:
        last_phase = transitions[-1].phase if transitions else Phase.ADMISSION
        started = bool(attempts_out) and (attempts_out[-1].progress_at is not None or any(
            r.pods[u].started is not None for u in atts[-1].pods))
        status = Status.RUNNING if last_phase in (Phase.RUNTIME, Phase.PROGRESS) and started else Status.PENDING
        reason, message = _pending_reason(r, atts, last_phase, pending)
    phase = transitions[-1].phase if transitions else (Phase.ADMISSION if r.kind else Phase.RESOLUTION)

    cur = attempts_out[-1] if attempts_out else None
    queued_cur = next((x for x in reversed(attempts_out) if x.queued_at is not None), None)
    # Kueue evictions: attempts ended by an eviction (the next attempt re-queued), plus a final deactivation
    evictions = sum(1 for nxt in atts[1:] if nxt.trigger not in ("RayJobRetry", EVICTION_NOT_OBSERVED))
    if final is not None and atts and atts[-1].end_reason == final.reason and is_deactivation(final.reason):
        evictions += 1
    evictions = max(evictions, sum(r.wl_evictions.values()))
    prov = intake["prov"]
    ann = r.annotations
    resume_of = ann.get(ANN_RESUME_OF)
    input_refs = [x for x in ann.get(ANN_INPUT_REFS, "").split(",") if x] or prov.get("input_refs") or []
    record = RunRecord(
        run_id=r.run_id, kind=r.kind or prov.get("workload_kind"), namespace=r.namespace or prov.get("namespace"),
        name=r.name or prov.get("name"), uid=r.uid,
        project=r.labels.get(LABEL_PROJECT) or prov.get("project"),
        workspace=r.labels.get(LABEL_WORKSPACE) or prov.get("workspace"),
        target=r.labels.get(LABEL_TARGET) or prov.get("target"),
        queue=r.wl_queue or prov.get("queue"), cluster_queue=next((a.cq for a in reversed(atts) if a.cq), None),
        status=status, reason=reason, message=message, phase=phase, attempts=len(atts), retries=total_retries,
        evictions=evictions, created_at=utc(r.created),
        queued_at=queued_cur.queued_at if queued_cur else None,
        admitted_at=queued_cur.admitted_at if queued_cur else None,
        started_at=next((a.started_at for a in attempts_out if a.started_at is not None), None),
        finished_at=utc(final.at) if final else None,
        admission_wait_s=queued_cur.admission_wait_s if queued_cur else None,
        pending_reason=pending[0] if pending and final is None and cur and cur.admitted_at is None else None,
        pending_message=pending[1] if pending and final is None and cur and cur.admitted_at is None else "",
        git_commit=ann.get(ANN_GIT_COMMIT) or prov.get("git_commit"),
        config_digest=ann.get(ANN_CONFIG_DIGEST) or prov.get("config_digest"),
        config_ref=ann.get(ANN_CONFIG_REF) or prov.get("config_ref"),
        input_refs=input_refs, output_uri=ann.get(ANN_OUTPUT) or prov.get("output_uri"),
        resume_of=resume_of, last_checkpoint=r.checkpoint[2] if r.checkpoint else None,
    )
    metrics = [MetricSummary(run_id=r.run_id, metric=k, first_step=m.first[0], first_value=m.first[1],
                             latest_step=m.latest[0], latest_value=m.latest[1], min_value=m.lo, max_value=m.hi,
                             points=m.points) for k, m in sorted(r.metrics.items())]
    links = [ResumeLink(run_id=r.run_id, resume_of=resume_of)] if resume_of else []
    return RunHistory(run=record, transitions=transitions, attempts=attempts_out, metrics=metrics, resume_links=links)


# ------------------------------------------------------------------------------------------ pieces


def _intake(r: RunFacts) -> dict[str, Any]:
    phases: dict[Phase, tuple[int, str, str]] = {}
    prov: dict[str, Any] = {}
    failure: tuple[int, str, str, str] | None = None
    for _eid, (kind, status, at, data) in sorted(r.intake.items(), key=lambda kv: (kv[1][2], kv[0])):
        phase = Phase.RESOLUTION if kind == "Resolution" else Phase.RENDERING
        if phase not in phases:
            phases[phase] = (at, f"{kind}Started" if status == "started" else f"{kind}{status.capitalize()}", "")
        for k, v in data.items():
            if v not in (None, "", []) and k not in ("reason", "message"):
                prov.setdefault(k, v)
        if status == "failed" and failure is None:
            failure = (at, data.get("reason") or f"{kind}Failed", data.get("message") or "", kind)
    return {"phases": phases, "prov": prov, "failure": failure}


def _kueue_attempts(r: RunFacts) -> list[_Att]:
    """Attempts from the Workload's admission and eviction cycles (or one attempt without Kueue).

    A deactivation ends an attempt; a later reactivation (``Requeued=True/Reactivated``) opens the next one,
    queued at the reactivation and triggered by the deactivation. A re-admission after a deactivation whose
    reactivation was not seen opens it too, without a queue time. Nothing reopens a run after its root was
    deleted."""
    queued0 = r.created if r.created is not None else r.wl_created
    if not r.wl_conds and not r.wl_uid:
        if r.kind is None:
            return []
        a = _Att("Submitted" if r.wl_queue else "Created", queued=queued0 if r.wl_queue else None)
        a.start = None if r.wl_queue else r.created
        return [a]
    admits = sorted({k[3] for k in r.wl_conds if k[0] == "Admitted" and k[1] == "True"})
    if not admits and not any(k[0] == "Admitted" for k in r.wl_conds):
        admits = sorted({k[3] for k in r.wl_conds if k[0] == "QuotaReserved" and k[1] == "True"})
    evicts = sorted((k[3], k[2], msg) for k, msg in r.wl_conds.items() if k[0] == "Evicted" and k[1] == "True")
    reactivations = sorted((k[3], msg) for k, msg in r.wl_conds.items()
                           if k[0] == "Requeued" and k[1] == "True" and k[2] == REACTIVATED
                           and (r.root_deleted is None or k[3] < r.root_deleted))
    causes: dict[str, list[str]] = {}
    for key in sorted(r.wl_evictions):
        reason, _, cause = key.partition("\x1f")
        causes.setdefault(reason, []).append(cause)
    missed = _missed_eviction(r, evicts, causes)
    seen_reasons: dict[str, int] = {}
    timeline = sorted([(t, 0, "", "") for t in admits] + [(t, 1, reason, msg) for t, reason, msg in evicts])
    atts = [_Att("Submitted", queued=queued0)]
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
        while todo and todo[-1][0] < after:
            todo.pop()  # a reactivation of an earlier cycle, or one that nothing we saw was deactivated for
        if not todo or (until is not None and (todo[-1][0] > until or (todo[-1][0] == until and not inclusive))):
            return None
        at, msg = todo.pop()
        return _Att(trigger, trigger_message=message, queued=at, reopened=(REACTIVATED, msg))

    for at, kind, reason, msg in timeline:
        nxt = reopen(at, inclusive=kind == 0)
        if nxt is not None:
            atts.append(nxt)
        cur = atts[-1]
        if kind == 0:
            if cur.admitted is not None:
                if cur.end is not None and is_deactivation(cur.end_reason):
                    # re-admitted after a deactivation whose reactivation was not seen
                    atts.append(_Att(cur.end_reason or "", trigger_message=cur.end_message))
                else:
                    # re-admitted without an observed eviction (intermediate states lost to a relist): the attempt
                    # before it was evicted at the latest when it was admitted again (docs/limits.md)
                    cur.end, cur.end_reason, cur.end_message, cur.cause = at, *missed
                    atts.append(_Att(EVICTION_NOT_OBSERVED))
                cur = atts[-1]
            cur.admitted = cur.start = at
            cur.cq = r.cq_by_admission.get(at)
            continue
        if cur.end is not None:
            continue  # deactivated: nothing counts as a new attempt until it is reactivated
        if cur.admitted is None and not is_deactivation(reason):
            continue
        n = seen_reasons.get(reason, 0)
        seen_reasons[reason] = n + 1
        cause_list = causes.get(reason) or [""]
        cur.end, cur.end_reason, cur.end_message = at, reason, msg
        cur.cause = cause_list[min(n, len(cause_list) - 1)] or None
        if not is_deactivation(reason):
            atts.append(_Att(reason, trigger_message=msg, queued=at))
    nxt = reopen(None, inclusive=True)
    if nxt is not None:
        atts.append(nxt)
    return atts


EVICTION_NOT_OBSERVED = "EvictionNotObserved"
_NOT_OBSERVED_MESSAGE = "evicted before this re-admission; the eviction itself was not observed"


def _missed_eviction(r: RunFacts, evicts: list[tuple[int, str, str]], causes: dict[str, list[str]]
                     ) -> tuple[str, str, str | None]:
    """(end reason, end message, underlying cause) of an attempt whose eviction was not observed: the reason
    Kueue's eviction counts (``status.schedulingStats.evictions``) have more of than the Evicted=True transitions
    seen, when there is exactly one such reason; else ``EvictionNotObserved``."""
    unseen: dict[str, int] = {}
    for key, count in r.wl_evictions.items():
        reason = key.partition("\x1f")[0]
        unseen[reason] = unseen.get(reason, 0) + count
    for _at, reason, _msg in evicts:
        if reason in unseen:
            unseen[reason] -= 1
    reasons = sorted(reason for reason, n in unseen.items() if n > 0)
    if len(reasons) != 1:
        return EVICTION_NOT_OBSERVED, _NOT_OBSERVED_MESSAGE, None
    found = set(causes.get(reasons[0], ()))
    cause = found.pop() if len(found) == 1 else ""
    return reasons[0], _NOT_OBSERVED_MESSAGE, cause or None


def _failed_before(a: RayAttemptFacts) -> int:
    """KubeRay's count of failed deployments (``status.failed``) when this deployment started: its own failure
    is counted in the status that reports it (Retrying, Failed, or a FAILED Ray job), not in the earlier ones."""
    own = a.outcome is not None and (a.outcome[1] in ("Retrying", "Failed") or a.outcome[2] == "FAILED")
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
                retried = (prev.outcome is not None and prev.outcome[1] == "Retrying") or \
                    _failed_before(r.ray[st]) > _failed_before(prev)
                if not retried:
                    continue
                reason = prev.outcome[3] if prev.outcome else "Unknown"
                message = prev.outcome[4] if prev.outcome else ""
                nxt = _Att("RayJobRetry", trigger_message=f"{reason}: {message}" if message else reason,
                           start=st, end=cur.end, end_reason=cur.end_reason, end_message=cur.end_message,
                           cause=cur.cause, cq=cur.cq)
                cur.end, cur.end_reason, cur.end_message, cur.cause = st, reason, message, None
                if prev.outcome and prev.outcome[0] > 0:
                    cur.end = min(prev.outcome[0], st)
                out.append(cur)
                cur = nxt
            cur.ray_start = st
            cur.ray_cluster = r.ray[st].cluster
        out.append(cur)
    return out


def _assign_pods(r: RunFacts, atts: list[_Att]) -> None:
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


def _failures(r: RunFacts, a: _Att) -> tuple[list[PodFailure], int]:
    fails = []
    created = sorted(r.pods[u].created or 0 for u in a.pods)
    retries = 0
    for u in a.pods:
        p = r.pods[u]
        if p.finished is None or p.finished[1] != "Failed":
            continue
        at = p.finished[0]
        killed = p.disrupted or (p.delete_requested is not None and p.delete_requested <= at)
        if killed:
            continue
        fails.append((at, p.name, p.finished[2], p.finished[3], p.finished[4]))
        if any(c > at for c in created):
            retries += 1
    fails.sort()
    return [PodFailure(pod=n, at=utc(at), reason=reason, exit_code=None if code < 0 else code, message=msg)
            for at, n, reason, code, msg in fails], retries


def _final(r: RunFacts, atts: list[_Att], intake: dict[str, Any]) -> _Final | None:
    root_src = _source(r.kind, r.namespace, r.name)
    if intake["failure"] is not None and r.kind is None:
        at, reason, msg, _kind = intake["failure"]
        return _Final(Status.FAILED, reason, msg, at, "TauGrid/intake")
    for ctype, ok in (("Complete", Status.SUCCEEDED), ("Failed", Status.FAILED)):
        hits = sorted((k[3], k[2], m) for k, m in r.job_conds.items() if k[0] == ctype and k[1] == "True")
        if hits:
            at, reason, msg = hits[0]
            return _Final(ok, reason or ("Completed" if ok is Status.SUCCEEDED else "Failed"), msg, at, root_src)
    if r.ray:
        last = r.ray[max(r.ray)]
        if last.outcome and last.outcome[1] in ("Complete", "Failed"):
            end, jds, js, reason, msg = last.outcome
            ok = Status.SUCCEEDED if jds == "Complete" and js == "SUCCEEDED" else Status.FAILED
            return _Final(ok, reason or ("Succeeded" if ok is Status.SUCCEEDED else js or "Failed"), msg,
                          end if end > 0 else None, root_src)
    finished = sorted((k[3], k[2], m) for k, m in r.wl_conds.items() if k[0] == "Finished" and k[1] == "True")
    if finished:
        at, reason, msg = finished[0]
        return _Final(Status.SUCCEEDED if reason == "Succeeded" else Status.FAILED, reason, msg, at,
                      _source("Workload", r.namespace, r.wl_name))
    if atts and atts[-1].end_reason and is_deactivation(atts[-1].end_reason):
        a = atts[-1]
        return _Final(Status.STOPPED, a.end_reason or "Deactivated", a.end_message, a.end,
                      _source("Workload", r.namespace, r.wl_name))
    if r.root_deleted is not None:
        return _Final(Status.STOPPED, "Deleted", "the workload was deleted before it finished",
                      r.root_deleted, root_src)
    return None


# Warning Events that explain a wait, by the phase the run is waiting in (Events are best-effort evidence:
# used only when the objects' own status says nothing)
_WAIT_EVENTS = {
    Phase.ADMISSION: ("Pending", "Inadmissible"),
    Phase.SCHEDULING: ("FailedScheduling", "FailedCreate"),
    Phase.RUNTIME: ("Failed", "BackOff", "FailedMount", "Unhealthy"),
}


def _latest_warning(r: RunFacts, phase: Phase, since: int | None) -> tuple[str, str] | None:
    reasons = _WAIT_EVENTS.get(phase, ())
    hits = sorted(((e.last, e.reason, e.message) for e in r.events.values()
                   if e.type == "Warning" and e.reason in reasons and (since is None or e.last >= since)),
                  reverse=True)
    return (hits[0][1], hits[0][2]) if hits else None


def _pending_reason(r: RunFacts, atts: list[_Att], phase: Phase, pending: tuple[str, str] | None
                    ) -> tuple[str | None, str]:
    cur = atts[-1] if atts else None
    since = None if cur is None else (cur.start if phase != Phase.ADMISSION else cur.queued)
    if phase == Phase.ADMISSION:
        return pending or _latest_warning(r, phase, since) or ("Queued", "")
    pods = [r.pods[u] for u in cur.pods] if cur else []
    if phase == Phase.SCHEDULING:
        unsched = sorted((p.unschedulable for p in pods if p.unschedulable and p.scheduled is None), reverse=True)
        if unsched:
            _ltt, reason, msg = unsched[0]
            return reason, msg
    waiting = sorted(p.waiting_reason for p in pods if p.waiting_reason)
    if phase in (Phase.SCHEDULING, Phase.RUNTIME) and waiting:
        return waiting[0], ""
    event = _latest_warning(r, phase, since)
    if event:
        return event
    return ("WaitingForPods", "") if phase == Phase.SCHEDULING else (None, "")
