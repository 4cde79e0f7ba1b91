"""The watcher without a cluster: slimming, run keying, the checkpoint, leader election, and the list+watch loop
against an in-process fake apiserver (aiohttp on loopback) that pages LISTs, streams watches, compacts its history
(410), drops and stalls connections, and serves Leases with optimistic concurrency."""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog
import structlog.testing
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration
from rich.console import Console

from sim import builders as b
from tests.support.laws import fold, histories
from tracker.core.model import DeadLetter
from tracker.core.reducer import Reducer
from tracker.runtime.watch_cmd import add_watch_command
from tracker.settings import KafkaSettings, SourceSettings
from tracker.shell.bus import InProcessBus
from tracker.shell.capture import Record, read_capture
from tracker.shell.changes import ChangesProducer
from tracker.shell.leader import LeaseConfig, LeaseElector, lead
from tracker.shell.slim import slim
from tracker.shell.watch import (
    Backoff,
    BusPublisher,
    Change,
    Checkpoint,
    JsonlCapture,
    KubeApi,
    LeadershipLost,
    RunKeyer,
    Snapshot,
    Watcher,
    WatchFatal,
    WatchSettings,
)
from tracker.shell.watch import stream as watch_module

Obj = dict[str, Any]
NS = "team-a"

# ------------------------------------------------------------------------------------------ realistic objects


