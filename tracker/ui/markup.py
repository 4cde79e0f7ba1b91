"""Escaping for the web view: every value that reaches a page goes through ``esc`` (text and attribute values alike)
or ``path_part`` (a URL path segment). Run ids, names, reasons and messages come from the cluster and may hold
``<``, ``&`` or quotes."""

from __future__ import annotations

import html
from datetime import UTC, datetime
from urllib.parse import quote


def esc(value: object) -> str:
    """Text safe in an element and in a double- or single-quoted attribute value."""
    return html.escape(str(value), quote=True)


def path_part(value: str) -> str:
    """One URL path segment: everything but unreserved characters percent-encoded (``/`` too)."""
    return quote(value, safe="")


def utc(dt: datetime) -> datetime:
    """A naive datetime is UTC (the core's convention)."""
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def clock(dt: datetime | None, fmt: str = "%Y-%m-%d %H:%M:%SZ") -> str:
    """A time for people, in UTC to the second; '-' for None."""
    return "-" if dt is None else utc(dt).strftime(fmt)
