"""The serve loop's hand-off to the embedded pipeline (tracker.runtime.service._Handoff): however the feeding side
stops (its source ended, failed, or was cancelled), the pipeline gets the end of its input and drains what is queued.
Before, the end was a None *put* that was skipped once the pipeline's task counted as done, which it does as soon as
the task group cancels it after a failing source: the pipeline thread then waited for input forever and `tracker
serve` hung, even on SIGTERM (found with an object whose `kind` was a list, issue 24)."""

from __future__ import annotations

import asyncio
import threading

from tracker.runtime.service import _Handoff
from tracker.shell.capture import Record


async def test_close_ends_the_input_after_what_is_queued() -> None:
    h = _Handoff(4)
    assert await h.put(Record("a:1", {"n": 1}), closed=lambda: False)
    assert await h.put(Record("a:2", {"n": 2}), closed=lambda: True) is False  # a closed consumer takes nothing
    h.close()
    first = await h.get()
    assert isinstance(first, Record) and first.value == {"n": 1}
    assert await h.get() is None
    assert await h.get() is None


async def test_close_wakes_a_getter_waiting_on_another_loop() -> None:
    h = _Handoff(4)
    got: list[object] = []

    def consumer() -> None:
        got.append(asyncio.run(asyncio.wait_for(h.get(), 10)))

    t = threading.Thread(target=consumer)
    t.start()
    await asyncio.sleep(0.2)  # the getter sleeps on its own loop
    h.close()
    t.join(10)
    assert not t.is_alive() and got == [None]
