"""What a replay keeps of a finished run (issue 27, "replay memory for 100k runs"): its facts, not its derivation.

A replay without retirement keeps every run it reads; the embedded pipeline frees a finished run's derivation
(``ReducerLimits.finished_derivation_rows`` None: however wide) at the flush that wrote its history, and derives it
again from the facts before a late record changes the run. The index it writes is the one keeping every derivation
writes.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from sim.lifecycles import generate_stream
from tests.service.test_replay_incremental import contents
from tracker.core.derive import Derivation, may_reopen
from tracker.core.facts import RunFacts
from tracker.core.limits import ReducerLimits
from tracker.core.model import FINAL_STATUSES
from tracker.core.reducer import Flushed, Reducer
from tracker.runtime import replay
from tracker.settings import EmbeddedSettings, Settings
from tracker.shell import jsonio
from tracker.shell.capture import capture_files

RUNS = 120


@pytest.fixture(autouse=True)
def _no_outside_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("TRACKER_")]:
        monkeypatch.delenv(name)


def capture(tmp_path: Path) -> Path:
    path = tmp_path / "generated.jsonl"
    path.write_bytes(b"".join(jsonio.dumps(rec) + b"\n" for rec in generate_stream(RUNS, seed=11)))
    return path


def fold(cap: Path, index: Path, *, flush_every: int) -> tuple[Reducer, list[Flushed]]:
    """Fold ``cap`` into ``index`` through the embedded wiring; its reducer and every flush."""
    kept: list[Reducer] = []
    flushes: list[Flushed] = []
    settings = Settings(embedded=EmbeddedSettings(flush_every=flush_every, replay_flush_every=flush_every))
    replay.fold(replay.capture_records(capture_files([cap])), index_path=index, settings=settings,
                retire_after_s=None, on_restored=kept.append, on_flush=lambda out, _n, _w: flushes.append(out))
    return kept[0], flushes


def finished(red: Reducer, run_id: str) -> bool:
    return Derivation().update(red.runs[run_id]).run.status in FINAL_STATUSES


def test_a_replay_keeps_the_derivations_of_live_runs_only(tmp_path: Path) -> None:
    red, _ = fold(capture(tmp_path), tmp_path / "index.sqlite", flush_every=5_000)
    finished_runs = {k for k in red.runs if finished(red, k)}
    reopenable = {k for k in finished_runs if may_reopen(red.runs[k], Derivation().update(red.runs[k]).run)}
    assert len(red.runs) == RUNS and len(finished_runs) > RUNS // 2  # most generated runs end
    assert reopenable, "the generator stops some runs by a deactivation while their Job exists"
    assert set(red.derivations) == set(red.runs) - finished_runs  # the reopenable ones' freed too
    # reading a finished run derives it on the side: nothing is kept again
    some = min(finished_runs)
    assert red.history(some) is not None and red.current(some) is not None
    assert some not in red.derivations


def test_freed_derivations_write_the_index_keeping_them_writes(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cap = capture(tmp_path)
    revived: list[str] = []
    revive = Reducer._revive

    def counting(self: Reducer, run_id: str, r: RunFacts) -> None:
        revived.append(run_id)
        revive(self, run_id, r)

    monkeypatch.setattr(Reducer, "_revive", counting)
    # a flush every 40 records: late records (pod deletions, Events) reach runs whose derivation was freed
    red, flushes = fold(cap, tmp_path / "freed.sqlite", flush_every=40)
    assert revived  # derivations were freed and derived again before a late record changed their run
    written: set[str] = set()
    for out in flushes:
        # derived again, the run's update carries only what changed, as if its derivation was kept
        assert not any(u.full and u.run_id in written for u in out.updates)
        written.update(u.run_id for u in out.updates)

    def keeping(settings: Settings, *, retire_after_s: float | None) -> ReducerLimits:
        return replace(original(settings, retire_after_s=retire_after_s), finished_derivation_rows=0)

    original = replay.reducer_limits
    monkeypatch.setattr(replay, "reducer_limits", keeping)
    kept, _ = fold(cap, tmp_path / "kept.sqlite", flush_every=40)
    assert set(kept.derivations) == set(kept.runs)
    assert contents(tmp_path / "freed.sqlite") == contents(tmp_path / "kept.sqlite")
    assert {k: red.history(k) for k in red.runs} == {k: kept.history(k) for k in kept.runs}


def test_a_run_reactivated_after_its_derivation_was_freed_reads_as_if_it_was_kept() -> None:
    """A run stopped by a deactivation while its Job exists looks finished: its derivation is freed like any finished
    run's; the reactivation that reopens it derives it again from the facts first, so its updates are the ones a
    kept derivation gives."""
    from tests.core.test_scenarios import SCENARIOS, _writes

    [run_id] = SCENARIOS["reactivated"].run_ids
    freed = Reducer(ReducerLimits(finished_derivation_rows=None))
    kept = Reducer(ReducerLimits(finished_derivation_rows=0))
    freed_at: list[int] = []
    reopened_at: list[int] = []
    for i, w in enumerate(_writes("reactivated")):
        for red in (freed, kept):
            red.apply(w.record, "t")
        a, b = freed.flush(), kept.flush()
        assert a.updates == b.updates, i
        assert freed.history(run_id) == kept.history(run_id), i
        if a.updates and run_id not in freed.derivations:
            freed_at.append(i)
        elif freed_at and run_id in freed.derivations:
            reopened_at.append(i)  # derived again, and kept while the run is live again
    assert freed_at and reopened_at and freed_at[0] < reopened_at[0], "freed, then reopened by the reactivation"
    assert freed.history(run_id) == kept.history(run_id)
