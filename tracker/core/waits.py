"""Waits read at a time: a live run's admission wait and its open pending span count up to ``now``.

A run's ``admission_wait_s`` is set once its current attempt is admitted (Kueue's ``Admitted=True``); while it is
still waiting (status ``pending``, ``queued_at`` set, ``admitted_at`` null) its wait is ``now - queued_at`` and
still growing. Likewise ``pending_s_by`` sums the *ended* pending spans (``tracker.core.pending``); the span still
going on (``pending_category`` from ``pending_since``) counts up to ``now`` where a reader shows or sums it.

Standard library only (no pydantic): ``tracker runs`` and ``tracker audit`` use it on plain rows, the renderers
and the metrics on ``RunRecord`` values. Pure: ``now`` is always an argument (a reader's ``--now``, the web view's
``?now=``, the reducer's watermark or wall clock).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import NamedTuple

from tracker.core.vocab import PENDING_CATEGORIES as PENDING_CATEGORIES  # re-exported

GROWING = "+"  # marks a wait still growing (``12m+``), as the timeline marks a phase still going on


class Wait(NamedTuple):
    seconds: float | None
    growing: bool  # still waiting: the seconds are up to ``now``


def _aware(dt: datetime) -> datetime:
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt


def admission_wait(status: str, queued_at: datetime | None, admitted_at: datetime | None, wait_s: float | None,
                   now: datetime | None) -> Wait:
    """The admission wait of a run (or attempt) at ``now``: the recorded one once admitted; while it is pending,
    queued and not admitted, ``now - queued_at`` (never negative), growing; else none."""
    if wait_s is not None:
        return Wait(wait_s, False)
    if str(status) == "pending" and queued_at is not None and admitted_at is None and now is not None:
        return Wait(max(0.0, (_aware(now) - _aware(queued_at)).total_seconds()), True)
    return Wait(None, False)


def open_seconds(since: datetime | None, now: datetime | None) -> float:
    """The seconds of an open span from ``since`` to ``now`` (0 without either; never negative)."""
    if since is None or now is None:
        return 0.0
    return max(0.0, (_aware(now) - _aware(since)).total_seconds())


def category_of(key: str) -> str:
    """The category of a ``pending_s_by`` key (``admission-check:<name>`` is ``admission-check``)."""
    return key.split(":", 1)[0]


def pending_by_category(pending_s_by: Mapping[str, float], open_category: str | None = None,
                        open_since: datetime | None = None, now: datetime | None = None) -> dict[str, float]:
    """Every category's pending seconds (0 for those without any), the open span counted up to ``now``."""
    out = dict.fromkeys(PENDING_CATEGORIES, 0.0)
    for key, seconds in pending_s_by.items():
        cat = category_of(key)
        out[cat] = out.get(cat, 0.0) + float(seconds)
    if open_category:
        out[open_category] = out.get(open_category, 0.0) + open_seconds(open_since, now)
    return out


def pending_by_key(pending_s_by: Mapping[str, float], open_key: str | None = None,
                   open_since: datetime | None = None, now: datetime | None = None) -> dict[str, float]:
    """The seconds by key (an admission check by its name) with the open span up to ``now``, longest first."""
    out = {k: float(v) for k, v in pending_s_by.items()}
    if open_key:
        out[open_key] = out.get(open_key, 0.0) + open_seconds(open_since, now)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))
