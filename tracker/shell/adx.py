"""Azure Data Explorer sink: run histories as rows of the TauGrid tables next to adx-mon's GPU telemetry.

``AdxSink.write`` turns each ``HistoryUpdate`` (what changed in one run: its history, its metric points, the pods
that changed) into rows of the tables declared in ``schemas/kusto/010-tables.kql`` and queues only the rows this
process has not sent yet: a bounded per-run memo keeps, for every row key of a run, the digest of the row last
queued. Nothing blocks the
event loop on the network: a worker thread batches the queued rows by size and time and ingests them with the
SDK's managed streaming ingestion, which falls back to queued ingestion for large payloads or when streaming
keeps failing. Transient failures (throttling, 5xx, network, timeouts) are retried with capped exponential
backoff; when retries run out the rows go to a spool directory (bounded in bytes) and are drained in order once
Kusto answers again, before any newer row. Rows are never dropped: a full spool back-pressures ``write``, and a
batch Kusto rejects as permanently invalid is kept under ``<spool>/rejected/`` for inspection.

Ingestion is at-least-once (retries, the queued fallback, spool replays, a call abandoned at its deadline that
completes anyway, a restart forgetting the memo); the materialized views of ``schemas/kusto/040-views.kql``
deduplicate by ``EventId`` and pick the newest ``Revision``. Row identity:

- a transition is a fact: ``EventId`` = hash of run_id|attempt|phase|at|reason, the same on every resend; so is a
  metric point (hash of run_id|metric|step|value|at; the memo keeps 8 bytes per point);
- attempts, pods, run state, metric summaries and checkpoints change over a run's life: each change is a new row whose
  ``Revision`` is the sink's clock in microseconds (strictly increasing), and whose ``EventId`` hashes the
  row's content and revision, so that only true duplicates of one delivery collapse in the views.

``AdxSink.write_queues`` does the same for Kueue's queues: a row of ``TaugridQueueState`` per change of a queue's
newest state and of ``TaugridQueuePositions`` per change of a pending run's position (a memo of the digest last
queued per queue and run), read through the newest-per-key views ``TaugridQueueStateLatest`` and
``TaugridQueuePositionsLatest``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog
from azure.identity import WorkloadIdentityCredential
from azure.kusto.data import KustoConnectionStringBuilder
from azure.kusto.data.data_format import DataFormat, IngestionMappingKind
from azure.kusto.data.exceptions import (
    KustoApiError,
    KustoAuthenticationError,
    KustoBlobError,
    KustoNetworkError,
    KustoServiceError,
    KustoThrottlingError,
)
from azure.kusto.ingest import (
    IngestionProperties,
    IngestionStatus,
    ManagedStreamingIngestClient,
    StreamDescriptor,
)
from azure.kusto.ingest.exceptions import KustoQueueError

from tracker import errors
from tracker.core.model import HistoryUpdate, MetricPoint, PodPlacement, RunHistory, RunRecord
from tracker.core.queues import QueuePosition, QueueState
from tracker.settings import AdxSettings
from tracker.shell.deadline import call_with_deadline

log = structlog.get_logger("tracker.adx")

TRANSITIONS = "TaugridRunTransitions"
ATTEMPTS = "TaugridRunAttempts"
PODS = "TaugridRunPods"
STATE = "TaugridRunState"
METRICS = "TaugridMetricSummaries"
POINTS = "TaugridMetricPoints"
CHECKPOINTS = "TaugridCheckpoints"
TABLES = (TRANSITIONS, ATTEMPTS, PODS, STATE, METRICS, POINTS, CHECKPOINTS)  # a run's
QUEUES = "TaugridQueueState"
POSITIONS = "TaugridQueuePositions"
QUEUE_TABLES = (QUEUES, POSITIONS)  # Kueue's queues and pending runs' positions (``write_queues``)
ALL_TABLES = TABLES + QUEUE_TABLES

def mapping_name(table: str) -> str:
    """The JSON ingestion mapping of a table (schemas/kusto/020-mappings.kql)."""
    return f"{table}_json"


def connection(settings: AdxSettings, uri: str) -> KustoConnectionStringBuilder:
    """A connection string for ``uri`` with the configured authentication."""
    if not uri:
        raise errors.ConfigError("no Kusto endpoint: set TRACKER_ADX__CLUSTER_URI")
    if settings.auth == "none":
        return KustoConnectionStringBuilder.with_no_authentication(uri)
    if settings.auth == "managed-identity":  # user-assigned with a client id, else system-assigned
        if settings.client_id:
            return KustoConnectionStringBuilder.with_aad_managed_service_identity_authentication(
                uri, client_id=settings.client_id)
        return KustoConnectionStringBuilder.with_aad_managed_service_identity_authentication(uri)
    if settings.auth == "app-secret":
        assert settings.client_secret is not None  # checked by AdxSettings (tracker.settings)
        return KustoConnectionStringBuilder.with_aad_application_key_authentication(
            uri, settings.client_id, settings.client_secret.get_secret_value(), settings.tenant_id)
    credential = WorkloadIdentityCredential(client_id=settings.client_id or None,
                                            tenant_id=settings.tenant_id or None)
    return KustoConnectionStringBuilder.with_azure_token_credential(uri, credential=credential)


# ------------------------------------------------------------------------------------------ rows

Row = dict[str, Any]
RowKey = tuple[str | int, ...]

# RunRecord field -> TaugridRunState column (every field; tests/index/test_adx_sink.py checks both sides).
STATE_COLUMNS: dict[str, str] = {
    "run_id": "RunId", "kind": "Kind", "namespace": "Namespace", "name": "Name", "uid": "Uid",
    "project": "Project", "workspace": "Workspace", "target": "Target", "queue": "Queue",
    "cluster_queue": "ClusterQueue", "status": "Status", "reason": "Reason", "message": "Message",
    "phase": "Phase", "attempts": "Attempts", "retries": "Retries", "evictions": "Evictions",
    "created_at": "CreatedAt", "queued_at": "QueuedAt", "admitted_at": "AdmittedAt", "started_at": "StartedAt",
    "finished_at": "FinishedAt", "admission_wait_s": "AdmissionWaitSec", "pending_reason": "PendingReason",
    "pending_message": "PendingMessage", "git_commit": "GitCommit", "config_digest": "ConfigDigest",
    "config_ref": "ConfigRef", "input_refs": "InputRefs", "output_uri": "OutputUri", "resume_of": "ResumeOf",
    "last_checkpoint": "LastCheckpoint", "gpus": "Gpus", "gpu_hours": "GpuHours", "lost_gpu_hours": "LostGpuHours",
    "lost_gpu_hours_by": "LostGpuHoursBy", "gpus_open": "GpusOpen", "open_since": "OpenSince",
    "pending_s_by": "PendingSecBy", "pending_category": "PendingCategory", "pending_since": "PendingSince",
    "quota_reserved_at": "QuotaReservedAt", "ledger_basis": "LedgerBasis", "ledger_gpu_hours_by": "LedgerGpuHoursBy",
    "ledger_wall_s_by": "LedgerWallSecBy", "ledger_until": "LedgerUntil", "ledger_open": "LedgerOpen", "ettr": "Ettr",
    "goodput": "Goodput", "resumed_from": "ResumedFrom", "checkpoints_saved": "CheckpointsSaved",
}
# The GPU accounting of an attempt (schemas/gpu-accounting.md): the same columns as TaugridRunState's.
_GPU_FIELDS = ("gpus", "gpu_hours", "lost_gpu_hours", "lost_gpu_hours_by", "gpus_open", "open_since")


def _ts(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _jsonable(value: Any) -> Any:
    return _ts(value) if isinstance(value, datetime) else value


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def history_rows(h: RunHistory, cluster: str) -> Iterator[tuple[str, RowKey, Row]]:
    """(table, key within the run, row without EventId/Revision/IngestedAt) for every row of a history, its metric
    points and pods included when it holds them."""
    yield from _history_rows(h, cluster)
    yield from _pod_rows(h.pods or (), cluster)
    yield from _point_rows(h.metric_points or (), cluster)


def update_rows(u: HistoryUpdate, cluster: str) -> Iterator[tuple[str, RowKey, Row]]:
    """The rows of what an update holds: its history's, its pods' and its metric points' (when they changed)."""
    if u.history is not None:
        yield from _history_rows(u.history, cluster)
    yield from _pod_rows(u.pods, cluster)
    if u.points is not None:
        yield from _point_rows(u.points, cluster)


