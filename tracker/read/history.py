"""A run's rows as the model's classes (``RunHistory``, ``RunRecord``): what ``IndexReader.history`` and
``IndexReader.records`` give, for ``tracker show``, ``compare``, the web view's run page and the demo.

Apart from ``tracker.read.store`` because it imports the model (pydantic), which ``tracker runs`` never pays for:
the store imports this module only when one of those two is called. An index of an older schema is read as it is,
the columns added since taking the model's defaults.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from typing import Any

from tracker.core.model import (
    Attempt,
    CheckpointRecord,
    LedgerSpan,
    MetricPoint,
    MetricSummary,
    PodPlacement,
    ResumeLink,
    RunHistory,
    RunRecord,
    Transition,
    field_names,
    load,
)
from tracker.read.filters import exact

# The runs table's JSON object columns (decoded into dicts).
_JSON_OBJECTS = ("evictions_by", "lost_gpu_hours_by", "pending_s_by", "ledger_gpu_hours_by", "ledger_wall_s_by")


def rows(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
    cur = conn.cursor()
    cur.row_factory = sqlite3.Row
    return cur.execute(sql, params).fetchall()


def _of_run(conn: sqlite3.Connection, table: str, run_id: str, order: str) -> list[sqlite3.Row]:
    return rows(conn, f"SELECT * FROM {table} WHERE run_id = ? ORDER BY {order}", (run_id,))


def _columns(row: sqlite3.Row, fields: Sequence[str]) -> dict[str, Any]:
    """The row's value of each field it has: a reader of an index of an older schema (which it may not migrate)
    gets the model's defaults for the columns added since (e.g. the GPU columns of version 4)."""
    have = set(row.keys())
    return {c: row[c] for c in fields if c in have}


# the order of a run's checkpoints and ledger spans in its history (since schema 8): checkpoints by start time (else
# end time; neither: first, as the epoch), kind, step and uri; spans in time order
_CHECKPOINT_ORDER = ("(CASE WHEN coalesce(started_at, ended_at) IS NULL THEN '1970-01-01T00:00:00.000000Z' ELSE "
                     + exact("coalesce(started_at, ended_at)") + " END), kind, step, uri")
_SPAN_ORDER = exact("start") + ", " + exact('"end"') + ", category"
_ATTEMPT_JSON = ("lost_gpu_hours_by", "admission_steps", "pending", "pending_s_by", "ledger_gpu_hours_by",
                 "ledger_wall_s_by")
_NAN_COLUMNS = ("first_value", "latest_value", "min_value", "max_value")  # NaN is stored as NULL


def load_history(conn: sqlite3.Connection, run_id: str, version: int) -> RunHistory | None:

    found = rows(conn, "SELECT * FROM runs WHERE run_id = ?", (run_id,))
    if not found:
        return None
    row = found[0]
    transitions = [load(Transition, {c: r[c] for c in field_names(Transition)})
                   for r in _of_run(conn, "transitions", run_id, "ordinal")]
    attempts = []
    for r in _of_run(conn, "attempts", run_id, "attempt"):
        data = _columns(r, field_names(Attempt))
        data["failures"] = json.loads(data["failures"])
        if "pods" in r.keys():  # noqa: SIM118 (a Row's `in` looks at its values)  an index of schema 5 or older
            data["pod_count"] = len(json.loads(r["pods"]))
            data["failed_pods"] = len(data["failures"])
        for c in _ATTEMPT_JSON:
            if c in data:
                data[c] = json.loads(data[c])
        attempts.append(load(Attempt, data))
    metrics = []
    for r in _of_run(conn, "metric_summaries", run_id, "metric"):
        data = {c: r[c] for c in field_names(MetricSummary)}
        for c in _NAN_COLUMNS:
            if data[c] is None:
                data[c] = math.nan
        metrics.append(load(MetricSummary, data))
    links = [load(ResumeLink, dict(r)) for r in _of_run(conn, "resume_links", run_id, "resume_of")]
    points = [load(MetricPoint, dict(r)) for r in _of_run(conn, "metric_points", run_id, "metric, step")] \
        if version >= 5 else []  # an older index, read as it is, has none
    # by attempt, then creation time (none first, as the reducer orders them), name and uid
    order = f"attempt, created_at IS NOT NULL, {exact('created_at')}, pod" + (", uid" if version >= 6 else "")
    pods = []
    for r in _of_run(conn, "pod_placements", run_id, order):
        data = _columns(r, field_names(PodPlacement))
        data.setdefault("uid", f"v5:{r['attempt']}:{r['pod']}")  # an index of schema 5 or older, read as it is
        data.setdefault("namespace", row["namespace"])
        pods.append(load(PodPlacement, data))
    checkpoints: list[CheckpointRecord] = []
    spans: list[LedgerSpan] = []
    if version >= 8:  # an older index, read as it is, has none
        checkpoints = [load(CheckpointRecord, _columns(r, field_names(CheckpointRecord)))
                       for r in _of_run(conn, "checkpoints", run_id, _CHECKPOINT_ORDER)]
        spans = [load(LedgerSpan, _columns(r, field_names(LedgerSpan)))
                 for r in _of_run(conn, "ledger_spans", run_id, _SPAN_ORDER)]
    return RunHistory(run=load_record(row), transitions=transitions, attempts=attempts, metrics=metrics,
                      resume_links=links, metric_points=points, pods=pods, checkpoints=checkpoints, ledger=spans)


def load_record(row: sqlite3.Row) -> RunRecord:
    data = _columns(row, field_names(RunRecord))
    data["input_refs"] = json.loads(data["input_refs"])
    if "evictions_by" in data and data["evictions_by"] is None:  # a row written before schema 9: the default
        del data["evictions_by"]
    for c in _JSON_OBJECTS:
        if c in data:
            data[c] = json.loads(data[c])
    return load(RunRecord, data)
