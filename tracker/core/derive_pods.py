"""The pod side of a run's derivation (step 2's pod assignment, and what steps 4 and 5 and the GPU accounting read of
pods), kept between changes so that a change of one pod costs the same in a run of 8 pods as in one of 4,096.

``PodSide`` holds, for one run:

- each pod's *entry*: the attempt it ran in, its row (``PodPlacement``, with its GPU accounting) and its
  *contribution*, the values its attempt's sums hold for it;
- per attempt, ``AttemptPods``: ordered multisets and sums over its pods: the bind times of the pods that count for
  Runtime, the started pods, the creation times (the latest one tells which failed pods the Job replaced), the pod
  failures, the pods unschedulable and the containers waiting (why a run waits), and the GPU sums (GPU-µs held and
  lost, by reason, still open) with the GPUs held at once over time (``PeakSet``).

A pod's row and contribution depend on the pod's facts, on its attempt's *context* (where attempts begin, which
RayCluster each ran, when each ended and why its GPU-time was lost: ``Layout``) and, for a pod that ended abnormally,
on the latest creation time in its attempt. ``PodSide.update`` recomputes the pods that changed, and the abnormally
ended pods whose replacement status the latest creation time flipped; a change of the layout (an admission, an
eviction, a retry, the run ending: a few times in a run's life) rebuilds every entry. Either way the result is a
function of the facts alone: ``tests/core/test_incremental.py`` checks that a side updated change by change equals one
built at once, on generated lifecycles.

Pure, like the rest of the derivation; the definitions of the GPU figures are ``tracker.core.gpu``'s.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, NamedTuple

from tracker.core import gpu
from tracker.core.facts import PodFacts, RunFacts, Unschedulable
from tracker.core.model import PodFailure, PodPlacement, pod_order, utc

_BEFORE_ALL = -(1 << 62)  # the bound of an attempt that has neither begun Scheduling nor Admission

# Shared empty containers, never changed: a live run's attempts and pod side hold a dozen containers, most of them
# empty for good (no failure, no unschedulable pod, no lost GPU-time); each starts as one of these, and the first
# insertion gives it a container of its own (``_inserted``, ``_with``). About 0.8 KiB a running run (bench/README.md).
_NO_ITEMS: list[Any] = []
_NO_LOSSES: dict[str, list[int]] = {}
_NO_UIDS: set[str] = set()


def _inserted(items: list[Any], item: Any) -> list[Any]:
    """``items`` (sorted) with ``item`` inserted in order: the same list, or a list of its own for ``_NO_ITEMS``."""
    if items is _NO_ITEMS:
        return [item]
    insort(items, item)
    return items


def _remove_one(items: list[Any], item: Any) -> None:
    """Removes one occurrence of ``item`` from ``items`` (sorted); KeyError when it holds none."""
    i = bisect_left(items, item)
    if i == len(items) or items[i] != item:
        raise KeyError(item)
    del items[i]


def _with(uids: set[str], uid: str) -> set[str]:
    """``uids`` with ``uid`` added: the same set, or a set of its own for ``_NO_UIDS``."""
    if uids is _NO_UIDS:
        return {uid}
    uids.add(uid)
    return uids


class PeakSet:
    """Events (time, +GPUs at a bind or -GPUs at a release) in time order, releases first at equal times, with the
    largest running sum: the most GPUs held at once. Up to ``FLAT`` events are one sorted list (``flat``), read whole;
    from then on they are kept in blocks with each block's sum and largest prefix sum, so that adding or removing an
    event costs one block and a pass over the blocks, not a pass over every event."""

    BLOCK = 128  # events per block, about; a block is split at twice as many
    FLAT = 32  # events kept as one plain list (most attempts: a bind and a release a pod; six block lists: ~1 KiB)

    __slots__ = ("blocks", "deltas", "flat", "lasts", "peaks", "sums", "wsums")

    def __init__(self) -> None:
        # the events while there are at most FLAT (the shared ``_NO_ITEMS`` while none), None once in blocks
        self.flat: list[tuple[int, int]] | None = _NO_ITEMS
        # the blocks: each list is the PeakSet's own from the FLAT + 1-th event on (shared empty lists until then)
        self.blocks: list[list[tuple[int, int]]] = _NO_ITEMS
        self.deltas: list[list[int]] = _NO_ITEMS  # each block's GPU deltas, in its order (summed in C by accumulate)
        self.lasts: list[tuple[int, int]] = _NO_ITEMS  # each block's last event
        self.sums: list[int] = _NO_ITEMS
        self.peaks: list[int] = _NO_ITEMS  # each block's largest prefix sum (0 when every prefix is negative)
        self.wsums: list[int] = _NO_ITEMS  # each block's sum of GPUs x time (the ledger's ``area``)

    def add(self, event: tuple[int, int]) -> None:
        flat = self.flat
        if flat is not None:
            flat = _inserted(flat, event)
            if len(flat) <= self.FLAT:
                self.flat = flat
            else:  # one block of FLAT + 1 events, from now on in blocks (a shrinking set stays in them)
                self.flat = None
                self.blocks, self.deltas, self.lasts = [flat], [[d for _t, d in flat]], [flat[-1]]
                self.sums, self.peaks, self.wsums = [0], [0], [0]
                self._sum(0)
            return
        if not self.blocks:
            self.blocks.append([event])
            self.deltas.append([event[1]])
            self.lasts.append(event)
            self.sums.append(event[1])
            self.peaks.append(max(0, event[1]))
            self.wsums.append(event[0] * event[1])
            return
        i = min(bisect_left(self.lasts, event), len(self.blocks) - 1)
        block = self.blocks[i]
        j = bisect_left(block, event)
        block.insert(j, event)
        self.deltas[i].insert(j, event[1])
        if len(block) > 2 * self.BLOCK:
            deltas, half = self.deltas[i], self.BLOCK
            self.blocks[i:i + 1] = [block[:half], block[half:]]
            self.deltas[i:i + 1] = [deltas[:half], deltas[half:]]
            self.lasts[i:i + 1] = [block[half - 1], block[-1]]
            self.sums[i:i + 1] = [0, 0]
            self.peaks[i:i + 1] = [0, 0]
            self.wsums[i:i + 1] = [0, 0]
            self._sum(i + 1)
        else:
            self.lasts[i] = block[-1]
        self._sum(i)

    def remove(self, event: tuple[int, int]) -> None:
        if self.flat is not None:
            _remove_one(self.flat, event)
            return
        i = bisect_left(self.lasts, event)
        block = self.blocks[i]
        j = bisect_left(block, event)
        if block[j] != event:
            raise KeyError(event)
        del block[j]
        del self.deltas[i][j]
        if not block:
            del self.blocks[i], self.deltas[i], self.lasts[i], self.sums[i], self.peaks[i], self.wsums[i]
            return
        self.lasts[i] = block[-1]
        self._sum(i)

    def _sum(self, i: int) -> None:
        prefix = list(accumulate(self.deltas[i]))
        self.sums[i] = prefix[-1]
        self.peaks[i] = max(0, max(prefix))
        self.wsums[i] = sum(t * d for t, d in self.blocks[i])

    def span(self) -> tuple[int, int] | None:
        """The first and the last event's times (None without events)."""
        events = self.flat
        if events is not None:
            return (events[0][0], events[-1][0]) if events else None
        return (self.blocks[0][0][0], self.blocks[-1][-1][0]) if self.blocks else None

    def areas(self) -> Callable[[int], int]:
        """A function of x: the GPU-µs held up to x (every event at or before x, each ``GPUs x (x - time)``), in
        the number of blocks and one block's events, not the number of events: the goodput ledger's integral."""
        if self.flat is not None:  # no whole block before x: the pass over the one list below
            cum_s = cum_w = [0]
            lasts: list[tuple[int, int]] = _NO_ITEMS
            blocks = [self.flat]
        else:
            cum_s = list(accumulate(self.sums, initial=0))
            cum_w = list(accumulate(self.wsums, initial=0))
            lasts, blocks = self.lasts, self.blocks

        def area(x: int) -> int:
            j = bisect_right(lasts, (x, 1 << 62))  # blocks 0..j-1 end at or before x
            total = cum_s[j] * x - cum_w[j]
            if j < len(blocks):
                for t, d in blocks[j]:
                    if t > x:
                        break
                    total += d * (x - t)
            return total

        return area

    def peak(self) -> int:
        if self.flat is not None:  # the largest prefix sum, as ``_sum`` reads a block's (0 when none is positive)
            return max(accumulate((d for _t, d in self.flat), initial=0))
        cur = best = 0
        for total, top in zip(self.sums, self.peaks, strict=True):
            if cur + top > best:
                best = cur + top
            cur += total
        return best


