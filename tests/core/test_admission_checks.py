"""Admission as Kueue does it with admission checks, every pending second explained, and deletion times (issue 24).

The objects are written by hand in the shapes Kueue 0.17, the Job controller and the kubelet write them
(shared/reference/lifecycle.md §1.4, §1.7; the real controllers' shapes are in tests/captures/controllers*/): a
Workload whose quota is reserved while an admission check is Pending carries ``QuotaReserved=True``, no
``Admitted=True`` (``Admitted=False/UnsatisfiedChecks`` at most) and ``status.admissionChecks[]``.
"""

from __future__ import annotations

import random
from datetime import datetime
from itertools import pairwise
from typing import Any

import pytest

from sim.scenarios import SCENARIOS
from tests.core.test_scenarios import fold_scenario
from tests.support.laws import by_object, fold, histories, interleave
from tests.watch.test_controller_captures import KEPT, load
from tracker.core.model import PendingCategory

Obj = dict[str, Any]
NS, JOB, JOB_UID, WL, WL_UID = "team-a", "llm-ft", "job-uid-1", "job-llm-ft-3f9a1", "wl-uid-1"
RUN = "run-ac-1"
CHECK = "prov-req"


def t(sec: int) -> str:
    return f"2026-08-20T10:{sec // 60:02d}:{sec % 60:02d}Z"


def job(etype: str = "MODIFIED", *, rv: int, suspend: bool = True, conds: list[Obj] | None = None,
        meta: Obj | None = None, start: int | None = None) -> Obj:
    status: Obj = {"conditions": conds or []}
    if start is not None:
        status["startTime"] = t(start)
    return {"type": etype, "object": {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": JOB, "namespace": NS, "uid": JOB_UID, "resourceVersion": str(rv),
                     "creationTimestamp": t(0),
                     "labels": {"taugrid.io/run-id": RUN, "kueue.x-k8s.io/queue-name": "gpu-lq"}, **(meta or {})},
        "spec": {"suspend": suspend, "parallelism": 1, "completions": 1, "template": {"spec": {"containers": []}}},
        "status": status}}


def cond(type_: str, status: str, reason: str, at: int, message: str = "") -> Obj:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": t(at)}


def check(state: str, at: int, message: str = "", name: str = CHECK) -> Obj:
    return {"name": name, "state": state, "lastTransitionTime": t(at), "message": message}


def workload(etype: str = "MODIFIED", *, rv: int, conds: list[Obj], checks: list[Obj] | None = None,
             cq: str | None = None, evictions: list[Obj] | None = None, meta: Obj | None = None) -> Obj:
    status: Obj = {"conditions": conds}
    if checks is not None:
        status["admissionChecks"] = checks
    if cq:
        status["admission"] = {"clusterQueue": cq, "podSetAssignments": []}
    if evictions:
        status["schedulingStats"] = {"evictions": evictions}
    return {"type": etype, "object": {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": WL, "namespace": NS, "uid": WL_UID, "resourceVersion": str(rv),
                     "creationTimestamp": t(1), **(meta or {}),
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": JOB, "uid": JOB_UID,
                                          "controller": True}]},
        "spec": {"queueName": "gpu-lq", "podSets": [{"name": "main", "count": 1}]},
        "status": status}}