def _history_rows(h: RunHistory, cluster: str) -> Iterator[tuple[str, RowKey, Row]]:
    run = h.run
    workload = {"Kind": run.kind, "Namespace": run.namespace, "Name": run.name}
    owner = {"Workspace": run.workspace, "Project": run.project}
    cluster_queue = {a.attempt: a.cluster_queue for a in h.attempts}
    for t in h.transitions:
        yield TRANSITIONS, ("T", t.attempt, t.phase.value), {
            "RunId": t.run_id, "Attempt": t.attempt, "Phase": t.phase.value, "At": _ts(t.at), "Reason": t.reason,
            "Message": t.message, "Source": t.source, **workload, **owner, "Target": run.target,
            "Cluster": cluster, "Queue": run.queue,
            "ClusterQueue": cluster_queue.get(t.attempt) or run.cluster_queue, "Status": run.status.value}
    for a in h.attempts:
        yield ATTEMPTS, ("A", a.attempt), {
            "RunId": a.run_id, "Attempt": a.attempt, "Trigger": a.trigger, "Cluster": cluster, **workload, **owner,
            "Queue": run.queue, "ClusterQueue": a.cluster_queue, "RayCluster": a.ray_cluster,
            "QueuedAt": _ts(a.queued_at), "AdmittedAt": _ts(a.admitted_at), "ScheduledAt": _ts(a.scheduled_at),
            "StartedAt": _ts(a.started_at), "ProgressAt": _ts(a.progress_at), "EndedAt": _ts(a.ended_at),
            "EndReason": a.end_reason, "EndMessage": a.end_message, "UnderlyingCause": a.underlying_cause,
            "AdmissionWaitSec": a.admission_wait_s, "Retries": a.retries,
            "Failures": [{"Pod": f.pod, "At": _ts(f.at), "Reason": f.reason, "ExitCode": f.exit_code,
                          "Message": f.message} for f in a.failures],
            "Pods": a.pod_count, **{STATE_COLUMNS[f]: _jsonable(getattr(a, f)) for f in _GPU_FIELDS},
            # Admission in steps and every pending second (README "Every pending second"); End null: still going on
            "QuotaReservedAt": _ts(a.quota_reserved_at),
            "AdmissionSteps": [{"Kind": st.kind, "At": _ts(st.at), "Check": st.check, "State": st.state,
                                "Message": st.message} for st in a.admission_steps],
            "Pending": [{"Category": sp.category.value, "Detail": sp.detail, "Start": _ts(sp.start),
                         "End": _ts(sp.end)} for sp in a.pending],
            "PendingSecBy": dict(a.pending_s_by),
            # its share of the goodput ledger (schemas/goodput.md)
            "LedgerGpuHoursBy": dict(a.ledger_gpu_hours_by), "LedgerWallSecBy": dict(a.ledger_wall_s_by)}
    # the run's summary, with the history's ledger spans (for timelines; a run keeps the latest 256)
    yield STATE, ("S",), {"Cluster": cluster, **_state(run), "LedgerSpans": [
        {"Category": sp.category.value, "Start": _ts(sp.start), "End": _ts(sp.end)} for sp in h.ledger]}
    for c in h.checkpoints:
        yield CHECKPOINTS, ("C", c.kind, c.step, c.uri, _ts(c.started_at) or ""), {
            "Cluster": cluster, "RunId": run.run_id, "Namespace": run.namespace, **owner, "Attempt": c.attempt,
            "Kind": c.kind, "Step": c.step, "Uri": c.uri, "StartedAt": _ts(c.started_at), "EndedAt": _ts(c.ended_at),
            "Status": c.status, "Bytes": c.bytes}
    for m in h.metrics:
        yield METRICS, ("M", m.metric), {
            "Cluster": cluster, "RunId": m.run_id, "Metric": m.metric, "FirstStep": m.first_step,
            "FirstValue": m.first_value, "LatestStep": m.latest_step, "LatestValue": m.latest_value,
            "MinValue": m.min_value, "MaxValue": m.max_value, "Points": m.points}


