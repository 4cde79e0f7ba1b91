"""Readers never write: `tracker runs` and `tracker show` open the index read-only, work on a read-only volume and
while a writer writes, and refuse a file that is not an index in one line on stderr."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from tests.support.histories import copy_into_older, index_of_schema, stored, ups
from tracker.cli import main
from tracker.cli.args import DEMO_CAPTURES
from tracker.read import store as store_module
from tracker.read.store import IndexReader
from tracker.runtime.replay import replay
from tracker.shell.index import ExperimentIndex
from tracker.shell.index_schema import IndexOpenError, IndexSchemaError

RUN = "gpt-moe-6wz8r"  # a run of the bundled capture


@pytest.fixture(scope="module")
def demo_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("demo") / "index.sqlite"
    replay(captures=[DEMO_CAPTURES], index_path=path, console=Console(quiet=True), quiet=True)
    return path


def copy_of(index: Path, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(index, directory / index.name)
    return directory / index.name


def listing(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir()}


def cli(args: list[str], wrap: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    code = "import sys; from tracker.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([*(wrap or []), sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])


def test_readers_work_on_a_read_only_volume(demo_index: Path, tmp_path: Path) -> None:
    """A read-only bind mount in a private mount namespace (``unshare``: no privileges needed beyond a user
    namespace, and root inside it), the way Stellar's volumes are mounted."""
    src = copy_of(demo_index, tmp_path / "src")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    assert shutil.which("unshare"), "unshare (util-linux) is needed to make a read-only mount"
    script = (f"mount --bind {src.parent} {mnt} && mount -o remount,ro,bind {mnt} && touch {mnt}/probe 2>/dev/null "
              f"&& echo WRITABLE; exec \"$@\"")
    wrap = ["unshare", "-rm", "sh", "-c", script, "sh"]
    before = listing(src.parent)
    runs = cli(["runs", "--index", str(mnt / src.name), "--json"], wrap)
    assert runs.returncode == 0, runs.stderr
    assert "WRITABLE" not in runs.stdout and RUN in runs.stdout
    show = cli(["show", RUN, "--index", str(mnt / src.name)], wrap)
    assert show.returncode == 0, show.stderr
    assert RUN in show.stdout and "attempt" in show.stdout
    assert listing(src.parent) == before


def test_a_reader_creates_no_file_and_migrates_nothing(demo_index: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    index = copy_of(demo_index, tmp_path / "idx")
    with sqlite3.connect(index) as conn:  # an index of an older schema: a reader reads it as it is
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.close()
    before = listing(index.parent)
    assert main(["runs", "--index", str(index), "--json"]) == 0
    assert main(["show", RUN, "--index", str(index)]) == 0
    assert RUN in capsys.readouterr().out
    assert listing(index.parent) == before
    with sqlite3.connect(index) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)
    conn.close()


def test_a_reader_reads_while_a_writer_writes(demo_index: Path, tmp_path: Path) -> None:
    index = copy_of(demo_index, tmp_path / "idx")
    with IndexReader(index) as reader:  # opened while no writer has the file open
        runs = stored(reader).records()
        with ExperimentIndex(index) as writer:
            history = stored(writer).history(RUN)
            assert history is not None
            writer.write(ups([replace(history, run=replace(history.run, message="edited"))]))
            writer._db.execute("BEGIN IMMEDIATE")  # a write in progress does not block the reader
            writer._db.execute("UPDATE runs SET message = 'uncommitted' WHERE run_id = ?", (RUN,))
            seen = stored(reader).history(RUN)
            assert seen is not None and seen.run.message == "edited"  # the committed state, not the uncommitted
            assert len(stored(reader).records()) == len(runs)
            writer._db.execute("ROLLBACK")


def test_readers_refuse_what_is_not_an_index_in_one_line(demo_index: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    cases: dict[str, Path] = {"missing": tmp_path / "missing.sqlite", "directory": tmp_path}
    (text := tmp_path / "text.sqlite").write_text("not a database\n")
    cases["not SQLite"] = text
    (empty := tmp_path / "empty.sqlite").write_bytes(b"")
    cases["empty"] = empty
    truncated = tmp_path / "truncated.sqlite"
    truncated.write_bytes(demo_index.read_bytes()[:1000])
    cases["truncated"] = truncated
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY)")
    conn.close()
    cases["another application's database"] = foreign
    newer = copy_of(demo_index, tmp_path / "newer")
    with sqlite3.connect(newer) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.close()
    cases["newer schema"] = newer
    for what, path in cases.items():
        for args in (["runs", "--index", str(path)], ["show", RUN, "--index", str(path)]):
            before = listing(path.parent)
            assert main(args) == 2, what
            out, err = capsys.readouterr()
            assert out == "", what
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0], (what, err)
            assert "Traceback" not in err
            assert listing(path.parent) == before, what


def test_a_writer_on_a_file_that_is_not_an_index_fails_in_one_line(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "notes.sqlite"
    text.write_text("my notes\n")
    assert main(["replay", str(DEMO_CAPTURES / "jobs.json"), "--index", str(text)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not an experiment index" in err[0]
    assert text.read_text() == "my notes\n"
    assert main(["replay", str(DEMO_CAPTURES / "jobs.json"), "--index", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_reader_errors_are_index_errors(tmp_path: Path) -> None:
    with pytest.raises(IndexOpenError, match="no experiment index"):
        IndexReader(tmp_path / "none.sqlite").open()
    (tmp_path / "e.sqlite").write_bytes(b"")
    with pytest.raises(IndexSchemaError, match="empty database"):
        IndexReader(tmp_path / "e.sqlite").open()
    with ExperimentIndex(tmp_path / "w.sqlite") as ix, pytest.raises(sqlite3.OperationalError, match="readonly"):
        IndexReader(ix.path).open().read(lambda conn: conn.execute("DELETE FROM runs"))  # a reader cannot write
    assert store_module.READ_RETRIES >= 1
    assert not os.path.exists(tmp_path / "none.sqlite")


def test_an_index_of_the_previous_schema_is_read_as_it_is(demo_index: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A reader never migrates: an index a tracker of schema 3 wrote (no GPU columns), on a read-only file, lists
    and shows its runs with the columns added since at their defaults."""
    import json


    old = tmp_path / "old.sqlite"
    index_of_schema(old, 3, monkeypatch)
    conn = sqlite3.connect(old)
    conn.execute("ATTACH DATABASE ? AS cur", (str(demo_index),))
    copy_into_older(conn)
    conn.commit()
    conn.close()
    assert "gpus" not in {r[1] for r in sqlite3.connect(old).execute("PRAGMA table_info(runs)")}
    old.chmod(0o444)
    capsys.readouterr()
    assert main(["runs", "--index", str(old), "-o", "json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert len(runs) >= 12 and all(r["gpus"] == 0 and r["lost_gpu_hours_by"] == {} for r in runs)
    assert main(["show", "--index", str(old), RUN, "-o", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["run"]["run_id"] == RUN and shown["run"]["gpus"] == 0 and shown["attempts"]