def pod(etype: str = "MODIFIED", *, rv: int, created: int, bound: int | None = None, started: int | None = None,
        waiting: str | None = None, meta: Obj | None = None, finished: int | None = None) -> Obj:
    conds = [cond("PodScheduled", "True", "", bound)] if bound is not None else []
    cs: list[Obj] = []
    if started is not None and finished is not None:
        cs = [{"name": "main", "state": {"terminated": {"startedAt": t(started), "finishedAt": t(finished),
                                                        "exitCode": 143, "reason": "Error"}}}]
    elif started is not None:
        cs = [{"name": "main", "state": {"running": {"startedAt": t(started)}}}]
    elif waiting is not None:
        cs = [{"name": "main", "state": {"waiting": {"reason": waiting}}}]
    phase = "Failed" if finished is not None else ("Running" if started is not None else "Pending")
    return {"type": etype, "object": {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{JOB}-abcde", "namespace": NS, "uid": "pod-uid-1", "resourceVersion": str(rv),
                     "creationTimestamp": t(created),
                     "labels": {"batch.kubernetes.io/controller-uid": JOB_UID, "taugrid.io/run-id": RUN},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": JOB, "uid": JOB_UID,
                                          "controller": True}], **(meta or {})},
        "spec": {"nodeName": "gpu-node-1" if bound is not None else "", "containers": [{"name": "main"}]},
        "status": {"phase": phase, "conditions": conds, "containerStatuses": cs}}}


PENDING_QUOTA = cond("QuotaReserved", "False", "Pending", 2,
                     "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in "
                     "flavor h100, 8 more needed")


def two_phase_until(stage: str) -> list[Obj]:
    """A two-phase admission, up to ``stage``: queued for quota, quota reserved at 0:30 with the check Pending,
    the check Ready and Admitted=True at 1:40, the pod bound at 1:42 and its container running at 1:50."""
    recs = [
        job("ADDED", rv=1),
        workload("ADDED", rv=2, conds=[]),
        workload(rv=3, conds=[PENDING_QUOTA]),
        workload(rv=4, cq="gpu-cq", conds=[cond("QuotaReserved", "True", "QuotaReserved", 30,
                                                "Quota reserved in ClusterQueue gpu-cq"),
                                           cond("Admitted", "False", "UnsatisfiedChecks", 30,
                                                "The workload has not all checks ready")],
                 checks=[check("Pending", 30, "Waiting for capacity: 0/8 nodes provisioned")]),
    ]
    if stage == "check-pending":
        return recs
    recs += [
        workload(rv=5, cq="gpu-cq", conds=[cond("QuotaReserved", "True", "QuotaReserved", 30,
                                                "Quota reserved in ClusterQueue gpu-cq"),
                                           cond("Admitted", "True", "Admitted", 100, "The workload is admitted")],
                 checks=[check("Ready", 100, "Provisioned")]),
        job(rv=6, suspend=False, start=101),
        pod("ADDED", rv=7, created=101),
        pod(rv=8, created=101, bound=102, waiting="ContainerCreating"),
        pod(rv=9, created=101, bound=102, started=110),
    ]
    return recs


def history(records: list[Obj]) -> dict[str, Any]:
    hs = histories(fold(records))
    assert list(hs) == [RUN]
    return hs[RUN]


def seconds(span: Obj) -> float:
    def p(x: str) -> datetime:
        return datetime.fromisoformat(x.replace("Z", "+00:00"))
    return (p(span["end"]) - p(span["start"])).total_seconds()


def test_a_reserved_workload_waiting_for_its_check_is_pending_in_admission_with_the_checks_message() -> None:
    h = history(two_phase_until("check-pending"))
    run, [att] = h["run"], h["attempts"]
    assert (run["status"], run["phase"]) == ("pending", "Admission")
    assert run["admitted_at"] is None and att["admitted_at"] is None and att["scheduled_at"] is None
    assert run["quota_reserved_at"] == att["quota_reserved_at"] == t(30)
    assert run["pending_reason"] == "AdmissionCheckPending"
    assert run["pending_message"] == f"{CHECK}: Waiting for capacity: 0/8 nodes provisioned"
    assert [tr["phase"] for tr in h["transitions"]] == ["Admission"]
    assert [(s["kind"], s["at"], s["check"], s["state"]) for s in att["admission_steps"]] == [
        ("QuotaReserved", t(30), None, "gpu-cq"), ("AdmissionCheck", t(30), CHECK, "Pending")]
    # every second so far: queued (Kueue had not looked yet), quota, then the check, still going on
    assert [(s["category"], s["start"], s["end"]) for s in att["pending"]] == [
        ("queued", t(0), t(2)), ("quota", t(2), t(30)), ("admission-check", t(30), None)]
    assert att["pending"][2]["detail"] == CHECK
    assert att["pending_s_by"] == {"queued": 2.0, "quota": 28.0}
    assert (run["pending_category"], run["pending_since"]) == ("admission-check", t(30))


