"""Scenarios the real controllers produce on the simulated cluster (Kueue, the Job controller, the KubeRay operator,
kube-scheduler, kwok), and what the tracker must make of them.

Each scenario drives its objects only as a person would (create a suspended Job or RayJob with a queue label, delete
it, flip a Workload's `spec.active`); everything else (admission, preemption, PodsReady timeouts, requeues,
deactivation, pod failures and their replacements, RayClusters, submitters, retries, deadlines) is decided and
written by the controllers. `tests/test_controller_scenarios.py` runs them live and keeps what the watcher captured
under `tests/captures/controllers/<scenario>/`; `tests/test_controller_captures.py` folds the kept captures.

`EXPECTED` is what the controllers decide, per run: status and reason, the phase reached, attempts with their
triggers and end reasons, evictions, pod retries, distinct RayClusters. It is written from the scenario's semantics
(Kueue's and KubeRay's documented behaviour), not copied from a run. Times are checked against the objects (`check`:
every time in a history is one the captured objects carry, and each attempt's admission is a Workload's
`Admitted=True` transition), never against literals: the API server's clock decides them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tests.infra.cluster import FAIL_FIRST_TRY_LABEL, GPU, PODS_READY_TIMEOUT_S
from tests.ray_dashboard_standin import RayDashboardStandIn, RayRun
from tracker.shell.kube import discover
from tracker.shell.watch import WORKLOADS, ApiError, KubeApi

Obj = dict[str, Any]
RUN_ID_LABEL = "taugrid.io/run-id"


def delays(**stages: str) -> dict[str, str]:
    """kwok "general" stage delay annotations, e.g. delays(complete="20s"): the delay and its jitter both (kwok
    takes the smaller)."""
    out = {}
    for stage, value in stages.items():
        out[f"pod-{stage}.stage.kwok.x-k8s.io/delay"] = value
        out[f"pod-{stage}.stage.kwok.x-k8s.io/jitter-delay"] = value
    return out


FAST = delays(create="1s", ready="1s")  # pods ready about 2 s after they are bound
NEVER_READY = delays(create="1s", ready="10m")


@dataclass(frozen=True)
class AttemptExpect:
    trigger: str
    end_reason: str | None
    #: the eviction's underlying cause Kueue counted (status.schedulingStats.evictions)
    cause: str | None = None


@dataclass(frozen=True)
class Expect:
    status: str
    reason: str | None
    phase: str
    attempts: tuple[AttemptExpect, ...]
    evictions: int = 0
    retries: int = 0
    #: phases every history must have entered (transitions), e.g. Runtime for a run whose pods ran
    phases: frozenset[str] = frozenset()
    ray_clusters: int = 0


@dataclass
class Driver:
    """What a scenario may do: act as a person through the API, and wait (bounded) for what the controllers do."""

    api: KubeApi
    namespace: str
    queue: str
    standin: RayDashboardStandIn | None
    workload_version: str = ""
    log: list[str] = field(default_factory=list)

    async def start(self) -> None:
        self.workload_version = await discover(self.api, WORKLOADS) or "v1beta1"

    def path(self, kind: str, name: str = "") -> str:
        group, plural = {"Job": ("batch/v1", "jobs"), "RayJob": ("ray.io/v1", "rayjobs"),
                         "Workload": (f"kueue.x-k8s.io/{self.workload_version}", "workloads"),
                         "RayCluster": ("ray.io/v1", "rayclusters"), "Pod": ("v1", "pods")}[kind]
        prefix = "/api/v1" if group == "v1" else f"/apis/{group}"
        return f"{prefix}/namespaces/{self.namespace}/{plural}" + (f"/{name}" if name else "")

    async def create(self, obj: Obj) -> Obj:
        self.log.append(f"{time.strftime('%H:%M:%S')} create {obj['kind']}/{obj['metadata']['name']}")
        return await self.api.request("POST", self.path(obj["kind"]), body=obj)

    async def delete(self, kind: str, name: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} delete {kind}/{name}")
        await self.api.request("DELETE", self.path(kind, name), body={"propagationPolicy": "Background"})

    async def items(self, kind: str) -> list[Obj]:
        found: list[Obj] = (await self.api.get(self.path(kind))).get("items") or []
        return found

    async def get(self, kind: str, name: str) -> Obj | None:
        try:
            return await self.api.get(self.path(kind, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def workload(self, owner: str) -> Obj | None:
        for wl in await self.items("Workload"):
            if any(ref.get("name") == owner for ref in wl["metadata"].get("ownerReferences") or []):
                return wl
        return None

    async def until(self, what: str, check: Callable[[], Awaitable[bool]], within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while not await check():
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.namespace}: timed out after {within_s:.0f}s waiting for {what}; "
                                     f"did: {self.log}")
            await asyncio.sleep(0.5)
        self.log.append(f"{time.strftime('%H:%M:%S')} saw {what}")

    async def until_workload(self, owner: str, what: str, pred: Callable[[Obj], bool], within_s: float) -> Obj:
        found: list[Obj] = []

        async def check() -> bool:
            wl = await self.workload(owner)
            if wl is not None and pred(wl):
                found.append(wl)
                return True
            return False

        await self.until(f"{owner}: {what}", check, within_s)
        return found[0]

    async def set_active(self, owner: str, active: bool) -> None:
        """What `kubectl edit workload` does: read, flip spec.active, write back (again on a conflict)."""
        self.log.append(f"{time.strftime('%H:%M:%S')} set {owner}'s Workload active={active}")
        for _ in range(20):
            wl = await self.workload(owner)
            assert wl is not None, f"no Workload for {owner}"
            wl["spec"]["active"] = active
            try:
                await self.api.request("PUT", self.path("Workload", wl["metadata"]["name"]), body=wl)
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise
            await asyncio.sleep(0.2)
        raise AssertionError(f"could not update {owner}'s Workload: conflicts")

    async def job_has(self, name: str, condition: str) -> bool:
        job = await self.get("Job", name)
        return job is not None and has(job, condition)

    async def job_running(self, name: str, pods: int) -> bool:
        job = await self.get("Job", name)
        return job is not None and not job["spec"].get("suspend") and (job["status"].get("ready") or 0) >= pods

    async def rayjob_status(self, name: str) -> Obj:
        rj = await self.get("RayJob", name)
        status: Obj = (rj or {}).get("status") or {}
        return status


def has(obj: Obj, ctype: str, status: str = "True", reason: str = "") -> bool:
    return any(c.get("type") == ctype and c.get("status") == status and (not reason or c.get("reason") == reason)
               for c in (obj.get("status") or {}).get("conditions") or [])


def job(name: str, *, queue: str, pods: int = 1, gpus: int = 1, priority: str = "",
        annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
        extra_spec: Obj | None = None) -> Obj:
    """A Kueue-managed Job, created suspended (no Kueue webhook runs out of cluster)."""
    meta_labels = {"kueue.x-k8s.io/queue-name": queue, RUN_ID_LABEL: f"run-{name}"}
    if priority:
        meta_labels["kueue.x-k8s.io/priority-class"] = priority
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": meta_labels},
            "spec": {"suspend": True, "parallelism": pods, "completions": pods, **(extra_spec or {}), "template": {
                "metadata": {"annotations": {**FAST, **(annotations or {})}, "labels": labels or {}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "train", "image": "busybox",
                    "resources": {"requests": {"cpu": "1", GPU: str(gpus)}, "limits": {GPU: str(gpus)}}}]}}}}


def rayjob(name: str, *, queue: str, workers: int, gpus: int, run_s: float, priority: str = "",
           backoff_limit: int = 0, deadline_s: int | None = None) -> Obj:
    """A Kueue-managed RayJob (K8sJobMode), created suspended; its submitter pod completes `run_s` after it is ready
    (kwok), as the real one exits when the Ray job it follows ends (the stand-in's script says how it ends)."""
    labels = {"kueue.x-k8s.io/queue-name": queue, RUN_ID_LABEL: f"run-{name}"}
    if priority:
        labels["kueue.x-k8s.io/priority-class"] = priority

    def template(container: str, resources: Obj, annotations: dict[str, str]) -> Obj:
        return {"metadata": {"annotations": annotations},
                "spec": {"containers": [{"name": container, "image": "rayproject/ray:2.49.0",
                                         "resources": {"requests": resources, "limits": resources}}]}}

    spec: Obj = {
        "entrypoint": "python train.py", "submissionMode": "K8sJobMode", "shutdownAfterJobFinishes": True,
        "suspend": True, "backoffLimit": backoff_limit,
        "rayClusterSpec": {
            "headGroupSpec": {"rayStartParams": {}, "template": template("ray-head", {"cpu": "1"}, FAST)},
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": workers, "minReplicas": workers,
                                  "maxReplicas": workers, "rayStartParams": {},
                                  "template": template("ray-worker", {"cpu": "1", GPU: str(gpus)},
                                                       {**FAST, **delays(**{"init-container-running": "1s",
                                                                            "init-container-completed": "1s"})})}]},
        "submitterPodTemplate": {**template("ray-job-submitter", {"cpu": "500m"},
                                            {**FAST, **delays(complete=f"{int(run_s)}s")}),
                                 },
    }
    spec["submitterPodTemplate"]["spec"]["restartPolicy"] = "Never"
    if deadline_s is not None:
        spec["activeDeadlineSeconds"] = deadline_s
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name, "labels": labels}, "spec": spec}


