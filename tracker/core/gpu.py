"""GPU accounting: the GPUs each pod held, for how long, and which of that GPU-time was lost.

The definitions are written once, in ``schemas/gpu-accounting.md``; this module is their only implementation. In
short:

- a pod's **GPUs** are the accelerators its containers request (``Accelerators``: the extended resources named in
  the setting ``reduce.accelerator_resources``, ``ACCELERATOR_RESOURCES`` by default; a container that sets only a
  limit requests its limit), summed over its containers;
- a pod **holds** them from its bind (PodScheduled=True) to its end: the last container's finish, else the deletion
  asked for, else the end of its attempt; a pod with none of these still holds them, and its GPU-time is left open
  (``gpu_hours`` None) for a reader to count up to its own notion of now (``held_hours``): the reducer reads no clock;
- held GPU-time is **lost** when it was thrown away, first matching rule wins: the pod ended abnormally (failed, or
  killed from outside) and the attempt replaced it (``PodFailure``, ``PodEvicted``); its attempt was ended by a Kueue
  eviction or a KubeRay retry (``Preempted``, ``PodsReadyTimeout``, ``Evicted``, ``RayJobRetry``); the run ended
  failed (``RunFailed``). A run stopped by deleting it loses nothing: whoever deleted it chose to stop.

Pure: it reads the facts and the derived history, and returns the history with the accounting filled in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from tracker.core.facts import PodFacts, RunFacts
from tracker.core.model import Attempt, PodPlacement, RunHistory, Status, utc

#: Extended resources counted as GPUs by default: NVIDIA and AMD GPUs, Intel and Habana accelerators, and NVIDIA MIG
#: slices (``nvidia.com/mig-<profile>``, each counted as one). A name ending in ``*`` matches every resource that
#: starts with the rest of it.
ACCELERATOR_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe",
                                          "habana.ai/gaudi", "nvidia.com/mig-*")

# Why GPU-time was lost (the keys of ``lost_gpu_hours_by``).
LOST_POD_FAILURE = "PodFailure"  # the pod failed and its attempt replaced it
LOST_POD_EVICTED = "PodEvicted"  # the pod was killed from outside (DisruptionTarget, deleted) and replaced
LOST_PREEMPTED = "Preempted"  # the attempt was preempted by Kueue
LOST_PODS_READY_TIMEOUT = "PodsReadyTimeout"  # the attempt was evicted by Kueue's PodsReady timeout
LOST_EVICTED = "Evicted"  # the attempt was ended by any other Kueue eviction or a deactivation
LOST_RAYJOB_RETRY = "RayJobRetry"  # KubeRay retried the RayJob on a new RayCluster
LOST_RUN_FAILED = "RunFailed"  # the run ended failed: all its GPU-time not lost otherwise
LOST_REASONS = (LOST_POD_FAILURE, LOST_POD_EVICTED, LOST_PREEMPTED, LOST_PODS_READY_TIMEOUT, LOST_EVICTED,
                LOST_RAYJOB_RETRY, LOST_RUN_FAILED)

_RAYJOB_RETRY_TRIGGER = "RayJobRetry"  # tracker.core.derive.RAYJOB_RETRY (not imported: derive calls this module)
_DELETED = "Deleted"  # the final reason of a run stopped by deleting its Job/RayJob
_US_PER_HOUR = 3_600_000_000


MAX_GPUS = 1 << 16  # per resource of a container: a larger count is a malformed pod (ValueError)


def _count(value: Any) -> int:
    """A GPU quantity (extended resources are whole numbers): an int or a decimal string; anything else is 0."""
    n = 0
    if isinstance(value, int) and not isinstance(value, bool):
        n = max(0, value)
    elif isinstance(value, str) and value.strip().isdigit():
        n = int(value.strip())
    if n > MAX_GPUS:
        raise ValueError(f"a container requests {value!r} GPUs (more than {MAX_GPUS})")
    return n


class Accelerators:
    """Which extended resources count as GPUs: exact names, and prefixes (a name given with a trailing ``*``)."""

    __slots__ = ("names", "prefixes")

    def __init__(self, resources: Iterable[str] = ACCELERATOR_RESOURCES) -> None:
        given = tuple(resources)
        self.names = frozenset(r for r in given if not r.endswith("*"))
        self.prefixes = tuple(sorted({r[:-1] for r in given if r.endswith("*")}))

    def __contains__(self, resource: object) -> bool:
        return isinstance(resource, str) and (resource in self.names or resource.startswith(self.prefixes))

    def __repr__(self) -> str:
        return f"Accelerators({sorted(self.names) + [p + '*' for p in self.prefixes]})"


DEFAULT_ACCELERATORS = Accelerators()


def is_accelerator(resource: str, accelerators: Accelerators = DEFAULT_ACCELERATORS) -> bool:
    return resource in accelerators


def pod_gpus(spec: Mapping[str, Any], accelerators: Accelerators = DEFAULT_ACCELERATORS) -> int:
    """GPUs a pod requests: per container, each accelerator's request, else its limit; summed over containers.
    ValueError if a count is beyond ``MAX_GPUS``."""
    total = 0
    containers = spec.get("containers")
    for c in containers if isinstance(containers, list) else ():
        res = c.get("resources") if isinstance(c, dict) else None
        if not isinstance(res, dict):
            continue
        req = _dict(res.get("requests"))
        lim = _dict(res.get("limits"))
        for name in {*req, *lim}:
            if isinstance(name, str) and name in accelerators:
                total += _count(req[name]) if name in req else _count(lim[name])
    return total


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _bind(p: PodFacts) -> int | None:
    return p.scheduled if p.scheduled is not None else p.started


def _end(p: PodFacts, attempt_end: int | None) -> int | None:
    if p.finished is not None:
        return p.finished.at
    if p.delete_requested is not None:
        return p.delete_requested
    return attempt_end


def _attempt_loss(i: int, attempts: Sequence[Attempt], status: Status, reason: str | None) -> str | None:
    """Why all of attempt ``i``'s remaining GPU-time was lost, if it was: by how the attempt ended, else the run."""
    a = attempts[i]
    if i + 1 < len(attempts):
        nxt = attempts[i + 1].trigger
        if nxt == _RAYJOB_RETRY_TRIGGER:
            return LOST_RAYJOB_RETRY
        return _eviction(a.end_reason or nxt)
    if status is Status.FAILED:
        return LOST_RUN_FAILED
    if a.ended_at is not None and status not in (Status.SUCCEEDED, Status.FAILED) and \
            not (status is Status.STOPPED and reason == _DELETED):
        return _eviction(a.end_reason)  # evicted and not re-queued yet, or deactivated
    return None


