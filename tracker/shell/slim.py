"""Cut a watched object down to the fields the reducer reads, before it is published.

A Pod as the API returns it is 5-20 KB (managedFields, the whole pod spec, volumes, env); the reducer reads a
few hundred bytes of it. Every published record is slimmed here by a declarative *shape* per kind: a key
mapped to ``True`` is copied verbatim, to a dict is projected recursively, and to a one-element list
projects every element of a list. The shapes mirror what ``tracker.core.extract`` and
``tracker.core.correlate`` read, and ``tests/watch/test_watch_unit.py`` proves that folding slimmed objects gives
the same histories as folding the originals.

A value of an unexpected type is copied as it is, so that a malformed object stays malformed and the
reducer dead-letters it with its reason instead of this module hiding the problem.

The slimmed object's free text is redacted (``tracker.core.redact.redact_object``: messages, reasons, notes,
eviction causes, annotation and label values; README "What is redacted"), with the same rules the extractor reads
it with: what the watcher publishes on the objects topic, keeps in its checkpoint, and what a replay folds and
holds, never carries a credential the object's text had. Redaction is idempotent, so folding a slimmed object
still gives the history folding the original gives.

Pure functions only: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracker.core.correlate import ROOT_KINDS
from tracker.core.model import LABEL_CONTROLLER_UID, LABEL_JOB_UID, LABEL_RAY_CLUSTER, LABEL_RAY_NODE_TYPE
from tracker.core.nodes import NODE_LABELS
from tracker.core.redact import redact_intake, redact_object

Shape = Mapping[str, Any]  # key -> True | Shape | [Shape]

#: Annotations of a root kept in records: TauGrid's own (provenance the history reports).
ROOT_ANNOTATION_PREFIX = "taugrid.io/"
#: Labels of a non-root object kept in records: the ones correlation and the reducer read.
CHILD_LABELS = frozenset({LABEL_CONTROLLER_UID, LABEL_JOB_UID, LABEL_RAY_CLUSTER, LABEL_RAY_NODE_TYPE})

_CONDITIONS = [{"type": True, "status": True, "reason": True, "message": True, "lastTransitionTime": True}]
_OWNERS = [{"apiVersion": True, "kind": True, "name": True, "uid": True, "controller": True}]
META_SHAPE: Shape = {  # an object's metadata (labels and annotations: ``_metadata``)
    "name": True, "namespace": True, "uid": True, "resourceVersion": True, "creationTimestamp": True,
    "deletionTimestamp": True, "deletionGracePeriodSeconds": True, "ownerReferences": _OWNERS,
}
_REF = {"apiVersion": True, "kind": True, "name": True, "namespace": True, "uid": True}

_FLAVOR_TOTALS = [{"name": True, "resources": [{"name": True, "total": True}]}]
_QUEUE_STATUS: Shape = {"pendingWorkloads": True, "reservingWorkloads": True, "admittedWorkloads": True,
                        "flavorsReservation": _FLAVOR_TOTALS, "conditions": _CONDITIONS}

# A root's pod templates: what ran (tracker.core.provenance), redacted by redact_object (COMMAND_KEYS)
_TEMPLATE: Shape = {"spec": {"containers": [{"image": True, "command": True, "args": True}]}}

SHAPES: Mapping[str, Shape] = {
    "Job": {
        "spec": {"parallelism": True, "completions": True, "template": _TEMPLATE},
        "status": {"conditions": _CONDITIONS, "failed": True, "startTime": True, "completionTime": True},
    },
    "RayJob": {
        "spec": {"entrypoint": True, "rayClusterSpec": {
            "headGroupSpec": {"template": _TEMPLATE},
            "workerGroupSpecs": [{"replicas": True, "numOfHosts": True, "template": _TEMPLATE}]}},
        "status": {
            "startTime": True, "endTime": True, "completionTime": True, "rayClusterName": True, "failed": True,
            "rayJobInfo": {"startTime": True, "endTime": True}, "jobDeploymentStatus": True, "jobStatus": True,
            "reason": True, "message": True,
        },
    },
    "Workload": {
        "spec": {"queueName": True},
        "status": {
            "conditions": _CONDITIONS, "admission": {"clusterQueue": True},
            "schedulingStats": {"evictions": [{"reason": True, "underlyingCause": True, "count": True}]},
            # two-phase admission: each AdmissionCheck's state (Kueue adds the entries, the check's controller moves
            # them) and the requeue backoff Kueue keeps after a PodsReady timeout or a Retry check
            "admissionChecks": [{"name": True, "state": True, "message": True, "lastTransitionTime": True,
                                 "requeueAfterSeconds": True, "retryCount": True}],
            "requeueState": {"count": True, "requeueAt": True},
        },
    },
    "Pod": {
        "spec": {"nodeName": True, "containers": [{"name": True, "resources": True}]},
        "status": {
            "phase": True, "reason": True, "message": True, "conditions": _CONDITIONS,
            "containerStatuses": [{
                "name": True,
                "state": {
                    "running": {"startedAt": True},
                    "terminated": {"startedAt": True, "finishedAt": True, "exitCode": True, "reason": True,
                                   "message": True},
                    "waiting": {"reason": True},
                },
            }],
        },
    },
    "RayCluster": {
        "status": {"state": True, "stateTransitionTimes": {"ready": True}, "conditions": _CONDITIONS},
    },
    "Event": {
        "involvedObject": _REF, "regarding": _REF, "reason": True, "type": True, "message": True, "note": True,
        "firstTimestamp": True, "lastTimestamp": True, "eventTime": True, "count": True,
        "series": {"count": True, "lastObservedTime": True}, "deprecatedCount": True,
        "deprecatedFirstTimestamp": True, "deprecatedLastTimestamp": True,
    },
    # Kueue's queues (tracker.core.queues): counts, quota and usage, stop policy, the Active condition
    "ClusterQueue": {
        "spec": {
            "cohort": True, "cohortName": True, "stopPolicy": True, "admissionChecks": True,
            "admissionChecksStrategy": {"admissionChecks": [{"name": True}]},
            "resourceGroups": [{"flavors": [{"name": True, "resources": [
                {"name": True, "nominalQuota": True, "borrowingLimit": True}]}]}],
        },
        "status": {**_QUEUE_STATUS, "flavorsUsage": _FLAVOR_TOTALS},
    },
    "LocalQueue": {
        "spec": {"clusterQueue": True, "stopPolicy": True},
        "status": {**_QUEUE_STATUS, "flavorUsage": _FLAVOR_TOTALS, "flavorsUsage": _FLAVOR_TOTALS},
    },
    # Nodes (tracker.core.nodes): cordon, taints' keys and effects (not values), conditions without their heartbeat
    # (which changes every few seconds); capacity and allocatable are cut to extended resources by ``_node``, labels
    # to NODE_LABELS by ``_metadata``
    "Node": {
        "spec": {"unschedulable": True, "taints": [{"key": True, "effect": True}]},
        "status": {"capacity": True, "allocatable": True, "conditions": _CONDITIONS},
    },
}


def project(value: Any, shape: Shape) -> Any:
    """The parts of ``value`` that ``shape`` names; a non-dict ``value`` is returned as it is."""
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, sub in shape.items():
        if key not in value:
            continue
        v = value[key]
        if sub is True:
            out[key] = v
        elif isinstance(sub, list):
            out[key] = [project(item, sub[0]) for item in v] if isinstance(v, list) else v
        else:
            out[key] = project(v, sub)
    return out


def slim(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` reduced to what the reducer reads, its free text redacted. ``obj`` must carry ``kind`` (one of
    ``SHAPES``)."""
    kind = obj.get("kind")
    shape = SHAPES.get(kind) if isinstance(kind, str) else None
    if shape is None or not isinstance(kind, str):
        raise ValueError(f"no record shape for kind {kind!r}")
    return finish(project(obj, shape), kind, obj.get("apiVersion"), obj.get("metadata"))


