"""Calls that may hang (the Kusto SDK's, azure-identity's), run on a daemon thread and waited for with a deadline.

A call past its deadline is abandoned, never waited for at exit: ``asyncio.to_thread``'s executor threads would
be joined when the process exits. ``call_with_deadline`` waits from synchronous code (the ADX sink, ``kusto
apply``), ``await_with_deadline`` from the event loop (``tracker doctor``); both run the call by ``_start``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tracker import errors

T = TypeVar("T")


class DeadlineExceeded(errors.Retryable, TimeoutError):
    """``call_with_deadline`` gave up waiting (raised by the helper itself, never by the call it waits for)."""


def _start(fn: Callable[[], T], name: str, *, on_result: Callable[[T], None],
           on_error: Callable[[BaseException], None]) -> threading.Thread:
    """``fn()`` on a new daemon thread named ``name``; its result or its error is handed to the callbacks."""
    def target() -> None:
        try:
            value = fn()
        except BaseException as exc:  # handed to the caller
            on_error(exc)
        else:
            on_result(value)

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def call_with_deadline(fn: Callable[[], T], *, timeout_s: float, what: str,
                       progress: tuple[float, Callable[[float], None]] | None = None) -> T:
    """``fn()`` in a daemon thread, waited for at most ``timeout_s`` (the SDK's calls can hang); with ``progress``,
    ``progress[1](elapsed)`` is called every ``progress[0]`` seconds meanwhile. ``DeadlineExceeded`` ("``what``
    still running after ...") when it does not return in time; what ``fn`` raises is raised here."""
    result: list[T] = []
    error: list[BaseException] = []
    started = time.monotonic()
    thread = _start(fn, what, on_result=result.append, on_error=error.append)
    while thread.is_alive():
        elapsed = time.monotonic() - started
        if elapsed >= timeout_s:
            raise DeadlineExceeded(f"{what} still running after {timeout_s:g}s")
        step = timeout_s - elapsed if progress is None else min(progress[0], timeout_s - elapsed)
        thread.join(step)
        if thread.is_alive() and progress is not None and time.monotonic() - started < timeout_s:
            progress[1](time.monotonic() - started)
    if error:
        raise error[0]
    return result[0]


async def await_with_deadline(fn: Callable[[], T], *, timeout_s: float, what: str) -> T:
    """``fn()`` on a daemon thread, awaited for at most ``timeout_s`` (``TimeoutError`` after that, from
    ``asyncio.timeout``); what ``fn`` raises (an ``Exception``) is raised here."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(lambda: None if done.done() else setter(value))

    def on_error(exc: BaseException) -> None:
        if isinstance(exc, Exception):
            deliver(done.set_exception, exc)

    _start(fn, what, on_result=lambda value: deliver(done.set_result, value), on_error=on_error)
    async with asyncio.timeout(timeout_s):
        return await done
