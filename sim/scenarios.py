"""The bundled scenarios: what the watchers of one cluster saw on 2026-08-20 between 09:00 and 13:00 UTC.

Each scenario is a script that drives the controller simulators (``sim.simulators``) through the write
sequences of ``shared/reference/lifecycle.md``; TauGrid's own intake events (Resolution, Rendering, Progress) come
with them. The training processes of several runs report as intake v2 has them (the goodput ledger's inputs): step
records, checkpoint saves with their durations, the restore of the last checkpoint after an interruption (a
preemption, a deactivation, a KubeRay retry, a pod replaced after an OOM kill) and steps again from its step, and
the lineage of a run that resumes another (a Resume event). Their times fit the objects': the training runs while
the containers do, and reports nothing after the interruption.

All scenarios share one object store: ``resourceVersion`` values are assigned across the whole cluster in
commit (time) order, so a scenario's streams are a slice of the bundled capture.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from sim import builders as b
from sim.builders import MINUTE, SECOND, EventsApi, Ms, Obj, at
from sim.simulators import (
    CLUSTER_QUEUE,
    FLAVOR_NODE_LABELS,
    KUEUE_ADMISSION,
    KUEUE_RAYJOB,
    KUEUE_WORKLOAD,
    NEW_RECORDERS,
    NODES,
    PODS_READY_TIMEOUT,
    RAYCLUSTER_CONTROLLER,
    RAYJOB_CONTROLLER,
    REGISTRY,
    REQUEUE_BACKOFF,
    SCHEDULER,
    STREAMS,
    JobSim,
    RayJobSim,
    Rec,
    Tau,
    Write,
    intake_id,
    progress,
    resolve,
    restore_checkpoint,
    resume,
    save_checkpoint,
    tau_submit,
)

# --------------------------------------------------------------------------------------------------
# The scenarios.

TRAIN_CMD = ("torchrun", "--nnodes=$(NNODES)", "--nproc-per-node=8", "-m", "taugrid.train", "--config",
             "/etc/taugrid/config.yaml")


def _tau(run_id: str, project: str, ns: str, config: str, resume_of: str | None = None) -> Tau:
    return Tau(run_id, project, ns, "h100-8x", config, resume_of)


def _job(rec: Rec, tau: Tau, ns: str, image: str, pods: int = 2, **kw: Any) -> JobSim:
    return JobSim(rec, ns=ns, name=tau.run_id, tau=tau, pods=pods, image=f"{REGISTRY}/{image}",
                  command=TRAIN_CMD, **kw)


def _curve(start: Ms, every: Ms, steps: Sequence[int], loss0: float, acc0: float
           ) -> list[tuple[Ms, int, float, float]]:
    """Progress points with a falling loss and a rising accuracy."""
    return [(start + i * every, step, round(loss0 / (1 + 0.35 * i), 4), round(min(0.99, acc0 + 0.06 * i), 4))
            for i, step in enumerate(steps)]


GIB = 1024**3


def _train(rec: Rec, tau: Tau, points: list[tuple[Ms, int, float, float]], saves: Sequence[tuple[int, int]] = (),
           size: int = 0) -> None:
    """Step records at a steady cadence (``progress``), and blocking checkpoint saves (step, seconds), each begun
    when its step is reached (intake v2: the save's duration is reported)."""
    progress(rec, tau, points)
    reached = {step: when for when, step, _loss, _acc in points}
    for step, took in saves:
        save_checkpoint(rec, tau, step, reached[step], reached[step] + took * SECOND, size)


def _pull_failures(job: JobSim, first: Ms, until: Ms, detail: str) -> None:
    """Every live pod: ErrImagePull, then back-offs at growing intervals until ``until``."""
    for pod in job.live():
        pod.pull_failed(first, detail)
        delay = 10 * SECOND
        t = first + 13 * SECOND
        while t < until:
            pod.back_off(t)
            t += delay
            delay = min(delay * 2, 5 * MINUTE)
        first += 700
    job.note(first, "containers waiting: ErrImagePull, then ImagePullBackOff")


def _pods_ready_timeout(job: JobSim, when: Ms, backoff: Ms) -> Ms:
    """§1.7d: evicted after the PodsReady timeout, stopped, requeued after the backoff. Returns requeue time."""
    wl = job.wl
    count = (wl.requeue[0] if wl.requeue else 0) + 1
    wl.requeue = (count, when + backoff)
    message = f"Exceeded the PodsReady timeout {job.ns}/{wl.name}"
    wl.evict(when, "PodsReadyTimeout", message, "WaitForStart")
    job.note(when, f"Evicted=True/PodsReadyTimeout (requeueState.count={count}, requeueAt {b.ts(when + backoff)})")
    gone = job.stop(when + 400, message)
    wl.release(gone + 300, "Pending", message, (False, "PodsReadyTimeout", message))
    wl.requeue = (count, None)
    wl.cond(when + backoff, "Requeued", True, "BackoffFinished", "The workload backoff was finished")
    wl.write(when + backoff)
    job.note(when + backoff, "Requeued=True/BackoffFinished")
    return when + backoff


def quick_success(rec: Rec) -> None:
    tau = _tau("rn50-ft-k7q2m", "vision", "team-a", "resnet50/finetune-imagenet.yaml")
    created = tau_submit(rec, tau, at("09:02:00"), "Job", "team-a", tau.run_id)
    job = _job(rec, tau, "team-a", "vision-train:2026.08.19", backoff_limit=3)
    job.create(created)
    job.admit(at("09:02:06.500"))
    job.start(at("09:02:06.800"))
    job.bind(at("09:02:07.600"), NODES[0:2])
    job.run(at("09:02:44"), 34.6)
    progress(rec, tau, _curve(at("09:05:10"), 8 * MINUTE, (500, 1500, 2500, 3500, 4500), 2.31, 0.41),
             checkpoint_at=2)
    job.succeed(at("09:41:08"))


def quota_wait(rec: Rec) -> None:
    tau = _tau("llama-sft-4xq9t", "llm", "team-b", "llama3-8b/sft-chat.yaml")
    created = tau_submit(rec, tau, at("09:20:00"), "Job", "team-b", tau.run_id)
    job = _job(rec, tau, "team-b", "llm-train:2026.08.18", backoff_limit=2)
    job.create(created)
    msg = ("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor h100, "
           "4 more needed")
    first = created + 1200
    for i in range(12):
        job.wl.pending(first + i * 4 * MINUTE, msg)
    job.note(first, "QuotaReserved=False/Pending (insufficient quota; Warning Pending event repeats, count 12)")
    job.admit(at("10:05:30"))
    job.start(at("10:05:30.300"))
    job.bind(at("10:05:31"), NODES[2:4])
    job.run(at("10:05:58"), 25.1)
    progress(rec, tau, _curve(at("10:10:00"), 10 * MINUTE, (200, 600, 1000, 1400), 1.92, 0.52))
    job.succeed(at("10:51:40"))


def preemption(rec: Rec) -> None:
    tau = _tau("bert-pt-2c5nw", "nlp", "team-a", "bert-large/pretrain.yaml")
    created = tau_submit(rec, tau, at("09:59:56"), "Job", "team-a", tau.run_id)
    victim = _job(rec, tau, "team-a", "nlp-train:2026.08.20", backoff_limit=3, priority_class="low", priority=100)
    victim.create(created)
    victim.admit(at("10:00:03"))
    victim.start(at("10:00:03.300"))
    victim.bind(at("10:00:04"), NODES[4:6])
    victim.run(at("10:00:41"), 33.8)
    # a checkpoint every 1000 steps (46 s each); the last one before the preemption completes at 10:35:46
    _train(rec, tau, _curve(at("10:05:00"), 5 * MINUTE, (1000, 1500, 2000, 2500, 3000, 3500, 4000), 7.9, 0.12),
           ((2000, 44), (3000, 47), (4000, 46)), 4 * GIB)
    # The preemptor: a high-priority Job submitted with kubectl (no TauGrid labels), keyed by its uid.
    hot = JobSim(rec, ns="team-a", name="eval-hotfix-0820", tau=None, pods=2, image=f"{REGISTRY}/eval:hotfix-3",
                 command=("python", "-m", "evals.run", "--suite", "release"), backoff_limit=1,
                 priority_class="high", priority=10000)
    hot.create(at("10:40:00"))
    hot.wl.pending(at("10:40:00.600"), "couldn't assign flavors to pod set main: insufficient unused quota for "
                   "nvidia.com/gpu in flavor h100, 16 more needed")
    message = (f"Preempted to accommodate a workload (UID: {hot.wl.uid}, JobUID: {hot.uid}) due to prioritization "
               f"in the ClusterQueue; preemptor path: /{CLUSTER_QUEUE}; preemptee path: /{CLUSTER_QUEUE}")
    victim.wl.preempted(at("10:40:01"), message, "; preemptor effective priority: 10000 (base: 10000, boost: 0); "
                        "preemptee effective priority: 100 (base: 100, boost: 0)")
    victim.note(at("10:40:01"), f"Evicted=True/Preempted by {hot.run_key}")
    hot.wl._event(at("10:40:01"), "PreemptedWorkload", f"Preempted workload team-a/{victim.wl.name} "
                  f"(UID: {victim.wl.uid}) in ClusterQueue {CLUSTER_QUEUE}", KUEUE_ADMISSION)
    gone = victim.stop(at("10:40:01.400"), message)
    victim.wl.release(gone + 300, "Pending", message, (True, "Preempted", message))
    victim.note(gone + 300, "quota released; Requeued=True/Preempted")
    hot.admit(gone + 1300)
    hot.start(gone + 1600)
    hot.bind(gone + 2400, NODES[4:6])
    hot.run(gone + 6 * SECOND, 2.4)
    victim.wl.pending(gone + 2 * SECOND, "couldn't assign flavors to pod set main: insufficient unused quota for "
                      "nvidia.com/gpu in flavor h100, 16 more needed")
    victim.wl.pending(at("10:55:00"), "couldn't assign flavors to pod set main: insufficient unused quota for "
                      "nvidia.com/gpu in flavor h100, 16 more needed")
    hot.succeed(at("11:09:50"))
    victim.admit(at("11:10:00"))
    victim.start(at("11:10:00.300"))
    victim.bind(at("11:10:01"), NODES[4:6])
    victim.run(at("11:10:06"), 1.9)
    restore_checkpoint(rec, tau, 4000, at("11:12:31"), at("11:14:07"))  # and goes on from step 4000
    _train(rec, tau, _curve(at("11:15:00"), 5 * MINUTE, (4000, 4500, 5000, 5500, 6000, 6500, 7000, 7500), 2.55,
                            0.5), ((5000, 45), (6000, 46), (7000, 44)), 4 * GIB)
    victim.succeed(at("11:52:20"))


IMAGE_NOT_FOUND = ('rpc error: code = NotFound desc = failed to pull and unpack image "{img}": failed to resolve '
                   'reference "{img}": {img}: not found')


def podsready_timeout(rec: Rec) -> None:
    tau = _tau("vit-l-9hx4d", "vision", "team-b", "vit-large/pretrain-in22k.yaml")
    created = tau_submit(rec, tau, at("10:59:56"), "Job", "team-b", tau.run_id)
    job = _job(rec, tau, "team-b", "vision-train:2026.08.20-rc1", backoff_limit=3)
    job.create(created)
    job.admit(at("11:00:03"))
    job.start(at("11:00:03.300"))
    job.bind(at("11:00:04"), NODES[6:8])
    _pull_failures(job, at("11:00:12"), at("11:10:00"), IMAGE_NOT_FOUND.format(img=job.image))
    requeued = _pods_ready_timeout(job, at("11:10:03"), REQUEUE_BACKOFF)
    job.admit(requeued + 1500)
    job.start(requeued + 1800)
    job.bind(requeued + 2600, NODES[6:8])
    job.run(requeued + 41 * SECOND, 37.2)  # CI has pushed the image by now
    progress(rec, tau, _curve(at("11:16:00"), 9 * MINUTE, (400, 800, 1200, 1600), 4.4, 0.22))
    job.succeed(at("11:48:30"))


DEACTIVATED_RUN = "gpt-moe-6wz8r"


def deactivated(rec: Rec) -> None:
    tau = _tau(DEACTIVATED_RUN, "llm", "team-a", "moe-16x1b/pretrain.yaml")
    created = tau_submit(rec, tau, at("11:19:56"), "Job", "team-a", tau.run_id)
    job = _job(rec, tau, "team-a", "llm-train:2026.8.20", backoff_limit=3)  # a mistyped tag
    job.create(created)
    not_found = IMAGE_NOT_FOUND.format(img=job.image)
    job.admit(at("11:20:02"))
    job.start(at("11:20:02.300"))
    job.bind(at("11:20:03"), NODES[0:2])
    _pull_failures(job, at("11:20:11"), at("11:30:00"), not_found)
    requeued = _pods_ready_timeout(job, at("11:30:02"), REQUEUE_BACKOFF)
    job.admit(requeued + 1000)
    job.start(requeued + 1300)
    second = requeued + 1000
    job.bind(second + 1000, NODES[0:2])
    _pull_failures(job, second + 9 * SECOND, second + PODS_READY_TIMEOUT - 3 * SECOND, not_found)
    # §1.7e: the second timeout exceeds backoffLimitCount=1.
    t = second + PODS_READY_TIMEOUT
    wl = job.wl
    wl.cond(t, "DeactivationTarget", True, "RequeuingLimitExceeded",
            "exceeding the maximum number of re-queuing retries")
    wl.write(t)
    wl.set_active(t + 200, False)
    message = "The workload is deactivated due to exceeding the maximum number of re-queuing retries"
    wl.conds = b.without_condition(wl.conds, "DeactivationTarget")
    wl.requeue = None
    wl.evict(t + 400, "DeactivatedDueToRequeuingLimitExceeded", message, "RequeuingLimitExceeded",
             stats_reason="Deactivated")
    job.note(t, "DeactivationTarget=True/RequeuingLimitExceeded; spec.active=false; "
                "Evicted=True/DeactivatedDueToRequeuingLimitExceeded")
    gone = job.stop(t + 700, message)
    wl.release(gone + 300, "Pending", message, (False, "DeactivatedDueToRequeuingLimitExceeded", message))
    job.note(gone + 300, "QuotaReserved=False/Pending, Requeued=False/DeactivatedDueToRequeuingLimitExceeded; "
                         "the Job stays suspended (run stopped)")


DEACTIVATED_MESSAGE = "The workload is deactivated"


def _deactivate_by_hand(job: JobSim, when: Ms) -> Ms:
    """A person sets spec.active=false on an admitted Workload (v0.12-v0.17 writes, integration-tested upstream in
    test/integration/singlecluster/controller/jobs/job/job_controller_test.go). Returns when the quota is released."""
    wl = job.wl
    wl.set_active(when, False)
    # workload controller, inactive branch: workload.Evict (requeueState cleared, no DeactivationTarget)
    wl.requeue = None
    wl.evict(when + 120, "Deactivated", DEACTIVATED_MESSAGE)
    job.note(when, "spec.active=false (by hand); Evicted=True/Deactivated")
    # job reconciler: stop the Job; once its pods are gone, clear the admission
    gone = job.stop(when + 300, DEACTIVATED_MESSAGE)
    wl.release(gone + 300, "Pending", DEACTIVATED_MESSAGE, (False, "Deactivated", DEACTIVATED_MESSAGE))
    job.note(gone + 300, "quota released: QuotaReserved=False/Pending, Requeued=False/Deactivated (run stopped)")
    return gone + 300


def _reactivate_by_hand(job: JobSim, when: Ms) -> Ms:
    """spec.active=true; the workload controller flips Requeued=False/Deactivated to True/Reactivated, which
    puts the Workload back in its queue. Returns when it is queued."""
    job.wl.set_active(when, True)
    job.wl.reactivated(when + 150)
    job.note(when, "spec.active=true (by hand); Requeued=True/Reactivated: queued again")
    return when + 150


def _wait_for_quota(job: JobSim, first: Ms, until: Ms, needed: int) -> None:
    """Kueue's scheduler finds no quota: the message in QuotaReserved=False/Pending, a Pending event per try."""
    msg = ("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor h100, "
           f"{needed} more needed")
    t = first
    while t < until:
        job.wl.pending(t, msg)
        t += 4 * MINUTE
    job.note(first, f"QuotaReserved=False/Pending ({needed} GPUs short); Warning Pending events repeat")


REACTIVATED_RUN = "mixtral-sft-8pz3c"


def reactivated(rec: Rec) -> None:
    tau = _tau(REACTIVATED_RUN, "llm", "team-b", "mixtral-8x7b/sft-code.yaml")
    created = tau_submit(rec, tau, at("09:05:56"), "Job", "team-b", tau.run_id)
    job = _job(rec, tau, "team-b", "llm-train:2026.08.18", backoff_limit=3)
    job.create(created)
    job.admit(at("09:06:02"))
    job.start(at("09:06:02.300"))
    job.bind(at("09:06:03"), NODES[6:8])
    job.run(at("09:06:40"), 35.1)
    _train(rec, tau, _curve(at("09:10:00"), 8 * MINUTE, (300, 900, 1500, 2100), 1.74, 0.48), ((1500, 52), (2100, 55)),
           90 * GIB)
    _deactivate_by_hand(job, at("09:40:00"))
    queued = _reactivate_by_hand(job, at("10:20:00"))
    _wait_for_quota(job, queued + 450, at("10:33:00"), 16)
    job.admit(at("10:33:05"))
    job.start(at("10:33:05.300"))
    job.bind(at("10:33:06"), NODES[6:8])
    job.run(at("10:33:31"), 2.3)
    restore_checkpoint(rec, tau, 2100, at("10:33:45"), at("10:34:38"))
    _train(rec, tau, _curve(at("10:35:00"), 6 * MINUTE, (2100, 2600, 3100, 3600), 0.95, 0.7), ((3100, 54),), 90 * GIB)
    job.succeed(at("10:54:20"))


REACTIVATED_WAITING_RUN = "qwen-rm-5vt2j"


def reactivated_waiting(rec: Rec) -> None:
    tau = _tau(REACTIVATED_WAITING_RUN, "llm", "team-a", "qwen2-7b/reward-model.yaml")
    created = tau_submit(rec, tau, at("11:49:56"), "Job", "team-a", tau.run_id)
    job = _job(rec, tau, "team-a", "llm-train:2026.08.20", backoff_limit=3)
    job.create(created)
    job.admit(at("11:50:02"))
    job.start(at("11:50:02.300"))
    job.bind(at("11:50:03"), NODES[2:4])
    job.run(at("11:50:41"), 36.0)
    progress(rec, tau, _curve(at("11:54:00"), 4 * MINUTE, (100, 300, 500), 0.69, 0.55))
    _deactivate_by_hand(job, at("12:05:00"))
    queued = _reactivate_by_hand(job, at("12:24:00"))
    _wait_for_quota(job, queued + 400, at("12:59:55"), 8)


def resumed(rec: Rec) -> None:
    tau = _tau("gpt-moe-tq3vb", "llm", "team-a", "moe-16x1b/pretrain.yaml", resume_of=DEACTIVATED_RUN)
    created = tau_submit(rec, tau, at("12:04:56"), "Job", "team-a", tau.run_id)
    job = _job(rec, tau, "team-a", "llm-train:2026.08.20", backoff_limit=3)
    job.create(created)
    job.admit(at("12:05:02"))
    job.start(at("12:05:02.300"))
    job.bind(at("12:05:03"), NODES[0:2])
    job.run(at("12:05:40"), 35.5)
    resume(rec, tau, at("12:05:48"))  # the run it resumes never saved a checkpoint: it starts afresh
    _train(rec, tau, _curve(at("12:08:00"), 8 * MINUTE, (250, 750, 1250, 1750), 9.2, 0.08),
           ((750, 38), (1250, 41), (1750, 40)), 30 * GIB)
    job.succeed(at("12:39:30"))


def rayjob_retry(rec: Rec) -> None:
    tau = _tau("rl-ppo-8mc2k", "rl", "team-b", "ppo/atari-distributed.yaml")
    created = tau_submit(rec, tau, at("10:13:56"), "RayJob", "team-b", tau.run_id)
    rj = RayJobSim(rec, ns="team-b", name=tau.run_id, tau=tau, workers=2, backoff_limit=1,
                   entrypoint="python -m taugrid.rl.ppo --config /etc/taugrid/config.yaml")
    rj.create(created)
    rj.admit(at("10:14:03"))
    running = rj.deploy(at("10:14:03.400"), NODES[2:5], 42.7)
    ray_start = running + 3 * SECOND
    rj.app(running + 2500, "PENDING", ray_start)
    rj.app(running + 6 * SECOND, "RUNNING", ray_start)
    _train(rec, tau, _curve(at("10:20:00"), 6 * MINUTE, (10, 40, 70, 100), 0.91, 0.3), ((40, 21), (70, 22), (100, 24)),
           2 * GIB)
    failed_at = at("10:41:17")
    gone = rj.retry(failed_at + 600, ray_start, failed_at,
                    "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 "
                    "chars):\nRuntimeError: CUDA error: an illegal memory access was encountered")
    running = rj.deploy(gone + 500, NODES[2:5], 2.2)
    ray_start = running + 3 * SECOND
    rj.app(running + 2500, "PENDING", ray_start)
    rj.app(running + 6 * SECOND, "RUNNING", ray_start)
    restore_checkpoint(rec, tau, 100, at("10:42:05"), at("10:42:41"))
    _train(rec, tau, _curve(at("10:43:00"), 6 * MINUTE, (100, 130, 160, 190), 0.6, 0.48), ((130, 22), (160, 23)),
           2 * GIB)
    end = rj.complete(at("11:02:31"), ray_start, at("11:02:30"), "Job finished successfully.")
    rj.clusters[-1].delete(end + 60 * SECOND)  # ttlSecondsAfterFinished
    rj._event(end + 60 * SECOND, "DeletedRayCluster", f"Deleted cluster team-b/{rj.clusters[-1].name}")


def oom_retry(rec: Rec) -> None:
    tau = _tau("whisper-ft-5gd7s", "speech", "team-b", "whisper-large/finetune-callcenter.yaml")
    created = tau_submit(rec, tau, at("11:59:56"), "Job", "team-b", tau.run_id)
    job = _job(rec, tau, "team-b", "speech-train:2026.08.17", backoff_limit=3, api="v1beta2")
    job.create(created)
    job.admit(at("12:00:02"))
    job.start(at("12:00:02.300"))
    job.bind(at("12:00:03"), NODES[5:7])
    job.run(at("12:00:31"), 26.4)
    _train(rec, tau, _curve(at("12:03:00"), 2 * MINUTE, (100, 200, 300, 400), 1.21, 0.61), ((300, 15),), 6 * GIB)
    oom = job.live()[1]
    job.pod_failed(at("12:09:41"), oom, 137, "OOMKilled")
    replacement = job.add_pod(at("12:09:52.200"))
    job.write(at("12:09:52.400"))
    replacement.bind(at("12:09:52.500"), oom.node or NODES[6])
    replacement.accept(at("12:09:53.300"))
    replacement.run(at("12:09:55"), 0.8)
    job.write(at("12:09:55.600"))
    job.note(at("12:09:52.200"), f"replacement pod {replacement.name} created; running 12:09:55")
    # the training restarts with the replacement pod, from the last checkpoint
    restore_checkpoint(rec, tau, 300, at("12:10:20"), at("12:10:52"))
    _train(rec, tau, _curve(at("12:14:00"), 6 * MINUTE, (300, 700, 1100, 1500, 1900), 0.98, 0.7),
           ((700, 16), (1100, 15), (1500, 17)), 6 * GIB)
    job.succeed(at("12:44:10"))


def unschedulable(rec: Rec) -> None:
    tau = _tau("sd-xl-3rp6f", "vision", "team-b", "sdxl/finetune-product-shots.yaml")
    created = tau_submit(rec, tau, at("12:51:26"), "Job", "team-b", tau.run_id)
    job = _job(rec, tau, "team-b", "diffusion-train:2026.08.20", backoff_limit=3)
    job.create(created)
    job.admit(at("12:51:31"))
    job.start(at("12:51:31.300"))
    message = ("0/8 nodes are available: 2 node(s) had untolerated taint {node.kubernetes.io/unschedulable: }, "
               "6 Insufficient nvidia.com/gpu. preemption: 0/8 nodes are available: 2 Preemption is not helpful "
               "for scheduling, 6 No preemption victims found for incoming pod.")
    t = at("12:51:31.700")
    delay = 1 * SECOND
    while t < at("12:59:55"):
        for i, pod in enumerate(job.live()):
            pod.unschedulable(t + 50 * i, message)
        t += delay
        delay = min(delay * 2, 2 * MINUTE)
    job.note(at("12:51:31.700"), "pods PodScheduled=False/Unschedulable; FailedScheduling events repeat until "
                                 "the capture ends")


def backoff_limit(rec: Rec) -> None:
    tau = _tau("dpo-sweep-7tj2h", "llm", "team-a", "dpo/sweep-beta-0.1.yaml")
    created = tau_submit(rec, tau, at("12:09:56"), "Job", "team-a", tau.run_id)
    job = _job(rec, tau, "team-a", "llm-train:2026.08.20", pods=1, backoff_limit=2)
    job.create(created)
    job.admit(at("12:10:02"))
    job.start(at("12:10:02.300"))
    job.bind(at("12:10:03"), NODES[3:4])
    job.run(at("12:10:09"), 4.1)
    t = at("12:11:52")
    for delay in (10, 20, 0):  # the Job controller's pod failure backoff: 10 s, then 20 s
        pod = job.live()[0]
        job.pod_failed(t, pod, 1, "Error")
        if not delay:
            break
        nxt = job.add_pod(t + delay * SECOND)
        job.write(t + delay * SECOND + 200)
        nxt.bind(t + delay * SECOND + 300, NODES[3])
        nxt.accept(t + delay * SECOND + 1100)
        nxt.run(t + (delay + 3) * SECOND, 0.7)
        job.write(t + (delay + 3) * SECOND + 400)
        t += (delay + 104) * SECOND
    job.fail(t + 1500)


def render_failed(rec: Rec) -> None:
    tau = _tau("seg-sam-4nb8x", "vision", "team-a", "sam/finetune-aerial.yaml")
    end = resolve(rec, tau, at("09:50:00"))
    start = end + 300
    rec.intake(start, b.rendering_event(event_id=intake_id(tau.run_id, "rendering", "started"),
                                        run_id=tau.run_id, when=start, status="started"))
    rec.intake(start + 900, b.rendering_event(
        event_id=intake_id(tau.run_id, "rendering", "failed"), run_id=tau.run_id, when=start + 900,
        status="failed", workload_kind="Job", namespace="team-a", name=tau.run_id, queue="team-a-lq",
        reason="ValidationFailed", message="spec.resources.gpus: must be a multiple of 8 for target h100-8x (got 12)"))
    rec.note(start + 900, f"{tau.run_id}: Rendering failed (ValidationFailed)")


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    run_ids: tuple[str, ...]
    build: Callable[[Rec], None] = field(repr=False)
    events_api: EventsApi = "v1"

    def streams(self) -> dict[str, list[Obj]]:
        """This scenario's watch and intake events, per stream, each stream in time order."""
        return {k: [w.record for w in v] for k, v in _cluster().by_scenario[self.name].items()}

    def notes(self) -> list[tuple[Ms, str]]:
        """Key moments (time, what), for the README and for writing expected histories."""
        return sorted(_cluster().notes[self.name], key=lambda n: n[0])


_RAY_RECORDERS = frozenset({SCHEDULER, KUEUE_ADMISSION, KUEUE_WORKLOAD, KUEUE_RAYJOB, RAYJOB_CONTROLLER,
                            RAYCLUSTER_CONTROLLER})

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("quick-success", "Admitted within seconds, 2 pods run, progress with a checkpoint, completes.",
             ("rn50-ft-k7q2m",), quick_success),
    Scenario("quota-wait", "Waits ~45 min for GPU quota (QuotaReserved=False/Pending), then runs and succeeds.",
             ("llama-sft-4xq9t",), quota_wait),
    Scenario("preemption", "A low-priority run is preempted by a high-priority Job without TauGrid labels, "
             "requeued, re-admitted and succeeds; the preemptor is its own run, keyed by its Job uid. Its training "
             "saves a checkpoint every 1000 steps; preempted 4 min after the last one, it restores it in its "
             "second attempt and goes on from its step.",
             ("bert-pt-2c5nw", b.uid("job", "team-a", "eval-hotfix-0820")), preemption),
    Scenario("podsready-timeout", "Image not found: ImagePullBackOff until the PodsReady timeout evicts it; "
             "requeued after the backoff, re-admitted, succeeds.", ("vit-l-9hx4d",), podsready_timeout),
    Scenario("deactivated", "Two PodsReady timeouts exceed backoffLimitCount=1: the Workload is deactivated and "
             "the Job stays suspended.", (DEACTIVATED_RUN,), deactivated),
    Scenario("rayjob-retry", "A RayJob (backoffLimit 1) under Kueue: the app fails, KubeRay retries on a new "
             "RayCluster, which restores the last checkpoint and succeeds. events.k8s.io/v1 Events.", ("rl-ppo-8mc2k",),
             rayjob_retry,
             "events.k8s.io/v1"),
    Scenario("oom-retry", "One pod is OOMKilled; the Job controller replaces it ~10 s later; the training "
             "restarts from its last checkpoint and succeeds. v1beta2 Workload.", ("whisper-ft-5gd7s",), oom_retry),
    Scenario("unschedulable", "Admitted, but the pods stay Unschedulable until the capture ends.",
             ("sd-xl-3rp6f",), unschedulable),
    Scenario("backoff-limit", "The container exits 1 three times (backoffLimit 2): Failed/BackoffLimitExceeded.",
             ("dpo-sweep-7tj2h",), backoff_limit),
    Scenario("render-failed", "Intake only: resolution succeeds, rendering fails validation.",
             ("seg-sam-4nb8x",), render_failed),
    Scenario("resumed", f"Resumes {DEACTIVATED_RUN} (taugrid.io/resume-of, and a Resume event from its "
             "training) with the image fixed; that run never saved a checkpoint, so it starts afresh; succeeds.",
             ("gpt-moe-tq3vb",), resumed),
    Scenario("reactivated", "A person deactivates the running Workload (spec.active=false): Kueue evicts it and "
             "stops the Job. Reactivated 40 min later, it waits for quota again, is re-admitted, restores the "
             "checkpoint saved 5 min before the deactivation and succeeds.",
             (REACTIVATED_RUN,), reactivated),
    Scenario("reactivated-waiting", "Deactivated by hand while running, reactivated 19 min later; still waiting "
             "for quota when the capture ends, 36 min after.", (REACTIVATED_WAITING_RUN,), reactivated_waiting),
)}


