"""The reducer process's policy, pure: what one transaction of a partition publishes, and what it remembers.

``tracker.runtime.reduce`` keeps the Kafka side (the consumer group, the transactional producers, restoring a
partition from ``run-state``); every decision it takes about what to write is made here, from the reducer's
``Flushed`` output and the partition's ``PartitionPolicy``, with the time passed in (no clock, no I/O):

- **publish or not**: a run's history (without its pods and metric points) is published to ``transitions`` when
  the sha256 of its JSON (its *content hash*) differs from the hash last published for the run; folding records
  that change nothing publishes nothing, and the same output twice publishes once. Each of its metric points is a
  record of its own, published when it was added or changed, with a tombstone for a point no longer kept
  (``HistoryUpdate.points``, ``removed_points``), and so is each of its pods, published when its row changed (the
  derivation tells which: ``HistoryUpdate.pods``), with a tombstone for a pod no longer the run's. So what a change
  publishes grows neither with the run's width nor with its points. The run's points record of an older tracker
  (one record with every point, key ``<run id>/points``) gets a tombstone once its points went out one by one. A
  record larger than the topic allows is a dead letter instead (its hash is remembered all the same, so that it is
  not retried at every batch);
- **the watermark**: the partition's event time, the latest transition time of any history it produced. It only
  advances (a batch of older histories holds it); the event clock of the stuck alerts reads it;
- **stuck runs**: a live run in Admission, Scheduling or Runtime before its application started is a candidate
  (``tracker.core.stuck``); it is alerted once per (run, attempt, phase) when its age reaches its phase's
  threshold at ``now_us`` (the wall clock, or the watermark for the event clock);
- **retired runs**: those the reducer retired while folding are dropped from the policy state and counted as
  finished by their last status; their run-state record becomes the reducer's retired marker, and the runs the
  reducer forgot (``max_retired``) get a tombstone;
- **which run-state records to write**: every run the batch touched (changed, retired or alerted), once;
- **Kueue's queues** (``tracker.core.queues``): the newest state of each ClusterQueue and LocalQueue the batch
  changed is a record of its own (kind ``queue``, key ``queue:<ClusterQueue>`` or ``queue:<namespace>/<LocalQueue>``),
  and so is each pending run's newest position (kind ``position``, key ``<run id>/position``), published when its
  content hash differs from the one last published for the key. Each is kept in run-state too (the same key: the
  state and its hash), so a new owner of the partition restores them; a retired run's position record there gets a
  tombstone (its transitions record stays, as its history does);
- **Nodes** (``tracker.core.nodes``): likewise, the newest kept state of each Node the batch changed (kind ``node``,
  key ``node:<name>``, a deletion included: it is the node's tombstone state, not a Kafka tombstone), published when
  its content hash changed and kept in run-state, so the sinks write the index's ``nodes`` and ADX's
  ``TaugridNodeState`` as the embedded pipeline does.

``RunShell`` is what is kept per run beside the reducer's facts; ``PartitionPolicy.shell_doc`` and
``PartitionPolicy.restore_shell`` are its form in a run-state record (the ``shell`` field).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tracker.core import entries, stuck
from tracker.core.model import (
    DeadLetter,
    HistoryUpdate,
    MetricPoint,
    Phase,
    PodPlacement,
    RunHistory,
    Status,
    adapter,
)
from tracker.core.nodes import NodeState
from tracker.core.queues import QueuePosition, QueueState
from tracker.core.reducer import Flushed
from tracker.core.stuck import Clock, Stuck, StuckRunAlert
from tracker.core.timefmt import ts
from tracker.core.waits import pending_by_category
from tracker.core.wire import HISTORY, NODE, POD, POINT, POINTS, POSITION, POSITION_SUFFIX, QUEUE, point_key, record_key


def content_hash(value: bytes) -> str:
    """The sha256 of a published value, hex (the ``content-hash`` header of a transitions record)."""
    return hashlib.sha256(value).hexdigest()


@dataclass(slots=True)
class RunShell:
    """What the reducer process keeps per live run besides the reducer's facts (persisted in run-state)."""

    content_hash: str | None = None  # of the history last published
    points_hash: str | None = None  # of the run's points record an older tracker published (None: none, or replaced)
    entries: tuple[int, ...] | None = None  # phase entries already counted in the metrics (core.entries)
    alerted: list[int] = field(default_factory=list)  # attempts already alerted stuck in Admission
    alerted_stuck: list[tuple[int, Phase]] = field(default_factory=list)  # (attempt, phase) alerted, other phases
    status: Status = Status.PENDING
    pending: dict[str, float] | None = None  # ended pending seconds by category already counted in the metrics

    def alerted_pairs(self) -> list[tuple[int, Phase]]:
        return [(a, Phase.ADMISSION) for a in self.alerted] + self.alerted_stuck

    def remember_alert(self, attempt: int, phase: Phase) -> None:
        if phase == Phase.ADMISSION:
            self.alerted.append(attempt)
        else:
            self.alerted_stuck.append((attempt, phase))


