"""The sinks' "refused data" protocol is the error tree's ``InvalidInput`` branch, nothing wider: an update the sink
refuses that way is skipped (counted, its offset committed with the batch's), while a builtin ``ValueError`` from a
write is a bug or a fault: retried, then fatal, never skipped. No Kafka: the runner's write path alone."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import pytest

from tracker import errors
from tracker.core.model import HistoryUpdate
from tracker.runtime.ops import Health, Metrics
from tracker.runtime.sinks import SinkFatal, SinkRunner
from tracker.settings import Settings, SinkSettings


class Sink:
    def __init__(self, refuse: str, error: type[Exception]) -> None:
        self.refuse, self.error = refuse, error
        self.written: list[str] = []
        self.calls = 0

    def write(self, updates: Sequence[HistoryUpdate]) -> int:
        self.calls += 1
        if any(u.run_id == self.refuse for u in updates):
            raise self.error(f"run {self.refuse}")
        self.written += [u.run_id for u in updates]
        return len(updates)


def runner(sink: Sink, metrics: Metrics) -> SinkRunner:
    settings = Settings(sink=SinkSettings(max_retries=2, retry_backoff_max_s=0.01))
    run = SinkRunner("test", open_sink=lambda: contextlib.nullcontext(sink), group="g", settings=settings,
                     metrics=metrics, health=Health())
    run._sink = sink
    return run


def bad_records(metrics: Metrics) -> float:
    return sum(s.value for m in metrics.sink_bad_records.collect() for s in m.samples if s.name.endswith("_total"))


UPDATES = [HistoryUpdate(run_id=r) for r in ("a", "b", "c")]


async def test_an_invalid_input_costs_its_update_only() -> None:
    sink, metrics = Sink("b", errors.InvalidInput), Metrics()
    await runner(sink, metrics)._write_with_retries(UPDATES, {})
    assert sink.written == ["a", "c"]
    assert bad_records(metrics) == 1


async def test_a_bare_value_error_is_not_skipped_but_stops_the_sink() -> None:
    sink, metrics = Sink("b", ValueError), Metrics()
    with pytest.raises(SinkFatal, match="write failed 3 times in a row"):
        await runner(sink, metrics)._write_with_retries(UPDATES, {})
    assert sink.written == [] and sink.calls == 3
    assert bad_records(metrics) == 0
