"""`tracker replay` stopped by SIGINT, SIGTERM or SIGHUP stops at a record boundary, commits what it folded, says
where it stopped in one line and exits 128 + the signal; the same replay run again finishes the index."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from sim.lifecycles import generate_stream
from tests.service.test_replay_incremental import contents
from tracker.cli import main
from tracker.cli.args import DEMO_CAPTURES
from tracker.runtime.replay import replay
from tracker.shell import jsonio

# about 10,000 records; the signalled replay reads the first third of them from a FIFO whose writer stays open, so it is
# still running, waiting for more, when the signal comes (a replay of a file could end before it: it once did)
RUNS = 400


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("capture") / "cluster.jsonl"
    path.write_bytes(b"".join(jsonio.dumps(r) + b"\n" for r in generate_stream(RUNS, 5)))
    return path


@pytest.fixture(scope="module")
def whole(capture: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[object, ...]]]:
    path = tmp_path_factory.mktemp("whole") / "index.sqlite"
    replay(captures=[capture], index_path=path, console=Console(quiet=True), quiet=True)
    return contents(path)


def committed_runs(index: Path) -> int:
    try:
        conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    except sqlite3.Error:
        return 0
    try:
        return int(conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
    except sqlite3.Error:
        return 0
    finally:
        conn.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signalled_replay_commits_says_where_and_a_second_one_finishes(
        capture: Path, whole: dict[str, list[tuple[object, ...]]], tmp_path: Path, sig: signal.Signals,
        capsys: pytest.CaptureFixture[str]) -> None:
    index = tmp_path / "index.sqlite"
    fifo = tmp_path / "cluster.jsonl"
    os.mkfifo(fifo)
    lines = capture.read_bytes().splitlines(keepends=True)
    part = b"".join(lines[:len(lines) // 3])
    code = "import sys; from tracker.cli import main; sys.exit(main(sys.argv[1:]))"
    # a flush (and a commit) every 500 records: the first commit, which the signal waits for, comes early (a capture
    # file's replay flushes every `replay_flush_every` records only, 20,000 by default: more than this capture)
    proc = subprocess.Popen([sys.executable, "-c", code, "replay", str(fifo), "--index", str(index)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TRACKER_EMBEDDED__REPLAY_FLUSH_EVERY": "500"})
    written = threading.Event()
    done = threading.Event()

    def write() -> None:  # a thread: opening a FIFO waits for its reader, and writing to it for the reads
        with contextlib.suppress(OSError), fifo.open("wb") as w:
            w.write(part)
            w.flush()
            written.set()
            done.wait(120)  # the writer stays open: the replay waits for more until it is signalled

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        assert written.wait(120), "the replay did not read the first part of the capture"
        deadline = time.monotonic() + 120
        while committed_runs(index) == 0 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate(timeout=10)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=120)
    finally:
        done.set()
        writer.join(10)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    said = err.strip().splitlines()
    assert len(said) == 1, err
    assert f"replay stopped by {sig.name} after" in said[0] and f"(the last from {fifo}:" in said[0], err
    assert "Traceback" not in err
    partial = contents(index)
    assert 0 < len(partial["runs"]) < len(whole["runs"]) or partial != whole
    conn = sqlite3.connect(index)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()
    assert main(["replay", str(capture), "--index", str(index)]) == 0
    assert contents(index) == whole


def test_replay_from_another_thread_runs_without_signal_handlers(tmp_path: Path) -> None:
    """Signal handlers belong to the main thread: a replay run in a worker thread (a library user, serve's tests)
    still works, and is stopped by its caller."""
    import threading

    reports = []
    worker = threading.Thread(target=lambda: reports.append(replay(captures=[DEMO_CAPTURES],
                                                                     index_path=tmp_path / "i.sqlite",
                                                                     console=Console(quiet=True), quiet=True)))
    worker.start()
    worker.join(120)
    assert len(reports) == 1 and reports[0].runs_written > 0 and not reports[0].stopped


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_from_a_quiet_pipe_answers_probes_and_stops_on_sigterm(tmp_path: Path) -> None:
    """``kubectl get ... -w | tracker serve --from-capture -``: the pipe stays open and quiet between changes. The
    process keeps answering /healthz meanwhile, writes what it was given, and a SIGTERM stops it at once (it used to
    sit in a read of standard input on the event loop: no probe answered, the signal was not handled)."""
    import urllib.request

    index = tmp_path / "index.sqlite"
    port = _free_port()
    code = "import sys; from tracker.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--from-capture", "-", "--index", str(index),
                             "--metrics-port", str(port)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"".join(jsonio.dumps(r) + b"\n" for r in generate_stream(5, 3)))
        proc.stdin.flush()  # and the pipe stays open, with nothing more in it
        deadline = time.monotonic() + 120
        while committed_runs(index) < 5 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert committed_runs(index) == 5, proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as answer:
            assert answer.status == 200
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert proc.returncode == 0 and time.monotonic() - started < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
