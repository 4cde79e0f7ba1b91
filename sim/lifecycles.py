"""Parametrised run lifecycles, for property tests and benchmarks.

``generate_run(index, params)`` gives the watch and intake events of one run, per stream, deterministically;
``generate_stream(n_runs, seed)`` interleaves many runs with seeded, varied parameters (about 20 changes per
run), cheaply enough for millions of events: objects are assembled from shared, read-only templates with
shallow copies, not from the deep builders the bundled scenarios use. The write sequences are those of the
scenarios (``sim.scenarios``) with the less important intermediate writes left out.

``generate_cluster(plans)`` runs several lifecycles on one cluster, with their interactions: submission times
and timing seeds of their own (``RunParams.tight`` makes most waits 0-1 s, so many writes share a second), runs
whose first admission is the preemption of another (the victim's ``Preempted`` eviction frees the quota the
preemptor is admitted with, at the same instant), and names reused after a deleted run's objects are gone. The
streams are in commit order with one resourceVersion counter, as etcd gives them.

``RunParams.training`` makes a run report its training as a real one does (intake v2): from shortly after its
containers start, in every attempt that runs, step records at a steady cadence, a checkpoint save (started, then
completed a few seconds later) every so many steps, and after an interruption (an eviction, a KubeRay retry, a pod
the Job controller replaced) a restore of the latest checkpoint completed before it, then steps again from that
checkpoint's step. Its timings come from a random generator of their own, so the objects are the same with or
without it. ``RunPlan.resumes`` makes a run resume an earlier one (the ``taugrid.io/resume-of`` annotation and a
``Resume`` event), from that run's latest checkpoint.

The generator also knows what each run must become: ``Cluster.expected`` holds, per run, the history the
tracker must derive (``ExpectedRun``: status, reason, phase, finish time, attempts with their triggers, times,
end reasons, retries and phases, evictions; the checkpoints saved, the lineage and the goodput ledger's basis, and
the step records, saves and restores the ledger's laws read), written down as the writes are made, from the
lifecycle itself
and the documented rules (README.md, docs/limits.md), never from the reducer. The property tests compare
the reducer's histories with it.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sim import builders as b
from sim.builders import MINUTE, SECOND, Ms, Obj, at
from tracker.core.model import (
    ANN_RESUME_OF,
    INTAKE_SCHEMA,
    LABEL_CONTROLLER_UID,
    LABEL_QUEUE,
    LABEL_RAY_CLUSTER,
    LABEL_RUN_ID,
)

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
    tight: bool = False  # every random wait 0 or 1 s: many writes share a (whole-second) timestamp
    training: bool = False  # report training as it goes (step records, checkpoint saves and restores; intake v2)
    #                         instead of the ``progress_points`` Progress events


@dataclass(frozen=True)
class RunPlan:
    """One run of a generated cluster (``generate_cluster``)."""

    params: RunParams = RunParams()
    index: int | None = None  # the run's identity (run id, uids, default name); default: its position
    start: Ms | None = None  # when the tau CLI starts it; default START + index * RUN_SPACING
    seed: int | None = None  # seed of its random waits; default its index
    preempts: int | None = None  # position of an earlier run whose next Preempted eviction this run's first
    #                              admission causes (admitted the moment the victim's quota is released)
    reuses_name_of: int | None = None  # position of an earlier deleted run: same namespace and name, submitted
    #                                    after every object of that run is gone
    resumes: int | None = None  # position of an earlier run this one resumes (its lineage), submitted after that
    #                             run's last write: from its latest completed checkpoint, if it has one


@dataclass
class ExpectedAttempt:
    """What one attempt of a run must look like in its history (times: ms, whole seconds as objects carry)."""

    trigger: str
    queued_at: Ms | None = None
    admitted_at: Ms | None = None
    ended_at: Ms | None = None
    end_reason: str | None = None
    retries: int = 0
    phases: list[str] = field(default_factory=list)  # phases entered in this attempt, in order
    bound_at: Ms | None = None  # every expected pod bound (Runtime), if it was
    progress_at: Ms | None = None  # first progress evidence (intake step or the Ray job's start)
    steps: list[tuple[Ms, int]] = field(default_factory=list)  # its step records (time, step), in order


@dataclass(frozen=True)
class ExpectedCheckpoint:
    """A checkpoint save or restore a run reported (``RunParams.training``); times in ms, as reported."""

    attempt: int  # 1-based: the attempt it was made in
    step: int
    uri: str
    started: Ms
    ended: Ms | None  # completed at; None: interrupted before it completed


@dataclass
class ExpectedRun:
    """What a generated run must become: the oracle the reducer's histories are checked against."""

    run_id: str
    kind: str
    namespace: str
    name: str
    uid: str
    status: str = "pending"
    reason: str | None = None
    phase: str = "Admission"
    finished_at: Ms | None = None
    evictions: int = 0
    retries: int = 0
    attempts: list[ExpectedAttempt] = field(default_factory=list)
    admissions: list[Ms] = field(default_factory=list)  # every Admitted=True transition written, in order
    evicted: list[tuple[Ms, str]] = field(default_factory=list)  # every Evicted=True transition (time, reason)
    deleted: bool = False  # the root and its objects were deleted
    # what it reported of its progress (the goodput ledger's inputs, schemas/goodput.md)
    ledger_basis: str = "accounting"  # "progress" once it reported a step record or a checkpoint
    resume_of: str | None = None
    resumed_from: str | None = None  # the Resume event's checkpoint, else its first restore's
    saves: list[ExpectedCheckpoint] = field(default_factory=list)
    restores: list[ExpectedCheckpoint] = field(default_factory=list)

    @property
    def checkpoints_saved(self) -> int:
        return len({(c.step, c.uri) for c in self.saves if c.ended is not None})

    @property
    def last_checkpoint(self) -> str | None:
        done = [(c.step, c.ended, c.uri) for c in self.saves if c.ended is not None]
        return max(done)[2] if done else None


