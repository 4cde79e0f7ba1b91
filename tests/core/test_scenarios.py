# ruff: noqa: E501  (the expected rows below are a table, one row per line)
"""Exact expected histories of every bundled scenario, and the end-to-end replay of the demo capture.

Each scenario in sim/scenarios.py is written from the reference write sequences (see
tracker/captures/demo/README.md for its timeline); the expected rows below were checked against that timeline.
"""

from __future__ import annotations

import copy
import json
import random
import sqlite3
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from sim.builders import at
from sim.scenarios import SCENARIOS, _cluster
from sim.simulators import Write
from tests.support.histories import stored
from tests.support.laws import by_object, fold, histories
from tracker.cli import main
from tracker.cli.args import DEMO_CAPTURES
from tracker.core.derive import may_reopen
from tracker.core.model import RunHistory, load, to_json
from tracker.core.reducer import Reducer
from tracker.read.timeline import timeline
from tracker.shell.index import ExperimentIndex

# scenario -> run id -> (run fields, transitions (attempt, phase, HH:MM:SS, reason),
#                        attempts (trigger, end reason, underlying cause, retries, failure reasons))
EXPECTED: dict[str, dict[str, tuple[dict[str, Any], list[tuple[int, str, str, str]],
                                    list[tuple[str, str | None, str | None, int, list[str]]]]]] = {
    'quick-success': {
        'rn50-ft-k7q2m': (
            {'status': 'succeeded', 'reason': 'CompletionsReached', 'phase': 'Completion', 'attempts': 1, 'retries': 0, 'evictions': 0, 'admission_wait_s': 3.0},
            [
                (1, 'Resolution', '09:02:00', 'ResolutionStarted'),
                (1, 'Rendering', '09:02:01', 'RenderingStarted'),
                (1, 'Admission', '09:02:03', 'Submitted'),
                (1, 'Scheduling', '09:02:06', 'Admitted'),
                (1, 'Runtime', '09:02:07', 'PodsScheduled'),
                (1, 'Progress', '09:05:10', 'FirstStep'),
                (1, 'Completion', '09:41:12', 'CompletionsReached'),
            ],
            [
                ('Submitted', 'CompletionsReached', None, 0, []),
            ],
        ),
    },
    'quota-wait': {
        'llama-sft-4xq9t': (
            {'status': 'succeeded', 'reason': 'CompletionsReached', 'phase': 'Completion', 'attempts': 1, 'retries': 0, 'evictions': 0, 'admission_wait_s': 2727.0},
            [
                (1, 'Resolution', '09:20:00', 'ResolutionStarted'),
                (1, 'Rendering', '09:20:01', 'RenderingStarted'),
                (1, 'Admission', '09:20:03', 'Submitted'),
                (1, 'Scheduling', '10:05:30', 'Admitted'),
                (1, 'Runtime', '10:05:31', 'PodsScheduled'),
                (1, 'Progress', '10:10:00', 'FirstStep'),
                (1, 'Completion', '10:51:44', 'CompletionsReached'),
            ],
            [
                ('Submitted', 'CompletionsReached', None, 0, []),
            ],
        ),
    },
    'preemption': {
        'bert-pt-2c5nw': (
            {'status': 'succeeded', 'reason': 'CompletionsReached', 'phase': 'Completion', 'attempts': 2, 'retries': 0, 'evictions': 1, 'admission_wait_s': 1799.0},
            [
                (1, 'Resolution', '09:59:56', 'ResolutionStarted'),
                (1, 'Rendering', '09:59:57', 'RenderingStarted'),
                (1, 'Admission', '09:59:59', 'Submitted'),
                (1, 'Scheduling', '10:00:03', 'Admitted'),
                (1, 'Runtime', '10:00:04', 'PodsScheduled'),
                (1, 'Progress', '10:05:00', 'FirstStep'),
                (2, 'Admission', '10:40:01', 'Preempted'),
                (2, 'Scheduling', '11:10:00', 'Admitted'),
                (2, 'Runtime', '11:10:01', 'PodsScheduled'),
                (2, 'Progress', '11:15:00', 'FirstStep'),
                (2, 'Completion', '11:52:24', 'CompletionsReached'),
            ],
            [
                ('Submitted', 'Preempted', None, 0, []),
                ('Preempted', 'CompletionsReached', None, 0, []),
            ],
        ),
        'e55428ce-5266-4f6d-8b5d-2ae542ca77c4': (
            {'status': 'succeeded', 'reason': 'CompletionsReached', 'phase': 'Completion', 'attempts': 1, 'retries': 0, 'evictions': 0, 'admission_wait_s': 6.0},
            [
                (1, 'Admission', '10:40:00', 'Submitted'),
                (1, 'Scheduling', '10:40:06', 'Admitted'),
                (1, 'Runtime', '10:40:07', 'PodsScheduled'),
                (1, 'Completion', '11:09:54', 'CompletionsReached'),
            ],
            [
                ('Submitted', 'CompletionsReached', None, 0, []),
            ],
        ),
    },
    'podsready-timeout': {
        'vit-l-9hx4d': (
            {'status': 'succeeded', 'reason': 'CompletionsReached', 'phase': 'Completion', 'attempts': 2, 'retries': 0, 'evictions': 1, 'admission_wait_s': 61.0},
            [
                (1, 'Resolution', '10:59:56', 'ResolutionStarted'),
                (1, 'Rendering', '10:59:57', 'RenderingStarted'),
                (1, 'Admission', '10:59:59', 'Submitted'),
                (1, 'Scheduling', '11:00:03', 'Admitted'),
                (1, 'Runtime', '11:00:04', 'PodsScheduled'),
                (2, 'Admission', '11:10:03', 'PodsReadyTimeout'),
                (2, 'Scheduling', '11:11:04', 'Admitted'),
                (2, 'Runtime', '11:11:05', 'PodsScheduled'),
                (2, 'Progress', '11:16:00', 'FirstStep'),
                (2, 'Completion', '11:48:34', 'CompletionsReached'),
            ],
            [
                ('Submitted', 'PodsReadyTimeout', 'WaitForStart', 0, []),
                ('PodsReadyTimeout', 'CompletionsReached', None, 0, []),
            ],
        ),
    },
    'deactivated': {
        'gpt-moe-6wz8r': (
            {'status': 'stopped', 'reason': 'DeactivatedDueToRequeuingLimitExceeded', 'phase': 'Completion', 'attempts': 2, 'retries': 0, 'evictions': 2, 'admission_wait_s': 61.0,
             'finished_at': '2026-08-20T11:41:03Z'},
            [
                (1, 'Resolution', '11:19:56', 'ResolutionStarted'),
                (1, 'Rendering', '11:19:57', 'RenderingStarted'),
                (1, 'Admission', '11:19:59', 'Submitted'),
                (1, 'Scheduling', '11:20:02', 'Admitted'),
                (1, 'Runtime', '11:20:03', 'PodsScheduled'),
                (2, 'Admission', '11:30:02', 'PodsReadyTimeout'),
                (2, 'Scheduling', '11:31:03', 'Admitted'),
                (2, 'Runtime', '11:31:04', 'PodsScheduled'),
                (2, 'Completion', '11:41:03', 'DeactivatedDueToRequeuingLimitExceeded'),
            ],
            [
                ('Submitted', 'PodsReadyTimeout', 'WaitForStart', 0, []),
                ('PodsReadyTimeout', 'DeactivatedDueToRequeuingLimitExceeded', 'RequeuingLimitExceeded', 0, []),
            ],
        ),
    },
    'rayjob-retry': {
        'rl-ppo-8mc2k': (
            {'status': 'succeeded', 'reason': 'Succeeded', 'phase': 'Completion', 'attempts': 2, 'retries': 0, 'evictions': 0, 'admission_wait_s': 4.0},
            [
                (1, 'Resolution', '10:13:56', 'ResolutionStarted'),
                (1, 'Rendering', '10:13:57', 'RenderingStarted'),
                (1, 'Admission', '10:13:59', 'Submitted'),
                (1, 'Scheduling', '10:14:03', 'Admitted'),
                (1, 'Runtime', '10:14:04', 'PodsScheduled'),
                (1, 'Progress', '10:14:54', 'RayJobRunning'),
                (2, 'Scheduling', '10:41:24', 'RayJobRetry'),
                (2, 'Runtime', '10:41:26', 'PodsScheduled'),
                (2, 'Progress', '10:41:35', 'RayJobRunning'),
                (2, 'Completion', '11:02:33', 'Succeeded'),
            ],
            [
                ('Submitted', 'AppFailed', None, 0, []),
                ('RayJobRetry', 'Succeeded', None, 0, []),
            ],
        ),
    },
    'oom-retry': {
        'whisper-ft-5gd7s': (
            {'status': 'succeeded', 'reason': 'CompletionsReached', 'phase': 'Completion', 'attempts': 1, 'retries': 1, 'evictions': 0, 'admission_wait_s': 3.0},
            [
                (1, 'Resolution', '11:59:56', 'ResolutionStarted'),
                (1, 'Rendering', '11:59:57', 'RenderingStarted'),
                (1, 'Admission', '11:59:59', 'Submitted'),
                (1, 'Scheduling', '12:00:02', 'Admitted'),
                (1, 'Runtime', '12:00:03', 'PodsScheduled'),
                (1, 'Progress', '12:03:00', 'FirstStep'),
                (1, 'Completion', '12:44:14', 'CompletionsReached'),
            ],
            [
                ('Submitted', 'CompletionsReached', None, 1, ['OOMKilled']),
            ],
        ),
    },
    'unschedulable': {
        'sd-xl-3rp6f': (
            {'status': 'pending', 'reason': 'Unschedulable', 'phase': 'Scheduling', 'attempts': 1, 'retries': 0, 'evictions': 0, 'admission_wait_s': 2.0},
            [
                (1, 'Resolution', '12:51:26', 'ResolutionStarted'),
                (1, 'Rendering', '12:51:27', 'RenderingStarted'),
                (1, 'Admission', '12:51:29', 'Submitted'),
                (1, 'Scheduling', '12:51:31', 'Admitted'),
            ],
            [
                ('Submitted', None, None, 0, []),
            ],
        ),
    },
    'backoff-limit': {
        'dpo-sweep-7tj2h': (
            {'status': 'failed', 'reason': 'BackoffLimitExceeded', 'phase': 'Completion', 'attempts': 1, 'retries': 2, 'evictions': 0, 'admission_wait_s': 3.0},
            [
                (1, 'Resolution', '12:09:56', 'ResolutionStarted'),
                (1, 'Rendering', '12:09:57', 'RenderingStarted'),
                (1, 'Admission', '12:09:59', 'Submitted'),
                (1, 'Scheduling', '12:10:02', 'Admitted'),
                (1, 'Runtime', '12:10:03', 'PodsScheduled'),
                (1, 'Completion', '12:15:52', 'BackoffLimitExceeded'),
            ],
            [
                ('Submitted', 'BackoffLimitExceeded', None, 2, ['Error', 'Error', 'Error']),
            ],
        ),
    },
    'render-failed': {
        'seg-sam-4nb8x': (
            {'status': 'failed', 'reason': 'ValidationFailed', 'phase': 'Completion', 'attempts': 0, 'retries': 0, 'evictions': 0, 'admission_wait_s': None},
            [
                (1, 'Resolution', '09:50:00', 'ResolutionStarted'),
                (1, 'Rendering', '09:50:01', 'RenderingStarted'),
                (1, 'Completion', '09:50:02', 'ValidationFailed'),
            ],
            [
            ],
        ),
    },
    'reactivated': {
        'mixtral-sft-8pz3c': (
            {'status': 'succeeded', 'reason': 'CompletionsReached', 'phase': 'Completion', 'attempts': 2, 'retries': 0, 'evictions': 1, 'admission_wait_s': 785.0,
             'queued_at': '2026-08-20T10:20:00Z', 'admitted_at': '2026-08-20T10:33:05Z', 'finished_at': '2026-08-20T10:54:24Z'},
            [
                (1, 'Resolution', '09:05:56', 'ResolutionStarted'),
                (1, 'Rendering', '09:05:57', 'RenderingStarted'),
                (1, 'Admission', '09:05:59', 'Submitted'),
                (1, 'Scheduling', '09:06:02', 'Admitted'),
                (1, 'Runtime', '09:06:03', 'PodsScheduled'),
                (1, 'Progress', '09:10:00', 'FirstStep'),
                (1, 'Completion', '09:40:00', 'Deactivated'),
                (2, 'Admission', '10:20:00', 'Reactivated'),
                (2, 'Scheduling', '10:33:05', 'Admitted'),
                (2, 'Runtime', '10:33:06', 'PodsScheduled'),
                (2, 'Progress', '10:35:00', 'FirstStep'),
                (2, 'Completion', '10:54:24', 'CompletionsReached'),
            ],
            [
                ('Submitted', 'Deactivated', None, 0, []),
                ('Deactivated', 'CompletionsReached', None, 0, []),
            ],
        ),
    },
    'reactivated-waiting': {
        'qwen-rm-5vt2j': (
            {'status': 'pending', 'reason': 'Pending', 'phase': 'Admission', 'attempts': 2, 'retries': 0, 'evictions': 1, 'admission_wait_s': None,
             'queued_at': '2026-08-20T12:24:00Z', 'admitted_at': None, 'finished_at': None, 'pending_reason': 'Pending'},
            [
                (1, 'Resolution', '11:49:56', 'ResolutionStarted'),
                (1, 'Rendering', '11:49:57', 'RenderingStarted'),
                (1, 'Admission', '11:49:59', 'Submitted'),
                (1, 'Scheduling', '11:50:02', 'Admitted'),
                (1, 'Runtime', '11:50:03', 'PodsScheduled'),
                (1, 'Progress', '11:54:00', 'FirstStep'),
                (1, 'Completion', '12:05:00', 'Deactivated'),
                (2, 'Admission', '12:24:00', 'Reactivated'),
            ],
            [
                ('Submitted', 'Deactivated', None, 0, []),
                ('Deactivated', None, None, 0, []),
            ],
        ),
    },
    'resumed': {
        'gpt-moe-tq3vb': (
            {'status': 'succeeded', 'reason': 'CompletionsReached', 'phase': 'Completion', 'attempts': 1, 'retries': 0, 'evictions': 0, 'admission_wait_s': 3.0},
            [
                (1, 'Resolution', '12:04:56', 'ResolutionStarted'),
                (1, 'Rendering', '12:04:57', 'RenderingStarted'),
                (1, 'Admission', '12:04:59', 'Submitted'),
                (1, 'Scheduling', '12:05:02', 'Admitted'),
                (1, 'Runtime', '12:05:03', 'PodsScheduled'),
                (1, 'Progress', '12:08:00', 'FirstStep'),
                (1, 'Completion', '12:39:34', 'CompletionsReached'),
            ],
            [
                ('Submitted', 'CompletionsReached', None, 0, []),
            ],
        ),
    },
}


