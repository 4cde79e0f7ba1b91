"""The tracker's vocabulary: phases, statuses, categories, label and annotation keys, and the reasons the reducer
names. Standard library only, so that every side reads it at no cost: the reducer (through ``tracker.core.model``,
which re-exports it), and the read side (``tracker runs`` starts without pydantic).

Each word is defined here once; the modules that use it import it from here (or from ``tracker.core.model``).
"""

from __future__ import annotations

from enum import StrEnum

# ------------------------------------------------------------------------------------------ intake schemas

INTAKE_SCHEMA = "taugrid.io/intake/v2"
INTAKE_SCHEMA_V1 = "taugrid.io/intake/v1"  # still read: every v1 event is a v2 event with the older schema id
INTAKE_SCHEMAS = frozenset({INTAKE_SCHEMA, INTAKE_SCHEMA_V1})

# ------------------------------------------------------------------------------------------ labels and annotations

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

# ------------------------------------------------------------------------------------------ phases and statuses


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
PHASES: tuple[str, ...] = tuple(p.value for p in Phase)
STATUSES: tuple[str, ...] = tuple(s.value for s in Status)


class PendingCategory(StrEnum):
    """Why an attempt was not running its application yet: each second of an attempt before its containers started
    falls in exactly one (``tracker.core.pending``; the definitions are in README "Every pending second")."""

    QUEUED = "queued"  # queued, not evaluated by Kueue yet (no Workload, or Kueue has not written QuotaReserved)
    QUOTA = "quota"  # Kueue found no quota for it (QuotaReserved=False: Pending, WaitingForQuota, ...)
    PREEMPTION = "preemption"  # Kueue is preempting other workloads to make room for it
    INADMISSIBLE = "inadmissible"  # its queue is stopped or missing, or it exceeds the queue's maximum quota
    BACKOFF = "backoff"  # requeued after an eviction, held back by Kueue's requeue backoff
    ADMISSION_CHECK = "admission-check"  # quota reserved, an admission check not Ready (detail: the check's name)
    POD_CREATION = "pod-creation"  # admitted, its pods (or RayCluster) not created yet
    UNSCHEDULABLE = "unschedulable"  # a pod is unschedulable (PodScheduled=False, FailedScheduling)
    SCHEDULING = "scheduling"  # pods created, not bound yet, nothing says they cannot be
    IMAGE_PULL = "image-pull"  # pods bound, pulling images
    CONTAINER_CREATION = "container-creation"  # pods bound, containers being created (no image pull seen)
    UNEXPLAINED = "unexplained"  # no evidence of why


PENDING_CATEGORIES: tuple[str, ...] = tuple(c.value for c in PendingCategory)


def span_key(category: str, detail: str) -> str:
    """The key a pending span's seconds are summed under (``pending_s_by``): its category; an admission check's by
    its name (``admission-check:<name>``). Here rather than in ``tracker.core.pending`` so that the readers that
    draw pending spans do not import the derivation. Always a plain ``str``: given a ``PendingCategory`` it was the
    enum, which ``compare -o yaml`` could not write (a live run's open span)."""
    return f"{category}:{detail}" if category == PendingCategory.ADMISSION_CHECK and detail else str(category)


class GoodputCategory(StrEnum):
    """Where an instant of a run's time (and the GPU-time held at it) went: each falls in exactly one
    (``tracker.core.ledger``; the definitions are in ``schemas/goodput.md``)."""

    PRODUCTIVE = "productive"  # training progress that was kept
    SCHEDULING = "scheduling"  # before the first step: queued, admission (quota, checks), pods not bound yet
    STARTUP = "startup"  # before the first step: pods bound (image pull, containers, initialization)
    CHECKPOINT_SAVE = "checkpoint-save"  # saving a checkpoint (blocking)
    CHECKPOINT_RESTORE = "checkpoint-restore"  # restoring a checkpoint
    WASTED_PROGRESS = "wasted-progress"  # progress lost: the last checkpoint kept -> the interruption
    INFRASTRUCTURE_RECOVERY = "infrastructure-recovery"  # an interruption -> the next first step
    UNCLASSIFIED = "unclassified"  # no rule says (e.g. GPU-time after the run's end)


GOODPUT_CATEGORIES: tuple[str, ...] = tuple(c.value for c in GoodputCategory)

# ------------------------------------------------------------------------------------------ reasons

# Workload Evicted=True reasons (prefixes) of a deactivation (spec.active=false): Kueue's ``InactiveWorkload`` and
# the ``Deactivated...`` reasons of newer versions. A deactivated run is stopped, unless a reactivation follows.
DEACTIVATION_REASONS = ("InactiveWorkload", "Deactivated")
# Requeued=True/Reactivated: Kueue's workload controller queues a deactivated Workload again after spec.active
# went back to true (pkg/controller/core/workload_controller.go)
REACTIVATED = "Reactivated"
DEACTIVATED_DUE_TO = "DeactivatedDueTo"  # Evicted=True/DeactivatedDueTo<Cause>: Kueue deactivated it itself

# Attempt triggers (``Attempt.trigger``) other than a Kueue eviction or deactivation reason
SUBMITTED = "Submitted"  # the first attempt of a run queued by Kueue
CREATED = "Created"  # the first attempt of a run without Kueue
RAYJOB_RETRY = "RayJobRetry"  # KubeRay retried the RayJob on a new RayCluster (lifecycle.md §4.4)
EVICTION_NOT_OBSERVED = "EvictionNotObserved"  # re-admitted, but the eviction before it was lost to a relist

DELETED = "Deleted"  # the final reason of a run stopped by deleting its Job/RayJob

# Why GPU-time was lost (the keys of ``lost_gpu_hours_by``).
LOST_POD_FAILURE = "PodFailure"  # the pod failed and its attempt replaced it
LOST_POD_EVICTED = "PodEvicted"  # the pod was killed from outside (DisruptionTarget, deleted) and replaced
LOST_PREEMPTED = "Preempted"  # the attempt was preempted by Kueue
LOST_PODS_READY_TIMEOUT = "PodsReadyTimeout"  # the attempt was evicted by Kueue's PodsReady timeout
LOST_EVICTED = "Evicted"  # the attempt was ended by any other Kueue eviction or a deactivation
LOST_RAYJOB_RETRY = "RayJobRetry"  # KubeRay retried the RayJob on a new RayCluster
LOST_RUN_FAILED = "RunFailed"  # the run ended failed: all its GPU-time not lost otherwise
LOST_REASONS = (LOST_POD_FAILURE, LOST_POD_EVICTED, LOST_PREEMPTED, LOST_PODS_READY_TIMEOUT, LOST_EVICTED,
                LOST_RAYJOB_RETRY, LOST_RUN_FAILED)


def is_deactivation(reason: str | None) -> bool:
    """A Workload eviction reason that means the run was deactivated (``spec.active=false``)."""
    return reason is not None and reason.startswith(DEACTIVATION_REASONS)
