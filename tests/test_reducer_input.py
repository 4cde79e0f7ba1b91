"""Bad input never crashes the reducer: it becomes a dead letter with a reason, and nothing else is lost."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tracker.core.reducer import Reducer, ReducerLimits

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


@settings(max_examples=400, deadline=None)
@given(kind=kinds, etype=st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
       meta=json_values, spec=json_values, status=json_values, extra=json_values)
def test_arbitrary_objects_never_crash(kind: str, etype: str, meta: Any, spec: Any, status: Any, extra: Any) -> None:
    red = Reducer(ReducerLimits(max_held=4))
    red.apply(added(JOB), "good")
    obj = {"kind": kind, "metadata": meta, "spec": spec, "status": status, "involvedObject": extra,
           "regarding": extra}
    red.apply({"type": etype, "object": obj}, "fuzz")
    red.apply({"type": etype, "object": {"kind": kind, "metadata": {"uid": "u", "ownerReferences": [
        {"kind": "Job", "uid": "job-uid-1", "controller": True}]}, "status": status}}, "fuzz")
    out = red.flush()
    run = next(h for h in out.histories if h.run.run_id == "run-1")
    assert run.run.kind == "Job"