def _pod_rows(pods: Iterable[PodPlacement], cluster: str) -> Iterator[tuple[str, RowKey, Row]]:
    for p in pods:
        yield PODS, ("P", p.uid), {
            "RunId": p.run_id, "Attempt": p.attempt, "Cluster": cluster, "Namespace": p.namespace,
            "Pod": p.pod, "Node": p.node, "CreatedAt": _ts(p.created_at),
            "StartTime": _ts(p.scheduled_at or p.created_at), "EndTime": _ts(p.finished_at), "Gpus": p.gpus,
            "ReleasedAt": _ts(p.released_at), "GpuHours": p.gpu_hours, "Lost": p.lost}


def _point_rows(points: Iterable[MetricPoint], cluster: str) -> Iterator[tuple[str, RowKey, Row]]:
    for pt in points:
        yield POINTS, ("MP",), {"Cluster": cluster, "RunId": pt.run_id, "Metric": pt.metric, "Step": pt.step,
                                "Value": pt.value, "At": _ts(pt.at)}


def queue_rows(queues: Iterable[QueueState], positions: Iterable[QueuePosition],
               cluster: str) -> Iterator[tuple[str, str, Row]]:
    """(table, key, row without EventId/Revision/IngestedAt) of each queue's state and each run's position: the
    newest of each, as the index keeps them (``tracker.shell.index_queues``)."""
    for q in queues:
        yield QUEUES, q.key, {
            "Cluster": cluster, "Key": q.key, "Kind": q.kind, "Namespace": q.namespace, "Name": q.name,
            "Uid": q.uid, "ResourceVersion": q.resource_version, "UpdatedAt": _us(q.updated_at),
            "ClusterQueue": q.cluster_queue, "Cohort": q.cohort, "StopPolicy": q.stop_policy, "Stopped": q.stopped,
            "Active": q.active, "ActiveReason": q.active_reason, "ActiveMessage": q.active_message,
            "Pending": q.pending, "Reserving": q.reserving, "Admitted": q.admitted,
            "AdmissionChecks": list(q.admission_checks),
            "Resources": [{"Flavor": r.flavor, "Resource": r.resource, "Nominal": r.nominal,
                           "BorrowingLimit": r.borrowing_limit, "Reserved": r.reserved, "Used": r.used}
                          for r in q.resources],
            "Deleted": q.deleted}
    for p in positions:
        yield POSITIONS, p.run_id, {
            "Cluster": cluster, "RunId": p.run_id, "Namespace": p.namespace, "Workload": p.workload,
            "ClusterQueue": p.cluster_queue, "LocalQueue": p.local_queue,
            "PositionInClusterQueue": p.position_in_cluster_queue,
            "PositionInLocalQueue": p.position_in_local_queue, "PolledAt": _us(p.polled_at)}


