"""Google's goodput figures for a neutral timeline: an offline reference for the tracker's goodput ledger.

``google_figures(tl)`` writes a :class:`RefTimeline` as the log entries Google's ``ml-goodput-measurement`` (0.2.3)
reads, into an in-memory logger (no Cloud Logging client, no GCS, no network; the calculator's local cache in a
temporary directory of its own), and returns what ``GoodputCalculator.get_job_goodput(include_badput_breakdown=True)``
says. ``random_timeline(rng)`` makes varied, realistic timelines to feed both this and the ledger.

The entries written, all in time order (``_entries``):

* ``GoodputRecorder.record_job_start_time(bind)`` for every attempt (``{job_start_time}``);
* ``GoodputRecorder.record_step_start_time(step, t)`` for every recorded step (``{step_count, step_start_time}``);
* a checkpoint save as Orbax's checkpoint logger writes it (the package's own tests: ``MockSaveStepStatistics`` in
  ``tests/goodput_test.py``): ``event_type: "save"``, ``step``, ``directory``,
  ``checkpoint_manager_blocking_duration_secs = end - start`` (and ``checkpointer_blocking_duration_secs``,
  ``wait_for_prev_duration_secs``, ``get_old_steps_duration_secs``, which the calculator requires), at the save's end;
* a restore likewise (``MockRestoreStepStatistics``): ``event_type: "restore"``,
  ``checkpoint_manager_duration_secs = end - start``, at the restore's end;
* ``GoodputRecorder.record_job_end_time(end)`` (``{job_end_time}``).

``RefAttempt.interrupted_at`` and ``RefAttempt.release`` have no entry: Google never learns when an attempt was
evicted or when its GPUs were freed.

How Google defines each figure (file and function names are the installed package's, under
``ml_goodput_measurement/src/``; "the main loop" is the loop over the cached entries in
``goodput.py: GoodputCalculator._get_current_productive_and_unproductive_time``):

Total job time (``goodput.py: GoodputCalculator._get_total_job_time``)
    The FIRST ``job_start_time`` ever recorded to the LAST ``job_end_time`` recorded (kept by
    ``goodput_cache.py: GoodputCache._update_times_from_new_entries``). Without a job end it is the first job start
    to the query time, ``datetime.now()`` read in ``get_job_goodput``: that is Google's only dependence on the wall
    clock. Every RefTimeline has an end, so the figures do not depend on when they are computed;
    ``google_figures`` checks ``total_s == end - first bind`` on every call.

Segments and disruptions (the main loop)
    Step start times are kept in a dict ``step -> start``, in recording order. A step number recorded a second
    time is a disruption (``_number_of_interruptions += 1``): the segment gathered so far is closed with
    ``curr_step`` = the re-recorded step number, and a new segment starts with ``{curr_step: its new start}``. The
    job's last segment is closed at the end of the loop with ``curr_step`` = its highest step.

Productive time (``_compute_adjusted_segment_productive_and_unproductive_time``, ``_compute_segment_final_metrics``)
    In a segment, for each pair of consecutively recorded steps ``(p, tp) -> (c, tc)``: if ``c <= curr_step`` and
    ``c == p + 1`` the delta ``tc - tp`` (less any custom badput event inside it; we record none) is productive;
    if ``c <= curr_step`` but ``c != p + 1`` the delta is dropped (it lands in OTHER). So the interval of step
    ``s`` is productive when step ``s + 1`` was reached in the same segment and ``s + 1 <= curr_step``. The
    delta of the segment's lowest step (``first_step_time``, its first step interval) is productive only up to the
    mean of the segment's other productive deltas; the excess is PROGRAM_STARTUP (below). A segment with a single
    productive delta has no startup excess. A segment closed by a re-recorded step 0 (``curr_step == 0``, a restart
    from scratch) yields nothing at all: no productive time, no wasted progress
    (``_get_segment_productive_and_unproductive_time`` returns ``0.0, {}``).
    Then, once: if the job end is recorded, ``end - start of the highest step of the last segment`` is added (the
    last step's interval is productive). Then the SUM of all checkpoint save blocking times
    (UNPRODUCTIVE_CHECKPOINT_SAVE_TIME below) is subtracted, wherever those saves lie. Productive time below 0 or
    above the total job time makes ``get_job_goodput`` raise ``ValueError``. The step deltas are raw: the time a save
    blocks inside a step's interval is part of that delta, so it also inflates the mean step time used for
    PROGRAM_STARTUP.

PROGRAM_STARTUP (``_compute_segment_final_metrics``)
    Per segment: ``max(0, first_step_time - mean(other productive deltas))``. It is NOT the time from the job start
    to the first step: that time is in no category (see OTHER).

WASTED_PROGRESS_FROM_DISRUPTION (``_compute_adjusted_segment_productive_and_unproductive_time``)
    Per segment closed by a disruption at ``curr_step > 0``: the sum of the raw deltas ``tc - tp`` of consecutive
    recorded pairs whose later step ``c > curr_step``, i.e. from the first start of step ``curr_step`` to the start
    of the last recorded step before the disruption. With a restore of checkpoint ``c`` this includes step ``c``'s
    own interval and so the blocking time of the save OF ``c`` itself, which is also in
    UNPRODUCTIVE_CHECKPOINT_SAVE_TIME: Google counts that save twice as badput and subtracts it from productive time,
    where it never was (the flat sum still equals the total, because productive time is that much lower).

INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION (the main loop, on a re-recorded step)
    ``job_start_time - _last_disruption_time``, where ``job_start_time`` is the latest job start recorded before the
    re-recorded step and ``_last_disruption_time`` is the start time of the last step recorded before it (the last
    key of the segment's dict); only if the job start is later than that step start. So it runs from the last
    step start of the interrupted attempt (not from the interruption) to the next attempt's start (not its first
    step): it includes the rest of that last step, the eviction and the rescheduling.

UNPRODUCTIVE_CHECKPOINT_SAVE_TIME (``checkpoint_badput_calculator.py:
CheckpointBadputCalculator.calculate_save_operation_checkpoint_manager_blocking_time`` and ``_save_statistics``)
    Save entries grouped by ``"<step>-local"`` or ``"<step>-persistent"`` (directory starting ``gs://``); each
    group's ``checkpoint_manager_blocking_duration_secs`` is AVERAGED over its entries, then the groups are summed.
    Two saves of the same step count once, at their mean.

UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME (``calculate_restore_operation_checkpoint_manager_blocking_time``,
``_restore_statistics``)
    The same for ``event_type`` ``"restore"`` (and ``"emergency_restore"``) with
    ``checkpoint_manager_duration_secs``: the same checkpoint restored by two attempts counts once, at the mean of
    the two restore times.

OTHER (``goodput.py: GoodputCalculator._compute_other_unproductive_time``)
    The residual ``max(0, total - productive - flat sum)``, where the flat sum
    (``_calculate_total_flat_unproductive_time``) adds every category but DATA_LOADING_ASYNC and OTHER (custom
    events summed). For the timelines here (consecutive steps, no other entries) it is exactly: the sum over
    attempts of (first step start - job start), minus UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME as Google counts it
    (averaged, see above), plus, for each attempt closed by a restart from step 0, its first to last step start.
    Before OTHER is computed any category below 0 or above the total is set to 0
    (``_sanitize_unproductive_times``).

The breakdown ``get_job_goodput`` returns (``_get_job_badput_breakdown``) is in percent of the total job time, and
a category is reported as 0 unless ``0 < seconds < total``. TPU_INITIALIZATION, TRAINING_PREP and the data loading
categories stay 0 here (we record none of their entries). ``GoogleFigures.badput_s`` turns the percentages back
into seconds (``pct / 100 * total``); CUSTOM_BADPUT_EVENTS (a dict by event type) is given as its sum.

Precision: the recorder stores times as ``datetime.timestamp()`` of a datetime, so they are rounded to the
microsecond; ``random_timeline`` makes times that are whole microseconds, which pass through unchanged.
"""

