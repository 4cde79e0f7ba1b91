"""Every field of every kind of record, replaced in turn by a wrong type or an extreme value, never stops the tracker.

Seeds are real records of the bundled scenarios (``sim.scenarios``): a Job (and a deleted one, and a
KubeRay submitter), a Pod (and a deleted one, and a Ray worker), a Workload of each Kueue API version (and a deleted
one), a RayJob (and a deleted one), a RayCluster, an Event of each Events API, and an intake event of each kind. Each
is folded into a reducer that already holds its own run and an unrelated run, with one field (or nested field, or
list element, or the whole record) replaced by each of ``VALUES`` (and, in place of a string, by each of ``TIMES``).
Each such record must be a dead letter with a reason or fold without an exception; the unrelated run's history must
not change; and every history that comes out must derive, encode as the reducer's state, be written to an experiment
index and render (JSON and timeline) without an exception. About 28,000 records, in about 45 s.
"""

from __future__ import annotations

import copy
import io
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from sim.scenarios import SCENARIOS
from tests.support.histories import ups
from tracker.core.model import RunHistory, to_json
from tracker.core.reducer import Reducer
from tracker.read.render import history_json
from tracker.read.timeline import timeline
from tracker.shell import jsonio
from tracker.shell.index import ExperimentIndex


