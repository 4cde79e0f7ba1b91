"""The experiment index's tables and how a run's update becomes their rows (``tracker.shell.index`` writes them).

Encoding is the writer's hottest part (a replay writes every changed run at every flush), so each row object is
read with one ``operator.attrgetter`` call and only values that are not plain SQLite scalars go through ``_cell``,
by their exact type first.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from tracker import errors
from tracker.core.model import (
    Attempt,
    CheckpointRecord,
    HistoryUpdate,
    LedgerSpan,
    MetricPoint,
    MetricSummary,
    PodPlacement,
    ResumeLink,
    RunRecord,
    Transition,
    field_names,
    iso,
)
from tracker.core.timefmt import ts

SqlValue = str | int | float | bytes | None
Row = tuple[SqlValue, ...]
OffsetKey = tuple[str, str, int]  # (consumer group, topic, partition)


@dataclass(frozen=True, slots=True)
class Table:
    """One table's columns, its primary key (run_id first, except consumer_offsets) and its statements."""

    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    upsert: str  # insert, or update only when the content differs (unchanged rows count no change)
    delete: str  # one row by key
    run_keys: str  # the keys, without run_id, of one run's rows
    runs_keys: str  # run_id and the keys of the rows of several runs: append "(?, ?, ...)"


def table(name: str, columns: tuple[str, ...], key: tuple[str, ...],
           unversioned: tuple[str, ...] = (), nullable: tuple[str, ...] = ()) -> Table:
    """``unversioned``: columns that are not content (written, but a difference alone is no change). ``nullable``:
    key columns that may be NULL, one value for the key (the table's unique index has ``ifnull(column, '')``)."""
    target = ", ".join(f"ifnull(\"{c}\", '')" if c in nullable else f'"{c}"' for c in key)
    head = f"INSERT INTO {name} ({_names(columns)}) VALUES ({', '.join('?' for _ in columns)}) " \
           f"ON CONFLICT ({target})"
    values = [c for c in columns if c not in key]
    assign = ", ".join(f'"{c}" = excluded."{c}"' for c in values)
    differs = " OR ".join(f'{name}."{c}" IS NOT excluded."{c}"' for c in values if c not in unversioned)
    return Table(
        name, columns, key,
        upsert=f"{head} DO UPDATE SET {assign} WHERE {differs}" if values else f"{head} DO NOTHING",
        delete=f"DELETE FROM {name} WHERE " + " AND ".join(f'"{c}" {"IS" if c in nullable else "="} ?' for c in key),
        run_keys=f"SELECT {_names(key[1:])} FROM {name} WHERE run_id = ?",
        runs_keys=f"SELECT {_names(key)} FROM {name} WHERE run_id IN ",
    )


def _names(columns: Sequence[str]) -> str:
    return ", ".join(f'"{c}"' for c in columns)


RUNS = table("runs", (*field_names(RunRecord), "updated_seq"), ("run_id",), unversioned=("updated_seq",))
TRANSITIONS = table("transitions", (*field_names(Transition), "ordinal"), ("run_id", "attempt", "phase"))
ATTEMPTS = table("attempts", field_names(Attempt), ("run_id", "attempt"))
PLACEMENTS = table("pod_placements", field_names(PodPlacement), ("run_id", "uid"))  # keyed by uid since schema 6
METRICS = table("metric_summaries", field_names(MetricSummary), ("run_id", "metric"))
LINKS = table("resume_links", field_names(ResumeLink), ("run_id", "resume_of"))
POINTS = table("metric_points", field_names(MetricPoint), ("run_id", "metric", "step"))  # since schema 5
# since schema 8: a run's checkpoints (a save's start may be unknown) and ledger spans, children of its history
CHECKPOINTS = table("checkpoints", ("run_id", *field_names(CheckpointRecord)),
                      ("run_id", "kind", "step", "uri", "started_at"), nullable=("started_at",))
SPANS = table("ledger_spans", ("run_id", *field_names(LedgerSpan)), ("run_id", "category", "start"))
OFFSETS = table("consumer_offsets", ("consumer_group", "topic", "partition", "next_offset"),
                  ("consumer_group", "topic", "partition"))
