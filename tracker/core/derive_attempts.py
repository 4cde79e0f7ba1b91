"""Step 2 of ``derive`` (``derive.py``): a run's attempts.

An attempt is one admission of the run. ``_kueue_attempts`` cuts the Workload's conditions into admission /
eviction cycles and ``_split_ray_retries`` cuts an admission again where KubeRay retried the RayJob on a new
RayCluster; which pod ran in which attempt, and what the attempts' pods add up to, is ``derive_pods.py``'s. Also
here: the Kueue reasons and attempt triggers the rules (``derive_rules.py``) read, and the condition helpers. Pure,
like the rest of the derivation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from tracker.core.facts import CondFacts, RayAttemptFacts, RunFacts

# re-exported (this module's users have imported them from here)
from tracker.core.vocab import CREATED as CREATED
from tracker.core.vocab import DEACTIVATED_DUE_TO as _DEACTIVATED_DUE_TO
from tracker.core.vocab import DEACTIVATION_REASONS as DEACTIVATION_REASONS
from tracker.core.vocab import EVICTION_NOT_OBSERVED as EVICTION_NOT_OBSERVED
from tracker.core.vocab import RAYJOB_RETRY as RAYJOB_RETRY
from tracker.core.vocab import REACTIVATED as REACTIVATED
from tracker.core.vocab import SUBMITTED as SUBMITTED
from tracker.core.vocab import is_deactivation as is_deactivation

_NOT_OBSERVED_MESSAGE = "evicted before this re-admission; the eviction itself was not observed"


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
    # the reason of the Admission entry when it is not the trigger: a reactivation
    reopened: Reason | None = None


# ------------------------------------------------------------------------------------------ 2. attempts

_ADMIT, _EVICT = 0, 1  # kinds of a Workload cycle event (at the same time: see _in_cycle_order)


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
    # a Workload without any Admitted condition (an old Kueue) is admitted at its quota reservation, unless it has
    # admission checks: then Kueue admits it only once every check is Ready (Admitted=True)
    if not admits and not r.wl_checks and not any(key[0] == "Admitted" for key in r.wl_conds):
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

    for ev in _in_cycle_order(timeline, lambda: atts[-1].admitted is not None and atts[-1].end is None):
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
        if cur.cause is None and ev.reason.startswith(_DEACTIVATED_DUE_TO):
            # Kueue 0.17 counts its own deactivation as reason Deactivated, cause RequeuingLimitExceeded, where the
            # condition says DeactivatedDueToRequeuingLimitExceeded: the cause, if Kueue counted it so
            suffix = ev.reason[len(_DEACTIVATED_DUE_TO):]
            cur.cause = suffix if suffix and suffix in causes.get("Deactivated", ()) else None
        if not is_deactivation(ev.reason):
            atts.append(_Att(ev.reason, trigger_message=ev.message, queued=ev.at))
    nxt = reopen(None, inclusive=True)
    if nxt is not None:
        atts.append(nxt)
    return atts


def _in_cycle_order(timeline: list[_CycleEvent], open_admission: Callable[[], bool]) -> Iterator[_CycleEvent]:
    """The cycle events (sorted by time) in the order they can have happened. Condition times have whole seconds, so
    an eviction and the next admission often share one: while an admission is open (``open_admission()``, asked
    before each event), an eviction at a time goes before an admission at the same time (Kueue admits again only
    what it evicted and released); otherwise the admission goes first (admitted and evicted within one second)."""
    i = 0
    while i < len(timeline):
        j = i
        while j < len(timeline) and timeline[j].at == timeline[i].at:
            j += 1
        group = timeline[i:j]
        while group:
            kind = _EVICT if open_admission() else _ADMIT
            pick = next((k for k, ev in enumerate(group) if ev.kind == kind), 0)
            yield group.pop(pick)
        i = j


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
    deployment's RayCluster, unless that one never created its RayCluster (seen as an object) and this one did."""
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
                    if cur.ray_cluster not in r.ray_clusters and r.ray[st].cluster in r.ray_clusters:
                        # the deployment before created no RayCluster: a RayJob created suspended (Kueue) goes
                        # Initializing -> Suspending -> Suspended before it is admitted, naming a RayCluster it never
                        # creates; the attempt ran this one
                        cur.ray_start, cur.ray_cluster = st, r.ray[st].cluster
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
