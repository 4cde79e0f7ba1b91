"""The goodput ledger's laws (tracker/core/ledger.py), over generated clusters whose runs report their training as
real ones do (``RunParams.training``: step records, checkpoint saves and restores in every attempt that runs) and
resume one another (``RunPlan.resumes``):

(a) it is exact: the GPU categories of every attempt and run sum to the GPU-time it held (its pods still open
    counted up to ``ledger_until``), the wall categories to the run's time from its first queueing to its end (or
    ``ledger_until``), and each attempt's to its own window (its begin to the next one's);
(b) no category is negative, and no more is wasted than was held;
(c) an interrupted attempt (evicted, retried by KubeRay, the last one of a failed run) loses exactly the training
    since the checkpoint the next one resumed from, all of it when it completed none: its wasted progress is
    that span, its wasted GPU-time at most its GPUs over that span;
(d) a replay in pieces (flushes, a snapshot and a restore between them) gives the ledger of one replay;
(e) it is deterministic (processes with other hash seeds) and idempotent (duplicates, relists, a replayed suffix);
(f) a run that reported no progress has the GPU accounting's ledger: held less lost productive, lost wasted;
(g) checkpoint saves and restores take exactly the time they were reported to take;

and every history is the one the generator says (its oracle checks the checkpoints, the lineage and the basis).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sim.builders import SECOND
from sim.lifecycles import START, ExpectedRun, RunParams, RunPlan, generate_cluster
from tests.core.test_reducer_laws import _flushed_state, assert_as_generated, law_settings, plans, seeds
from tests.support.laws import by_object, fold, histories, interleave, noisy, roundtrip, run_histories
from tracker.core.ledger import US_PER_HOUR
from tracker.core.model import GoodputCategory, RunHistory
from tracker.core.reducer import Reducer

REPO = Path(__file__).resolve().parents[2]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
PRODUCTIVE = GoodputCategory.PRODUCTIVE.value
WASTED = GoodputCategory.WASTED_PROGRESS.value
SAVE = GoodputCategory.CHECKPOINT_SAVE.value
RESTORE = GoodputCategory.CHECKPOINT_RESTORE.value
WALL_TOL = 1e-6  # s: float sums of exact microseconds


@st.composite
def training_plans(draw: st.DrawFn, max_runs: int = 5) -> list[RunPlan]:
    """The reducer laws' clusters (``plans``), most runs reporting their training, some resuming an earlier run."""
    out = []
    for pos, plan in enumerate(draw(plans(max_runs))):
        training = draw(st.integers(0, 4), label="training") > 0
        resumes = None
        if pos and plan.preempts is None and draw(st.integers(0, 2), label="resumes") == 0:
            resumes = draw(st.integers(0, pos - 1), label="resumed")
        out.append(replace(plan, params=replace(plan.params, training=training), resumes=resumes))
    return out


def _us(t: datetime | None) -> int | None:
    return None if t is None else (t - _EPOCH) // timedelta(microseconds=1)


def _close(a: float | None, b: float | None) -> bool:
    return a == b if a is None or b is None else abs(a - b) <= 1e-9


