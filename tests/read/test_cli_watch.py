"""``tracker runs -w`` and ``tracker show -w`` (issue 28, point 2): live readers in kubectl's manner. A watch started
on an index that a replay then extends prints the header once and a line for each run that is new or changed (not
the runs that did not change), ``-o json`` one object per line for jq, ``show -w`` the run again when it changes;
SIGTERM or SIGINT ends a watch at once with exit 0 and no traceback."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from tracker.cli import main
from tracker.cli.args import DEMO_CAPTURES
from tracker.runtime.replay import replay

FIRST = ["intake.jsonl", "jobs.json", "workloads.json"]  # the runs exist; no pod has run yet
THEN = ["pods.jsonl", "events.jsonl", "rayjobs.json", "rayclusters.json"]


class Watch:
    """A ``tracker`` watch as a subprocess, its stdout read line by line on a thread."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRACKER_")} | {"COLUMNS": "160"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tracker.cli", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def take(self, n: int, timeout: float = 60) -> list[str]:
        return [self.lines.get(timeout=timeout) for _ in range(n)]

    def quiet_for(self, seconds: float) -> list[str]:
        time.sleep(seconds)
        out = []
        while not self.lines.empty():
            out.append(self.lines.get_nowait())
        return out

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, float, str]:
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=5)
        assert self.proc.stderr is not None
        return code, time.monotonic() - t0, self.proc.stderr.read()


def names(index: Path) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "tracker.cli", "runs", "--index", str(index), "-o", "name"],
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_runs_w_prints_the_table_then_only_what_changed(tmp_path: Path, sig: int) -> None:
    index = tmp_path / "index.sqlite"
    replay(captures=[DEMO_CAPTURES / f for f in FIRST], index_path=index, console=Console(quiet=True), quiet=True)
    before = names(index)
    watch = Watch(["runs", "-w", "--watch-interval", "0.2", "--index", str(index)], tmp_path)
    try:
        header, *rows = watch.take(1 + len(before))
        assert header.split()[:3] == ["NAMESPACE", "RUN", "STATUS"]
        assert all(run.startswith(r.split()[1]) for r, run in zip(rows, before, strict=True))  # short ids
        assert watch.quiet_for(1.0) == []  # nothing changed: nothing printed (ages going up are not changes)
        replay(captures=[DEMO_CAPTURES / f for f in THEN], index_path=index, console=Console(quiet=True), quiet=True)
        time.sleep(1.0)
        changed = watch.quiet_for(0.5)
        assert changed, "the runs the second replay changed should be printed again"
        every = names(index)
        assert all(any(run.startswith(line.split()[1]) for run in every) for line in changed)
        assert not any(line.startswith("NAMESPACE") for line in changed)
        assert any("Succeeded" in line for line in changed) and len(changed) < 3 * len(names(index))
    finally:
        code, took, err = watch.stop(sig)
    assert code == 0 and took < 5
    assert err.splitlines() == [f"note: {index} is a recording (written by tracker replay): read as of "
                                "2026-08-20T12:51:31Z, the latest time it holds (--now TIME to read it at another)"]


def test_runs_w_o_json_is_one_object_a_line_and_show_w_prints_again_on_change(tmp_path: Path) -> None:
    index = tmp_path / "index.sqlite"
    replay(captures=[DEMO_CAPTURES / f for f in FIRST], index_path=index, console=Console(quiet=True), quiet=True)
    runs = Watch(["runs", "-w", "-o", "json", "--watch-interval", "0.2", "--index", str(index)], tmp_path)
    show = Watch(["show", "vit-l-9hx4d", "-w", "-o", "json", "--watch-interval", "0.2", "--index", str(index)],
                 tmp_path)
    try:
        first = [json.loads(line) for line in runs.take(len(names(index)))]
        assert {r["run_id"] for r in first} == set(names(index))
        before = json.loads(show.take(1)[0])
        assert before["pods"] == []  # no pod seen yet
        replay(captures=[DEMO_CAPTURES / f for f in THEN], index_path=index, console=Console(quiet=True), quiet=True)
        deadline = time.monotonic() + 30
        while len((after := json.loads(show.take(1)[0]))["pods"]) < 4:  # the second replay's pods
            assert time.monotonic() < deadline
        assert after["run"]["run_id"] == "vit-l-9hx4d" and len(after["transitions"]) > len(before["transitions"])
        more = [json.loads(line) for line in runs.quiet_for(1.0)]
        assert "vit-l-9hx4d" in {r["run_id"] for r in more}
    finally:
        for w in (runs, show):
            code, took, err = w.stop()
            assert code == 0 and took < 5 and "Traceback" not in err
            assert all(line.startswith(f"note: {index} is a recording") for line in err.splitlines())


def test_watch_refuses_formats_it_cannot_print_line_by_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    index = tmp_path / "index.sqlite"
    replay(captures=[DEMO_CAPTURES / "jobs.json"], index_path=index, console=Console(quiet=True), quiet=True)
    assert main(["runs", "-w", "-o", "yaml", "--index", str(index)]) == 2
    assert "-w/--watch prints table, wide, name, json (not -o yaml)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["runs", "-w", "--watch-interval", "0.01", "--index", str(index)])
    assert exit_.value.code == 2
    assert "must be between 0.2 and 3600 seconds" in capsys.readouterr().err