def job_run(name: str, *, preempted: bool = False) -> list[Obj]:
    """Watch events of one Kueue-managed batch Job run, in a valid per-object order (sequence (a) or (c))."""
    job_uid = b.uid("job", name)
    wl_name = b.workload_name("Job", "batch", name, job_uid)
    wl_uid = b.uid("wl", name)
    labels = {"kueue.x-k8s.io/queue-name": "lq", "taugrid.io/run-id": f"run-{name}", "taugrid.io/project": "p"}
    tmpl = b.template_spec(containers=[b.container(name="trainer", image="img", command=["train"], cpu_millis=8000,
                                                   memory_mi=1024, gpus=1)], restart_policy="Never")
    meta = b.object_meta(name=name, namespace=NS, uid=job_uid, created=b.at("09:00:00"), labels=labels,
                         annotations={"taugrid.io/git-commit": "abc123", "kubectl.kubernetes.io/last-applied-"
                                      "configuration": "{" + "x" * 4000 + "}"})
    meta["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]

    def job(suspend: bool, status: Obj) -> Obj:
        spec = b.job_spec(uid=job_uid, template=b.pod_template({}, tmpl), parallelism=2, completions=2,
                          backoff_limit=3, suspend=suspend)
        return b.job(meta=meta, spec=spec, status=status)

    wl_meta = b.object_meta(name=wl_name, namespace=NS, uid=wl_uid, created=b.at("09:00:01"),
                            labels={"kueue.x-k8s.io/job-uid": job_uid},
                            owners=[b.owner_reference("batch/v1", "Job", name, job_uid)])
    spec = b.workload_spec(api="v1beta1", queue="lq", pod_sets=[b.pod_set("main", 2, b.pod_template({}, tmpl))],
                           priority=100, priority_class="low", active=True)

    def wl(conds: list[Obj], admitted: bool, evictions: int = 0) -> Obj:
        adm = b.admission("cq", [b.pod_set_assignment("main", 2, {"cpu": "f"}, {"cpu": "16"})]) if admitted else None
        ev = [{"reason": "Preempted", "underlyingCause": "", "count": evictions}] if evictions else []
        return b.workload(api="v1beta1", meta=wl_meta, spec=spec,
                          status=b.workload_status(api="v1beta1", conditions=conds, admission=adm, evictions=ev))

    def c(t: str, s: bool, r: str, when: str) -> Obj:
        return b.condition(t, s, r, f"{t} {r}", b.at(when), generation=1)

    pending = [c("QuotaReserved", False, "Pending", "09:00:01")]
    admitted = [c("QuotaReserved", True, "QuotaReserved", "09:00:05"), c("Admitted", True, "Admitted", "09:00:05")]
    out = [{"type": "ADDED", "object": job(True, b.job_status(conditions=[
                b.job_condition("Suspended", True, "JobSuspended", "Job suspended", b.at("09:00:00"))]))},
           {"type": "ADDED", "object": wl(pending, False)},
           {"type": "MODIFIED", "object": wl(admitted, True)}]
    start = "09:00:06"
    if preempted:
        evicted = [*admitted, c("Evicted", True, "Preempted", "09:01:00"), c("Preempted", True, "InClusterQueue",
                                                                                  "09:01:00")]
        requeued = [c("QuotaReserved", False, "Pending", "09:01:10"), c("Admitted", False, "NoReservation", "09:01:10"),
                    c("Evicted", True, "Preempted", "09:01:00"), c("Requeued", True, "Preempted", "09:01:10")]
        readmitted = [c("QuotaReserved", True, "QuotaReserved", "09:02:00"), c("Admitted", True, "Admitted",
                                                                               "09:02:00"),
                      c("Evicted", False, "QuotaReserved", "09:02:00"), c("Requeued", True, "Preempted", "09:01:10")]
        out += [{"type": "MODIFIED", "object": wl(evicted, True, 1)},
                {"type": "MODIFIED", "object": wl(requeued, False, 1)},
                {"type": "MODIFIED", "object": wl(readmitted, True, 1)}]
        start = "09:02:01"
    for i in range(2):
        pod_name = f"{name}-{b.rand_suffix(name, str(i))}"
        pod_uid = b.uid("pod", name, str(i))
        pmeta = b.object_meta(name=pod_name, namespace=NS, uid=pod_uid, created=b.at(start),
                              labels={"batch.kubernetes.io/controller-uid": job_uid, "batch.kubernetes.io/job-name":
                                      name, "app": "x"},
                              owners=[b.owner_reference("batch/v1", "Job", name, job_uid)])
        pmeta["managedFields"] = [{"manager": "kubelet"}]
        sched = b.pod_condition("PodScheduled", True, b.at(start))
        running = b.pod_status(phase="Running", conditions=[sched], containers=[b.container_status(
            name="trainer", image="img", state=b.running_state(b.at(start) + 2000), ready=True, started=True)])
        done = b.pod_status(phase="Succeeded", conditions=[sched], containers=[b.container_status(
            name="trainer", image="img", state=b.terminated_state(exit_code=0, reason="Completed",
                                                                  started=b.at(start) + 2000, finished=b.at("09:05:00"),
                                                                  container_id="c"))])
        spec = b.pod_spec(tmpl, "node-1")
        out += [{"type": "ADDED", "object": b.pod(meta=pmeta, spec=spec, status=running)},
                {"type": "MODIFIED", "object": b.pod(meta=pmeta, spec=spec, status=done)}]
        for api, make in (("v1", b.core_event), ("events.k8s.io/v1", b.events_v1_event)):
            emeta = b.object_meta(name=b.event_name(pod_name, b.at(start)), namespace=NS,
                                  uid=b.uid("ev", pod_name, api), created=b.at(start))
            ev = make(meta=emeta, regarding=b.object_reference("v1", "Pod", NS, pod_name, pod_uid),
                      reason="Scheduled", message="Successfully assigned", warning=False, component="default-scheduler",
                      instance="", first=b.at(start), last=b.at(start), count=1, series=False)
            out.append({"type": "ADDED", "object": ev})
    out.append({"type": "MODIFIED", "object": job(False, b.job_status(
        conditions=[b.job_condition("Complete", True, "CompletionsReached", "done", b.at("09:05:01"))],
        start=b.at(start), completion=b.at("09:05:01"), succeeded=2))})
    return out


def rayjob_run(name: str) -> list[Obj]:
    """A RayJob with its RayCluster, head pod and submitter Job and pod."""
    rj_uid = b.uid("rayjob", name)
    head = b.template_spec(containers=[b.container(name="ray-head", image="ray", command=["ray"], cpu_millis=1000,
                                                   memory_mi=512)], restart_policy="Always")
    cluster_spec = b.ray_cluster_spec(ray_version="2.49.0", head_template=b.pod_template({}, head),
                                      worker_groups=[b.worker_group("gpu", 2, b.pod_template({}, head))])
    meta = b.object_meta(name=name, namespace=NS, uid=rj_uid, created=b.at("10:00:00"),
                         labels={"kueue.x-k8s.io/queue-name": "lq"})
    spec = b.rayjob_spec(entrypoint="python x.py", cluster_spec=cluster_spec,
                         submitter_template=b.pod_template({}, head), backoff_limit=0, suspend=False, ttl_s=60)
    cluster = f"{name}-abcde"
    rc_uid = b.uid("rc", name)
    rc_meta = b.object_meta(name=cluster, namespace=NS, uid=rc_uid, created=b.at("10:00:02"),
                            owners=[b.owner_reference("ray.io/v1", "RayJob", name, rj_uid)])
    rc_ready = b.raycluster_status(conditions=[], desired={"cpu": "3", "memory": "1Gi"}, workers=2, ready_workers=2,
                                   head={}, updated=b.at("10:00:30"), generation=1, state="ready",
                                   transitions={"ready": b.at("10:00:30")})
    sub_uid = b.uid("submitter", name)
    sub_meta = b.object_meta(name=name, namespace=NS, uid=sub_uid, created=b.at("10:00:31"),
                             owners=[b.owner_reference("ray.io/v1", "RayJob", name, rj_uid)])
    head_pod = b.object_meta(name=f"{cluster}-head-xyz12", namespace=NS, uid=b.uid("head", name),
                             created=b.at("10:00:03"), labels={"ray.io/cluster": cluster, "ray.io/node-type": "head"},
                             owners=[b.owner_reference("ray.io/v1", "RayCluster", cluster, rc_uid)])
    status_running = b.rayjob_status(deployment="Running", generation=1, cluster_status={}, job_status="RUNNING",
                                     cluster=cluster, start=b.at("10:00:01"), ray_start=b.at("10:00:40"))
    status_done = b.rayjob_status(deployment="Complete", generation=1, cluster_status={}, job_status="SUCCEEDED",
                                  cluster=cluster, start=b.at("10:00:01"), end=b.at("10:09:00"),
                                  ray_start=b.at("10:00:40"), ray_end=b.at("10:08:50"), counts=(1, 0))
    pod_status = b.pod_status(phase="Running", conditions=[b.pod_condition("PodScheduled", True, b.at("10:00:04"))])
    return [
        {"type": "ADDED", "object": b.rayjob(meta=meta, spec=spec, status=None)},
        {"type": "ADDED", "object": b.raycluster(meta=rc_meta, spec=cluster_spec, status=rc_ready)},
        {"type": "ADDED", "object": b.pod(meta=head_pod, spec=b.pod_spec(head, "n"), status=pod_status)},
        {"type": "ADDED", "object": b.job(meta=sub_meta, spec=b.job_spec(
            uid=sub_uid, template=b.pod_template({}, head), parallelism=1, completions=1, backoff_limit=2,
            suspend=False), status=b.job_status())},
        {"type": "MODIFIED", "object": b.rayjob(meta=meta, spec=spec, status=status_running)},
        {"type": "MODIFIED", "object": b.rayjob(meta=meta, spec=spec, status=status_done)},
    ]


def slimmed(events: list[Obj]) -> list[Obj]:
    return [{"type": e["type"], "object": slim(e["object"])} for e in events]


# ------------------------------------------------------------------------------------------ slimming


def test_slim_objects_fold_to_the_same_histories() -> None:
    events = job_run("train") + job_run("victim", preempted=True) + rayjob_run("rj")
    full = histories(fold(events))
    assert set(full) == {"run-train", "run-victim", b.uid("rayjob", "rj")}
    assert full["run-victim"]["run"]["attempts"] == 2
    assert histories(fold(slimmed(events))) == full


def _with_secrets(events: list[Obj]) -> list[Obj]:
    """The events with secrets in what ran: a Job's args (a flag's value, a flag's next argument, a SAS URL) and
    image, a RayJob's entrypoint and its worker group's image."""
    out = copy.deepcopy(events)
    for e in out:
        obj = e["object"]
        if obj["kind"] == "Job" and obj["metadata"]["name"] == "train":
            c = obj["spec"]["template"]["spec"]["containers"][0]
            c["image"] = "acr.io/train:1?sv=2024&sig=SASSIG0123456789abcdef"
            c["args"] = ["--hf-token=hf_SECRET0123456789", "--api-key", "APIKEY0123456789",
                         "https://store/blob?sp=r&sig=ARGSIG0123456789abcdef", "--lr", "3e-4"]
        elif obj["kind"] == "RayJob":
            obj["spec"]["entrypoint"] = "python x.py --token RAYTOKEN0123456789 --epochs 3"
            group = obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
            group["template"]["spec"]["containers"][0]["image"] = "ray:2.49?sig=RAYSIG0123456789"
    return out


_SECRETS = ("SASSIG", "hf_SECRET", "APIKEY", "ARGSIG", "RAYTOKEN", "RAYSIG")


def test_slim_keeps_what_ran_redacted_and_folds_to_the_same_histories() -> None:
    events = _with_secrets(job_run("train") + rayjob_run("rj"))
    full = histories(fold(events))
    small = slimmed(events)
    assert not any(s in json.dumps(small) for s in _SECRETS)  # what the watcher publishes carries none
    assert histories(fold(small)) == full
    job = full["run-train"]["run"]
    assert job["images"] == ["acr.io/train:1?sv=2024&sig=[redacted]"]
    assert job["entrypoint"] == ("train --hf-token=[redacted] --api-key [redacted] "
                                 "'https://store/blob?sp=r&sig=[redacted]' --lr 3e-4")
    ray = full[b.uid("rayjob", "rj")]["run"]
    assert ray["entrypoint"] == "python x.py --token [redacted] --epochs 3"
    assert ray["images"][-1] == "ray:2.49?sig=[redacted]" and len(ray["images"]) == len(set(ray["images"]))
    assert not any(s in json.dumps(full) for s in _SECRETS)


def test_slim_drops_what_the_reducer_does_not_read() -> None:
    events = job_run("train")
    job, pod = events[0]["object"], events[3]["object"]
    small_job, small_pod = slim(job), slim(pod)
    assert "managedFields" not in small_job["metadata"] and "managedFields" not in small_pod["metadata"]
    assert small_job["metadata"]["annotations"] == {"taugrid.io/git-commit": "abc123"}
    assert small_job["metadata"]["labels"] == job["metadata"]["labels"]  # a root keeps its labels
    assert small_pod["metadata"]["labels"] == {"batch.kubernetes.io/controller-uid": b.uid("job", "train")}
    assert small_pod["spec"] == {"nodeName": "node-1", "containers": [
        {"name": "trainer", "resources": pod["spec"]["containers"][0]["resources"]}]}
    # of the pod template, only what ran (tracker.core.provenance): the containers' image, command and args
    assert small_job["spec"]["template"] == {"spec": {"containers": [{"image": "img", "command": ["train"]}]}}
    for full, small in ((job, small_job), (pod, small_pod)):
        assert len(json.dumps(small)) * 2 < len(json.dumps(full))


def test_slim_leaves_malformed_values_for_the_reducer_to_reject() -> None:
    job = copy.deepcopy(job_run("bad")[0]["object"])
    job["status"]["conditions"] = "not a list"
    assert slim(job)["status"]["conditions"] == "not a list"
    red = fold([{"type": "ADDED", "object": slim(job)}])
    assert red.stats.dead_letters == 1 and "conditions must be a list" in red.flush().dead_letters[0].detail
    with pytest.raises(ValueError, match="no record shape"):
        slim({"kind": "ConfigMap"})


# ------------------------------------------------------------------------------------------ run keying


def test_run_keys_hold_until_the_owner_and_release_in_order() -> None:
    events = job_run("train")
    pods = [e for e in events if e["object"]["kind"] == "Pod"]
    keys = RunKeyer(max_held=100, max_runs=10)
    for e in pods:
        assert keys.key(e["type"], e["object"], source="src") == []
    assert keys.held == 4
    released = keys.key("ADDED", events[0]["object"], source="src")
    assert [(r[0], r[2]["metadata"]["uid"]) for r in released] == (
        [("run-train", b.uid("job", "train"))] + [("run-train", e["object"]["metadata"]["uid"]) for e in pods])
    pod_event = next(e for e in events if e["object"]["kind"] == "Event")
    assert keys.key("ADDED", pod_event["object"], source="src")[0][0] == "run-train"  # bound through its pod
    node_event = copy.deepcopy(pod_event["object"])
    node_event["involvedObject"]["kind"] = "Node"
    assert keys.key("ADDED", node_event, source="src") == [] and keys.ignored == 1


def test_run_keys_forget_the_least_recent_run_and_drop_the_oldest_held() -> None:
    keys = RunKeyer(max_held=2, max_runs=1)
    a, c = job_run("a"), job_run("c")
    keys.key("ADDED", a[0]["object"], source="s")
    keys.key("ADDED", c[0]["object"], source="s")  # run-a forgotten
    assert keys.key("ADDED", a[3]["object"], source="s") == []  # a's pod waits again
    keys.key("ADDED", a[5]["object"], source="s")
    keys.key("ADDED", a[6]["object"], source="s")
    assert keys.dropped == 1 and keys.just_dropped[0][1][1]["metadata"]["uid"] == a[3]["object"]["metadata"]["uid"]


def test_run_keys_restore_binds_dependents_of_checkpointed_roots() -> None:
    objs = [slim(e["object"]) for e in rayjob_run("rj")]
    keys = RunKeyer(max_held=10, max_runs=10)
    keys.restore(reversed(objs))  # any order: pods after their RayCluster after their RayJob
    head_event = b.core_event(meta=b.object_meta(name="e", namespace=NS, uid="e1", created=b.at("10:00:05")),
                              regarding=b.object_reference("v1", "Pod", NS, "h", b.uid("head", "rj")), reason="Pulled",
                              message="m", warning=False, component="kubelet", instance="", first=b.at("10:00:05"),
                              last=b.at("10:00:05"), count=1, series=False)
    assert [k[0] for k in keys.key("ADDED", head_event, source="s")] == [b.uid("rayjob", "rj")]


def test_backoff_is_jittered_doubling_and_capped() -> None:
    backoff = Backoff(base_s=0.5, cap_s=4.0, rng=random.Random(1))
    delays = [backoff.next() for _ in range(8)]
    for n, d in enumerate(delays):
        cap = min(4.0, 0.5 * 2**n)
        assert cap / 2 <= d <= cap
    assert max(delays) <= 4.0 and len(set(delays)) == len(delays)
    backoff.reset()
    assert backoff.next() <= 0.5


def test_checkpoint_round_trip_is_incremental(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "cp.sqlite")
    pod = slim(job_run("a")[3]["object"])
    cp.save(Snapshot({"s@*": "10", "t@*": None}, {"s@*": {"u1": ("5", b"{}"), "u2": ("6", b"{}")}},
                     [("owner", ("ADDED", pod, "src"))]))
    cp.save(Snapshot({"s@*": "12", "t@*": None}, {"s@*": {"u1": None, "u3": ("7", b'{"a":1}')}}, []))
    cp.close()
    saved = Checkpoint(tmp_path / "cp.sqlite").load()
    assert saved.rvs == {"s@*": "12", "t@*": None}
    assert saved.known == {"s@*": {"u2": ("6", b"{}"), "u3": ("7", b'{"a":1}')}}
    assert saved.held == []
    cp2 = Checkpoint(tmp_path / "cp.sqlite")
    cp2.save(Snapshot({}, {}, [("owner", ("ADDED", pod, "src"))]))
    assert cp2.load().held == [("ADDED", pod, "src")]


# ------------------------------------------------------------------------------------------ fake apiserver

GROUPS = {"batch": ["v1"], "kueue.x-k8s.io": ["v1beta1"], "ray.io": ["v1"], "events.k8s.io": ["v1"],
          "coordination.k8s.io": ["v1"]}
PLURALS = {"Job": ("batch", "v1", "jobs"), "Workload": ("kueue.x-k8s.io", "v1beta1", "workloads"),
           "RayJob": ("ray.io", "v1", "rayjobs"), "RayCluster": ("ray.io", "v1", "rayclusters"),
           "Pod": ("", "v1", "pods"), "Event": ("events.k8s.io", "v1", "events"),
           "Lease": ("coordination.k8s.io", "v1", "leases"), "Node": ("", "v1", "nodes")}


class FakeApiServer:
    """Enough of kube-apiserver for the watcher: discovery, paginated LIST, WATCH with bookmarks and 410s."""

    def __init__(self) -> None:
        self.rv = 100
        self.objects: dict[tuple[str, str], dict[str, Obj]] = {}  # (group, plural) -> uid -> object
        self.log: list[tuple[int, str, str, str, Obj]] = []  # (rv, group, plural, type, object)
        self.oldest = 0  # watches from before this resourceVersion get 410
        self.groups = dict(GROUPS)
        self.stalled = False
        self.garbage: bytes | None = None  # sent once, on the next watch, before anything else
        self.changed = asyncio.Condition()
        self.watches: list[web.Request] = []
        self.requests: list[str] = []
        self.discoveries: list[str] = []
        self.forbidden: set[str] = set()  # plurals RBAC does not allow (403 on every request)
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1", self.core_discovery)
        app.router.add_get("/apis/{group}", self.group_discovery)
        app.router.add_get("/apis/{group}/{version}", self.version_discovery)
        for prefix in ("/api/{version}", "/apis/{group}/{version}"):
            app.router.add_get(prefix + "/{plural}", self.collection)
            app.router.add_get(prefix + "/namespaces/{ns}/{plural}", self.collection)
            app.router.add_get(prefix + "/namespaces/{ns}/{plural}/{name}", self.get_one)
            app.router.add_post(prefix + "/namespaces/{ns}/{plural}", self.create_one)
            app.router.add_put(prefix + "/namespaces/{ns}/{plural}/{name}", self.replace_one)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self.kill_watches()
        assert self.runner is not None
        await self.runner.cleanup()

    # ---------------------------------------------------------------- the store

    async def write(self, obj: Obj, etype: str | None = None) -> Obj:
        """Create or update (or, with etype DELETED, delete) ``obj``; returns it as stored."""
        group, _v, plural = PLURALS[obj["kind"]]
        store = self.objects.setdefault((group, plural), {})
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        if etype == "DELETED":
            store.pop(meta["uid"], None)
        else:
            etype = "MODIFIED" if meta["uid"] in store else "ADDED"
            store[meta["uid"]] = obj
        self.log.append((self.rv, group, plural, etype, obj))
        async with self.changed:
            self.changed.notify_all()
        return obj

    async def delete(self, obj: Obj) -> Obj:
        return await self.write(obj, "DELETED")

    def compact(self) -> None:
        self.oldest = self.rv

    def kill_watches(self) -> None:
        """Cut every open watch connection (as a dying proxy or apiserver would)."""
        for request in self.watches:
            if request.transport is not None:
                request.transport.abort()
        self.watches.clear()

    # ---------------------------------------------------------------- handlers

    async def core_discovery(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIResourceList", "groupVersion": "v1",
                                  "resources": [{"name": "pods"}, {"name": "events"}, {"name": "nodes"}]})

    async def group_discovery(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        self.discoveries.append(group)
        if group not in self.groups:
            return self.status(404, "NotFound", "the server could not find the requested resource")
        versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in self.groups[group]]
        return web.json_response({"kind": "APIGroup", "name": group, "versions": versions,
                                  "preferredVersion": versions[0]})

    async def version_discovery(self, request: web.Request) -> web.Response:
        group, version = request.match_info["group"], request.match_info["version"]
        if version not in self.groups.get(group, []):
            return self.status(404, "NotFound", "not served")
        names = [p for g, v, p in PLURALS.values() if g == group and v == version]
        return web.json_response({"kind": "APIResourceList", "resources": [{"name": n} for n in names]})

    def served(self, request: web.Request) -> tuple[str, str] | None:
        group = request.match_info.get("group", "")
        version, plural = request.match_info["version"], request.match_info["plural"]
        if group and version not in self.groups.get(group, []):
            return None
        return group, plural

    def matches(self, obj: Obj, request: web.Request) -> bool:
        ns = request.match_info.get("ns")
        if ns and obj["metadata"].get("namespace") != ns:
            return False
        labels = obj["metadata"].get("labels") or {}
        for term in filter(None, request.query.get("labelSelector", "").split(",")):
            if (term[1:] in labels) if term.startswith("!") else (term not in labels):
                return False
        return True

    async def collection(self, request: web.Request) -> web.StreamResponse:
        key = self.served(request)
        self.requests.append(f"{'WATCH' if request.query.get('watch') else 'LIST'} {request.path} "
                             f"selector={request.query.get('labelSelector', '')}")
        if key is None:
            return self.status(404, "NotFound", "not served")
        if key[1] in self.forbidden:
            return self.status(403, "Forbidden", f'{key[1]} is forbidden: User "system:serviceaccount:tracker:'
                                                 f'tracker-watcher" cannot list resource "{key[1]}"')
        if request.query.get("watch"):
            return await self.watch(request, key)
        cont = request.query.get("continue")
        offset, snapshot = (int(p) for p in cont.split(":")) if cont else (0, self.rv)
        if cont and snapshot < self.oldest:
            return self.status(410, "Expired", "The provided continue parameter is too old")
        items = sorted((o for o in self.objects.get(key, {}).values() if self.matches(o, request)),
                       key=lambda o: o["metadata"]["name"])
        limit = int(request.query.get("limit", "0")) or len(items)
        page = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items[offset:offset + limit]]
        meta: Obj = {"resourceVersion": str(snapshot)}
        if offset + limit < len(items):
            meta["continue"] = f"{offset + limit}:{snapshot}"
        return web.json_response({"kind": "List", "metadata": meta, "items": page})

    async def watch(self, request: web.Request, key: tuple[str, str]) -> web.StreamResponse:
        since = int(request.query["resourceVersion"])
        deadline = time.monotonic() + int(request.query.get("timeoutSeconds", "60"))
        resp = web.StreamResponse()
        await resp.prepare(request)
        self.watches.append(request)
        if since < self.oldest:
            await resp.write(json.dumps({"type": "ERROR", "object": {
                "kind": "Status", "status": "Failure", "reason": "Expired", "code": 410,
                "message": f"too old resource version: {since} ({self.oldest})"}}).encode() + b"\n")
            return resp
        if self.garbage is not None:
            garbage, self.garbage = self.garbage, None
            await resp.write(garbage + b"\n")
        sent = since
        while time.monotonic() < deadline:
            if not self.stalled:
                for rv, g, p, etype, obj in self.log:
                    if rv > sent and (g, p) == key and self.matches(obj, request):
                        await resp.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
                sent = self.rv
                if request.query.get("allowWatchBookmarks"):
                    await resp.write(json.dumps({"type": "BOOKMARK", "object": {
                        "kind": "Bookmark", "metadata": {"resourceVersion": str(sent)}}}).encode() + b"\n")
            async with self.changed:
                with suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), max(0.01, min(0.5, deadline - time.monotonic())))
        return resp

    async def get_one(self, request: web.Request) -> web.Response:
        key = self.served(request)
        if key is None:
            return self.status(404, "NotFound", "not served")
        for obj in self.objects.get(key, {}).values():
            if obj["metadata"]["name"] == request.match_info["name"] and self.matches(obj, request):
                return web.json_response(obj)
        return self.status(404, "NotFound", "not found")

    async def create_one(self, request: web.Request) -> web.Response:
        body = await request.json()
        key = self.served(request)
        if key is None:
            return self.status(404, "NotFound", "not served")
        body["metadata"]["namespace"] = request.match_info["ns"]
        if any(o["metadata"]["name"] == body["metadata"]["name"] for o in self.objects.get(key, {}).values()):
            return self.status(409, "AlreadyExists", "exists")
        return web.json_response(await self.write({"kind": "Lease", **body}), status=201)

    async def replace_one(self, request: web.Request) -> web.Response:
        body = await request.json()
        key = self.served(request)
        if key is None:
            return self.status(404, "NotFound", "not served")
        for obj in self.objects.get(key, {}).values():
            if obj["metadata"]["name"] == request.match_info["name"]:
                if body["metadata"].get("resourceVersion") != obj["metadata"]["resourceVersion"]:
                    return self.status(409, "Conflict", "the object has been modified")
                body["metadata"]["uid"] = obj["metadata"]["uid"]
                return web.json_response(await self.write({"kind": "Lease", **body}))
        return self.status(404, "NotFound", "not found")

    @staticmethod
    def status(code: int, reason: str, message: str) -> web.Response:
        return web.json_response({"kind": "Status", "status": "Failure", "reason": reason, "message": message,
                                  "code": code}, status=code)


