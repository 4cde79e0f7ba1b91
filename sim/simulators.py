"""Simulators of the controllers behind the bundled scenarios (``sim.scenarios``).

Small models of the Job controller, Kueue, KubeRay, the scheduler and the kubelet, which write the sequences of
``shared/reference/lifecycle.md`` (§1.7 a to e, §2, §3, §4.3 to 4.5), and a deactivation by hand and its
reactivation as Kueue v0.12-v0.17 write them (``pkg/controller/core/workload_controller.go``,
``pkg/controller/jobframework/reconciler.go``, ``pkg/workload/workload.go``). Every status write is one MODIFIED
watch event carrying the whole object, a delete is a DELETED event with the last state, and a repeated Event is the
same Event object MODIFIED with a higher count. ``Rec`` records the writes of one scenario; ``Tau`` and the intake
helpers write TauGrid's own intake events (Resolution, Rendering, Progress, and the training process's checkpoint
saves and restores).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sim import builders as b
from sim.builders import MINUTE, SECOND, EventsApi, Ms, Obj, WorkloadApi
from tracker.core.model import (
    ANN_CONFIG_DIGEST,
    ANN_CONFIG_REF,
    ANN_GIT_COMMIT,
    ANN_OUTPUT,
    ANN_RESUME_OF,
    LABEL_CONTROLLER_UID,
    LABEL_PROJECT,
    LABEL_QUEUE,
    LABEL_RAY_CLUSTER,
    LABEL_RAY_NODE_TYPE,
    LABEL_RUN_ID,
    LABEL_TARGET,
    LABEL_WORKSPACE,
)

STREAMS = ("jobs", "workloads", "pods", "events", "rayjobs", "rayclusters", "intake")

CLUSTER_QUEUE = "gpu-cq"
FLAVOR = "h100"
FLAVOR_NODE_LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
FLAVOR_TOLERATIONS = ({"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"},)
NODES = tuple(f"aks-h100-36541870-vmss{i:06x}" for i in range(8))
PODS_READY_TIMEOUT: Ms = 10 * MINUTE  # Kueue waitForPodsReady.timeout of this cluster
REQUEUE_BACKOFF: Ms = 60 * SECOND  # requeuingStrategy.backoffBaseSeconds (backoffLimitCount is 1)
REGISTRY = "acr-taugrid.azurecr.io"

# Components that record Events; the first group uses client-go tools/record (count, firstTimestamp).
KUBELET = "kubelet"
JOB_CONTROLLER = "job-controller"
KUEUE_ADMISSION = "kueue-admission"
KUEUE_WORKLOAD = "kueue-workload-controller"
KUEUE_JOB = "batch/job-kueue-controller"
KUEUE_RAYJOB = "ray.io/rayjob-kueue-controller"
SCHEDULER = "default-scheduler"  # tools/events (eventTime, series)
RAYJOB_CONTROLLER = "rayjob-controller"
RAYCLUSTER_CONTROLLER = "raycluster-controller"
NEW_RECORDERS = frozenset({SCHEDULER})
CONTROL_PLANE_HOST = "aks-system-14725836-vmss000000"


@dataclass(frozen=True, slots=True)
class Write:
    at: Ms
    stream: str
    record: Obj  # a watch event {"type", "object"} or an intake event


@dataclass(slots=True)
class _EventState:
    name: str
    uid: str
    first: Ms
    count: int


class Rec:
    """Records one scenario's writes, in the order the controllers make them."""

    def __init__(self, events_api: EventsApi, new_recorders: frozenset[str] = NEW_RECORDERS) -> None:
        self.events_api = events_api
        self.new_recorders = new_recorders
        self.writes: list[Write] = []
        self.notes: list[tuple[Ms, str]] = []
        self._last: dict[str, Ms] = {}
        self._events: dict[tuple[str, ...], _EventState] = {}
        self._event_names: set[str] = set()
        self.intake_ids: set[str] = set()

    def note(self, when: Ms, text: str) -> None:
        self.notes.append((when, text))

    def watch(self, stream: str, etype: str, when: Ms, obj: Obj) -> None:
        key = obj["metadata"]["uid"]
        if when < self._last.get(key, when):
            raise AssertionError(f"{obj['kind']} {obj['metadata']['name']}: write at {b.ts(when)} goes back in time")
        self._last[key] = when
        self.writes.append(Write(when, stream, {"type": etype, "object": obj}))

    def intake(self, when: Ms, event: Obj) -> None:
        if event["event_id"] in self.intake_ids:
            raise AssertionError(f"intake event id {event['event_id']} reported twice")
        self.intake_ids.add(event["event_id"])
        self.writes.append(Write(when, "intake", event))

    def event(self, when: Ms, about: Obj, reason: str, message: str, *, component: str, warning: bool = False,
              instance: str = "", field_path: str | None = None, action: str = "") -> None:
        """Record an Event about ``about``; a repeat of the same one updates the same Event object."""
        meta = about["metadata"]
        key = (meta["uid"], reason, message, component, field_path or "")
        state = self._events.get(key)
        if state is None:
            name, nanos = b.event_name(meta["name"], when), 0
            while name in self._event_names:  # names are unique in a namespace, as the API server enforces
                nanos += 1
                name = b.event_name(meta["name"], when, nanos)
            self._event_names.add(name)
            state = self._events[key] = _EventState(name, b.uid("event", name, reason), when, 0)
        state.count += 1
        ev_meta = b.object_meta(name=state.name, namespace=meta["namespace"], uid=state.uid, created=state.first)
        regarding = b.object_reference(about["apiVersion"], about["kind"], meta["namespace"], meta["name"],
                                       meta["uid"], field_path)
        build = b.core_event if self.events_api == "v1" else b.events_v1_event
        if not instance and component in self.new_recorders:
            instance = f"{component.replace('/', '-')}-{CONTROL_PLANE_HOST}"  # tools/events always names it
        obj = build(meta=ev_meta, regarding=regarding, reason=reason, message=message, warning=warning,
                    component=component, instance=instance, first=state.first, last=when, count=state.count,
                    series=component in self.new_recorders, action=action or reason)
        self.watch("events", "ADDED" if state.count == 1 else "MODIFIED", when, obj)


# --------------------------------------------------------------------------------------------------
# TauGrid run metadata and intake.