class _Multiset:
    """A sorted list used as a multiset: add, remove one occurrence, smallest, largest."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[Any] = _NO_ITEMS

    def add(self, item: Any) -> None:
        self.items = _inserted(self.items, item)

    def remove(self, item: Any) -> None:
        _remove_one(self.items, item)


# A pod failure as it is ordered in an attempt's list: (at, pod name, reason, exit code, message, uid)
FailureKey = tuple[int, str, str, int, str, str]


class Contribution(NamedTuple):
    """What one pod adds to its attempt's sums (``AttemptPods``); removed again, exactly, when the pod changes."""

    created: int  # creation time (0 when unknown)
    sched: int | None  # bind time, when the pod counts for Runtime (a RayJob's own pods, the submitter, do not)
    started: bool  # a container started
    failure: FailureKey | None  # the pod failed (not killed from outside)
    unschedulable: Unschedulable | None  # PodScheduled=False, not scheduled since
    waiting: str | None  # a container's waiting reason
    held: int  # GPU-µs held by the pod, once it released its GPUs
    lost: int  # of them, lost
    lost_reason: str | None
    open_gpus: int  # GPUs it still holds (then ``held`` is 0)
    open_weight: int  # open_gpus x bind time
    events: tuple[tuple[int, int], ...]  # its PeakSet events
    abnormal_end: int | None  # the release time of a pod whose loss depends on the latest creation time
    start_at: int | None = None  # when its first container started, when the pod counts for Runtime
    unsched_at: int | None = None  # when it was last found unschedulable (PodScheduled=False), scheduled since or not