async def quota_free(d: Driver, within_s: float = 300) -> None:
    """The ClusterQueue is shared: wait until what earlier tests left has given its quota back."""
    async def idle() -> bool:
        cqs = (await d.api.get(f"/apis/kueue.x-k8s.io/{d.workload_version}/clusterqueues")).get("items") or []
        return all(not (cq.get("status") or {}).get("admittedWorkloads")
                   and not (cq.get("status") or {}).get("reservingWorkloads") for cq in cqs)
    await d.until("the ClusterQueue to be idle", idle, within_s)


# ------------------------------------------------------------------------------------------------ scenarios


async def quota_wait_and_deletions(d: Driver) -> None:
    """A blocker holds the whole quota; one Job waits for quota and is admitted when it is given back; one is
    deleted while it waits; one is deleted while it runs."""
    await d.create(job("blocker", queue=d.queue, pods=2, gpus=4, annotations=delays(complete="15s")))
    await d.until_workload("blocker", "admitted", lambda w: has(w, "Admitted"), 60)
    await d.create(job("waiter", queue=d.queue, pods=1, gpus=4))
    await d.create(job("queued-deleted", queue=d.queue, pods=1, gpus=4))
    for name in ("waiter", "queued-deleted"):
        await d.until_workload(name, "created", lambda w: True, 60)

    async def both_pending() -> bool:
        # Kueue 0.12 may write no QuotaReserved=False for a Workload waiting for quota (its scheduler's status
        # write can lose a conflict, and it is not retried before the quota changes): its LocalQueue counts it
        lq = await d.api.get(f"/apis/kueue.x-k8s.io/{d.workload_version}/namespaces/{d.namespace}/localqueues/"
                             f"{d.queue}")
        return int((lq.get("status") or {}).get("pendingWorkloads") or 0) >= 2
    await d.until("waiter and queued-deleted to wait for quota", both_pending, 60)
    await d.delete("Job", "queued-deleted")
    await d.until("waiter to complete", lambda: d.job_has("waiter", "Complete"), 120)
    await d.create(job("running-deleted", queue=d.queue, pods=1, gpus=2, annotations=delays(complete="10m")))
    await d.until("running-deleted to run", lambda: d.job_running("running-deleted", 1), 90)
    await d.delete("Job", "running-deleted")
    await d.until("running-deleted to be gone", lambda: _gone(d, "Job", "running-deleted"), 60)
    await d.until("blocker to complete", lambda: d.job_has("blocker", "Complete"), 60)