def _us(value: int | None) -> str | None:
    """µs since the epoch as a Kusto datetime (RFC 3339, UTC)."""
    return None if value is None else _ts(datetime.fromtimestamp(value / 1e6, UTC))


def _state(run: RunRecord) -> Row:
    return {column: _jsonable(getattr(run, name)) for name, column in STATE_COLUMNS.items()}


def _line(row: Row) -> bytes:
    return json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode()


def _stamp(payload: bytes, ingested_at: datetime) -> bytes:
    """Adds IngestedAt (the time the rows are handed to Kusto) to every row of a payload."""
    field = b'{"IngestedAt":"' + (_ts(ingested_at) or "").encode() + b'",'
    return b"\n".join(field + line[1:] for line in payload.split(b"\n"))


# ------------------------------------------------------------------------------------------ delivery


@dataclass(slots=True)
class AdxSinkStats:
    """Counters for metrics; read from any thread."""

    rows_queued: int = 0  # rows accepted by write()
    rows_sent: int = 0  # rows Kusto accepted
    chunks_sent: int = 0  # ingestion calls that succeeded
    queued_fallbacks: int = 0  # of those, the ones the SDK sent by queued ingestion instead of streaming
    retries: int = 0  # failed ingestion calls that were retried
    spooled_rows: int = 0  # rows that went through the spool
    spool_bytes: int = 0  # bytes in the spool now
    spool_files: int = 0  # files in the spool now
    rejected_rows: int = 0  # rows Kusto refused as permanently invalid (kept in <spool>/rejected/)
    backpressure_waits: int = 0  # times write() waited for room


