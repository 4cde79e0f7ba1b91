"""The reducer's metrics for the embedded pipeline (``tracker serve`` without Kafka).

The Kafka reducer counts in its transaction loop (``tracker.runtime.reduce``); the embedded pipeline has no such
loop, so this counts the same families from each flush of the reducer: changes folded, phase entries added (as
``tracker.core.entries`` counts them), dead letters by reason, runs in memory by status, runs retired by status,
the oldest pending and stuck ages per queue (``tracker_oldest_pending_admission_seconds`` on ``alerts.clock``,
``tracker_oldest_stuck_seconds`` on ``alerts.metrics_clock``, as the Kafka reducer sets them), the ended pending
seconds by category (``tracker_pending_seconds_total``), the open pending spans' summed age
(``tracker_pending_open_seconds``), and what the reducer holds packed and derived (``tracker_reducer_packed_runs``,
``_packed_bytes``, ``_derivations``: of the reducer ``restored`` gave). It runs on the pipeline's thread;
prometheus_client's metrics are thread-safe. Gauges are refreshed at most every ``ops.metrics_interval_s``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from tracker.core import entries
from tracker.core import stuck as policy
from tracker.core.model import Phase, RunHistory, Status
from tracker.core.publish import ended_pending, pending_added
from tracker.core.reducer import Flushed, Reducer
from tracker.core.waits import PENDING_CATEGORIES
from tracker.runtime.ops import Metrics
from tracker.settings import Settings

PARTITION = "embedded"  # the partition label of tracker_changes_consumed_total in the embedded pipeline


class EmbeddedMetrics:
    def __init__(self, metrics: Metrics, settings: Settings, *, wall_us: Callable[[], int] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.m = metrics
        self.clock = settings.alerts.clock
        self.metrics_clock = settings.alerts.metrics_clock
        self.interval_s = settings.ops.metrics_interval_s
        self._wall_us = wall_us or (lambda: time.time_ns() // 1_000)
        self._monotonic = monotonic
        self._last_refresh: float | None = None
        self.status: dict[str, Status] = {}  # live run id -> status
        self.entries: dict[str, tuple[int, ...]] = {}  # live run id -> phase entries already counted, per phase
        self.stuck: dict[str, policy.Stuck] = {}  # live runs before their application started
        self._queues: set[str] = set()
        self._stuck_keys: set[tuple[str, str]] = set()
        self.pending: dict[str, dict[str, float]] = {}  # live run id -> ended pending seconds counted, by category
        self.reducer: Reducer | None = None  # the pipeline's (``restored``): its packed runs and derivations kept

    def restored(self, reducer: Reducer) -> None:
        """Start from the runs a restored reducer holds (their phase entries were counted by an earlier process)."""
        self.reducer = reducer
        for run_id in list(reducer.runs):
            h = reducer.current(run_id)
            if h is not None:
                self._seen(h)
                self.pending[run_id] = ended_pending(h)  # counted by an earlier process

    def flushed(self, out: Flushed, folded: int, watermark_us: int) -> None:
        """One flush of the reducer: ``folded`` records were folded since the previous one."""
        m = self.m
        if folded:
            m.changes_consumed.labels(PARTITION).inc(folded)
        counted: Counter[Phase] = Counter()
        for u in out.updates:
            if u.history is not None:
                before = self.entries.get(u.run_id, entries.NONE)
                counted.update(entries.added(before, self._seen(u.history)))
                now_pending = ended_pending(u.history)
                for category, seconds in pending_added(self.pending.get(u.run_id, {}), now_pending).items():
                    m.pending_seconds.labels(category).inc(seconds)
                self.pending[u.run_id] = now_pending
        for phase, n in counted.items():
            m.transitions.labels(phase.value).inc(n)
        for reason, n in Counter(dl.reason for dl in out.dead_letters).items():
            m.dead_letters.labels(reason).inc(n)
        for run_id in out.retired:
            status = self.status.pop(run_id, Status.SUCCEEDED)
            self.entries.pop(run_id, None)
            self.stuck.pop(run_id, None)
            self.pending.pop(run_id, None)
            m.runs_finished.labels(status.value).inc()
        now = self._monotonic()
        if self._last_refresh is None or now - self._last_refresh >= self.interval_s:
            self._last_refresh = now
            self.refresh(watermark_us)

    def refresh(self, watermark_us: int) -> None:
        """Set the gauges: runs by status, the oldest pending admission and the oldest stuck run per queue."""
        m = self.m
        statuses = Counter(s.value for s in self.status.values())
        for status in Status:
            m.runs.labels(status.value).set(statuses.get(status.value, 0))
        if self.reducer is not None:  # on the pipeline's thread, as the reducer
            packed, packed_bytes = self.reducer.runs.packed_size()
            m.packed_runs.set(packed)
            m.packed_bytes.set(packed_bytes)
            m.derivations.set(len(self.reducer.derivations))
        wall = self._wall_us()
        clock = wall if self.clock == "wall" else watermark_us
        oldest: dict[str, float] = {}
        for w in self.stuck.values():
            if w.phase == Phase.ADMISSION and w.queued_at_us is not None:
                oldest[w.queue] = max(oldest.get(w.queue, 0.0), max(0, clock - w.queued_at_us) / 1e6)
        for queue in self._queues - oldest.keys():
            m.oldest_pending.remove(queue)
        for queue, age in oldest.items():
            m.oldest_pending.labels(queue).set(age)
        self._queues = set(oldest)
        gauge_clock = wall if self.metrics_clock == "wall" else watermark_us
        stuck = {(phase.value, queue): age for (phase, queue), age in policy.oldest(self.stuck.values(),
                                                                                     gauge_clock).items()}
        for key in self._stuck_keys - stuck.keys():
            m.oldest_stuck.remove(*key)
        for key, age in stuck.items():
            m.oldest_stuck.labels(*key).set(age)
        self._stuck_keys = set(stuck)
        pending_open = policy.pending_open(self.stuck.values(), gauge_clock)
        for category in PENDING_CATEGORIES:  # every category, 0 without an open span
            m.pending_open.labels(category).set(pending_open.get(category, 0.0))

    def _seen(self, h: RunHistory) -> tuple[int, ...]:
        """Remember the run's status, phase entries and stuck state; its phase entries per phase."""
        run_id = h.run.run_id
        self.status[run_id] = h.run.status
        now = self.entries[run_id] = entries.phase_entries(h)
        candidate = policy.stuck_candidate(h)
        if candidate is None:
            self.stuck.pop(run_id, None)
        else:
            self.stuck[run_id] = candidate
        return now
