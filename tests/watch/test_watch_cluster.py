"""The watcher on the simulated cluster (marked ``cluster``): real Kueue-managed Jobs, scheduled onto kwok GPU nodes.

Jobs are submitted as a user would (suspended, with a queue label; there is no Kueue webhook out of cluster). One
succeeds; a low-priority Job is preempted by a high-priority one, requeued, and re-admitted once the high one is
done. The watcher runs as the ServiceAccount of deploy/k8s/rbac/clusterrole.yaml; its capture is folded by the Reducer
and compared with an independent plain watch of the same namespace (every object, unslimmed) folded the same way,
and the phases, attempts and admission waits are checked against the Workloads Kueue wrote.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.config import new_client_from_config

from tests.infra.cluster import GPU
from tests.infra.fixtures import KubeCluster
from tests.infra.watching import has_condition
from tests.support.laws import fold, histories
from tests.watch.test_watch_kube import RBAC, watcher_identity
from tracker.shell.capture import Record, read_capture
from tracker.shell.watch import ApiError, JsonlCapture, KubeApi, Watcher, WatchSettings, resources

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]
#: kwok "general" pod stages read these; a long delay keeps a pod Running until it is preempted.
KEEP_RUNNING = {"pod-complete.stage.kwok.x-k8s.io/delay": "10m",
                "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "10m"}
CONFIG = WatchSettings(watch_timeout_s=30, read_timeout_s=15, backoff_base_s=0.1, backoff_cap_s=1,
                     checkpoint_interval_s=0.5)


@pytest.fixture(scope="module")
def watcher_kubeconfig(kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert RBAC.exists()
    return watcher_identity(kube_cluster.kubectl, kube_cluster.kubeconfig,
                            tmp_path_factory.mktemp("watcher") / "kubeconfig").kubeconfig


def queued_job(name: str, *, queue: str, pods: int, gpus: int, priority: str = "",
               annotations: dict[str, str] | None = None) -> Obj:
    labels = {"kueue.x-k8s.io/queue-name": queue, "taugrid.io/run-id": f"run-{name}"}
    if priority:
        labels["kueue.x-k8s.io/priority-class"] = priority
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels},
            "spec": {"suspend": True, "parallelism": pods, "completions": pods, "template": {
                "metadata": {"annotations": annotations or {}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "train", "image": "busybox",
                    "resources": {"requests": {"cpu": "1", GPU: str(gpus)}, "limits": {GPU: str(gpus)}}}]}}}}


class PlainWatch:
    """Every change in one namespace, unslimmed, from plain list+watch requests: the reference to compare with."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.events: list[Obj] = []

    async def run(self, started: asyncio.Event) -> None:
        streams = []
        for res in resources():
            path = res.collection_path(res.versions[-1], self.namespace)
            listing = await self.api.get(path)
            streams.append((path, listing["metadata"]["resourceVersion"]))
        started.set()
        await asyncio.gather(*(self.follow(path, rv) for path, rv in streams))

    async def follow(self, path: str, rv: str) -> None:
        while True:
            params = [("watch", "1"), ("resourceVersion", rv), ("allowWatchBookmarks", "true"),
                      ("timeoutSeconds", "30")]
            async with self.api.lines(path, params, read_timeout_s=60) as lines:
                async for line in lines:
                    event = json.loads(line)
                    rv = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self.events.append({"type": event["type"], "object": event["object"]})


@asynccontextmanager
async def plain_watch(api: KubeApi, namespace: str) -> AsyncIterator[PlainWatch]:
    plain = PlainWatch(api, namespace)
    started = asyncio.Event()
    task = asyncio.create_task(plain.run(started))
    await asyncio.wait_for(started.wait(), 30)
    try:
        yield plain
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


async def until(what: str, cond: Callable[[], bool], within_s: float = 180) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.25)


def latest(events: list[Obj], kind: str, pred: Callable[[Obj], bool]) -> Obj | None:
    found = [e["object"] for e in events if e["object"].get("kind") == kind and pred(e["object"])]
    return found[-1] if found else None


def owned_by(uid: str) -> Callable[[Obj], bool]:
    return lambda o: any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])


def captured(path: Path) -> list[Obj]:
    """The capture's records of runs (not Kueue's queues nor positions, which are keyed by no run)."""
    return [r.value for r in read_capture(path) if isinstance(r, Record) and "schema" not in r.value
            and not str(r.value.get("key", "")).startswith("queue:")]


def states(events: list[Obj]) -> set[tuple[str, str]]:
    """(uid, resourceVersion) of every state, except expired Events (which the watcher does not publish)."""
    return {(e["object"]["metadata"]["uid"], e["object"]["metadata"]["resourceVersion"]) for e in events
            if e["object"]["kind"] != "Event" or e["type"] != "DELETED"}


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


