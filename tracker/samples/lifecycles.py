"""Parametrised run lifecycles, for property tests and benchmarks.

``generate_run(index, params)`` gives the watch and intake events of one run, per stream, deterministically;
``generate_stream(n_runs, seed)`` interleaves many runs with seeded, varied parameters (about 20 changes per
run), cheaply enough for millions of events: objects are assembled from shared, read-only templates with
shallow copies, not from the deep builders the bundled scenarios use. The write sequences are those of the
scenarios (``tracker.samples.scenarios``) with the less important intermediate writes left out.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from tracker.core.model import INTAKE_SCHEMA, LABEL_CONTROLLER_UID, LABEL_QUEUE, LABEL_RAY_CLUSTER, LABEL_RUN_ID
from tracker.samples import builders as b
from tracker.samples.builders import MINUTE, SECOND, Ms, Obj, at

Outcome = Literal["succeeded", "failed", "deactivated", "running", "deleted"]
STREAMS = ("jobs", "workloads", "pods", "events", "rayjobs", "rayclusters", "intake")
START: Ms = at("09:00:00")
RUN_SPACING: Ms = 3 * SECOND  # run i is submitted at START + i * RUN_SPACING


@dataclass(frozen=True)
class RunParams:
    kind: Literal["Job", "RayJob"] = "Job"
    pods: int = 2  # 1..8 (RayJob: head + pods-1 workers)
    evictions: int = 0  # 0..3 Kueue evictions before the last admission
    eviction_reason: Literal["Preempted", "PodsReadyTimeout"] = "Preempted"
    pod_failures: int = 0  # 0..3 pods replaced by the Job controller (Job only)
    ray_retries: int = 0  # 0..2 KubeRay retries on a new RayCluster (RayJob only)
    outcome: Outcome = "succeeded"
    with_events: bool = True
    progress_points: int = 2  # 0..5
    workload_api: Literal["v1beta1", "v1beta2"] = "v1beta1"


# ------------------------------------------------------------------------------------ shared templates

_CTR = b.container(name="trainer", image="acr-taugrid.azurecr.io/train:2026.08.20", cpu_millis=88_000,
                   memory_mi=1_600 * 1024, gpus=8, command=["python", "-m", "taugrid.train"])
_TEMPLATE_SPEC = b.template_spec(containers=[_CTR], restart_policy="Never")
_TEMPLATE = b.pod_template({b.LABEL_PODSET: "main"}, _TEMPLATE_SPEC)
_POD_SPEC = b.pod_spec(_TEMPLATE_SPEC, None)
_RAY_TEMPLATE = b.pod_template({}, b.template_spec(containers=[{**_CTR, "name": "ray"}], restart_policy="Always"))
_CLUSTER_SPEC = b.ray_cluster_spec(ray_version="2.49.0", head_template=_RAY_TEMPLATE, worker_groups=[])
_USAGE = {"cpu": "88", "memory": "1600Gi", "nvidia.com/gpu": "8"}
_FLAVORS = {"cpu": "h100", "memory": "h100", "nvidia.com/gpu": "h100"}
_NODES = tuple(f"aks-h100-36541870-vmss{i:06x}" for i in range(64))
_DONE_COND = "PodCompleted"
_READY_CONDS = [{"lastProbeTime": None, "lastTransitionTime": None, "status": "True", "type": t}
                for t in ("Initialized", "Ready", "ContainersReady")]


def _cond(type_: str, status: str, reason: str, message: str, when: Ms) -> Obj:
    return {"lastTransitionTime": b.ts(when), "message": message, "observedGeneration": 1, "reason": reason,
            "status": status, "type": type_}


def _set(conds: list[Obj], new: Obj) -> list[Obj]:
    return [c for c in conds if c["type"] != new["type"]] + [new]


class _Run:
    """One run's writes as (time, seq, stream, record); objects are rebuilt per write from shared parts."""

    def __init__(self, index: int, p: RunParams, t0: Ms) -> None:
        self.p, self.t = p, t0
        self.out: list[tuple[Ms, int, str, Obj]] = []
        self.ns = "team-a" if index % 2 == 0 else "team-b"
        self.run_id = f"run-{index:07d}"
        self.name = f"{'rj' if p.kind == 'RayJob' else 'job'}-{index:07d}"
        self.uid = b.uid("lifecycle", str(index))
        self._prefix = self.uid[:24]
        self._n = 0
        kind = p.kind
        self.root_ref = b.owner_reference(b.RAY_API_VERSION if kind == "RayJob" else "batch/v1", kind, self.name,
                                          self.uid)
        self.root_meta: Obj = {"creationTimestamp": b.ts(t0), "name": self.name, "namespace": self.ns, "uid": self.uid,
                          "labels": {LABEL_RUN_ID: self.run_id, LABEL_QUEUE: f"{self.ns}-lq"}}
        self.root_spec: Obj = ({"suspend": True, "parallelism": p.pods, "completions": p.pods, "backoffLimit": 3,
                                "selector": {"matchLabels": {LABEL_CONTROLLER_UID: self.uid}},
                                "template": _TEMPLATE} if kind == "Job" else
                               {"suspend": True, "entrypoint": "python -m taugrid.train", "backoffLimit": 2,
                                "submissionMode": "K8sJobMode", "shutdownAfterJobFinishes": True,
                                "rayClusterSpec": {**_CLUSTER_SPEC, "workerGroupSpecs": [
                                    b.worker_group("gpu", p.pods - 1, _RAY_TEMPLATE)]} if p.pods > 1
                                else _CLUSTER_SPEC})
        self.root_status: Obj = {}
        wl_name = f"{kind.lower()}-{self.name}-{self.uid[:5]}"
        self.wl_meta: Obj = {"creationTimestamp": "", "name": wl_name, "namespace": self.ns, "uid": self.child_uid(),
                        "labels": {"kueue.x-k8s.io/job-uid": self.uid}, "ownerReferences": [self.root_ref]}
        self.wl_spec = {"active": True, "queueName": f"{self.ns}-lq", "priority": 100,
                        "podSets": [{"count": p.pods, "name": "main", "template": _TEMPLATE}]}
        self.wl_conds: list[Obj] = []
        self.wl_status: Obj = {}
        self.evictions: dict[str, int] = {}
        self.pods: list[Obj] = []  # live pods: {"metadata", "spec", "status"} parts
        self.pod_owner = self.root_ref
        self.cluster_meta: Obj | None = None
        self.pod_labels: dict[str, str] = {LABEL_CONTROLLER_UID: self.uid, LABEL_RUN_ID: self.run_id}
        self.failed = 0
        self.deployments = 0

    # ---- plumbing

    def child_uid(self) -> str:
        self._n += 1
        return f"{self._prefix}{self._n:012x}"

    def emit(self, stream: str, record: Obj, dt: Ms = 0) -> None:
        self.t += dt
        self.out.append((self.t, len(self.out), stream, record))

    def root(self, etype: str = "MODIFIED", dt: Ms = 0) -> None:
        api = b.RAY_API_VERSION if self.p.kind == "RayJob" else "batch/v1"
        obj = {"apiVersion": api, "kind": self.p.kind, "metadata": dict(self.root_meta), "spec": self.root_spec,
               "status": self.root_status}
        self.emit("rayjobs" if self.p.kind == "RayJob" else "jobs", {"type": etype, "object": obj}, dt)

    def workload(self, etype: str = "MODIFIED", dt: Ms = 0) -> None:
        status = {**self.wl_status, "conditions": self.wl_conds}
        if self.evictions:
            status["schedulingStats"] = {"evictions": [{"count": n, "reason": r, "underlyingCause": ""}
                                                       for r, n in self.evictions.items()]}
        obj = {"apiVersion": f"kueue.x-k8s.io/{self.p.workload_api}", "kind": "Workload",
               "metadata": dict(self.wl_meta), "spec": self.wl_spec, "status": status}
        self.emit("workloads", {"type": etype, "object": obj}, dt)

    def wl_cond(self, type_: str, status: str, reason: str, message: str) -> None:
        self.wl_conds = _set(self.wl_conds, _cond(type_, status, reason, message, self.t))

    def pod(self, pod: Obj, etype: str = "MODIFIED", dt: Ms = 0) -> None:
        obj = {"apiVersion": "v1", "kind": "Pod", "metadata": dict(pod["metadata"]), "spec": pod["spec"],
               "status": pod["status"]}
        self.emit("pods", {"type": etype, "object": obj}, dt)

    def event(self, about: str, name: str, uid: str, reason: str, message: str, warning: bool = False) -> None:
        if not self.p.with_events:
            return
        when = b.ts(self.t)
        ev_name = f"{name}.{self.t * 1_000_000:x}"
        ev = {"apiVersion": "v1", "kind": "Event", "count": 1, "firstTimestamp": when, "lastTimestamp": when,
              "involvedObject": {"kind": about, "name": name, "namespace": self.ns, "uid": uid},
              "message": message, "reason": reason, "type": "Warning" if warning else "Normal",
              "metadata": {"creationTimestamp": when, "name": ev_name, "namespace": self.ns,
                           "uid": self.child_uid()}, "source": {"component": "kueue-admission"}}
        self.emit("events", {"type": "ADDED", "object": ev})

    def intake(self, kind: str, **fields: Any) -> None:
        ev = {"schema": INTAKE_SCHEMA, "event_id": f"{self.run_id}-{len(self.out)}", "run_id": self.run_id,
              "at": b.ts(self.t), "kind": kind, **fields}
        self.emit("intake", ev)

    # ---- lifecycle pieces

    def submit(self) -> None:
        self.intake("Resolution", status="succeeded", project="bench", workspace=self.ns, target="h100-8x")
        self.intake("Rendering", status="succeeded", workload_kind=self.p.kind, namespace=self.ns, name=self.name)
        self.t += 2 * SECOND
        self.root_meta["creationTimestamp"] = b.ts(self.t)
        self.root("ADDED")
        self.wl_meta["creationTimestamp"] = b.ts(self.t + 300)
        self.workload("ADDED", 300)
        self.wl_cond("QuotaReserved", "False", "Pending", "couldn't assign flavors to pod set main: insufficient "
                     "unused quota for nvidia.com/gpu in flavor h100, 8 more needed")
        self.workload(dt=700)
        self.event("Workload", self.wl_meta["name"], self.wl_meta["uid"], "Pending", "insufficient quota", True)

    def admit(self, wait: Ms) -> None:
        self.t += wait
        self.wl_status = {"admission": {"clusterQueue": "gpu-cq", "podSetAssignments": [
            {"count": self.p.pods, "flavors": _FLAVORS, "name": "main", "resourceUsage": _USAGE}]}}
        self.wl_cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue gpu-cq")
        self.wl_cond("Admitted", "True", "Admitted", "The workload is admitted")
        for t in ("Evicted", "Preempted"):
            if any(c["type"] == t and c["status"] == "True" for c in self.wl_conds):
                self.wl_cond(t, "False", "QuotaReserved", "Previously: evicted")
        self.workload()
        self.event("Workload", self.wl_meta["name"], self.wl_meta["uid"], "Admitted", "Admitted by ClusterQueue")
        self.root_spec = {**self.root_spec, "suspend": False}
        if self.p.kind == "Job":
            self.root_status = {"startTime": b.ts(self.t + 200), "conditions": [
                b.job_condition("Suspended", False, "JobResumed", "Job resumed", self.t + 200)], "active": 0}
        self.root(dt=200)

    def deploy(self) -> None:
        """RayJob: a new deployment on a new RayCluster, Initializing."""
        self.deployments += 1
        cluster = f"{self.name}-c{self.deployments}"
        self.cluster_meta = {"creationTimestamp": b.ts(self.t + 100), "name": cluster, "namespace": self.ns,
                             "uid": self.child_uid(), "ownerReferences": [self.root_ref],
                             "labels": self.root_meta["labels"]}
        self.pod_owner = b.owner_reference(b.RAY_API_VERSION, "RayCluster", cluster, self.cluster_meta["uid"])
        self.pod_labels = {LABEL_RAY_CLUSTER: cluster}
        self.root_status = {**self.root_status, "jobDeploymentStatus": "Initializing", "jobStatus": "",
                            "rayClusterName": cluster, "jobId": f"{cluster}-j", "startTime": b.ts(self.t + 100)}
        self.root(dt=100)
        self.emit("rayclusters", {"type": "ADDED", "object": {
            "apiVersion": b.RAY_API_VERSION, "kind": "RayCluster", "metadata": dict(self.cluster_meta),
            "spec": self.root_spec["rayClusterSpec"], "status": {}}})

    def cluster_write(self, etype: str, status: Obj) -> None:
        assert self.cluster_meta is not None
        self.emit("rayclusters", {"type": etype, "object": {
            "apiVersion": b.RAY_API_VERSION, "kind": "RayCluster", "metadata": dict(self.cluster_meta),
            "spec": self.root_spec["rayClusterSpec"], "status": status}})

    def create_pods(self, count: int) -> list[Obj]:
        """Create ``count`` pods (the Job controller or KubeRay); returns them."""
        new = []
        for _ in range(count):
            uid = self.child_uid()
            name = f"{self.name}-p{uid[-4:]}"
            pod = {"metadata": {"creationTimestamp": b.ts(self.t), "name": name, "namespace": self.ns, "uid": uid,
                                "labels": self.pod_labels, "ownerReferences": [self.pod_owner]},
                   "spec": _POD_SPEC, "status": {"phase": "Pending", "qosClass": "Burstable"}}
            new.append(pod)
            self.pod(pod, "ADDED", 40)
        self.pods.extend(new)
        return new

    def schedule(self, pods: list[Obj], start: bool, wait: Ms) -> None:
        """Bind ``pods``, and start their containers if ``start`` (else they wait on the image)."""
        for i, pod in enumerate(pods):
            node = _NODES[(i + len(self.out)) % len(_NODES)]
            when = b.ts(self.t)
            pod["spec"] = {**_POD_SPEC, "nodeName": node}
            sched = {"lastProbeTime": None, "lastTransitionTime": when, "status": "True", "type": "PodScheduled"}
            pod["status"] = {"phase": "Pending", "qosClass": "Burstable", "conditions": [sched]}
            self.pod(pod, dt=100)
            self.event("Pod", pod["metadata"]["name"], pod["metadata"]["uid"], "Scheduled", f"assigned to {node}")
        self.t += wait
        for pod in pods:
            if start:
                when = b.ts(self.t)
                pod["status"] = {"phase": "Running", "qosClass": "Burstable", "startTime": when,
                                 "conditions": [pod["status"]["conditions"][0],
                                                *({**c, "lastTransitionTime": when} for c in _READY_CONDS)],
                                 "containerStatuses": [{"name": "trainer", "ready": True, "restartCount": 0,
                                                        "started": True, "state": {"running": {"startedAt": when}}}]}
            else:
                pod["status"] = {**pod["status"], "containerStatuses": [{
                    "name": "trainer", "ready": False, "restartCount": 0, "started": False,
                    "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}
            self.pod(pod, dt=300)

    def finish_pod(self, pod: Obj, code: int, reason: str) -> None:
        when = b.ts(self.t)
        started = pod["status"].get("startTime", when)
        pod["status"] = {"phase": "Succeeded" if code == 0 else "Failed", "qosClass": "Burstable",
                         "startTime": started, "conditions": [
                             pod["status"]["conditions"][0],
                             {"lastProbeTime": None, "lastTransitionTime": when, "reason": _DONE_COND,
                              "status": "False", "type": "Ready"}],
                         "containerStatuses": [{"name": "trainer", "ready": False, "restartCount": 0,
                                                "started": False, "state": {"terminated": {
                                                    "exitCode": code, "reason": reason, "startedAt": started,
                                                    "finishedAt": when}}}]}
        self.pod(pod, dt=500)

    def delete_pods(self) -> None:
        for pod in self.pods:
            pod["metadata"] = {**pod["metadata"], "deletionTimestamp": b.ts(self.t + 30 * SECOND),
                               "deletionGracePeriodSeconds": 30}
            if pod["status"]["phase"] == "Running":
                self.finish_pod(pod, 143, "Error")
            self.pod(pod, "DELETED", 1000)
        self.pods = []

    def evict(self, reason: str, final: bool) -> None:
        """A Kueue eviction (or the deactivation when ``final``): stop the job, release the quota."""
        message = {"Preempted": "Preempted to accommodate a workload", "PodsReadyTimeout":
                   f"Exceeded the PodsReady timeout {self.ns}/{self.wl_meta['name']}"}.get(
                       reason, "The workload is deactivated due to exceeding the maximum number of re-queuing "
                       "retries")
        if final:
            self.wl_spec = {**self.wl_spec, "active": False}
        self.wl_cond("Evicted", "True", reason, message)
        if reason == "Preempted":
            self.wl_cond("Preempted", "True", "InClusterQueue", message)
        self.evictions[reason] = self.evictions.get(reason, 0) + 1
        self.workload()
        self.event("Workload", self.wl_meta["name"], self.wl_meta["uid"], f"EvictedDueTo{reason}", message)
        self.root_spec = {**self.root_spec, "suspend": True}
        if self.p.kind == "Job":
            self.root_status = {"conditions": [b.job_condition("Suspended", True, "JobSuspended", "Job suspended",
                                                               self.t + 300)], "failed": self.failed}
        else:
            self.root_status = {**self.root_status, "jobDeploymentStatus": "Suspending", "rayClusterName": ""}
        self.root(dt=300)
        self.delete_pods()
        if self.p.kind == "RayJob":
            self.cluster_write("DELETED", {"state": "ready"})
        self.wl_status = {}
        self.wl_cond("QuotaReserved", "False", "Deactivated" if final else "Pending", message)
        self.wl_cond("Admitted", "False", "NoReservation", "The workload has no reservation")
        requeued = reason == "Preempted"
        self.wl_cond("Requeued", "True" if requeued else "False", reason, message)
        self.workload(dt=500)

    def run_job(self, rng: random.Random) -> None:
        """The last admission of a batch Job: pods, failures with replacements, progress, the outcome."""
        p = self.p
        self.schedule(self.create_pods(p.pods), True, rng.randrange(5, 60) * SECOND)
        for i in range(p.pod_failures):
            self.t += rng.randrange(1, 20) * MINUTE
            victim = self.pods[i % len(self.pods)]
            self.finish_pod(victim, 137, "OOMKilled")
            self.pods.remove(victim)
            self.failed += 1
            self.root_status = {**self.root_status, "failed": self.failed}
            self.root(dt=300)
            self.t += 10 * SECOND
            self.schedule(self.create_pods(1), True, 3 * SECOND)
        self.progress(rng)
        self.end(rng)

    def run_rayjob(self, rng: random.Random) -> None:
        p = self.p
        for n in range(p.ray_retries + 1):
            self.deploy()
            self.schedule(self.create_pods(p.pods), True, rng.randrange(20, 60) * SECOND)
            self.cluster_write("MODIFIED", {"state": "ready", "stateTransitionTimes": {"ready": b.ts(self.t)}})
            self.root_status = {**self.root_status, "jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                                "rayJobInfo": {"startTime": b.ts(self.t + 5 * SECOND)}}
            self.root(dt=5 * SECOND)
            if n < p.ray_retries:
                self.t += rng.randrange(2, 30) * MINUTE
                self.root_status = {**self.root_status, "jobDeploymentStatus": "Retrying", "jobStatus": "FAILED",
                                    "failed": n + 1, "reason": "AppFailed", "message": "exit code 1"}
                self.root()
                self.delete_pods()
                self.cluster_write("DELETED", {"state": "ready"})
                self.root_status = {"failed": n + 1, "jobDeploymentStatus": ""}
                self.root(dt=500)
        self.progress(rng)
        self.end(rng)

    def progress(self, rng: random.Random) -> None:
        for i in range(self.p.progress_points):
            self.t += rng.randrange(1, 10) * MINUTE
            ckpt = {"checkpoint_uri": f"abfss://runs/{self.run_id}/step-{i}"} if i == 2 else {}
            self.intake("Progress", step=100 * (i + 1), metrics={"loss": 2.0 / (i + 1), "accuracy": 0.1 * i},
                        **ckpt)

    def end(self, rng: random.Random) -> None:
        p = self.p
        self.t += rng.randrange(1, 30) * MINUTE
        if p.outcome == "running":
            return
        if p.outcome == "deleted":
            self.root("DELETED")
            self.delete_pods()
            self.workload("DELETED", 500)
            return
        ok = p.outcome == "succeeded"
        for pod in self.pods:
            self.finish_pod(pod, 0 if ok else 1, "Completed" if ok else "Error")
        message = "Reached expected number of succeeded pods" if ok else "Job has reached the specified backoff limit"
        if p.kind == "Job":
            cond = "Complete" if ok else "Failed"
            reason = "CompletionsReached" if ok else "BackoffLimitExceeded"
            self.root_status = {**self.root_status, "active": 0, "succeeded" if ok else "failed": p.pods,
                                "conditions": [*self.root_status.get("conditions", []),
                                               b.job_condition(cond, True, reason, message, self.t + 500)]}
            if ok:
                self.root_status["completionTime"] = b.ts(self.t + 500)
        else:
            self.root_status = {**self.root_status, "jobDeploymentStatus": "Complete" if ok else "Failed",
                                "jobStatus": "SUCCEEDED" if ok else "FAILED", "endTime": b.ts(self.t + 500),
                                "reason": "" if ok else "AppFailed", "message": message}
        self.root(dt=500)
        self.wl_cond("Finished", "True", "Succeeded" if ok else "Failed", message)
        self.workload(dt=300)


def _events(index: int, p: RunParams, t0: Ms) -> list[tuple[Ms, int, str, Obj]]:
    rng = random.Random(index)
    r = _Run(index, p, t0)
    r.submit()
    final = p.outcome == "deactivated"
    reason = p.eviction_reason
    for _ in range(p.evictions):
        r.admit(rng.randrange(1, 120) * SECOND)
        if p.kind == "RayJob":
            r.deploy()
        r.schedule(r.create_pods(p.pods), reason == "Preempted", rng.randrange(5, 30) * SECOND)
        r.t += (10 * MINUTE if reason == "PodsReadyTimeout" else rng.randrange(1, 40) * MINUTE)
        r.evict(reason, False)
    r.admit(rng.randrange(1, 600) * SECOND)
    if final:
        if p.kind == "RayJob":
            r.deploy()
        r.schedule(r.create_pods(p.pods), False, 10 * MINUTE)
        r.evict("DeactivatedDueToRequeuingLimitExceeded", True)
    elif p.kind == "Job":
        r.run_job(rng)
    else:
        r.run_rayjob(rng)
    r.out.sort(key=lambda e: (e[0], e[1]))
    return r.out


def generate_run(index: int, params: RunParams) -> dict[str, list[Obj]]:
    """One run's watch and intake events, per stream, each stream in commit order (deterministic)."""
    out: dict[str, list[Obj]] = {s: [] for s in STREAMS}
    rv = 1000 + index * 1000
    for _t, _seq, stream, record in _events(index, params, START + index * RUN_SPACING):
        if stream != "intake":
            rv += 1
            record["object"]["metadata"]["resourceVersion"] = str(rv)
        out[stream].append(record)
    return out


def random_params(rng: random.Random) -> RunParams:
    """Varied parameters, weighted like a real cluster (mostly plain successes)."""
    kind: Literal["Job", "RayJob"] = "RayJob" if rng.random() < 0.2 else "Job"
    outcome: Outcome = rng.choices(("succeeded", "failed", "deactivated", "running", "deleted"),
                                   (70, 10, 5, 10, 5))[0]
    return RunParams(
        kind=kind, pods=rng.choice((1, 1, 1, 1, 2, 2, 4)), evictions=rng.choices((0, 1, 2, 3), (80, 12, 6, 2))[0],
        eviction_reason="Preempted" if rng.random() < 0.7 else "PodsReadyTimeout",
        pod_failures=rng.choices((0, 1, 2, 3), (85, 10, 4, 1))[0] if kind == "Job" else 0,
        ray_retries=rng.choices((0, 1, 2), (80, 15, 5))[0] if kind == "RayJob" else 0,
        outcome=outcome, with_events=rng.random() < 0.3, progress_points=rng.randrange(0, 4),
        workload_api="v1beta2" if rng.random() < 0.3 else "v1beta1")


def generate_stream(n_runs: int, seed: int) -> Iterator[Obj]:
    """Every record of ``n_runs`` runs with seeded, varied parameters, interleaved in time order."""
    rng = random.Random(seed)
    heap: list[tuple[Ms, int, Obj]] = []
    seq = 0
    rv = 1_000_000
    for index in range(n_runs):
        t0 = START + index * RUN_SPACING
        while heap and heap[0][0] < t0:
            _t, _s, record = heapq.heappop(heap)
            if "object" in record:
                rv += 1
                record["object"]["metadata"]["resourceVersion"] = str(rv)
            yield record
        for t, _i, _stream, record in _events(index, random_params(rng), t0):
            seq += 1
            heapq.heappush(heap, (t, seq, record))
    while heap:
        _t, _s, record = heapq.heappop(heap)
        if "object" in record:
            rv += 1
            record["object"]["metadata"]["resourceVersion"] = str(rv)
        yield record
