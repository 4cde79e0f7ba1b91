"""Nodes in the experiment index (issue 28, schema 12): the ``nodes`` table written newest-wins in any order, a
replay of captures with Node events (watch events and ``kubectl get nodes -o json``) into it, and the migration of an
index of schema 9. SQLite and pure code."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from tests.core.test_nodes import node
from tests.support.histories import index_of_schema
from tracker.core.nodes import NodeBook
from tracker.core.reducer import Reducer
from tracker.runtime.pipeline import run_pipeline
from tracker.shell.capture import capture_files, interleave
from tracker.shell.index import ExperimentIndex

DEMO = Path(__file__).resolve().parents[2] / "tracker" / "captures" / "demo"


def _rows(path: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT name, resource_version, gpu_product, gpu_count, gpu_memory_mib, instance_type, "
                            "zone, agent_pool, ready, ready_since, unschedulable, deleted FROM nodes "
                            "ORDER BY name").fetchall()
    finally:
        conn.close()


def test_rows_are_newest_wins_in_any_order(tmp_path: Path) -> None:
    book = NodeBook()
    states = []
    for etype, obj in [("ADDED", node("a", 5)), ("MODIFIED", node("a", 7, ready="False",
                                                                   since="2026-08-20T09:30:00Z")),
                       ("ADDED", node("b", 6, cordoned=True))]:
        book.apply(etype, obj)
        states += book.take()
    newest_first = tmp_path / "newest-first.sqlite"
    with ExperimentIndex(newest_first) as ix:
        assert ix.write_nodes(list(reversed(states))) == 2  # a's older version after its newer one: no change
        assert ix.write_nodes(states) == 0
    in_order = tmp_path / "in-order.sqlite"
    with ExperimentIndex(in_order) as ix:
        assert ix.write_nodes(states) == 3
    assert _rows(newest_first) == _rows(in_order) == [
        ("a", 7, "NVIDIA-H100-80GB-HBM3", 8, 81559, "Standard_ND96isr_H100_v5", "eastus-1", "h100", 0,
         "2026-08-20T09:30:00Z", 0, 0),
        ("b", 6, "NVIDIA-H100-80GB-HBM3", 8, 81559, "Standard_ND96isr_H100_v5", "eastus-1", "h100", 1,
         "2026-08-20T08:00:00Z", 1, 0)]
    conn = sqlite3.connect(in_order)
    labels, capacity, conditions, taints = conn.execute(
        "SELECT labels, capacity, conditions, taints FROM nodes WHERE name = 'a'").fetchone()
    conn.close()
    assert json.loads(labels)["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3" and "kubernetes.io/hostname" \
        not in json.loads(labels)
    assert json.loads(capacity) == {"nvidia.com/gpu": "8"} and json.loads(taints) == [["nvidia.com/gpu", "NoSchedule"]]
    assert {c["type"]: c["since"] for c in json.loads(conditions)} == {"MemoryPressure": "2026-08-20T07:00:00Z",
                                                                     "Ready": "2026-08-20T09:30:00Z"}


def _replay(paths: list[Path], index: Path) -> int:
    with ExperimentIndex(index) as store:
        report = asyncio.run(run_pipeline(interleave(capture_files(paths)), Reducer(), sinks=[], store=store))
    return report.dead_letters


def test_a_replay_of_node_captures_writes_the_nodes_table(tmp_path: Path) -> None:
    capture = tmp_path / "nodes.jsonl"
    deleted = node("c", 20)
    deleted["metadata"]["deletionTimestamp"] = "2026-08-20T12:00:00Z"
    capture.write_text("\n".join(json.dumps(r) for r in [
        {"apiVersion": "v1", "kind": "List", "items": [node("a", 10), node("c", 11)]},  # kubectl get nodes -o json
        {"type": "MODIFIED", "object": node("a", 12, ready="False", since="2026-08-20T10:00:00Z")},
        {"type": "MODIFIED", "object": node("a", 9)},  # late: changes nothing
        {"type": "DELETED", "object": deleted},
    ]) + "\n")
    index = tmp_path / "runs.sqlite"
    assert _replay([capture], index) == 0
    assert [(r[0], r[1], r[8], r[11]) for r in _rows(index)] == [("a", 12, 0, 0), ("c", 20, 1, 1)]
    conn = sqlite3.connect(index)
    assert conn.execute("SELECT deleted_at FROM nodes WHERE name = 'c'").fetchone() == ("2026-08-20T12:00:00Z",)
    conn.close()
    _replay([capture], index)  # again: the same rows
    assert [(r[0], r[1]) for r in _rows(index)] == [("a", 12), ("c", 20)]


def test_an_index_of_schema_9_is_migrated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "index.sqlite"
    index_of_schema(path, 9, monkeypatch)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'nodes'").fetchall() == []
    conn.close()
    with ExperimentIndex(path) as ix:
        assert ix.write_nodes(NodeBook.from_json({"nodes": []}).take()) == 0
        book = NodeBook()
        book.apply("ADDED", node("a", 5))
        assert ix.write_nodes(book.take()) == 1
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("12",)
    conn.close()
    assert [r[0] for r in _rows(path)] == ["a"]
