"""A run's progress minutes (the report ids it remembers, the earliest report of each minute) kept apart on run-state,
a record per minute (``Reducer.snapshot_run(points_apart=True)``, snapshot version 4): a report rewrites its minute's
record, not every id and minute the run remembers, and a changelog restored from at any flush counts each report
once and gives the history of a reducer that never restarted."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import changelog
from tracker.core import wire
from tracker.core.facts import (
    MAX_PROGRESS_BUCKETS,
    MAX_PROGRESS_SEEN,
    RunFacts,
    seen_minute,
)
from tracker.core.ledger_facts import STEP_TRAIL_WIDTH, StepTrail
from tracker.core.model import to_json
from tracker.core.reducer import Reducer
from tracker.core.snapshot import Minute, minute_of_state, minute_state
from tracker.errors import StoredStateError
from tracker.runtime import run_state

T0 = datetime(2026, 8, 20, 10, 0, tzinfo=UTC)
Report = tuple[str, int, int]  # (event id, step, seconds after T0)


def progress(event_id: str, step: int, seconds: float, run_id: str = "r") -> dict[str, Any]:
    return {"schema": "taugrid.io/intake/v1", "kind": "Progress", "event_id": event_id, "run_id": run_id,
            "at": (T0 + timedelta(seconds=seconds)).isoformat(), "step": step, "metrics": {"loss": 1.0 / (step + 1)}}


Minutes = dict[int, tuple[list[list[Any]], int | None, list[list[Any]]]]


def minutes_of(facts: RunFacts) -> Minutes:
    """The progress minutes a changelog must hold: the run's report ids by minute, each minute by (time, id), its
    earliest report and its step records."""
    ids: dict[int, list[list[Any]]] = {}
    for k, at in sorted(facts.progress_seen.items(), key=lambda kv: (kv[1], kv[0])):
        ids.setdefault(seen_minute(at), []).append([k, at])
    steps: dict[int, list[list[Any]]] = {}
    for at, step in facts.steps.records():
        steps.setdefault(seen_minute(at), []).append([at, step])
    every = ids.keys() | facts.progress_buckets.keys() | steps.keys()
    return {m: (ids.get(m, []), facts.progress_buckets.get(m), steps.get(m, [])) for m in every}


def minute_records(log: changelog.Changelog, run_id: str = "r") -> Minutes:
    out = {}
    for key in log:
        parsed = wire.minute_of_key(key)
        if parsed is not None and parsed[0] == run_id:
            out[parsed[1]] = minute_of_state(changelog.doc(log, key), run_id, parsed[1])
    return out


def listed(minutes: dict[int, Minute]) -> Minutes:
    return {m: ([list(p) for p in ids], first, [list(r) for r in steps]) for m, (ids, first, steps) in minutes.items()}


# reports over about ten progress minutes; ids from a pool, so that many are repeats (of the id's first report)
reports = st.lists(st.tuples(st.integers(0, 40).map(lambda i: f"e{i}"), st.integers(0, 40), st.integers(0, 600)),
                   max_size=60)


@settings(max_examples=150, deadline=None)
@given(rs=reports, cuts=st.sets(st.integers(0, 60), max_size=12), restarts=st.sets(st.integers(-1, 60), max_size=4))
def test_a_changelog_of_minutes_counts_each_report_once_and_gives_the_same_history_whatever_the_restarts(
        rs: list[Report], cuts: set[int], restarts: set[int]) -> None:
    """Written at each flush and restored from at any of them, the changelog ends with the minutes of a reducer that
    never restarted, in records of their own (the run's record holds none); the metric's report count, its summary
    and the whole history are that reducer's; a retired run leaves its marker and no minute."""
    first = {}  # a repeat is the same report: the id's first step and time
    for event_id, step, sec in rs:
        first.setdefault(event_id, (event_id, step, sec))
    plain, red, log = Reducer(), Reducer(), changelog.Changelog()

    def flush(n: int) -> Reducer:
        for u in red.flush().updates:
            changelog.write(log, red, u.run_id)
        return changelog.restore(log) if n in restarts else red

    for n, (event_id, _step, _sec) in enumerate(rs):
        plain.apply(progress(*first[event_id]), "law")
        red.apply(progress(*first[event_id]), "law")
        if n in cuts:
            red = flush(n)
    red = flush(-1)
    if not rs:
        assert not log and not red.runs
        return
    assert red.runs["r"].progress_seen == plain.runs["r"].progress_seen
    assert red.runs["r"].progress_buckets == plain.runs["r"].progress_buckets
    assert red.runs["r"].metrics == plain.runs["r"].metrics
    assert red.runs["r"].metrics["loss"].points == len(first)
    assert to_json(red.history("r")) == to_json(plain.history("r"))
    run = changelog.doc(log, "r")
    assert run["version"] == 4 and run["facts"]["progress_seen"] == run["facts"]["progress_buckets"] == []
    assert run["facts"]["steps"][1] == []
    assert minute_records(log) == minutes_of(plain.runs["r"])
    again = changelog.restore(log)
    assert again.runs["r"].progress_seen == plain.runs["r"].progress_seen
    assert again.runs["r"].progress_buckets == plain.runs["r"].progress_buckets
    assert again.runs["r"].steps == plain.runs["r"].steps and red.runs["r"].steps == plain.runs["r"].steps
    red.retire("r")
    red.flush()
    changelog.write(log, red, "r")
    assert set(log) == {"r"} and changelog.doc(log, "r")["retired"] is True


def test_a_report_rewrites_its_minute_only() -> None:
    """A run that remembers hundreds of reports writes, for one more report, the record of that report's minute: its
    own record holds no id and no minute."""
    red = Reducer()
    for k in range(600):  # ten minutes, a report a second
        red.apply(progress(f"report-{k}", k, k), "intake")
    red.flush()
    first = red.snapshot_run("r", points_apart=True)
    assert first is not None and first["facts"]["progress_seen"] == first["facts"]["progress_buckets"] == []
    m0 = seen_minute(int(T0.timestamp() * 1_000_000))
    assert sorted(first["minutes"]) == list(range(m0, m0 + 10))
    assert all(len(ids) == 60 == len(steps) and first_at == ids[0][1] == steps[0][0]
               for ids, first_at, steps in first["minutes"].values())
    assert first["facts"]["steps"][1] == []
    red.apply(progress("late", 600, 600.5), "intake")
    red.flush()
    snap = red.snapshot_run("r", points_apart=True)
    assert snap is not None
    minute = seen_minute(int((T0 + timedelta(seconds=600.5)).timestamp() * 1_000_000))
    assert list(snap["minutes"]) == [minute] and [p[0] for p in snap["minutes"][minute][0]] == ["late"]
    assert snap["minutes"][minute][1] == snap["minutes"][minute][0][0][1] and snap["minutes_removed"] == []
    assert snap["minutes"][minute][2] == [(snap["minutes"][minute][1], 600)]
    _tombs, records = run_state.run_records("r", snap)
    assert [k for k, _v, _h in records] == ["r", wire.point_key("r", "loss", 600), wire.minute_key("r", minute)]
    assert b'"report-' not in records[0][1] and b'"late"' not in records[0][1]  # the run's record: no id of the 601
    red.apply(progress("late", 600, 600.5), "intake")  # a repeat changes nothing
    red.flush()
    assert red.snapshot_run("r", points_apart=True)["minutes"] == {}  # type: ignore[index]


def test_at_the_bound_the_changelog_forgets_the_oldest_minute_with_the_reducer() -> None:
    """Past ``MAX_PROGRESS_SEEN`` reports a run forgets its oldest id for each new one: the changelog rewrites the
    oldest minute (which keeps its earliest report), and restored anywhere holds exactly the ids the run
    remembers."""
    rng = random.Random(7)
    red, log = Reducer(), changelog.Changelog()
    n = MAX_PROGRESS_SEEN + 3_000
    for k in range(n):
        red.apply(progress(f"p{k}", k, k * 0.5 + rng.random() * 0.1), "intake")
        if k % 997 == 0 or k == n - 1:
            red.flush()
            changelog.write(log, red, "r")
            if k == MAX_PROGRESS_SEEN + 1_000:
                red = changelog.restore(log)
    facts = red.runs["r"]
    assert len(facts.progress_seen) == MAX_PROGRESS_SEEN and facts.metrics["loss"].points == n
    assert minute_records(log) == minutes_of(facts)
    assert changelog.restore(log).runs["r"].progress_seen == facts.progress_seen


def test_at_the_bound_of_minutes_the_changelog_keeps_the_earliest_ones() -> None:
    """Past ``MAX_PROGRESS_BUCKETS`` minutes a run keeps its earliest ones (and its latest report ids): the changelog
    holds exactly those, a minute of ids alone once its earliest report is no longer kept."""
    red, log = Reducer(), changelog.Changelog()
    n = MAX_PROGRESS_BUCKETS + 300
    for k in range(n):  # a report every 61 s: a minute each
        red.apply(progress(f"p{k}", k, k * 61), "intake")
        if k % 1_999 == 0 or k == n - 1:
            red.flush()
            changelog.write(log, red, "r")
            if k == 3 * 1_999:
                red = changelog.restore(log)
    facts = red.runs["r"]
    assert len(facts.progress_buckets) == MAX_PROGRESS_BUCKETS and len(facts.progress_seen) == MAX_PROGRESS_SEEN
    records = minute_records(log)
    assert records == minutes_of(facts) and any(first is None for _ids, first, _steps in records.values())
    again = changelog.restore(log).runs["r"]
    assert (again.progress_seen, again.progress_buckets) == (facts.progress_seen, facts.progress_buckets)
    assert again.steps == facts.steps and facts.steps.width > STEP_TRAIL_WIDTH  # its width grew: records merged
    assert again.metrics == facts.metrics


def test_a_run_kept_with_its_ids_inside_writes_every_minute_at_its_next_snapshot() -> None:
    """A version-3 record (ids and minutes inside the facts, as the tracker before version 4 wrote it) is read, and
    the run's next snapshot writes every minute apart, though no flush changed them."""
    red = Reducer()
    for k in range(180):
        red.apply(progress(f"p{k}", k, k), "intake")
    red.flush()
    old = red.snapshot_run("r", points_apart=True)
    assert old is not None
    old["version"], old["facts"]["progress_seen"] = 3, sorted(red.runs["r"].progress_seen.items())
    old["facts"]["progress_buckets"] = sorted(red.runs["r"].progress_buckets.items())
    old["facts"]["steps"] = red.runs["r"].steps.to_json()
    for key in ("minutes", "minutes_removed"):
        del old[key]
    new = Reducer()
    points = json.loads(json.dumps(old.pop("points")))
    new.restore_run(json.loads(json.dumps(old)), {}, points)
    snap = new.snapshot_run("r", points_apart=True)
    assert snap is not None and snap["version"] == 4 and snap["facts"]["progress_seen"] == []
    assert listed(snap["minutes"]) == minutes_of(red.runs["r"]) and len(snap["minutes"]) == 3
    assert new.runs["r"].metrics == red.runs["r"].metrics and new.runs["r"].steps == red.runs["r"].steps
    assert new.runs["r"].progress_buckets == red.runs["r"].progress_buckets
    assert new.snapshot_run("r", points_apart=True)["minutes"] == {}  # type: ignore[index]


def test_a_minute_record_that_is_not_one_is_refused_in_one_line() -> None:
    at = int(T0.timestamp() * 1_000_000)
    m = seen_minute(at)
    assert minute_of_state(minute_state("r", ([("a", at)], at, [(at, 3)])), "r", m) == ([["a", at]], at, [[at, 3]])
    assert minute_of_state(minute_state("r", ([], at, [])), "r", m) == ([], at, [])
    ok = {"version": 4, "run_id": "r", "seen": [["a", at]], "first": None, "steps": []}
    for bad, why in [({"version": 3}, "version 4"), ({"run_id": "other"}, "run 'r'"),
                     ({"seen": [["a", at + 60_000_000]]}, f"minute {m}"), ({"first": at - 1}, f"minute {m}"),
                     ({"first": "soon"}, "first: at or null"), ({"seen": [["a", "soon"]]}, "event id, at"),
                     ({"seen": [[1, at]]}, "event id, at"), ({"steps": [[at, 1.5]]}, "steps"),
                     ({"steps": [[at - 1, 1]]}, f"minute {m}"), ({"steps": None}, "steps")]:
        with pytest.raises(StoredStateError, match=why) as err:
            minute_of_state({**ok, **bad}, "r", m)
        assert "\n" not in str(err.value)
    for doc, why in [([], "seen")]:
        with pytest.raises(StoredStateError, match=why) as err:
            minute_of_state(doc, "r", m)
        assert "\n" not in str(err.value)
    kept = run_state.Restored()
    with pytest.raises(StoredStateError, match="run-state record 'r/minute/5': "):
        kept.add("r/minute/5", b"{not json")
    with pytest.raises(StoredStateError, match="minute 5"):
        kept.add("r/minute/5", json.dumps(minute_state("r", ([("a", at)], None, []))).encode())


def test_minute_keys_are_told_from_points_and_pods() -> None:
    assert wire.minute_of_key(wire.minute_key("r", 29_000_000)) == ("r", 29_000_000)
    assert wire.minute_of_key(wire.minute_key("r", -3)) == ("r", -3)
    assert wire.minute_of_key(wire.point_key("r", "a/minute/5", 3)) is None  # a metric may be called that
    assert wire.point_of_key(wire.point_key("r", "a/minute/5", 3)) == ("r", "a/minute/5", 3)
    for key in ("r/minute/", "r/minute/05", "r/minute/x", "/minute/5", "r/pod/u", "r"):
        assert wire.minute_of_key(key) is None, key


@settings(max_examples=200, deadline=None)
@given(recs=st.lists(st.tuples(st.integers(-(2**24), 2**26), st.integers(0, 50)), max_size=80),
       cap=st.integers(1, 6))
def test_a_step_record_names_the_times_of_every_record_it_added_or_dropped(recs: list[tuple[int, int]],
                                                                         cap: int) -> None:
    """``StepTrail.add`` returns the time of each record it added or dropped (merges included), so the minutes a
    changelog rewrites hold every change; and a trail rebuilt from its records alone (``of_records``) is itself."""
    trail = StepTrail()
    for at, step in recs:
        before = set(trail.records())
        changed = trail.add(at, step, cap)
        after = set(trail.records())
        assert {r[0] for r in before ^ after} <= set(changed)
        assert changed or before == after
        assert StepTrail.from_json(StepTrail.of_records(trail.width, [list(r) for r in after])) == trail