from __future__ import annotations

import itertools
import math
import random
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ml_goodput_measurement.src import goodput as gp

JOB_NAME = "reference-job"
LOGGER_NAME = "reference-goodput"
CHECKPOINT_DIR = "/checkpoints/reference-job"  # a local directory: save and restore entries group as "<step>-local"

# Not in Google's flat sum: async data loading overlaps training; OTHER is the residual of the rest.
NOT_IN_FLAT_SUM = frozenset({"DATA_LOADING_ASYNC", "OTHER"})


@dataclass(frozen=True)
class RefAttempt:
    bind: float  # epoch seconds: the attempt's pods bound = Google's record_job_start_time
    # (step, time the step was reached = Google's step_start_time), step numbers consecutive within an attempt
    steps: tuple[tuple[int, float], ...]
    saves: tuple[tuple[int, float, float], ...] = ()  # checkpoint save of step: (step, start, end); blocks end-start
    restores: tuple[tuple[int, float, float], ...] = ()  # checkpoint restore of step: (step, start, end)
    interrupted_at: float | None = None  # the attempt was interrupted (evicted) at this time; None for the last attempt
    release: float | None = None  # when its pods released the GPUs (>= interrupted_at); for the last attempt = end


@dataclass(frozen=True)
class RefTimeline:
    attempts: tuple[RefAttempt, ...]
    end: float  # the job's end: Google's record_job_end_time (the last attempt completed)


