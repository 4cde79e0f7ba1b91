"""What a replay keeps of a finished run (issue 27, "replay memory for 100k runs"): its facts, not its derivation.

A replay without retirement keeps every run it reads; the embedded pipeline frees a finished run's derivation
(``ReducerLimits.keep_finished_derivations``) at the flush that wrote its history, and derives it again from the
facts when a late record changes the run. The index it writes is the one keeping every derivation writes.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from sim.lifecycles import generate_stream
from tests.service.test_replay_incremental import contents
from tracker.core.derive import Derivation, may_reopen
from tracker.core.model import FINAL_STATUSES
from tracker.core.reducer import Flushed, Reducer, ReducerLimits
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
    settings = Settings(embedded=EmbeddedSettings(flush_every=flush_every))
    replay.fold(replay.capture_records(capture_files([cap])), index_path=index, settings=settings,
                retire_after_s=None, on_restored=kept.append, on_flush=lambda out, _n, _w: flushes.append(out))
    return kept[0], flushes


def finished_for_good(red: Reducer, run_id: str) -> bool:
    h = Derivation().update(red.runs[run_id])
    return h.run.status in FINAL_STATUSES and not may_reopen(red.runs[run_id], h.run)


def test_a_replay_keeps_the_derivations_of_live_runs_only(tmp_path: Path) -> None:
    red, _ = fold(capture(tmp_path), tmp_path / "index.sqlite", flush_every=5_000)
    finished = {k for k in red.runs if finished_for_good(red, k)}
    assert len(red.runs) == RUNS and len(finished) > RUNS // 2  # most generated runs end
    assert set(red.derivations) == set(red.runs) - finished
    # reading a finished run derives it on the side: nothing is kept again
    some = min(finished)
    assert red.history(some) is not None and red.current(some) is not None
    assert some not in red.derivations


def test_freed_derivations_write_the_index_keeping_them_writes(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cap = capture(tmp_path)
    # a flush every 40 records: late records (pod deletions, Events) reach runs whose derivation was freed
    red, flushes = fold(cap, tmp_path / "freed.sqlite", flush_every=40)
    written: set[str] = set()
    rebuilt = 0
    for out in flushes:
        rebuilt += sum(1 for u in out.updates if u.full and u.run_id in written)
        written.update(u.run_id for u in out.updates)
    assert rebuilt > 0  # derivations were freed and derived again

    def keeping(settings: Settings, *, retire_after_s: float | None) -> ReducerLimits:
        return replace(original(settings, retire_after_s=retire_after_s), keep_finished_derivations=True)

    original = replay.reducer_limits
    monkeypatch.setattr(replay, "reducer_limits", keeping)
    kept, _ = fold(cap, tmp_path / "kept.sqlite", flush_every=40)
    assert set(kept.derivations) == set(kept.runs)
    assert contents(tmp_path / "freed.sqlite") == contents(tmp_path / "kept.sqlite")
    assert {k: red.history(k) for k in red.runs} == {k: kept.history(k) for k in kept.runs}
