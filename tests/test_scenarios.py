# ruff: noqa: E501  (the expected rows below are a table, one row per line)
"""Exact expected histories of every bundled scenario, and the end-to-end replay of the demo capture.

Each scenario in tracker/samples/scenarios.py is written from the reference write sequences (see
tracker/captures/demo/README.md for its timeline); the expected rows below were checked against that timeline.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tracker.cli import DEMO_CAPTURES, main
from tracker.core.reducer import Reducer
from tracker.samples.scenarios import SCENARIOS
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
            {'status': 'stopped', 'reason': 'DeactivatedDueToRequeuingLimitExceeded', 'phase': 'Completion', 'attempts': 2, 'retries': 0, 'evictions': 2, 'admission_wait_s': 61.0},
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
                ('PodsReadyTimeout', 'DeactivatedDueToRequeuingLimitExceeded', None, 0, []),
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
        got_fields = h.run.model_dump(mode="json", include=set(fields))
        assert got_fields == fields
        assert [(t.attempt, t.phase.value, t.at.strftime("%H:%M:%S"), t.reason) for t in h.transitions] == transitions
        assert [(a.trigger, a.end_reason, a.underlying_cause, a.retries, [f.reason for f in a.failures])
                for a in h.attempts] == attempts
        # the models round-trip through validation: derive builds valid values
        assert type(h).model_validate(h.model_dump()) == h


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
                assert index.history(run_id) == red.history(run_id), run_id
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
    assert [r["run_id"] for r in runs] == list(SCENARIOS["unschedulable"].run_ids)
    required = {"run_id", "kind", "namespace", "name", "status", "reason", "phase", "attempts", "retries",
                "evictions", "queued_at", "admitted_at", "started_at", "finished_at", "admission_wait_s"}
    assert required <= set(runs[0])
    assert runs[0]["queued_at"].endswith("Z") and runs[0]["finished_at"] is None
    assert main(["runs", "--index", str(index_path), "--json", "--stalled-admission", "30m",
                 "--now", "2026-08-20T09:55:00Z"]) == 0
    assert json.loads(capsys.readouterr().out) == []  # nothing is pending in Admission at the end
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
