"""AdxSink and `tracker kusto apply` against the Kusto STAND-IN (tests/support/adx_standin.py): the exact requests the
azure-kusto SDK sends for our rows, retries, the queued fallback, spooling through outages, and schema apply."""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from azure.kusto.data import KustoClient, KustoConnectionStringBuilder
from structlog.testing import capture_logs

from tests.support.adx_standin import KustoStandIn, _Refused
from tests.support.histories import ups
from tracker.cli.args import DEMO_CAPTURES
from tracker.core.model import (
    AdmissionStep,
    Attempt,
    CheckpointRecord,
    GoodputCategory,
    HistoryUpdate,
    LedgerSpan,
    MetricPoint,
    MetricSummary,
    PendingCategory,
    PendingSpan,
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
from tracker.core.reducer import Reducer
from tracker.runtime.kusto_cmd import add_kusto_commands
from tracker.runtime.pipeline import PipelineLimits, run_pipeline
from tracker.runtime.sinks import AdxCollector
from tracker.settings import AdxSettings, SettingsError, load_settings
from tracker.shell.adx import STATE_COLUMNS, TABLES, AdxSink, connection, history_rows, update_rows
from tracker.shell.capture import BadRecord, capture_files, interleave
from tracker.shell.kusto_apply import PROBE, ApplyError, apply_schema, schema_commands

SCHEMA = json.loads((Path(__file__).parents[2] / "schemas" / "kusto" / "schema.json").read_text())
DB = "TauGridTest"
T0 = datetime(2026, 8, 20, 9, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


# ------------------------------------------------------------------------------------------ histories


def evicted_run(*, finished: bool) -> RunHistory:
    """A fine-tuning Job preempted once, then re-admitted; running, or succeeded when ``finished``."""
    rid = "run-llama-ft"
    cq = "gpu-a100"
    transitions = [
        Transition(run_id=rid, attempt=1, phase=Phase.RESOLUTION, at=at(0), reason="ResolutionSucceeded",
                   source="TauGrid/intake"),
        Transition(run_id=rid, attempt=1, phase=Phase.ADMISSION, at=at(1), reason="Queued",
                   source="Workload/team-a/job-llama-ft-1"),
        Transition(run_id=rid, attempt=1, phase=Phase.SCHEDULING, at=at(3), reason="Admitted",
                   message="Admitted by ClusterQueue gpu-a100", source="Workload/team-a/job-llama-ft-1"),
        Transition(run_id=rid, attempt=1, phase=Phase.RUNTIME, at=at(4), reason="Started",
                   source="Pod/team-a/llama-ft-0"),
        Transition(run_id=rid, attempt=2, phase=Phase.ADMISSION, at=at(20), reason="Preempted",
                   message="Preempted to accommodate a higher priority Workload",
                   source="Workload/team-a/job-llama-ft-1"),
        Transition(run_id=rid, attempt=2, phase=Phase.SCHEDULING, at=at(30), reason="Admitted",
                   source="Workload/team-a/job-llama-ft-1"),
        Transition(run_id=rid, attempt=2, phase=Phase.RUNTIME, at=at(31), reason="Started",
                   source="Pod/team-a/llama-ft-0"),
        Transition(run_id=rid, attempt=2, phase=Phase.PROGRESS, at=at(33), reason="FirstProgress",
                   source="TauGrid/intake"),
    ]
    if finished:
        transitions.append(Transition(run_id=rid, attempt=2, phase=Phase.COMPLETION, at=at(90),
                                      reason="Succeeded", source="Job/team-a/llama-ft"))
    pods = [PodPlacement(run_id=rid, uid="uid-llama-ft-0-a", namespace="team-a", attempt=1, pod="llama-ft-0",
                         node="aks-gpu-0", created_at=at(3), scheduled_at=at(3.5), finished_at=at(20)),
            PodPlacement(run_id=rid, uid="uid-llama-ft-0-b", namespace="team-a", attempt=2, pod="llama-ft-0",
                         node="aks-gpu-1", created_at=at(30), scheduled_at=at(30.5),
                         finished_at=at(90) if finished else None)]
    attempts = [
        Attempt(run_id=rid, attempt=1, trigger="Submitted", queued_at=at(1), admitted_at=at(3), scheduled_at=at(3.5),
                started_at=at(4), progress_at=None, ended_at=at(20), end_reason="Preempted",
                end_message="Preempted to accommodate a higher priority Workload",
                underlying_cause="PriorityPreemption", admission_wait_s=120.0, cluster_queue=cq, retries=1,
                failures=[PodFailure(pod="llama-ft-0-old", at=at(10), reason="OOMKilled", exit_code=137,
                                     message="container trainer")],
                failed_pods=1, pod_count=1, ledger_gpu_hours_by={"startup": 0.5, "wasted-progress": 0.25},
                ledger_wall_s_by={"scheduling": 150.0, "startup": 30.0, "wasted-progress": 270.0}),
        Attempt(run_id=rid, attempt=2, trigger="Preempted", queued_at=at(20), admitted_at=at(30),
                scheduled_at=at(30.5), started_at=at(31), progress_at=at(33), ended_at=at(90) if finished else None,
                end_reason="Succeeded" if finished else None, admission_wait_s=600.0, cluster_queue=cq, retries=0,
                pod_count=1),
    ]
    run = RunRecord(
        run_id=rid, kind="Job", namespace="team-a", name="llama-ft", uid="uid-llama", project="llama",
        workspace="research", target="a100-pool", queue="team-a-gpu", cluster_queue=cq,
        status=Status.SUCCEEDED if finished else Status.RUNNING, reason="Succeeded" if finished else "Started",
        phase=Phase.COMPLETION if finished else Phase.PROGRESS, attempts=2, retries=1, evictions=1,
        evictions_by={"Preempted": 1},
        created_at=at(0.5), queued_at=at(20), admitted_at=at(30), started_at=at(4),
        finished_at=at(90) if finished else None, admission_wait_s=600.0, git_commit="abc123",
        config_digest="sha256:cfg", config_ref="configs/llama.yaml", input_refs=["ds://alpaca"],
        output_uri="az://runs/llama-ft", resume_of="run-llama-base", last_checkpoint="az://runs/llama-ft/ck-3",
        ledger_basis="progress", ledger_gpu_hours_by={"startup": 0.5, "wasted-progress": 0.25, "productive": 8.0},
        ledger_wall_s_by={"scheduling": 150.0, "startup": 30.0, "wasted-progress": 270.0, "productive": 3000.0},
        ledger_until=at(90 if finished else 85), ledger_open=None if finished else "productive", ettr=3000 / 3450,
        goodput=8.0 / 8.75, resumed_from="az://runs/llama-base/ck-9", checkpoints_saved=1)
    metrics = [MetricSummary(run_id=rid, metric="loss", first_step=1, first_value=2.5, latest_step=300 if finished
                             else 120, latest_value=0.9 if finished else 1.4, min_value=0.9 if finished else 1.4,
                             max_value=2.5, points=30 if finished else 12)]
    points = [MetricPoint(run_id=rid, metric="loss", step=step, value=value, at=at(minutes))
              for step, value, minutes in ((1, 2.5, 33), (64, 1.6, 50), (256, 0.9, 85))[:3 if finished else 2]]
    checkpoints = [CheckpointRecord(kind="save", step=120, uri="az://runs/llama-ft/ck-120", started_at=at(15),
                                    ended_at=at(15.5), status="completed", bytes=1 << 30, attempt=1),
                   CheckpointRecord(kind="restore", step=120, uri="az://runs/llama-ft/ck-120", started_at=at(32),
                                    ended_at=at(32.5), status="completed", attempt=2)]
    spans = [LedgerSpan(category=GoodputCategory.WASTED_PROGRESS, start=at(15.5), end=at(20)),
             LedgerSpan(category=GoodputCategory.INFRASTRUCTURE_RECOVERY, start=at(20), end=at(32)),
             LedgerSpan(category=GoodputCategory.CHECKPOINT_RESTORE, start=at(32), end=at(32.5))]
    return RunHistory(run=run, transitions=transitions, attempts=attempts, metrics=metrics,
                      resume_links=[ResumeLink(run_id=rid, resume_of="run-llama-base")], metric_points=points,
                      pods=pods, checkpoints=checkpoints, ledger=spans)


def pending_run(message: str = "insufficient quota for nvidia.com/gpu in flavor a100") -> RunHistory:
    rid = "run-pending"
    run = RunRecord(
        run_id=rid, kind="RayJob", namespace="team-b", name="sweep", uid="uid-sweep", project="sweeps",
        workspace="applied", target="a100-pool", queue="team-b-gpu", cluster_queue=None, status=Status.PENDING,
        reason="Pending", phase=Phase.ADMISSION, attempts=1, retries=0, evictions=0, created_at=at(2),
        queued_at=at(2), admitted_at=None, started_at=None, finished_at=None, admission_wait_s=None,
        pending_reason="Pending", pending_message=message, pending_s_by={"queued": 60.0},
        pending_category="admission-check", pending_since=at(3), quota_reserved_at=at(3))
    return RunHistory(
        run=run,
        transitions=[Transition(run_id=rid, attempt=1, phase=Phase.ADMISSION, at=at(2), reason="Queued",
                                source="Workload/team-b/rayjob-sweep")],
        attempts=[Attempt(run_id=rid, attempt=1, trigger="Submitted", queued_at=at(2), admitted_at=None,
                          scheduled_at=None, started_at=None, progress_at=None, ended_at=None, end_reason=None,
                          admission_wait_s=None, retries=0, quota_reserved_at=at(3),
                          admission_steps=[AdmissionStep(kind="QuotaReserved", at=at(3), state="gpu-a100"),
                                           AdmissionStep(kind="AdmissionCheck", at=at(3), check="prov",
                                                         state="Pending", message="waiting for nodes")],
                          pending=[PendingSpan(category=PendingCategory.QUEUED, start=at(2), end=at(3)),
                                   PendingSpan(category=PendingCategory.ADMISSION_CHECK, detail="prov", start=at(3),
                                               end=None)],
                          pending_s_by={"queued": 60.0})],
        metrics=[], resume_links=[])


def iso(dt: datetime | None) -> str | None:
    return None if dt is None else dt.isoformat().replace("+00:00", "Z")


def expected_transition_rows(h: RunHistory) -> list[dict[str, Any]]:
    """What TaugridRunTransitions must receive for a history, written out from the issue's column list."""
    cq = {a.attempt: a.cluster_queue for a in h.attempts}
    r = h.run
    return [{
        "EventId": hashlib.sha256(f"{t.run_id}|{t.attempt}|{t.phase.value}|{iso(t.at)}|{t.reason}".encode())
        .hexdigest()[:32],
        "RunId": t.run_id, "Attempt": t.attempt, "Phase": t.phase.value, "At": iso(t.at), "Reason": t.reason,
        "Message": t.message, "Source": t.source, "Kind": r.kind, "Namespace": r.namespace, "Name": r.name,
        "Workspace": r.workspace, "Project": r.project, "Target": r.target, "Cluster": "aks-east-1",
        "Queue": r.queue, "ClusterQueue": cq.get(t.attempt) or r.cluster_queue, "Status": r.status.value,
    } for t in h.transitions]


def strip(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in keys}


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture
def standin() -> Iterator[KustoStandIn]:
    s = KustoStandIn().up()
    yield s
    s.down()


@pytest.fixture
def make_sink(standin: KustoStandIn, tmp_path: Path) -> Iterator[Callable[..., AdxSink]]:
    sinks: list[AdxSink] = []

    def make(**overrides: Any) -> AdxSink:
        values: dict[str, Any] = dict(
            cluster_uri=standin.url, auth="none", database=DB, source_cluster="aks-east-1",
            spool_dir=tmp_path / "spool", batch_max_delay_s=0.05, retry_attempts=2, retry_initial_s=0.01,
            retry_max_s=0.2, ingest_timeout_s=30)
        sink = AdxSink(AdxSettings(**(values | overrides)))
        sinks.append(sink)
        return sink

    yield make
    for sink in sinks:
        sink.close(timeout_s=30)


def wait_until(cond: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def delivered(standin: KustoStandIn) -> int:
    return sum(len(rows) for rows in standin.tables.values())


# ------------------------------------------------------------------------------------------ rows


def test_rows_have_exactly_the_declared_columns() -> None:
    assert set(STATE_COLUMNS) == set(field_names(RunRecord)), "every RunRecord field has a TaugridRunState column"
    seen = set()
    for h in (evicted_run(finished=True), pending_run()):
        for table, _key, row in history_rows(h, "c"):
            seen.add(table)
            assert set(row) | {"EventId", "Revision", "IngestedAt"} == set(SCHEMA["tables"][table]["columns"])
    assert seen == set(TABLES), "the sample histories produce rows for every table"


def test_write_streams_each_table_with_its_mapping(standin: KustoStandIn, make_sink: Callable[..., AdxSink]) -> None:
    sink = make_sink()
    histories = [evicted_run(finished=False), pending_run()]
    before = datetime.now(UTC)
    rows = sink.write(ups(histories))
    assert sink.flush(30)

    # 8 + 1 transitions, 2 + 1 attempts, 2 pods, 2 states, 1 metric summary, 2 metric points, 2 checkpoints
    assert rows == 21 and sink.stats.rows_sent == 21 and sink.stats.rows_queued == 21
    requests = standin.of("ingest")
    assert [r.status for r in requests] == [200] * len(TABLES)
    assert {r.path for r in requests} == {f"/v1/rest/ingest/{DB}/{t}" for t in TABLES}
    for r in requests:
        table = r.path.rsplit("/", 1)[1]
        assert r.method == "POST"
        assert r.query == {"streamFormat": "json", "mappingName": f"{table}_json"}
        assert r.headers["content-encoding"] == "gzip"
        assert r.headers["x-ms-client-request-id"].startswith("KPC.executeManagedStreamingIngest;")
        for row in r.rows():
            assert list(row)[:3] == ["IngestedAt", "EventId", "Revision"]
            assert set(row) == set(SCHEMA["tables"][table]["columns"])
            assert before <= datetime.fromisoformat(row["IngestedAt"]) <= datetime.now(UTC)
    assert not standin.of("mgmt") and not standin.of("blob"), "no fallback to queued ingestion"

    tables = standin.tables
    assert [strip(r, "IngestedAt", "Revision") for r in tables["TaugridRunTransitions"]] == [
        row for h in histories for row in expected_transition_rows(h)]
    revisions = {r["RunId"]: r["Revision"] for r in tables["TaugridRunState"]}
    assert revisions["run-llama-ft"] < revisions["run-pending"], "one strictly increasing revision per history"
    assert all(r["Revision"] == revisions[r["RunId"]] for t in TABLES for r in tables[t])

    attempts = {(r["RunId"], r["Attempt"]): r for r in tables["TaugridRunAttempts"]}
    first = attempts[("run-llama-ft", 1)]
    assert strip(first, "IngestedAt", "Revision", "EventId") == {
        "RunId": "run-llama-ft", "Attempt": 1, "Trigger": "Submitted", "Cluster": "aks-east-1", "Kind": "Job",
        "Namespace": "team-a", "Name": "llama-ft", "Workspace": "research", "Project": "llama",
        "Queue": "team-a-gpu", "ClusterQueue": "gpu-a100", "RayCluster": None, "QueuedAt": "2026-08-20T09:01:00Z",
        "AdmittedAt": "2026-08-20T09:03:00Z", "ScheduledAt": "2026-08-20T09:03:30Z",
        "StartedAt": "2026-08-20T09:04:00Z", "ProgressAt": None, "EndedAt": "2026-08-20T09:20:00Z",
        "EndReason": "Preempted", "EndMessage": "Preempted to accommodate a higher priority Workload",
        "UnderlyingCause": "PriorityPreemption", "AdmissionWaitSec": 120.0, "Retries": 1,
        "Failures": [{"Pod": "llama-ft-0-old", "At": "2026-08-20T09:10:00Z", "Reason": "OOMKilled",
                      "ExitCode": 137, "Message": "container trainer"}],
        "Pods": 1, "Gpus": 0, "GpuHours": 0.0, "LostGpuHours": 0.0, "LostGpuHoursBy": {}, "GpusOpen": 0,
        "OpenSince": None, "QuotaReservedAt": None, "AdmissionSteps": [], "Pending": [], "PendingSecBy": {},
        "LedgerGpuHoursBy": {"startup": 0.5, "wasted-progress": 0.25},
        "LedgerWallSecBy": {"scheduling": 150.0, "startup": 30.0, "wasted-progress": 270.0}}
    # Admission in steps and every pending second (issue 24): the spans as the history has them, End null while open
    waiting = attempts[("run-pending", 1)]
    assert (waiting["QuotaReservedAt"], waiting["PendingSecBy"]) == ("2026-08-20T09:03:00Z", {"queued": 60.0})
    assert waiting["AdmissionSteps"] == [
        {"Kind": "QuotaReserved", "At": "2026-08-20T09:03:00Z", "Check": None, "State": "gpu-a100", "Message": ""},
        {"Kind": "AdmissionCheck", "At": "2026-08-20T09:03:00Z", "Check": "prov", "State": "Pending",
         "Message": "waiting for nodes"}]
    assert waiting["Pending"] == [
        {"Category": "queued", "Detail": "", "Start": "2026-08-20T09:02:00Z", "End": "2026-08-20T09:03:00Z"},
        {"Category": "admission-check", "Detail": "prov", "Start": "2026-08-20T09:03:00Z", "End": None}]
    assert [strip(r, "IngestedAt", "Revision", "EventId") for r in tables["TaugridRunPods"]] == [
        {"RunId": "run-llama-ft", "Attempt": 1, "Cluster": "aks-east-1", "Namespace": "team-a", "Pod": "llama-ft-0",
         "Node": "aks-gpu-0", "CreatedAt": "2026-08-20T09:03:00Z", "StartTime": "2026-08-20T09:03:30Z",
         "EndTime": "2026-08-20T09:20:00Z", "Gpus": 0, "ReleasedAt": None, "GpuHours": 0.0, "Lost": None},
        {"RunId": "run-llama-ft", "Attempt": 2, "Cluster": "aks-east-1", "Namespace": "team-a", "Pod": "llama-ft-0",
         "Node": "aks-gpu-1", "CreatedAt": "2026-08-20T09:30:00Z", "StartTime": "2026-08-20T09:30:30Z",
         "EndTime": None, "Gpus": 0, "ReleasedAt": None, "GpuHours": 0.0, "Lost": None}]
    state = {r["RunId"]: r for r in tables["TaugridRunState"]}
    record = histories[1].run
    assert strip(state["run-pending"], "IngestedAt", "Revision", "EventId") == {"Cluster": "aks-east-1", **{
        STATE_COLUMNS[f]: (iso(v) if isinstance(v, datetime) else v) for f, v in asdict(record).items()},
        "LedgerSpans": []}
    # the goodput ledger (issue 25): the run's fields, its spans, its checkpoints as rows of their own
    ft = state["run-llama-ft"]
    assert (ft["LedgerBasis"], ft["LedgerOpen"], ft["LedgerUntil"], ft["CheckpointsSaved"], ft["ResumedFrom"]) == \
        ("progress", "productive", "2026-08-20T10:25:00Z", 1, "az://runs/llama-base/ck-9")
    assert ft["LedgerGpuHoursBy"] == {"startup": 0.5, "wasted-progress": 0.25, "productive": 8.0}
    assert (ft["Ettr"], ft["Goodput"]) == (3000 / 3450, 8.0 / 8.75)
    assert (ft["Evictions"], ft["EvictionsBy"], state["run-pending"]["EvictionsBy"]) == (1, {"Preempted": 1}, {})
    assert ft["LedgerSpans"] == [
        {"Category": "wasted-progress", "Start": "2026-08-20T09:15:30Z", "End": "2026-08-20T09:20:00Z"},
        {"Category": "infrastructure-recovery", "Start": "2026-08-20T09:20:00Z", "End": "2026-08-20T09:32:00Z"},
        {"Category": "checkpoint-restore", "Start": "2026-08-20T09:32:00Z", "End": "2026-08-20T09:32:30Z"}]
    assert [strip(r, "IngestedAt", "Revision", "EventId") for r in tables["TaugridCheckpoints"]] == [
        {"Cluster": "aks-east-1", "RunId": "run-llama-ft", "Namespace": "team-a", "Workspace": "research",
         "Project": "llama", "Attempt": 1, "Kind": "save", "Step": 120, "Uri": "az://runs/llama-ft/ck-120",
         "StartedAt": "2026-08-20T09:15:00Z", "EndedAt": "2026-08-20T09:15:30Z", "Status": "completed",
         "Bytes": 1 << 30},
        {"Cluster": "aks-east-1", "RunId": "run-llama-ft", "Namespace": "team-a", "Workspace": "research",
         "Project": "llama", "Attempt": 2, "Kind": "restore", "Step": 120, "Uri": "az://runs/llama-ft/ck-120",
         "StartedAt": "2026-08-20T09:32:00Z", "EndedAt": "2026-08-20T09:32:30Z", "Status": "completed",
         "Bytes": None}]
    assert state["run-pending"]["PendingMessage"] == "insufficient quota for nvidia.com/gpu in flavor a100"
    assert (state["run-pending"]["PendingCategory"], state["run-pending"]["PendingSince"],
            state["run-pending"]["PendingSecBy"], state["run-pending"]["QuotaReservedAt"]) == \
        ("admission-check", "2026-08-20T09:03:00Z", {"queued": 60.0}, "2026-08-20T09:03:00Z")
    assert state["run-llama-ft"]["ResumeOf"] == "run-llama-base"
    assert state["run-llama-ft"]["InputRefs"] == ["ds://alpaca"]
    assert [strip(r, "IngestedAt", "Revision", "EventId") for r in tables["TaugridMetricSummaries"]] == [
        {"Cluster": "aks-east-1", "RunId": "run-llama-ft", "Metric": "loss", "FirstStep": 1, "FirstValue": 2.5,
         "LatestStep": 120, "LatestValue": 1.4, "MinValue": 1.4, "MaxValue": 2.5, "Points": 12}]
    assert [strip(r, "IngestedAt", "Revision", "EventId") for r in tables["TaugridMetricPoints"]] == [
        {"Cluster": "aks-east-1", "RunId": "run-llama-ft", "Metric": "loss", "Step": 1, "Value": 2.5,
         "At": "2026-08-20T09:33:00Z"},
        {"Cluster": "aks-east-1", "RunId": "run-llama-ft", "Metric": "loss", "Step": 64, "Value": 1.6,
         "At": "2026-08-20T09:50:00Z"}]
    event_ids = [r["EventId"] for t in TABLES for r in tables[t]]
    assert len(event_ids) == len(set(event_ids)) == 21


def test_only_changed_rows_are_sent_again(standin: KustoStandIn, make_sink: Callable[..., AdxSink]) -> None:
    sink = make_sink()
    assert sink.write(ups([evicted_run(finished=False), pending_run()])) == 21
    assert sink.flush(30)
    sent = len(standin.of("ingest"))

    assert sink.write(ups([evicted_run(finished=False), pending_run()])) == 0
    assert sink.flush(30)
    assert len(standin.of("ingest")) == sent, "unchanged histories send nothing"

    # The run finishes: a Completion transition, attempt 2 and its pod end, new state and metric summary.
    finished = evicted_run(finished=True)
    assert sink.write(ups([finished, pending_run()])) == 6
    assert sink.flush(30)
    new = {r.path.rsplit("/", 1)[1]: r.rows() for r in standin.of("ingest")[sent:]}
    assert [(r["Phase"], r["Reason"]) for r in new["TaugridRunTransitions"]] == [("Completion", "Succeeded")]
    assert [(r["Attempt"], r["EndReason"]) for r in new["TaugridRunAttempts"]] == [(2, "Succeeded")]
    assert [(r["Attempt"], r["EndTime"]) for r in new["TaugridRunPods"]] == [(2, "2026-08-20T10:30:00Z")]
    assert [(r["RunId"], r["Status"]) for r in new["TaugridRunState"]] == [("run-llama-ft", "succeeded")]
    assert [r["LatestStep"] for r in new["TaugridMetricSummaries"]] == [300]
    assert [(r["Step"], r["Value"]) for r in new["TaugridMetricPoints"]] == [(256, 0.9)], "only the new point"

    # The reducer's updates carry the points that changed: each is sent once; every point again (a restored
    # reducer's first update) sends none of those already sent.
    rid = finished.run.run_id
    point = MetricPoint(run_id=rid, metric="loss", step=288, value=0.85, at=at(29))
    assert sink.write([HistoryUpdate(run_id=rid, points=[point])]) == 1
    assert sink.write([HistoryUpdate(run_id=rid, points=[point])]) == 0, "a point sent is not sent again"
    assert sink.write([HistoryUpdate(run_id=rid, removed_points=(("loss", 288),))]) == 0
    whole = [*(finished.metric_points or ()), point]
    assert sink.write([HistoryUpdate(run_id=rid, points=whole, points_full=True)]) == 0
    assert sink.flush(30)
    assert [(r["Step"], r["Value"]) for r in standin.tables["TaugridMetricPoints"] if r["Step"] == 288] == [(288, 0.85)]

    # A value that comes back (pending message A -> B -> A) is a change each time: the latest view must see it.
    assert sink.write(ups([pending_run("B")])) == 1
    assert sink.write(ups([pending_run()])) == 1
    assert sink.flush(30)
    assert [r["PendingMessage"] for r in standin.tables["TaugridRunState"] if r["RunId"] == "run-pending"] == [
        "insufficient quota for nvidia.com/gpu in flavor a100", "B",
        "insufficient quota for nvidia.com/gpu in flavor a100"]


def test_memo_is_bounded_per_run(standin: KustoStandIn, make_sink: Callable[..., AdxSink]) -> None:
    sink = make_sink(memo_max_runs=1)
    assert sink.write(ups([pending_run()])) == 3
    assert sink.write(ups([pending_run()])) == 0
    assert sink.write(ups([evicted_run(finished=False)])) == 18  # evicts run-pending from the memo
    assert sink.write(ups([pending_run()])) == 3, "a forgotten run is sent again (the dedup views absorb it)"
    assert sink.flush(30)
    transitions = [r["EventId"] for r in standin.tables["TaugridRunTransitions"] if r["RunId"] == "run-pending"]
    assert len(transitions) == 2 and len(set(transitions)) == 1, "a resent transition keeps its EventId"


def test_demo_captures_through_the_pipeline_leave_the_final_histories_as_latest_rows(
        standin: KustoStandIn, make_sink: Callable[..., AdxSink]) -> None:
    """The bundled demo captures, folded by the reducer in the embedded pipeline (which re-sends a run's complete
    history at every flush), through AdxSink: the newest row per key, as the views and functions read them, is
    the row of the final history, and nothing is sent twice."""
    files = capture_files([DEMO_CAPTURES])
    final = Reducer()
    for rec in interleave(files):
        if isinstance(rec, BadRecord):
            final.reject(rec.source, rec.reason, rec.excerpt)
        else:
            final.apply(rec.value, rec.source)
    updates = final.flush().updates
    assert len(updates) >= 5 and all(u.full for u in updates)

    sink = make_sink()
    report = asyncio.run(run_pipeline(interleave(files), Reducer(), sinks=[sink],
                                      limits=PipelineLimits(flush_every=500, replay_flush_every=500)))
    assert sink.flush(60)
    assert report.runs_written > len(updates), "runs were flushed several times while the captures folded"
    assert report.rows_changed == sink.stats.rows_queued == sink.stats.rows_sent == delivered(standin)

    fact = {"RunId", "Attempt", "Phase", "At", "Reason", "Message", "Source"}
    meta = {"EventId", "Revision", "IngestedAt"}
    keys = {"TaugridRunTransitions": ("RunId", "Attempt", "Phase"), "TaugridRunAttempts": ("RunId", "Attempt"),
            "TaugridRunPods": ("RunId", "Attempt", "Pod"), "TaugridRunState": ("RunId",),
            "TaugridMetricSummaries": ("RunId", "Metric"), "TaugridMetricPoints": ("RunId", "Metric", "Step"),
            # as TaugridCheckpointsLatest() keys them: a save by run, step and URI (its start may come later)
            "TaugridCheckpoints": ("RunId", "Kind", "Step", "Uri", "RestoreStartedAt")}
    assert set(keys) == set(TABLES)

    def key_of(row: dict[str, Any], key: tuple[str, ...]) -> tuple[Any, ...]:
        restore = row["StartedAt"] if row.get("Kind") == "restore" else None
        return tuple(restore if c == "RestoreStartedAt" else row[c] for c in key)

    for table, key in keys.items():
        latest: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row in standin.tables[table]:
            k = key_of(row, key)
            if k not in latest or row["Revision"] > latest[k]["Revision"]:
                latest[k] = row
        want = {key_of(row, key): row for u in updates for t, _, row in update_rows(u, "aks-east-1") if t == table}
        assert want or table != "TaugridCheckpoints", "the demo's runs saved checkpoints"
        # A transition is a fact sent once: its run context (Status, ClusterQueue, ...) is as of that batch.
        fields = fact if table == "TaugridRunTransitions" else set(SCHEMA["tables"][table]["columns"]) - meta
        assert {k: {f: v for f, v in row.items() if f in fields} for k, row in latest.items()} == \
            {k: {f: v for f, v in row.items() if f in fields} for k, row in want.items()}, table
        event_ids = [r["EventId"] for r in standin.tables[table]]
        assert len(event_ids) == len(set(event_ids)), f"{table}: a row was sent twice"


# ------------------------------------------------------------------------------------------ failures


def test_429_and_503_are_retried_then_streamed(standin: KustoStandIn, make_sink: Callable[..., AdxSink]) -> None:
    sink = make_sink()
    standin.fail("ingest", 429, 503)
    assert sink.write(ups([pending_run()])) == 3
    assert sink.flush(60)

    first = [r for r in standin.of("ingest") if r.path.endswith("/TaugridRunTransitions")]
    assert [r.status for r in first] == [429, 503, 200]
    ids = [r.headers["x-ms-client-request-id"] for r in first]
    source = ids[0].split(";")[1]
    assert ids == [f"KPC.executeManagedStreamingIngest;{source};{n}" for n in range(3)], "same payload, retried"
    assert len({r.body for r in first}) == 1
    assert {t: len(rows) for t, rows in standin.tables.items()} == {
        "TaugridRunTransitions": 1, "TaugridRunAttempts": 1, "TaugridRunState": 1}
    assert sink.stats.queued_fallbacks == 0 and sink.stats.rows_sent == 3


def test_streaming_failures_fall_back_to_queued_ingestion(standin: KustoStandIn,
                                                          make_sink: Callable[..., AdxSink]) -> None:
    sink = make_sink()
    standin.fail("ingest", 503, 503, 503)  # the SDK's three streaming attempts for the first table
    assert sink.write(ups([pending_run()])) == 3
    assert sink.flush(60)

    assert [json.loads(r.body)["csl"] for r in standin.of("mgmt")] == [
        ".get ingestion resources", ".get kusto identity token"]
    (blob,) = standin.of("blob")
    assert blob.method == "PUT" and blob.path.startswith(f"/tempstorage/{DB}__TaugridRunTransitions__")
    assert blob.headers["x-ms-blob-type"] == "BlockBlob"
    (queue,) = standin.of("queue")
    assert queue.path == "/readyforaggregation/messages"
    message = json.loads(base64.b64decode(ElementTree.fromstring(queue.body).findtext("MessageText") or ""))
    assert message["DatabaseName"] == DB and message["TableName"] == "TaugridRunTransitions"
    assert message["BlobPath"].startswith(f"{standin.url}/tempstorage/{DB}__TaugridRunTransitions__")
    props = message["AdditionalProperties"]
    assert (props["format"], props["ingestionMappingReference"], props["ingestionMappingType"]) == (
        "json", "TaugridRunTransitions_json", "Json")
    assert props["authorizationContext"] == "standin-authorization-context"

    assert standin.routes["TaugridRunTransitions"] == ["queued"]
    assert standin.routes["TaugridRunState"] == ["streaming"]
    assert [strip(r, "IngestedAt", "Revision") for r in standin.tables["TaugridRunTransitions"]] == \
        expected_transition_rows(pending_run())
    assert sink.stats.queued_fallbacks == 1


def test_sink_retries_when_the_sdk_gives_up(standin: KustoStandIn, make_sink: Callable[..., AdxSink]) -> None:
    sink = make_sink(retry_attempts=3)
    standin.fail("ingest", 503, 503, 503)  # streaming gives up ...
    standin.fail("mgmt", 503)  # ... and the queued fallback fails too: the sink backs off and tries again
    assert sink.write(ups([pending_run()])) == 3
    assert sink.flush(60)
    assert sink.stats.retries == 1 and sink.stats.spooled_rows == 0
    assert {t: len(rows) for t, rows in standin.tables.items()} == {
        "TaugridRunTransitions": 1, "TaugridRunAttempts": 1, "TaugridRunState": 1}


def test_a_hung_call_is_abandoned_at_its_deadline_and_retried(standin: KustoStandIn,
                                                              make_sink: Callable[..., AdxSink]) -> None:
    # deadlines generous enough that only the stalled call misses one on a loaded machine
    sink = make_sink(ingest_timeout_s=2.0)
    standin.stall("ingest", 6.0)
    assert sink.write(ups([pending_run()])) == 3
    assert sink.flush(60)
    assert sink.stats.retries >= 1
    transitions = [r.status for r in standin.of("ingest") if r.path.endswith("/TaugridRunTransitions")]
    assert len(transitions) >= 2, "the first call was given up after 2 s and sent again"
    # The abandoned call completes anyway: at-least-once, the same EventId twice (the Dedup view keeps one).
    wait_until(lambda: len(standin.tables["TaugridRunTransitions"]) >= 2)
    assert len({r["EventId"] for r in standin.tables["TaugridRunTransitions"]}) == 1


def test_permanent_rejection_keeps_the_rows_on_disk(standin: KustoStandIn, make_sink: Callable[..., AdxSink],
                                                    tmp_path: Path) -> None:
    sink = make_sink()
    standin.fail("ingest", 400, 400, 400)
    assert sink.write(ups([pending_run()])) == 3
    assert sink.flush(60)
    (kept,) = (tmp_path / "spool" / "rejected").glob("*.TaugridRunTransitions.jsonl")
    assert [strip(json.loads(line), "Revision") for line in kept.read_bytes().splitlines()] == \
        expected_transition_rows(pending_run())
    assert sink.stats.rejected_rows == 1
    assert set(standin.tables) == {"TaugridRunAttempts", "TaugridRunState"}, "the other tables go on"

    # Once the cause is fixed, rejected files moved back into the spool are drained by the next start.
    sink.close(timeout_s=30)
    kept.rename(tmp_path / "spool" / kept.name)
    again = make_sink()
    wait_until(lambda: len(standin.tables["TaugridRunTransitions"]) == 1)
    assert again.stats.spool_files == 0


def test_outage_spools_and_drains_in_order(standin: KustoStandIn, make_sink: Callable[..., AdxSink],
                                           tmp_path: Path) -> None:
    sink = make_sink()
    collector = AdxCollector()
    collector.sink = sink
    standin.outage = 503
    assert sink.write(ups([evicted_run(finished=False), pending_run()])) == 21
    assert sink.flush(60)
    assert sink.stats.spooled_rows == 21 and sink.stats.spool_files == len(TABLES)
    assert sink.spool_bytes == sum(p.stat().st_size for p in (tmp_path / "spool").glob("*.jsonl")) > 0
    assert not standin.tables
    # what a scraper sees during the outage (issue 17): the spool's files, bytes and age
    time.sleep(0.05)
    seen = {m.name: m.samples[0].value for m in collector.collect()}
    assert seen["tracker_adx_spool_files"] == len(TABLES) and seen["tracker_adx_spool_bytes"] == sink.spool_bytes
    assert seen["tracker_adx_spool_oldest_age_seconds"] > 0 and seen["tracker_adx_rows_spooled"] == 21

    standin.down()  # now connections are refused
    standin.outage = None
    assert sink.write(ups([evicted_run(finished=True), pending_run("B")])) == 7
    assert sink.flush(60)
    assert sink.stats.spooled_rows == 28 and not standin.tables

    standin.up()
    wait_until(lambda: sink.stats.spool_files == 0 and delivered(standin) == 28)
    assert sink.spool_bytes == 0 and not list((tmp_path / "spool").glob("*.jsonl"))
    seen = {m.name: m.samples[0].value for m in collector.collect()}
    assert seen["tracker_adx_spool_files"] == seen["tracker_adx_spool_oldest_age_seconds"] == 0
    assert seen["tracker_adx_rows_sent"] == 28 and seen["tracker_adx_rows_rejected"] == 0
    # Nothing lost or doubled, and each table got its rows in the order they were written.
    event_ids = [r["EventId"] for t in TABLES for r in standin.tables[t]]
    assert len(event_ids) == len(set(event_ids)) == 28
    for t in TABLES:
        revisions = [r["Revision"] for r in standin.tables[t]]
        assert revisions == sorted(revisions), t
    assert [(r["RunId"], r["Status"], r["PendingMessage"]) for r in standin.tables["TaugridRunState"]] == [
        ("run-llama-ft", "running", ""), ("run-pending", "pending", pending_run().run.pending_message),
        ("run-llama-ft", "succeeded", ""), ("run-pending", "pending", "B")]
    ingested = [datetime.fromisoformat(r["IngestedAt"]) for r in standin.tables["TaugridRunState"]]
    assert ingested == sorted(ingested), "IngestedAt is the delivery time, after the outage"

    assert sink.write(ups([pending_run()])) == 1
    assert sink.flush(30)
    assert sink.stats.spooled_rows == 28 and delivered(standin) == 29, "after the drain rows stream directly"


def test_full_spool_blocks_write_until_kusto_is_back(standin: KustoStandIn,
                                                     make_sink: Callable[..., AdxSink]) -> None:
    sink = make_sink(spool_max_bytes=1, queue_max_rows=2, batch_max_rows=2)
    standin.outage = 503
    writer = threading.Thread(target=sink.write, args=(ups([evicted_run(finished=False), pending_run()]),))
    writer.start()
    wait_until(lambda: sink.stats.backpressure_waits > 0)
    writer.join(1.0)
    assert writer.is_alive(), "write() waits while neither Kusto nor the spool takes rows"
    assert sink.stats.spool_files == 0 and not standin.tables

    standin.outage = None
    writer.join(60)
    assert not writer.is_alive()
    assert sink.flush(60)
    assert delivered(standin) == 21 and sink.stats.spooled_rows == 0


def test_foreign_files_in_the_spool_are_ignored_with_one_warning_never_deleted(
        standin: KustoStandIn, make_sink: Callable[..., AdxSink], tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    (spool / "rejected").mkdir(parents=True)
    foreign = {"notes.jsonl": b'{"a": 1}', "12.jsonl": b"x", "0000000000000009.NotATable.jsonl": b'{"RunId": "x"}',
               "rejected/kept-by-an-operator.jsonl": b"y", "0000000000000005.TaugridRunState.jsonl.bak": b"z"}
    for name, data in foreign.items():
        (spool / name).write_bytes(data)
    standin.outage = 503
    with capture_logs() as logs:
        sink = make_sink()
    warnings = [e for e in logs if e["event"] == "adx_spool_foreign_files_ignored"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    assert warnings[0]["files"] == sorted(n for n in foreign if n.endswith(".jsonl"))
    assert sink.stats.spool_files == 0 and sink.spool_bytes == 0

    assert sink.write(ups([pending_run()])) == 3
    assert sink.flush(60)
    assert sink.stats.spool_files == 3, "its own rows are spooled beside the foreign files"
    standin.outage = None
    wait_until(lambda: sink.stats.spool_files == 0 and delivered(standin) == 3)
    assert {(spool / name).read_bytes() for name in foreign} == set(foreign.values()), "left as they were"
    assert {r["RunId"] for t in TABLES for r in standin.tables[t]} == {"run-pending"}, "never sent"


def test_spool_left_by_a_previous_process_is_drained_first(standin: KustoStandIn,
                                                           make_sink: Callable[..., AdxSink]) -> None:
    standin.outage = 503
    first = make_sink()
    assert first.write(ups([pending_run("A")])) == 3
    first.close(timeout_s=60)
    assert first.stats.spool_files == 3 and not standin.tables

    standin.outage = None
    second = make_sink()
    assert second.stats.spool_files == 3
    assert second.write(ups([pending_run("B")])) == 3
    assert second.flush(30)
    wait_until(lambda: delivered(standin) == 6)
    assert [r["PendingMessage"] for r in standin.tables["TaugridRunState"]] == ["A", "B"]


def test_close_delivers_what_is_queued(standin: KustoStandIn, make_sink: Callable[..., AdxSink]) -> None:
    sink = make_sink(batch_max_delay_s=3600)
    assert sink.write(ups([pending_run()])) == 3
    sink.close(timeout_s=30)
    assert delivered(standin) == 3
    with pytest.raises(RuntimeError):
        sink.write(ups([pending_run("B")]))


def test_rows_read_back_through_the_sdk_query_path(standin: KustoStandIn,
                                                   make_sink: Callable[..., AdxSink]) -> None:
    sink = make_sink()
    sink.write(ups([pending_run()]))
    assert sink.flush(30)
    with KustoClient(KustoConnectionStringBuilder.with_no_authentication(standin.url)) as client:
        result = client.execute_query(DB, "TaugridRunState").primary_results[0]
    assert [(row["RunId"], row["Status"], row["PendingReason"]) for row in result] == [
        ("run-pending", "pending", "Pending")]


# ------------------------------------------------------------------------------------------ settings


def test_settings_from_environment_and_auth_modes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRACKER_ADX__CLUSTER_URI", "https://taugrid.westeurope.kusto.windows.net")
    monkeypatch.setenv("TRACKER_ADX__AUTH", "app-secret")
    monkeypatch.setenv("TRACKER_ADX__CLIENT_ID", "app-id")
    monkeypatch.setenv("TRACKER_ADX__TENANT_ID", "tenant-id")
    monkeypatch.setenv("TRACKER_ADX__CLIENT_SECRET", "s3cr3t-value")
    monkeypatch.setenv("TRACKER_ADX__BATCH_MAX_ROWS", "500")
    s = load_settings().adx
    assert (s.cluster_uri, s.batch_max_rows, s.database) == ("https://taugrid.westeurope.kusto.windows.net", 500,
                                                             "Metrics")
    assert "s3cr3t-value" not in repr(s) and "s3cr3t-value" not in str(s.model_dump())
    kcsb = connection(s, s.cluster_uri)
    assert (kcsb.application_client_id, kcsb.application_key, kcsb.authority_id) == (
        "app-id", "s3cr3t-value", "tenant-id")

    monkeypatch.delenv("TRACKER_ADX__CLIENT_SECRET")
    with pytest.raises(SettingsError, match="client_secret"):
        load_settings()

    msi = connection(AdxSettings(auth="managed-identity", client_id="uami"), "https://c.kusto.windows.net")
    assert msi.msi_authentication and msi.msi_parameters == {"client_id": "uami"}

    token = tmp_path / "token"
    token.write_text("federated-token")
    monkeypatch.setenv("AZURE_FEDERATED_TOKEN_FILE", str(token))
    wi = connection(AdxSettings(auth="workload-identity", client_id="app-id", tenant_id="tenant-id"),
                    "https://c.kusto.windows.net")
    assert wi.azure_credential is not None and wi.aad_federated_security

    none = connection(AdxSettings(auth="none"), "http://127.0.0.1:8080")
    assert not none.aad_federated_security
    with pytest.raises(ValueError, match="TRACKER_ADX__CLUSTER_URI"):
        connection(AdxSettings(auth="none"), "")


# ------------------------------------------------------------------------------------------ kusto apply


def test_kusto_apply_dry_run_prints_every_command(standin: KustoStandIn, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TRACKER_ADX__DATABASE", DB)
    parser = argparse.ArgumentParser()
    add_kusto_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["kusto", "apply", "--dry-run"])
    assert args.func(args, None) == 0
    out = capsys.readouterr().out
    commands = schema_commands()
    assert out.startswith(f"// {len(commands)} commands for database {DB} (dry run: nothing sent)\n")
    positions = [out.index(f"// {c.file} #{c.index}\n{c.text}\n") for c in commands]
    assert positions == sorted(positions), "printed in apply order"
    assert not standin.requests, "a dry run sends nothing"


def test_kusto_apply_sends_the_commands_in_order(standin: KustoStandIn) -> None:
    settings = AdxSettings(cluster_uri=standin.url, auth="none", database=DB, mgmt_timeout_s=90)
    out = io.StringIO()
    commands = apply_schema(settings, dry_run=False, out=out)
    probe, *sent = [r.json() for r in standin.of("mgmt")]
    assert probe["csl"] == PROBE and json.loads(probe["properties"])["Options"]["servertimeout"] == "0:00:30"
    assert [s["csl"] for s in sent] == [c.text for c in commands]
    assert {s["db"] for s in sent} == {DB}
    assert all(json.loads(s["properties"])["Options"]["servertimeout"] == "0:01:30" for s in sent)
    assert [c.file for c in commands][:1] == ["010-tables.kql"] and commands[-1].file == "050-functions.kql"
    assert out.getvalue().endswith(f"applied {len(commands)} commands to database {DB} at {standin.url}\n")


def test_kusto_apply_stops_at_the_first_failure(standin: KustoStandIn, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in {"CLUSTER_URI": standin.url, "AUTH": "none", "DATABASE": DB}.items():
        monkeypatch.setenv(f"TRACKER_ADX__{k}", v)
    answer = standin._mgmt

    def refuse_the_second_command(req: Any) -> Any:
        if len(standin.of("mgmt")) == 3:  # the probe, the first command, then this one
            raise _Refused("no")
        return answer(req)

    monkeypatch.setattr(standin, "_mgmt", refuse_the_second_command)
    parser = argparse.ArgumentParser()
    add_kusto_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["kusto", "apply"])
    assert args.func(args, None) == 1
    assert len(standin.of("mgmt")) == 3
    captured = capsys.readouterr()
    assert "error: kusto apply:" in captured.err
    assert "[2/" in captured.out and "[3/" not in captured.out


def test_kusto_apply_gives_up_after_the_connect_phase_when_the_cluster_does_not_answer(
        standin: KustoStandIn) -> None:
    assert AdxSettings().connect_timeout_s == 30 < AdxSettings().mgmt_timeout_s == 600
    standin.stall("mgmt", 20)  # the first request is answered only after 20 s
    settings = AdxSettings(cluster_uri=standin.url, auth="none", database=DB, connect_timeout_s=1)
    out = io.StringIO()
    started = time.monotonic()
    with pytest.raises(ApplyError, match=r"did not answer within 1s \(the connect phase; "
                                         r"TRACKER_ADX__CONNECT_TIMEOUT_S\): nothing was applied"):
        apply_schema(settings, dry_run=False, out=out)
    assert time.monotonic() - started < 5
    assert [r.json()["csl"] for r in standin.of("mgmt")] == [PROBE]
    assert out.getvalue().startswith(f"connecting to {standin.url} (database {DB}; up to 1s")


def test_kusto_apply_shows_which_command_of_how_many_while_it_waits(standin: KustoStandIn) -> None:
    standin.stall("mgmt", 0)  # the probe
    standin.stall("mgmt", 1.5)  # the first command takes 1.5 s
    settings = AdxSettings(cluster_uri=standin.url, auth="none", database=DB)
    lines: list[tuple[float, str]] = []

    class Terminal(io.StringIO):
        """Records when each line is flushed."""

        def flush(self) -> None:
            lines.extend((time.monotonic(), line) for line in self.getvalue().splitlines())
            self.seek(0)
            self.truncate()

    started = time.monotonic()
    commands = apply_schema(settings, dry_run=False, out=Terminal(), progress_every_s=0.5)
    total = len(commands)
    first = [(t - started, line) for t, line in lines if line.startswith(f"[1/{total}] ")]
    assert first[0][1] == f"[1/{total}] {commands[0].file} #1: {commands[0].text.splitlines()[0][:100]}"
    assert first[0][0] < 1.0, "shown when it is sent, not when it is done"
    waiting = [line for _t, line in first if "still running after" in line]
    assert 2 <= len(waiting) <= 3 and "TRACKER_ADX__MGMT_TIMEOUT_S" in waiting[0]
    assert [line for _t, line in lines if line.startswith(f"[{total}/{total}] ")]


def test_kusto_apply_progress_reaches_a_pipe_as_it_happens(standin: KustoStandIn) -> None:
    """Not only on a terminal: each line is flushed, so `kubectl logs` of a Job shows where apply waits."""
    standin.stall("mgmt", 0)
    standin.stall("mgmt", 30)  # the first command hangs
    env = {**os.environ, "TRACKER_ADX__CLUSTER_URI": standin.url, "TRACKER_ADX__AUTH": "none",
           "TRACKER_ADX__DATABASE": DB}
    proc = subprocess.Popen([sys.executable, "-m", "tracker.cli", "kusto", "apply"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).parents[2])
    try:
        assert proc.stdout is not None
        seen: list[bytes] = []
        reader = threading.Thread(target=lambda: seen.extend(iter(proc.stdout.readline, b"")), daemon=True)
        reader.start()
        wait_until(lambda: any(line.startswith(b"[1/") for line in seen), timeout_s=20)
        assert seen[0].startswith(b"connecting to ")
    finally:
        proc.kill()
        proc.wait()
