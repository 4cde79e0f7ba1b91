"""Values that are an object's current state come from its newest version, whatever order versions arrive in.

A condition's message (Kueue rewrites ``QuotaReserved=False`` messages in place, keeping the transition time), what
a Workload waits for now, a pod's latest scheduling failure and waiting reason, a root's labels and annotations are
kept from the object version with the highest ``metadata.resourceVersion`` (etcd's revision), so a version that
arrives again (a capture replayed into the same index, a Kafka redelivery) or late changes nothing, not even for one
flush. Without a resourceVersion that parses as an integer, the later arrival wins (docs/limits.md).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from sim.scenarios import SCENARIOS
from tests.support.laws import by_object
from tracker.core.extract import resource_version
from tracker.core.facts import RunFacts
from tracker.core.model import ANN_OUTPUT
from tracker.core.reducer import Reducer

T0 = "2026-08-20T10:00:00Z"
JOB: dict[str, Any] = {
    "apiVersion": "batch/v1", "kind": "Job",
    "metadata": {"name": "train", "namespace": "team-a", "uid": "job-1", "creationTimestamp": T0,
                 "labels": {"taugrid.io/run-id": "run-1", "kueue.x-k8s.io/queue-name": "team-a-lq"}},
    "spec": {"parallelism": 1, "suspend": True}, "status": {},
}
WORKLOAD: dict[str, Any] = {
    "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
    "metadata": {"name": "job-train-1a2b3", "namespace": "team-a", "uid": "wl-1", "creationTimestamp": T0,
                 "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-1",
                                      "controller": True}]},
    "spec": {"queueName": "team-a-lq"}, "status": {},
}
POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "train-x1", "namespace": "team-a", "uid": "pod-1", "creationTimestamp": "2026-08-20T10:02:00Z",
                 "labels": {"controller-uid": "job-1"},
                 "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-1",
                                      "controller": True}]},
    "spec": {}, "status": {"phase": "Pending"},
}


def version(obj: dict[str, Any], rv: str | None, **status: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    if rv is not None:
        out["metadata"]["resourceVersion"] = rv
    out["status"] = {**out["status"], **status}
    return {"type": "MODIFIED", "object": out}


def cond(type_: str, status: str, reason: str, message: str, when: str = "2026-08-20T10:00:01Z") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": when}


def waiting(rv: str | None, message: str) -> dict[str, Any]:
    """A Workload waiting for quota, its QuotaReserved=False message rewritten in place (same transition time)."""
    return version(WORKLOAD, rv, conditions=[cond("QuotaReserved", "False", "Pending", message)])


ADMITTED = [cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue gpu-cq",
                 "2026-08-20T10:01:00Z"),
            cond("Admitted", "True", "Admitted", "The workload is admitted", "2026-08-20T10:01:00Z")]


def fold(*records: dict[str, Any]) -> Reducer:
    red = Reducer()
    red.apply({"type": "ADDED", "object": JOB}, "t")
    for rec in records:
        red.apply(rec, "t")
    return red


def run(red: Reducer) -> tuple[str, str | None, str]:
    h = red.history("run-1")
    assert h is not None
    return h.run.phase.value, h.run.reason, h.run.message


@pytest.mark.parametrize("order", [(0, 1), (1, 0), (0, 1, 0), (1, 0, 1, 0)])
def test_a_message_rewritten_in_place_is_the_newest_versions(order: tuple[int, ...]) -> None:
    versions = [waiting("10", "8 more needed"), waiting("11", "2 more needed")]
    red = fold(*(versions[i] for i in order))
    assert run(red) == ("Admission", "Pending", "2 more needed")
    assert red.runs["run-1"].wl_conds[("QuotaReserved", "False", "Pending", 1787220001000000)] == "2 more needed"


def test_an_older_waiting_version_does_not_bring_the_wait_back() -> None:
    red = fold(waiting("10", "8 more needed"), version(WORKLOAD, "12", conditions=ADMITTED))
    assert red.runs["run-1"].wl_pending is None
    red.apply(waiting("10", "8 more needed"), "again")
    assert red.runs["run-1"].wl_pending is None
    assert run(red)[0] == "Scheduling"


def test_a_pods_scheduling_failure_and_waiting_reason_are_the_newest_versions() -> None:
    def unschedulable(rv: str, message: str) -> dict[str, Any]:
        return version(POD, rv, conditions=[
            cond("PodScheduled", "False", "Unschedulable", message, "2026-08-20T10:02:01Z")])

    admitted = version(WORKLOAD, "12", conditions=ADMITTED)
    newest = unschedulable("21", "0/8 nodes are available: 8 Insufficient nvidia.com/gpu")
    red = fold(admitted, unschedulable("20", "0/8 nodes are available: 2 node(s) were unschedulable"), newest)
    assert run(red) == ("Scheduling", "Unschedulable", "0/8 nodes are available: 8 Insufficient nvidia.com/gpu")
    red.apply(unschedulable("20", "0/8 nodes are available: 2 node(s) were unschedulable"), "again")
    assert run(red) == ("Scheduling", "Unschedulable", "0/8 nodes are available: 8 Insufficient nvidia.com/gpu")

    def pulling(rv: str, reason: str) -> dict[str, Any]:
        bound = version(POD, rv, conditions=[cond("PodScheduled", "True", "", "", "2026-08-20T10:03:00Z")],
                        containerStatuses=[{"name": "trainer", "state": {"waiting": {"reason": reason}}}])
        bound["object"]["spec"] = {"nodeName": "node-1"}
        return bound

    red = fold(admitted, pulling("30", "ErrImagePull"), pulling("31", "ImagePullBackOff"),
               pulling("30", "ErrImagePull"))
    assert run(red)[1] == "ImagePullBackOff"


def test_a_roots_labels_and_annotations_are_the_newest_versions() -> None:
    def root(rv: str, output: str) -> dict[str, Any]:
        rec = version(JOB, rv)
        rec["object"]["metadata"]["annotations"] = {ANN_OUTPUT: output}
        return rec

    red = Reducer()
    for rec in (root("5", "abfss://runs/a"), root("7", "abfss://runs/b"), root("5", "abfss://runs/a")):
        red.apply(rec, "t")
    h = red.history("run-1")
    assert h is not None and h.run.output_uri == "abfss://runs/b"


def test_a_job_conditions_message_is_the_newest_versions() -> None:
    def failed(rv: str, message: str) -> dict[str, Any]:
        return version(JOB, rv, conditions=[cond("Failed", "True", "BackoffLimitExceeded", message,
                                                 "2026-08-20T11:00:00Z")])

    red = Reducer()
    for rec in (failed("41", "Job has reached the specified backoff limit"), failed("40", "an older message")):
        red.apply(rec, "t")
    assert run(red) == ("Completion", "BackoffLimitExceeded", "Job has reached the specified backoff limit")


def test_without_a_resource_version_the_later_arrival_wins() -> None:
    """An object version with no resourceVersion, or one that is not an integer, is last-write-wins."""
    for rvs in ((None, None), ("abc", "abb"), ("10", None)):
        red = fold(waiting(rvs[0], "8 more needed"), waiting(rvs[1], "2 more needed"))
        assert run(red)[2] == "2 more needed"
        red.apply(waiting(rvs[0], "8 more needed"), "again")
        assert run(red)[2] == "8 more needed"


@pytest.mark.parametrize(("text", "value"), [
    ("123", 123), ("0", 0), (45, 45), ("", None), ("abc", None), ("12a", None), ("-3", None), (-3, None),
    (True, None), ("\u0661\u0662", None), ("9" * 40, None), (None, None), (1.5, None)])
def test_resource_versions_that_are_integers_are_compared_as_integers(text: Any, value: int | None) -> None:
    assert resource_version({"resourceVersion": text} if text is not None else {}) == value


def test_the_versions_survive_a_snapshot_and_older_snapshots_load() -> None:
    pod = version(POD, "20", conditions=[
        cond("PodScheduled", "False", "Unschedulable", "busy", "2026-08-20T10:02:01Z")])
    pod["object"]["status"]["containerStatuses"] = [{"name": "c", "state": {"waiting": {"reason": "ErrImagePull"}}}]
    red = fold(waiting("10", "8 more needed"), waiting("11", "2 more needed"), pod)
    facts = red.runs["run-1"]
    text = json.dumps(facts.to_json())
    back = RunFacts.from_json(json.loads(text))
    assert json.dumps(back.to_json()) == text
    assert (back.wl_rv, back.wl_conds_rv, back.pods["pod-1"].unschedulable_rv, back.pods["pod-1"].waiting_rv) == (
        11, {("QuotaReserved", "False", "Pending", 1787220001000000): 11}, 20, 20)
    assert back.root_rv is None  # the Job was folded without one

    # a snapshot written before resourceVersions were kept: no versions, and the next version sets the values
    old = json.loads(text)
    del old["wl_rv"], old["root_rv"]
    old["wl_conds"] = [row[:5] for row in old["wl_conds"]]
    old["pods"] = {k: v[:12] for k, v in old["pods"].items()}
    restored = RunFacts.from_json(old)
    assert (restored.wl_rv, restored.wl_conds_rv, restored.pods["pod-1"].unschedulable_rv) == (None, {}, None)
    assert restored.wl_conds == facts.wl_conds and restored.wl_pending == ("Pending", "2 more needed")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_scenario_record_applied_again_changes_no_history(name: str) -> None:
    """Fold a scenario, then apply each of its records again in order, flushing after each one: every flush
    writes the final histories (the bundled scenarios rewrite messages in place, as Kueue and the scheduler do)."""
    records = [ev for seq in by_object(SCENARIOS[name].streams()) for ev in seq]
    red = Reducer()
    for ev in records:
        red.apply(ev, name)
    final = {h.run.run_id: h for h in red.flush().histories}
    for n, ev in enumerate(records):
        red.apply(ev, "again")
        for h in red.flush().histories:
            assert h == final[h.run.run_id], f"record {n} applied again changed {h.run.run_id}"
