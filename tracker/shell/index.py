"""The experiment index: run histories in SQLite (WAL), read directly by Stellar, TauGrid's experiment UI.

This is the I/O shell around the pure reducer. ``ExperimentIndex.write`` stores what changed in each given run
(``HistoryUpdate``) in one transaction: its history replaces the run's rows (the run, its transitions, attempts,
metric summaries and resume links), its metric points replace the run's points when they changed, and each pod
that changed is written as its own row; rows whose content is unchanged are not touched, so re-writing the same
updates is a no-op. The schema is a contract: it is
documented in ``schemas/index/README.md`` and its DDL is ``schemas/index/schema.sql`` (``SCHEMA_SQL`` of
``tracker.shell.index_schema``, with the migrations and the opening checks, must stay identical to that file;
a test checks it).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

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
from tracker.core.nodes import NodeState
from tracker.core.queues import QueuePosition, QueueState
from tracker.core.timefmt import ts
from tracker.shell import index_nodes, index_queues
from tracker.shell.index_lock import WriterLock
from tracker.shell.index_schema import (
    IndexOpenError,
    check_database,
    check_tables,
    migrate,
    stamp,
    transaction,
    why,
)

BUSY_TIMEOUT_MS = 10_000  # how long a writer waits for another writer's lock before failing

SqlValue = str | int | float | bytes | None
_T = TypeVar("_T")
Row = tuple[SqlValue, ...]
OffsetKey = tuple[str, str, int]  # (consumer group, topic, partition)

@dataclass(frozen=True, slots=True)
class _Table:
    """One table's columns, its primary key (run_id first, except consumer_offsets) and its statements."""

    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    upsert: str  # insert, or update only when the content differs (unchanged rows count no change)
    delete: str  # one row by key
    run_keys: str  # the keys, without run_id, of one run's rows


def _table(name: str, columns: tuple[str, ...], key: tuple[str, ...],
           unversioned: tuple[str, ...] = (), nullable: tuple[str, ...] = ()) -> _Table:
    """``unversioned``: columns that are not content (written, but a difference alone is no change). ``nullable``:
    key columns that may be NULL, one value for the key (the table's unique index has ``ifnull(column, '')``)."""
    target = ", ".join(f"ifnull(\"{c}\", '')" if c in nullable else f'"{c}"' for c in key)
    head = f"INSERT INTO {name} ({_names(columns)}) VALUES ({', '.join('?' for _ in columns)}) " \
           f"ON CONFLICT ({target})"
    values = [c for c in columns if c not in key]
    assign = ", ".join(f'"{c}" = excluded."{c}"' for c in values)
    differs = " OR ".join(f'{name}."{c}" IS NOT excluded."{c}"' for c in values if c not in unversioned)
    return _Table(
        name, columns, key,
        upsert=f"{head} DO UPDATE SET {assign} WHERE {differs}" if values else f"{head} DO NOTHING",
        delete=f"DELETE FROM {name} WHERE " + " AND ".join(f'"{c}" {"IS" if c in nullable else "="} ?' for c in key),
        run_keys=f"SELECT {_names(key[1:])} FROM {name} WHERE run_id = ?",
    )


def _names(columns: Sequence[str]) -> str:
    return ", ".join(f'"{c}"' for c in columns)


_RUNS = _table("runs", (*field_names(RunRecord), "updated_seq"), ("run_id",), unversioned=("updated_seq",))
_TRANSITIONS = _table("transitions", (*field_names(Transition), "ordinal"), ("run_id", "attempt", "phase"))
_ATTEMPTS = _table("attempts", field_names(Attempt), ("run_id", "attempt"))
_PLACEMENTS = _table("pod_placements", field_names(PodPlacement), ("run_id", "uid"))  # keyed by uid since schema 6
_METRICS = _table("metric_summaries", field_names(MetricSummary), ("run_id", "metric"))
_LINKS = _table("resume_links", field_names(ResumeLink), ("run_id", "resume_of"))
_POINTS = _table("metric_points", field_names(MetricPoint), ("run_id", "metric", "step"))  # since schema 5
# since schema 8: a run's checkpoints (a save's start may be unknown) and ledger spans, children of its history
_CHECKPOINTS = _table("checkpoints", ("run_id", *field_names(CheckpointRecord)),
                      ("run_id", "kind", "step", "uri", "started_at"), nullable=("started_at",))