@pytest.fixture
async def fake() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer()
    await server.start()
    yield server
    await server.stop()


@asynccontextmanager
async def api_for(server: FakeApiServer, request_timeout_s: float = 5.0) -> AsyncIterator[KubeApi]:
    cfg = Configuration(host=server.url)
    async with ApiClient(cfg) as client:
        yield KubeApi(client, connect_timeout_s=2, request_timeout_s=request_timeout_s)


class Recorder:
    """A Publisher that keeps what it is given, with the time it was given."""

    def __init__(self) -> None:
        self.records: list[tuple[str, Change, str]] = []
        self.times: list[float] = []
        self.letters: list[DeadLetter] = []
        self.flushes = 0

    async def publish(self, key: str, record: Change, *, source: str) -> None:
        self.records.append((key, record, source))
        self.times.append(time.monotonic())

    async def dead_letter(self, letter: DeadLetter) -> None:
        self.letters.append(letter)

    async def flush(self) -> None:
        self.flushes += 1

    def seen(self) -> list[tuple[str, str, str]]:
        """(type, kind/name, resourceVersion) of every record."""
        return [(r["type"], f"{r['object']['kind']}/{r['object']['metadata']['name']}",
                 r["object"]["metadata"]["resourceVersion"]) for _k, r, _s in self.records]