@dataclass(frozen=True)
class GoogleFigures:
    total_s: float  # Google's total job time (first job start -> job end)
    productive_s: float
    goodput_pct: float  # as get_job_goodput returns it (percent)
    badput_s: dict[str, float] = field(default_factory=dict)  # seconds per Google BadputType name
    disruptions: int = 0  # how many re-recorded steps Google saw

    def flat_sum_s(self) -> float:
        """Productive time plus every badput category Google's flat sum adds, plus OTHER: the total when OTHER
        (a residual clamped at 0) was not clamped."""
        return self.productive_s + sum(v for k, v in self.badput_s.items() if k != "DATA_LOADING_ASYNC")


class MemoryLogger:
    """Stands in for the package's ``_CloudLogger``: keeps the entries in memory, in the order written.

    ``read_cloud_logging_entries`` returns the entries after ``last_entry_info`` (an entry's id is its index); the
    time window the calculator passes is ignored (every entry of the one job is wanted)."""

    def __init__(self, job_name: str) -> None:
        self.job_name = job_name
        self.entries: list[dict[str, Any]] = []

    def write_cloud_logging_entry(self, entry: dict[str, Any] | None) -> None:
        if entry is not None and entry.get("job_name") == self.job_name:
            self.entries.append(dict(entry))

    def flush(self) -> None:
        pass

    def read_cloud_logging_entries(
        self,
        start_time: datetime | None = None,
        end_time: datetime | None = None,
        last_entry_info: tuple[datetime, str] | None = None,
    ) -> tuple[list[dict[str, Any]], tuple[datetime | None, str | None]]:
        first = int(last_entry_info[1]) + 1 if last_entry_info is not None else 0
        new = [dict(e) for e in self.entries[first:]]
        if not self.entries or not new:
            return new, (None, None)
        last = len(self.entries) - 1
        return new, (_entry_time(self.entries[last]), f"{last:09d}")


def _entry_time(entry: dict[str, Any]) -> datetime:
    ts = gp.get_timestamp_from_log_entry(entry)
    if not isinstance(ts, datetime):
        raise ValueError(f"entry without a time: {entry}")
    return ts


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


def validate(tl: RefTimeline) -> None:
    """Raise ValueError unless the timeline is one the harness (and Google) can read as meant."""
    if not tl.attempts:
        raise ValueError("no attempt")
    prev_bind = -math.inf
    for i, a in enumerate(tl.attempts):
        last = i == len(tl.attempts) - 1
        if not a.steps:
            raise ValueError(f"attempt {i}: no step")
        if a.bind <= prev_bind:
            raise ValueError(f"attempt {i}: binds before the previous attempt")
        prev_bind = a.bind
        nums = [s for s, _ in a.steps]
        times = [t for _, t in a.steps]
        if nums != list(range(nums[0], nums[0] + len(nums))):
            raise ValueError(f"attempt {i}: step numbers not consecutive")
        if times[0] < a.bind or any(b <= x for x, b in itertools.pairwise(times)):
            raise ValueError(f"attempt {i}: step times not increasing from the bind")
        for step, start, end in a.saves + a.restores:
            if end < start:
                raise ValueError(f"attempt {i}: checkpoint operation of step {step} ends before it starts")
        if last:
            if a.interrupted_at is not None:
                raise ValueError("the last attempt is not interrupted")
            if tl.end <= times[-1]:
                raise ValueError("the job ends before its last step started")
        else:
            if a.interrupted_at is None or a.interrupted_at <= times[-1]:
                raise ValueError(f"attempt {i}: interrupted_at missing or before its last step")
            if tl.attempts[i + 1].bind <= a.interrupted_at:
                raise ValueError(f"attempt {i + 1}: binds before attempt {i} was interrupted")


