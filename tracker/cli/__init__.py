"""The `tracker` command line: ``main`` (the entry point ``tracker = "tracker.cli:main"``), which parses the command
line and runs the command, and turns the errors that reach it into one line and an exit code.

Start-up is kept short: the package imports only the standard library (and the standard-library parts of the read
side), and each command imports what it uses when it runs. ``runs`` imports neither pydantic nor rich, ``show`` and
``compare`` no pydantic (tests/read/test_show_light.py).

- ``parser``: the parser and its commands; ``args``: the option values (durations, times, the index path) and the
  command line's own errors; ``reading``: the reader commands (runs, audit, show, compare, demo, completion);
  ``ui``: the ``ui`` command; ``replay_cmd``: ``replay``.

Exit codes, by the error tree (``tracker.errors``): a ``Fatal`` error exits with its class's ``exit_code`` (2 for a
command line, an index or a reducer state that cannot work; 75 for an index another writer holds and did not let go
of within ``index.writer_wait_s``; 1 otherwise), a missing file with 2, any other ``OSError`` or ``sqlite3.Error``
with 1; a closed pipe ends quietly (141); SIGINT where no command handles it (start-up, the readers, ``doctor``) is
one line, 130; anything else is a bug and keeps its traceback. A replay or demo stopped by SIGINT, SIGTERM or SIGHUP
exits 128 + the signal after committing what it read; the service commands exit 0 after a graceful stop (README,
"Signals and exit codes").
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, TextIO, cast

from tracker import errors
from tracker.shell import compiled_core

try:
    from tracker.cli.args import fail, table_width
    from tracker.cli.parser import SERVICE_COMMANDS, build_parser
except ImportError as _exc:  # a compiled core older than its sources may not even load (a changed native class)
    try:
        compiled_core.check()
    except errors.Fatal as _stale:  # then that is the one line, not the import's traceback
        sys.stderr.write(f"error: {_stale}\n")
        raise SystemExit(_stale.exit_code) from _exc
    raise


class _TrailingBlanksCut:
    """A text stream that writes whole lines to ``out`` without their trailing blanks."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self._partial = ""

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        if lines:
            self.out.write("".join(line.rstrip() + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self.out.write(self._partial.rstrip())
            self._partial = ""
        self.out.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return int(self.out.fileno())


def _command(argv: Sequence[str]) -> str | None:
    """The command word: the first argument that is not an option (the top level has no option with a value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:  # SIGINT where no command handles it (start-up, a reader, doctor): no traceback
        fail("interrupted (SIGINT)")
        return 128 + signal.SIGINT


def _main(argv: list[str]) -> int:
    args = build_parser(service_commands=_command(argv) in SERVICE_COMMANDS).parse_args(argv)
    console: Any = None
    if getattr(args, "needs_console", True):
        from rich.console import Console

        from tracker.runtime.gctune import tune_gc

        tune_gc()
        # a pipe or a CI log gets COLUMNS or a fixed, readable width instead of rich's 80-column fallback, and
        # lines without the trailing blanks rich pads them with
        console = Console() if sys.stdout.isatty() else Console(width=table_width() or 150,
                                                                file=cast(TextIO, _TrailingBlanksCut(sys.stdout)))
    try:
        compiled_core.check()  # a compiled core older than its sources would run other code than the tree shows
        rc: int = args.func(args, console)
        for note in getattr(args, "notes", None) or ():  # after the answer (tracker.cli.args.reading_now)
            sys.stderr.write(note + "\n")
    except errors.Fatal as exc:  # each branch carries its exit code (a usage error, an unusable index: 2)
        fail(str(exc))
        return exc.exit_code
    except BrokenPipeError:  # the reader went away (tracker runs | head): no message, and none at exit either
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except FileNotFoundError as exc:  # a file given that is not there
        fail(str(exc))
        return 2
    except OSError as exc:
        fail(f"{exc.__class__.__name__}: {exc}")
        return 1
    except Exception as exc:
        import sqlite3  # imported by whatever raised it, if it is one

        if isinstance(exc, sqlite3.Error):
            fail(f"{exc.__class__.__name__}: {exc}")
            return 1
        raise
    return rc