FAST = WatchSettings(namespaces=(NS,), page_size=2, watch_timeout_s=3, read_timeout_s=2, backoff_base_s=0.02,
                   backoff_cap_s=0.1, unavailable_retry_cap_s=0.2, checkpoint_interval_s=0.05)


@asynccontextmanager
async def watching(watcher: Watcher) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    await asyncio.wait_for(watcher.wait_synced(), 10)
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def until(cond: Callable[[], bool], within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def objects_of(events: list[Obj]) -> Iterator[Obj]:
    """Latest state per object, in first-seen order."""
    latest: dict[str, Obj] = {}
    for e in events:
        latest[e["object"]["metadata"]["uid"]] = e["object"]
    yield from latest.values()


# ------------------------------------------------------------------------------------------ list + watch


async def test_lists_in_tiers_then_watches_and_keys_every_record(fake: FakeApiServer) -> None:
    events = job_run("train")
    stored = {}
    for obj in reversed(list(objects_of(events))):  # pods and events exist before their Job in the list
        stored[obj["metadata"]["uid"]] = await fake.write(obj)
    rec = Recorder()
    async with api_for(fake) as api:
        watcher = Watcher(api, rec, FAST)
        async with watching(watcher):
            listed = len(rec.records)
            assert listed == len(stored)
            assert {k for k, _r, _s in rec.records} == {"run-train"}
            assert rec.records[0][1]["object"]["kind"] == "Job"  # tier 0 lists first: nothing had to wait
            assert all(r["object"]["apiVersion"] and r["type"] == "ADDED" for _k, r, _s in rec.records)
            assert watcher.keys.held == 0
            job = copy.deepcopy(stored[b.uid("job", "train")])
            job["metadata"]["labels"]["touched"] = "1"
            job = await fake.write(job)
            await until(lambda: len(rec.records) == listed + 1)
            assert rec.seen()[-1] == ("MODIFIED", "Job/train", job["metadata"]["resourceVersion"])
            # a pod of another run arrives before its Job: held, then released right after it
            other = job_run("other")
            await fake.write(other[3]["object"])
            await until(lambda: watcher.keys.held == 1)
            assert len(rec.records) == listed + 1
            await fake.write(other[0]["object"])
            await until(lambda: len(rec.records) == listed + 3)
            assert [s[1] for s in rec.seen()[-2:]] == ["Job/other", f"Pod/{other[3]['object']['metadata']['name']}"]
    assert watcher.stats.published == len(rec.records) and watcher.stats.record_bytes > 0
    pod_requests = [r for r in fake.requests if "/pods" in r]
    assert pod_requests and all("selector=batch.kubernetes.io/controller-uid" in r or "selector=ray.io/cluster,!" in r
                                for r in pod_requests)


async def test_410_relists_and_reconciles_with_what_was_known(fake: FakeApiServer) -> None:
    a, c, d = job_run("a")[0]["object"], job_run("c")[0]["object"], job_run("d")[0]["object"]
    a, d = await fake.write(a), await fake.write(d)
    gone = await fake.write(job_run("gone")[0]["object"])
    rec = Recorder()
    async with api_for(fake) as api:
        watcher = Watcher(api, rec, FAST)
        async with watching(watcher):
            await until(lambda: len(rec.records) == 3)
            fake.stalled = True  # the watcher sees nothing of what follows ...
            a2 = copy.deepcopy(a)
            a2["status"]["failed"] = 1
            a2 = await fake.write(a2)
            await fake.delete(gone)
            c = await fake.write(c)
            fake.compact()  # ... and the history is compacted before it reconnects
            fake.stalled = False
            fake.kill_watches()
            await until(lambda: len(rec.records) == 6)
            await asyncio.sleep(0.2)
    assert sorted(rec.seen()[3:]) == sorted([
        ("MODIFIED", "Job/a", a2["metadata"]["resourceVersion"]),
        ("ADDED", "Job/c", c["metadata"]["resourceVersion"]),
        ("DELETED", "Job/gone", gone["metadata"]["resourceVersion"]),  # synthetic, with the last known state
    ])
    assert "Job/d" not in [s[1] for s in rec.seen()[3:]]  # unchanged: not published again
    assert watcher.stats.relists >= 1 and watcher.stats.synthetic_deletes == 1


async def test_a_silent_connection_is_dropped_and_resumed_without_loss(fake: FakeApiServer) -> None:
    rec = Recorder()
    async with api_for(fake) as api:
        watcher = Watcher(api, rec, replace(FAST, read_timeout_s=0.5, watch_timeout_s=30))
        async with watching(watcher):
            fake.stalled = True
            job = await fake.write(job_run("late")[0]["object"])
            await asyncio.sleep(1.5)  # > read timeout: the watcher reconnects, and the server now answers
            fake.stalled = False
            await until(lambda: rec.seen() == [("ADDED", "Job/late", job["metadata"]["resourceVersion"])])
    assert watcher.stats.reconnects >= 1


async def test_a_missing_crd_is_reported_once_and_watched_once_installed(fake: FakeApiServer) -> None:
    del fake.groups["kueue.x-k8s.io"]
    rec = Recorder()
    events = job_run("train")
    await fake.write(events[0]["object"])
    async with api_for(fake) as api:
        watcher = Watcher(api, rec, replace(FAST, queues=False))  # Workloads alone: one stream
        async with watching(watcher):
            await until(lambda: fake.discoveries.count("kueue.x-k8s.io") >= 4)  # retried, with a capped backoff
            assert watcher.stats.unavailable == 1  # ... but reported once
            assert len(rec.records) == 1  # the other streams run meanwhile
            fake.groups["kueue.x-k8s.io"] = ["v1beta1"]
            wl = await fake.write(events[1]["object"])
            await until(lambda: ("ADDED", f"Workload/{wl['metadata']['name']}", wl["metadata"]["resourceVersion"])
                        in rec.seen())
    assert rec.records[-1][0] == "run-train" and watcher.stats.unavailable == 1


def gpu_node(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "creationTimestamp": "2026-08-20T07:00:00Z",
                         "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
                                    "kubernetes.io/hostname": name}},
            "status": {"capacity": {"cpu": "96", "nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "lastHeartbeatTime": "2026-08-20T09:00:00Z",
                                       "lastTransitionTime": "2026-08-20T07:01:00Z"}]}}


