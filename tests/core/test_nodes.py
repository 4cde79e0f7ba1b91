"""Nodes in the core (issue 28): what is kept of a Node, the reducer's newest-wins NodeBook (laws: idempotent under
duplicates and relists, independent of the order across nodes, resumable from a snapshot), dead letters, and what
slimming keeps. Pure code."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracker.core.nodes import NodeBook, NodeState, extract_node, node_key
from tracker.core.reducer import Reducer
from tracker.shell.slim import slim
from tracker.shell.watch.keying import RunKeyer

Obj = dict[str, Any]


def node(name: str = "aks-h100-0", rv: int = 10, *, ready: str = "True", since: str = "2026-08-20T08:00:00Z",
         product: str | None = "NVIDIA-H100-80GB-HBM3", gpus: str = "8", cordoned: bool = False,
         message: str = "kubelet is posting ready status") -> Obj:
    labels = {"kubernetes.io/hostname": name, "kubernetes.azure.com/agentpool": "h100",
              "node.kubernetes.io/instance-type": "Standard_ND96isr_H100_v5", "topology.kubernetes.io/zone": "eastus-1",
              "nvidia.com/gpu.count": gpus, "nvidia.com/gpu.memory": "81559", "beta.kubernetes.io/os": "linux"}
    if product is not None:
        labels["nvidia.com/gpu.product"] = product
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(rv),
                         "creationTimestamp": "2026-08-20T07:00:00Z", "labels": labels,
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0"}, "managedFields": [{"x": 1}]},
            "spec": {"providerID": "azure:///subscriptions/x", "unschedulable": cordoned,
                     "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            "status": {"capacity": {"cpu": "96", "memory": "1900Gi", "nvidia.com/gpu": gpus, "rdma/ib": "8"},
                       "allocatable": {"cpu": "95", "nvidia.com/gpu": gpus},
                       "conditions": [
                           {"type": "Ready", "status": ready, "reason": "KubeletReady", "message": message,
                            "lastHeartbeatTime": f"2026-08-20T09:{rv % 60:02d}:00Z", "lastTransitionTime": since},
                           {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                            "lastHeartbeatTime": "2026-08-20T09:00:00Z", "lastTransitionTime": "2026-08-20T07:00:00Z"}],
                       "images": [{"names": ["nvcr.io/nvidia/pytorch:24.01"], "sizeBytes": 1}],
                       "nodeInfo": {"kubeletVersion": "v1.31.2"}}}


def event(etype: str, obj: Obj) -> Obj:
    return {"type": etype, "object": obj}


def test_what_is_kept_of_a_node() -> None:
    n = extract_node("ADDED", node(cordoned=True))
    assert n.key == node_key(node()) == "node:aks-h100-0"
    assert (n.gpu_product, n.gpu_count, n.ready, n.unschedulable) == ("NVIDIA-H100-80GB-HBM3", 8, True, True)
    assert dict(n.labels) == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
                              "nvidia.com/gpu.memory": "81559", "kubernetes.azure.com/agentpool": "h100",
                              "node.kubernetes.io/instance-type": "Standard_ND96isr_H100_v5",
                              "topology.kubernetes.io/zone": "eastus-1"}
    assert dict(n.capacity) == dict(n.allocatable) == {"nvidia.com/gpu": "8"}  # accelerators only
    assert n.taints == (("nvidia.com/gpu", "NoSchedule"),)
    assert [c.type for c in n.conditions] == ["MemoryPressure", "Ready"]
    # no label: the GPU count is the accelerator capacity's; no GPU product label at all: none
    bare = node(product=None)
    del bare["metadata"]["labels"]["nvidia.com/gpu.count"]
    assert (extract_node("ADDED", bare).gpu_count, extract_node("ADDED", bare).gpu_product) == (8, None)


def test_a_condition_message_is_redacted() -> None:
    n = extract_node("ADDED", node(message="probe failed: https://x.blob.core.windows.net/c?sv=2022&sig=SECRETSIG1"))
    ready = n.condition("Ready")
    assert ready is not None and "SECRETSIG1" not in ready.message and "probe failed" in ready.message


@pytest.mark.parametrize(("obj", "why"), [
    ({**node(), "metadata": {"uid": "u"}}, "metadata.name"),
    ({**node(), "metadata": {"name": "n"}}, "metadata.uid"),
    ({**node(), "spec": {"unschedulable": "yes"}}, "unschedulable"),
    ({**node(), "status": {"capacity": {"nvidia.com/gpu": "lots"}}}, "whole number"),
])
def test_malformed_nodes_are_dead_letters(obj: Obj, why: str) -> None:
    red = Reducer()
    red.apply(event("ADDED", obj), "t:1")
    out = red.flush()
    assert out.nodes == [] and len(out.dead_letters) == 1
    assert out.dead_letters[0].reason == "malformed Node" and why in out.dead_letters[0].detail


def test_newest_version_wins_a_heartbeat_is_not_flushed_and_a_deletion_stays() -> None:
    book = NodeBook()
    assert book.apply("ADDED", node(rv=10))
    assert [n.resource_version for n in book.take()] == [10]
    assert not book.apply("MODIFIED", node(rv=11))  # only the heartbeat moved: nothing kept changed
    assert book.take() == [] and book.nodes["node:aks-h100-0"].resource_version == 11
    assert book.apply("MODIFIED", node(rv=12, ready="False", since="2026-08-20T09:30:00Z"))
    assert not book.apply("MODIFIED", node(rv=9))  # late and older
    assert book.take()[0].ready is False
    gone = node(rv=13, ready="False", since="2026-08-20T09:30:00Z")
    gone["metadata"]["deletionTimestamp"] = "2026-08-20T10:00:00Z"
    assert book.apply("DELETED", gone)
    assert not book.apply("MODIFIED", node(rv=12))  # does not bring it back
    [n] = book.take()
    assert n.deleted and n.deleted_at is not None and n.updated_at == n.deleted_at


_VERSIONS = [node("a", 5), node("a", 6, ready="False", since="2026-08-20T09:00:00Z"), node("a", 7, cordoned=True),
             node("b", 3, product="NVIDIA-A100-SXM4-80GB"), node("b", 8, product="NVIDIA-A100-SXM4-80GB", gpus="4"),
             node("c", 4), node("c", 9)]
_DELETIONS = [("DELETED", node("c", 9)), ("DELETED", node("a", 8, cordoned=True))]


def _fold(records: list[tuple[str, Obj]], *, snapshot_at: int | None = None) -> tuple[dict[str, NodeState],
                                                                                    dict[str, NodeState]]:
    """The kept nodes after folding ``records`` (and what the flushes wrote, newest per node)."""
    red = Reducer()
    written: dict[str, NodeState] = {}
    for i, (etype, obj) in enumerate(records):
        if i == snapshot_at:
            for n in red.flush().nodes:
                written[n.key] = n
            red = Reducer.restore(copy.deepcopy(red.snapshot()))
        red.apply(event(etype, copy.deepcopy(obj)), f"t:{i}")
    for n in red.flush().nodes:
        written[n.key] = n
    return {k: n for k, n in red.nodes.nodes.items()}, written


def _content(nodes: dict[str, NodeState]) -> dict[str, tuple[Any, ...]]:
    return {k: n.content() for k, n in nodes.items()}


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_laws_order_across_nodes_duplicates_relists_and_snapshots(data: st.DataObject) -> None:
    """Any interleaving of the nodes' own version sequences, with duplicates and relists (a node's latest version
    again, ADDED), and a snapshot and restore anywhere, keeps and writes what the plain fold does."""
    per_node: dict[str, list[tuple[str, Obj]]] = {}
    for obj in _VERSIONS:
        per_node.setdefault(obj["metadata"]["name"], []).append(("MODIFIED", obj))
    for etype, obj in _DELETIONS:
        per_node[obj["metadata"]["name"]].append((etype, obj))
    plain = [r for name in sorted(per_node) for r in per_node[name]]
    expected_kept, expected_written = _fold(plain)
    queues = {k: list(v) for k, v in per_node.items()}
    mixed: list[tuple[str, Obj]] = []
    while any(queues.values()):
        name = data.draw(st.sampled_from(sorted(k for k, v in queues.items() if v)))
        rec = queues[name].pop(0)
        mixed.append(rec)
        for _ in range(data.draw(st.integers(0, 2))):  # duplicates and relists of what was seen
            mixed.append(data.draw(st.sampled_from([rec, ("ADDED", rec[1]), data.draw(st.sampled_from(mixed))])))
    at = data.draw(st.one_of(st.none(), st.integers(0, len(mixed) - 1)))
    kept, written = _fold(mixed, snapshot_at=at)
    assert _content(kept) == _content(expected_kept)
    assert _content(written) == _content(expected_written)
    assert kept["node:a"].deleted and kept["node:b"].gpu_count == 4


def test_slimmed_nodes_fold_as_the_originals_and_keep_what_is_read() -> None:
    obj = node(cordoned=True)
    s = slim(copy.deepcopy(obj))
    assert extract_node("ADDED", s) == extract_node("ADDED", obj)
    assert set(s["metadata"]["labels"]) == {"nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory",
                                            "kubernetes.azure.com/agentpool", "node.kubernetes.io/instance-type",
                                            "topology.kubernetes.io/zone"}
    assert s["status"]["capacity"] == {"nvidia.com/gpu": "8", "rdma/ib": "8"}  # extended resources only
    assert "annotations" not in s["metadata"] and "images" not in s["status"] and "nodeInfo" not in s["status"]
    assert s["spec"] == {"unschedulable": True, "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}
    assert "lastHeartbeatTime" not in s["status"]["conditions"][0]


def test_capture_records_and_bare_lists_are_keyed_by_node() -> None:
    from tracker.shell.capture import Record
    keyer = RunKeyer(max_held=10)
    assert keyer.key_record(Record("n:1", event("ADDED", node()))) == [(Record("n:1", event("ADDED", node())),
                                                                       "node:aks-h100-0")]
    listed = keyer.key_record(Record("n:2", {"kind": "List", "items": [node("x"), {"kind": "Secret"}]}))
    assert [k for _r, k in listed] == ["node:x", None]
    red = Reducer()
    red.apply({"apiVersion": "v1", "kind": "List", "items": [node("x"), node("y", product=None)]}, "n:2")
    assert [(n.name, n.gpu_product) for n in red.flush().nodes] == [("x", "NVIDIA-H100-80GB-HBM3"), ("y", None)]
