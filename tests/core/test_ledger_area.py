"""The goodput ledger integrates the GPUs an attempt's pods held through ``PeakSet.areas`` (blocks of events with
their sums) rather than a pass over every pod: it must equal the plain integral of the events, whatever events are
added and removed."""

from __future__ import annotations

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
