"""Read capture files: JSON lines, or the concatenated pretty-printed JSON values that
``kubectl get <resource> -A -w --output-watch-events -o json`` prints.

Reading is streaming and bounded: one JSON value at a time, and a value larger than ``max_value_bytes`` is
reported as a dead letter instead of being buffered without end. A value that does not parse is reported
with its position and reading resumes at the next line that starts a value.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_VALUE_BYTES = 8 * 1024 * 1024  # a Kubernetes object is at most ~1.5 MiB in etcd; leave room
READ_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class Record:
    source: str  # "path:line" of the value's first line
    value: Any


@dataclass(frozen=True, slots=True)
class BadRecord:
    source: str
    reason: str
    excerpt: str


_decoder = json.JSONDecoder()


def read_capture(path: Path, max_value_bytes: int = MAX_VALUE_BYTES) -> Iterator[Record | BadRecord]:
    """Yield every JSON value in ``path`` in file order."""
    name = str(path)
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        buf = ""
        line = 1  # line number of buf[0]
        eof = False
        while True:
            stripped = buf.lstrip()
            line += buf.count("\n", 0, len(buf) - len(stripped))
            buf = stripped
            if not buf:
                if eof:
                    return
                chunk = fh.read(READ_CHUNK)
                if not chunk:
                    return
                buf = chunk
                continue
            try:
                value, end = _decoder.raw_decode(buf)
            except json.JSONDecodeError as exc:
                # Top-level values start at column 0 in both formats, so a later line starting with
                # '{' or '[' means this value is complete and invalid; otherwise it may be cut short.
                nxt = _next_start(buf, 1)
                if nxt < 0 and not eof and len(buf) <= max_value_bytes:
                    chunk = fh.read(READ_CHUNK)
                    if chunk:
                        buf += chunk
                    else:
                        eof = True
                    continue
                too_large = nxt < 0 and len(buf) > max_value_bytes
                reason = "value too large" if too_large else f"invalid JSON: {exc.msg}"
                yield BadRecord(f"{name}:{line}", reason, buf[: min(256, nxt if nxt > 0 else 256)])
                if nxt < 0:
                    buf = _drain_to_line_start(fh) if too_large else ""
                    continue
                line += buf.count("\n", 0, nxt)
                buf = buf[nxt:]
                continue
            yield Record(f"{name}:{line}", value)
            line += buf.count("\n", 0, end)
            buf = buf[end:]


def _next_start(buf: str, pos: int) -> int:
    """Index of the next line at or after ``pos`` that starts with '{' or '['."""
    i = buf.find("\n", max(pos, 1) - 1)
    while i >= 0:
        if buf[i + 1:i + 2] in ("{", "["):
            return i + 1
        i = buf.find("\n", i + 1)
    return -1


def _drain_to_line_start(fh: Any) -> str:
    """Skip input until a line that starts a JSON value; return the buffer from there."""
    while True:
        chunk = fh.read(READ_CHUNK)
        if not chunk:
            return ""
        i = _next_start("\n" + chunk, 1)
        if i >= 0:
            return str(chunk[i - 1:])


def capture_files(paths: list[Path]) -> list[Path]:
    """Expand directories to the capture files inside them (sorted), keep files as given."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(sorted(q for q in p.iterdir() if q.suffix in (".json", ".jsonl") and q.is_file()))
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"capture not found: {p}")
    return out


def interleave(paths: list[Path]) -> Iterator[Record | BadRecord]:
    """Round-robin over several captures: each file stays in its own order, none is read ahead."""
    its = [read_capture(p) for p in paths]
    while its:
        alive = []
        for it in its:
            rec = next(it, None)
            if rec is not None:
                alive.append(it)
                yield rec
        its = alive
