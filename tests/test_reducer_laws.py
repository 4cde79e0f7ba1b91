"""The reducer's laws, over generated lifecycles built from realistic object templates.

- determinism: the same input gives the same history;
- idempotence: duplicated events and full relists change nothing;
- order across objects: any interleaving that keeps each object's own order gives the same history;
- resumability: fold a prefix, snapshot, restore, fold the rest == fold everything.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.laws import Event, by_object, fold, histories, relist, roundtrip
from tracker.samples.lifecycles import RunParams, generate_run

run_params = st.builds(
    RunParams,
    kind=st.sampled_from(["Job", "RayJob"]),
    pods=st.integers(1, 4),
    evictions=st.integers(0, 2),
    eviction_reason=st.sampled_from(["Preempted", "PodsReadyTimeout"]),
    pod_failures=st.integers(0, 2),
    ray_retries=st.integers(0, 2),
    outcome=st.sampled_from(["succeeded", "failed", "deactivated", "running", "deleted"]),
    with_events=st.booleans(),
    progress_points=st.integers(0, 3),
    workload_api=st.sampled_from(["v1beta1", "v1beta2"]),
)


@st.composite
def lifecycles(draw: st.DrawFn) -> list[list[Event]]:
    """Per-object event sequences of one to three runs."""
    params = draw(st.lists(run_params, min_size=1, max_size=3))
    seqs: list[list[Event]] = []
    for i, p in enumerate(params):
        seqs.extend(by_object(generate_run(i, p)))
    return seqs


def canonical(seqs: list[list[Event]]) -> list[Event]:
    """The streams one after another (each object's order kept)."""
    return [ev for seq in seqs for ev in seq]


@st.composite
def interleavings(draw: st.DrawFn, seqs: list[list[Event]]) -> list[Event]:
    """Any merge of the per-object sequences that keeps each one's own order."""
    cursors = [0] * len(seqs)
    out: list[Event] = []
    live = [i for i, s in enumerate(seqs) if s]
    while live:
        i = draw(st.sampled_from(live))
        out.append(seqs[i][cursors[i]])
        cursors[i] += 1
        if cursors[i] == len(seqs[i]):
            live.remove(i)
    return out


LAW_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                                 HealthCheck.data_too_large])


@LAW_SETTINGS
@given(st.data())
def test_determinism(data: st.DataObject) -> None:
    seqs = data.draw(lifecycles())
    order = data.draw(interleavings(seqs))
    assert histories(fold(order)) == histories(fold(order))


@LAW_SETTINGS
@given(st.data())
def test_order_across_objects_does_not_matter(data: st.DataObject) -> None:
    seqs = data.draw(lifecycles())
    expected = histories(fold(canonical(seqs)))
    assert expected, "a lifecycle must produce at least one run"
    order = data.draw(interleavings(seqs))
    assert histories(fold(order)) == expected


@LAW_SETTINGS
@given(st.data())
def test_duplicates_and_relists_change_nothing(data: st.DataObject) -> None:
    seqs = data.draw(lifecycles())
    order = data.draw(interleavings(seqs))
    expected = histories(fold(order))
    noisy: list[Event] = []
    for n, ev in enumerate(order):
        noisy.append(ev)
        roll = data.draw(st.integers(0, 9), label=f"noise@{n}")
        if roll == 0:
            noisy.append(ev)  # at-least-once delivery: the same change again
        elif roll == 1:
            noisy.extend(relist(order[: n + 1]))  # a full relist after a reconnect or 410
        elif roll == 2 and n >= 3:
            noisy.extend(order[n - 2: n + 1])  # a consumer restart replays a suffix
    noisy.extend(relist(order))
    assert histories(fold(noisy)) == expected


@LAW_SETTINGS
@given(st.data())
def test_snapshot_and_resume_equals_one_fold(data: st.DataObject) -> None:
    seqs = data.draw(lifecycles())
    order = data.draw(interleavings(seqs))
    cut = data.draw(st.integers(0, len(order)))
    resumed = fold(order[cut:], roundtrip(fold(order[:cut])))
    assert histories(resumed) == histories(fold(order))


def _flushed_state(order: list[Event], every: int) -> dict[str, Any]:
    """What a sink ends up with when the reducer flushes every ``every`` records."""
    from tracker.core.reducer import Reducer

    red = Reducer()
    last: dict[str, Any] = {}
    for n, ev in enumerate(order, start=1):
        red.apply(ev, "law")
        if n % every == 0:
            for h in red.flush().histories:
                last[h.run.run_id] = h.model_dump(mode="json")
    for h in red.flush().histories:
        last[h.run.run_id] = h.model_dump(mode="json")
    return last


@LAW_SETTINGS
@given(st.data())
def test_incremental_flushes_end_where_one_fold_ends(data: st.DataObject) -> None:
    seqs = data.draw(lifecycles())
    order = data.draw(interleavings(seqs))
    every = data.draw(st.integers(1, 7))
    assert _flushed_state(order, every) == histories(fold(order))
