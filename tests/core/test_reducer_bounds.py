"""A run's state stays bounded: progress reports are remembered only as far back as needed, and finished runs
are retired (their facts freed, their ids remembered up to a bound) so that late records start no partial history."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import pytest

from tracker.core.facts import MAX_PROGRESS_SEEN, RunFacts
from tracker.core.reducer import Reducer

T0 = datetime(2026, 8, 20, 10, 0, tzinfo=UTC)


def progress(step: int) -> dict[str, object]:
    return {"schema": "taugrid.io/intake/v1", "kind": "Progress", "event_id": f"p-{step}", "run_id": "long",
            "at": (T0 + timedelta(seconds=step)).isoformat(), "step": step, "metrics": {"loss": 1.0 / (step + 1)}}


def test_progress_memory_is_bounded_and_recent_repeats_are_still_ignored() -> None:
    red = Reducer()
    n = MAX_PROGRESS_SEEN + 2_000
    for step in range(n):
        red.apply(progress(step), "intake")
    for step in range(n - 100, n):  # a consumer restart replays the latest reports
        red.apply(progress(step), "intake")
    red.apply(progress(5), "intake")  # a very late repeat, older than everything remembered
    facts = red.runs["long"]
    assert len(facts.progress_seen) == MAX_PROGRESS_SEEN
    loss = facts.metrics["loss"]
    assert loss.points == n
    assert (loss.first[0], loss.latest[0]) == (0, n - 1)
    snap = red.snapshot_run("long")
    assert snap is not None and len(json.dumps(snap)) < 1_000_000


# ------------------------------------------------------------------------------------------ retirement


def _run_records(index: int, **params: object) -> tuple[str, list[dict[str, object]]]:
    from sim.lifecycles import RunParams, generate_run

    streams = generate_run(index, RunParams(**params))  # type: ignore[arg-type]
    records = [r for s in streams.values() for r in s]
    reducer = Reducer()
    for r in records:
        reducer.apply(r, "x")
    (run_id,) = reducer.runs
    return run_id, records


def test_a_retired_run_is_freed_and_late_records_do_not_start_a_partial_history() -> None:
    run_id, records = _run_records(1)
    red = Reducer()
    for r in records:
        red.apply(r, "x")
    finished = red.history(run_id)
    assert finished is not None and finished.run.status.value == "succeeded"
    red.flush()
    red.retire(run_id)
    assert run_id not in red.runs and red.history(run_id) is None
    for r in records:  # late records of every object of the run (a relist, a TTL delete, an expiring Event)
        red.apply(r, "late")
    assert run_id not in red.runs and not red.flush().histories
    assert red.stats.after_retirement == len(records)


def test_retirement_survives_snapshots_and_is_bounded() -> None:
    from tracker.core.limits import ReducerLimits

    runs = [_run_records(i) for i in range(3)]
    red = Reducer(ReducerLimits(max_retired=2))
    for _run_id, records in runs:
        for r in records:
            red.apply(r, "x")
    for run_id, _records in runs:
        red.retire(run_id)
    assert list(red.retired) == [runs[1][0], runs[2][0]]  # the oldest is forgotten, with its owner bindings
    whole = Reducer.restore(json.loads(json.dumps(red.snapshot())), red.limits)
    per_run = Reducer(red.limits)
    for run_id, _records in runs[1:]:
        snap = red.snapshot_run(run_id)
        assert snap is not None and snap["retired"] is True
        per_run.restore_run(json.loads(json.dumps(snap)))
    for restored in (whole, per_run):
        assert list(restored.retired) == list(red.retired)
        for r in runs[2][1]:
            restored.apply(r, "late")
        assert not restored.runs
    forgotten, records = runs[0]
    for r in records:  # a run forgotten beyond the bound starts again (the documented cost of the bound)
        red.apply(r, "late")
    assert forgotten in red.runs


# ------------------------------------------------------------------------------------------ malformed first records


def test_a_malformed_first_record_of_a_run_leaves_no_run_behind() -> None:
    """The run is created only once its first object merged: a malformed Job (here a creationTimestamp that is not a
    time) is a dead letter and nothing else, not an empty `pending` run that the sinks would write for ever."""
    red = Reducer()
    job = {"type": "ADDED", "object": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": "train", "namespace": "team-a", "uid": "uid-1", "creationTimestamp": "yesterday",
        "labels": {"taugrid.io/run-id": "run-1"}}, "spec": {}, "status": {}}}
    red.apply(job, "capture:1")
    out = red.flush()
    assert out.histories == [] and red.runs == {}
    assert [d.reason for d in out.dead_letters] == ["malformed Job"]
    good = json.loads(json.dumps(job))
    good["object"]["metadata"]["creationTimestamp"] = "2026-08-20T10:00:00Z"
    red.apply(good, "capture:2")
    assert [h.run.run_id for h in red.flush().histories] == ["run-1"]


def _reference_seen(seen: dict[str, int], event_id: str, at: int) -> bool:
    """The rule of ``RunFacts.seen_progress`` as a scan of every remembered id (what it computed before it kept them
    in order)."""
    if event_id in seen:
        return True
    if len(seen) >= MAX_PROGRESS_SEEN:
        oldest = min(seen.items(), key=lambda kv: (kv[1], kv[0]))
        if (at, event_id) < (oldest[1], oldest[0]):
            return True
        del seen[oldest[0]]
    seen[event_id] = at
    return False


@pytest.mark.parametrize("seed", range(3))
def test_the_reports_remembered_at_the_bound_are_the_latest_whatever_the_order_and_a_restore(seed: int) -> None:
    """At its bound a run forgets its oldest report id (by time, then id) for each new one, as a scan of them all
    would: the same answers and the same ids, reports out of order, repeated, older than all, tied in time, and
    across a snapshot restored (the order is built again from the restored ids)."""
    rng = random.Random(seed)
    facts, ref = RunFacts("r"), dict[str, int]()
    n = MAX_PROGRESS_SEEN + 4_000
    # new ids, and one in ten a repeat of an earlier one; times out of order, many tied
    reports = [(f"e{k}" if rng.random() < 0.9 else f"e{rng.randrange(k + 1)}", rng.randrange(n // 4))
               for k in range(n)]
    for k, (event_id, at) in enumerate(reports):
        if k == MAX_PROGRESS_SEEN + 1_000:
            facts = RunFacts.from_json(json.loads(json.dumps(facts.to_json())))
        assert facts.seen_progress(event_id, at) == _reference_seen(ref, event_id, at), k
    assert facts.progress_seen == ref and len(ref) == MAX_PROGRESS_SEEN
    assert facts.seen_order == sorted(ref, key=lambda e: (ref[e], e))
