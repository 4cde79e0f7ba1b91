"""The reducer state an index keeps is checked before a replay continues from it (issue 27).

An index is built by replaying a bundled capture (with held records, retired runs, a live run with its pods and
the watermark), then damaged: every stored-state table and column (``reducer_runs.state`` and ``retired_seq``,
``reducer_pods``, ``reducer_held``, ``meta``'s ``reducer_clock`` and ``schema_version``), its tables and the file.
A second ``tracker replay`` of another capture must then stop with exit 2 and exactly one line on stderr naming the
table (or what is wrong with the file), no traceback, and leave the index byte for byte as it was. The readers
(``tracker runs``, ``tracker show``) on the same damage: they work, or say what is wrong in one line.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracker.cli import main
from tracker.cli.args import DEMO_CAPTURES
from tracker.read.store import IndexReader
from tracker.shell.index_schema import SCHEMA_VERSION, IndexSchemaError

CAPTURES = Path(__file__).resolve().parents[1] / "captures" / "controllers"
FIRST = [str(CAPTURES / "quota-wait-and-deletions" / "capture.jsonl.gz"), str(DEMO_CAPTURES / "pods.jsonl")]
SECOND = [str(CAPTURES / "pod-failure-retry" / "capture.jsonl.gz")]
RETIRE = ["--retire-after", "1s"]  # the same on every replay into one index (README); it makes retired markers
LIVE = "run-running-deleted"  # the base index's live run (it has a pod row); the others are retired markers
RETIRED = "run-blocker"

Damage = Callable[[sqlite3.Connection], None]
# the caps docs/limits.md states (tracker.shell.state_codec): a run's state, a pod's
RUN_STATE_BYTES, POD_STATE_BYTES = 64 * 1024 * 1024, 1024 * 1024
BASE_RSS = 200 * 1024 * 1024  # a replay's own peak resident memory, with room (about 110 MiB measured here)

NEWER = SCHEMA_VERSION + 1  # a schema version no tracker of this code reads


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("base") / "index.sqlite"
    assert main(["replay", *FIRST, *RETIRE, "--index", str(path)]) == 0
    with sqlite3.connect(path) as conn:  # what the matrix damages is there
        assert conn.execute("SELECT retired_seq FROM reducer_runs WHERE run_id = ?", (LIVE,)).fetchone() == (None,)
        assert conn.execute("SELECT retired_seq FROM reducer_runs WHERE run_id = ?", (RETIRED,)).fetchone()[0] >= 1
        assert conn.execute("SELECT COUNT(*) FROM reducer_pods WHERE run_id = ?", (LIVE,)).fetchone()[0] >= 1
        assert conn.execute("SELECT COUNT(*) FROM reducer_held").fetchone()[0] >= 3
        assert conn.execute("SELECT value FROM meta WHERE key = 'reducer_clock'").fetchone() is not None
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "not a file"


def damaged(base: Path, directory: Path, damage: Damage) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "index.sqlite"
    shutil.copy(base, path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        damage(conn)
    finally:
        conn.close()
    assert not Path(f"{path}-wal").exists()  # checkpointed: the file alone is the index
    return path


# ------------------------------------------------------------------------------------------ damage
def z(value: Any) -> bytes:
    return zlib.compress(json.dumps(value).encode())


def state(conn: sqlite3.Connection, table: str, where: str) -> Any:
    blob = conn.execute(f"SELECT {_column(table)} FROM {table} WHERE {where}").fetchone()[0]
    return json.loads(zlib.decompress(blob))


def _column(table: str) -> str:
    return "record" if table == "reducer_held" else "state"


def set_blob(table: str, where: str, blob: bytes | str | Callable[[bytes], bytes]) -> Damage:
    def damage(conn: sqlite3.Connection) -> None:
        column = _column(table)
        old = conn.execute(f"SELECT {column} FROM {table} WHERE {where}").fetchone()[0]
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE {where}", (blob(old) if callable(blob) else blob,))
    return damage


def edit(table: str, where: str, change: Callable[[Any], Any]) -> Damage:
    """Decode the row's JSON, ``change`` it (returning the new value, or None to keep the changed one), store it."""
    def damage(conn: sqlite3.Connection) -> None:
        value = state(conn, table, where)
        new = change(value)
        set_blob(table, where, z(value if new is None else new))(conn)
    return damage