# --------------------------------------------------------------------------------------------------
# One cluster: every scenario's writes, with resourceVersions in commit order.

FIRST_RESOURCE_VERSION = 48_213_907


@dataclass(frozen=True)
class Cluster:
    streams: dict[str, list[Write]]  # the merged capture, per stream
    by_scenario: dict[str, dict[str, list[Write]]]
    notes: dict[str, list[tuple[Ms, str]]]


@cache
def _cluster() -> Cluster:
    tagged: list[tuple[Ms, int, int, str, Write]] = []
    notes: dict[str, list[tuple[Ms, str]]] = {}
    for i, sc in enumerate(SCENARIOS.values()):
        rec = Rec(sc.events_api, _RAY_RECORDERS if sc.events_api != "v1" else NEW_RECORDERS)
        sc.build(rec)
        notes[sc.name] = rec.notes
        tagged.extend((w.at, i, seq, sc.name, w) for seq, w in enumerate(rec.writes))
    tagged.sort(key=lambda x: x[:3])
    rv = FIRST_RESOURCE_VERSION
    streams: dict[str, list[Write]] = {s: [] for s in STREAMS}
    by_scenario: dict[str, dict[str, list[Write]]] = {s.name: {k: [] for k in STREAMS} for s in SCENARIOS.values()}
    written = dict.fromkeys(SCENARIOS, 0)  # object writes of each scenario so far (intake events have no version)
    for _at, _i, _seq, name, w in tagged:
        if w.stream != "intake":
            written[name] += 1
            # other writes of the cluster in between: drawn from the object write's rank in its scenario, so that
            # intake events added to a scenario change no resourceVersion
            rv += 1 + b.small_int(4, "rv", str(written[name]), name)
            w.record["object"]["metadata"]["resourceVersion"] = str(rv)
        streams[w.stream].append(w)
        by_scenario[name][w.stream].append(w)
    return Cluster(streams, by_scenario, notes)


