"""A run's rows as the model's classes (``RunHistory``, ``RunRecord``): what ``IndexReader.history`` and
``IndexReader.records`` give, for ``tracker show``, ``compare``, the web view's run page and the demo; and a history
as the published JSON document (``document``: ``tracker show -o json``).

The one place the read side turns the index's rows into the model's rows. Standard library only (issue 28: ``show``
and ``compare`` start without pydantic, tests/read/test_show_light.py): the model's rows are plain dataclasses, and
``build`` makes one from a row's columns, converting each value by its field's declared type (``datetime`` from the
index's ISO-8601 text, enums from their values, ``float`` and ``dict[str, float]`` values as floats, nested rows),
as pydantic's validation would; ``document`` writes a history as ``tracker.core.model.to_json`` (pydantic) does. A
test reads every run of the demo index both ways and compares. The index is the tracker's own output, written from
these classes, so it is converted and not validated again. A field of a type ``build`` has no conversion for is a
``TypeError`` at the first read (add it to ``_converter``). An index of an older schema is read as it is, the columns
added since taking the model's defaults.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from enum import Enum
from typing import Any, TypeVar, cast

from tracker.core import model
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
)
from tracker.core.vocab import GoodputCategory, PendingCategory, Phase, Status
from tracker.read.filters import exact

_T = TypeVar("_T")

# The runs table's JSON object columns (decoded into dicts).
_JSON_OBJECTS = ("evictions_by", "lost_gpu_hours_by", "pending_s_by", "ledger_gpu_hours_by", "ledger_wall_s_by",
                 "hyperparameters", "images")  # images: a JSON array, decoded alike


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
    transitions = [build(Transition, {c: r[c] for c in field_names(Transition)})
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
        attempts.append(build(Attempt, data))
    metrics = []
    for r in _of_run(conn, "metric_summaries", run_id, "metric"):
        data = {c: r[c] for c in field_names(MetricSummary)}
        for c in _NAN_COLUMNS:
            if data[c] is None:
                data[c] = math.nan
        metrics.append(build(MetricSummary, data))
    links = [build(ResumeLink, dict(r)) for r in _of_run(conn, "resume_links", run_id, "resume_of")]
    points = [build(MetricPoint, dict(r)) for r in _of_run(conn, "metric_points", run_id, "metric, step")] \
        if version >= 5 else []  # an older index, read as it is, has none
    # by attempt, then creation time (none first, as the reducer orders them), name and uid
    order = f"attempt, created_at IS NOT NULL, {exact('created_at')}, pod" + (", uid" if version >= 6 else "")
    pods = []
    for r in _of_run(conn, "pod_placements", run_id, order):
        data = _columns(r, field_names(PodPlacement))
        data.setdefault("uid", f"v5:{r['attempt']}:{r['pod']}")  # an index of schema 5 or older, read as it is
        data.setdefault("namespace", row["namespace"])
        pods.append(build(PodPlacement, data))
    checkpoints: list[CheckpointRecord] = []
    spans: list[LedgerSpan] = []
    if version >= 8:  # an older index, read as it is, has none
        checkpoints = [build(CheckpointRecord, _columns(r, field_names(CheckpointRecord)))
                       for r in _of_run(conn, "checkpoints", run_id, _CHECKPOINT_ORDER)]
        spans = [build(LedgerSpan, _columns(r, field_names(LedgerSpan)))
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
    return build(RunRecord, data)


# ------------------------------------------------------------------------------------------ rows without pydantic

_ENUMS: dict[str, type[Enum]] = {"Phase": Phase, "Status": Status, "PendingCategory": PendingCategory,
                                 "GoodputCategory": GoodputCategory}
# as the index gives them (a JSON scalar keeps its JSON type: pydantic's smart union does the same for hyperparameters)
_SAME = ("str", "int", "bool", "list[str]", "dict[str, int]", "dict[str, str]",
         "dict[str, str | int | float | bool | None]")
_PLANS: dict[type[Any], tuple[tuple[str, Callable[[Any], Any] | None], ...]] = {}


def build(cls: type[_T], data: dict[str, Any]) -> _T:
    """A model row (a dataclass of ``tracker.core.model``) of plain data (a row's columns, JSON values), each value
    converted by its field's type (None stays None); a field missing from ``data`` takes its default."""
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = tuple((f.name, _converter(str(f.type))) for f in dataclasses.fields(cast(Any, cls)))
    values = {}
    for name, convert in plan:
        if name in data:
            value = data[name]
            values[name] = value if convert is None or value is None else convert(value)
    return cls(**values)


def _base(annotation: str) -> str:
    """The type a field's annotation (a string: the model uses ``from __future__ import annotations``) declares:
    without ``Annotated[...]``'s metadata and without ``| None``."""
    t = annotation.strip()
    if t.startswith("Annotated["):
        depth = 0
        for i, ch in enumerate(t[10:], 10):
            if ch in "[(":
                depth += 1
            elif ch in "])":
                depth -= 1
            elif ch == "," and depth == 0:
                t = t[10:i].strip()
                break
    return " | ".join(part.strip() for part in t.split(" | ") if part.strip() != "None")


def _converter(annotation: str) -> Callable[[Any], Any] | None:
    t = _base(annotation)
    if t in _SAME or t.startswith("Literal["):
        return None
    if t == "float":
        return float
    if t == "datetime":
        return _time
    if t in _ENUMS:
        return _ENUMS[t]
    if t == "dict[str, float]":
        return lambda d: {k: float(v) for k, v in d.items()}
    if t.startswith("list[") and t.endswith("]") and dataclasses.is_dataclass(getattr(model, t[5:-1], None)):
        row: type[Any] = getattr(model, t[5:-1])
        return lambda items: [build(row, item) for item in items]
    raise TypeError(f"tracker.read.history.build has no conversion for a field of type {annotation!r}")


def _time(value: Any) -> datetime:
    """The index's ISO-8601 UTC text ('...Z') as an aware datetime (a naive time is UTC, as pydantic reads it)."""
    dt = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt


def document(history: RunHistory) -> dict[str, Any]:
    """The history as JSON values, as ``tracker.core.model.to_json`` writes it (the published history schema,
    schemas/history/v5.schema.json): fields in their order, times as ISO-8601 with a Z (microseconds when there
    are any), enums as their values, floats as they are (NaN too)."""
    out: dict[str, Any] = _plain(history)
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return _time_text(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _time_text(dt: datetime) -> str:
    text = dt.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text
