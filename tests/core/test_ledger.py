"""The goodput ledger (tracker/core/ledger.py) on hand-made inputs, every figure worked out by hand from the rules
of its docstring; and its facts (tracker/core/ledger_facts.py: StepTrail, Checkpoints): bounded, and the same for any
order and repeats of the same reports."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracker.core import ledger as ledger_module
from tracker.core import ledger_facts
from tracker.core.derive_ledger import restores, saves
from tracker.core.ledger import Ledger, LedgerAttempt, LedgerInput, Restore, Save, Stretches, ledger, stretches
from tracker.core.ledger_facts import STEP_TRAIL_WIDTH, Checkpoints, StepTrail

S = 1_000_000  # µs in a second: the inputs below are in seconds
SCHED, STARTUP, PROD, SAVE, RESTORE, WASTED, INFRA = ("scheduling", "startup", "productive", "checkpoint-save",
                                                      "checkpoint-restore", "wasted-progress",
                                                      "infrastructure-recovery")


def _s(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(a * S, b) for a, b in pairs]


def _att(begin: int, end: int | None, lost: bool, pending: list[tuple[str, int, int | None]],
         held: list[tuple[int, int]], held_s: int = 0, lost_s: int = 0) -> LedgerAttempt:
    """An attempt, times in seconds; ``held_s``/``lost_s`` in GPU-seconds (of its released pods)."""
    return LedgerAttempt(begin * S, None if end is None else end * S, lost,
                         [(c, s * S, None if e is None else e * S) for c, s, e in pending],
                         _s(held), held_s * S, lost_s * S)


def _by_s(by: dict[str, int]) -> dict[str, float]:
    return {k: v / S for k, v in by.items()}


def _spans_s(led: Ledger) -> list[tuple[str, float, float]]:
    return [(c, s / S, e / S) for c, s, e in led.spans]


def test_two_attempts_a_checkpoint_an_eviction_and_a_restore() -> None:
    """Attempt 1 (queued at 0, 16 GPUs bound 60 to 1005) reaches step 400, saved step 200 from 500 to 520, and is
    evicted at 1000; attempt 2 (queued at 1000, 16 GPUs bound 1110 to 3000) restores step 200 from 1160 to 1190,
    steps from 200 at 1200 to the run's end at 3000.

    Pieces: scheduling 0-60 (its quota and scheduling pending spans; the image pull is startup), startup 60-120
    (the first step), productive 120-500, save 500-520, wasted 520-1000 (the checkpoint the next stretch resumed
    from completed at 520), recovery 1000-1160 (the eviction to the next first step, the restore apart; attempt
    2's pending spans rank below it), restore 1160-1190, recovery 1190-1200, productive 1200-3000."""
    first = _att(0, 1000, True, [("quota", 0, 50), ("scheduling", 50, 60), ("image-pull", 60, 100)],
                 [(60, 16), (1005, -16)], 16 * 945, 16 * 945)
    second = _att(1000, 3000, False, [("backoff", 1000, 1100), ("scheduling", 1100, 1110),
                                      ("container-creation", 1110, 1150)], [(1110, 16), (3000, -16)], 16 * 1890)
    steps = _s([(120, 0), (300, 100), (500, 200), (700, 300), (900, 400),
                (1200, 200), (1500, 300), (2000, 400), (2900, 500)])
    led = ledger(LedgerInput([first, second], steps, [Save(500 * S, 520 * S, 200, True)],
                             [Restore(1160 * S, 1190 * S, 200)], 3000 * S, False))
    assert led.basis == "progress"
    assert [_by_s(w) for w in led.wall_us] == [
        {SCHED: 60, STARTUP: 60, PROD: 380, SAVE: 20, WASTED: 480},
        {INFRA: 170, RESTORE: 30, PROD: 1800},
    ]
    assert [_by_s(g) for g in led.gpu_us] == [
        {STARTUP: 16 * 60, PROD: 16 * 380, SAVE: 16 * 20, WASTED: 16 * 480, INFRA: 16 * 5},  # = 16 x 945
        {INFRA: 16 * 60, RESTORE: 16 * 30, PROD: 16 * 1800},  # = 16 x 1890
    ]
    assert (led.until, led.open) == (3000 * S, None)
    assert _spans_s(led) == [(WASTED, 520, 1000), (INFRA, 1000, 1160), (RESTORE, 1160, 1190), (INFRA, 1190, 1200)]


def test_a_restart_within_an_attempt() -> None:
    """One attempt (8 GPUs bound 10 to 2000): steps 0 to 30 by 400, step 20 saved 300-310; the process dies and
    restores step 20 (500-520), reports step 20 again at 530 (a new stretch), and goes on to the end at 2000.
    The first stretch ends at its last record (400): wasted from the save's completion (310) to 400, recovery
    from 400 to the next stretch's first record (the restore apart)."""
    att = _att(0, 2000, False, [("scheduling", 0, 10)], [(10, 8), (2000, -8)], 8 * 1990)
    steps = _s([(100, 0), (200, 10), (300, 20), (400, 30), (530, 20), (600, 30), (1900, 100)])
    led = ledger(LedgerInput([att], steps, [Save(300 * S, 310 * S, 20, True)], [Restore(500 * S, 520 * S, 20)],
                             2000 * S, False))
    assert _by_s(led.wall_us[0]) == {SCHED: 10, STARTUP: 90, PROD: 200 + 1470, SAVE: 10, WASTED: 90,
                                     INFRA: 100 + 10, RESTORE: 20}
    assert _by_s(led.gpu_us[0]) == {STARTUP: 8 * 90, PROD: 8 * 1670, SAVE: 8 * 10, WASTED: 8 * 90,
                                    INFRA: 8 * 110, RESTORE: 8 * 20}
    assert sum(led.gpu_us[0].values()) == 8 * 1990 * S
    assert _spans_s(led) == [(WASTED, 310, 400), (INFRA, 400, 500), (RESTORE, 500, 520), (INFRA, 520, 530)]


def test_a_failed_run_keeps_its_last_checkpoint() -> None:
    """One attempt (8 GPUs bound 20, released 995 when the pod failed), the run failed at 1000: step 100 saved
    500-530; the save of step 200 begun at 900 never completed. Nothing resumed it: kept to the last completed
    checkpoint (530), wasted from there to the run's end; an unfinished save takes no time."""
    att = _att(0, 1000, True, [("quota", 0, 20)], [(20, 8), (995, -8)], 8 * 975, 8 * 975)
    steps = _s([(100, 0), (300, 50), (500, 100), (700, 150), (900, 200)])
    led = ledger(LedgerInput([att], steps, [Save(500 * S, 530 * S, 100, True), Save(900 * S, None, 200, False)],
                             [], 1000 * S, True))
    assert _by_s(led.wall_us[0]) == {SCHED: 20, STARTUP: 80, PROD: 400, SAVE: 30, WASTED: 470}
    assert _by_s(led.gpu_us[0]) == {STARTUP: 8 * 80, PROD: 8 * 400, SAVE: 8 * 30, WASTED: 8 * 465}
    assert _spans_s(led) == [(WASTED, 530, 1000)]


def test_a_running_run_with_open_pods() -> None:
    """Two 8-GPU pods bound at 10 and 12, still held; steps at 60, 120, 180, the save of step 20 begun at 180.
    Counted up to the latest time known (180): 8 GPUs 10-12 and 16 after, i.e. gpus_open (16) x (180 - the
    GPU-weighted mean bind time, 11); the run is productive there."""
    att = _att(0, None, False, [("quota", 0, 10)], [(10, 8), (12, 8)])
    led = ledger(LedgerInput([att], _s([(60, 0), (120, 10), (180, 20)]), [Save(180 * S, None, 20, False)], [],
                             None, False))
    assert _by_s(led.wall_us[0]) == {SCHED: 10, STARTUP: 50, PROD: 120}
    assert _by_s(led.gpu_us[0]) == {STARTUP: 8 * 2 + 16 * 48, PROD: 16 * 120}
    assert sum(led.gpu_us[0].values()) == 16 * (180 - 11) * S
    assert (led.until, led.open, led.spans) == (180 * S, PROD, [])


def test_without_progress_or_attempts_the_ledger_is_the_accounting() -> None:
    """No step or checkpoint: the GPU accounting's figures. Steps but no attempt yet (intake events before any
    object: a replay that has not reached the run's root), nothing to divide: the accounting's empty ledger (it
    raised an IndexError)."""
    atts = [_att(0, 100, True, [], [(10, 8), (100, -8)], 720, 720), _att(100, 300, False, [], [(110, 8), (300, -8)],
                                                                          1520)]
    led = ledger(LedgerInput(atts, [], [], [], 300 * S, False))
    assert (led.basis, [_by_s(g) for g in led.gpu_us], led.wall_us) == (
        "accounting", [{PROD: 0, WASTED: 720}, {PROD: 1520, WASTED: 0}], [{}, {}])
    assert ledger(LedgerInput([], _s([(5, 1)]), [], [], None, False)) == Ledger("accounting", [], [], None, None, [])


# ------------------------------------------------------------------------------------------ facts


def test_a_save_begun_again_after_an_interruption_is_the_one_that_completed() -> None:
    """The save of step 120 begun at 100, cut short by an eviction; training comes back to step 120 and saves it
    again (same URI) from 900 to 910. The save took 10, not 810 (the earliest start spanned the eviction)."""
    for order in ([("started", 100), ("started", 900), ("completed", 910)],
                  [("completed", 910), ("started", 900), ("started", 100)]):
        c = Checkpoints()
        for phase, at in order:
            c.save(120, "abfss://c/step-120", phase, at, None)
        assert saves(c) == [Save(900, 910, 120, True)]


def test_an_interrupted_restore_does_not_take_the_next_ones_end() -> None:
    """The restore of a checkpoint begun at 100 and cut short, the same checkpoint restored again from 900 to 910:
    the first has no end (it took the second's end, 810 of restore, before)."""
    c = Checkpoints()
    for phase, at in [("started", 100), ("started", 900), ("completed", 910), ("started", 2000),
                      ("completed", 2005)]:
        c.restore(40, "abfss://c/step-40", phase, at)
    assert restores(c) == [(40, "abfss://c/step-40", 100, None), (40, "abfss://c/step-40", 900, 910),
                           (40, "abfss://c/step-40", 2000, 2005)]


records = st.lists(st.tuples(st.integers(-(1 << 34), 1 << 36), st.integers(0, 1 << 40)), max_size=120)


def _shuffled_with_repeats(items: list[Any], seed: int) -> list[Any]:
    rng = random.Random(seed)
    out = items + [x for x in items if rng.random() < 0.3]
    rng.shuffle(out)
    return out


@settings(max_examples=300, deadline=None)
@given(records, st.integers(2, 16), st.integers(0, 1 << 32))  # (at the widest, times before and after 1970
#                                                              are two buckets)
def test_the_step_trail_is_bounded_and_a_function_of_the_set_of_records(rs: list[tuple[int, int]], cap: int,
                                                                        seed: int) -> None:
    a, b = StepTrail(), StepTrail()
    for at, step in rs:
        a.add(at, step, cap)
    for at, step in _shuffled_with_repeats(rs, seed):
        b.add(at, step, cap)
    assert (a.width, a.buckets) == (b.width, b.buckets)
    assert len(a.buckets) <= cap
    # the width is the smallest that fits: half of it would need more buckets than the cap
    if a.width > STEP_TRAIL_WIDTH:
        assert len({at // (a.width // 2) for at, _ in rs}) > cap
    # each bucket keeps its earliest and its latest record (by time, then step), and the records are the reported
    for k, (lo, hi) in a.buckets.items():
        inside = [r for r in rs if r[0] // a.width == k]
        assert (lo, hi) == (min(inside), max(inside))
    assert set(a.records()) <= set(rs)
    assert StepTrail.from_json(a.to_json()) == a


@settings(max_examples=300, deadline=None)
@given(records, st.integers(2, 16), st.integers(0, 1 << 32))
def test_the_step_trails_records_kept_up_to_date_equal_them_sorted_anew(rs: list[tuple[int, int]], cap: int,
                                                                      seed: int) -> None:
    """``records`` is kept up to date by each ``add`` once asked for (a report moves one record, not a sort of a long
    run's every record): asked for at any point, it is the records sorted anew from the buckets."""
    rng = random.Random(seed)
    t = StepTrail()
    for at, step in _shuffled_with_repeats(rs, seed):
        t.add(at, step, cap)
        if rng.random() < 0.3:
            assert t.records() == sorted({r for pair in t.buckets.values() for r in pair})
    assert t.records() == sorted({r for pair in t.buckets.values() for r in pair})
    assert t.records() is not t.records()  # a copy: a later report does not change what a caller holds


ops = st.lists(st.one_of(
    st.tuples(st.just("save"), st.integers(0, 40), st.sampled_from(["u1", "u2"]),
              st.sampled_from(["started", "completed", "failed"]), st.integers(0, 1000),
              st.none() | st.integers(0, 1 << 40)),
    st.tuples(st.just("restore"), st.integers(0, 40), st.sampled_from(["u1", "u2"]),
              st.sampled_from(["started", "completed", "failed"]), st.integers(0, 1000), st.none()),
    st.tuples(st.just("resume"), st.integers(0, 3), st.sampled_from(["run-a", "run-b"]),
              st.sampled_from(["", "u1"]), st.integers(0, 1000), st.none() | st.integers(0, 40)),
), max_size=150)


def _apply(c: Checkpoints, op: tuple[Any, ...]) -> None:
    kind, a, b, phase, at, extra = op
    if kind == "save":
        c.save(a, b, phase, at, extra)
    elif kind == "restore":
        c.restore(a, b, phase, at)
    else:
        c.resumed(at, b, phase or None, extra)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(0, 1 << 32), st.integers(1, 6), st.integers(1, 4), st.integers(1, 3))
def test_checkpoints_are_bounded_and_a_function_of_the_set_of_reports(
        reports: list[tuple[Any, ...]], seed: int, max_saves: int, max_restores: int, max_times: int) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ledger_facts, "MAX_CHECKPOINT_SAVES", max_saves)
        mp.setattr(ledger_facts, "MAX_CHECKPOINT_RESTORES", max_restores)
        mp.setattr(ledger_facts, "MAX_RESTORE_TIMES", max_times)
        a, b = Checkpoints(), Checkpoints()
        for op in reports:
            _apply(a, op)
        for op in _shuffled_with_repeats(reports, seed):
            _apply(b, op)
    assert a.to_json() == b.to_json()
    assert len(a.saves) <= max_saves and len(a.restores) <= max_restores
    assert all(len(starts) <= max_times and len(ends) <= max_times for starts, ends in a.restores.values())
    # the kept saves and restores are those of the highest (step, uri)
    keys = sorted({(op[1], op[2]) for op in reports if op[0] == "save"})
    assert sorted(a.saves) == keys[-max_saves:] if keys else not a.saves
    keys = sorted({(op[1], op[2]) for op in reports if op[0] == "restore"})
    assert sorted(a.restores) == keys[-max_restores:] if keys else not a.restores
    assert Checkpoints.from_json(a.to_json()).to_json() == a.to_json()


def _stretches_by_hand(steps: list[tuple[int, int]], begins: list[int | None]) -> list[tuple[int, int, int]]:
    """The stretches as the module's docstring defines them, written plainly: (first index, end index, attempt)."""
    def attempt(at: int) -> int:
        return max((j for j, b in enumerate(begins) if b is not None and b <= at), default=0)

    out: list[tuple[int, int, int]] = []
    for i, (at, step) in enumerate(steps):
        a = attempt(at)
        if out and out[-1][1] == i and out[-1][2] == a and step > steps[i - 1][1]:
            out[-1] = (out[-1][0], i + 1, a)  # the same attempt, the step goes up: the same stretch
        else:
            out.append((i, i + 1, a))
    return out


small_times = st.integers(0, 400)
begins_of = st.lists(st.one_of(st.none(), small_times), max_size=4)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["report", "report", "report", "edit", "begins"]), small_times,
                          st.integers(0, 60), st.integers(0, 1 << 32)), max_size=60), begins_of, begins_of)
