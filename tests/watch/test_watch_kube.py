"""The watcher against a real kube-apiserver and etcd (marked ``kube``).

A private control plane (etcd + kube-apiserver + the Kueue and KubeRay CRDs, started by ``tests.infra.kube`` from
the cached build) is used instead of the shared one, because these tests need things the shared one cannot give:
no controllers writing to the test objects (the shared apiserver may run Kueue and the Job controller), and an
apiserver that can be restarted. A 410 needs both: etcd compaction alone does not expire a watch, because the
apiserver's watch cache still holds the history (checked by ``test_compaction_alone_does_not_expire_a_cached_watch``),
so the 410 fault compacts etcd and restarts the apiserver, whose new watch cache starts after the compacted revision.

The watcher always runs as the ServiceAccount of deploy/k8s/rbac/clusterrole.yaml (a token from the TokenRequest API),
so every test also proves the role is enough. Each test drives three runs through realistic lifecycles with the
status subresource (a quick success; a preemption with requeue and re-admission; a RayJob), injects one fault, and
checks the watcher's capture against the objects the API returned for every write: same run histories when
folded by the Reducer, every written state published, and no (uid, resourceVersion) published twice.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka import TopicPartition
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.config import new_client_from_config

from tests.infra import build, kube
from tests.infra.config import REPO_ROOT, Component
from tests.infra.fixtures import unavailable
from tests.infra.kubectl import Kubectl
from tests.infra.proc import Process, free_port, http_ok, spawn, wait_for
from tests.support.laws import fold, histories
from tracker.runtime.ops import Health, Metrics, Shutdown
from tracker.runtime.service import create_topics as service_create_topics
from tracker.runtime.watch_cmd import WatchOptions, watch_body
from tracker.settings import load_settings
from tracker.shell import kafka
from tracker.shell.capture import Record, read_capture
from tracker.shell.leader import Lease, LeaseConfig, LeaseElector, lead
from tracker.shell.watch import ApiError, Change, JsonlCapture, KubeApi, Watcher, WatchSettings

pytestmark = pytest.mark.kube

Obj = dict[str, Any]
RBAC = REPO_ROOT / "deploy" / "k8s" / "rbac" / "clusterrole.yaml"
SYSTEM_NS = "tracker-system"
SA = "tracker-watcher"
BATCH, CORE, EVENTS = "/apis/batch/v1", "/api/v1", "/apis/events.k8s.io/v1"
KUEUE, RAY = "/apis/kueue.x-k8s.io/v1beta1", "/apis/ray.io/v1"
CONFIG = WatchSettings(watch_timeout_s=20, read_timeout_s=8, connect_timeout_s=2, backoff_base_s=0.1, backoff_cap_s=1,
                     checkpoint_interval_s=0.2)

# ------------------------------------------------------------------------------------------ control plane


@dataclass
class ControlPlane:
    kubeconfig: Path
    server: str
    ca: Path
    etcd_url: str
    etcd: Process
    apiserver: Process
    argv: list[str]
    kubectl: Kubectl

    def restart_apiserver(self) -> None:
        """A new apiserver process on the same etcd: its watch cache starts at the current revision."""
        self.apiserver.stop()
        self.apiserver = spawn("kube-apiserver", self.argv, log_path=Path(self.apiserver.log))
        wait_for("restarted kube-apiserver", lambda: kube.is_ready(self.kubeconfig), timeout=60,
                 process=self.apiserver)

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (the v3 JSON gateway); returns the revision."""
        head = _etcd(self.etcd_url, "/v3/kv/range", {"key": "Lw=="})  # "/"
        revision = int(head["header"]["revision"])
        _etcd(self.etcd_url, "/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision


def _etcd(url: str, path: str, body: Obj) -> Obj:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        result: Obj = json.loads(response.read())
        return result


def start_control_plane(state: Path, crd_overrides: Sequence[Path] = ()) -> ControlPlane:
    """A private etcd + kube-apiserver with the Kueue and KubeRay CRDs (see ``tests.infra.kube.start``)."""
    unbuilt = [a.path.name for a in build.artifacts_for(Component.KUBE) if not a.is_built()]
    if unbuilt:
        unavailable(f"kube environment is not built ({', '.join(unbuilt)}); run `python -m tests.infra up "
                    "--components kube` once")
    instance = kube.start(state, crd_overrides=crd_overrides)
    etcd, apiserver = instance.processes
    argv = [a.decode() for a in Path(f"/proc/{apiserver.pid}/cmdline").read_bytes().split(b"\0")[:-1]]
    etcd_url = next(a.split("=", 1)[1] for a in argv if a.startswith("--etcd-servers="))
    config = yaml.safe_load(instance.kubeconfig.read_text())
    return ControlPlane(instance.kubeconfig, instance.server,
                        Path(config["clusters"][0]["cluster"]["certificate-authority"]), etcd_url, etcd, apiserver,
                        argv, Kubectl(build.KUBERNETES.path / "bin" / "kubectl", instance.kubeconfig))


@contextmanager
def control_plane_at(state: Path, crd_overrides: Sequence[Path] = ()) -> Iterator[ControlPlane]:
    """``start_control_plane``, stopped (apiserver, then etcd) when the block ends: a module's fixture."""
    plane = start_control_plane(state, crd_overrides)
    try:
        yield plane
    finally:
        plane.apiserver.stop()
        plane.etcd.stop()


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with control_plane_at(tmp_path_factory.mktemp("control-plane")) as plane:
        yield plane


@dataclass(frozen=True)
class Identity:
    """The watcher's ServiceAccount: a bearer token and a kubeconfig for it."""

    token: str
    kubeconfig: Path

    def at(self, server: str, path: Path) -> Path:
        """The same credentials for another server address (a proxy in front of the apiserver)."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = server
        path.write_text(yaml.safe_dump(config))
        return path


def rbac_documents(namespace: str) -> list[Obj]:
    """deploy/k8s/rbac/clusterrole.yaml with its namespace replaced."""
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    for doc in docs:
        if "namespace" in doc["metadata"]:
            doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
    return docs


def watcher_identity(kubectl: Kubectl, admin_kubeconfig: Path, path: Path) -> Identity:
    """The watcher's ServiceAccount of deploy/k8s/rbac/clusterrole.yaml in SYSTEM_NS, and a kubeconfig at ``path``
    for its token, on the cluster of ``admin_kubeconfig``."""
    kubectl.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NS}}])
    kubectl.apply(rbac_documents(SYSTEM_NS))
    token = kubectl.run("create", "token", SA, f"--namespace={SYSTEM_NS}", "--duration=2h").strip()
    clusters = yaml.safe_load(admin_kubeconfig.read_text())["clusters"]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "watcher", "clusters": clusters,
        "users": [{"name": SA, "user": {"token": token}}],
        "contexts": [{"name": "watcher", "context": {"cluster": clusters[0]["name"], "user": SA}}]}))
    return Identity(token, path)


@pytest.fixture(scope="module")
def identity(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Identity:
    return watcher_identity(control_plane.kubectl, control_plane.kubeconfig,
                            tmp_path_factory.mktemp("identity") / "kubeconfig")


@asynccontextmanager
async def client_for(kubeconfig: Path) -> AsyncIterator[ApiClient]:
    async with await new_client_from_config(config_file=str(kubeconfig)) as client:
        yield client


@pytest.fixture
async def admin(control_plane: ControlPlane) -> AsyncIterator[ApiClient]:
    async with client_for(control_plane.kubeconfig) as client:
        yield client


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = control_plane.kubectl.create_namespace("watch")
    yield name
    control_plane.kubectl.delete_namespace(name)


# ------------------------------------------------------------------------------------------ API writes


async def call(client: ApiClient, method: str, path: str, body: Obj | None = None, *,
               content_type: str = "application/json", params: list[tuple[str, str]] | None = None) -> Obj:
    resp = await client.call_api(path, method, query_params=params or [], body=body,
                                 header_params={"Accept": "application/json", "Content-Type": content_type},
                                 auth_settings=["BearerToken"], _preload_content=False, _request_timeout=30)
    try:
        data: Obj = json.loads(await resp.read())
    finally:
        resp.release()
    if resp.status >= 300:
        raise ApiError(resp.status, str(data.get("reason")), str(data.get("message")))
    return data


class Clock:
    """Times written into statuses: start now, advance on purpose, whole seconds (metav1.Time)."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC).replace(microsecond=0)

    def tick(self, seconds: int = 5) -> str:
        self.now += timedelta(seconds=seconds)
        return self.text()

    def text(self) -> str:
        return self.now.strftime("%Y-%m-%dT%H:%M:%SZ")

    def micro(self) -> str:
        return self.now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Cluster:
    """Admin writes to one namespace; remembers every object the API returned, as the watch events it implies."""

    client: ApiClient
    ns: str
    clock: Clock = field(default_factory=Clock)
    written: list[Obj] = field(default_factory=list)

    def path(self, api: str, plural: str, name: str = "") -> str:
        return f"{api}/namespaces/{self.ns}/{plural}" + (f"/{name}" if name else "")

    async def create(self, api: str, plural: str, body: Obj) -> Obj:
        obj = await call(self.client, "POST", self.path(api, plural), body)
        self.written.append({"type": "ADDED", "object": obj})
        return obj

    async def patch(self, obj: Obj, patch: Obj, *, status: bool = True) -> Obj:
        path = self.object_path(obj) + ("/status" if status else "")
        new = await call(self.client, "PATCH", path, patch, content_type="application/merge-patch+json")
        if new["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            self.written.append({"type": "MODIFIED", "object": new})
        return new

    async def delete(self, obj: Obj) -> None:
        gone = await call(self.client, "DELETE", self.object_path(obj), {"gracePeriodSeconds": 0,
                                                                          "propagationPolicy": "Background"})
        if gone.get("kind") == "Status":
            gone = obj
        self.written.append({"type": "DELETED", "object": gone})

    @staticmethod
    def object_path(obj: Obj) -> str:
        group_version = obj["apiVersion"]
        api = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
        plural = {"Job": "jobs", "Pod": "pods", "Event": "events", "Workload": "workloads", "RayJob": "rayjobs",
                  "RayCluster": "rayclusters"}[obj["kind"]]
        return f"{api}/namespaces/{obj['metadata']['namespace']}/{plural}/{obj['metadata']['name']}"

    # ---------------------------------------------------------------- building blocks

    def condition(self, type_: str, status: bool, reason: str, message: str = "") -> Obj:
        return {"type": type_, "status": "True" if status else "False", "reason": reason,
                "message": message or f"{type_} {reason}", "lastTransitionTime": self.clock.text()}

    async def event(self, regarding: Obj, reason: str, note: str, *, warning: bool = False) -> Obj:
        meta = regarding["metadata"]
        return await self.create(EVENTS, "events", {
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.monotonic_ns():x}"},
            "eventTime": self.clock.micro(), "reason": reason, "note": note, "action": reason,
            "type": "Warning" if warning else "Normal", "reportingController": "tracker.test/controller",
            "reportingInstance": "test",
            "regarding": {"apiVersion": regarding["apiVersion"], "kind": regarding["kind"], "name": meta["name"],
                          "namespace": self.ns, "uid": meta["uid"]}})

    async def repeat(self, event: Obj, count: int) -> Obj:
        """The recorder's deduplication: the same Event, with a growing series."""
        return await self.patch(event, {"series": {"count": count, "lastObservedTime": self.clock.micro()}},
                                status=False)

    async def job(self, name: str, *, pods: int = 2, owner: Obj | None = None, run_id: str = "",
                  settle: bool = True) -> Obj:
        labels = {"kueue.x-k8s.io/queue-name": "lq"} if owner is None else {}
        if run_id:
            labels["taugrid.io/run-id"] = run_id
        meta: Obj = {"name": name, "labels": labels}
        if owner is not None:
            meta["ownerReferences"] = [_owner(owner)]
        job = await self.create(BATCH, "jobs", {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
            "spec": {"suspend": owner is None, "parallelism": pods, "completions": pods,
                     "template": {"spec": {"restartPolicy": "Never", "containers": [
                         {"name": "trainer", "image": "trainer:1", "resources": {"requests": {"cpu": "1"}}}]}}}})
        if owner is None and settle:
            job = await self.patch(job, {"status": {"conditions": [
                self.condition("Suspended", True, "JobSuspended", "Job suspended")]}})
        return job

    async def workload(self, owner: Obj) -> Obj:
        meta = owner["metadata"]
        return await self.create(KUEUE, "workloads", {
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": f"{owner['kind'].lower()}-{meta['name']}-{meta['uid'][:5]}",
                         "labels": {"kueue.x-k8s.io/job-uid": meta["uid"]}, "ownerReferences": [_owner(owner)]},
            "spec": {"queueName": "lq", "podSets": [{"name": "main", "count": 2, "template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "trainer", "image": "trainer:1",
                                                          "resources": {"requests": {"cpu": "1"}}}]}}}]}})

    async def admit(self, wl: Obj, *extra: Obj) -> Obj:
        self.clock.tick()
        conds = [self.condition("QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue cq"),
                 self.condition("Admitted", True, "Admitted", "The workload is admitted"), *extra]
        return await self.patch(wl, {"status": {"conditions": conds, "admission": {
            "clusterQueue": "cq", "podSetAssignments": [{"name": "main", "count": 2, "flavors": {"cpu": "default"},
                                                         "resourceUsage": {"cpu": "2"}}]}}})

    async def pod(self, owner: Obj, index: int, labels: Obj) -> Obj:
        self.clock.tick(2)
        pod = await self.create(CORE, "pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{owner['metadata']['name']}-{index}-{time.monotonic_ns() % 100000}",
                         "labels": labels, "ownerReferences": [_owner(owner)]},
            "spec": {"nodeName": "node-1", "restartPolicy": "Never",
                     "containers": [{"name": "trainer", "image": "trainer:1"}]}})
        return await self.patch(pod, {"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": self.clock.text()}]}})

    async def pod_running(self, pod: Obj) -> Obj:
        started = self.clock.tick(3)
        return await self.patch(pod, {"status": {"phase": "Running", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": pod["status"]["conditions"][0][
                "lastTransitionTime"]},
            {"type": "Ready", "status": "True", "lastTransitionTime": started}],
            "containerStatuses": [{"name": "trainer", "image": "trainer:1", "imageID": "", "ready": True,
                                   "restartCount": 0, "started": True,
                                   "state": {"running": {"startedAt": started}}}]}})

    async def pod_succeeded(self, pod: Obj) -> Obj:
        started = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
        finished = self.clock.tick(30)
        return await self.patch(pod, {"status": {"phase": "Succeeded", "conditions": [
            *pod["status"]["conditions"][:1], {"type": "Ready", "status": "False", "reason": "PodCompleted",
                                               "lastTransitionTime": finished}],
            "containerStatuses": [{"name": "trainer", "image": "trainer:1", "imageID": "", "ready": False,
                                   "restartCount": 0, "started": False, "state": {"terminated": {
                                       "exitCode": 0, "reason": "Completed", "startedAt": started,
                                       "finishedAt": finished}}}]}})

    async def resume(self, job: Obj) -> Obj:
        job = await self.patch(job, {"spec": {"suspend": False}}, status=False)
        start = self.clock.tick(1)
        return await self.patch(job, {"status": {"startTime": start, "active": 2, "conditions": [
            self.condition("Suspended", False, "JobResumed", "Job resumed")]}})

    async def complete(self, job: Obj) -> Obj:
        done = self.clock.tick(2)
        return await self.patch(job, {"status": {"active": 0, "ready": 0, "succeeded": 2, "completionTime": done,
                                                 "conditions": [
            *job["status"]["conditions"],
            self.condition("SuccessCriteriaMet", True, "CompletionsReached", "Reached expected number of "
                           "succeeded pods"),
            self.condition("Complete", True, "CompletionsReached", "Reached expected number of succeeded pods")]}})