@dataclass(slots=True)
class Entry:
    attempt: int  # index into the attempts (0-based)
    contribution: Contribution
    row: PodPlacement
    failure_row: PodFailure | None


class AttemptPods:
    """The sums and ordered sets of one attempt's pods."""

    __slots__ = ("abnormal", "by", "count", "created", "failures", "held", "lost", "open_gpus", "open_weight",
                 "peak", "sched", "started", "starts", "unsched_at", "unschedulable", "waiting")

    def __init__(self) -> None:
        self.count = 0
        self.sched: list[int] = _NO_ITEMS  # sorted bind times of the pods that count for Runtime
        self.started = 0
        self.starts: list[int] = _NO_ITEMS  # sorted container start times of the pods that count for Runtime
        self.unsched_at: list[int] = _NO_ITEMS  # sorted times pods were found unschedulable
        self.created: list[int] = _NO_ITEMS  # sorted creation times
        self.failures: list[FailureKey] = _NO_ITEMS  # sorted
        self.unschedulable = _Multiset()
        self.waiting = _Multiset()
        self.held = 0
        self.lost = 0
        self.by: dict[str, list[int]] = _NO_LOSSES  # lost reason -> [GPU-µs, pods]: one with pods listed (even at 0)
        self.open_gpus = 0
        self.open_weight = 0
        self.peak = PeakSet()
        # sorted (release time, uid) of pods whose loss reads last_created
        self.abnormal: list[tuple[int, str]] = _NO_ITEMS

    def last_created(self) -> int:
        return self.created[-1] if self.created else 0

    def retries(self) -> int:
        """The failures the Job replaced: a pod of the attempt was created after the failure."""
        return bisect_left(self.failures, self.last_created(), key=lambda f: f[0])

    def add_created(self, created: int) -> None:
        self.created = _inserted(self.created, created)

    def remove_created(self, created: int) -> None:
        i = bisect_left(self.created, created)
        del self.created[i]

    def add(self, uid: str, c: Contribution) -> None:
        """Add a pod's contribution (its creation time is added apart: ``add_created``)."""
        self.count += 1
        if c.sched is not None:
            self.sched = _inserted(self.sched, c.sched)
        self.started += c.started
        if c.start_at is not None:
            self.starts = _inserted(self.starts, c.start_at)
        if c.unsched_at is not None:
            self.unsched_at = _inserted(self.unsched_at, c.unsched_at)
        if c.failure is not None:
            self.failures = _inserted(self.failures, c.failure)
        if c.unschedulable is not None:
            self.unschedulable.add(c.unschedulable)
        if c.waiting is not None:
            self.waiting.add(c.waiting)
        self._gpu(uid, c, 1)

    def remove(self, uid: str, c: Contribution) -> None:
        self.count -= 1
        if c.sched is not None:
            del self.sched[bisect_left(self.sched, c.sched)]
        self.started -= c.started
        if c.start_at is not None:
            del self.starts[bisect_left(self.starts, c.start_at)]
        if c.unsched_at is not None:
            del self.unsched_at[bisect_left(self.unsched_at, c.unsched_at)]
        if c.failure is not None:
            del self.failures[bisect_left(self.failures, c.failure)]
        if c.unschedulable is not None:
            self.unschedulable.remove(c.unschedulable)
        if c.waiting is not None:
            self.waiting.remove(c.waiting)
        self._gpu(uid, c, -1)

    def _gpu(self, uid: str, c: Contribution, sign: int) -> None:
        self.held += sign * c.held
        self.lost += sign * c.lost
        if c.lost_reason is not None:
            if self.by is _NO_LOSSES:
                self.by = {}
            by = self.by.setdefault(c.lost_reason, [0, 0])
            by[0] += sign * c.lost
            by[1] += sign
            if not by[1]:
                del self.by[c.lost_reason]
        self.open_gpus += sign * c.open_gpus
        self.open_weight += sign * c.open_weight
        for ev in c.events:
            if sign > 0:
                self.peak.add(ev)
            else:
                self.peak.remove(ev)
        if c.abnormal_end is not None:
            key = (c.abnormal_end, uid)
            if sign > 0:
                self.abnormal = _inserted(self.abnormal, key)
            else:
                del self.abnormal[bisect_left(self.abnormal, key)]


