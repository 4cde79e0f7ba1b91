"""The reducer's own retirement (``ReducerLimits.retire_after_us``), which the embedded pipeline (`tracker serve`)
uses so that its memory stays flat: a run whose history is final for good is freed once the event-time watermark
(the earliest of the watch streams' latest creationTimestamp) is the grace past its last change.

The decision is taken per record, never at flushes, so the histories a sink ends up with do not depend on when
the pipeline flushes, nor on where a stream is cut into calls that continue from the index's stored state."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim import builders
from sim.lifecycles import generate_cluster
from tests.core.test_reducer_laws import law_settings, plans, seeds
from tests.service.test_replay_incremental import contents, cut
from tests.support.histories import stored
from tests.support.laws import by_object, interleave
from tracker.cli.args import DEMO_CAPTURES
from tracker.core.limits import ReducerLimits
from tracker.core.model import FINAL_STATUSES, to_json
from tracker.core.reducer import Reducer
from tracker.read.store import IndexReader
from tracker.shell.capture import Record, capture_files
from tracker.shell.capture import interleave as round_robin
from tracker.shell.index import ExperimentIndex
from tracker.shell.reducer_state import restore

Event = dict[str, Any]
HOUR_US = 3_600 * 1_000_000


def sink_state(order: Sequence[Event], limits: ReducerLimits, every: int = 0,
               cuts: Sequence[int] = ()) -> tuple[dict[str, Any], list[str]]:
    """The last history of each run a sink receives (flushing every ``every`` records, 0: at the end only, and
    continuing from a snapshot at each of ``cuts``), and the runs retired, in order."""
    red = Reducer(limits)
    last: dict[str, Any] = {}
    retired: list[str] = []

    def flush() -> None:
        out = red.flush()
        last.update((h.run.run_id, to_json(h)) for h in out.histories)
        retired.extend(out.retired)

    for n, ev in enumerate(order, start=1):
        red.apply(ev, f"law:{n}")
        if every and n % every == 0:
            flush()
        if n in cuts:
            red = Reducer.restore(red.snapshot(), limits)
    flush()
    return last, retired


def by_creation(cluster_streams: dict[str, list[Event]], seed: int) -> list[Event]:
    """An arrival order close to a live watch: each object's records in their order, objects by creation."""
    seqs = by_object(cluster_streams)
    order = interleave(seqs, random.Random(seed))

    def created(ev: Event) -> str:
        return str(ev.get("object", {}).get("metadata", {}).get("creationTimestamp") or "")
    return sorted(order, key=created)


@law_settings(80)
@given(plans(), seeds, st.sampled_from([0, 60 * 1_000_000, HOUR_US]), st.integers(0, 7), st.integers(0, 1 << 16))
def test_retirement_does_not_depend_on_flushes_or_on_where_the_stream_is_cut(
        plan: Any, seed: int, grace: int, every: int, cut_seed: int) -> None:
    cluster = generate_cluster(plan)
    order = interleave(by_object(cluster.streams), random.Random(seed))
    limits = ReducerLimits(retire_after_us=grace)
    once = sink_state(order, limits)
    rng = random.Random(cut_seed)
    cuts = sorted(rng.sample(range(1, len(order) + 1), min(3, len(order))))
    assert sink_state(order, limits, every=every, cuts=cuts) == once


@law_settings(60)
@given(plans(), seeds)
def test_with_no_grace_finished_runs_are_retired_and_their_histories_stay_what_they_were(
        plan: Any, seed: int) -> None:
    """Records in creation order, a run freed as soon as it is final and the watermark moves: every run that
    the cluster ends is retired, and each history the sink holds is the one a reducer that never retires has,
    except that records after its retirement (a later deletion) are not folded into it."""
    cluster = generate_cluster(plan)
    order = by_creation(cluster.streams, seed)
    keep, none_retired = sink_state(order, ReducerLimits())
    assert none_retired == []
    got, retired = sink_state(order, ReducerLimits(retire_after_us=0))
    assert set(got) == set(keep)
    assert len(retired) == len(set(retired))
    for run_id in retired:
        assert got[run_id]["run"]["status"] in {s.value for s in FINAL_STATUSES}, run_id
    for run_id in set(keep) - set(retired):
        assert got[run_id] == keep[run_id], run_id


