"""The experiment index on a real SQLite file: round trip, idempotence, replacement, queries, atomicity, schema."""

from __future__ import annotations

import math
import re
import sqlite3
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.histories import copy_into_older, index_of_schema, stored, ups
from tracker.core.model import (
    Attempt,
    CheckpointRecord,
    GoodputCategory,
    HistoryUpdate,
    LedgerSpan,
    MetricPoint,
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
from tracker.read.store import IndexReader
from tracker.shell import index as index_module
from tracker.shell import index_schema
from tracker.shell.index import ExperimentIndex
from tracker.shell.index_schema import SCHEMA_SQL, SCHEMA_VERSION, IndexSchemaError

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 8, 20, 10, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def record(run_id: str, **kw: Any) -> RunRecord:
    base: dict[str, Any] = dict(
        run_id=run_id, kind="Job", namespace="team-a", name=f"train-{run_id}", uid=f"uid-{run_id}",
        project="llm", workspace="ws-a", target="gpu-a100", queue="lq", cluster_queue="cq",
        status=Status.PENDING, reason="Queued", phase=Phase.ADMISSION, attempts=1, retries=0, evictions=0,
        created_at=at(0), queued_at=at(0), admitted_at=None, started_at=None, finished_at=None,
        admission_wait_s=None,
    )
    return RunRecord(**(base | kw))


def tr(run_id: str, attempt: int, phase: Phase, minutes: float, reason: str, message: str = "") -> Transition:
    return Transition(run_id=run_id, attempt=attempt, phase=phase, at=at(minutes), reason=reason, message=message,
                      source=f"Job/team-a/train-{run_id}")


def attempt(run_id: str, n: int, **kw: Any) -> Attempt:
    base: dict[str, Any] = dict(
        run_id=run_id, attempt=n, trigger="Submitted", queued_at=None, admitted_at=None, scheduled_at=None,
        started_at=None, progress_at=None, ended_at=None, end_reason=None, admission_wait_s=None, retries=0,
    )
    return Attempt(**(base | kw))


def pod(run_id: str, attempt: int, name: str, node: str | None, created: float, scheduled: float | None,
        finished: float | None) -> PodPlacement:
    return PodPlacement(run_id=run_id, uid=f"uid-{name}", namespace="team-a", attempt=attempt, pod=name, node=node,
                        created_at=at(created), scheduled_at=at(scheduled) if scheduled is not None else None,
                        finished_at=at(finished) if finished is not None else None)


def finished_two_attempts() -> RunHistory:
    """Preempted during attempt 1 (after an OOMKilled pod was retried), then failed in attempt 2."""
    rid = "run-fail"
    return RunHistory(
        run=record(rid, status=Status.FAILED, reason="BackoffLimitExceeded", message="Job has reached the limit",
                   phase=Phase.COMPLETION, attempts=2, retries=1, evictions=1, evictions_by={"Preempted": 1},
                   queued_at=at(20),
                   admitted_at=at(65.2), started_at=at(1.5), finished_at=at(90), admission_wait_s=2712.0,
                   git_commit="3f2a9c1", config_digest="sha256:abc", config_ref="configs/llm.yaml",
                   input_refs=["s3://data/train", "s3://data/eval"], output_uri="s3://out/run-fail",
                   ledger_gpu_hours_by={"productive": 0.25, "wasted-progress": 1.875}, goodput=0.25 / 2.125),
        transitions=[
            tr(rid, 1, Phase.ADMISSION, 0, "Submitted"),
            tr(rid, 1, Phase.SCHEDULING, 1, "Admitted", "Admitted by ClusterQueue cq"),
            tr(rid, 1, Phase.RUNTIME, 1.5, "PodsScheduled", "2/2 pods scheduled"),
            tr(rid, 2, Phase.ADMISSION, 20, "Preempted", "Preempted to accommodate a higher priority workload"),
            tr(rid, 2, Phase.SCHEDULING, 65.2, "Admitted", "Admitted by ClusterQueue cq"),
            tr(rid, 2, Phase.RUNTIME, 66, "PodsScheduled", "2/2 pods scheduled"),
            tr(rid, 2, Phase.COMPLETION, 90, "BackoffLimitExceeded", "Job has reached the limit"),
        ],
        attempts=[
            attempt(rid, 1, queued_at=at(0), admitted_at=at(1), scheduled_at=at(1), started_at=at(1.5),
                    ended_at=at(20), end_reason="Preempted", end_message="Preempted to accommodate",
                    underlying_cause="InCohortReclamation", admission_wait_s=60.0, cluster_queue="cq", retries=1,
                    failures=[PodFailure(pod="train-0-a", at=at(10), reason="OOMKilled", exit_code=137)],
                    failed_pods=1, pod_count=3,
                    ledger_gpu_hours_by={"productive": 0.25, "wasted-progress": 1.125}),
            attempt(rid, 2, trigger="Preempted", queued_at=at(20),
                    admitted_at=at(65.2), scheduled_at=at(65.2), started_at=at(66), ended_at=at(90),
                    end_reason="BackoffLimitExceeded", end_message="Job has reached the limit",
                    admission_wait_s=2712.0, cluster_queue="cq",
                    failures=[PodFailure(pod="train-0-c", at=at(89), reason="Error", exit_code=1, message="boom")],
                    failed_pods=1, pod_count=2, ledger_gpu_hours_by={"wasted-progress": 0.75}),
        ],
        metrics=[],
        resume_links=[],
        metric_points=[],
        pods=[pod(rid, 1, "train-0-a", "node-1", 1, 1.2, 10), pod(rid, 1, "train-1-a", "node-2", 1, 1.5, 20),
              pod(rid, 1, "train-0-b", "node-1", 10.5, 11, 20), pod(rid, 2, "train-0-c", "node-3", 65.5, 66, 89),
              pod(rid, 2, "train-1-c", None, 65.5, None, None)],
    )


def pending_in_admission(run_id: str = "run-wait", queued: float = 0, workspace: str = "ws-a",
                         project: str = "llm") -> RunHistory:
    return RunHistory(
        run=record(run_id, queued_at=at(queued), created_at=at(queued), workspace=workspace, project=project,
                   reason="Pending", pending_reason="Pending",
                   pending_message="couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu"),
        transitions=[tr(run_id, 1, Phase.ADMISSION, queued, "Submitted")],
        attempts=[attempt(run_id, 1, queued_at=at(queued))],
        metrics=[],
        resume_links=[],
        metric_points=[],
        pods=[],
    )


def resumed_with_metrics() -> RunHistory:
    rid = "run-resume"
    return RunHistory(
        run=record(rid, status=Status.RUNNING, reason=None, phase=Phase.PROGRESS, workspace="ws-b",
                   project="vision", queued_at=at(0.000001), admitted_at=at(0.5), started_at=at(1),
                   admission_wait_s=29.99994, resume_of="run-fail", last_checkpoint="s3://out/run-resume/ckpt-1200",
                   created_at=at(0.000001), ledger_basis="progress",
                   ledger_gpu_hours_by={"scheduling": 0.0, "startup": 0.0125, "checkpoint-restore": 0.008333,
                                        "productive": 0.45, "checkpoint-save": 0.01, "unclassified": 1e-9},
                   ledger_wall_s_by={"scheduling": 30.0, "startup": 42.0, "checkpoint-restore": 30.0,
                                     "productive": 1620.5, "checkpoint-save": 36.0},
                   ledger_until=at(30.5), ledger_open="productive", ettr=1620.5 / 1758.5, goodput=0.45 / 0.480833,
                   resumed_from="s3://out/run-fail/ckpt-800", checkpoints_saved=2),
        transitions=[
            Transition(run_id=rid, attempt=1, phase=Phase.RENDERING, at=at(-1), reason="RenderingSucceeded",
                       message="", source="TauGrid/intake"),
            Transition(run_id=rid, attempt=1, phase=Phase.RESOLUTION, at=at(-1), reason="ResolutionSucceeded",
                       message="", source="TauGrid/intake"),  # out of phase order: the order must survive
            tr(rid, 1, Phase.ADMISSION, 0.000001, "Submitted"),
            tr(rid, 1, Phase.SCHEDULING, 0.5, "Admitted"),
            tr(rid, 1, Phase.RUNTIME, 1, "PodsScheduled", "1/1 pods scheduled"),
            tr(rid, 1, Phase.PROGRESS, 2, "FirstStep"),
        ],
        attempts=[attempt(rid, 1, queued_at=at(0.000001), admitted_at=at(0.5), scheduled_at=at(0.5),
                          started_at=at(1), progress_at=at(2), admission_wait_s=29.99994, pod_count=1,
                          ledger_gpu_hours_by={"startup": 0.0125, "checkpoint-restore": 0.008333, "productive": 0.45,
                                               "checkpoint-save": 0.01, "unclassified": 1e-9},
                          ledger_wall_s_by={"scheduling": 30.0, "startup": 42.0, "checkpoint-restore": 30.0,
                                            "productive": 1620.5, "checkpoint-save": 36.0})],
        pods=[pod(rid, 1, "train-x", "node-9", 0.6, 1, None)],
        # by start time, else end time (the v1 save of step 1200 reported no start), as the reducer orders them
        checkpoints=[
            CheckpointRecord(kind="restore", step=800, uri="s3://out/run-fail/ckpt-800", started_at=at(1.2),
                             ended_at=at(1.7), status="completed", attempt=1),
            CheckpointRecord(kind="save", step=1000, uri="s3://out/run-resume/ckpt-1000", started_at=at(20),
                             ended_at=at(20.6000005), status="completed", bytes=7_516_192_768, attempt=1),
            CheckpointRecord(kind="save", step=1100, uri="s3://out/run-resume/ckpt-1100", started_at=at(25),
                             ended_at=at(25.1), status="failed", attempt=1),
            CheckpointRecord(kind="restore", step=1000, uri="s3://out/run-resume/ckpt-1000", started_at=at(26),
                             ended_at=None, status="started", attempt=1),
            CheckpointRecord(kind="save", step=1200, uri="s3://out/run-resume/ckpt-1200", started_at=None,
                             ended_at=at(30.25), status="completed", attempt=1),
        ],
        ledger=[LedgerSpan(category=GoodputCategory.CHECKPOINT_RESTORE, start=at(1.2), end=at(1.7)),
                LedgerSpan(category=GoodputCategory.WASTED_PROGRESS, start=at(20.6000005), end=at(25.1)),
                LedgerSpan(category=GoodputCategory.INFRASTRUCTURE_RECOVERY, start=at(25.1), end=at(26))],
        metrics=[
            MetricSummary(run_id=rid, metric="accuracy", first_step=0, first_value=0.1, latest_step=1200,
                          latest_value=0.83, min_value=0.1, max_value=0.85, points=13),
            MetricSummary(run_id=rid, metric="loss", first_step=0, first_value=2.31, latest_step=1200,
                          latest_value=0.42, min_value=0.4, max_value=2.5, points=13),
        ],
        resume_links=[ResumeLink(run_id=rid, resume_of="run-fail")],
        metric_points=[MetricPoint(run_id=rid, metric="accuracy", step=0, value=0.1, at=at(2)),
                       MetricPoint(run_id=rid, metric="loss", step=0, value=2.31, at=at(2)),
                       MetricPoint(run_id=rid, metric="loss", step=1200, value=0.42, at=at(30.5))],
    )


def before_ledger(h: RunHistory) -> RunHistory:
    """A history as an index of schema 7 or older holds it: the ledger fields at their defaults, no checkpoints and no
    ledger spans (and no evictions_by, as before schema 9)."""
    defaults = {f: getattr(RunRecord(**{**{n: getattr(h.run, n) for n in field_names(RunRecord)
                                           if n not in _LEDGER_RUN}}), f) for f in _LEDGER_RUN}
    return replace(before_evictions_by(h), run=replace(h.run, **defaults, evictions_by={}), checkpoints=[], ledger=[],
                   attempts=[replace(a, ledger_gpu_hours_by={}, ledger_wall_s_by={}) for a in h.attempts])


def before_evictions_by(h: RunHistory) -> RunHistory:
    """A history as an index of schema 8 or older holds it: no evictions by reason (the history's default)."""
    return replace(h, run=replace(h.run, evictions_by={}))


_LEDGER_RUN = ("ledger_basis", "ledger_gpu_hours_by", "ledger_wall_s_by", "ledger_until", "ledger_open", "ettr",
               "goodput", "resumed_from", "checkpoints_saved")


def all_histories() -> list[RunHistory]:
    return [finished_two_attempts(), pending_in_admission(), resumed_with_metrics()]


@pytest.fixture
def index(tmp_path: Path) -> Any:
    with ExperimentIndex(tmp_path / "index.sqlite") as ix:
        yield ix


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, sorted: the content of the index."""
    with sqlite3.connect(path) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}


# ------------------------------------------------------------------------------------------ round trip


def test_round_trip_is_lossless(index: ExperimentIndex) -> None:
    histories = all_histories()
    # run-fail alone: the runs row, 7 transitions, 2 attempts, 5 pod placements
    assert index.write(ups(histories[:1])) == 1 + 7 + 2 + 5
    assert index.write(ups(histories)) > 0
    for h in histories:
        assert stored(index).history(h.run.run_id) == h
    assert stored(index).history("no-such-run") is None


def test_times_are_iso_utc_text_with_microseconds_only_when_nonzero(index: ExperimentIndex) -> None:
    index.write(ups(all_histories()))
    rows = dict(sqlite3.connect(index.path).execute("SELECT run_id, queued_at FROM runs").fetchall())
    assert rows["run-wait"] == "2026-08-20T10:00:00Z"
    assert rows["run-resume"] == "2026-08-20T10:00:00.000060Z"
    assert rows["run-fail"] == "2026-08-20T10:20:00Z"


def test_times_decoded_from_the_transitions_topic_or_with_an_offset_are_the_same_text(index: ExperimentIndex) -> None:
    """A sink's times come from pydantic (its own UTC tzinfo), a caller's may carry an offset: each is stored as the
    same ISO-8601 UTC text as the reducer's own times."""
    from datetime import timezone

    from pydantic import TypeAdapter

    decoded = TypeAdapter(datetime).validate_json('"2026-08-20T10:00:00.000060Z"')
    assert decoded.tzinfo is not UTC
    offset = datetime(2026, 8, 20, 12, 0, 0, 60, tzinfo=timezone(timedelta(hours=2)))
    points = [MetricPoint(run_id="p", metric=m, step=1, value=1.0, at=at) for m, at in
              (("utc", datetime(2026, 8, 20, 10, 0, 0, 60, tzinfo=UTC)), ("decoded", decoded), ("offset", offset))]
    index.write([HistoryUpdate(run_id="p", points=points, points_full=True)])
    rows = dict(sqlite3.connect(index.path).execute("SELECT metric, at FROM metric_points").fetchall())
    assert rows == {"utc": "2026-08-20T10:00:00.000060Z", "decoded": "2026-08-20T10:00:00.000060Z",
                    "offset": "2026-08-20T10:00:00.000060Z"}


def test_nan_metric_is_stored_as_null_and_read_back_as_nan(index: ExperimentIndex) -> None:
    h = resumed_with_metrics()
    bad = replace(h.metrics[1], latest_value=math.nan)
    h = replace(h, metrics=[h.metrics[0], bad])
    index.write(ups([h]))
    got = stored(index).history(h.run.run_id)
    assert got is not None and math.isnan(got.metrics[1].latest_value)
    assert index.write(ups([h])) == 0  # NULL IS NULL: no churn either


# ------------------------------------------------------------------------------------------ idempotence


def test_rewriting_the_same_histories_changes_nothing(index: ExperimentIndex) -> None:
    histories = all_histories()
    index.write(ups(histories), {("tracker", "history", 0): 42})
    before = dump(index.path)
    assert index.write(ups(histories), {("tracker", "history", 0): 42}) == 0
    assert index.write(ups(list(reversed(histories)))) == 0
    assert dump(index.path) == before


def test_updated_seq_moves_only_for_runs_whose_content_changed(index: ExperimentIndex) -> None:
    fail, wait, resume = all_histories()
    index.write(ups([fail, wait, resume]))

    def seqs() -> dict[str, int]:
        return dict(sqlite3.connect(index.path).execute("SELECT run_id, updated_seq FROM runs").fetchall())

    first = seqs()
    assert set(first.values()) == {1}
    # a child row changed (a new metric point), the runs row did not: the run still counts as updated
    m = replace(resume.metrics[1], points=14, latest_value=0.41)
    changed = replace(resume, metrics=[resume.metrics[0], m])
    assert index.write(ups([fail, wait, changed])) == 2  # the metric row and the runs row's updated_seq
    assert seqs() == first | {"run-resume": 2}
    # the runs row changed
    admitted = replace(wait, run=replace(wait.run, phase=Phase.SCHEDULING))
    assert index.write(ups([admitted])) == 1
    assert seqs() == first | {"run-resume": 2, "run-wait": 3}


def test_a_run_given_twice_in_one_write_is_written_as_its_last_history(index: ExperimentIndex) -> None:
    wait = pending_in_admission()
    later = replace(wait, run=replace(wait.run, reason="Later"))
    index.write(ups([wait, later]))
    got = stored(index).history("run-wait")
    assert got is not None and got.run.reason == "Later"


# ------------------------------------------------------------------------------------------ replacement


def test_replacing_a_history_deletes_rows_it_no_longer_has(index: ExperimentIndex) -> None:
    fail = finished_two_attempts()
    index.write(ups([fail]))
    assert fail.pods is not None
    shrunk = replace(fail, transitions=[t for t in fail.transitions if t.phase is not Phase.COMPLETION],
                     attempts=[replace(fail.attempts[0], pod_count=1)], pods=fail.pods[:1])
    # the Completion transition, attempt 2, 4 pods (2 of each attempt) go; attempt 1 (pod_count) is updated; the
    # runs row's updated_seq moves
    assert index.write(ups([shrunk])) == 1 + 1 + 4 + 1 + 1
    assert stored(index).history(fail.run.run_id) == shrunk
    conn = sqlite3.connect(index.path)
    assert conn.execute("SELECT COUNT(*) FROM transitions WHERE phase = 'Completion'").fetchone() == (0,)
    assert conn.execute("SELECT attempt, pod FROM pod_placements").fetchall() == [(1, "train-0-a")]


def test_many_runs_shrinking_in_one_write_end_as_when_written_one_at_a_time(tmp_path: Path) -> None:
    # one write looks up the rows it may delete for all of its runs at once (a query per table); a run given twice in
    # the write is looked up as it goes, so its second update sees what the first wrote
    histories = all_histories()
    shrunk = [replace(h, transitions=h.transitions[:1], attempts=h.attempts[:1], pods=(h.pods or [])[:1],
                      metrics=h.metrics[:1]) for h in histories]
    # run 0 grows and shrinks again within the second write; runs 1 and 2 shrink together in the third
    writes = [shrunk, [*histories, shrunk[0]], shrunk[1:]]
    with ExperimentIndex(tmp_path / "batched.sqlite") as batched, ExperimentIndex(tmp_path / "one.sqlite") as one:
        for w in writes:
            assert batched.write(ups(w)) > 0
            for h in w:
                one.write(ups([h]))
    got, want = dump(tmp_path / "batched.sqlite"), dump(tmp_path / "one.sqlite")
    for tables in (got, want):  # when each file was made (a second apart across a tick) is not its content
        tables["meta"] = [row for row in tables["meta"] if row[0] != "created_at"]
    seq = [r[1] for r in sqlite3.connect(tmp_path / "one.sqlite").execute("PRAGMA table_info(runs)")].index(
        "updated_seq")
    for rows in (got["runs"], want["runs"]):  # write counters: three writes against eight
        rows[:] = sorted(((*r[:seq], *r[seq + 1:]) for r in rows), key=repr)
    assert got == want
    reader = IndexReader(tmp_path / "batched.sqlite").open()
    assert [reader.history(h.run.run_id) for h in histories] == shrunk


def test_the_updates_of_a_run_whose_points_coarsen_end_as_its_points(index: ExperimentIndex) -> None:
    """Each flush's update carries the points added or changed and names those downsampling dropped: written one
    after the other, the index holds the run's points, as the rule keeps them, and a write of one progress report
    changes its own rows only."""
    from tests.core.test_metric_points import progress
    from tracker.core.limits import ReducerLimits
    from tracker.core.reducer import Reducer

    red = Reducer(ReducerLimits(metric_points_per_run=16))
    for step in range(60):
        red.apply(progress(f"e{step}", step, step, {"loss": 1.0 / (step + 1), "lr": 0.1}), "law")
        if step % 7 == 0:
            index.write(red.flush().updates)
            h = red.history("r")
            assert h is not None and stored(index).history("r") == h
    index.write(red.flush().updates)
    h = red.history("r")
    assert h is not None and len(h.metric_points) <= 16 and stored(index).history("r") == h
    red.apply(progress("last", 60, 60, {"loss": 0.01}), "law")
    [u] = red.flush().updates
    assert len(u.points or ()) <= 1 and not u.full and not u.points_full
    assert index.write([u]) >= 1 and stored(index).history("r") == red.history("r")


def test_placements_are_the_pods_rows(index: ExperimentIndex) -> None:
    index.write(ups([finished_two_attempts()]))
    rows = sqlite3.connect(index.path).execute(
        "SELECT attempt, pod, node, created_at, scheduled_at, finished_at FROM pod_placements "
        "WHERE run_id = 'run-fail' ORDER BY attempt, pod").fetchall()
    assert rows == [
        (1, "train-0-a", "node-1", "2026-08-20T10:01:00Z", "2026-08-20T10:01:12Z", "2026-08-20T10:10:00Z"),
        (1, "train-0-b", "node-1", "2026-08-20T10:10:30Z", "2026-08-20T10:11:00Z", "2026-08-20T10:20:00Z"),
        (1, "train-1-a", "node-2", "2026-08-20T10:01:00Z", "2026-08-20T10:01:30Z", "2026-08-20T10:20:00Z"),
        (2, "train-0-c", "node-3", "2026-08-20T11:05:30Z", "2026-08-20T11:06:00Z", "2026-08-20T11:29:00Z"),
        (2, "train-1-c", None, "2026-08-20T11:05:30Z", None, None),
    ]


def test_a_history_with_rows_of_another_run_is_refused(index: ExperimentIndex) -> None:
    wait = pending_in_admission()
    alien = replace(wait, transitions=[tr("other", 1, Phase.ADMISSION, 0, "Submitted")])
    with pytest.raises(ValueError, match="other"):
        index.write(ups([alien]))
    twice = replace(wait, transitions=wait.transitions * 2)
    with pytest.raises(ValueError, match="two transitions rows"):
        index.write(ups([twice]))
    assert stored(index).records() == []


# ------------------------------------------------------------------------------------------ queries


def test_stalled_admission_uses_the_given_now(index: ExperimentIndex) -> None:
    index.write(ups([*all_histories(), pending_in_admission("run-new", queued=50)]))
    now = at(60)
    assert [r.run_id for r in stored(index).records(stalled_admission_s=30 * 60, now=now)] == ["run-wait"]
    assert [r.run_id for r in stored(index).records(stalled_admission_s=5 * 60, now=now)] == ["run-new", "run-wait"]
    waiting = stored(index).history("run-wait")
    assert waiting is not None and stored(index).records(stalled_admission_s=10 * 60, now=now) == [waiting.run]
    # strictly longer than the threshold: queued exactly 10 minutes before now is not stalled
    assert [r.run_id for r in stored(index).records(stalled_admission_s=10 * 60 - 1e-6, now=now)] == \
        ["run-new", "run-wait"]
    assert stored(index).records(stalled_admission_s=10 * 60, now=now, limit=1)[0].run_id == "run-wait"
    assert stored(index).records(stalled_admission_s=0, now=at(-1)) == []
    # without now, the current time (long after 2026-08-20 in any test run)
    assert len(stored(index).records(stalled_admission_s=60)) == 2


def test_stalled_admission_compares_sub_second_times_exactly(index: ExperimentIndex) -> None:
    h = pending_in_admission("run-frac", queued=0.5 / 60)  # 10:00:00.5, stored as ...00.500000Z
    index.write(ups([h]))
    assert stored(index).records(stalled_admission_s=60, now=at(1) + timedelta(seconds=0.5)) == []
    assert len(stored(index).records(stalled_admission_s=60, now=at(1) + timedelta(seconds=0.500001))) == 1


def test_filters_combine_and_order_is_newest_first(index: ExperimentIndex) -> None:
    index.write(ups([*all_histories(), pending_in_admission("run-other", queued=5, workspace="ws-z", project="x")]))

    def ids(**kw: Any) -> list[str]:
        return [r.run_id for r in stored(index).records(**kw)]

    assert ids() == ["run-other", "run-resume", "run-fail", "run-wait"]
    assert ids(status="pending") == ["run-other", "run-wait"]
    assert ids(status=Status.FAILED) == ["run-fail"]
    assert ids(phase=Phase.PROGRESS) == ["run-resume"]
    assert ids(phase="Admission", workspace="ws-a") == ["run-wait"]
    assert ids(workspace="ws-a", project="llm") == ["run-fail", "run-wait"]
    assert ids(project="vision") == ["run-resume"]
    assert ids(limit=2) == ["run-other", "run-resume"]
    with pytest.raises(ValueError):
        stored(index).records(status="bogus")
    with pytest.raises(ValueError):
        stored(index).records(limit=0)


def test_counts_by_status(index: ExperimentIndex) -> None:
    assert stored(index).counts_by_status() == dict.fromkeys(Status, 0)
    index.write(ups(all_histories()))
    assert stored(index).counts_by_status() == {Status.PENDING: 1, Status.RUNNING: 1, Status.SUCCEEDED: 0,
                                        Status.FAILED: 1, Status.STOPPED: 0}


# ------------------------------------------------------------------------------------------ offsets


def test_offsets_are_written_with_the_rows(index: ExperimentIndex) -> None:
    index.write(ups(all_histories()), {("tracker", "history", 0): 10, ("tracker", "history", 1): 7,
                                  ("other", "history", 0): 3})
    assert index.offsets("tracker") == {("history", 0): 10, ("history", 1): 7}
    assert index.write(ups([]), {("tracker", "history", 0): 12}) == 1
    assert index.offsets("tracker") == {("history", 0): 12, ("history", 1): 7}
    assert index.offsets("nobody") == {}


def test_a_failure_mid_write_lands_neither_rows_nor_offsets(index: ExperimentIndex,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    index.write(ups([pending_in_admission()]), {("tracker", "history", 0): 5})
    before = dump(index.path)

    def disk_full(self: ExperimentIndex, rows: Any) -> int:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(ExperimentIndex, "_write_offsets", disk_full)
    with pytest.raises(sqlite3.OperationalError):
        index.write(ups(all_histories()), {("tracker", "history", 0): 99})
    assert dump(index.path) == before
    monkeypatch.undo()
    # the connection is usable again, and nothing of the failed write is pending in it
    assert index.write(ups([]), {("tracker", "history", 0): 6}) == 1
    assert [r.run_id for r in stored(index).records()] == ["run-wait"]


def test_an_unserialisable_offset_lands_nothing(index: ExperimentIndex) -> None:
    with pytest.raises(ValueError, match="consumer offset"):
        index.write(ups(all_histories()), {("tracker", "history", 0): "ten"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="consumer offset"):
        index.write(ups(all_histories()), {("tracker", "history", -1): 10})
    assert stored(index).records() == [] and index.offsets("tracker") == {}


def test_a_database_error_in_a_later_run_rolls_back_the_earlier_ones(index: ExperimentIndex,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    real = ExperimentIndex._write_run
    calls = []

    def fail_second(self: ExperimentIndex, e: Any, seq: int, existing: Any) -> int:
        calls.append(e.run_id)
        if len(calls) == 2:
            raise sqlite3.IntegrityError("boom")
        return real(self, e, seq, existing)

    monkeypatch.setattr(ExperimentIndex, "_write_run", fail_second)
    with pytest.raises(sqlite3.IntegrityError):
        index.write(ups(all_histories()), {("tracker", "history", 0): 1})
    assert calls[:1] == ["run-fail"]
    assert stored(index).records() == [] and index.offsets("tracker") == {}


# ------------------------------------------------------------------------------------------ schema


def test_ddl_file_is_what_the_code_applies(tmp_path: Path) -> None:
    assert (REPO / "schemas" / "index" / "schema.sql").read_text() == SCHEMA_SQL
    from_file = sqlite3.connect(tmp_path / "from-file.sqlite")
    from_file.executescript((REPO / "schemas" / "index" / "schema.sql").read_text())
    with ExperimentIndex(tmp_path / "from-code.sqlite"):
        pass
    from_code = sqlite3.connect(tmp_path / "from-code.sqlite")
    query = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
    assert from_code.execute(query).fetchall() == from_file.execute(query).fetchall()
    meta = dict(from_code.execute("SELECT key, value FROM meta").fetchall())
    assert meta.pop("schema_version") == str(SCHEMA_VERSION) and meta.pop("tracker_version")
    assert list(meta) == ["created_at"] and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["created_at"])


def test_tables_carry_every_model_field(index: ExperimentIndex) -> None:
    conn = sqlite3.connect(index.path)

    def columns(table: str) -> list[str]:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]

    # version 4 appended the GPU columns after updated_seq (ALTER TABLE ADD COLUMN), version 7 the pending ones,
    # version 8 the ledger's, version 9 evictions_by, version 11 what ran
    gpu = ["gpus", "gpu_hours", "lost_gpu_hours", "lost_gpu_hours_by", "gpus_open", "open_since",
           "pending_s_by", "pending_category", "pending_since", "quota_reserved_at",
           "ledger_basis", "ledger_gpu_hours_by", "ledger_wall_s_by", "ledger_until", "ledger_open", "ettr", "goodput",
           "resumed_from", "checkpoints_saved", "evictions_by", *WHAT_RAN]
    assert columns("runs") == [*(f for f in field_names(RunRecord) if f not in gpu), "updated_seq", *gpu]
    assert columns("transitions") == [*field_names(Transition), "ordinal"]
    assert columns("attempts") == list(field_names(Attempt))
    assert columns("metric_summaries") == list(field_names(MetricSummary))
    assert columns("resume_links") == list(field_names(ResumeLink))
    assert columns("pod_placements") == list(field_names(PodPlacement))
    assert columns("metric_points") == list(field_names(MetricPoint))
    assert columns("checkpoints") == ["run_id", *field_names(CheckpointRecord)]
    assert columns("ledger_spans") == ["run_id", *field_names(LedgerSpan)]


def test_pragmas(index: ExperimentIndex) -> None:
    conn = index._db
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == index_module.BUSY_TIMEOUT_MS


def test_reopening_keeps_the_data(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite"
    with ExperimentIndex(path) as ix:
        ix.write(ups(all_histories()))
    with ExperimentIndex(path) as ix:
        assert stored(ix).history("run-fail") == finished_two_attempts()
        assert ix.write(ups(all_histories())) == 0


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite"
    with ExperimentIndex(path):
        pass
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(IndexSchemaError, match=f"schema version {SCHEMA_VERSION + 1}, newer"):
        ExperimentIndex(path).open()


def test_a_foreign_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE something (x)")
    with pytest.raises(IndexSchemaError, match="not an experiment index"):
        ExperimentIndex(path).open()


def test_an_older_schema_is_migrated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "index.sqlite"
    index_of_schema(path, 1, monkeypatch)  # an index written by the tracker of schema version 1
    # schema 1 has no reducer state tables nor GPU columns: write the rows it had, as it did
    with ExperimentIndex(tmp_path / "current.sqlite") as cur:
        cur.write(ups([pending_in_admission()]))
    conn = sqlite3.connect(path)
    conn.execute("ATTACH DATABASE ? AS cur", (str(tmp_path / "current.sqlite"),))
    copy_into_older(conn)
    conn.commit()
    conn.close()
    assert "reducer_runs" not in dump(path)
    with ExperimentIndex(path) as ix:
        assert stored(ix).history("run-wait") == pending_in_admission()
        assert ix.runs_without_state() == ["run-wait"]
    tables = dump(path)
    assert tables["reducer_runs"] == [] and tables["reducer_held"] == []
    assert dict(tables["meta"])["schema_version"] == str(SCHEMA_VERSION)  # created_at: when it was migrated
    assert set(dict(tables["meta"])) == {"schema_version", "created_at", "tracker_version"}


def test_a_later_migration_runs_after_the_current_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "index.sqlite"
    with ExperimentIndex(path) as ix:
        ix.write(ups([pending_in_admission()]))
    later = "CREATE TABLE extra (run_id TEXT PRIMARY KEY);\n-- a trailing comment\n"
    monkeypatch.setattr(index_schema, "MIGRATIONS", {**index_schema.MIGRATIONS, SCHEMA_VERSION + 1: later})
    monkeypatch.setattr(index_schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with ExperimentIndex(path) as ix:
        assert stored(ix).history("run-wait") == pending_in_admission()
    tables = dump(path)
    assert tables["extra"] == [] and dict(tables["meta"])["schema_version"] == str(SCHEMA_VERSION + 1)


def test_an_incomplete_migration_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_schema, "MIGRATIONS", {1: SCHEMA_SQL + "CREATE TABLE broken (a\n"})
    with pytest.raises(ValueError, match="incomplete SQL statement"):
        ExperimentIndex(tmp_path / "index.sqlite").open()
    with sqlite3.connect(tmp_path / "index.sqlite") as conn:  # the whole migration rolled back
        assert conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone() == (0,)


def test_readers_keep_their_snapshot_and_do_not_block_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite"
    with ExperimentIndex(path) as writer, IndexReader(path) as reader:
        writer.write(ups([pending_in_admission()]))
        stellar = sqlite3.connect(path, isolation_level=None)
        stellar.execute("BEGIN")
        assert stellar.execute("SELECT COUNT(*) FROM runs").fetchone() == (1,)
        writer.write(ups(all_histories()))  # not blocked by the open read transaction
        assert stellar.execute("SELECT COUNT(*) FROM transitions").fetchone() == (1,)  # still its snapshot
        stellar.execute("COMMIT")
        assert stellar.execute("SELECT COUNT(*) FROM runs").fetchone() == (3,)
        assert len(stored(reader).records()) == 3


def test_closed_index_says_so(tmp_path: Path) -> None:
    ix = ExperimentIndex(tmp_path / "index.sqlite")
    with pytest.raises(RuntimeError, match="not open"):
        ix.write([])
    with pytest.raises(RuntimeError, match="not open"):
        IndexReader(ix.path).records()


# ------------------------------------------------------------------------------------------ metric history (schema 5)


def test_metric_points_are_replaced_with_the_runs_other_rows(index: ExperimentIndex) -> None:
    h = resumed_with_metrics()
    index.write(ups([h]))
    rows = sqlite3.connect(index.path).execute("SELECT * FROM metric_points ORDER BY metric, step").fetchall()
    assert rows == [("run-resume", "accuracy", 0, 0.1, "2026-08-20T10:02:00Z"),
                    ("run-resume", "loss", 0, 2.31, "2026-08-20T10:02:00Z"),
                    ("run-resume", "loss", 1200, 0.42, "2026-08-20T10:30:30Z")]
    coarser = [h.metric_points[0], replace(h.metric_points[2], step=1024, value=0.5)]
    assert index.write(ups([replace(h, metric_points=coarser)])) == 2 + 1 + 1  # 2 gone, 1 new, updated_seq
    got = stored(index).history(h.run.run_id)
    assert got is not None and got.metric_points == coarser
    index.write(ups([replace(h, metric_points=[])]))
    assert sqlite3.connect(index.path).execute("SELECT COUNT(*) FROM metric_points").fetchone() == (0,)


def test_meta_says_which_cluster_and_workspace_the_index_belongs_to(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite"
    with ExperimentIndex(path, identity={"cluster": "aks-east-1", "workspace": ""}):
        pass
    with IndexReader(path) as ix:
        assert ix.meta("cluster") == "aks-east-1" and ix.meta("workspace") is None
        assert ix.meta("tracker_version") and ix.meta("created_at")
        created = ix.meta("created_at")
    with ExperimentIndex(path, identity={"cluster": "aks-west-2", "workspace": "ws-a"}):
        pass
    with IndexReader(path) as ix:  # the last writer's configuration; created_at stays
        assert (ix.meta("cluster"), ix.meta("workspace"), ix.meta("created_at")) == ("aks-west-2", "ws-a", created)


def test_a_schema_4_index_is_read_as_it_is_and_migrated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "index.sqlite"
    index_of_schema(path, 4, monkeypatch)  # an index written by the tracker of schema version 4
    with ExperimentIndex(tmp_path / "current.sqlite") as cur:
        cur.write(ups([resumed_with_metrics()]))
    conn = sqlite3.connect(path)
    conn.execute("ATTACH DATABASE ? AS cur", (str(tmp_path / "current.sqlite"),))
    copy_into_older(conn)
    conn.commit()
    conn.close()
    assert "metric_points" not in dump(path) and "created_at" not in dict(dump(path)["meta"])
    h = resumed_with_metrics()
    assert h.pods is not None
    # its pods have no uids yet: 'v5:<attempt>:<pod>' until the run is written again
    as_it_was = replace(before_ledger(h), metric_points=[],
                        pods=[replace(p, uid=f"v5:{p.attempt}:{p.pod}") for p in h.pods])
    with IndexReader(path) as reader:  # a reader reads it as it is
        assert stored(reader).history("run-resume") == as_it_was
    with ExperimentIndex(path) as ix:  # a writer migrates it: the run has no points until written again
        assert stored(ix).history("run-resume") == as_it_was
        ix.write(ups([h]))
        assert stored(ix).history("run-resume") == h
    meta = dict(dump(path)["meta"])
    assert meta["schema_version"] == str(SCHEMA_VERSION) and "created_at" in meta


# ------------------------------------------------------------------------------------------ lineage


def test_resumed_by_lists_the_runs_that_resume_a_run(tmp_path: Path) -> None:
    """IndexReader.resumed_by: the lineage in reverse, one step (resume_links by resume_of), the first created
    first, runs without a creation time last."""


    path = tmp_path / "index.sqlite"
    with ExperimentIndex(path):
        pass
    with sqlite3.connect(path) as conn:
        for run_id, created in (("b-late", "2026-08-20T11:00:00Z"), ("a-early", "2026-08-20T10:00:00.500000Z"),
                                ("c-none", None), ("d-sub", "2026-08-20T10:00:00Z")):
            conn.execute("INSERT INTO runs (run_id, status, message, phase, attempts, retries, evictions, "
                         "created_at, pending_message, input_refs, updated_seq) "
                         "VALUES (?, 'running', '', 'Progress', 1, 0, 0, ?, '', '[]', 1)", (run_id, created))
            conn.execute("INSERT INTO resume_links (run_id, resume_of) VALUES (?, 'root')", (run_id,))
        conn.execute("INSERT INTO resume_links (run_id, resume_of) VALUES ('a-early', 'other')")
    conn.close()
    with IndexReader(path) as reader:
        assert reader.resumed_by("root") == ["d-sub", "a-early", "b-late", "c-none"]
        assert reader.resumed_by("other") == ["a-early"]
        assert reader.resumed_by("a-early") == [] and reader.resumed_by("no-such-run") == []


def test_a_schema_7_index_is_read_as_it_is_and_migrated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Schema 8 adds the goodput ledger: a reader reads an index of schema 7 as it is (the ledger fields at their
    defaults, no checkpoints, no spans), a writer migrates it and the run's next history fills them."""
    path = tmp_path / "index.sqlite"
    index_of_schema(path, 7, monkeypatch)
    with ExperimentIndex(tmp_path / "current.sqlite") as cur:
        cur.write(ups(all_histories()))
    conn = sqlite3.connect(path)
    conn.execute("ATTACH DATABASE ? AS cur", (str(tmp_path / "current.sqlite"),))
    copy_into_older(conn)
    conn.execute("INSERT INTO main.metric_points SELECT * FROM cur.metric_points")
    conn.commit()
    conn.close()
    assert "checkpoints" not in dump(path) and "ledger_spans" not in dump(path)
    with IndexReader(path) as reader:
        for h in all_histories():
            assert stored(reader).history(h.run.run_id) == before_ledger(h)
    with ExperimentIndex(path) as ix:
        for h in all_histories():
            assert stored(ix).history(h.run.run_id) == before_ledger(h)
        assert ix.write(ups(all_histories())) > 0
        for h in all_histories():
            assert stored(ix).history(h.run.run_id) == h
        assert ix.write(ups(all_histories())) == 0
    assert dict(dump(path)["meta"])["schema_version"] == str(SCHEMA_VERSION) == "12"


def test_a_schema_8_index_is_read_as_it_is_and_migrated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Schema 9 adds runs.evictions_by: a reader reads an index of schema 8 as it is (the runs rows' evictions_by
    None: unknown, the history's default {}), a writer migrates it (the column NULL in the rows written before, the
    index holding nothing to derive it from) and the run's next history fills it."""
    path = tmp_path / "index.sqlite"
    index_of_schema(path, 8, monkeypatch)
    with ExperimentIndex(tmp_path / "current.sqlite") as cur:
        cur.write(ups(all_histories()))
    conn = sqlite3.connect(path)
    conn.execute("ATTACH DATABASE ? AS cur", (str(tmp_path / "current.sqlite"),))
    copy_into_older(conn)
    for table in ("metric_points", "checkpoints", "ledger_spans"):  # as in schema 8
        conn.execute(f"INSERT INTO main.{table} SELECT * FROM cur.{table}")
    conn.commit()
    conn.close()
    assert "evictions_by" not in [r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(runs)")]
    with IndexReader(path) as reader:
        assert {r.run_id: r.data["evictions_by"] for r in reader.runs()} == dict.fromkeys(
            (h.run.run_id for h in all_histories()), None)
        for h in all_histories():
            assert stored(reader).history(h.run.run_id) == before_evictions_by(h)
    with ExperimentIndex(path) as ix:
        assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM runs WHERE evictions_by IS NULL").fetchone() == (3,)
        assert {r.run_id: r.data["evictions_by"] for r in stored(ix).runs()} == dict.fromkeys(
            (h.run.run_id for h in all_histories()), None)
        assert ix.write(ups(all_histories())) > 0
        assert {r.run_id: r.data["evictions_by"] for r in stored(ix).runs()} == {
            h.run.run_id: h.run.evictions_by for h in all_histories()}
        for h in all_histories():
            assert stored(ix).history(h.run.run_id) == h
        assert ix.write(ups(all_histories())) == 0
    assert dict(dump(path)["meta"])["schema_version"] == str(SCHEMA_VERSION) == "12"
    # schema 10: the runs of a root found by its NAMESPACE/NAME through an index
    plan = [r[3] for r in sqlite3.connect(path).execute(
        "EXPLAIN QUERY PLAN SELECT run_id FROM runs WHERE namespace = 'a' AND name = 'b'")]
    assert plan == ["SEARCH runs USING INDEX runs_by_name (namespace=? AND name=?)"]


WHAT_RAN = ("images", "entrypoint", "hyperparameters", "hyperparameters_omitted")


def with_what_ran(h: RunHistory) -> RunHistory:
    return replace(h, run=replace(h.run, images=["acr.io/train:1", "acr.io/tau:1"], entrypoint="torchrun -m x --lr 1",
                                  hyperparameters={"lr": 0.0003, "bf16": True, "opt": "adamw", "none": None},
                                  hyperparameters_omitted=3))


def before_what_ran(h: RunHistory) -> RunHistory:
    """A history as an index of schema 9 or older holds it: nothing known of what ran (the history's defaults)."""
    return replace(h, run=replace(h.run, images=[], entrypoint=None, hyperparameters={}, hyperparameters_omitted=0))


def test_a_schema_9_index_is_read_as_it_is_and_migrated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Schema 11 adds what ran (runs.images, entrypoint, hyperparameters, hyperparameters_omitted): a reader reads an
    index of schema 9 as it is (the defaults: nothing known), a writer migrates it and the run's next history fills
    them; both read sides (runs and history) give them back as written."""
    path = tmp_path / "index.sqlite"
    index_of_schema(path, 9, monkeypatch)
    histories = [with_what_ran(h) for h in all_histories()]
    with ExperimentIndex(tmp_path / "current.sqlite") as cur:
        cur.write(ups(histories))
    conn = sqlite3.connect(path)
    conn.execute("ATTACH DATABASE ? AS cur", (str(tmp_path / "current.sqlite"),))
    copy_into_older(conn)
    for table in ("metric_points", "checkpoints", "ledger_spans"):
        conn.execute(f"INSERT INTO main.{table} SELECT * FROM cur.{table}")
    conn.commit()
    conn.close()
    assert not set(WHAT_RAN) & {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(runs)")}
    with IndexReader(path) as reader:
        assert [{k: r.data[k] for k in WHAT_RAN} for r in reader.runs()] == [
            {"images": [], "entrypoint": None, "hyperparameters": {}, "hyperparameters_omitted": 0}] * 3
        for h in histories:
            assert stored(reader).history(h.run.run_id) == before_what_ran(h)
    with ExperimentIndex(path) as ix:
        for h in histories:
            assert stored(ix).history(h.run.run_id) == before_what_ran(h)
        assert ix.write(ups(histories)) > 0
        for h in histories:
            assert stored(ix).history(h.run.run_id) == h
        assert {r.run_id: {k: r.data[k] for k in WHAT_RAN} for r in stored(ix).runs()} == {
            h.run.run_id: {k: getattr(h.run, k) for k in WHAT_RAN} for h in histories}
        assert ix.write(ups(histories)) == 0
    assert dict(dump(path)["meta"])["schema_version"] == str(SCHEMA_VERSION) == "12"


def test_evictions_by_round_trips(index: ExperimentIndex) -> None:
    """runs.evictions_by: the run's evictions by reason as JSON text, read back as the model's dict."""
    h = finished_two_attempts()
    index.write(ups([h]))
    conn = sqlite3.connect(index.path)
    assert conn.execute("SELECT evictions, evictions_by FROM runs").fetchall() == [(1, '{"Preempted":1}')]
    assert stored(index).history(h.run.run_id) == h
    assert [r.data["evictions_by"] for r in stored(index).runs()] == [{"Preempted": 1}]
    later = replace(h, run=replace(h.run, evictions=3, evictions_by={"EvictionNotObserved": 1, "Preempted": 2}))
    index.write(ups([later]))
    assert conn.execute("SELECT evictions_by FROM runs").fetchall() == [('{"EvictionNotObserved":1,"Preempted":2}',)]
    assert stored(index).history(h.run.run_id) == later


def test_checkpoints_and_ledger_spans_are_replaced_with_the_history(index: ExperimentIndex) -> None:
    """A run's checkpoints (keyed by run, kind, step, uri and start, a start not reported being one value) and
    ledger spans are rows of their own, replaced with its history: unchanged rows are not touched."""
    h = resumed_with_metrics()
    index.write(ups([h]))
    conn = sqlite3.connect(index.path)
    rows = conn.execute("SELECT kind, step, started_at, ended_at, status, bytes, attempt FROM checkpoints "
                        "ORDER BY kind, step, started_at").fetchall()
    assert rows == [("restore", 800, "2026-08-20T10:01:12Z", "2026-08-20T10:01:42Z", "completed", None, 1),
                    ("restore", 1000, "2026-08-20T10:26:00Z", None, "started", None, 1),
                    ("save", 1000, "2026-08-20T10:20:00Z", "2026-08-20T10:20:36.000030Z", "completed", 7_516_192_768,
                     1),
                    ("save", 1100, "2026-08-20T10:25:00Z", "2026-08-20T10:25:06Z", "failed", None, 1),
                    ("save", 1200, None, "2026-08-20T10:30:15Z", "completed", None, 1)]
    assert conn.execute('SELECT category, start, "end" FROM ledger_spans ORDER BY start').fetchall() == [
        ("checkpoint-restore", "2026-08-20T10:01:12Z", "2026-08-20T10:01:42Z"),
        ("wasted-progress", "2026-08-20T10:20:36.000030Z", "2026-08-20T10:25:06Z"),
        ("infrastructure-recovery", "2026-08-20T10:25:06Z", "2026-08-20T10:26:00Z")]
    # the restore ends, the v1 save's start becomes known, the failed save goes; a span ends later, one is new
    cps = h.checkpoints
    later = replace(h, checkpoints=[cps[0], cps[1], replace(cps[3], ended_at=at(26.5), status="completed"),
                                    replace(cps[4], started_at=at(30))],
                    ledger=[h.ledger[0], h.ledger[1], replace(h.ledger[2], end=at(26.5)),
                            LedgerSpan(category=GoodputCategory.CHECKPOINT_RESTORE, start=at(26), end=at(26.5))])
    # checkpoints: 1 updated, 1 deleted (failed save), 1 deleted and 1 inserted (the save's key changed); spans: 1
    # updated, 1 inserted; the runs row's updated_seq
    assert index.write(ups([later])) == 1 + 1 + 2 + 1 + 1 + 1
    assert stored(index).history(h.run.run_id) == later
    assert index.write(ups([later])) == 0
    assert conn.execute("SELECT COUNT(*) FROM checkpoints WHERE started_at IS NULL").fetchone() == (0,)
    index.write(ups([replace(later, checkpoints=[], ledger=[])]))
    assert conn.execute("SELECT (SELECT COUNT(*) FROM checkpoints) + (SELECT COUNT(*) FROM ledger_spans)"
                        ).fetchone() == (0,)


def test_the_reducers_history_with_checkpoint_events_round_trips(tmp_path: Path) -> None:
    """The reducer's complete history of a run that saved, restored and resumed checkpoints (intake v2), preempted
    in between (the preemption scenario): the index gives it back equal, its ledger, checkpoints and spans too."""
    from tests.core.test_scenarios import SCENARIOS
    from tracker.core.reducer import Reducer

    rid = "bert-pt-2c5nw"
    red = Reducer()
    own = ("CheckpointSave", "CheckpointRestore", "Resume")  # the scenario's own (the demo's): replaced by these
    for stream in SCENARIOS["preemption"].streams().values():
        for ev in stream:
            if not (ev.get("run_id") == rid and ev.get("kind") in own):
                red.apply(ev, "preemption")

    def intake(n: int, when: str, kind: str, **fields: Any) -> dict[str, Any]:
        return {"schema": "taugrid.io/intake/v2", "event_id": f"ck-{n}", "run_id": rid, "at": when, "kind": kind,
                **fields}

    uri = "az://ckpt/bert/step-2000"
    for i, ev in enumerate([
            intake(1, "2026-08-20T10:24:00Z", "CheckpointSave", phase="started", step=2000, uri=uri),
            intake(2, "2026-08-20T10:25:30.250Z", "CheckpointSave", phase="completed", step=2000, uri=uri,
                   bytes=1 << 33),
            intake(3, "2026-08-20T10:35:00Z", "CheckpointSave", phase="started", step=3000, uri=uri + "-3000"),
            intake(4, "2026-08-20T10:36:00Z", "CheckpointSave", phase="failed", step=3000, uri=uri + "-3000"),
            intake(5, "2026-08-20T11:10:30Z", "CheckpointRestore", phase="started", step=2000, uri=uri),
            intake(6, "2026-08-20T11:12:00Z", "CheckpointRestore", phase="completed", step=2000, uri=uri),
            intake(7, "2026-08-20T11:10:06Z", "Resume", resume_of="bert-pt-00000", checkpoint_uri=uri, step=2000)]):
        red.apply(ev, f"intake:{i}")
    red.flush()
    h = red.history(rid)
    assert h is not None
    assert h.run.ledger_basis == "progress" and h.run.checkpoints_saved == 1 and h.run.resumed_from == uri
    assert [(c.kind, c.step, c.status, c.started_at is None) for c in h.checkpoints] == [
        ("save", 2000, "completed", False), ("save", 3000, "failed", False), ("restore", 2000, "completed", False)]
    assert {sp.category for sp in h.ledger} >= {GoodputCategory.CHECKPOINT_RESTORE}
    assert all(a.ledger_gpu_hours_by for a in h.attempts)
    with ExperimentIndex(tmp_path / "index.sqlite") as ix:
        ix.write(ups([h]))
        assert stored(ix).history(rid) == h
        assert ix.write(ups([h])) == 0


def test_a_run_known_only_from_its_intake_events_has_an_empty_ledger(tmp_path: Path) -> None:
    """Step records before the run's Job or RayJob is seen (intake first, as a capture replayed in pieces or the
    changes topic may deliver them): no attempt to place them in, so no ledger yet (it crashed the derivation)."""
    from tracker.core.reducer import Reducer

    red = Reducer()
    for i, step in enumerate((100, 200)):
        red.apply({"schema": "taugrid.io/intake/v2", "event_id": f"p-{i}", "run_id": "early", "kind": "Progress",
                   "at": f"2026-08-20T10:0{i}:00Z", "step": step, "metrics": {"loss": 1.0 / step}}, "intake")
    red.apply({"schema": "taugrid.io/intake/v2", "event_id": "s-1", "run_id": "early", "kind": "CheckpointSave",
               "at": "2026-08-20T10:01:30Z", "phase": "completed", "step": 200, "uri": "az://ck/200"}, "intake")
    red.flush()
    h = red.history("early")
    assert h is not None and h.attempts == []
    assert (h.run.ledger_basis, h.run.ledger_gpu_hours_by, h.run.ledger_wall_s_by, h.ledger) == ("accounting", {}, {},
                                                                                                  [])
    assert [(c.kind, c.step) for c in h.checkpoints] == [("save", 200)] and h.run.checkpoints_saved == 1
    with ExperimentIndex(tmp_path / "index.sqlite") as ix:
        ix.write(ups([h]))
        assert stored(ix).history("early") == h