class AttemptContext(NamedTuple):
    """What the pods of one attempt read of it."""

    bound: int  # a pod created at or after this time (and before the next attempt's) ran in it
    ray_cluster: str | None  # the pods of this RayCluster ran in it
    end: int | None  # when it ended (a pod still running then released its GPUs then)
    loss: str | None  # why all of its GPU-time not lost otherwise was lost (gpu.attempt_losses)


class Layout(NamedTuple):
    """The attempts as the pods see them; a change of it rebuilds every entry."""

    ray: bool  # a RayJob: only its RayClusters' pods count for Runtime
    namespace: str | None  # the run's, which its pod rows carry
    attempts: tuple[AttemptContext, ...]


class PodSide:
    """The pod side of one run's derivation (module docstring)."""

    __slots__ = ("attempts", "changed", "cluster_attempt", "entries", "facts", "full", "layout", "removed")

    def __init__(self) -> None:
        self.facts: RunFacts | None = None  # the facts it was built from (a run whose facts were replaced rebuilds)
        self.layout: Layout | None = None
        self.entries: dict[str, Entry] = {}
        self.attempts: list[AttemptPods] = []
        self.cluster_attempt: dict[str, int] = {}
        # since the last ``take``: the uids whose row changed, the uids no longer the run's, whether every row is new
        self.changed: set[str] = _NO_UIDS
        self.removed: set[str] = _NO_UIDS
        self.full = True

    # ---------------------------------------------------------------- updates
    def update(self, r: RunFacts, layout: Layout, changed: Iterable[str] | None) -> None:
        """Bring the side up to date with ``r``: ``changed`` are the pods whose facts may have changed since the last
        update (None: any)."""
        if self.facts is not r or self.layout != layout or changed is None:
            self._rebuild(r, layout)
            return
        todo = sorted(uid for uid in set(changed) if uid in r.pods or uid in self.entries)
        if not todo or not self.attempts:
            return
        before = [a.last_created() for a in self.attempts]
        old: dict[str, Entry] = {}
        for uid in todo:  # take the changed pods out of their attempts' sums
            e = self.entries.pop(uid, None)
            if e is not None:
                old[uid] = e
                a = self.attempts[e.attempt]
                a.remove(uid, e.contribution)
                a.remove_created(e.contribution.created)
        placed: dict[str, int] = {}
        for uid in todo:  # their attempts now, and so each attempt's latest creation time
            p = r.pods.get(uid)
            if p is None:
                self.removed = _with(self.removed, uid)
                continue
            i = placed[uid] = self._attempt_of(p, layout)
            self.attempts[i].add_created(p.created or 0)
        for i, was in enumerate(before):
            self._flip(r, i, was)
        for uid, i in placed.items():
            self._enter(r, uid, i, old.get(uid))

    def _rebuild(self, r: RunFacts, layout: Layout) -> None:
        old = self.entries if self.facts is r else {}
        gone = set(self.entries)
        self.facts, self.layout = r, layout
        self.entries = {}
        self.attempts = [AttemptPods() for _ in layout.attempts]
        self.cluster_attempt = {a.ray_cluster: i for i, a in enumerate(layout.attempts) if a.ray_cluster}
        if self.attempts:  # a run without attempts (no root, no Workload yet) places no pod
            placed = {uid: self._attempt_of(p, layout) for uid, p in r.pods.items()}
            for uid, i in placed.items():
                self.attempts[i].add_created(r.pods[uid].created or 0)
            for uid, i in placed.items():
                self._enter(r, uid, i, old.get(uid))
        gone -= self.entries.keys()
        if gone:
            self.removed = self.removed | gone
        if self.changed and self.removed:
            self.changed = self.changed - self.removed

    def _attempt_of(self, p: PodFacts, layout: Layout) -> int:
        """A RayCluster's pods ran in the attempt that ran that RayCluster; any other pod in the last attempt that
        began (Scheduling, else Admission) no later than the pod was created."""
        if p.ray_cluster:
            i = self.cluster_attempt.get(p.ray_cluster)
            if i is not None:
                return i
        c = p.created if p.created is not None else 0
        idx = 0
        for j, a in enumerate(layout.attempts):
            if a.bound <= c:
                idx = j
        return idx

    def _flip(self, r: RunFacts, i: int, was: int) -> None:
        """The latest creation time of attempt ``i`` moved from ``was``: the abnormally ended pods released in between
        now were (or no longer were) replaced by the Job, which changes their loss reason; their entries are made
        again. (A pod was replaced when a pod of its attempt was created after its release: gpu.pod_loss.)"""
        a = self.attempts[i]
        now = a.last_created()
        if was == now or not a.abnormal:
            return
        lo, hi = min(was, now), max(was, now)
        for _end, uid in a.abnormal[bisect_left(a.abnormal, (lo, "")):bisect_left(a.abnormal, (hi, ""))]:
            e = self.entries.pop(uid)
            a.remove(uid, e.contribution)
            self._enter(r, uid, i, e)

    def _enter(self, r: RunFacts, uid: str, i: int, old: Entry | None) -> None:
        """Make the entry of pod ``uid`` in attempt ``i`` (whose creation time the attempt holds already)."""
        layout = self.layout
        assert layout is not None
        a = self.attempts[i]
        c, row, failure_row = _pod(r.run_id, layout.namespace, uid, r.pods[uid], i + 1, layout.attempts[i],
                                   a.last_created(), layout.ray)
        a.add(uid, c)
        self.entries[uid] = Entry(i, c, row, failure_row)
        if uid in self.removed:  # then not _NO_UIDS
            self.removed.discard(uid)
        if old is None or old.row != row:
            self.changed = _with(self.changed, uid)

    # ---------------------------------------------------------------- output
    def take(self) -> tuple[tuple[PodPlacement, ...], tuple[str, ...], bool]:
        """The rows changed since the last take (every row, when ``full``), the uids removed, and ``full``."""
        full = self.full
        uids = self.entries if full else sorted(self.changed)
        rows = tuple(self.entries[u].row for u in sorted(uids) if u in self.entries)
        removed = tuple(sorted(u for u in self.removed if u not in self.entries))
        self.changed, self.removed, self.full = _NO_UIDS, _NO_UIDS, False
        return rows, removed, full

    def rows(self) -> list[PodPlacement]:
        """Every pod row, in the order of a complete history (``model.pod_order``)."""
        return sorted((e.row for e in self.entries.values()), key=pod_order)

    def failures(self, i: int, limit: int) -> list[PodFailure]:
        a = self.attempts[i]
        out = []
        for key in a.failures[:limit]:
            row = self.entries[key[5]].failure_row
            assert row is not None
            out.append(row)
        return out


