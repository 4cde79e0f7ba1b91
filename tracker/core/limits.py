"""The reducer's bounds (``ReducerLimits``) and counters (``Stats``), apart so that the reducer's parts (retirement,
the snapshot codec) declare them as the reducer does: a compiled core (``deploy/compiled``) holds each attribute
with one type in a class and its subclasses."""

from __future__ import annotations

from dataclasses import dataclass, fields

from tracker.core.curves import METRIC_POINTS_PER_RUN
from tracker.core.gpu import ACCELERATOR_RESOURCES


@dataclass(frozen=True, slots=True)
class ReducerLimits:
    """Explicit bounds on the reducer's memory."""

    max_held: int = 100_000  # records waiting for their owner to be seen
    max_dead_letters: int = 10_000  # dead letters kept until the next flush
    max_retired: int = 1_000_000  # finished runs remembered (ids and owner uids) after their facts are freed
    # Retire finished runs by itself: a run whose history is final for good once the event-time watermark is this
    # many µs past its last change. None: the caller retires (``retire``), as the Kafka reducer does.
    retire_after_us: int | None = None
    # Extended resources counted as GPUs (``reduce.accelerator_resources``; a trailing ``*`` matches a prefix).
    # Every reducer of a deployment must count the same ones: a pod's GPUs are facts kept with its run.
    accelerator_resources: tuple[str, ...] = ACCELERATOR_RESOURCES
    # Metric points kept per run, downsampled over all its metrics (``facts.MetricPoints``); 0 keeps none.
    metric_points_per_run: int = METRIC_POINTS_PER_RUN
    # A finished run frees its derivation (``derive.Derivation``: its last history and pod side, about 13 KiB of a
    # narrow run's 23) at the flush that wrote its history when it has at most this many pods and metric points
    # together, a run that may still reopen included (stopped by a deactivation while its Job exists,
    # ``derive.may_reopen``). A late record of it (a pod deleted by the Job's TTL, an Event) first derives it again
    # from its facts (``Reducer._revive``), so its update still carries only what changed; this bound caps what that
    # derivation costs. A wider run keeps its derivation until it retires. None: every finished run frees it, however
    # wide (a replay without retirement, which keeps every run it reads: ``runtime.replay.reducer_limits``). A run whose
    # derivation is freed has its facts packed from the next flush on (``tracker.core.run_table``: ~9.5 -> ~0.7 KiB).
    finished_derivation_rows: int | None = 64


@dataclass(slots=True)
class Stats:
    records: int = 0
    bookmarks: int = 0
    watch_errors: int = 0
    ignored: int = 0
    dead_letters: int = 0
    held: int = 0
    released: int = 0
    dropped_uncorrelated: int = 0
    after_retirement: int = 0
    run_id_conflicts: int = 0  # records of a Job or RayJob whose run id another root, created earlier, has
    retired: int = 0  # runs retired by the reducer's own policy (``ReducerLimits.retire_after_us``)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
