"""Kueue's queues into Azure Data Explorer (issue 24, point 4): ``AdxSink.write_queues`` against the Kusto STAND-IN
(tests/support/adx_standin.py): a row per change of a queue's state (``TaugridQueueState``) and of a pending run's
position
(``TaugridQueuePositions``), with exactly the declared columns, streamed with their mappings, sent again only when
they change; and the same rows from the embedded pipeline (replay) of captures with queue objects."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.core.test_queues import DEMO, cq, ev, lq, position
from tests.index.test_adx_sink import DB, make_sink, standin  # noqa: F401  (fixtures)
from tests.support.adx_standin import KustoStandIn
from tracker.core.queues import QueueBook
from tracker.core.reducer import Reducer
from tracker.runtime.pipeline import run_pipeline
from tracker.shell.adx import POSITIONS, QUEUE_TABLES, QUEUES, AdxSink, queue_rows
from tracker.shell.capture import capture_files, interleave

SCHEMA = json.loads((Path(__file__).parents[2] / "schemas" / "kusto" / "schema.json").read_text())
META = ("EventId", "Revision", "IngestedAt")


def book(*records: dict[str, Any]) -> QueueBook:
    b = QueueBook()
    for r in records:
        if "schema" in r:
            b.position(r)
        else:
            b.apply(r["type"], r["object"])
    return b


def strip(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in META}


def latest(rows: list[dict[str, Any]], *key: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The newest row per key by Revision, as the views TaugridQueueStateLatest / ...PositionsLatest keep them."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        k = tuple(row[c] for c in key)
        if k not in out or row["Revision"] > out[k]["Revision"]:
            out[k] = row
    return out


def wait_until(cond: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_queue_rows_have_exactly_the_declared_columns() -> None:
    b = book(ev("ADDED", cq()), ev("ADDED", lq()), position(), position("other", pos=None))
    seen = set()
    for table, _key, row in queue_rows(b.queues.values(), b.positions.values(), "c"):
        seen.add(table)
        assert [*META[:2], *row, META[2]] == list(SCHEMA["tables"][table]["columns"]), table
    assert seen == set(QUEUE_TABLES)


def test_write_queues_streams_each_table_and_resends_only_changes(
        standin: KustoStandIn, make_sink: Callable[[], AdxSink]) -> None:  # noqa: F811  (imported fixtures)
    sink = make_sink()
    b = book(ev("ADDED", cq()), ev("ADDED", lq()), position())
    assert sink.write_queues(list(b.queues.values()), list(b.positions.values())) == 3
    assert sink.flush(30)
    requests = standin.of("ingest")
    assert sorted(r.path for r in requests) == sorted(f"/v1/rest/ingest/{DB}/{t}" for t in QUEUE_TABLES)
    for r in requests:
        table = r.path.rsplit("/", 1)[1]
        assert r.status == 200 and r.query == {"streamFormat": "json", "mappingName": f"{table}_json"}
        for row in r.rows():
            assert set(row) == set(SCHEMA["tables"][table]["columns"])
    assert {r["Key"]: strip(r) for r in standin.tables[QUEUES]}["queue:gpu-cq"] == {
        "Cluster": "aks-east-1", "Key": "queue:gpu-cq", "Kind": "ClusterQueue", "Namespace": None, "Name": "gpu-cq",
        "Uid": "cq-uid", "ResourceVersion": 10, "UpdatedAt": "2026-08-20T09:00:05Z", "ClusterQueue": "gpu-cq",
        "Cohort": "all", "StopPolicy": None, "Stopped": False, "Active": True, "ActiveReason": "Ready",
        "ActiveMessage": "m", "Pending": 3, "Reserving": 1, "Admitted": 1, "AdmissionChecks": ["prov"],
        "Resources": [{"Flavor": "h100", "Resource": "cpu", "Nominal": "96", "BorrowingLimit": "8", "Reserved": None,
                       "Used": "500m"},
                      {"Flavor": "h100", "Resource": "nvidia.com/gpu", "Nominal": "8", "BorrowingLimit": None,
                       "Reserved": "8", "Used": "8"}],
        "Deleted": False}
    assert [strip(r) for r in standin.tables[POSITIONS]] == [{
        "Cluster": "aks-east-1", "RunId": "qwen-rm-5vt2j", "Namespace": "team-a", "Workload": "job-qwen-rm-5vt2j",
        "ClusterQueue": "gpu-cq", "LocalQueue": "team-a-lq", "PositionInClusterQueue": 2, "PositionInLocalQueue": 1,
        "PolledAt": "2026-08-20T12:59:00Z"}]
    sent = len(standin.of("ingest"))

    # the same state again: nothing; the ClusterQueue stopped and a newer poll: a row each
    assert sink.write_queues(list(b.queues.values()), list(b.positions.values())) == 0
    b2 = book(ev("MODIFIED", cq("12", pending=4, stop="Hold")), position(at="2026-08-20T12:59:30Z", pos=1))
    assert sink.write_queues([*b.queues.values(), *b2.queues.values()], list(b2.positions.values())) == 2
    assert sink.flush(30)
    new = [row for r in standin.of("ingest")[sent:] for row in r.rows()]
    assert sorted((r.get("Key") or r["RunId"], r.get("Pending"), r.get("PositionInClusterQueue")) for r in new) == [
        ("queue:gpu-cq", 4, None), ("qwen-rm-5vt2j", None, 1)]
    newest = latest(standin.tables[QUEUES], "Cluster", "Key")
    assert {k[1]: (r["ResourceVersion"], r["Pending"], r["Stopped"], r["StopPolicy"]) for k, r in newest.items()} \
        == {"queue:gpu-cq": (12, 4, True, "Hold"), "queue:team-a/team-a-lq": (11, 2, False, None)}
    assert [r["PositionInClusterQueue"] for r in latest(standin.tables[POSITIONS], "Cluster", "RunId").values()] == [1]
    event_ids = [r["EventId"] for t in QUEUE_TABLES for r in standin.tables[t]]
    assert len(event_ids) == len(set(event_ids)) == 5


def test_replay_with_queue_captures_writes_the_queue_tables(
        standin: KustoStandIn, make_sink: Callable[[], AdxSink], tmp_path: Path) -> None:  # noqa: F811
    """The embedded pipeline hands the queues to every sink that keeps them: the ADX sink gets the newest state."""
    capture = tmp_path / "queues.jsonl"
    capture.write_text("\n".join(json.dumps(r) for r in [
        ev("ADDED", cq("10", pending=5)), ev("ADDED", lq()), ev("MODIFIED", cq("12", pending=3, stop="Hold")),
        position()]) + "\n")
    sink = make_sink()
    asyncio.run(run_pipeline(interleave(capture_files([DEMO, capture])), Reducer(), sinks=[sink]))
    assert sink.flush(60)
    newest = latest(standin.tables[QUEUES], "Cluster", "Key")
    assert {k: (r["Pending"], r["Stopped"]) for (_, k), r in newest.items()} == \
        {"queue:gpu-cq": (3, True), "queue:team-a/team-a-lq": (2, False)}
    assert [(r["RunId"], r["PositionInClusterQueue"]) for r in standin.tables[POSITIONS]] == [("qwen-rm-5vt2j", 2)]
    assert standin.tables["TaugridRunState"], "the runs' rows go on as before"