def _deep(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(levels):
        value = {"a": value} if i % 2 else [value]
    return value


VALUES: list[tuple[str, Any]] = [
    ("list", ["x", 1]),
    ("dict", {"x": 1}),
    ("None", None),
    ("true", True),
    ("2^63", 2**63),
    ("2^64", 2**64),
    ("-1", -1),
    ("NaN", math.nan),
    ("inf", math.inf),
    ("empty string", ""),
    ("huge string", "x" * 100_000),
    ("deeply nested", _deep(5000)),
]
# in place of a string (any may be a time): a time string anywhere else is just a string, as "" and "x..." are
TIMES: list[tuple[str, Any]] = [
    ("year 1", "0001-01-01T00:00:00Z"),
    ("year 1 +14:00", "0001-01-01T00:00:00+14:00"),
    ("year 9999", "9999-12-31T23:59:59.999999Z"),
    ("year 9999 -14:00", "9999-12-31T23:59:59-14:00"),
    ("year 0", "0000-01-01T00:00:00Z"),
    ("year 10000", "10000-01-01T00:00:00Z"),
]

BYSTANDER_SCENARIO = "quota-wait"


@dataclass(frozen=True)
class Seed:
    name: str
    scenario: str
    record: dict[str, Any]
    # the record unchanged is folded before the mutations (each then changes the facts only by what it changes);
    # not for a progress report: one with the same event id is a repeat, ignored whatever it says
    in_context: bool = True


def _last(scenario: str, stream: str, pred: Any = lambda r: True) -> dict[str, Any]:
    records = [r for r in SCENARIOS[scenario].streams()[stream] if pred(r)]
    assert records, (scenario, stream)
    return max(records, key=lambda r: len(json.dumps(r)))  # the one with the most fields


def _obj(r: dict[str, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = r["object"]
    return obj


def _deleted(record: dict[str, Any]) -> dict[str, Any]:
    rec = copy.deepcopy(record)
    rec["type"] = "DELETED"
    rec["object"]["metadata"]["deletionTimestamp"] = "2026-08-20T12:00:00Z"
    rec["object"]["metadata"]["deletionGracePeriodSeconds"] = 30
    return rec


def _seeds() -> list[Seed]:
    job = _last("quick-success", "jobs")
    intake = SCENARIOS["quick-success"].streams()["intake"]
    ray_intake = SCENARIOS["rayjob-retry"].streams()["intake"]
    return [
        Seed("Job", "quick-success", job),
        Seed("Job DELETED", "unschedulable", _deleted(_last("unschedulable", "jobs"))),
        Seed("Job (RayJob submitter)", "rayjob-retry", _last("rayjob-retry", "jobs")),
        Seed("Pod", "oom-retry", _last("oom-retry", "pods")),
        Seed("Pod DELETED", "quick-success", _deleted(_last("quick-success", "pods"))),
        Seed("Pod (Ray worker)", "rayjob-retry", _last("rayjob-retry", "pods")),
        Seed("Workload v1beta1", "preemption",
             _last("preemption", "workloads", lambda r: _obj(r)["apiVersion"].endswith("v1beta1"))),
        Seed("Workload v1beta2", "oom-retry",
             _last("oom-retry", "workloads", lambda r: _obj(r)["apiVersion"].endswith("v1beta2"))),
        Seed("Workload DELETED", "quick-success", _deleted(_last("quick-success", "workloads"))),
        Seed("RayJob", "rayjob-retry", _last("rayjob-retry", "rayjobs")),
        Seed("RayJob DELETED", "rayjob-retry", _deleted(_last("rayjob-retry", "rayjobs"))),
        Seed("RayCluster", "rayjob-retry", _last("rayjob-retry", "rayclusters")),
        Seed("Event v1", "oom-retry", _last("oom-retry", "events", lambda r: _obj(r)["apiVersion"] == "v1")),
        Seed("Event events.k8s.io/v1", "rayjob-retry",
             _last("rayjob-retry", "events", lambda r: _obj(r)["apiVersion"] == "events.k8s.io/v1")),
        Seed("intake Resolution", "quick-success", max((e for e in intake if e["kind"] == "Resolution"),
                                                       key=lambda e: len(json.dumps(e)))),
        Seed("intake Rendering", "quick-success", max((e for e in intake if e["kind"] == "Rendering"),
                                                      key=lambda e: len(json.dumps(e)))),
        # a new report (an event id of its own): a repeated one is ignored, whatever it says
        Seed("intake Progress", "rayjob-retry", max((e for e in ray_intake if e["kind"] == "Progress"),
                                                    key=lambda e: len(json.dumps(e))) | {"event_id": "fuzz-step"},
             in_context=False),
    ]


SEEDS = _seeds()

Path_ = tuple[Any, ...]


def _paths(value: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    """Every field, nested field and list element of ``value`` (and ``()``, the value itself)."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _at(record: Any, path: Path_) -> Any:
    for key in path:
        record = record[key]
    return record


def _replaced(record: Any, path: Path_, value: Any) -> Any:
    """``record`` with the value at ``path`` replaced (only the containers along the path are copied)."""
    if not path:
        return value
    top = copy.copy(record)
    parent = top
    for key in path[:-1]:
        child = copy.copy(parent[key])
        parent[key] = child
        parent = child
    parent[path[-1]] = value
    return top


def _context(seed: Seed) -> tuple[Callable[[], Reducer], str]:
    """A maker of the reducer after the seed's scenario and the bystander's (to start each mutation from), and the
    bystander's run id. Each reducer is folded anew: a compiled core's frozen classes cannot be unpickled."""
    records = [(rec, name) for name in (seed.scenario, BYSTANDER_SCENARIO)
               for stream in SCENARIOS[name].streams().values() for rec in stream]
    if seed.in_context:
        records.append((seed.record, "seed"))

    def fresh() -> Reducer:
        red = Reducer()
        for rec, source in records:
            red.apply(rec, source)
        out = red.flush()
        assert not out.dead_letters, out.dead_letters[:3]
        return red

    fresh()
    (bystander,) = SCENARIOS[BYSTANDER_SCENARIO].run_ids
    return fresh, bystander


def _unchanged(red: Reducer, pristine: Reducer) -> bool:
    """Whether ``red`` holds exactly what ``pristine`` does (facts, bindings, held records)."""
    return (red.runs == pristine.runs and red.corr.owner_run == pristine.corr.owner_run
            and red.corr.held_version() == pristine.corr.held_version() and red.retired == pristine.retired)


def _label(path: Path_) -> str:
    return ".".join(str(p) for p in path) or "<record>"


def _check_outputs(histories: dict[str, tuple[RunHistory, str]], index_path: Path) -> list[str]:
    """Every distinct history is written to an index and rendered; the failures, each with the mutation."""
    failures = []
    console = Console(file=io.StringIO(), width=120, color_system=None)
    with ExperimentIndex(index_path) as index:
        for h, origin in histories.values():
            try:
                index.write(ups([h]))
                history_json(h)
                json.dumps(history_json(h))
                console.print(timeline(h, width=120))
                console.file = io.StringIO()
            except Exception as exc:  # reported with the mutation that made it
                failures.append(f"{origin}: output {type(exc).__name__}: {str(exc)[:200]}")
    return failures


@pytest.mark.parametrize("seed", SEEDS, ids=[s.name for s in SEEDS])
def test_every_field_replaced_by_wrong_types_and_extremes_is_a_dead_letter_or_folds(
        seed: Seed, tmp_path: Path) -> None:
    context, bystander = _context(seed)
    pristine = context()
    baseline = {run_id: pristine.history(run_id) for run_id in pristine.runs}
    failures: list[str] = []
    distinct: dict[str, tuple[RunHistory, str]] = {
        json.dumps(to_json(h), sort_keys=True): (h, "baseline") for h in baseline.values() if h is not None}
    paths = list(_paths(seed.record))
    red = context()
    tried = 0
    for path in paths:
        for vname, value in VALUES + TIMES if isinstance(_at(seed.record, path), str) else VALUES:
            tried += 1
            origin = f"{seed.name} {_label(path)}={vname}"
            try:
                red.apply(_replaced(seed.record, path, value), "fuzz")
                # what folds leaving the facts as they were derives the baseline's histories (derive is pure):
                # only changed runs are derived, which keeps the run time low
                red.dirty = {run_id for run_id in red.dirty if red.runs.get(run_id) != pristine.runs.get(run_id)}
                out = red.flush()
                if any(h.run.run_id == bystander and h != baseline[bystander] for h in out.histories):
                    failures.append(f"{origin}: the unrelated run's history changed")
                for h in out.histories:
                    distinct.setdefault(json.dumps(to_json(h), sort_keys=True), (h, origin))
                    jsonio.dumps(red.snapshot_run(h.run.run_id))  # the state a replay keeps in the index
                for item in red.corr.held_items():
                    jsonio.dumps(list(item[2]))
                for d in out.dead_letters:
                    assert d.reason, "a dead letter without a reason"
            except Exception as exc:  # collected, so that one run shows every failure
                failures.append(f"{origin}: {type(exc).__name__}: {str(exc)[:200]}")
            if not _unchanged(red, pristine):
                red = context()
    failures += _check_outputs(distinct, tmp_path / "index.sqlite")
    assert not failures, f"{len(failures)} of {tried} mutations failed:\n" + "\n".join(failures[:40])
