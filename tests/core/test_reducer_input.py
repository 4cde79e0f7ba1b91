"""Bad input never crashes the reducer: it becomes a dead letter with a reason, and nothing else is lost."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.lifecycles import RunParams, RunPlan, generate_cluster
from tests.support.laws import by_object, fold
from tracker.core.limits import ReducerLimits
from tracker.core.model import to_json
from tracker.core.reducer import Reducer

JOB: dict[str, Any] = {
    "apiVersion": "batch/v1", "kind": "Job",
    "metadata": {"name": "train", "namespace": "team-a", "uid": "job-uid-1",
                 "creationTimestamp": "2026-08-20T10:00:00Z",
                 "labels": {"taugrid.io/run-id": "run-1", "kueue.x-k8s.io/queue-name": "team-a-lq"}},
    "spec": {"parallelism": 1, "completions": 1, "suspend": True},
    "status": {},
}


def added(obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": "ADDED", "object": obj}


def broken(path: list[str], value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(JOB)
    cur = obj
    for key in path[:-1]:
        cur = cur.setdefault(key, {})
    cur[path[-1]] = value
    return added(obj)


CASES = [
    ("not a JSON object", "not a JSON object", ["a", "list"]),
    ("not a watch event", "not a watch event", {"type": "UPSERTED", "object": JOB}),
    ("watch event without an object", "watch event without an object", {"type": "ADDED", "object": "x"}),
    ("unknown kind", "unknown kind", added({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}})),
    ("malformed Job", "metadata.uid is missing", broken(["metadata", "uid"], "")),
    ("malformed Job", "creationTimestamp", broken(["metadata", "creationTimestamp"], "yesterday")),
    ("malformed Job", "status.conditions[] must be objects", broken(["status", "conditions"], ["Complete"])),
    ("malformed Job", "parallelism must be an integer", broken(["spec", "parallelism"], "4")),
    ("malformed Job", "labels must be an object", broken(["metadata", "labels"], ["a"])),
    ("unknown intake schema version", "taugrid.io/intake/v9",
     {"schema": "taugrid.io/intake/v9", "kind": "Progress", "run_id": "r"}),
    ("invalid intake event", "step", {"schema": "taugrid.io/intake/v1", "kind": "Progress", "event_id": "e",
                                      "run_id": "r", "at": "2026-08-20T10:00:00Z", "step": -1}),
    ("invalid intake event", "metrics", {"schema": "taugrid.io/intake/v1", "kind": "Progress", "event_id": "e",
                                         "run_id": "r", "at": "2026-08-20T10:00:00Z", "step": 1,
                                         "metrics": {"loss": "nan"}}),
]


def test_each_kind_of_bad_input_is_a_dead_letter_with_its_reason() -> None:
    red = Reducer()
    red.apply(added(JOB), "good")
    for _reason, _detail, record in CASES:
        red.apply(record, "bad")
    out = red.flush()
    got = [(d.reason, d.reason + d.detail + d.excerpt) for d in out.dead_letters]
    assert len(got) == len(CASES)
    for (reason, detail, _r), (got_reason, got_text) in zip(CASES, got, strict=True):
        assert got_reason == reason
        assert detail in got_text
    # the good record was folded, and the bad ones did not disturb it
    assert [h.run.run_id for h in out.histories] == ["run-1"]
    assert out.histories[0].run.phase == "Admission"
    assert red.stats.dead_letters == len(CASES)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=30,
)
kinds = st.sampled_from(["Job", "RayJob", "Workload", "Pod", "RayCluster", "Event"])


def _apply_one(red: Reducer, record: Any) -> bool:
    """Fold one record; True if it became a dead letter (exactly one), False if it folded."""
    before = red.stats.dead_letters
    red.apply(record, "fuzz")
    added_letters = red.stats.dead_letters - before
    assert added_letters in (0, 1), f"one record gave {added_letters} dead letters"
    return added_letters == 1


def _dump(red: Reducer, run_id: str) -> dict[str, Any]:
    h = red.history(run_id)
    assert h is not None
    return to_json(h)


@settings(max_examples=400, deadline=None)
@given(kind=kinds, etype=st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
       meta=json_values, spec=json_values, status=json_values, extra=json_values)
def test_arbitrary_objects_never_crash(kind: str, etype: str, meta: Any, spec: Any, status: Any, extra: Any) -> None:
    """An arbitrary object is a dead letter or folds without touching the run it is not about; one that names
    the run's Job as its owner leaves it the same Job."""
    red = Reducer(ReducerLimits(max_held=4))
    red.apply(added(JOB), "good")
    good = _dump(red, "run-1")
    obj = {"kind": kind, "metadata": meta, "spec": spec, "status": status, "involvedObject": extra,
           "regarding": extra}
    _apply_one(red, {"type": etype, "object": obj})
    red.flush()  # every changed run's history derives
    assert _dump(red, "run-1") == good
    _apply_one(red, {"type": etype, "object": {"kind": kind, "metadata": {"uid": "u", "ownerReferences": [
        {"kind": "Job", "uid": "job-uid-1", "controller": True}]}, "status": status}})
    out = red.flush()
    run = next(h for h in [*out.histories, red.history("run-1")] if h is not None and h.run.run_id == "run-1")
    assert (run.run.kind, run.run.uid, run.run.name) == ("Job", "job-uid-1", "train")


