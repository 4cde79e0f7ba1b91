"""Kubernetes timestamps to integer microseconds since the epoch (UTC).

metav1.Time serialises as ``2026-08-20T10:14:03Z`` and metav1.MicroTime as ``2026-08-20T10:14:03.123456Z``;
mixing them breaks string ordering, so the core works in integers. Parsing is memoised: a capture repeats
the same timestamps many times.

Only instants a ``datetime`` can hold in UTC are accepted (0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z):
``0001-01-01T00:00:00+14:00`` parses as a local time but is in year 0 in UTC, and no history could show it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache

from tracker import errors


class BadTimestamp(errors.InvalidInput):
    """Not an ISO-8601 UTC timestamp."""


@lru_cache(maxsize=8192)  # behind extract.time_at's memo: a bound on memory (an entry is ~200 B)
def _parse(text: str) -> int:
    try:
        dt = datetime.fromisoformat(text)
    except ValueError as exc:
        raise BadTimestamp(f"not an RFC 3339 timestamp: {text[:64]!r}") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    us = micros(dt)
    if not in_range(us):
        raise BadTimestamp(f"outside the years 0001 to 9999 in UTC: {text[:64]!r}")
    return us


def micros(dt: datetime) -> int:
    """An aware datetime to microseconds since the epoch, exactly (``dt.timestamp()`` is a float)."""
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MIN_US = micros(datetime.min.replace(tzinfo=UTC))  # 0001-01-01T00:00:00Z
MAX_US = micros(datetime.max.replace(tzinfo=UTC))  # 9999-12-31T23:59:59.999999Z


def in_range(us: int) -> bool:
    """Whether ``us`` (microseconds since the epoch) is an instant a UTC ``datetime`` can hold."""
    return MIN_US <= us <= MAX_US


def ts(value: object) -> int | None:
    """Parse a Kubernetes timestamp; None and "" give None; anything else malformed raises BadTimestamp."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return _parse(value)
    if isinstance(value, datetime):
        return _parse(value.isoformat())
    raise BadTimestamp(f"timestamp must be a string, got {type(value).__name__}")