def _pod(run_id: str, namespace: str | None, uid: str, p: PodFacts, attempt: int, ctx: AttemptContext,
         last_created: int, ray: bool) -> tuple[Contribution, PodPlacement, PodFailure | None]:
    """A pod's contribution to its attempt, its row and its failure row (gpu.py holds the definitions)."""
    created = p.created if p.created is not None else 0
    sched = p.scheduled if (not ray or p.ray_cluster) else None
    end = p.finished
    failure = failure_row = None
    if end is not None and end.phase == "Failed" and not (
            p.disrupted or (p.delete_requested is not None and p.delete_requested <= end.at)):
        failure = (end.at, p.name, end.reason, end.exit_code, end.message, uid)
        failure_row = PodFailure(pod=p.name, at=utc(end.at), reason=end.reason,
                                 exit_code=None if end.exit_code < 0 else end.exit_code, message=end.message)
    unsched = p.unschedulable if p.unschedulable and p.scheduled is None else None
    held = lost = open_gpus = open_weight = 0
    lost_reason = None
    events: tuple[tuple[int, int], ...] = ()
    abnormal_end = None
    g = p.gpus
    bind = gpu.bind_time(p)
    released_at = None
    gpu_hours: float | None = 0.0
    if g and bind is not None:
        release = gpu.release_time(p, ctx.end)
        if release is None:
            open_gpus, open_weight, gpu_hours = g, g * bind, None
            events = ((bind, g),)
        else:
            release = max(release, bind)
            held = g * (release - bind)
            events = ((bind, g), (release, -g))
            if gpu.loss_reads_last_created(p):
                abnormal_end = release
            lost_reason = gpu.pod_loss(p, release, last_created) or ctx.loss
            if lost_reason is not None:
                lost = held
            released_at, gpu_hours = utc(release), held / gpu.US_PER_HOUR
    row = PodPlacement(run_id=run_id, namespace=namespace, attempt=attempt, uid=uid, pod=p.name, node=p.node,
                       created_at=utc(p.created), scheduled_at=utc(p.scheduled),
                       finished_at=utc(end.at) if end else None, gpus=g, released_at=released_at,
                       gpu_hours=gpu_hours, lost=lost_reason)
    counts = not ray or bool(p.ray_cluster)  # a RayJob's own pods (the submitter) do not count for Runtime
    return Contribution(created, sched, p.started is not None, failure, unsched, p.waiting_reason or None, held, lost,
                        lost_reason, open_gpus, open_weight, events, abnormal_end,
                        p.started if counts else None,
                        p.unschedulable.at if p.unschedulable is not None else None), row, failure_row
