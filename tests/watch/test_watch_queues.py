"""The watcher publishes Kueue's ClusterQueues and LocalQueues keyed by queue, and says once that the visibility API is
not served (the bare kube-apiserver has Kueue's CRDs but no Kueue: the status is written through the status
subresource, as Kueue would). Marked ``kube``; its own control plane, so no other test sees its queues."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from tests.watch.test_watch_kube import (  # noqa: F401  (admin, identity, namespace: fixtures, run on this module's plane)
    CONFIG,
    ControlPlane,
    Identity,
    admin,
    call,
    captured,
    control_plane_at,
    identity,
    namespace,
    running,
    watcher_api,
)
from tracker.core.reducer import Reducer
from tracker.shell.watch import JsonlCapture, Watcher

pytestmark = pytest.mark.kube

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with control_plane_at(tmp_path_factory.mktemp("control-plane-queues")) as plane:
        yield plane


async def _kueue_version(client: ApiClient) -> str:
    group = await call(client, "GET", "/apis/kueue.x-k8s.io")
    return str(group["preferredVersion"]["version"])


async def test_queues_are_watched_and_the_missing_visibility_api_is_said_once(
        admin: ApiClient, namespace: str, identity: Identity, tmp_path: Path) -> None:  # noqa: F811
    version = await _kueue_version(admin)
    base = f"/apis/kueue.x-k8s.io/{version}"
    cohort = "cohortName" if version == "v1beta2" else "cohort"
    cq = await call(admin, "POST", f"{base}/clusterqueues", {
        "apiVersion": f"kueue.x-k8s.io/{version}", "kind": "ClusterQueue", "metadata": {"name": f"cq-{namespace}"},
        "spec": {cohort: "all", "namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["nvidia.com/gpu"],
            "flavors": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]}})
    cq["status"] = {"pendingWorkloads": 3, "reservingWorkloads": 1, "admittedWorkloads": 1,
                    "flavorsUsage": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "8"}]}],
                    "flavorsReservation": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "8"}]}],
                    "conditions": [{"type": "Active", "status": "True", "reason": "Ready", "message": "ok",
                                    "lastTransitionTime": "2026-08-20T09:00:00Z"}]}
    cq = await call(admin, "PUT", f"{base}/clusterqueues/{cq['metadata']['name']}/status", cq)
    lq = await call(admin, "POST", f"{base}/namespaces/{namespace}/localqueues", {
        "apiVersion": f"kueue.x-k8s.io/{version}", "kind": "LocalQueue",
        "metadata": {"name": "team-lq", "namespace": namespace},
        "spec": {"clusterQueue": cq["metadata"]["name"], "stopPolicy": "Hold"}})
    path = tmp_path / "capture.jsonl"
    try:
        async with watcher_api(identity.kubeconfig) as api:
            capture = JsonlCapture(path)
            config = replace(CONFIG, namespaces=(namespace,), visibility_interval_s=1.0)
            watcher = Watcher(api, capture, config)
            async with running(watcher):
                deadline = time.monotonic() + 60
                while not {r["key"] for r in captured(path, queues=True)} >= \
                        {f"queue:{cq['metadata']['name']}", f"queue:{namespace}/team-lq"}:
                    assert time.monotonic() < deadline, captured(path, queues=True)
                    await asyncio.sleep(0.2)
                await asyncio.sleep(2.5)  # a few poll intervals: the missing visibility API is said once only
            capture.close()
    finally:
        await call(admin, "DELETE", f"{base}/clusterqueues/{cq['metadata']['name']}")
    records = captured(path, queues=True)
    assert watcher.visibility is not None and watcher.visibility.unavailable is not None
    assert "visibility.kueue.x-k8s.io" in watcher.visibility.unavailable
    assert watcher.stats.dead_letters == 0
    red = Reducer()
    for r in records:
        red.apply(r, "capture")
    out = red.flush()
    assert out.dead_letters == []
    queues = {q.key: q for q in out.queues}
    got_cq = queues[f"queue:{cq['metadata']['name']}"]
    assert (got_cq.pending, got_cq.admitted, got_cq.cohort, got_cq.active) == (3, 1, "all", True)
    assert [(r.resource, r.nominal, r.used) for r in got_cq.resources] == [("nvidia.com/gpu", "8", "8")]
    got_lq = queues[f"queue:{namespace}/team-lq"]
    assert (got_lq.cluster_queue, got_lq.stopped, got_lq.stop_policy) == (cq["metadata"]["name"], True, "Hold")
    assert lq["metadata"]["uid"] == got_lq.uid
