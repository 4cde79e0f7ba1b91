"""The values of the `tracker` command line: where the readers find the index, durations and times as the
options take them, the argparse types of the options, and the two errors a command reports without a traceback.

Standard library only (and ``tracker.read.filters``, which is too): every command imports this module at start.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from tracker import errors
from tracker.read import filters

_V = TypeVar("_V")

DEMO_CAPTURES = Path(__file__).parents[1] / "captures" / "demo"
DEFAULT_DEMO_INDEX = Path("out") / "demo-index.sqlite"
# The end of the demo captures' window (their README): `tracker demo`'s index is read as of it (``reading_now``)
DEMO_CAPTURED_UNTIL = "2026-08-20T13:00:00Z"
INDEX_ENV = "TRACKER_INDEX"
# Where readers look when neither --index nor TRACKER_INDEX is given: the index the deployed tracker writes
# (deploy/k8s/base/settings.yaml), so `kubectl exec deploy/tracker-sink-index -- tracker runs` needs no flag.
DEFAULT_INDEX = Path("/var/lib/tracker/index.sqlite")
SHOW_WIDTH_PIPED = 120  # layout width of `show` when the output is not a terminal and COLUMNS is not set



class UsageError(errors.Fatal):
    """A command line that cannot work (exit 2)."""

    exit_code = 2


class NotFound(errors.Fatal):
    """What was asked for is not there (exit 1)."""


def parse_duration(text: str) -> float:
    """'90' (seconds), '90s', '30m', '1h30m', '2d' -> seconds (``tracker.read.filters.parse_duration``)."""
    try:
        return filters.parse_duration(text)
    except filters.FilterError as exc:
        raise UsageError(str(exc)) from None


def parse_time(text: str, flag: str = "--now") -> datetime:
    """An ISO-8601 time (a date alone is midnight; no offset is UTC)."""
    try:
        return filters.parse_time(text, flag)
    except filters.FilterError as exc:
        raise UsageError(str(exc)) from None


def parse_now(text: str | None) -> datetime | None:
    return None if text is None else parse_time(text)


def recorded_now(path: Path) -> datetime | None:
    """The latest time a recording holds (an index written by ``tracker replay`` or ``tracker demo`` only:
    ``ExperimentIndex.set_clock``), which its readers read it as of; None for a live index, or one that does not
    read (the command's own read says why)."""
    import sqlite3

    from tracker.read.store import IndexReader

    try:
        with IndexReader(path) as reader:
            if reader.meta("clock") != "recorded":
                return None
            until = reader.meta("recorded_until")
    except (errors.TrackerError, sqlite3.Error, OSError):
        return None
    try:
        return parse_now(until)
    except filters.FilterError:
        return None


def reading_now(args: argparse.Namespace, path: Path, *, say: bool = True) -> datetime:
    """The time a reader reads at: ``--now``; else a recording's latest time (``recorded_now``; unless not ``say``,
    a note for stderr is kept in ``args.notes``, which ``tracker.cli.main`` prints once the command has printed
    its answer, so that it never comes before an error's one line); else the wall clock."""
    given = parse_now(args.now)
    if given is not None:
        return given
    recorded = recorded_now(path)
    if recorded is None:
        return datetime.now(UTC)
    if say:
        notes = getattr(args, "notes", None)
        if notes is None:
            notes = args.notes = []
        notes.append(recording_note(path, recorded))
    return recorded


def recording_note(path: Path, recorded: datetime) -> str:
    return (f"note: {path} is a recording (written by tracker replay): read as of "
            f"{recorded.strftime('%Y-%m-%dT%H:%M:%SZ')}, the latest time it holds (--now TIME to read it at another)")


def parse_when(text: str, now: datetime, *, flag: str) -> datetime:
    """A duration back from ``now`` ('2h': two hours ago) or a time."""
    try:
        return filters.parse_when(text, now, flag=flag)
    except filters.FilterError as exc:
        raise UsageError(str(exc)) from None


def index_path(args: argparse.Namespace) -> Path:
    """--index, else $TRACKER_INDEX, else the deployed tracker's index."""
    given: Path | None = getattr(args, "index", None)
    if given is not None:
        return given
    env = os.environ.get(INDEX_ENV)
    return Path(env) if env else DEFAULT_INDEX


def choice(allowed: Sequence[str], what: str) -> Callable[[str], str]:
    """An argparse type: one or more of ``allowed`` (comma-separated), matched case-insensitively."""
    return argument_type(filters.choice(allowed, what))


def output(named: Sequence[str]) -> Callable[[str], str]:
    """An argparse type for ``-o``: one of ``named``, ``jsonpath=TEMPLATE`` or ``custom-columns=SPEC``
    (``tracker.read.jsonpath``), checked when the command line is read and kept as given."""
    def output_format(text: str) -> str:
        if text in named:  # (argparse converts the default too: a plain format needs no template parser)
            return text
        from tracker.read.jsonpath import output_format as parsed

        parsed(text, named)
        return text
    return argument_type(output_format)


def positive(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    return argument_type(filters.positive)(text)


def argument_type(convert: Callable[[str], _V]) -> Callable[[str], _V]:
    """``convert`` as an argparse type: its ValueError's message is what argparse reports."""
    def checked(text: str) -> _V:
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    checked.__name__ = getattr(convert, "__name__", "value")
    return checked


def fail(message: str) -> None:
    """One line on stderr, never read as markup."""
    sys.stderr.write(f"error: {' '.join(message.split())}\n")


def table_width() -> int | None:
    """The width a table must fit: the terminal's; COLUMNS when set; else none (piped output is not cut)."""
    if sys.stdout.isatty():
        import shutil

        return shutil.get_terminal_size().columns
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


def run_filter(args: argparse.Namespace, now: datetime) -> filters.RunFilter:
    """The ``RunFilter`` of ``tracker runs``' filter options (``tracker.read.filters.run_filter``, which the web view
    gives its query string)."""
    values: dict[str, Any] = {name: getattr(args, name.replace("-", "_")) for name in filters.FILTERS
                              if name != "now"}
    values["all-namespaces"] = args.all_namespaces
    try:
        return filters.run_filter(values, now=now)
    except filters.FilterError as exc:
        raise UsageError(str(exc)) from None


def print_rich(make: Callable[[int], Any]) -> None:  # (rich is imported when a command prints with it)
    """Print a rich renderable laid out for the terminal; piped, at COLUMNS (or SHOW_WIDTH_PIPED) and with no
    trailing blanks."""
    from rich.console import Console

    if sys.stdout.isatty():
        console = Console()
        console.print(make(console.width))
        return
    width = table_width() or SHOW_WIDTH_PIPED
    console = Console(width=width, color_system=None, force_terminal=False)
    with console.capture() as captured:
        console.print(make(width))
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
