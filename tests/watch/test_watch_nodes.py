"""The watcher publishes Nodes keyed by node with the ClusterRole of deploy/k8s/rbac (issue 28, point 1): a Node object
created in the real kube-apiserver with NVIDIA's GPU labels, its status written through the status subresource (as
the kubelet would), then NotReady and cordoned, is captured by the watcher under the watcher's ServiceAccount, and a
replay of the capture writes its newest state to the index's ``nodes`` table. Marked ``kube``; its own control plane,
so no other test sees its Node."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient
from rich.console import Console

from tests.watch.test_watch_kube import (  # noqa: F401  (admin, identity: fixtures, run on this module's plane)
    CONFIG,
    CORE,
    ControlPlane,
    Identity,
    admin,
    call,
    captured,
    control_plane_at,
    identity,
    running,
    watcher_api,
)
from tracker.runtime.replay import replay
from tracker.shell.watch import JsonlCapture, Watcher

pytestmark = pytest.mark.kube

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with control_plane_at(tmp_path_factory.mktemp("control-plane-nodes")) as plane:
        yield plane


def _node_records(path: Path, name: str) -> list[Obj]:
    return [r for r in captured(path, queues=True) if r.get("key") == f"node:{name}"]


async def test_a_gpu_node_is_watched_and_lands_in_the_index(
        admin: ApiClient, identity: Identity, tmp_path: Path) -> None:  # noqa: F811
    name = "aks-h100-test-vmss000000"
    node = await call(admin, "POST", f"{CORE}/nodes", {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
            "kubernetes.azure.com/agentpool": "h100", "kubernetes.io/hostname": name}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}})
    node["status"] = {"capacity": {"cpu": "96", "nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                      "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                      "message": "kubelet is posting ready status",
                                      "lastHeartbeatTime": "2026-08-20T09:00:00Z",
                                      "lastTransitionTime": "2026-08-20T09:00:00Z"}]}
    node = await call(admin, "PUT", f"{CORE}/nodes/{name}/status", node)
    path = tmp_path / "capture.jsonl"
    try:
        async with watcher_api(identity.kubeconfig) as api:
            capture = JsonlCapture(path)
            watcher = Watcher(api, capture, CONFIG)  # the ServiceAccount of deploy/k8s/rbac: Nodes allowed
            async with running(watcher):
                node["status"]["conditions"][0].update(status="False", reason="KubeletNotReady",
                                                       lastTransitionTime="2026-08-20T10:00:00Z")
                node = await call(admin, "PUT", f"{CORE}/nodes/{name}/status", node)
                node["spec"]["unschedulable"] = True
                node = await call(admin, "PUT", f"{CORE}/nodes/{name}", node)
                deadline = time.monotonic() + 60
                while not any(r["object"]["metadata"]["resourceVersion"] == node["metadata"]["resourceVersion"]
                              for r in _node_records(path, name)):
                    assert time.monotonic() < deadline, _node_records(path, name)
                    await asyncio.sleep(0.2)
            capture.close()
    finally:
        await call(admin, "DELETE", f"{CORE}/nodes/{name}")
    records = _node_records(path, name)
    assert watcher.stats.unavailable == 0 and watcher.stats.dead_letters == 0
    assert set(records[0]["object"]["metadata"]["labels"]) == {"nvidia.com/gpu.product", "nvidia.com/gpu.count",
                                                               "kubernetes.azure.com/agentpool"}  # slimmed
    index = tmp_path / "index.sqlite"
    report = await asyncio.to_thread(replay, captures=[path], index_path=index, console=Console(quiet=True),
                                     quiet=True)  # tracker replay (its own event loop)
    assert report.dead_letters == 0
    conn = sqlite3.connect(index)
    rows = conn.execute("SELECT name, uid, resource_version, gpu_product, gpu_count, agent_pool, ready, ready_since, "
                        "unschedulable, capacity, deleted FROM nodes").fetchall()
    conn.close()
    assert rows == [(name, node["metadata"]["uid"], int(node["metadata"]["resourceVersion"]), "NVIDIA-H100-80GB-HBM3",
                     8, "h100", 0, "2026-08-20T10:00:00Z", 1, '{"nvidia.com/gpu":"8"}', 0)]
