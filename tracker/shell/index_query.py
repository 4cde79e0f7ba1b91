"""Reader queries of the experiment index for the command line: listing runs kubectl-style, finding a run by a
prefix of its id or by the ``NAMESPACE/NAME`` of its Job or RayJob, reading a run's labels.

Made for a fast start: this module imports neither pydantic nor the wire models (``tracker.shell.index`` does,
and that costs more than the whole of ``tracker runs``). Rows come back as plain dicts with exactly the fields of
``RunRecord`` (a test checks ``RUN_FIELDS`` against the model), times as the index's ISO-8601 UTC text.

It opens the index read-only the way ``ExperimentIndex(path, readonly=True)`` does (shared with a writer's WAL
when one has the file open, else immutable, re-reading shared when a writer appeared meanwhile). Only the usual
case is handled here: whenever the file is missing, not a database, not an index, or of a schema version this
module does not know, the opening is left to ``ExperimentIndex``, which raises its one-line error (or, for a
newer schema it can read, gives its connection).
"""

from __future__ import annotations

import json
import re
import sqlite3
import zlib
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, TypeVar

from tracker import errors

KNOWN_SCHEMA_VERSION = 8  # the newest schema this module reads on its own (tracker.shell.index_schema.SCHEMA_VERSION)
READ_RETRIES = 3
BUSY_TIMEOUT_MS = 10_000

# The runs table's columns that make a RunRecord, in the model's order.
RUN_FIELDS = (
    "run_id", "kind", "namespace", "name", "uid", "project", "workspace", "target", "queue", "cluster_queue",
    "status", "reason", "message", "phase", "attempts", "retries", "evictions", "created_at", "queued_at",
    "admitted_at", "started_at", "finished_at", "admission_wait_s", "pending_reason", "pending_message",
    "git_commit", "config_digest", "config_ref", "input_refs", "output_uri", "resume_of", "last_checkpoint",
    "gpus", "gpu_hours", "lost_gpu_hours", "lost_gpu_hours_by", "gpus_open", "open_since",
    "pending_s_by", "pending_category", "pending_since", "quota_reserved_at",
    "ledger_basis", "ledger_gpu_hours_by", "ledger_wall_s_by", "ledger_until", "ledger_open", "ettr", "goodput",
    "resumed_from", "checkpoints_saved",
)
# Columns added to ``runs`` since schema 1, with the value a row written before them stands for.
ADDED_COLUMN_DEFAULTS = {"gpus": "0", "gpu_hours": "0.0", "lost_gpu_hours": "0.0", "lost_gpu_hours_by": "'{}'",
                         "gpus_open": "0", "open_since": "NULL", "pending_s_by": "'{}'", "pending_category": "NULL",
                         "pending_since": "NULL", "quota_reserved_at": "NULL", "ledger_basis": "'accounting'",
                         "ledger_gpu_hours_by": "'{}'", "ledger_wall_s_by": "'{}'", "ledger_until": "NULL",
                         "ledger_open": "NULL", "ettr": "NULL", "goodput": "NULL", "resumed_from": "NULL",
                         "checkpoints_saved": "0"}
# The runs table's JSON object columns (decoded into dicts).
_JSON_OBJECTS = ("lost_gpu_hours_by", "pending_s_by", "ledger_gpu_hours_by", "ledger_wall_s_by")
PHASES = ("Resolution", "Rendering", "Admission", "Scheduling", "Runtime", "Progress", "Completion")
STATUSES = ("pending", "running", "succeeded", "failed", "stopped")
LIVE_STATUSES = ("pending", "running")
# Phases a run can be stuck in before its application starts (``--stuck``).
STUCK_PHASES = ("Admission", "Scheduling", "Runtime")

# Label keys answered from the runs table's columns (the root's labels as the reducer read them); short aliases too.
LABEL_COLUMNS = {
    "taugrid.io/run-id": "run_id", "taugrid.io/project": "project", "taugrid.io/workspace": "workspace",
    "taugrid.io/target": "target", "kueue.x-k8s.io/queue-name": "queue",
    "run-id": "run_id", "project": "project", "workspace": "workspace", "target": "target", "queue": "queue",
}

