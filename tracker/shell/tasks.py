"""Structured concurrency helpers: every task lives in a ``TaskGroup`` and none outlives the call that made it.

``asyncio.gather`` of coroutines leaves the other tasks running when one raises; ``all_of`` runs them in a task
group instead (the others are cancelled and awaited) and raises the first error by itself, unwrapped, as
``gather`` did, so that callers catching a type keep catching it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

from tracker import errors

T = TypeVar("T")


async def all_of(coros: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Run ``coros`` concurrently; their results in order. When one raises, the others are cancelled and awaited,
    and the first error raised (the first leaf of the task group's exception group) leaves alone."""
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(c) for c in coros]
    except BaseExceptionGroup as group:
        raise errors.leaves(group)[0] from None
    return [t.result() for t in tasks]
