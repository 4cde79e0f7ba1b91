"""Incremental derivation (tracker.core.derive.Derivation, tracker.core.derive_pods.PodSide) equals derivation from
scratch, and the updates a reducer flushes, applied one after the other, are the complete history.

The laws, on generated lifecycles (the clusters of tests/core/test_reducer_laws.py, and wide runs of many pods with pod
failures, evictions and deletions) folded in a random interleaving and flushed at random points:

- after every flush, each update's history is the history derived from scratch from the run's facts at that point;
- at the end, each run's history kept incrementally (``Reducer.history``) is the one derived from scratch
  (``derive``), pods and metric points included;
- the updates of a run combined in order (``HistoryUpdate.then``: what a sink ends up holding) are its complete
  history: the same rows, no removed pod left, no pod missing;
- an update holds only the pod rows that changed (a flush after a change of one pod of a wide run holds that pod),
  and only the metric points that changed (a flush after one progress report holds its points, not the run's);
- a progress report that changes nothing but the run's metrics, step records and checkpoints is derived without the
  history's shape (``derive._Shape``), and the history is still the one from scratch, whatever the report's time
  (before the run's attempt, in it, after its end, in a progress bucket already seen or not) and checkpoint.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from itertools import accumulate
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sim import builders as b
from sim.lifecycles import START, RunParams, RunPlan, generate_cluster
from tests.core.test_reducer_laws import law_settings, plans, run_params, seeds
from tests.core.test_run_id_conflicts import _copy, _run
from tests.support.laws import by_object, interleave
from tracker.core.derive import derive
from tracker.core.derive_pods import AttemptPods, PeakSet
from tracker.core.limits import ReducerLimits
from tracker.core.model import FINAL_STATUSES, HistoryUpdate, RunHistory, utc
from tracker.core.reducer import Reducer


def _check(order: list[Any], flush_at: set[int]) -> dict[str, HistoryUpdate]:
    """Fold ``order`` flushing after the records at ``flush_at``; check each flush against a derivation from scratch.
    Returns what a sink holds at the end: each run's updates combined."""
    red = Reducer()
    held: dict[str, HistoryUpdate] = {}

    def flush() -> None:
        for u in red.flush().updates:
            scratch = derive(red.runs[u.run_id])
            history = u.history if u.history is not None else held[u.run_id].history  # None: unchanged
            assert history == replace(scratch, metric_points=None, pods=None), u.run_id
            rows = {p.uid: p for p in scratch.pods or ()}
            assert all(rows.get(p.uid) == p for p in u.pods), "an update's pod row is not the pod's row"
            assert not set(u.removed_pods) & set(rows)
            points = {(p.metric, p.step): p for p in scratch.metric_points or ()}
            if u.full or u.points_full:
                assert (u.points or []) == (scratch.metric_points or []), "every point, in order"
            else:
                assert all(points.get((p.metric, p.step)) == p for p in u.points or ()), \
                    "an update's point is not the run's point"
            assert not set(u.removed_points) & set(points), "a point named removed is still kept"
            held[u.run_id] = held[u.run_id].then(u) if u.run_id in held else u

    for n, rec in enumerate(order):
        red.apply(rec, "law")
        if n in flush_at:
            flush()
    flush()
    for run_id, facts in red.runs.items():
        scratch = derive(facts)
        assert red.history(run_id) == scratch, run_id
        sink = held[run_id]
        assert sink.full, "the first update of a run holds all of it"
        assert sink.document() == scratch, run_id
        assert not set(sink.removed_pods) & {p.uid for p in scratch.pods or ()}
        assert not set(sink.removed_points) & {(p.metric, p.step) for p in scratch.metric_points or ()}
    return held


@law_settings(80)
@given(plans(), seeds, st.lists(st.integers(0, 400), max_size=40))
def test_incremental_derivation_equals_derivation_from_scratch(plan: list[RunPlan], seed: int,
                                                               cuts: list[int]) -> None:
    cluster = generate_cluster(plan)
    order = interleave(by_object(cluster.streams), random.Random(seed))
    _check(order, set(cuts))


