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

A history is built in five steps, each a table or a function. ``derive`` (below) runs them and assembles the
history and its run record (``_record``); the attempts of step 2 are worked out in ``derive_attempts.py``, and
the rule tables of steps 1, 3, 4 and 5, with the functions their rows name, are in ``derive_rules.py``:

1. **Intake** (``_intake``): TauGrid's Resolution and Rendering events give the first two phases
   (``INTAKE_PHASES``), the provenance fields used when the root object does not carry them, and an intake
   failure.
2. **Attempts**: an attempt is one admission of the run. ``_kueue_attempts`` cuts the Workload's conditions into
   admission / eviction cycles (Kueue keeps one Workload through evictions and requeues: lifecycle.md §7, "cross
   object rules"); ``_split_ray_retries`` cuts an admission again where KubeRay retried the RayJob on a new
   RayCluster; ``_assign_pods`` gives each pod to the attempt it ran in (``derive_attempts.py``).
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
   (``_record``, below).

Each table is ordered and holds the rules of one decision; a reader can check each row against lifecycle.md
(§1.7 for Kueue, §2 for Jobs, §3 for Pods, §4 for KubeRay, §7 for the mapping to the seven phases).
``tests/test_derive_tables.py`` checks their invariants.
"""

from __future__ import annotations

from tracker.core import gpu
from tracker.core.derive_attempts import (
    CREATED,
    DEACTIVATION_REASONS,
    EVICTION_NOT_OBSERVED,
    RAYJOB_RETRY,
    REACTIVATED,
    SUBMITTED,
    Cond,
    Reason,
    _assign_pods,
    _failures,
    _kueue_attempts,
    _split_ray_retries,
    is_deactivation,
)
from tracker.core.derive_rules import (
    ATTEMPT_PHASES,
    FINAL_STATUS_RULES,
    INTAKE_PHASES,
    INTAKE_SOURCE,
    RUNNING_PHASES,
    WAIT_RULES,
    AttemptPhase,
    Entry,
    FinalRule,
    IntakePhase,
    WaitEvidence,
    WaitRule,
    _Final,
    _final,
    _Intake,
    _intake,
    _pending_reason,
    _Run,
    _source,
    _view,
)
from tracker.core.facts import RunFacts
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
    MetricPoint,
    MetricSummary,
    Phase,
    PodPlacement,
    ResumeLink,
    RunHistory,
    RunRecord,
    Status,
    Transition,
    utc,
)

# the derivation's names, importable from here as before it was split in three modules
__all__ = [
    "ATTEMPT_PHASES", "CREATED", "DEACTIVATION_REASONS", "EVICTION_NOT_OBSERVED", "FINAL_STATUS_RULES", "INTAKE_PHASES",
    "INTAKE_SOURCE", "RAYJOB_RETRY", "REACTIVATED", "RUNNING_PHASES", "SUBMITTED", "WAIT_RULES", "AttemptPhase", "Cond",
    "Entry", "FinalRule", "IntakePhase", "Reason", "WaitEvidence", "WaitRule", "derive", "is_deactivation",
    "may_reopen",
]


def may_reopen(r: RunFacts, run: RunRecord) -> bool:
    """Whether a run that looks finished may still come back: stopped by a Kueue deactivation while its Job or
    RayJob still exists, so that a reactivation reopens it. Such a run is not finished for good (a consumer
    that frees finished runs must keep it); once its root is deleted it is."""
    return run.status is Status.STOPPED and is_deactivation(run.reason) and r.root_deleted is None


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
                                  resume_links=links, metric_points=_points(r)), r, [a.pods for a in atts])


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


def _points(r: RunFacts) -> list[MetricPoint]:
    return [MetricPoint(run_id=r.run_id, metric=k, step=step, value=value, at=utc(at))
            for k, curve in sorted(r.points.curves.items()) for step, value, at in sorted(curve.values())]
