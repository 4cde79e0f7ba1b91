"""Wire models of the tracker: what comes in (intake events, defined in ``tracker.core.intake`` and re-exported
here), what goes out (history rows).

Everything here is a plain value: pydantic v2 models for anything that crosses a process boundary, so
that the JSON Schemas under ``schemas/`` are generated from exactly these classes.

Importing this module does not import pydantic (``tracker show`` and ``compare`` build these rows from the index with
the standard library and start without it, issue 28): the history rows are dataclasses whose pydantic annotations
(``Field``) are strings until ``adapter`` first builds a pydantic adapter, which puts ``Field`` in this module's
namespace for pydantic to resolve them; the pydantic models re-exported here (the intake events, ``DeadLetter``, which
lives in ``tracker.core.dead_letter``) are imported on first use (the module's ``__getattr__``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from dataclasses import field as dc_field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, cast, overload

if TYPE_CHECKING:
    from pydantic import ConfigDict, Field, TypeAdapter

    # re-exported: the intake events live in tracker.core.intake, the dead letter in tracker.core.dead_letter
    from tracker.core.dead_letter import EXCERPT_MAX as EXCERPT_MAX
    from tracker.core.dead_letter import DeadLetter as DeadLetter
    from tracker.core.intake import URI_MAX as URI_MAX
    from tracker.core.intake import CheckpointRestoreEvent as CheckpointRestoreEvent
    from tracker.core.intake import CheckpointSaveEvent as CheckpointSaveEvent
    from tracker.core.intake import IntakeEnvelope as IntakeEnvelope
    from tracker.core.intake import IntakeEvent as IntakeEvent
    from tracker.core.intake import ProgressEvent as ProgressEvent
    from tracker.core.intake import RenderingEvent as RenderingEvent
    from tracker.core.intake import ResolutionEvent as ResolutionEvent
    from tracker.core.intake import ResumeEvent as ResumeEvent
else:
    # The names re-exported from modules that import pydantic, imported when first asked for.
    _LAZY = {"DeadLetter": "tracker.core.dead_letter", "EXCERPT_MAX": "tracker.core.dead_letter", **dict.fromkeys(
        ("URI_MAX", "CheckpointRestoreEvent", "CheckpointSaveEvent", "IntakeEnvelope", "IntakeEvent", "ProgressEvent",
         "RenderingEvent", "ResolutionEvent", "ResumeEvent"), "tracker.core.intake")}

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value

# re-exported: the vocabulary lives in tracker.core.vocab (standard library only)
from tracker.core.vocab import ANN_CONFIG_DIGEST as ANN_CONFIG_DIGEST
from tracker.core.vocab import ANN_CONFIG_REF as ANN_CONFIG_REF
from tracker.core.vocab import ANN_GIT_COMMIT as ANN_GIT_COMMIT
from tracker.core.vocab import ANN_INPUT_REFS as ANN_INPUT_REFS
from tracker.core.vocab import ANN_OUTPUT as ANN_OUTPUT
from tracker.core.vocab import ANN_RESUME_OF as ANN_RESUME_OF
from tracker.core.vocab import FINAL_STATUSES as FINAL_STATUSES
from tracker.core.vocab import INTAKE_SCHEMA as INTAKE_SCHEMA
from tracker.core.vocab import INTAKE_SCHEMA_V1 as INTAKE_SCHEMA_V1
from tracker.core.vocab import INTAKE_SCHEMAS as INTAKE_SCHEMAS
from tracker.core.vocab import LABEL_CONTROLLER_UID as LABEL_CONTROLLER_UID
from tracker.core.vocab import LABEL_JOB_UID as LABEL_JOB_UID
from tracker.core.vocab import LABEL_PROJECT as LABEL_PROJECT
from tracker.core.vocab import LABEL_QUEUE as LABEL_QUEUE
from tracker.core.vocab import LABEL_RAY_CLUSTER as LABEL_RAY_CLUSTER
from tracker.core.vocab import LABEL_RAY_NODE_TYPE as LABEL_RAY_NODE_TYPE
from tracker.core.vocab import LABEL_RUN_ID as LABEL_RUN_ID
from tracker.core.vocab import LABEL_TARGET as LABEL_TARGET
from tracker.core.vocab import LABEL_WORKSPACE as LABEL_WORKSPACE
from tracker.core.vocab import TAUGRID_ANNOTATION_PREFIX as TAUGRID_ANNOTATION_PREFIX
from tracker.core.vocab import GoodputCategory as GoodputCategory
from tracker.core.vocab import PendingCategory as PendingCategory
from tracker.core.vocab import Phase as Phase
from tracker.core.vocab import Status as Status


@overload
def utc(ts_us: int) -> datetime: ...
@overload
def utc(ts_us: None) -> None: ...
@overload
def utc(ts_us: int | None) -> datetime | None: ...


def utc(ts_us: int | None) -> datetime | None:
    """Microseconds since the epoch to an aware UTC datetime (None stays None); exact, in integers (through a float
    the microseconds of a time near year 1 or 9999 are lost, and the last of year 9999 rounds up into year 10000)."""
    return None if ts_us is None else _utc(ts_us)


@lru_cache(maxsize=8_192)  # ~1 MiB: a narrow run's history holds ~39 datetimes of ~10 values, one object a value
def _utc(ts_us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=ts_us)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso(ts_us: int | None) -> str | None:
    """Microseconds since the epoch to ISO-8601 UTC with a trailing Z (seconds unless sub-second)."""
    if ts_us is None:
        return None
    dt = datetime.fromtimestamp(ts_us // 1_000_000, tz=UTC).replace(microsecond=ts_us % 1_000_000)
    text = dt.isoformat(timespec="microseconds" if dt.microsecond else "seconds")
    return text.replace("+00:00", "Z")


# --------------------------------------------------------------------------------------------------
# Output: the run history, as written to the experiment index and to Azure Data Explorer.
#
# Plain frozen dataclasses, not pydantic models: the reducer builds them for every change it derives, and a
# dataclass is built several times faster than a model is validated. pydantic still describes them (the JSON
# Schemas under schemas/ come from ``TypeAdapter``s over these classes, with the ``Field`` constraints in their
# annotations) and validates them where they come in from outside (``load``: the transitions topic, the index).
# The reducer's own output is correct by construction and is not validated again.

_FORBID: ConfigDict = {"extra": "forbid"}  # a ConfigDict (a TypedDict: a dict)
_LOST_BY = ("lost_gpu_hours by reason (PodFailure, PodEvicted, Preempted, PodsReadyTimeout, Evicted, RayJobRetry, "
            "RunFailed).")
_EVICTIONS_BY = ("evictions by reason, summing to evictions: each attempt ended by a Kueue eviction that the next "
                 "attempt re-queued (how it ended, else the next attempt's trigger), a final deactivation, and what "
                 "Kueue counted beyond those (EvictionNotObserved). Empty in histories written before v5.")
_LEDGER_GPU = ("GPU-hours held, by goodput category (schemas/goodput.md); with the open pods counted up to "
               "ledger_until. Sums to gpu_hours + gpus_open x (ledger_until - open_since).")
_LEDGER_WALL = "Seconds of wall time by goodput category (schemas/goodput.md), from queued to the end or ledger_until."
_OPEN = ("GPUs still held by pods that have not released them: held at time T = gpu_hours + gpus_open x "
         "(T - open_since).")


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    """One phase entry of one attempt of a run. Keyed by (run_id, attempt, phase).

    Completion is the last entry of a finished run, or of an attempt stopped by a Kueue deactivation that a
    reactivation later undid (the run is then in Completion until the next attempt's Admission)."""

    __pydantic_config__ = _FORBID

    run_id: str
    attempt: Annotated[int, Field(ge=1)]
    phase: Phase
    at: datetime
    reason: Annotated[str, Field(description="Machine-readable cause, e.g. Queued, Admitted, Preempted, Reactivated, "
                                             "OOMKilled.")]
    message: str = ""
    source: Annotated[str, Field(description="Object that evidences it, as Kind/namespace/name.")]


@dataclass(frozen=True, slots=True, kw_only=True)
class PodFailure:
    """A pod of an attempt that failed (not one killed from outside). Keyed by (run_id, attempt, pod)."""

    __pydantic_config__ = _FORBID

    pod: str
    at: datetime | None
    reason: str
    exit_code: int | None = None
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PodPlacement:
    """One pod of a run: where and when it ran, in which attempt, and its GPU accounting. Keyed by (run_id, uid).

    A run's pods are records of their own (``RunHistory.pods`` in a complete history, one record per pod on the
    transitions topic), so that a change of one pod of a wide run rewrites that pod's row only."""

    __pydantic_config__ = _FORBID

    run_id: str
    uid: Annotated[str, Field(description="The pod's metadata.uid ('v5:<attempt>:<pod>' for a row an index of "
                                          "schema 5 held, until its run is written again).")]
    namespace: Annotated[str | None, Field(description="The run's (and so the pod's) namespace: a pod record stands "
                                                       "alone, for joins with GPU telemetry on namespace and pod.")]
    attempt: Annotated[int, Field(ge=1, description="The attempt the pod ran in.")]
    pod: Annotated[str, Field(description="The pod's name.")]
    node: str | None
    created_at: datetime | None
    scheduled_at: datetime | None
    finished_at: datetime | None
    gpus: Annotated[int, Field(ge=0, description="GPUs the pod requested (schemas/gpu-accounting.md).")] = 0
    released_at: Annotated[datetime | None, Field(description="When the pod stopped holding its GPUs.")] = None
    gpu_hours: Annotated[float | None, Field(description="GPU-hours held from bind to release; null while the pod "
                                                         "still holds its GPUs.")] = 0.0
    lost: Annotated[str | None, Field(description="Why its GPU-time was lost (schemas/gpu-accounting.md), null if "
                                                  "it was not.")] = None


def pod_order(p: PodPlacement) -> tuple[int, bool, datetime, str, str]:
    """The order of a run's pods in a complete history: by attempt, then creation time (none first), name and uid."""
    return p.attempt, p.created_at is not None, p.created_at or _EPOCH, p.pod, p.uid


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionStep:
    """A sub-state of an attempt's Admission: Kueue reserved quota (``QuotaReserved``), an admission check changed
    state (``AdmissionCheck``), or Kueue released the quota before the attempt was admitted (``QuotaReleased``: an
    eviction, e.g. a check in Retry). The attempt is admitted at ``Admitted=True``, once every check is Ready."""

    __pydantic_config__ = _FORBID

    kind: Annotated[str, Field(description="QuotaReserved, AdmissionCheck or QuotaReleased.")]
    at: datetime
    check: Annotated[str | None, Field(description="The admission check's name (kind AdmissionCheck).")] = None
    state: Annotated[str, Field(description="A check's state (Pending, Ready, Retry, Rejected); the ClusterQueue "
                                            "of a QuotaReserved; the eviction reason of a QuotaReleased.")]
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingSpan:
    """A stretch of an attempt's time before its application started, and why (``PendingCategory``)."""

    __pydantic_config__ = _FORBID

    category: PendingCategory
    detail: Annotated[str, Field(description="What explains it: Kueue's message, the check's name and message, the "
                                             "scheduler's message, a container's waiting reason.")] = ""
    start: datetime
    end: Annotated[datetime | None, Field(description="null: it still goes on (a live attempt: up to now).")]


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRecord:
    """A checkpoint the run saved (``save``) or restored (``restore``), as its intake events told. Keyed by (run_id,
    kind, step, uri, started_at)."""

    __pydantic_config__ = _FORBID

    kind: Annotated[Literal["save", "restore"], Field(description="save or restore.")]
    step: int
    uri: str
    started_at: Annotated[datetime | None, Field(description="null: the start was not reported (a v1 Progress "
                                                             "event's checkpoint_uri).")]
    ended_at: Annotated[datetime | None, Field(description="completed or failed at; null: not reported yet.")]
    status: Annotated[Literal["started", "completed", "failed"], Field(description="How far it got.")]
    bytes: int | None = None
    attempt: Annotated[int | None, Field(description="The attempt it happened in.")] = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerSpan:
    """A stretch of a run's time the ledger did not count productive (not a checkpoint save: those are the run's
    ``checkpoints``), for timelines."""

    __pydantic_config__ = _FORBID

    category: GoodputCategory
    start: datetime
    end: datetime


MAX_FAILURES_LISTED = 64  # pod failures an attempt lists (the earliest); ``failed_pods`` counts them all


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One admission (or RayJob retry) of a run. Keyed by (run_id, attempt). Its pods are the run's ``pods`` with
    this attempt number."""

    __pydantic_config__ = _FORBID

    run_id: str
    attempt: Annotated[int, Field(ge=1)]
    trigger: Annotated[str, Field(description="Why this attempt began: Submitted, a Kueue eviction reason (a "
                                              "deactivation when the Workload was reactivated), RayJobRetry.")]
    queued_at: datetime | None
    admitted_at: datetime | None
    scheduled_at: datetime | None
    started_at: datetime | None
    progress_at: datetime | None
    ended_at: datetime | None
    end_reason: Annotated[str | None, Field(description="Eviction or terminal reason that ended the attempt.")]
    end_message: str = ""
    underlying_cause: str | None = None
    admission_wait_s: float | None
    cluster_queue: str | None = None
    ray_cluster: str | None = None
    retries: Annotated[int, Field(ge=0, description="Pod failures the Job replaced within this attempt.")]
    failures: Annotated[list[PodFailure], Field(description=f"Its pod failures, the earliest first: at most "
                                                            f"{MAX_FAILURES_LISTED} (failed_pods counts them all).")
                        ] = dc_field(default_factory=list)
    # GPU accounting (tracker.core.gpu; the definitions are in schemas/gpu-accounting.md)
    gpus: Annotated[int, Field(ge=0, description="The most GPUs held at once (a run: by any attempt).")] = 0
    gpu_hours: Annotated[float, Field(ge=0, description="GPU-hours held by pods that released them.")] = 0.0
    lost_gpu_hours: Annotated[float, Field(ge=0, description="Of gpu_hours, the GPU-hours lost.")] = 0.0
    lost_gpu_hours_by: Annotated[dict[str, float], Field(description=_LOST_BY)] = dc_field(default_factory=dict)
    gpus_open: Annotated[int, Field(ge=0, description=_OPEN)] = 0
    open_since: Annotated[datetime | None, Field(description="GPU-weighted mean bind time of those pods.")] = None
    pod_count: Annotated[int, Field(ge=0, description="How many pods ran in it (the run's pods of this "
                                                      "attempt).")] = 0
    failed_pods: Annotated[int, Field(ge=0, description="How many of its pods failed (those listed in failures "
                                                        "and the rest).")] = 0
    # Admission in steps, and every pending second explained (tracker.core.pending)
    quota_reserved_at: Annotated[datetime | None, Field(
        description="When Kueue last reserved quota for it (QuotaReserved=True); admitted_at is Admitted=True, "
                    "once every admission check is Ready.")] = None
    admission_steps: Annotated[list[AdmissionStep], Field(
        description="Quota reservations, admission check states and quota releases of its Admission, in time "
                    "order.")] = dc_field(default_factory=list)
    pending: Annotated[list[PendingSpan], Field(
        description="Its time from queued (or created) to its application's start (or its end), split by reason, in "
                    "time order; the last has end null while it goes on.")] = dc_field(default_factory=list)
    pending_s_by: Annotated[dict[str, float], Field(
        description="Seconds of its ended pending spans by category (an open span counts up to now where read).")
                            ] = dc_field(default_factory=dict)
    # the goodput ledger (tracker.core.ledger; the definitions are in schemas/goodput.md)
    ledger_gpu_hours_by: Annotated[dict[str, float], Field(description=_LEDGER_GPU)] = dc_field(default_factory=dict)
    ledger_wall_s_by: Annotated[dict[str, float], Field(description=_LEDGER_WALL)] = dc_field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricSummary:
    __pydantic_config__ = _FORBID

    run_id: str
    metric: str
    first_step: int
    first_value: float
    latest_step: int
    latest_value: float
    min_value: float
    max_value: float
    points: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricPoint:
    """One point of a training metric's curve, as the run reported it. A run keeps a bounded, downsampled set of
    its points (at most ``reduce.metric_points_per_run`` over all its metrics, default 512): the rule is in
    ``schemas/index/README.md`` ("Metric points"). Keyed by (run_id, metric, step)."""

    __pydantic_config__ = _FORBID

    run_id: str
    metric: str
    step: int
    value: float
    at: Annotated[datetime, Field(description="The time of the progress event that reported the point.")]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeLink:
    __pydantic_config__ = _FORBID

    run_id: str
    resume_of: str


_IMAGES = ("Container images it ran, distinct, in order: the root object's (a Job's containers; a RayJob's head, then "
           "worker groups), then the Rendering intake event's when it differs (at most 8).")
_ENTRYPOINT = ("What it ran: the Job's first container's command and args joined shell-style, or the RayJob's "
               "entrypoint (else the Rendering event's); secrets redacted, at most 2048 characters.")
_HYPER = ("The Rendering intake event's hyperparameters: the first 64 keys in key order, string values cut at 256 "
          "characters, a value under a secret-looking key [redacted].")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """The current summary of a run. Keyed by run_id."""

    __pydantic_config__ = _FORBID

    run_id: str
    kind: str | None
    namespace: str | None
    name: str | None
    uid: str | None
    project: str | None
    workspace: str | None
    target: str | None
    queue: str | None
    cluster_queue: str | None
    status: Status
    reason: str | None
    message: str = ""
    phase: Phase
    attempts: int
    retries: int
    evictions: int
    evictions_by: Annotated[dict[str, int], Field(description=_EVICTIONS_BY)] = dc_field(default_factory=dict)
    created_at: datetime | None
    queued_at: datetime | None
    admitted_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    admission_wait_s: float | None
    pending_reason: str | None = None
    pending_message: str = ""
    git_commit: str | None = None
    config_digest: str | None = None
    config_ref: str | None = None
    input_refs: list[str] = dc_field(default_factory=list)
    output_uri: str | None = None
    resume_of: str | None = None
    last_checkpoint: str | None = None
    # GPU accounting (tracker.core.gpu; the definitions are in schemas/gpu-accounting.md)
    gpus: Annotated[int, Field(ge=0, description="The most GPUs held at once (a run: by any attempt).")] = 0
    gpu_hours: Annotated[float, Field(ge=0, description="GPU-hours held by pods that released them.")] = 0.0
    lost_gpu_hours: Annotated[float, Field(ge=0, description="Of gpu_hours, the GPU-hours lost.")] = 0.0
    lost_gpu_hours_by: Annotated[dict[str, float], Field(description=_LOST_BY)] = dc_field(default_factory=dict)
    gpus_open: Annotated[int, Field(ge=0, description=_OPEN)] = 0
    open_since: Annotated[datetime | None, Field(description="GPU-weighted mean bind time of those pods.")] = None
    # every pending second explained (tracker.core.pending): the attempts' sums, and the span still going on
    pending_s_by: Annotated[dict[str, float], Field(
        description="Seconds of every attempt's ended pending spans by category.")] = dc_field(default_factory=dict)
    pending_category: Annotated[str | None, Field(
        description="The category of the pending span still going on, if any (it runs from pending_since to "
                    "now).")] = None
    pending_since: datetime | None = None
    quota_reserved_at: Annotated[datetime | None, Field(
        description="When Kueue reserved quota for the current attempt (admitted_at: Admitted=True).")] = None
    # the goodput ledger (tracker.core.ledger; the definitions are in schemas/goodput.md)
    ledger_basis: Annotated[Literal["progress", "accounting"], Field(
        description="progress: from the run's step and checkpoint events; accounting: it reported none, so the "
                    "ledger is the GPU accounting's (held - lost productive, lost wasted) and ettr is null.")
                            ] = "accounting"
    ledger_gpu_hours_by: Annotated[dict[str, float], Field(description=_LEDGER_GPU)] = dc_field(default_factory=dict)
    ledger_wall_s_by: Annotated[dict[str, float], Field(description=_LEDGER_WALL)] = dc_field(default_factory=dict)
    ledger_until: Annotated[datetime | None, Field(
        description="The open pods' GPU-time is in the ledger up to this time; a reader adds gpus_open x (now - "
                    "ledger_until) to ledger_open (and the wall time since to ledger_open too).")] = None
    ledger_open: Annotated[str | None, Field(
        description="The category the run is in at ledger_until while it goes on (null when it has ended).")] = None
    ettr: Annotated[float | None, Field(
        description="Effective training time ratio: productive wall time over wall time since queued (null without "
                    "progress events).")] = None
    goodput: Annotated[float | None, Field(
        description="Productive GPU-time over GPU-time held (null when nothing was held).")] = None
    resumed_from: Annotated[str | None, Field(
        description="The checkpoint this run resumed from (a Resume event's, else its first restore's URI).")
                            ] = None
    checkpoints_saved: Annotated[int, Field(ge=0, description="Checkpoints it saved (completed).")] = 0
    # what ran (tracker.core.provenance: where each comes from, the bounds, the redaction); empty before they existed
    images: Annotated[list[str], Field(description=_IMAGES)] = dc_field(default_factory=list)
    entrypoint: Annotated[str | None, Field(description=_ENTRYPOINT)] = None
    hyperparameters: Annotated[dict[str, str | int | float | bool | None], Field(description=_HYPER)
                               ] = dc_field(default_factory=dict)
    hyperparameters_omitted: Annotated[int, Field(ge=0, description="Hyperparameters left out (past the first 64).")
                                       ] = 0



@dataclass(frozen=True, slots=True, kw_only=True)
class RunHistory:
    """Everything known about one run: what the sinks write.

    A complete history (``tracker show -o json``, ``ExperimentIndex.history``, ``Reducer.history``) holds the run's
    metric points and pods. On the transitions topic a run's history leaves both out (``null``): its metric points
    are a record of their own, and so is each of its pods, so that a record's size does not grow with the run's width
    (deploy/kafka/topics.md)."""

    __pydantic_config__ = _FORBID

    run: RunRecord
    transitions: list[Transition]
    attempts: list[Attempt]
    metrics: list[MetricSummary]
    resume_links: list[ResumeLink]
    metric_points: Annotated[list[MetricPoint] | None, Field(
        description="The metrics' curves, bounded and downsampled per run (by metric, then step); null where they "
                    "are a record of their own (the transitions topic).")] = None
    pods: Annotated[list[PodPlacement] | None, Field(
        description="The run's pods, by attempt, then creation time and name; null where each pod is a record of "
                    "its own (the transitions topic).")] = None
    checkpoints: Annotated[list[CheckpointRecord], Field(
        description="Its checkpoint saves and restores, by start time (bounded: schemas/goodput.md).")
                           ] = dc_field(default_factory=list)
    ledger: Annotated[list[LedgerSpan], Field(
        description="Its wasted progress, infrastructure recovery and checkpoint restore spans, in time order.")
                      ] = dc_field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryUpdate:
    """What changed in one run: its history, its metric points, its pods; what the sinks write.

    The reducer makes one per changed run at each flush: ``history`` (without metric points and pods; None when it is
    the one the run's previous update held: a change of a pod that moved nothing of the run's own history),
    ``points``, the metric points that were added or changed (None: none), ``removed_points``, the (metric, step) of
    the points no longer kept (downsampling dropped them), ``pods``, the pod rows that changed, and ``removed_pods``,
    the uids of pods that are no longer the run's (a root that lost the run id to another took them along).
    ``full``: ``pods`` and ``points`` hold all of the run's, and a sink drops any other row it holds for the run (the
    first update of a run the reducer did not know, or restored). ``points_full``: ``points`` holds all of the run's
    points (the sink drops its others), its pods changed as ``pods`` says. So what an update carries grows with what
    changed, not with the run's width or its points. A sink reading the transitions topic, where each part is a record
    of its own, makes updates that hold only some of the parts (``history`` None: unchanged)."""

    run_id: str
    history: RunHistory | None = None
    points: list[MetricPoint] | None = None
    pods: tuple[PodPlacement, ...] = ()
    removed_pods: tuple[str, ...] = ()
    removed_points: tuple[tuple[str, int], ...] = ()
    full: bool = False
    points_full: bool = False

    @classmethod
    def of(cls, document: RunHistory) -> HistoryUpdate:
        """The update that writes a complete history (its metric points and pods, all of them)."""
        return cls(run_id=document.run.run_id, history=replace(document, metric_points=None, pods=None),
                   points=list(document.metric_points or ()), pods=tuple(document.pods or ()), full=True)

    def then(self, later: HistoryUpdate) -> HistoryUpdate:
        """This update followed by a later one of the same run, as one update."""
        if later.run_id != self.run_id:
            raise ValueError(f"updates of two runs ({self.run_id!r}, {later.run_id!r}) do not combine")
        if later.full:
            pods = {p.uid: p for p in later.pods}
            removed = set(self.removed_pods) | {p.uid for p in self.pods}
        else:
            pods = {p.uid: p for p in self.pods}
            removed = set(self.removed_pods)
            for uid in later.removed_pods:
                pods.pop(uid, None)
            removed |= set(later.removed_pods)
            pods.update((p.uid, p) for p in later.pods)
        points, gone, points_full = self._points_then(later)
        full = self.full or later.full
        return HistoryUpdate(run_id=self.run_id, history=later.history or self.history, points=points,
                             pods=tuple(pods[u] for u in sorted(pods)), removed_pods=tuple(sorted(removed - set(pods))),
                             removed_points=gone, full=full, points_full=points_full and not full)

    def _points_then(self, later: HistoryUpdate) -> tuple[list[MetricPoint] | None, tuple[tuple[str, int], ...], bool]:
        whole = self.full or self.points_full
        if later.full or later.points_full:
            kept = {(p.metric, p.step): p for p in later.points or ()}
            gone = set(self.removed_points) | {(p.metric, p.step) for p in self.points or ()}
            whole = True
        else:
            kept = {(p.metric, p.step): p for p in self.points or ()}
            for key in later.removed_points:
                kept.pop(key, None)
            gone = set(self.removed_points) | set(later.removed_points)
            kept.update(((p.metric, p.step), p) for p in later.points or ())
        points = [kept[k] for k in sorted(kept)] if kept or whole or self.points is not None else None
        return points, () if whole else tuple(sorted(gone - set(kept))), whole

    def document(self) -> RunHistory:
        """The complete history, of a ``full`` update with its history."""
        assert self.history is not None and self.full, "only a full update with its history is a whole history"
        return replace(self.history, metric_points=list(self.points or ()), pods=sorted(self.pods, key=pod_order))


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricPointsRecord:
    """A run's complete set of metric points, as the transitions topic carries it (a record of its own)."""

    __pydantic_config__ = _FORBID

    run_id: str
    metric_points: list[MetricPoint]


