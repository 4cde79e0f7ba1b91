"""Every command of the README, pasted as written (issue 28, point 5).

Each ``bash`` block of README.md is either run here, line by line in one bash session, in a fresh directory that
holds the repository's ``tracker/`` (its bundled captures) and a ``./run`` and ``.venv/bin/tracker`` that run this
tree's tracker, or it is listed in ``NOT_RUN`` with the reason (a cluster, Kafka, ADX, a server, or this test's
own command). A block added to the README must be put in one of the two, or this test fails; a line that exits
non-zero, prints a traceback, or prints nothing where it should print runs fails it. A ``-w`` line runs until
SIGTERM ends it after ``WATCH_S`` (exit 0 is its documented end).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
WATCH_S = 3.0
# the blocks not run here, by their first line, with the reason
NOT_RUN = {
    "./run demo    # replay the bundled captures of one cluster into a fresh experiment index, show runs and "
    "timelines": "the README's two commands: `./run test` is the command that runs this test; `./run demo` is "
                 "tests/service/test_demo_command.py",
    "tracker ui --index runs.sqlite          # http://127.0.0.1:8321/ — or $TRACKER_INDEX; --port, --host, "
    "--stuck-after": "a server: tests/ui/ run it",
    "tracker serve --watch --index /var/lib/tracker/index.sqlite   # watcher, reducer, index; embedded bus (no "
    "Kafka)": "needs a cluster (tests/service, tests/watch against the kube-apiserver)",
    "export TRACKER_KAFKA__BOOTSTRAP_SERVERS=kafka-0:9092,kafka-1:9092": "needs a Kafka cluster (tests/kafka)",
    "export TRACKER_ADX__CLUSTER_URI=https://<cluster>.<region>.kusto.windows.net TRACKER_ADX__DATABASE=Metrics":
        "needs Azure Data Explorer (tests/deploy/test_kusto.py with the stand-in)",
}


def bash_blocks() -> list[list[str]]:
    blocks, block, inside = [], [], False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            if inside:
                blocks.append(block)
            inside, block = line.strip() == "```bash", []
        elif inside:
            block.append(line)
    return blocks


def test_every_bash_block_is_run_or_says_why_not() -> None:
    firsts = [b[0] for b in bash_blocks()]
    assert set(NOT_RUN) <= set(firsts), sorted(set(NOT_RUN) - set(firsts))
    run = [f for f in firsts if f not in NOT_RUN]
    assert run == ["./run tracker replay tracker/captures/demo --index runs.sqlite    # fold captures (files, dirs, "
                   "- for stdin)"], run


def _shim(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "tracker").symlink_to(REPO / "tracker")  # the bundled captures, as in a checkout
    python = sys.executable
    _shim(tmp_path / "run", f'[ "$1" = tracker ] || exit 9\nshift\nPYTHONPATH={REPO} exec {python} -m tracker.cli "$@"')
    _shim(tmp_path / ".venv" / "bin" / "tracker", f'PYTHONPATH={REPO} exec {python} -m tracker.cli "$@"')
    return tmp_path


def _command(line: str) -> str:
    """The command of a README line, without its trailing comment (a '#' after two spaces or more)."""
    return re.split(r"\s{2,}#", line, maxsplit=1)[0].strip()


def test_the_readers_block_runs_verbatim(workdir: Path) -> None:
    block = next(b for b in bash_blocks() if b[0] not in NOT_RUN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACKER_")} | {"COLUMNS": "100"}
    env["PATH"] = f"/usr/bin:/bin:{env.get('PATH', '')}"
    state = workdir / ".env"  # the exports of earlier lines, for the later ones
    state.write_text("")
    for line in block:
        command = _command(line)
        if not command:
            continue
        watch = " -w" in f" {command} "
        script = (f"set -euo pipefail\ncd {workdir}\nsource {state}\n"
                  + (f"timeout -s TERM {WATCH_S} {command} || [ $? -eq 124 ]\n" if watch else f"{command}\n")
                  + f"export -p | grep -E ' (TRACKER_INDEX|PATH)=' > {state}\n")
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120,
                              check=False, cwd=workdir)
        said = f"{line}\n--- stdout\n{done.stdout[-2000:]}\n--- stderr\n{done.stderr[-2000:]}"
        assert done.returncode == 0, said
        assert "Traceback" not in done.stderr and "error" not in done.stderr.lower(), said
        if command.startswith("tracker runs") or command.startswith("tracker show") or \
                command.startswith("tracker compare") or command.startswith("tracker audit --since"):
            assert done.stdout.strip(), f"printed nothing: {said}"
        reads_time = not command.startswith(("tracker completion", "tracker show qwen-rm-5vt2j -o json"))
        if command.startswith("tracker") and reads_time:  # (a history document does not depend on the time)
            assert "is a recording (written by tracker replay): read as of 2026-08-20T12:51:31Z" in done.stderr, \
                said
    assert (workdir / "audit.csv").read_text().startswith("project,")
