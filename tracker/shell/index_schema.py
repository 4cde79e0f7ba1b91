"""The experiment index's schema: its DDL as numbered migrations, the schema version, and opening-time checks.

``SCHEMA_SQL`` (every migration in order) is the contract Stellar reads; ``schemas/index/schema.sql`` is generated
from it (``python -m tracker.schemas``) and documented in ``schemas/index/README.md``. ``ExperimentIndex``
(``tracker.shell.index``) migrates a file with ``migrate`` when it opens it for writing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from tracker import errors
from tracker.shell import index_ddl

_V1 = """\
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    kind             TEXT,
    namespace        TEXT,
    name             TEXT,
    uid              TEXT,
    project          TEXT,
    workspace        TEXT,
    target           TEXT,
    queue            TEXT,
    cluster_queue    TEXT,
    status           TEXT NOT NULL
        CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'stopped')),
    reason           TEXT,
    message          TEXT NOT NULL,
    phase            TEXT NOT NULL
        CHECK (phase IN ('Resolution', 'Rendering', 'Admission', 'Scheduling', 'Runtime', 'Progress',
                         'Completion')),
    attempts         INTEGER NOT NULL,
    retries          INTEGER NOT NULL,
    evictions        INTEGER NOT NULL,
    created_at       TEXT,
    queued_at        TEXT,
    admitted_at      TEXT,
    started_at       TEXT,
    finished_at      TEXT,
    admission_wait_s REAL,
    pending_reason   TEXT,
    pending_message  TEXT NOT NULL,
    git_commit       TEXT,
    config_digest    TEXT,
    config_ref       TEXT,
    input_refs       TEXT NOT NULL, -- JSON array of strings
    output_uri       TEXT,
    resume_of        TEXT,
    last_checkpoint  TEXT,
    updated_seq      INTEGER NOT NULL
);
CREATE INDEX runs_by_status ON runs (status, phase, queued_at);
CREATE INDEX runs_by_phase ON runs (phase);
CREATE INDEX runs_by_queued_at ON runs (queued_at);
CREATE INDEX runs_by_created_at ON runs (created_at);
CREATE INDEX runs_by_workspace ON runs (workspace, project);
CREATE INDEX runs_by_project ON runs (project);
CREATE INDEX runs_by_config ON runs (config_digest);
CREATE INDEX runs_by_git_commit ON runs (git_commit);
CREATE INDEX runs_by_updated_seq ON runs (updated_seq);

CREATE TABLE transitions (
    run_id  TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL CHECK (attempt >= 1),
    phase   TEXT NOT NULL
        CHECK (phase IN ('Resolution', 'Rendering', 'Admission', 'Scheduling', 'Runtime', 'Progress',
                         'Completion')),
    at      TEXT NOT NULL,
    reason  TEXT NOT NULL,
    message TEXT NOT NULL,
    source  TEXT NOT NULL,
    ordinal INTEGER NOT NULL, -- position in the run's timeline, 0-based
    PRIMARY KEY (run_id, attempt, phase)
) WITHOUT ROWID;

CREATE TABLE attempts (
    run_id           TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    attempt          INTEGER NOT NULL CHECK (attempt >= 1),
    "trigger"        TEXT NOT NULL,
    queued_at        TEXT,
    admitted_at      TEXT,
    scheduled_at     TEXT,
    started_at       TEXT,
    progress_at      TEXT,
    ended_at         TEXT,
    end_reason       TEXT,
    end_message      TEXT NOT NULL,
    underlying_cause TEXT,
    admission_wait_s REAL,
    cluster_queue    TEXT,
    ray_cluster      TEXT,
    retries          INTEGER NOT NULL CHECK (retries >= 0),
    failures         TEXT NOT NULL, -- JSON array of {pod, at, reason, exit_code, message}
    pods             TEXT NOT NULL, -- JSON array of {pod, node, created_at, scheduled_at, finished_at}
    PRIMARY KEY (run_id, attempt)
) WITHOUT ROWID;