_SPANS = _table("ledger_spans", ("run_id", *field_names(LedgerSpan)), ("run_id", "category", "start"))
_OFFSETS = _table("consumer_offsets", ("consumer_group", "topic", "partition", "next_offset"),
                  ("consumer_group", "topic", "partition"))
# A run's rows that its history replaces, beside its runs row (parents before children: deletes run in reverse).
_CHILDREN = (_TRANSITIONS, _ATTEMPTS, _METRICS, _LINKS, _CHECKPOINTS, _SPANS)


@dataclass(frozen=True, slots=True)
class _Encoded:
    """One run's update as table rows, ready to write."""

    run_id: str
    run: Row | None  # without updated_seq; None: the history did not change (not in the update)
    children: tuple[list[Row], ...]  # aligned with _CHILDREN
    points: list[Row] | None  # None: unchanged
    pods: list[Row]  # changed pod rows
    removed: list[str]  # uids of pods no longer the run's
    full: bool  # pods (and points) are all of the run's


@dataclass(frozen=True, slots=True)
class ReducerState:
    """The reducer state an index keeps (see ``ExperimentIndex.reducer_state``), as SQLite returns it: nothing is
    checked here (``tracker.shell.reducer_state.restore`` checks every value, naming its table and row)."""

    runs: list[tuple[Any, Any, Any]]  # (run_id, state, retired_seq): retired markers first, oldest first; then live
    held: list[tuple[Any, Any, Any]]  # (seq, owner, record)
    clock: Any  # meta's reducer_clock text (the reducer's watermark state, ``Reducer.marks``); None: not kept
    pods: list[tuple[Any, Any, Any]] = field(default_factory=list)  # (run_id, uid, state) of every pod kept


@dataclass(frozen=True, slots=True)
class StateRows:
    """The reducer's state to store with one write (see ``tracker.shell.reducer_state``).

    ``runs``: each written run's encoded state (None for a run whose state is no longer kept). ``retired``: the
    retirement ordinal of the runs among them whose state is a retired marker. ``pods``: (run id, pod uid) -> the
    pod's encoded state, of the pods whose state changed (None: no longer kept). ``held``: every record waiting for
    its owner as (seq, owner uid, encoded record), or None when they did not change. ``clock``: the reducer's
    event-time watermark state (``Reducer.marks``), or None when it did not change. A run whose state is None or a
    retired marker keeps no pod state.
    """

    runs: Mapping[str, bytes | None]
    held: Sequence[tuple[int, str, bytes]] | None = None
    retired: Mapping[str, int] = field(default_factory=dict)
    clock: Sequence[int] | None = None
    pods: Mapping[tuple[str, str], bytes | None] = field(default_factory=dict)


