"""Human output (runs table, timeline) rendered to text, and the JSON shapes of `runs` and `show`."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rich.console import Console, RenderableType

from tracker.core.model import (
    Attempt,
    MetricSummary,
    Phase,
    PodFailure,
    PodPlacement,
    ResumeLink,
    RunHistory,
    RunRecord,
    Status,
    Transition,
    field_names,
)
from tracker.read.render import history_json, human_duration, hyperparameters_text, runs_json, runs_table
from tracker.read.timeline import timeline

T0 = datetime(2026, 8, 20, 10, 0, tzinfo=UTC)
WIDTH = 120


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def text(renderable: RenderableType, width: int = WIDTH) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(renderable)
    return console.export_text()


def record(run_id: str, **kw: Any) -> RunRecord:
    base: dict[str, Any] = dict(
        run_id=run_id, kind="Job", namespace="team-a", name="train", uid="u1", project="llm", workspace="ws-a",
        target="a100", queue="lq", cluster_queue="cq", status=Status.PENDING, reason="Pending", phase=Phase.ADMISSION,
        attempts=1, retries=0, evictions=0, created_at=at(0), queued_at=at(0), admitted_at=None, started_at=None,
        finished_at=None, admission_wait_s=None,
    )
    return RunRecord(**(base | kw))


def tr(run_id: str, attempt: int, phase: Phase, seconds: float, reason: str, message: str = "") -> Transition:
    return Transition(run_id=run_id, attempt=attempt, phase=phase, at=at(seconds), reason=reason, message=message,
                      source="Job/team-a/train")


def attempt(run_id: str, n: int, **kw: Any) -> Attempt:
    base: dict[str, Any] = dict(
        run_id=run_id, attempt=n, trigger="Submitted", queued_at=None, admitted_at=None, scheduled_at=None,
        started_at=None, progress_at=None, ended_at=None, end_reason=None, admission_wait_s=None, retries=0,
    )
    return Attempt(**(base | kw))


def failed_after_eviction() -> RunHistory:
    """Attempt 1: admitted after 60s, an OOMKilled pod retried, preempted at 20m. Attempt 2: waited 45m12s."""
    rid = "run-fail"
    return RunHistory(
        run=record(rid, status=Status.FAILED, reason="BackoffLimitExceeded", message="Job has reached the limit",
                   phase=Phase.COMPLETION, attempts=2, retries=1, evictions=1, queued_at=at(1200),
                   admitted_at=at(3912), started_at=at(90), finished_at=at(5400), admission_wait_s=2712.0,
                   git_commit="3f2a9c1", config_digest="sha256:abc", config_ref="configs/llm.yaml",
                   input_refs=["s3://data/train"], output_uri="s3://out/run-fail",
                   last_checkpoint="s3://out/run-fail/ckpt-300"),
        transitions=[
            tr(rid, 1, Phase.ADMISSION, 0, "Submitted"),
            tr(rid, 1, Phase.SCHEDULING, 60, "Admitted", "Admitted by ClusterQueue cq"),
            tr(rid, 1, Phase.RUNTIME, 90, "PodsScheduled", "2/2 pods scheduled"),
            tr(rid, 2, Phase.ADMISSION, 1200, "Preempted", "Preempted to accommodate a higher priority workload"),
            tr(rid, 2, Phase.SCHEDULING, 3912, "Admitted", "Admitted by ClusterQueue cq"),
            tr(rid, 2, Phase.RUNTIME, 3960, "PodsScheduled", "2/2 pods scheduled"),
            tr(rid, 2, Phase.COMPLETION, 5400, "BackoffLimitExceeded", "Job has reached the limit"),
        ],
        attempts=[
            attempt(rid, 1, queued_at=at(0), admitted_at=at(60), scheduled_at=at(60), started_at=at(90),
                    ended_at=at(1200), end_reason="Preempted", end_message="Preempted to accommodate",
                    underlying_cause="InCohortReclamation", admission_wait_s=60.0, cluster_queue="cq", retries=1,
                    failures=[PodFailure(pod="train-0-a", at=at(600), reason="OOMKilled", exit_code=137)],
                    failed_pods=1, pod_count=1),
            attempt(rid, 2, trigger="Preempted", queued_at=at(1200), admitted_at=at(3912), scheduled_at=at(3912),
                    started_at=at(3960), ended_at=at(5400), end_reason="BackoffLimitExceeded",
                    end_message="Job has reached the limit", admission_wait_s=2712.0, cluster_queue="cq",
                    failures=[PodFailure(pod="train-0-c", at=at(5300), reason="Error", exit_code=1)], failed_pods=1),
        ],
        metrics=[],
        resume_links=[],
        metric_points=[],
        pods=[PodPlacement(run_id=rid, uid="uid-train-0-a", namespace="team-a", attempt=1, pod="train-0-a",
                           node="node-1", created_at=at(60), scheduled_at=at(70), finished_at=at(600))],
    )


def pending() -> RunHistory:
    rid = "run-wait"
    return RunHistory(
        run=record(rid, pending_reason="Pending",
                   pending_message="couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu"),
        transitions=[tr(rid, 1, Phase.ADMISSION, 0, "Submitted")],
        attempts=[attempt(rid, 1, queued_at=at(0))],
        metrics=[],
        resume_links=[],
    )


def resumed_with_metrics() -> RunHistory:
    rid = "run-resume"
    return RunHistory(
        run=record(rid, status=Status.RUNNING, reason=None, phase=Phase.PROGRESS, queued_at=at(0.25),
                   admitted_at=at(30), started_at=at(60), admission_wait_s=29.75, resume_of="run-fail",
                   last_checkpoint="s3://out/run-resume/ckpt-1200"),
        transitions=[tr(rid, 1, Phase.ADMISSION, 0.25, "Submitted"), tr(rid, 1, Phase.SCHEDULING, 30, "Admitted"),
                     tr(rid, 1, Phase.RUNTIME, 60, "PodsScheduled"), tr(rid, 1, Phase.PROGRESS, 120, "FirstStep")],
        attempts=[attempt(rid, 1, queued_at=at(0.25), admitted_at=at(30), admission_wait_s=29.75)],
        metrics=[
            MetricSummary(run_id=rid, metric="loss", first_step=0, first_value=2.31, latest_step=1200,
                          latest_value=0.42, min_value=0.4, max_value=2.5, points=13),
            MetricSummary(run_id=rid, metric="grad_norm", first_step=0, first_value=1.0, latest_step=1200,
                          latest_value=math.nan, min_value=0.5, max_value=math.inf, points=13),
        ],
        resume_links=[ResumeLink(run_id=rid, resume_of="run-fail")],
    )


# ------------------------------------------------------------------------------------------ text


@pytest.mark.parametrize(("seconds", "expected"), [
    (None, "-"), (0, "0s"), (0.2, "<1s"), (5, "5s"), (59.9, "59s"), (60, "1m00s"), (2712, "45m12s"),
    (7380, "2h03m"), (100_800, "1d04h"), (math.inf, "-"),
])
def test_human_duration(seconds: float | None, expected: str) -> None:
    assert human_duration(seconds) == expected


def test_runs_table() -> None:
    records = [h.run for h in (failed_after_eviction(), pending(), resumed_with_metrics())]
    assert "BackoffLimitExc" in text(runs_table(records))  # at 120 columns the reason is cut, not wrapped
    out = text(runs_table(records), width=160)
    assert "3 runs" in out
    for expected in ("run-fail", "run-wait", "run-resume", "team-a/train", "failed", "pending", "running",
                     "Completion", "Admission", "Progress", "45m12s", "29s", "08-20 10:20:00",
                     "BackoffLimitExceeded", "Pending"):
        assert expected in out, expected
    header = next(line for line in out.splitlines() if "status" in line)
    for column in ("run", "kind", "ns/name", "phase", "att", "retry", "evict", "queued", "wait", "reason"):
        assert column in header
    row = next(line for line in out.splitlines() if "run-fail" in line)
    assert row.split()[5:8] == ["2", "1", "1"]  # attempts, retries, evictions


def test_timeline_of_a_finished_run_with_two_attempts() -> None:
    out = text(timeline(failed_after_eviction(), width=WIDTH, now=at(99_999)))
    lines = out.splitlines()
    # the axis ends at the last transition, not at `now`, because the run is finished
    assert any("10:00:00Z" in line and "11:30:00Z" in line for line in lines)
    assert "(1h30m)" in out and "live" not in out

    def bar(phase: str, nth: int = 0) -> str:
        return [line for line in lines if line.strip().startswith(phase)][nth]

    assert "1m00s" in bar("Admission", 0) and "Submitted" in bar("Admission", 0)
    assert "45m12s" in bar("Admission", 1) and "Preempted" in bar("Admission", 1)
    assert "18m30s" in bar("Runtime", 0)  # until the eviction opened attempt 2
    assert "24m00s" in bar("Runtime", 1)
    assert "11:30:00" in bar("Completion") and "BackoffLimitExceeded" in bar("Completion")
    assert "▒" in bar("Admission", 1) and "█" in bar("Runtime", 1) and "◆" in bar("Completion")
    # the long wait is drawn longer than the short one
    assert bar("Admission", 1).count("▒") > 10 * bar("Admission", 0).count("▒")
    assert any("attempt 1" in line and "trigger Submitted" in line for line in lines)
    assert any("attempt 2" in line and "trigger Preempted" in line and "waited 45m12s" in line for line in lines)
    assert any("ended Preempted" in line and "InCohortReclamation" in line for line in lines)
    assert any("train-0-a OOMKilled exit 137" in line for line in lines)
    assert any("train-0-c Error exit 1" in line for line in lines)
    assert "1 pod retry" in out
    # attempt 2 ended in the run's completion: not repeated as an "ended" line
    assert not any("ended BackoffLimitExceeded" in line for line in lines)
    for expected in ("llm / ws-a / a100", "3f2a9c1", "sha256:abc (configs/llm.yaml)", "s3://data/train",
                     "s3://out/run-fail", "s3://out/run-fail/ckpt-300"):
        assert expected in out, expected
    assert all(len(line) <= WIDTH for line in lines)


def test_timeline_of_a_live_run_ends_at_now() -> None:
    out = text(timeline(pending(), width=WIDTH, now=at(4212)))
    admission = next(line for line in out.splitlines() if line.strip().startswith("Admission"))
    assert "1h10m+" in admission and "(ongoing)" in admission
    assert "live" in out and "11:10:12Z" in out
    assert "insufficient quota for nvidia.com/gpu" in out


def test_timeline_of_a_live_run_without_now_marks_the_current_phase() -> None:
    out = text(timeline(pending(), width=WIDTH, now=None))
    admission = next(line for line in out.splitlines() if line.strip().startswith("Admission"))
    assert "▶" in admission and "10:00:00" in admission and "(ongoing)" in admission


def test_timeline_shows_metrics_and_resume_link() -> None:
    out = text(timeline(resumed_with_metrics(), width=WIDTH, now=at(600)))
    assert "2.31 @0 → 0.42 @1200" in out and "-81.8%" in out
    assert "grad_norm" in out and "nan" in out and "inf" in out
    resume = next(line for line in out.splitlines() if line.startswith("resume of"))
    assert "run-fail" in resume
    assert "s3://out/run-resume/ckpt-1200" in out


def test_timeline_without_transitions() -> None:
    h = replace(pending(), transitions=[], attempts=[])
    assert "no phase transitions recorded yet" in text(timeline(h, width=WIDTH))


def test_cluster_text_is_not_markup() -> None:
    h = pending()
    h = replace(h, transitions=[replace(h.transitions[0], reason="[bold]x[/bold]")])
    assert "[bold]x[/bold]" in text(timeline(h, width=WIDTH))
    assert "[red]" in text(runs_table([replace(h.run, reason="[red]")]))


@pytest.mark.parametrize("width", [60, 80, 200])
def test_timeline_fits_the_width(width: int) -> None:
    out = text(timeline(failed_after_eviction(), width=width), width=width)
    assert "Admission" in out and "Completion" in out
    bars = [line for line in out.splitlines() if line.strip().startswith(("Admission", "Runtime"))]
    assert bars and all(len(line) <= width for line in bars)


# ------------------------------------------------------------------------------------------ JSON

RUN_KEYS = set(field_names(RunRecord))


def is_iso_z(value: str) -> bool:
    return value.endswith("Z") and datetime.fromisoformat(value).tzinfo is not None


def test_runs_json_shape() -> None:
    out = runs_json([h.run for h in (failed_after_eviction(), pending(), resumed_with_metrics())])
    json.dumps(out, allow_nan=False)
    assert {"run_id", "kind", "namespace", "name", "status", "reason", "phase", "attempts", "retries", "evictions",
            "queued_at", "admitted_at", "started_at", "finished_at", "admission_wait_s"} <= RUN_KEYS
    assert all(set(r) == RUN_KEYS for r in out)
    fail, wait, resume = out
    assert fail["status"] == "failed" and fail["phase"] == "Completion" and fail["attempts"] == 2
    assert fail["queued_at"] == "2026-08-20T10:20:00Z" and fail["finished_at"] == "2026-08-20T11:30:00Z"
    assert resume["queued_at"] == "2026-08-20T10:00:00.250000Z"
    assert wait["admitted_at"] is None and wait["finished_at"] is None and wait["admission_wait_s"] is None
    assert fail["input_refs"] == ["s3://data/train"]
    for r in out:
        for key in ("created_at", "queued_at", "admitted_at", "started_at", "finished_at"):
            assert r[key] is None or is_iso_z(r[key])


def test_history_json_shape() -> None:
    h = failed_after_eviction()
    out = history_json(h)
    json.dumps(out, allow_nan=False)
    assert set(out) == RUN_KEYS | {"transitions", "attempt_details", "metrics", "resume_links", "pods", "checkpoints",
                                   "ledger"}
    assert out["attempts"] == 2  # the run object's count, as in runs_json
    assert [(t["phase"], t["attempt"]) for t in out["transitions"]] == [(t.phase.value, t.attempt) for t in
                                                                        h.transitions]
    assert all(set(t) == {"at", "phase", "attempt", "reason", "message", "source"} for t in out["transitions"])
    assert out["transitions"][3] == {"at": "2026-08-20T10:20:00Z", "phase": "Admission", "attempt": 2,
                                     "reason": "Preempted", "message": h.transitions[3].message,
                                     "source": "Job/team-a/train"}
    first = out["attempt_details"][0]
    assert set(first) == set(field_names(Attempt)) - {"run_id"}
    assert first["failures"] == [{"pod": "train-0-a", "at": "2026-08-20T10:10:00Z", "reason": "OOMKilled",
                                  "exit_code": 137, "message": ""}]
    assert first["pod_count"] == 1 and first["failed_pods"] == 1
    assert out["pods"][0]["scheduled_at"] == "2026-08-20T10:01:10Z" and out["pods"][0]["attempt"] == 1
    assert out["metrics"] == [] and out["resume_links"] == []


def test_history_json_metrics_and_links() -> None:
    out = history_json(resumed_with_metrics())
    json.dumps(out, allow_nan=False)
    assert out["resume_links"] == [{"resume_of": "run-fail"}]
    loss, grad = out["metrics"]
    assert set(loss) == set(field_names(MetricSummary)) - {"run_id"}
    assert loss["latest_value"] == 0.42
    assert grad["latest_value"] is None and grad["max_value"] is None  # NaN and infinity are not JSON


def test_hyperparameters_show_the_first_few_then_how_many_more() -> None:
    """The terminal's grid shows the first hyperparameters in key order and counts the rest, with those the tracker
    did not keep (past 64); JSON-like values (true, null); no hyperparameters: '-'."""
    run = replace(record("r"), hyperparameters={f"k{i}": i for i in range(8)} | {"flag": True, "none": None},
                  hyperparameters_omitted=5)
    assert hyperparameters_text(run, 3) == "flag=true, k0=0, k1=1, +12 more"
    assert hyperparameters_text(run).endswith("none=null, +5 more")
    assert hyperparameters_text(replace(run, hyperparameters={}, hyperparameters_omitted=0)) == "-"
    assert hyperparameters_text(replace(run, hyperparameters={}), 3) == "+5 more"