@dataclass(frozen=True, slots=True)
class Tau:
    """What ``tau`` resolved for a run: it becomes labels and annotations of the Job or RayJob."""

    run_id: str
    project: str
    workspace: str
    target: str
    config: str
    resume_of: str | None = None

    @property
    def commit(self) -> str:
        return b.hex_id(40, "commit", self.project, self.config)

    @property
    def digest(self) -> str:
        return "sha256:" + b.hex_id(64, "config", self.run_id)

    @property
    def config_ref(self) -> str:
        return f"git+https://github.com/taugrid/{self.project}@{self.commit[:12]}#configs/{self.config}"

    @property
    def output(self) -> str:
        return f"abfss://runs@taugridml.dfs.core.windows.net/{self.project}/{self.run_id}/"

    @property
    def hyperparameters(self) -> dict[str, str | int | float | bool]:
        """What ``tau`` rendered from the run's config, flattened (the Rendering event's ``hyperparameters``)."""
        pick = int(b.hex_id(8, "hyperparameters", self.run_id), 16)
        return {"optim.lr": (1e-4, 2e-4, 3e-4, 6e-4)[pick % 4], "optim.weight_decay": 0.1,
                "train.global_batch_size": (256, 512, 1024)[pick // 4 % 3], "train.precision": "bf16",
                "train.grad_checkpointing": pick % 2 == 0, "seed": pick % 10_000}

    def labels(self, queue: str) -> dict[str, str]:
        return {LABEL_RUN_ID: self.run_id, LABEL_PROJECT: self.project, LABEL_WORKSPACE: self.workspace,
                LABEL_TARGET: self.target, LABEL_QUEUE: queue}

    def annotations(self) -> dict[str, str]:
        ann = {ANN_GIT_COMMIT: self.commit, ANN_CONFIG_DIGEST: self.digest, ANN_CONFIG_REF: self.config_ref,
               ANN_OUTPUT: self.output}
        if self.resume_of:
            ann[ANN_RESUME_OF] = self.resume_of
        return ann


def intake_id(run_id: str, *parts: str) -> str:
    return b.uid("intake", run_id, *parts)


def resolve(rec: Rec, tau: Tau, start: Ms) -> Ms:
    """Resolution started and succeeded; returns when it ended."""
    rec.intake(start, b.resolution_event(event_id=intake_id(tau.run_id, "resolution", "started"),
                                         run_id=tau.run_id, when=start, status="started"))
    end = start + 1200
    rec.intake(end, b.resolution_event(
        event_id=intake_id(tau.run_id, "resolution", "succeeded"), run_id=tau.run_id, when=end,
        status="succeeded", project=tau.project, workspace=tau.workspace, target=tau.target,
        git_commit=tau.commit, config_digest=tau.digest, config_ref=tau.config_ref,
        input_refs=[f"abfss://datasets@taugridml.dfs.core.windows.net/{tau.project}/v3/"]))
    rec.note(start, f"{tau.run_id}: Resolution started; succeeded {b.ts(end)}")
    return end


def render(rec: Rec, tau: Tau, start: Ms, kind: str, ns: str, name: str, queue: str) -> Ms:
    """Rendering started and succeeded (the workload was submitted); returns when it ended."""
    rec.intake(start, b.rendering_event(event_id=intake_id(tau.run_id, "rendering", "started"),
                                        run_id=tau.run_id, when=start, status="started"))
    end = start + 1800
    rec.intake(end, b.rendering_event(
        event_id=intake_id(tau.run_id, "rendering", "succeeded"), run_id=tau.run_id, when=end,
        status="succeeded", workload_kind=kind, namespace=ns, name=name, queue=queue, output_uri=tau.output,
        hyperparameters=tau.hyperparameters))
    rec.note(start, f"{tau.run_id}: Rendering started; succeeded {b.ts(end)}")
    return end


def progress(rec: Rec, tau: Tau, points: Sequence[tuple[Ms, int, float, float]], checkpoint_at: int = -1) -> None:
    """Progress events (time, step, loss, accuracy); the point at index ``checkpoint_at`` has a checkpoint (v1's
    way: ``save_checkpoint`` reports one with its duration)."""
    for i, (when, step, loss, acc) in enumerate(points):
        ckpt = checkpoint_uri(tau, step) if i == checkpoint_at else None
        event_id = intake_id(tau.run_id, "progress", str(step))
        if event_id in rec.intake_ids:  # the step reached again, after a restore: a report of its own
            event_id = intake_id(tau.run_id, "progress", str(step), b.ts(when))
        rec.intake(when, b.progress_event(event_id=event_id,
                                          run_id=tau.run_id, when=when, step=step,
                                          metrics={"loss": loss, "accuracy": acc}, checkpoint_uri=ckpt))
    if points:
        rec.note(points[0][0], f"{tau.run_id}: first Progress (step {points[0][1]})")


def checkpoint_uri(tau: Tau, step: int) -> str:
    return f"{tau.output}checkpoints/step-{step:06d}/"


def save_checkpoint(rec: Rec, tau: Tau, step: int, start: Ms, end: Ms, size: int) -> None:
    """The training process saved the checkpoint of ``step`` from ``start`` to ``end`` (blocking)."""
    uri = checkpoint_uri(tau, step)
    for phase, when in (("started", start), ("completed", end)):
        rec.intake(when, b.checkpoint_save_event(event_id=intake_id(tau.run_id, "save", str(step), phase),
                                                 run_id=tau.run_id, when=when, phase=phase, step=step, uri=uri,
                                                 size=size if phase == "completed" else None))
    rec.note(start, f"{tau.run_id}: checkpoint of step {step} saved ({(end - start) / SECOND:g} s)")


def restore_checkpoint(rec: Rec, tau: Tau, step: int, start: Ms, end: Ms, uri: str | None = None) -> None:
    """The training process restored the checkpoint of ``step`` (its own, unless ``uri``) from ``start`` to
    ``end``; it goes on from that step."""
    uri = uri or checkpoint_uri(tau, step)
    for phase, when in (("started", start), ("completed", end)):
        rec.intake(when, b.checkpoint_restore_event(
            event_id=intake_id(tau.run_id, "restore", str(step), b.ts(start), phase), run_id=tau.run_id, when=when,
            phase=phase, step=step, uri=uri))
    rec.note(start, f"{tau.run_id}: restored the checkpoint of step {step} ({(end - start) / SECOND:g} s)")


def resume(rec: Rec, tau: Tau, when: Ms, checkpoint: tuple[int, str] | None = None) -> None:
    """The training process says which run it resumes (``tau.resume_of``), from which checkpoint if any."""
    assert tau.resume_of is not None
    step, uri = checkpoint if checkpoint is not None else (None, None)
    rec.intake(when, b.resume_event(event_id=intake_id(tau.run_id, "resume"), run_id=tau.run_id, when=when,
                                    resume_of=tau.resume_of, checkpoint_uri=uri, step=step))
    rec.note(when, f"{tau.run_id}: Resume of {tau.resume_of}" + (f" from {uri}" if uri else " (no checkpoint)"))


def tau_submit(rec: Rec, tau: Tau, start: Ms, kind: str, ns: str, name: str) -> Ms:
    """Resolution and Rendering before the object exists; returns when the object is created."""
    return render(rec, tau, resolve(rec, tau, start) + 300, kind, ns, name, f"{ns}-lq") + 400


# --------------------------------------------------------------------------------------------------
# Pods (kube-scheduler and kubelet).

_POD_COND_ORDER = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled",
                   "DisruptionTarget")


