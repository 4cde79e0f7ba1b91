"""The captures the real controllers produced (`tests/captures/controllers/<scenario>/`, each with the VERSIONS that
produced it; `tests/watch/test_controller_scenarios.py` writes them) fold, without a cluster, to the histories the
controllers decided (`tests.support.controller_scenarios.EXPECTED`), in any order of the objects' streams, and say
the same
when replayed in two pieces."""

from __future__ import annotations

import gzip
import json
import random
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.infra.config import KUEUE_VERSIONS
from tests.support.controller_scenarios import EXPECTED, SCENARIOS, differences, run_facts, same_steps
from tests.support.laws import by_object, fold, histories, interleave
from tests.watch.test_controller_scenarios import CAPTURES, captures_dir

#: (Kueue version, scenario) of every kept capture: all scenarios on the default Kueue, and those kept of another
KEPT = [(kueue, s) for kueue in KUEUE_VERSIONS for s in SCENARIOS
        if kueue == KUEUE_VERSIONS[0] or (captures_dir(kueue) / s).is_dir()]


def load(scenario: str, kueue: str = KUEUE_VERSIONS[0]) -> list[dict[str, Any]]:
    path = captures_dir(kueue) / scenario / "capture.jsonl.gz"
    assert path.is_file(), f"{path} is missing: run the live scenario with TRACKER_KEEP_CONTROLLER_CAPTURES=1"
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def kueue_of(scenario: str, kueue: str = KUEUE_VERSIONS[0]) -> str:
    """The Kueue version that produced the kept capture (its VERSIONS file)."""
    for line in (captures_dir(kueue) / scenario / "VERSIONS").read_text().splitlines():
        if line.startswith("kueue "):
            return line.split()[1]
    raise AssertionError(f"{scenario}/VERSIONS names no Kueue version")


def test_every_scenario_has_a_kept_capture_with_its_versions() -> None:
    kept = {p.name for p in CAPTURES.iterdir() if p.is_dir()}
    assert kept == set(SCENARIOS) == set(EXPECTED)
    for kueue, scenario in KEPT:
        versions = (captures_dir(kueue) / scenario / "VERSIONS").read_text()
        for what in ("kubernetes", "kueue", "kuberay-operator", "kwok"):
            assert f"{what} " in versions, f"{scenario}/VERSIONS names no {what} version"
        assert kueue_of(scenario, kueue) == kueue


@pytest.mark.parametrize(("kueue", "scenario"), KEPT, ids=[f"{k}-{s}" for k, s in KEPT])
def test_a_kept_capture_folds_to_what_the_controllers_decided(kueue: str, scenario: str) -> None:
    records = load(scenario, kueue)
    got = histories(fold(records))
    assert differences(scenario, records, got, kueue_of(scenario, kueue),
                       midway=lambda prefix: histories(fold(prefix))) == []
    # the watch API orders each object's changes only: any interleaving of the objects folds the same
    rng = random.Random(scenario)
    seqs = by_object({"capture": records})
    for _ in range(3):
        assert histories(fold(interleave(seqs, rng))) == got


def test_the_kept_captures_are_what_the_watcher_writes(tmp_path: Path) -> None:
    """JSON lines of watch events {"type", "object", "key"}: what `tracker replay` reads."""
    for kueue, scenario in KEPT:
        for rec in load(scenario, kueue):
            assert rec["type"] in ("ADDED", "MODIFIED", "DELETED") and rec["object"]["metadata"]["uid"]


def test_admission_steps_stamped_in_one_second_may_come_in_any_order_but_time_never_goes_back() -> None:
    def step(kind: str, state: str, at: str, check: str | None = None) -> dict[str, Any]:
        return {"kind": kind, "check": check, "state": state, "at": at, "message": ""}

    want = (("AdmissionCheck", "c", "Pending"), ("QuotaReserved", None, "Reserved"), ("AdmissionCheck", "c", "Ready"))
    t0, t1 = "2026-12-03T08:00:00Z", "2026-12-03T08:00:06Z"
    assert same_steps([step("AdmissionCheck", "Pending", t0, "c"), step("QuotaReserved", "Reserved", t0),
                       step("AdmissionCheck", "Ready", t1, "c")], want)
    assert same_steps([step("QuotaReserved", "Reserved", t0), step("AdmissionCheck", "Pending", t0, "c"),
                       step("AdmissionCheck", "Ready", t1, "c")], want)
    assert not same_steps([step("QuotaReserved", "Reserved", t0), step("AdmissionCheck", "Pending", t1, "c"),
                           step("AdmissionCheck", "Ready", t1, "c")], want)
    assert not same_steps([step("AdmissionCheck", "Pending", t1, "c"), step("QuotaReserved", "Reserved", t0),
                           step("AdmissionCheck", "Ready", t1, "c")], want)
    assert not same_steps([step("QuotaReserved", "Reserved", t0)], want)
    either = (frozenset(want[:2]), want[2])  # the first two in either order, also a second apart
    assert same_steps([step("QuotaReserved", "Reserved", t0), step("AdmissionCheck", "Pending", t1, "c"),
                       step("AdmissionCheck", "Ready", t1, "c")], either)
    assert not same_steps([step("AdmissionCheck", "Ready", t0, "c"), step("QuotaReserved", "Reserved", t1),
                           step("AdmissionCheck", "Pending", t1, "c")], either)


def test_deletion_evidence_is_taken_in_the_tracker_s_order() -> None:
    def rec(obj: dict[str, Any]) -> dict[str, Any]:
        return {"type": "MODIFIED", "object": obj}

    owned = [{"kind": "Job", "name": "a", "uid": "u"}]
    pod = {"kind": "Pod", "metadata": {"name": "a-x", "ownerReferences": owned,
                                       "deletionTimestamp": "2026-12-03T08:00:40Z", "deletionGracePeriodSeconds": 30},
           "status": {"containerStatuses": [{"state": {"terminated": {"finishedAt": "2026-12-03T08:00:12Z"}}}]}}
    wl = {"kind": "Workload", "metadata": {"name": "job-a-1", "ownerReferences": owned,
                                           "deletionTimestamp": "2026-12-03T08:00:11Z"}}
    root = {"kind": "Job", "metadata": {"name": "a", "deletionTimestamp": "2026-12-03T08:00:09Z"}}
    at = datetime.fromisoformat
    assert run_facts([rec(pod)])["a"].deletion_evidence() == (
        "its pods' deletionTimestamp less their grace period", {at("2026-12-03T08:00:10Z").timestamp()})
    assert run_facts([rec(pod), rec(wl)])["a"].deletion_evidence() == (
        "the Workload's deletionTimestamp", {at("2026-12-03T08:00:11Z").timestamp()})
    assert run_facts([rec(pod), rec(wl), rec(root)])["a"].deletion_evidence() == (
        "the root's deletionTimestamp", {at("2026-12-03T08:00:09Z").timestamp()})
    done = {**pod, "metadata": {k: v for k, v in pod["metadata"].items() if not k.startswith("deletion")}}
    assert run_facts([rec(done)])["a"].deletion_evidence() == (
        "its last container finishedAt", {at("2026-12-03T08:00:12Z").timestamp()})
    assert run_facts([rec({"kind": "Job", "metadata": {"name": "a"}})])["a"].deletion_evidence() is None
