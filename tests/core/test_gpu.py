"""GPU accounting (tracker/core/gpu.py, schemas/gpu-accounting.md): exact GPU-seconds of every bundled scenario,
a run deleted while queued, a live run, the pod resources read, and the laws over generated clusters: lost <= held,
and a run's totals are the sums of its attempts'."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given

from sim.builders import at
from sim.lifecycles import RunPlan, generate_cluster
from sim.scenarios import SCENARIOS, _cluster
from tests.core.test_reducer_laws import law_settings, plans
from tests.core.test_scenarios import fold_scenario
from tests.support.laws import fold
from tracker.core.gpu import ACCELERATOR_RESOURCES, Accelerators, goodput, held_hours, pod_gpus
from tracker.core.model import RunHistory
from tracker.core.reducer import Reducer

# scenario -> run id -> (gpus, GPU-seconds held, GPU-seconds lost by reason,
#                        per attempt: (gpus, GPU-seconds held, GPU-seconds lost by reason))
EXPECTED: dict[str, dict[str, tuple[int, float, dict[str, float], list[tuple[int, float, dict[str, float]]]]]] = {
    # success: two 8-GPU pods bound 09:02:07, finished 09:41:08 and 09:41:10; nothing lost
    "quick-success": {"rn50-ft-k7q2m": (16, 8 * (2341 + 2343), {}, [(16, 8 * (2341 + 2343), {})])},
    "quota-wait": {"llama-sft-4xq9t": (16, 8 * (2769 + 2771), {}, [(16, 8 * (2769 + 2771), {})])},
    # preemption: attempt 1 (bound 10:00:04, pods deleted 10:40:03) is lost to the preemption
    "preemption": {
        "bert-pt-2c5nw": (16, 16 * 2399 + 8 * (2541 + 2539), {"Preempted": 16 * 2399},
                          [(16, 16 * 2399, {"Preempted": 16 * 2399}), (16, 8 * (2541 + 2539), {})]),
        "e55428ce-5266-4f6d-8b5d-2ae542ca77c4": (16, 8 * (1785 + 1783), {}, [(16, 8 * (1785 + 1783), {})]),
    },
    # PodsReady timeout: attempt 1 (11:00:04 to 11:10:03) lost; attempt 2 succeeds
    "podsready-timeout": {
        "vit-l-9hx4d": (16, 16 * 599 + 8 * (2247 + 2245), {"PodsReadyTimeout": 16 * 599},
                        [(16, 16 * 599, {"PodsReadyTimeout": 16 * 599}), (16, 8 * (2247 + 2245), {})]),
    },
    # a second PodsReady timeout exceeds the requeuing limit: the deactivated attempt is lost as Evicted
    "deactivated": {
        "gpt-moe-6wz8r": (16, 16 * 599 + 16 * 600, {"PodsReadyTimeout": 16 * 599, "Evicted": 16 * 600},
                          [(16, 16 * 599, {"PodsReadyTimeout": 16 * 599}), (16, 16 * 600, {"Evicted": 16 * 600})]),
    },
    # OOM: the OOMKilled pod (12:00:03 to 12:09:41) was replaced: lost; the run succeeds
    "oom-retry": {
        "whisper-ft-5gd7s": (16, 8 * (578 + 2647 + 2060), {"PodFailure": 8 * 578},
                             [(16, 8 * (578 + 2647 + 2060), {"PodFailure": 8 * 578})]),
    },
    # backoff limit: two failed pods replaced (PodFailure), the last one's GPU-time lost with the failed run
    "backoff-limit": {
        "dpo-sweep-7tj2h": (8, 8 * (109 + 104 + 104), {"PodFailure": 8 * (109 + 104), "RunFailed": 8 * 104},
                            [(8, 8 * (109 + 104 + 104), {"PodFailure": 8 * (109 + 104), "RunFailed": 8 * 104})]),
    },
    # RayJob retry: the first RayCluster's two 8-GPU workers (10:14:04 to 10:41:22) are lost; head and submitter
    # request no GPU
    "rayjob-retry": {
        "rl-ppo-8mc2k": (16, 16 * 1638 + 16 * 1330, {"RayJobRetry": 16 * 1638},
                         [(16, 16 * 1638, {"RayJobRetry": 16 * 1638}), (16, 16 * 1330, {})]),
    },
    "reactivated": {
        "mixtral-sft-8pz3c": (16, 16 * 2039 + 8 * (1274 + 1276), {"Evicted": 16 * 2039},
                              [(16, 16 * 2039, {"Evicted": 16 * 2039}), (16, 8 * (1274 + 1276), {})]),
    },
    "reactivated-waiting": {
        "qwen-rm-5vt2j": (16, 16 * 899, {"Evicted": 16 * 899}, [(16, 16 * 899, {"Evicted": 16 * 899}), (0, 0, {})]),
    },
    "resumed": {"gpt-moe-tq3vb": (16, 8 * (2069 + 2067), {}, [(16, 8 * (2069 + 2067), {})])},
    # never admitted (pods created, never bound) and never submitted: nothing held
    "unschedulable": {"sd-xl-3rp6f": (0, 0, {}, [(0, 0, {})])},
    "render-failed": {"seg-sam-4nb8x": (0, 0, {}, [])},
}


def _s(hours: float) -> float:
    return round(hours * 3600, 3)


def _by(by: dict[str, float]) -> dict[str, float]:
    return {k: _s(v) for k, v in by.items()}


def test_every_scenario_has_gpu_expectations() -> None:
    assert set(EXPECTED) == set(SCENARIOS)
    for name, sc in SCENARIOS.items():
        assert set(EXPECTED[name]) == set(sc.run_ids)


def test_gpu_hours_of_every_scenario_are_exactly_as_expected() -> None:
    for name, runs in EXPECTED.items():
        red = fold_scenario(name)
        for run_id, (gpus, held, lost_by, attempts) in runs.items():
            h = red.history(run_id)
            assert h is not None
            got = (h.run.gpus, _s(h.run.gpu_hours), _by(h.run.lost_gpu_hours_by),
                   [(a.gpus, _s(a.gpu_hours), _by(a.lost_gpu_hours_by)) for a in h.attempts])
            assert got == (gpus, held, lost_by, attempts), (name, run_id)
            assert _s(h.run.lost_gpu_hours) == sum(lost_by.values())
            assert h.run.gpus_open == 0 and h.run.open_since is None  # every bundled run has ended or never bound
            _check_laws(h)


def test_pod_placements_carry_their_gpus_and_why_they_were_lost() -> None:
    h = fold_scenario("oom-retry").history("whisper-ft-5gd7s")
    assert h is not None
    rows = [(p.pod, p.gpus, p.released_at and p.released_at.strftime("%H:%M:%S"), _s(p.gpu_hours or 0), p.lost)
            for p in h.pods or () if p.attempt == 1]
    assert rows == [("whisper-ft-5gd7s-74cqx", 8, "12:09:41", 8 * 578, "PodFailure"),
                    ("whisper-ft-5gd7s-fzh9n", 8, "12:44:10", 8 * 2647, None),
                    ("whisper-ft-5gd7s-2xgdx", 8, "12:44:12", 8 * 2060, None)]


def _writes(name: str) -> list[Any]:
    return sorted((w for ws in _cluster().by_scenario[name].values() for w in ws), key=lambda w: w.at)


def test_a_run_deleted_while_queued_held_nothing() -> None:
    red = Reducer()
    last_job = None
    for w in _writes("quota-wait"):
        if w.at >= at("10:00:00"):  # still queued for quota: admitted at 10:05:30
            break
        red.apply(w.record, "quota-wait")
        if w.stream == "jobs":
            last_job = w.record
    assert last_job is not None
    gone = copy.deepcopy(last_job)
    gone["type"] = "DELETED"
    gone["object"]["metadata"]["deletionTimestamp"] = "2026-08-20T10:00:00Z"
    red.apply(gone, "quota-wait")
    h = red.history("llama-sft-4xq9t")
    assert h is not None and h.run.status.value == "stopped" and h.run.reason == "Deleted"
    assert (h.run.gpus, h.run.gpu_hours, h.run.lost_gpu_hours, h.run.lost_gpu_hours_by) == (0, 0.0, 0.0, {})
    assert [(a.gpus, a.gpu_hours) for a in h.attempts] == [(0, 0.0)]


def test_a_live_run_leaves_its_gpu_time_open_for_the_reader() -> None:
    red = Reducer()
    for w in _writes("quick-success"):
        if w.at >= at("09:20:00"):
            break
        red.apply(w.record, "quick-success")
    h = red.history("rn50-ft-k7q2m")
    assert h is not None and h.run.status.value == "running"
    assert (h.run.gpus, h.run.gpu_hours, h.run.gpus_open) == (16, 0.0, 16)
    assert h.run.open_since == datetime(2026, 8, 20, 9, 2, 7, tzinfo=UTC)
    assert [p.gpu_hours for p in h.pods or () if p.attempt == 1] == [None, None]
    now = datetime(2026, 8, 20, 9, 32, 7, tzinfo=UTC)
    assert held_hours(h.run.gpu_hours, h.run.gpus_open, h.run.open_since, now) == 8.0
    assert held_hours(h.run.gpu_hours, h.run.gpus_open, h.run.open_since, None) == 0.0


def test_pod_gpus_reads_requests_else_limits_of_every_container() -> None:
    spec = {"containers": [
        {"resources": {"requests": {"cpu": "8", "nvidia.com/gpu": "4"}, "limits": {"nvidia.com/gpu": "4"}}},
        {"resources": {"limits": {"nvidia.com/gpu": 2}}},
        {"resources": {"requests": {"nvidia.com/mig-1g.10gb": "1", "example.com/fpga": "3"}}},
        {"name": "no-resources"},
    ]}
    assert pod_gpus(spec) == 7
    assert pod_gpus(spec, Accelerators((*ACCELERATOR_RESOURCES, "example.com/fpga"))) == 10
    assert pod_gpus({"containers": [{"resources": {"requests": {"nvidia.com/gpu": "lots"}}}]}) == 0
    assert pod_gpus({}) == 0
    with pytest.raises(ValueError):
        pod_gpus({"containers": [{"resources": {"limits": {"nvidia.com/gpu": 1 << 63}}}]})


def test_goodput() -> None:
    assert goodput(0.0, 0.0) is None
    assert goodput(10.0, 2.5) == 0.75


def _check_laws(h: RunHistory) -> None:
    run = h.run
    assert 0 <= run.lost_gpu_hours <= run.gpu_hours + 1e-9
    assert run.gpu_hours == sum((a.gpu_hours for a in h.attempts), 0.0)
    assert run.lost_gpu_hours == sum((a.lost_gpu_hours for a in h.attempts), 0.0)
    assert run.gpus_open == sum(a.gpus_open for a in h.attempts)
    assert run.gpus == max((a.gpus for a in h.attempts), default=0)
    for a in h.attempts:
        assert 0 <= a.lost_gpu_hours <= a.gpu_hours + 1e-9
        assert abs(sum(a.lost_gpu_hours_by.values()) - a.lost_gpu_hours) < 1e-9
        pods = [p for p in h.pods or () if p.attempt == a.attempt]
        assert len(pods) == a.pod_count
        assert abs(sum(p.gpu_hours or 0.0 for p in pods) - a.gpu_hours) < 1e-9
        assert a.gpus_open == sum(p.gpus for p in pods if p.gpu_hours is None)
        assert a.gpus <= sum(p.gpus for p in pods)
    by: dict[str, float] = {}
    for a in h.attempts:
        for k, v in a.lost_gpu_hours_by.items():
            by[k] = by.get(k, 0.0) + v
    assert run.lost_gpu_hours_by == dict(sorted(by.items()))
    if run.status.value == "succeeded" or run.attempts == 0:
        assert "RunFailed" not in run.lost_gpu_hours_by
    if run.status.value == "failed":
        # every attempt of a failed run is lost, whatever else lost it first
        assert run.lost_gpu_hours == run.gpu_hours


@law_settings(80)
@given(plans())
def test_lost_never_exceeds_held_and_runs_sum_their_attempts(plan: list[RunPlan]) -> None:
    cluster = generate_cluster(plan)
    red = fold([ev for stream in cluster.streams.values() for ev in stream])
    for run_id in red.runs:
        h = red.history(run_id)
        assert h is not None
        _check_laws(h)
        exp = cluster.expected[run_id]
        if exp.status == "running":
            assert h.run.gpus_open > 0 or h.run.gpus == 0
        else:
            assert h.run.gpus_open == 0
        # an attempt preempted the second it was admitted held no GPU-time: nothing of it can be lost
        if any(a.end_reason in ("Preempted", "PodsReadyTimeout") and a.gpu_hours > 0 for a in h.attempts[:-1]):
            assert h.run.lost_gpu_hours > 0 or h.run.gpus == 0