def ledger_problems(h: RunHistory, exp: ExpectedRun) -> list[str]:
    """How a run's ledger breaks laws (a), (b), (c), (f) and (g) ([] if it does not)."""
    bad: list[str] = []
    run = h.run

    def check(ok: bool, what: str) -> None:
        if not ok:
            bad.append(f"{run.run_id} {what}")

    until = _us(run.ledger_until)
    # the GPU-µs of rounding: open_since is a GPU-weighted mean bind time, floored to the microsecond
    tol = (sum(p.gpus for p in h.pods or ()) + 1) / US_PER_HOUR

    def held(gpu_hours: float, gpus_open: int, open_since: datetime | None) -> float:
        if not gpus_open:
            return gpu_hours
        since = _us(open_since)
        assert until is not None and since is not None, (run.run_id, "open pods and no ledger_until")
        return gpu_hours + gpus_open * (until - since) / US_PER_HOUR

    # (a), (b): GPU
    rows = [(f"attempt {a.attempt}", a.ledger_gpu_hours_by, held(a.gpu_hours, a.gpus_open, a.open_since))
            for a in h.attempts]
    rows.append(("run", run.ledger_gpu_hours_by, held(run.gpu_hours, run.gpus_open, run.open_since)))
    for who, by, total in rows:
        got = sum(by.values())
        check(abs(got - total) <= tol + 1e-12 * total, f"{who}: GPU categories sum to {got} h, held {total} h")
        check(all(v >= 0 for v in by.values()), f"{who}: a negative GPU category {by}")
        check(by.get(WASTED, 0.0) <= total + tol, f"{who}: wasted {by.get(WASTED)} h > held {total} h")
    for cat in {k for a in h.attempts for k in a.ledger_gpu_hours_by} | set(run.ledger_gpu_hours_by):
        parts = sum(a.ledger_gpu_hours_by.get(cat, 0.0) for a in h.attempts)
        check(abs(run.ledger_gpu_hours_by.get(cat, 0.0) - parts) <= 1e-9, f"run {cat}: not its attempts' sum")
    total_gpu = sum(run.ledger_gpu_hours_by.values())
    want_goodput = run.ledger_gpu_hours_by.get(PRODUCTIVE, 0.0) / total_gpu if total_gpu > 0 else None
    check(_close(run.goodput, want_goodput), f"goodput {run.goodput}, productive / held {want_goodput}")

    check(run.ledger_basis == exp.ledger_basis, f"basis {run.ledger_basis}, expected {exp.ledger_basis}")
    if run.ledger_basis == "accounting":
        # (f): the GPU accounting's figures; no wall ledger, no ETTR
        for a in h.attempts:
            want = {PRODUCTIVE: a.gpu_hours - a.lost_gpu_hours, WASTED: a.lost_gpu_hours} if a.gpu_hours else {}
            got_a = a.ledger_gpu_hours_by
            check(got_a.keys() == want.keys() and all(abs(got_a[k] - want[k]) <= 1e-9 for k in want),
                  f"attempt {a.attempt}: accounting ledger {got_a}, expected {want}")
            check(a.ledger_wall_s_by == {}, f"attempt {a.attempt}: a wall ledger without progress")
        check(run.ledger_wall_s_by == {} and run.ettr is None, "a wall ledger or an ETTR without progress")
        check(run.ledger_until == run.open_since, "ledger_until is not open_since")
        return bad

    # (a), (b): wall, from the first attempt's queueing to the end (or ledger_until)
    end = _us(run.finished_at) if run.finished_at is not None else until
    lo = _us(h.attempts[0].queued_at)
    assert end is not None and lo is not None
    total_wall = sum(run.ledger_wall_s_by.values())
    check(abs(total_wall - (end - lo) / 1e6) <= WALL_TOL, f"wall categories sum to {total_wall} s, "
          f"queued to end is {(end - lo) / 1e6} s")
    check(all(v >= 0 for v in run.ledger_wall_s_by.values()), f"a negative wall category {run.ledger_wall_s_by}")
    cuts: list[int] = []
    for a in h.attempts:
        begin = _us(a.queued_at) if a.queued_at is not None else _us(a.scheduled_at)
        cuts.append(begin if begin is not None else (cuts[-1] if cuts else lo))
    cuts[0] = lo
    for i, a in enumerate(h.attempts):
        w1 = cuts[i + 1] if i + 1 < len(cuts) else end
        window = max(0, min(w1, end) - cuts[i]) / 1e6
        got = sum(a.ledger_wall_s_by.values())
        check(abs(got - window) <= WALL_TOL, f"attempt {a.attempt}: wall categories sum to {got} s, its window "
              f"is {window} s")
        check(all(v >= 0 for v in a.ledger_wall_s_by.values()), f"attempt {a.attempt}: a negative wall category")
    productive = run.ledger_wall_s_by.get(PRODUCTIVE, 0.0)
    check(_close(run.ettr, productive / total_wall if total_wall > 0 else None), f"ettr {run.ettr}")

    # (g): saves and restores take the time they took (a save redone after an interruption is two saves)
    for cat, reported in ((SAVE, exp.saves), (RESTORE, exp.restores)):
        want_s = sum(c.ended - c.started for c in reported if c.ended is not None) / 1000
        got = run.ledger_wall_s_by.get(cat, 0.0)
        check(abs(got - want_s) <= WALL_TOL, f"{cat}: {got} s, the reports say {want_s} s")

    # (c): an interrupted attempt loses the training since its last checkpoint (the next one resumes from it)
    last = len(exp.attempts) - 1
    for i, (a, ea) in enumerate(zip(h.attempts, exp.attempts, strict=True)):
        interrupted = i < last or exp.status == "failed"
        if not interrupted or not ea.steps or any(s1 <= s0 for (_, s0), (_, s1) in pairwise(ea.steps)):
            continue  # not interrupted, no training, or restarted within the attempt (a pod replaced)
        done = [c.ended for c in exp.saves if c.attempt == i + 1 and c.ended is not None]
        kept = 1000 * (max(done) if done else ea.steps[0][0])
        ended = _us(a.ended_at)
        assert ended is not None
        lost_s = (ended - kept) / 1e6
        wasted_s = a.ledger_wall_s_by.get(WASTED, 0.0)
        wasted_h = a.ledger_gpu_hours_by.get(WASTED, 0.0)
        check(abs(wasted_s - lost_s) <= WALL_TOL, f"attempt {a.attempt}: wasted {wasted_s} s, {lost_s} s since "
              f"{'its last checkpoint' if done else 'its first step'}")
        check(wasted_h <= a.gpus * lost_s / 3600 + tol, f"attempt {a.attempt}: wasted {wasted_h} GPU-h > "
              f"{a.gpus} GPUs x {lost_s} s")
    return bad