def finish(out: dict[str, Any], kind: str, api_version: Any, meta: Any) -> dict[str, Any]:
    """``out`` (an object of ``kind`` projected onto its shape) as ``slim`` returns it: with ``api_version``,
    ``kind`` and the cut of ``meta`` (the object's metadata) after its shape's keys, a Node's resources cut, its free
    text redacted. ``tracker.shell.typed`` finishes the objects its decoder projected with it."""
    out["apiVersion"] = api_version
    out["kind"] = kind
    out["metadata"] = _metadata(meta, root=kind in ROOT_KINDS) if isinstance(meta, dict) else meta
    if kind == "Node":
        _node(out, meta)
    return redact_object(out)


def _node(out: dict[str, Any], meta: Any) -> None:
    """A Node's labels (``meta``'s) cut to ``NODE_LABELS``, its capacity and allocatable to extended resources
    (named with a domain, ``nvidia.com/gpu``: the reducer keeps those it counts as GPUs), in ``out``."""
    labels = meta.get("labels") if isinstance(meta, dict) else None
    if isinstance(labels, dict) and isinstance(out.get("metadata"), dict):
        out["metadata"]["labels"] = {k: v for k, v in labels.items() if k in NODE_LABELS}
    status = out.get("status")
    for key in ("capacity", "allocatable"):
        res = status.get(key) if isinstance(status, dict) else None
        if isinstance(res, dict):
            status[key] = {k: v for k, v in res.items() if isinstance(k, str) and "/" in k}  # type: ignore[index]


def _metadata(meta: dict[str, Any], *, root: bool) -> dict[str, Any]:
    out: dict[str, Any] = project(meta, META_SHAPE)
    labels = meta.get("labels")
    if isinstance(labels, dict):
        out["labels"] = labels if root else {k: v for k, v in labels.items() if k in CHILD_LABELS}
    elif labels is not None:
        out["labels"] = labels
    annotations = meta.get("annotations")
    if root and isinstance(annotations, dict):
        kept = {k: v for k, v in annotations.items() if k.startswith(ROOT_ANNOTATION_PREFIX)}
        if kept:
            out["annotations"] = kept
    elif root and annotations is not None:
        out["annotations"] = annotations
    return out


def slim_event(value: Any) -> Any:
    """A watch event (``{"type", "object"}``) with its object slimmed; an intake event with its free text and URLs
    redacted (``redact.redact_intake``); any other value (a bookmark, an object of no known kind) as it is, for
    the reducer to fold or dead-letter."""
    if not isinstance(value, dict):
        return value
    if "schema" in value:
        return redact_intake(value)
    obj = value.get("object")
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if not isinstance(obj, dict) or not isinstance(kind, str) or kind not in SHAPES:
        return value
    return {**value, "object": slim(obj)}