def test_stretches_kept_between_derivations_equal_them_found_anew(
        ops: list[tuple[str, int, int, int]], begins: list[int | None], other: list[int | None]) -> None:
    """``Stretches.of`` scans the step records from the first that changed since its last call: after any records
    (a step trail's, reported in any order, or a list edited anywhere) and any change of the attempts' begins, it
    gives the stretches found anew, which are the docstring's."""
    trail, kept, edited = StepTrail(), Stretches(), Stretches()
    mine: list[tuple[int, int]] = []
    for kind, at, step, seed in ops:
        if kind == "begins":
            begins = other if begins != other else begins[:-1]
        elif kind == "edit":  # anywhere: an insertion, a removal or a replacement
            rng = random.Random(seed)
            i = rng.randrange(len(mine) + 1)
            mine = mine[:i] + [(at, step)] * rng.randrange(2) + mine[i + rng.randrange(2):]
        else:
            trail.add(at * S // 10, step, 8)  # a small cap: widths double, records merge away
            mine = [*mine, (at, step)]
        scaled = [None if b is None else b * S // 10 for b in begins]  # the trail's times are tenths of seconds
        for cache, steps, bs in ((kept, trail.records(), scaled), (edited, list(mine), begins)):
            got = cache.of(steps, bs)
            assert got == stretches(steps, bs)
            assert [(x.start, x.end, x.attempt) for x in got] == _stretches_by_hand(steps, bs)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=40), st.integers(0, 40),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=5))
def test_the_records_scanned_again_are_those_from_the_first_that_changed(
        a: list[tuple[int, int]], cut: int, tail: list[tuple[int, int]]) -> None:
    """What ``Stretches.of`` scans again starts at the first record that differs (it keeps the longest common
    prefix), whether the change is at the end (the usual case) or anywhere."""
    b = a[:cut] + tail
    common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    assert ledger_module._common(a, b) == common
