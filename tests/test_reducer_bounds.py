"""A long run's state stays bounded: progress reports are remembered only as far back as needed."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from tracker.core.facts import MAX_PROGRESS_SEEN
from tracker.core.reducer import Reducer

T0 = datetime(2026, 8, 20, 10, 0, tzinfo=UTC)


def progress(step: int) -> dict[str, object]:
    return {"schema": "taugrid.io/intake/v1", "kind": "Progress", "event_id": f"p-{step}", "run_id": "long",
            "at": (T0 + timedelta(seconds=step)).isoformat(), "step": step, "metrics": {"loss": 1.0 / (step + 1)}}


def test_progress_memory_is_bounded_and_recent_repeats_are_still_ignored() -> None:
    red = Reducer()
    n = MAX_PROGRESS_SEEN + 2_000
    for step in range(n):
        red.apply(progress(step), "intake")
    for step in range(n - 100, n):  # a consumer restart replays the latest reports
        red.apply(progress(step), "intake")
    red.apply(progress(5), "intake")  # a very late repeat, older than everything remembered
    facts = red.runs["long"]
    assert len(facts.progress_seen) == MAX_PROGRESS_SEEN
    loss = facts.metrics["loss"]
    assert loss.points == n
    assert (loss.first[0], loss.latest[0]) == (0, n - 1)
    snap = red.snapshot_run("long")
    assert snap is not None and len(json.dumps(snap)) < 1_000_000
