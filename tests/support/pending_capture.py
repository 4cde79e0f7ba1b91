"""A small hand-written capture of two runs whose Admission has steps (tests of issue 24's outputs).

- ``run-check`` (team-c/wait-check): created 10:00:00, Kueue found no quota at 10:00:05, reserved quota at 10:10:00
  with the admission check ``prov`` Pending ("waiting for nodes"): never admitted, so at 10:30:00 it has waited
  30m and waits on (queued 5s, quota 9m55s, admission-check:prov from 10:10:00 on).
- ``run-retry`` (team-c/retry-check): created 10:00:00, quota reserved at 10:01:00 with ``prov`` Pending, the check
  went to Retry at 10:05:00 and Kueue released the quota (Evicted=True, AdmissionCheck: an eviction before any
  admission), reserved again at 10:08:00, ``prov`` Ready and Admitted=True at 10:09:00; its pods not created yet.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from tracker.runtime.replay import replay

NS = "team-c"
NOW = "2026-08-20T10:30:00Z"
CHECK_RUN, RETRY_RUN = "run-check", "run-retry"


def _t(hms: str) -> str:
    return f"2026-08-20T{hms}Z"


def _job(run_id: str, name: str, uid: str, rv: int) -> dict[str, Any]:
    return {"type": "ADDED", "object": {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "uid": uid, "resourceVersion": str(rv),
                     "creationTimestamp": _t("10:00:00"),
                     "labels": {"kueue.x-k8s.io/queue-name": "lq-c", "taugrid.io/run-id": run_id}},
        "spec": {"parallelism": 1, "completions": 1, "suspend": True}, "status": {}}}


def _cond(ctype: str, status: str, reason: str, at: str, message: str = "") -> dict[str, str]:
    return {"type": ctype, "status": status, "reason": reason, "lastTransitionTime": _t(at), "message": message}


def _wl(job: str, uid: str, rv: int, status: dict[str, Any], kind: str = "MODIFIED") -> dict[str, Any]:
    return {"type": kind, "object": {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": f"job-{job}-1a2b3", "namespace": NS, "uid": f"wl-{uid}", "resourceVersion": str(rv),
                     "creationTimestamp": _t("10:00:00"), "labels": {"kueue.x-k8s.io/job-uid": uid},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid,
                                          "controller": True}]},
        "spec": {"queueName": "lq-c"}, "status": status}}


NO_QUOTA = _cond("QuotaReserved", "False", "Pending", "10:00:05",
                 "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu")


def records() -> list[dict[str, Any]]:
    check_uid, retry_uid = "uid-check-0001", "uid-retry-0001"
    adm = {"clusterQueue": "cq-c"}
    out = [
        _job(CHECK_RUN, "wait-check", check_uid, 100),
        _wl("wait-check", check_uid, 101, {}, "ADDED"),
        _wl("wait-check", check_uid, 102, {"conditions": [NO_QUOTA]}),
        _wl("wait-check", check_uid, 103, {
            "admission": adm,
            "conditions": [_cond("QuotaReserved", "True", "QuotaReserved", "10:10:00",
                                 "Quota reserved in ClusterQueue cq-c")],
            "admissionChecks": [{"name": "prov", "state": "Pending", "lastTransitionTime": _t("10:10:00"),
                                 "message": "waiting for nodes"}]}),
        _job(RETRY_RUN, "retry-check", retry_uid, 200),
        _wl("retry-check", retry_uid, 201, {}, "ADDED"),
        _wl("retry-check", retry_uid, 202, {
            "admission": adm,
            "conditions": [_cond("QuotaReserved", "True", "QuotaReserved", "10:01:00")],
            "admissionChecks": [{"name": "prov", "state": "Pending", "lastTransitionTime": _t("10:01:00"),
                                 "message": "waiting for nodes"}]}),
        _wl("retry-check", retry_uid, 203, {
            "conditions": [_cond("QuotaReserved", "False", "Pending", "10:05:00", "quota released"),
                           _cond("Evicted", "True", "AdmissionCheck", "10:05:00",
                                 "At least one admission check is false"),
                           _cond("Requeued", "True", "Evicted", "10:05:00")],
            "admissionChecks": [{"name": "prov", "state": "Retry", "lastTransitionTime": _t("10:05:00"),
                                 "message": "provisioning failed, retrying"}],
            "schedulingStats": {"evictions": [{"reason": "AdmissionCheck", "count": 1}]}}),
        _wl("retry-check", retry_uid, 204, {
            "admission": adm,
            "conditions": [_cond("QuotaReserved", "True", "QuotaReserved", "10:08:00"),
                           _cond("Evicted", "False", "QuotaReserved", "10:08:00"),
                           _cond("Requeued", "True", "Evicted", "10:05:00")],
            "admissionChecks": [{"name": "prov", "state": "Pending", "lastTransitionTime": _t("10:08:00")}],
            "schedulingStats": {"evictions": [{"reason": "AdmissionCheck", "count": 1}]}}),
        _wl("retry-check", retry_uid, 205, {
            "admission": adm,
            "conditions": [_cond("QuotaReserved", "True", "QuotaReserved", "10:08:00"),
                           _cond("Evicted", "False", "QuotaReserved", "10:08:00"),
                           _cond("Requeued", "True", "Evicted", "10:05:00"),
                           _cond("Admitted", "True", "Admitted", "10:09:00")],
            "admissionChecks": [{"name": "prov", "state": "Ready", "lastTransitionTime": _t("10:09:00"),
                                 "message": "nodes provisioned"}],
            "schedulingStats": {"evictions": [{"reason": "AdmissionCheck", "count": 1}]}}),
    ]
    return out


def build(directory: Path) -> Path:
    """The capture replayed into ``directory/pending.sqlite``."""
    capture = directory / "pending-capture.jsonl"
    capture.write_text("".join(json.dumps(r) + "\n" for r in records()))
    path = directory / "pending.sqlite"
    replay(captures=[capture], index_path=path, console=Console(quiet=True), quiet=True)
    return path