@law_settings(60)
@given(plans(), seeds, st.lists(st.integers(0, 400), max_size=40), st.sampled_from([None, 60_000_000, 3_600_000_000]))
def test_a_reducer_that_frees_finished_runs_derivations_flushes_what_one_keeping_them_flushes(
        plan: list[RunPlan], seed: int, cuts: list[int], retire_after_us: int | None) -> None:
    """A finished run's derivation freed at a flush (``ReducerLimits.finished_derivation_rows``) is derived again
    before a late record changes the run (``Reducer._revive``), and retiring it reads the verdict noted when it was
    freed; its facts, packed from the next flush on (``tracker.core.run_table``), are unpacked first: the updates and
    retirements are the ones of a reducer that keeps every derivation, flush by flush."""
    order = interleave(by_object(generate_cluster(plan).streams), random.Random(seed))
    freeing = Reducer(ReducerLimits(finished_derivation_rows=None, retire_after_us=retire_after_us))
    keeping = Reducer(ReducerLimits(finished_derivation_rows=0, retire_after_us=retire_after_us))
    freed = 0
    for n, rec in enumerate(order):
        for red in (freeing, keeping):
            red.apply(rec, "law")
        if n in cuts or n == len(order) - 1:
            a, b = freeing.flush(), keeping.flush()
            assert a.updates == b.updates, n
            assert (a.retired, a.forgotten) == (b.retired, b.forgotten), n
            freed = max(freed, len(set(freeing.runs) - set(freeing.derivations)))
    assert freeing.stats == keeping.stats
    assert {k: freeing.history(k) for k in freeing.runs} == {k: keeping.history(k) for k in keeping.runs}
    if any(derive(r).run.status in FINAL_STATUSES for r in keeping.runs.values()):
        assert freed, "a finished run's derivation was freed"


wide_params = st.builds(
    RunParams,
    kind=st.sampled_from(["Job", "RayJob"]),
    pods=st.integers(9, 40),
    evictions=st.integers(0, 2),
    eviction_reason=st.sampled_from(["Preempted", "PodsReadyTimeout"]),
    pod_failures=st.integers(0, 3),
    ray_retries=st.integers(0, 1),
    outcome=st.sampled_from(["succeeded", "failed", "deactivated", "running", "deleted"]),
    with_events=st.booleans(),
    progress_points=st.integers(0, 3),
    tight=st.booleans(),
)


@law_settings(40)
@given(wide_params, seeds, st.floats(0.0, 1.0))
def test_wide_runs_flushed_at_every_record_equal_their_derivation_from_scratch(params: RunParams, seed: int,
                                                                               density: float) -> None:
    """One wide run, its pods' records interleaved at random, flushed after a random share of its records (up to
    every one of them, as a live run is at a live rate)."""
    order = interleave(by_object(generate_cluster([RunPlan(params, seed=seed)]).streams), random.Random(seed))
    rng = random.Random(seed + 1)
    _check(order, {n for n in range(len(order)) if rng.random() < density})


def test_a_change_of_one_pod_of_a_wide_run_updates_that_pod_only() -> None:
    cluster = generate_cluster([RunPlan(RunParams(pods=64, outcome="running", progress_points=0))])
    order = [ev for seq in by_object(cluster.streams) for ev in seq]
    red = Reducer()
    for rec in order:
        red.apply(rec, "law")
    [first] = red.flush().updates
    assert first.full and len(first.pods) == 64
    pod = next(ev for ev in reversed(order) if "object" in ev and ev["object"]["kind"] == "Pod")
    changed = {**pod, "object": {**pod["object"], "spec": {**pod["object"]["spec"], "nodeName": "another-node"},
                                 "metadata": {**pod["object"]["metadata"], "resourceVersion": "999999"}}}
    red.apply(changed, "law")
    [second] = red.flush().updates
    assert not second.full and second.points is None and second.removed_pods == ()
    assert [(p.uid, p.node) for p in second.pods] == [(pod["object"]["metadata"]["uid"], "another-node")]
    red.apply(changed, "law")  # the same record again: its row does not change, and no pod goes out
    [third] = red.flush().updates
    assert third.pods == ()
    assert isinstance(red.history(first.run_id), RunHistory)


def test_a_root_that_takes_a_run_id_removes_the_other_roots_pods() -> None:
    """Two Jobs claim one run id; the one created first keeps it. Folded after the other, it takes the run over: the
    pods folded for the other are no longer the run's (the update names them in removed_pods) and a sink that
    combines the updates holds the winner's pods only."""
    run_id, watch, intake = _run("quick-success")
    copy = _copy(watch, namespace="team-z", created="2026-08-20T10:02:03Z")  # created later: it loses
    red = Reducer()
    for rec in [*copy, *intake]:  # the later root first: it holds the run id for now
        red.apply(rec, "law")
    [before] = red.flush().updates
    theirs = {p.uid for p in before.pods}
    assert theirs
    for rec in watch:
        red.apply(rec, "law")
    [after] = red.flush().updates
    assert set(after.removed_pods) == theirs
    combined = before.then(after)
    assert combined.document() == derive(red.runs[run_id])
    assert {p.uid for p in combined.pods}.isdisjoint(theirs) and combined.pods