# A run's rows that its history replaces, beside its runs row (parents before children: deletes run in reverse).
CHILDREN = (TRANSITIONS, ATTEMPTS, METRICS, LINKS, CHECKPOINTS, SPANS)


@dataclass(frozen=True, slots=True)
class Encoded:
    """One run's update as table rows, ready to write."""

    run_id: str
    run: Row | None  # without updated_seq; None: the history did not change (not in the update)
    children: tuple[list[Row], ...]  # aligned with CHILDREN
    points: list[Row] | None  # added or changed point rows (None: none)
    pods: list[Row]  # changed pod rows
    removed: list[str]  # uids of pods no longer the run's
    full: bool  # pods (and points) are all of the run's
    removed_points: list[tuple[str, int]]  # (metric, step) of points no longer kept
    points_full: bool  # points are all of the run's


# ------------------------------------------------------------------------------------------ encoding


def _aware(dt: datetime) -> datetime:
    """A naive datetime is UTC (the core's convention for timestamps)."""
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


_ZERO = timedelta(0)


def _when(dt: datetime | None) -> str | None:
    """The index's time text: ISO-8601 UTC with a Z, microseconds only when not zero (``model.iso``'s form)."""
    if dt is None:
        return None
    if dt.tzinfo is UTC or (dt.tzinfo is not None and dt.utcoffset() == _ZERO):
        # the rows' own times, and those pydantic decoded from the transitions topic (its own UTC tzinfo): datetime's
        # isoformat is that form, with +00:00 for the Z
        return dt.isoformat()[:-6] + "Z"
    return iso(ts(_aware(dt)))


_SCALAR = frozenset({str, int, bool, type(None)})  # stored as they are (exact types: an enum is none of them)
_FIELDS: dict[type, tuple[str, ...] | None] = {}  # a type's dataclass fields (None: not a dataclass)


def _fields_of(t: type) -> tuple[str, ...] | None:
    names = _FIELDS.get(t, ())
    if names == ():
        names = tuple(f.name for f in dataclasses.fields(t)) if dataclasses.is_dataclass(t) else None
        _FIELDS[t] = names
    return names


def _plain(value: Any) -> Any:
    """A row value as JSON-ready data, with times in the index's text format."""
    t = type(value)
    if t in _SCALAR:
        return value
    if t is datetime:
        return _when(value)
    if t is list:
        return [_plain(v) for v in value]
    names = _fields_of(t)
    if names is not None:
        return {n: _plain(getattr(value, n)) for n in names}
    if isinstance(value, datetime):
        return _when(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class RefusedUpdate(errors.InvalidInput):
    """An update the index cannot store as it is (rows of other runs, a key twice, a NaN inside a JSON column, a
    consumer offset that is not one): a sink skips it and goes on."""


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:  # NaN or infinity: JSON has no such number
        raise RefusedUpdate(f"cannot store {exc}") from exc


def _json(items: list[Any]) -> str:
    return _dumps(_plain(items))


def _float(value: float) -> SqlValue:
    return None if math.isnan(value) else value


def _cell(value: object) -> SqlValue:
    """A value as an SQLite value (the scalars of ``_SCALAR`` are never passed: ``_row`` keeps them)."""
    convert = _CONVERT.get(type(value))
    if convert is not None:
        return convert(value)
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, datetime):
        return _when(value)
    if isinstance(value, list):
        return _json(value)
    if isinstance(value, dict):
        return _dumps(value)
    raise TypeError(f"cannot store a {type(value).__name__} in the experiment index")


_CONVERT: dict[type, Callable[[Any], SqlValue]] = {
    datetime: _when, list: lambda v: _json(v) if v else "[]", dict: lambda v: _dumps(v) if v else "{}",
    float: _float}
_GETTERS: dict[tuple[str, ...], Callable[[Any], tuple[Any, ...]]] = {}