def _entries(tl: RefTimeline) -> Iterator[tuple[float, int, str, Any]]:
    """(time, tie order, kind, data) of every entry to write; sorted by the caller."""
    for a in tl.attempts:
        yield a.bind, 0, "start", None
        for step, _start, end in a.restores:
            yield end, 1, "restore", (step, _start, end)
        for step, t in a.steps:
            yield t, 2, "step", step
        for step, _start, end in a.saves:
            yield end, 3, "save", (step, _start, end)
    yield tl.end, 4, "end", None


def _save_entry(step: int, start: float, end: float) -> dict[str, Any]:
    return {
        "job_name": JOB_NAME,
        "step": step,
        "event_type": "save",
        "directory": CHECKPOINT_DIR,
        "reached_preemption": False,
        "preemption_received_at": None,
        "synchronous": True,
        "wait_for_prev_start_time": start,
        "wait_for_prev_duration_secs": 0.0,
        "checkpointer_blocking_start_time": start,
        "checkpointer_blocking_duration_secs": end - start,
        "get_old_steps_start_time": end,
        "get_old_steps_duration_secs": 0.0,
        "checkpoint_manager_blocking_start_time": start,
        "checkpoint_manager_blocking_duration_secs": end - start,
    }


def _restore_entry(step: int, start: float, end: float) -> dict[str, Any]:
    return {
        "job_name": JOB_NAME,
        "step": step,
        "event_type": "restore",
        "directory": CHECKPOINT_DIR,
        "checkpointer_start_time": start,
        "checkpointer_duration_secs": end - start,
        "checkpoint_manager_start_time": start,
        "checkpoint_manager_duration_secs": end - start,
    }


def write_entries(tl: RefTimeline, logger: MemoryLogger) -> None:
    """Write the timeline as Google's recorder and Orbax's checkpoint logger would, in time order."""
    rec = gp.GoodputRecorder(JOB_NAME, LOGGER_NAME, logging_enabled=True, cloud_logger=logger)
    for t, _, kind, data in sorted(_entries(tl), key=lambda e: (e[0], e[1])):
        if kind == "start":
            rec.record_job_start_time(_dt(t))
        elif kind == "step":
            rec.record_step_start_time(data, _dt(t))
        elif kind == "end":
            rec.record_job_end_time(_dt(t))
        elif kind == "save":
            logger.write_cloud_logging_entry(_save_entry(*data))
        else:
            logger.write_cloud_logging_entry(_restore_entry(*data))


def _seconds(value: float | dict[str, float], total: float) -> float:
    pct = sum(value.values()) if isinstance(value, dict) else value
    return float(pct) / 100.0 * total


def google_figures(tl: RefTimeline) -> GoogleFigures:
    """Google's goodput figures for the timeline (raises ValueError where Google does, e.g. productive time < 0)."""
    validate(tl)
    logger = MemoryLogger(JOB_NAME)
    write_entries(tl, logger)
    with tempfile.TemporaryDirectory(prefix="goodput-ref-") as cache_dir:
        calc = gp.GoodputCalculator(JOB_NAME, LOGGER_NAME, cloud_logger=logger, gcs_path=None, cache_dir=cache_dir)
        goodput_pct, breakdown, _ = calc.get_job_goodput(include_badput_breakdown=True)
        details = calc.get_job_goodput_details()
    total = float(details["total_elapsed_time"])
    productive = float(details["goodput_time"][gp.GoodputType.TOTAL])
    expected_total = tl.end - tl.attempts[0].bind
    # The job end is recorded, so the total is first start -> end, not first start -> now (the query time).
    if abs(total - expected_total) > 1e-6 * max(1.0, expected_total):
        raise AssertionError(f"Google's total job time {total} is not end - first bind = {expected_total}")
    return GoogleFigures(
        total_s=total,
        productive_s=productive,
        goodput_pct=float(goodput_pct),
        badput_s={kind.name: _seconds(v, total) for kind, v in breakdown.items()},
        disruptions=int(details["disruption_count"]),
    )


