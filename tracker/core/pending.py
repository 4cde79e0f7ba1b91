"""Admission in steps, and every pending second explained: what an attempt waited for before its application started.

An attempt's *pending window* runs from the time it was queued (Admission; without Kueue, or for a RayJob retry,
from its Scheduling entry) to its application's start: the time the last of the pods it expects had a container
running (a RayJob's RayCluster pods; the first progress report or the Ray job's start if earlier), or the attempt's
end if it never started; a live attempt's window is still open (its last span has no end, and readers count it up
to their ``--now``). Each second of the window falls in exactly one ``PendingCategory``, decided by a sweep over the
evidence the objects carry, all with their own times (never the tracker's clock):

Admission (until the Workload's ``Admitted=True``):

- ``queued``: not evaluated by Kueue yet: before the Workload carries ``QuotaReserved=False`` (or a Kueue
  ``Pending`` event), and after an eviction until Kueue released the quota and queued it again;
- ``quota``, ``preemption``, ``inadmissible``: ``QuotaReserved=False`` with its reason and message (at its
  ``lastTransitionTime``), refined by Kueue's Warning events on the Workload (each distinct message is an Event of
  its own, whose ``firstTimestamp`` is when Kueue first said it) and by ``PreemptedWorkload`` (Kueue 0.17+): see
  ``classify``;
- ``backoff``: ``Requeued=False`` (a PodsReady timeout or an admission check's retry delay) until ``Requeued=True``;
- ``admission-check``: quota reserved (``QuotaReserved=True``), an admission check (``status.admissionChecks``)
  not Ready: the first by name; detail: its name. A reservation whose checks are all Ready counts for the one
  that became Ready last (Kueue has not written Admitted yet).

Scheduling and Runtime (from admission):

- ``pod-creation``: admitted, none of its pods created yet (the Job controller or KubeRay creating them);
- ``scheduling``: pods created, not all bound, none found unschedulable;
- ``unschedulable``: from the first ``PodScheduled=False`` of its pods until all are bound;
- ``image-pull``: pods bound, images pulling (``Pulling``/``Pulled`` Events of its pods, or a container waiting
  in ``ErrImagePull``/``ImagePullBackOff``);
- ``container-creation``: pods bound, containers not running yet, no image pull seen;
- ``unexplained``: a reservation that is neither admitted nor waits for a check the tracker knows of.

Pure: a function of the facts and of what ``derive`` worked out (attempts, their pods' sums), like the rest of it.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import NamedTuple

from tracker.core.derive_attempts import _Att, is_deactivation
from tracker.core.derive_pods import AttemptPods
from tracker.core.facts import RunFacts
from tracker.core.model import AdmissionStep, PendingCategory, PendingSpan, utc
from tracker.core.vocab import span_key as span_key  # re-exported (defined there for the readers)

Cat = PendingCategory

# QuotaReserved=False reasons (legacy and granular, lifecycle.md §1.4) of a Workload Kueue cannot admit as it is
INADMISSIBLE_REASONS = frozenset({"Inadmissible", "Misconfigured", "Suspended", "OnHold", "AdmissionGated",
                                  "ExceedsMaxQuota", "NoMatchingFlavor"})
PREEMPTION_REASONS = frozenset({"WaitingForPreemptedWorkloads"})
QUEUED_REASONS = frozenset({"PendingEvaluation"})
# Kueue's Warning events that repeat the QuotaReserved=False message (the legacy ``Pending`` and the granular ones)
KUEUE_PENDING_EVENTS = frozenset({"Pending", "WaitingForQuota", "NoMatchingFlavor", "ExceedsMaxQuota",
                                  "TopologyPlacementFailed", "WaitingForPreemptedWorkloads", "Misconfigured",
                                  "Inadmissible"})
_INADMISSIBLE_TEXT = ("doesn't exist", "does not exist", "is inactive", "is stopped", "request > maximum capacity")
IMAGE_PULL_WAITING = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName")

# kinds of admission steps (model.AdmissionStep.kind), in the order of steps at the same time
QUOTA_RESERVED, ADMISSION_CHECK, QUOTA_RELEASED = "QuotaReserved", "AdmissionCheck", "QuotaReleased"
_STEP_ORDER = {QUOTA_RELEASED: 0, QUOTA_RESERVED: 1, ADMISSION_CHECK: 2}


def classify(reason: str, message: str) -> tuple[Cat, str]:
    """The category of a ``QuotaReserved=False`` (or Kueue pending event) reason and message, and its detail."""
    low = message.lower()
    detail = message or reason
    if reason in INADMISSIBLE_REASONS or any(t in low for t in _INADMISSIBLE_TEXT):
        return Cat.INADMISSIBLE, detail
    if reason in PREEMPTION_REASONS or "pending the preemption" in low:
        return Cat.PREEMPTION, detail
    if reason in QUEUED_REASONS:
        return Cat.QUEUED, detail
    return Cat.QUOTA, detail


class AttemptPending(NamedTuple):
    steps: list[AdmissionStep]
    spans: list[PendingSpan]
    by: dict[str, float]  # seconds of the ended spans by key (``span_key``)
    reserved: int | None  # the last quota reservation of its Admission
    check: tuple[str, str, str] | None  # the check it waits for now: (name, state, message), if it waits for one


# events of the sweep, in the order they apply at the same time
_E_QUOTA, _E_REQUEUE, _E_RELEASE, _E_RESERVE, _E_CHECK = range(5)


def attempt_pending(r: RunFacts, a: _Att, number: int, pods: AttemptPods, runtime_at: int | None,
                    progress_at: int | None) -> AttemptPending:
    """Admission steps and pending spans of attempt ``number`` (1-based) ``a``."""
    w0 = a.queued if a.queued is not None else a.start
    if w0 is None:
        return AttemptPending([], [], {}, None, None)
    w1 = _app_start(r, a, pods, runtime_at, progress_at, w0)
    adm_end = a.admitted if a.admitted is not None else (a.start if a.start is not None and a.queued is not None
                                                          else None)
    last = adm_end if adm_end is not None else a.end

    def inside(t: int, inclusive_end: bool = True) -> bool:
        return t >= w0 and (last is None or t < last or (inclusive_end and t == last))

    # ---- admission steps and the sweep's events
    steps: list[AdmissionStep] = []
    evs: list[tuple[int, int, str, str, str, int]] = []  # (at, kind, a, b, c, resourceVersion)
    if a.queued is not None:
        for (ctype, status, reason, at), msg in r.wl_conds.items():
            if ctype == "QuotaReserved":
                if status == "True" and inside(at):
                    evs.append((at, _E_RESERVE, reason, msg, "", 0))
                    steps.append(AdmissionStep(kind=QUOTA_RESERVED, at=utc(at), state=r.cq_by_admission.get(at, ""),
                                               message=msg))
                elif status == "False" and inside(at, inclusive_end=False):
                    evs.append((at, _E_QUOTA, reason, msg, "", 0))
            elif ctype == "Requeued" and inside(at, inclusive_end=False) and not is_deactivation(reason):
                evs.append((at, _E_REQUEUE, status, reason, msg, 0))
            elif ctype == "Evicted" and status == "True" and at >= w0 and (
                    (adm_end is not None and at < adm_end) or (adm_end is None and (a.end is None or at <= a.end))):
                evs.append((at, _E_RELEASE, reason, msg, "", 0))
                steps.append(AdmissionStep(kind=QUOTA_RELEASED, at=utc(at), state=reason, message=msg))
        for ckey, msg in r.wl_checks.items():
            name, state, _r, at = ckey
            if at <= w0 or inside(at):
                # states in one second: the one of the newest Workload version last (Kueue resets a Retry or
                # Rejected check to Pending in the second it evicts)
                evs.append((at, _E_CHECK, name, state, msg, r.wl_checks_rv.get(ckey, -1)))
                if at >= w0:
                    steps.append(AdmissionStep(kind=ADMISSION_CHECK, at=utc(at), check=name, state=state, message=msg))
        for e in r.events.values():
            if e.object_kind != "Workload" or not inside(e.first, inclusive_end=False):
                continue
            if e.type == "Warning" and e.reason in KUEUE_PENDING_EVENTS:
                evs.append((e.first, _E_QUOTA, e.reason, e.message, "event", 0))
            elif e.reason == "PreemptedWorkload":  # Kueue 0.17+: on the preemptor, when it preempts
                evs.append((e.first, _E_QUOTA, "WaitingForPreemptedWorkloads", e.message, "event", 0))
    evs.sort(key=lambda e: (e[0], e[1], e[5], e[2:5]))
    steps.sort(key=lambda s: (s.at, _STEP_ORDER[s.kind], s.check or "", s.state))

    # ---- the sweep over Admission
    spans: list[tuple[int, Cat, str]] = []  # (start, category, detail): each runs to the next one's start
    quota: tuple[Cat, str] = (Cat.QUEUED, "" if number == 1 else f"requeued after {a.trigger}")
    reserved = False
    reserved_at: int | None = None
    backoff: str | None = None
    checks: dict[str, tuple[int, int, str, str]] = {}  # name -> (at, resourceVersion, state, message)

    def not_ready() -> list[tuple[str, str, str]]:
        """The checks not Ready now, by name: (name, state, message)."""
        return sorted((n, st, m) for n, (_at, _rv, st, m) in checks.items() if st != "Ready")

    def current() -> tuple[Cat, str]:
        if reserved:
            waiting = not_ready()
            if waiting:
                return Cat.ADMISSION_CHECK, waiting[0][0]
            if checks:
                return Cat.ADMISSION_CHECK, max(checks.items(), key=lambda kv: (kv[1][:2], kv[0]))[0]
            return Cat.UNEXPLAINED, "quota reserved, not admitted, no admission check known"
        if backoff is not None:
            return Cat.BACKOFF, backoff
        return quota

    spans.append((w0, *current()))
    for at, kind, x, y, z, rv in evs:
        if kind == _E_QUOTA:
            quota = classify(x, y)
            reserved = False
        elif kind == _E_REQUEUE:
            backoff = None if x == "True" else (f"{y}: {z}" if z else y)
        elif kind == _E_RELEASE:
            reserved = False
            quota = (Cat.QUEUED, f"quota released ({x}), waiting to be queued again")
        elif kind == _E_RESERVE:
            reserved, reserved_at = True, at
            backoff = None
        else:
            old = checks.get(x)
            if old is None or (at, rv) >= old[:2]:
                checks[x] = (at, rv, y, z)
        if at >= w0:
            spans.append((max(at, w0), *current()))

    # ---- Scheduling and Runtime
    start = a.start
    if start is not None and (w1 is None or start < w1):
        spans.append((start, Cat.POD_CREATION, _event_message(r, "FailedCreate", start)))
        i = bisect_left(pods.created, start)
        first_created = pods.created[i] if i < len(pods.created) else None
        if first_created is not None:
            spans.append((max(first_created, start), Cat.SCHEDULING, ""))
            j = bisect_left(pods.unsched_at, start)
            if j < len(pods.unsched_at):
                spans.append((max(pods.unsched_at[j], start), Cat.UNSCHEDULABLE, _unschedulable_detail(r, pods)))
        if runtime_at is not None:
            spans.extend(_runtime(r, pods, runtime_at, w1))

    # ---- clip to the window, merge neighbours
    out: list[PendingSpan] = []
    by: dict[str, float] = {}
    cuts = sorted(spans, key=lambda s: s[0])  # stable: at one time, the later evidence wins
    merged: list[tuple[int, Cat, str]] = []
    for t, cat, detail in cuts:
        t = max(t, w0)
        if w1 is not None and t >= w1:
            break
        if merged and merged[-1][0] == t:
            merged[-1] = (t, cat, detail)
            if len(merged) > 1 and merged[-2][1:] == merged[-1][1:]:
                merged.pop()
        elif not merged or merged[-1][1:] != (cat, detail):
            merged.append((t, cat, detail))
    for k, (t, cat, detail) in enumerate(merged):
        end = merged[k + 1][0] if k + 1 < len(merged) else w1
        out.append(PendingSpan(category=cat, detail=detail, start=utc(t), end=utc(end)))
        if end is not None:
            key = span_key(cat, detail)
            by[key] = by.get(key, 0.0) + (end - t) / 1_000_000
    check = None
    if a.queued is not None and a.admitted is None and reserved and a.end is None:
        check = next(iter(not_ready()), None)
    return AttemptPending(steps, out, by, reserved_at, check)


def _app_start(r: RunFacts, a: _Att, pods: AttemptPods, runtime_at: int | None, progress_at: int | None,
               w0: int) -> int | None:
    """When the attempt's application started (the end of its pending window), else its end (None: still open)."""
    starts = pods.starts
    app = starts[r.expected_pods - 1] if len(starts) >= r.expected_pods else None
    if progress_at is not None and (app is None or progress_at < app):
        app = progress_at
    if app is None and runtime_at is not None and r.kind == "RayJob" and not starts:
        app = runtime_at  # a RayCluster ready, whose pods were not seen
    if app is None and a.end is not None and starts:
        app = starts[-1]  # ended with fewer pods started than it expects: the last that did
    if app is not None:
        app = max(app, w0)
        return app if a.end is None else min(app, max(a.end, w0))
    return None if a.end is None else max(a.end, w0)


