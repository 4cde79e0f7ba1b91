"""Scenarios the real controllers produce on the simulated cluster (Kueue, the Job controller, the KubeRay operator,
kube-scheduler, kwok), and what the tracker must make of them.

Each scenario drives its objects only as a person would (create a suspended Job or RayJob with a queue label, delete
it, flip a Workload's `spec.active`, create a ClusterQueue that requires an AdmissionCheck) or, in the admission-check
scenarios, as that check's controller would (`tests/support/admission_check_standin.py` moves the check's state);
everything else (admission, preemption, PodsReady timeouts, requeues, deactivation, pod failures and their
replacements, RayClusters, submitters, retries, deadlines, what a check's state makes Kueue do) is decided and
written by the controllers. `tests/watch/test_controller_scenarios.py` runs them live and keeps what the watcher
captured
under `tests/captures/controllers/<scenario>/`; `tests/watch/test_controller_captures.py` folds the kept captures.

`EXPECTED` is what the controllers decide, per run: status and reason, the phase reached, attempts with their
triggers and end reasons, evictions, pod retries, distinct RayClusters; for two-phase admission the attempts'
admission steps and pending spans and what the run says while its check is Pending (`Midway`); for a deleted run,
that it finished at the best evidence of its deletion the objects carry (`RunFacts.deletion_evidence`). It is
written from the scenario's semantics (Kueue's and KubeRay's documented behaviour), not copied from a run. Times are
checked against the objects (`differences`: every time in a history is one the captured objects carry, each attempt's
admission is a Workload's `Admitted=True` transition, its quota reservation a `QuotaReserved=True` one, each admission
step a transition of its kind), never against literals: the API server's clock decides them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from tests.infra.cluster import FAIL_FIRST_TRY_LABEL, GPU, PODS_READY_TIMEOUT_S, RESOURCE_FLAVOR
from tests.support.admission_check_standin import CHECK, AdmissionCheckStandIn, entry
from tests.support.ray_dashboard_standin import RayDashboardStandIn, RayRun
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


#: An admission step (kind, check, state): QuotaReserved (state "Reserved"), AdmissionCheck (state of the check),
#: QuotaReleased (state: the eviction reason).
Step = tuple[str, str | None, str]
#: Steps expected in an order, a frozenset of them in any order among themselves: Kueue adds a check's entry
#: (Pending) and reserves quota in two controllers at about the same time, in either order.
StepsExpect = tuple[Step | frozenset[Step], ...]


@dataclass(frozen=True)
class PendingExpect:
    """A span of the attempt's `pending` list: its category, its detail (None: any) and how long it lasted at least
    (what the scenario held it for, less the API's one-second resolution)."""

    category: str
    detail: str | None = None
    at_least_s: float = 0.0


@dataclass(frozen=True)
class AttemptExpect:
    trigger: str
    end_reason: str | None
    #: the eviction's underlying cause Kueue counted (status.schedulingStats.evictions)
    cause: str | None = None
    #: its admission steps in order (steps Kueue stamped with the same second may come in any order); None: unchecked
    steps: StepsExpect | None = None
    #: spans its `pending` list must hold
    pending: tuple[PendingExpect, ...] = ()


@dataclass(frozen=True)
class Midway:
    """What the run's record says while its AdmissionCheck is Pending with `message` and its quota is reserved (the
    capture folded up to the last record of its Workload in that state)."""

    message: str
    pending_reason: str
    pending_message: str
    phase: str = "Admission"
    attempts: int = 1
    evictions: int = 0


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
    #: phases the history must never have entered, e.g. Scheduling for a run never admitted
    absent_phases: frozenset[str] = frozenset()
    #: its admission waits on AdmissionChecks: every admitted attempt reserved quota (quota_reserved_at) before it was
    #: admitted (admitted_at, the Workload's Admitted=True), and the Scheduling phase began at admitted_at
    two_phase: bool = False
    #: never admitted: the run's and every attempt's admitted_at are null
    never_admitted: bool = False
    midways: tuple[Midway, ...] = ()


@dataclass
class Driver:
    """What a scenario may do: act as a person through the API, and wait (bounded) for what the controllers do."""

    api: KubeApi
    namespace: str
    queue: str
    standin: RayDashboardStandIn | None
    #: the controller of the AdmissionCheck the scenarios' own ClusterQueues require
    #: (tests/support/admission_check_standin.py)
    checks: AdmissionCheckStandIn | None = None
    workload_version: str = ""
    log: list[str] = field(default_factory=list)
    #: what the test undoes, last first, once the watcher stopped and the scenario's Jobs are deleted (the queues
    #: and the AdmissionCheck it created)
    cleanups: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

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

    async def delete(self, kind: str, name: str, propagation: str = "Background") -> None:
        """`kubectl delete` (its default propagation is Background; `--cascade=foreground` is Foreground)."""
        self.log.append(f"{time.strftime('%H:%M:%S')} delete {kind}/{name} ({propagation})")
        await self.api.request("DELETE", self.path(kind, name), body={"propagationPolicy": propagation})

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

    async def check(self, owner: str, state: str, message: str, *, requeue_after_s: int | None = None) -> None:
        """What the AdmissionCheck's controller (the stand-in) does: move the check's entry on `owner`'s Workload."""
        assert self.checks is not None, "the scenario needs the AdmissionCheck stand-in"
        wl = await self.workload(owner)
        assert wl is not None, f"no Workload for {owner}"
        self.log.append(f"{time.strftime('%H:%M:%S')} check {self.checks.check}={state} on {owner}'s Workload")
        await self.checks.set(self.path("Workload", wl["metadata"]["name"]), state, message,
                              requeue_after_s=requeue_after_s)

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


# ------------------------------------------------------------------------------------------------ admission checks

#: The LocalQueue (in the scenario's namespace) of the scenario's own ClusterQueue, which requires the stand-in's check
CHECKED_QUEUE = "checked-queue"
#: That ClusterQueue's quota: cohort-less and small, beside the shared `cluster-queue` (the nodes hold 8 GPUs; the
#: scenarios run one at a time and wait for every ClusterQueue to be idle before they start)
CHECKED_QUOTA = {"cpu": "8", "memory": "64Gi", GPU: "2"}
#: how long a check stays Pending (with a message) while the Workload holds its quota reservation
HOLD_S = 6
HOLD_MESSAGE = "waiting for capacity: request 1 of 1 accepted, not provisioned yet"
HOLD_AGAIN_MESSAGE = "waiting for capacity: request 2 of 2 accepted, not provisioned yet"
READY_MESSAGE = "capacity provisioned"
RETRY_MESSAGE = "capacity request failed: out of stock; retrying"
REJECT_MESSAGE = "capacity request failed for good: the requested GPUs are not offered here"
#: what the stand-in asks Kueue to wait after a Retry (Kueue 0.15+: requeueAfterSeconds; 0.12's API has no such field)
RETRY_AFTER_S = 5


async def checked_queue(d: Driver) -> str:
    """A ClusterQueue of the scenario's own (cohort-less, `CHECKED_QUOTA`) that requires the stand-in's AdmissionCheck
    for every flavor (`admissionChecksStrategy`), and a LocalQueue feeding it in the scenario's namespace; both active.
    They are removed after the scenario (`Driver.cleanups`). The LocalQueue's name."""
    assert d.checks is not None, "the scenario needs the AdmissionCheck stand-in"
    checks = d.checks
    await checks.install()
    d.cleanups.append(checks.uninstall)  # cleanups run last first: after the ClusterQueue is gone
    cq_name = f"checked-{d.namespace}"
    cq_path = f"/apis/kueue.x-k8s.io/v1beta1/clusterqueues/{cq_name}"
    lq_path = f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{d.namespace}/localqueues/{CHECKED_QUEUE}"
    await d.api.request("POST", cq_path.rsplit("/", 1)[0], body={
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": cq_name},
        "spec": {"namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO",
                 "resourceGroups": [{"coveredResources": list(CHECKED_QUOTA), "flavors": [{
                     "name": RESOURCE_FLAVOR,
                     "resources": [{"name": r, "nominalQuota": q} for r, q in CHECKED_QUOTA.items()]}]}],
                 "admissionChecksStrategy": {"admissionChecks": [{"name": checks.check}]}}})

    async def remove() -> None:
        for path in (lq_path, cq_path):
            with contextlib.suppress(ApiError):
                await d.api.request("DELETE", path)

        async def cq_gone() -> bool:
            try:
                await d.api.get(cq_path)
            except ApiError as exc:
                if exc.status == 404:
                    return True
                raise
            return False
        await d.until(f"ClusterQueue {cq_name} to be gone", cq_gone, 120)

    d.cleanups.append(remove)
    await d.api.request("POST", lq_path.rsplit("/", 1)[0], body={
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
        "metadata": {"name": CHECKED_QUEUE, "namespace": d.namespace}, "spec": {"clusterQueue": cq_name}})

    async def active() -> bool:
        return has(await d.api.get(cq_path), "Active") and has(await d.api.get(lq_path), "Active")
    await d.until(f"ClusterQueue {cq_name} (its check active) and its LocalQueue to be active", active, 60)
    return CHECKED_QUEUE


def check_state(wl: Obj, check: str) -> str | None:
    found = entry(wl, check)
    return None if found is None else str(found.get("state"))


def evicted_for(wl: Obj, reason: str) -> bool:
    """Kueue counted an eviction for `reason` (status.schedulingStats.evictions)."""
    return any(e.get("reason") == reason
               for e in ((wl.get("status") or {}).get("schedulingStats") or {}).get("evictions") or [])


async def reserved_pending(d: Driver, owner: str, what: str) -> Obj:
    """Wait until `owner`'s Workload holds a quota reservation, is not admitted, and its check is Pending."""
    assert d.checks is not None
    check = d.checks.check
    return await d.until_workload(
        owner, what, lambda w: has(w, "QuotaReserved") and not has(w, "Admitted") and not has(w, "Evicted")
        and check_state(w, check) == "Pending", 60)


async def held(d: Driver, owner: str) -> None:
    """Kueue keeps the Workload unadmitted and its Job suspended while the check is Pending."""
    wl = await d.workload(owner)
    job_obj = await d.get("Job", owner)
    assert wl is not None and job_obj is not None
    assert has(wl, "QuotaReserved") and not has(wl, "Admitted"), f"{owner}: admitted with its check Pending: {wl}"
    assert job_obj["spec"].get("suspend") is True, f"{owner}: unsuspended with its check Pending"


async def check_held_pending(d: Driver, name: str, hold_s: float) -> None:
    """A Job `name` in the checked queue, its quota reserved and its check held Pending (HOLD_MESSAGE) for `hold_s`,
    its Job suspended all along."""
    queue = await checked_queue(d)
    await d.create(job(name, queue=queue, pods=1, gpus=1, annotations=delays(complete="5s")))
    await reserved_pending(d, name, "quota reserved, its check Pending")
    await d.check(name, "Pending", HOLD_MESSAGE)
    await asyncio.sleep(hold_s)
    await held(d, name)


async def admission_check_two_phase(d: Driver) -> None:
    """Quota reserved, the AdmissionCheck Pending (with a message) for HOLD_S, then Ready: Kueue admits the Workload
    (Admitted=True), the Job is unsuspended, runs and completes."""
    await check_held_pending(d, "two-phase", HOLD_S)
    await d.check("two-phase", "Ready", READY_MESSAGE)
    await d.until_workload("two-phase", "admitted", lambda w: has(w, "Admitted"), 30)
    await d.until("two-phase to complete", lambda: d.job_has("two-phase", "Complete"), 90)


async def admission_check_retry(d: Driver) -> None:
    """The check goes Pending, then Retry before the Workload was ever admitted: Kueue evicts it (reason
    AdmissionCheck), releases its quota, resets the check to Pending and requeues it (after requeueAfterSeconds on
    Kueue 0.17); quota is reserved again, the check goes Pending, then Ready; the Job runs and completes."""
    assert d.checks is not None
    await check_held_pending(d, "retried", HOLD_S / 2)
    await d.check("retried", "Retry", RETRY_MESSAGE,
                  requeue_after_s=RETRY_AFTER_S if d.workload_version == "v1beta2" else None)
    check = d.checks.check
    await d.until_workload(
        "retried", "evicted (AdmissionCheck), requeued, quota reserved again with its check Pending",
        lambda w: evicted_for(w, "AdmissionCheck") and has(w, "QuotaReserved") and not has(w, "Evicted")
        and not has(w, "Admitted") and check_state(w, check) == "Pending", 90)
    await d.check("retried", "Pending", HOLD_AGAIN_MESSAGE)
    await asyncio.sleep(HOLD_S / 2)
    await held(d, "retried")
    await d.check("retried", "Ready", READY_MESSAGE)
    await d.until("retried to complete", lambda: d.job_has("retried", "Complete"), 90)


async def admission_check_rejected(d: Driver) -> None:
    """The check goes Pending, then Rejected: Kueue deactivates the Workload (spec.active=false, Evicted=True
    DeactivatedDueToAdmissionCheck) and releases its quota; the Job never leaves suspend=true."""
    await check_held_pending(d, "rejected", HOLD_S / 2)
    await d.check("rejected", "Rejected", REJECT_MESSAGE)
    await d.until_workload("rejected", "deactivated by Kueue and its quota released",
                           lambda w: w["spec"].get("active") is False and has(w, "Evicted")
                           and has(w, "QuotaReserved", "False"), 60)
    await asyncio.sleep(2)  # nothing more happens: the Job stays suspended
    job_obj = await d.get("Job", "rejected")
    assert job_obj is not None and job_obj["spec"].get("suspend") is True, "rejected: the Job was unsuspended"
    assert not [p for p in await d.items("Pod") if p["metadata"]["name"].startswith("rejected-")], "rejected: pods"


# ------------------------------------------------------------------------------------------------ deletions


async def deleted_while_running(d: Driver) -> None:
    """A Job whose pods would run for ten minutes is deleted (kubectl's default, background propagation) while they
    run: the Job goes at once, the garbage collector deletes its pods and its Workload."""
    await d.create(job("doomed", queue=d.queue, pods=2, gpus=1, annotations=delays(complete="10m")))
    await d.until("doomed to run", lambda: d.job_running("doomed", 2), 90)
    await asyncio.sleep(3)
    await d.delete("Job", "doomed")

    async def all_gone() -> bool:
        pods = [p for p in await d.items("Pod") if p["metadata"]["name"].startswith("doomed-")]
        return not pods and await d.get("Job", "doomed") is None and await d.workload("doomed") is None
    await d.until("doomed, its pods and its Workload to be gone", all_gone, 90)


async def deleted_while_queued(d: Driver) -> None:
    """A blocker holds the whole quota; two Jobs wait for quota and are deleted while they wait: one in the
    background (kubectl's default: the Job goes at once), one in the foreground (`--cascade=foreground`: the Job
    carries a deletionTimestamp until the garbage collector has deleted its Workload)."""
    await d.create(job("holder", queue=d.queue, pods=2, gpus=4, annotations=delays(complete="20s")))
    await d.until_workload("holder", "admitted", lambda w: has(w, "Admitted"), 60)
    for name in ("queued-bg", "queued-fg"):
        await d.create(job(name, queue=d.queue, pods=1, gpus=4))

    async def both_pending() -> bool:
        lq = await d.api.get(f"/apis/kueue.x-k8s.io/{d.workload_version}/namespaces/{d.namespace}/localqueues/"
                             f"{d.queue}")
        return int((lq.get("status") or {}).get("pendingWorkloads") or 0) >= 2
    await d.until("queued-bg and queued-fg to wait for quota", both_pending, 60)
    await asyncio.sleep(3)
    await d.delete("Job", "queued-bg")
    await d.delete("Job", "queued-fg", propagation="Foreground")
    for name in ("queued-bg", "queued-fg"):
        await d.until(f"{name} to be gone", lambda n=name: _gone(d, "Job", n), 60)
    await d.until("holder to complete", lambda: d.job_has("holder", "Complete"), 90)


SCENARIOS: dict[str, Callable[[Driver], Awaitable[None]]] = {
    "quota-wait-and-deletions": quota_wait_and_deletions,
    "priority-preemption": priority_preemption,
    "podsready-timeout-deactivation": pods_ready_timeout_deactivation,
    "deactivate-reactivate": deactivate_reactivate,
    "pod-failure-retry": pod_failure_retry,
    "rayjob-preempted-readmitted": rayjob_preempted_readmitted,
    "rayjob-retry": rayjob_retry,
    "rayjob-deadline": rayjob_deadline,
    "admission-check-two-phase": admission_check_two_phase,
    "admission-check-retry": admission_check_retry,
    "admission-check-rejected": admission_check_rejected,
    "deleted-while-running": deleted_while_running,
    "deleted-while-queued": deleted_while_queued,
}

SUBMITTED = "Submitted"
#: The Job controller's reason on `Complete=True` (Kubernetes 1.32 writes it; older ones left it empty): the reason of
#: a succeeded batch Job's run and of its last attempt's end.
COMPLETED = "CompletionsReached"
RUNTIME = frozenset({"Admission", "Scheduling", "Runtime", "Completion"})

#: Kueue's workload controller adds the check's entry (Pending, no message) as soon as the Workload exists (the check is
#: required for every flavor, so it need not wait for the flavors assigned: AdmissionChecksForWorkload), while its
#: scheduler reserves quota: either comes first
RESERVED_AND_CHECK_PENDING = frozenset({("AdmissionCheck", CHECK, "Pending"), ("QuotaReserved", None, "Reserved")})

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
    "admission-check-two-phase": {
        "run-two-phase": Expect(
            "succeeded", COMPLETED, "Completion",
            (AttemptExpect(SUBMITTED, COMPLETED,
                           steps=(RESERVED_AND_CHECK_PENDING,
                                  ("AdmissionCheck", CHECK, "Ready")),
                           pending=(PendingExpect("admission-check", CHECK, HOLD_S - 1),)),),
            phases=RUNTIME, two_phase=True,
            midways=(Midway(HOLD_MESSAGE, "AdmissionCheckPending", f"{CHECK}: {HOLD_MESSAGE}"),)),
    },
    # Retry before admission: Kueue evicts (Evicted=True/AdmissionCheck, counted in schedulingStats.evictions),
    # resets the check to Pending in the same write, releases the quota and requeues: the Job never ran, so no new
    # attempt begins, but the eviction counts. (Kueue 0.17, given requeueAfterSeconds, first sets requeueState.requeueAt
    # and keeps the reservation until then; it evicts, releases and reserves again within that second.)
    "admission-check-retry": {
        "run-retried": Expect(
            "succeeded", COMPLETED, "Completion",
            (AttemptExpect(SUBMITTED, COMPLETED,
                           steps=(RESERVED_AND_CHECK_PENDING,
                                  ("AdmissionCheck", CHECK, "Retry"), ("AdmissionCheck", CHECK, "Pending"),
                                  ("QuotaReleased", None, "AdmissionCheck"), ("QuotaReserved", None, "Reserved"),
                                  ("AdmissionCheck", CHECK, "Ready")),
                           pending=(PendingExpect("admission-check", CHECK, HOLD_S / 2 - 1),)),),
            evictions=1, phases=RUNTIME, two_phase=True,
            midways=(Midway(HOLD_MESSAGE, "AdmissionCheckPending", f"{CHECK}: {HOLD_MESSAGE}"),
                     Midway(HOLD_AGAIN_MESSAGE, "AdmissionCheckPending", f"{CHECK}: {HOLD_AGAIN_MESSAGE}",
                            evictions=1))),
    },
    # Rejected: Kueue sets DeactivationTarget, then spec.active=false, then evicts (Evicted=True
    # DeactivatedDueToAdmissionCheck, resetting the check to Pending) and releases the quota; the Job stays suspended
    "admission-check-rejected": {
        "run-rejected": Expect(
            "stopped", "DeactivatedDueToAdmissionCheck", "Completion",
            (AttemptExpect(SUBMITTED, "DeactivatedDueToAdmissionCheck", "AdmissionCheck",
                           steps=(RESERVED_AND_CHECK_PENDING,
                                  ("AdmissionCheck", CHECK, "Rejected"), ("AdmissionCheck", CHECK, "Pending"),
                                  ("QuotaReleased", None, "DeactivatedDueToAdmissionCheck")),
                           pending=(PendingExpect("admission-check", CHECK, HOLD_S / 2 - 1),)),),
            evictions=1, phases=frozenset({"Admission", "Completion"}),
            absent_phases=frozenset({"Scheduling", "Runtime"}), never_admitted=True,
            midways=(Midway(HOLD_MESSAGE, "AdmissionCheckPending", f"{CHECK}: {HOLD_MESSAGE}"),)),
    },
    "deleted-while-running": {
        "run-doomed": Expect("stopped", "Deleted", "Completion", (AttemptExpect(SUBMITTED, "Deleted"),),
                             phases=RUNTIME),
    },
    "deleted-while-queued": {
        "run-holder": Expect("succeeded", COMPLETED, "Completion", (AttemptExpect(SUBMITTED, COMPLETED),),
                             phases=RUNTIME),
        "run-queued-bg": Expect("stopped", "Deleted", "Completion",
                                (AttemptExpect(SUBMITTED, "Deleted", pending=(PendingExpect("quota"),)),),
                                phases=frozenset({"Admission", "Completion"}),
                                absent_phases=frozenset({"Scheduling", "Runtime"}), never_admitted=True),
        "run-queued-fg": Expect("stopped", "Deleted", "Completion",
                                (AttemptExpect(SUBMITTED, "Deleted", pending=(PendingExpect("quota"),)),),
                                phases=frozenset({"Admission", "Completion"}),
                                absent_phases=frozenset({"Scheduling", "Runtime"}), never_admitted=True),
    },
}


