"""A finished run's facts packed (tracker.core.run_table): what they give back, when the reducer packs them, and that a
reducer that packs them flushes and snapshots what one that keeps them does."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.lifecycles import generate_cluster, generate_stream
from tests.core.test_reducer_laws import law_settings, plans, seeds
from tests.support.laws import by_object, interleave
from tracker.core.derive import derive
from tracker.core.facts import RunFacts
from tracker.core.limits import ReducerLimits
from tracker.core.model import FINAL_STATUSES
from tracker.core.reducer import Flushed, Reducer
from tracker.core.run_table import LEARN_MAX, LEARN_MIN, RunTable, pack, unpack


@law_settings(40)
@given(plans(), seeds, st.sampled_from([None, set(), {29786951, 29786960}]))
def test_packed_facts_give_back_the_same_facts_and_history(plan: Any, seed: int, minutes: set[int] | None) -> None:
    """Every run of a generated cluster, packed at any point of its records, unpacks to the same snapshot values, the
    same history, and the same progress minutes noted as changed."""
    order = interleave(by_object(generate_cluster(plan).streams), random.Random(seed))
    red = Reducer()
    for n, rec in enumerate(order):
        red.apply(rec, "law")
        if n % 7 == 0 or n == len(order) - 1:
            for r in red.runs.values():
                r.minutes_changed = None if minutes is None else set(minutes)
                for zdict in (None, _DICTIONARY):
                    back = unpack(pack(r, zdict), zdict)
                    assert back.to_json() == r.to_json()
                    assert derive(back) == derive(r)
                    assert back.minutes_changed == r.minutes_changed
                    assert back is not r and back.labels is not r.labels  # nothing shared with the packed facts


def _dictionary() -> bytes:
    """A dictionary as a table learns one: the packed facts of a run of another cluster."""
    red = Reducer()
    for rec in generate_stream(3, 11):
        red.apply(rec, "t")
    table = RunTable(red.runs.values())
    for run_id in list(table):
        table.pack(run_id)
    assert table.zdict is not None
    return table.zdict


_DICTIONARY = _dictionary()


def _counted(table: RunTable) -> bool:
    """Whether the table's count of packed runs and bytes is what it holds."""
    packed = [v for v in table._runs.values() if isinstance(v, bytes)]
    return table.packed_size() == (len(packed), sum(map(len, packed)))


def test_run_table_reads_unpack_and_packing_keeps_the_order() -> None:
    red = Reducer()
    for rec in generate_stream(6, 3):
        red.apply(rec, "t")
    red.flush()
    table = RunTable(red.runs.values())
    ids = list(table)
    docs = table.docs()
    for run_id in ids[::2]:
        table.pack(run_id)
        table.pack(run_id)  # packing a packed run leaves it as it is
    assert [table.packed(k) for k in ids] == [i % 2 == 0 for i in range(len(ids))]
    assert _counted(table) and table.packed_size()[0] == len(ids[::2])
    assert list(table) == ids and len(table) == len(ids) and ids[0] in table and "nope" not in table
    assert table.docs() == docs  # a packed run's values read without unpacking it
    assert table.packed(ids[0])
    assert table[ids[0]].to_json() == docs[0]  # a read unpacks it, from now on
    assert not table.packed(ids[0]) and table.take_unpacked() == {ids[0]} and table.take_unpacked() == set()
    assert _counted(table)
    kept = RunTable(RunFacts.from_json(d) for d in docs)
    for run_id in ids:
        kept.pack(run_id)
    assert table == kept and table != {}  # a packed run compares by its snapshot values
    assert [table.packed(k) for k in ids][1:] == [i % 2 == 0 for i in range(1, len(ids))]  # comparing unpacked none
    changed = kept[ids[1]]
    changed.labels["changed"] = "yes"
    assert table != kept
    live = list(red.runs.values())
    assert RunTable(live) == {r.run_id: r for r in live}
    assert live[0].shape_seq and RunTable([unpack(pack(live[0]))]) != RunTable(live[:1])  # two unpacked: as RunFacts
    gone = table.pop(ids[2])
    assert gone is not None and gone.to_json() == docs[2] and ids[2] not in table and _counted(table)
    table[ids[4]] = RunFacts.from_json(docs[4])  # a packed run replaced by facts
    assert not table.packed(ids[4]) and _counted(table)
    table.take_unpacked()
    table.pack(ids[5])
    assert table.packed_size()[0] == 1
    table.discard(ids[5])  # packed: dropped without unpacking it
    table.discard(ids[3])
    table.discard("nope")
    assert ids[5] not in table and ids[3] not in table and table.packed_size() == (0, 0) and _counted(table)
    assert table.take_unpacked() == set()
    assert table.pop("nope") is None and table.get("nope") is None
    table.pack("nope")
    assert "nope" not in table