def queue_value(q: QueueState) -> bytes:
    """The JSON of a queue's record (``QueueState.to_json``), keys sorted: the same state, the same bytes."""
    return json.dumps(q.to_json(), sort_keys=True, separators=(",", ":")).encode()


def position_value(p: QueuePosition) -> bytes:
    """The JSON of a position record (``QueuePosition.to_json``), keys sorted."""
    return json.dumps(p.to_json(), sort_keys=True, separators=(",", ":")).encode()


def node_value(n: NodeState) -> bytes:
    """The JSON of a Node's record (``NodeState.to_json``), keys sorted."""
    return json.dumps(n.to_json(), sort_keys=True, separators=(",", ":")).encode()


def queue_state_doc(kind: str, value: bytes, digest: str) -> dict[str, Any]:
    """The run-state record kept for a queue, a position or a Node: its published value (``kind`` the field) and
    hash."""
    return {kind: json.loads(value), "hash": digest}


@dataclass(frozen=True, slots=True)
class Publication:
    """A record to publish on ``transitions``: its kind, key, JSON (None: a tombstone) and the content hash of it."""

    run_id: str  # a queue's record: its queue key; a Node's: its node key
    kind: str  # HISTORY, POINT, POD, QUEUE, POSITION or NODE (POINTS: the tombstone of an older record)
    key: str
    value: bytes | None
    digest: str | None


@dataclass(frozen=True, slots=True)
class Alert:
    """A stuck-run alert due: the candidate and its alert record."""

    stuck: Stuck
    record: StuckRunAlert


@dataclass(slots=True)
class Decisions:
    """What one transaction of a partition writes (in this order: publications, alerts, the run-state of the
    ``touched`` runs, tombstones of the ``forgotten`` ones, dead letters), and what to count once committed."""

    publish: list[Publication] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    touched: list[str] = field(default_factory=list)  # runs whose run-state record is written, each once, in order
    forgotten: list[str] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)  # the fold's, then histories too large
    oversized: list[tuple[str, int]] = field(default_factory=list)  # (record key, bytes) of records too large
    phases: Counter[str] = field(default_factory=Counter)  # phase entries to count
    pending: dict[str, float] = field(default_factory=dict)  # ended pending seconds to count, by category
    finished: Counter[str] = field(default_factory=Counter)  # retired runs, by final status
    # run-state records of queues, positions and Nodes: (key, kind, value) of those published; positions whose
    # record goes
    queue_state: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    queue_state_gone: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Limits:
    """The outside facts the policy needs: the largest value a record may carry, the transitions topic (a too
    large history's dead letter names it), the stuck thresholds and the alerts' clock."""

    max_value_bytes: int
    transitions_topic: str
    thresholds_s: Mapping[Phase, float]
    clock: Clock