# ``--sort-by`` keys: a column, or the time the run entered its phase.
SORT_KEYS = {
    "created": "created_at", "queued": "queued_at", "admitted": "admitted_at", "started": "started_at",
    "finished": "finished_at", "age": "phase_since", "name": "name", "namespace": "namespace", "run": "run_id",
    "status": "status", "phase": "phase", "attempts": "attempts", "evictions": "evictions",
    "retries": "retries", "wait": "admission_wait_s",
}

_T = TypeVar("_T")


class IndexQueryError(errors.Fatal, ValueError):
    """A query that cannot be answered as asked (an unknown or ambiguous run, a bad selector)."""


# ------------------------------------------------------------------------------------------ selectors


class Requirement(NamedTuple):
    """One term of a label selector: ``op`` is one of =, !=, in, notin, exists, !exists."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op == "exists":
            return value is not None
        if self.op == "!exists":
            return value is None
        if self.op in ("=", "in"):
            return value is not None and value in self.values
        return value is None or value not in self.values  # != and notin, as kubectl: a missing label matches


_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_SET_TERM = re.compile(rf"^({_KEY})\s+(in|notin)\s+\(([^()]*)\)$")
_EQ_TERM = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})$")
_EXISTS_TERM = re.compile(rf"^(!?)\s*({_KEY})$")


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """A kubectl label selector: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``,
    joined by commas (all must hold)."""
    terms: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    out: list[Requirement] = []
    for raw in terms:
        term = raw.strip()
        if m := _SET_TERM.match(term):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            if not values:
                raise IndexQueryError(f"selector term {term!r} has no values")
            out.append(Requirement(m.group(1), m.group(2), values))
        elif m := _EQ_TERM.match(term):
            out.append(Requirement(m.group(1), "!=" if m.group(2) == "!=" else "=", (m.group(3),)))
        elif m := _EXISTS_TERM.match(term):
            out.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise IndexQueryError(f"not a label selector term: {term!r} (use e.g. taugrid.io/project=llm, "
                                  "'team notin (a,b)', '!kueue.x-k8s.io/priority-class')")
    return tuple(out)


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


def time_text(dt: datetime) -> str:
    """A time in the index's fixed-width form, which orders exactly as text against ``_exact`` columns."""
    dt = dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
    return dt.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _exact(column: str) -> str:
    """A stored time ('...SSZ', or '...SS.ffffffZ' when sub-second) in fixed-width form."""
    return f"(CASE WHEN length({column}) = 20 THEN substr({column}, 1, 19) || '.000000Z' ELSE {column} END)"


class RunFilter(NamedTuple):
    """What ``runs`` keeps: every given condition holds. Times are aware datetimes."""

    namespaces: tuple[str, ...] = ()
    selector: tuple[Requirement, ...] = ()
    queues: tuple[str, ...] = ()
    cluster_queues: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    phases: tuple[str, ...] = ()
    since: datetime | None = None  # created at or after
    until: datetime | None = None  # created before
    stuck_before: datetime | None = None  # live, not started, in Admission/Scheduling/Runtime since before this
    stalled_admission_before: datetime | None = None  # pending in Admission, queued before this
    sort_by: str = "created"
    limit: int | None = None
    now: datetime | None = None  # the reference time of ``--sort-by wait``: a run still waiting has waited until now


# When the run entered its current phase: the time of its last transition. SQLite gives a bare column of an
# aggregate with one max() the value of the row with the maximum, which reads a run's transitions once, unsorted.
_LAST_AT = "(SELECT at FROM (SELECT t.at AS at, MAX(t.ordinal) FROM transitions t WHERE t.run_id = runs.run_id))"


