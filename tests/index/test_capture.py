"""Capture reading: both formats, bad values, oversized values, round-robin across files; byte-order marks, gzip,
standard input, and directory entries that are not capture files."""

from __future__ import annotations

import gzip
import io
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracker.shell import capture
from tracker.shell.capture import (
    AS_WRITTEN,
    MAX_VALUE_BYTES,
    BadRecord,
    Decoding,
    Record,
    capture_files,
    capture_size,
    interleave,
    read_capture,
)


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


# ------------------------------------------------------------------------------ input as people have it


def _values(records: list[Record | BadRecord]) -> list[object]:
    return [r.value for r in records if isinstance(r, Record)]


def test_a_byte_order_mark_is_skipped(tmp_path: Path) -> None:
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + b'{"n": 1}\n{"n": 2}\n')
    got = list(read_capture(p))
    assert _values(got) == [{"n": 1}, {"n": 2}] and len(got) == 2


def test_gzip_captures_are_read_in_directories_and_by_name(tmp_path: Path) -> None:
    (tmp_path / "pods.jsonl.gz").write_bytes(gzip.compress(b'{"f": "pods", "i": 0}\n{"f": "pods", "i": 1}\n'))
    (tmp_path / "jobs.json.gz").write_bytes(gzip.compress(
        b"\xef\xbb\xbf" + json.dumps({"f": "jobs", "i": 0}, indent=4).encode()))
    files = capture_files([tmp_path])
    assert [f.name for f in files if isinstance(f, Path)] == ["jobs.json.gz", "pods.jsonl.gz"]
    assert _values(list(interleave(files))) == [{"f": "jobs", "i": 0}, {"f": "pods", "i": 0}, {"f": "pods", "i": 1}]
    # recognised by content: a gzip capture by any name (a pipe carries no name)
    (tmp_path / "plain-name.jsonl").write_bytes(gzip.compress(b'{"n": 1}\n'))
    assert _values(list(read_capture(tmp_path / "plain-name.jsonl"))) == [{"n": 1}]


def test_a_truncated_gzip_capture_keeps_what_it_holds_and_reports_the_rest(tmp_path: Path) -> None:
    data = gzip.compress(b"".join(b'{"n": %d}\n' % i for i in range(2000)))
    p = tmp_path / "cut.jsonl.gz"
    p.write_bytes(data[: len(data) * 2 // 3])
    got = list(read_capture(p))
    assert 0 < len(_values(got)) < 2000
    assert isinstance(got[-1], BadRecord) and got[-1].reason.startswith("capture not read to its end")
    assert got[-1].source == str(p)


def test_standard_input_is_a_capture_given_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(b'{"n": 1}\n{"n": 2}\n'))))
    files = capture_files([Path("-"), Path("-")])
    assert files == [Path("-")]
    got = list(interleave(files))
    assert _values(got) == [{"n": 1}, {"n": 2}] and [r.source for r in got] == ["stdin:1", "stdin:2"]
    assert capture_size(files[0]) == 0


def test_what_a_directory_holds_that_is_not_a_capture_file_is_reported(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "a.jsonl").write_text('{"n": 1}\n')
    os.mkfifo(tmp_path / "fifo.jsonl")  # opening it would wait for a writer forever
    (tmp_path / "dangling.json").symlink_to(tmp_path / "gone.json")
    (tmp_path / "sub.json").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock.json"))
    (tmp_path / "notes.txt").write_text("not named like a capture: not read, not reported")
    try:
        files = capture_files([tmp_path])
        got = list(interleave(files))
    finally:
        sock.close()
    assert _values(got) == [{"n": 1}]
    bad = {Path(r.source).name: r.reason for r in got if isinstance(r, BadRecord)}
    assert bad == {"dangling.json": "capture not read: a symbolic link to nothing",
                   "fifo.jsonl": "capture not read: a FIFO, not a regular file",
                   "sock.json": "capture not read: a socket, not a regular file",
                   "sub.json": "capture not read: a directory, not a regular file"}
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 4 and all(any(name in w for w in warned) for name in bad)
    assert sum(capture_size(f) for f in files) == len('{"n": 1}\n')


