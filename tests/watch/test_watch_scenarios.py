"""Every bundled lifecycle scenario written through a real kube-apiserver, watched by the real watcher (``kube``).

``sim/scenarios.py`` holds what the controllers of one cluster wrote for fourteen runs (quota waits,
preemption, PodsReady timeouts, deactivation and reactivation, OOM and pod retries, unschedulable pods, RayJob
retries, ...), and
``tests/core/test_scenarios.py`` the exact histories they fold to. Here each scenario is *driven* through the API as
the controllers would: objects created with POST, specs and metadata changed with PUT, statuses with PUT on the
``status`` subresource, pods bound with the ``binding`` subresource, graceful deletes with a grace period and
finalizers removed afterwards, Events created and updated with their counts and series. The watcher (running as
the ServiceAccount of deploy/k8s/rbac/clusterrole.yaml) captures it all, and:

- every state the API returned is in the capture, none twice, and the capture folds to exactly the same
  histories as the written objects, times included (the watcher loses and duplicates nothing);
- folded with the scenario's intake events, each run agrees with its expected history in
  ``tests/core/test_scenarios.py`` in all that does not depend on a time the API server assigns itself (see
  ``comparable``): status, reason, final phase, attempts, evictions, each attempt's trigger, end reason and
  underlying cause, the re-admissions and the final transition. ``creationTimestamp`` and
  ``deletionTimestamp`` are "now" on the server, hours after the scenario's own times, and the run id of a
  run keyed by its Job uid is the server's uid.

Three translations are made, each named where it happens: Workloads written as v1beta2 by a scenario are
converted to v1beta1 (what Kueue's conversion webhook does; the test environment's Kueue 0.12 serves v1beta1
only); Events of client-go's legacy recorder are written through core/v1, as that recorder does (the
events.k8s.io API refuses them), and read back by the watcher through events.k8s.io; a Job's selector and
template labels are left to the API server to generate.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from sim.scenarios import SCENARIOS, _cluster
from tests.core.test_scenarios import EXPECTED
from tests.support.laws import fold
from tests.watch.test_watch_kube import (  # noqa: F401  (module-scoped fixtures: one private control plane here)
    CONFIG,
    ApiError,
    Identity,
    admin,
    call,
    captured,
    client_for,
    control_plane,
    identity,
    missing,
    running,
    wait_captured,
    watcher_api,
)
from tracker.core.model import to_json
from tracker.shell.watch import JsonlCapture, Watcher

pytestmark = pytest.mark.kube

Obj = dict[str, Any]

PLURALS = {"Job": "jobs", "Pod": "pods", "Event": "events", "Workload": "workloads", "RayJob": "rayjobs",
           "RayCluster": "rayclusters"}
SERVER_SET_META = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields",
                   "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink")
JOB_GENERATED_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid", "batch.kubernetes.io/job-name",
                        "job-name")


def object_path(api_version: str, kind: str, ns: str, name: str = "") -> str:
    base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    return f"{base}/namespaces/{ns}/{PLURALS[kind]}" + (f"/{name}" if name else "")


def workload_as_v1beta1(obj: Obj) -> Obj:
    """A v1beta2 Workload as Kueue's conversion webhook serves it at v1beta1 (the fields our scenarios use)."""
    obj = copy.deepcopy(obj)
    obj["apiVersion"] = "kueue.x-k8s.io/v1beta1"
    spec = obj.get("spec") or {}
    ref = spec.pop("priorityClassRef", None)
    if ref:
        spec["priorityClassName"], spec["priorityClassSource"] = ref["name"], "kueue.x-k8s.io/workloadpriorityclass"
    status = obj.get("status") or {}
    if "accumulatedPastExecutionTimeSeconds" in status:
        status["accumulatedPastExexcutionTimeSeconds"] = status.pop("accumulatedPastExecutionTimeSeconds")
    return obj


