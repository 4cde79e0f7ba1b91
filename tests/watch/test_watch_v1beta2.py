"""The watcher against a kube-apiserver serving Kueue Workloads only at ``kueue.x-k8s.io/v1beta2`` (marked ``kube``).

The shared test environment runs Kueue 0.12, whose Workload CRD serves v1beta1 alone, so the watcher's preference for
v1beta2 is never exercised there. This module starts its own bare control plane (as tests/watch/test_watch_kube.py does)
with the Workload CRD of a Kueue release that serves v1beta2, cut down to that one version: no conversion webhook
runs here, so the CRD keeps only v1beta2 (served and stored) with ``conversion: None``. A v1beta1 Workload cannot be
written or read at all, so whatever the watcher captures was discovered, listed and watched at v1beta2.

One Job run is driven through the API in the order Kueue (with waitForPodsReady) and the Job controller write it:
queued while quota is short, admitted, evicted by the PodsReady timeout, backed off, re-admitted, succeeded. Its
Workload is written as v1beta2, including v1beta2-only fields (``spec.priorityClassRef``,
``status.accumulatedPastExecutionTimeSeconds``), and the capture must fold to the same history as the objects the API
returned for every write. Written times follow the wall clock, so pods fall into their attempts by creationTimestamp.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient

from tests.infra import build
from tests.infra.fixtures import unavailable
from tests.infra.proc import InfraError
from tests.support.laws import fold, histories
from tests.watch.test_watch_kube import (  # noqa: F401  (admin, identity, namespace: fixtures, run on this module's plane)
    CONFIG,
    Clock,
    Cluster,
    ControlPlane,
    Identity,
    admin,
    call,
    captured,
    control_plane_at,
    identity,
    missing,
    namespace,
    running,
    wait_captured,
    watcher_api,
)
from tracker.shell.watch import WORKLOADS, ApiError, JsonlCapture, KubeApi, Watcher

pytestmark = pytest.mark.kube

Obj = dict[str, Any]
GROUP = "kueue.x-k8s.io"
V1BETA2 = f"{GROUP}/v1beta2"
KUEUE_V1BETA2, KUEUE_V1BETA1 = f"/apis/{V1BETA2}", f"/apis/{GROUP}/v1beta1"
RUN_ID = "run-v1beta2"


def v1beta2_only(crd: Obj) -> Obj:
    """The Workload CRD serving and storing v1beta2 alone, with no conversion (there is no webhook to call)."""
    versions = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
    assert len(versions) == 1, f"no v1beta2 in {[v['name'] for v in crd['spec']['versions']]}"
    version = {k: v for k, v in versions[0].items() if k not in ("deprecated", "deprecationWarning")}
    version.update(served=True, storage=True)
    return {**crd, "spec": {**crd["spec"], "versions": [version], "conversion": {"strategy": "None"}}}


@pytest.fixture(scope="module")
def workload_crd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    artifact = build.KUEUE_V1BETA2_WORKLOAD_CRD
    try:
        source = artifact.ensure() / "crds" / "kueue.x-k8s.io_workloads.yaml"
    except InfraError as exc:
        unavailable(f"could not fetch the Workload CRD of Kueue {artifact.version} ({artifact.path.name}): {exc}")
    crd = yaml.load(source.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    path = tmp_path_factory.mktemp("workload-crd") / source.name  # the bundled CRD's file name: it replaces that one
    path.write_text(json.dumps(v1beta2_only(crd)))
    return path


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory, workload_crd: Path) -> Iterator[ControlPlane]:
    """A private etcd + kube-apiserver with the usual CRDs, except the Workload CRD: the v1beta2-only one."""
    with control_plane_at(tmp_path_factory.mktemp("control-plane-v1beta2"), crd_overrides=[workload_crd]) as plane:
        yield plane


# ------------------------------------------------------------------------------------------ the run


def conditions(c: Cluster, obj: Obj, *changes: tuple[str, bool, str, str]) -> list[Obj]:
    """``obj``'s conditions with ``changes`` set as metav1 SetStatusCondition does: a condition whose status is
    unchanged keeps its lastTransitionTime; others keep their place, new ones are appended."""
    out = [dict(x) for x in (obj.get("status") or {}).get("conditions") or []]
    for type_, status, reason, message in changes:
        new = c.condition(type_, status, reason, message)
        old = next((x for x in out if x["type"] == type_), None)
        if old is None:
            out.append(new)
        else:
            if old["status"] != new["status"]:
                old["lastTransitionTime"] = new["lastTransitionTime"]
            old.update(status=new["status"], reason=reason, message=message)
    return out


async def workload(c: Cluster, owner: Obj) -> Obj:
    """The Workload Kueue's job reconciler creates for ``owner``, written as v1beta2 (priorityClassRef, no
    priorityClassName/priorityClassSource)."""
    meta = owner["metadata"]
    return await c.create(KUEUE_V1BETA2, "workloads", {
        "apiVersion": V1BETA2, "kind": "Workload",
        "metadata": {"name": f"job-{meta['name']}-{meta['uid'][:5]}", "labels": {"kueue.x-k8s.io/job-uid": meta["uid"]},
                     "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                          "name": meta["name"], "uid": meta["uid"], "controller": True,
                                          "blockOwnerDeletion": True}]},
        "spec": {"queueName": "lq", "priority": 100,
                 "priorityClassRef": {"group": GROUP, "kind": "WorkloadPriorityClass", "name": "standard"},
                 "podSets": [{"name": "main", "count": 2, "template": {"spec": {
                     "restartPolicy": "Never", "containers": [{"name": "trainer", "image": "trainer:1",
                                                               "resources": {"requests": {"cpu": "1"}}}]}}}]}})


class WallClock(Clock):
    """Written times that follow the wall clock (whole seconds, never going back), so that the times the apiserver
    sets itself (creationTimestamp, which places a pod in its attempt) interleave with them as in a real cluster."""

    def tick(self, seconds: int = 5) -> str:
        self.now = max(self.now, datetime.now(UTC).replace(microsecond=0))
        return self.text()


async def later() -> None:
    """Wait for the next whole second: whatever is written from now on carries a later time than what was before."""
    await asyncio.sleep(1.02 - time.time() % 1)


def _ltt(wl: Obj, type_: str) -> datetime:
    when = next(x["lastTransitionTime"] for x in wl["status"]["conditions"] if x["type"] == type_)
    return datetime.strptime(when, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


async def pods_ready_timeout_run(c: Cluster) -> list[Obj]:
    """Queued, admitted, evicted by the PodsReady timeout (pods never ready), backed off, re-admitted, succeeded.
    Returns the Workload after each of the two admissions and after the eviction."""
    job = await c.job("trainer", run_id=RUN_ID)
    labels = {"batch.kubernetes.io/controller-uid": job["metadata"]["uid"], "batch.kubernetes.io/job-name": "trainer"}
    wl = await workload(c, job)
    assert wl["apiVersion"] == V1BETA2 and wl["spec"]["priorityClassRef"]["name"] == "standard"  # not pruned
    quota = ("couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor default, "
             "2 more needed")
    c.clock.tick()
    wl = await c.patch(wl, {"status": {"conditions": conditions(
        c, wl, ("QuotaReserved", False, "Pending", quota), ("PodsReady", False, "WaitForStart",
                                                             "Not all pods are ready or succeeded"))}})
    pending = await c.event(wl, "Pending", quota, warning=True)
    await later()
    c.clock.tick()
    await c.repeat(pending, 2)

    # admitted: the v1beta2 admission, with PodsReady still waiting
    admitted = "Admitted by ClusterQueue cq"
    first = wl = await c.admit(wl, *[x for x in wl["status"]["conditions"] if x["type"] == "PodsReady"])
    waited = (_ltt(wl, "QuotaReserved") - datetime.fromisoformat(wl["metadata"]["creationTimestamp"])).seconds
    await c.event(wl, "QuotaReserved", f"Quota reserved in ClusterQueue cq, wait time since queued was {waited}s")
    await c.event(wl, "Admitted", f"{admitted}, wait time since reservation was 0s")
    job = await c.resume(job)
    await c.event(job, "Started", admitted)
    pods = [await c.pod(job, i, labels) for i in range(2)]  # scheduled, but never ready

    # the PodsReady timeout: one write (conditions, requeueState, schedulingStats)
    await later()
    c.clock.tick()
    timeout = f"Exceeded the PodsReady timeout {c.ns}/{wl['metadata']['name']}"
    requeue_at = (c.clock.now + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    evicted = wl = await c.patch(wl, {"status": {
        "conditions": conditions(c, wl, ("Evicted", True, "PodsReadyTimeout", timeout)),
        "requeueState": {"count": 1, "requeueAt": requeue_at},
        "schedulingStats": {"evictions": [{"reason": "PodsReadyTimeout", "underlyingCause": "WaitForStart",
                                           "count": 1}]}}})
    await c.event(wl, "EvictedDueToPodsReadyTimeout", timeout)
    # the Job is stopped and its pods deleted, then the quota released
    job = await c.patch(job, {"spec": {"suspend": True}}, status=False)
    await c.event(job, "Stopped", timeout)
    for p in pods:
        await c.delete(p)
    c.clock.tick()
    job = await c.patch(job, {"status": {"startTime": None, "active": 0, "conditions": [
        c.condition("Suspended", True, "JobSuspended", "Job suspended")]}})
    await later()
    c.clock.tick()
    ran = int((_ltt(wl, "Evicted") - _ltt(wl, "Admitted")).total_seconds())
    wl = await c.patch(wl, {"status": {"admission": None, "accumulatedPastExecutionTimeSeconds": ran,
                                       "conditions": conditions(
        c, wl, ("QuotaReserved", False, "Pending", timeout), ("Admitted", False, "NoReservation",
                                                              "The workload has no reservation"),
        ("Requeued", False, "PodsReadyTimeout", timeout))}})
    assert wl["status"]["accumulatedPastExecutionTimeSeconds"] == ran  # the v1beta2 spelling, kept by the schema
    # the requeue backoff ends
    await later()
    c.clock.tick()
    wl = await c.patch(wl, {"status": {"requeueState": {"requeueAt": None}, "conditions": conditions(
        c, wl, ("Requeued", True, "BackoffFinished", "The workload backoff was finished"))}})

    # re-admitted; this time the pods become ready and succeed
    await later()
    kept = [x for x in wl["status"]["conditions"] if x["type"] in ("PodsReady", "Requeued")]
    c.clock.tick()
    second = wl = await c.admit(wl, c.condition("Evicted", False, "QuotaReserved", f"Previously: {timeout}"), *kept)
    await c.event(wl, "Admitted", f"{admitted}, wait time since reservation was 0s")
    job = await c.resume(job)
    await c.event(job, "Started", admitted)
    pods = [await c.pod_running(await c.pod(job, i + 2, labels)) for i in range(2)]
    wl = await c.patch(wl, {"status": {"conditions": conditions(c, wl, ("PodsReady", True, "Started",
                                                                        "All pods reached readiness"))}})
    await later()
    for p in pods:
        await c.pod_succeeded(p)
    await c.complete(job)
    await c.patch(wl, {"status": {"conditions": conditions(
        c, wl, ("Finished", True, "Succeeded", "Reached expected number of succeeded pods"))}})
    return [first, evicted, second]


# ------------------------------------------------------------------------------------------ the test


async def test_v1beta2_workloads_are_discovered_captured_and_fold_to_the_written_history(
        admin: ApiClient, namespace: str, identity: Identity, tmp_path: Path) -> None:  # noqa: F811
    # the apiserver serves Workloads at v1beta2 only
    group = await call(admin, "GET", f"/apis/{GROUP}")
    assert group["preferredVersion"]["version"] == "v1beta2"
    served = await call(admin, "GET", KUEUE_V1BETA2)
    assert "workloads" in {r["name"] for r in served["resources"]}
    with pytest.raises(ApiError) as gone:
        await KubeApi(admin).get(f"{KUEUE_V1BETA1}/namespaces/{namespace}/workloads")
    assert gone.value.status == 404

    path = tmp_path / "capture.jsonl"
    c = Cluster(admin, namespace, clock=WallClock())
    async with watcher_api(identity.kubeconfig) as api:
        capture = JsonlCapture(path)
        watcher = Watcher(api, capture, replace(CONFIG, namespaces=(namespace,)))
        async with running(watcher):
            first, evicted, second = await pods_ready_timeout_run(c)
            await wait_captured(path, c.written)
        capture.close()

    # the watcher discovered v1beta2, and everything it captured of the Workload is v1beta2
    stream = next(s for s in watcher.streams if s.res is WORKLOADS)
    assert stream.version == "v1beta2"
    records = captured(path)
    workloads = [r for r in records if r["object"]["kind"] == "Workload"]
    assert {r["object"]["apiVersion"] for r in workloads} == {V1BETA2}
    assert len(workloads) == sum(1 for w in c.written if w["object"]["kind"] == "Workload") == 9
    assert watcher.stats.relists == 0 and watcher.stats.unavailable == 0

    # the same history as the objects written, keyed by the run
    assert not missing(c.written, records)
    keys = [(r["type"], r["object"]["metadata"]["uid"], r["object"]["metadata"]["resourceVersion"]) for r in records]
    assert len(keys) == len(set(keys))
    expected = histories(fold(c.written))
    assert histories(fold(records)) == expected
    assert {r["key"] for r in records} == {RUN_ID}

    # ... and it is the right one
    history = expected[RUN_ID]
    run, attempts = history["run"], history["attempts"]
    assert (run["status"], run["reason"], run["kind"], run["name"], run["queue"], run["cluster_queue"]) == (
        "succeeded", "CompletionsReached", "Job", "trainer", "lq", "cq")
    assert (run["attempts"], run["evictions"], run["retries"]) == (2, 1, 0)
    one, two = attempts
    assert (one["trigger"], one["cluster_queue"], one["end_reason"], one["underlying_cause"]) == (
        "Submitted", "cq", "PodsReadyTimeout", "WaitForStart")
    submitted = datetime.fromisoformat(c.written[0]["object"]["metadata"]["creationTimestamp"])  # the Job's
    assert one["admission_wait_s"] == (_ltt(first, "Admitted") - submitted).total_seconds() > 0
    assert (two["trigger"], two["cluster_queue"], two["end_reason"]) == ("PodsReadyTimeout", "cq", "CompletionsReached")
    assert two["queued_at"] == one["ended_at"] == _ltt(evicted, "Evicted").strftime("%Y-%m-%dT%H:%M:%SZ")
    assert two["admission_wait_s"] == (_ltt(second, "Admitted") - _ltt(evicted, "Evicted")).total_seconds() >= 3
    pods = [w["object"]["metadata"]["name"] for w in c.written if w["type"] == "ADDED" and w["object"]["kind"] == "Pod"]
    ones = [p for p in history["pods"] if p["attempt"] == 1]
    twos = [p for p in history["pods"] if p["attempt"] == 2]
    assert [p["pod"] for p in ones] == pods[:2] and [p["pod"] for p in twos] == pods[2:]
    assert [p["finished_at"] is None for p in ones + twos] == [True, True, False, False]
    assert (one["pod_count"], two["pod_count"]) == (2, 2)
    assert [(t["attempt"], t["phase"], t["reason"]) for t in history["transitions"]] == [
        (1, "Admission", "Submitted"), (1, "Scheduling", "Admitted"), (1, "Runtime", "PodsScheduled"),
        (2, "Admission", "PodsReadyTimeout"), (2, "Scheduling", "Admitted"), (2, "Runtime", "PodsScheduled"),
        (2, "Completion", "CompletionsReached")]
