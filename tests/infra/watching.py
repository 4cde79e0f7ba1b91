"""Async helpers for tests that watch Kubernetes objects through kubernetes_asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio import watch

#: A watch event as kubernetes_asyncio yields it: {"type": ..., "object": ..., "raw_object": {...}}.
Event = dict[str, Any]


def condition(obj: Mapping[str, Any], condition_type: str) -> Mapping[str, Any] | None:
    """The status condition of `condition_type` on a raw (dict) object, if present."""
    for item in obj.get("status", {}).get("conditions") or []:
        if item.get("type") == condition_type:
            found: Mapping[str, Any] = item
            return found
    return None


def has_condition(obj: Mapping[str, Any], condition_type: str, status: str = "True", reason: str = "") -> bool:
    found = condition(obj, condition_type)
    return found is not None and found.get("status") == status and (not reason or found.get("reason") == reason)


async def wait_for_event(
    list_call: Callable[..., Awaitable[Any]],
    *args: Any,
    predicate: Callable[[Event], bool],
    # Not left to the caller's asyncio.timeout: it also bounds the server-side watch, and on expiry
    # the failure can list the events that were seen.
    timeout: float,  # noqa: ASYNC109
    **kwargs: Any,
) -> Event:
    """Watch with `list_call(*args, **kwargs)` until an event satisfies `predicate`; return it.

    Pass `resource_version=` to replay everything after a known write (no lost-update race).
    """
    events_seen: list[str] = []
    async with watch.Watch() as stream:
        try:
            async with asyncio.timeout(timeout):
                async for event in stream.stream(list_call, *args, timeout_seconds=int(timeout) + 5, **kwargs):
                    raw = event["raw_object"]
                    events_seen.append(f"{event['type']} {raw.get('kind')}/{raw.get('metadata', {}).get('name')}")
                    if predicate(event):
                        matched: Event = event
                        return matched
        except TimeoutError:
            pass
    raise AssertionError(f"no matching watch event within {timeout:.0f}s; saw: {events_seen[-20:]}")
