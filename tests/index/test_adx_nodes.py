"""Nodes into Azure Data Explorer (issue 28, point 1): ``AdxSink.write_nodes`` against the Kusto STAND-IN
(tests/support/adx_standin.py): a row per change of a Node's state (``TaugridNodeState``) with exactly the declared
columns, streamed with its mapping, sent again only when it changes; the same rows from the embedded pipeline (a
replay of the bundled captures, whose ``nodes.json`` has the Nodes the pods ran on); and ``TaugridNodes`` joining the
newest state for the GPU model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from tests.core.test_nodes import node
from tests.index.test_adx_queues import META, SCHEMA, latest, strip
from tests.index.test_adx_sink import DB, make_sink, standin  # noqa: F401  (fixtures)
from tests.support.adx_standin import KustoStandIn
from tracker.core.nodes import NodeBook
from tracker.core.reducer import Reducer
from tracker.runtime.pipeline import run_pipeline
from tracker.shell.adx import NODE_TABLES, NODES, AdxSink, node_rows
from tracker.shell.capture import capture_files, interleave
from tracker.shell.kusto_apply import schema_commands

DEMO = Path(__file__).resolve().parents[2] / "tracker" / "captures" / "demo"


def states(*versions: tuple[str, dict[str, object]]) -> NodeBook:
    b = NodeBook()
    for etype, obj in versions:
        b.apply(etype, obj)  # type: ignore[arg-type]
    return b


def test_node_rows_have_exactly_the_declared_columns() -> None:
    b = states(("ADDED", node("a")), ("ADDED", node("b", product=None)))
    rows = list(node_rows(b.nodes.values(), "c"))
    assert {t for t, _k, _r in rows} == set(NODE_TABLES)
    for table, _key, row in rows:
        assert [*META[:2], *row, META[2]] == list(SCHEMA["tables"][table]["columns"]), table


def test_write_nodes_streams_the_table_and_resends_only_changes(
        standin: KustoStandIn, make_sink: Callable[[], AdxSink]) -> None:  # noqa: F811  (imported fixtures)
    sink = make_sink()
    b = states(("ADDED", node("a", 10)))
    assert sink.write_nodes(list(b.nodes.values())) == 1
    assert sink.flush(30)
    [request] = standin.of("ingest")
    assert request.path == f"/v1/rest/ingest/{DB}/{NODES}" and request.query == {
        "streamFormat": "json", "mappingName": f"{NODES}_json"}
    assert [strip(r) for r in standin.tables[NODES]] == [{
        "Cluster": "aks-east-1", "Node": "a", "Uid": "uid-a", "ResourceVersion": 10,
        "CreatedAt": "2026-08-20T07:00:00Z", "UpdatedAt": "2026-08-20T08:00:00Z",
        "GpuProduct": "NVIDIA-H100-80GB-HBM3", "GpuCount": 8, "Ready": True, "ReadySince": "2026-08-20T08:00:00Z",
        "Unschedulable": False,
        "Labels": {"kubernetes.azure.com/agentpool": "h100", "node.kubernetes.io/instance-type":
                   "Standard_ND96isr_H100_v5", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559",
                   "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "topology.kubernetes.io/zone": "eastus-1"},
        "Capacity": {"nvidia.com/gpu": "8"}, "Allocatable": {"nvidia.com/gpu": "8"},
        "Conditions": [{"Type": "MemoryPressure", "Status": "False", "Reason": "KubeletHasSufficientMemory",
                        "Message": "", "Since": "2026-08-20T07:00:00Z"},
                       {"Type": "Ready", "Status": "True", "Reason": "KubeletReady",
                        "Message": "kubelet is posting ready status", "Since": "2026-08-20T08:00:00Z"}],
        "Taints": [{"Key": "nvidia.com/gpu", "Effect": "NoSchedule"}], "Deleted": False, "DeletedAt": None}]
    # the same state again: nothing; NotReady: a row
    assert sink.write_nodes(list(b.nodes.values())) == 0
    b.apply("MODIFIED", node("a", 12, ready="False", since="2026-08-20T10:00:00Z"))
    assert sink.write_nodes(b.take()) == 1
    assert sink.flush(30)
    [newest] = latest(standin.tables[NODES], "Cluster", "Node").values()
    assert (newest["ResourceVersion"], newest["Ready"], newest["ReadySince"]) == (12, False, "2026-08-20T10:00:00Z")


def test_replay_of_the_bundled_captures_writes_their_nodes(
        standin: KustoStandIn, make_sink: Callable[[], AdxSink]) -> None:  # noqa: F811
    sink = make_sink()
    asyncio.run(run_pipeline(interleave(capture_files([DEMO])), Reducer(), sinks=[sink]))
    assert sink.flush(60)
    text = (DEMO / "nodes.json").read_text()
    names = {v["object"]["metadata"]["name"] for v in _values(text)}
    pods = {r["Node"] for r in standin.tables["TaugridRunPods"] if r["Node"]}
    newest = latest(standin.tables[NODES], "Cluster", "Node")
    assert {n for _c, n in newest} == names and pods <= names
    assert {(r["GpuProduct"], r["GpuCount"], r["Ready"]) for r in newest.values()} == {
        ("NVIDIA-H100-80GB-HBM3", 8, True)}


def test_taugrid_nodes_joins_the_newest_node_state() -> None:
    body = next(c.text for c in schema_commands() if ") TaugridNodes(" in c.text)
    assert "let nodeState = TaugridNodeStateLatest\n        | where IngestedAt > ago(nodeLookback)" in body
    assert "| lookup kind=leftouter nodeState on Cluster, Node" in body
    assert body.split("| project ")[-1].startswith(
        "Cluster, Node, Runs, Pods, FailedPods, EvictedPods, RunsFailed, RunsEvicted, LastFailureAt, "
        "LastFailureReason, LastFailureRun, GpuProduct, GpuCount, Ready, ReadySince, Unschedulable, NodeDeleted")
    view = next(c.text for c in schema_commands() if "TaugridNodeStateLatest on table TaugridNodeState" in c.text)
    assert "summarize arg_max(Revision, *) by Cluster, Node" in view


def _values(text: str) -> list[dict[str, object]]:
    decoder, at, out = json.JSONDecoder(), 0, []
    while at < len(text.rstrip()):
        value, at = decoder.raw_decode(text, at)
        out.append(value)
        at += 1
    return out
