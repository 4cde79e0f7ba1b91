"""The one reader of the experiment index: the read side's every query (listing runs kubectl-style, finding a run by
a prefix of its id or by the ``NAMESPACE/NAME`` of its Job or RayJob, a run's labels, its whole history) goes through
one read-only connection, so that a command or a web request opens the index once.

Made for a fast start: at import this module uses the standard library only (``tracker runs`` imports neither
pydantic nor the wire models). Rows come back as plain dicts with exactly the fields of ``RunRecord`` (a test checks
``RUN_FIELDS`` against the model), times as the index's ISO-8601 UTC text; ``history`` and ``records``, which build
the model's rows, import ``tracker.core.model`` when called.

Read-only, and never creating a file beside the index (it may sit on a read-only volume): while a writer has the
index open its ``-wal`` and ``-shm`` files exist, and a ``mode=ro`` connection shares them, reading a consistent
snapshot while the writer writes. When no writer has it open there is no ``-wal`` file, and ``mode=ro`` would
create both files (and cannot, on a read-only volume), so the file is opened as immutable; each read then checks
that no ``-wal`` appeared meanwhile, and reads again, shared, if one did (``read``). The usual case (an index of a
schema version this module knows) opens without importing the schema module; anything else (a missing file, not
a database, not an index, a newer schema) is checked by ``tracker.shell.index_schema``, which raises its one-line
error or accepts a newer schema this reader can read.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import zlib
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from tracker import errors
from tracker.read.filters import LABEL_COLUMNS, SORT_KEYS, STUCK_PHASES, RunFilter, exact, shown, time_text

if TYPE_CHECKING:
    from tracker.core.model import RunHistory, RunRecord
    from tracker.core.vocab import Phase, Status

# The most a run's stored state is inflated to for its labels (``-l``): tracker.shell.state_codec.RUN_STATE_BYTES, the
# cap of the writer, which refuses larger states; a state that does not inflate within it is read as without labels.
LABELS_STATE_BYTES = 64 * 1024 * 1024
KNOWN_SCHEMA_VERSION = 12  # the newest schema this module reads on its own (tracker.shell.index_schema.SCHEMA_VERSION)
READ_RETRIES = 3
BUSY_TIMEOUT_MS = 10_000

# The runs table's columns that make a RunRecord, in the model's order.
RUN_FIELDS = (
    "run_id", "kind", "namespace", "name", "uid", "project", "workspace", "target", "queue", "cluster_queue",
    "status", "reason", "message", "phase", "attempts", "retries", "evictions", "evictions_by", "created_at",
    "queued_at",
    "admitted_at", "started_at", "finished_at", "admission_wait_s", "pending_reason", "pending_message",
    "git_commit", "config_digest", "config_ref", "input_refs", "output_uri", "resume_of", "last_checkpoint",
    "gpus", "gpu_hours", "lost_gpu_hours", "lost_gpu_hours_by", "gpus_open", "open_since",
    "pending_s_by", "pending_category", "pending_since", "quota_reserved_at",
    "ledger_basis", "ledger_gpu_hours_by", "ledger_wall_s_by", "ledger_until", "ledger_open", "ettr", "goodput",
    "resumed_from", "checkpoints_saved", "images", "entrypoint", "hyperparameters", "hyperparameters_omitted",
)
# Columns added to ``runs`` since schema 1, with the value a row written before them stands for.
ADDED_COLUMN_DEFAULTS = {"gpus": "0", "gpu_hours": "0.0", "lost_gpu_hours": "0.0", "lost_gpu_hours_by": "'{}'",
                         "gpus_open": "0", "open_since": "NULL", "pending_s_by": "'{}'", "pending_category": "NULL",
                         "pending_since": "NULL", "quota_reserved_at": "NULL", "ledger_basis": "'accounting'",
                         "ledger_gpu_hours_by": "'{}'", "ledger_wall_s_by": "'{}'", "ledger_until": "NULL",
                         "ledger_open": "NULL", "ettr": "NULL", "goodput": "NULL", "resumed_from": "NULL",
                         "checkpoints_saved": "0", "evictions_by": "NULL", "images": "'[]'", "entrypoint": "NULL",
                         "hyperparameters": "'{}'", "hyperparameters_omitted": "0"}
# The runs table's JSON object columns (decoded into dicts; evictions_by is None in rows written before schema 9).
_JSON_OBJECTS = ("evictions_by", "lost_gpu_hours_by", "pending_s_by", "ledger_gpu_hours_by", "ledger_wall_s_by",
                 "hyperparameters", "images")  # images: a JSON array, decoded alike
_T = TypeVar("_T")


class IndexQueryError(errors.Fatal, ValueError):
    """A query that cannot be answered as asked (an unknown or ambiguous run, an unknown field or sort key)."""


# ------------------------------------------------------------------------------------------ rows


class Run:
    """A run as listed: ``data`` has the RunRecord fields asked for (JSON-ready); ``phase_since`` is when the run
    entered its current phase (its last transition; None when it has none), as ISO-8601 UTC text; ``labels`` are
    filled in when a selector needed them. (A plain class, not a dataclass: importing dataclasses costs more
    than a fast start affords.)"""

    __slots__ = ("data", "labels", "phase_since")

    def __init__(self, data: dict[str, Any], phase_since: str | None, *, labels: dict[str, str] | None = None) -> None:
        self.data = data
        self.phase_since = phase_since
        self.labels = labels

    @property
    def run_id(self) -> str:
        return str(self.data["run_id"])


def parse_time(text: str | None) -> datetime | None:
    """The index's time text ('...Z') as an aware datetime."""
    if text is None:
        return None
    return datetime.fromisoformat(text)  # Python 3.11 reads the trailing Z


