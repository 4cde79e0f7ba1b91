"""What ``tracker runs`` and the web view keep: label selectors, the ``RunFilter`` and the one function that builds it
from filter values as the user gave them (``run_filter``), with the time and duration forms the filters take.

One place for the filters, so that the command line (its options) and the web view (its query string) read them
alike and refuse them with the same words: a value that cannot work raises ``FilterError``, which the command line
reports as a usage error (exit 2) and the web view as a 400 page. Standard library and the core vocabulary only:
``tracker runs`` starts without pydantic.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from tracker import errors
from tracker.core.vocab import PHASES, STATUSES

LIVE_STATUSES = ("pending", "running")
# Phases a run can be stuck in before its application starts (``--stuck``).
STUCK_PHASES = ("Admission", "Scheduling", "Runtime")

# Label keys answered from the runs table's columns (the root's labels as the reducer read them); short aliases too.
LABEL_COLUMNS = {
    "taugrid.io/run-id": "run_id", "taugrid.io/project": "project", "taugrid.io/workspace": "workspace",
    "taugrid.io/target": "target", "kueue.x-k8s.io/queue-name": "queue",
    "run-id": "run_id", "project": "project", "workspace": "workspace", "target": "target", "queue": "queue",
}

# ``--sort-by`` keys: a column, or the time the run entered its phase.
SORT_KEYS = {
    "created": "created_at", "queued": "queued_at", "admitted": "admitted_at", "started": "started_at",
    "finished": "finished_at", "age": "phase_since", "name": "name", "namespace": "namespace", "run": "run_id",
    "status": "status", "phase": "phase", "attempts": "attempts", "evictions": "evictions",
    "retries": "retries", "wait": "admission_wait_s",
}

#: The filters ``run_filter`` takes, as ``tracker runs`` spells its options (the web view's query string too).
FILTERS = ("namespace", "selector", "queue", "cluster-queue", "status", "phase", "since", "until",
           "stalled-admission", "stuck", "workspace", "project", "sort-by", "limit", "now", "node")
# The filters given as a list (repeated, or comma-separated values); the others take one value, the last given.
LIST_FILTERS = ("namespace", "selector", "queue", "cluster-queue", "status", "phase", "node")

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
#: The largest ``--limit`` (and ``limit=``): SQLite's largest integer. The web view caps it lower (``MAX_LIMIT``).
MAX_LIMIT = 2**63 - 1
#: The instants a time may name, in UTC: those a ``datetime`` holds (as ``tracker.core.timefmt`` accepts).
TIME_RANGE = "between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z in UTC"


class FilterError(errors.InvalidInput):
    """A filter value that cannot work (the message says which and why): a usage error on the command line, a 400
    page in the web view."""


class TimeRangeError(FilterError):
    """An ISO-8601 time outside the years 1 to 9999 in UTC."""


# ------------------------------------------------------------------------------------------ values


def parse_duration(text: str) -> float:
    """'90' (seconds), '90s', '30m', '1h30m', '2d' -> seconds."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    m = _DURATION.match(text)
    if not text or m is None or not any(m.groups()):
        raise FilterError(f"not a duration: {text!r} (use e.g. 90s, 30m, 1h30m, 2d)")
    try:
        d, h, mi, s = (int(g) if g else 0 for g in m.groups())
    except ValueError:  # more digits than Python converts (4300): longer than any span of time a datetime holds
        raise FilterError(f"not a duration: {shown(text)} (too many digits)") from None
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