def test_admitted_is_the_admitted_condition_not_the_quota_reservation() -> None:
    h = history(two_phase_until("running"))
    run, [att] = h["run"], h["attempts"]
    assert run["status"] == "running"
    assert (att["quota_reserved_at"], att["admitted_at"], run["admitted_at"]) == (t(30), t(100), t(100))
    assert att["admission_wait_s"] == run["admission_wait_s"] == 100.0
    assert [(tr["phase"], tr["at"]) for tr in h["transitions"]] == [
        ("Admission", t(0)), ("Scheduling", t(100)), ("Runtime", t(102))]
    assert [(s["category"], s["start"], s["end"]) for s in att["pending"]] == [
        ("queued", t(0), t(2)), ("quota", t(2), t(30)), ("admission-check", t(30), t(100)),
        ("pod-creation", t(100), t(101)), ("scheduling", t(101), t(102)), ("container-creation", t(102), t(110))]
    assert att["pending_s_by"] == {"queued": 2.0, "quota": 28.0, f"admission-check:{CHECK}": 70.0,
                                   "pod-creation": 1.0, "scheduling": 1.0, "container-creation": 8.0}
    assert run["pending_reason"] is None and run["pending_category"] is None
    # the spans tile the attempt's time from queued to the application's start, with no gap and no overlap
    assert sum(seconds(s) for s in att["pending"]) == 110.0
    assert all(a["end"] == b["start"] for a, b in pairwise(att["pending"]))


def test_a_rejected_check_stops_the_run_never_admitted() -> None:
    recs = [*two_phase_until("check-pending"),
            workload(rv=5, conds=[cond("QuotaReserved", "False", "Pending", 95, "The workload is deactivated"),
                                  cond("Admitted", "False", "NoReservation", 95, "The workload has no reservation"),
                                  cond("Evicted", "True", "DeactivatedDueToAdmissionCheck", 95,
                                       "The workload is deactivated due to Admission check(s): prov-req, were "
                                       "rejected"),
                                  cond("Requeued", "False", "DeactivatedDueToAdmissionCheck", 95, "")],
                     checks=[check("Rejected", 95, "ProvisioningRequest failed: no capacity")],
                     evictions=[{"reason": "Deactivated", "underlyingCause": "AdmissionCheck", "count": 1}])]
    h = history(recs)
    run, [att] = h["run"], h["attempts"]
    assert (run["status"], run["reason"]) == ("stopped", "DeactivatedDueToAdmissionCheck")
    assert run["admitted_at"] is None and att["admitted_at"] is None and att["scheduled_at"] is None
    assert [tr["phase"] for tr in h["transitions"]] == ["Admission", "Completion"]
    assert run["finished_at"] == t(95)
    assert ("AdmissionCheck", t(95), CHECK, "Rejected") in [
        (s["kind"], s["at"], s["check"], s["state"]) for s in att["admission_steps"]]
    assert [(s["category"], s["end"]) for s in att["pending"]][-1] == ("admission-check", t(95))
    assert run["pending_category"] is None


