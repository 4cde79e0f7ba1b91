"""`tracker replay` honours the settings `tracker serve` reads: the dead-letter file's bound
(``TRACKER_EMBEDDED__DEAD_LETTER_FILE_BYTES`` / ``_FILES``) and the reducer's bounds (``TRACKER_REDUCE__*``), through
the one capture -> index wiring (``tracker.runtime.replay``) that replay, demo and the embedded serve share. Before
it, replay built its reducer bounds and its dead-letter file from constants."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

import tracker.cli
from tracker.cli import main
from tracker.cli.args import DEMO_CAPTURES
from tracker.runtime import replay, service
from tracker.runtime.ops import Health, Metrics, Shutdown
from tracker.settings import SettingsError, load_settings

SMALLEST_FILE = 64 * 1024  # the least embedded.dead_letter_file_bytes allows


@pytest.fixture(autouse=True)
def _no_outside_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the settings a test sets: none from the environment it runs in, no Kafka (serve runs embedded)."""
    for name in [n for n in os.environ if n.startswith("TRACKER_")]:
        monkeypatch.delenv(name)


def broken_capture(path: Path, lines: int) -> Path:
    """A capture of ``lines`` watch events of Jobs whose metadata is not an object: each one a dead letter of
    about 1.5 KB."""
    path.write_text("".join(json.dumps({"type": "ADDED", "object": {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": f"job {i} of a broken capture {'-' * 1400}"}}) + "\n"
        for i in range(lines)))
    return path


def dead_letter_files(index: Path) -> list[tuple[str, int]]:
    """(suffix after the index's name, letters) of each dead-letter file beside ``index``, current first."""
    stem = index.stem + ".dead-letters.jsonl"
    found = sorted(index.parent.glob(stem + "*"), key=lambda p: (len(p.name), p.name))
    return [(p.name[len(stem):], len(p.read_text().splitlines())) for p in found]


def test_replay_rotates_its_dead_letter_file_by_the_settings_as_serve_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    capture = broken_capture(tmp_path / "broken.jsonl", 200)
    # the code defaults (64 MiB, 5 files) hold every letter in one file
    assert main(["replay", str(capture), "--index", str(tmp_path / "default.sqlite")]) == 0
    assert dead_letter_files(tmp_path / "default.sqlite") == [("", 200)]
    assert "dropped by rotation" not in capsys.readouterr().out

    monkeypatch.setenv("TRACKER_EMBEDDED__DEAD_LETTER_FILE_BYTES", str(SMALLEST_FILE))
    monkeypatch.setenv("TRACKER_EMBEDDED__DEAD_LETTER_FILES", "2")
    replayed = tmp_path / "replay.sqlite"
    assert main(["replay", str(capture), "--index", str(replayed)]) == 0
    files = dead_letter_files(replayed)
    assert [suffix for suffix, _ in files] == ["", ".1"]  # two files kept, the older ones deleted
    assert all(p.stat().st_size <= SMALLEST_FILE for p in replayed.parent.glob("replay.dead-letters.jsonl*"))
    kept = sum(n for _, n in files)
    assert 0 < kept < 200
    out = " ".join(capsys.readouterr().out.split())
    assert f"200 dead letter(s) with reasons in {tmp_path}" in out
    assert f"the {200 - kept} oldest were dropped by rotation" in out

    # the embedded serve, with the same settings and capture, keeps the same letters in the same files
    opts = service.ServeOptions(captures=(capture,), index_path=tmp_path / "serve.sqlite", exit_when_done=True)
    import asyncio

    asyncio.run(service.serve_body(load_settings(), opts)(Metrics(), Health(), Shutdown(10)))
    assert dead_letter_files(tmp_path / "serve.sqlite") == files


def metric_points(index: Path) -> dict[str, int]:
    with sqlite3.connect(index) as conn:
        return dict(conn.execute("SELECT run_id, COUNT(*) FROM metric_points GROUP BY run_id").fetchall())


def test_replay_takes_the_reducer_bounds_from_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["replay", str(DEMO_CAPTURES), "--index", str(tmp_path / "default.sqlite")]) == 0
    full = metric_points(tmp_path / "default.sqlite")
    assert max(full.values()) > 2  # the demo has runs reporting more points than the bound set below

    monkeypatch.setenv("TRACKER_REDUCE__METRIC_POINTS_PER_RUN", "2")
    assert main(["replay", str(DEMO_CAPTURES), "--index", str(tmp_path / "two.sqlite")]) == 0
    two = metric_points(tmp_path / "two.sqlite")
    assert set(two) == set(full) and all(n <= 2 for n in two.values())

    monkeypatch.setenv("TRACKER_REDUCE__METRIC_POINTS_PER_RUN", "0")
    assert main(["replay", str(DEMO_CAPTURES), "--index", str(tmp_path / "none.sqlite")]) == 0
    assert metric_points(tmp_path / "none.sqlite") == {}


def test_replay_with_invalid_settings_is_one_usage_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TRACKER_EMBEDDED__DEAD_LETTER_FILES", "0")
    index = tmp_path / "runs.sqlite"
    assert main(["replay", str(DEMO_CAPTURES), "--index", str(index)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid settings: embedded.dead_letter_files: ") and err.count("\n") == 1
    assert not index.exists()
    # no capture file given: the same exit code, before the settings are read
    (tmp_path / "empty").mkdir()
    assert main(["replay", str(tmp_path / "empty"), "--index", str(index)]) == 2
    assert capsys.readouterr().err == ("error: no capture files given (expected .json or .jsonl files or "
                                       "directories of them)\n")


def test_the_command_line_holds_no_replay_of_its_own() -> None:
    assert not hasattr(tracker.cli, "replay")


def test_the_finished_derivations_a_reducer_frees_are_the_settings_and_a_replay_without_retirement_frees_all(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``reduce.finished_derivation_rows`` bounds the finished runs whose derivation a flush frees (``tracker reduce``,
    ``serve``, a retiring replay); a replay without retirement frees every finished run's (None), however wide."""
    settings = load_settings()
    assert settings.reduce.finished_derivation_rows == 64
    assert settings.reduce.reducer_limits().finished_derivation_rows == 64
    assert replay.reducer_limits(settings, retire_after_s=3_600.0).finished_derivation_rows == 64
    assert replay.reducer_limits(settings, retire_after_s=None).finished_derivation_rows is None
    monkeypatch.setenv("TRACKER_REDUCE__FINISHED_DERIVATION_ROWS", "0")
    zero = load_settings()
    assert zero.reduce.reducer_limits().finished_derivation_rows == 0
    assert replay.reducer_limits(zero, retire_after_s=60.0).finished_derivation_rows == 0
    monkeypatch.setenv("TRACKER_REDUCE__FINISHED_DERIVATION_ROWS", "-1")
    with pytest.raises(SettingsError, match=r"reduce\.finished_derivation_rows: Input should be greater than or equal"):
        load_settings()