#: Where another Kueue writes otherwise. Kueue 0.12 counts its own deactivation in schedulingStats.evictions as
#: reason DeactivatedDueTo<cause> with no underlying cause; 0.17 as Deactivated/<cause>. Kueue 0.12's
#: AdmissionCheck entries have no requeueAfterSeconds: a Retry requeues the Workload at once (no backoff).
EXPECTED_BY_KUEUE: dict[str, dict[str, dict[str, Expect]]] = {
    "0.12.10": {
        "podsready-timeout-deactivation": {
            "run-never-ready": Expect("stopped", "DeactivatedDueToRequeuingLimitExceeded", "Completion",
                                      (AttemptExpect(SUBMITTED, "PodsReadyTimeout", "WaitForStart"),
                                       AttemptExpect("PodsReadyTimeout", "DeactivatedDueToRequeuingLimitExceeded")),
                                      evictions=2, phases=RUNTIME),
        },
        "admission-check-rejected": {
            "run-rejected": replace(
                EXPECTED["admission-check-rejected"]["run-rejected"],
                attempts=(replace(EXPECTED["admission-check-rejected"]["run-rejected"].attempts[0], cause=None),)),
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


def _sec(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def _owner(obj: Obj) -> str | None:
    """The name of the Job or RayJob `obj` (a Workload or a Job's pod) belongs to."""
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("kind") in ("Job", "RayJob"):
            return str(ref.get("name"))
    return None


@dataclass
class RunFacts:
    """What the captured objects of one run (its root Job or RayJob `name`, its Workload, its pods) carry."""

    name: str
    reserved: set[float] = field(default_factory=set)  # QuotaReserved=True lastTransitionTimes
    released: set[float] = field(default_factory=set)  # QuotaReserved=False and Evicted=True lastTransitionTimes
    #: (check, state, lastTransitionTime) -> the messages that entry carried
    checks: dict[tuple[str, str, float], set[str]] = field(default_factory=dict)
    root_deleted: set[float] = field(default_factory=set)
    workload_deleted: set[float] = field(default_factory=set)
    pods_deleted: set[float] = field(default_factory=set)  # deletionTimestamp less deletionGracePeriodSeconds
    finished: set[float] = field(default_factory=set)  # containers' finishedAt

    def deletion_evidence(self) -> tuple[str, set[float]] | None:
        """The best evidence of when the run was deleted, in the tracker's order: the root's deletionTimestamp, the
        Workload's, its pods' deletionTimestamp less their grace period, its containers' last finishedAt."""
        for what, found in (("the root's deletionTimestamp", self.root_deleted),
                            ("the Workload's deletionTimestamp", self.workload_deleted),
                            ("its pods' deletionTimestamp less their grace period", self.pods_deleted)):
            if found:
                return what, found
        if self.finished:
            return "its last container finishedAt", {max(self.finished)}
        return None


def run_facts(records: Iterable[Obj]) -> dict[str, RunFacts]:
    """Per root name, what its captured objects carry (`RunFacts`)."""
    out: dict[str, RunFacts] = {}

    def facts(name: str) -> RunFacts:
        return out.setdefault(name, RunFacts(name))

    for rec in records:
        obj = rec["object"]
        kind, meta = obj.get("kind"), obj["metadata"]
        status = obj.get("status") or {}
        if kind in ("Job", "RayJob") and _owner(obj) is None:
            root = facts(meta["name"])
            if meta.get("deletionTimestamp"):
                root.root_deleted.add(_sec(meta["deletionTimestamp"]))
            continue
        owner = _owner(obj)
        if owner is None:
            continue
        f = facts(owner)
        if kind == "Workload":
            if meta.get("deletionTimestamp"):
                f.workload_deleted.add(_sec(meta["deletionTimestamp"]))
            for c in status.get("conditions") or []:
                if not c.get("lastTransitionTime"):
                    continue
                if c.get("type") == "QuotaReserved":
                    (f.reserved if c.get("status") == "True" else f.released).add(_sec(c["lastTransitionTime"]))
                elif c.get("type") == "Evicted" and c.get("status") == "True":
                    f.released.add(_sec(c["lastTransitionTime"]))
            for ac in status.get("admissionChecks") or []:
                if ac.get("lastTransitionTime"):
                    key = (str(ac.get("name")), str(ac.get("state")), _sec(ac["lastTransitionTime"]))
                    f.checks.setdefault(key, set()).add(str(ac.get("message") or ""))
        elif kind == "Pod":
            if meta.get("deletionTimestamp"):
                f.pods_deleted.add(_sec(meta["deletionTimestamp"]) - float(meta.get("deletionGracePeriodSeconds") or 0))
            for cs in status.get("containerStatuses") or []:
                done = ((cs.get("state") or {}).get("terminated") or {}).get("finishedAt")
                if done:
                    f.finished.add(_sec(done))
    return out


def _orders(groups: list[list[Step]]) -> set[tuple[Step, ...]]:
    """Every sequence the groups make, each group in any order of its own."""
    out: set[tuple[Step, ...]] = {()}
    for group in groups:
        out = {prefix + perm for prefix in out for perm in itertools.permutations(group)}
    return out


def same_steps(got: list[Obj], want: StepsExpect) -> bool:
    """`got` (admission steps, each with its `at`) are `want` in order, except that steps stamped with the same second
    may come in any order among themselves, as may the steps of a frozenset in `want`; and their times never go
    back."""
    ats = [_sec(g["at"]) for g in got]
    if ats != sorted(ats):
        return False
    # a QuotaReserved step's state names the ClusterQueue that reserved it: any one matches "Reserved"
    ties = [[(g["kind"], g.get("check"), "Reserved" if g["kind"] == "QuotaReserved" else g["state"]) for _, g in tie]
            for _, tie in itertools.groupby(zip(ats, got, strict=True), key=lambda pair: pair[0])]
    seen = _orders(ties)
    wanted = _orders([list(w) if isinstance(w, frozenset) else [w] for w in want])
    return bool(seen & wanted)


def _step_problems(run_id: str, a: Obj, want: AttemptExpect, f: RunFacts) -> list[str]:
    problems: list[str] = []
    steps = a.get("admission_steps")
    if want.steps is not None:
        if steps is None:
            return [f"{run_id}: attempt {a['attempt']} has no admission_steps"]
        if not same_steps(steps, want.steps):
            problems.append(f"{run_id}: attempt {a['attempt']} admission steps "
                            f"{[(s['kind'], s.get('check'), s['state'], s['at']) for s in steps]}, expected "
                            f"{list(want.steps)} (ties within a second in any order)")
    for step in steps or []:
        at = _sec(step["at"])
        kind = step["kind"]
        if kind == "QuotaReserved" and at not in f.reserved:
            problems.append(f"{run_id}: step QuotaReserved at {step['at']} is no QuotaReserved=True transition")
        elif kind == "QuotaReleased" and at not in f.released:
            problems.append(f"{run_id}: step QuotaReleased at {step['at']} is no QuotaReserved=False or Evicted=True "
                            "transition")
        elif kind == "AdmissionCheck":
            messages = f.checks.get((str(step.get("check")), str(step["state"]), at))
            if messages is None:
                problems.append(f"{run_id}: step AdmissionCheck {step.get('check')}={step['state']} at {step['at']} "
                                "is no admissionChecks entry the Workload carried")
            elif (step.get("message") or "") not in messages:
                problems.append(f"{run_id}: step AdmissionCheck {step.get('check')}={step['state']} message "
                                f"{step.get('message')!r} is none of the entry's {sorted(messages)}")
    return problems


def _pending_problems(run_id: str, a: Obj, want: AttemptExpect) -> list[str]:
    if not want.pending:
        return []
    spans = a.get("pending")
    if spans is None:
        return [f"{run_id}: attempt {a['attempt']} has no pending spans"]
    problems = []
    for w in want.pending:
        matching = [p for p in spans
                    if p["category"] == w.category and (w.detail is None or p.get("detail") == w.detail)]
        if not matching:
            problems.append(f"{run_id}: attempt {a['attempt']} has no pending span {w.category}/{w.detail}: "
                            f"{[(p['category'], p.get('detail')) for p in spans]}")
            continue
        if not w.at_least_s:
            continue  # an open span will do (a run deleted while it waited, with no deletion time to end it)
        longest = max((_sec(p["end"]) - _sec(p["start"]) for p in matching if p.get("end")), default=None)
        if longest is None or longest < w.at_least_s:
            problems.append(f"{run_id}: attempt {a['attempt']} pending {w.category}/{w.detail} lasted {longest} s, "
                            f"expected at least {w.at_least_s} s")
    if a.get("admitted_at"):
        late = [p for p in spans if p.get("end") and _sec(p["end"]) > _sec(a["admitted_at"])
                and p["category"] in ("queued", "quota", "preemption", "inadmissible", "admission-check", "backoff")]
        if late:
            problems.append(f"{run_id}: attempt {a['attempt']} admission waits end after its admission: {late}")
    for p in spans:
        if p.get("end") and _sec(p["end"]) < _sec(p["start"]):
            problems.append(f"{run_id}: pending span {p} ends before it starts")
    return problems


def midway_records(records: list[Obj], owner: str, check: str, message: str) -> list[Obj] | None:
    """The capture up to the last record of `owner`'s Workload holding its quota with `check` Pending with
    `message`; None if it never did."""
    last = None
    for i, rec in enumerate(records):
        obj = rec["object"]
        if obj.get("kind") == "Workload" and _owner(obj) == owner and has(obj, "QuotaReserved"):
            found = entry(obj, check)
            if found is not None and found.get("state") == "Pending" and found.get("message") == message:
                last = i
    return None if last is None else records[:last + 1]


def midway_problems(run_id: str, want: Midway, h: Obj) -> list[str]:
    run = h["run"]
    got = {"pending_reason": run.get("pending_reason"), "pending_message": run.get("pending_message"),
           "phase": run["phase"], "attempts": run["attempts"], "evictions": run["evictions"],
           "admitted_at": run["admitted_at"], "status": run["status"]}
    wanted = {"pending_reason": want.pending_reason, "pending_message": want.pending_message, "phase": want.phase,
              "attempts": want.attempts, "evictions": want.evictions, "admitted_at": None, "status": "pending"}
    problems = []
    if got != wanted:
        problems.append(f"{run_id} while its check is Pending ({want.message!r}): got {got}, expected {wanted}")
    last = h["attempts"][-1] if h["attempts"] else {}
    if last.get("admitted_at") is not None or last.get("quota_reserved_at") is None:
        problems.append(f"{run_id} while its check is Pending: its attempt's admitted_at {last.get('admitted_at')} "
                        f"(expected null), quota_reserved_at {last.get('quota_reserved_at')} (expected set)")
    return problems


def differences(scenario: str, records: Iterable[Obj], got: dict[str, Any], kueue: str | None = None,
                midway: Callable[[list[Obj]], dict[str, Any]] | None = None) -> list[str]:
    """Where the folded histories `got` of a capture made with Kueue `kueue` disagree with what the controllers
    decide (`expected()`); empty if they agree. `midway` folds a prefix of the capture (for `Expect.midways`)."""
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
    facts = run_facts(records)
    for f in facts.values():
        object_times |= f.pods_deleted  # a deletion asked for is a time the objects say, less the grace period
    for run_id, want in wanted_runs.items():
        if run_id not in got:
            continue
        h = got[run_id]
        f = facts.get(run_id.removeprefix("run-"), RunFacts(run_id))
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
        if want.absent_phases & reached:
            problems.append(f"{run_id}: phases {sorted(reached)} hold {sorted(want.absent_phases & reached)}, "
                            "which it never entered")
        clusters = {a["ray_cluster"] for a in attempts if a.get("ray_cluster")}
        if len(clusters) != want.ray_clusters:
            problems.append(f"{run_id}: RayClusters {sorted(clusters)}, expected {want.ray_clusters} distinct")
        for a in attempts:
            if a["admitted_at"] is not None and datetime.fromisoformat(a["admitted_at"]).timestamp() not in admitted:
                problems.append(f"{run_id}: attempt {a['attempt']} admitted_at {a['admitted_at']} is no Workload's "
                                "Admitted=True transition")
            reserved = a.get("quota_reserved_at")
            if reserved is not None and _sec(reserved) not in f.reserved:
                problems.append(f"{run_id}: attempt {a['attempt']} quota_reserved_at {reserved} is no Workload's "
                                "QuotaReserved=True transition")
            if want.two_phase and a["admitted_at"] is not None and (
                    reserved is None or not _sec(reserved) < _sec(a["admitted_at"])):
                problems.append(f"{run_id}: attempt {a['attempt']} quota_reserved_at {reserved} is not before its "
                                f"admitted_at {a['admitted_at']} (the check held it Pending for seconds)")
        for a, wa in zip(attempts, want.attempts, strict=False):
            problems += _step_problems(run_id, a, wa, f)
            if not (a is attempts[-1] and "not recorded" in run["message"]):
                # (a deletion no object recorded ends the last attempt at the latest time its objects carry: its
                # spans are cut there, and may be none at all)
                problems += _pending_problems(run_id, a, wa)
        if want.two_phase:
            scheduling = sorted(_sec(t["at"]) for t in h["transitions"] if t["phase"] == "Scheduling")
            admissions = sorted(_sec(a["admitted_at"]) for a in attempts if a["admitted_at"])
            if scheduling != admissions:
                problems.append(f"{run_id}: Scheduling began at {scheduling}, expected at the admissions "
                                f"(Admitted=True) {admissions}")
        if want.never_admitted and (run["admitted_at"] is not None or any(a["admitted_at"] for a in attempts)):
            problems.append(f"{run_id}: admitted_at {run['admitted_at']}, "
                            f"{[a['admitted_at'] for a in attempts]}: it was never admitted")
        if want.reason == "Deleted":
            evidence = f.deletion_evidence()
            ended = attempts[-1]["ended_at"] if attempts else None
            if evidence is None:
                # no object says when: the latest time its objects carry (a lower bound, said so in the message)
                if run["finished_at"] is None or "not recorded" not in run["message"]:
                    problems.append(f"{run_id}: finished_at {run['finished_at']} ({run['message']!r}): no object "
                                    "carries evidence of its deletion, expected the latest time they carry, said so")
            else:
                what, times = evidence
                for label, at in (("finished_at", run["finished_at"]), ("its last attempt's ended_at", ended)):
                    if at is None or _sec(at) not in times:
                        problems.append(f"{run_id}: {label} {at} is not {what} "
                                        f"{sorted(datetime.fromtimestamp(t, UTC).isoformat() for t in times)}")
        for mw in want.midways:
            prefix = midway_records(records, run_id.removeprefix("run-"), CHECK, mw.message)
            if prefix is None:
                problems.append(f"{run_id}: the capture never shows its check Pending with {mw.message!r}")
            elif midway is not None:
                problems += midway_problems(run_id, mw, midway(prefix)[run_id])
        stamped = [(f"transition {t['phase']}/{t['reason']}", t["at"]) for t in h["transitions"]]
        stamped += [(f"attempt {a['attempt']} {k}", a.get(k)) for a in attempts
                    for k in ("queued_at", "quota_reserved_at", "admitted_at", "scheduled_at", "started_at",
                              "progress_at", "ended_at")]
        stamped += [(f"attempt {a['attempt']} step {s['kind']}/{s['state']}", s["at"]) for a in attempts
                    for s in a.get("admission_steps") or []]
        stamped += [(f"attempt {a['attempt']} pending {p['category']} {k}", p.get(k)) for a in attempts
                    for p in a.get("pending") or [] for k in ("start", "end")]
        stamped += [(f"run {k}", run[k]) for k in ("created_at", "queued_at", "admitted_at", "started_at",
                                                   "finished_at")]
        for what, at in stamped:
            if at is not None and datetime.fromisoformat(at).timestamp() not in object_times:
                problems.append(f"{run_id}: {what} {at} is no time the captured objects carry")
    return problems
