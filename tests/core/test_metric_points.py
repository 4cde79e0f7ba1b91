"""A run's metric points: bounded and downsampled by a rule whose result depends only on the set of points reported
(``tracker.core.facts.MetricPoints``), so the reducer's laws hold for them too: any order, repeats, snapshots and
resumes give the same points, and they are the ones the documented rule picks (checked against a direct
computation from the whole set)."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import changelog
from tracker.core.curves import METRIC_POINTS_PER_RUN, MetricPoints
from tracker.core.facts import RunFacts
from tracker.core.limits import ReducerLimits
from tracker.core.model import HistoryUpdate, to_json
from tracker.core.reducer import Reducer
from tracker.core.snapshot import point_of_state
from tracker.errors import StoredStateError

T0 = datetime(2026, 8, 20, 10, 0, tzinfo=UTC)
METRICS = ("loss", "acc", "lr")

Report = tuple[str, int, int, dict[str, float]]  # (event id, step, seconds after T0, metrics)


def progress(event_id: str, step: int, seconds: int, metrics: dict[str, float], run_id: str = "r") -> dict[str, Any]:
    return {"schema": "taugrid.io/intake/v1", "kind": "Progress", "event_id": event_id, "run_id": run_id,
            "at": (T0 + timedelta(seconds=seconds)).isoformat(), "step": step, "metrics": metrics}


reports = st.lists(st.tuples(
    st.integers(0, 300), st.integers(0, 50),
    st.dictionaries(st.sampled_from(METRICS), st.sampled_from([0.0, -0.0, 1.0, 2.5, -3.0]), max_size=3)),
    max_size=60).map(lambda rs: [(f"e{i}", step, sec, m) for i, (step, sec, m) in enumerate(rs)])


def expected(rs: list[Report], cap: int) -> list[dict[str, Any]]:
    """The documented rule, computed from the whole set at once: the smallest power-of-two width at which the
    (metric, step // width) buckets number at most ``cap`` (or every metric has one bucket); per bucket the point
    of the smallest step, of one step the latest time, then the largest value."""
    if cap <= 0:
        return []
    pts = {(m, step, sec, v + 0.0) for _e, step, sec, ms in rs for m, v in ms.items()}
    if not pts:
        return []
    top = max(p[1] for p in pts)
    width = 1
    while len({(m, s // width) for m, s, _t, _v in pts}) > cap and width <= top:
        width *= 2
    best: dict[tuple[str, int], tuple[str, int, int, float]] = {}
    for p in pts:
        k = (p[0], p[1] // width)
        cur = best.get(k)
        if cur is None or (p[1], -p[2], -p[3]) < (cur[1], -cur[2], -cur[3]):
            best[k] = p
    return [{"run_id": "r", "metric": m, "step": s, "value": v,
             "at": (T0 + timedelta(seconds=t)).isoformat().replace("+00:00", "Z")}
            for m, s, t, v in sorted(best.values())]


def points_of(red: Reducer) -> list[dict[str, Any]]:
    h = red.history("r")
    return [] if h is None else [to_json(p) for p in h.metric_points]


@settings(max_examples=150, deadline=None)
@given(rs=reports, cap=st.integers(0, 12), seed=st.integers(0, 2**32 - 1), cut=st.integers(0, 200))
def test_points_are_the_rules_whatever_the_order_repeats_and_resumes(rs: list[Report], cap: int, seed: int,
                                                                    cut: int) -> None:
    limits = ReducerLimits(metric_points_per_run=cap)
    records = [progress(*r) for r in rs]
    want = expected(rs, cap)

    one = Reducer(limits)
    for rec in records:
        one.apply(rec, "law")
    assert points_of(one) == want

    rng = random.Random(seed)
    shuffled = records + rng.sample(records, k=len(records) // 2)  # repeats, reordered
    rng.shuffle(shuffled)
    cut = min(cut, len(shuffled))
    first = Reducer(limits)
    for rec in shuffled[:cut]:
        first.apply(rec, "law")
    resumed = Reducer.restore(json.loads(json.dumps(first.snapshot())), limits)  # through JSON, as it is kept
    for rec in shuffled[cut:]:
        resumed.apply(rec, "law")
    assert points_of(resumed) == want
    if "r" in one.runs:
        assert resumed.runs["r"].points.to_json() == one.runs["r"].points.to_json()
        kept = sum(len(c) for c in one.runs["r"].points.curves.values())
        assert kept == one.runs["r"].points.size <= max(cap, len(one.runs["r"].points.curves))


def test_a_long_run_keeps_the_cap_spread_over_its_whole_curve() -> None:
    red = Reducer()
    n = 9_000
    for step in range(n):
        red.apply(progress(f"p{step}", step, step, {"loss": 1.0 / (step + 1), "lr": 0.1}), "intake")
    h = red.history("r")
    assert h is not None
    loss = [p.step for p in h.metric_points if p.metric == "loss"]
    lr = [p.step for p in h.metric_points if p.metric == "lr"]
    assert len(h.metric_points) <= METRIC_POINTS_PER_RUN
    width = red.runs["r"].points.width
    assert width == 64  # the smallest power of two that fits 2 x 9,000 steps in 512 points
    assert loss == lr == list(range(0, n, width))  # evenly spread, first step kept
    assert h.metrics[0].points == n  # the summary still counts every point


def test_zero_keeps_no_points_and_the_summary_is_unchanged() -> None:
    red = Reducer(ReducerLimits(metric_points_per_run=0))
    red.apply(progress("a", 1, 0, {"loss": 2.0}), "intake")
    h = red.history("r")
    assert h is not None and h.metric_points == [] and h.metrics[0].latest_value == 2.0


def test_more_metrics_than_the_cap_keep_one_point_each() -> None:
    red = Reducer(ReducerLimits(metric_points_per_run=2))
    for step in range(10):
        red.apply(progress(f"e{step}", step, step, {m: float(step) for m in METRICS}), "intake")
    h = red.history("r")
    assert h is not None
    assert [(p.metric, p.step) for p in h.metric_points] == [("acc", 0), ("loss", 0), ("lr", 0)]


def test_a_snapshot_kept_before_points_were_kept_is_read_and_continues() -> None:
    red = Reducer()
    red.apply(progress("a", 3, 0, {"loss": 2.0}), "intake")
    old = red.runs["r"].to_json()
    del old["points"]  # a snapshot written by a tracker that kept no points
    facts = RunFacts.from_json(json.loads(json.dumps(old)))
    assert facts.points == MetricPoints() and facts.metrics["loss"].points == 1
    red.runs["r"] = facts
    red.apply(progress("b", 4, 1, {"loss": 1.5}), "intake")
    h = red.history("r")
    assert h is not None and [(p.step, p.value) for p in h.metric_points] == [(4, 1.5)]
    assert h.metrics[0].points == 2


def test_the_cap_and_the_index_identity_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracker.settings import load_settings

    assert load_settings().reduce.reducer_limits().metric_points_per_run == METRIC_POINTS_PER_RUN
    monkeypatch.setenv("TRACKER_REDUCE__METRIC_POINTS_PER_RUN", "0")
    monkeypatch.setenv("TRACKER_ADX__SOURCE_CLUSTER", "aks-east-1")  # the name the ADX rows carry, by default
    settings = load_settings()
    assert settings.reduce.reducer_limits(max_retired=5).metric_points_per_run == 0
    assert settings.index.identity(default_cluster=settings.adx.source_cluster) == {"cluster": "aks-east-1",
                                                                                  "workspace": ""}
    monkeypatch.setenv("TRACKER_INDEX__CLUSTER", "aks-east-2")
    monkeypatch.setenv("TRACKER_INDEX__WORKSPACE", "research")
    settings = load_settings()
    assert settings.index.identity(default_cluster=settings.adx.source_cluster) == {"cluster": "aks-east-2",
                                                                                  "workspace": "research"}


@settings(max_examples=150, deadline=None)
@given(rs=reports, cap=st.integers(1, 12), cuts=st.sets(st.integers(0, 60), max_size=12))
def test_the_updates_carry_the_points_that_changed_and_their_records_add_up_to_the_rules(
        rs: list[Report], cap: int, cuts: set[int]) -> None:
    """Flushed at any points: each update carries the points added or changed since the previous one (all of them the
    first time) and names the points no longer kept. Two sinks end up with the rule's points: one that combines the
    updates (``HistoryUpdate.then``: the experiment index) and one that keeps a record per point, upserted or deleted
    one by one and never replaced as a whole (Kafka's compacted transitions topic)."""
    red = Reducer(ReducerLimits(metric_points_per_run=cap))
    combined: HistoryUpdate | None = None
    records: dict[tuple[str, int], dict[str, Any]] = {}

    def flush() -> None:
        nonlocal combined
        for u in red.flush().updates:
            now = {(p["metric"], p["step"]): p for p in points_of(red)}
            assert all(now[p.metric, p.step] == to_json(p) for p in u.points or ())
            assert not set(u.removed_points) & set(now)
            if combined is not None and not (u.full or u.points_full):
                before = {(p.metric, p.step): to_json(p) for p in combined.points or ()}
                assert {(p.metric, p.step) for p in u.points or ()} == {k for k, p in now.items() if before.get(k) != p}
            for key in u.removed_points:
                records.pop(key, None)
            records.update(((p.metric, p.step), to_json(p)) for p in u.points or ())
            combined = u if combined is None else combined.then(u)

    for n, r in enumerate(rs):
        red.apply(progress(*r), "law")
        if n in cuts:
            flush()
    flush()
    want = expected(rs, cap)
    if combined is None:
        assert want == []
        return
    assert [to_json(p) for p in combined.points or ()] == want
    assert [records[k] for k in sorted(records)] == want


def test_one_report_to_a_run_of_many_points_updates_its_points_only() -> None:
    red = Reducer()
    for i in range(200):
        red.apply(progress(f"e{i}", i, i, {"loss": 1.0 / (i + 1), "acc": i / 400}), "intake")
    [first] = red.flush().updates
    assert first.full and len(first.points or ()) == 400 and first.removed_points == ()
    red.apply(progress("next", 200, 200, {"loss": 0.001}), "intake")
    [second] = red.flush().updates
    assert not second.full and not second.points_full
    assert [(p.metric, p.step, p.value) for p in second.points or ()] == [("loss", 200, 0.001)]
    red.apply(progress("next", 200, 200, {"loss": 0.001}), "intake")  # the same report again: nothing changed
    [third] = red.flush().updates
    assert third.points is None and third.removed_points == ()
    # past the cap the curves coarsen: the points merged away are named, the kept ones stay where they are
    for i in range(201, 400):
        red.apply(progress(f"e{i}", i, i, {"loss": 1.0 / (i + 1), "acc": i / 400}), "intake")
    [fourth] = red.flush().updates
    h = red.history("r")
    assert h is not None and len(h.metric_points) <= 512
    kept = {(p.metric, p.step) for p in h.metric_points}
    assert fourth.removed_points and not set(fourth.removed_points) & kept
    assert {(p.metric, p.step) for p in fourth.points or ()} <= kept
    assert [to_json(p) for p in (first.then(second).then(third).then(fourth).points or ())] == \
        [to_json(p) for p in h.metric_points]


@settings(max_examples=150, deadline=None)
@given(rs=reports, cap=st.integers(1, 12), cuts=st.sets(st.integers(0, 60), max_size=12),
       restarts=st.sets(st.integers(0, 60), max_size=3))
def test_a_changelog_of_points_apart_restores_the_rules_points_and_a_retired_run_leaves_none(
        rs: list[Report], cap: int, cuts: set[int], restarts: set[int]) -> None:
    """The run-state changelog keeps each point in a record of its own (``snapshot_run(points_apart=True)``): written
    at each flush, restored from at any flush (a restart), it ends with the rule's points, the run's record holds none
    of them, and a run retired leaves its marker and no point record."""
    limits = ReducerLimits(metric_points_per_run=cap)
    red = Reducer(limits)
    log: changelog.Changelog = {}

    def flush(n: int) -> Reducer:
        for u in red.flush().updates:
            changelog.write(log, red, u.run_id)
        if n in restarts:
            return changelog.restore(log, limits)
        return red

    for n, r in enumerate(rs):
        red.apply(progress(*r), "law")
        if n in cuts:
            red = flush(n)
    red = flush(-1)
    want = expected(rs, cap)
    if "r" not in red.runs:
        assert want == [] and not log
        return
    run = changelog.doc(log, "r")
    assert run["version"] == 4 and run["facts"]["points"][1] == {} and run["facts"]["progress_seen"] == []
    assert points_of(red) == want
    restored = changelog.restore(log, limits)
    assert points_of(restored) == want
    assert restored.runs["r"].points.to_json() == red.runs["r"].points.to_json()
    red.retire("r")
    red.flush()
    changelog.write(log, red, "r")
    marker = changelog.doc(log, "r")
    assert set(log) == {"r"} and marker["retired"] is True and marker["version"] == 4


def test_a_run_kept_with_its_points_inside_writes_them_all_apart_at_its_next_snapshot() -> None:
    """A run-state record of version 2 (points inside the facts, as trackers before version 3 and the index keep it)
    is read, and the run's next version-4 snapshot writes every point, even when no flush changed one of them."""
    red = Reducer()
    for step in range(5):
        red.apply(progress(f"p{step}", step, step, {"loss": 1.0 / (step + 1)}), "intake")
    red.flush()
    old = red.snapshot_run("r")
    assert old is not None and old["version"] == 2 and len(old["facts"]["points"][1]["loss"]) == 5
    new = Reducer()
    new.restore_run(json.loads(json.dumps(old)))
    snap = new.snapshot_run("r", points_apart=True)
    assert snap is not None and snap["version"] == 4 and snap["facts"]["points"] == [1, {}]
    assert [p[0] for p in snap["points"]["loss"]] == [0, 1, 2, 3, 4] and snap["points_removed"] == []
    again = new.snapshot_run("r", points_apart=True)  # written: the next snapshot holds none
    assert again is not None and again["points"] == {}


def test_a_points_record_that_is_not_one_is_refused_in_one_line() -> None:
    with pytest.raises(StoredStateError, match="is not a metric point's record of run 'r'"):
        point_of_state({"version": 2, "run_id": "r", "point": [1.0, 0]}, "r")
    with pytest.raises(StoredStateError, match="is not a metric point's record"):
        point_of_state({"version": 3, "run_id": "other", "point": [1.0, 0]}, "r")
    red = Reducer()
    red.apply(progress("a", 3, 0, {"loss": 2.0}), "intake")
    red.flush()
    snap = red.snapshot_run("r", points_apart=True)
    assert snap is not None
    with pytest.raises(StoredStateError, match="points"):  # the values are checked with the facts
        Reducer().restore_run(json.loads(json.dumps(snap)), {}, {"loss": [[3, "not a number", 0]]})