def test_a_table_learns_its_dictionary_from_the_first_run_it_packs_of_a_usual_size() -> None:
    """Runs packed before the table learned a dictionary are packed without one, and unpack the same after; the
    dictionary is a packed run's marshalled facts of ``LEARN_MIN`` to ``LEARN_MAX`` bytes, and packs the others in
    about half the bytes (the generator's runs: ~0.65 KiB against ~1.4 KiB)."""
    red = Reducer()
    for rec in generate_stream(40, 5):
        red.apply(rec, "t")
    red.flush()
    runs = list(red.runs.values())
    small = RunFacts(run_id="small")  # facts of a few hundred bytes: too few of what runs repeat to learn from
    table = RunTable([small, *runs])
    docs = table.docs()
    table.pack("small")
    assert table.zdict is None and table.packed("small")
    for r in runs:
        table.pack(r.run_id)
    dictionary = table.zdict
    assert dictionary is not None and LEARN_MIN <= len(dictionary) <= LEARN_MAX
    assert table.docs() == docs
    plain = [len(pack(r)) for r in runs[1:]]
    preset = [len(pack(r, dictionary)) for r in runs[1:]]
    assert sum(preset) < 0.7 * sum(plain)
    other = RunTable(RunFacts.from_json(d) for d in reversed(docs))  # another order: another dictionary
    for d in docs:
        other.pack(d["run_id"])
    assert other.zdict != dictionary and other == RunTable(RunFacts.from_json(d) for d in docs) and table == other
    assert [table[d["run_id"]].to_json() for d in docs] == docs  # each unpacked with its own dictionary
    with pytest.raises(ValueError, match="without one"):
        unpack(pack(runs[0], dictionary))


def _snapshots(red: Reducer, out: Flushed) -> dict[str, Any]:
    """The run-state records of a flush, as the Kafka reducer writes them (``tracker.runtime.reduce``)."""
    return {k: red.snapshot_run(k, points_apart=True) for k in [*(u.run_id for u in out.updates), *out.retired]}


def _late_deletion(rec: dict[str, Any]) -> dict[str, Any]:
    """The pod of ``rec`` deleted (as a Job's TTL deletes its pods, after the run finished)."""
    late = copy.deepcopy(rec)
    late["type"] = "DELETED"
    meta = late["object"]["metadata"]
    meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
    return late


