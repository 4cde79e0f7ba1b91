"""Values at or beyond the edges of what the readers can hold (a --limit beyond SQLite's integers, times near year 1
and 9999 in any offset, durations beyond any date, run ids of any length): one clear line and exit 2, or the
answer the value asks for, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracker.cli import main


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0] and "Traceback" not in err, err[:2000]
    return lines[0]


@pytest.mark.parametrize("limit", [str(10**30), str(2**63), "9" * 5000])
def test_a_limit_beyond_sqlites_integers_is_a_usage_error(index: Path, capsys: pytest.CaptureFixture[str],
                                                          limit: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["runs", "--index", str(index), "--limit", limit])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "--limit" in one_error_line(err.splitlines()[-1])


def test_the_largest_limit_sqlite_holds_is_every_run(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--index", str(index), "--json"]) == 0
    every = [r["run_id"] for r in json.loads(capsys.readouterr().out)]
    assert main(["runs", "--index", str(index), "--json", "--limit", str(2**63 - 1)]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == every


@pytest.mark.parametrize("command, args", [
    ("runs", ["--since", "9999-12-31T23:59:59-05:00"]),
    ("runs", ["--until", "0001-01-01T00:00:00+05:00"]),
    ("runs", ["--now", "0001-01-01T00:00:00+05:00", "--sort-by", "wait"]),
    ("runs", ["--now", "9999-12-31T23:59:59-05:00"]),
    ("audit", ["--since", "9999-12-31T23:59:59-05:00"]),
    ("audit", ["--now", "0001-01-01T00:00:00+14:00"]),
    ("show", ["qwen", "--now", "0001-01-01T00:00:00+05:00"]),
    ("compare", ["qwen", "seg", "--now", "9999-12-31T23:59:59-05:00"]),
])
def test_a_time_outside_years_1_to_9999_in_utc_is_one_line_and_exit_2(
        index: Path, capsys: pytest.CaptureFixture[str], command: str, args: list[str]) -> None:
    assert main([command, "--index", str(index), *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z" in one_error_line(err)


@pytest.mark.parametrize("args", [["--since", "0001-01-01T00:00:00Z"], ["--until", "9999-12-31T23:59:59Z"],
                                  ["--since", "999999999d"], ["--since", "9" * 400],
                                  ["--now", "0001-01-01T00:00:00Z", "--since", "1d"],
                                  ["--now", "9999-12-31T23:59:59.999999Z", "--sort-by", "wait"]])
def test_times_at_the_edges_and_durations_beyond_year_1_keep_every_run(
        index: Path, capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    """A cutoff before year 1 is the first representable time (as ``--stalled-admission`` already was): every run
    with a creation time (a window keeps only those)."""
    assert main(["runs", "--index", str(index), "--json"]) == 0
    windowed = "--since" in args or "--until" in args
    every = {r["run_id"] for r in json.loads(capsys.readouterr().out) if r["created_at"] or not windowed}
    assert main(["runs", "--index", str(index), "--json", *args]) == 0
    assert {r["run_id"] for r in json.loads(capsys.readouterr().out)} == every


@pytest.mark.parametrize("option", ["--since", "--until", "--stuck", "--stalled-admission"])
def test_a_duration_of_more_digits_than_python_converts_is_one_line_and_exit_2(
        index: Path, capsys: pytest.CaptureFixture[str], option: str) -> None:
    assert main(["runs", "--index", str(index), option, "9" * 5000 + "d"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and option.lstrip("-") in one_error_line(err)


@pytest.mark.parametrize("length", [50_001, 100_000])
def test_a_long_run_id_is_not_found_in_one_line(index: Path, capsys: pytest.CaptureFixture[str],
                                                length: int) -> None:
    ref = "a" * length
    assert main(["show", "--index", str(index), ref]) == 1
    out, err = capsys.readouterr()
    line = one_error_line(err)
    assert out == "" and "no run 'aaaa" in line and f"({length} characters)" in line and len(line) < 400


def test_a_long_start_of_a_run_id_still_finds_it(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--index", str(index), "-o", "name"]) == 0
    run_id = max(capsys.readouterr().out.split(), key=len)
    assert main(["show", "--index", str(index), run_id[:-1], "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["run_id"] == run_id


@pytest.mark.parametrize("args", [["-l", "run-id=" + "a" * 100_000], ["--project", "p" * 100_000],
                                  ["-l", "team in (" + ",".join("x" * 10 for _ in range(5_000)) + ")"]])
def test_long_selector_values_match_nothing_in_one_answer(index: Path, capsys: pytest.CaptureFixture[str],
                                                          args: list[str]) -> None:
    assert main(["runs", "--index", str(index), "--json", *args]) == 0
    assert json.loads(capsys.readouterr().out) == []