class PodSim:
    """One Pod: created by its controller, bound by the scheduler, run by the kubelet."""

    def __init__(self, rec: Rec, *, name: str, ns: str, labels: Mapping[str, str], owner: Obj, template: Obj,
                 container: str, image: str, finalizers: Sequence[str] = (), generate_name: str | None = None
                 ) -> None:
        self.rec, self.ns, self.name, self.container, self.image = rec, ns, name, container, image
        self.uid = b.uid("pod", ns, name)
        self.labels, self.owner, self.template = dict(labels), owner, template
        self.finalizers = list(finalizers)
        self.generate_name = generate_name
        self.created: Ms = 0
        self.node: str | None = None
        self.phase = "Pending"
        self.conds: list[Obj] = []
        self.state: Obj | None = None
        self.ready = False
        self.started: Ms | None = None  # kubelet accepted the pod (status.startTime)
        self.run_start: Ms | None = None
        self.pod_ip: str | None = None
        self.deletion: tuple[Ms, int] | None = None

    @property
    def active(self) -> bool:
        return self.phase in ("Pending", "Running") and self.deletion is None

    @property
    def host_ip(self) -> str | None:
        return None if self.node is None else f"10.224.0.{10 + NODES.index(self.node)}"

    @property
    def container_id(self) -> str:
        return "containerd://" + b.hex_id(64, "container", self.uid)

    @property
    def image_id(self) -> str:
        return f"{self.image.split(':')[0]}@sha256:{b.hex_id(64, 'image', self.image)}"

    def obj(self) -> Obj:
        meta = b.object_meta(name=self.name, namespace=self.ns, uid=self.uid, created=self.created,
                             labels=self.labels, owners=[self.owner], finalizers=self.finalizers,
                             generate_name=self.generate_name, deletion=self.deletion)
        conds = sorted(self.conds, key=lambda c: _POD_COND_ORDER.index(c["type"]))
        containers = []
        if self.state is not None:
            running_or_done = "waiting" not in self.state
            containers.append(b.container_status(
                name=self.container, image=self.image, state=self.state, ready=self.ready,
                started="running" in self.state, container_id=self.container_id if running_or_done else None,
                image_id=self.image_id if running_or_done else ""))
        status = b.pod_status(phase=self.phase, conditions=conds, containers=containers, host_ip=self.host_ip,
                              pod_ip=self.pod_ip, started=self.started)
        return b.pod(meta=meta, spec=b.pod_spec(self.template, self.node), status=status)

    def _write(self, when: Ms, etype: str = "MODIFIED") -> None:
        self.rec.watch("pods", etype, when, self.obj())

    def _cond(self, type_: str, status: bool, when: Ms, reason: str | None = None, message: str | None = None
              ) -> None:
        new = b.pod_condition(type_, status, when, reason, message)
        self.conds = b.set_condition(self.conds, new)

    def add(self, when: Ms) -> None:
        self.created = when
        self._write(when, "ADDED")

    def bind(self, when: Ms, node: str) -> None:
        self.node = node
        self._cond("PodScheduled", True, when)
        self._write(when)
        self.rec.event(when, self.obj(), "Scheduled", f"Successfully assigned {self.ns}/{self.name} to {node}",
                       component=SCHEDULER, action="Binding")

    def unschedulable(self, when: Ms, message: str) -> None:
        """A failed scheduling attempt: the condition is written once, the Event repeats."""
        if not self.conds:
            self._cond("PodScheduled", False, when, "Unschedulable", message)
            self._write(when)
        self.rec.event(when, self.obj(), "FailedScheduling", message, component=SCHEDULER, warning=True,
                       action="Scheduling")

    def accept(self, when: Ms) -> None:
        """The kubelet started the sandbox and pulls the image."""
        self.started = when
        self._cond("PodReadyToStartContainers", False, when)
        self._cond("Initialized", True, when)
        msg = f"containers with unready status: [{self.container}]"
        self._cond("Ready", False, when, "ContainersNotReady", msg)
        self._cond("ContainersReady", False, when, "ContainersNotReady", msg)
        self.state = b.waiting_state("ContainerCreating")
        self._write(when)
        self._kubelet(when + 20, "Pulling", f'Pulling image "{self.image}"')

    def _kubelet(self, when: Ms, reason: str, message: str, warning: bool = False) -> None:
        self.rec.event(when, self.obj(), reason, message, component=KUBELET, warning=warning,
                       instance=self.node or "", field_path=f"spec.containers{{{self.container}}}")

    def sandbox_ready(self, when: Ms) -> None:
        self._cond("PodReadyToStartContainers", True, when)
        self.pod_ip = f"10.244.{NODES.index(self.node or NODES[0])}.{2 + b.small_int(250, 'ip', self.uid)}"

    def pull_failed(self, when: Ms, detail: str) -> None:
        """ErrImagePull, then ImagePullBackOff with repeating kubelet Events."""
        self.sandbox_ready(when)
        self.state = b.waiting_state("ErrImagePull", f'failed to pull and unpack image "{self.image}": {detail}')
        self._write(when)
        self._kubelet(when, "Failed", f'Failed to pull image "{self.image}": {detail}', warning=True)
        self._kubelet(when, "Failed", "Error: ErrImagePull", warning=True)

    def back_off(self, when: Ms) -> None:
        """One image pull back-off (the kubelet writes the waiting reason only when it changes)."""
        if self.state is not None and self.state["waiting"]["reason"] != "ImagePullBackOff":
            self.state = b.waiting_state("ImagePullBackOff", f'Back-off pulling image "{self.image}"')
            self._write(when)
        self._kubelet(when, "BackOff", f'Back-off pulling image "{self.image}"')
        self._kubelet(when, "Failed", "Error: ImagePullBackOff", warning=True)

    def run(self, when: Ms, pull_s: float) -> None:
        """Image pulled, container started and ready."""
        self.sandbox_ready(when)
        size = 4_000_000_000 + b.small_int(3_000_000_000, "size", self.image)
        self._kubelet(when - 400, "Pulled", f'Successfully pulled image "{self.image}" in {pull_s:.3g}s '
                      f"({pull_s:.3g}s including waiting). Image size: {size} bytes.")
        self._kubelet(when - 200, "Created", f"Created container: {self.container}")
        self._kubelet(when, "Started", f"Started container {self.container}")
        self.run_start = when
        self.phase = "Running"
        self.state = b.running_state(when)
        self.ready = True
        self._cond("Ready", True, when)
        self._cond("ContainersReady", True, when)
        self._write(when + 300)

    def terminate(self, when: Ms, exit_code: int, reason: str, message: str | None = None) -> None:
        """The container exited; a pod with restartPolicy Never is terminal."""
        self.phase = "Succeeded" if exit_code == 0 else "Failed"
        self.state = b.terminated_state(exit_code=exit_code, reason=reason, started=self.run_start, finished=when,
                                        container_id=self.container_id if self.run_start else None,
                                        message=message)
        self.ready = False
        self._cond("PodReadyToStartContainers", False, when)
        self._cond("Ready", False, when, "PodCompleted")
        self._cond("ContainersReady", False, when, "PodCompleted")
        self._write(when + 500)

    def drop_finalizer(self, when: Ms) -> None:
        self.finalizers = []
        self._write(when)

    def delete(self, when: Ms) -> Ms:
        """Graceful delete: deletionTimestamp, SIGTERM (exit 143) if it ran, then gone. Returns when gone."""
        self.deletion = (when + 30 * SECOND, 30)
        self._write(when)
        if self.run_start is not None and self.phase == "Running":
            self._kubelet(when + 100, "Killing", f"Stopping container {self.container}")
            self.terminate(when + 2 * SECOND, 143, "Error")
            gone = when + 3 * SECOND
        else:
            if self.phase == "Pending":
                self.phase = "Failed"
                self.ready = False
            self._write(when + 700)
            gone = when + 1 * SECOND
        if self.finalizers:
            self.drop_finalizer(gone - 100)
        self._write(gone, "DELETED")
        return gone


# --------------------------------------------------------------------------------------------------
# Kueue Workload.