def shown(text: str, limit: int = 64) -> str:
    """``text`` quoted as a message shows a value given, cut to ``limit`` characters (a value may be huge)."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def parse_time(text: str, flag: str = "--now") -> datetime:
    """An ISO-8601 time (a date alone is midnight; no offset is UTC), an instant a UTC ``datetime`` can hold (so
    that it converts to UTC and, in the index's form, compares with the stored times)."""
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise FilterError(f"{flag} must be an ISO-8601 time, got {shown(text)}") from exc
    dt = dt if dt.tzinfo else dt.replace(tzinfo=UTC)
    try:
        dt.astimezone(UTC)
    except OverflowError:
        raise TimeRangeError(f"{flag} must be a time {TIME_RANGE}, got {shown(text)}") from None
    return dt


def parse_now(text: str | None) -> datetime | None:
    return None if text is None else parse_time(text)


def parse_when(text: str, now: datetime, *, flag: str) -> datetime:
    """A duration back from ``now`` ('2h': two hours ago) or a time."""
    stripped = text.strip()
    if stripped and (_DURATION.match(stripped) or re.fullmatch(r"\d+(\.\d+)?", stripped)):
        try:
            return ago(now, parse_duration(text))
        except FilterError as exc:
            raise FilterError(f"{flag}: {exc}") from None
    try:
        return parse_time(text, flag)
    except TimeRangeError:
        raise
    except FilterError:
        raise FilterError(f"{flag} takes a duration (e.g. 2h, 1d) or an ISO-8601 time, got {shown(text)}") from None


def ago(now: datetime, seconds: float) -> datetime:
    """``now`` minus ``seconds``; the first representable time when that is before year 1."""
    try:
        return now - timedelta(seconds=seconds)
    except OverflowError:
        return datetime.min.replace(tzinfo=UTC)


def split(values: Sequence[str] | None) -> tuple[str, ...]:
    """Repeated and comma-separated values, in order, without repeats."""
    out: dict[str, None] = {}
    for v in values or ():
        for part in v.split(","):
            if part.strip():
                out[part.strip()] = None
    return tuple(out)


def choice(allowed: Sequence[str], what: str) -> Callable[[str], str]:
    """One or more of ``allowed`` (comma-separated), matched case-insensitively, as their spelling in ``allowed``;
    ValueError saying which are unknown (an argparse type: argparse reports its message)."""
    by_lower = {a.lower(): a for a in allowed}

    def convert(text: str) -> str:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        bad = [p for p in parts if p.lower() not in by_lower]
        if bad or not parts:
            raise ValueError(f"unknown {what} {', '.join(map(repr, bad or [text]))} (one of: {', '.join(allowed)})")
        return ",".join(by_lower[p.lower()] for p in parts)
    convert.__name__ = what
    return convert


def positive(text: str) -> int:
    """A whole number from 1 to ``MAX_LIMIT`` (SQLite's largest integer); ValueError saying so (an argparse
    type)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT:
        raise ValueError(f"must be a whole number >= 1 and at most {MAX_LIMIT}, got {shown(text)}")
    return value


def time_text(dt: datetime) -> str:
    """A time in the index's fixed-width form, which orders exactly as text against ``exact`` columns."""
    dt = dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
    return dt.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def exact(column: str) -> str:
    """A stored time ('...SSZ', or '...SS.ffffffZ' when sub-second) in fixed-width form ('...SS.ffffffZ'), which
    orders and compares exactly as text (the stored form omits zero microseconds: exact only to the second)."""
    return f"(CASE WHEN length({column}) = 20 THEN substr({column}, 1, 19) || '.000000Z' ELSE {column} END)"


# ------------------------------------------------------------------------------------------ selectors


class Requirement(NamedTuple):
    """One term of a label selector: ``op`` is one of =, !=, in, notin, exists, !exists."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op == "exists":
            return value is not None
        if self.op == "!exists":
            return value is None
        if self.op in ("=", "in"):
            return value is not None and value in self.values
        return value is None or value not in self.values  # != and notin, as kubectl: a missing label matches


_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_SET_TERM = re.compile(rf"^({_KEY})\s+(in|notin)\s+\(([^()]*)\)$")
_EQ_TERM = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})$")
_EXISTS_TERM = re.compile(rf"^(!?)\s*({_KEY})$")


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """A kubectl label selector: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``,
    joined by commas (all must hold)."""
    terms: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    out: list[Requirement] = []
    for raw in terms:
        term = raw.strip()
        if m := _SET_TERM.match(term):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            if not values:
                raise FilterError(f"selector term {term!r} has no values")
            out.append(Requirement(m.group(1), m.group(2), values))
        elif m := _EQ_TERM.match(term):
            out.append(Requirement(m.group(1), "!=" if m.group(2) == "!=" else "=", (m.group(3),)))
        elif m := _EXISTS_TERM.match(term):
            out.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise FilterError(f"not a label selector term: {term!r} (use e.g. taugrid.io/project=llm, "
                              "'team notin (a,b)', '!kueue.x-k8s.io/priority-class')")
    return tuple(out)


# ------------------------------------------------------------------------------------------ the filter


class RunFilter(NamedTuple):
    """What ``runs`` keeps: every given condition holds. Times are aware datetimes."""

    namespaces: tuple[str, ...] = ()
    selector: tuple[Requirement, ...] = ()
    queues: tuple[str, ...] = ()
    cluster_queues: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    phases: tuple[str, ...] = ()
    since: datetime | None = None  # created at or after
    until: datetime | None = None  # created before
    stuck_before: datetime | None = None  # live, not started, in Admission/Scheduling/Runtime since before this
    stalled_admission_before: datetime | None = None  # pending in Admission, queued before this
    sort_by: str = "created"
    limit: int | None = None
    now: datetime | None = None  # the reference time of ``--sort-by wait``: a run still waiting has waited until now
    nodes: tuple[str, ...] = ()  # a pod of the run (any attempt) was bound to one of these nodes


FilterValues = Mapping[str, "Sequence[str] | str | int | bool | None"]


def _one(values: FilterValues, name: str) -> str | None:
    """The value of a filter that takes one: the last given (a list's last item)."""
    value = values.get(name)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Sequence):
        return str(value[-1]) if value else None
    return str(value)


def _many(values: FilterValues, name: str) -> list[str]:
    value = values.get(name)
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]  # type: ignore[union-attr]