def test_a_reducer_that_packs_finished_runs_flushes_and_snapshots_what_one_keeping_them_does() -> None:
    """Generated runs folded with a flush every 300 records: a finished narrow run is packed from the flush after the
    one that freed its derivation; a late record (its pod deleted) unpacks it, its update carries only what changed, and
    the next flush but one packs it again. Flush by flush, the updates and the run-state snapshots are the ones of a
    reducer that keeps every run's facts and derivation."""
    records = list(generate_stream(120, 5))
    packing = Reducer(ReducerLimits())
    keeping = Reducer(ReducerLimits(finished_derivation_rows=-1))  # frees no derivation, so packs nothing

    def flush() -> list[str]:
        a, b = packing.flush(), keeping.flush()
        assert a.updates == b.updates
        assert _snapshots(packing, a) == _snapshots(keeping, b)
        assert _counted(packing.runs)
        return [u.run_id for u in a.updates]

    most_packed = 0
    for n, rec in enumerate(records, 1):
        for red in (packing, keeping):
            red.apply(rec, "t")
        if n % 300 == 0:
            flush()
            most_packed = max(most_packed, sum(packing.runs.packed(k) for k in packing.runs))
    flush()
    flush()  # packs the runs the one before freed
    packed = [k for k in packing.runs if packing.runs.packed(k)]
    assert most_packed > 0 and len(packed) > len(packing.runs) // 2
    assert not any(keeping.runs.packed(k) for k in keeping.runs)

    last_pod: dict[str, dict[str, Any]] = {}
    for rec in records:
        obj = rec.get("object")
        if isinstance(obj, dict) and obj.get("kind") == "Pod":
            run_id = packing.corr.owner_run.get(obj["metadata"]["ownerReferences"][0]["uid"])
            if run_id is not None:
                last_pod[run_id] = rec
    late = [last_pod[k] for k in packed if k in last_pod][:10]
    assert late
    for rec in late:
        for red in (packing, keeping):
            red.apply(_late_deletion(rec), "late")
    touched = {k for k in packed if not packing.runs.packed(k)}
    assert len(touched) == len(late)  # each late record unpacked its run, and only its run
    out = packing.flush()
    assert {u.run_id for u in out.updates} == touched
    assert not any(u.full for u in out.updates)  # only what changed: the deleted pod's row
    assert out.updates == keeping.flush().updates
    packing.flush()
    assert all(packing.runs.packed(k) for k in touched) and _counted(packing.runs)  # finished still: packed again
    assert packing.snapshot()["runs"] == keeping.snapshot()["runs"]
    assert {k: packing.history(k) for k in packing.runs} == {k: keeping.history(k) for k in keeping.runs}


def test_restored_finished_runs_are_packed_once_read_and_their_late_records_go_out_as_a_keeping_reducers() -> None:
    """A restored reducer's finished narrow runs have no derivation: read once (as a restored partition's policy reads
    every run), their facts are packed at the next flush. A late record unpacks one; its update is the one of a reducer
    that keeps every run's facts and derivation (``full``, as any restored run's first update), and after it the run
    is freed and packed as any finished run."""
    records = list(generate_stream(60, 9))
    first = Reducer()
    for rec in records:
        first.apply(rec, "t")
    first.flush()
    snap = first.snapshot()
    packing = Reducer.restore(snap)
    keeping = Reducer.restore(snap, ReducerLimits(finished_derivation_rows=-1))
    finished = {k for k in keeping.runs if (h := keeping.current(k)) is not None and h.run.status in FINAL_STATUSES}
    for k in packing.runs:
        packing.current(k)
    assert not any(packing.runs.packed(k) for k in packing.runs)  # the read left them as they were
    assert packing.flush().updates == keeping.flush().updates == []
    packed = {k for k in packing.runs if packing.runs.packed(k)}
    assert packed and packed <= finished and len(packed) > len(finished) // 2
    assert not set(packing.derivations) & packed

    pods: dict[str, dict[str, Any]] = {}
    for rec in records:
        obj = rec.get("object")
        if isinstance(obj, dict) and obj.get("kind") == "Pod":
            run_id = packing.corr.owner_run.get(obj["metadata"]["ownerReferences"][0]["uid"])
            if run_id in packed:
                pods[run_id] = rec
    late = sorted(pods)[:6]
    assert late
    for step in range(2):  # the deletion, then the deletion seen again with a newer resourceVersion
        for run_id in late:
            rec = pods[run_id] = _late_deletion(pods[run_id])
            for red in (packing, keeping):
                red.apply(rec, "late")
        a, b = packing.flush(), keeping.flush()
        assert a.updates == b.updates and {u.run_id for u in a.updates} <= set(late)
        assert all(u.full for u in a.updates) if step == 0 else not any(u.full for u in a.updates)
        packing.flush()
        keeping.flush()
        assert all(packing.runs.packed(k) for k in late)
    assert {k: packing.history(k) for k in packing.runs} == {k: keeping.history(k) for k in keeping.runs}