class WorkloadSim:
    """A Kueue Workload for one Job or RayJob, with the writes of Kueue's scheduler and controllers."""

    def __init__(self, rec: Rec, *, owner: Obj, ns: str, queue: str, api: WorkloadApi, pod_sets: Sequence[Obj],
                 usage: Sequence[tuple[str, int, Mapping[str, str]]], priority: int, priority_class: str,
                 event_target: Callable[[], Obj], kueue_component: str) -> None:
        self.rec, self.ns, self.queue, self.api = rec, ns, queue, api
        meta = owner["metadata"]
        group = owner["apiVersion"].split("/")[0] if "/" in owner["apiVersion"] else ""
        self.owner_uid = meta["uid"]
        self.name = b.workload_name(owner["kind"], group, meta["name"], meta["uid"])
        self.uid = b.uid("workload", self.name)
        self.owner_ref = b.owner_reference(owner["apiVersion"], owner["kind"], meta["name"], meta["uid"])
        self.pod_sets, self.usage = list(pod_sets), list(usage)
        self.priority, self.priority_class = priority, priority_class
        self.event_target, self.kueue_component = event_target, kueue_component
        self.created: Ms = 0
        self.generation = 1
        self.active = True
        self.finalizers = ["kueue.x-k8s.io/resource-in-use"]
        self.conds: list[Obj] = []
        self.admission: Obj | None = None
        self.requeue: tuple[int, Ms | None] | None = None
        self.evictions: dict[tuple[str, str], int] = {}
        self.requests: list[Obj] = []
        self.accumulated_s = 0
        self.queued_since: Ms = 0
        self.admitted_at: Ms | None = None
        self.status_written = False

    def obj(self) -> Obj:
        meta = b.object_meta(name=self.name, namespace=self.ns, uid=self.uid, created=self.created,
                             generation=self.generation, labels={"kueue.x-k8s.io/job-uid": self.owner_uid},
                             owners=[self.owner_ref], finalizers=self.finalizers)
        spec = b.workload_spec(api=self.api, queue=self.queue, pod_sets=self.pod_sets, priority=self.priority,
                               priority_class=self.priority_class, active=self.active)
        status = None
        if self.status_written:
            evictions = [{"count": n, "reason": r, "underlyingCause": c} for (r, c), n in self.evictions.items()]
            status = b.workload_status(api=self.api, conditions=self.conds, admission=self.admission,
                                       requeue=self.requeue, evictions=evictions,
                                       resource_requests=self.requests, accumulated_s=self.accumulated_s)
        return b.workload(api=self.api, meta=meta, spec=spec, status=status)

    def write(self, when: Ms, etype: str = "MODIFIED") -> None:
        if etype != "ADDED":
            self.status_written = True
        self.rec.watch("workloads", etype, when, self.obj())

    def cond(self, when: Ms, type_: str, status: bool, reason: str, message: str) -> None:
        self.conds = b.set_condition(self.conds, b.condition(type_, status, reason, message, when,
                                                             generation=self.generation))

    def _event(self, when: Ms, reason: str, message: str, component: str, warning: bool = False) -> None:
        self.rec.event(when, self.obj(), reason, message, component=component, warning=warning)

    def add(self, when: Ms) -> None:
        """Created by the Kueue job reconciler; the first reconcile sets PodsReady=False (waitForPodsReady)."""
        self.created = self.queued_since = when
        self.write(when, "ADDED")
        self.rec.event(when, self.event_target(), "CreatedWorkload", f"Created Workload: {self.ns}/{self.name}",
                       component=self.kueue_component)
        self.cond(when + 40, "PodsReady", False, "WaitForStart", "Not all pods are ready or succeeded")
        self.write(when + 40)

    def pending(self, when: Ms, message: str) -> None:
        """A failed scheduling attempt: the condition changes only when its message does; the Event repeats."""
        old = b.find_condition(self.conds, "QuotaReserved")
        if old is None or old["message"] != message or old["status"] != "False":
            self.cond(when, "QuotaReserved", False, "Pending", message)
            self.requests = [{"name": ps["name"], "resources": dict(res)} for ps, (_n, _c, res)
                             in zip(self.pod_sets, self.usage, strict=True)]
            self.write(when)
        self._event(when, "Pending", message, KUEUE_ADMISSION, warning=True)

    def admit(self, when: Ms) -> None:
        """Quota reserved and admitted in one write (no AdmissionChecks)."""
        self.admission = b.admission(CLUSTER_QUEUE, [
            b.pod_set_assignment(name, count, {"cpu": FLAVOR, "memory": FLAVOR, "nvidia.com/gpu": FLAVOR}, res)
            for name, count, res in self.usage])
        self.requests = []
        self.cond(when, "QuotaReserved", True, "QuotaReserved", f"Quota reserved in ClusterQueue {CLUSTER_QUEUE}")
        self.cond(when, "Admitted", True, "Admitted", "The workload is admitted")
        for type_ in ("Evicted", "Preempted"):
            old = b.find_condition(self.conds, type_)
            if old is not None and old["status"] == "True":
                self.cond(when, type_, False, "QuotaReserved", f"Previously: {old['message']}")
        self.admitted_at = when
        self.write(when)
        wait_s = (when - self.queued_since) // SECOND
        self._event(when, "QuotaReserved", f"Quota reserved in ClusterQueue {CLUSTER_QUEUE}, wait time since "
                    f"queued was {wait_s}s", KUEUE_ADMISSION)
        self._event(when, "Admitted", f"Admitted by ClusterQueue {CLUSTER_QUEUE}, wait time since reservation "
                    "was 0s", KUEUE_ADMISSION)

    def pods_ready(self, when: Ms) -> None:
        self.cond(when, "PodsReady", True, "Started", "All pods reached readiness and the workload is running")
        self.write(when)

    def evict(self, when: Ms, reason: str, message: str, cause: str = "", component: str = KUEUE_WORKLOAD,
              stats_reason: str | None = None) -> None:
        """Evicted=True and schedulingStats.evictions[(stats_reason or reason, cause)] += 1 in one write."""
        self.cond(when, "Evicted", True, reason, message)
        key = (stats_reason or reason, cause)
        self.evictions[key] = self.evictions.get(key, 0) + 1
        self.write(when)
        self._event(when, f"EvictedDueTo{reason}", message, component)

    def set_active(self, when: Ms, active: bool) -> None:
        """A person (or Kueue itself) sets spec.active: a spec update, so the generation goes up."""
        self.active = active
        self.generation += 1
        self.write(when)

    def reactivated(self, when: Ms) -> None:
        """The workload controller sees spec.active=true with Requeued=False/Deactivated: Requeued=True/Reactivated.
        Kueue measures the queueing time from this condition."""
        self.cond(when, "Requeued", True, "Reactivated", "The workload was reactivated")
        self.queued_since = when
        self.write(when)

    def preempted(self, when: Ms, message: str, event_suffix: str) -> None:
        """Evicted=True/Preempted and Preempted=True/InClusterQueue in one scheduler write."""
        self.cond(when, "Evicted", True, "Preempted", message)
        self.cond(when, "Preempted", True, "InClusterQueue", message)
        self.evictions[("Preempted", "")] = self.evictions.get(("Preempted", ""), 0) + 1
        self.write(when)
        self._event(when, "EvictedDueToPreempted", message, KUEUE_ADMISSION)
        self._event(when, "Preempted", message + event_suffix, KUEUE_ADMISSION)

    def release(self, when: Ms, quota_reason: str, quota_message: str, requeued: tuple[bool, str, str]) -> None:
        """The job's pods are gone: admission cleared, QuotaReserved/Admitted False, Requeued set."""
        self.admission = None
        if self.admitted_at is not None:
            self.accumulated_s += (when - self.admitted_at) // SECOND
            self.admitted_at = None
        self.cond(when, "QuotaReserved", False, quota_reason, quota_message)
        self.cond(when, "Admitted", False, "NoReservation", "The workload has no reservation")
        self.cond(when, "Requeued", requeued[0], requeued[1], requeued[2])
        self.cond(when, "PodsReady", False, "WaitForStart", "Not all pods are ready or succeeded")
        self.queued_since = when
        self.write(when)

    def finish(self, when: Ms, succeeded: bool, message: str) -> None:
        """Finished=True copied from the job; then the finalizer is removed."""
        self.cond(when, "Finished", True, "Succeeded" if succeeded else "Failed", message)
        self.write(when)
        self.rec.event(when, self.event_target(), "FinishedWorkload",
                       f"Workload '{self.ns}/{self.name}' is declared finished", component=self.kueue_component)
        self.finalizers = []
        self.write(when + 150)


# --------------------------------------------------------------------------------------------------
# batch/v1 Job managed by Kueue, with its Job controller writes.


def _gpu_usage(count: int, cpu_millis: int, memory_mi: int, gpus: int) -> dict[str, str]:
    return b.resource_list(cpu_millis * count, memory_mi * count, gpus * count)