@dataclass(frozen=True, slots=True)
class _Chunk:
    """Rows of one table for one ingestion call: newline-separated JSON objects without IngestedAt."""

    table: str
    payload: bytes

    @property
    def rows(self) -> int:
        return self.payload.count(b"\n") + 1


class _Spool:
    """Chunks waiting for Kusto, one file each (``<seq>.<table>.jsonl``), oldest first."""

    def __init__(self, root: Path, stats: AdxSinkStats) -> None:
        self.root = root
        self.rejected = root / "rejected"
        self.stats = stats
        root.mkdir(parents=True, exist_ok=True)
        ours, foreign = _spool_files(root)
        rejected, foreign_rejected = _spool_files(self.rejected)
        if foreign or foreign_rejected:  # someone else's files: left alone, never sent, never deleted
            log.warning("adx_spool_foreign_files_ignored",
                        spool_dir=str(root), files=sorted(str(p.relative_to(root)) for p in foreign + foreign_rejected))
        self.files: deque[Path] = deque(ours)
        self.seq = max((_spool_seq(p) for p in [*ours, *rejected]), default=0)
        stats.spool_files = len(self.files)
        stats.spool_bytes = sum(p.stat().st_size for p in self.files)

    def __bool__(self) -> bool:
        return bool(self.files)

    def fits(self, chunk: _Chunk, limit: int) -> bool:
        return self.stats.spool_bytes + len(chunk.payload) <= limit

    def _write(self, directory: Path, chunk: _Chunk) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        self.seq += 1
        path = directory / f"{self.seq:016d}.{chunk.table}.jsonl"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(chunk.payload)
        os.replace(tmp, path)
        return path

    def push(self, chunk: _Chunk) -> None:
        self.files.append(self._write(self.root, chunk))
        self.stats.spool_bytes += len(chunk.payload)
        self.stats.spool_files += 1
        self.stats.spooled_rows += chunk.rows

    def oldest_age_s(self, now: float) -> float:
        try:
            return max(0.0, now - self.files[0].stat().st_mtime)
        except (IndexError, OSError):  # empty, or drained meanwhile (another thread)
            return 0.0

    def peek(self) -> _Chunk:
        path = self.files[0]
        return _Chunk(path.name.split(".")[1], path.read_bytes())

    def pop(self) -> None:
        path = self.files[0]
        size = path.stat().st_size
        path.unlink()
        self.files.popleft()
        # the file count last: a reader that sees it drop sees the file gone and the bytes counted off
        self.stats.spool_bytes -= size
        self.stats.spool_files -= 1

    def reject(self, chunk: _Chunk) -> Path:
        self.stats.rejected_rows += chunk.rows
        return self._write(self.rejected, chunk)


_SPOOL_NAME = re.compile(rf"(\d{{16}})\.({'|'.join(ALL_TABLES)})\.jsonl")


def _spool_files(directory: Path) -> tuple[list[Path], list[Path]]:
    """The ``*.jsonl`` files of a spool directory: the sink's own (``<16-digit seq>.<table>.jsonl`` regular files,
    oldest first) and any other."""
    ours: list[Path] = []
    foreign: list[Path] = []
    for p in sorted(directory.glob("*.jsonl")):
        (ours if _SPOOL_NAME.fullmatch(p.name) and p.is_file() and not p.is_symlink() else foreign).append(p)
    return ours, foreign


