"""``tasks.in_thread``: a blocking iterator read on a thread of its own, its items in order, its error raised, ended
by ``until`` after what it handed, and the loop woken once a batch, not once an item (a wake-up is a byte in the
loop's self-pipe, which also carries the signals; a fast reader that filled it lost them)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from tracker.shell import tasks


def test_items_in_order_and_the_iterators_error_raised() -> None:
    def items() -> Iterator[int]:
        yield from range(5000)
        raise ValueError("bad capture")

    got: list[int] = []

    async def consume_into() -> None:
        async for i in tasks.in_thread(items(), buffer=64):
            got.append(i)

    with pytest.raises(ValueError, match="bad capture"):
        asyncio.run(consume_into())
    assert got == list(range(5000))

    async def plain() -> list[int]:
        return [i async for i in tasks.in_thread(iter(range(3000)), buffer=7)]

    assert asyncio.run(plain()) == list(range(3000))


def test_until_ends_after_what_was_handed_while_the_thread_waits_in_a_read() -> None:
    release = threading.Event()

    def items() -> Iterator[int]:
        yield from range(10)
        release.wait(30)  # a quiet pipe
        yield 99

    async def main() -> list[int]:
        until = asyncio.Event()
        out = []
        async for i in tasks.in_thread(items(), until=until):
            out.append(i)
            if i == 9:
                until.set()
        return out

    try:
        assert asyncio.run(asyncio.wait_for(main(), 10)) == list(range(10))
    finally:
        release.set()


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)


def test_the_loop_is_woken_once_a_batch_not_once_an_item(monkeypatch: pytest.MonkeyPatch) -> None:
    """While the consumer holds the loop, the thread hands up to ``buffer`` items with one wake-up between them."""
    wakes = 0

    async def main() -> list[int]:
        nonlocal wakes
        loop = asyncio.get_running_loop()
        real = loop.call_soon_threadsafe

        def counted(*args: object, **kwargs: object) -> asyncio.Handle:
            nonlocal wakes
            wakes += 1
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
        out = []
        async for i in tasks.in_thread(iter(range(2000)), buffer=1000):
            if i in (0, 1000):
                hold_the_loop(0.3)  # as a fold does: the thread fills the buffer meanwhile
            out.append(i)
        return out

    assert asyncio.run(main()) == list(range(2000))
    # one item at a time this was 2,001 wake-ups; a batch needs one: at most a few dozen with the thread racing ahead
    assert wakes < 200, wakes