def run_filter(values: FilterValues, *, now: datetime) -> RunFilter:
    """The ``RunFilter`` of filter values named as ``FILTERS`` (``tracker runs``' options; the web view's query
    string): lists for ``LIST_FILTERS``, one value (or a list, whose last counts) for the others; ``all-namespaces``
    (true: every namespace) too. Each value is checked as the command line checks it; FilterError names the filter
    and says why (``status: unknown status 'x' (one of: ...)``)."""
    statuses = _checked(values, "status", choice(STATUSES, "status"))
    phases = _checked(values, "phase", choice(PHASES, "phase"))
    sort_by = _one(values, "sort-by")
    if sort_by is not None and sort_by not in SORT_KEYS:
        raise FilterError(f"sort-by: invalid choice: {sort_by!r} (choose from "
                          + ", ".join(repr(k) for k in SORT_KEYS) + ")")
    limit_text = _one(values, "limit")
    limit = None
    if limit_text is not None:
        try:
            limit = positive(limit_text)
        except ValueError as exc:
            raise FilterError(f"limit: {exc}") from None
    selector: tuple[Requirement, ...] = ()
    for text in _many(values, "selector"):
        selector += parse_selector(text)
    for key, name in (("taugrid.io/workspace", "workspace"), ("taugrid.io/project", "project")):
        value = _one(values, name)
        if value is not None:
            selector += (Requirement(key, "=", (value,)),)
    namespaces = () if values.get("all-namespaces") else split(_many(values, "namespace"))
    stalled_text, stuck_text = _one(values, "stalled-admission"), _one(values, "stuck")
    since_text, until_text = _one(values, "since"), _one(values, "until")
    stalled = None if stalled_text is None else ago(now, _duration(stalled_text, "stalled-admission"))
    stuck = None if stuck_text is None else ago(now, _duration(stuck_text, "stuck"))
    return RunFilter(
        namespaces=namespaces, selector=selector, queues=split(_many(values, "queue")),
        cluster_queues=split(_many(values, "cluster-queue")), statuses=statuses, phases=phases,
        since=None if since_text is None else parse_when(since_text, now, flag="--since"),
        until=None if until_text is None else parse_when(until_text, now, flag="--until"),
        stalled_admission_before=stalled, stuck_before=stuck,
        sort_by="age" if stuck_text is not None and sort_by is None else (sort_by or "created"),
        limit=limit, now=now, nodes=split(_many(values, "node")))


def _duration(text: str, name: str) -> float:
    try:
        return parse_duration(text)
    except FilterError as exc:
        raise FilterError(f"{name}: {exc}") from None


def _checked(values: FilterValues, name: str, convert: Callable[[str], str]) -> tuple[str, ...]:
    out: list[str] = []
    for text in _many(values, name):
        try:
            out.append(convert(text))
        except ValueError as exc:
            raise FilterError(f"{name}: {exc}") from None
    return split(out)