# --- a generator of timelines -------------------------------------------------------------------------------------


def _us(t: float) -> float:
    """A time rounded to the microsecond: the recorder's datetimes keep it exactly."""
    return round(t, 6)


def random_timeline(rng: random.Random) -> RefTimeline:
    """A realistic, varied timeline.

    1-4 attempts; the first binds at an epoch time between 2020 and 2027. Each attempt starts its first step 5-300 s
    after it binds; a step takes the job's base step time (1-30 s) jittered by at most 10%; it records 20-400 steps.
    A checkpoint is saved every k steps (k 5-50; not step 0, not the step an attempt resumes from, which is saved
    already), blocking 1-20 s: the save of step s starts when step s is reached and step s+1 starts once it has ended
    plus the step's compute. An interrupted attempt is interrupted inside its last recorded step's interval; a save of
    that step counts only if it ended before the interruption. The next attempt binds 10-900 s after the
    interruption (the old pods release their GPUs between the two), restores the latest checkpoint saved before the
    interruption (2-60 s, within its startup) and records that checkpoint's step again as its first step; with no
    checkpoint yet it starts again at step 0 with no restore. The last attempt runs to the end: its last step's start
    plus one step time, plus a final save of that step on every k-th step or otherwise with probability 1/2.
    """
    n_attempts = rng.randint(1, 4)
    every = rng.randint(5, 50)
    base = rng.uniform(1.0, 30.0)

    def step_time() -> float:
        return base * rng.uniform(0.9, 1.1)

    def blocking() -> float:
        return rng.uniform(1.0, 20.0)

    attempts: list[RefAttempt] = []
    latest_checkpoint: int | None = None
    bind = _us(rng.uniform(1.58e9, 1.80e9))
    end = 0.0
    for i in range(n_attempts):
        last = i == n_attempts - 1
        startup = rng.uniform(5.0, 300.0)
        restores: tuple[tuple[int, float, float], ...] = ()
        first_step = 0
        if latest_checkpoint is not None:
            first_step = latest_checkpoint
            dur = rng.uniform(2.0, min(60.0, startup - 1.0))
            r_start = _us(bind + rng.uniform(0.0, startup - dur))
            restores = ((first_step, r_start, _us(r_start + dur)),)
        now = _us(bind + startup)
        n_steps = rng.randint(20, 400)
        steps: list[tuple[int, float]] = []
        saves: list[tuple[int, float, float]] = []
        for j in range(n_steps):
            step = first_step + j
            steps.append((step, now))
            if j == n_steps - 1:
                break
            if step > 0 and j > 0 and step % every == 0:
                save_end = _us(now + blocking())
                saves.append((step, now, save_end))
                now = save_end
            now = _us(now + step_time())
        last_step, last_start = steps[-1]
        due = last_step > 0 and n_steps > 1 and last_step % every == 0
        if last:
            after = last_start
            if due or rng.random() < 0.5:
                after = _us(last_start + blocking())
                saves.append((last_step, last_start, after))
            end = _us(after + step_time())
            attempts.append(RefAttempt(bind, tuple(steps), tuple(saves), restores, None, end))
            break
        save_end = _us(last_start + blocking()) if due else last_start
        window = (save_end - last_start) + step_time()
        interrupted = _us(last_start + window * rng.uniform(0.02, 0.98))
        if due and save_end <= interrupted:
            saves.append((last_step, last_start, save_end))
        next_bind = _us(interrupted + rng.uniform(10.0, 900.0))
        release = _us(interrupted + rng.uniform(0.0, min(30.0, next_bind - interrupted)))
        attempts.append(RefAttempt(bind, tuple(steps), tuple(saves), restores, interrupted, release))
        if saves:
            latest_checkpoint = saves[-1][0]
        bind = next_bind
    return RefTimeline(tuple(attempts), end)
