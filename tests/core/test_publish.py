"""The reducer process's policy without Kafka (tracker.core.publish): what a transaction publishes, the watermark,
stuck alerts, retirement and the run-state ``shell`` field, on hand-made histories and on generated clusters."""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.lifecycles import generate_stream
from tests.core.test_nodes import node
from tests.core.test_queues import cq, lq, position
from tests.core.test_reducer_laws import law_settings
from tests.support.histories import stored
from tracker.core import entries
from tracker.core.model import (
    HistoryUpdate,
    MetricPoint,
    MetricPointsRecord,
    Phase,
    PodPlacement,
    RunHistory,
    RunRecord,
    Status,
    Transition,
    adapter,
)
from tracker.core.nodes import NodeBook
from tracker.core.publish import (
    HISTORY,
    NODE,
    POD,
    POINT,
    POINTS,
    POSITION,
    QUEUE,
    Limits,
    PartitionPolicy,
    RunShell,
    advance,
    content_hash,
    node_value,
    position_value,
    queue_value,
    record_key,
)
from tracker.core.queues import QueueBook, QueuePosition, QueueState
from tracker.core.reducer import Flushed, Reducer
from tracker.core.timefmt import ts
from tracker.core.wire import point_key

T0 = datetime.fromisoformat("2026-08-20T10:00:00+00:00")
MIN = 60_000_000  # a minute in microseconds
LIMITS = Limits(max_value_bytes=1 << 20, transitions_topic="transitions",
                thresholds_s={Phase.ADMISSION: 1_800.0, Phase.SCHEDULING: 600.0, Phase.RUNTIME: 600.0},
                clock="event")


def us(at: datetime) -> int:
    value = ts(at)
    assert value is not None
    return value


def history(run_id: str, *phases: tuple[Phase, int], status: Status = Status.PENDING) -> RunHistory:
    """A run whose transitions enter ``phases`` (phase, minutes after T0), in that order; its phase is the last."""
    transitions = [Transition(run_id=run_id, attempt=1, phase=p, at=T0 + timedelta(minutes=m), reason="R",
                              source=f"Job/ns/{run_id}") for p, m in phases]
    run = RunRecord(run_id=run_id, kind="Job", namespace="ns", name=run_id, uid=None, project=None, workspace=None,
                    target=None, queue="q", cluster_queue=None, status=status, reason="R",
                    phase=phases[-1][0] if phases else Phase.ADMISSION, attempts=1, retries=0, evictions=0,
                    created_at=T0, queued_at=T0, admitted_at=None, started_at=None, finished_at=None,
                    admission_wait_s=None)
    return RunHistory(run=run, transitions=transitions, attempts=[], metrics=[], resume_links=[])


def batch(*histories: RunHistory, retired: tuple[str, ...] = ()) -> Flushed:
    return Flushed(updates=[HistoryUpdate(run_id=h.run.run_id, history=h) for h in histories], retired=list(retired))


def dump(h: RunHistory) -> bytes:
    return adapter(RunHistory).dump_json(h)


# ------------------------------------------------------------------------------------------ publishing


def test_a_history_is_published_once_per_content() -> None:
    policy = PartitionPolicy()
    h = history("a", (Phase.ADMISSION, 0))
    first = policy.decide(batch(h), LIMITS, now_us=None)
    [published] = first.publish
    assert published.run_id == "a" and published.value == dump(h)
    assert published.digest == content_hash(published.value) == hashlib.sha256(published.value).hexdigest()
    assert first.touched == ["a"] and first.phases == Counter({"Admission": 1})
    again = policy.decide(batch(h), LIMITS, now_us=None)  # folded again, nothing changed: nothing to publish
    assert again.publish == [] and not again.phases and again.touched == ["a"]
    moved = history("a", (Phase.ADMISSION, 0), (Phase.SCHEDULING, 5))
    [next_one] = policy.decide(batch(moved), LIMITS, now_us=None).publish
    assert next_one.value == dump(moved) and policy.runs["a"].content_hash == next_one.digest


