"""The values of the `tracker` command line: where the readers find the index, durations and times as the
options take them, the argparse types of the options, and the two errors a command reports without a traceback.

Standard library only, like ``tracker.cli``: every command imports this module at start.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tracker import errors

DEMO_CAPTURES = Path(__file__).parent / "captures" / "demo"
DEFAULT_DEMO_INDEX = Path("out") / "demo-index.sqlite"
INDEX_ENV = "TRACKER_INDEX"
# Where readers look when neither --index nor TRACKER_INDEX is given: the index the deployed tracker writes
# (deploy/k8s/base/settings.yaml), so `kubectl exec deploy/tracker-sink-index -- tracker runs` needs no flag.
DEFAULT_INDEX = Path("/var/lib/tracker/index.sqlite")
SHOW_WIDTH_PIPED = 120  # layout width of `show` when the output is not a terminal and COLUMNS is not set

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


class UsageError(errors.Fatal):
    """A command line that cannot work (exit 2)."""


class NotFound(errors.Fatal):
    """What was asked for is not there (exit 1)."""


def parse_duration(text: str) -> float:
    """'90' (seconds), '90s', '30m', '1h30m', '2d' -> seconds."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    m = _DURATION.match(text)
    if not text or m is None or not any(m.groups()):
        raise UsageError(f"not a duration: {text!r} (use e.g. 90s, 30m, 1h30m, 2d)")
    d, h, mi, s = (int(g) if g else 0 for g in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


def parse_time(text: str, flag: str = "--now") -> datetime:
    """An ISO-8601 time (a date alone is midnight; no offset is UTC)."""
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise UsageError(f"{flag} must be an ISO-8601 time, got {text!r}") from exc
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def parse_now(text: str | None) -> datetime | None:
    return None if text is None else parse_time(text)


def parse_when(text: str, now: datetime, *, flag: str) -> datetime:
    """A duration back from ``now`` ('2h': two hours ago) or a time."""
    stripped = text.strip()
    if stripped and (_DURATION.match(stripped) or re.fullmatch(r"\d+(\.\d+)?", stripped)):
        try:
            return now - timedelta(seconds=parse_duration(text))
        except OverflowError:
            return datetime.min.replace(tzinfo=UTC)
    try:
        return parse_time(text, flag)
    except UsageError:
        raise UsageError(f"{flag} takes a duration (e.g. 2h, 1d) or an ISO-8601 time, got {text!r}") from None


def index_path(args: argparse.Namespace) -> Path:
    """--index, else $TRACKER_INDEX, else the deployed tracker's index."""
    given: Path | None = getattr(args, "index", None)
    if given is not None:
        return given
    env = os.environ.get(INDEX_ENV)
    return Path(env) if env else DEFAULT_INDEX


def _split(values: Sequence[str] | None) -> tuple[str, ...]:
    """Repeated and comma-separated values, in order, without repeats."""
    out: dict[str, None] = {}
    for v in values or ():
        for part in v.split(","):
            if part.strip():
                out[part.strip()] = None
    return tuple(out)


def _choice(allowed: Sequence[str], what: str) -> Callable[[str], str]:
    """An argparse type: one or more of ``allowed`` (comma-separated), matched case-insensitively."""
    by_lower = {a.lower(): a for a in allowed}

    def convert(text: str) -> str:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        bad = [p for p in parts if p.lower() not in by_lower]
        if bad or not parts:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(map(repr, bad or [text]))} "
                                             f"(one of: {', '.join(allowed)})")
        return ",".join(by_lower[p.lower()] for p in parts)
    convert.__name__ = what
    return convert


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _ago(now: datetime, seconds: float) -> datetime:
    """``now`` minus ``seconds``; the first representable time when that is before year 1."""
    try:
        return now - timedelta(seconds=seconds)
    except OverflowError:
        return datetime.min.replace(tzinfo=UTC)


def table_width() -> int | None:
    """The width a table must fit: the terminal's; COLUMNS when set; else none (piped output is not cut)."""
    if sys.stdout.isatty():
        import shutil

        return shutil.get_terminal_size().columns
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None