# ------------------------------------------------------------------------------ realistic records, mutated

# run-0000000 is the bystander; the records of runs 1 and 2 (a Job and a RayJob with evictions, pod failures
# and retries) are the ones mutated
_CLUSTER = generate_cluster([
    RunPlan(RunParams(evictions=1, pod_failures=1, progress_points=3)),
    RunPlan(RunParams(evictions=2, pod_failures=2, progress_points=3, outcome="deleted")),
    RunPlan(RunParams(kind="RayJob", pods=3, evictions=1, ray_retries=1, outcome="failed")),
])
_BYSTANDER = "run-0000000"


def _run_of(ev: dict[str, Any]) -> str:
    """Every uid of a generated run starts like its root's."""
    if "schema" in ev:
        return str(ev["run_id"])
    uid = ev["object"]["metadata"]["uid"]
    return next(r for r, e in _CLUSTER.expected.items() if uid[:24] == e.uid[:24])


_ORDER = [ev for seq in by_object(_CLUSTER.streams) for ev in seq]
_OTHERS = [ev for ev in _ORDER if _run_of(ev) != _BYSTANDER]
_BASE = fold(ev for ev in _ORDER if _run_of(ev) == _BYSTANDER)

odd_values = st.sampled_from([None, "", "yesterday", "2026-13-45T99:99:99Z", -1, 0, 2**70, -2**70, 1.5, 1e308,
                              True, [], {}, "Job", "Pod", "DELETED", [{"type": "Evicted"}], {"uid": ""}])


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _mutated(record: dict[str, Any], path: tuple[Any, ...], delete: bool, value: Any) -> Any:
    if not path:
        return value
    rec = copy.deepcopy(record)
    parent: Any = rec
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return rec


def test_a_roots_uid_replaced_is_another_root_whose_run_id_the_real_ones_records_cannot_take() -> None:
    """The case hypothesis found for the law below: the Job's first record with another uid (a time, here) is a root
    of its own; it keeps the run id, and each later record of the real Job is a dead letter saying the id is taken.
    The bystander's history does not change."""
    red = Reducer.restore(json.loads(json.dumps(_BASE.snapshot())))
    bystander = _dump(red, _BYSTANDER)
    assert not _apply_one(red, _mutated(_OTHERS[0], ("object", "metadata", "uid"), False, "2026-13-45T99:99:99Z"))
    for ev in _OTHERS[1:]:
        red.apply(ev, "later")
    out = red.flush()
    assert len(out.dead_letters) == red.stats.dead_letters > 1
    assert {(d.source, d.reason) for d in out.dead_letters} == {("later", "run id taken by another root")}
    assert _dump(red, _BYSTANDER) == bystander


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_each_mutated_record_is_a_dead_letter_or_leaves_other_runs_alone(data: st.DataObject) -> None:
    """A realistic record of one run with one value replaced (by an odd or arbitrary JSON value) or removed
    is a dead letter, or it folds; either way another run's history does not change and every history still
    derives."""
    n = data.draw(st.integers(0, len(_OTHERS) - 1), label="record")
    record = _OTHERS[n]
    path = data.draw(st.sampled_from(_paths(record)), label="path")
    delete = bool(path) and data.draw(st.booleans(), label="delete")
    value = None if delete else data.draw(odd_values | json_values, label="value")
    red = Reducer.restore(json.loads(json.dumps(_BASE.snapshot())))
    bystander = _dump(red, _BYSTANDER)
    for ev in _OTHERS[:n]:
        red.apply(ev, "earlier")
    dead = _apply_one(red, _mutated(record, path, delete, value))
    for ev in _OTHERS[n + 1:]:
        red.apply(ev, "later")
    out = red.flush()  # every changed run's history derives
    assert red.stats.dead_letters == len(out.dead_letters)
    rest = out.dead_letters
    if path[-2:] == ("metadata", "uid") and isinstance(value, str):
        # another uid is another object claiming the run's id: the first root seen keeps the run, and each later
        # record of the real one is refused, a dead letter saying why
        rest = [d for d in rest if not (d.source == "later" and d.reason == "run id taken by another root")]
    # else the only dead letter is the mutated record's (when it was held for its owner, it became one on release)
    assert len(rest) <= 1
    assert not dead or len(rest) == 1
    assert all(d.reason for d in out.dead_letters)
    assert _dump(red, _BYSTANDER) == bystander


@pytest.mark.parametrize("kind", [[], {"a": 1}])
def test_an_object_whose_kind_is_not_a_string_is_a_dead_letter(kind: Any) -> None:
    red = Reducer()
    red.apply({"type": "ADDED", "object": {"kind": kind, "metadata": {}}}, "bad")
    assert [d.reason for d in red.flush().dead_letters] == ["unknown kind"]