async def test_kueue_jobs_and_a_preemption_come_out_right(
        kube_api: ApiClient, kube_cluster: KubeCluster, queue_namespace: str, watcher_kubeconfig: Path,
        tmp_path: Path) -> None:
    ns, admin = queue_namespace, KubeApi(kube_api)
    cq_path = f"/apis/kueue.x-k8s.io/v1beta1/clusterqueues/{kube_cluster.cluster_queue}"
    # The ClusterQueue is shared: wait until what earlier tests left running (a namespace still being deleted
    # after the controllers were restarted, say) has given its quota back.
    deadline = time.monotonic() + 300
    while True:
        cq = await admin.get(cq_path)
        if not cq["status"].get("admittedWorkloads") and not cq["status"].get("pendingWorkloads"):
            break
        assert time.monotonic() < deadline, f"the ClusterQueue stays busy: {cq['status']}"
        await asyncio.sleep(1)
    quota = next(int(r["nominalQuota"]) for r in cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
                 if r["name"] == GPU)
    path = tmp_path / "capture.jsonl"
    jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"
    async with await new_client_from_config(config_file=str(watcher_kubeconfig)) as sa_client, \
            plain_watch(admin, ns) as plain:
        capture = JsonlCapture(path)
        watcher = Watcher(KubeApi(sa_client), capture, replace(CONFIG, namespaces=(ns,)))
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(stop))
        await asyncio.wait_for(watcher.wait_synced(), 60)
        try:
            def job(name: str) -> Obj:
                return latest(plain.events, "Job", lambda o: o["metadata"]["name"] == name) or {"status": {}}

            def running(name: str) -> bool:
                state = job(name)
                return state.get("spec", {}).get("suspend") is False and (state["status"].get("ready") or 0) == 2

            await admin.request("POST", jobs, body=queued_job("train", queue=kube_cluster.local_queue, pods=2, gpus=1))
            await until("train to complete", lambda: has_condition(job("train"), "Complete"))
            low = await admin.request("POST", jobs, body=queued_job(
                "low", queue=kube_cluster.local_queue, pods=2, gpus=quota // 2, priority="low",
                annotations=KEEP_RUNNING))
            await until("low to run", lambda: running("low"))
            await admin.request("POST", jobs, body=queued_job(
                "high", queue=kube_cluster.local_queue, pods=1, gpus=quota // 2, priority="high"))
            await until("high to complete", lambda: has_condition(job("high"), "Complete"))

            def readmitted(o: Obj) -> bool:
                return owned_by(low["metadata"]["uid"])(o) and has_condition(o, "Admitted") and has_condition(
                    o, "Requeued") and has_condition(o, "Evicted", status="False")

            await until("low to be re-admitted and run again",
                        lambda: latest(plain.events, "Workload", readmitted) is not None and running("low"))
            seen = states(plain.events)
            await until("the watcher to catch up", lambda: seen <= states(captured(path)), within_s=30)
        finally:
            stop.set()
            await asyncio.wait_for(task, 60)
            capture.close()
        reference = list(plain.events)
    for name in ("low", "high", "train"):  # give the shared quota back now, not when the namespace goes
        with suppress(ApiError):
            await admin.request("DELETE", f"{jobs}/{name}", body={"propagationPolicy": "Background"})

    records = captured(path)
    keys = [(r["type"], r["object"]["metadata"]["uid"], r["object"]["metadata"]["resourceVersion"]) for r in records]
    assert len(keys) == len(set(keys)), "a change was published twice"
    assert states(reference) <= states(records), "a change the plain watch saw was not published"
    got = histories(fold(records))
    assert got == histories(fold(reference))

    assert got.keys() == {"run-train", "run-low", "run-high"}
    for name in ("train", "high"):
        run = got[f"run-{name}"]["run"]
        assert (run["status"], run["phase"], run["attempts"], run["evictions"]) == ("succeeded", "Completion", 1, 0)
        assert run["cluster_queue"] == kube_cluster.cluster_queue and run["admission_wait_s"] >= 0
    low_history = got["run-low"]
    run = low_history["run"]
    assert (run["status"], run["attempts"], run["evictions"]) == ("running", 2, 1)
    first, second = low_history["attempts"]
    assert first["end_reason"] == "Preempted" and second["trigger"] == "Preempted"
    assert first["admitted_at"] is not None and second["admitted_at"] is not None

    # the admission waits are the Workload's: Kueue's QuotaReserved/Admitted transition times
    workload = latest(reference, "Workload", owned_by(low["metadata"]["uid"]))
    assert workload is not None
    admitted = next(c for c in workload["status"]["conditions"] if c["type"] == "Admitted")
    assert ts(second["admitted_at"]) == ts(admitted["lastTransitionTime"])
    assert second["admission_wait_s"] == pytest.approx(ts(second["admitted_at"]) - ts(second["queued_at"]))
    assert second["admission_wait_s"] > 0 and ts(second["queued_at"]) >= ts(first["admitted_at"])
