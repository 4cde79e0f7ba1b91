"""One writer per index: concurrent writers take turns (``<index>.writer.lock``, ``tracker.shell.index_lock``), a
second writer that may not wait refuses in one line, readers never wait, and the kernel frees the lock of a writer
that dies. Issue 27: two `tracker replay` into one index at once both exited 0 and the index missed hundreds of
rows (each restored the same reducer state, folded its piece and wrote over the other's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.service.test_replay_incremental import contents, replay_quietly
from tracker.cli.args import DEMO_CAPTURES
from tracker.read.render import history_json
from tracker.read.store import IndexReader
from tracker.shell.index import ExperimentIndex
from tracker.shell.index_lock import WRITER_BUSY_EXIT, WriterBusy, lock_path

# waits for the file named by its first argument (so that every process starts its replay at the same moment),
# then runs the command line given after it
GATED = ("import os, sys, time\nfrom tracker.cli import main\n"
         "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
         "sys.exit(main(sys.argv[2:]))")
HOLD = ("import sys, time\nfrom tracker.shell.index import ExperimentIndex\n"
        "with ExperimentIndex(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(600)")


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("TRACKER_")}
    out.update(extra)
    return out


def tracker(*argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "import sys; from tracker.cli import main; sys.exit(main())",
                           *argv], capture_output=True, text=True, timeout=120, env=env(**extra))


def holding(index: Path) -> subprocess.Popen[str]:
    """A process that holds the writer role of ``index`` until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(index)], stdout=subprocess.PIPE, text=True, env=env())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def histories(index: Path) -> dict[str, object]:
    with IndexReader(index) as reader:
        return {r.run_id: history_json(h) for r in reader.records() if (h := reader.history(r.run_id)) is not None}


def test_concurrent_replays_of_pieces_leave_what_one_replay_of_all_leaves(tmp_path: Path) -> None:
    whole = tmp_path / "whole.sqlite"
    replay_quietly([DEMO_CAPTURES], whole)
    files = sorted(p for p in DEMO_CAPTURES.iterdir() if p.suffix in (".json", ".jsonl"))
    pieces = [files[i::3] for i in range(3)]
    for round_ in range(2):  # the processes race: twice, so that code without the lock fails nearly always
        index = tmp_path / f"together-{round_}.sqlite"
        go = tmp_path / f"go-{round_}"
        procs = [subprocess.Popen([sys.executable, "-c", GATED, str(go), "replay", *map(str, piece),
                                   "--index", str(index)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env(TRACKER_INDEX__WRITER_WAIT_S="300"))
                 for piece in pieces]
        time.sleep(1.0)
        go.touch()
        results = [p.communicate(timeout=300) for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], results
        got, want = contents(index), contents(whole)
        assert {t: len(rows) for t, rows in got.items()} == {t: len(rows) for t, rows in want.items()}
        assert got == want
        assert histories(index) == histories(whole)
        for _out, err in results:  # a replay that waited said so, in one line
            assert all(line.startswith("waiting for ") for line in err.splitlines()), err

def test_a_second_writer_that_may_not_wait_refuses_in_one_line(tmp_path: Path) -> None:
    index = tmp_path / "index.sqlite"
    holder = holding(index)
    try:
        done = tracker("replay", str(DEMO_CAPTURES), "--index", str(index), TRACKER_INDEX__WRITER_WAIT_S="0")
        assert done.returncode == WRITER_BUSY_EXIT == WriterBusy.exit_code, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert str(index) in lines[0] and f"pid {holder.pid}" in lines[0], lines[0]
        waited = tracker("replay", str(DEMO_CAPTURES), "--index", str(index), TRACKER_INDEX__WRITER_WAIT_S="0.5")
        assert waited.returncode == WRITER_BUSY_EXIT, waited
        lines = waited.stderr.strip().splitlines()
        assert len(lines) == 2 and lines[0].startswith("waiting for ") and f"pid {holder.pid}" in lines[0], lines
    finally:
        holder.kill()
        holder.wait()
    assert lock_path(index).stat().st_mode & 0o777 == 0o600


def test_a_reader_reads_while_a_writer_holds_the_index(tmp_path: Path) -> None:
    index = tmp_path / "index.sqlite"
    replay_quietly([DEMO_CAPTURES], index)
    holder = holding(index)
    try:
        done = tracker("runs", "--index", str(index), "-o", "json", TRACKER_INDEX__WRITER_WAIT_S="0")
        assert done.returncode == 0, done.stderr
        assert [line for line in done.stderr.splitlines() if "is a recording" not in line] == []
        assert len(done.stdout) > 100
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_is_freed_when_its_writer_dies_even_by_sigkill(tmp_path: Path) -> None:
    index = tmp_path / "index.sqlite"
    holder = holding(index)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    done = tracker("replay", str(DEMO_CAPTURES), "--index", str(index), TRACKER_INDEX__WRITER_WAIT_S="0")
    assert done.returncode == 0, done.stderr
    assert lock_path(index).exists()  # never deleted: a writer opening it races no one


def test_in_one_process_a_second_writer_waits_for_the_first_to_close(tmp_path: Path) -> None:
    index = tmp_path / "index.sqlite"
    said: list[str] = []
    opened, close = threading.Event(), threading.Event()

    def first_writer() -> None:  # SQLite connections stay on their thread
        with ExperimentIndex(index):
            opened.set()
            close.wait(30)

    first = threading.Thread(target=first_writer)
    first.start()
    try:
        assert opened.wait(30)
        with pytest.raises(WriterBusy, match="one writer per index"):
            ExperimentIndex(index, writer_wait_s=0).open()
        threading.Timer(0.5, close.set).start()
        # the sink's way: no bound; it goes on once the first writer closes
        with ExperimentIndex(index, writer_wait_s=None, on_wait=said.append) as second:
            assert second.meta("schema_version") is not None
    finally:
        close.set()
        first.join()
    assert len(said) == 1 and said[0].startswith(f"waiting for the writer of {index} (pid {os.getpid()}")