async def _gone(d: Driver, kind: str, name: str) -> bool:
    return await d.get(kind, name) is None


async def priority_preemption(d: Driver) -> None:
    """A low-priority Job holding the quota is preempted by a high-priority one, requeued, re-admitted and
    completes."""
    await d.create(job("low", queue=d.queue, pods=2, gpus=4, priority="low", annotations=delays(complete="20s")))
    await d.until("low to run", lambda: d.job_running("low", 2), 90)
    await d.create(job("high", queue=d.queue, pods=1, gpus=4, priority="high", annotations=delays(complete="3s")))
    await d.until_workload("low", "evicted (Preempted)", lambda w: has(w, "Evicted", reason="Preempted"), 60)
    await d.until("high to complete", lambda: d.job_has("high", "Complete"), 90)
    await d.until("low to complete after its re-admission", lambda: d.job_has("low", "Complete"), 150)


async def pods_ready_timeout_deactivation(d: Driver) -> None:
    """Pods that never become ready: Kueue evicts at the PodsReady timeout, requeues after its backoff, and at the
    next timeout (the requeuing limit, backoffLimitCount=1) deactivates the Workload."""
    await d.create(job("never-ready", queue=d.queue, pods=1, gpus=1, annotations=NEVER_READY))
    await d.until_workload("never-ready", "deactivated by Kueue",
                           lambda w: w["spec"].get("active") is False and has(w, "QuotaReserved", "False"),
                           4 * PODS_READY_TIMEOUT_S + 60)