def sql(*statements: str) -> Damage:
    def damage(conn: sqlite3.Connection) -> None:
        for s in statements:
            conn.execute(s)
    return damage


def bomb(size: int) -> bytes:
    """A small zlib stream of more than ``size`` bytes of JSON (blanks, then ``[]``): valid, only too large."""
    c = zlib.compressobj(9)
    chunk = b" " * (1 << 20)
    parts = [c.compress(chunk) for _ in range(size // len(chunk) + 1)]
    parts += [c.compress(b"[]"), c.flush()]
    return b"".join(parts)


LIVE_ROW = f"run_id = '{LIVE}'"
RETIRED_ROW = f"run_id = '{RETIRED}'"
POD_ROW = f"run_id = '{LIVE}'"
HELD_ROW = "seq = (SELECT MIN(seq) FROM reducer_held)"


def facts(change: Callable[[dict[str, Any]], Any]) -> Damage:
    return edit("reducer_runs", LIVE_ROW, lambda s: change(s["facts"]))


def setitem(d: dict[str, Any], key: str, value: Any) -> None:
    d[key] = value


def delitem(d: dict[str, Any], key: str) -> None:
    del d[key]


def pod_field(i: int, value: Any) -> Callable[[list[Any]], list[Any]]:
    def change(pod: list[Any]) -> list[Any]:
        pod[i] = value
        return pod
    return change


# (id, damage, the words the one line must hold)
STATE_DAMAGE: list[tuple[str, Damage, str]] = [
    # reducer_runs.state of a live run
    ("runs-truncated", set_blob("reducer_runs", LIVE_ROW, lambda b: b[: len(b) // 2]), "reducer_runs"),
    ("runs-random-bytes", set_blob("reducer_runs", LIVE_ROW, bytes(range(7, 250, 3))), "reducer_runs"),
    ("runs-trailing-bytes", set_blob("reducer_runs", LIVE_ROW, lambda b: b + b"\x00junk"), "reducer_runs"),
    ("runs-zlib-not-json", set_blob("reducer_runs", LIVE_ROW, zlib.compress(b"{not json")), "reducer_runs"),
    ("runs-json-too-deep", set_blob("reducer_runs", LIVE_ROW, zlib.compress(b"[" * 200_000)), "reducer_runs"),
    ("runs-json-list", set_blob("reducer_runs", LIVE_ROW, z([1, 2, 3])), "reducer_runs"),
    ("runs-text-not-blob", set_blob("reducer_runs", LIVE_ROW, "a text"), "reducer_runs"),
    ("runs-version", edit("reducer_runs", LIVE_ROW, lambda s: setitem(s, "version", 7)), "version"),
    ("runs-other-run", edit("reducer_runs", LIVE_ROW, lambda s: setitem(s, "run_id", RETIRED)), "reducer_runs"),
    ("runs-owners-text", edit("reducer_runs", LIVE_ROW, lambda s: setitem(s, "owners", "uid")), "owners"),
    ("runs-owners-missing", edit("reducer_runs", LIVE_ROW, lambda s: delitem(s, "owners")), "owners"),
    ("runs-marks-short", edit("reducer_runs", LIVE_ROW, lambda s: setitem(s, "marks", [1, 2])), "marks"),
    ("runs-marks-text", edit("reducer_runs", LIVE_ROW, lambda s: setitem(s, "marks", ["a"] * 4)), "marks"),
    ("runs-quiet-huge", edit("reducer_runs", LIVE_ROW, lambda s: setitem(s, "quiet", 10**30)), "quiet"),
    ("facts-missing", edit("reducer_runs", LIVE_ROW, lambda s: delitem(s, "facts")), "facts"),
    ("facts-not-object", edit("reducer_runs", LIVE_ROW, lambda s: setitem(s, "facts", [])), "facts"),
    ("facts-ray-missing", facts(lambda f: delitem(f, "ray")), "facts.ray"),
    ("facts-created-text", facts(lambda f: setitem(f, "created", "yesterday")), "facts.created"),
    ("facts-created-huge", facts(lambda f: setitem(f, "created", 2**70)), "facts.created"),
    ("facts-created-float", facts(lambda f: setitem(f, "created", 1.5)), "facts.created"),
    ("facts-expected-negative", facts(lambda f: setitem(f, "expected_pods", -3)), "facts.expected_pods"),
    ("facts-labels-null", facts(lambda f: setitem(f, "labels", None)), "facts.labels"),
    ("facts-label-value-int", facts(lambda f: setitem(f, "labels", {"a": 1})), "facts.labels.a"),
    ("facts-conds-row-short", facts(lambda f: setitem(f, "wl_conds", [["Admitted", "True"]])), "facts.wl_conds[0]"),
    ("facts-events-bad", facts(lambda f: setitem(f, "events", {"e": [1, 2]})), "facts.events.e"),
    ("facts-metric-nan", facts(lambda f: setitem(f, "metrics", {"loss": [[1, "NaN"], [1, 0.5], 0, 1, 1]})),
     "facts.metrics.loss"),
    ("facts-points-width-zero", facts(lambda f: setitem(f, "points", [0, {"loss": [[1, 0.5, 1]]}])), "facts.points"),
    ("facts-intake-kind", facts(lambda f: setitem(f, "intake", {"e": ["Progress", "started", 1, {}]})),
     "facts.intake.e"),
    ("facts-bool-as-int", facts(lambda f: setitem(f, "job_failed", True)), "facts.job_failed"),
    # reducer_runs: a retired marker
    ("retired-seq-null", sql(f"UPDATE reducer_runs SET retired_seq = NULL WHERE {RETIRED_ROW}"), "retired_seq"),
    ("retired-seq-text", sql(f"UPDATE reducer_runs SET retired_seq = 'x' WHERE {RETIRED_ROW}"), "retired_seq"),
    ("retired-seq-other", sql(f"UPDATE reducer_runs SET retired_seq = 9 WHERE {RETIRED_ROW}"), "retired_seq"),
    ("live-with-retired-seq", sql(f"UPDATE reducer_runs SET retired_seq = 99 WHERE {LIVE_ROW}"), "retired_seq"),
    ("retired-seq-negative", edit("reducer_runs", RETIRED_ROW, lambda s: setitem(s, "retired_seq", -5)),
     "retired_seq"),
    ("retired-owners-null", edit("reducer_runs", RETIRED_ROW, lambda s: setitem(s, "owners", None)), "owners"),
    ("runs-key-blob", sql(f"UPDATE reducer_runs SET run_id = X'00ff' WHERE {RETIRED_ROW}"),
     "written without the reducer state"),
    # reducer_pods
    ("pods-truncated", set_blob("reducer_pods", POD_ROW, lambda b: b[:-3]), "reducer_pods"),
    ("pods-zlib-not-json", set_blob("reducer_pods", POD_ROW, zlib.compress(b"\xff\xfe")), "reducer_pods"),
    ("pods-json-object", set_blob("reducer_pods", POD_ROW, z({"name": "p"})), "reducer_pods"),
    ("pods-name-null", edit("reducer_pods", POD_ROW, pod_field(0, None)), "reducer_pods"),
    ("pods-gpus-text", edit("reducer_pods", POD_ROW, pod_field(14, "8")), "reducer_pods"),
    ("pods-gpus-negative", edit("reducer_pods", POD_ROW, pod_field(14, -1)), "reducer_pods"),
    ("pods-created-huge", edit("reducer_pods", POD_ROW, pod_field(3, 10**25)), "reducer_pods"),
    ("pods-short", edit("reducer_pods", POD_ROW, lambda p: p[:5]), "reducer_pods"),
    ("pods-bomb", set_blob("reducer_pods", POD_ROW, bomb(4 * POD_STATE_BYTES)), "inflates to more than 1 MiB"),
    # reducer_held
    ("held-truncated", set_blob("reducer_held", HELD_ROW, lambda b: b[:10]), "reducer_held"),
    ("held-zlib-not-json", set_blob("reducer_held", HELD_ROW, zlib.compress(b"held")), "reducer_held"),
    ("held-two-items", edit("reducer_held", HELD_ROW, lambda r: r[:2]), "reducer_held"),
    ("held-event-type", edit("reducer_held", HELD_ROW, lambda r: [5, r[1], r[2]]), "reducer_held"),
    ("held-object-null", edit("reducer_held", HELD_ROW, lambda r: [r[0], None, r[2]]), "reducer_held"),
    ("held-source-int", edit("reducer_held", HELD_ROW, lambda r: [r[0], r[1], 7]), "reducer_held"),
    ("held-owner-empty", sql(f"UPDATE reducer_held SET owner = '' WHERE {HELD_ROW}"), "reducer_held"),
    ("held-seq-negative", sql(f"UPDATE reducer_held SET seq = -4 WHERE {HELD_ROW}"), "reducer_held"),
    # meta: the watermark
    ("clock-not-json", sql("UPDATE meta SET value = '[1, 2' WHERE key = 'reducer_clock'"), "reducer_clock"),
    ("clock-short", sql("UPDATE meta SET value = '[1, 2]' WHERE key = 'reducer_clock'"), "reducer_clock"),
    ("clock-null", sql("UPDATE meta SET value = 'null' WHERE key = 'reducer_clock'"), "reducer_clock"),
    ("clock-text", sql("""UPDATE meta SET value = '["a","b","c","d"]' WHERE key = 'reducer_clock'"""),
     "reducer_clock"),
    ("clock-huge", sql(f"UPDATE meta SET value = '[{10**30}, 0, 0, 0]' WHERE key = 'reducer_clock'"),
     "reducer_clock"),
]

SCHEMA_DAMAGE: list[tuple[str, Damage, str]] = [
    ("schema-version-text", sql("UPDATE meta SET value = 'nine' WHERE key = 'schema_version'"),
     f"'nine' in meta, which is no schema version; this tracker reads schema versions 1 to {SCHEMA_VERSION}"),
    ("schema-version-zero", sql("UPDATE meta SET value = '0' WHERE key = 'schema_version'"),
     f"this tracker reads schema versions 1 to {SCHEMA_VERSION}"),
    ("schema-version-newer", sql(f"UPDATE meta SET value = '{NEWER}' WHERE key = 'schema_version'"),
     f"schema version {NEWER}, newer than this tracker supports (this tracker reads schema versions 1 to "
     f"{SCHEMA_VERSION})"),
    ("schema-version-older", sql("UPDATE meta SET value = '4' WHERE key = 'schema_version'"),
     "states schema version 4 in meta, but its tables are not those of version 4"),
    ("schema-version-missing", sql("DELETE FROM meta WHERE key = 'schema_version'"),
     f"no schema_version in a meta table; this tracker reads schema versions 1 to {SCHEMA_VERSION}"),
    ("dropped-reducer-held", sql("DROP TABLE reducer_held"), "has no table reducer_held"),
    ("dropped-reducer-pods", sql("DROP TABLE reducer_pods"), "has no table reducer_pods"),
    ("dropped-runs", sql("PRAGMA foreign_keys = OFF", "DROP TABLE runs"), "has no table runs"),
    ("reducer-runs-column-dropped", sql("DROP INDEX reducer_runs_by_retired_seq",
                                        "ALTER TABLE reducer_runs DROP COLUMN retired_seq"),
     "table reducer_runs has other columns"),
    ("reducer-held-column-renamed", sql("ALTER TABLE reducer_held RENAME COLUMN record TO rec"),
     "table reducer_held has other columns"),
]


def replay_second(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    capsys.readouterr()
    rc = main(["replay", *SECOND, *RETIRE, "--index", str(path)])
    err = capsys.readouterr().err
    return rc, [line for line in err.splitlines() if line.strip()]


def assert_refused(path: Path, before: str, rc: int, lines: list[str], words: str) -> None:
    assert rc == 2, lines
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    assert words in lines[0], lines[0]
    assert str(path) in lines[0], lines[0]
    assert digest(path) == before  # nothing written


@pytest.mark.parametrize(("damage", "words"), [pytest.param(d, w, id=i) for i, d, w in STATE_DAMAGE + SCHEMA_DAMAGE])
def test_a_replay_into_a_damaged_index_stops_in_one_line_and_writes_nothing(
        base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Damage, words: str) -> None:
    path = damaged(base, tmp_path, damage)
    before = digest(path)
    rc, lines = replay_second(path, capsys)
    assert_refused(path, before, rc, lines, words)
    if words.startswith(("reducer_", "facts", "owners", "marks", "quiet", "version", "retired_seq", "run_id")):
        # the table (and the row) is named, and the way to rebuild
        table = next(t for t in ("reducer_runs", "reducer_pods", "reducer_held", "reducer_clock") if t in lines[0])
        assert table in lines[0]
        assert "replay the captures into a new index" in lines[0]


def test_the_undamaged_index_continues(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The matrix's control: the same second replay into the index as it was built goes on and writes."""
    path = damaged(base, tmp_path, lambda conn: None)
    before = digest(path)
    rc, lines = replay_second(path, capsys)
    assert rc == 0, lines
    assert digest(path) != before


def peak(args: list[str]) -> tuple[int, list[str], str, int]:
    """Run ``tracker ARGS`` in a process of its own: its exit code, stderr lines, stdout, peak resident bytes."""
    # VmHWM: the peak of this process's own memory (ru_maxrss may report the forking parent's, kept across exec)
    code = ("import re, sys; from pathlib import Path; from tracker.cli import main; rc = main(sys.argv[1:]); "
            "print(re.search(r'VmHWM:\\s+(\\d+) kB', Path('/proc/self/status').read_text())[1], file=sys.stderr); "
            "sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    lines = done.stderr.splitlines()
    said = [line for line in lines[:-1] if not line.startswith("note: ")]  # (a recording's reference time)
    return done.returncode, said, done.stdout, int(lines[-1]) * 1024


def test_a_zlib_bomb_in_a_run_state_stops_at_the_cap(base: Path, tmp_path: Path) -> None:
    """A blob of under a megabyte that inflates to 384 MiB of valid JSON: the replay refuses it once the cap (64 MiB
    plus the metric points' share) is reached, and never holds much more than the cap (its peak resident memory is
    measured: inflating it whole took more than 384 MiB). The readers' ``-l``, which reads the stored labels, skips
    it within the same cap."""
    blob = bomb(384 * 1024 * 1024)
    assert len(blob) < 1024 * 1024
    path = damaged(base, tmp_path, set_blob("reducer_runs", LIVE_ROW, blob))
    before = digest(path)
    rc, lines, _out, peak_bytes = peak(["replay", *SECOND, *RETIRE, "--index", str(path)])
    assert_refused(path, before, rc, lines, "table reducer_runs, run 'run-running-deleted'")
    assert "inflates to more than" in lines[0]
    assert peak_bytes < RUN_STATE_BYTES + BASE_RSS, peak_bytes  # the cap and the interpreter, no more
    rc, lines, out, peak_bytes = peak(["runs", "-o", "name", "-l", "!team", "--index", str(path)])  # a stored label
    assert (rc, lines) == (0, [])
    assert LIVE in out  # read as a run without labels: it has no label team
    assert peak_bytes < RUN_STATE_BYTES + BASE_RSS, peak_bytes
    assert digest(path) == before


def test_the_file_itself(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not an SQLite file, a directory: one line each, nothing created or changed."""
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"SQLite format 2\x00" + bytes(200))
    before = digest(junk)
    rc, lines = replay_second(junk, capsys)
    assert_refused(junk, before, rc, lines, "is not an experiment index")
    directory = tmp_path / "dir.sqlite"
    directory.mkdir()
    rc, lines = replay_second(directory, capsys)
    assert rc == 2 and len(lines) == 1 and "is a directory" in lines[0], lines
    assert list(directory.iterdir()) == []


@given(table=st.sampled_from([("reducer_runs", LIVE_ROW), ("reducer_runs", RETIRED_ROW), ("reducer_pods", POD_ROW),
                              ("reducer_held", HELD_ROW)]),
       how=st.sampled_from(["replace", "flip", "cut", "append"]), data=st.data())
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_byte_damage_anywhere_in_a_blob(base: Path, tmp_path_factory: pytest.TempPathFactory,
                                        capsys: pytest.CaptureFixture[str], table: tuple[str, str], how: str,
                                        data: st.DataObject) -> None:
    def change(blob: bytes) -> bytes:
        if how == "replace":
            return data.draw(st.binary(min_size=0, max_size=300), label="bytes")
        at = data.draw(st.integers(0, len(blob) - 1), label="at")
        if how == "flip":
            bit = data.draw(st.integers(0, 7), label="bit")
            return blob[:at] + bytes([blob[at] ^ (1 << bit)]) + blob[at + 1:]
        if how == "cut":
            return blob[:at]
        return blob + data.draw(st.binary(min_size=1, max_size=50), label="tail")

    path = damaged(base, tmp_path_factory.mktemp("bytes"), set_blob(*table, change))
    before = digest(path)
    rc, lines = replay_second(path, capsys)
    assert_refused(path, before, rc, lines, table[0])


READERS = [["runs", "-o", "name"], ["runs", "-o", "json"], ["runs", "-o", "name", "-l", f"taugrid.io/run-id={LIVE}"],
           ["show", LIVE]]


@pytest.mark.parametrize(("damage", "words"), [pytest.param(d, w, id=i) for i, d, w in STATE_DAMAGE + SCHEMA_DAMAGE
                                                if not i.startswith("pods-bomb")])
def test_readers_on_a_damaged_index(base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Damage,
                                    words: str) -> None:
    """The readers do not read the reducer state (but for ``-l``'s labels, bounded): on damaged state they just
    work; on a damaged schema they say what is wrong in one line."""
    path = damaged(base, tmp_path, damage)
    before = digest(path)
    for args in READERS:
        capsys.readouterr()
        rc = main([*args, "--index", str(path)])
        out, err = capsys.readouterr()
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith("note: ")]
        assert "Traceback" not in err
        if any(d is damage for _i, d, _w in STATE_DAMAGE):
            assert rc == 0 and not lines, (args, lines)  # nothing the readers read is damaged
            assert LIVE in out
        else:
            assert (rc == 0 and not lines) or (rc != 0 and len(lines) == 1 and not out), (args, rc, lines)
    assert digest(path) == before


@pytest.mark.parametrize(("version", "words"), [
    ("nine", f"'nine' in meta, which is no schema version; this tracker reads schema versions 1 to {SCHEMA_VERSION}"),
    ("-1", f"'-1' in meta, which is no schema version; this tracker reads schema versions 1 to {SCHEMA_VERSION}"),
    (str(NEWER), f"schema version {NEWER}, newer than this tracker supports (this tracker reads schema versions 1 to "
           f"{SCHEMA_VERSION})"),
])
def test_the_reader_names_the_version_found_and_the_versions_it_reads(base: Path, tmp_path: Path, version: str,
                                                                       words: str) -> None:
    path = damaged(base, tmp_path, sql(f"UPDATE meta SET value = '{version}' WHERE key = 'schema_version'"))
    with pytest.raises(IndexSchemaError) as caught:
        IndexReader(path).open()
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)
