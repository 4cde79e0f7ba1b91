"""Read capture files: JSON lines, or the concatenated pretty-printed JSON values that
``kubectl get <resource> -A -w --output-watch-events -o json`` prints.

Reading is streaming and bounded: one JSON value at a time, and a value larger than ``max_value_bytes`` is
reported as a dead letter instead of being buffered without end. A value that does not parse (bad JSON, nested
deeper than the decoder goes, an integer of thousands of digits) is reported with its position and reading resumes
at the next line that starts a value.

Input as people have it: a UTF-8 byte-order mark is skipped; a gzip-compressed capture (``pods.jsonl.gz``; it is
recognised by its content, so a pipe may carry one too) is decompressed; ``-`` is standard input. In a directory,
the files named like captures (``.json``, ``.jsonl``, and those with ``.gz``) are read in name order; an entry named
like one that is not a regular file (a FIFO, a socket, a device, a dangling symbolic link, a directory), or a file
that cannot be opened or read to its end (permissions, a truncated gzip), is reported (a dead letter, and a warning
naming it) and the rest is read. A path given by name may be a regular file or a pipe (``<(zcat today.jsonl.gz)``);
a device (``/dev/zero``, ``/dev/urandom``, a terminal) or a socket given by name is refused (``NotACapture``, exit 2).

Bounded on any stream: a value (or a run of bytes without a line that starts a value, as NUL bytes from
``/dev/zero`` on a pipe) longer than ``max_value_bytes`` is a bad record, and so is every further ``max_value_bytes``
of it, so a caller always gets a record (and a chance to stop) within ``max_value_bytes`` of input. A read that may
block without end (standard input, a pipe: ``is_stream``) is for the caller to put on a thread of its own
(``tracker.shell.tasks.in_thread``), as ``tracker replay`` and ``tracker serve`` do.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import logging
import os
import stat
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from tracker import errors
from tracker.shell import jsonio

MAX_VALUE_BYTES = 8 * 1024 * 1024  # a Kubernetes object is at most ~1.5 MiB in etcd; leave room
READ_CHUNK = 1 << 16
CAPTURE_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
STDIN = Path("-")
STDIN_NAME = "stdin"

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Decoding:
    """How a capture's values are decoded: ``line`` decodes the text of one JSON object (the fast path: a JSON line,
    or an object pretty-printed as kubectl prints them; ValueError if it is not JSON), ``value`` finishes a value
    the slow path decoded (a line holding more than one, an object not indented). ``line(text)`` must equal
    ``value(jsonio.loads(text))``."""

    line: Callable[[str], Any]
    value: Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


#: The values as they are in the file.
AS_WRITTEN = Decoding(jsonio.loads, _same)


@dataclass(frozen=True, slots=True)
class Record:
    source: str  # "path:line" of the value's first line
    value: Any


@dataclass(frozen=True, slots=True)
class BadRecord:
    source: str
    reason: str
    excerpt: str


@dataclass(frozen=True, slots=True)
class Unreadable:
    """An entry of a capture directory that is not read, and why: it is reported as a dead letter."""

    path: Path
    why: str


Capture = Path | Unreadable

_decoder = json.JSONDecoder()


class NotACapture(errors.ConfigError):
    """A capture path given by name that is not a regular file, a pipe or ``-``: a device (``/dev/zero`` never ends)
    or a socket (exit 2, as a command line that cannot work)."""

    exit_code = 2


class _ReadError(errors.InvalidInput):
    """Reading the capture's bytes failed; the message says why."""


def read_capture(path: Capture, max_value_bytes: int = MAX_VALUE_BYTES, *,
                 decoding: Decoding = AS_WRITTEN) -> Iterator[Record | BadRecord]:
    """Yield every JSON value in ``path`` (``-``: standard input) in file order, decoded by ``decoding``; what cannot
    be read is a BadRecord."""
    if isinstance(path, Unreadable):
        _log.warning("capture %s not read: %s", path.path, path.why)
        yield BadRecord(str(path.path), f"capture not read: {path.why}", "")
        return
    name = STDIN_NAME if path == STDIN else str(path)
    with ExitStack() as stack:
        try:
            fh = _open(path, stack)
        except OSError as exc:
            why = _why(exc)
            _log.warning("capture %s not read: %s", name, why)
            yield BadRecord(name, f"capture not read: {why}", "")
            return
        try:
            yield from _values(fh, name, max_value_bytes, decoding)
        except _ReadError as exc:
            _log.warning("capture %s not read to its end: %s", name, exc)
            yield BadRecord(name, f"capture not read to its end: {exc}", "")