@dataclass(slots=True)
class PartitionPolicy:
    """The policy state of one partition: its live runs' shells, its stuck candidates, its watermark."""

    runs: dict[str, RunShell] = field(default_factory=dict)
    stuck: dict[str, Stuck] = field(default_factory=dict)  # live runs before their application started
    watermark_us: int = 0
    queue_hashes: dict[str, str] = field(default_factory=dict)  # queue key -> hash of its record last published
    position_hashes: dict[str, str] = field(default_factory=dict)  # run id -> hash of its position last published
    node_hashes: dict[str, str] = field(default_factory=dict)  # node key -> hash of its record last published

    # ------------------------------------------------------------------------------------ one batch
    def decide(self, flushed: Flushed, limits: Limits, *, now_us: int | None) -> Decisions:
        """The decisions of one folded batch (``flushed``), updating this state as if they are committed.

        ``now_us`` is the wall clock; None for the event clock (the watermark, once the batch advanced it)."""
        out = Decisions(dead_letters=list(flushed.dead_letters), forgotten=list(flushed.forgotten))
        touched: list[str] = []
        for u in flushed.updates:
            touched.append(u.run_id)
            self._publish(u, limits, out)
            if u.history is not None:  # None: unchanged since the run's previous update
                self.watermark_us = advance(self.watermark_us, u.history)
                self.track(u.history)
        for run_id in flushed.retired:  # their run-state record becomes the retired marker
            gone = self.runs.pop(run_id, None)
            self.stuck.pop(run_id, None)
            out.finished[(gone.status if gone is not None else Status.SUCCEEDED).value] += 1
            touched.append(run_id)
            if self.position_hashes.pop(run_id, None) is not None:  # the reducer forgot its position
                out.queue_state_gone.append(record_key(run_id, POSITION))
        self._publish_queues(flushed, limits, out)
        out.alerts = self.due_alerts(self.watermark_us if now_us is None else now_us, limits)
        touched.extend(a.stuck.run_id for a in out.alerts)
        out.touched = list(dict.fromkeys(touched))
        return out

    def _publish(self, u: HistoryUpdate, limits: Limits, out: Decisions) -> None:
        h = u.history
        run_id = u.run_id
        shell = self.runs.setdefault(run_id, RunShell())
        if h is not None:
            shell.status = h.run.status
            value = adapter(RunHistory).dump_json(h)
            digest = content_hash(value)
            if digest != shell.content_hash:
                self._add(out, limits, Publication(run_id, HISTORY, record_key(run_id, HISTORY), value, digest))
                now = entries.phase_entries(h)
                out.phases.update({p.value: n for p, n in entries.added(shell.entries or entries.NONE, now).items()})
                shell.content_hash, shell.entries = digest, now
                counted = ended_pending(h)
                for cat, seconds in pending_added(shell.pending or {}, counted).items():
                    out.pending[cat] = out.pending.get(cat, 0.0) + seconds
                shell.pending = counted
        point_json = adapter(MetricPoint).dump_json
        for pt in u.points or ():
            self._add(out, limits, Publication(run_id, POINT, point_key(run_id, pt.metric, pt.step), point_json(pt),
                                               None))
        for metric, step in u.removed_points:
            out.publish.append(Publication(run_id, POINT, point_key(run_id, metric, step), None, None))
        if shell.points_hash is not None and (u.full or u.points_full):
            # the run's points record of a tracker before per-point records: its point records, just published,
            # replace it
            out.publish.append(Publication(run_id, POINTS, record_key(run_id, POINTS), None, None))
            shell.points_hash = None
        pod_json = adapter(PodPlacement).dump_json
        for row in u.pods:
            self._add(out, limits, Publication(run_id, POD, record_key(run_id, POD, row.uid), pod_json(row), None))
        for uid in u.removed_pods:
            out.publish.append(Publication(run_id, POD, record_key(run_id, POD, uid), None, None))

    def _publish_queues(self, flushed: Flushed, limits: Limits, out: Decisions) -> None:
        """Each queue's newest state, each run's newest position and each Node's newest state that the batch changed,
        when its content hash differs from the one last published for its key (a retired run's position is not
        published)."""
        retired = set(flushed.retired)
        items: list[tuple[str, str, bytes, dict[str, str]]] = [
            (q.key, QUEUE, queue_value(q), self.queue_hashes) for q in flushed.queues]
        items += [(p.run_id, POSITION, position_value(p), self.position_hashes)
                  for p in flushed.positions if p.run_id not in retired]
        items += [(n.key, NODE, node_value(n), self.node_hashes) for n in flushed.nodes]
        for name, kind, value, hashes in items:
            digest = content_hash(value)
            if hashes.get(name) == digest:
                continue
            key = record_key(name, kind)
            hashes[name] = digest
            if self._add(out, limits, Publication(name, kind, key, value, digest)):
                out.queue_state.append((key, kind, queue_state_doc(kind, value, digest)))

    def restore_queue_record(self, key: str, doc: Mapping[str, Any]) -> QueueState | QueuePosition:
        """Read back the run-state record of a queue (key ``queue:...``) or a position (``<run id>/position``):
        the hash last published is remembered; the state or position is returned (for the reducer's ``QueueBook``).
        Raises ValueError when the record is not one."""
        try:
            digest = doc["hash"]
            if key.endswith(POSITION_SUFFIX) and POSITION in doc:
                pos = QueuePosition.from_json(doc[POSITION])
                self.position_hashes[pos.run_id] = digest
                return pos
            q = QueueState.from_json(doc[QUEUE])
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"run-state record {key[:200]!r} is not a queue's or a position's: {exc!r}") from exc
        self.queue_hashes[q.key] = digest
        return q

    def restore_node_record(self, key: str, doc: Mapping[str, Any]) -> NodeState:
        """Read back the run-state record of a Node (key ``node:<name>``): the hash last published is remembered, the
        state returned (for the reducer's ``NodeBook``). Raises ValueError when the record is not one."""
        try:
            digest = doc["hash"]
            n = NodeState.from_json(doc[NODE])
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"run-state record {key[:200]!r} is not a Node's: {exc!r}") from exc
        if n.key != key or not isinstance(digest, str):
            raise ValueError(f"run-state record {key[:200]!r} holds the Node {n.key[:200]!r}")
        self.node_hashes[n.key] = digest
        return n

    @staticmethod
    def _add(out: Decisions, limits: Limits, p: Publication) -> bool:
        assert p.value is not None
        if len(p.value) <= limits.max_value_bytes:
            out.publish.append(p)
            return True
        out.oversized.append((p.key, len(p.value)))
        out.dead_letters.append(DeadLetter(
            source=f"{limits.transitions_topic}:{p.key}", reason=f"{p.kind} record too large to publish",
            detail=f"{len(p.value)} bytes > {limits.max_value_bytes}", excerpt=p.value[:2048].decode(errors="replace")))
        return False

    def due_alerts(self, now_us: int, limits: Limits) -> list[Alert]:
        """The stuck runs due an alert at ``now_us`` (each remembered as alerted: it is due only once)."""
        alerted_by_run = {run_id: self.runs[run_id].alerted_pairs() for run_id in self.stuck}
        due = []
        for s in stuck.due(self.stuck.values(), now_us, limits.thresholds_s, alerted_by_run):
            self.runs[s.run_id].remember_alert(s.attempt, s.phase)
            due.append(Alert(s, stuck.stuck_alert(s, now_us, limits.clock, limits.thresholds_s[s.phase])))
        return due

    def track(self, h: RunHistory) -> None:
        """Keep ``h``'s run as a stuck candidate, or stop keeping it."""
        candidate = stuck.stuck_candidate(h)
        if candidate is None:
            self.stuck.pop(h.run.run_id, None)
        else:
            self.stuck[h.run.run_id] = candidate

    # ------------------------------------------------------------------------------------ run-state
    def shell_doc(self, run_id: str) -> dict[str, Any]:
        """The ``shell`` field of a run's run-state record."""
        shell = self.runs.get(run_id)
        if shell is None:
            return {"watermark_us": self.watermark_us}
        return {"watermark_us": self.watermark_us, "hash": shell.content_hash, "points_hash": shell.points_hash,
                "entries": None if shell.entries is None else list(shell.entries),
                "alerted": shell.alerted, "alerted_stuck": [[a, p.value] for a, p in shell.alerted_stuck],
                "pending": shell.pending}

    def restore_shell(self, run_id: str, doc: Mapping[str, Any], *, retired: bool) -> None:
        """Read back a run-state record's ``shell`` field (``doc``); a retired run keeps no shell."""
        self.watermark_us = max(self.watermark_us, doc.get("watermark_us", 0))
        if not retired:
            self.runs[run_id] = RunShell(doc.get("hash"), doc.get("points_hash"),
                                         tuple(doc.get("entries") or ()) or None, list(doc.get("alerted", ())),
                                         [(int(a), Phase(p)) for a, p in doc.get("alerted_stuck", ())],
                                         pending=doc.get("pending"))

    def restored(self, histories: Iterable[RunHistory]) -> None:
        """After the records are read back: each live run's status and stuck candidacy from its history (and its
        phase entries, when an older state did not keep them: all counted already)."""
        for h in histories:
            shell = self.runs.get(h.run.run_id)
            if shell is None:
                continue
            shell.status = h.run.status
            if shell.entries is None or len(shell.entries) != len(entries.PHASES):
                shell.entries = entries.phase_entries(h)
            if shell.pending is None:  # an older state: its pending seconds were not counted, nor will they be
                shell.pending = ended_pending(h)
            self.track(h)


def ended_pending(h: RunHistory) -> dict[str, float]:
    """A run's ended pending seconds by category (``tracker_pending_seconds_total`` counts them)."""
    return {k: v for k, v in pending_by_category(h.run.pending_s_by).items() if v}


def pending_added(before: Mapping[str, float], now: Mapping[str, float]) -> dict[str, float]:
    """The seconds to count since ``before`` (a counter never goes down: a category that shrank adds nothing)."""
    return {k: v - before.get(k, 0.0) for k, v in now.items() if v > before.get(k, 0.0)}


def advance(watermark_us: int, h: RunHistory) -> int:
    """The watermark after ``h``: its latest transition time if that is later, else held where it was."""
    if not h.transitions:
        return watermark_us
    latest = ts(max(t.at for t in h.transitions))
    assert latest is not None
    return max(watermark_us, latest)