class JobSim:
    """A Kueue-managed batch Job (restartPolicy Never, NonIndexed), its Workload and its Pods."""

    def __init__(self, rec: Rec, *, ns: str, name: str, tau: Tau | None, pods: int, image: str,
                 command: Sequence[str], gpus: int = 8, cpu_millis: int = 88_000, memory_mi: int = 1_600 * 1024,
                 backoff_limit: int = 0, priority_class: str = "standard", priority: int = 1000,
                 api: WorkloadApi = "v1beta1") -> None:
        self.rec, self.ns, self.name, self.tau, self.count, self.image = rec, ns, name, tau, pods, image
        self.uid = b.uid("job", ns, name)
        self.run_key = tau.run_id if tau else self.uid
        self.queue = f"{ns}-lq"
        self.labels = {**(tau.labels(self.queue) if tau else {LABEL_QUEUE: self.queue}),
                       b.LABEL_PRIORITY_CLASS: priority_class}
        self.annotations = tau.annotations() if tau else {}
        self.backoff_limit = backoff_limit
        pod_labels = {LABEL_CONTROLLER_UID: self.uid, b.LABEL_JOB_NAME: name,
                      b.LABEL_LEGACY_CONTROLLER_UID: self.uid, b.LABEL_LEGACY_JOB_NAME: name}
        if tau:
            pod_labels[LABEL_RUN_ID] = tau.run_id
        ctr = b.container(name="trainer", image=image, command=command, cpu_millis=cpu_millis, memory_mi=memory_mi,
                          gpus=gpus)
        self.template = b.pod_template(pod_labels, b.template_spec(containers=[ctr], restart_policy="Never"))
        self.admitted_template = b.pod_template(
            {**pod_labels, b.LABEL_PODSET: "main", b.LABEL_LOCAL_QUEUE: self.queue,
             b.LABEL_CLUSTER_QUEUE: CLUSTER_QUEUE},
            b.template_spec(containers=[ctr], restart_policy="Never", node_selector=FLAVOR_NODE_LABELS,
                            tolerations=FLAVOR_TOLERATIONS))
        self.created: Ms = 0
        self.generation = 1
        self.suspend = True
        self.status_written = False
        self.conds: list[Obj] = []
        self.start_time: Ms | None = None
        self.completion: Ms | None = None
        self.succeeded = self.failed = 0
        self.uncounted: tuple[list[str], list[str]] = ([], [])
        self.pods: list[PodSim] = []
        self.serial = 0
        usage = _gpu_usage(pods, cpu_millis, memory_mi, gpus)
        self.wl = WorkloadSim(rec, owner=self.obj(), ns=ns, queue=self.queue, api=api,
                              pod_sets=[b.pod_set("main", pods, self.template)], usage=[("main", pods, usage)],
                              priority=priority, priority_class=priority_class, event_target=self.obj,
                              kueue_component=KUEUE_JOB)

    # ---- objects and writes

    def obj(self) -> Obj:
        meta = b.object_meta(name=self.name, namespace=self.ns, uid=self.uid, created=self.created,
                             generation=self.generation, labels=self.labels, annotations=self.annotations)
        spec = b.job_spec(uid=self.uid, template=self.template if self.suspend else self.admitted_template,
                          parallelism=self.count, completions=self.count, backoff_limit=self.backoff_limit,
                          suspend=self.suspend)
        status: Obj = {}
        if self.status_written:
            live = [p for p in self.pods if p.active]
            status = b.job_status(conditions=self.conds, start=self.start_time, completion=self.completion,
                                  active=len(live), ready=sum(p.ready for p in live), succeeded=self.succeeded,
                                  failed=self.failed, terminating=sum(p.deletion is not None for p in self.pods),
                                  uncounted_succeeded=self.uncounted[0], uncounted_failed=self.uncounted[1])
        return b.job(meta=meta, spec=spec, status=status)

    def write(self, when: Ms, etype: str = "MODIFIED") -> None:
        if etype != "ADDED":
            self.status_written = True
        self.rec.watch("jobs", etype, when, self.obj())

    def note(self, when: Ms, text: str) -> None:
        self.rec.note(when, f"{self.run_key}: {text}")

    def _event(self, when: Ms, reason: str, message: str, component: str = JOB_CONTROLLER,
               warning: bool = False) -> None:
        self.rec.event(when, self.obj(), reason, message, component=component, warning=warning)

    def _cond(self, when: Ms, type_: str, status: bool, reason: str, message: str) -> None:
        new = b.job_condition(type_, status, reason, message, when)
        old = b.find_condition(self.conds, type_)
        if old is not None and old["status"] == new["status"]:
            new = {**new, "lastTransitionTime": old["lastTransitionTime"]}
        self.conds = [c for c in self.conds if c["type"] != type_] + [new]

    # ---- lifecycle

    def create(self, when: Ms) -> None:
        """Created suspended by Kueue's webhook; the Job controller marks it Suspended; Kueue adds the Workload."""
        self.created = when
        self.write(when, "ADDED")
        self._cond(when + 200, "Suspended", True, "JobSuspended", "Job suspended")
        self.write(when + 200)
        self._event(when + 200, "Suspended", "Job suspended")
        self.wl.add(when + 300)
        self.note(when, f"Job {self.ns}/{self.name} created (uid {self.uid}); Workload {self.wl.name}")

    def admit(self, when: Ms) -> None:
        self.wl.admit(when)
        self.note(when, f"admitted in {CLUSTER_QUEUE}")

    def start(self, when: Ms) -> None:
        """Kueue unsuspends the Job; the Job controller resumes it and creates the pods."""
        self.suspend = False
        self.generation += 1
        self.write(when)
        self._event(when, "Started", f"Admitted by clusterQueue {CLUSTER_QUEUE}", KUEUE_JOB)
        self.start_time = when + 200
        self._cond(when + 200, "Suspended", False, "JobResumed", "Job resumed")
        self.write(when + 200)
        self._event(when + 200, "Resumed", "Job resumed")
        for i in range(self.count):
            self.add_pod(when + 300 + 40 * i)
        self.write(when + 300 + 40 * self.count)

    def add_pod(self, when: Ms) -> PodSim:
        self.serial += 1
        name = f"{self.name}-{b.rand_suffix(self.uid, str(self.serial))}"
        pod = PodSim(self.rec, name=name, ns=self.ns, labels=self.admitted_template["metadata"]["labels"],
                     owner=b.owner_reference("batch/v1", "Job", self.name, self.uid),
                     template=self.admitted_template["spec"], container="trainer", image=self.image,
                     finalizers=["batch.kubernetes.io/job-tracking"], generate_name=f"{self.name}-")
        pod.add(when)
        self.pods.append(pod)
        self._event(when, "SuccessfulCreate", f"Created pod: {name}")
        return pod

    def live(self) -> list[PodSim]:
        return [p for p in self.pods if p.active]

    def bind(self, when: Ms, nodes: Sequence[str], step: Ms = 150) -> None:
        pods = self.live()
        for i, (pod, node) in enumerate(zip(pods, nodes, strict=False)):
            pod.bind(when + i * step, node)
            pod.accept(when + i * step + 900)
        self.note(when, f"pods scheduled ({', '.join(p.name for p in pods)})")

    def run(self, when: Ms, pull_s: float, step: Ms = 1300) -> Ms:
        """Every live pod starts; the Job counts them ready; Kueue sets PodsReady. Returns when all are ready."""
        pods = self.live()
        for i, pod in enumerate(pods):
            pod.run(when + i * step, pull_s + i * 1.3)
        done = when + (len(pods) - 1) * step + 600
        self.write(done)
        self.note(when, "containers started")
        self.wl.pods_ready(done + 200)
        return done + 200

    def count_terminal(self, when: Ms, pods: Sequence[PodSim], succeeded: bool) -> None:
        """uncountedTerminatedPods, pod finalizers removed, then the counters."""
        uids = [p.uid for p in pods]
        self.uncounted = (uids, []) if succeeded else ([], uids)
        self.write(when)
        for i, pod in enumerate(pods):
            pod.drop_finalizer(when + 100 + 20 * i)
        self.uncounted = ([], [])
        if succeeded:
            self.succeeded += len(pods)
        else:
            self.failed += len(pods)
        self.write(when + 200 + 20 * len(pods))

    def succeed(self, when: Ms, step: Ms = 2 * SECOND) -> Ms:
        """All pods exit 0; SuccessCriteriaMet, Complete, and Kueue marks the Workload finished."""
        pods = self.live()
        for i, pod in enumerate(pods):
            pod.terminate(when + i * step, 0, "Completed")
        t = when + len(pods) * step
        self.count_terminal(t, pods, True)
        msg = "Reached expected number of succeeded pods"
        self._cond(t + 500, "SuccessCriteriaMet", True, "CompletionsReached", msg)
        self.write(t + 500)
        self.completion = t + 800
        self._cond(t + 800, "Complete", True, "CompletionsReached", msg)
        self.write(t + 800)
        self._event(t + 800, "Completed", "Job completed")
        self.wl.finish(t + 1000, True, msg)
        self.note(t + 800, "Job Complete=True/CompletionsReached; Workload Finished=True/Succeeded")
        return t + 1200

    def pod_failed(self, when: Ms, pod: PodSim, exit_code: int, reason: str) -> None:
        pod.terminate(when, exit_code, reason)
        self.count_terminal(when + 700, [pod], False)
        self.note(when, f"pod {pod.name} terminated {reason} exit {exit_code} (Job status.failed={self.failed})")

    def fail(self, when: Ms) -> None:
        """Backoff limit exceeded: FailureTarget, the rest of the pods gone, Failed; the Workload finishes."""
        msg = "Job has reached the specified backoff limit"
        self._cond(when, "FailureTarget", True, "BackoffLimitExceeded", msg)
        self.write(when)
        self._cond(when + 600, "Failed", True, "BackoffLimitExceeded", msg)
        self.write(when + 600)
        self._event(when + 600, "BackoffLimitExceeded", msg, warning=True)
        self.wl.finish(when + 800, False, msg)
        self.note(when + 600, "Job Failed=True/BackoffLimitExceeded; Workload Finished=True/Failed")

    def stop(self, when: Ms, message: str) -> Ms:
        """Kueue suspends the Job after an eviction; the Job controller deletes its pods. Returns when all are gone."""
        self.suspend = True
        self.generation += 1
        self.write(when)
        self._event(when, "Stopped", message, KUEUE_JOB)
        self.start_time = None
        self._cond(when + 250, "Suspended", True, "JobSuspended", "Job suspended")
        pods = self.live()
        gone = when + 250
        for i, pod in enumerate(pods):
            gone = max(gone, pod.delete(when + 300 + 30 * i))
            self._event(when + 300 + 30 * i, "SuccessfulDelete", f"Deleted pod: {pod.name}")
        self.write(when + 300 + 30 * len(pods))
        self._event(when + 300 + 30 * len(pods), "Suspended", "Job suspended")
        self.pods = [p for p in self.pods if p not in pods]
        self.write(gone + 100)
        self.note(when, f"Job stopped by Kueue; pods deleted, all gone {b.ts(gone)}")
        return gone + 100