class ExperimentIndex:
    """The experiment index at ``path``.

    The writer: it creates the file, or migrates it, on open. (The read side reads through
    ``tracker.read.store.IndexReader``, which never writes.) Use as a context manager, or call ``open`` and
    ``close``. One connection; not for sharing between threads.

    One writer per index: ``open`` takes the writer role (``tracker.shell.index_lock``: ``<index>.writer.lock``)
    and ``close`` gives it back, so a writer's whole life (restore, fold, write) is its own. Another writer holding
    it, ``open`` waits up to ``writer_wait_s`` (None: without a bound; 0: not at all), saying so once through
    ``on_wait`` (default: one line on stderr), then raises ``WriterBusy``.
    """

    def __init__(self, path: Path | str, *, identity: Mapping[str, str] | None = None,
                 writer_wait_s: float | None = 30.0, on_wait: Callable[[str], None] | None = None,
                 stop_waiting: threading.Event | None = None) -> None:
        """``identity``: what a writer records in ``meta`` besides its version (``cluster``, ``workspace``);
        ``stop_waiting``: set, it ends a wait for the writer role (``index_lock.WaitStopped``)."""
        self.path = Path(path)
        self.identity = dict(identity or {})
        self._conn: sqlite3.Connection | None = None
        self._lock = WriterLock(self.path, wait_s=writer_wait_s, on_wait=on_wait, stop=stop_waiting)
        self.refused_after_retirement = 0  # histories not written: their run was retired and then forgotten

    # ------------------------------------------------------------------------------------ lifecycle
    def open(self) -> ExperimentIndex:
        if self._conn is not None:
            return self
        if self.path.is_dir():
            raise IndexOpenError(f"{self.path} is a directory, not an experiment index file")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
        except OSError as exc:
            raise IndexOpenError(f"cannot open experiment index {self.path} for writing: cannot take its writer "
                                 f"lock {self._lock.path}: {why(exc)}") from exc
        try:
            self._conn = self._open_writer()
        except BaseException:
            self._lock.release()
            raise
        return self

    def _open_writer(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None)  # autocommit: transactions are explicit
        except (OSError, sqlite3.Error) as exc:
            raise IndexOpenError(f"cannot open experiment index {self.path} for writing: {why(exc)}") from exc
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            check_database(conn, self.path)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            migrate(conn, self.path)
            check_tables(conn, self.path)  # before anything is written: a damaged index stays as it was
            stamp(conn, self.identity)
        except sqlite3.OperationalError as exc:
            conn.close()
            raise IndexOpenError(f"cannot write to experiment index {self.path}: {why(exc)} (is the file or its "
                                 "directory read-only? readers need no write access, writers do)") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _get(self, query: Callable[[sqlite3.Connection], _T]) -> _T:
        return query(self._db)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
                self._lock.release()

    def __enter__(self) -> ExperimentIndex:
        return self.open()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"experiment index {self.path} is not open (use open() or a with block)")
        return self._conn

    # ------------------------------------------------------------------------------------ write
    def write(self, updates: Sequence[HistoryUpdate],
              offsets: Mapping[OffsetKey, int] | None = None, *, state: StateRows | None = None) -> int:
        """Store what changed in each run (its history replacing its rows, its metric points when they changed, the
        pods that changed, the pods removed), the consumer offsets and the reducer's state, atomically.

        Updates of one run apply in order. Rows whose content is unchanged are left alone and a run's
        ``updated_seq`` moves only when one of its rows changed, so writing the same updates again changes nothing.
        Without ``state`` the written runs' reducer state is dropped (their histories now come from elsewhere, e.g.
        the Kafka reducer, so a replay must not continue from it). Returns the number of history rows inserted,
        updated or deleted (offsets included; reducer state is not counted).

        With ``state``, an update of a run this index holds as retired (its state row a retirement marker) is not
        written: it comes from records that arrived after the reducer forgot the retirement, and would replace
        the run's whole history with their part of it (counted in ``refused_after_retirement``). Its marker
        stays (renewed when the state retires the run again).
        """
        conn = self._db
        if state is not None and updates:
            refused = self._retired_before({u.run_id for u in updates})
            if refused:
                self.refused_after_retirement += len({u.run_id for u in updates if u.run_id in refused})
                updates = [u for u in updates if u.run_id not in refused]
                state = StateRows({k: v for k, v in state.runs.items() if k not in refused or k in state.retired},
                                  state.held, state.retired, state.clock,
                                  {k: v for k, v in state.pods.items() if k[0] not in refused})
        encoded = [_encode(u) for u in updates]
        offset_rows = _offset_rows(offsets or {})
        with transaction(conn, "BEGIN IMMEDIATE"):
            seq = int(conn.execute("SELECT COALESCE(MAX(updated_seq), 0) + 1 FROM runs").fetchone()[0])
            changed = sum(self._write_run(e, seq) for e in encoded)
            changed += self._write_offsets(offset_rows)
            if state is None:
                gone = [(r,) for r in dict.fromkeys(e.run_id for e in encoded)]
                conn.executemany("DELETE FROM reducer_runs WHERE run_id = ?", gone)
                conn.executemany("DELETE FROM reducer_pods WHERE run_id = ?", gone)
            else:
                self._write_state(state)
        return changed

    def write_queues(self, queues: Sequence[QueueState], positions: Sequence[QueuePosition]) -> int:
        """Store the newest state of Kueue's queues and pending runs' positions (``tracker.shell.index_queues``),
        in a transaction of their own; the number of rows changed."""
        if not queues and not positions:
            return 0
        with transaction(self._db, "BEGIN IMMEDIATE"):
            return index_queues.write(self._db, queues, positions)

    def write_nodes(self, nodes: Sequence[NodeState]) -> int:
        """Store the newest state of Nodes (``tracker.shell.index_nodes``), in a transaction of their own; the number
        of rows changed."""
        if not nodes:
            return 0
        with transaction(self._db, "BEGIN IMMEDIATE"):
            return index_nodes.write(self._db, nodes)

    def _retired_before(self, run_ids: Iterable[str]) -> set[str]:
        """The runs of ``run_ids`` that this index holds as retired."""
        live = list(run_ids)
        found: set[str] = set()
        for i in range(0, len(live), 500):
            chunk = live[i:i + 500]
            found.update(r[0] for r in self._db.execute(
                f"SELECT run_id FROM reducer_runs WHERE retired_seq IS NOT NULL AND run_id IN "
                f"({', '.join('?' * len(chunk))})", chunk))
        return found

    def _write_state(self, state: StateRows) -> None:
        conn = self._db
        conn.executemany("INSERT INTO reducer_runs (run_id, state, retired_seq) VALUES (?, ?, ?) "
                         "ON CONFLICT (run_id) DO UPDATE SET state = excluded.state, "
                         "retired_seq = excluded.retired_seq",
                         [(k, v, state.retired.get(k)) for k, v in state.runs.items() if v is not None])
        if state.clock is not None:
            conn.execute("INSERT INTO meta (key, value) VALUES ('reducer_clock', ?) "
                         "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                         (json.dumps(list(state.clock)),))
        conn.executemany("DELETE FROM reducer_runs WHERE run_id = ?",
                         [(k,) for k, v in state.runs.items() if v is None])
        conn.executemany("INSERT INTO reducer_pods (run_id, uid, state) VALUES (?, ?, ?) "
                         "ON CONFLICT (run_id, uid) DO UPDATE SET state = excluded.state",
                         [(*k, v) for k, v in state.pods.items() if v is not None])
        conn.executemany("DELETE FROM reducer_pods WHERE run_id = ? AND uid = ?",
                         [k for k, v in state.pods.items() if v is None])
        conn.executemany("DELETE FROM reducer_pods WHERE run_id = ?",
                         [(k,) for k, v in state.runs.items() if v is None or k in state.retired])
        if state.held is not None:
            kept = {seq for seq, _owner, _record in state.held}
            stale = [(seq,) for (seq,) in conn.execute("SELECT seq FROM reducer_held") if seq not in kept]
            conn.executemany("DELETE FROM reducer_held WHERE seq = ?", stale)
            conn.executemany("INSERT INTO reducer_held (seq, owner, record) VALUES (?, ?, ?) "
                             "ON CONFLICT (seq) DO NOTHING", state.held)

    def _write_run(self, e: _Encoded, seq: int) -> int:
        conn = self._db
        run_changed = 0
        changed = 0
        if e.run is not None:
            run_changed = conn.execute(_RUNS.upsert, (*e.run, seq)).rowcount
            for table, rows in reversed(list(zip(_CHILDREN, e.children, strict=True))):
                changed += _delete_stale(conn, table, e.run_id, {r[1:len(table.key)] for r in rows})
            for table, rows in zip(_CHILDREN, e.children, strict=True):
                changed += conn.executemany(table.upsert, rows).rowcount
        if e.points is not None:
            changed += _delete_stale(conn, _POINTS, e.run_id, {r[1:3] for r in e.points})
            changed += conn.executemany(_POINTS.upsert, e.points).rowcount
        if e.full:
            changed += _delete_stale(conn, _PLACEMENTS, e.run_id, {(r[_UID],) for r in e.pods})
        changed += conn.executemany(_PLACEMENTS.delete, [(e.run_id, uid) for uid in e.removed]).rowcount
        # a pod's row migrated from an index of schema 5 (uid 'v5:<attempt>:<pod>') gives way to its row with its uid
        changed += conn.executemany(_PLACEMENTS.delete, [(e.run_id, f"v5:{r[_ATTEMPT]!s}:{r[_POD]!s}")
                                                         for r in e.pods]).rowcount
        changed += conn.executemany(_PLACEMENTS.upsert, e.pods).rowcount
        if changed and not run_changed:
            run_changed = conn.execute("UPDATE runs SET updated_seq = ? WHERE run_id = ?",
                                       (seq, e.run_id)).rowcount
        return run_changed + changed

    def _write_offsets(self, rows: list[Row]) -> int:
        return self._db.executemany(_OFFSETS.upsert, rows).rowcount

    # ------------------------------------------------------------------------------------ read
    def offsets(self, group: str) -> dict[tuple[str, int], int]:
        """The next offset to consume per (topic, partition) for a consumer group."""
        def query(conn: sqlite3.Connection) -> dict[tuple[str, int], int]:
            cur = conn.execute('SELECT topic, "partition", next_offset FROM consumer_offsets '
                               "WHERE consumer_group = ? ORDER BY topic, \"partition\"", (group,))
            return {(r["topic"], r["partition"]): r["next_offset"] for r in cur}
        return self._get(query)

    def reducer_state(self, max_retired: int | None = None) -> ReducerState:
        """The stored reducer state, read in one transaction: (run id, encoded state, retired_seq) of every live run
        kept and of the latest ``max_retired`` retired ones (all when None; oldest retirement first), the held
        records, the watermark state and the pods' states, as stored (unchecked)."""
        conn = self._db
        with transaction(conn, "BEGIN"):
            runs = [(r[0], r[1], r[2]) for r in conn.execute(
                "SELECT run_id, state, retired_seq FROM reducer_runs WHERE retired_seq IS NULL ORDER BY run_id")]
            retired = [(r[0], r[1], r[2]) for r in conn.execute(
                "SELECT run_id, state, retired_seq FROM (SELECT run_id, state, retired_seq FROM reducer_runs "
                "WHERE retired_seq IS NOT NULL ORDER BY retired_seq DESC LIMIT ?) ORDER BY retired_seq",
                (-1 if max_retired is None else max_retired,))]
            held = [(r[0], r[1], r[2]) for r in conn.execute(
                "SELECT seq, owner, record FROM reducer_held ORDER BY seq")]
            row = conn.execute("SELECT value FROM meta WHERE key = 'reducer_clock'").fetchone()
            pods = [(r[0], r[1], r[2]) for r in conn.execute(
                "SELECT run_id, uid, state FROM reducer_pods ORDER BY run_id, uid")]
        return ReducerState(retired + runs, held, None if row is None else row[0], pods)

    def runs_without_state(self) -> list[str]:
        """Runs whose reducer state this index does not keep (written by the Kafka sink, or before schema 2)."""
        return [r[0] for r in self._db.execute(
            "SELECT run_id FROM runs WHERE NOT EXISTS (SELECT 1 FROM reducer_runs s WHERE s.run_id = runs.run_id) "
            "ORDER BY run_id")]

    def meta(self, key: str) -> str | None:
        row = self._get(lambda conn: conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone())
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with transaction(self._db, "BEGIN IMMEDIATE"):
            self._db.execute("INSERT INTO meta (key, value) VALUES (?, ?) "
                             "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value))

    def set_clock(self, *, recorded: bool) -> None:
        """Say how readers read "now" in this index (``CLOCK_KEY``): a recording (written by ``tracker replay`` or
        ``tracker demo`` only) is read as of the latest time it holds (``RECORDED_UNTIL_KEY``: of every transition,
        attempt end and metric point), since a capture knows nothing after it; an index a live writer (``serve``, a
        sink) wrote to is read at the wall clock."""
        if not recorded:
            if self.meta(CLOCK_KEY) != "live":
                self.set_meta(CLOCK_KEY, "live")
            return
        row = self._db.execute(
            "SELECT max(t) FROM (SELECT max(at) AS t FROM transitions UNION ALL SELECT max(ended_at) FROM attempts "
            "UNION ALL SELECT max(at) FROM metric_points)").fetchone()
        with transaction(self._db, "BEGIN IMMEDIATE"):
            for key, value in ((CLOCK_KEY, "recorded"), (RECORDED_UNTIL_KEY, row[0] if row else None)):
                if value is None:
                    self._db.execute("DELETE FROM meta WHERE key = ?", (key,))
                else:
                    self._db.execute("INSERT INTO meta (key, value) VALUES (?, ?) "
                                     "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value))

CLOCK_KEY = "clock"  # meta: "recorded" (readers read as of RECORDED_UNTIL_KEY) or "live" (the wall clock)
RECORDED_UNTIL_KEY = "recorded_until"


# ------------------------------------------------------------------------------------------ encoding


def _aware(dt: datetime) -> datetime:
    """A naive datetime is UTC (the core's convention for timestamps)."""
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


def _when(dt: datetime | None) -> str | None:
    """The index's time text: ISO-8601 UTC with a Z, microseconds only when not zero (``model.iso``'s form)."""
    if dt is None:
        return None
    if dt.tzinfo is UTC:  # the rows' own times: datetime's isoformat is that form, with +00:00 for the Z
        return dt.isoformat()[:-6] + "Z"
    return iso(ts(_aware(dt)))


def _plain(value: Any) -> Any:
    """A row value as JSON-ready data, with times in the index's text format."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
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


def _cell(value: object) -> SqlValue:
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


def _row(value: Any, columns: Sequence[str]) -> Row:
    return tuple(_cell(getattr(value, c)) for c in columns)


_UID, _ATTEMPT, _POD = (_PLACEMENTS.columns.index(c) for c in ("uid", "attempt", "pod"))


def _encode(u: HistoryUpdate) -> _Encoded:
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
        children = ([(*_row(t, field_names(Transition)), i) for i, t in enumerate(h.transitions)],
                    [_row(a, _ATTEMPTS.columns) for a in h.attempts],
                    [_row(m, _METRICS.columns) for m in h.metrics],
                    [_row(link, _LINKS.columns) for link in h.resume_links],
                    [(run_id, *_row(c, _CHECKPOINTS.columns[1:])) for c in h.checkpoints],
                    [(run_id, *_row(sp, _SPANS.columns[1:])) for sp in h.ledger])
        run = _row(h.run, _RUNS.columns[:-1])
    points = None if u.points is None else [_row(p, _POINTS.columns) for p in u.points]
    pods = [_row(p, _PLACEMENTS.columns) for p in u.pods]
    for table, table_rows in (*zip(_CHILDREN, children, strict=False), (_POINTS, points or []),
                              (_PLACEMENTS, pods)):
        width = len(table.key)
        keys = [r[:width] for r in table_rows]
        if len(set(keys)) != len(keys):
            dup = next(k for k in keys if keys.count(k) > 1)
            raise RefusedUpdate(f"update of run {run_id!r} has two {table.name} rows with key {dup[1:]}")
    return _Encoded(run_id, run, children, points, pods, list(u.removed_pods), u.full)


def _delete_stale(conn: sqlite3.Connection, table: _Table, run_id: str, kept: set[tuple[SqlValue, ...]]) -> int:
    """Delete the run's rows of ``table`` whose key (without run_id) is not in ``kept``."""
    stale = sorted({tuple(r) for r in conn.execute(table.run_keys, (run_id,))} - kept)
    return conn.executemany(table.delete, [(run_id, *k) for k in stale]).rowcount


def _offset_rows(offsets: Mapping[OffsetKey, int]) -> list[Row]:
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
