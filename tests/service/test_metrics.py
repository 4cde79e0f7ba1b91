"""Metrics of each process (issue 17): a process exports its own families, the build info and the process
families; the embedded pipeline (`tracker serve` without Kafka) updates the reducer's metrics from its flushes."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.core.test_retirement import demo_stream
from tracker.core.limits import ReducerLimits
from tracker.core.model import Phase, RunHistory, Status
from tracker.core.reducer import Flushed, Reducer
from tracker.runtime.embedded_metrics import PARTITION, EmbeddedMetrics
from tracker.runtime.ops import PROCESS_FAMILIES, Metrics, build_version
from tracker.runtime.pipeline import PipelineLimits, run_pipeline
from tracker.settings import load_settings
from tracker.shell.index import ExperimentIndex
from tracker.shell.reducer_state import restore


def families(metrics: Metrics) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """name -> samples (sample name, labels, value) of the process's exposition, as a scraper parses it."""
    text = metrics.exposition().decode()
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


def tracker_families(metrics: Metrics) -> set[str]:
    return {name for name in families(metrics) if name.startswith("tracker_")}


def test_each_process_exports_its_own_families_and_no_other() -> None:
    reduce, sink, watch = Metrics("reduce"), Metrics("sink-index"), Metrics("watch")
    held = {"tracker_runs", "tracker_reducer_packed_runs", "tracker_reducer_packed_bytes",
            "tracker_reducer_derivations"}
    assert {"tracker_transactions", "tracker_consumer_lag", "tracker_oldest_stuck_seconds", *held} <= \
        tracker_families(reduce)
    assert not any(name.startswith("tracker_sink_") for name in tracker_families(reduce))
    assert {"tracker_sink_rows_changed", "tracker_consumer_lag"} <= tracker_families(sink)
    assert "tracker_transactions" not in tracker_families(sink) and not held & tracker_families(sink)
    assert tracker_families(watch) == {"tracker_build_info", "tracker_errors"}
    embedded = tracker_families(Metrics("serve-embedded"))
    assert {"tracker_transitions", "tracker_dead_letters_dropped", *held} <= embedded
    assert not {"tracker_transactions", "tracker_consumer_lag", "tracker_partitions_assigned"} & embedded
    every = tracker_families(Metrics())
    for process in PROCESS_FAMILIES:
        assert tracker_families(Metrics(process)) <= every


@pytest.mark.parametrize("process", sorted(PROCESS_FAMILIES))
def test_every_process_exports_its_build_and_its_resources(process: str) -> None:
    exported = families(Metrics(process))
    [(_, labels, value)] = exported["tracker_build_info"]
    assert value == 1 and labels["process"] == process and labels["version"] == build_version() != ""
    assert labels["python"].count(".") == 2
    assert "process_resident_memory_bytes" in exported and "process_cpu_seconds" in exported


def test_an_unknown_process_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown process 'reducer'.*reduce"):
        Metrics("reducer")


def values(metrics: Metrics, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(labels.items())): value for name, labels, value in families(metrics).get(family, [])
            if not name.endswith("_created")}


def test_the_embedded_pipeline_counts_what_it_folds_and_holds(tmp_path: Path) -> None:
    """Over the bundled capture, flushed in small batches: changes folded, phase entries added (the sum over the
    histories written), dead letters by reason, runs held by status and the stuck gauges agree with the index."""
    metrics = Metrics("serve-embedded")
    gauges = EmbeddedMetrics(metrics, load_settings(None, {}), monotonic=lambda: 0.0)
    records = demo_stream()
    last: dict[str, RunHistory] = {}
    letters: Counter[str] = Counter()

    def on_flush(out: Flushed, folded: int, watermark: int) -> None:
        last.update((h.run.run_id, h) for h in out.histories)
        letters.update(dl.reason for dl in out.dead_letters)
        gauges.flushed(out, folded, watermark)

    with ExperimentIndex(tmp_path / "runs.sqlite") as index:
        reducer = restore(index, ReducerLimits())
        gauges.restored(reducer)
        asyncio.run(run_pipeline(records, reducer, sinks=[], store=index,
                                 limits=PipelineLimits(flush_every=7, replay_flush_every=7), on_flush=on_flush))
    gauges.refresh(reducer.watermark)
    histories = list(last.values())
    assert values(metrics, "tracker_changes_consumed") == {(("partition", PARTITION),): float(len(records))}
    phases = Counter(t.phase.value for h in histories for t in h.transitions)
    assert {dict(k)["phase"]: v for k, v in values(metrics, "tracker_transitions").items()} == phases
    assert {dict(k)["reason"]: v for k, v in values(metrics, "tracker_dead_letters").items()} == letters
    statuses = Counter(h.run.status.value for h in histories)
    held = {dict(k)["status"]: v for k, v in values(metrics, "tracker_runs").items()}
    assert held == {s.value: float(statuses.get(s.value, 0)) for s in Status}
    stuck = {(dict(k)["phase"], dict(k)["queue"]) for k in values(metrics, "tracker_oldest_stuck_seconds")}
    expected = {(h.run.phase.value, f"{h.run.namespace or '-'}/{h.run.queue or '-'}")
                for h in histories if h.run.status == Status.PENDING
                and h.run.phase in (Phase.ADMISSION, Phase.SCHEDULING, Phase.RUNTIME)}
    assert stuck == expected and expected  # the demo has runs stuck before running
    packed, packed_bytes = reducer.runs.packed_size()
    assert values(metrics, "tracker_reducer_packed_runs") == {(): float(packed)} and packed > 0
    assert values(metrics, "tracker_reducer_packed_bytes") == {(): float(packed_bytes)} and packed_bytes > packed
    assert values(metrics, "tracker_reducer_derivations") == {(): float(len(reducer.derivations))}


def test_retired_runs_are_counted_finished_and_leave_the_gauges(tmp_path: Path) -> None:
    metrics = Metrics("serve-embedded")
    gauges = EmbeddedMetrics(metrics, load_settings(None, {}), monotonic=lambda: 0.0)
    reducer = Reducer(ReducerLimits(retire_after_us=0))
    records = demo_stream()
    asyncio.run(run_pipeline(records, reducer, sinks=[], on_flush=gauges.flushed))
    gauges.refresh(reducer.watermark)
    finished = {dict(k)["status"]: v for k, v in values(metrics, "tracker_runs_finished").items()}
    assert sum(finished.values()) == len(reducer.retired) > 0
    held = {dict(k)["status"]: v for k, v in values(metrics, "tracker_runs").items()}
    assert sum(held.values()) == len(reducer.runs)


def test_a_restarted_pipeline_starts_from_the_runs_it_restored(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    with ExperimentIndex(path) as index:
        asyncio.run(run_pipeline(demo_stream(), restore(index, ReducerLimits()), sinks=[], store=index))
    metrics = Metrics("serve-embedded")
    gauges = EmbeddedMetrics(metrics, load_settings(None, {}), monotonic=lambda: 0.0)
    with ExperimentIndex(path) as index:
        reducer = restore(index, ReducerLimits())
    gauges.restored(reducer)
    gauges.refresh(reducer.watermark)
    held = {dict(k)["status"]: v for k, v in values(metrics, "tracker_runs").items()}
    assert sum(held.values()) == len(reducer.runs) > 0
    assert not values(metrics, "tracker_transitions")  # counted by the process that added them