async def deactivate_reactivate(d: Driver) -> None:
    """A person deactivates a running Workload (spec.active=false), then reactivates it; it runs again and completes."""
    await d.create(job("paused", queue=d.queue, pods=1, gpus=2, annotations=delays(complete="15s")))
    await d.until("paused to run", lambda: d.job_running("paused", 1), 90)
    await d.set_active("paused", False)
    await d.until_workload("paused", "evicted and released (Deactivated)",
                           lambda w: has(w, "Evicted", reason="Deactivated") and has(w, "QuotaReserved", "False"), 90)
    await d.set_active("paused", True)
    await d.until("paused to complete after its reactivation", lambda: d.job_has("paused", "Complete"), 150)


async def pod_failure_retry(d: Driver) -> None:
    """kwok fails the first pod of an Indexed Job (our stage pod-fail-first-try); the Job controller replaces it and
    the replacement succeeds."""
    await d.create(job("flaky", queue=d.queue, pods=1, gpus=1, labels={FAIL_FIRST_TRY_LABEL: "true"},
                       annotations=delays(complete="3s"),
                       extra_spec={"completionMode": "Indexed", "backoffLimitPerIndex": 1}))
    await d.until("flaky to complete", lambda: d.job_has("flaky", "Complete"), 150)


async def rayjob_preempted_readmitted(d: Driver) -> None:
    """A low-priority RayJob: suspended by Kueue until admitted, its RayCluster and submitter created by the operator,
    preempted by a high-priority Job (the operator tears the cluster down), re-admitted on a new RayCluster."""
    assert d.standin is not None
    d.standin.script(d.namespace, "ray-low", RayRun(20), RayRun(20))
    await d.create(rayjob("ray-low", queue=d.queue, workers=2, gpus=4, run_s=20, priority="low"))

    async def ray_running() -> bool:
        status = await d.rayjob_status("ray-low")
        return status.get("jobDeploymentStatus") == "Running" and status.get("jobStatus") == "RUNNING"

    await d.until("ray-low's Ray job to run", ray_running, 150)
    await d.create(job("high", queue=d.queue, pods=1, gpus=4, priority="high", annotations=delays(complete="3s")))
    await d.until_workload("ray-low", "evicted (Preempted)", lambda w: has(w, "Evicted", reason="Preempted"), 60)
    await d.until("high to complete", lambda: d.job_has("high", "Complete"), 120)

    async def complete() -> bool:
        return (await d.rayjob_status("ray-low")).get("jobDeploymentStatus") == "Complete"

    await d.until("ray-low to complete on its new RayCluster", complete, 240)


async def rayjob_retry(d: Driver) -> None:
    """The Ray job fails; KubeRay (backoffLimit 1) retries the RayJob on a new RayCluster, where it succeeds."""
    assert d.standin is not None
    d.standin.script(d.namespace, "ray-retry", RayRun(3, "FAILED"), RayRun(3))
    await d.create(rayjob("ray-retry", queue=d.queue, workers=1, gpus=2, run_s=4, backoff_limit=1))

    async def complete() -> bool:
        return (await d.rayjob_status("ray-retry")).get("jobDeploymentStatus") == "Complete"

    await d.until("ray-retry to complete after a retry", complete, 240)


async def rayjob_deadline(d: Driver) -> None:
    """The Ray job never ends; KubeRay fails the RayJob at its activeDeadlineSeconds."""
    assert d.standin is not None
    d.standin.script(d.namespace, "ray-deadline", RayRun(600, "RUNNING"))
    await d.create(rayjob("ray-deadline", queue=d.queue, workers=1, gpus=1, run_s=600, deadline_s=30))

    async def failed() -> bool:
        return (await d.rayjob_status("ray-deadline")).get("jobDeploymentStatus") == "Failed"

    await d.until("ray-deadline to fail at its deadline", failed, 180)


SCENARIOS: dict[str, Callable[[Driver], Awaitable[None]]] = {
    "quota-wait-and-deletions": quota_wait_and_deletions,
    "priority-preemption": priority_preemption,
    "podsready-timeout-deactivation": pods_ready_timeout_deactivation,
    "deactivate-reactivate": deactivate_reactivate,
    "pod-failure-retry": pod_failure_retry,
    "rayjob-preempted-readmitted": rayjob_preempted_readmitted,
    "rayjob-retry": rayjob_retry,
    "rayjob-deadline": rayjob_deadline,
}