class IndexReader:
    """The experiment index at ``path``, read-only. A context manager."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        self._immutable = False
        self._keeper: Any = None  # the ExperimentIndex whose connection this reader uses, if any

    def __enter__(self) -> IndexReader:
        self._conn = self._open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._keeper is not None:
            self._keeper.close()
            self._keeper = None
        elif self._conn is not None:
            self._conn.close()
        self._conn = None

    def _wal_exists(self) -> bool:
        return Path(f"{self.path}-wal").exists()

    def _open(self) -> sqlite3.Connection:
        conn = self._open_fast()
        if conn is not None:
            return conn
        from tracker.shell.index import ExperimentIndex  # raises the one-line error, or reads a newer schema

        self._keeper = ExperimentIndex(self.path, readonly=True).open()
        self._immutable = False
        conn = self._keeper._db
        assert isinstance(conn, sqlite3.Connection)
        return conn

    def _open_fast(self) -> sqlite3.Connection | None:
        try:
            if not self.path.is_file():
                return None
            self._immutable = not self._wal_exists()
            uri = f"{self.path.resolve().as_uri()}?mode=ro" + ("&immutable=1" if self._immutable else "")
            conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        except (OSError, sqlite3.Error):
            return None
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is not None and str(row[0]).isdigit() and 1 <= int(row[0]) <= KNOWN_SCHEMA_VERSION:
                return conn
        except sqlite3.Error:
            pass
        conn.close()
        return None

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"experiment index {self.path} is not open (use a with block)")
        return self._conn

    def _read(self, query: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run a read in one snapshot; an immutable reader whose file got a writer meanwhile reads again, shared."""
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
        if f.since is not None:
            where.append(f"created_at IS NOT NULL AND {_exact('created_at')} >= ?")
            params.append(time_text(f.since))
        if f.until is not None:
            where.append(f"created_at IS NOT NULL AND {_exact('created_at')} < ?")
            params.append(time_text(f.until))
        if f.stalled_admission_before is not None:
            where.append(f"status = 'pending' AND phase = 'Admission' AND {_exact('queued_at')} < ?")
            params.append(time_text(f.stalled_admission_before))
        if f.stuck_before is not None:
            where.append(f"status = 'pending' AND phase IN ({', '.join(repr(p) for p in STUCK_PHASES)}) "
                         f"AND {_exact(_LAST_AT)} < ?")
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
                        run.data[col] = {} if row[at] == "{}" else json.loads(row[at])
            if label_terms:
                labels = _stored_labels(conn, [r.run_id for r in runs])
                kept = []
                for r in runs:
                    r.labels = run_labels(r.data, labels.get(r.run_id, {}))
                    if all(t.matches(r.labels) for t in label_terms):
                        kept.append(r)
                runs = kept[: f.limit] if f.limit is not None else kept
            return runs
        return self._read(query)

    def labels(self, runs: Iterable[Run]) -> None:
        """Fill in each run's labels (the stored workload labels and those the columns give)."""
        runs = list(runs)
        stored = self._read(lambda conn: _stored_labels(conn, [r.run_id for r in runs]))
        for r in runs:
            r.labels = run_labels(r.data, stored.get(r.run_id, {}))

    def attempt_ends(self, run_ids: Iterable[str]) -> dict[str, list[tuple[str, str | None]]]:
        """Each run's attempts in order, as (trigger, end_reason): what ``tracker audit`` counts evictions from."""
        wanted = set(run_ids)

        def query(conn: sqlite3.Connection) -> dict[str, list[tuple[str, str | None]]]:
            out: dict[str, list[tuple[str, str | None]]] = {}
            for run_id, trigger, end_reason in conn.execute(
                    'SELECT run_id, "trigger", end_reason FROM attempts ORDER BY run_id, attempt'):
                if run_id in wanted:
                    out.setdefault(run_id, []).append((trigger, end_reason))
            return out
        return self._read(query)

    # ------------------------------------------------------------------------------------ one run
    def queue_context(self, run_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """What each pending run of ``run_ids`` waits behind (tables ``queues`` and ``queue_positions``, schema 7):
        {"cluster_queue": {...}, "local_queue": {...}, "position": {...}}, each present when known. A position is
        kept only when it was polled after the run was last queued. Runs that are not pending, and an index from
        before schema 7, give nothing."""
        ids = list(dict.fromkeys(run_ids))

        def query(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
            if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'queues'").fetchone() is None:
                return {}
            out: dict[str, dict[str, Any]] = {}
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                marks = ", ".join("?" * len(chunk))
                runs = conn.execute(
                    f"SELECT run_id, namespace, queue, cluster_queue, queued_at FROM runs "
                    f"WHERE status = 'pending' AND run_id IN ({marks})", chunk).fetchall()
                positions = {r[0]: r for r in conn.execute(
                    f"SELECT run_id, cluster_queue, local_queue, position_in_cluster_queue, position_in_local_queue, "
                    f"polled_at, polled_us FROM queue_positions WHERE run_id IN ({marks})", chunk)}
                for run_id, namespace, queue, cluster_queue, queued_at in runs:
                    ctx: dict[str, Any] = {}
                    pos = positions.get(run_id)
                    lq = self._queue(conn, f"queue:{namespace}/{queue}") if namespace and queue else None
                    if lq is not None:
                        ctx["local_queue"] = lq
                    if cluster_queue is None and pos is not None:
                        cluster_queue = pos[1]
                    if cluster_queue is None and lq is not None:  # not admitted yet: its LocalQueue's ClusterQueue
                        cluster_queue = lq.get("cluster_queue")
                    if cluster_queue:
                        cq = self._queue(conn, f"queue:{cluster_queue}")
                        if cq is not None:
                            ctx["cluster_queue"] = cq
                    queued = parse_time(queued_at)
                    if pos is not None and pos[3] is not None and (
                            queued is None or pos[6] >= int(queued.timestamp() * 1_000_000)):
                        ctx["position"] = {"cluster_queue": pos[1], "local_queue": pos[2],
                                           "position_in_cluster_queue": pos[3], "position_in_local_queue": pos[4],
                                           "polled_at": pos[5]}
                    if ctx:
                        out[run_id] = ctx
            return out

        return self._read(query)

    @staticmethod
    def _queue(conn: sqlite3.Connection, key: str) -> dict[str, Any] | None:
        row = conn.execute(
            "SELECT kind, namespace, name, cluster_queue, cohort, stop_policy, stopped, active, active_reason, "
            "active_message, pending, reserving, admitted, admission_checks, resources, deleted, updated_at "
            "FROM queues WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        resources = json.loads(row[14])
        return {"kind": row[0], "namespace": row[1], "name": row[2], "cluster_queue": row[3], "cohort": row[4],
                "stop_policy": row[5], "stopped": bool(row[6]), "active": None if row[7] is None else bool(row[7]),
                "active_reason": row[8], "active_message": row[9], "pending": row[10], "reserving": row[11],
                "admitted": row[12], "admission_checks": json.loads(row[13]), "resources": resources,
                "gpu": gpu_usage(resources), "deleted": bool(row[15]), "updated_at": row[16]}

    def resolve(self, ref: str) -> tuple[str, str | None]:
        """The run id ``ref`` names, and a note when the choice is worth saying: the exact id, else a unique prefix
        of one, else ``NAMESPACE/NAME`` of a Job or RayJob (its latest run). IndexQueryError if none or several."""
        def query(conn: sqlite3.Connection) -> tuple[str, str | None]:
            if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (ref,)).fetchone():
                return ref, None
            escaped = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            ids = [r[0] for r in conn.execute("SELECT run_id FROM runs WHERE run_id LIKE ? ESCAPE '\\' "
                                              "AND substr(run_id, 1, length(?)) = ? ORDER BY run_id LIMIT 6",
                                              (escaped + "%", ref, ref))]
            if len(ids) == 1:
                return ids[0], None
            if len(ids) > 1:
                shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
                raise IndexQueryError(f"{ref!r} is the start of several run ids ({shown}): give more of it")
            namespace, sep, name = ref.partition("/")
            if sep and namespace and name:
                rows = conn.execute(
                    "SELECT run_id, created_at FROM runs WHERE namespace = ? AND name = ? "
                    f"ORDER BY created_at IS NULL, {_exact('created_at')} DESC, run_id", (namespace, name)).fetchall()
                if rows:
                    note = None
                    if len(rows) > 1:
                        note = (f"{ref} has {len(rows)} runs; showing the latest, {rows[0][0]} (the others: "
                                + ", ".join(r[0] for r in rows[1:6]) + (", ..." if len(rows) > 6 else "") + ")")
                    return str(rows[0][0]), note
            raise IndexQueryError(f"no run {ref!r} in {self.path} (a run id, a unique start of one, or "
                                  "NAMESPACE/NAME of a Job or RayJob; list runs with: tracker runs)")
        return self._read(query)

    def resumed_by(self, run_id: str) -> list[str]:
        """The runs that resume ``run_id`` (their ``resume_of`` is it: the lineage in reverse, one step), the first
        created first (runs without a creation time last), ties by run id. A run the index does not hold, or one
        nobody resumed, gives []."""
        def query(conn: sqlite3.Connection) -> list[str]:
            return [r[0] for r in conn.execute(
                "SELECT l.run_id FROM resume_links l LEFT JOIN runs r ON r.run_id = l.run_id WHERE l.resume_of = ? "
                f"ORDER BY r.created_at IS NULL, {_exact('r.created_at')}, l.run_id", (run_id,))]
        return self._read(query)

    def short_ids(self, run_ids: Iterable[str], *, minimum: int = 8, full_up_to: int = 18) -> dict[str, str]:
        """For each run id, the shortest start of it (at least ``minimum`` characters) that no other run id in the
        index shares; ids of at most ``full_up_to`` characters are kept whole."""
        wanted = sorted(set(run_ids))
        if not wanted:
            return {}

        def query(conn: sqlite3.Connection) -> list[str]:
            return [r[0] for r in conn.execute("SELECT run_id FROM runs ORDER BY run_id")]
        every = self._read(query)
        return short_ids(every, wanted, minimum=minimum, full_up_to=full_up_to)


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
        try:
            snap = json.loads(zlib.decompress(blob))
            labels = snap.get("facts", {}).get("labels") or {}
        except (zlib.error, ValueError, AttributeError):
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
        return f"{column} IS NULL, {_exact(column)}, run_id"
    if column.endswith("_at"):
        return f"{column} IS NULL, {_exact(column)} DESC, run_id"  # newest first, runs without the time last
    if column in ("attempts", "evictions", "retries", "admission_wait_s"):
        return f"{column} IS NULL, {column} DESC, run_id"  # most first
    return f"{column} IS NULL, {column}, run_id"


# ------------------------------------------------------------------------------------------ queues

# tracker.core.gpu.ACCELERATOR_RESOURCES, not imported (it imports pydantic): the resources shown as GPUs
ACCELERATORS = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe", "habana.ai/gaudi")
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {"": 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}


def _number(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    m = _QUANTITY.match(text.strip())
    return None if m is None else float(m.group(1)) * _SUFFIX[m.group(2) or ""]


def _accelerator(resource: str) -> bool:
    return resource in ACCELERATORS or resource.startswith("nvidia.com/mig-")


def gpu_usage(resources: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first accelerator resource of a queue, summed over its flavors: {resource, used (reserved), nominal}."""
    sums: dict[str, list[float | None]] = {}
    for r in resources:
        name = r.get("resource")
        if not isinstance(name, str) or not _accelerator(name):
            continue
        # quota reserved (flavorsReservation) includes what admitted workloads use (flavorsUsage), and also what
        # workloads hold while their admission checks run: what a pending workload waits behind
        used = _number(r.get("reserved")) if r.get("reserved") is not None else _number(r.get("used"))
        nominal = _number(r.get("nominal"))
        acc = sums.setdefault(name, [None, None])
        if used is not None:
            acc[0] = (acc[0] or 0.0) + used
        if nominal is not None:
            acc[1] = (acc[1] or 0.0) + nominal
    if not sums:
        return None
    name = min(sums, key=lambda n: (n not in ACCELERATORS, n))
    used, nominal = sums[name]
    return {"resource": name, "used": used, "nominal": nominal}