def _getter(columns: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """One call that reads ``columns`` of a row object, as a tuple."""
    get = _GETTERS.get(columns)
    if get is None:
        if len(columns) == 1:
            one = operator.attrgetter(columns[0])
            get = _GETTERS[columns] = lambda value: (one(value),)
        else:
            get = _GETTERS[columns] = operator.attrgetter(*columns)
    return get


def _row(value: Any, columns: tuple[str, ...]) -> Row:
    return tuple([v if type(v) in _SCALAR else _cell(v) for v in _getter(columns)(value)])


_TRANSITION_FIELDS = field_names(Transition)
_CHECKPOINT_FIELDS = CHECKPOINTS.columns[1:]
_SPAN_FIELDS = SPANS.columns[1:]
_RUN_FIELDS = RUNS.columns[:-1]
UID, ATTEMPT, POD = (PLACEMENTS.columns.index(c) for c in ("uid", "attempt", "pod"))


def encode(u: HistoryUpdate) -> Encoded:
    """An update as rows; RefusedUpdate if it is not one run's consistent update."""
    run_id = u.run_id
    h = u.history
    owners = [*(p.run_id for p in u.points or ()), *(p.run_id for p in u.pods)]
    if h is not None:
        owners += [h.run.run_id, *(t.run_id for t in h.transitions), *(a.run_id for a in h.attempts),
                   *(m.run_id for m in h.metrics), *(link.run_id for link in h.resume_links)]
    foreign = sorted({o for o in owners if o != run_id})
    if foreign:
        raise RefusedUpdate(f"update of run {run_id!r} holds rows of other runs: {foreign[:5]}")
    children: tuple[list[Row], ...] = ()
    run = None
    if h is not None:
        children = ([(*_row(t, _TRANSITION_FIELDS), i) for i, t in enumerate(h.transitions)],
                    [_row(a, ATTEMPTS.columns) for a in h.attempts],
                    [_row(m, METRICS.columns) for m in h.metrics],
                    [_row(link, LINKS.columns) for link in h.resume_links],
                    [(run_id, *_row(c, _CHECKPOINT_FIELDS)) for c in h.checkpoints],
                    [(run_id, *_row(sp, _SPAN_FIELDS)) for sp in h.ledger])
        run = _row(h.run, _RUN_FIELDS)
    points = None if u.points is None else [_row(p, POINTS.columns) for p in u.points]
    pods = [_row(p, PLACEMENTS.columns) for p in u.pods]
    for table, table_rows in (*zip(CHILDREN, children, strict=False), (POINTS, points or []),
                              (PLACEMENTS, pods)):
        width = len(table.key)
        keys = [r[:width] for r in table_rows]
        if len(set(keys)) != len(keys):
            dup = next(k for k in keys if keys.count(k) > 1)
            raise RefusedUpdate(f"update of run {run_id!r} has two {table.name} rows with key {dup[1:]}")
    return Encoded(run_id, run, children, points, pods, list(u.removed_pods), u.full, list(u.removed_points),
                   u.full or u.points_full)


def many(conn: sqlite3.Connection, sql: str, rows: Sequence[Row]) -> int:
    """``executemany``, skipped when there is nothing to write; the number of rows changed."""
    return conn.executemany(sql, rows).rowcount if rows else 0


def delete_stale(conn: sqlite3.Connection, table: Table, run_id: str, kept: set[tuple[SqlValue, ...]],
                 held: set[tuple[SqlValue, ...]] | None = None) -> int:
    """Delete the run's rows of ``table`` whose key (without run_id) is not in ``kept``. ``held``: the keys of the
    run's rows the index holds, when already read (``ExperimentIndex._existing_keys``); else they are read here."""
    if held is None:
        held = {tuple(r) for r in conn.execute(table.run_keys, (run_id,))}
    return many(conn, table.delete, [(run_id, *k) for k in sorted(held - kept)])


def offset_rows(offsets: Mapping[OffsetKey, int]) -> list[Row]:
    rows: list[Row] = []
    for key, offset in offsets.items():
        group, topic, partition = key
        if not (isinstance(group, str) and group and isinstance(topic, str) and topic
                and _natural(partition) and _natural(offset)):
            raise RefusedUpdate(f"consumer offset must map (group, topic, partition >= 0) to an int >= 0, "
                             f"got {key!r}: {offset!r}")
        rows.append((group, topic, partition, offset))
    return rows


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