def fold_scenario(name: str) -> Reducer:
    red = Reducer()
    for stream in SCENARIOS[name].streams().values():
        for ev in stream:
            red.apply(ev, name)
    return red


def test_every_scenario_has_an_expectation() -> None:
    assert set(EXPECTED) == set(SCENARIOS)
    for name, sc in SCENARIOS.items():
        assert set(EXPECTED[name]) == set(sc.run_ids)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_history_is_exactly_as_expected(name: str) -> None:
    red = fold_scenario(name)
    assert red.stats.dead_letters == 0
    assert sorted(red.runs) == sorted(EXPECTED[name])
    for run_id, (fields, transitions, attempts) in EXPECTED[name].items():
        h = red.history(run_id)
        assert h is not None
        got_fields = {k: v for k, v in to_json(h.run).items() if k in fields}
        assert got_fields == fields
        assert [(t.attempt, t.phase.value, t.at.strftime("%H:%M:%S"), t.reason) for t in h.transitions] == transitions
        assert [(a.trigger, a.end_reason, a.underlying_cause, a.retries, [f.reason for f in a.failures])
                for a in h.attempts] == attempts
        # the models round-trip through validation: derive builds valid values
        assert load(RunHistory, to_json(h)) == h


def test_scenario_details() -> None:
    """Facts a reader of the index relies on, beyond the transition rows."""
    oom = fold_scenario("oom-retry").history("whisper-ft-5gd7s")
    assert oom is not None
    [failure] = oom.attempts[0].failures
    assert (failure.reason, failure.exit_code, failure.pod) == ("OOMKilled", 137, "whisper-ft-5gd7s-74cqx")
    quick = fold_scenario("quick-success").history("rn50-ft-k7q2m")
    assert quick is not None
    assert quick.run.last_checkpoint and quick.run.output_uri and quick.run.git_commit and quick.run.config_digest
    assert {m.metric for m in quick.metrics} >= {"loss"}
    loss = next(m for m in quick.metrics if m.metric == "loss")
    assert loss.first_step < loss.latest_step and loss.points >= 2
    resumed = fold_scenario("resumed")
    [run_id] = SCENARIOS["resumed"].run_ids
    h = resumed.history(run_id)
    assert h is not None and h.run.resume_of == SCENARIOS["deactivated"].run_ids[0]
    assert [link.resume_of for link in h.resume_links] == [h.run.resume_of]
    stuck = fold_scenario("unschedulable").history(SCENARIOS["unschedulable"].run_ids[0])
    assert (stuck is not None and "Insufficient" in stuck.run.message) or "nodes are available" in stuck.run.message
    quota = fold_scenario("quota-wait")
    h2 = quota.history("llama-sft-4xq9t")
    assert h2 is not None and h2.attempts[0].admission_wait_s == 2727.0