class _Text:
    """A capture's bytes as text: decompressed when they are gzip, decoded as UTF-8 without a byte-order mark.

    Bytes are read with ``read1`` (what is available, at most a chunk), so that a read that fails (a truncated
    gzip) loses nothing that came before it."""

    def __init__(self, raw: io.BufferedReader) -> None:
        try:
            magic = raw.peek(2)[:2]
        except OSError:
            magic = b""  # the first read reports it
        self._stream: io.BufferedIOBase = gzip.GzipFile(fileobj=raw, mode="rb") if magic == b"\x1f\x8b" else raw
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")
        self._done = False

    def read(self) -> str:
        """The next chunk of text; "" at the end. Raises _ReadError."""
        while not self._done:
            try:
                data = self._stream.read1(READ_CHUNK)
            except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
                raise _ReadError(_why(exc)) from exc
            self._done = not data
            text = self._decoder.decode(data, final=self._done)
            if text:
                return text
        return ""


def _open(path: Path, stack: ExitStack) -> _Text:
    """Standard input for ``-``, else the file (closed by ``stack``)."""
    if path == STDIN:
        # a reader of its own on a copy of the descriptor, not sys.stdin: a capture may be read on a thread that sits
        # in a read of a quiet pipe when the process exits, and the interpreter aborts if it finds sys.stdin's lock
        # held then ("could not acquire lock ... at interpreter shutdown")
        try:
            fd = sys.stdin.fileno()
        except (AttributeError, ValueError, io.UnsupportedOperation):  # not a real stream (an embedding, a test)
            stdin = sys.stdin.buffer
            raw: io.BufferedReader = stdin if isinstance(stdin, io.BufferedReader) else \
                io.BufferedReader(cast(io.RawIOBase, stdin))
        else:
            raw = stack.enter_context(io.BufferedReader(io.FileIO(os.dup(fd), "rb")))
    else:
        raw = stack.enter_context(path.open("rb"))
    return _Text(raw)


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _values(fh: _Text, name: str, max_value_bytes: int, decoding: Decoding) -> Iterator[Record | BadRecord]:
    line_value, finish = decoding.line, decoding.value
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
            chunk = fh.read()
            if not chunk:
                return
            buf = chunk
            continue
        # the fast path: each whole line that is one JSON object (JSON lines), and each pretty-printed object
        # ("{" alone on its line, as kubectl prints them) up to its first "}" at column 0 (nothing nested is at
        # column 0 when it is indented), decoded by ``decoding.line`` (orjson, ``jsonio``, or the typed decoder of
        # ``tracker.shell.typed``); an object not read to its end yet is read on here (up to ``max_value_bytes``);
        # what is not one object (two values on a line, a value not indented, bad JSON, a value too large) goes the
        # slow way below, which decodes it or reports it
        pos = 0
        searched = 0  # the search for the end of a pretty-printed object at ``pos`` has passed this
        while buf.startswith("{", pos):
            end = buf.find("\n", pos)
            if end == pos + 1:  # "{\n": a pretty-printed object, to its closing "}\n"
                end = buf.find("\n}\n", max(end, searched)) + 2
                end = -1 if end < 2 else end
            if end < 0:  # the object goes on in the next read: read it here, not by failing the slow way first
                if pos == 0 and not eof and len(buf) <= max_value_bytes:
                    chunk = fh.read()
                    if chunk:
                        searched = max(0, len(buf) - 2)  # where "\n}\n" may start that was not searched yet
                        buf += chunk
                        continue
                    eof = True
                break
            text = buf[pos:end]
            try:
                value = line_value(text)
            except (ValueError, RecursionError):
                break
            yield Record(f"{name}:{line}", value)
            line += text.count("\n") + 1
            pos = end + 1
            searched = 0
        if pos:
            buf = buf[pos:]
            continue
        try:
            value, end = _decoder.raw_decode(buf)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError, as is a 5000-digit integer
            # Top-level values start at column 0 in both formats, so a later line starting with
            # '{' or '[' means this value is complete and invalid; otherwise it may be cut short.
            nxt = _next_start(buf, 1)
            if nxt < 0 and not eof and len(buf) <= max_value_bytes:
                chunk = fh.read()
                if chunk:
                    buf += chunk
                else:
                    eof = True
                continue
            too_large = nxt < 0 and len(buf) > max_value_bytes
            reason = "value too large" if too_large else f"invalid JSON: {_json_error(exc)}"
            yield BadRecord(f"{name}:{line}", reason, buf[: min(256, nxt if nxt > 0 else 256)])
            if nxt < 0:
                rest = _drain_to_line_start(fh, max_value_bytes) if too_large else ""
                while rest is None:  # another max_value_bytes without a line that starts a value (/dev/zero)
                    yield BadRecord(f"{name}:{line}", "value too large (still no line that starts a value)", "")
                    rest = _drain_to_line_start(fh, max_value_bytes)
                buf = rest
                continue
            line += buf.count("\n", 0, nxt)
            buf = buf[nxt:]
            continue
        yield Record(f"{name}:{line}", finish(value))
        line += buf.count("\n", 0, end)
        buf = buf[end:]