def test_a_check_in_retry_releases_the_quota_without_a_new_attempt_and_counts_as_an_eviction() -> None:
    reserved = cond("QuotaReserved", "True", "QuotaReserved", 30, "Quota reserved in ClusterQueue gpu-cq")
    retry_evicted = cond("Evicted", "True", "AdmissionCheck", 60, "At least one admission check is false")
    recs = [*two_phase_until("check-pending"),
            workload(rv=5, cq="gpu-cq", conds=[reserved, retry_evicted], checks=[check("Retry", 60, "try again")]),
            workload(rv=6, conds=[cond("QuotaReserved", "False", "Pending", 61,
                                       "At least one admission check is false"),
                                  retry_evicted, cond("Requeued", "False", "AdmissionCheck", 61, "")],
                     checks=[check("Pending", 61)],
                     evictions=[{"reason": "AdmissionCheck", "underlyingCause": "", "count": 1}]),
            workload(rv=7, conds=[cond("QuotaReserved", "False", "Pending", 61, "couldn't assign flavors"),
                                  retry_evicted, cond("Requeued", "True", "BackoffFinished", 70, "")],
                     checks=[check("Pending", 61)],
                     evictions=[{"reason": "AdmissionCheck", "underlyingCause": "", "count": 1}]),
            workload(rv=8, cq="gpu-cq", conds=[cond("QuotaReserved", "True", "QuotaReserved", 80, ""),
                                               cond("Evicted", "False", "QuotaReserved", 80, "Previously: ..."),
                                               cond("Admitted", "True", "Admitted", 90, "")],
                     checks=[check("Ready", 90)],
                     evictions=[{"reason": "AdmissionCheck", "underlyingCause": "", "count": 1}])]
    h = history(recs)
    run, [att] = h["run"], h["attempts"]
    assert (run["attempts"], run["evictions"]) == (1, 1)
    assert (att["quota_reserved_at"], att["admitted_at"]) == (t(80), t(90))
    steps = [(s["kind"], s["at"], s["state"]) for s in att["admission_steps"]]
    assert ("QuotaReleased", t(60), "AdmissionCheck") in steps
    assert [s for s in steps if s[0] == "QuotaReserved"] == [("QuotaReserved", t(30), "gpu-cq"),
                                                             ("QuotaReserved", t(80), "gpu-cq")]
    assert [(s["category"], s["start"], s["end"]) for s in att["pending"]] == [
        ("queued", t(0), t(2)), ("quota", t(2), t(30)), ("admission-check", t(30), t(60)),
        ("queued", t(60), t(61)), ("backoff", t(61), t(70)), ("quota", t(70), t(80)),
        ("admission-check", t(80), t(90)), ("pod-creation", t(90), None)]


def test_a_job_deleted_while_running_ends_at_its_pods_deletion_not_its_start() -> None:
    recs = [*two_phase_until("running"),
            job("DELETED", rv=10, suspend=False, start=101),
            pod(rv=11, created=101, bound=102, started=110,
                meta={"deletionTimestamp": t(530), "deletionGracePeriodSeconds": 30}),
            pod("DELETED", rv=12, created=101, bound=102, started=110, finished=532,
                meta={"deletionTimestamp": t(530), "deletionGracePeriodSeconds": 30}),
            workload("DELETED", rv=13, conds=[cond("Admitted", "True", "Admitted", 100, "")])]
    run = history(recs)["run"]
    assert (run["status"], run["reason"], run["finished_at"]) == ("stopped", "Deleted", t(500))


@pytest.mark.parametrize(("evidence", "want"), [
    ("root", 400), ("workload", 450), ("pods", 500), ("finished", 532), ("none", 110)])
def test_a_deleted_run_ends_at_the_best_evidence_in_order(evidence: str, want: int) -> None:
    grace = {"deletionGracePeriodSeconds": 30}
    root_meta = {"deletionTimestamp": t(400)} if evidence == "root" else None
    wl_meta = {"deletionTimestamp": t(450)} if evidence in ("root", "workload") else None
    pod_meta = {"deletionTimestamp": t(530), **grace} if evidence in ("root", "workload", "pods") else None
    finished = 532 if evidence != "none" else None
    recs = [*two_phase_until("running"),
            job("DELETED", rv=10, suspend=False, start=101, meta=root_meta),
            workload("DELETED", rv=13, conds=[cond("Admitted", "True", "Admitted", 100, "")], meta=wl_meta),
            pod("DELETED", rv=12, created=101, bound=102, started=110, finished=finished, meta=pod_meta)]
    if evidence == "none":  # no pod state after its start: the latest time the root carries (its startTime)
        recs[-1] = pod(rv=12, created=101, bound=102, started=110)
    run = history(recs)["run"]
    assert (run["status"], run["finished_at"]) == ("stopped", t(want if evidence != "none" else 101))


