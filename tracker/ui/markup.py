"""Escaping for the web view: every value that reaches a page goes through ``esc`` (text and attribute values alike)
or ``path_part`` (a URL path segment). Run ids, names, reasons and messages come from the cluster and may hold
``<``, ``&`` or quotes."""

from __future__ import annotations

import html
from urllib.parse import quote

from tracker.read.render import clock_text
from tracker.read.render import utc as utc  # re-exported, as is clock_text as clock: the pages' names

clock = clock_text


def esc(value: object) -> str:
    """Text safe in an element and in a double- or single-quoted attribute value."""
    return html.escape(str(value), quote=True)


def path_part(value: str) -> str:
    """One URL path segment: everything but unreserved characters percent-encoded (``/`` too)."""
    return quote(value, safe="")