def test_a_history_with_checkpoints_and_ledger_round_trips_through_its_records(tmp_path: Path) -> None:
    """The goodput ledger (history/v4) on the transitions topic: the history record carries the run's ledger fields,
    checkpoints and ledger spans; what `tracker sink index` decodes from the run's records and writes is the complete
    history again."""
    from tests.index.test_index import resumed_with_metrics
    from tracker.shell.index import ExperimentIndex
    from tracker.shell.transitions import combine, decode

    h = resumed_with_metrics()
    assert h.checkpoints and h.ledger and h.run.ledger_gpu_hours_by and h.attempts[0].ledger_wall_s_by
    decided = PartitionPolicy().decide(Flushed(updates=[HistoryUpdate.of(h)], retired=[]), LIMITS, now_us=None)
    kinds = [p.kind for p in decided.publish]
    assert h.metric_points and kinds == [HISTORY, *[POINT] * len(h.metric_points), POD]
    record = adapter(RunHistory).validate_json(decided.publish[0].value or b"")
    assert record == replace(h, metric_points=None, pods=None)
    updates = [decode(p.key.encode(), p.value, [("kind", p.kind.encode())]) for p in decided.publish]
    with ExperimentIndex(tmp_path / "index.sqlite") as index:
        index.write(combine(updates))
        assert stored(index).history(h.run.run_id) == h
        assert index.write(combine(updates)) == 0


def test_an_older_trackers_points_record_is_read_whole_and_replaced_by_point_records(tmp_path: Path) -> None:
    """A tracker before per-point records published a run's every point as one record (key ``<run id>/points``,
    kind ``points``). A sink reads it as every point of the run; a reducer restored from that tracker's run-state
    publishes the run's points one by one at its first update, then that record's tombstone, which a sink reads as
    nothing. The index ends with the run's points either way."""
    from tests.index.test_index import resumed_with_metrics
    from tracker.shell.index import ExperimentIndex
    from tracker.shell.transitions import combine, decode

    h = resumed_with_metrics()
    run_id, pts = h.run.run_id, list(h.metric_points or ())
    assert len(pts) >= 2
    old = adapter(MetricPointsRecord).dump_json(MetricPointsRecord(run_id=run_id, metric_points=pts))
    whole = decode(record_key(run_id, POINTS).encode(), old, [("kind", POINTS.encode())])
    assert whole.points_full and whole.points == pts
    policy = PartitionPolicy()
    policy.restore_shell(run_id, {"watermark_us": 0, "hash": None, "points_hash": content_hash(old)}, retired=False)
    decided = policy.decide(Flushed(updates=[HistoryUpdate.of(h)], retired=[]), LIMITS, now_us=None)
    assert [p.kind for p in decided.publish] == [HISTORY, *[POINT] * len(pts), POINTS, POD]
    tombstone = decided.publish[1 + len(pts)]
    assert (tombstone.key, tombstone.value) == (record_key(run_id, POINTS), None)
    assert policy.runs[run_id].points_hash is None and policy.shell_doc(run_id)["points_hash"] is None
    again = policy.decide(Flushed(updates=[HistoryUpdate.of(h)], retired=[]), LIMITS, now_us=None)
    assert POINTS not in [p.kind for p in again.publish], "the tombstone goes once"
    updates = [decode(p.key.encode(), p.value, [("kind", p.kind.encode())]) for p in decided.publish]
    assert updates[1 + len(pts)] == HistoryUpdate(run_id=run_id)
    with ExperimentIndex(tmp_path / "index.sqlite") as index:
        index.write(combine([HistoryUpdate.of(replace(h, metric_points=[*pts, replace(pts[0], step=10**9)])),
                             whole]))  # the older record drops a point it does not hold
        assert stored(index).history(run_id) == h
        index.write(combine(updates))
        assert stored(index).history(run_id) == h