async def test_nodes_are_watched_cluster_wide_keyed_by_node_and_slimmed(fake: FakeApiServer) -> None:
    rec = Recorder()
    await fake.write(gpu_node("gpu-0"))
    async with api_for(fake) as api:
        watcher = Watcher(api, rec, replace(FAST, queues=False))  # every stream but the queues' is served
        async with watching(watcher):
            await fake.write(gpu_node("gpu-1"))
            await until(lambda: len([k for k, _r, _s in rec.records if k.startswith("node:")]) == 2)
    nodes = {k: r["object"] for k, r, _s in rec.records if k.startswith("node:")}
    assert sorted(nodes) == ["node:gpu-0", "node:gpu-1"] and watcher.stats.unavailable == 0
    assert nodes["node:gpu-0"]["metadata"]["labels"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                                         "nvidia.com/gpu.count": "8"}
    assert nodes["node:gpu-0"]["status"]["capacity"] == {"nvidia.com/gpu": "8"}
    assert any(r.startswith("LIST /api/v1/nodes ") for r in fake.requests)  # cluster-wide, not per namespace


async def test_nodes_forbidden_by_rbac_are_said_once_and_the_watcher_goes_on(fake: FakeApiServer) -> None:
    fake.forbidden.add("nodes")
    rec = Recorder()
    await fake.write(gpu_node("gpu-0"))
    await fake.write(job_run("train")[0]["object"])
    async with api_for(fake) as api:
        # a fresh logger for the streams (bound when the watcher makes them): in a whole run an earlier test has
        # configured logging with cache_logger_on_first_use, and the module's cached logger would miss capture_logs
        from unittest.mock import patch

        from tracker.shell.watch import stream as stream_module
        with structlog.testing.capture_logs() as logs, \
                patch.object(stream_module, "log", structlog.get_logger("tracker.watch")):
            watcher = Watcher(api, rec, replace(FAST, queues=False))
            async with watching(watcher):
                await until(lambda: sum(r.startswith("LIST /api/v1/nodes") for r in fake.requests) >= 3)
                job = await fake.write(job_run("later")[0]["object"])
                await until(lambda: ("ADDED", "Job/later", job["metadata"]["resourceVersion"]) in rec.seen())
    assert [k for k, _r, _s in rec.records] == ["run-train", "run-later"]  # the runs, no node
    warned = [e for e in logs if e["event"] == "watch_resource_unavailable"]
    assert len(warned) == 1 and warned[0]["status"] == 403 and watcher.stats.unavailable == 1


