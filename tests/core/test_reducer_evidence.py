"""Events are a fallback source of reasons, used only when the objects' status says nothing."""

from __future__ import annotations

import copy
import json
from typing import Any

from tracker.core.reducer import Reducer

JOB: dict[str, Any] = {
    "apiVersion": "batch/v1", "kind": "Job",
    "metadata": {"name": "train", "namespace": "team-a", "uid": "job-1", "creationTimestamp": "2026-08-20T10:00:00Z",
                 "labels": {"taugrid.io/run-id": "run-1", "kueue.x-k8s.io/queue-name": "team-a-lq"}},
    "spec": {"parallelism": 1, "suspend": True}, "status": {},
}
WORKLOAD: dict[str, Any] = {
    "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
    "metadata": {"name": "job-train-1a2b3", "namespace": "team-a", "uid": "wl-1",
                 "creationTimestamp": "2026-08-20T10:00:01Z",
                 "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-1",
                                      "controller": True}]},
    "spec": {"queueName": "team-a-lq"}, "status": {},
}


def event(reason: str, message: str, last: str, count: int, uid: str = "ev-1") -> dict[str, Any]:
    return {"type": "MODIFIED", "object": {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"job-train-1a2b3.{uid}", "namespace": "team-a", "uid": uid,
                     "creationTimestamp": "2026-08-20T10:00:02Z"},
        "involvedObject": {"kind": "Workload", "name": "job-train-1a2b3", "namespace": "team-a", "uid": "wl-1"},
        "reason": reason, "message": message, "type": "Warning", "source": {"component": "kueue-admission"},
        "firstTimestamp": "2026-08-20T10:00:02Z", "lastTimestamp": last, "count": count}}


def test_a_pending_event_explains_an_admission_wait_when_the_workload_status_is_silent() -> None:
    red = Reducer()
    red.apply(event("Pending", "couldn't assign flavors: 4 more needed", "2026-08-20T10:04:02Z", 3), "e")
    red.apply({"type": "ADDED", "object": WORKLOAD}, "w")
    red.apply({"type": "ADDED", "object": JOB}, "j")
    red.apply(event("Pending", "couldn't assign flavors: 2 more needed", "2026-08-20T10:08:02Z", 5), "e")
    h = red.history("run-1")
    assert h is not None
    assert (h.run.status, h.run.phase, h.run.reason) == ("pending", "Admission", "Pending")
    assert h.run.message == "couldn't assign flavors: 2 more needed"


def test_the_workload_condition_wins_over_events() -> None:
    red = Reducer()
    wl = dict(WORKLOAD, status={"conditions": [
        {"type": "QuotaReserved", "status": "False", "reason": "Inadmissible",
         "message": "LocalQueue team-a-lq doesn't exist", "lastTransitionTime": "2026-08-20T10:00:02Z"}]})
    for rec in ({"type": "ADDED", "object": JOB}, {"type": "ADDED", "object": wl},
                event("Pending", "insufficient quota", "2026-08-20T10:08:02Z", 5)):
        red.apply(rec, "t")
    h = red.history("run-1")
    assert h is not None and (h.run.reason, h.run.message) == ("Inadmissible", "LocalQueue team-a-lq doesn't exist")
    assert h.run.pending_reason == "Inadmissible"


# ------------------------------------------------------------------------------------------ malformed deletions

RAYJOB: dict[str, Any] = {
    "apiVersion": "ray.io/v1", "kind": "RayJob",
    "metadata": {"name": "rl", "namespace": "team-a", "uid": "rayjob-1", "creationTimestamp": "2026-08-20T10:00:00Z",
                 "labels": {"taugrid.io/run-id": "run-ray", "kueue.x-k8s.io/queue-name": "team-a-lq"}},
    "spec": {"rayClusterSpec": {"workerGroupSpecs": [{"replicas": 2}]}},
    "status": {"startTime": "2026-08-20T10:01:00Z", "rayClusterName": "rl-abcde",
               "jobDeploymentStatus": "Running"},
}
RAY_WORKLOAD: dict[str, Any] = {
    "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
    "metadata": {"name": "rayjob-rl-1a2b3", "namespace": "team-a", "uid": "wl-ray",
                 "creationTimestamp": "2026-08-20T10:00:01Z",
                 "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "rl", "uid": "rayjob-1",
                                      "controller": True}]},
    "spec": {"queueName": "team-a-lq"},
    "status": {"conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                               "message": "Quota reserved", "lastTransitionTime": "2026-08-20T10:00:30Z"}],
               "admission": {"clusterQueue": "gpu-cq"}},
}


def _deleted_with_bad_timestamp(obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    bad = copy.deepcopy(obj)
    bad["metadata"]["deletionTimestamp"] = "not a time"
    bad["status"] = status
    return {"type": "DELETED", "object": bad}


def test_a_malformed_deletion_timestamp_is_a_dead_letter_and_merges_nothing() -> None:
    """extract validates a whole object before it merges any of it: a DELETED RayJob or Workload whose
    deletionTimestamp does not parse leaves the run's facts exactly as they were."""
    red = Reducer()
    red.apply({"type": "ADDED", "object": RAYJOB}, "r")
    red.apply({"type": "ADDED", "object": RAY_WORKLOAD}, "w")
    before = json.dumps(red.runs["run-ray"].to_json(), sort_keys=True)
    # a new deployment, a Ray app start and a terminal state in the status of the deleted RayJob
    red.apply(_deleted_with_bad_timestamp(RAYJOB, {
        "startTime": "2026-08-20T10:30:00Z", "rayClusterName": "rl-fghij", "failed": 1,
        "jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "endTime": "2026-08-20T10:40:00Z",
        "rayJobInfo": {"startTime": "2026-08-20T10:31:00Z"}}), "r")
    # an eviction, a new admission and eviction counts in the status of the deleted Workload
    red.apply(_deleted_with_bad_timestamp(RAY_WORKLOAD, {
        "conditions": [{"type": "Evicted", "status": "True", "reason": "Preempted", "message": "preempted",
                        "lastTransitionTime": "2026-08-20T10:20:00Z"},
                       {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "waiting",
                        "lastTransitionTime": "2026-08-20T10:21:00Z"}],
        "schedulingStats": {"evictions": [{"reason": "Preempted", "underlyingCause": "", "count": 1}]}}), "w")
    out = red.flush()
    assert [(d.reason, "deletionTimestamp" in d.detail) for d in out.dead_letters] == [
        ("malformed RayJob", True), ("malformed Workload", True)]
    assert json.dumps(red.runs["run-ray"].to_json(), sort_keys=True) == before