def test_a_live_run_quiet_for_the_grace_keeps_its_facts_but_not_its_derivation() -> None:
    """A live run (or one a reactivation may reopen) quiet for the grace is not retired; its derivation is freed
    meanwhile, and what a reader or a sink gets of it stays what a reducer that never frees anything gives, also when
    a later record touches it again (derived again from its facts first, ``Reducer._revive``: its update carries only
    what changed)."""
    records = [rec.value for rec in round_robin(capture_files([DEMO_CAPTURES])) if isinstance(rec, Record)]
    keep, _ = sink_state(records, ReducerLimits())
    freeing = Reducer(ReducerLimits(retire_after_us=60 * 1_000_000))  # a flush after each record: none dirty when due
    revived: set[str] = set()
    last: dict[str, Any] = {}
    quiet_seen: set[str] = set()
    retired: set[str] = set()
    for n, ev in enumerate(records, start=1):
        freed = set(freeing._freed_final)  # the runs whose derivation is freed, untouched since
        freeing.apply(ev, f"demo:{n}")
        revived |= {k for k in freed if k in freeing.derivations}
        quiet_seen |= {k for k in freeing.runs if k not in freeing.derivations and k not in freeing.dirty}
        out = freeing.flush()
        assert not any(u.full and u.run_id in last for u in out.updates), "a run written before goes out whole"
        last.update((h.run.run_id, to_json(h)) for h in out.histories)
        retired.update(out.retired)
    live_quiet = {k for k in quiet_seen if k in freeing.runs}
    assert live_quiet, "some demo run goes quiet while live (pending for quota, unschedulable, deactivated)"
    assert revived, "a record touched a run whose derivation was freed"
    # (a retired run misses the records after its retirement, as retiring does: test_with_no_grace_... above)
    assert {k: h for k, h in last.items() if k not in retired} == {k: h for k, h in keep.items() if k not in retired}
    assert set(last) == set(keep)
    never = Reducer()
    for n, ev in enumerate(records, start=1):
        never.apply(ev, f"demo:{n}")
    assert {k: freeing.history(k) for k in live_quiet} == {k: never.history(k) for k in live_quiet}


def test_a_grace_longer_than_the_capture_retires_nothing_and_changes_nothing() -> None:
    records = [rec.value for rec in round_robin(capture_files([DEMO_CAPTURES])) if isinstance(rec, Record)]
    keep, _ = sink_state(records, ReducerLimits())
    got, retired = sink_state(records, ReducerLimits(retire_after_us=24 * HOUR_US))
    assert retired == [] and got == keep


# ------------------------------------------------------------------------------------------ through the index


def demo_stream() -> list[Record]:
    """The bundled capture as `tracker serve --from-capture DIR` reads it (its files round-robin)."""
    return [rec for rec in round_robin(capture_files([DEMO_CAPTURES])) if isinstance(rec, Record)]


def serve_into(index_path: Path, records: Sequence[Record], limits: ReducerLimits) -> Reducer:
    from tracker.runtime.pipeline import run_pipeline

    with ExperimentIndex(index_path) as index:
        reducer = restore(index, limits)
        asyncio.run(run_pipeline(list(records), reducer, sinks=[], store=index))
    return reducer