def _json_error(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc)  # e.g. "Exceeds the limit (4300 digits) for integer string conversion: value has 5000 digits"


def _next_start(buf: str, pos: int) -> int:
    """Index of the next line at or after ``pos`` that starts with '{' or '['."""
    i = buf.find("\n", max(pos, 1) - 1)
    while i >= 0:
        if buf[i + 1:i + 2] in ("{", "["):
            return i + 1
        i = buf.find("\n", i + 1)
    return -1


def _drain_to_line_start(fh: _Text, limit: int) -> str | None:
    """Skip input until a line that starts a JSON value; return the buffer from there ("" at the end), or None once
    ``limit`` characters were skipped without one: the caller reports them, so that an endless stream without such a
    line (NUL bytes from ``/dev/zero`` on a pipe) is a bad record every ``limit`` characters, not a silent spin."""
    skipped = 0
    while skipped < limit:
        chunk = fh.read()
        if not chunk:
            return ""
        i = _next_start("\n" + chunk, 1)
        if i >= 0:
            return str(chunk[i - 1:])
        skipped += len(chunk)
    return None


def capture_files(paths: Sequence[Path]) -> list[Capture]:
    """Expand directories to the capture files inside them (sorted), keep files (and ``-``, standard input, once)
    as given. An entry of a directory named like a capture that cannot be read as one is kept as ``Unreadable``, so
    that reading reports it; a path given that does not exist raises FileNotFoundError."""
    out: list[Capture] = []
    for p in paths:
        if p == STDIN:
            if STDIN not in out:
                out.append(STDIN)
        elif p.is_dir():
            try:
                entries = sorted(q for q in p.iterdir() if q.name.endswith(CAPTURE_SUFFIXES))
            except OSError as exc:
                out.append(Unreadable(p, f"the directory cannot be listed: {_why(exc)}"))
                continue
            for q in entries:
                problem = _not_a_capture_file(q)
                out.append(q if problem is None else Unreadable(q, problem))
        elif p.exists():  # a file, or a pipe named on purpose (e.g. <(zcat today.jsonl.gz)); no device or socket
            refused = _not_given_capture(p)
            if refused is not None:
                raise NotACapture(f"capture {p} is {refused}: give a regular file, a pipe or - (standard input)")
            out.append(p)
        elif p.is_symlink():
            raise FileNotFoundError(f"capture not found: {p} is a symbolic link to nothing")
        else:
            raise FileNotFoundError(f"capture not found: {p}")
    return out


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


def _not_given_capture(path: Path) -> str | None:
    """Why a path given by name cannot be read as a capture (None if it can: a regular file or a FIFO). A device
    (``/dev/zero``, ``/dev/urandom``, a terminal) or a socket never ends, or is not a capture at all."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None  # opening it reports why, as a bad record
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
        return None
    return next((k for test, k in _KINDS if test(mode)), "not a regular file")


def is_stream(path: Capture) -> bool:
    """Whether reading ``path`` may block without end: standard input or a pipe (not a regular file)."""
    if isinstance(path, Unreadable):
        return False
    if path == STDIN:
        return True
    try:
        return not stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _not_a_capture_file(path: Path) -> str | None:
    """Why a directory entry cannot be read as a capture file (None if it can)."""
    try:
        mode = path.stat().st_mode  # follows a symbolic link
    except FileNotFoundError:
        return "a symbolic link to nothing" if path.is_symlink() else "gone"
    except OSError as exc:
        return _why(exc)
    if stat.S_ISREG(mode):
        return None
    kind = next((k for test, k in _KINDS if test(mode)), "not a regular file")
    return f"{kind}, not a regular file"


def capture_size(path: Capture) -> int:
    """Bytes of a capture file as stored (0 for standard input and what is not a regular file)."""
    if isinstance(path, Unreadable) or path == STDIN:
        return 0
    try:
        st = path.stat()
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def interleave(paths: Sequence[Capture], *, decoding: Decoding = AS_WRITTEN) -> Iterator[Record | BadRecord]:
    """Round-robin over several captures: each file stays in its own order, none is read ahead."""
    its = [read_capture(p, decoding=decoding) for p in paths]
    while its:
        alive = []
        for it in its:
            rec = next(it, None)
            if rec is not None:
                alive.append(it)
                yield rec
        its = alive