@law_settings(200)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 60), st.sampled_from([-8, -4, -1, 1, 4, 8])), max_size=900))
def test_the_most_gpus_held_at_once_is_the_largest_running_sum_whatever_the_adds_and_removes(
        ops: list[tuple[bool, int, int]]) -> None:
    """PeakSet (a plain list up to 32 events, then blocks of 128 to 256) against the definition: the largest prefix
    sum of the sorted events."""
    peaks = PeakSet()
    held: list[tuple[int, int]] = []
    for remove, t, delta in ops:
        if remove and held:
            ev = held.pop(t % len(held))
            peaks.remove(ev)
        else:
            held.append((t, delta))
            peaks.add((t, delta))
        assert peaks.peak() == max([0, *accumulate(d for _t, d in sorted(held))])


def test_attempts_start_with_shared_empty_containers_and_fill_their_own() -> None:
    """An attempt's sorted lists and loss sums start as shared empty containers (``derive_pods._NO_ITEMS``): the first
    insertion gives the attempt one of its own, so another attempt still starts empty (the autouse fixture
    ``_shared_empties_stay_empty`` checks the shared ones after every test)."""
    a, b = AttemptPods(), AttemptPods()
    assert a.created is b.created and a.failures is b.failures and a.by is b.by
    for t in (30, 10, 20):
        a.add_created(t)
    a.unschedulable.add("x")
    assert a.created == [10, 20, 30] and a.last_created() == 30 and a.unschedulable.items == ["x"]
    assert b.created == [] and b.last_created() == 0 and b.unschedulable.items == [] and b.retries() == 0
    a.remove_created(20)
    a.unschedulable.remove("x")
    assert a.created == [10, 30] and a.unschedulable.items == [] and AttemptPods().created == []


def test_an_attempt_lists_its_first_64_failures_and_counts_them_all() -> None:
    """Records stay bounded when every pod of a wide run fails: the attempt lists the 64 earliest failures and
    ``failed_pods`` counts all of them (and ``retries`` those the Job replaced, whatever the list holds)."""
    from tracker.core.model import MAX_FAILURES_LISTED

    cluster = generate_cluster([RunPlan(RunParams(pods=2, pod_failures=1, outcome="failed"))])
    order = [ev for seq in by_object(cluster.streams) for ev in seq]
    failed = [ev for ev in order if ev.get("object", {}).get("kind") == "Pod"
              and ev["object"].get("status", {}).get("phase") == "Failed"]
    assert failed
    template = failed[-1]
    uid, name = template["object"]["metadata"]["uid"], template["object"]["metadata"]["name"]
    clones = []
    for k in range(100):
        text = json.dumps(template).replace(uid, f"{uid[:-4]}{k:04d}").replace(name, f"{name}-{k:03d}")
        clones.append(json.loads(text))
    red = Reducer()
    for rec in [*order, *clones]:
        red.apply(rec, "law")
    h = red.history(next(iter(red.runs)))
    assert h is not None
    a = next(a for a in h.attempts if a.failed_pods)
    assert len(a.failures) == MAX_FAILURES_LISTED and a.failed_pods >= 100
    assert a.failures == sorted(a.failures, key=lambda f: (f.at, f.pod))
    assert h == derive(red.runs[h.run.run_id])


# progress reports and checkpoint events of a run, at times around its lifecycle: (kind, minutes after START, step,
# with a checkpoint URI)
training_events = st.lists(st.tuples(st.sampled_from(["Progress", "Progress", "Progress", "CheckpointSave",
                                                      "CheckpointRestore"]),
                                     st.integers(-5, 240), st.integers(0, 5_000), st.booleans()), max_size=30)