def _runtime(r: RunFacts, pods: AttemptPods, runtime_at: int, w1: int | None) -> list[tuple[int, Cat, str]]:
    """Spans from all pods bound to the application's start: image pulls, else container creation."""
    pulling = [e.first for e in r.events.values()
               if e.object_kind == "Pod" and e.reason == "Pulling" and e.first >= runtime_at
               and (w1 is None or e.first < w1)]
    pulled = [e.last for e in r.events.values()
              if e.object_kind == "Pod" and e.reason == "Pulled" and e.last >= runtime_at
              and (w1 is None or e.last <= w1)]
    waiting = [str(w) for w in pods.waiting.items]
    pull_wait = next((w for w in waiting if w in IMAGE_PULL_WAITING), None)
    other = next((w for w in waiting if w not in IMAGE_PULL_WAITING), "")
    out: list[tuple[int, Cat, str]] = [(runtime_at, Cat.CONTAINER_CREATION, other)]
    if pulling:
        out.append((min(pulling), Cat.IMAGE_PULL, pull_wait or "Pulling"))
        done = max(pulled) if pulled else None
        if done is not None and done > min(pulling) and pull_wait is None:
            out.append((done, Cat.CONTAINER_CREATION, other))
    elif pull_wait is not None:
        out = [(runtime_at, Cat.IMAGE_PULL, pull_wait)]
    return out


def _event_message(r: RunFacts, reason: str, since: int) -> str:
    hits = sorted((e.last, e.message) for e in r.events.values() if e.reason == reason and e.last >= since)
    return hits[-1][1] if hits else ""


def _unschedulable_detail(r: RunFacts, pods: AttemptPods) -> str:
    if pods.unschedulable.items:
        u = pods.unschedulable.items[-1]
        return f"{u.reason}: {u.message}" if u.message else str(u.reason)
    return _event_message(r, "FailedScheduling", 0)
