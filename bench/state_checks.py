"""What checking the stored reducer state costs a replay's start (issue 27).

    uv run python bench/state_checks.py [--runs 2000] [--seed 7] [--repeat 5]

Replays a generated cluster of ``--runs`` runs (sim.lifecycles) into a fresh index, then times, in this process,
``tracker.shell.reducer_state.restore`` (what every later replay does first: read, inflate, check, load) and, on
the same decoded states, the checks alone (``core.snapshot_shape.check_run_snapshot``), with as baseline the
decoding of the same blobs (inflate + JSON). Medians of ``--repeat``; CPU time (``process_time``) beside wall time,
and the load average before and after (the machine is shared).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from sim.lifecycles import generate_stream
from tracker.core.snapshot_shape import check_run_snapshot
from tracker.runtime.replay import replay
from tracker.shell import jsonio, reducer_state
from tracker.shell.index import ExperimentIndex
from tracker.shell.state_codec import decode, run_state_cap


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    print(f"load average before: {load()}")
    work = Path(tempfile.mkdtemp(prefix="state-checks-"))
    capture = work / "cluster.jsonl"
    capture.write_bytes(b"".join(jsonio.dumps(r) + b"\n" for r in generate_stream(a.runs, a.seed)))
    index = work / "index.sqlite"
    replay(captures=[capture], index_path=index, console=Console(quiet=True), quiet=True)
    with sqlite3.connect(index) as conn:
        blobs = [b for (b,) in conn.execute("SELECT state FROM reducer_runs")]
    cap = run_state_cap(512)
    states = [decode(b, cap) for b in blobs]

    def restore() -> None:
        with ExperimentIndex(index) as ix:
            reducer_state.restore(ix)

    rows = [("restore (read, inflate, check, load)", timed(restore, a.repeat)),
            ("decode only (inflate + JSON, baseline)", timed(lambda: [decode(b, cap) for b in blobs], a.repeat)),
            ("checks only (check_run_snapshot)", timed(lambda: [check_run_snapshot(s) for s in states], a.repeat))]
    print(f"{len(blobs)} stored run states, {sum(map(len, blobs)) / len(blobs):.0f} bytes each compressed")
    for name, (wall, cpu) in rows:
        print(f"{name:42} {wall * 1e3:8.0f} ms wall {cpu * 1e3:8.0f} ms CPU  "
              f"({cpu * 1e6 / len(blobs):.0f} µs CPU a run)")
    print(f"load average after: {load()}")


if __name__ == "__main__":
    main()