# --------------------------------------------------------------------------------------------------
# KubeRay RayJob (K8sJobMode) managed by Kueue, its RayClusters, submitter Jobs and Pods.

RAY_IMAGE = f"{REGISTRY}/ray-train:2.49.0-py311-cu128"
_HEAD = (8_000, 64 * 1024, 0)
_WORKER = (88_000, 1_600 * 1024, 8)
_SUBMITTER = (500, 200, 0)


class RayClusterSim:
    """A RayCluster a RayJob created: head and worker pods, status up to ``ready``."""

    def __init__(self, rec: Rec, owner: RayJobSim, name: str) -> None:
        self.rec, self.owner, self.name, self.ns = rec, owner, name, owner.ns
        self.uid = b.uid("raycluster", self.ns, name)
        self.labels = {**owner.labels, b.LABEL_RAY_ORIGIN_NAME: owner.name, b.LABEL_RAY_ORIGIN_CRD: "RayJob"}
        self.created: Ms = 0
        self.deletion: Ms | None = None
        self.status: Obj | None = None
        self.provisioning: Obj | None = None
        self.pods: list[PodSim] = []

    def obj(self) -> Obj:
        meta = b.object_meta(name=self.name, namespace=self.ns, uid=self.uid, created=self.created, generation=1,
                             labels=self.labels, owners=[self.owner.ref()],
                             deletion=(self.deletion, 0) if self.deletion is not None else None)
        return b.raycluster(meta=meta, spec=self.owner.cluster_spec(), status=self.status)

    def write(self, when: Ms, etype: str = "MODIFIED") -> None:
        self.rec.watch("rayclusters", etype, when, self.obj())

    def _pod(self, when: Ms, node_type: str, group: str, name: str) -> None:
        labels = {LABEL_RAY_CLUSTER: self.name, LABEL_RAY_NODE_TYPE: node_type, b.LABEL_RAY_GROUP: group,
                  "ray.io/is-ray-node": "yes", "ray.io/identifier": f"{self.name}-{node_type}",
                  "app.kubernetes.io/name": "kuberay", b.LABEL_CREATED_BY: "kuberay-operator",
                  b.LABEL_PODSET: "head" if node_type == "head" else group}
        template = self.owner.pod_template(node_type)
        pod = PodSim(self.rec, name=name, ns=self.ns, labels=labels,
                     owner=b.owner_reference(b.RAY_API_VERSION, "RayCluster", self.name, self.uid),
                     template=template["spec"], container=f"ray-{node_type}", image=RAY_IMAGE)
        pod.add(when)
        self.pods.append(pod)
        what = "head Pod" if node_type == "head" else "worker Pod"
        self.rec.event(when, self.obj(), f"Created{'Head' if node_type == 'head' else 'Worker'}Pod",
                       f"Created {what} {self.ns}/{name}", component=RAYCLUSTER_CONTROLLER)

    def _status(self, when: Ms, ready: bool) -> Obj:
        head = self.pods[0]
        workers = self.owner.workers
        conds = [b.condition("HeadPodReady", ready, "HeadPodRunningAndReady" if ready else "ContainersNotReady",
                             "" if ready else f"containers with unready status: [{head.container}]", when,
                             generation=1),
                 b.condition("RayClusterProvisioned", ready,
                             "AllPodRunningAndReadyFirstTime" if ready else "RayClusterPodsProvisioning",
                             "All Ray Pods are ready for the first time" if ready
                             else "RayCluster Pods are being provisioned for first time", when, generation=1)]
        desired = b.resource_list(_HEAD[0] + workers * _WORKER[0], _HEAD[1] + workers * _WORKER[1],
                                  workers * _WORKER[2])
        head_info = {"podName": head.name, "serviceName": f"{self.name}-head-svc"}
        if head.pod_ip:
            head_info |= {"podIP": head.pod_ip, "serviceIP": head.pod_ip}
        return b.raycluster_status(conditions=conds, desired=desired, workers=workers,
                                   ready_workers=workers if ready else 0, head=head_info, updated=when,
                                   generation=1, state="ready" if ready else None,
                                   transitions={"ready": when} if ready else None)

    def create(self, when: Ms, nodes: Sequence[str], pull_s: float) -> Ms:
        """Created; pods created, scheduled and started; ``ready``. Returns when the cluster is ready."""
        self.created = when
        self.write(when, "ADDED")
        self._pod(when + 300, "head", "headgroup", f"{self.name}-head-{b.rand_suffix(self.uid, 'head')}")
        for i in range(self.owner.workers):
            self._pod(when + 340 + 30 * i, "worker", "gpu",
                      f"{self.name}-gpu-worker-{b.rand_suffix(self.uid, 'worker', str(i))}")
        self.status = self.provisioning = self._status(when + 500, False)
        self.write(when + 500)
        for i, (pod, node) in enumerate(zip(self.pods, nodes, strict=False)):
            pod.bind(when + 1200 + 100 * i, node)
            pod.accept(when + 2000 + 100 * i)
        run = when + 2000 + int(pull_s * SECOND)
        for i, pod in enumerate(self.pods):
            pod.run(run + 700 * i, pull_s + 0.4 * i)
        ready = run + 700 * len(self.pods) + 500
        self.status = self._status(ready, True)
        self.write(ready)
        self.owner.note(ready, f"RayCluster {self.name} ready (pods scheduled {b.ts(when + 1200)}, "
                               f"containers started {b.ts(run)})")
        return ready

    def delete(self, when: Ms) -> Ms:
        """Deleted by KubeRay: pods killed and garbage-collected, then the cluster goes. Returns when gone."""
        self.deletion = when
        self.write(when)
        gone = when
        for i, pod in enumerate(self.pods):
            gone = max(gone, pod.delete(when + 200 + 50 * i))
        self.write(gone + 200, "DELETED")
        return gone + 200