def retired_rows(index_path: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(index_path) as conn:
        return conn.execute("SELECT run_id, retired_seq FROM reducer_runs WHERE retired_seq IS NOT NULL "
                            "ORDER BY retired_seq").fetchall()


@pytest.mark.parametrize("pieces", [2, 5, 17])
def test_the_embedded_pipeline_retires_the_same_runs_however_its_input_is_cut(tmp_path: Path, pieces: int) -> None:
    limits = ReducerLimits(retire_after_us=HOUR_US)
    records = demo_stream()
    whole = tmp_path / "whole.sqlite"
    serve_into(whole, records, limits)
    retired = retired_rows(whole)
    assert len(retired) >= 3, "the demo spans hours: runs that ended early are retired"
    # the histories are those of a pipeline that never retires
    keep = tmp_path / "keep.sqlite"
    serve_into(keep, records, ReducerLimits())
    assert contents(whole) == contents(keep)
    assert retired_rows(keep) == []

    pieced = tmp_path / "pieced.sqlite"
    for piece in cut(records, pieces, random.Random(pieces)):  # type: ignore[arg-type]
        serve_into(pieced, piece, limits)  # type: ignore[arg-type]
    assert contents(pieced) == contents(whole)
    assert retired_rows(pieced) == retired


def test_a_restart_remembers_only_the_latest_retirements_and_the_index_the_rest(tmp_path: Path) -> None:
    records = demo_stream()
    index = tmp_path / "index.sqlite"
    serve_into(index, records, ReducerLimits(retire_after_us=HOUR_US, max_retired=2))
    retired = retired_rows(index)
    assert len(retired) >= 3
    with ExperimentIndex(index) as ix:
        red = restore(ix, ReducerLimits(retire_after_us=HOUR_US, max_retired=2))
    assert list(red.retired) == [run_id for run_id, _seq in retired[-2:]]
    assert not set(red.runs) & {run_id for run_id, _ in retired}


@pytest.mark.parametrize("flushes", [1, 3])
def test_runs_retired_and_forgotten_between_two_flushes_keep_their_markers(tmp_path: Path, flushes: int) -> None:
    """However the flushes fall (one flush for the whole stream, or a few), every retired run's marker is in the
    index, those the reducer forgot (``max_retired``) included: none of its histories is held without state, so a
    later replay continues from it instead of refusing it. (A run retired and forgotten between two flushes used to
    have its state row deleted; which runs that hit depended on where the flushes fell.)"""
    from tracker.shell.reducer_state import StateTracker

    records = demo_stream()
    index = tmp_path / "index.sqlite"
    with ExperimentIndex(index) as ix:
        red = restore(ix, ReducerLimits(retire_after_us=HOUR_US, max_retired=2))
        state = StateTracker(red)
        step = -(-len(records) // flushes)
        for start in range(0, len(records), step):
            for rec in records[start:start + step]:
                red.apply(rec.value, rec.source)
            out = red.flush()
            ix.write(out.updates, state=state.capture([*(u.run_id for u in out.updates), *out.retired],
                                                      out.forgotten_seq))
        assert ix.runs_without_state() == []
    retired = retired_rows(index)
    assert len(retired) >= 3 and [seq for _run, seq in retired] == list(range(1, len(retired) + 1))
    with ExperimentIndex(index) as ix:
        again = restore(ix, ReducerLimits(retire_after_us=HOUR_US, max_retired=2))
    assert list(again.retired) == [run_id for run_id, _seq in retired[-2:]]


def test_records_of_a_forgotten_run_never_replace_its_history(tmp_path: Path) -> None:
    """The reducer forgot the retirement (``max_retired``); the index did not: a late record of the run starts a
    partial history in memory, which the index refuses to write over the whole one."""
    records = demo_stream()
    index = tmp_path / "index.sqlite"
    serve_into(index, records, ReducerLimits(retire_after_us=HOUR_US, max_retired=1))

    def roots(run_id: str) -> list[Record]:
        return [rec for rec in records if rec.value.get("object", {}).get("kind") in ("Job", "RayJob")
                and rec.value["object"]["metadata"].get("labels", {}).get("taugrid.io/run-id") == run_id]

    # the first retired run (and forgotten: max_retired=1) whose Job or RayJob carries its run id
    first = next(run_id for run_id, _seq in retired_rows(index)[:-1] if roots(run_id))
    before = contents(index)
    with IndexReader(index) as ix:
        h = stored(ix).history(first)
    assert h is not None and h.run.status in FINAL_STATUSES
    late = roots(first)
    with ExperimentIndex(index) as ix:
        red = restore(ix, ReducerLimits(retire_after_us=HOUR_US, max_retired=1))
        assert first not in red.retired
        from tracker.runtime.pipeline import run_pipeline

        asyncio.run(run_pipeline(late[-1:], red, sinks=[], store=ix))
        assert ix.refused_after_retirement == 1
    assert contents(index) == before


def test_a_malformed_record_or_a_second_root_of_a_retired_run_is_still_a_dead_letter() -> None:
    records = [rec.value for rec in demo_stream()]
    red = Reducer(ReducerLimits(retire_after_us=0))
    for n, rec in enumerate(records):
        red.apply(rec, f"demo:{n}")
    out = red.flush()
    assert out.retired
    run_id = out.retired[0]
    root = next(rec for rec in records if rec.get("object", {}).get("kind") in ("Job", "RayJob")
                and rec["object"]["metadata"].get("labels", {}).get("taugrid.io/run-id") == run_id)
    broken = {"type": "MODIFIED", "object": {**root["object"], "status": {"conditions": "not a list"}}}
    other = builders.deep_copy(root) if hasattr(builders, "deep_copy") else __import__("copy").deepcopy(root)
    other["object"]["metadata"]["uid"] = "00000000-0000-4000-8000-000000000000"
    red.apply(broken, "late:1")
    red.apply(other, "late:2")
    letters = red.flush().dead_letters
    assert [(d.source, d.reason) for d in letters] == [
        ("late:1", f"malformed {root['object']['kind']}"), ("late:2", "run id taken by another root")]
    assert run_id in red.retired and run_id not in red.runs


def test_replay_retires_only_when_asked_and_then_writes_the_same_histories(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from tracker.cli import main

    plain, retiring = tmp_path / "plain.sqlite", tmp_path / "retiring.sqlite"
    assert main(["replay", str(DEMO_CAPTURES), "--index", str(plain)]) == 0
    assert retired_rows(plain) == []  # off by default: a capture may be replayed one stream at a time
    assert main(["replay", str(DEMO_CAPTURES), "--index", str(retiring), "--retire-after", "1h"]) == 0
    assert len(retired_rows(retiring)) >= 3
    assert contents(retiring) == contents(plain)
    capsys.readouterr()
    assert main(["replay", str(DEMO_CAPTURES), "--index", str(retiring), "--retire-after", "soon"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not a duration" in err
