"""Stuck runs: live runs that have stayed in a phase before their application started for too long.

The one definition the CLI (``tracker runs --stuck``, ``tracker.read.filters.STUCK_PHASES``), the reducer's
metrics and alerts and the KQL function ``TaugridStuckRuns`` share: a run is *stuck-eligible* while its status is
``pending`` and its phase is Admission (waiting for quota or backoff), Scheduling (pods unschedulable or not
created) or Runtime (pods bound, containers not started: image pulls, PodsReady waits). Its *age* is the time in
the current phase: ``now - since``, ``since`` being the time of the run's last transition (the phase entry). The
reason and message are the run's (``RunRecord.reason``/``message``: Kueue's pending condition, the scheduler's
``FailedScheduling``, the container's waiting reason), with Kueue's pending reason and message beside them.

Pure: the clock is an argument (microseconds since the epoch), so the reducer can pass its event-time watermark
or the wall clock, and tests need neither Kafka nor time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tracker.core.model import Phase, RunHistory, Status, utc
from tracker.core.timefmt import ts

STUCK_PHASES: tuple[Phase, ...] = (Phase.ADMISSION, Phase.SCHEDULING, Phase.RUNTIME)

STALLED_ADMISSION_SCHEMA: Literal["taugrid.io/stalled-admission-alert/v1"] = "taugrid.io/stalled-admission-alert/v1"
STUCK_RUN_SCHEMA: Literal["taugrid.io/stuck-run-alert/v1"] = "taugrid.io/stuck-run-alert/v1"

Clock = Literal["event", "wall"]


@dataclass(frozen=True, slots=True)
class Stuck:
    """A live run in a phase before its application started (stuck once its age passes the phase's threshold)."""

    run_id: str
    attempt: int
    phase: Phase
    since_us: int  # when the run entered the phase (its last transition)
    queue: str  # the LocalQueue, as namespace/name ('-' for an unknown part)
    cluster_queue: str | None
    queued_at_us: int | None  # the current attempt's queueing time
    reason: str | None
    message: str
    pending_reason: str | None
    pending_message: str
    admitted: bool = False  # the current attempt was admitted (its admission wait has ended)
    pending_category: str | None = None  # the category of its open pending span (tracker.core.pending) ...
    pending_since_us: int | None = None  # ... and when that span began

    def age_us(self, now_us: int) -> int:
        return now_us - self.since_us

    def admission_wait_s(self, now_us: int) -> float | None:
        """Its admission wait at ``now_us`` while it still waits (queued, not admitted), else None."""
        if self.admitted or self.queued_at_us is None:
            return None
        return max(0, now_us - self.queued_at_us) / 1e6

    def pending_open_s(self, now_us: int) -> float:
        """The age of its open pending span at ``now_us`` (0 without one)."""
        return 0.0 if self.pending_since_us is None else max(0, now_us - self.pending_since_us) / 1e6


def stuck_candidate(history: RunHistory) -> Stuck | None:
    """The run as a stuck candidate: pending, in Admission/Scheduling/Runtime, with a phase entry; else None."""
    r = history.run
    if r.status != Status.PENDING or r.phase not in STUCK_PHASES or not history.transitions:
        return None
    last = history.transitions[-1]
    return Stuck(run_id=r.run_id, attempt=r.attempts, phase=r.phase, since_us=_us(last.at),
                 queue=f"{r.namespace or '-'}/{r.queue or '-'}", cluster_queue=r.cluster_queue,
                 queued_at_us=None if r.queued_at is None else _us(r.queued_at), reason=r.reason,
                 message=r.message, pending_reason=r.pending_reason, pending_message=r.pending_message,
                 admitted=r.admitted_at is not None, pending_category=r.pending_category,
                 pending_since_us=None if r.pending_since is None else _us(r.pending_since))


def is_due(stuck: Stuck, now_us: int, thresholds_s: Mapping[Phase, float]) -> bool:
    """Stuck for at least the phase's threshold (a phase without a threshold is never due)."""
    threshold = thresholds_s.get(stuck.phase)
    return threshold is not None and stuck.age_us(now_us) >= int(threshold * 1_000_000)


def due(candidates: Iterable[Stuck], now_us: int, thresholds_s: Mapping[Phase, float],
        alerted: Mapping[str, Iterable[tuple[int, Phase]]]) -> list[Stuck]:
    """The candidates due an alert at ``now_us``: past their phase's threshold and not alerted yet for their
    (attempt, phase); ``alerted`` maps a run id to the (attempt, phase) pairs already alerted."""
    return [s for s in candidates
            if is_due(s, now_us, thresholds_s) and (s.attempt, s.phase) not in set(alerted.get(s.run_id, ()))]


def pending_open(candidates: Iterable[Stuck], now_us: int) -> dict[str, float]:
    """The summed age in seconds of the open pending spans by category (``tracker_pending_open_seconds``): with
    ``tracker_pending_seconds_total`` (the ended spans), every pending second up to ``now_us``."""
    out: dict[str, float] = {}
    for s in candidates:
        if s.pending_category:
            out[s.pending_category] = out.get(s.pending_category, 0.0) + s.pending_open_s(now_us)
    return out


def oldest(candidates: Iterable[Stuck], now_us: int) -> dict[tuple[Phase, str], float]:
    """The age in seconds of the oldest candidate per (phase, queue) (never negative)."""
    out: dict[tuple[Phase, str], float] = {}
    for s in candidates:
        key = (s.phase, s.queue)
        out[key] = max(out.get(key, 0.0), max(0, s.age_us(now_us)) / 1e6)
    return out


# ------------------------------------------------------------------------------------------ alert records


class _Alert(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class StalledAdmissionAlert(_Alert):
    """A run has waited for admission longer than the threshold (one per run and attempt).

    Superseded by ``taugrid.io/stuck-run-alert/v1``, which has every field of this one with the same meaning (for
    phase Admission) and is what the reducer writes to the alerts topic now; published for the records written
    before."""

    schema_: Literal["taugrid.io/stalled-admission-alert/v1"] = Field(default=STALLED_ADMISSION_SCHEMA,
                                                                      alias="schema")
    run_id: str
    attempt: int
    queue: str = Field(description="The LocalQueue, as namespace/name.")
    cluster_queue: str | None
    queued_at: datetime
    observed_at: datetime = Field(description="The clock reading at which the age passed the threshold.")
    clock: Clock
    age_s: float
    threshold_s: float
    pending_reason: str | None
    pending_message: str


class StuckRunAlert(_Alert):
    """A live run has stayed in a phase before its application started (Admission, Scheduling or Runtime) longer
    than that phase's threshold: one per run, attempt and phase. Key on the alerts topic: the run id.

    Compatible with ``taugrid.io/stalled-admission-alert/v1``: its fields are all here with the same meaning;
    ``queued_at`` may be null outside Admission."""

    schema_: Literal["taugrid.io/stuck-run-alert/v1"] = Field(default=STUCK_RUN_SCHEMA, alias="schema")
    run_id: str
    attempt: int
    phase: Literal["Admission", "Scheduling", "Runtime"] = Field(description="The phase the run is stuck in.")
    since: datetime = Field(description="When the run entered the phase (its last transition).")
    queue: str = Field(description="The LocalQueue, as namespace/name ('-' for an unknown part).")
    cluster_queue: str | None
    queued_at: datetime | None = Field(description="When the current attempt was queued (Admission: = since).")
    observed_at: datetime = Field(description="The clock reading at which the age passed the threshold.")
    clock: Clock = Field(description="event: the partition's event-time watermark; wall: the reducer's clock.")
    age_s: float = Field(description="Time in the phase at observed_at, in seconds.")
    threshold_s: float = Field(description="The phase's threshold (alerts.stalled_admission_s, "
                                           "alerts.stuck_scheduling_s or alerts.stuck_runtime_s).")
    reason: str | None = Field(description="Why the run waits: Kueue's pending reason, the scheduler's "
                                           "FailedScheduling, a container's waiting reason (e.g. ImagePullBackOff).")
    message: str = Field(description="The message that goes with the reason (may be empty).")
    pending_reason: str | None = Field(description="Kueue's pending reason while not admitted, else null.")
    pending_message: str
    admission_wait_s: float | None = Field(default=None, description=(
        "While the current attempt is not admitted (Admission): its admission wait at observed_at, observed_at - "
        "queued_at, still growing; else null."))
    pending_category: str | None = Field(default=None, description=(
        "The category of the pending span going on at observed_at (README \"Every pending second\"), if any."))
    pending_since: datetime | None = Field(default=None, description="When that pending span began.")


def stuck_alert(stuck: Stuck, now_us: int, clock: Clock, threshold_s: float) -> StuckRunAlert:
    return StuckRunAlert(
        run_id=stuck.run_id, attempt=stuck.attempt, phase=stuck.phase.value,
        since=_dt(stuck.since_us), queue=stuck.queue, cluster_queue=stuck.cluster_queue,
        queued_at=None if stuck.queued_at_us is None else _dt(stuck.queued_at_us), observed_at=_dt(now_us),
        clock=clock, age_s=stuck.age_us(now_us) / 1e6, threshold_s=threshold_s, reason=stuck.reason,
        message=stuck.message, pending_reason=stuck.pending_reason, pending_message=stuck.pending_message,
        admission_wait_s=stuck.admission_wait_s(now_us), pending_category=stuck.pending_category,
        pending_since=None if stuck.pending_since_us is None else _dt(stuck.pending_since_us))


def _us(at: datetime) -> int:
    value = ts(at)
    assert value is not None
    return value


def _dt(us: int) -> datetime:
    value = utc(us)
    assert value is not None
    return value


def schema_documents() -> dict[str, dict[str, Any]]:
    """The alert records' JSON Schemas published under ``schemas/`` (path relative to schemas/ -> schema)."""
    return {
        "stuck-run-alert/v1.schema.json": StuckRunAlert.model_json_schema(by_alias=True) | {"$id": STUCK_RUN_SCHEMA},
        "stalled-admission-alert/v1.schema.json":
            StalledAdmissionAlert.model_json_schema(by_alias=True) | {"$id": STALLED_ADMISSION_SCHEMA},
    }