def _owner(obj: Obj) -> Obj:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


Fault = Callable[[str], Awaitable[None]]


async def no_fault(point: str) -> None:
    return None


# ------------------------------------------------------------------------------------------ the three runs


async def quick_success(c: Cluster, fault: Fault) -> None:
    """Sequence (a): queued, admitted quickly, two pods run and succeed, the Job completes."""
    job = await c.job("quick", run_id="run-quick")
    wl = await c.workload(job)
    wl = await c.patch(wl, {"status": {"conditions": [c.condition("QuotaReserved", False, "Pending",
                                                                  "couldn't assign flavors: insufficient quota")]}})
    pending = await c.event(wl, "Pending", "couldn't assign flavors: insufficient quota", warning=True)
    await fault("quick:queued")
    pending = await c.repeat(pending, 2)
    wl = await c.admit(wl)
    await c.event(wl, "Admitted", "Admitted by ClusterQueue cq")
    job = await c.resume(job)
    await c.event(job, "Started", "Admitted by clusterQueue cq")
    labels = {"batch.kubernetes.io/controller-uid": job["metadata"]["uid"], "batch.kubernetes.io/job-name": "quick"}
    pods = [await c.pod(job, i, labels) for i in range(2)]
    await fault("quick:scheduled")
    for p in pods:
        await c.event(p, "Scheduled", f"Successfully assigned {p['metadata']['name']} to node-1")
    pods = [await c.pod_running(p) for p in pods]
    await fault("quick:running")
    pods = [await c.pod_succeeded(p) for p in pods]
    job = await c.complete(job)
    await c.patch(wl, {"status": {"conditions": [*wl["status"]["conditions"], c.condition(
        "Finished", True, "Succeeded", "Reached expected number of succeeded pods")]}})
    await fault("quick:finished")