def _eviction(reason: str | None) -> str:
    if reason == "Preempted":
        return LOST_PREEMPTED
    if reason == "PodsReadyTimeout":
        return LOST_PODS_READY_TIMEOUT
    return LOST_EVICTED


class _Acc:
    """One attempt's sums, in GPU-microseconds."""

    __slots__ = ("by", "held", "intervals", "lost", "open_gpus", "open_weight")

    def __init__(self) -> None:
        self.held = 0
        self.lost = 0
        self.by: dict[str, int] = {}
        self.open_gpus = 0
        self.open_weight = 0  # sum of gpus x bind over the pods still holding GPUs
        self.intervals: list[tuple[int, int]] = []  # (time, +gpus / -gpus)


def _peak(events: list[tuple[int, int]]) -> int:
    cur = peak = 0
    for _, delta in sorted(events):  # at equal times releases (negative) come first
        cur += delta
        peak = max(peak, cur)
    return peak


def account(history: RunHistory, r: RunFacts, attempt_pods: Sequence[Sequence[str]]) -> RunHistory:
    """``history`` with GPUs, GPU-hours held and lost filled in per pod placement, attempt and run.

    ``attempt_pods`` lists, per attempt, the uids of its pods (the order of ``Attempt.pods`` is rebuilt here)."""
    run = history.run
    if not any(p.gpus for p in r.pods.values()):
        return history
    attempts_out: list[Attempt] = []
    for i, (a, uids) in enumerate(zip(history.attempts, attempt_pods, strict=True)):
        pods = sorted((r.pods[u] for u in uids), key=lambda p: (p.created or 0, p.name))
        end_us = _us(a.ended_at)
        attempt_loss = _attempt_loss(i, history.attempts, run.status, run.reason)
        last_created = max((p.created or 0 for p in pods), default=0)
        acc = _Acc()
        placements: list[PodPlacement] = []
        for p, placed in zip(pods, a.pods, strict=True):
            placements.append(_pod(p, placed, end_us, attempt_loss, last_created, acc))
        attempts_out.append(a.model_copy(update={
            "pods": placements, "gpus": _peak(acc.intervals), "gpu_hours": acc.held / _US_PER_HOUR,
            "lost_gpu_hours": acc.lost / _US_PER_HOUR,
            "lost_gpu_hours_by": {k: v / _US_PER_HOUR for k, v in sorted(acc.by.items())},
            "gpus_open": acc.open_gpus,
            "open_since": utc(acc.open_weight // acc.open_gpus) if acc.open_gpus else None,
        }))
    return history.model_copy(update={"attempts": attempts_out, "run": run.model_copy(update=totals(attempts_out))})


def _pod(p: PodFacts, placed: PodPlacement, end_us: int | None, attempt_loss: str | None, last_created: int,
         acc: _Acc) -> PodPlacement:
    bind = _bind(p)
    if not p.gpus or bind is None:
        return placed.model_copy(update={"gpus": p.gpus, "gpu_hours": 0.0})
    end = _end(p, end_us)
    if end is None:
        acc.open_gpus += p.gpus
        acc.open_weight += p.gpus * bind
        acc.intervals.append((bind, p.gpus))
        return placed.model_copy(update={"gpus": p.gpus, "gpu_hours": None})
    end = max(end, bind)
    held = p.gpus * (end - bind)
    acc.held += held
    acc.intervals += [(bind, p.gpus), (end, -p.gpus)]
    lost = _pod_loss(p, end, last_created) or attempt_loss
    if lost is not None:
        acc.lost += held
        acc.by[lost] = acc.by.get(lost, 0) + held
    return placed.model_copy(update={"gpus": p.gpus, "released_at": utc(end), "gpu_hours": held / _US_PER_HOUR,
                                     "lost": lost})


def _pod_loss(p: PodFacts, end: int, last_created: int) -> str | None:
    """A pod that ended abnormally and was replaced by a later pod of its attempt."""
    if p.finished is not None and p.finished.phase != "Failed":
        return None
    if p.finished is None and p.delete_requested is None:
        return None  # ended with its attempt
    if last_created <= end:
        return None
    killed = p.finished is None or p.disrupted or (p.delete_requested is not None and p.delete_requested <= end)
    return LOST_POD_EVICTED if killed else LOST_POD_FAILURE


def totals(attempts: Sequence[Attempt]) -> dict[str, Any]:
    """A run's GPU fields from its attempts': sums, in attempt order, except ``gpus`` (the most any attempt held)."""
    by: dict[str, float] = {}
    for a in attempts:
        for k, v in a.lost_gpu_hours_by.items():
            by[k] = by.get(k, 0.0) + v
    open_gpus = sum(a.gpus_open for a in attempts)
    weight = sum(a.gpus_open * (_us(a.open_since) or 0) for a in attempts)
    return {
        "gpus": max((a.gpus for a in attempts), default=0),
        "gpu_hours": sum((a.gpu_hours for a in attempts), 0.0),
        "lost_gpu_hours": sum((a.lost_gpu_hours for a in attempts), 0.0),
        "lost_gpu_hours_by": dict(sorted(by.items())),
        "gpus_open": open_gpus,
        "open_since": utc(weight // open_gpus) if open_gpus else None,
    }


def _us(t: datetime | None) -> int | None:
    if t is None:
        return None
    return (t - _EPOCH) // timedelta(microseconds=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def held_hours(gpu_hours: float, gpus_open: int, open_since: datetime | None, now: datetime | None) -> float:
    """GPU-hours held up to ``now``: the closed GPU-time plus the open pods' (``now`` None: the closed only)."""
    if not gpus_open or open_since is None or now is None:
        return gpu_hours
    return gpu_hours + gpus_open * max(0.0, (now - open_since).total_seconds()) / 3600


def goodput(gpu_hours: float, lost_gpu_hours: float) -> float | None:
    """The share of held GPU-time not lost (None when nothing was held)."""
    return None if gpu_hours <= 0 else (gpu_hours - lost_gpu_hours) / gpu_hours