async def test_restart_resumes_from_the_checkpoint_without_replaying(fake: FakeApiServer, tmp_path: Path) -> None:
    events = job_run("train")
    cp = tmp_path / "watch.sqlite"
    for obj in objects_of(events[:5]):
        await fake.write(obj)
    first, second = Recorder(), Recorder()
    async with api_for(fake) as api:
        async with watching(Watcher(api, first, FAST, checkpoint=cp)):
            await until(lambda: len(first.records) == 3)
        assert first.flushes >= 1
        job = next(o for o in fake.objects[("batch", "jobs")].values())
        job2 = copy.deepcopy(job)
        job2["status"]["failed"] = 2
        job2 = await fake.write(job2)  # while the watcher is down
        restarted_at = len(fake.requests)
        async with watching(Watcher(api, second, FAST, checkpoint=cp)):
            await until(lambda: len(second.records) >= 1)
            await asyncio.sleep(0.3)
    assert second.seen() == [("MODIFIED", "Job/train", job2["metadata"]["resourceVersion"])]
    assert all(r.startswith("WATCH") for r in fake.requests[restarted_at:])  # resumed its watches, no relist


async def test_restart_after_compaction_reconciles_against_the_checkpoint(fake: FakeApiServer, tmp_path: Path) -> None:
    cp = tmp_path / "watch.sqlite"
    events = job_run("train")
    pods = [o for o in objects_of(events) if o["kind"] == "Pod"]
    job = await fake.write(events[0]["object"])
    stored_pods = [await fake.write(p) for p in pods]
    first, second = Recorder(), Recorder()
    async with api_for(fake) as api:
        async with watching(Watcher(api, first, FAST, checkpoint=cp)):
            await until(lambda: len(first.records) == 3)
        await fake.delete(stored_pods[0])  # deleted while the watcher was down, then compacted away
        fake.compact()
        watcher = Watcher(api, second, FAST, checkpoint=cp)
        async with watching(watcher):
            await until(lambda: len(second.records) == 1)
            await asyncio.sleep(0.3)
    assert second.seen() == [("DELETED", f"Pod/{pods[0]['metadata']['name']}",
                              stored_pods[0]["metadata"]["resourceVersion"])]
    assert second.records[0][0] == "run-train"  # keyed through bindings rebuilt from the checkpoint
    assert watcher.stats.relists >= 1 and second.records[0][1]["object"]["metadata"]["ownerReferences"][0]["uid"] \
        == job["metadata"]["uid"]