async def preempted(c: Cluster, fault: Fault) -> None:
    """Sequence (c): admitted and running, preempted (pods deleted, Job suspended), requeued, re-admitted."""
    job = await c.job("victim")
    wl = await c.workload(job)
    wl = await c.admit(wl)
    job = await c.resume(job)
    labels = {"batch.kubernetes.io/controller-uid": job["metadata"]["uid"], "batch.kubernetes.io/job-name": "victim"}
    pods = [await c.pod_running(await c.pod(job, i, labels)) for i in range(2)]
    await fault("victim:running")
    c.clock.tick(60)
    preemption = "Preempted to accommodate a workload (UID: x, JobUID: y) due to prioritization in the ClusterQueue"
    wl = await c.patch(wl, {"status": {
        "conditions": [*wl["status"]["conditions"], c.condition("Evicted", True, "Preempted", preemption),
                       c.condition("Preempted", True, "InClusterQueue", preemption)],
        "schedulingStats": {"evictions": [{"reason": "Preempted", "underlyingCause": "", "count": 1}]}}})
    await c.event(wl, "Preempted", preemption)
    job = await c.patch(job, {"spec": {"suspend": True}}, status=False)
    await fault("victim:evicted")
    for p in pods:
        await c.delete(p)
    c.clock.tick(2)
    job = await c.patch(job, {"status": {"startTime": None, "active": 0, "conditions": [
        c.condition("Suspended", True, "JobSuspended", "Job suspended")]}})
    c.clock.tick(2)
    evicted = [x for x in wl["status"]["conditions"] if x["type"] in ("Evicted", "Preempted")]
    wl = await c.patch(wl, {"status": {"admission": None, "conditions": [
        c.condition("QuotaReserved", False, "Pending", preemption),
        c.condition("Admitted", False, "NoReservation", "The workload has no reservation"), *evicted,
        c.condition("Requeued", True, "Preempted", preemption)]}})
    await fault("victim:requeued")
    c.clock.tick(120)
    requeued = next(x for x in wl["status"]["conditions"] if x["type"] == "Requeued")
    wl = await c.admit(wl, c.condition("Evicted", False, "QuotaReserved", f"Previously: {preemption}"),
                       c.condition("Preempted", False, "QuotaReserved", f"Previously: {preemption}"), requeued)
    job = await c.resume(job)
    pods = [await c.pod_running(await c.pod(job, i + 2, labels)) for i in range(2)]
    await fault("victim:readmitted")


