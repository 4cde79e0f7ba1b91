"""Intake events: what TauGrid's `tau` CLI and the training process report, outside the Kubernetes API.

pydantic models (they cross a process boundary, and ``schemas/intake/v2.schema.json`` is generated from them:
``tracker.schemas``); the reducer validates each as it folds it (``IntakeEnvelope``) and dead-letters what does not
validate. A v1 event is read as it is; v2 added checkpoint saves and restores and resumption, and later (compatibly:
optional fields) a Rendering event's image, entrypoint and hyperparameters.
``tracker.core.model`` re-exports every name here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

URI_MAX = 2048  # characters of a checkpoint URI
# a hyperparameter's value: a JSON scalar (a string of at most 64 KiB, a finite number, a boolean, null)
Hyperparameter = Annotated[str, Field(max_length=65536)] | bool | Annotated[int, Field(ge=-(2**63), le=2**63 - 1)] \
    | Annotated[float, Field(allow_inf_nan=False)] | None


class _Intake(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: Literal["taugrid.io/intake/v1", "taugrid.io/intake/v2"] = Field(
        alias="schema", description="Schema id and version (v1 events are read as they are).")
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
    # what ran (tracker.core.provenance; added to v2 compatibly: optional, and an event without them is as before)
    image: str | None = Field(default=None, max_length=4096, description="The container image rendered.")
    entrypoint: str | None = Field(default=None, max_length=65536, description=(
        "The command line rendered (command and args joined shell-style, or a RayJob's entrypoint)."))
    hyperparameters: dict[Annotated[str, Field(min_length=1, max_length=1024)], Hyperparameter] | None = Field(
        default=None, max_length=4096, description=(
            "The run's hyperparameters as a flat map of scalars (nested config flattened by the sender, e.g. "
            "optim.lr). The tracker keeps the first 64 keys in key order and cuts string values at 256 characters; "
            "a value under a secret-looking key is kept as [redacted]."))


class ProgressEvent(_Intake):
    """A step record: the training process reached ``step`` at ``at`` (the time the step starts), with metric
    points; optionally a checkpoint of that step completed then (v1's way; v2 reports saves with
    ``CheckpointSave`` events, which give their duration)."""

    kind: Literal["Progress"]
    step: int = Field(ge=0, le=2**63 - 1, description="Training step: a signed 64-bit integer, as stored.")
    metrics: dict[str, Annotated[float, Field(allow_inf_nan=False)]] = Field(default_factory=dict, max_length=256)
    checkpoint_uri: str | None = None  # unbounded, as v1 published it


class _IntakeV2(_Intake):
    schema_: Literal["taugrid.io/intake/v2"] = Field(alias="schema", description="Schema id and version.")


class CheckpointSaveEvent(_IntakeV2):
    """The training process began (``started``), finished (``completed``) or gave up (``failed``) saving a
    checkpoint of a step. ``at`` is when; the save's blocking time is from ``started`` to ``completed``/``failed``
    (schemas/goodput.md). The two events of one save share step and URI."""

    kind: Literal["CheckpointSave"]
    phase: Literal["started", "completed", "failed"]
    step: int = Field(ge=0, le=2**63 - 1, description="The training step the checkpoint holds.")
    uri: str = Field(min_length=1, max_length=URI_MAX, description="Where the checkpoint is written.")
    bytes: int | None = Field(default=None, ge=0, le=2**63 - 1, description="Its size, when known (completed).")


class CheckpointRestoreEvent(_IntakeV2):
    """The training process began (``started``), finished (``completed``) or gave up (``failed``) restoring a
    checkpoint; the step it restores is where training goes on from (progress after it is wasted)."""

    kind: Literal["CheckpointRestore"]
    phase: Literal["started", "completed", "failed"]
    step: int = Field(ge=0, le=2**63 - 1, description="The training step the checkpoint holds.")
    uri: str = Field(min_length=1, max_length=URI_MAX, description="Where the checkpoint is read from.")


class ResumeEvent(_IntakeV2):
    """This run resumes another run (its lineage): from which run, and from which of its checkpoints when known.
    The root's ``taugrid.io/resume-of`` annotation, when set, names the run instead."""

    kind: Literal["Resume"]
    resume_of: str = Field(min_length=1, max_length=253, description="The run id resumed.")
    checkpoint_uri: str | None = Field(default=None, max_length=URI_MAX)
    step: int | None = Field(default=None, ge=0, le=2**63 - 1)


IntakeEvent = Annotated[ResolutionEvent | RenderingEvent | ProgressEvent | CheckpointSaveEvent |
                        CheckpointRestoreEvent | ResumeEvent, Field(discriminator="kind")]


class IntakeEnvelope(BaseModel):
    """Wrapper used to validate one intake event of any kind."""

    event: IntakeEvent
