"""The generated clusters the reducer's laws run on are what a cluster could write: well-formed objects, one live
object per name, preemptors admitted when their victim's quota is released, names reused only once free."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings

from sim.builders import SECOND, ts
from sim.lifecycles import RunParams, RunPlan, generate_cluster, generate_run
from tests.core.test_reducer_laws import plans
from tests.core.test_samples import _check_well_formed
from tests.support.laws import ms


def _admitted(ev: dict[str, Any]) -> int | None:
    return next((ms(c["lastTransitionTime"]) for c in ev["object"]["status"].get("conditions", ())
                 if c["type"] == "Admitted" and c["status"] == "True"), None)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(plans())
def test_generated_clusters_are_well_formed(plan: list[RunPlan]) -> None:
    cluster = generate_cluster(plan)
    _check_well_formed(cluster.streams)
    for stream, records in cluster.streams.items():
        if stream == "intake":
            continue
        live: dict[tuple[str, str, str], str] = {}
        for r in records:
            meta = r["object"]["metadata"]
            key = (r["object"]["kind"], meta["namespace"], meta["name"])
            assert live.setdefault(key, meta["uid"]) == meta["uid"], f"two live {key} objects share a name"
            if r["type"] == "DELETED":
                del live[key]
    rvs = [int(r["object"]["metadata"]["resourceVersion"]) for s, rs in cluster.streams.items() if s != "intake"
           for r in rs]
    assert len(rvs) == len(set(rvs)), "one resourceVersion counter across streams, as etcd"


def test_a_preemptor_is_admitted_when_its_victims_quota_is_released() -> None:
    cluster = generate_cluster([RunPlan(RunParams(evictions=2)), RunPlan(RunParams(), preempts=0),
                                RunPlan(RunParams(kind="RayJob", tight=True), preempts=0)])
    victim, first, second = cluster.expected.values()
    workloads = cluster.streams["workloads"]

    def owner(ev: dict[str, Any]) -> str:
        return str(ev["object"]["metadata"]["ownerReferences"][0]["uid"])

    for preemptor, eviction in ((first, 0), (second, 1)):
        i = next(i for i, ev in enumerate(workloads) if owner(ev) == preemptor.uid and _admitted(ev) is not None)
        released = next(ev for ev in reversed(workloads[:i]) if owner(ev) == victim.uid)  # the victim's last write
        conds = {c["type"]: c for c in released["object"]["status"]["conditions"]}
        assert conds["Requeued"]["status"] == "True" and "admission" not in released["object"]["status"]
        requeued = ms(conds["Requeued"]["lastTransitionTime"])
        assert requeued is not None and 0 <= preemptor.admissions[0] - requeued <= SECOND  # the same instant
        assert conds["Evicted"]["lastTransitionTime"] == ts(victim.evicted[eviction][0])
        assert f"JobUID: {preemptor.uid}" in conds["Evicted"]["message"]
        assert preemptor.admissions[0] >= victim.evicted[eviction][0]


def test_a_name_is_reused_only_after_its_run_is_gone() -> None:
    cluster = generate_cluster([RunPlan(RunParams(kind="RayJob", outcome="deleted")),
                                RunPlan(RunParams(kind="RayJob"), reuses_name_of=0)])
    old, new = cluster.expected.values()
    assert (old.name, old.namespace) == (new.name, new.namespace) and old.uid != new.uid
    rayjobs = cluster.streams["rayjobs"]
    gone = max(i for i, ev in enumerate(rayjobs) if ev["object"]["metadata"]["uid"] == old.uid)
    assert rayjobs[gone]["type"] == "DELETED"
    assert min(i for i, ev in enumerate(rayjobs) if ev["object"]["metadata"]["uid"] == new.uid) > gone


def test_generate_run_is_one_run_of_a_cluster() -> None:
    """The single-run generator (benchmarks, other tests) writes what a one-run cluster writes."""
    params = RunParams(kind="RayJob", evictions=1, ray_retries=1, outcome="failed")
    single = generate_run(0, params)
    cluster = generate_cluster([RunPlan(params)])
    strip = [{**r, "object": {**r["object"], "metadata": {k: v for k, v in r["object"]["metadata"].items()
                                                          if k != "resourceVersion"}}} if "object" in r else r
             for s in sorted(single) for r in single[s]]
    strip_cluster = [{**r, "object": {**r["object"], "metadata": {k: v for k, v in r["object"]["metadata"].items()
                                                                  if k != "resourceVersion"}}} if "object" in r else r
                     for s in sorted(cluster.streams) for r in cluster.streams[s]]
    assert strip == strip_cluster
