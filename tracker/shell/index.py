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

import json
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from tracker.core.model import HistoryUpdate
from tracker.core.nodes import NodeState
from tracker.core.queues import QueuePosition, QueueState
from tracker.shell import index_nodes, index_queues
from tracker.shell.index_lock import WriterLock
from tracker.shell.index_rows import (
    ATTEMPT,
    CHILDREN,
    OFFSETS,
    PLACEMENTS,
    POD,
    POINTS,
    RUNS,
    UID,
    Encoded,
    OffsetKey,
    Row,
    SqlValue,
    Table,
    delete_stale,
    encode,
    many,
    offset_rows,
)
from tracker.shell.index_schema import (
    IndexOpenError,
    check_database,
    check_tables,
    migrate,
    stamp,
    transaction,
    why,
)

_IN_CHUNK = 500  # run ids bound in one `run_id IN (...)` query
BUSY_TIMEOUT_MS = 10_000  # how long a writer waits for another writer's lock before failing

_T = TypeVar("_T")

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
        self._v5_pods: bool | None = None  # pod rows of schema 5 left (None: not asked yet on this connection)

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
                self._v5_pods = None
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
        encoded = [encode(u) for u in updates]
        offsets_rows = offset_rows(offsets or {})
        with transaction(conn, "BEGIN IMMEDIATE"):
            seq = int(conn.execute("SELECT COALESCE(MAX(updated_seq), 0) + 1 FROM runs").fetchone()[0])
            existing = self._existing_keys(encoded)
            changed = sum(self._write_run(e, seq, existing) for e in encoded)
            changed += self._write_offsets(offsets_rows)
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
        return {r[0] for r in self._rows_of_runs(
            "SELECT run_id FROM reducer_runs WHERE retired_seq IS NOT NULL AND run_id IN ", list(run_ids))}

    def _rows_of_runs(self, select: str, run_ids: Sequence[str]) -> Iterator[sqlite3.Row]:
        """The rows of ``select`` (which ends in ``run_id IN ``) for ``run_ids``, ``_IN_CHUNK`` runs a query."""
        for i in range(0, len(run_ids), _IN_CHUNK):
            chunk = run_ids[i:i + _IN_CHUNK]
            yield from self._db.execute(f"{select}({', '.join('?' * len(chunk))})", chunk)

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

    def _existing_keys(self, encoded: Sequence[Encoded]) -> dict[tuple[str, str], set[tuple[SqlValue, ...]]]:
        """(table, run id) -> the keys (without run_id) of the rows the index holds, for every table whose stale rows
        ``_write_run`` deletes for these updates: a query per table and 500 runs instead of one per table and run.
        Only for runs with one update in the write (a second update of a run must see what the first wrote)."""
        wanted = {r for r, n in Counter(e.run_id for e in encoded).items() if n == 1}
        per_table: dict[str, list[str]] = {t.name: [] for t in (*CHILDREN, POINTS, PLACEMENTS)}
        for e in encoded:
            if e.run_id not in wanted:
                continue
            if e.run is not None:
                for t in CHILDREN:
                    per_table[t.name].append(e.run_id)
            if e.points_full:
                per_table[POINTS.name].append(e.run_id)
            if e.full:
                per_table[PLACEMENTS.name].append(e.run_id)
        found: dict[tuple[str, str], set[tuple[SqlValue, ...]]] = {}
        for table in (*CHILDREN, POINTS, PLACEMENTS):
            runs = per_table[table.name]
            for run_id in runs:
                found[table.name, run_id] = set()
            for row in self._rows_of_runs(table.runs_keys, runs):
                found[table.name, row[0]].add(tuple(row[1:]))
        return found

    def _write_run(self, e: Encoded, seq: int, existing: Mapping[tuple[str, str], set[tuple[SqlValue, ...]]]) -> int:
        conn = self._db
        run_changed = 0
        changed = 0

        def stale(table: Table, kept: set[tuple[SqlValue, ...]]) -> int:
            return delete_stale(conn, table, e.run_id, kept, existing.get((table.name, e.run_id)))

        if e.run is not None:
            run_changed = conn.execute(RUNS.upsert, (*e.run, seq)).rowcount
            for table, rows in reversed(list(zip(CHILDREN, e.children, strict=True))):
                changed += stale(table, {r[1:len(table.key)] for r in rows})
            for table, rows in zip(CHILDREN, e.children, strict=True):
                changed += many(conn, table.upsert, rows)
        if e.points_full:
            changed += stale(POINTS, {r[1:3] for r in e.points or ()})
        else:
            changed += many(conn, POINTS.delete, [(e.run_id, metric, step) for metric, step in e.removed_points])
        if e.points:
            changed += many(conn, POINTS.upsert, e.points)
        if e.full:
            changed += stale(PLACEMENTS, {(r[UID],) for r in e.pods})
        changed += many(conn, PLACEMENTS.delete, [(e.run_id, uid) for uid in e.removed])
        if self._has_v5_pods():
            # a pod's row migrated from an index of schema 5 (uid 'v5:<attempt>:<pod>') gives way to its row with
            # its uid
            changed += many(conn, PLACEMENTS.delete, [(e.run_id, f"v5:{r[ATTEMPT]!s}:{r[POD]!s}")
                                                        for r in e.pods])
        changed += many(conn, PLACEMENTS.upsert, e.pods)
        if changed and not run_changed:
            run_changed = conn.execute("UPDATE runs SET updated_seq = ? WHERE run_id = ?",
                                       (seq, e.run_id)).rowcount
        return run_changed + changed

    def _has_v5_pods(self) -> bool:
        """Whether the index still holds pod rows migrated from schema 5 (asked once a connection: this writer
        never writes one, and it is the only writer while it holds the role)."""
        if self._v5_pods is None:
            self._v5_pods = self._db.execute(
                "SELECT EXISTS (SELECT 1 FROM pod_placements WHERE uid LIKE 'v5:%')").fetchone()[0] == 1
        return self._v5_pods

    def _write_offsets(self, rows: list[Row]) -> int:
        return self._db.executemany(OFFSETS.upsert, rows).rowcount

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
