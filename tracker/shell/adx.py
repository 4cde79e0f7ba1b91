"""Azure Data Explorer sink: run histories as rows of the TauGrid tables next to adx-mon's GPU telemetry.

``AdxSink.write`` turns each ``HistoryUpdate`` (what changed in one run: its history, its metric points, the pods
that changed) into rows of the tables declared in ``schemas/kusto/010-tables.kql`` (``tracker.shell.adx_rows``, whose
names this module re-exports) and queues only the rows this
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
``TaugridQueuePositionsLatest``. ``AdxSink.write_nodes`` likewise: a row of ``TaugridNodeState`` per change of a
Node's newest state (GPU model and count, conditions, cordon), read through ``TaugridNodeStateLatest``.
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
from collections.abc import Iterable, Sequence
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
from tracker.core.model import HistoryUpdate
from tracker.core.nodes import NodeState
from tracker.core.queues import QueuePosition, QueueState
from tracker.settings import AdxSettings

# re-exported: the rows are tracker.shell.adx_rows'
from tracker.shell.adx_rows import ALL_TABLES as ALL_TABLES
from tracker.shell.adx_rows import ATTEMPTS as ATTEMPTS
from tracker.shell.adx_rows import CHECKPOINTS as CHECKPOINTS
from tracker.shell.adx_rows import METRICS as METRICS
from tracker.shell.adx_rows import NODE_TABLES as NODE_TABLES
from tracker.shell.adx_rows import NODES as NODES
from tracker.shell.adx_rows import PODS as PODS
from tracker.shell.adx_rows import POINTS as POINTS
from tracker.shell.adx_rows import POSITIONS as POSITIONS
from tracker.shell.adx_rows import QUEUE_TABLES as QUEUE_TABLES
from tracker.shell.adx_rows import QUEUES as QUEUES
from tracker.shell.adx_rows import STATE as STATE
from tracker.shell.adx_rows import STATE_COLUMNS as STATE_COLUMNS
from tracker.shell.adx_rows import TABLES as TABLES
from tracker.shell.adx_rows import TRANSITIONS as TRANSITIONS
from tracker.shell.adx_rows import Row as Row
from tracker.shell.adx_rows import RowKey as RowKey
from tracker.shell.adx_rows import history_rows as history_rows
from tracker.shell.adx_rows import mapping_name as mapping_name
from tracker.shell.adx_rows import node_rows as node_rows
from tracker.shell.adx_rows import queue_rows as queue_rows
from tracker.shell.adx_rows import row_digest, row_line, stamp_ingested
from tracker.shell.adx_rows import update_rows as update_rows
from tracker.shell.deadline import call_with_deadline

log = structlog.get_logger("tracker.adx")

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
    try:
        credential = WorkloadIdentityCredential(client_id=settings.client_id or None,
                                                tenant_id=settings.tenant_id or None)
    except ValueError:  # azure-identity's own message is a paragraph with a link; say what is missing, in one line
        missing = [name for name, value in (
            ("AZURE_TENANT_ID (or TRACKER_ADX__TENANT_ID)", settings.tenant_id or os.environ.get("AZURE_TENANT_ID")),
            ("AZURE_CLIENT_ID (or TRACKER_ADX__CLIENT_ID)", settings.client_id or os.environ.get("AZURE_CLIENT_ID")),
            ("AZURE_FEDERATED_TOKEN_FILE", os.environ.get("AZURE_FEDERATED_TOKEN_FILE"))) if not value]
        raise errors.ConfigError(
            "ADX auth workload-identity is not configured: missing " + (", ".join(missing) or "its settings") +
            " (the AKS workload identity webhook sets them in the pod; or set adx.auth to managed-identity"
            " or app-secret)") from None
    return KustoConnectionStringBuilder.with_azure_token_credential(uri, credential=credential)


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


_POINTS_MEMO = 20_000  # metric points a run's memo remembers as sent (8 bytes each), beyond those a run holds
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
                    out.append((table, row_line({"EventId": row_digest(fact), "Revision": self._revision, **row})))
                continue
            if table == TRANSITIONS:  # a fact: the same EventId whenever it is sent
                digest = event_id = row_digest(f"{run_id}|{row['Attempt']}|{row['Phase']}|{row['At']}|{row['Reason']}")
            else:
                digest = row_digest(json.dumps(row, sort_keys=True, separators=(",", ":")))
                event_id = row_digest(f"{digest}|{self._revision}")
            if sent.get(key) != digest:
                out.append((table, row_line({"EventId": event_id, "Revision": self._revision, **row})))
            memo[key] = digest
        if u.full or u.points_full:  # every point of the run: those it does not hold are gone
            memo[("MP",)] = b"".join(sorted(points))
        elif points:  # the points that changed: added to those sent (at most _POINTS_MEMO a run, then only these)
            old = sent.get(("MP",), b"")
            assert isinstance(old, bytes)
            kept = {old[i:i + 8] for i in range(0, len(old), 8)} | set(points)
            memo[("MP",)] = b"".join(sorted(kept if len(kept) <= _POINTS_MEMO else points))
        self._memo[run_id] = memo
        while len(self._memo) > self.settings.memo_max_runs:
            self._memo.popitem(last=False)
        return out

    def write_queues(self, queues: Sequence[QueueState], positions: Sequence[QueuePosition]) -> int:
        """Queues a row per queue state and per position not sent before (``TaugridQueueState``,
        ``TaugridQueuePositions``; a bounded memo of the digest last queued per key); returns their number."""
        return self._write_keyed(queue_rows(queues, positions, self.settings.source_cluster))

    def write_nodes(self, nodes: Sequence[NodeState]) -> int:
        """Queues a row per Node state not sent before (``TaugridNodeState``, the same memo as the queues');
        returns their number."""
        return self._write_keyed(node_rows(nodes, self.settings.source_cluster))

    def _write_keyed(self, rows: Iterable[tuple[str, str, dict[str, Any]]]) -> int:
        """Rows that are no part of a run, newest per (table, key): those whose digest changed are queued."""
        self._revision = max(self._revision + 1, time.time_ns() // 1_000)
        lines: list[tuple[str, bytes]] = []
        for table, key, row in rows:
            digest = row_digest(json.dumps(row, sort_keys=True, separators=(",", ":")))
            memo_key = (table, key)
            if self._queue_memo.get(memo_key) != digest:
                lines.append((table, row_line({"EventId": row_digest(f"{digest}|{self._revision}"),
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
        payload = stamp_ingested(chunk.payload, datetime.now(UTC))
        result = self._client.ingest_from_stream(StreamDescriptor(io.BytesIO(payload), size=len(payload)),
                                                 ingestion_properties=self._props[chunk.table])
        return bool(result.status == IngestionStatus.QUEUED)