def test_a_value_nested_too_deeply_or_with_a_huge_integer_is_reported_and_reading_resumes(tmp_path: Path) -> None:
    p = tmp_path / "odd.jsonl"
    p.write_text('{"n": 1}\n' + "[" * 5000 + "]" * 5000 + '\n{"n": 2}\n{"big": ' + "9" * 5000 + '}\n{"n": 3}\n')
    got = list(read_capture(p))
    assert _values(got) == [{"n": 1}, {"n": 2}, {"n": 3}]
    bad = [r for r in got if isinstance(r, BadRecord)]
    assert [(r.source, r.reason[:40]) for r in bad] == [(f"{p}:2", "invalid JSON: nested too deeply"),
                                                        (f"{p}:4", "invalid JSON: Exceeds the limit (4300 di")]


def test_a_capture_named_that_is_not_there_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "gone.jsonl")
    with pytest.raises(FileNotFoundError, match="symbolic link to nothing"):
        capture_files([tmp_path / "dangling.jsonl"])
    with pytest.raises(FileNotFoundError, match="capture not found"):
        capture_files([tmp_path / "nope.jsonl"])


def test_bytes_without_a_line_that_starts_a_value_are_a_bad_record_every_max_value_bytes(tmp_path: Path) -> None:
    """A stream of NUL bytes (``/dev/zero`` on a pipe) never has a line that starts a value: every
    ``max_value_bytes`` of it is a bad record, so a reader always gets one within a bound, never a silent drain to
    an end that may not come; reading resumes at the next line that starts a value."""
    path = tmp_path / "zeros.jsonl"
    path.write_bytes(b"\0" * 1_000_000 + b'\n{"a": 1}\n')
    got = list(read_capture(path, max_value_bytes=100_000))  # reads go by READ_CHUNK (64 KiB): one per 2 chunks
    bad = [r for r in got if isinstance(r, BadRecord)]
    assert 6 <= len(bad) <= 10 and all(r.reason.startswith("value too large") for r in bad), bad
    assert isinstance(got[-1], Record) and got[-1].value == {"a": 1}


def test_a_device_given_by_name_is_refused(tmp_path: Path) -> None:
    """A device never ends (``/dev/zero``) or is no capture: refused in one line (exit 2), before any read; a FIFO
    given by name is read (``<(zcat today.jsonl.gz)``)."""
    from tracker.shell.capture import NotACapture

    with pytest.raises(NotACapture, match=r"^capture /dev/zero is a character device: give a regular file, a pipe"):
        capture_files([Path("/dev/zero")])
    assert NotACapture.exit_code == 2
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    assert capture_files([fifo]) == [fifo]


def _slow_only(text: str) -> Any:
    raise ValueError("the slow path only")


VALUES = st.recursive(st.none() | st.integers() | st.text(max_size=5) | st.floats(allow_nan=False),
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)


@st.composite
def capture_text(draw: st.DrawFn) -> str:
    """Values as captures hold them: JSON lines, kubectl's indented objects, objects indented by 0, two on a line,
    top-level lists and scalars, and bad or cut values; with or without a last newline."""
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        value = draw(st.dictionaries(st.text(max_size=4), VALUES, max_size=4) | VALUES)
        form = draw(st.sampled_from(["line", "indent4", "indent2", "indent0", "two", "bad", "cut"]))
        if form == "line":
            parts.append(json.dumps(value) + "\n")
        elif form.startswith("indent"):
            parts.append(json.dumps(value, indent=int(form[6:])) + "\n")
        elif form == "two":
            parts.append(json.dumps(value) + " " + json.dumps(value) + "\n")
        elif form == "bad":
            parts.append("{bad: " + json.dumps(value) + "\n")
        else:
            parts.append(json.dumps(value, indent=4)[:-2] + "\n")
    text = "".join(parts)
    return text[:-1] if text and draw(st.booleans()) else text


@settings(max_examples=400, deadline=None)
@given(capture_text(), st.sampled_from([7, 64, 1 << 16]), st.sampled_from([40, 200, MAX_VALUE_BYTES]))
def test_the_fast_path_reads_what_the_slow_path_reads(text: str, chunk: int, max_value_bytes: int) -> None:
    """The fast path (JSON lines, kubectl's indented objects) yields exactly the records, bad records and line
    numbers of the slow path alone (``json.JSONDecoder.raw_decode``), in reads of any size, values too large too."""
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(capture, "READ_CHUNK", chunk)
        path = Path(tmp) / "c.json"
        path.write_text(text)
        fast = list(read_capture(path, max_value_bytes))
        slow = list(read_capture(path, max_value_bytes, decoding=Decoding(_slow_only, AS_WRITTEN.value)))
    assert fast == slow  # Record and BadRecord compare by value: source, value, reason, excerpt