async def test_held_records_survive_a_restart(fake: FakeApiServer, tmp_path: Path) -> None:
    cp = tmp_path / "watch.sqlite"
    events = job_run("train")
    pod = await fake.write(events[3]["object"])
    first, second = Recorder(), Recorder()
    async with api_for(fake) as api:
        w1 = Watcher(api, first, FAST, checkpoint=cp)
        async with watching(w1):
            await until(lambda: w1.keys.held == 1)
        assert first.records == []
        async with watching(Watcher(api, second, FAST, checkpoint=cp)):
            await fake.write(events[0]["object"])
            await until(lambda: len(second.records) == 2)
    assert [s[1] for s in second.seen()] == ["Job/train", f"Pod/{pod['metadata']['name']}"]


async def test_capture_is_what_replay_reads(fake: FakeApiServer, tmp_path: Path) -> None:
    events = job_run("train") + rayjob_run("rj")
    for obj in objects_of(events):
        await fake.write(obj)
    path = tmp_path / "capture.jsonl"
    capture = JsonlCapture(path)
    expected = len(list(objects_of(events)))
    async with api_for(fake) as api, watching(Watcher(api, capture, FAST)):
        await until(lambda: len(path.read_text().splitlines()) == expected)
    capture.close()
    records = [r for r in read_capture(path) if isinstance(r, Record)]
    assert {r.value["key"] for r in records} == {"run-train", b.uid("rayjob", "rj")}
    direct = histories(fold([{"type": "ADDED", "object": o} for o in objects_of(events)]))
    assert histories(fold(r.value for r in records)) == direct


async def test_bus_publisher_feeds_serve_shaped_items(fake: FakeApiServer) -> None:
    await fake.write(job_run("train")[0]["object"])
    bus: InProcessBus[tuple[Record, str]] = InProcessBus(10)
    async with api_for(fake) as api, watching(Watcher(api, BusPublisher(bus), FAST)):
        await until(lambda: bus.qsize() == 1)
        item, key = bus.drain_nowait(1)[0]
    assert key == "run-train" and item.source == f"watch:jobs@{NS}" and item.value["object"]["kind"] == "Job"


async def test_publishing_stops_when_the_lease_is_no_longer_valid(fake: FakeApiServer) -> None:
    class Flag:
        ok = True

        def valid(self) -> bool:
            return self.ok

    flag, rec = Flag(), Recorder()
    await fake.write(job_run("a")[0]["object"])
    async with api_for(fake) as api:
        watcher = Watcher(api, rec, FAST, leadership=flag)
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(stop))
        await until(lambda: len(rec.records) == 1)
        flag.ok = False
        await fake.write(job_run("b")[0]["object"])
        with pytest.raises(ExceptionGroup) as info:
            await asyncio.wait_for(task, 5)
    assert info.group_contains(LeadershipLost)
    assert len(rec.records) == 1


