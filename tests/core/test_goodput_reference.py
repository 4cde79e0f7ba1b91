"""The Google goodput reference harness (tests/support/goodput_reference.py): against figures computed by hand from
Google's
rules, against an independent re-statement of those rules on 200 random timelines, and the timeline generator
against what it promises."""

from __future__ import annotations

import itertools
import math
import random
import socket
import statistics
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.support.goodput_reference import (
    GoogleFigures,
    MemoryLogger,
    RefAttempt,
    RefTimeline,
    google_figures,
    random_timeline,
    write_entries,
)

TOL = 1e-6
SEEDS = range(200)
CATEGORIES = (
    "PROGRAM_STARTUP",
    "WASTED_PROGRESS_FROM_DISRUPTION",
    "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    "OTHER",
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Nothing here may reach a network or build a Cloud client: any attempt fails the test."""
    monkeypatch.setattr(socket.socket, "connect", _refuse)
    monkeypatch.setattr(socket, "create_connection", _refuse)
    monkeypatch.setattr("google.cloud.logging.Client", _refuse)
    monkeypatch.setattr("google.cloud.storage.Client", _refuse)
    yield


def _refuse(*args: Any, **kwargs: Any) -> NoReturn:
    raise AssertionError("the goodput reference tried to reach the network or build a Cloud client")


def test_the_offline_guard_refuses_a_cloud_client(tmp_path: Path) -> None:
    # The guard is real: without the in-memory logger, Google's calculator builds a Cloud Logging client.
    from ml_goodput_measurement.src import goodput

    with pytest.raises(AssertionError, match="network or build a Cloud client"):
        goodput.GoodputCalculator("j", "l", cache_dir=str(tmp_path))


def _assert_figures(got: GoogleFigures, total: float, productive: float, **badput: float) -> None:
    assert got.total_s == pytest.approx(total, abs=TOL)
    assert got.productive_s == pytest.approx(productive, abs=TOL)
    assert got.goodput_pct == pytest.approx(100.0 * productive / total, abs=TOL)
    for name in CATEGORIES:
        assert got.badput_s[name] == pytest.approx(badput.get(name, 0.0), abs=TOL), name
    for name, value in got.badput_s.items():
        if name not in CATEGORIES:
            assert value == 0.0, name  # TPU init, training prep, data loading, custom events: never recorded here


B = 1_700_000_000.0  # an epoch second; every time below is B + a whole number of seconds


def test_one_attempt_without_checkpoints() -> None:
    # Bound at B, first step 60 s later; step 0 takes 20 s, steps 1-3 take 10 s, step 4 ends the job 10 s later.
    tl = RefTimeline(
        (RefAttempt(B, ((0, B + 60), (1, B + 80), (2, B + 90), (3, B + 100), (4, B + 110)), release=B + 120),),
        end=B + 120,
    )
    # Productive deltas 20, 10, 10, 10: the first exceeds the mean of the others (10) by 10 s = PROGRAM_STARTUP;
    # the last step's interval (110 -> 120) is productive since the job end is recorded: 40 + 10 = 50 s.
    # The 60 s from the bind to step 0 is in no category: OTHER = 120 - 50 - 10.
    got = google_figures(tl)
    _assert_figures(got, total=120.0, productive=50.0, PROGRAM_STARTUP=10.0, OTHER=60.0)
    assert got.disruptions == 0


def _two_attempts() -> RefTimeline:
    a1 = RefAttempt(
        bind=1000.0,
        steps=((0, 1100.0), (1, 1115.0), (2, 1125.0), (3, 1135.0), (4, 1150.0), (5, 1160.0)),
        saves=((3, 1135.0, 1140.0),),  # the save of step 3 blocks 5 s inside step 3's interval (1135 -> 1150)
        interrupted_at=1165.0,
        release=1175.0,
    )
    a2 = RefAttempt(
        bind=1200.0,
        steps=((3, 1250.0), (4, 1260.0), (5, 1270.0), (6, 1280.0), (7, 1293.0)),
        saves=((6, 1280.0, 1283.0),),  # 3 s inside step 6's interval (1280 -> 1293)
        restores=((3, 1210.0, 1222.0),),  # 12 s, within the startup 1200 -> 1250
        release=1303.0,
    )
    return RefTimeline((a1, a2), end=1303.0)


def test_two_attempts_with_a_checkpoint_and_a_restore() -> None:
    got = google_figures(_two_attempts())
    # Total: first job start 1000 -> job end 1303 = 303 s.
    # Disruption: step 3 recorded again (attempt 2); attempt 1's segment is closed with curr_step = 3.
    #   Productive deltas (later step <= 3): 0->1 15 s, 1->2 10 s, 2->3 10 s = 35 s; the first exceeds the mean of
    #   the others (10) by 5 s: PROGRAM_STARTUP 5, productive 30.
    #   Wasted (later step > 3): 3->4 15 s (with the 5 s save of step 3) + 4->5 10 s = 25 s.
    #   Infrastructure recovery: attempt 2's job start 1200 - start of the last step recorded before, step 5 at
    #   1160 = 40 s (the interruption at 1165 and the release at 1175 are not seen).
    # Attempt 2's segment (the last): deltas 3->4 10, 4->5 10, 5->6 10, 6->7 13 (with the 3 s save): first 10 is not
    #   above the mean 11, no startup; 43 s, plus the last step 1293 -> end 1303 = 10 s.
    # Saves: 5 + 3 = 8 s, subtracted from productive: 30 + 43 + 10 - 8 = 75 s. The 5 s save of step 3 is thus in
    #   WASTED_PROGRESS and in UNPRODUCTIVE_CHECKPOINT_SAVE_TIME, and taken off productive time that never held it.
    # Restore: 12 s. OTHER = 303 - 75 - (5 + 25 + 40 + 8 + 12) = 138 = (1100 - 1000) + (1250 - 1200) - 12.
    _assert_figures(
        got,
        total=303.0,
        productive=75.0,
        PROGRAM_STARTUP=5.0,
        WASTED_PROGRESS_FROM_DISRUPTION=25.0,
        INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION=40.0,
        UNPRODUCTIVE_CHECKPOINT_SAVE_TIME=8.0,
        UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME=12.0,
        OTHER=138.0,
    )
    assert got.disruptions == 1


def test_the_same_checkpoint_restored_twice_counts_once_at_the_mean() -> None:
    # Attempt 2 saves nothing before it too is interrupted: attempt 3 restores step 3 again (20 s after 12 s).
    tl = _two_attempts()
    a1, a2 = tl.attempts
    a2 = replace(a2, steps=a2.steps[:3], saves=(), interrupted_at=1275.0, release=1280.0)
    a3 = RefAttempt(
        bind=1300.0,
        steps=((3, 1340.0), (4, 1350.0), (5, 1360.0), (6, 1370.0)),
        restores=((3, 1310.0, 1330.0),),
        release=1380.0,
    )
    got = google_figures(RefTimeline((a1, a2, a3), end=1380.0))
    # Attempt 2 (steps 3, 4, 5) is closed by step 3 recorded again: its deltas 3->4, 4->5 are wasted (20 s);
    # infrastructure 1300 - 1270 = 30 s. Attempt 3: three 10 s deltas + 10 s last step = 40 s productive.
    # Restore: the two entries of step 3 (12 s, 20 s) are averaged: 16 s, not 32 s.
    productive = 30.0 + 0.0 + 40.0 - 5.0
    flat = 5.0 + (25.0 + 20.0) + (40.0 + 30.0) + 5.0 + 16.0
    _assert_figures(
        got,
        total=380.0,
        productive=productive,
        PROGRAM_STARTUP=5.0,
        WASTED_PROGRESS_FROM_DISRUPTION=45.0,
        INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION=70.0,
        UNPRODUCTIVE_CHECKPOINT_SAVE_TIME=5.0,
        UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME=16.0,
        OTHER=380.0 - productive - flat,
    )
    assert got.disruptions == 2


def test_a_restart_from_step_zero_loses_the_attempt_to_other() -> None:
    # No checkpoint: attempt 2 records step 0 again. Google's segment closed at step 0 yields nothing: no productive
    # time, no wasted progress; only the infrastructure recovery is counted.
    a1 = RefAttempt(B, ((0, B + 50), (1, B + 60), (2, B + 70), (3, B + 80)), interrupted_at=B + 85, release=B + 86)
    a2 = RefAttempt(B + 100, ((0, B + 130), (1, B + 140), (2, B + 150)), release=B + 160)
    got = google_figures(RefTimeline((a1, a2), end=B + 160))
    _assert_figures(
        got,
        total=160.0,
        productive=30.0,
        INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION=20.0,  # B + 100 - (B + 80)
        OTHER=110.0,  # 50 before step 0, attempt 1's 30 s of steps, 30 s before attempt 2's step 0
    )
    assert got.disruptions == 1


def test_google_refuses_when_a_wasted_save_outweighs_the_productive_time() -> None:
    # The 100 s save of step 2 lies in step 2's interval, wasted once step 2 is recorded again; Google still takes it
    # off productive time (4 s of steps), which goes below 0: get_job_goodput raises.
    a1 = RefAttempt(
        1000.0,
        ((0, 1010.0), (1, 1011.0), (2, 1012.0), (3, 1113.0)),
        saves=((2, 1012.0, 1112.0),),
        interrupted_at=1113.5,
        release=1114.0,
    )
    a2 = RefAttempt(1200.0, ((2, 1250.0), (3, 1251.0)), restores=((2, 1210.0, 1220.0),), release=1252.0)
    with pytest.raises(ValueError, match="Productive training time is invalid"):
        google_figures(RefTimeline((a1, a2), end=1252.0))


def test_the_figures_do_not_depend_on_when_they_are_computed() -> None:
    # Google reads datetime.now() as the query time; with the job end recorded it must not matter: the same
    # timeline moved to 1990 or to 2100 (after now) gives the same figures.
    tl = _two_attempts()

    def moved(to: float) -> RefTimeline:
        d = to - tl.attempts[0].bind

        def a(x: RefAttempt) -> RefAttempt:
            return RefAttempt(
                x.bind + d,
                tuple((s, t + d) for s, t in x.steps),
                tuple((s, b + d, e + d) for s, b, e in x.saves),
                tuple((s, b + d, e + d) for s, b, e in x.restores),
                None if x.interrupted_at is None else x.interrupted_at + d,
                None if x.release is None else x.release + d,
            )

        return RefTimeline(tuple(a(x) for x in tl.attempts), tl.end + d)

    here = google_figures(tl)
    for to in (631_152_000.0, 4_102_444_800.0):  # 1990-01-01, 2100-01-01
        there = google_figures(moved(to))
        assert there.total_s == pytest.approx(here.total_s, abs=1e-5)
        assert there.productive_s == pytest.approx(here.productive_s, abs=1e-5)
        for name, value in here.badput_s.items():
            assert there.badput_s[name] == pytest.approx(value, abs=1e-5), name


def test_entries_are_written_in_time_order() -> None:
    logger = MemoryLogger("reference-job")
    write_entries(_two_attempts(), logger)
    kinds = [next(k for k in e if k.endswith("time")) for e in logger.entries]
    assert kinds[0] == "job_start_time" and kinds[-1] == "job_end_time"
    assert kinds.count("job_start_time") == 2
    steps = [e["step_count"] for e in logger.entries if "step_count" in e]
    assert steps == [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]
    saves = [e for e in logger.entries if e.get("event_type") == "save"]
    assert [(e["step"], e["checkpoint_manager_blocking_duration_secs"]) for e in saves] == [(3, 5.0), (6, 3.0)]


# --- 200 random timelines ---------------------------------------------------------------------------------------


def _predicted(tl: RefTimeline) -> dict[str, float]:
    """Google's rules as goodput_reference's docstring states them, applied to the attempts directly (not to log
    entries): if this agrees with the package on every random timeline, the docstring is exact for them."""
    productive = startup = wasted = infra = 0.0
    for i, a in enumerate(tl.attempts):
        nxt = tl.attempts[i + 1] if i + 1 < len(tl.attempts) else None
        curr = nxt.steps[0][0] if nxt is not None else a.steps[-1][0]
        deltas = [(s2, t2 - t1) for (_, t1), (s2, t2) in itertools.pairwise(a.steps)]
        if nxt is not None:
            infra += max(0.0, nxt.bind - a.steps[-1][1])
            if curr == 0:
                continue
        kept = [d for s, d in deltas if s <= curr]
        wasted += sum(d for s, d in deltas if s > curr)
        excess = max(0.0, kept[0] - statistics.fmean(kept[1:])) if len(kept) > 1 else 0.0
        productive += sum(kept) - excess
        startup += excess
    productive += tl.end - tl.attempts[-1].steps[-1][1]

    def once_per_step(ops: list[tuple[int, float, float]]) -> float:
        by_step: dict[int, list[float]] = {}
        for s, b, e in ops:
            by_step.setdefault(s, []).append(e - b)
        return sum(statistics.fmean(v) for v in by_step.values())

    save = once_per_step([x for a in tl.attempts for x in a.saves])
    restore = once_per_step([x for a in tl.attempts for x in a.restores])
    productive -= save
    total = tl.end - tl.attempts[0].bind
    flat = startup + wasted + infra + save + restore
    return {
        "total": total,
        "productive": productive,
        "PROGRAM_STARTUP": startup,
        "WASTED_PROGRESS_FROM_DISRUPTION": wasted,
        "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION": infra,
        "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME": save,
        "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME": restore,
        "OTHER": max(0.0, total - productive - flat),
    }


@pytest.fixture(scope="module")
def random_figures() -> list[tuple[RefTimeline, GoogleFigures]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", _refuse)
        return [(tl, google_figures(tl)) for tl in (random_timeline(random.Random(seed)) for seed in SEEDS)]


def test_random_timelines_figures_are_finite_non_negative_and_add_up(
    random_figures: list[tuple[RefTimeline, GoogleFigures]],
) -> None:
    for tl, got in random_figures:
        values = [got.total_s, got.productive_s, got.goodput_pct, *got.badput_s.values()]
        assert all(math.isfinite(v) and v >= 0.0 for v in values), got
        assert got.total_s == pytest.approx(tl.end - tl.attempts[0].bind, rel=TOL)
        assert got.goodput_pct == pytest.approx(100.0 * got.productive_s / got.total_s, rel=TOL)
        flat = got.productive_s + sum(v for k, v in got.badput_s.items() if k not in {"DATA_LOADING_ASYNC", "OTHER"})
        # OTHER is the residual, so the sum is exact: OTHER was never clamped at 0 on these timelines.
        assert flat + got.badput_s["OTHER"] == pytest.approx(got.total_s, rel=TOL)
        assert got.flat_sum_s() == pytest.approx(got.total_s, rel=TOL)
        assert got.disruptions == len(tl.attempts) - 1


def test_random_timelines_agree_with_the_rules_as_documented(
    random_figures: list[tuple[RefTimeline, GoogleFigures]],
) -> None:
    for tl, got in random_figures:
        want = _predicted(tl)
        assert got.total_s == pytest.approx(want["total"], rel=TOL)
        assert got.productive_s == pytest.approx(want["productive"], abs=TOL * want["total"])
        for name in CATEGORIES:
            assert got.badput_s[name] == pytest.approx(want[name], abs=TOL * want["total"]), name
        # OTHER in closed form (goodput_reference's docstring): time before each attempt's first step, less the
        # restore time Google counts, plus the steps of attempts that restarted from step 0.
        other = sum(a.steps[0][1] - a.bind for a in tl.attempts) - got.badput_s["UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"]
        other += sum(a.steps[-1][1] - a.steps[0][1] for a, n in itertools.pairwise(tl.attempts) if n.steps[0][0] == 0)
        assert got.badput_s["OTHER"] == pytest.approx(other, abs=TOL * want["total"])


def test_random_timelines_are_what_the_generator_promises() -> None:
    seen: dict[str, int] = {"attempts": 0, "from_zero": 0, "dropped_save": 0, "restored_twice": 0, "final_save": 0}
    counts: set[int] = set()
    for seed in SEEDS:
        tl = random_timeline(random.Random(seed))
        assert 1 <= len(tl.attempts) <= 4
        counts.add(len(tl.attempts))
        assert tl.end == round(tl.end, 6)
        saved_before: list[int] = []
        ratios: list[float] = []
        for i, a in enumerate(tl.attempts):
            last = i == len(tl.attempts) - 1
            nums = [s for s, _ in a.steps]
            assert 20 <= len(nums) <= 400 and nums == list(range(nums[0], nums[0] + len(nums)))
            assert 5.0 - TOL <= a.steps[0][1] - a.bind <= 300.0 + TOL
            want_first = saved_before[-1] if saved_before else 0
            assert nums[0] == want_first
            if saved_before:
                ((rs, rb, r_end),) = a.restores
                assert rs == want_first and 2.0 - TOL <= r_end - rb <= 60.0 + TOL
                assert a.bind <= rb < r_end <= a.steps[0][1]
                seen["restored_twice"] += sum(1 for b in tl.attempts[:i] if b.restores and b.restores[0][0] == rs)
            else:
                assert a.restores == ()
                seen["from_zero"] += i > 0
            for s, b, e in a.saves:
                assert 1.0 - TOL <= e - b <= 20.0 + TOL and s > 0 and s != nums[0]
                assert b == dict(a.steps)[s]
            save_of = {s: e - b for s, b, e in a.saves}
            for (s1, t1), (_, t2) in itertools.pairwise(a.steps):
                ratios.append(t2 - t1 - save_of.get(s1, 0.0))
            if last:
                assert a.interrupted_at is None and a.release == tl.end
                final = save_of.get(nums[-1], 0.0)
                seen["final_save"] += final > 0
                ratios.append(tl.end - a.steps[-1][1] - final)
            else:
                nxt = tl.attempts[i + 1]
                assert a.interrupted_at is not None and a.release is not None
                assert a.steps[-1][1] < a.interrupted_at <= a.release <= nxt.bind
                assert 10.0 - TOL <= nxt.bind - a.interrupted_at <= 900.0 + TOL
                assert all(e <= a.interrupted_at for _, _, e in a.saves)
                every = _every(tl)
                seen["dropped_save"] += every > 0 and nums[-1] % every == 0 and nums[-1] not in save_of
            saved_before += [s for s, _, _ in a.saves]
        # Step times (save time taken out) stay within the +-10% jitter of one base step time.
        assert max(ratios) <= min(ratios) * 1.1 / 0.9 + TOL
        seen["attempts"] += len(tl.attempts)
    assert counts == {1, 2, 3, 4}
    # The random timelines reach each of Google's special cases the reference tests cover.
    assert all(v > 0 for v in seen.values()), seen


def _every(tl: RefTimeline) -> int:
    """A multiple of the generator's checkpoint period: the gcd of the saved steps but the job's final save (which
    may fall on any step); 0 (no step is a multiple of it) when there is none."""
    final = tl.attempts[-1].steps[-1][0]
    steps = [s for a in tl.attempts for s, _, _ in a.saves if not (a is tl.attempts[-1] and s == final)]
    return math.gcd(*steps) if steps else 0