CREATE TABLE metric_summaries (
    run_id       TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    metric       TEXT NOT NULL,
    first_step   INTEGER NOT NULL,
    first_value  REAL, -- NULL only when the value is NaN
    latest_step  INTEGER NOT NULL,
    latest_value REAL, -- NULL only when the value is NaN
    min_value    REAL, -- NULL only when the value is NaN
    max_value    REAL, -- NULL only when the value is NaN
    points       INTEGER NOT NULL,
    PRIMARY KEY (run_id, metric)
) WITHOUT ROWID;
CREATE INDEX metric_summaries_by_metric ON metric_summaries (metric);

CREATE TABLE resume_links (
    run_id    TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    resume_of TEXT NOT NULL,
    PRIMARY KEY (run_id, resume_of)
) WITHOUT ROWID;
CREATE INDEX resume_links_by_resume_of ON resume_links (resume_of);

CREATE TABLE pod_placements (
    run_id       TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    pod          TEXT NOT NULL,
    node         TEXT,
    created_at   TEXT,
    scheduled_at TEXT,
    finished_at  TEXT,
    PRIMARY KEY (run_id, attempt, pod),
    FOREIGN KEY (run_id, attempt) REFERENCES attempts (run_id, attempt) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE INDEX pod_placements_by_node ON pod_placements (node, scheduled_at);
CREATE INDEX pod_placements_by_pod ON pod_placements (pod);

CREATE TABLE consumer_offsets (
    consumer_group TEXT NOT NULL,
    topic          TEXT NOT NULL,
    "partition"    INTEGER NOT NULL CHECK ("partition" >= 0),
    next_offset    INTEGER NOT NULL CHECK (next_offset >= 0),
    PRIMARY KEY (consumer_group, topic, "partition")
) WITHOUT ROWID;
"""

_V2 = """\

-- The tracker's own state, not part of what readers use: the reducer's facts of each run (zlib-compressed JSON)
-- and the records still waiting for their owner object, written in the same transaction as the rows above so
-- that a later replay into this index continues from them instead of replacing the histories.
CREATE TABLE reducer_runs (
    run_id TEXT PRIMARY KEY,
    state  BLOB NOT NULL
) WITHOUT ROWID;

CREATE TABLE reducer_held (
    seq    INTEGER PRIMARY KEY, -- arrival order among held records
    owner  TEXT NOT NULL,       -- the uid of the owner object the record waits for
    record BLOB NOT NULL
);
"""

_V3 = """\

-- Retirement: the reducer frees the facts of a finished run once the event time is well past its last record,
-- and its row here becomes a marker with the retirement's ordinal. The markers are the lasting memory of which
-- runs ended (the reducer remembers the latest ones only): a record that arrives for a run after it was
-- forgotten never replaces its history.
ALTER TABLE reducer_runs ADD COLUMN retired_seq INTEGER; -- the retirement ordinal of a retired run, else NULL

CREATE INDEX reducer_runs_by_retired_seq ON reducer_runs (retired_seq) WHERE retired_seq IS NOT NULL;
"""

_V4 = """\

-- GPU accounting (schemas/gpu-accounting.md): GPUs, GPU-hours held and lost, per run, attempt and pod. Rows
-- written before version 4 read 0 until their run is written again (a replay of its captures rewrites it).
ALTER TABLE runs ADD COLUMN gpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN gpu_hours REAL NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN lost_gpu_hours REAL NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN lost_gpu_hours_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: reason -> GPU-hours
ALTER TABLE runs ADD COLUMN gpus_open INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN open_since TEXT;
ALTER TABLE attempts ADD COLUMN gpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN gpu_hours REAL NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN lost_gpu_hours REAL NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN lost_gpu_hours_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: reason -> GPU-hours
ALTER TABLE attempts ADD COLUMN gpus_open INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN open_since TEXT;
ALTER TABLE pod_placements ADD COLUMN gpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pod_placements ADD COLUMN released_at TEXT;
ALTER TABLE pod_placements ADD COLUMN gpu_hours REAL; -- NULL while the pod holds its GPUs
ALTER TABLE pod_placements ADD COLUMN lost TEXT;
CREATE INDEX runs_by_lost_gpu_hours ON runs (lost_gpu_hours);
"""

_V5 = """\

-- Metric history (schemas/index/README.md, "Metric points"): each run's metric points, bounded and downsampled,
-- replaced with the run's other rows. Runs written before version 5 have none until they are written again.
CREATE TABLE metric_points (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    metric TEXT NOT NULL,
    step   INTEGER NOT NULL,
    value  REAL NOT NULL,
    at     TEXT NOT NULL, -- the time of the progress event that reported the point
    PRIMARY KEY (run_id, metric, step)
) WITHOUT ROWID;
CREATE INDEX metric_points_by_metric ON metric_points (metric, run_id);

-- Which index this is: meta also holds created_at (below), tracker_version (the tracker that last opened it for
-- writing), and cluster and workspace when the writer is configured with them (TRACKER_INDEX__CLUSTER, ...).
INSERT INTO meta (key, value) VALUES ('created_at', strftime('%Y-%m-%dT%H:%M:%SZ', 'now'))
    ON CONFLICT (key) DO NOTHING;
"""

_V6 = """\

-- Bounded writes (schema 6): each pod is a row of its own, keyed by its uid and written when it changes, so that a
-- change of one pod of a wide run rewrites that row only. Rows written before version 6 keep 'v5:<attempt>:<pod>'
-- as uid until their run is written again. attempts.pods (every pod of the attempt as JSON) is gone: the attempt's
-- pods are the pod_placements rows with its number, and attempts.pod_count counts them. A run's pods and metric
-- points are written apart from its history (on the transitions topic they are records of their own), so their rows
-- no longer reference runs: an index built from a compacted topic may hold them before the run's row.
CREATE TABLE pod_placements_v6 (
    run_id       TEXT NOT NULL, -- no foreign key: built from a compacted topic, a pod may come before its run
    uid          TEXT NOT NULL, -- the pod's metadata.uid
    namespace    TEXT, -- the run's
    attempt      INTEGER NOT NULL CHECK (attempt >= 1),
    pod          TEXT NOT NULL,
    node         TEXT,
    created_at   TEXT,
    scheduled_at TEXT,
    finished_at  TEXT,
    gpus         INTEGER NOT NULL DEFAULT 0,
    released_at  TEXT,
    gpu_hours    REAL, -- NULL while the pod holds its GPUs
    lost         TEXT,
    PRIMARY KEY (run_id, uid)
) WITHOUT ROWID;
INSERT INTO pod_placements_v6 (run_id, uid, namespace, attempt, pod, node, created_at, scheduled_at, finished_at,
                               gpus, released_at, gpu_hours, lost)
    SELECT p.run_id, 'v5:' || p.attempt || ':' || p.pod, r.namespace, p.attempt, p.pod, p.node, p.created_at,
           p.scheduled_at, p.finished_at, p.gpus, p.released_at, p.gpu_hours, p.lost
    FROM pod_placements p JOIN runs r ON r.run_id = p.run_id;
DROP TABLE pod_placements;
ALTER TABLE pod_placements_v6 RENAME TO pod_placements;
CREATE INDEX pod_placements_by_attempt ON pod_placements (run_id, attempt);
CREATE INDEX pod_placements_by_node ON pod_placements (node, scheduled_at);
CREATE INDEX pod_placements_by_pod ON pod_placements (pod);
ALTER TABLE attempts ADD COLUMN pod_count INTEGER NOT NULL DEFAULT 0; -- its pods (pod_placements rows)
ALTER TABLE attempts ADD COLUMN failed_pods INTEGER NOT NULL DEFAULT 0; -- its failed pods (failures lists <= 64)
UPDATE attempts SET pod_count = json_array_length(pods), failed_pods = json_array_length(failures);
ALTER TABLE attempts DROP COLUMN pods;
CREATE TABLE metric_points_v6 (
    run_id TEXT NOT NULL, -- no foreign key, as pod_placements
    metric TEXT NOT NULL,
    step   INTEGER NOT NULL,
    value  REAL NOT NULL,
    at     TEXT NOT NULL, -- the time of the progress event that reported the point
    PRIMARY KEY (run_id, metric, step)
) WITHOUT ROWID;
INSERT INTO metric_points_v6 (run_id, metric, step, value, at)
    SELECT run_id, metric, step, value, at FROM metric_points;
DROP TABLE metric_points;
ALTER TABLE metric_points_v6 RENAME TO metric_points;
CREATE INDEX metric_points_by_metric ON metric_points (metric, run_id);

-- The reducer's state of each pod, apart from its run's (reducer_runs): zlib-compressed JSON.
CREATE TABLE reducer_pods (
    run_id TEXT NOT NULL,
    uid    TEXT NOT NULL,
    state  BLOB NOT NULL,
    PRIMARY KEY (run_id, uid)
) WITHOUT ROWID;
"""

_V7 = """\

-- Admission in steps and every pending second explained (schema 7, history/v3; README "Every pending second"):
-- Admission lasts until Kueue's Admitted=True; the quota reservation and each admission check's states are its
-- steps, and each attempt's time before its application started is split into categories. Rows written before
-- version 7 read the defaults until their run is written again (a replay of its captures rewrites it).
ALTER TABLE runs ADD COLUMN pending_s_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: category -> seconds (ended spans)
ALTER TABLE runs ADD COLUMN pending_category TEXT; -- the category of the span still going on (from pending_since)
ALTER TABLE runs ADD COLUMN pending_since TEXT;
ALTER TABLE runs ADD COLUMN quota_reserved_at TEXT;
ALTER TABLE attempts ADD COLUMN quota_reserved_at TEXT;
ALTER TABLE attempts ADD COLUMN admission_steps TEXT NOT NULL DEFAULT '[]'; -- JSON array of steps
ALTER TABLE attempts ADD COLUMN pending TEXT NOT NULL DEFAULT '[]'; -- JSON array of {category, detail, start, end}
ALTER TABLE attempts ADD COLUMN pending_s_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: category -> seconds
"""

# Kueue's queues (issue 24; part of schema 7 with _V7): the newest state of
# each ClusterQueue and LocalQueue, and each pending run's position in its queues at the latest poll of Kueue's
# visibility API. No foreign keys: queues are no part of a run, and a position may come before its run's row.
_V7_QUEUES = """\

-- Kueue's queues (schemas/index/README.md, "Queues"): the newest version of each ClusterQueue and LocalQueue, by
-- resourceVersion; a deleted queue keeps its row with deleted = 1, so that a late older version does not revive it.
CREATE TABLE queues (
    key              TEXT PRIMARY KEY, -- 'queue:<ClusterQueue>' or 'queue:<namespace>/<LocalQueue>'
    kind             TEXT NOT NULL CHECK (kind IN ('ClusterQueue', 'LocalQueue')),
    namespace        TEXT, -- a LocalQueue's
    name             TEXT NOT NULL,
    uid              TEXT NOT NULL,
    resource_version INTEGER, -- of the version the row is from (NULL when not an integer: last written wins)
    updated_at       TEXT, -- the object's latest time: its creation or a condition's lastTransitionTime
    cluster_queue    TEXT, -- a ClusterQueue's own name; a LocalQueue's spec.clusterQueue
    cohort           TEXT,
    stop_policy      TEXT, -- spec.stopPolicy: None, Hold, HoldAndDrain
    stopped          INTEGER NOT NULL CHECK (stopped IN (0, 1)), -- stopPolicy not None, or Active=False/Stopped
    active           INTEGER CHECK (active IN (0, 1)), -- the Active condition (NULL: none)
    active_reason    TEXT NOT NULL,
    active_message   TEXT NOT NULL,
    pending          INTEGER NOT NULL, -- status.pendingWorkloads
    reserving        INTEGER NOT NULL, -- status.reservingWorkloads
    admitted         INTEGER NOT NULL, -- status.admittedWorkloads
    admission_checks TEXT NOT NULL, -- JSON array of the admission checks a ClusterQueue names
    resources        TEXT NOT NULL, -- JSON array of {flavor, resource, nominal, borrowing_limit, reserved, used}
    deleted          INTEGER NOT NULL CHECK (deleted IN (0, 1))
) WITHOUT ROWID;
CREATE INDEX queues_by_cluster_queue ON queues (cluster_queue);

-- Each pending run's place in its queues at the latest poll of Kueue's visibility API (newest poll wins); NULL
-- positions: the run was listed at a previous poll and no longer is.
CREATE TABLE queue_positions (
    run_id                    TEXT PRIMARY KEY, -- no foreign key: a position may come before its run's row
    namespace                 TEXT NOT NULL,
    workload                  TEXT NOT NULL, -- the Workload's name
    cluster_queue             TEXT NOT NULL,
    local_queue               TEXT,
    position_in_cluster_queue INTEGER,
    position_in_local_queue   INTEGER,
    polled_at                 TEXT NOT NULL, -- the poll's time, as the watcher recorded it
    polled_us                 INTEGER NOT NULL -- the same in microseconds since the epoch (ordering)
) WITHOUT ROWID;
"""

_V8 = """\

-- The goodput ledger (schema 8, history/v4; schemas/goodput.md): where each run's and attempt's time and GPU-time
-- went, by category, its ETTR and goodput, and the run's checkpoints and ledger spans. Rows written before version 8
-- read the defaults (an accounting ledger with nothing in it) until their run is written again.
ALTER TABLE runs ADD COLUMN ledger_basis TEXT NOT NULL DEFAULT 'accounting'
    CHECK (ledger_basis IN ('progress', 'accounting'));
ALTER TABLE runs ADD COLUMN ledger_gpu_hours_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: category -> GPU-hours
ALTER TABLE runs ADD COLUMN ledger_wall_s_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: category -> seconds
ALTER TABLE runs ADD COLUMN ledger_until TEXT; -- the open pods' GPU-time is in the ledger up to this time
ALTER TABLE runs ADD COLUMN ledger_open TEXT; -- the category the run is in at ledger_until while it goes on
ALTER TABLE runs ADD COLUMN ettr REAL;
ALTER TABLE runs ADD COLUMN goodput REAL;
ALTER TABLE runs ADD COLUMN resumed_from TEXT; -- the checkpoint URI this run resumed from
ALTER TABLE runs ADD COLUMN checkpoints_saved INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN ledger_gpu_hours_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: category -> GPU-hours
ALTER TABLE attempts ADD COLUMN ledger_wall_s_by TEXT NOT NULL DEFAULT '{}'; -- JSON object: category -> seconds

-- A run's checkpoint saves and restores, replaced with its history. Keyed by (run_id, kind, step, uri, started_at);
-- started_at is NULL for a save whose start was not reported (a v1 Progress event's checkpoint_uri), of which a run
-- has one per (step, uri): the key treats NULL as one value.
CREATE TABLE checkpoints (
    run_id     TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    kind       TEXT NOT NULL CHECK (kind IN ('save', 'restore')),
    step       INTEGER NOT NULL,
    uri        TEXT NOT NULL,
    started_at TEXT, -- NULL: the start was not reported
    ended_at   TEXT, -- completed or failed at; NULL: not reported yet
    status     TEXT NOT NULL CHECK (status IN ('started', 'completed', 'failed')),
    bytes      INTEGER,
    attempt    INTEGER -- the attempt it happened in
);
CREATE UNIQUE INDEX checkpoints_by_key ON checkpoints (run_id, kind, step, uri, ifnull(started_at, ''));
CREATE INDEX checkpoints_by_uri ON checkpoints (uri);

-- A run's wasted-progress, infrastructure-recovery and checkpoint-restore spans (for timelines), replaced with its
-- history.
CREATE TABLE ledger_spans (
    run_id   TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    category TEXT NOT NULL CHECK (category IN ('productive', 'scheduling', 'startup', 'checkpoint-save',
                                               'checkpoint-restore', 'wasted-progress', 'infrastructure-recovery',
                                               'unclassified')),
    start    TEXT NOT NULL,
    "end"    TEXT NOT NULL,
    PRIMARY KEY (run_id, category, start)
) WITHOUT ROWID;
"""

_V9 = """\

-- Evictions by reason (schema 9, history/v5): the reducer's count of each run's Kueue evictions by reason (sums to
-- evictions). NULL in rows written before version 9 (the index keeps no history to derive it from): readers derive
-- it from the run's attempts rows until the run is written again.
ALTER TABLE runs ADD COLUMN evictions_by TEXT; -- JSON object: reason -> evictions; NULL: written before version 9
"""

_V10 = """\

-- A run by the NAMESPACE/NAME of its Job or RayJob (schema 10): `tracker show`, `compare` and the web view find the
-- latest run of a root by its namespace and name without reading every run.
CREATE INDEX runs_by_name ON runs (namespace, name);
"""

_V11 = """
-- What ran (schema 11, history/v5 with optional fields; tracker.core.provenance): each run's container images, its
-- entrypoint and its hyperparameters. Rows written before version 11 read the defaults (nothing known) until their
-- run is written again.
ALTER TABLE runs ADD COLUMN images TEXT NOT NULL DEFAULT '[]'; -- JSON array of image references, in order
ALTER TABLE runs ADD COLUMN entrypoint TEXT; -- command and args joined shell-style, or a RayJob's entrypoint
ALTER TABLE runs ADD COLUMN hyperparameters TEXT NOT NULL DEFAULT '{}'; -- JSON object: name -> scalar (<= 64 names)
ALTER TABLE runs ADD COLUMN hyperparameters_omitted INTEGER NOT NULL DEFAULT 0; -- names left out past the first 64
"""

_V12 = index_ddl.NODES  # the Nodes (issue 28): tracker.shell.index_ddl

# Migration n turns a schema of version n - 1 into version n. A new version appends a migration here (and so
# changes schemas/index/schema.sql, generated from SCHEMA_SQL) and updates the README.
MIGRATIONS: Mapping[int, str] = {1: _V1, 2: _V2, 3: _V3, 4: _V4, 5: _V5, 6: _V6, 7: _V7 + _V7_QUEUES, 8: _V8, 9: _V9,
                                 10: _V10, 11: _V11, 12: _V12}
SCHEMA_VERSION = max(MIGRATIONS)
SCHEMA_SQL = f"""\
-- TauGrid experiment index, schema version {SCHEMA_VERSION}.
-- The contract Stellar reads: every table and column is documented in README.md next to this file.
-- Times are ISO-8601 UTC text, 'YYYY-MM-DDTHH:MM:SSZ' ('YYYY-MM-DDTHH:MM:SS.ffffffZ' when sub-second).
-- JSON columns hold compact JSON text (query them with json_each / json_extract).

{"".join(MIGRATIONS.values())}"""


class IndexSchemaError(errors.Fatal, RuntimeError):
    """The file is not an experiment index this tracker can use (e.g. its schema is newer than the code)."""

    exit_code = 2  # the command line says why and exits 2


class IndexOpenError(IndexSchemaError):
    """The index cannot be opened at all: missing, a directory, unreadable, or not an SQLite database."""


READS = f"this tracker reads schema versions 1 to {SCHEMA_VERSION}"
REBUILD = "replay the captures into a new index (tracker replay CAPTURE... --index NEW.sqlite)"


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Bring the index to ``SCHEMA_VERSION`` in one transaction; IndexSchemaError (nothing changed) when its tables
    are not those of the version its ``meta`` states, so that a migration cannot apply."""
    if schema_version(conn, path) == SCHEMA_VERSION:
        return
    with transaction(conn, "BEGIN IMMEDIATE"):  # re-read under the write lock: another process may migrate
        version = schema_version(conn, path)
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in statements(MIGRATIONS[target]):
                try:
                    conn.execute(statement)
                except sqlite3.OperationalError as exc:
                    if _not_schema(exc):
                        raise
                    raise IndexSchemaError(
                        f"experiment index {path} states schema version {version} in meta, but its tables are not "
                        f"those of version {version}: migrating it to {target} failed ({why(exc)}); {READS}. Nothing "
                        f"was changed: {REBUILD}") from None
        conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                     "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (str(SCHEMA_VERSION),))


def tracker_version() -> str:
    """The installed tracker's version ('unknown' when it runs from a tree that was never installed)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("taugrid-tracker")
    except PackageNotFoundError:
        return "unknown"


def stamp(conn: sqlite3.Connection, identity: Mapping[str, str]) -> None:
    """Record in ``meta`` which index this is: the tracker version writing it, and the ``cluster`` and ``workspace``
    the writer is configured with (empty values are not written). Writes only what differs."""
    values = {"tracker_version": tracker_version(), **{k: v for k, v in identity.items() if v}}
    marks = ", ".join("?" for _ in values)
    have = dict(conn.execute(f"SELECT key, value FROM meta WHERE key IN ({marks})", list(values)).fetchall())
    if have == values:
        return
    with transaction(conn, "BEGIN IMMEDIATE"):
        conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?) "
                         "ON CONFLICT (key) DO UPDATE SET value = excluded.value", list(values.items()))


def check_database(conn: sqlite3.Connection, path: Path) -> None:
    """IndexOpenError unless the file is an SQLite database (an empty or new file is one)."""
    try:
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise IndexOpenError(f"{path} is not an experiment index ({why(exc)}): give the path of an index "
                             "that tracker replay or tracker sink index wrote") from exc


def why(exc: BaseException) -> str:
    """A one-line cause for an SQLite or OS error."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def schema_version(conn: sqlite3.Connection, path: Path) -> int:
    """The index's schema version: 0 for an empty database; IndexSchemaError for anything unusable."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        return 0
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() \
        if "meta" in tables else None
    if row is None:
        raise IndexSchemaError(f"{path} is not an experiment index (it has tables but no schema_version in a meta "
                               f"table; {READS})")
    text = str(row[0])
    if not (text.isascii() and text.isdigit() and 1 <= len(text) <= 9 and int(text) >= 1):
        raise IndexSchemaError(f"experiment index {path} has schema version {row[0]!r:.40} in meta, which is no "
                               f"schema version; {READS}. {REBUILD[0].upper()}{REBUILD[1:]}")
    version = int(text)
    if version > SCHEMA_VERSION:
        raise IndexSchemaError(f"experiment index {path} has schema version {version}, newer than this "
                               f"tracker supports ({READS}); upgrade the tracker to use it")
    return version


def _not_schema(exc: sqlite3.OperationalError) -> bool:
    """Whether an error of a migration is the file's or the disk's (read-only, locked, full), not its tables'."""
    text = str(exc).lower()
    return any(w in text for w in ("readonly", "read-only", "locked", "busy", "disk", "i/o", "full"))


def expected_columns() -> dict[str, tuple[str, ...]]:
    """Each table of ``SCHEMA_VERSION`` and its columns, in order (its migrations run in memory, once)."""
    return _columns_of("".join(MIGRATIONS[v] for v in sorted(MIGRATIONS) if v <= SCHEMA_VERSION))


@lru_cache(maxsize=4)
def _columns_of(script: str) -> dict[str, tuple[str, ...]]:
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(script)
        return _columns(mem)
    finally:
        mem.close()


def _columns(conn: sqlite3.Connection) -> dict[str, tuple[str, ...]]:
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    return {n: tuple(str(c[1]) for c in conn.execute(f"PRAGMA table_info(\"{n}\")")) for n in names}


def check_tables(conn: sqlite3.Connection, path: Path) -> None:
    """IndexSchemaError unless every table of ``SCHEMA_VERSION`` is there with its columns (other tables are left
    alone): an index of this version whose tables were dropped or changed."""
    have = _columns(conn)
    for table, columns in expected_columns().items():
        found = have.get(table)
        if found is None:
            raise IndexSchemaError(f"experiment index {path} (schema version {SCHEMA_VERSION}) has no table {table}; "
                                   f"nothing was changed: {REBUILD}")
        if found != columns:
            missing = [c for c in columns if c not in found] or "none"
            extra = [c for c in found if c not in columns] or "none"
            raise IndexSchemaError(f"experiment index {path} (schema version {SCHEMA_VERSION}): table {table} has "
                                   f"other columns than version {SCHEMA_VERSION} (missing: {missing}, not of it: "
                                   f"{extra}); nothing was changed: {REBUILD}")


def statements(script: str) -> Iterator[str]:
    """The SQL statements of a script, one at a time (so they run inside the caller's transaction)."""
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            yield buf.strip()
            buf = ""
    if any(line.strip() and not line.strip().startswith("--") for line in buf.splitlines()):
        raise ValueError(f"incomplete SQL statement at the end of a migration: {buf.strip()[:80]!r}")


@contextmanager
def transaction(conn: sqlite3.Connection, begin: str) -> Iterator[None]:
    """BEGIN ... COMMIT, or ROLLBACK when the block raises (the connection is in autocommit mode)."""
    conn.execute(begin)
    try:
        yield
    except BaseException:
        if conn.in_transaction:  # some errors (e.g. a full disk) have rolled back already
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
