"""Reading the transitions topic back: each record of a run (its history, its metric points, one of its pods) as
the ``HistoryUpdate`` it stands for (deploy/kafka/topics.md).

``tracker reduce`` publishes a run's parts as records of their own (``tracker.core.publish``: header ``kind``,
keys ``<run id>``, ``<run id>/point/<step>/<metric>``, ``<run id>/pod/<uid>``; a tombstone for a point no longer
kept, or a pod no longer the run's), so that a record's size grows neither with the run's width nor with its points,
and compaction keeps the latest of each part. A sink reads them in partition order and writes each as the update it
is; ``combine`` makes one update per run of a batch. Records a tracker before the split published (no ``kind``
header: the run's whole history, pods inside its attempts) are read as the full update they are; a run's points
record of a tracker before per-point records (kind ``points``) as every point of the run (``points_full``), and
its tombstone as nothing (the run's point records replace it). A record that is none of these is a
``BadTransition`` (an ``errors.InvalidInput``: a sink skips it and goes on); any other error is a bug and stops the
sink. The keys and kinds are ``tracker.core.wire``'s.

Kueue's queues travel on the same topic (``tracker.core.publish``): a queue's newest state (kind ``queue``, key
``queue:...``) and a pending run's newest position (kind ``position``, key ``<run id>/position``); ``decode_queue``
reads them (``is_queue_record`` tells them apart), for the sinks that keep queues (``write_queues``). So do the
Nodes' newest states (kind ``node``, key ``node:<name>``): ``is_node_record``, ``decode_node``, for the sinks that
keep Nodes (``write_nodes``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from tracker import errors
from tracker.core import wire
from tracker.core.model import (
    HistoryUpdate,
    MetricPoint,
    MetricPointsRecord,
    PodPlacement,
    RunHistory,
    load,
    load_json,
)
from tracker.core.nodes import NodeState
from tracker.core.queues import QueuePosition, QueueState
from tracker.core.wire import (
    HISTORY,
    NODE,
    NODE_KEY_PREFIX,
    POD,
    POINT,
    POINTS,
    POSITION,
    QUEUE,
    QUEUE_KEY_PREFIX,
    record_key,
)
from tracker.shell import jsonio


class BadTransition(errors.InvalidInput):
    """A transitions record that is not what its kind and key say (or not JSON, or not the model it names)."""


def _kind(headers: Sequence[tuple[str, bytes]] | None) -> str | None:
    return wire.kind_of(headers)


def is_queue_record(headers: Sequence[tuple[str, bytes]] | None) -> bool:
    """Whether a transitions record is a queue's state or a run's position (``decode_queue``), not a run's part."""
    return _kind(headers) in (QUEUE, POSITION)


def decode_queue(key: bytes | None, value: bytes | None,
                 headers: Sequence[tuple[str, bytes]] | None) -> QueueState | QueuePosition:
    """A queue's newest state or a pending run's newest position; BadTransition if the record is neither, or its key
    is not the one its content has."""
    kind = _kind(headers)
    text_key = key.decode(errors="replace") if key is not None else ""
    if value is None:
        raise BadTransition(f"a tombstone of a {kind} record (key {text_key[:200]!r}): queues and positions are kept")
    try:
        doc = jsonio.loads(value)
        if not isinstance(doc, dict):
            raise BadTransition("not a JSON object")
        item: QueueState | QueuePosition
        if kind == QUEUE:
            item = QueueState.from_json(doc)
            expected = item.key if item.key.startswith(QUEUE_KEY_PREFIX) else None
        elif kind == POSITION:
            item = QueuePosition.from_json(doc)
            expected = record_key(item.run_id, POSITION)
        else:
            raise BadTransition(f"not a queue record: kind {kind!r}")
    except BadTransition:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as exc:  # not JSON, or not the object it names
        raise BadTransition(f"a {kind} record (key {text_key[:200]!r}) that is not one: {exc!r}") from exc
    if text_key != expected:
        raise BadTransition(f"a {kind} record keyed {text_key[:200]!r} holds {expected!r}")
    return item


def is_node_record(headers: Sequence[tuple[str, bytes]] | None) -> bool:
    """Whether a transitions record is a Node's state (``decode_node``), not a run's part."""
    return _kind(headers) == NODE


def decode_node(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]] | None) -> NodeState:
    """A Node's newest state; BadTransition if the record is not one, or its key is not the node's."""
    text_key = key.decode(errors="replace") if key is not None else ""
    if _kind(headers) != NODE:
        raise BadTransition(f"not a node record: kind {_kind(headers)!r}")
    if value is None:
        raise BadTransition(f"a tombstone of a node record (key {text_key[:200]!r}): a deleted Node is a state")
    try:
        doc = jsonio.loads(value)
        if not isinstance(doc, dict):
            raise BadTransition("not a JSON object")
        node = NodeState.from_json(doc)
    except BadTransition:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as exc:  # not JSON, or not a Node's state
        raise BadTransition(f"a node record (key {text_key[:200]!r}) that is not one: {exc!r}") from exc
    if not node.key.startswith(NODE_KEY_PREFIX) or text_key != node.key:
        raise BadTransition(f"a node record keyed {text_key[:200]!r} holds {node.key[:200]!r}")
    return node