def _training(run_id: str, events: list[tuple[str, int, int, bool]]) -> list[dict[str, Any]]:
    out = []
    for i, (kind, minutes, step, uri) in enumerate(events):
        when = START + minutes * b.MINUTE + i  # some share a progress bucket (a minute), some do not
        ckpt = f"az://ckpt/{run_id}/{step // 1000}" if uri else None
        if kind == "Progress":
            out.append(b.progress_event(event_id=f"law-{i}", run_id=run_id, when=when, step=step,
                                        metrics={"loss": 1.0 / (1 + step)}, checkpoint_uri=ckpt))
        elif kind == "CheckpointSave":
            out.append(b.checkpoint_save_event(event_id=f"law-{i}", run_id=run_id, when=when,
                                               phase="completed" if uri else "started", step=step,
                                               uri=f"az://ckpt/{run_id}/{step // 1000}"))
        else:
            out.append(b.checkpoint_restore_event(event_id=f"law-{i}", run_id=run_id, when=when,
                                                  phase="completed" if uri else "started", step=step,
                                                  uri=f"az://ckpt/{run_id}/{step // 1000}"))
    return out


@law_settings(60)
@given(run_params, training_events, seeds, st.floats(0.0, 1.0))
def test_progress_reports_anywhere_flushed_anywhere_equal_the_derivation_from_scratch(
        params: RunParams, events: list[tuple[str, int, int, bool]], seed: int, density: float) -> None:
    """A run's lifecycle with progress reports and checkpoint events added at any time around it, flushed after a
    random share of the records: each flush's history is the one from scratch (``_check``), however many of the
    progress reports took the path that keeps the history's shape."""
    streams = by_object(generate_cluster([RunPlan(params, seed=seed)]).streams)
    run_id = next(rec["run_id"] for stream in streams for rec in stream if "run_id" in rec)
    order = interleave([*streams, _training(run_id, events)], random.Random(seed))
    rng = random.Random(seed + 1)
    _check(order, {n for n in range(len(order)) if rng.random() < density})


def test_a_progress_report_of_a_running_run_keeps_its_shape_unless_it_changes_what_the_shape_reads() -> None:
    """The shape (attempts, phases, status, the run record without the ledger) is derived again only when a report
    changes what it reads: an attempt's first progress report, or a later checkpoint; not a progress time in a minute
    not seen yet after the attempt's first. Each history is the one from scratch."""
    cluster = generate_cluster([RunPlan(RunParams(pods=2, outcome="running", progress_points=1))])
    red = Reducer()
    for rec in (ev for seq in by_object(cluster.streams) for ev in seq):
        red.apply(rec, "law")
    [first] = red.flush().updates
    run_id = first.run_id
    assert first.history is not None
    last = max(t.at for t in first.history.transitions)
    base = int(last.timestamp() * 1000) + 5 * b.MINUTE
    shapes = red.derivations[run_id].shapes

    def report(n: int, when: int, uri: str | None = None) -> HistoryUpdate:
        red.apply(b.progress_event(event_id=f"p{n}", run_id=run_id, when=when, step=1_000 + n, metrics={"loss": 1 / n},
                                   checkpoint_uri=uri), "law")
        [u] = red.flush().updates
        history = u.history if u.history is not None else first.history
        assert history == replace(derive(red.runs[run_id]), metric_points=None, pods=None)
        return u

    report(1, base)  # a minute not seen yet, after the attempt's first report: the progress times changed, not it
    assert red.derivations[run_id].shapes == shapes
    u = report(2, base + b.SECOND)  # the same minute: steps, metrics and points only
    assert red.derivations[run_id].shapes == shapes
    assert u.points and u.history is not None and u.history.metrics != first.history.metrics
    report(3, base + 2 * b.SECOND, "az://ckpt/3")  # a later checkpoint
    assert red.derivations[run_id].shapes == shapes + 1
    report(4, base + 3 * b.SECOND)
    assert red.derivations[run_id].shapes == shapes + 1
    red.apply(b.progress_event(event_id="p4", run_id=run_id, when=base + 3 * b.SECOND, step=1_004,
                               metrics={"loss": 1 / 4}), "law")  # a repeat: nothing changes, nothing derived
    [u] = red.flush().updates
    assert u.history is None and not u.points and red.derivations[run_id].shapes == shapes + 1
    # a report before the attempt's first (after it started): the attempt's Progress entry moves
    att = first.history.attempts[-1]
    assert att.started_at is not None and att.progress_at is not None and att.started_at < att.progress_at
    earlier = int(att.started_at.timestamp() * 1000) + (int(att.progress_at.timestamp() * 1000) -
                                                         int(att.started_at.timestamp() * 1000)) // 2
    u = report(5, earlier)
    assert red.derivations[run_id].shapes == shapes + 2
    assert u.history is not None and u.history.attempts[-1].progress_at == utc(earlier * 1000)