def test_point_records_name_their_point_in_the_key_and_a_tombstone_removes_it() -> None:
    from tracker.shell.transitions import BadTransition, decode

    pt = MetricPoint(run_id="r1", metric="train/loss", step=7, value=0.5, at=T0)
    key = point_key("r1", "train/loss", 7)
    assert key == "r1/point/7/train/loss"
    headers = [("kind", POINT.encode())]
    assert decode(key.encode(), adapter(MetricPoint).dump_json(pt), headers) == HistoryUpdate(run_id="r1", points=[pt])
    assert decode(key.encode(), None, headers) == HistoryUpdate(run_id="r1", removed_points=(("train/loss", 7),))
    for bad_key in ("r1/point/x/train/loss", "r1/point/07/train/loss", "r1/point/7", "/point/7/m", "r1/pod/7/m"):
        with pytest.raises(BadTransition, match="point record's key"):
            decode(bad_key.encode(), None, headers)
    with pytest.raises(BadTransition, match="holds step 7"):
        decode(point_key("r1", "train/loss", 8).encode(), adapter(MetricPoint).dump_json(pt), headers)
    with pytest.raises(BadTransition, match="points record's key"):
        decode(b"r1/pointz", None, [("kind", POINTS.encode())])


def test_a_history_too_large_is_a_dead_letter_once_and_is_not_published() -> None:
    policy = PartitionPolicy()
    h = history("big", (Phase.ADMISSION, 0))
    size = len(dump(h))
    small = Limits(max_value_bytes=size - 1, transitions_topic="tt", thresholds_s={}, clock="event")
    decided = policy.decide(batch(h), small, now_us=None)
    assert decided.publish == [] and decided.oversized == [("big", size)]
    [letter] = decided.dead_letters
    assert (letter.source, letter.reason, letter.detail) == ("tt:big", "history record too large to publish",
                                                             f"{size} bytes > {size - 1}")
    assert decided.phases == Counter({"Admission": 1}) and decided.touched == ["big"]
    assert policy.decide(batch(h), small, now_us=None).dead_letters == []  # not retried at every batch


def test_the_folds_dead_letters_and_forgotten_runs_pass_through() -> None:
    flushed = Flushed(forgotten=["old"])
    flushed.dead_letters.extend(Reducer().flush().dead_letters)
    decided = PartitionPolicy().decide(flushed, LIMITS, now_us=None)
    assert decided.forgotten == ["old"] and decided.publish == [] and decided.touched == []


# ------------------------------------------------------------------------------------------ watermark


def test_the_watermark_advances_with_the_latest_transition_and_holds_otherwise() -> None:
    policy = PartitionPolicy()
    policy.decide(batch(history("a", (Phase.ADMISSION, 0), (Phase.SCHEDULING, 30))), LIMITS, now_us=None)
    assert policy.watermark_us == us(T0) + 30 * MIN
    policy.decide(batch(history("b", (Phase.ADMISSION, 10))), LIMITS, now_us=None)  # older: held
    assert policy.watermark_us == us(T0) + 30 * MIN
    assert advance(7, history("c")) == 7  # no transitions: held
    assert advance(0, history("d", (Phase.ADMISSION, 45), (Phase.SCHEDULING, 40))) == us(T0) + 45 * MIN


# ------------------------------------------------------------------------------------------ stuck runs


def test_a_stuck_run_is_alerted_once_when_its_threshold_passes_on_the_wall_clock() -> None:
    policy = PartitionPolicy()
    h = history("a", (Phase.ADMISSION, 0))
    assert policy.decide(batch(h), LIMITS, now_us=us(T0) + 29 * MIN).alerts == []
    assert policy.due_alerts(us(T0) + 29 * MIN, LIMITS) == []
    [alert] = policy.due_alerts(us(T0) + 30 * MIN, LIMITS)
    assert (alert.stuck.run_id, alert.stuck.phase, alert.record.age_s) == ("a", Phase.ADMISSION, 1_800.0)
    assert policy.runs["a"].alerted_pairs() == [(1, Phase.ADMISSION)]
    assert policy.due_alerts(us(T0) + 90 * MIN, LIMITS) == []  # once per (run, attempt, phase)
    later = history("a", (Phase.ADMISSION, 0), (Phase.SCHEDULING, 31))  # a new phase: alerted again when due
    decided = policy.decide(batch(later), LIMITS, now_us=us(T0) + 41 * MIN)
    assert [(a.stuck.phase, a.record.age_s) for a in decided.alerts] == [(Phase.SCHEDULING, 600.0)]
    assert decided.touched == ["a"]  # its run-state record (alerts remembered) is written once


