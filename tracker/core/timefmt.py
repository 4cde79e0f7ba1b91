"""Kubernetes timestamps to integer microseconds since the epoch (UTC).

metav1.Time serialises as ``2026-08-20T10:14:03Z`` and metav1.MicroTime as ``2026-08-20T10:14:03.123456Z``;
mixing them breaks string ordering, so the core works in integers. Parsing is memoised: a capture repeats
the same timestamps many times.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache


class BadTimestamp(ValueError):
    pass


@lru_cache(maxsize=65536)
def _parse(text: str) -> int:
    try:
        dt = datetime.fromisoformat(text)
    except ValueError as exc:
        raise BadTimestamp(f"not an RFC 3339 timestamp: {text[:64]!r}") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ts(value: object) -> int | None:
    """Parse a Kubernetes timestamp; None and "" give None; anything else malformed raises BadTimestamp."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return _parse(value)
    if isinstance(value, datetime):
        return _parse(value.isoformat())
    raise BadTimestamp(f"timestamp must be a string, got {type(value).__name__}")
