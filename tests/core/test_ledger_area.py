"""The goodput ledger integrates the GPUs an attempt's pods held through ``PeakSet.areas`` (blocks of events with
their sums) rather than a pass over every pod: it must equal the plain integral of the events, whatever events are
added and removed."""

from __future__ import annotations

from itertools import accumulate

from hypothesis import given, settings
from hypothesis import strategies as st

from tracker.core.derive_pods import PeakSet
from tracker.core.ledger import Events

pods = st.lists(st.tuples(st.integers(-10**6, 10**6), st.integers(1, 16), st.integers(0, 10**5) | st.none()),
                max_size=700)


@settings(max_examples=60, deadline=None)
@given(pods, st.data())
def test_peakset_areas_are_the_integral_of_its_events(held: list[tuple[int, int, int | None]],
                                                      data: st.DataObject) -> None:
    ps = PeakSet()
    events: list[tuple[int, int]] = []
    for bind, gpus, length in held:
        mine = [(bind, gpus)] + ([(bind + length, -gpus)] if length is not None else [])
        for ev in mine:
            ps.add(ev)
            events.append(ev)
    for ev in data.draw(st.lists(st.sampled_from(events), max_size=len(events) // 3, unique=True)
                        if events else st.just([])):
        ps.remove(ev)
        events.remove(ev)
    got, want = ps.areas(), Events(events).areas()
    for x in data.draw(st.lists(st.integers(-2 * 10**6, 2 * 10**6), min_size=1, max_size=50)):
        assert got(x) == want(x)
    assert ps.span() == Events(events).span()


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 16), st.integers(0, 10**5)), max_size=400))
def test_the_area_after_every_release_is_the_gpu_time_held(held: list[tuple[int, int, int]]) -> None:
    ps = PeakSet()
    for bind, gpus, length in held:
        ps.add((bind, gpus))
        ps.add((bind + length, -gpus))
    assert ps.areas()(2 * 10**6) == sum(g * length for _b, g, length in held)


def test_a_peakset_reads_the_same_as_it_grows_past_its_flat_list_and_shrinks_again() -> None:
    """Up to ``PeakSet.FLAT`` events are one plain list, then blocks: every step, on either side of the change and back
    down to none, reads as the plain events do (span, areas, the most GPUs at once)."""
    ps, events = PeakSet(), []
    steps = [(t * 10, 2 if t % 3 else -1) for t in range(2 * PeakSet().FLAT)]  # (compiled: an instance attribute)
    for ev in [*steps, *reversed(steps)]:
        if ev in events:
            ps.remove(ev)
            events.remove(ev)
        else:
            ps.add(ev)
            events.append(ev)
        want = Events(events)
        assert ps.span() == want.span()
        assert [ps.areas()(x) for x in range(-5, 700, 35)] == [want.areas()(x) for x in range(-5, 700, 35)]
        assert ps.peak() == max([0, *accumulate(d for _t, d in sorted(events))])
    assert ps.flat is None and ps.blocks == [] and PeakSet().flat == []
