"""The rows of the Azure Data Explorer sink: what a run's ``HistoryUpdate`` (and a queue's state, a pending run's
position, a Node's state) becomes in the TauGrid tables (``schemas/kusto/010-tables.kql``), one JSON line per row.

Pure encoding, no I/O: ``tracker.shell.adx`` (the sink, which re-exports every name here) decides which rows are
new (its memo of the digest last queued per row key) and delivers them. A row's key (``RowKey``) names the row a
change of it replaces; the row identity rules (``EventId``, ``Revision``) are in ``tracker.shell.adx``'s docstring.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from tracker.core.model import HistoryUpdate, MetricPoint, PodPlacement, RunHistory, RunRecord
from tracker.core.nodes import NodeState
from tracker.core.queues import QueuePosition, QueueState

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
NODES = "TaugridNodeState"
NODE_TABLES = (NODES,)  # the Nodes runs ran on (``write_nodes``)
ALL_TABLES = TABLES + QUEUE_TABLES + NODE_TABLES

def mapping_name(table: str) -> str:
    """The JSON ingestion mapping of a table (schemas/kusto/020-mappings.kql)."""
    return f"{table}_json"


Row = dict[str, Any]
RowKey = tuple[str | int, ...]

# RunRecord field -> TaugridRunState column (every field; tests/index/test_adx_sink.py checks both sides).
STATE_COLUMNS: dict[str, str] = {
    "run_id": "RunId", "kind": "Kind", "namespace": "Namespace", "name": "Name", "uid": "Uid",
    "project": "Project", "workspace": "Workspace", "target": "Target", "queue": "Queue",
    "cluster_queue": "ClusterQueue", "status": "Status", "reason": "Reason", "message": "Message",
    "phase": "Phase", "attempts": "Attempts", "retries": "Retries", "evictions": "Evictions",
    "evictions_by": "EvictionsBy",
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
    "images": "Images", "entrypoint": "Entrypoint", "hyperparameters": "Hyperparameters",
    "hyperparameters_omitted": "HyperparametersOmitted",
}
# The GPU accounting of an attempt (schemas/gpu-accounting.md): the same columns as TaugridRunState's.
_GPU_FIELDS = ("gpus", "gpu_hours", "lost_gpu_hours", "lost_gpu_hours_by", "gpus_open", "open_since")


def _ts(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _jsonable(value: Any) -> Any:
    return _ts(value) if isinstance(value, datetime) else value


def row_digest(text: str) -> str:
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


def node_rows(nodes: Iterable[NodeState], cluster: str) -> Iterator[tuple[str, str, Row]]:
    """(table, key, row without EventId/Revision/IngestedAt) of each Node's newest state, as the index keeps it
    (``tracker.shell.index_nodes``)."""
    for n in nodes:
        ready = n.condition("Ready")
        yield NODES, n.key, {
            "Cluster": cluster, "Node": n.name, "Uid": n.uid, "ResourceVersion": n.resource_version,
            "CreatedAt": _us(n.created_at), "UpdatedAt": _us(n.updated_at), "GpuProduct": n.gpu_product,
            "GpuCount": n.gpu_count, "Ready": n.ready, "ReadySince": None if ready is None else _us(ready.since),
            "Unschedulable": n.unschedulable, "Labels": dict(n.labels), "Capacity": dict(n.capacity),
            "Allocatable": dict(n.allocatable),
            "Conditions": [{"Type": c.type, "Status": c.status, "Reason": c.reason, "Message": c.message,
                            "Since": _us(c.since)} for c in n.conditions],
            "Taints": [{"Key": k, "Effect": e} for k, e in n.taints], "Deleted": n.deleted,
            "DeletedAt": _us(n.deleted_at)}


def _us(value: int | None) -> str | None:
    """µs since the epoch as a Kusto datetime (RFC 3339, UTC)."""
    return None if value is None else _ts(datetime.fromtimestamp(value / 1e6, UTC))


def _state(run: RunRecord) -> Row:
    return {column: _jsonable(getattr(run, name)) for name, column in STATE_COLUMNS.items()}


def row_line(row: Row) -> bytes:
    return json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode()


def stamp_ingested(payload: bytes, ingested_at: datetime) -> bytes:
    """Adds IngestedAt (the time the rows are handed to Kusto) to every row of a payload."""
    field = b'{"IngestedAt":"' + (_ts(ingested_at) or "").encode() + b'",'
    return b"\n".join(field + line[1:] for line in payload.split(b"\n"))