@dataclass
class Cluster:
    """The streams of a generated cluster, and what each run must become."""

    streams: dict[str, list[Obj]]
    expected: dict[str, ExpectedRun]


def _sec(ms: Ms) -> Ms:
    """The time an object carries for an instant: metav1.Time has whole seconds."""
    return ms - ms % SECOND


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
    """One run's writes as (time, seq, stream, record); objects are rebuilt per write from shared parts.

    ``expected`` is written alongside: each write that the history must show records it there."""

    def __init__(self, index: int, p: RunParams, t0: Ms, *, name: str | None = None, namespace: str | None = None,
                 seed: int | None = None) -> None:
        self.p, self.t = p, t0
        self.rng = random.Random(index if seed is None else seed)
        self.out: list[tuple[Ms, int, str, Obj]] = []
        self.ns = namespace or ("team-a" if index % 2 == 0 else "team-b")
        self.run_id = f"run-{index:07d}"
        self.name = name or f"{'rj' if p.kind == 'RayJob' else 'job'}-{index:07d}"
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
        self.dead_pods: list[Obj] = []  # failed pods the Job controller replaced (kept until the Job is deleted)
        self.pod_owner = self.root_ref
        self.cluster_meta: Obj | None = None
        self.cluster_live = False
        self.pod_labels: dict[str, str] = {LABEL_CONTROLLER_UID: self.uid, LABEL_RUN_ID: self.run_id}
        self.failed = 0
        self.deployments = 0
        self.releases: list[Ms] = []  # when each non-final Preempted eviction released the quota
        self.preemptors: list[tuple[str, str]] = []  # (workload uid, job uid) causing each Preempted eviction
        self.expected = ExpectedRun(self.run_id, kind, self.ns, self.name, self.uid)
        # training (RunParams.training): its own random waits, so that the objects do not change with it
        self.trng = random.Random(f"training/{index if seed is None else seed}")
        self.cadence = self.trng.choice((30, 45, 60, 90, 120)) * SECOND  # between step records
        self.per_record = self.trng.choice((1, 5, 10, 20, 50))  # steps between records
        self.every = self.per_record * self.trng.randrange(3, 9)  # a checkpoint every so many steps
        self.session: Ms | None = None  # when the running training process started
        self.step0 = 0  # the step training starts from without a checkpoint
        self.ckpt: tuple[int, str] | None = None  # the latest completed checkpoint (step, uri)
        self.progress_ms: list[Ms] = []  # every Progress event's time
        self.reports: list[tuple[Ms, int, str, Obj]] = []  # the training's intake events (merged into out at last)

    # ---- plumbing

    def wait(self, lo: int, hi: int, unit: Ms) -> Ms:
        """A random wait of ``lo..hi-1`` units; with ``tight``, 0 or 1 s instead (the usual draw is made either
        way: without ``tight`` the waits are those the generator always drew)."""
        n = self.rng.randrange(lo, hi)
        return self.rng.randrange(0, 2) * SECOND if self.p.tight else n * unit

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
        ev_uid = self.child_uid()
        ev_name = f"{name}.{self.t * 1_000_000 + self._n:x}"  # unique even for two Events in one millisecond
        ev = {"apiVersion": "v1", "kind": "Event", "count": 1, "firstTimestamp": when, "lastTimestamp": when,
              "involvedObject": {"kind": about, "name": name, "namespace": self.ns, "uid": uid},
              "message": message, "reason": reason, "type": "Warning" if warning else "Normal",
              "metadata": {"creationTimestamp": when, "name": ev_name, "namespace": self.ns,
                           "uid": ev_uid}, "source": {"component": "kueue-admission"}}
        self.emit("events", {"type": "ADDED", "object": ev})

    def intake(self, kind: str, **fields: Any) -> None:
        ev = {"schema": INTAKE_SCHEMA, "event_id": f"{self.run_id}-{len(self.out)}", "run_id": self.run_id,
              "at": b.ts(self.t), "kind": kind, **fields}
        self.emit("intake", ev)

    def intake_at(self, when: Ms, kind: str, **fields: Any) -> None:
        """An intake event of the training process at ``when`` (ms, its own clock), without moving time on; kept
        apart until the run's writes are all made, so that they do not change the objects."""
        n = len(self.reports)
        ev = {"schema": INTAKE_SCHEMA, "event_id": f"{self.run_id}-t{n}", "run_id": self.run_id,
              "at": b.micro_ts(when), "kind": kind, **fields}
        self.reports.append((when, n, "intake", ev))

    # ---- the oracle

    @property
    def att(self) -> ExpectedAttempt:
        return self.expected.attempts[-1]

    def enter(self, phase: str, att: ExpectedAttempt | None = None) -> None:
        att = att or self.att
        if phase not in att.phases:
            att.phases.append(phase)

    def progress_seen(self, when: Ms) -> None:
        att = self.att
        if att.progress_at is None and att.bound_at is not None and _sec(when) >= att.bound_at:
            att.progress_at = _sec(when)
            self.enter("Progress")

    def progress_reported(self, until: Ms) -> None:
        """The current attempt's first progress from its step records before ``until``, by the documented rule
        (docs/limits.md, "Progress points"): the earliest report of each minute is kept, and the attempt's first
        progress is the first kept one from its pods' binding on (a minute that began in the attempt before
        does not count)."""
        att = self.att
        if att.bound_at is None:
            return
        kept: dict[int, Ms] = {}
        for x in self.progress_ms:
            kept[x // MINUTE] = min(kept.get(x // MINUTE, x), x)
        first = min((x for x in kept.values() if att.bound_at <= x < until), default=None)
        if first is not None and (att.progress_at is None or first < att.progress_at):
            att.progress_at = first
            self.enter("Progress")

    # ---- training (RunParams.training)

    def twait(self, lo: Ms, hi: Ms) -> Ms:
        """A training wait of ``lo..hi-1`` ms; with ``tight``, 0 or 1 s."""
        n = self.trng.randrange(lo, hi)
        return self.trng.randrange(0, 2) * SECOND if self.p.tight else n

    def train_start(self) -> None:
        """The containers started: the training process starts now (unless it runs already)."""
        if self.p.training and self.session is None:
            self.session = self.t

    def train_stop(self, when: Ms) -> None:
        """The training process stops at ``when`` (an eviction, a failure, the run's end): write what it reported
        since it started. It reports nothing from the second ``when`` falls in (the objects carry whole seconds:
        an attempt ends at its second)."""
        if self.session is None:
            return
        t, self.session = self.session, None
        cut = _sec(when)
        exp = self.expected
        n = len(exp.attempts)

        def clock(x: Ms) -> Ms:
            return _sec(x) if self.p.tight else x  # tight: whole seconds, shared with the objects' writes

        if self.ckpt is not None:  # restore the latest checkpoint, then go on from its step
            step, uri = self.ckpt
            rs = t + self.twait(5 * SECOND, 20 * SECOND)
            r_end = rs + self.twait(3 * SECOND, 20 * SECOND)
            if clock(rs) >= cut:
                return
            self.intake_at(clock(rs), "CheckpointRestore", phase="started", step=step, uri=uri)
            done = clock(r_end) < cut
            if done:
                self.intake_at(clock(r_end), "CheckpointRestore", phase="completed", step=step, uri=uri)
            exp.restores.append(ExpectedCheckpoint(n, step, uri, clock(rs), clock(r_end) if done else None))
            if exp.resumed_from is None:
                exp.resumed_from = uri
            if not done:
                return
            exp.ledger_basis = "progress"
            t = r_end + self.twait(1 * SECOND, 5 * SECOND)
        else:
            step = self.step0
            t += self.twait(10 * SECOND, 60 * SECOND)
        first = step
        while clock(t) < cut:
            at_ = clock(t)
            self.intake_at(at_, "Progress", step=step, metrics={"loss": round(4.0 / (1 + step / 500), 6)})
            self.progress_ms.append(at_)
            self.att.steps.append((at_, step))
            exp.ledger_basis = "progress"
            if step != first and step % self.every == 0:  # a blocking save of this step's checkpoint
                uri = f"abfss://runs/{self.run_id}/checkpoints/step-{step:08d}"
                end = t + self.twait(2 * SECOND, 15 * SECOND)
                self.intake_at(at_, "CheckpointSave", phase="started", step=step, uri=uri)
                if clock(end) >= cut:
                    exp.saves.append(ExpectedCheckpoint(n, step, uri, at_, None))
                    break
                self.intake_at(clock(end), "CheckpointSave", phase="completed", step=step, uri=uri,
                               bytes=self.p.pods * 12 * 1024**3)
                exp.saves.append(ExpectedCheckpoint(n, step, uri, at_, clock(end)))
                self.ckpt = (step, uri)
                t = end
            t += self.cadence
            step += self.per_record
        self.progress_reported(cut)

    # ---- lifecycle pieces

    def resume(self, run_id: str, ckpt: tuple[int, str] | None) -> None:
        """This run resumes ``run_id`` (``tau`` sets the annotation), from its checkpoint ``ckpt`` if it has one:
        the training process says so (a Resume event) and starts from it."""
        self.root_meta["annotations"] = {ANN_RESUME_OF: run_id}
        exp = self.expected
        exp.resume_of = run_id
        if ckpt is None:
            self.intake("Resume", resume_of=run_id)
            return
        self.intake("Resume", resume_of=run_id, checkpoint_uri=ckpt[1], step=ckpt[0])
        exp.resumed_from = ckpt[1]
        if self.p.training:
            self.ckpt, self.step0 = ckpt, ckpt[0]

    def submit(self, resume: tuple[str, tuple[int, str] | None] | None = None) -> None:
        self.intake("Resolution", status="succeeded", project="bench", workspace=self.ns, target="h100-8x")
        self.intake("Rendering", status="succeeded", workload_kind=self.p.kind, namespace=self.ns, name=self.name)
        if resume is not None:
            self.resume(*resume)
        self.t += 2 * SECOND
        self.root_meta["creationTimestamp"] = b.ts(self.t)
        self.root("ADDED")
        self.expected.attempts.append(ExpectedAttempt("Submitted", queued_at=_sec(self.t),
                                                      phases=["Resolution", "Rendering", "Admission"]))
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
        self.att.admitted_at = _sec(self.t)
        self.expected.admissions.append(_sec(self.t))
        self.enter("Scheduling")
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
        """RayJob: a new deployment on a new RayCluster, Initializing (a new attempt if it is a KubeRay retry)."""
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
        self.cluster_live = True
        self.emit("rayclusters", {"type": "ADDED", "object": {
            "apiVersion": b.RAY_API_VERSION, "kind": "RayCluster", "metadata": dict(self.cluster_meta),
            "spec": self.root_spec["rayClusterSpec"], "status": {}}})

    def retry_deploy(self) -> None:
        """RayJob: KubeRay retries on a new RayCluster; the retried deployment ends where the new one starts."""
        self.att.ended_at, self.att.end_reason = _sec(self.t + 100), "AppFailed"
        self.expected.attempts.append(ExpectedAttempt("RayJobRetry", phases=["Scheduling"]))
        self.deploy()

    def cluster_write(self, etype: str, status: Obj) -> None:
        assert self.cluster_meta is not None
        self.cluster_live = etype != "DELETED"
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
            if self.att.bound_at is None and i == len(pods) - 1:
                self.att.bound_at = _sec(self.t)  # the attempt's pods are all bound (replacements come later)
                self.enter("Runtime")
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
        if start:
            self.train_start()

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

    def delete_pods(self, pods: list[Obj] | None = None) -> None:
        for pod in self.pods if pods is None else pods:
            pod["metadata"] = {**pod["metadata"], "deletionTimestamp": b.ts(self.t + 30 * SECOND),
                               "deletionGracePeriodSeconds": 30}
            if pod["status"]["phase"] == "Running":
                self.finish_pod(pod, 143, "Error")
            self.pod(pod, "DELETED", 1000)
        if pods is None:
            self.pods = []

    def evict(self, reason: str, final: bool) -> None:
        """A Kueue eviction (or the deactivation when ``final``): stop the job, release the quota."""
        message = {"Preempted": "Preempted to accommodate a workload", "PodsReadyTimeout":
                   f"Exceeded the PodsReady timeout {self.ns}/{self.wl_meta['name']}"}.get(
                       reason, "The workload is deactivated due to exceeding the maximum number of re-queuing "
                       "retries")
        if reason == "Preempted" and len(self.preemptors) > len(self.releases):
            wl_uid, job_uid = self.preemptors[len(self.releases)]
            message += f" (UID: {wl_uid}, JobUID: {job_uid}) due to prioritization in the ClusterQueue"
        if final:
            self.wl_spec = {**self.wl_spec, "active": False}
        self.train_stop(self.t)
        self.wl_cond("Evicted", "True", reason, message)
        if reason == "Preempted":
            self.wl_cond("Preempted", "True", "InClusterQueue", message)
        self.evictions[reason] = self.evictions.get(reason, 0) + 1
        exp = self.expected
        exp.evictions += 1
        exp.evicted.append((_sec(self.t), reason))
        self.att.ended_at, self.att.end_reason = _sec(self.t), reason
        if final:
            exp.status, exp.reason, exp.finished_at = "stopped", reason, _sec(self.t)
            self.enter("Completion")
        else:
            exp.attempts.append(ExpectedAttempt(reason, queued_at=_sec(self.t), phases=["Admission"]))
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
        if requeued and not final:
            self.releases.append(self.t)

    def run_job(self) -> None:
        """The last admission of a batch Job: pods, failures with replacements, progress, the outcome."""
        p = self.p
        self.schedule(self.create_pods(p.pods), True, self.wait(5, 60, SECOND))
        for i in range(p.pod_failures):
            self.t += self.wait(1, 20, MINUTE)
            victim = self.pods[i % len(self.pods)]
            self.train_stop(self.t)  # the training process dies with the pod; it starts again with its replacement
            self.finish_pod(victim, 137, "OOMKilled")
            self.pods.remove(victim)
            self.dead_pods.append(victim)
            self.failed += 1
            self.att.retries += 1
            self.expected.retries += 1
            self.root_status = {**self.root_status, "failed": self.failed}
            self.root(dt=300)
            self.t += 10 * SECOND
            self.schedule(self.create_pods(1), True, 3 * SECOND)
        self.progress()
        self.end()

    def run_rayjob(self) -> None:
        p = self.p
        for n in range(p.ray_retries + 1):
            if n:
                self.retry_deploy()
            else:
                self.deploy()
            self.schedule(self.create_pods(p.pods), True, self.wait(20, 60, SECOND))
            self.cluster_write("MODIFIED", {"state": "ready", "stateTransitionTimes": {"ready": b.ts(self.t)}})
            self.root_status = {**self.root_status, "jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                                "rayJobInfo": {"startTime": b.ts(self.t + 5 * SECOND)}}
            self.progress_seen(self.t + 5 * SECOND)  # the Ray job's own start
            self.root(dt=5 * SECOND)
            if n < p.ray_retries:
                self.t += self.wait(2, 30, MINUTE)
                self.train_stop(self.t)
                self.root_status = {**self.root_status, "jobDeploymentStatus": "Retrying", "jobStatus": "FAILED",
                                    "failed": n + 1, "reason": "AppFailed", "message": "exit code 1"}
                self.root()
                self.delete_pods()
                self.cluster_write("DELETED", {"state": "ready"})
                self.root_status = {"failed": n + 1, "jobDeploymentStatus": ""}
                self.root(dt=500)
        self.progress()
        self.end()

    def progress(self) -> None:
        """``progress_points`` Progress events (without ``training``, which reports its own; the waits are the
        same either way)."""
        for i in range(self.p.progress_points):
            self.t += self.wait(1, 10, MINUTE)
            if self.p.training:
                continue
            self.expected.ledger_basis = "progress"
            if i == 2:
                uri = f"abfss://runs/{self.run_id}/step-{i}"
                self.expected.saves.append(ExpectedCheckpoint(len(self.expected.attempts), 100 * (i + 1), uri,
                                                              _sec(self.t), _sec(self.t)))
            ckpt = {"checkpoint_uri": f"abfss://runs/{self.run_id}/step-{i}"} if i == 2 else {}
            self.progress_seen(self.t)
            self.intake("Progress", step=100 * (i + 1), metrics={"loss": 2.0 / (i + 1), "accuracy": 0.1 * i},
                        **ckpt)

    def end(self) -> None:
        p = self.p
        exp = self.expected
        self.t += self.wait(1, 30, MINUTE)
        self.train_stop(self.t)  # the run's end (or, running, the end of what is generated)
        if p.outcome == "running":
            exp.status = "running"
            return
        if p.outcome == "deleted":
            self.delete_everything()
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
            reason = "Succeeded" if ok else "AppFailed"  # a RayJob's success carries no reason of its own
            self.root_status = {**self.root_status, "jobDeploymentStatus": "Complete" if ok else "Failed",
                                "jobStatus": "SUCCEEDED" if ok else "FAILED", "endTime": b.ts(self.t + 500),
                                "reason": "" if ok else "AppFailed", "message": message}
        exp.status, exp.reason, exp.finished_at = "succeeded" if ok else "failed", reason, _sec(self.t + 500)
        self.att.ended_at, self.att.end_reason = exp.finished_at, reason
        self.enter("Completion")
        self.root(dt=500)
        self.wl_cond("Finished", "True", "Succeeded" if ok else "Failed", message)
        self.workload(dt=300)

    def delete_everything(self) -> None:
        """``kubectl delete`` of the root: it goes at once (no finalizer), the garbage collector takes the rest."""
        exp = self.expected
        att = self.att
        admitted = "Scheduling" in att.phases
        # docs/limits.md, "Deletion times": the root goes without a deletionTimestamp, and so does the Workload here;
        # the pods of its (admitted) attempt are deleted with it, and the latest of their deletions less the grace
        # period is when the run ended. Without pods, the latest time the root itself carries. Phases after that
        # are not shown.
        stamp = _carried_time(self.root_meta, self.root_status)
        self.root("DELETED")
        pods = [*self.pods, *self.dead_pods]
        self.delete_pods()
        self.delete_pods(self.dead_pods)
        self.dead_pods = []
        if pods and admitted:
            stamp = max(_parse_ts(p["metadata"]["deletionTimestamp"]) for p in pods) - 30 * SECOND
        att.phases = [ph for ph in att.phases if ph not in ("Runtime", "Progress")]
        if att.bound_at is not None and att.bound_at <= stamp:
            self.enter("Runtime")
            if att.progress_at is not None and (self.p.kind == "RayJob" or att.progress_at <= stamp):
                self.enter("Progress")
        exp.status, exp.reason, exp.finished_at, exp.deleted = "stopped", "Deleted", stamp, True
        att.ended_at, att.end_reason = stamp, "Deleted"
        self.enter("Completion")
        if self.cluster_live:
            self.cluster_write("DELETED", {"state": "ready"})
        self.workload("DELETED", 500)

    def finish(self) -> ExpectedRun:
        """The run-level phase, once every write is made."""
        exp = self.expected
        last = exp.attempts[-1].phases
        exp.phase = "Completion" if "Completion" in last else max(last, key=_PHASES.index)
        return exp


_PHASES = ["Resolution", "Rendering", "Admission", "Scheduling", "Runtime", "Progress", "Completion"]


def _carried_time(meta: Obj, status: Obj) -> Ms:
    """The latest time an object carries: its creation, condition transitions, start/completion/end times."""
    times = [meta["creationTimestamp"], *(c["lastTransitionTime"] for c in status.get("conditions", ())),
             *(status[k] for k in ("startTime", "completionTime", "endTime") if status.get(k))]
    return max(_parse_ts(t) for t in times)


def _parse_ts(text: str) -> Ms:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()) * SECOND


def _events(index: int, p: RunParams, t0: Ms, *, name: str | None = None, namespace: str | None = None,
            seed: int | None = None, admit_at: Ms | None = None,
            preemptors: Sequence[tuple[str, str]] = (),
            resume: tuple[str, tuple[int, str] | None] | None = None) -> _Run:
    """Every write of one run; ``admit_at`` forces the time of its first admission (a preemptor's); ``resume``:
    the run id it resumes and that run's latest checkpoint (step, uri)."""
    r = _Run(index, p, t0, name=name, namespace=namespace, seed=seed)
    r.preemptors = list(preemptors)
    r.submit(resume)
    final = p.outcome == "deactivated"
    reason = p.eviction_reason
    first = True

    def admission_wait(lo: int, hi: int) -> Ms:
        nonlocal first
        w = r.wait(lo, hi, SECOND)
        if first and admit_at is not None:
            if admit_at < r.t:
                raise ValueError(f"{r.run_id}: cannot be admitted at {admit_at}, submitted at {r.t}")
            w = admit_at - r.t
        first = False
        return w

    for _ in range(p.evictions):
        r.admit(admission_wait(1, 120))
        if p.kind == "RayJob":
            r.deploy()
        r.schedule(r.create_pods(p.pods), reason == "Preempted", r.wait(5, 30, SECOND))
        r.t += (10 * MINUTE if reason == "PodsReadyTimeout" else r.wait(1, 40, MINUTE))
        r.evict(reason, False)
    r.admit(admission_wait(1, 600))
    if final:
        if p.kind == "RayJob":
            r.deploy()
        r.schedule(r.create_pods(p.pods), False, 10 * MINUTE)
        r.evict("DeactivatedDueToRequeuingLimitExceeded", True)
    elif p.kind == "Job":
        r.run_job()
    else:
        r.run_rayjob()
    r.out = [(t, n, stream, record) for n, (t, _, stream, record) in enumerate([*r.out, *r.reports])]
    r.out.sort(key=lambda e: (e[0], e[1]))
    r.finish()
    return r


def generate_run(index: int, params: RunParams) -> dict[str, list[Obj]]:
    """One run's watch and intake events, per stream, each stream in commit order (deterministic)."""
    out: dict[str, list[Obj]] = {s: [] for s in STREAMS}
    rv = 1000 + index * 1000
    for _t, _seq, stream, record in _events(index, params, START + index * RUN_SPACING).out:
        if stream != "intake":
            rv += 1
            record["object"]["metadata"]["resourceVersion"] = str(rv)
        out[stream].append(record)
    return out


def expected_run(index: int, params: RunParams) -> ExpectedRun:
    """What the run ``generate_run(index, params)`` gives must become."""
    return _events(index, params, START + index * RUN_SPACING).expected


def generate_cluster(plans: Sequence[RunPlan]) -> Cluster:
    """Several runs on one cluster (see ``RunPlan``): every stream in commit order, one resourceVersion counter
    across them (as etcd), and what each run must become."""
    indexes = [i if plan.index is None else plan.index for i, plan in enumerate(plans)]
    if len(set(indexes)) != len(indexes):
        raise ValueError(f"run indexes must be distinct: {indexes}")
    # who preempts whom: the k-th preemptor of a victim causes its k-th Preempted eviction
    preemptors: dict[int, list[tuple[str, str]]] = {}
    claimed: dict[int, int] = {}  # preemptor position -> the victim's eviction it causes
    for pos, plan in enumerate(plans):
        victim = plan.preempts
        if victim is None:
            continue
        if not 0 <= victim < pos:
            raise ValueError(f"run {pos} can only preempt an earlier run, not {victim}")
        if plan.reuses_name_of is not None:
            raise ValueError(f"run {pos}: a preemptor's submission time is set by its victim, not by a name")
        vp = plans[victim].params
        n = len(preemptors.setdefault(victim, []))
        if vp.eviction_reason != "Preempted" or n >= vp.evictions:
            raise ValueError(f"run {victim} has no Preempted eviction left for run {pos} to cause")
        uid = b.uid("lifecycle", str(indexes[pos]))
        preemptors[victim].append((f"{uid[:24]}{1:012x}", uid))  # its Workload is its first child
        claimed[pos] = n
    runs: list[_Run] = []
    for pos, plan in enumerate(plans):
        index = indexes[pos]
        start = START + index * RUN_SPACING if plan.start is None else plan.start
        name = namespace = None
        admit_at = None
        if plan.reuses_name_of is not None:
            old = plan.reuses_name_of
            if not 0 <= old < pos or not runs[old].expected.deleted:
                raise ValueError(f"run {pos} can only reuse the name of an earlier deleted run, not {old}")
            name, namespace = runs[old].name, runs[old].ns
            start = max(start, runs[old].out[-1][0] + SECOND)  # after its last object is gone
        resume = None
        if plan.resumes is not None:
            old = plan.resumes
            if not 0 <= old < pos:
                raise ValueError(f"run {pos} can only resume an earlier run, not {old}")
            if plan.preempts is not None:
                raise ValueError(f"run {pos}: a preemptor's submission time is set by its victim, not by a resume")
            start = max(start, runs[old].out[-1][0] + SECOND)  # after that run's last write
            resume = (runs[old].run_id, runs[old].ckpt)
        if plan.preempts is not None:
            admit_at = runs[plan.preempts].releases[claimed[pos]]
            lead = random.Random(index if plan.seed is None else plan.seed).randrange(0, 60) * SECOND
            start = admit_at - 3 * SECOND - (0 if plan.params.tight else lead)  # submitting takes 3 s
        runs.append(_events(index, plan.params, start, name=name, namespace=namespace, seed=plan.seed,
                            admit_at=admit_at, preemptors=preemptors.get(pos, ()), resume=resume))
    merged = sorted((t, pos, seq, stream, record) for pos, r in enumerate(runs) for t, seq, stream, record in r.out)
    streams: dict[str, list[Obj]] = {s: [] for s in STREAMS}
    rv = 1000
    for _t, _pos, _seq, stream, record in merged:
        if stream != "intake":
            rv += 1
            record["object"]["metadata"]["resourceVersion"] = str(rv)
        streams[stream].append(record)
    return Cluster(streams, {r.run_id: r.expected for r in runs})


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


def generate_stream(n_runs: int, seed: int,
                    params: Callable[[random.Random], RunParams] = random_params) -> Iterator[Obj]:
    """Every record of ``n_runs`` runs with seeded, varied parameters (drawn by ``params``), interleaved in time
    order."""
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
        for t, _i, _stream, record in _events(index, params(rng), t0).out:
            seq += 1
            heapq.heappush(heap, (t, seq, record))
    while heap:
        _t, _s, record = heapq.heappop(heap)
        if "object" in record:
            rv += 1
            record["object"]["metadata"]["resourceVersion"] = str(rv)
        yield record