def test_on_the_event_clock_another_runs_progress_makes_a_run_stuck() -> None:
    policy = PartitionPolicy()
    assert policy.decide(batch(history("a", (Phase.ADMISSION, 0))), LIMITS, now_us=None).alerts == []
    decided = policy.decide(batch(history("b", (Phase.ADMISSION, 35))), LIMITS, now_us=None)
    assert [a.stuck.run_id for a in decided.alerts] == ["a"] and decided.touched == ["b", "a"]
    running = history("b", (Phase.ADMISSION, 35), (Phase.PROGRESS, 36), status=Status.RUNNING)
    policy.decide(batch(running), LIMITS, now_us=None)
    assert set(policy.stuck) == {"a"}  # b's application started: no longer a candidate


# ------------------------------------------------------------------------------------------ retirement


def test_retired_runs_leave_the_state_and_are_counted_by_their_last_status() -> None:
    policy = PartitionPolicy()
    policy.decide(batch(history("a", (Phase.ADMISSION, 0), status=Status.FAILED), history("p", (Phase.ADMISSION, 0))),
                  LIMITS, now_us=None)
    decided = policy.decide(batch(retired=("a", "p", "unknown")), LIMITS, now_us=None)
    assert decided.finished == Counter({"failed": 1, "pending": 1, "succeeded": 1})
    assert decided.touched == ["a", "p", "unknown"] and decided.publish == []
    assert policy.runs == {} and policy.stuck == {}


# ------------------------------------------------------------------------------------------ run-state


def test_the_shell_field_reads_back_as_it_was_written() -> None:
    policy = PartitionPolicy()
    h = history("a", (Phase.ADMISSION, 0), (Phase.SCHEDULING, 1))
    policy.decide(batch(h), LIMITS, now_us=us(T0) + 60 * MIN)
    docs = {run_id: policy.shell_doc(run_id) for run_id in policy.runs}
    assert docs["a"]["alerted_stuck"] == [[1, "Scheduling"]] and docs["a"]["entries"] == list(entries.phase_entries(h))
    restored = PartitionPolicy()
    for run_id, doc in docs.items():
        restored.restore_shell(run_id, doc, retired=False)
    restored.restore_shell("gone", {"watermark_us": 5}, retired=True)
    restored.restored([h])
    assert restored.runs == policy.runs and restored.stuck == policy.stuck
    assert restored.watermark_us == policy.watermark_us
    assert PartitionPolicy().shell_doc("nobody") == {"watermark_us": 0}


def test_an_older_shell_without_phase_entries_counts_them_as_counted() -> None:
    policy = PartitionPolicy()
    policy.restore_shell("a", {"watermark_us": 0, "hash": "x", "alerted": [1]}, retired=False)
    h = history("a", (Phase.ADMISSION, 0), (Phase.SCHEDULING, 1))
    policy.restored([h])
    # and its pending seconds (none ended in this history) as counted too
    assert policy.runs["a"] == RunShell("x", None, entries.phase_entries(h), [1], [], Status.PENDING, {})


# ------------------------------------------------------------------------------------------ laws


def flushes(seed: int, cuts: list[int]) -> tuple[list[Flushed], dict[str, RunHistory]]:
    """A generated cluster's records folded in batches cut at ``cuts``: each batch's output, and the final
    history of every run."""
    records = list(generate_stream(6, seed))
    reducer = Reducer()
    out = []
    bounds = sorted({0, len(records), *(c % (len(records) + 1) for c in cuts)})
    for start, end in pairwise(bounds):
        for rec in records[start:end]:
            reducer.apply(rec, "law")
        out.append(reducer.flush())
    final = {run_id: h for run_id in reducer.runs if (h := reducer.history(run_id)) is not None}
    return out, final