def cluster_nodes() -> list[Obj]:
    """The Nodes the demo's pods run on (``NODES``), as ``kubectl get nodes -w --output-watch-events -o json`` lists
    them: one ADDED each, GPU-labelled as NVIDIA's GPU feature discovery labels them, Ready since before the day."""
    out = []
    for i, name in enumerate(NODES):
        created = at("07:40:00") + i * SECOND
        beat = b.ts(created + 60 * SECOND)
        labels = {"kubernetes.azure.com/agentpool": "h100", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                  "node.kubernetes.io/instance-type": "Standard_ND96isr_H100_v5", "nvidia.com/gpu.count": "8",
                  "nvidia.com/gpu.memory": "81559", **FLAVOR_NODE_LABELS,
                  "topology.kubernetes.io/zone": f"eastus-{1 + i % 3}"}
        conditions = [
            {"lastHeartbeatTime": beat, "lastTransitionTime": b.ts(created), "reason": "KubeletHasSufficientMemory",
             "message": "kubelet has sufficient memory available", "status": "False", "type": "MemoryPressure"},
            {"lastHeartbeatTime": beat, "lastTransitionTime": b.ts(created + 40 * SECOND), "reason": "KubeletReady",
             "message": "kubelet is posting ready status", "status": "True", "type": "Ready"}]
        resources: dict[str, str] = {"cpu": "96", "memory": "1900Gi", "nvidia.com/gpu": "8", "pods": "110"}
        allocatable: dict[str, str] = {**resources, "cpu": "94", "memory": "1820Gi"}
        out.append({"type": "ADDED", "object": {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"creationTimestamp": b.ts(created), "labels": labels, "name": name,
                         "resourceVersion": str(FIRST_RESOURCE_VERSION - 100 + i), "uid": b.uid("node", name)},
            "spec": {"providerID": f"azure:///subscriptions/x/virtualMachineScaleSets/aks-h100-36541870-vmss/"
                                   f"virtualMachines/{i}",
                     "taints": [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "value": "present"}]},
            "status": {"allocatable": allocatable, "capacity": resources,
                       "conditions": conditions,
                       "nodeInfo": {"kubeletVersion": "v1.31.2", "osImage": "Ubuntu 22.04.5 LTS"}}}})
    return out


def cluster_streams() -> dict[str, list[Obj]]:
    """The capture of the whole cluster: every scenario's events merged per stream, in commit order."""
    return {k: [w.record for w in v] for k, v in _cluster().streams.items()}