def test_a_job_deleted_while_queued_after_an_eviction_is_not_ended_by_the_evicted_pods_deletion() -> None:
    # attempt 1 ran and was preempted at 2:00 (its pod deleted then); attempt 2 waits; the Job is deleted at 9:00
    base = two_phase_until("running")
    evicted = [cond("QuotaReserved", "False", "Pending", 121, "Preempted"),
               cond("Admitted", "True", "Admitted", 100, ""),
               cond("Evicted", "True", "Preempted", 120, "Preempted to accommodate a workload")]
    recs = [*base,
            workload(rv=10, conds=evicted, evictions=[{"reason": "Preempted", "underlyingCause": "", "count": 1}]),
            pod("DELETED", rv=11, created=101, bound=102, started=110, finished=125,
                meta={"deletionTimestamp": t(150), "deletionGracePeriodSeconds": 30}),
            job("DELETED", rv=12, suspend=True, conds=[cond("Suspended", "True", "JobSuspended", 540)]),
            workload("DELETED", rv=13, conds=evicted, meta={"deletionTimestamp": t(541)})]
    h = history(recs)
    assert (h["run"]["attempts"], h["run"]["finished_at"]) == (2, t(541))


def _tiles(att: Obj) -> bool:
    spans = att["pending"]
    return all(a["end"] == b["start"] for a, b in pairwise(spans)) and \
        all(s["end"] is None or s["end"] > s["start"] for s in spans) and \
        all(s["end"] is not None for s in spans[:-1])


def assert_tiled_and_explained(hs: dict[str, Any]) -> None:
    """Every attempt's pending spans tile its window, and at most 5% of their seconds are unexplained."""
    total = unexplained = 0.0
    for h in hs.values():
        for att in h["attempts"]:
            assert _tiles(att), (h["run"]["run_id"], att["pending"])
            for s in att["pending"]:
                if s["end"] is not None:
                    total += seconds(s)
                    unexplained += seconds(s) if s["category"] == PendingCategory.UNEXPLAINED else 0.0
    assert unexplained <= 0.05 * total, (unexplained, total)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_scenarios_pending_seconds_tile_its_attempts_and_are_at_most_5_percent_unexplained(
        scenario: str) -> None:
    assert_tiled_and_explained(histories(fold_scenario(scenario)))


def test_pending_spans_do_not_depend_on_the_order_objects_arrive_in() -> None:
    recs = two_phase_until("running")
    want = history(recs)
    rng = random.Random(24)
    for _ in range(5):
        assert history(list(interleave(by_object({"c": recs}), rng))) == want


@pytest.mark.parametrize(("kueue", "scenario"), KEPT, ids=[f"{k}-{s}" for k, s in KEPT])
def test_the_real_controllers_pending_seconds_tile_their_attempts_and_are_at_most_5_percent_unexplained(
        kueue: str, scenario: str) -> None:
    assert_tiled_and_explained(histories(fold(load(scenario, kueue))))


def test_slimmed_objects_keep_the_admission_checks() -> None:
    """The watcher publishes slimmed objects (tracker.shell.slim): a slimmed two-phase admission folds the same."""
    from tracker.shell.slim import slim
    recs = two_phase_until("running")
    assert history([{"type": r["type"], "object": slim(r["object"])} for r in recs]) == history(recs)