def test_demo_capture_replays_to_the_same_histories_as_each_scenario(tmp_path: Path) -> None:
    index_path = tmp_path / "index.sqlite"
    assert main(["replay", str(DEMO_CAPTURES), "--index", str(index_path)]) == 0
    with ExperimentIndex(index_path) as index:
        for name in SCENARIOS:
            red = fold_scenario(name)
            for run_id in SCENARIOS[name].run_ids:
                assert stored(index).history(run_id) == red.history(run_id), run_id
    assert not (tmp_path / "index.dead-letters.jsonl").exists()


def _dump(path: Path) -> list[tuple[str, list[Any]]]:
    con = sqlite3.connect(path)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        return [(t, sorted(map(repr, con.execute(f"SELECT * FROM {t}")))) for t in tables]
    finally:
        con.close()


def test_replaying_twice_into_the_same_index_changes_nothing(tmp_path: Path) -> None:
    index_path = tmp_path / "index.sqlite"
    assert main(["replay", str(DEMO_CAPTURES), "--index", str(index_path)]) == 0
    first = _dump(index_path)
    assert main(["replay", str(DEMO_CAPTURES), "--index", str(index_path)]) == 0
    assert _dump(index_path) == first


def test_runs_json_and_show_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index_path = tmp_path / "index.sqlite"
    assert main(["replay", str(DEMO_CAPTURES), "--index", str(index_path)]) == 0
    capsys.readouterr()
    assert main(["runs", "--index", str(index_path), "--json", "--status", "pending"]) == 0
    runs = json.loads(capsys.readouterr().out)
    pending = {*SCENARIOS["unschedulable"].run_ids, *SCENARIOS["reactivated-waiting"].run_ids}
    assert {r["run_id"] for r in runs} == pending
    required = {"run_id", "kind", "namespace", "name", "status", "reason", "phase", "attempts", "retries",
                "evictions", "queued_at", "admitted_at", "started_at", "finished_at", "admission_wait_s"}
    assert required <= set(runs[0])
    assert runs[0]["queued_at"].endswith("Z") and runs[0]["finished_at"] is None
    assert main(["runs", "--index", str(index_path), "--json", "--stalled-admission", "30m",
                 "--now", "2026-08-20T09:55:00Z"]) == 0
    assert json.loads(capsys.readouterr().out) == []  # nothing was pending in Admission that long at 09:55
    assert main(["runs", "--index", str(index_path), "--json", "--stalled-admission", "30m",
                 "--now", "2026-08-20T13:00:00Z"]) == 0
    # queued again at its reactivation (12:24): waiting 36 minutes when the capture ends (the demo's example)
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == list(SCENARIOS["reactivated-waiting"].run_ids)
    assert main(["show", "bert-pt-2c5nw", "--index", str(index_path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(t["attempt"], t["phase"]) for t in shown["transitions"]][-1] == (2, "Completion")
    assert all(set(t) >= {"at", "phase", "attempt", "reason"} for t in shown["transitions"])
    assert main(["show", "no-such-run", "--index", str(index_path)]) == 1


def test_demo_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index_path = tmp_path / "demo.sqlite"
    assert main(["demo", "--index", str(index_path)]) == 0
    out = capsys.readouterr().out
    assert "bert-pt-2c5nw" in out and "RayJobRetry" in out and str(index_path.resolve()) in out


# ------------------------------------------------------------------------------------------ deactivation, reactivation


def _writes(name: str) -> list[Write]:
    return sorted((w for stream in _cluster().by_scenario[name].values() for w in stream), key=lambda w: w.at)


def _fold_writes(writes: Iterable[Write]) -> Reducer:
    red = Reducer()
    for w in writes:
        red.apply(w.record, "t")
    assert red.stats.dead_letters == 0
    return red


def _history(red: Reducer, run_id: str) -> RunHistory:
    h = red.history(run_id)
    assert h is not None
    return h


def _last(name: str, kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(w.record["object"] for w in reversed(_writes(name)) if w.stream != "intake"
                              and w.record["object"]["kind"] == kind))


def _set_condition(obj: dict[str, Any], type_: str, status: str, reason: str, message: str, when: str) -> None:
    conds = [c for c in obj["status"]["conditions"] if c["type"] != type_]
    obj["status"]["conditions"] = [*conds, {"type": type_, "status": status, "reason": reason, "message": message,
                                            "lastTransitionTime": when}]


def test_reactivation_reopens_a_deactivated_run_and_clears_its_end() -> None:
    """While deactivated the run is stopped; reactivated, it is pending in Admission again, in a new attempt
    queued at the reactivation; and the stale 'The workload is deactivated' is not what it waits for."""
    writes = _writes("reactivated")
    [run_id] = SCENARIOS["reactivated"].run_ids
    deactivated = _history(_fold_writes(w for w in writes if w.at < at("10:00:00")), run_id)
    assert (deactivated.run.status, deactivated.run.phase, deactivated.run.reason) == ("stopped", "Completion",
                                                                                       "Deactivated")
    assert deactivated.run.finished_at == datetime(2026, 8, 20, 9, 40, tzinfo=UTC)
    # reactivated, and the scheduler has not tried it yet
    queued = _history(_fold_writes(w for w in writes if w.at <= at("10:20:00.300")), run_id)
    assert (queued.run.status, queued.run.phase, queued.run.attempts) == ("pending", "Admission", 2)
    assert queued.run.finished_at is None
    assert queued.run.queued_at == datetime(2026, 8, 20, 10, 20, tzinfo=UTC)
    assert (queued.run.reason, queued.run.pending_reason, queued.run.pending_message) == ("Queued", None, "")
    assert [(a.trigger, a.queued_at, a.end_reason) for a in queued.attempts][1:] == [
        ("Deactivated", datetime(2026, 8, 20, 10, 20, tzinfo=UTC), None)]
    # and it says why once Kueue's scheduler has tried
    waiting = _history(_fold_writes(w for w in writes if w.at <= at("10:21:00")), run_id)
    assert waiting.run.pending_reason == "Pending" and "insufficient unused quota" in waiting.run.pending_message


def test_a_relist_that_lost_the_deactivation_still_reopens_at_the_reactivation() -> None:
    """Workload states between the deactivation and the re-admission unseen (a relist): the re-admitted
    Workload still carries Requeued=True/Reactivated, so the new attempt is queued at the reactivation."""
    [run_id] = SCENARIOS["reactivated"].run_ids
    lost = [w for w in _writes("reactivated")
            if not (w.stream == "workloads" and at("09:39:00") < w.at < at("10:33:05"))]
    h = _history(_fold_writes(lost), run_id)
    assert [(a.trigger, a.queued_at, a.admitted_at, a.end_reason) for a in h.attempts] == [
        ("Submitted", datetime(2026, 8, 20, 9, 5, 59, tzinfo=UTC), datetime(2026, 8, 20, 9, 6, 2, tzinfo=UTC), None),
        ("Deactivated", datetime(2026, 8, 20, 10, 20, tzinfo=UTC), datetime(2026, 8, 20, 10, 33, 5, tzinfo=UTC),
         "CompletionsReached")]
    assert h.run.evictions == 1 and h.run.admission_wait_s == 785.0


def test_a_readmission_after_a_deactivation_is_a_new_attempt_even_without_the_reactivation() -> None:
    """No Requeued=True/Reactivated in any record (e.g. it was overwritten before the watcher saw it): the
    re-admission still opens an attempt triggered by the deactivation, with no queue time to report."""
    [run_id] = SCENARIOS["reactivated"].run_ids
    writes = []
    for w in _writes("reactivated"):
        if w.stream == "workloads":
            w = copy.deepcopy(w)
            status = w.record["object"].get("status") or {}
            status["conditions"] = [c for c in status.get("conditions", ()) if c["reason"] != "Reactivated"]
        writes.append(w)
    h = _history(_fold_writes(writes), run_id)
    assert [(a.trigger, a.queued_at is None, a.end_reason) for a in h.attempts] == [
        ("Submitted", False, "Deactivated"), ("Deactivated", True, "CompletionsReached")]
    assert [(t.attempt, t.phase.value, t.reason) for t in h.transitions][6:8] == [
        (1, "Completion", "Deactivated"), (2, "Scheduling", "Admitted")]


def test_a_derived_deactivation_reason_reopens_too() -> None:
    """Kueue before kubernetes-sigs/kueue#14874 (v0.12-v0.17) writes Requeued=True/Reactivated only when the
    deactivation reason is exactly Deactivated; with the fix, DeactivatedDueTo<Cause> is reactivated as well."""
    [run_id] = SCENARIOS["deactivated"].run_ids
    wl = _last("deactivated", "Workload")
    wl["spec"]["active"] = True
    _set_condition(wl, "Requeued", "True", "Reactivated", "The workload was reactivated", "2026-08-20T12:30:00Z")
    red = _fold_writes(_writes("deactivated"))
    red.apply({"type": "MODIFIED", "object": wl}, "t")
    h = _history(red, run_id)
    assert (h.run.status, h.run.phase, h.run.finished_at, h.run.evictions) == ("pending", "Admission", None, 2)
    assert [(a.trigger, a.end_reason) for a in h.attempts][2:] == [("DeactivatedDueToRequeuingLimitExceeded", None)]


def test_deletion_stays_final() -> None:
    """A deactivated run whose Job is deleted is stopped for good: a later reactivation of its (finalizer-held)
    Workload does not reopen it. A reactivated run deleted while it waits is stopped as Deleted."""
    [run_id] = SCENARIOS["deactivated"].run_ids
    job = _last("deactivated", "Job")
    job["metadata"]["deletionTimestamp"] = "2026-08-20T12:00:00Z"
    wl = _last("deactivated", "Workload")
    _set_condition(wl, "Requeued", "True", "Reactivated", "The workload was reactivated", "2026-08-20T12:00:05Z")
    red = _fold_writes(_writes("deactivated"))
    for rec in ({"type": "DELETED", "object": job}, {"type": "MODIFIED", "object": wl}):
        red.apply(rec, "t")
    h = _history(red, run_id)
    assert (h.run.status, h.run.reason, h.run.phase) == ("stopped", "DeactivatedDueToRequeuingLimitExceeded",
                                                         "Completion")
    assert h.run.finished_at == datetime(2026, 8, 20, 11, 41, 3, tzinfo=UTC) and h.run.attempts == 2

    [waiting_id] = SCENARIOS["reactivated-waiting"].run_ids
    job = _last("reactivated-waiting", "Job")
    job["metadata"]["deletionTimestamp"] = "2026-08-20T12:50:00Z"
    red = _fold_writes(_writes("reactivated-waiting"))
    red.apply({"type": "DELETED", "object": job}, "t")
    h = _history(red, waiting_id)
    assert (h.run.status, h.run.reason, h.run.phase, h.run.attempts) == ("stopped", "Deleted", "Completion", 2)
    assert [(t.attempt, t.phase.value, t.reason) for t in h.transitions][-3:] == [
        (1, "Completion", "Deactivated"), (2, "Admission", "Reactivated"), (2, "Completion", "Deleted")]


@pytest.mark.parametrize("name", ["reactivated", "reactivated-waiting"])
def test_reactivation_histories_do_not_depend_on_arrival_order(name: str) -> None:
    """Each object's records kept in order, the objects interleaved at random, everything delivered twice."""
    seqs = by_object(SCENARIOS[name].streams())
    want = histories(fold(ev for seq in seqs for ev in seq))
    for seed in range(5):
        rng = random.Random(seed)
        queues = [list(seq) * 2 for seq in seqs]
        order = []
        while any(queues):
            q = rng.choice([q for q in queues if q])
            order.append(q.pop(0))
        assert histories(fold(order)) == want


def test_the_timeline_shows_the_deactivated_interval() -> None:
    [run_id] = SCENARIOS["reactivated"].run_ids
    h = fold_scenario("reactivated").history(run_id)
    assert h is not None
    console = Console(record=True, width=140, color_system=None)
    console.print(timeline(h, width=140))
    lines = console.export_text().splitlines()
    stopped = next(line for line in lines if line.lstrip().startswith("Completion") and "┄" in line)
    assert "40m00s" in stopped and "stopped until reactivated: Deactivated" in stopped
    header = next(line for line in lines if "attempt 2" in line)
    assert "trigger Deactivated" in header and "waited 13m05s for admission" in header
    assert any("Reactivated: The workload was reactivated" in line for line in lines)
    # attempt 1's pending rows and GPU line, attempt 2's header, its five phases, its pending rows and its GPU
    # line, then the legend
    def at(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    first_gpus, second = at("16 GPUs · 9.06 GPU-h held · 9.06 lost (Evicted 9.06)"), lines.index(header)
    assert lines.index(stopped) < first_gpus < second
    assert all(line.startswith("   ") for line in lines[lines.index(stopped) + 1:first_gpus])  # steps, spans
    second_gpus = at("16 GPUs · 5.67 GPU-h held")
    assert second + 5 < second_gpus and any("┄ deactivated" in line for line in lines[second_gpus + 1:])


def test_a_deactivated_run_may_reopen_until_its_job_is_deleted() -> None:
    """What a consumer that frees finished runs (the Kafka reducer's retirement) must ask before it does."""
    [run_id] = SCENARIOS["deactivated"].run_ids
    red = fold_scenario("deactivated")
    assert may_reopen(red.runs[run_id], _history(red, run_id).run)
    job = _last("deactivated", "Job")
    job["metadata"]["deletionTimestamp"] = "2026-08-20T12:00:00Z"
    red.apply({"type": "DELETED", "object": job}, "t")
    assert not may_reopen(red.runs[run_id], _history(red, run_id).run)
    for name in ("quick-success", "backoff-limit", "reactivated", "reactivated-waiting", "unschedulable"):
        done = fold_scenario(name)
        assert not any(may_reopen(done.runs[rid], _history(done, rid).run) for rid in SCENARIOS[name].run_ids)


def test_a_requeued_attempt_runs_no_pod_before_it_is_admitted() -> None:
    """Pods placed in the waiting attempt by their creation times (here, as an API server that received the writes
    hours later stamps them) do not make it run: Kueue keeps the Job suspended until it admits it again."""
    [run_id] = SCENARIOS["reactivated-waiting"].run_ids
    writes = []
    for w in _writes("reactivated-waiting"):
        if w.stream == "pods":
            w = copy.deepcopy(w)
            w.record["object"]["metadata"]["creationTimestamp"] = "2026-08-20T15:00:00Z"
        writes.append(w)
    h = _history(_fold_writes(writes), run_id)
    assert (h.run.status, h.run.phase, h.attempts[-1].started_at) == ("pending", "Admission", None)
