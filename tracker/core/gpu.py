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

from tracker.core.facts import PodFacts
from tracker.core.model import Attempt, Status, utc
from tracker.core.vocab import DELETED as _DELETED

# re-exported: why GPU-time was lost (the keys of ``lost_gpu_hours_by``)
from tracker.core.vocab import LOST_EVICTED as LOST_EVICTED
from tracker.core.vocab import LOST_POD_EVICTED as LOST_POD_EVICTED
from tracker.core.vocab import LOST_POD_FAILURE as LOST_POD_FAILURE
from tracker.core.vocab import LOST_PODS_READY_TIMEOUT as LOST_PODS_READY_TIMEOUT
from tracker.core.vocab import LOST_PREEMPTED as LOST_PREEMPTED
from tracker.core.vocab import LOST_RAYJOB_RETRY as LOST_RAYJOB_RETRY
from tracker.core.vocab import LOST_REASONS as LOST_REASONS
from tracker.core.vocab import LOST_RUN_FAILED as LOST_RUN_FAILED
from tracker.core.vocab import RAYJOB_RETRY as _RAYJOB_RETRY_TRIGGER

#: Extended resources counted as GPUs by default: NVIDIA and AMD GPUs, Intel and Habana accelerators, and NVIDIA MIG
#: slices (``nvidia.com/mig-<profile>``, each counted as one). A name ending in ``*`` matches every resource that
#: starts with the rest of it.
ACCELERATOR_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe",
                                          "habana.ai/gaudi", "nvidia.com/mig-*")


US_PER_HOUR = 3_600_000_000  # GPU-µs in a GPU-hour


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


def bind_time(p: PodFacts) -> int | None:
    """When a pod began holding its GPUs: its bind (PodScheduled=True), else its first container start."""
    return p.scheduled if p.scheduled is not None else p.started


def release_time(p: PodFacts, attempt_end: int | None) -> int | None:
    """When a pod stopped holding its GPUs: its last container's finish, else the deletion asked for, else the end of
    its attempt; None while it still holds them."""
    if p.finished is not None:
        return p.finished.at
    if p.delete_requested is not None:
        return p.delete_requested
    return attempt_end


def attempt_losses(triggers: Sequence[str], end_reasons: Sequence[str | None], ended: Sequence[bool],
                   final_status: Status | None, final_reason: str | None) -> list[str | None]:
    """Why all of each attempt's GPU-time not lost by its pods was lost, if it was: by how the attempt ended (the next
    attempt's trigger, its own end reason), else, for the last one, by how the run ended (``final_status`` None: it
    has not)."""
    out: list[str | None] = []
    n = len(triggers)
    for i in range(n):
        if i + 1 < n:
            nxt = triggers[i + 1]
            out.append(LOST_RAYJOB_RETRY if nxt == _RAYJOB_RETRY_TRIGGER else _eviction(end_reasons[i] or nxt))
        elif final_status is Status.FAILED:
            out.append(LOST_RUN_FAILED)
        elif ended[i] and final_status is not Status.SUCCEEDED and \
                not (final_status is Status.STOPPED and final_reason == _DELETED):
            out.append(_eviction(end_reasons[i]))  # evicted and not re-queued yet, or deactivated
        else:
            out.append(None)
    return out


def _eviction(reason: str | None) -> str:
    if reason == "Preempted":
        return LOST_PREEMPTED
    if reason == "PodsReadyTimeout":
        return LOST_PODS_READY_TIMEOUT
    return LOST_EVICTED


def loss_reads_last_created(p: PodFacts) -> bool:
    """Whether ``pod_loss`` depends on the latest creation time in the pod's attempt: the pod failed, or was deleted
    before it ended."""
    if p.finished is not None:
        return p.finished.phase == "Failed"
    return p.delete_requested is not None


def pod_loss(p: PodFacts, end: int, last_created: int) -> str | None:
    """A pod that ended abnormally and was replaced by a later pod of its attempt (one created after ``end``)."""
    if not loss_reads_last_created(p):
        return None  # it succeeded, or ended with its attempt
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
