"""Capture reading: both formats, bad values, oversized values, round-robin across files."""

from __future__ import annotations

import json
from pathlib import Path

from tracker.shell.capture import BadRecord, Record, capture_files, interleave, read_capture


def test_json_lines_and_kubectl_pretty_output(tmp_path: Path) -> None:
    lines = tmp_path / "a.jsonl"
    lines.write_text('{"n": 1}\n{"n": 2}\n')
    pretty = tmp_path / "b.json"
    pretty.write_text(json.dumps({"n": 3, "o": {"x": [1, 2]}}, indent=4) + "\n" + json.dumps({"n": 4}, indent=4))
    got = [r for r in read_capture(lines)] + [r for r in read_capture(pretty)]
    assert [r.value["n"] for r in got if isinstance(r, Record)] == [1, 2, 3, 4]
    assert [r.source for r in got] == [f"{lines}:1", f"{lines}:2", f"{pretty}:1", f"{pretty}:10"]


def test_bad_json_is_reported_and_reading_resumes(tmp_path: Path) -> None:
    p = tmp_path / "c.jsonl"
    p.write_text('{"n": 1}\n{bad\n{"n": 2}\n{"n": "cut')
    got = list(read_capture(p))
    assert isinstance(got[0], Record) and got[0].value == {"n": 1}
    assert isinstance(got[1], BadRecord) and got[1].source == f"{p}:2" and got[1].reason.startswith("invalid JSON")
    assert isinstance(got[2], Record) and got[2].value == {"n": 2}
    assert isinstance(got[3], BadRecord) and got[3].source == f"{p}:4"
    assert len(got) == 4


def test_oversized_value_is_a_dead_letter_not_a_buffer(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text('{"big": "' + "x" * 5000 + '"\n{"n": 2}\n')
    got = list(read_capture(p, max_value_bytes=1000))
    assert isinstance(got[0], BadRecord)
    assert [r.value for r in got if isinstance(r, Record)] == [{"n": 2}]


def test_directories_expand_and_files_interleave_in_their_own_order(tmp_path: Path) -> None:
    (tmp_path / "x.jsonl").write_text('{"f": "x", "i": 0}\n{"f": "x", "i": 1}\n{"f": "x", "i": 2}\n')
    (tmp_path / "y.json").write_text('{"f": "y", "i": 0}\n')
    (tmp_path / "notes.txt").write_text("ignored")
    files = capture_files([tmp_path])
    assert [f.name for f in files] == ["x.jsonl", "y.json"]
    got = [(r.value["f"], r.value["i"]) for r in interleave(files) if isinstance(r, Record)]
    assert got == [("x", 0), ("y", 0), ("x", 1), ("x", 2)]