class SubmitterSim:
    """The submitter batch/v1 Job KubeRay creates in K8sJobMode (named like the RayJob; not a run)."""

    def __init__(self, rec: Rec, owner: RayJobSim, attempt: int) -> None:
        self.rec, self.owner, self.ns, self.name = rec, owner, owner.ns, owner.name
        self.uid = b.uid("job", self.ns, self.name, "submitter", str(attempt))
        self.labels = {b.LABEL_RAY_ORIGIN_NAME: owner.name, b.LABEL_RAY_ORIGIN_CRD: "RayJob",
                       b.LABEL_CREATED_BY: "kuberay-operator"}
        pod_labels = {LABEL_CONTROLLER_UID: self.uid, b.LABEL_JOB_NAME: self.name,
                      b.LABEL_LEGACY_CONTROLLER_UID: self.uid, b.LABEL_LEGACY_JOB_NAME: self.name,
                      b.LABEL_PODSET: "submitter"}
        self.template = b.pod_template(pod_labels, owner.pod_template("submitter")["spec"])
        self.created: Ms = 0
        self.conds: list[Obj] = []
        self.start: Ms | None = None
        self.completion: Ms | None = None
        self.succeeded = 0
        self.pod: PodSim | None = None

    def obj(self) -> Obj:
        meta = b.object_meta(name=self.name, namespace=self.ns, uid=self.uid, created=self.created, generation=1,
                             labels=self.labels, owners=[self.owner.ref()])
        spec = b.job_spec(uid=self.uid, template=self.template, parallelism=1, completions=1, backoff_limit=2,
                          suspend=False)
        status: Obj = {}
        if self.start is not None:
            active = self.pod is not None and self.pod.active
            status = b.job_status(conditions=self.conds, start=self.start, completion=self.completion,
                                  active=int(active), ready=int(active and self.pod is not None and self.pod.ready),
                                  succeeded=self.succeeded)
        return b.job(meta=meta, spec=spec, status=status)

    def write(self, when: Ms, etype: str = "MODIFIED") -> None:
        self.rec.watch("jobs", etype, when, self.obj())

    def create(self, when: Ms, node: str) -> None:
        self.created = when
        self.write(when, "ADDED")
        self.start = when + 150
        name = f"{self.name}-{b.rand_suffix(self.uid, 'pod')}"
        self.pod = PodSim(self.rec, name=name, ns=self.ns, labels=self.template["metadata"]["labels"],
                          owner=b.owner_reference("batch/v1", "Job", self.name, self.uid),
                          template=self.template["spec"], container="ray-job-submitter", image=RAY_IMAGE,
                          finalizers=["batch.kubernetes.io/job-tracking"], generate_name=f"{self.name}-")
        self.pod.add(when + 150)
        self.rec.event(when + 150, self.obj(), "SuccessfulCreate", f"Created pod: {name}", component=JOB_CONTROLLER)
        self.write(when + 200)
        self.pod.bind(when + 400, node)
        self.pod.accept(when + 1200)
        self.pod.run(when + 2600, 0.9)
        self.write(when + 3000)

    def complete(self, when: Ms) -> None:
        assert self.pod is not None
        self.pod.terminate(when, 0, "Completed")
        self.pod.drop_finalizer(when + 700)
        self.succeeded = 1
        msg = "Reached expected number of succeeded pods"
        self.conds = [b.job_condition("SuccessCriteriaMet", True, "CompletionsReached", msg, when + 800)]
        self.write(when + 800)
        self.completion = when + 1000
        self.conds.append(b.job_condition("Complete", True, "CompletionsReached", msg, when + 1000))
        self.write(when + 1000)
        self.rec.event(when + 1000, self.obj(), "Completed", "Job completed", component=JOB_CONTROLLER)

    def delete(self, when: Ms) -> None:
        """Deleted by KubeRay (background propagation): the Job goes, then the GC deletes its pod."""
        self.write(when, "DELETED")
        if self.pod is not None:
            self.pod.delete(when + 300)


