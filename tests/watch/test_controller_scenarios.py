"""Scenarios produced by the real controllers (marked ``cluster``): Kueue (0.17 by default), the Job controller, the
KubeRay operator 1.5, kube-scheduler and kwok decide everything; the test only acts as a person would
(`tests/support/controller_scenarios.py`). The tracker's watcher captures each scenario's namespace, the capture
is folded, and the histories must agree with `EXPECTED` in everything the controllers decide, with every time one
the captured objects carry. The Ray dashboard, which KubeRay polls, is served by a stand-in
(`tests/support/ray_dashboard_standin.py`); the AdmissionCheck of the admission-check scenarios is decided by a
stand-in of its controller (`tests/support/admission_check_standin.py`), which moves the check's state when the
scenario says so.

With ``TRACKER_KEEP_CONTROLLER_CAPTURES=1`` each capture is written to
``tests/captures/controllers/<scenario>/capture.jsonl.gz`` (Kueue 0.17; another Kueue's to
``tests/captures/controllers-kueue-<version>/``) with a ``VERSIONS`` file, the regression inputs
`tests/watch/test_controller_captures.py` folds without a cluster.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from tests.infra.config import KUBERNETES_VERSION, KUEUE_VERSIONS, KWOK_VERSION, REPO_ROOT
from tests.infra.fixtures import KubeCluster, unavailable
from tests.support.admission_check_standin import AdmissionCheckStandIn
from tests.support.controller_scenarios import EXPECTED, SCENARIOS, Driver, differences, quota_free
from tests.support.laws import fold, histories
from tests.support.ray_dashboard_standin import RayDashboardStandIn
from tests.watch.test_watch_cluster import CONFIG, captured
from tracker.shell.watch import ApiError, JsonlCapture, KubeApi, Watcher

pytestmark = pytest.mark.cluster

CAPTURES = REPO_ROOT / "tests" / "captures" / "controllers"
KEEP = os.environ.get("TRACKER_KEEP_CONTROLLER_CAPTURES") == "1"


def captures_dir(kueue: str | None) -> Path:
    """Where the captures a Kueue version produced are kept: the default Kueue's in CAPTURES, another's beside it."""
    if kueue is None or kueue == KUEUE_VERSIONS[0]:
        return CAPTURES
    return CAPTURES.with_name(f"controllers-kueue-{kueue}")


@pytest.fixture(scope="module")
def standin(kube_cluster: KubeCluster) -> Iterator[RayDashboardStandIn]:
    if kube_cluster.ray_dashboard_proxy is None:
        unavailable("the simulated cluster records no Ray dashboard proxy address (an external cluster, or one "
                    "started by an older `python -m tests.infra up`): run `python -m tests.infra up` again")
    with RayDashboardStandIn(kube_cluster.kubeconfig).serve(kube_cluster.ray_dashboard_proxy) as served:
        yield served


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_controllers_produce_the_expected_history(
        scenario: str, kube_api: ApiClient, kube_cluster: KubeCluster, queue_namespace: str,
        standin: RayDashboardStandIn, tmp_path: Path) -> None:
    admin = KubeApi(kube_api)
    driver = Driver(admin, queue_namespace, kube_cluster.local_queue, standin, checks=AdmissionCheckStandIn(admin))
    await driver.start()
    await quota_free(driver)
    path = tmp_path / "capture.jsonl"
    capture = JsonlCapture(path)
    watcher = Watcher(admin, capture, replace(CONFIG, namespaces=(queue_namespace,)))
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop))
    started = time.monotonic()
    try:
        await asyncio.wait_for(watcher.wait_synced(), 60)
        await SCENARIOS[scenario](driver)
        await asyncio.sleep(3)  # the last writes (finalizers, Workload Finished) reach the watcher
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        capture.close()
        for rj in await _names(driver, "RayJob"):  # give the shared quota back now, not when the namespace goes
            await _delete(driver, "RayJob", rj)
        for j in await _names(driver, "Job"):
            await _delete(driver, "Job", j)
        for cleanup in reversed(driver.cleanups):
            await cleanup()
    elapsed = time.monotonic() - started
    records = captured(path)
    got = histories(fold(records))
    if KEEP:
        keep(scenario, records, kube_cluster, elapsed)
    assert differences(scenario, records, got, kube_cluster.kueue_version,
                       midway=lambda prefix: histories(fold(prefix))) == [], json.dumps(
        {r: {"run": {k: h["run"][k] for k in ("status", "reason", "phase", "attempts", "evictions", "retries")},
             "attempts": [(a["trigger"], a["end_reason"], a["ray_cluster"]) for a in h["attempts"]]}
         for r, h in got.items()}, indent=1)
    assert set(got) == set(EXPECTED[scenario])


async def _names(driver: Driver, kind: str) -> list[str]:
    try:
        return [o["metadata"]["name"] for o in await driver.items(kind)]
    except ApiError:
        return []


async def _delete(driver: Driver, kind: str, name: str) -> None:
    try:
        await driver.delete(kind, name)
    except ApiError as exc:
        if exc.status != 404:
            raise


def keep(scenario: str, records: list[dict[str, Any]], kube_cluster: KubeCluster, elapsed: float) -> None:
    """The capture as a regression input, with the versions that produced it."""
    out = captures_dir(kube_cluster.kueue_version) / scenario
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / "capture.jsonl.gz", "wt", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, separators=(",", ":"), sort_keys=True) + "\n")
    (out / "VERSIONS").write_text(
        f"kubernetes {KUBERNETES_VERSION} (kube-apiserver, kube-scheduler, kube-controller-manager)\n"
        f"kueue {kube_cluster.kueue_version}\nkuberay-operator {kube_cluster.kuberay_version}\nkwok {KWOK_VERSION}\n"
        f"ray-dashboard stand-in (tests/support/ray_dashboard_standin.py)\n"
        f"admission-check stand-in (tests/support/admission_check_standin.py)\n"
        f"produced by tests/watch/test_controller_scenarios.py"
        f"::test_controllers_produce_the_expected_history[{scenario}]"
        f" with TRACKER_KEEP_CONTROLLER_CAPTURES=1, {len(records)} records in {elapsed:.0f} s\n")