async def rayjob(c: Cluster, fault: Fault) -> None:
    """A RayJob: Initializing with its RayCluster and pods, a submitter Job, Running, Complete."""
    worker_tmpl = {"spec": {"containers": [{"name": "ray-worker", "image": "ray:2"}]}}
    rj = await c.create(RAY, "rayjobs", {
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": "rj", "labels": {"kueue.x-k8s.io/queue-name": "lq", "taugrid.io/run-id": "run-rj"}},
        "spec": {"entrypoint": "python train.py", "shutdownAfterJobFinishes": True, "rayClusterSpec": {
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                {"name": "ray-head", "image": "ray:2"}]}}},
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 1,
                                  "rayStartParams": {}, "template": worker_tmpl}]}}})
    wl = await c.admit(await c.workload(rj))
    start = c.clock.tick()
    rj = await c.patch(rj, {"status": {"jobDeploymentStatus": "Initializing", "startTime": start,
                                       "rayClusterName": "rj-abcde", "jobId": "rj-xyz12"}})
    rc = await c.create(RAY, "rayclusters", {
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": "rj-abcde", "ownerReferences": [_owner(rj)]},
        "spec": rj["spec"]["rayClusterSpec"]})
    await fault("rj:initializing")
    labels = {"ray.io/cluster": "rj-abcde"}
    pods = [await c.pod_running(await c.pod(rc, i, {**labels, "ray.io/node-type": kind}))
            for i, kind in enumerate(("head", "worker"))]
    ready = c.clock.tick()
    rc = await c.patch(rc, {"status": {"state": "ready", "stateTransitionTimes": {"ready": ready}, "conditions": [
        c.condition("RayClusterProvisioned", True, "AllPodRunningAndReadyFirstTime",
                    "All Ray Pods are ready for the first time")]}})
    submitter = await c.job("rj", pods=1, owner=rj)
    await c.event(rj, "CreatedRayJobSubmitter", f"Created Kubernetes Job {c.ns}/rj")
    rj = await c.patch(rj, {"status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                                       "rayJobInfo": {"startTime": c.clock.tick()}}})
    await fault("rj:running")
    end = c.clock.tick(300)
    rj = await c.patch(rj, {"status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "endTime": end,
                                       "succeeded": 1, "failed": 0, "rayJobInfo": {"endTime": end}}})
    await c.patch(wl, {"status": {"conditions": [*wl["status"]["conditions"], c.condition(
        "Finished", True, "Succeeded", "Job finished successfully")]}})
    del pods, submitter
    await fault("rj:complete")


async def all_runs(c: Cluster, fault: Fault) -> None:
    await quick_success(c, fault)
    await preempted(c, fault)
    await rayjob(c, fault)


# ------------------------------------------------------------------------------------------ checking


def captured(path: Path, *, queues: bool = False) -> list[Obj]:
    """The records of a capture; without ``queues``, not Kueue's queues nor positions nor Nodes (records of no run:
    the watcher publishes them since issues 24 and 28, tests/watch/test_watch_queues.py and test_watch_nodes.py check
    them)."""
    records = [r.value for r in read_capture(path) if isinstance(r, Record)] if path.exists() else []
    return records if queues else [r for r in records if "schema" not in r and not str(r.get("key", "")).startswith(
        ("queue:", "node:"))]


def missing(written: list[Obj], records: list[Obj]) -> list[str]:
    """Written states that are not in the capture: (uid, resourceVersion) for writes, uid for deletes."""
    seen = {(r["object"]["metadata"]["uid"], r["object"]["metadata"]["resourceVersion"]) for r in records}
    deleted = {r["object"]["metadata"]["uid"] for r in records if r["type"] == "DELETED"}
    out = []
    for w in written:
        meta = w["object"]["metadata"]
        if w["type"] == "DELETED" and meta["uid"] not in deleted:
            out.append(f"DELETED {w['object']['kind']}/{meta['name']}")
        elif w["type"] != "DELETED" and (meta["uid"], meta["resourceVersion"]) not in seen:
            out.append(f"{w['type']} {w['object']['kind']}/{meta['name']}@{meta['resourceVersion']}")
    return out


async def wait_captured(path: Path, written: list[Obj], within_s: float = 60.0,
                        more: Callable[[], list[Obj]] | None = None) -> list[Obj]:
    deadline = time.monotonic() + within_s
    while True:
        records = captured(path) + (more() if more else [])
        lost = missing(written, records)
        if not lost:
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(lost)} written states never published, e.g. {lost[:5]}")
        await asyncio.sleep(0.1)