def _spool_seq(path: Path) -> int:
    return int(path.name.split(".", 1)[0])


def _is_transient(exc: BaseException) -> bool:
    """Whether a failed ingestion may succeed later: throttling, 408/5xx, network errors, timeouts, auth hiccups."""
    if isinstance(exc, (KustoThrottlingError, KustoNetworkError, KustoBlobError, KustoQueueError,
                        KustoAuthenticationError, TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, KustoApiError) and exc.get_api_error().permanent:
        return False
    if isinstance(exc, KustoServiceError):
        status = getattr(exc.get_raw_http_response(), "status_code", None)
        return status is None or status in (408, 429) or status >= 500
    return False




class AdxSink:
    """History sink into Azure Data Explorer (see the module docstring). Use as a context manager or ``close()``."""

    def __init__(self, settings: AdxSettings) -> None:
        self.settings = settings
        self.stats = AdxSinkStats()
        engine = connection(settings, settings.cluster_uri)
        dm = connection(settings, settings.ingest_uri) if settings.ingest_uri else None
        self._client = ManagedStreamingIngestClient(engine, dm)
        self._props = {t: IngestionProperties(database=settings.database, table=t, data_format=DataFormat.JSON,
                                              ingestion_mapping_reference=mapping_name(t),
                                              ingestion_mapping_kind=IngestionMappingKind.JSON)
                       for t in ALL_TABLES}
        self._memo: OrderedDict[str, dict[RowKey, str | bytes]] = OrderedDict()
        self._queue_memo: OrderedDict[tuple[str, str], str] = OrderedDict()  # (table, key) -> digest last queued
        self._revision = 0
        self._spool = _Spool(settings.spool_dir, self.stats)
        self._cond = threading.Condition()
        self._pending: deque[tuple[str, bytes, float]] = deque()  # (table, row, monotonic time queued)
        self._pending_bytes = 0
        self._busy = False  # the worker holds rows taken from _pending
        self._flushing = 0
        self._closing = threading.Event()
        self._failures = 0  # consecutive failed attempts; > 0 while Kusto is unreachable
        self._next_attempt = 0.0  # monotonic time of the next spool drain attempt
        self._worker = threading.Thread(target=self._run, name="adx-sink", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------------------------ producer side
    def write(self, updates: Sequence[HistoryUpdate]) -> int:
        """Queues the rows of ``updates`` not sent before; returns their number. Blocks only when full."""
        lines: list[tuple[str, bytes]] = []
        for u in updates:
            lines.extend(self._new_rows(u))
        return self._enqueue(lines)

    def _enqueue(self, lines: list[tuple[str, bytes]]) -> int:
        """Queues ``(table, line)`` rows for the worker; blocks only while the queue is full. Their number."""
        with self._cond:
            if self._closing.is_set():
                raise RuntimeError("AdxSink is closed")
            for item in lines:
                if len(self._pending) >= self.settings.queue_max_rows:
                    self.stats.backpressure_waits += 1
                    self._cond.notify_all()
                    self._cond.wait_for(lambda: len(self._pending) < self.settings.queue_max_rows)
                self._pending.append((*item, time.monotonic()))
                self._pending_bytes += len(item[1])
            self.stats.rows_queued += len(lines)
            self._cond.notify_all()
        return len(lines)

    def _new_rows(self, u: HistoryUpdate) -> list[tuple[str, bytes]]:
        run_id = u.run_id
        sent = self._memo.pop(run_id, {})
        memo = dict(sent)  # what this update leaves: the rows it replaces go, its own rows come
        if u.history is not None:  # its rows replace those of the run's previous history
            memo = {k: v for k, v in memo.items() if k[0] in ("P", "MP")}
        if u.full:  # every pod of the run: the others are gone
            memo = {k: v for k, v in memo.items() if k[0] != "P"}
        for uid in u.removed_pods:
            memo.pop(("P", uid), None)
        self._revision = max(self._revision + 1, time.time_ns() // 1_000)
        out = []
        sent_points: set[bytes] | None = None
        points: list[bytes] = []  # the run's points, 8 bytes each (hundreds per run: a digest each would be large)
        for table, key, row in update_rows(u, self.settings.source_cluster):
            if table == POINTS:  # a fact, like a transition
                if sent_points is None:
                    old = sent.get(("MP",), b"")
                    assert isinstance(old, bytes)
                    sent_points = {old[i:i + 8] for i in range(0, len(old), 8)}
                fact = f"{run_id}|{row['Metric']}|{row['Step']}|{row['Value']!r}|{row['At']}"
                points.append(hashlib.blake2b(fact.encode(), digest_size=8).digest())
                if points[-1] not in sent_points:
                    out.append((table, _line({"EventId": _digest(fact), "Revision": self._revision, **row})))
                continue
            if table == TRANSITIONS:  # a fact: the same EventId whenever it is sent
                digest = event_id = _digest(f"{run_id}|{row['Attempt']}|{row['Phase']}|{row['At']}|{row['Reason']}")
            else:
                digest = _digest(json.dumps(row, sort_keys=True, separators=(",", ":")))
                event_id = _digest(f"{digest}|{self._revision}")
            if sent.get(key) != digest:
                out.append((table, _line({"EventId": event_id, "Revision": self._revision, **row})))
            memo[key] = digest
        if u.points is not None:
            memo[("MP",)] = b"".join(sorted(points))
        self._memo[run_id] = memo
        while len(self._memo) > self.settings.memo_max_runs:
            self._memo.popitem(last=False)
        return out

    def write_queues(self, queues: Sequence[QueueState], positions: Sequence[QueuePosition]) -> int:
        """Queues a row per queue state and per position not sent before (``TaugridQueueState``,
        ``TaugridQueuePositions``; a bounded memo of the digest last queued per key); returns their number."""
        self._revision = max(self._revision + 1, time.time_ns() // 1_000)
        lines: list[tuple[str, bytes]] = []
        for table, key, row in queue_rows(queues, positions, self.settings.source_cluster):
            digest = _digest(json.dumps(row, sort_keys=True, separators=(",", ":")))
            memo_key = (table, key)
            if self._queue_memo.get(memo_key) != digest:
                lines.append((table, _line({"EventId": _digest(f"{digest}|{self._revision}"),
                                            "Revision": self._revision, **row})))
            self._queue_memo[memo_key] = digest
            self._queue_memo.move_to_end(memo_key)
        while len(self._queue_memo) > self.settings.memo_max_runs:
            self._queue_memo.popitem(last=False)
        return self._enqueue(lines)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Sends the queued rows now; True once each was accepted by Kusto or spooled (False on timeout)."""
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout_s)
            finally:
                self._flushing -= 1

    def close(self, timeout_s: float | None = None) -> None:
        """Delivers (or spools) every queued row and stops the worker. The spool is kept for the next start."""
        with self._cond:
            self._closing.set()
            self._cond.notify_all()
        self._worker.join(timeout_s)
        self._client.close()

    def __enter__(self) -> AdxSink:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def spool_bytes(self) -> int:
        return self.stats.spool_bytes

    def spool_oldest_age_s(self, now: float | None = None) -> float:
        """Seconds since the oldest file in the spool was written (0 with an empty spool); any thread."""
        return self._spool.oldest_age_s(time.time() if now is None else now)

    # ------------------------------------------------------------------------------------ worker side
    def _batch_due(self, now: float) -> bool:
        s = self.settings
        return bool(self._pending) and (
            self._closing.is_set() or self._flushing > 0 or len(self._pending) >= s.batch_max_rows
            or self._pending_bytes >= s.batch_max_bytes or now - self._pending[0][2] >= s.batch_max_delay_s)

    def _wait_s(self, now: float) -> float | None:
        waits = []
        if self._pending:
            waits.append(self._pending[0][2] + self.settings.batch_max_delay_s - now)
        if self._spool:
            waits.append(self._next_attempt - now)
        return max(0.0, min(waits)) if waits else None

    def _take_batch(self) -> list[_Chunk]:
        s = self.settings
        by_table: dict[str, list[bytes]] = {}
        rows = size = 0
        while self._pending and rows < s.batch_max_rows:
            table, line, _ = self._pending[0]
            if rows and size + len(line) > s.batch_max_bytes:
                break
            self._pending.popleft()
            self._pending_bytes -= len(line)
            by_table.setdefault(table, []).append(line)
            rows += 1
            size += len(line) + 1
        return [_Chunk(table, b"\n".join(lines)) for table, lines in by_table.items()]

    def _run(self) -> None:
        backlog: deque[_Chunk] = deque()  # taken from _pending, neither accepted nor spooled yet
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    closing = self._closing.is_set()
                    if not backlog and self._batch_due(now):
                        backlog.extend(self._take_batch())
                        self._busy = True
                        self._cond.notify_all()
                        break
                    if backlog or (self._spool and now >= self._next_attempt):
                        break
                    if closing and not self._pending:
                        return
                    self._cond.wait(self._wait_s(now))
            self._deliver(backlog)
            if not backlog:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _deliver(self, backlog: deque[_Chunk]) -> None:
        closing = self._closing.is_set()
        # Spooled rows go first; on close, one more try unless Kusto just failed.
        while self._spool and ((closing and self._failures == 0) or time.monotonic() >= self._next_attempt):
            chunk = self._spool.peek()
            if not self._attempt(chunk, retries=0):
                break
            self._spool.pop()
        if self._spool:  # Kusto is still away: newer rows queue up behind the spooled ones
            self._to_spool(backlog, closing)
            return
        while backlog:
            if not self._attempt(backlog[0], retries=0 if closing else self.settings.retry_attempts - 1):
                self._to_spool(backlog, closing)
                return
            backlog.popleft()

    def _to_spool(self, backlog: deque[_Chunk], closing: bool) -> None:
        # On close, rows go to disk even past the bound: nothing is dropped.
        while backlog and (closing or self._spool.fits(backlog[0], self.settings.spool_max_bytes)):
            self._spool.push(backlog.popleft())
        if backlog:
            log.warning("adx_spool_full", spool_bytes=self.stats.spool_bytes,
                        held_chunks=len(backlog))
            self._closing.wait(min(self.settings.retry_max_s, max(0.0, self._next_attempt - time.monotonic())))

    def _attempt(self, chunk: _Chunk, retries: int) -> bool:
        """Ingests one chunk, retrying transient failures; True if accepted (or rejected as permanently bad)."""
        for attempt in range(retries + 1):
            try:
                queued = call_with_deadline(lambda: self._ingest(chunk), timeout_s=self.settings.ingest_timeout_s,
                                            what="ingestion call")
            except Exception as exc:
                if not _is_transient(exc):
                    path = self._spool.reject(chunk)
                    log.error("adx_rows_rejected", table=chunk.table, rows=chunk.rows,
                              path=str(path), error=str(exc))
                    return True
                self._failures += 1
                delay = min(self.settings.retry_max_s, self.settings.retry_initial_s * 2 ** (self._failures - 1))
                self._next_attempt = time.monotonic() + delay
                log.warning("adx_ingestion_failed", table=chunk.table, rows=chunk.rows, attempt=attempt + 1,
                            retry_in_s=delay, error=str(exc))
                if attempt < retries:
                    self.stats.retries += 1
                    if self._closing.wait(delay):
                        return False
                continue
            self._failures = 0
            self.stats.chunks_sent += 1
            self.stats.rows_sent += chunk.rows
            self.stats.queued_fallbacks += int(queued)
            return True
        return False

    def _ingest(self, chunk: _Chunk) -> bool:
        payload = _stamp(chunk.payload, datetime.now(UTC))
        result = self._client.ingest_from_stream(StreamDescriptor(io.BytesIO(payload), size=len(payload)),
                                                 ingestion_properties=self._props[chunk.table])
        return bool(result.status == IngestionStatus.QUEUED)