HISTORY_SCHEMA = "taugrid.io/run-history/v5"
POD_SCHEMA = "taugrid.io/pod-placement/v1"
METRIC_POINTS_SCHEMA = "taugrid.io/metric-points/v1"  # a run's every point in one record: older trackers' (still read)
METRIC_POINT_SCHEMA = "taugrid.io/metric-point/v1"  # one point a record (kind point)

_T = TypeVar("_T")


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def adapter(cls: type[_T]) -> TypeAdapter[_T]:
    """The pydantic adapter of a row class (built once, on first use: readers that never validate never pay)."""
    found = _ADAPTERS.get(cls)
    if found is None:
        from pydantic import Field, TypeAdapter

        # the rows' annotations name Field (strings until pydantic resolves them in this module's namespace)
        globals()["Field"] = Field
        found = _ADAPTERS[cls] = TypeAdapter(cls)
    return cast("TypeAdapter[_T]", found)


def load(cls: type[_T], data: Any) -> _T:
    """Validate plain data (JSON values, or an index row's columns) as a ``cls``; pydantic's ValidationError (a
    ValueError) when it is not one."""
    return adapter(cls).validate_python(data)


def load_json(cls: type[_T], data: bytes | str) -> _T:
    """Validate JSON text as a ``cls``."""
    return adapter(cls).validate_json(data)


def field_names(cls: type[Any]) -> tuple[str, ...]:
    """A row class's fields, in order (the columns of its table in the experiment index)."""
    return tuple(f.name for f in fields(cls))


def to_json(value: Any) -> Any:
    """A row (or a history) as JSON values: times as ISO-8601 UTC strings with a Z, enums as their values."""
    return adapter(type(value)).dump_python(value, mode="json")
