"""Reading the transitions topic back: each record of a run (its history, its metric points, one of its pods) as
the ``HistoryUpdate`` it stands for (deploy/kafka/topics.md).

``tracker reduce`` publishes a run's parts as records of their own (``tracker.core.publish``: header ``kind``,
keys ``<run id>``, ``<run id>/points``, ``<run id>/pod/<uid>``; a tombstone for a pod no longer the run's), so that a
record's size does not grow with the run's width, and compaction keeps the latest of each part. A sink reads them
in partition order and writes each as the update it is; ``combine`` makes one update per run of a batch. Records a
tracker before the split published (no ``kind`` header: the run's whole history, pods inside its attempts) are read
as the full update they are. A record that is none of these is a ValueError.

Kueue's queues travel on the same topic (``tracker.core.publish``): a queue's newest state (kind ``queue``, key
``queue:...``) and a pending run's newest position (kind ``position``, key ``<run id>/position``); ``decode_queue``
reads them (``is_queue_record`` tells them apart), for the sinks that keep queues (``write_queues``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from tracker.core.model import (
    HistoryUpdate,
    MetricPointsRecord,
    PodPlacement,
    RunHistory,
    load,
    load_json,
)
from tracker.core.publish import HISTORY, POD, POINTS, POSITION, QUEUE, record_key
from tracker.core.queues import QUEUE_KEY_PREFIX, QueuePosition, QueueState
from tracker.shell import jsonio

KIND_HEADER = "kind"  # of a transitions record: history, points, pod, queue or position (tracker.core.publish);
# of a run-state one: pod, queue or position


def _kind(headers: Sequence[tuple[str, bytes]] | None) -> str | None:
    return next((v.decode(errors="replace") for k, v in headers or () if k == KIND_HEADER), None)


def is_queue_record(headers: Sequence[tuple[str, bytes]] | None) -> bool:
    """Whether a transitions record is a queue's state or a run's position (``decode_queue``), not a run's part."""
    return _kind(headers) in (QUEUE, POSITION)


def decode_queue(key: bytes | None, value: bytes | None,
                 headers: Sequence[tuple[str, bytes]] | None) -> QueueState | QueuePosition:
    """A queue's newest state or a pending run's newest position; ValueError if the record is neither, or its key is
    not the one its content has."""
    kind = _kind(headers)
    text_key = key.decode(errors="replace") if key is not None else ""
    if value is None:
        raise ValueError(f"a tombstone of a {kind} record (key {text_key[:200]!r}): queues and positions are kept")
    try:
        doc = jsonio.loads(value)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        item: QueueState | QueuePosition
        if kind == QUEUE:
            item = QueueState.from_json(doc)
            expected = item.key if item.key.startswith(QUEUE_KEY_PREFIX) else None
        elif kind == POSITION:
            item = QueuePosition.from_json(doc)
            expected = record_key(item.run_id, POSITION)
        else:
            raise ValueError(f"not a queue record: kind {kind!r}")
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"a {kind} record (key {text_key[:200]!r}) that is not one: {exc!r}") from exc
    if text_key != expected:
        raise ValueError(f"a {kind} record keyed {text_key[:200]!r} holds {expected!r}")
    return item


def decode(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]] | None) -> HistoryUpdate:
    """The update a transitions record stands for; ValueError (pydantic's ValidationError is one) if it is none."""
    kind = _kind(headers)
    text_key = key.decode(errors="replace") if key is not None else ""
    if kind == POD:
        run_id, sep, uid = text_key.partition("/pod/")
        if not sep or not run_id or not uid:
            raise ValueError(f"a pod record's key is not <run id>/pod/<uid>: {text_key[:200]!r}")
        if value is None:
            return HistoryUpdate(run_id=run_id, removed_pods=(uid,))
        pod = load_json(PodPlacement, value)
        if (pod.run_id, pod.uid) != (run_id, uid):
            raise ValueError(f"a pod record keyed {text_key[:200]!r} holds pod {pod.uid!r} of run {pod.run_id!r}")
        return HistoryUpdate(run_id=run_id, pods=(pod,))
    if value is None:
        raise ValueError(f"a tombstone of a {kind or 'history'} record (key {text_key[:200]!r}): only pods are deleted")
    if kind == POINTS:
        points = load_json(MetricPointsRecord, value)
        return HistoryUpdate(run_id=points.run_id, points=points.metric_points)
    if kind == HISTORY:
        history = load_json(RunHistory, value)
        return HistoryUpdate(run_id=history.run.run_id, history=history)
    if kind is not None:
        raise ValueError(f"unknown transitions record kind {kind[:100]!r}")
    return legacy(jsonio.loads(value))


def legacy(doc: Any) -> HistoryUpdate:
    """A run's whole history as a tracker before the split published it (history/v1: each attempt's pods inside
    it, no pod uids), as a full update; its pods get the uid ``v5:<attempt>:<pod>``, as an index of schema 5 has."""
    if not isinstance(doc, dict) or not isinstance(doc.get("attempts"), list) or not isinstance(doc.get("run"), dict):
        raise ValueError("not a run history")
    run_id = doc["run"].get("run_id")
    namespace = doc["run"].get("namespace")
    pods: dict[str, PodPlacement] = {}
    attempts = []
    for a in doc["attempts"]:
        if not isinstance(a, dict):
            raise ValueError("attempts[] must be objects")
        a = dict(a)
        placed = a.pop("pods", None) or []
        a.setdefault("pod_count", len(placed))
        a.setdefault("failed_pods", len(a.get("failures") or []))
        for p in placed:
            if not isinstance(p, dict):
                raise ValueError("attempts[].pods[] must be objects")
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