async def test_a_record_the_watcher_cannot_handle_is_a_dead_letter_and_the_stream_goes_on(
        fake: FakeApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in handling one record (here slimming raises ValueError, as it does for an unknown kind) costs that
    record only: it becomes a dead letter, listed or watched, and the stream neither reconnects nor relists. A
    watched line (a listed page) is slimmed as it is decoded (``typed.slim_line``, ``typed.slim_list``); when that
    fails the line (the page) is decoded whole and each object slimmed again, and that failing too makes the dead
    letter."""
    real_slim, real_slim_line, real_slim_list = watch_module.slim, watch_module.slim_line, watch_module.slim_list

    def buggy_slim(obj: Obj) -> Obj:
        if obj["metadata"]["name"].startswith("poison"):
            raise ValueError("a bug in slimming")
        return real_slim(obj)

    def buggy_slim_line(text: bytes) -> Any:
        if b'"poison' in text:
            raise ValueError("a bug in typed slimming")
        return real_slim_line(text)

    def buggy_slim_list(text: bytes, kind: str, api_version: str) -> Any:
        if b'"poison' in text:
            raise ValueError("a bug in typed slimming")
        return real_slim_list(text, kind, api_version)

    monkeypatch.setattr(watch_module, "slim", buggy_slim)
    monkeypatch.setattr(watch_module, "slim_line", buggy_slim_line)
    monkeypatch.setattr(watch_module, "slim_list", buggy_slim_list)
    await fake.write(job_run("poison-listed")[0]["object"])
    listed = await fake.write(job_run("a")[0]["object"])
    rec = Recorder()
    async with api_for(fake) as api:
        watcher = Watcher(api, rec, FAST)
        async with watching(watcher):
            await until(lambda: len(rec.records) == 1)
            await fake.write(job_run("poison-watched")[0]["object"])
            after = await fake.write(job_run("b")[0]["object"])
            await until(lambda: len(rec.records) == 2, within_s=5)
            await asyncio.sleep(0.2)
    assert rec.seen() == [("ADDED", "Job/a", listed["metadata"]["resourceVersion"]),
                          ("ADDED", "Job/b", after["metadata"]["resourceVersion"])]
    assert [(dl.source, dl.reason) for dl in rec.letters] == [(f"watch:jobs@{NS}", "watcher error")] * 2
    assert all(dl.detail == "ValueError: a bug in slimming" for dl in rec.letters)
    assert '"name":"poison-listed"' in rec.letters[0].excerpt and '"name":"poison-watched"' in rec.letters[1].excerpt
    assert watcher.stats.dead_letters == 2 and watcher.stats.reconnects == 0 and watcher.stats.relists == 0


async def test_an_object_that_cannot_be_keyed_is_a_dead_letter(fake: FakeApiServer) -> None:
    job = copy.deepcopy(job_run("bad")[0]["object"])
    job["metadata"]["ownerReferences"] = "not a list"
    await fake.write(job)
    rec = Recorder()
    async with api_for(fake) as api:
        watcher = Watcher(api, rec, FAST)
        async with watching(watcher):
            await until(lambda: len(rec.letters) == 1)
    assert rec.records == [] and watcher.stats.malformed == 1
    assert rec.letters[0].reason == "malformed Job" and rec.letters[0].source == f"watch:jobs@{NS}"


async def test_a_line_that_is_not_a_watch_event_drops_the_connection_and_resumes(fake: FakeApiServer) -> None:
    rec = Recorder()
    async with api_for(fake) as api:
        watcher = Watcher(api, rec, FAST)
        async with watching(watcher):
            fake.garbage = b"<html>proxy error</html>"
            fake.kill_watches()
            await until(lambda: fake.garbage is None and watcher.stats.reconnects >= 1)
            job = await fake.write(job_run("late")[0]["object"])
            await until(lambda: rec.seen() == [("ADDED", "Job/late", job["metadata"]["resourceVersion"])])
    assert rec.letters == []


async def test_an_unexpected_error_in_the_watch_loop_stops_the_watcher(
        fake: FakeApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error outside the handling of a record is a bug of the loop: the watcher stops saying which stream
    failed and why, instead of reconnecting for ever."""
    def broken(self: Any, seen: set[str], list_rv: str) -> None:
        raise ValueError("a bug after listing")

    monkeypatch.setattr(watch_module.Stream, "reconcile_end", broken)
    async with api_for(fake) as api:
        watcher = Watcher(api, Recorder(), FAST)
        with pytest.raises(ExceptionGroup) as info:
            await asyncio.wait_for(watcher.run(asyncio.Event()), 5)
    assert info.group_contains(WatchFatal, match=r"jobs@team-a.*ValueError: a bug after listing")
    assert watcher.stats.reconnects == 0


async def test_the_kafka_publisher_sends_dead_letters_to_their_topic() -> None:
    sent: list[tuple[str, bytes, bytes | None]] = []

    class Producer:
        async def send(self, topic: str, *, value: bytes, key: bytes | None = None,
                       headers: Any = None) -> asyncio.Future[None]:
            sent.append((topic, value, key))
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

    ks = KafkaSettings()
    publisher = ChangesProducer(ks=ks, source=SourceSettings(max_in_flight=10), producer=Producer())  # type: ignore[arg-type]
    letter = DeadLetter(source="watch:jobs@*", reason="watcher error", detail="KeyError: 'x'", excerpt="{}")
    await publisher.dead_letter(letter)
    await publisher.flush()
    assert sent == [(ks.topics.dead_letters, letter.model_dump_json().encode(), None)]


# ------------------------------------------------------------------------------------------ leader election


def lease(identity: str) -> LeaseConfig:
    """Short, but with room for a loaded machine: the leader renews 10 times per renew deadline."""
    return LeaseConfig(namespace=NS, identity=identity, lease_duration_s=3.0, renew_deadline_s=2.0,
                       retry_period_s=0.2)


async def test_only_one_candidate_leads_and_a_released_lease_is_taken_at_once(fake: FakeApiServer) -> None:
    async with api_for(fake, request_timeout_s=1.5) as api:
        a, c = LeaseElector(api, lease("a")), LeaseElector(api, lease("c"))
        never = asyncio.Event()
        la = await a.acquire(never)
        assert la is not None and la.valid()
        assert not await c.attempt()
        keeper = asyncio.create_task(a.keep(la))
        await asyncio.sleep(4)  # longer than the lease: a keeps renewing, so c still cannot take it
        assert la.valid() and not await c.attempt()
        keeper.cancel()
        await a.release()
        start = time.monotonic()
        lc = await c.acquire(never)
        assert lc is not None and time.monotonic() - start < 2
        stored = next(iter(fake.objects[("coordination.k8s.io", "leases")].values()))
        assert stored["spec"]["holderIdentity"] == "c" and stored["spec"]["leaseTransitions"] == 1


async def test_a_leader_that_cannot_renew_stops_before_anyone_else_can_lead(fake: FakeApiServer) -> None:
    async with api_for(fake, request_timeout_s=1.5) as api:
        a, c = LeaseElector(api, lease("a")), LeaseElector(api, lease("c"))
        la = await a.acquire(asyncio.Event())
        assert la is not None
        assert not await c.attempt()  # c observes the lease now
        observed = c.observed_at
        fake.groups.pop("coordination.k8s.io")  # a's renewals fail from here on (404 on every request)
        with pytest.raises(LeadershipLost):
            await a.keep(la)
        lost_at = time.monotonic()
        assert not la.valid()
        fake.groups["coordination.k8s.io"] = ["v1"]
        lc = await c.acquire(asyncio.Event())
        acquired_at = time.monotonic()
        # a stopped at its renew deadline, before c could take over: c waited out the whole lease duration
        assert lc is not None and lost_at < observed + 3.0 <= acquired_at


async def test_a_stolen_lease_ends_leadership_at_the_next_renewal(fake: FakeApiServer) -> None:
    async with api_for(fake, request_timeout_s=1.5) as api:
        a = LeaseElector(api, lease("a"))
        la = await a.acquire(asyncio.Event())
        assert la is not None
        stored = next(iter(fake.objects[("coordination.k8s.io", "leases")].values()))
        await fake.write({**stored, "spec": {**stored["spec"], "holderIdentity": "thief"}})
        deadline = la.deadline
        with pytest.raises(LeadershipLost, match="thief"):
            await a.keep(la)
        assert not la.valid() and time.monotonic() < deadline  # at the next renewal, not at the renew deadline


async def test_lead_runs_the_body_only_while_leading(fake: FakeApiServer) -> None:
    stop = asyncio.Event()
    terms: list[str] = []

    async def body(lz: Any) -> None:
        terms.append("start")
        await stop.wait()

    async with api_for(fake, request_timeout_s=1.5) as api:
        elector = LeaseElector(api, lease("a"))
        task = asyncio.create_task(lead(elector, stop, body=body))
        await until(lambda: terms == ["start"])
        stop.set()
        await asyncio.wait_for(task, 5)
        stored = next(iter(fake.objects[("coordination.k8s.io", "leases")].values()))
        assert stored["spec"]["holderIdentity"] == ""  # released on the way out


def test_lease_durations_are_validated() -> None:
    with pytest.raises(ValueError, match="retry_period_s < renew_deadline_s < lease_duration_s"):
        LeaseConfig(namespace="x", identity="a", lease_duration_s=5, renew_deadline_s=6, retry_period_s=1)


# ------------------------------------------------------------------------------------------ command line


def test_watch_command_parses_and_requires_an_output(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="tracker")
    add_watch_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["watch", "-n", "a", "-n", "b", "--lease-namespace", "tracker", "--identity", "me"])
    assert args.namespaces == ["a", "b"] and args.lease_name == "tracker-watcher"
    console = Console(file=None, force_terminal=False, width=200)
    assert args.func(args, console) == 2
    assert "needs an output" in capsys.readouterr().out
    bad = parser.parse_args(["watch", "--capture", "x.jsonl", "--lease-namespace", "t", "--renew-deadline", "20"])
    assert bad.func(bad, console) == 2


def test_the_capture_key_field_is_ignored_by_the_reducer() -> None:
    red = Reducer()
    red.apply({**job_run("a")[0], "key": "run-a"}, "src")
    assert red.stats.dead_letters == 0 and "run-a" in red.runs

