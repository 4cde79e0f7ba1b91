"""Odd but possible command-line input: one clear line and a documented exit code, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracker.cli import main


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_an_empty_duration_is_an_error_not_every_run(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--index", str(index), "--stalled-admission", "", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "not a duration: ''" in one_error_line(err)


@pytest.mark.parametrize("args", [["--stalled-admission", "99999999999d"],
                                  ["--stalled-admission", "1s", "--now", "0001-01-01"],
                                  ["--stalled-admission", "0s", "--now", "0001-01-01T00:00:00Z"]])
def test_a_cutoff_before_year_one_matches_no_run(index: Path, capsys: pytest.CaptureFixture[str],
                                                 args: list[str]) -> None:
    assert main(["runs", "--index", str(index), "--json", *args]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_a_cutoff_at_the_end_of_time_matches_every_run_waiting_in_admission(
        index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--index", str(index), "--json", "--status", "pending"]) == 0
    pending = [r for r in json.loads(capsys.readouterr().out) if r["phase"] == "Admission"]
    assert main(["runs", "--index", str(index), "--json", "--stalled-admission", "1s", "--now", "9999-12-31"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == [r["run_id"] for r in pending]


def test_a_run_id_that_looks_like_markup_is_printed_as_given(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "[red]x[/red] [/]", "--index", str(index)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "no run '[red]x[/red] [/]'" in one_error_line(err)


def test_replay_of_a_missing_capture_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(tmp_path / "nope.jsonl"), "--index", str(tmp_path / "i.sqlite")]) == 2
    assert "nope.jsonl" in one_error_line(capsys.readouterr().err)


def test_replay_says_how_many_dead_letters_rotation_dropped(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # the smallest bound the settings allow (replay takes it from them, as serve does)
    monkeypatch.setenv("TRACKER_EMBEDDED__DEAD_LETTER_FILE_BYTES", str(64 * 1024))
    monkeypatch.setenv("TRACKER_EMBEDDED__DEAD_LETTER_FILES", "2")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(f'{{"type": "ADDED", "object": {{"kind": "Pod", "n": {i}, "x": {"y" * 200}\n'
                           for i in range(500)))
    assert main(["replay", str(bad), "--index", str(tmp_path / "i.sqlite")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # as read, whatever the console's wrapping
    assert "500 dead letter(s)" in out and "oldest were dropped by rotation" in out
