"""The reducer's own retirement: when a run's history is final for good, its facts are freed.

A run is retired (``Retirement.retire``: its facts freed, its id and owner bindings remembered, bounded by
``max_retired``, so late records of it are recognised and ignored) either by the caller or, with
``ReducerLimits.retire_after_us`` set, by the reducer itself, by event time:

- the *watermark* is the earliest of the latest creationTimestamp (the API server's clock, not a controller's or an
  application's) seen in each watch stream (roots, Workloads, Pods, Events: ``marks``, one per stream) that has been
  seen, so a stream that lags behind the others holds retirement back instead of losing its records;
- each live run has a *quiet* time, the watermark when it last changed, and a due time ``quiet + grace`` on a heap
  (an entry is stale unless it matches the run's quiet time: a run that changed again was pushed again);
- after each record (not at flushes, whose timing varies, so the same records retire the same runs at the same
  points however they are split into calls) the runs due are derived; a final one that cannot reopen is retired,
  a live one waits for a record to touch it again, its derivation freed meanwhile (derived again from its facts
  when a record touches it).

``Retirement`` is a part of ``tracker.core.reducer.Reducer`` (a mixin: it shares the reducer's state, declared
below, which ``Reducer.__init__`` sets). Pure, as the reducer is.
"""

from __future__ import annotations

import heapq
from typing import Any

from tracker.core.correlate import Correlator, lost_key
from tracker.core.derive import Derivation, may_reopen
from tracker.core.limits import ReducerLimits, Stats
from tracker.core.model import FINAL_STATUSES, DeadLetter, HistoryUpdate, RunHistory
from tracker.core.nodes import NodeBook
from tracker.core.queues import QueueBook
from tracker.core.run_table import RunTable
from tracker.core.timefmt import BadTimestamp, ts

_STREAMS = {"Job": 0, "RayJob": 0, "Workload": 1, "Pod": 2, "Event": 3}  # the watch streams of the watermark
STREAM_COUNT = max(_STREAMS.values()) + 1  # the length of ``marks``


