"""Start-up time of the reader commands, as a person at a terminal sees it.

    uv run python bench/cli_start.py [--runs 10000] [--repeat 10] [--src DIR] [--index PATH]

Builds (once, then reused) an experiment index of ``--runs`` generated runs (sim.lifecycles, about
20 changes per run, folded by the reducer and written as the sinks write them), then times, as separate
processes, ``tracker --help``, ``tracker runs``, ``tracker show RUN`` (the timeline and ``-o json``) and ``tracker
compare RUN RUN`` (the table and ``-o json``) on it: the median and the best of ``--repeat`` runs after two warm-up
runs, and the median CPU time (which depends less on the machine's load). The load average is printed before and
after.
The byte-code cache is warm: the processes run without PYTHONDONTWRITEBYTECODE, so the warm-up writes the
``.pyc`` files of everything the command imports.

``--src DIR`` times the ``tracker`` package of another source tree with this environment's interpreter (e.g. an
older commit: ``git archive COMMIT tracker | tar -x -C /tmp/base``), for before/after figures.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLUSH_EVERY = 50_000


def build_index(path: Path, n_runs: int, seed: int) -> None:
    from sim.lifecycles import generate_stream
    from tracker.core.reducer import Reducer
    from tracker.shell.index import ExperimentIndex

    tmp = path.with_name(path.name + ".part")
    tmp.unlink(missing_ok=True)
    reducer = Reducer()
    t0 = time.perf_counter()
    with ExperimentIndex(tmp) as index:
        for n, record in enumerate(generate_stream(n_runs, seed), 1):
            reducer.apply(record, "bench")
            if n % FLUSH_EVERY == 0:
                index.write(reducer.flush().updates)
        index.write(reducer.flush().updates)
    for suffix in ("-wal", "-shm"):
        Path(f"{tmp}{suffix}").unlink(missing_ok=True)
    tmp.rename(path)
    print(f"built {path} ({n_runs:,} runs) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


def some_runs(path: Path) -> tuple[str, str]:
    """Two runs of the index (the 501st and the 502nd by id): ``show`` reads the first, ``compare`` both."""
    import sqlite3

    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT run_id FROM runs ORDER BY run_id LIMIT 2 OFFSET 500").fetchall()
        count = conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    finally:
        conn.close()
    print(f"index: {count:,} runs; show: {rows[0][0]}; compare: {rows[0][0]} {rows[1][0]}", file=sys.stderr)
    return str(rows[0][0]), str(rows[1][0])


def time_command(argv: list[str], env: dict[str, str], cwd: Path, repeat: int) -> tuple[float, float, float]:
    """Median and best wall time, and median CPU time (user + system) of the process: the wall time depends on
    what else the machine runs, the CPU time much less."""
    for _ in range(2):  # warm-up: the byte-code cache, the page cache
        subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    times, cpu = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(times), min(times), statistics.median(cpu)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--index", type=Path, help="index to use (default: out/bench-RUNS.sqlite, built if missing)")
    ap.add_argument("--src", type=Path, help="source tree whose tracker package to time (default: this one)")
    args = ap.parse_args(argv)

    index = args.index or REPO / "out" / f"bench-{args.runs}.sqlite"
    if not index.exists():
        index.parent.mkdir(parents=True, exist_ok=True)
        build_index(index, args.runs, args.seed)
    run, other = some_runs(index)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "TRACKER_INDEX")}
    env["COLUMNS"] = "120"
    src = (args.src or REPO).resolve()
    env["PYTHONPATH"] = str(src)
    base = [sys.executable, "-m", "tracker.cli"]
    commands = {
        "tracker --help": [*base, "--help"],
        "tracker runs": [*base, "runs", "--index", str(index)],
        f"tracker show {run}": [*base, "show", run, "--index", str(index)],
        f"tracker show {run} -o json": [*base, "show", run, "--index", str(index), "-o", "json"],
        f"tracker compare {run} {other}": [*base, "compare", run, other, "--index", str(index)],
        f"tracker compare {run} {other} -o json": [*base, "compare", run, other, "--index", str(index), "-o", "json"],
    }
    load = os.getloadavg()[0]
    print(f"source: {src}; python {sys.version.split()[0]}; {os.cpu_count()} cores, load {load:.2f}; "
          f"wall time median (best) of {args.repeat}, CPU time median; warm byte-code cache")
    for label, cmd in commands.items():
        median, best, cpu = time_command(cmd, env, src, args.repeat)  # -m puts the cwd first
        print(f"{label:<60} {median * 1000:7.0f} ms  ({best * 1000:.0f} ms)  cpu {cpu * 1000:.0f} ms")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