def assert_same_history(written: list[Obj], records: list[Obj], *, allow_duplicates: bool = False) -> None:
    assert not missing(written, records)
    keys = [(r["type"], r["object"]["metadata"]["uid"], r["object"]["metadata"]["resourceVersion"]) for r in records]
    if not allow_duplicates:
        duplicates = {k for k in keys if keys.count(k) > 1}
        assert not duplicates, f"published twice: {sorted(duplicates)[:5]}"
    expected = histories(fold(written))
    assert histories(fold(records)) == expected
    assert {r["key"] for r in records} == set(expected)
    assert expected["run-quick"]["run"]["status"] == "succeeded"
    victim = next(h for h in expected.values() if h["run"]["name"] == "victim")
    assert victim["run"]["attempts"] == 2 and victim["run"]["evictions"] == 1
    assert victim["attempts"][1]["trigger"] == "Preempted" and victim["attempts"][1]["admission_wait_s"] > 0
    assert expected["run-rj"]["run"]["status"] == "succeeded"


@asynccontextmanager
async def running(watcher: Watcher) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    try:
        await asyncio.wait_for(watcher.wait_synced(), 60)
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


@asynccontextmanager
async def watcher_api(kubeconfig: Path, config: WatchSettings = CONFIG) -> AsyncIterator[KubeApi]:
    async with client_for(kubeconfig) as client:
        yield KubeApi(client, connect_timeout_s=config.connect_timeout_s, request_timeout_s=10)


# ------------------------------------------------------------------------------------------ faults


