"""A recording is read as of the latest time it holds (issue 28, point 5): an index written only by `tracker replay`
or `tracker demo` says so in its meta, and the readers then default `now` to that time (the demo's: its captures'
end), say so on stderr, and `--now` still wins; once a live writer (a sink, `serve`) writes to it, it is read at
the wall clock again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rich.console import Console

from tracker.cli.args import DEMO_CAPTURES
from tracker.runtime.replay import replay
from tracker.shell.index import ExperimentIndex


def tracker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracker.cli", *args], capture_output=True, text=True, check=False,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_the_demo_is_read_as_of_its_captures_end(tmp_path: Path) -> None:
    index = tmp_path / "demo.sqlite"
    assert tracker("demo", "--index", str(index)).returncode == 0
    stuck = tracker("runs", "--stuck", "30m", "--index", str(index))
    assert stuck.returncode == 0 and "qwen-rm-5vt2j" in stuck.stdout, stuck
    assert stuck.stderr == (f"note: {index} is a recording (written by tracker replay): read as of "
                            "2026-08-20T13:00:00Z, the latest time it holds (--now TIME to read it at another)\n")
    assert "104d" not in tracker("runs", "--index", str(index)).stdout
    at = tracker("runs", "--stuck", "30m", "--index", str(index), "--now", "2026-08-20T12:30:00Z")
    assert "recording" not in at.stderr and "qwen-rm-5vt2j" not in at.stdout  # --now wins: 6 minutes at 12:30


def test_a_replay_is_read_as_of_its_latest_time_until_a_live_writer_writes(tmp_path: Path) -> None:
    index = tmp_path / "r.sqlite"
    replay(captures=[DEMO_CAPTURES], index_path=index, console=Console(quiet=True), quiet=True)
    said = tracker("runs", "--index", str(index))
    assert "read as of 2026-08-20T12:51:31Z" in said.stderr
    with ExperimentIndex(index) as writer:
        writer.set_clock(recorded=False)  # what a sink and serve do when they open it
    live = tracker("runs", "--index", str(index))
    assert live.returncode == 0 and live.stderr == "" and "d " in live.stdout  # ages in days: the wall clock