def assert_ledger_laws(red: Reducer, expected: dict[str, ExpectedRun]) -> None:
    bad = [p for run_id, h in run_histories(red).items() for p in ledger_problems(h, expected[run_id])]
    assert not bad, "\n".join(bad)


LEDGER_RUN_FIELDS = ("ledger_basis", "ledger_gpu_hours_by", "ledger_wall_s_by", "ledger_until", "ledger_open", "ettr",
                     "goodput", "resume_of", "resumed_from", "checkpoints_saved", "last_checkpoint")


def ledger_of(hists: dict[str, Any]) -> dict[str, Any]:
    """The ledger's parts of histories (JSON values): run fields, attempts' categories, checkpoints, spans."""
    return {run_id: {"run": {k: h["run"][k] for k in LEDGER_RUN_FIELDS},
                     "attempts": [[a["ledger_gpu_hours_by"], a["ledger_wall_s_by"]] for a in h["attempts"]],
                     "checkpoints": h["checkpoints"], "ledger": h["ledger"]}
            for run_id, h in hists.items()}


# ------------------------------------------------------------------------------------------ the laws


@law_settings(120)
@given(training_plans(), seeds)
def test_the_ledger_is_exact_and_loses_only_the_training_since_the_last_checkpoint(plan: list[RunPlan],
                                                                                   seed: int) -> None:
    """(a), (b), (c), (f), (g), on any interleaving, and the histories are the generator's."""
    cluster = generate_cluster(plan)
    red = fold(interleave(by_object(cluster.streams), random.Random(seed)))
    assert_as_generated(histories(red), cluster)
    assert_ledger_laws(red, cluster.expected)


@law_settings(60)
@given(plans(), seeds)
def test_without_progress_the_ledger_is_the_gpu_accounting(plan: list[RunPlan], seed: int) -> None:
    """(f): runs that report no step and no checkpoint."""
    quiet = [replace(p, params=replace(p.params, progress_points=0, training=False)) for p in plan]
    cluster = generate_cluster(quiet)
    red = fold(interleave(by_object(cluster.streams), random.Random(seed)))
    assert all(exp.ledger_basis == "accounting" for exp in cluster.expected.values())
    assert_as_generated(histories(red), cluster)
    assert_ledger_laws(red, cluster.expected)


@law_settings(80)
@given(training_plans(), seeds, st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=1, max_size=4))
def test_a_replay_in_pieces_gives_the_ledger_of_one_replay(plan: list[RunPlan], seed: int,
                                                           cuts: list[tuple[float, bool]]) -> None:
    """(d): the records in pieces, a flush or a snapshot and restore between two pieces; and what a sink holds
    when the reducer flushes every few records."""
    cluster = generate_cluster(plan)
    order = interleave(by_object(cluster.streams), random.Random(seed))
    once = ledger_of(histories(fold(order)))
    red = Reducer()
    pos = 0
    for frac, restart in sorted(cuts):
        cut = int(frac * len(order))
        red = fold(order[pos:cut], red)
        pos = max(pos, cut)
        if restart:
            red = roundtrip(red)
        else:
            red.flush()
    red = fold(order[pos:], red)
    assert ledger_of(histories(red)) == once
    assert_ledger_laws(red, cluster.expected)
    assert ledger_of(_flushed_state(order, 1 + seed % 7)) == once


