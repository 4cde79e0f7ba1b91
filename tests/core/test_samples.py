"""The sample data: bundled captures up to date, objects well-formed, generators deterministic."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from sim import generate
from sim.lifecycles import RunParams, generate_run, generate_stream
from sim.scenarios import SCENARIOS, cluster_streams
from tracker.core.model import IntakeEnvelope

OWNED_KINDS = ("Workload", "Pod", "RayCluster")


def _objects(streams: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [r["object"] for name, recs in streams.items() if name != "intake" for r in recs]


def _check_well_formed(streams: dict[str, list[dict[str, Any]]]) -> None:
    objects = _objects(streams)
    last_rv: dict[str, int] = {}
    for name, recs in streams.items():
        for rec in recs:
            if name == "intake":
                IntakeEnvelope.model_validate({"event": rec})
                continue
            assert rec["type"] in ("ADDED", "MODIFIED", "DELETED")
            meta = rec["object"]["metadata"]
            assert meta["uid"] and meta["creationTimestamp"] and meta["resourceVersion"], meta
            rv = int(meta["resourceVersion"])
            assert rv > last_rv.get(meta["uid"], -1), f"{meta['name']}: resourceVersion does not increase"
            last_rv[meta["uid"]] = rv
    uids = {o["metadata"]["uid"] for o in objects}
    for obj in objects:
        if obj["kind"] in OWNED_KINDS:
            owners = [ref["uid"] for ref in obj["metadata"].get("ownerReferences", ())]
            assert owners and all(u in uids for u in owners), f"{obj['kind']} {obj['metadata']['name']}: no owner"
        elif obj["kind"] == "Event":
            about = obj.get("regarding") or obj["involvedObject"]
            assert about["uid"] in uids, f"Event {obj['metadata']['name']}: {about['kind']} {about['name']} unknown"
    intake_ids = [r["event_id"] for r in streams.get("intake", ())]
    assert len(intake_ids) == len(set(intake_ids))


def test_bundled_captures_are_up_to_date() -> None:
    assert generate.main(["--check"]) == 0


def test_bundled_capture_is_well_formed() -> None:
    streams = cluster_streams()
    _check_well_formed(streams)
    times = [r["at"] for r in streams["intake"]]
    assert times == sorted(times)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_streams(name: str) -> None:
    sc = SCENARIOS[name]
    streams = sc.streams()
    _check_well_formed(streams)
    run_ids = {r["run_id"] for r in streams["intake"]}
    assert run_ids <= set(sc.run_ids)
    assert sc.notes()


PARAMS = [RunParams(), RunParams(kind="RayJob", pods=3, ray_retries=2, evictions=1),
          RunParams(evictions=2, eviction_reason="PodsReadyTimeout", outcome="deactivated", workload_api="v1beta2"),
          RunParams(pods=4, pod_failures=3, outcome="failed", progress_points=5),
          RunParams(kind="RayJob", outcome="deleted", with_events=False),
          RunParams(pods=8, evictions=3, outcome="running")]


def test_object_names_are_unique_as_the_api_server_enforces() -> None:
    """One name per live object in a namespace: two Events about one object in the same millisecond get names that
    differ in the sub-millisecond digits (a POST of the second would be refused with 409 otherwise)."""
    streams = cluster_streams()
    for stream, records in streams.items():
        if stream == "intake":
            continue
        live: dict[tuple[str, str, str], str] = {}  # a name is free again once its object is deleted
        for r in records:
            meta = r["object"]["metadata"]
            key = (r["object"]["kind"], meta.get("namespace", ""), meta["name"])
            assert live.setdefault(key, meta["uid"]) == meta["uid"], f"two live {key} objects share a name"
            if r["type"] == "DELETED":
                del live[key]


@pytest.mark.parametrize("params", PARAMS)
def test_generate_run_is_deterministic_and_well_formed(params: RunParams) -> None:
    first = generate_run(5, params)
    assert first == generate_run(5, params)
    _check_well_formed(first)
    other = generate_run(6, params)
    assert not {o["metadata"]["uid"] for o in _objects(first)} & {o["metadata"]["uid"] for o in _objects(other)}


def test_generate_stream_is_deterministic_and_well_formed() -> None:
    first = list(itertools.islice(generate_stream(200, seed=3), 3000))
    assert first == list(itertools.islice(generate_stream(200, seed=3), 3000))
    streams: dict[str, list[dict[str, Any]]] = {"intake": [], "objects": []}
    for rec in first:
        streams["intake" if "schema" in rec else "objects"].append(rec)
    objects = streams["objects"]
    rvs = [int(r["object"]["metadata"]["resourceVersion"]) for r in objects]
    assert rvs == sorted(rvs)
    full = list(generate_stream(200, seed=3))
    assert 15 <= len(full) / 200 <= 30
    _check_well_formed({"intake": [r for r in full if "schema" in r], "all": [r for r in full if "schema" not in r]})