# When the run entered its current phase: the time of its last transition. SQLite gives a bare column of an
# aggregate with one max() the value of the row with the maximum, which reads a run's transitions once, unsorted.
_LAST_AT = "(SELECT at FROM (SELECT t.at AS at, MAX(t.ordinal) FROM transitions t WHERE t.run_id = runs.run_id))"


class IndexReader:
    """The experiment index at ``path``, read-only: one connection, opened by ``with`` (or ``open``) and closed at
    its end. Not for sharing between threads."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        self._immutable = False  # opened a file no writer had open (see the module's docstring)
        self.version = 0  # the index's schema version, once open

    def open(self) -> IndexReader:
        if self._conn is None:
            self._conn = self._open()
        return self

    def __enter__(self) -> IndexReader:
        return self.open()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _wal_exists(self) -> bool:
        return Path(f"{self.path}-wal").exists()

    def _open(self) -> sqlite3.Connection:
        return self._open_fast() or self._open_checked()

    def _open_fast(self) -> sqlite3.Connection | None:
        """The usual case, without the schema module: a file of a schema version this module knows; else None."""
        try:
            if not self.path.is_file():
                return None
            self._immutable = not self._wal_exists()
            conn = self._connect()
        except (OSError, sqlite3.Error):
            return None
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is not None and str(row[0]).isdigit() and 1 <= int(row[0]) <= KNOWN_SCHEMA_VERSION:
                self.version = int(row[0])
                return conn
        except sqlite3.Error:
            pass
        conn.close()
        return None

    def _open_checked(self) -> sqlite3.Connection:
        """Anything else: the schema module's checks, with its one-line errors (a newer schema it can read opens)."""
        from tracker.shell.index_schema import IndexOpenError, IndexSchemaError, check_database, schema_version, why

        if not self.path.exists():
            raise IndexOpenError(f"no experiment index at {self.path} (create one with: tracker replay CAPTURE... "
                                 f"--index {self.path})")
        if self.path.is_dir():
            raise IndexOpenError(f"{self.path} is a directory, not an experiment index file")
        self._immutable = not self._wal_exists()
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise IndexOpenError(f"cannot open experiment index {self.path}: {why(exc)}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            check_database(conn, self.path)
            self.version = schema_version(conn, self.path)
            if self.version == 0:
                raise IndexSchemaError(f"{self.path} is not an experiment index (an empty database)")
        except sqlite3.Error as exc:
            conn.close()
            raise IndexOpenError(f"cannot read experiment index {self.path}: {why(exc)}") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _connect(self) -> sqlite3.Connection:
        uri = f"{self.path.resolve().as_uri()}?mode=ro" + ("&immutable=1" if self._immutable else "")
        return sqlite3.connect(uri, uri=True, isolation_level=None)

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"experiment index {self.path} is not open (use open() or a with block)")
        return self._conn

    def read(self, query: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``query`` in one snapshot; an immutable reader whose file got a writer meanwhile reads again, shared
        (at most ``READ_RETRIES`` times)."""
        result = self._snapshot(query)
        for _ in range(READ_RETRIES):
            if not (self._immutable and self._wal_exists()):
                break
            self.close()
            self._conn = self._open()
            result = self._snapshot(query)
        return result

    def _snapshot(self, query: Callable[[sqlite3.Connection], _T]) -> _T:
        conn = self._db
        conn.execute("BEGIN")
        try:
            return query(conn)
        finally:
            conn.execute("COMMIT")

    # ------------------------------------------------------------------------------------ runs
    def runs(self, f: RunFilter | None = None, fields: Sequence[str] = RUN_FIELDS,
             *, phase_since: bool = True) -> list[Run]:
        """Runs matching ``f``, sorted by ``f.sort_by`` (times newest first, age and counts largest first, names
        ascending; ties by run id). Each run's ``data`` holds ``fields`` (every RunRecord field by default; fewer
        read faster); without ``phase_since`` the runs' ``phase_since`` is not read (it costs a lookup per run)."""
        f = f or RunFilter()
        unknown = [c for c in fields if c not in RUN_FIELDS]
        if unknown:
            raise IndexQueryError(f"not a run field: {', '.join(unknown)}")
        where: list[str] = []
        params: list[Any] = []

        def any_of(column: str, values: Sequence[str]) -> None:
            if values:
                where.append(f"{column} IN ({', '.join('?' for _ in values)})")
                params.extend(values)

        any_of("namespace", f.namespaces)
        any_of("queue", f.queues)
        any_of("cluster_queue", f.cluster_queues)
        any_of("status", f.statuses)
        any_of("phase", f.phases)
        if f.nodes:  # a pod of the run on one of the nodes (the pods table's index by node answers it)
            marks = ", ".join("?" for _ in f.nodes)
            where.append(f"run_id IN (SELECT run_id FROM pod_placements WHERE node IN ({marks}))")
            params.extend(f.nodes)
        if f.since is not None:
            where.append(f"created_at IS NOT NULL AND {exact('created_at')} >= ?")
            params.append(time_text(f.since))
        if f.until is not None:
            where.append(f"created_at IS NOT NULL AND {exact('created_at')} < ?")
            params.append(time_text(f.until))
        if f.stalled_admission_before is not None:
            where.append(f"status = 'pending' AND phase = 'Admission' AND {exact('queued_at')} < ?")
            params.append(time_text(f.stalled_admission_before))
        if f.stuck_before is not None:
            where.append(f"status = 'pending' AND phase IN ({', '.join(repr(p) for p in STUCK_PHASES)}) "
                         f"AND {exact(_LAST_AT)} < ?")
            params.append(time_text(f.stuck_before))
        # the label terms the columns answer go to SQL; the others need the stored workload labels
        column_terms = [r for r in f.selector if r.key in LABEL_COLUMNS]
        label_terms = [r for r in f.selector if r.key not in LABEL_COLUMNS]
        for r in column_terms:
            col = LABEL_COLUMNS[r.key]
            if r.op == "exists":
                where.append(f"{col} IS NOT NULL")
            elif r.op == "!exists":
                where.append(f"{col} IS NULL")
            elif r.op in ("=", "in"):
                any_of(col, r.values)
            else:
                where.append(f"({col} IS NULL OR {col} NOT IN ({', '.join('?' for _ in r.values)}))")
                params.extend(r.values)
        if label_terms:
            fields = [*fields, *(c for c in dict.fromkeys(LABEL_COLUMNS.values()) if c not in fields)]
        if "run_id" not in fields:
            fields = ["run_id", *fields]
        names = tuple(fields)
        since = _LAST_AT if phase_since or f.sort_by == "age" else "NULL"
        select = (f"SELECT {', '.join(names)}, {since} AS phase_since FROM runs"
               + (f" WHERE {' AND '.join(where)}" if where else "") + f" ORDER BY {_order(f.sort_by, f.now)}")
        if f.limit is not None and not label_terms:
            select += " LIMIT ?"
            params.append(f.limit)

        def query(conn: sqlite3.Connection) -> list[Run]:
            n = len(names)
            sql = select
            have = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
            missing = [c for c in names if c not in have]
            if missing:  # an index of an older schema, read as it is: the columns added since read as their default
                sql = select.replace(f"SELECT {', '.join(names)},", "SELECT " + ", ".join(
                    c if c in have else f"{ADDED_COLUMN_DEFAULTS.get(c, 'NULL')} AS {c}" for c in names) + ",", 1)
            refs = names.index("input_refs") if "input_refs" in names else None
            rows = conn.execute(sql, params).fetchall()
            runs = [Run(dict(zip(names, row, strict=False)), row[n]) for row in rows]
            if refs is not None:
                for run, row in zip(runs, rows, strict=True):
                    run.data["input_refs"] = [] if row[refs] == "[]" else json.loads(row[refs])
            for col in _JSON_OBJECTS:
                at = names.index(col) if col in names else None
                if at is not None:
                    for run, row in zip(runs, rows, strict=True):
                        cell = row[at]
                        run.data[col] = {} if cell == "{}" else None if cell is None else json.loads(cell)
            if label_terms:
                labels = _stored_labels(conn, [r.run_id for r in runs])
                kept = []
                for r in runs:
                    r.labels = run_labels(r.data, labels.get(r.run_id, {}))
                    if all(t.matches(r.labels) for t in label_terms):
                        kept.append(r)
                runs = kept[: f.limit] if f.limit is not None else kept
            return runs
        return self.read(query)

    def labels(self, runs: Iterable[Run]) -> None:
        """Fill in each run's labels (the stored workload labels and those the columns give)."""
        runs = list(runs)
        stored = self.read(lambda conn: _stored_labels(conn, [r.run_id for r in runs]))
        for r in runs:
            r.labels = run_labels(r.data, stored.get(r.run_id, {}))

    def attempt_ends(self, run_ids: Iterable[str]) -> dict[str, list[tuple[str, str | None]]]:
        """Each run's attempts in order, as (trigger, end_reason): what ``tracker audit`` counts the evictions of a
        row written before schema 9 from (its ``evictions_by`` is None)."""
        wanted = set(run_ids)

        def query(conn: sqlite3.Connection) -> dict[str, list[tuple[str, str | None]]]:
            out: dict[str, list[tuple[str, str | None]]] = {}
            for run_id, trigger, end_reason in conn.execute(
                    'SELECT run_id, "trigger", end_reason FROM attempts ORDER BY run_id, attempt'):
                if run_id in wanted:
                    out.setdefault(run_id, []).append((trigger, end_reason))
            return out
        return self.read(query)

    # ------------------------------------------------------------------------------------ one run
    def resolve(self, ref: str) -> tuple[str, str | None]:
        """The run id ``ref`` names, and a note when the choice is worth saying: the exact id, else a unique prefix
        of one, else ``NAMESPACE/NAME`` of a Job or RayJob (its latest run). IndexQueryError if none or several."""
        def query(conn: sqlite3.Connection) -> tuple[str, str | None]:
            if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (ref,)).fetchone():
                return ref, None
            # the ids starting with ``ref`` come first among those after it (text compares as its bytes): a range of
            # the primary key, whatever the length of ``ref`` (LIKE refuses patterns of over 50,000 bytes)
            ids = [r[0] for r in conn.execute("SELECT run_id FROM runs WHERE run_id > ? ORDER BY run_id LIMIT 6",
                                              (ref,))]
            ids = list(itertools.takewhile(lambda run_id: run_id.startswith(ref), ids))
            if len(ids) == 1:
                return ids[0], None
            if len(ids) > 1:
                listed = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
                raise IndexQueryError(f"{ref!r} is the start of several run ids ({listed}): give more of it")
            namespace, sep, name = ref.partition("/")
            if sep and namespace and name:
                rows = conn.execute(
                    "SELECT run_id, created_at FROM runs WHERE namespace = ? AND name = ? "
                    f"ORDER BY created_at IS NULL, {exact('created_at')} DESC, run_id", (namespace, name)).fetchall()
                if rows:
                    note = None
                    if len(rows) > 1:
                        note = (f"{ref} has {len(rows)} runs; showing the latest, {rows[0][0]} (the others: "
                                + ", ".join(r[0] for r in rows[1:6]) + (", ..." if len(rows) > 6 else "") + ")")
                    return str(rows[0][0]), note
            raise IndexQueryError(f"no run {shown(ref)} in {self.path} (a run id, a unique start of one, or "
                                  "NAMESPACE/NAME of a Job or RayJob; list runs with: tracker runs)")
        return self.read(query)

    def resumed_by(self, run_id: str) -> list[str]:
        """The runs that resume ``run_id`` (their ``resume_of`` is it: the lineage in reverse, one step), the first
        created first (runs without a creation time last), ties by run id. A run the index does not hold, or one
        nobody resumed, gives []."""
        def query(conn: sqlite3.Connection) -> list[str]:
            return [r[0] for r in conn.execute(
                "SELECT l.run_id FROM resume_links l LEFT JOIN runs r ON r.run_id = l.run_id WHERE l.resume_of = ? "
                f"ORDER BY r.created_at IS NULL, {exact('r.created_at')}, l.run_id", (run_id,))]
        return self.read(query)

    def short_ids(self, run_ids: Iterable[str], *, minimum: int = 8, full_up_to: int = 18) -> dict[str, str]:
        """For each run id, the shortest start of it (at least ``minimum`` characters) that no other run id in the
        index shares; ids of at most ``full_up_to`` characters are kept whole."""
        wanted = sorted(set(run_ids))
        if not wanted:
            return {}

        def query(conn: sqlite3.Connection) -> list[str]:
            return [r[0] for r in conn.execute("SELECT run_id FROM runs ORDER BY run_id")]
        every = self.read(query)
        return short_ids(every, wanted, minimum=minimum, full_up_to=full_up_to)

    # ------------------------------------------------------------------------------------ whole rows
    def history(self, run_id: str) -> RunHistory | None:
        """The run's complete history as written (None if the index does not hold the run), in one snapshot."""
        from tracker.read.history import load_history

        return self.read(lambda conn: load_history(conn, run_id, self.version))

    def records(self, status: Status | str | None = None, phase: Phase | str | None = None,
                *, stalled_admission_s: float | None = None, now: datetime | None = None,
                workspace: str | None = None, project: str | None = None,
                limit: int | None = None) -> list[RunRecord]:
        """Runs (the model's rows) matching every given filter, newest first: by created_at (exactly, to the
        microsecond), runs without one last, ties by run_id.

        ``stalled_admission_s`` keeps only runs that are pending in Admission and were queued more than that
        many seconds before ``now`` (the current UTC time when ``now`` is None; a naive ``now`` is UTC).
        ``limit`` (>= 1) caps the number of runs returned; None returns all.
        """
        import math
        from datetime import timedelta

        from tracker.core.vocab import Phase, Status

        where: list[str] = []
        params: list[Any] = []
        for column, value in (("status", None if status is None else Status(status).value),
                              ("phase", None if phase is None else Phase(phase).value),
                              ("workspace", workspace), ("project", project)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if stalled_admission_s is not None:
            if not math.isfinite(stalled_admission_s) or stalled_admission_s < 0:
                raise ValueError(f"stalled_admission_s must be finite and >= 0, got {stalled_admission_s!r}")
            try:
                text = time_text((now or datetime.now(UTC)) - timedelta(seconds=stalled_admission_s))
            except OverflowError:  # before year 1: no run was queued that long ago
                text = ""
            where.append(f"status = 'pending' AND phase = 'Admission' AND {exact('queued_at')} < ?")
            params.append(text)
        sql = f"SELECT * FROM runs{' WHERE ' + ' AND '.join(where) if where else ''} " \
              f"ORDER BY created_at IS NULL, {exact('created_at')} DESC, run_id"
        if limit is not None:
            if limit < 1:
                raise ValueError(f"limit must be >= 1, got {limit}")
            sql += " LIMIT ?"
            params.append(limit)
        from tracker.read.history import load_record, rows

        return self.read(lambda conn: [load_record(r) for r in rows(conn, sql, params)])

    def counts_by_status(self) -> dict[Status, int]:
        """Number of runs per status (every status present, zeros included)."""
        from tracker.core.vocab import Status

        counts = dict.fromkeys(Status, 0)
        for status, n in self.read(lambda conn: conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status")
                                   .fetchall()):
            counts[Status(status)] = n
        return counts

    def meta(self, key: str) -> str | None:
        """A value of the index's ``meta`` table (None when it has none)."""
        row = self.read(lambda conn: conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone())
        return None if row is None else str(row[0])


def short_ids(every: Sequence[str], wanted: Iterable[str], *, minimum: int = 8, full_up_to: int = 18) -> dict[str, str]:
    """``every``: all run ids, sorted. A unique prefix is one longer than the common prefix with either neighbour."""
    import bisect

    out: dict[str, str] = {}
    for rid in wanted:
        if len(rid) <= full_up_to:
            out[rid] = rid
            continue
        i = bisect.bisect_left(every, rid)
        need = minimum
        for j in (i - 1, i + 1):
            if 0 <= j < len(every) and every[j] != rid:
                other = every[j]
                common = 0
                for a, b in zip(rid, other, strict=False):
                    if a != b:
                        break
                    common += 1
                need = max(need, common + 1)
        out[rid] = rid[:need]
    return out


def run_labels(data: dict[str, Any], stored: dict[str, str]) -> dict[str, str]:
    """A run's labels: the root's labels as stored with its state, and those its columns give."""
    labels = dict(stored)
    for key, column in LABEL_COLUMNS.items():
        if "/" in key and data.get(column) is not None:
            labels.setdefault(key, str(data[column]))
    for key, column in LABEL_COLUMNS.items():
        if "/" not in key and data.get(column) is not None:
            labels.setdefault(key, str(data[column]))
    return labels


def _stored_labels(conn: sqlite3.Connection, run_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """The root object's labels kept in the reducer's state (an index written by the Kafka sink has none)."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "reducer_runs" not in tables or not run_ids:
        return {}
    out: dict[str, dict[str, str]] = {}
    wanted = set(run_ids)
    for run_id, blob in conn.execute("SELECT run_id, state FROM reducer_runs"):
        if run_id not in wanted:
            continue
        try:  # inflated within a bound (a damaged blob may be a zlib bomb); one that does not decode has no labels
            inflater = zlib.decompressobj()
            raw = inflater.decompress(blob, LABELS_STATE_BYTES)
            if not inflater.eof:
                continue
            snap = json.loads(raw)
            labels = snap.get("facts", {}).get("labels") or {}
        except (zlib.error, ValueError, AttributeError, TypeError, RecursionError):
            continue
        if isinstance(labels, dict):
            out[run_id] = {str(k): str(v) for k, v in labels.items()}
    return out


def _order(sort_by: str, now: datetime | None = None) -> str:
    column = SORT_KEYS.get(sort_by)
    if column is None:
        raise IndexQueryError(f"cannot sort by {sort_by!r} (one of: {', '.join(SORT_KEYS)})")
    if column == "admission_wait_s" and now is not None:
        # a run still waiting (pending, queued, not admitted) has waited now - queued_at (tracker.core.waits)
        live = ("(CASE WHEN admission_wait_s IS NULL AND status = 'pending' AND queued_at IS NOT NULL AND admitted_at "
                f"IS NULL THEN (julianday('{time_text(now)[:-1]}') - julianday(substr(queued_at, 1, "
                "length(queued_at) - 1))) * 86400.0 ELSE admission_wait_s END)")
        return f"{live} IS NULL, {live} DESC, run_id"
    if column == "phase_since":  # age in the current phase: the longest first
        return f"{column} IS NULL, {exact(column)}, run_id"
    if column.endswith("_at"):
        return f"{column} IS NULL, {exact(column)} DESC, run_id"  # newest first, runs without the time last
    if column in ("attempts", "evictions", "retries", "admission_wait_s"):
        return f"{column} IS NULL, {column} DESC, run_id"  # most first
    return f"{column} IS NULL, {column}, run_id"