class RayJobSim:
    """A RayJob in K8sJobMode under Kueue: its status writes, RayClusters and submitters."""

    def __init__(self, rec: Rec, *, ns: str, name: str, tau: Tau, workers: int, backoff_limit: int,
                 entrypoint: str, priority_class: str = "standard", priority: int = 1000,
                 api: WorkloadApi = "v1beta1") -> None:
        self.rec, self.ns, self.name, self.tau, self.workers = rec, ns, name, tau, workers
        self.uid = b.uid("rayjob", ns, name)
        self.queue = f"{ns}-lq"
        self.labels = {**tau.labels(self.queue), b.LABEL_PRIORITY_CLASS: priority_class}
        self.backoff_limit, self.entrypoint = backoff_limit, entrypoint
        self.created: Ms = 0
        self.generation = 1
        self.suspend = True
        self.finalizers: list[str] = []
        self.status: Obj | None = None
        self.clusters: list[RayClusterSim] = []
        self.submitters: list[SubmitterSim] = []
        self.deployments = 0
        self.counts = (0, 0)
        pod_sets = [b.pod_set("head", 1, self.pod_template("head", admitted=False)),
                    b.pod_set("gpu", workers, self.pod_template("worker", admitted=False)),
                    b.pod_set("submitter", 1, self.pod_template("submitter", admitted=False))]
        usage = [("head", 1, _gpu_usage(1, *_HEAD)), ("gpu", workers, _gpu_usage(workers, *_WORKER)),
                 ("submitter", 1, _gpu_usage(1, *_SUBMITTER))]
        self.wl = WorkloadSim(rec, owner=self.obj(), ns=ns, queue=self.queue, api=api, pod_sets=pod_sets,
                              usage=usage, priority=priority, priority_class=priority_class, event_target=self.obj,
                              kueue_component=KUEUE_RAYJOB)

    def ref(self) -> Obj:
        return b.owner_reference(b.RAY_API_VERSION, "RayJob", self.name, self.uid)

    def note(self, when: Ms, text: str) -> None:
        self.rec.note(when, f"{self.tau.run_id}: {text}")

    def pod_template(self, node_type: str, admitted: bool | None = None) -> Obj:
        """The head, worker or submitter pod template (with Kueue's flavor injected once admitted)."""
        admitted = not self.suspend if admitted is None else admitted
        cpu, mem, gpus = {"head": _HEAD, "worker": _WORKER, "submitter": _SUBMITTER}[node_type]
        if node_type == "submitter":
            ctr = b.container(name="ray-job-submitter", image=RAY_IMAGE, cpu_millis=cpu, memory_mi=mem, command=[
                "/bin/bash", "-ce", f"ray job submit --address http://$RAY_DASHBOARD_ADDRESS --no-wait -- "
                f"{self.entrypoint}; ray job logs --address http://$RAY_DASHBOARD_ADDRESS --follow $RAY_JOB_ID"])
            policy = "Never"
        else:
            ctr = b.container(name=f"ray-{node_type}", image=RAY_IMAGE, cpu_millis=cpu, memory_mi=mem, gpus=gpus,
                              command=["/bin/bash", "-lc", "--", "ray start --block " + (
                                  "--head" if node_type == "head" else "--address=$RAY_ADDRESS")],
                              ports=[{"containerPort": 8265, "name": "dashboard", "protocol": "TCP"}]
                              if node_type == "head" else ())
            policy = "Always"
        labels = {LABEL_RUN_ID: self.tau.run_id}
        if admitted:
            labels |= {b.LABEL_LOCAL_QUEUE: self.queue, b.LABEL_CLUSTER_QUEUE: CLUSTER_QUEUE}
            return b.pod_template(labels, b.template_spec(containers=[ctr], restart_policy=policy,
                                                          node_selector=FLAVOR_NODE_LABELS,
                                                          tolerations=FLAVOR_TOLERATIONS))
        return b.pod_template(labels, b.template_spec(containers=[ctr], restart_policy=policy))

    def cluster_spec(self) -> Obj:
        return b.ray_cluster_spec(ray_version="2.49.0", head_template=self.pod_template("head"),
                                  worker_groups=[b.worker_group("gpu", self.workers, self.pod_template("worker"))])

    def obj(self) -> Obj:
        meta = b.object_meta(name=self.name, namespace=self.ns, uid=self.uid, created=self.created,
                             generation=self.generation, labels=self.labels, annotations=self.tau.annotations(),
                             finalizers=self.finalizers)
        spec = b.rayjob_spec(entrypoint=self.entrypoint, cluster_spec=self.cluster_spec(),
                             submitter_template=self.pod_template("submitter"), backoff_limit=self.backoff_limit,
                             suspend=self.suspend, ttl_s=60)
        return b.rayjob(meta=meta, spec=spec, status=self.status)

    def write(self, when: Ms, etype: str = "MODIFIED") -> None:
        self.rec.watch("rayjobs", etype, when, self.obj())

    def set_status(self, when: Ms, deployment: str, **kw: Any) -> None:
        """One status write; keyword arguments are those of ``builders.rayjob_status``."""
        kw.setdefault("cluster_status", b.EMPTY_RAY_CLUSTER_STATUS)
        self.status = b.rayjob_status(deployment=deployment, generation=self.generation, **kw)
        self.write(when)

    def _event(self, when: Ms, reason: str, message: str, component: str = RAYJOB_CONTROLLER) -> None:
        self.rec.event(when, self.obj(), reason, message, component=component)

    def create(self, when: Ms) -> None:
        """Created suspended: "" -> Initializing -> Suspending -> Suspended; then Kueue creates the Workload."""
        self.created = when
        self.write(when, "ADDED")
        self.finalizers = ["ray.io/rayjob-finalizer"]
        self.write(when + 150)
        self.set_status(when + 250, "")
        sfx = b.rand_suffix(self.uid, "deploy", "0")
        self.set_status(when + 350, "Initializing", job_id=f"{self.name}-{sfx}", cluster=f"{self.name}-{sfx}",
                        start=when + 350, counts=self.counts)
        self.set_status(when + 450, "Suspending", start=when + 350, counts=self.counts)
        self.set_status(when + 550, "Suspended", start=when + 350, counts=self.counts)
        self.wl.add(when + 700)
        self.rec.note(when, f"{self.tau.run_id}: RayJob {self.ns}/{self.name} created (uid {self.uid}); "
                            f"Workload {self.wl.name}; Suspended {b.ts(when + 550)}")

    def admit(self, when: Ms) -> None:
        self.wl.admit(when)
        self.note(when, f"admitted in {CLUSTER_QUEUE}")
        self.suspend = False
        self.generation += 1
        self.write(when + 150)
        self._event(when + 150, "Started", f"Admitted by clusterQueue {CLUSTER_QUEUE}", KUEUE_RAYJOB)

    def deploy(self, when: Ms, nodes: Sequence[str], pull_s: float) -> Ms:
        """"" (New) -> Initializing with a new RayCluster; once it is ready, the submitter Job -> Running.

        Returns when the submitter Job was created."""
        self.set_status(when, "", counts=self.counts)
        self.deployments += 1
        n = str(self.deployments)
        cluster = RayClusterSim(self.rec, self, f"{self.name}-{b.rand_suffix(self.uid, 'cluster', n)}")
        self.clusters.append(cluster)
        start = when + 100
        self.current: dict[str, Any] = {"job_id": f"{self.name}-{b.rand_suffix(self.uid, 'jobid', n)}",
                                        "cluster": cluster.name, "start": start}
        self.set_status(start, "Initializing", counts=self.counts, **self.current)
        self._event(start + 50, "CreatedRayCluster", f"Created RayCluster {self.ns}/{cluster.name}")
        ready = cluster.create(start + 50, nodes, pull_s)
        self.set_status(start + 600, "Initializing", counts=self.counts, cluster_status=cluster.provisioning,
                        **self.current)
        self.current["dashboard"] = f"{cluster.name}-head-svc.{self.ns}.svc.cluster.local:8265"
        self.set_status(ready + 300, "Initializing", counts=self.counts, cluster_status=cluster.status,
                        **self.current)
        if self.deployments == 1:
            self.wl.pods_ready(ready + 500)
        else:
            self.wl.cond(ready + 500, "PodsReady", True, "Recovered",
                         "All pods reached readiness and the workload is running")
            self.wl.write(ready + 500)
        submitter = SubmitterSim(self.rec, self, self.deployments)
        self.submitters.append(submitter)
        created = ready + 600
        submitter.create(created, nodes[0])
        self._event(created, "CreatedRayJobSubmitter", f"Created Kubernetes Job {self.ns}/{self.name}")
        self.set_status(created + 100, "Running", counts=self.counts, cluster_status=cluster.status,
                        **self.current)
        self.note(start, f"deployment {n}: Initializing with RayCluster {cluster.name} (status.startTime "
                         f"{b.ts(start)}); Running {b.ts(created + 100)}")
        return created + 100

    def app(self, when: Ms, job_status: str, ray_start: Ms, ray_end: Ms | None = None) -> None:
        """The Ray job's status as polled from the dashboard while Running."""
        self.set_status(when, "Running", job_status=job_status, counts=self.counts, ray_start=ray_start,
                        ray_end=ray_end, cluster_status=self.clusters[-1].status, **self.current)

    def retry(self, when: Ms, ray_start: Ms, ray_end: Ms, message: str) -> Ms:
        """The app failed: the submitter ends, Retrying/FAILED, cluster and submitter deleted. Returns when done."""
        self.app(when, "FAILED", ray_start, ray_end)
        self.submitters[-1].complete(when + 1500)
        self.counts = (self.counts[0], self.counts[1] + 1)
        self.set_status(when + 2800, "Retrying", job_status="FAILED", counts=self.counts, ray_start=ray_start,
                        ray_end=ray_end, cluster_status=self.clusters[-1].status, reason="AppFailed",
                        message=message, **self.current)
        self.note(when + 2800, f"Retrying/FAILED (failed={self.counts[1]}, reason AppFailed)")
        gone = self.clusters[-1].delete(when + 3000)
        self._event(when + 3000, "DeletedRayCluster", f"Deleted cluster {self.ns}/{self.clusters[-1].name}")
        self.submitters[-1].delete(when + 3100)
        self._event(when + 3100, "DeletedRayJobSubmitter", f"Deleted submitter K8s Job {self.ns}/{self.name}")
        self.wl.cond(when + 3300, "PodsReady", False, "WaitForRecovery",
                     "At least one pod has failed, waiting for recovery")
        self.wl.write(when + 3300)
        return gone

    def complete(self, when: Ms, ray_start: Ms, ray_end: Ms, message: str) -> Ms:
        """SUCCEEDED; the submitter ends; Complete with endTime; Kueue finishes the Workload. Returns the end."""
        self.app(when, "SUCCEEDED", ray_start, ray_end)
        self.submitters[-1].complete(when + 1500)
        self.counts = (self.counts[0] + 1, self.counts[1])
        end = when + 2800
        self.set_status(end, "Complete", job_status="SUCCEEDED", counts=self.counts, ray_start=ray_start,
                        ray_end=ray_end, end=end, cluster_status=self.clusters[-1].status, message=message,
                        **self.current)
        self.wl.finish(end + 300, True, message)
        self.note(end, f"RayJob Complete/SUCCEEDED (endTime {b.ts(end)}); Workload Finished=True/Succeeded")
        return end