class Proxy:
    """A loopback TCP proxy in front of the apiserver that can cut or freeze every connection through it."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.connections: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.accepted = 0

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"https://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        self.cut()
        self.server.close()

    def cut(self) -> None:
        """Reset every open connection (as a dying load balancer would)."""
        for a, b in list(self.connections):
            for w in (a, b):
                w.transport.abort()
        self.connections.clear()

    def freeze(self) -> None:
        """Stop forwarding without closing anything: half-open connections, only timeouts notice."""
        self.flowing.clear()

    def thaw(self) -> None:
        self.flowing.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self.connections.add(pair)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with suppress(ConnectionError, OSError, asyncio.IncompleteReadError):
                while data := await src.read(65536):
                    await self.flowing.wait()
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort() if dst.transport.is_closing() else dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)
        self.connections.discard(pair)


def server_port(server: str) -> int:
    return int(server.rsplit(":", 1)[1])


# ------------------------------------------------------------------------------------------ tests


async def test_no_fault_capture_folds_to_the_written_histories(admin: ApiClient, namespace: str,
                                                               identity: Identity, tmp_path: Path) -> None:
    path = tmp_path / "capture.jsonl"
    c = Cluster(admin, namespace)
    async with watcher_api(identity.kubeconfig) as api:
        capture = JsonlCapture(path)
        watcher = Watcher(api, capture, replace(CONFIG, namespaces=(namespace,)))
        async with running(watcher):
            await all_runs(c, no_fault)
            records = await wait_captured(path, c.written)
        capture.close()
    assert_same_history(c.written, captured(path))
    assert watcher.stats.relists == 0 and watcher.stats.unavailable == 0 and watcher.keys.held == 0
    mean = watcher.stats.record_bytes / watcher.stats.changes
    assert mean < 2000
    # beyond the writes the test made: only the apiserver's own, marking a pod deleted before removing it
    written = {(w["object"]["metadata"]["uid"], w["object"]["metadata"]["resourceVersion"]) for w in c.written}
    extra = [r for r in records
             if (r["object"]["metadata"]["uid"], r["object"]["metadata"]["resourceVersion"]) not in written]
    assert extra and all(r["object"]["metadata"].get("deletionTimestamp") for r in extra)


async def test_cut_and_frozen_connections_resume_without_loss_or_repeats(
        admin: ApiClient, namespace: str, identity: Identity, control_plane: ControlPlane, tmp_path: Path) -> None:
    proxy = Proxy(server_port(control_plane.server))
    kubeconfig = identity.at(await proxy.start(), tmp_path / "via-proxy")
    path = tmp_path / "capture.jsonl"
    c = Cluster(admin, namespace)

    async def fault(point: str) -> None:
        if point in ("quick:scheduled", "victim:evicted", "rj:initializing"):
            proxy.cut()  # mid-stream: the watches are open and events are flowing
        elif point == "victim:requeued":
            proxy.freeze()  # silence: only the read timeout can tell
            await asyncio.sleep(config.read_timeout_s + 1)
            proxy.thaw()

    config = replace(CONFIG, namespaces=(namespace,), read_timeout_s=3)
    async with watcher_api(kubeconfig, config) as api:
        capture = JsonlCapture(path)
        watcher = Watcher(api, capture, config)
        async with running(watcher):
            await all_runs(c, fault)
            await wait_captured(path, c.written)
        capture.close()
    await proxy.stop()
    assert_same_history(c.written, captured(path))
    assert proxy.accepted >= 7 * 4  # every stream connected again after each of the three cuts
    assert watcher.stats.reconnects >= 7  # the freeze: every silent stream gave up and reconnected
    assert watcher.stats.relists == 0  # resumed from the last resourceVersion each time


async def test_restart_with_the_same_checkpoint_and_deletes_while_down(
        admin: ApiClient, namespace: str, identity: Identity, tmp_path: Path) -> None:
    path, checkpoint = tmp_path / "capture.jsonl", tmp_path / "watch.sqlite"
    c = Cluster(admin, namespace)
    config = replace(CONFIG, namespaces=(namespace,))
    async with watcher_api(identity.kubeconfig) as api:
        stop, task, capture = asyncio.Event(), None, None
        instances: list[Watcher] = []

        async def start() -> None:
            nonlocal stop, task, capture
            capture, stop = JsonlCapture(path), asyncio.Event()
            instances.append(Watcher(api, capture, config, checkpoint=checkpoint))
            task = asyncio.create_task(instances[-1].run(stop))
            await asyncio.wait_for(instances[-1].wait_synced(), 60)

        async def shut_down() -> None:
            assert task is not None and capture is not None
            stop.set()
            await asyncio.wait_for(task, 60)
            capture.close()

        async def fault(point: str) -> None:
            if point == "quick:running":
                await shut_down()  # down: a run comes and goes, and the quick run's pods change
                doomed = await c.job("doomed", pods=1)
                await c.delete(doomed)
                await start()
            elif point == "victim:requeued":
                await shut_down()  # down: objects the watcher knew are deleted
                for w in [w for w in c.written if w["object"]["kind"] == "Pod"
                          and w["object"]["metadata"]["name"].startswith("quick-")][-2:]:
                    await c.delete(w["object"])
                await start()

        await start()
        await all_runs(c, fault)
        await wait_captured(path, c.written)
        await shut_down()
    assert len(instances) == 3 and all(w.stats.relists == 0 for w in instances)
    assert_same_history(c.written, captured(path))


async def test_restart_as_a_new_process(admin: ApiClient, namespace: str, identity: Identity, tmp_path: Path) -> None:
    path, checkpoint = tmp_path / "capture.jsonl", tmp_path / "watch.sqlite"
    port = free_port()
    argv = [sys.executable, "-c", CLI, "watch", "--kubeconfig", str(identity.kubeconfig), "-n", namespace,
            "--capture", str(path), "--checkpoint", str(checkpoint), "--checkpoint-interval", "0.2",
            "--watch-timeout", "20", "--log-format", "console", "--metrics-port", str(port)]
    c = Cluster(admin, namespace)
    log = (tmp_path / "watch.log").open("ab")
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT))

    async def ready() -> None:
        """/readyz answers 200 once every stream has listed (or resumed)."""
        await _until(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), within_s=60)

    async def stop() -> None:
        proc = procs[-1]
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 60)
        assert proc.returncode == 0, (tmp_path / "watch.log").read_text()[-3000:]

    async def fault(point: str) -> None:
        if point in ("quick:scheduled", "victim:evicted", "rj:running"):
            await wait_captured(path, c.written, within_s=60)  # what was written so far is out ...
            await stop()  # ... then the process goes down, changes happen, and a new process starts
            await c.event(c.written[0]["object"], "WhileDown", "changed while the watcher was down")
            start()

    start()
    try:
        await ready()  # the first process has no checkpoint: what is written before it listed is not history
        await all_runs(c, fault)
        await wait_captured(path, c.written, within_s=60)
        await stop()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        log.close()
    assert len(procs) == 4
    assert_same_history(c.written, captured(path))


CLI = """
import argparse, sys
from rich.console import Console
from tracker.runtime.watch_cmd import add_watch_command
parser = argparse.ArgumentParser(prog="tracker")
add_watch_command(parser.add_subparsers(dest="command", required=True))
args = parser.parse_args(sys.argv[1:])
sys.exit(args.func(args, Console()))
"""


async def test_410_after_compaction_while_down_reconciles(
        admin: ApiClient, namespace: str, identity: Identity, control_plane: ControlPlane, tmp_path: Path) -> None:
    """The watcher is down while etcd is compacted and the apiserver restarted: resuming from the checkpoint gets
    410, and the re-list is reconciled with the checkpoint. While it is down each object changes at most once (a
    re-list can only ever show the latest state), runs are created, and a whole run is deleted."""
    path, checkpoint = tmp_path / "capture.jsonl", tmp_path / "watch.sqlite"
    c = Cluster(admin, namespace)
    config = replace(CONFIG, namespaces=(namespace,))
    async with watcher_api(identity.kubeconfig) as api:
        capture = JsonlCapture(path)
        async with running(Watcher(api, capture, config, checkpoint=checkpoint)):
            await all_runs(c, no_fault)
            cancelled = await c.job("cancelled", pods=1)
            cancelled_wl = await c.workload(cancelled)
            stuck = await c.pod(cancelled, 0, {"batch.kubernetes.io/controller-uid": cancelled["metadata"]["uid"]})
            await wait_captured(path, c.written)
        capture.close()
        # down: one write per object, a new run, a run deleted; then history compacted and the cache gone
        victim = next(w["object"] for w in reversed(c.written) if w["object"]["metadata"]["name"] == "victim")
        await c.patch(victim, {"status": {"failed": 1}})
        fresh = await c.job("fresh", pods=1, settle=False)
        await c.workload(fresh)
        for obj in (stuck, cancelled_wl, cancelled):
            await c.delete(obj)
        revision = control_plane.compact_etcd()
        control_plane.restart_apiserver()
        capture = JsonlCapture(path)
        watcher = Watcher(api, capture, config, checkpoint=checkpoint)
        async with running(watcher):
            await wait_captured(path, c.written)
            # every stream's checkpointed version is gone (a CRD's new watch cache may first answer 429 while
            # it initializes: retried with backoff)
            await _until(lambda: watcher.stats.relists >= 7)
        capture.close()
    assert revision > 0
    assert watcher.stats.synthetic_deletes == 3
    records = captured(path)
    assert_same_history(c.written, records)
    after = records[len(records) - 6:]
    assert sorted((r["type"], r["object"]["metadata"]["name"]) for r in after) == sorted([
        ("MODIFIED", "victim"), ("ADDED", "fresh"), ("ADDED", f"job-fresh-{fresh['metadata']['uid'][:5]}"),
        ("DELETED", "cancelled"), ("DELETED", cancelled_wl["metadata"]["name"]),
        ("DELETED", stuck["metadata"]["name"])])


async def test_compaction_alone_does_not_expire_a_cached_watch(
        admin: ApiClient, namespace: str, control_plane: ControlPlane) -> None:
    """Why the 410 test restarts the apiserver: after compacting etcd, a watch from a compacted resourceVersion is
    still served from the watch cache, while a list at that exact version is refused with 410."""
    c = Cluster(admin, namespace)
    job = await c.job("probe", pods=1)
    old = job["metadata"]["resourceVersion"]
    await c.patch(job, {"metadata": {"labels": {"touched": "yes"}}}, status=False)
    control_plane.compact_etcd()
    api = KubeApi(admin)
    with pytest.raises(ApiError) as gone:
        await api.get(c.path(BATCH, "jobs"), [("resourceVersion", old), ("resourceVersionMatch", "Exact")])
    assert gone.value.status == 410
    async with api.lines(c.path(BATCH, "jobs"), [("watch", "1"), ("resourceVersion", old), ("timeoutSeconds", "1")],
                         read_timeout_s=10) as lines:
        types = [json.loads(line)["type"] async for line in lines]
    assert types[0] == "MODIFIED" and "ERROR" not in types


async def test_the_role_allows_watching_and_refuses_everything_else(
        identity: Identity, control_plane: ControlPlane) -> None:
    docs = {d["kind"]: d for d in rbac_documents(SYSTEM_NS)}
    rules = docs["ClusterRole"]["rules"]
    visibility = "visibility.kueue.x-k8s.io"  # Kueue's visibility API: get only (the pending workloads of a queue)
    assert all(r["verbs"] == (["get"] if r["apiGroups"] == [visibility] else ["get", "list", "watch"]) for r in rules)
    assert {(g, res) for r in rules for g in r["apiGroups"] for res in r["resources"]} == {
        ("", "pods"), ("", "events"), ("", "nodes"), ("batch", "jobs"), ("events.k8s.io", "events"),
        ("kueue.x-k8s.io", "workloads"), ("kueue.x-k8s.io", "clusterqueues"), ("kueue.x-k8s.io", "localqueues"),
        (visibility, "clusterqueues/pendingworkloads"), (visibility, "localqueues/pendingworkloads"),
        ("ray.io", "rayjobs"), ("ray.io", "rayclusters")}
    async with client_for(identity.kubeconfig) as sa:
        for path in (f"{BATCH}/jobs", f"{CORE}/pods", f"{CORE}/events", f"{CORE}/nodes", f"{EVENTS}/events",
                     f"{KUEUE}/workloads",
                     f"{KUEUE}/clusterqueues", f"{KUEUE}/localqueues", f"{RAY}/rayjobs", f"{RAY}/rayclusters"):
            assert (await call(sa, "GET", path, params=[("limit", "1")]))["kind"].endswith("List")
        refused = [
            ("GET", f"{CORE}/secrets", None),
            ("GET", f"{CORE}/namespaces/{SYSTEM_NS}/configmaps", None),
            ("POST", f"{BATCH}/namespaces/{SYSTEM_NS}/jobs", {"metadata": {"name": "x"}}),
            ("DELETE", f"{CORE}/namespaces/default/pods/x", None),
            ("GET", "/apis/coordination.k8s.io/v1/namespaces/default/leases/tracker-watcher", None),
            ("POST", "/apis/coordination.k8s.io/v1/namespaces/default/leases", {"metadata": {"name": "x"}}),
            ("GET", f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NS}/leases/another-lease", None),
            ("GET", f"{KUEUE}/resourceflavors", None),
            ("POST", f"{KUEUE}/clusterqueues", {"metadata": {"name": "x"}}),  # queues are read, never written
            ("DELETE", f"{KUEUE}/namespaces/default/localqueues/x", None),
            ("POST", f"{CORE}/nodes", {"metadata": {"name": "x"}}),  # Nodes are read, never written
            ("DELETE", f"{CORE}/nodes/x", None),
        ]
        for method, path, body in refused:
            with pytest.raises(ApiError) as denied:
                await call(sa, method, path, body)
            assert denied.value.status == 403, (method, path)
        # its own Lease: create, get, update
        elector = LeaseElector(KubeApi(sa), LeaseConfig(namespace=SYSTEM_NS, identity="rbac-probe",
                                                        name="tracker-watcher"))
        assert await elector.attempt() and await elector.attempt()
        await elector.release()


async def test_two_replicas_never_publish_at_the_same_time(
        admin: ApiClient, namespace: str, identity: Identity, control_plane: ControlPlane, tmp_path: Path) -> None:
    """Replica a leads; its lease traffic then freezes (a partition) while its watches still flow: it stops
    publishing at its renew deadline, and b takes over only once the lease has run out. Then b dies without
    releasing the lease, and a takes over again after the lease runs out, resuming from its own checkpoint."""
    proxy = Proxy(server_port(control_plane.server))
    lease_kubeconfig = identity.at(await proxy.start(), tmp_path / "lease-via-proxy")
    config = replace(CONFIG, namespaces=(namespace,))
    c = Cluster(admin, namespace)
    published: dict[str, list[tuple[float, Obj]]] = {"a": [], "b": []}

    class Timed:
        def __init__(self, name: str, sink: JsonlCapture) -> None:
            self.name, self.sink = name, sink

        async def publish(self, key: str, record: Change, *, source: str) -> None:
            published[self.name].append((time.monotonic(), {**record, "key": key}))
            await self.sink.publish(key, record, source=source)

        async def flush(self) -> None:
            await self.sink.flush()

    async def replica(name: str, lease_api: KubeApi, watch_api: KubeApi, stop: asyncio.Event) -> None:
        sink = JsonlCapture(tmp_path / f"{name}.jsonl")
        elector = LeaseElector(lease_api, LeaseConfig(namespace=SYSTEM_NS, identity=name, name=SA,
                                                      lease_duration_s=4, renew_deadline_s=2.5, retry_period_s=0.5))

        async def term(lease: Lease) -> None:
            await Watcher(watch_api, Timed(name, sink), config, checkpoint=tmp_path / f"{name}.sqlite",
                          leadership=lease).run(stop)

        try:
            await lead(elector, stop, body=term)
        finally:
            sink.close()

    def union() -> list[Obj]:
        return [r for _t, r in sorted(published["a"] + published["b"], key=lambda p: p[0])]

    async with client_for(identity.kubeconfig) as direct, client_for(lease_kubeconfig) as via_proxy:
        direct_api, proxied_api = KubeApi(direct, request_timeout_s=2), KubeApi(via_proxy, request_timeout_s=2)
        stop_a, stop_b = asyncio.Event(), asyncio.Event()
        a = asyncio.create_task(replica("a", proxied_api, direct_api, stop_a))
        await asyncio.sleep(1)
        b = asyncio.create_task(replica("b", direct_api, direct_api, stop_b))
        await quick_success(c, no_fault)
        await wait_captured(tmp_path / "a.jsonl", c.written)
        assert published["b"] == []  # b is a candidate only

        proxy.freeze()  # a can no longer renew; its watches (direct) keep delivering
        frozen_at = time.monotonic()
        await _until(lambda: bool(published["b"]))
        a_last, b_first = max(t for t, _ in published["a"]), min(t for t, _ in published["b"])
        # a stopped at its renew deadline (<= 2.5 s after its last renewal started, so before the freeze + 2.5 s);
        # b took over only once it had seen that renewal unchanged for the lease duration (4 s): no overlap, with at
        # least the difference between the two as a gap, however slow the machine
        assert a_last < frozen_at + 2.5 and b_first - a_last > 4 - 2.5
        await preempted(c, no_fault)
        await wait_captured(tmp_path / "b.jsonl", c.written, within_s=60, more=lambda: captured(tmp_path / "a.jsonl"))

        proxy.thaw()
        await asyncio.sleep(1)
        b.cancel()  # b dies without releasing the lease
        with suppress(asyncio.CancelledError):
            await b
        killed_at = time.monotonic()
        await rayjob(c, no_fault)  # written while nobody leads: a resumes from its checkpoint and replays it
        await wait_captured(tmp_path / "a.jsonl", c.written, within_s=60, more=lambda: captured(tmp_path / "b.jsonl"))
        a_again = min(t for t, _ in published["a"] if t > b_first)
        assert max(t for t, _ in published["b"]) < killed_at < a_again
        assert a_again - max(t for t, _ in published["b"]) > 4 - 2.5
        stop_a.set()
        await asyncio.wait_for(a, 30)
    await proxy.stop()
    assert_same_history(c.written, union(), allow_duplicates=True)  # a new leader republishes from its checkpoint


async def _until(cond: Callable[[], bool], within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


@pytest.mark.kafka
async def test_watch_publishes_keyed_changes_to_kafka(
        admin: ApiClient, namespace: str, identity: Identity, kafka_bootstrap: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`tracker watch` with Kafka: every change on the changes topic, keyed by run id, with its source header."""
    prefix = f"w{time.monotonic_ns():x}"
    for name, value in {"KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap, "KAFKA__TOPICS__CHANGES": f"{prefix}.changes",
                        "KAFKA__TOPICS__TRANSITIONS": f"{prefix}.transitions",
                        "KAFKA__TOPICS__RUN_STATE": f"{prefix}.run-state",
                        "KAFKA__TOPICS__DEAD_LETTERS": f"{prefix}.dead-letters",
                        "KAFKA__TOPICS__ALERTS": f"{prefix}.alerts", "KAFKA__TOPICS__PARTITIONS": "3",
                        "KAFKA__TOPICS__SIDE_PARTITIONS": "1", "KAFKA__TOPICS__REPLICATION_FACTOR": "1",
                        "KAFKA__REQUEST_TIMEOUT_MS": "10000", "KAFKA__CALL_TIMEOUT_S": "20"}.items():
        monkeypatch.setenv(f"TRACKER_{name}", value)
    settings = load_settings()
    assert set((await service_create_topics(settings)).values()) == {"created"}
    metrics, health, shutdown = Metrics(), Health(), Shutdown(30)
    opts = WatchOptions(config=replace(CONFIG, namespaces=(namespace,)), kubeconfig=identity.kubeconfig,
                        checkpoint=tmp_path / "watch.sqlite")
    c = Cluster(admin, namespace)
    body = asyncio.ensure_future(watch_body(settings, opts)(metrics, health, shutdown))
    await _until(lambda: b"tracker_watch_published" in metrics.exposition() and health.not_ready() == [])
    await quick_success(c, no_fault)
    consumer = kafka.make_consumer(settings.kafka, group_id=None)
    await kafka.start(consumer, settings.kafka, what="test reader")
    try:
        tps = [TopicPartition(settings.kafka.topics.changes, p) for p in range(3)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        records: list[Any] = []
        deadline = time.monotonic() + 60
        while missing(c.written, [json.loads(r.value) for r in records]):
            assert time.monotonic() < deadline, "changes did not reach Kafka"
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                records.extend(batch)
    finally:
        await kafka.stop(consumer, settings.kafka, what="test reader")
    exposition = metrics.exposition().decode()
    assert f"tracker_watch_published_total {float(len(records))}" in exposition
    shutdown.requested.set()
    await asyncio.wait_for(body, 60)
    assert {r.key.decode() for r in records} == {"run-quick"}  # one run: one key, so one partition, in order
    assert {dict(r.headers)["source"].decode().split("@")[0] for r in records} == {
        "watch:jobs", "watch:workloads", "watch:pods-job", "watch:events"}
    values = [json.loads(r.value) for r in sorted(records, key=lambda r: r.offset)]
    assert histories(fold(values)) == histories(fold(c.written))