@law_settings(25)
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_the_same_output_twice_publishes_once(seed: int, cuts: list[int]) -> None:
    """Deciding every batch's output twice (a redelivered fold) publishes, counts and alerts exactly what
    deciding it once does; the last publication of a run is its final history; the watermark never goes back."""
    batches, final = flushes(seed, cuts)
    once, twice = PartitionPolicy(), PartitionPolicy()
    published: dict[str, bytes] = {}
    counted_once: Counter[str] = Counter()
    counted_twice: Counter[str] = Counter()
    for flushed in batches:
        before = once.watermark_us
        a = once.decide(flushed, LIMITS, now_us=None)
        b = twice.decide(flushed, LIMITS, now_us=None)
        again = twice.decide(flushed, LIMITS, now_us=None)
        # the history, published by content, once; the pods and the metric points that changed go as they come
        # (the derivation says which changed: a redelivered batch sends them again, as upserts)
        parts = (POD, POINT)
        assert [p for p in again.publish if p.kind not in parts] == [] and not again.phases and again.alerts == []
        assert [p for p in again.publish if p.kind in parts] == [p for p in a.publish if p.kind in parts]
        assert b.publish == a.publish and [x.record for x in b.alerts] == [x.record for x in a.alerts]
        assert once.watermark_us >= before
        assert all(once.watermark_us >= advance(0, h) for h in flushed.histories)
        for p in a.publish:
            if p.value is None:
                published.pop(p.key, None)
            else:
                published[p.key] = p.value
        counted_once.update(a.phases)
        counted_twice.update(b.phases)
    assert counted_twice == counted_once
    expected: dict[str, bytes] = {}
    for run_id, h in final.items():  # the last publication of each part is the final history's
        expected[record_key(run_id, HISTORY)] = dump(replace(h, metric_points=None, pods=None))
        expected.update((point_key(run_id, p.metric, p.step), adapter(MetricPoint).dump_json(p))
                        for p in h.metric_points or ())
        expected.update((record_key(run_id, POD, p.uid), adapter(PodPlacement).dump_json(p)) for p in h.pods or ())
    assert published == expected
    assert once.runs == twice.runs and once.stuck == twice.stuck and once.watermark_us == twice.watermark_us


# ------------------------------------------------------------------------------------------ Kueue's queues


def test_queues_and_positions_are_published_once_per_content_and_restored_from_their_state_records() -> None:
    book = QueueBook()
    book.apply("ADDED", cq())
    book.apply("ADDED", lq())
    book.position(position())
    queues, positions = book.take()
    policy = PartitionPolicy()
    first = policy.decide(Flushed(queues=queues, positions=positions), LIMITS, now_us=None)
    assert [(p.kind, p.key) for p in first.publish] == [
        (QUEUE, "queue:gpu-cq"), (QUEUE, "queue:team-a/team-a-lq"), (POSITION, "qwen-rm-5vt2j/position")]
    assert all(p.digest == content_hash(p.value or b"") for p in first.publish)
    assert first.publish[0].value == queue_value(queues[0]) and first.publish[2].value == position_value(positions[0])
    assert [(k, kind) for k, kind, _ in first.queue_state] == [(p.key, p.kind) for p in first.publish]
    assert first.touched == [] and first.phases == Counter()
    # the same state again (a relist, a second poll that changed nothing): nothing published, nothing kept
    again = policy.decide(Flushed(queues=queues, positions=positions), LIMITS, now_us=None)
    assert again.publish == [] and again.queue_state == []

    # a new owner reads the state records back: the same hashes, so the same states publish nothing
    restored = PartitionPolicy()
    items = [restored.restore_queue_record(key, doc) for key, _, doc in first.queue_state]
    assert items == [*queues, *positions]
    assert isinstance(items[0], QueueState) and isinstance(items[2], QueuePosition)
    assert (restored.queue_hashes, restored.position_hashes) == (policy.queue_hashes, policy.position_hashes)
    assert restored.decide(Flushed(queues=queues, positions=positions), LIMITS, now_us=None).publish == []
    for key, doc in (("queue:x", {}), ("queue:x", {"hash": "h", QUEUE: []}), ("r/position", {"hash": "h"})):
        with pytest.raises(ValueError, match="is not a queue's or a position's"):
            restored.restore_queue_record(key, doc)

    # a newer poll publishes the position; the run retired: its state record goes (a tombstone), nothing published
    book.position(position(at="2026-08-20T12:59:30Z", pos=1))
    _, newer = book.take()
    [moved] = restored.decide(Flushed(positions=newer), LIMITS, now_us=None).publish
    assert moved.value == position_value(newer[0])
    gone = restored.decide(Flushed(retired=["qwen-rm-5vt2j"], positions=newer), LIMITS, now_us=None)
    assert gone.publish == [] and gone.queue_state_gone == ["qwen-rm-5vt2j/position"]
    assert "qwen-rm-5vt2j" not in restored.position_hashes