def decode(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]] | None) -> HistoryUpdate:
    """The update a transitions record stands for; BadTransition if it is none (not JSON, not the model its kind
    names: pydantic's ValidationError, or a legacy history that is not one)."""
    try:
        return _decode(key, value, headers)
    except ValidationError as exc:  # not the model its kind names
        raise BadTransition(f"a {_kind(headers) or 'history'} record that is not one: {exc}") from exc


def _decode(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]] | None) -> HistoryUpdate:
    kind = _kind(headers)
    text_key = key.decode(errors="replace") if key is not None else ""
    if kind == POD:
        run_id, uid = wire.pod_of_key(text_key) or ("", "")
        if not run_id or not uid:
            raise BadTransition(f"a pod record's key is not <run id>/pod/<uid>: {text_key[:200]!r}")
        if value is None:
            return HistoryUpdate(run_id=run_id, removed_pods=(uid,))
        pod = load_json(PodPlacement, value)
        if (pod.run_id, pod.uid) != (run_id, uid):
            raise BadTransition(f"a pod record keyed {text_key[:200]!r} holds pod {pod.uid!r} of run {pod.run_id!r}")
        return HistoryUpdate(run_id=run_id, pods=(pod,))
    if kind == POINT:
        run_id, metric, step = wire.point_of_key(text_key) or ("", "", 0)
        if not run_id:
            raise BadTransition(f"a point record's key is not <run id>/point/<step>/<metric>: {text_key[:200]!r}")
        if value is None:
            return HistoryUpdate(run_id=run_id, removed_points=((metric, step),))
        point = load_json(MetricPoint, value)
        if (point.run_id, point.metric, point.step) != (run_id, metric, step):
            raise BadTransition(f"a point record keyed {text_key[:200]!r} holds step {point.step!r} of metric "
                                f"{point.metric[:200]!r} of run {point.run_id!r}")
        return HistoryUpdate(run_id=run_id, points=[point])
    if kind == POINTS and value is None:  # an older tracker's points record, replaced by the run's point records
        older = wire.run_of_points_key(text_key)
        if older is None:
            raise BadTransition(f"a points record's key is not <run id>/points: {text_key[:200]!r}")
        return HistoryUpdate(run_id=older)
    if value is None:
        raise BadTransition(f"a tombstone of a {kind or 'history'} record (key {text_key[:200]!r}): "
                            "only pods, points and older points records are deleted")
    if kind == POINTS:  # an older tracker's: every point of the run
        points = load_json(MetricPointsRecord, value)
        return HistoryUpdate(run_id=points.run_id, points=points.metric_points, points_full=True)
    if kind == HISTORY:
        history = load_json(RunHistory, value)
        return HistoryUpdate(run_id=history.run.run_id, history=history)
    if kind is not None:
        raise BadTransition(f"unknown transitions record kind {kind[:100]!r}")
    try:
        doc = jsonio.loads(value)
    except ValueError as exc:  # not JSON (or not UTF-8)
        raise BadTransition(f"a history record (key {text_key[:200]!r}) that is not JSON: {exc}") from exc
    return legacy(doc)


def legacy(doc: Any) -> HistoryUpdate:
    """A run's whole history as a tracker before the split published it (history/v1: each attempt's pods inside
    it, no pod uids), as a full update; its pods get the uid ``v5:<attempt>:<pod>``, as an index of schema 5 has.
    BadTransition if ``doc`` is not one."""
    try:
        return _legacy(doc)
    except (KeyError, TypeError, AttributeError, ValidationError) as exc:  # fields of other types than a history's
        raise BadTransition(f"not a run history: {exc!r}") from exc


def _legacy(doc: Any) -> HistoryUpdate:
    if not isinstance(doc, dict) or not isinstance(doc.get("attempts"), list) or not isinstance(doc.get("run"), dict):
        raise BadTransition("not a run history")
    run_id = doc["run"].get("run_id")
    namespace = doc["run"].get("namespace")
    pods: dict[str, PodPlacement] = {}
    attempts = []
    for a in doc["attempts"]:
        if not isinstance(a, dict):
            raise BadTransition("attempts[] must be objects")
        a = dict(a)
        placed = a.pop("pods", None) or []
        a.setdefault("pod_count", len(placed))
        a.setdefault("failed_pods", len(a.get("failures") or []))
        for p in placed:
            if not isinstance(p, dict):
                raise BadTransition("attempts[].pods[] must be objects")
            uid = f"v5:{a.get('attempt')}:{p.get('pod')}"
            pods[uid] = load(PodPlacement, {**p, "run_id": run_id, "namespace": namespace,
                                            "attempt": a.get("attempt"), "uid": uid})
        attempts.append(a)
    whole = load(RunHistory, {**doc, "attempts": attempts, "pods": None})
    return HistoryUpdate(run_id=whole.run.run_id, history=replace(whole, metric_points=None),
                         points=list(whole.metric_points or ()), pods=tuple(pods[u] for u in sorted(pods)), full=True)


def combine(updates: Iterable[HistoryUpdate]) -> list[HistoryUpdate]:
    """One update per run, in the order the runs first appear, each the updates of its run one after the other."""
    out: dict[str, HistoryUpdate] = {}
    for u in updates:
        seen = out.get(u.run_id)
        out[u.run_id] = u if seen is None else seen.then(u)
    return list(out.values())