def event_as_core_v1(ev: Obj) -> Obj:
    """An events.k8s.io/v1 Event of client-go's legacy recorder in the core/v1 form that recorder writes."""
    renames = {"regarding": "involvedObject", "note": "message", "reportingController": "reportingComponent",
               "deprecatedCount": "count", "deprecatedFirstTimestamp": "firstTimestamp",
               "deprecatedLastTimestamp": "lastTimestamp", "deprecatedSource": "source"}
    return {**{renames.get(k, k): v for k, v in ev.items()}, "apiVersion": "v1"}


@dataclass
class Driver:
    """Writes one scenario's object changes through the API, as the controllers that made them would.

    Scenario namespaces are mapped to fresh ones, scenario uids to the uids the API server assigned (in every
    reference: ownerReferences, labels, Event subjects). ``written`` collects the watch events the API implies
    (every object it returned), to check the watcher's capture against."""

    client: ApiClient
    namespaces: dict[str, str]
    uids: dict[str, str] = field(default_factory=dict)  # scenario uid -> server uid
    scenario_last: dict[str, Obj] = field(default_factory=dict)  # scenario uid -> its last scenario state
    server: dict[str, Obj] = field(default_factory=dict)  # scenario uid -> the last object the API returned
    written: list[Obj] = field(default_factory=list)

    def mapped(self, obj: Obj) -> Obj:
        text = json.dumps(obj)
        for old, new in self.uids.items():
            text = text.replace(old, new)
        out: Obj = json.loads(text)

        def namespaces(node: Any) -> None:
            if isinstance(node, dict):
                for k, v in node.items():
                    if k == "namespace" and isinstance(v, str) and v in self.namespaces:
                        node[k] = self.namespaces[v]
                    else:
                        namespaces(v)
            elif isinstance(node, list):
                for v in node:
                    namespaces(v)
        namespaces(out)
        return out

    def note(self, etype: str, obj: Obj) -> Obj:
        self.written.append({"type": etype, "object": obj})
        return obj

    async def apply(self, record: Obj) -> None:
        etype, obj = record["type"], record["object"]
        if obj.get("apiVersion") == "kueue.x-k8s.io/v1beta2":
            obj = workload_as_v1beta1(obj)
        uid = obj["metadata"]["uid"]
        if etype == "ADDED" and uid not in self.server:
            await self._create(uid, obj)
        elif etype == "DELETED":
            await self._delete(uid, obj)
        else:
            await self._update(uid, obj)
        self.scenario_last[uid] = obj

    # ---------------------------------------------------------------- the three kinds of write

    async def _create(self, uid: str, obj: Obj) -> None:
        body = self.mapped(obj)
        meta = body["metadata"]
        for k in SERVER_SET_META:
            meta.pop(k, None)
        status = body.pop("status", None)
        kind = body["kind"]
        node = None
        if kind == "Job":
            body["spec"].pop("selector", None)
            labels = body["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {})
            for k in JOB_GENERATED_LABELS:
                labels.pop(k, None)
        if kind == "Pod":
            node = body["spec"].pop("nodeName", None)
        if kind == "Event":
            body.update(status or {})
            status = None
        if kind == "Event" and body["apiVersion"] == "events.k8s.io/v1" and not body.get("eventTime"):
            body = event_as_core_v1(body)  # the legacy recorder writes through core/v1 (events.k8s.io refuses it)
        path = object_path(body["apiVersion"], kind, meta["namespace"])
        created = self.note("ADDED", await call(self.client, "POST", path, body))
        self.uids[uid] = created["metadata"]["uid"]
        self.server[uid] = created
        if node:
            await self._bind(uid, node)
        if status:
            await self._put_status(uid, status)

    async def _update(self, uid: str, obj: Obj) -> None:
        before, new = self.scenario_last[uid], self.mapped(obj)
        kind = obj["kind"]
        if kind == "Event":  # no status subresource: the whole object
            if self.server[uid]["apiVersion"] == "v1" and new["apiVersion"] != "v1":
                new = event_as_core_v1(new)
            body = {**new, "metadata": {**self.server[uid]["metadata"], **{
                k: v for k, v in new["metadata"].items() if k not in SERVER_SET_META}}}
            self.server[uid] = self.note("MODIFIED", await call(self.client, "PUT", self.path(uid), body))
            return
        if obj["metadata"].get("deletionTimestamp") and not before["metadata"].get("deletionTimestamp"):
            await self._start_deleting(uid, obj)
        if kind == "Pod" and obj["spec"].get("nodeName") and not before["spec"].get("nodeName"):
            await self._bind(uid, obj["spec"]["nodeName"])  # a pod's spec changes no other way
        if (kind != "Pod" and obj.get("spec") != before.get("spec")) or self._meta(obj) != self._meta(before):
            await self._put(uid, new)
        if obj.get("status") != before.get("status") and uid in self.server:
            await self._put_status(uid, new.get("status") or {})

    async def _delete(self, uid: str, obj: Obj) -> None:
        if uid not in self.server:
            return
        current = self.server[uid]
        if current["metadata"].get("finalizers"):  # the last finalizer goes, then the object
            current = {**current, "metadata": {**current["metadata"], "finalizers": []}}
            self.server[uid] = self.note("MODIFIED", await call(self.client, "PUT", self.path(uid), current))
        try:
            gone = await call(self.client, "DELETE", self.path(uid), {"gracePeriodSeconds": 0,
                                                                      "propagationPolicy": "Background"})
        except ApiError as exc:
            if exc.status != 404:  # already removed by the API server (finalizers gone, deletion requested)
                raise
            gone = self.server[uid]
        self.note("DELETED", gone if gone.get("kind") != "Status" else self.server[uid])
        del self.server[uid]

    # ---------------------------------------------------------------- helpers

    @staticmethod
    def _meta(obj: Obj) -> tuple[Any, ...]:
        m = obj["metadata"]
        return m.get("labels"), m.get("annotations"), m.get("finalizers"), m.get("ownerReferences")

    def path(self, uid: str) -> str:
        obj = self.server[uid]
        return object_path(obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])

    async def _put(self, uid: str, new: Obj) -> None:
        current = self.server[uid]
        meta = {**current["metadata"], **{k: new["metadata"].get(k) for k in
                                          ("labels", "annotations", "finalizers", "ownerReferences")}}
        body = {**current, "metadata": meta}
        if current["kind"] == "Job":  # the selector and template stay as the API server generated them
            body["spec"] = {**new["spec"], "selector": current["spec"]["selector"],
                            "template": current["spec"]["template"]}
        elif current["kind"] != "Pod":
            body["spec"] = new["spec"]
        result = await call(self.client, "PUT", self.path(uid), body)
        if result["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            self.server[uid] = self.note("MODIFIED", result)

    async def _put_status(self, uid: str, status: Obj) -> None:
        current = self.server[uid]
        result = await call(self.client, "PUT", self.path(uid) + "/status", {**current, "status": status})
        if result["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            self.server[uid] = self.note("MODIFIED", result)

    async def _bind(self, uid: str, node: str) -> None:
        pod = self.server[uid]
        await call(self.client, "POST", self.path(uid) + "/binding", {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod["metadata"]["name"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        self.server[uid] = self.note("MODIFIED", await call(self.client, "GET", self.path(uid)))

    async def _start_deleting(self, uid: str, obj: Obj) -> None:
        """A graceful delete: the API server sets deletionTimestamp; finalizers keep the object."""
        grace = obj["metadata"].get("deletionGracePeriodSeconds", 30)
        result = await call(self.client, "DELETE", self.path(uid), {"gracePeriodSeconds": grace,
                                                                 "propagationPolicy": "Background"})
        if result.get("kind") != "Status":
            self.server[uid] = self.note("MODIFIED", result)


def scenario_writes(name: str) -> tuple[list[Obj], list[Obj]]:
    """(object changes, intake events) of one scenario, in the order they were written."""
    writes = sorted((w for stream in _cluster().by_scenario[name].values() for w in stream), key=lambda w: w.at)
    objects = [copy.deepcopy(w.record) for w in writes if w.stream != "intake"]
    intake = [copy.deepcopy(w.record) for w in writes if w.stream == "intake"]
    return objects, intake


def comparable(fields: Obj, transitions: list[tuple[Any, ...]], attempts: list[tuple[Any, ...]]
               ) -> tuple[Obj, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """What of an expected history (test_scenarios' shape) does not depend on times the API server assigns
    (``creationTimestamp``, ``deletionTimestamp``): the run's status, reason, final phase, attempts and
    evictions; each attempt's trigger, end reason and underlying cause; the re-admissions and the final
    transition (attempt, phase, reason). Times are not compared: a transition is never earlier than the one
    before it, and the first one (Admission starts at the root's creation) is "now" on the API server. Pods
    are placed in attempts by creation time, and a failed pod counts as killed (not as a failure) by its
    deletion request (``deletionTimestamp``), so retries and failures are not compared either."""
    run = {k: fields[k] for k in ("status", "reason", "phase", "attempts", "evictions") if k in fields}
    kept = [t[:2] + t[3:] for t in transitions if t[0] > 1 and t[1] == "Admission"]
    if transitions:
        kept.append(transitions[-1][:2] + transitions[-1][3:])
    return run, kept, [a[:3] for a in attempts]


def expected_of(h: Any) -> tuple[Obj, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """A derived history in test_scenarios' shape."""
    return (to_json(h.run),
            [(t.attempt, t.phase.value, t.at.strftime("%H:%M:%S"), t.reason) for t in h.transitions],
            [(a.trigger, a.end_reason, a.underlying_cause, a.retries, [f.reason for f in a.failures])
             for a in h.attempts])


DRIVEN = sorted(n for n in SCENARIOS if any(w.stream != "intake" for s in _cluster().by_scenario[n].values()
                                             for w in s))


@pytest.mark.parametrize("name", DRIVEN)
async def test_scenario_through_the_api_folds_to_its_expected_history(
        name: str, admin: ApiClient, identity: Identity, control_plane: Any,  # noqa: F811  (imported fixtures)
        tmp_path: Path) -> None:
    objects, intake = scenario_writes(name)
    originals = sorted({r["object"]["metadata"]["namespace"] for r in objects})
    namespaces = {ns: control_plane.kubectl.create_namespace(ns) for ns in originals}
    try:
        path = tmp_path / "capture.jsonl"
        driver = Driver(admin, namespaces)
        async with watcher_api(identity.kubeconfig) as api:
            capture = JsonlCapture(path)
            watcher = Watcher(api, capture, replace(CONFIG, namespaces=tuple(namespaces.values())))
            async with running(watcher):
                for record in objects:
                    await driver.apply(record)
                records = await wait_captured(path, driver.written)
            capture.close()
        assert watcher.stats.relists == 0 and watcher.keys.held == 0
    finally:
        for ns in namespaces.values():
            control_plane.kubectl.delete_namespace(ns)

    # the watcher: everything written, nothing twice, the same histories
    assert not missing(driver.written, records)
    keys = [(r["type"], r["object"]["metadata"]["uid"], r["object"]["metadata"]["resourceVersion"]) for r in records]
    assert len(keys) == len(set(keys)), "a state was published twice"
    want, got = fold(driver.written), fold(records)
    assert sorted(got.runs) == sorted(want.runs)
    for run_id in want.runs:
        assert got.history(run_id) == want.history(run_id)

    # the scenario: with its intake events, the expected histories (server-assigned times aside)
    fold(intake, got)
    run_ids = {old: driver.uids.get(old, old) for old in EXPECTED[name]}
    assert sorted(got.runs) == sorted(run_ids.values())
    for old, new in run_ids.items():
        h = got.history(new)
        assert h is not None
        assert comparable(*expected_of(h)) == comparable(*EXPECTED[name][old])