def test_a_queue_record_too_large_is_a_dead_letter() -> None:
    book = QueueBook()
    book.apply("ADDED", cq())
    queues, _ = book.take()
    tiny = Limits(max_value_bytes=100, transitions_topic="tt", thresholds_s={}, clock="event")
    decided = PartitionPolicy().decide(Flushed(queues=queues), tiny, now_us=None)
    assert decided.publish == [] and decided.queue_state == []
    [letter] = decided.dead_letters
    assert (letter.source, letter.reason) == ("tt:queue:gpu-cq", "queue record too large to publish")


# ------------------------------------------------------------------------------------------ Nodes


def test_nodes_are_published_once_per_content_kept_in_run_state_and_restored() -> None:
    book = NodeBook()
    book.apply("ADDED", node("aks-h100-0", 10))
    book.apply("ADDED", node("aks-h100-1", 11, ready="False"))
    nodes = book.take()
    policy = PartitionPolicy()
    first = policy.decide(Flushed(nodes=nodes), LIMITS, now_us=None)
    assert [(p.kind, p.key) for p in first.publish] == [(NODE, "node:aks-h100-0"), (NODE, "node:aks-h100-1")]
    assert [p.value for p in first.publish] == [node_value(n) for n in nodes]
    assert all(p.digest == content_hash(p.value or b"") for p in first.publish)
    assert [(k, kind) for k, kind, _ in first.queue_state] == [(p.key, p.kind) for p in first.publish]
    assert first.touched == [] and first.queue_state_gone == []
    assert policy.decide(Flushed(nodes=nodes), LIMITS, now_us=None).publish == []  # the same content again

    # a new owner reads the state records back: the same hashes (nothing published again), the same book
    restored, book2 = PartitionPolicy(), NodeBook()
    for key, _, doc in first.queue_state:
        book2.restore(restored.restore_node_record(key, doc))
    assert book2.nodes == book.nodes and book2.take() == []
    assert restored.node_hashes == policy.node_hashes
    assert restored.decide(Flushed(nodes=nodes), LIMITS, now_us=None).publish == []
    assert not book2.apply("MODIFIED", node("aks-h100-0", 9))  # an older version than the restored one: ignored
    for key, doc in (("node:x", {}), ("node:x", {"hash": "h", NODE: []}),
                     ("node:x", {"hash": "h", NODE: nodes[0].to_json()})):  # the last: another node's state
        with pytest.raises(ValueError, match="run-state record 'node:x'"):
            restored.restore_node_record(key, doc)

    # a deletion is a state of its own (its tombstone), published once
    book2.apply("DELETED", node("aks-h100-1", 12))
    [gone] = restored.decide(Flushed(nodes=book2.take()), LIMITS, now_us=None).publish
    assert gone.key == "node:aks-h100-1" and gone.value is not None and b'"deleted":true' in gone.value


def test_a_node_record_reads_back_as_the_state_published_and_a_wrong_one_is_refused() -> None:
    from tracker.core import wire
    from tracker.shell.transitions import BadTransition, decode_node, is_node_record, is_queue_record

    book = NodeBook()
    book.apply("ADDED", node("aks-h100-0", 10))
    [state] = book.take()
    [p] = PartitionPolicy().decide(Flushed(nodes=[state]), LIMITS, now_us=None).publish
    headers = list(wire.kind_headers(p.kind, p.digest))
    assert is_node_record(headers) and not is_queue_record(headers)
    assert decode_node(p.key.encode(), p.value, headers) == state
    for key, value, kind, why in [
            (b"node:aks-h100-1", p.value, NODE, "keyed 'node:aks-h100-1' holds 'node:aks-h100-0'"),
            (p.key.encode(), None, NODE, "a tombstone of a node record"),
            (p.key.encode(), b"[1]", NODE, "not a JSON object"),
            (p.key.encode(), b'{"key": "node:aks-h100-0"}', NODE, "that is not one"),
            (p.key.encode(), p.value, QUEUE, "not a node record")]:
        with pytest.raises(BadTransition, match=why):
            decode_node(key, value, list(wire.kind_headers(kind)))
