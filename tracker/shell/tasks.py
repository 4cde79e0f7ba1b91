"""Structured concurrency helpers: every task lives in a ``TaskGroup`` and none outlives the call that made it.

``asyncio.gather`` of coroutines leaves the other tasks running when one raises; ``all_of`` runs them in a task
group instead (the others are cancelled and awaited) and raises the first error by itself, unwrapped, as
``gather`` did, so that callers catching a type keep catching it.

``in_thread`` iterates a blocking iterator (a capture read from a pipe that may stay quiet for hours) on a thread
of its own, so that the event loop keeps answering probes and signals while the iterator waits."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Iterable
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


_END = object()


async def in_thread(items: Iterable[T], *, buffer: int = 1024, name: str = "reader",
                    until: asyncio.Event | None = None) -> AsyncIterator[T]:
    """The items of a blocking iterator, read on a daemon thread of their own, at most ``buffer`` ahead of the
    consumer. The iterator's error is raised here. When the consumer stops (or is cancelled), the thread stops at its
    next item; a thread blocked in a read that never returns is a daemon and does not hold up the process's exit.

    Once ``until`` is set the thread hands nothing more, and the iteration ends after the items it handed before
    (at most ``buffer``), even while the thread sits in a read of a quiet pipe: every item handed is consumed (what
    the iterator had read towards its next item, a value not yet complete, is not).

    The thread wakes the loop once for the items it hands while the loop has not yet woken (not once an item): a
    wake-up is a byte in the loop's self-pipe, which also carries the signals of ``loop.add_signal_handler``, and a
    self-pipe filled by a fast reader lost them (a replay of a pipe did not stop on SIGINT)."""
    loop = asyncio.get_running_loop()
    handed: deque[tuple[object, BaseException | None]] = deque()  # appended by the thread, taken by the consumer
    ready = asyncio.Event()  # set on the loop when something was handed
    lock = threading.Lock()
    waking = False  # a wake-up is on its way to the loop (under ``lock``)
    room = threading.Semaphore(buffer)
    stop = threading.Event()

    def wake() -> None:
        nonlocal waking
        with lock:
            waking = False
        ready.set()

    async def end_when_set(event: asyncio.Event) -> None:
        await event.wait()
        stop.set()
        handed.append((_END, None))  # after every item handed so far
        ready.set()

    def hand(item: object, exc: BaseException | None = None) -> bool:
        nonlocal waking
        handed.append((item, exc))
        with lock:
            if waking:
                return True
            waking = True
        try:
            loop.call_soon_threadsafe(wake)
        except RuntimeError:  # the loop is closed: nobody reads any more
            return False
        return True

    def read() -> None:
        try:
            for item in items:
                while not room.acquire(timeout=0.5):
                    if stop.is_set():
                        return
                if stop.is_set() or not hand(item):
                    return
        except BaseException as exc:  # handed to the consumer, which raises it
            if not stop.is_set():
                hand(_END, exc)
            return
        if not stop.is_set():
            hand(_END)

    threading.Thread(target=read, name=name, daemon=True).start()
    ender = None if until is None else asyncio.ensure_future(end_when_set(until))
    try:
        while True:
            if not handed:
                ready.clear()
                if not handed:  # (a wake-up for what the thread hands from now on sets it again)
                    await ready.wait()
                continue
            item, exc = handed.popleft()
            if item is _END:
                if exc is not None:
                    raise exc
                return
            room.release()
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        if ender is not None:
            ender.cancel()