SUBMITTED = "Submitted"
#: The Job controller's reason on `Complete=True` (Kubernetes 1.32 writes it; older ones left it empty): the reason of
#: a succeeded batch Job's run and of its last attempt's end.
COMPLETED = "CompletionsReached"
RUNTIME = frozenset({"Admission", "Scheduling", "Runtime", "Completion"})

EXPECTED: dict[str, dict[str, Expect]] = {
    "quota-wait-and-deletions": {
        "run-blocker": Expect("succeeded", COMPLETED, "Completion", (AttemptExpect(SUBMITTED, COMPLETED),),
                              phases=RUNTIME),
        "run-waiter": Expect("succeeded", COMPLETED, "Completion", (AttemptExpect(SUBMITTED, COMPLETED),),
                             phases=RUNTIME),
        "run-queued-deleted": Expect("stopped", "Deleted", "Completion", (AttemptExpect(SUBMITTED, "Deleted"),),
                                     phases=frozenset({"Admission", "Completion"})),
        "run-running-deleted": Expect("stopped", "Deleted", "Completion", (AttemptExpect(SUBMITTED, "Deleted"),),
                                      phases=RUNTIME),
    },
    "priority-preemption": {
        "run-low": Expect("succeeded", COMPLETED, "Completion",
                          (AttemptExpect(SUBMITTED, "Preempted"), AttemptExpect("Preempted", COMPLETED)),
                          evictions=1, phases=RUNTIME),
        "run-high": Expect("succeeded", COMPLETED, "Completion", (AttemptExpect(SUBMITTED, COMPLETED),),
                           phases=RUNTIME),
    },
    "podsready-timeout-deactivation": {
        "run-never-ready": Expect("stopped", "DeactivatedDueToRequeuingLimitExceeded", "Completion",
                                  (AttemptExpect(SUBMITTED, "PodsReadyTimeout", "WaitForStart"),
                                   AttemptExpect("PodsReadyTimeout", "DeactivatedDueToRequeuingLimitExceeded",
                                                 "RequeuingLimitExceeded")),
                                  evictions=2, phases=frozenset({"Admission", "Scheduling", "Runtime",
                                                                 "Completion"})),
    },
    "deactivate-reactivate": {
        "run-paused": Expect("succeeded", COMPLETED, "Completion",
                             (AttemptExpect(SUBMITTED, "Deactivated"), AttemptExpect("Deactivated", COMPLETED)),
                             evictions=1, phases=RUNTIME),
    },
    "pod-failure-retry": {
        "run-flaky": Expect("succeeded", COMPLETED, "Completion", (AttemptExpect(SUBMITTED, COMPLETED),), retries=1,
                            phases=RUNTIME),
    },
    "rayjob-preempted-readmitted": {
        "run-ray-low": Expect("succeeded", "Succeeded", "Completion",
                              (AttemptExpect(SUBMITTED, "Preempted"), AttemptExpect("Preempted", "Succeeded")),
                              evictions=1, phases=RUNTIME | {"Progress"}, ray_clusters=2),
        "run-high": Expect("succeeded", COMPLETED, "Completion", (AttemptExpect(SUBMITTED, COMPLETED),),
                           phases=RUNTIME),
    },
    "rayjob-retry": {
        "run-ray-retry": Expect("succeeded", "Succeeded", "Completion",
                                (AttemptExpect(SUBMITTED, "AppFailed"), AttemptExpect("RayJobRetry", "Succeeded")),
                                phases=RUNTIME | {"Progress"}, ray_clusters=2),
    },
    "rayjob-deadline": {
        "run-ray-deadline": Expect("failed", "DeadlineExceeded", "Completion",
                                   (AttemptExpect(SUBMITTED, "DeadlineExceeded"),),
                                   phases=RUNTIME | {"Progress"}, ray_clusters=1),
    },
}


#: Where another Kueue writes otherwise. Kueue 0.12 counts its own deactivation in schedulingStats.evictions as
#: reason DeactivatedDueToRequeuingLimitExceeded with no underlying cause; 0.17 as Deactivated/RequeuingLimitExceeded.
EXPECTED_BY_KUEUE: dict[str, dict[str, dict[str, Expect]]] = {
    "0.12.10": {
        "podsready-timeout-deactivation": {
            "run-never-ready": Expect("stopped", "DeactivatedDueToRequeuingLimitExceeded", "Completion",
                                      (AttemptExpect(SUBMITTED, "PodsReadyTimeout", "WaitForStart"),
                                       AttemptExpect("PodsReadyTimeout", "DeactivatedDueToRequeuingLimitExceeded")),
                                      evictions=2, phases=RUNTIME),
        },
    },
}


