"""Wire models of the tracker: what comes in (intake events), what goes out (history rows).

Everything here is a plain value: pydantic v2 models for anything that crosses a process boundary, so
that the JSON Schemas under ``schemas/`` are generated from exactly these classes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracker.core.redact import redact_inline, redact_text

INTAKE_SCHEMA = "taugrid.io/intake/v1"

# TauGrid's own labels and annotations on Jobs / RayJobs (rendered by the `tau` CLI).
LABEL_RUN_ID = "taugrid.io/run-id"
LABEL_PROJECT = "taugrid.io/project"
LABEL_WORKSPACE = "taugrid.io/workspace"
LABEL_TARGET = "taugrid.io/target"
TAUGRID_ANNOTATION_PREFIX = "taugrid.io/"  # the annotations of a root the reducer keeps
ANN_RESUME_OF = "taugrid.io/resume-of"
ANN_GIT_COMMIT = "taugrid.io/git-commit"
ANN_CONFIG_DIGEST = "taugrid.io/config-digest"
ANN_CONFIG_REF = "taugrid.io/config-ref"
ANN_INPUT_REFS = "taugrid.io/input-refs"
ANN_OUTPUT = "taugrid.io/storage-output"

# Kueue / batch / KubeRay identifiers read by the correlator and reducer.
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
LABEL_JOB_UID = "kueue.x-k8s.io/job-uid"
LABEL_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
LABEL_RAY_CLUSTER = "ray.io/cluster"
LABEL_RAY_NODE_TYPE = "ray.io/node-type"


class Phase(StrEnum):
    """The seven lifecycle phases, in order."""

    RESOLUTION = "Resolution"
    RENDERING = "Rendering"
    ADMISSION = "Admission"
    SCHEDULING = "Scheduling"
    RUNTIME = "Runtime"
    PROGRESS = "Progress"
    COMPLETION = "Completion"


class Status(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


FINAL_STATUSES = frozenset({Status.SUCCEEDED, Status.FAILED, Status.STOPPED})


def utc(ts_us: int | None) -> datetime | None:
    """Microseconds since the epoch to an aware UTC datetime (None stays None); exact, in integers (through a float
    the microseconds of a time near year 1 or 9999 are lost, and the last of year 9999 rounds up into year 10000)."""
    if ts_us is None:
        return None
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
# Intake events: what TauGrid's `tau` CLI and the training process report, outside the Kubernetes API.


class _Intake(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: Literal["taugrid.io/intake/v1"] = Field(alias="schema", description="Schema id and version.")
    event_id: str = Field(min_length=1, max_length=256, description="Unique id; repeats are ignored.")
    run_id: str = Field(min_length=1, max_length=253, description="The run (taugrid.io/run-id label value).")
    at: datetime = Field(description="When it happened, by the reporter's clock (RFC 3339 with offset).")


class ResolutionEvent(_Intake):
    """`tau` resolved project, workspace and target for a run (or failed to)."""

    kind: Literal["Resolution"]
    status: Literal["started", "succeeded", "failed"]
    project: str | None = None
    workspace: str | None = None
    target: str | None = None
    git_commit: str | None = None
    config_digest: str | None = None
    config_ref: str | None = None
    input_refs: list[str] = Field(default_factory=list)
    reason: str | None = None
    message: str | None = Field(default=None, max_length=4096)


class RenderingEvent(_Intake):
    """`tau` rendered the workload (Job or RayJob) and submitted it, or validation failed."""

    kind: Literal["Rendering"]
    status: Literal["started", "succeeded", "failed"]
    workload_kind: Literal["Job", "RayJob"] | None = None
    namespace: str | None = None
    name: str | None = None
    queue: str | None = None
    output_uri: str | None = Field(default=None, description="storage.output location of the run.")
    reason: str | None = None
    message: str | None = Field(default=None, max_length=4096)


class ProgressEvent(_Intake):
    """The training process reports a step with metric points (and optionally a checkpoint)."""

    kind: Literal["Progress"]
    step: int = Field(ge=0, le=2**63 - 1, description="Training step: a signed 64-bit integer, as stored.")
    metrics: dict[str, Annotated[float, Field(allow_inf_nan=False)]] = Field(default_factory=dict, max_length=256)
    checkpoint_uri: str | None = None


IntakeEvent = Annotated[ResolutionEvent | RenderingEvent | ProgressEvent, Field(discriminator="kind")]


class IntakeEnvelope(BaseModel):
    """Wrapper used to validate one intake event of any kind."""

    event: IntakeEvent


# --------------------------------------------------------------------------------------------------
# Output: the run history, as written to the experiment index and to Azure Data Explorer.


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Transition(_Row):
    """One phase entry of one attempt of a run. Keyed by (run_id, attempt, phase).

    Completion is the last entry of a finished run, or of an attempt stopped by a Kueue deactivation that a
    reactivation later undid (the run is then in Completion until the next attempt's Admission)."""

    run_id: str
    attempt: int = Field(ge=1)
    phase: Phase
    at: datetime
    reason: str = Field(description="Machine-readable cause, e.g. Queued, Admitted, Preempted, Reactivated, OOMKilled.")
    message: str = ""
    source: str = Field(description="Object that evidences it, as Kind/namespace/name.")


class PodFailure(_Row):
    pod: str
    at: datetime | None
    reason: str
    exit_code: int | None = None
    message: str = ""


class PodPlacement(_Row):
    pod: str
    node: str | None
    created_at: datetime | None
    scheduled_at: datetime | None
    finished_at: datetime | None
    gpus: int = Field(default=0, ge=0, description="GPUs the pod requested (schemas/gpu-accounting.md).")
    released_at: datetime | None = Field(default=None, description="When the pod stopped holding its GPUs.")
    gpu_hours: float | None = Field(default=0.0, description="GPU-hours held from bind to release; null while the "
                                                             "pod still holds its GPUs.")
    lost: str | None = Field(default=None, description="Why its GPU-time was lost (schemas/gpu-accounting.md), "
                                                       "null if it was not.")


class Attempt(_Row):
    """One admission (or RayJob retry) of a run. Keyed by (run_id, attempt)."""

    run_id: str
    attempt: int = Field(ge=1)
    trigger: str = Field(description="Why this attempt began: Submitted, a Kueue eviction reason (a deactivation "
                                     "when the Workload was reactivated), RayJobRetry.")
    queued_at: datetime | None
    admitted_at: datetime | None
    scheduled_at: datetime | None
    started_at: datetime | None
    progress_at: datetime | None
    ended_at: datetime | None
    end_reason: str | None = Field(description="Eviction or terminal reason that ended the attempt.")
    end_message: str = ""
    underlying_cause: str | None = None
    admission_wait_s: float | None
    cluster_queue: str | None = None
    ray_cluster: str | None = None
    retries: int = Field(ge=0, description="Pod failures the Job replaced within this attempt.")
    failures: list[PodFailure] = Field(default_factory=list)
    pods: list[PodPlacement] = Field(default_factory=list)
    # GPU accounting (tracker.core.gpu; the definitions are in schemas/gpu-accounting.md)
    gpus: int = Field(default=0, ge=0, description="The most GPUs held at once (a run: by any attempt).")
    gpu_hours: float = Field(default=0.0, ge=0, description="GPU-hours held by pods that released them.")
    lost_gpu_hours: float = Field(default=0.0, ge=0, description="Of gpu_hours, the GPU-hours lost.")
    lost_gpu_hours_by: dict[str, float] = Field(default_factory=dict,
                                                description="lost_gpu_hours by reason (PodFailure, PodEvicted, "
                                                            "Preempted, PodsReadyTimeout, Evicted, RayJobRetry, "
                                                            "RunFailed).")
    gpus_open: int = Field(default=0, ge=0, description="GPUs still held by pods that have not released them: "
                                                        "held at time T = gpu_hours + gpus_open x (T - open_since).")
    open_since: datetime | None = Field(default=None, description="GPU-weighted mean bind time of those pods.")


class MetricSummary(_Row):
    run_id: str
    metric: str
    first_step: int
    first_value: float
    latest_step: int
    latest_value: float
    min_value: float
    max_value: float
    points: int


class MetricPoint(_Row):
    """One point of a training metric's curve, as the run reported it. A run keeps a bounded, downsampled set of
    its points (at most ``reduce.metric_points_per_run`` over all its metrics, default 512): the rule is in
    ``schemas/index/README.md`` ("Metric points"). Keyed by (run_id, metric, step)."""

    run_id: str
    metric: str
    step: int
    value: float
    at: datetime = Field(description="The time of the progress event that reported the point.")


class ResumeLink(_Row):
    run_id: str
    resume_of: str


class RunRecord(_Row):
    """The current summary of a run. Keyed by run_id."""

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
    input_refs: list[str] = Field(default_factory=list)
    output_uri: str | None = None
    resume_of: str | None = None
    last_checkpoint: str | None = None
    # GPU accounting (tracker.core.gpu; the definitions are in schemas/gpu-accounting.md)
    gpus: int = Field(default=0, ge=0, description="The most GPUs held at once (a run: by any attempt).")
    gpu_hours: float = Field(default=0.0, ge=0, description="GPU-hours held by pods that released them.")
    lost_gpu_hours: float = Field(default=0.0, ge=0, description="Of gpu_hours, the GPU-hours lost.")
    lost_gpu_hours_by: dict[str, float] = Field(default_factory=dict,
                                                description="lost_gpu_hours by reason (PodFailure, PodEvicted, "
                                                            "Preempted, PodsReadyTimeout, Evicted, RayJobRetry, "
                                                            "RunFailed).")
    gpus_open: int = Field(default=0, ge=0, description="GPUs still held by pods that have not released them: "
                                                        "held at time T = gpu_hours + gpus_open x (T - open_since).")
    open_since: datetime | None = Field(default=None, description="GPU-weighted mean bind time of those pods.")


EXCERPT_MAX = 2048  # characters of a dead letter's excerpt


class DeadLetter(_Row):
    """An input the tracker could not use, with the reason. Nothing else is affected.

    It keeps what identifies the record and never a secret: whoever makes one, the excerpt and the detail are
    redacted when it is made (``tracker.core.redact``: values of secret-looking keys, environment variable values,
    token-like annotation values, credentials inside text), and the identity is read from the excerpt when it is
    not given."""

    source: str = Field(description="Where the record was: path:line of a capture, topic/partition@offset, a watch.")
    reason: str
    detail: str = ""
    identity: dict[str, str] = Field(
        default_factory=dict,
        description="What identifies the record, as far as it could be read: kind, apiVersion, namespace, name, uid, "
                    "resourceVersion of an object; kind, run_id, event_id of an intake event.")
    excerpt: str = Field(default="", max_length=EXCERPT_MAX,
                         description="The record's JSON (or the text that did not parse), redacted, cut at 2048 "
                                     "characters.")

    @model_validator(mode="before")
    @classmethod
    def _redact(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        given = data.get("identity")
        if isinstance(given, dict) and given:
            data["identity"] = {str(k): redact_inline(str(v)) for k, v in given.items()}
        excerpt = data.get("excerpt")
        if isinstance(excerpt, str):
            red = redact_text(excerpt)
            data["excerpt"] = red.text[:EXCERPT_MAX]
            if not given:
                data["identity"] = red.identity  # redacted already
        for name in ("detail", "reason"):
            if isinstance(data.get(name), str):
                data[name] = redact_inline(data[name])
        return data


class RunHistory(_Row):
    """Everything known about one run: what the sinks write."""

    run: RunRecord
    transitions: list[Transition]
    attempts: list[Attempt]
    metrics: list[MetricSummary]
    resume_links: list[ResumeLink]
    metric_points: list[MetricPoint] = Field(
        default_factory=list, description="The metrics' curves, bounded and downsampled per run (by metric, then "
                                          "step); absent from histories written before they were kept.")


def schema_documents() -> dict[str, dict[str, Any]]:
    """The JSON Schemas published under ``schemas/`` (path relative to schemas/ -> schema)."""
    from pydantic import TypeAdapter

    from tracker.core import stuck  # it builds on this module

    intake = TypeAdapter(IntakeEvent).json_schema()
    intake["$id"] = INTAKE_SCHEMA
    intake["title"] = "TauGrid intake event"
    return {
        "intake/v1.schema.json": intake,
        "history/v1.schema.json": RunHistory.model_json_schema() | {"$id": "taugrid.io/run-history/v1"},
        "dead-letter/v1.schema.json": DeadLetter.model_json_schema() | {"$id": "taugrid.io/dead-letter/v1"},
        **stuck.schema_documents(),
    }