@law_settings(80)
@given(training_plans(), seeds)
def test_duplicates_relists_and_replayed_suffixes_change_no_ledger(plan: list[RunPlan], seed: int) -> None:
    """(e), idempotence."""
    cluster = generate_cluster(plan)
    rng = random.Random(seed)
    order = interleave(by_object(cluster.streams), rng)
    red = fold(noisy(order, rng))
    assert ledger_of(histories(red)) == ledger_of(histories(fold(order)))
    assert_as_generated(histories(red), cluster)


_LEDGER_IN_CHILD = """
import hashlib, json, sys
from tests.support.laws import fold, histories
from tests.core.test_ledger_laws import ledger_of
out = [ledger_of(histories(fold(order))) for order in json.load(open(sys.argv[1]))]
print(hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest())
"""


def test_the_ledger_is_the_same_in_processes_with_other_hash_seeds(tmp_path: Path) -> None:
    """(e), determinism."""
    rng = random.Random(20261203)
    orders = []
    for _ in range(6):
        runs = [RunPlan(RunParams(kind=rng.choice(["Job", "RayJob"]), pods=rng.randrange(1, 5),
                                  evictions=rng.randrange(3), pod_failures=rng.randrange(3),
                                  ray_retries=rng.randrange(2),
                                  outcome=rng.choice(["succeeded", "failed", "running", "deleted"]),
                                  tight=rng.random() < 0.3, training=True),
                        start=START + rng.randrange(4) * SECOND, seed=rng.randrange(1 << 16)) for _ in range(5)]
        runs.append(RunPlan(RunParams(training=True), seed=rng.randrange(1 << 16), resumes=rng.randrange(5)))
        orders.append(interleave(by_object(generate_cluster(runs).streams), rng))
    inputs = tmp_path / "orders.json"
    inputs.write_text(json.dumps(orders))
    digests = set()
    for hash_seed in ("0", "3735928559"):
        done = subprocess.run([sys.executable, "-c", _LEDGER_IN_CHILD, str(inputs)], cwd=REPO,
                              env={**os.environ, "PYTHONHASHSEED": hash_seed}, capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        digests.add(done.stdout.strip())
    here = [ledger_of(histories(fold(order))) for order in orders]
    digests.add(hashlib.sha256(json.dumps(here, sort_keys=True).encode()).hexdigest())
    assert len(digests) == 1, digests
    assert any(h["run"]["ledger_basis"] == "progress" for hs in here for h in hs.values())


# ------------------------------------------------------------------------------------------ the generator


def test_training_reports_in_every_attempt_that_runs_and_resumes_from_the_last_checkpoint() -> None:
    """The generator's training: steps in every attempt whose containers ran, a restore of the latest checkpoint
    completed before each interruption, steps again from its step; and a run resuming another from its latest
    checkpoint. The objects are those of the same runs without training."""
    runs = [RunPlan(RunParams(evictions=2, pod_failures=1, training=True), seed=3),
            RunPlan(RunParams(kind="RayJob", ray_retries=1, evictions=1, training=True), seed=4, resumes=0)]
    cluster = generate_cluster(runs)
    plain = generate_cluster([replace(r, params=replace(r.params, training=False)) for r in runs])
    assert {k: v for k, v in cluster.streams.items() if k != "intake"} == {
        k: v for k, v in plain.streams.items() if k != "intake"}
    first, second = cluster.expected.values()
    assert all(a.steps for a in first.attempts) and all(a.steps for a in second.attempts)
    for exp in (first, second):
        for n, a in enumerate(exp.attempts[1:], start=2):
            before = [c for c in exp.saves if c.attempt < n and c.ended is not None and c.ended < a.steps[0][0]]
            restore = next((c for c in exp.restores if c.attempt == n), None)
            latest = max(before, key=lambda c: c.ended or 0) if before else None
            if latest is not None:
                assert restore is not None and (restore.step, restore.uri) == (latest.step, latest.uri)
                assert a.steps[0][1] == latest.step and restore.ended is not None
                assert restore.ended < a.steps[0][0]
    assert second.resume_of == first.run_id and second.resumed_from == first.last_checkpoint
    assert second.attempts[0].steps[0][1] == max(c.step for c in first.saves if c.ended is not None)
    intake = [ev["kind"] for ev in cluster.streams["intake"] if ev["run_id"] == second.run_id]
    assert {"Resume", "Progress", "CheckpointSave", "CheckpointRestore"} <= set(intake)
    kinds = {ev["kind"] for ev in cluster.streams["intake"]}
    assert all(ev["schema"] == "taugrid.io/intake/v2" for ev in cluster.streams["intake"]), kinds