def expected(scenario: str, kueue: str | None) -> dict[str, Expect]:
    """What the controllers decide in `scenario` when the cluster runs Kueue `kueue` (None: the default, 0.17)."""
    return EXPECTED_BY_KUEUE.get(kueue or "", {}).get(scenario) or EXPECTED[scenario]


# ------------------------------------------------------------------------------------------------ checking


def _times(value: Any, out: set[float]) -> None:
    """Every timestamp string anywhere in `value`, as seconds since the epoch."""
    if isinstance(value, dict):
        for v in value.values():
            _times(v, out)
    elif isinstance(value, list):
        for v in value:
            _times(v, out)
    elif isinstance(value, str) and len(value) >= 20 and value[4:5] == "-" and value[10:11] == "T":
        with contextlib.suppress(ValueError):
            out.add(datetime.fromisoformat(value).timestamp())


def differences(scenario: str, records: Iterable[Obj], got: dict[str, Any], kueue: str | None = None) -> list[str]:
    """Where the folded histories `got` of a capture made with Kueue `kueue` disagree with what the controllers
    decide (`expected()`); empty if they agree."""
    records = list(records)
    problems: list[str] = []
    wanted_runs = expected(scenario, kueue)
    if set(got) != set(wanted_runs):
        problems.append(f"runs: got {sorted(got)}, expected {sorted(wanted_runs)}")
    object_times: set[float] = set()
    admitted: set[float] = set()
    for rec in records:
        obj = rec["object"]
        _times(obj, object_times)
        if obj.get("kind") == "Workload":
            for c in (obj.get("status") or {}).get("conditions") or []:
                if c.get("type") == "Admitted" and c.get("status") == "True" and c.get("lastTransitionTime"):
                    admitted.add(datetime.fromisoformat(c["lastTransitionTime"]).timestamp())
    for run_id, want in wanted_runs.items():
        if run_id not in got:
            continue
        h = got[run_id]
        run, attempts = h["run"], h["attempts"]
        summary = {"status": run["status"], "reason": run["reason"], "phase": run["phase"],
                   "attempts": run["attempts"], "evictions": run["evictions"], "retries": run["retries"]}
        wanted = {"status": want.status, "reason": want.reason, "phase": want.phase,
                  "attempts": len(want.attempts), "evictions": want.evictions, "retries": want.retries}
        if summary != wanted:
            problems.append(f"{run_id}: got {summary}, expected {wanted}")
        shape = [(a["trigger"], a["end_reason"], a["underlying_cause"]) for a in attempts]
        want_shape = [(a.trigger, a.end_reason, a.cause) for a in want.attempts]
        if shape != want_shape:
            problems.append(f"{run_id}: attempts (trigger, end_reason, cause) {shape}, expected {want_shape}")
        reached = {t["phase"] for t in h["transitions"]}
        if not want.phases <= reached:
            problems.append(f"{run_id}: phases {sorted(reached)} lack {sorted(want.phases - reached)}")
        clusters = {a["ray_cluster"] for a in attempts if a.get("ray_cluster")}
        if len(clusters) != want.ray_clusters:
            problems.append(f"{run_id}: RayClusters {sorted(clusters)}, expected {want.ray_clusters} distinct")
        for a in attempts:
            if a["admitted_at"] is not None and datetime.fromisoformat(a["admitted_at"]).timestamp() not in admitted:
                problems.append(f"{run_id}: attempt {a['attempt']} admitted_at {a['admitted_at']} is no Workload's "
                                "Admitted=True transition")
        stamped = [(f"transition {t['phase']}/{t['reason']}", t["at"]) for t in h["transitions"]]
        stamped += [(f"attempt {a['attempt']} {k}", a[k]) for a in attempts
                    for k in ("queued_at", "admitted_at", "scheduled_at", "started_at", "progress_at", "ended_at")]
        stamped += [(f"run {k}", run[k]) for k in ("created_at", "queued_at", "admitted_at", "started_at",
                                                   "finished_at")]
        for what, at in stamped:
            if at is not None and datetime.fromisoformat(at).timestamp() not in object_times:
                problems.append(f"{run_id}: {what} {at} is no time the captured objects carry")
    return problems