class Retirement:
    """The retirement part of the reducer (module docstring); the attributes are the reducer's."""

    limits: ReducerLimits
    stats: Stats
    runs: RunTable
    corr: Correlator
    retired: dict[str, int]  # run id -> retirement ordinal; insertion-ordered: oldest first
    retirements: int  # the ordinal of the latest retirement
    dirty: set[str]
    dead: list[DeadLetter]
    marks: list[int]  # the latest creation time (µs) seen per watch stream (``_STREAMS``)
    quiet: dict[str, int]  # live run -> the watermark when it last changed
    _due_heap: list[tuple[int, str]]  # (quiet + grace, run id); stale unless it matches ``quiet``
    _touched: list[str]
    _retired_updates: dict[str, HistoryUpdate]
    derivations: dict[str, Derivation]
    _freed_final: dict[str, bool]
    _pack_next: set[str]
    _pods_changed: dict[str, set[str]]
    _state_pods: dict[str, set[str]]
    _state_removed: dict[str, set[str]]
    _state_points: dict[str, tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]]
    _retiring_points: dict[str, tuple[tuple[str, int], ...]]
    _points_inside: set[str]
    _state_minutes: dict[str, tuple[int, ...]]
    _retiring_minutes: dict[str, tuple[int, ...]]
    _retired_now: list[str]
    _forgotten_now: list[str]
    _forgotten_seq: dict[str, int]
    queues: QueueBook
    nodes: NodeBook

    def _update(self, run_id: str) -> RunHistory:
        raise NotImplementedError  # the reducer's

    def _retire_due(self, record: Any) -> None:
        """After each record: advance the watermark, give the runs it touched a new due time, and retire the runs
        that are due and final for good. Decided per record (not at flushes, whose timing varies), so that the
        same records retire the same runs at the same points however they are split into calls."""
        grace = self.limits.retire_after_us
        assert grace is not None
        before = self.watermark
        stream, created = _created(record)
        if created is not None and created > self.marks[stream]:
            self.marks[stream] = created
        now = self.watermark
        if now == 0:
            self._touched = []  # scheduled once the watermark is known
            return
        if before == 0:  # known from now on: every run is looked at a grace from now
            for run_id in sorted(self.runs):
                self._schedule(run_id, now)
        if self._touched:
            for run_id in dict.fromkeys(self._touched):
                if run_id in self.runs:
                    self._schedule(run_id, now)
            self._touched = []
        heap = self._due_heap
        while heap and heap[0][0] <= now:
            due, run_id = heapq.heappop(heap)
            quiet = self.quiet.get(run_id)
            if quiet is None or quiet + grace != due:
                continue  # stale: the run changed since, or was retired
            # a run whose derivation a flush freed, untouched since, was found final (for good or not) then
            final = None if run_id in self.dirty else self._freed_final.get(run_id)
            if final is None:
                r, h = self.runs[run_id], self._update(run_id)
                final = h.run.status in FINAL_STATUSES and not may_reopen(r, h.run)
            if final:
                if run_id in self.dirty:  # its final history still goes out at the next flush
                    self._retired_updates[run_id] = self.derivations[run_id].take()
                self.retire(run_id)
                self._retired_now.append(run_id)
                self.stats.retired += 1
            else:
                # quiet but live: nothing changes its history (a function of its facts) until a record touches it,
                # which schedules it again. Its derivation (its last history and pod side, about two thirds of what
                # a live run holds) is freed meanwhile: the record that touches it first derives it again from the
                # facts (``Reducer._revive``; one never taken, as a restored run's, is derived after, and its update
                # is ``full``). Runs that never end in a capture, and runs stopped by a deactivation while their Job
                # exists, no longer keep one each (bench/README.md).
                del self.quiet[run_id]
                if run_id not in self.dirty:
                    d = self.derivations.pop(run_id, None)
                    if d is not None and d.taken:
                        self._freed_final[run_id] = False
                        self._pack_next.add(run_id)

    @property
    def watermark(self) -> int:
        """The event-time watermark (µs): the earliest of the latest creation times of the streams seen; 0 while
        none has been."""
        return min((m for m in self.marks if m), default=0)

    def _schedule(self, run_id: str, quiet: int) -> None:
        grace = self.limits.retire_after_us
        assert grace is not None
        if self.quiet.get(run_id) != quiet:
            self.quiet[run_id] = quiet
            heapq.heappush(self._due_heap, (quiet + grace, run_id))
            if len(self._due_heap) > 2 * len(self.quiet) + 1024:  # drop stale entries now and then
                self._due_heap = [(q + grace, k) for k, q in self.quiet.items()]
                heapq.heapify(self._due_heap)

    def retire(self, run_id: str) -> None:
        """Free a finished run's facts once its history is written. Its id and owner bindings are remembered
        (bounded by ``max_retired``) so that late records (TTL deletions, expiring Events) are recognised and
        ignored instead of starting a partial history that would overwrite the real one."""
        r = self.runs.pop(run_id)
        self.queues.forget_run(run_id)
        self.dirty.discard(run_id)
        self.quiet.pop(run_id, None)
        self.derivations.pop(run_id, None)
        self._freed_final.pop(run_id, None)
        self._pods_changed.pop(run_id, None)
        self._state_pods.pop(run_id, None)
        if r is not None and r.pods:  # its pods' state goes with it
            self._state_removed.setdefault(run_id, set()).update(r.pods)
        self._points_inside.discard(run_id)
        if r is not None and r.points.size:  # and its points' (at the next flush: ``snapshot_run``)
            self._retiring_points[run_id] = tuple((k, pt[0]) for k, c in r.points.curves.items() for pt in c.values())
        minutes = r.minutes() if r is not None else None
        if minutes:  # and its progress minutes'
            self._retiring_minutes[run_id] = tuple(sorted(minutes))
        self.retirements += 1
        self.retired.pop(run_id, None)
        self.retired[run_id] = self.retirements
        while len(self.retired) > self.limits.max_retired:
            oldest = next(iter(self.retired))
            self._forgotten_seq[oldest] = self.retired.pop(oldest)
            self._forgotten_now.append(oldest)
            self.corr.forget_run(oldest)
            self.corr.forget_run(lost_key(oldest))


def _created(record: Any) -> tuple[int, int | None]:
    """The watch stream of a watch event's object and its creationTimestamp (µs), when it has a valid one."""
    obj = record.get("object") if isinstance(record, dict) else None
    if not isinstance(obj, dict):
        return 0, None
    kind = obj.get("kind")
    stream = _STREAMS.get(kind) if kind.__class__ is str else None
    meta = obj.get("metadata")
    value = meta.get("creationTimestamp") if isinstance(meta, dict) else None
    if stream is None or value.__class__ is not str:
        return 0, None
    try:
        return stream, ts(value)
    except BadTimestamp:
        return 0, None
