"""Peak memory of ``tracker replay`` of a capture of N generated runs: peak RSS, wall and CPU, runs/s, index size.

    uv run python bench/replay_memory.py [--runs 100000] [--seed 7] [--cache DIR] [--tracker-root DIR] \
                                         [--retire-after 1h]

The capture: every record of ``--runs`` runs of ``sim.lifecycles.generate_stream`` (the generator's plain objects:
Jobs, RayJobs, Workloads, Pods, RayClusters, Events and intake events of runs submitted 3 s apart, in time order,
about 24 records a run), as JSON lines. It is written once and kept in ``--cache`` (default
``$TMPDIR/tracker-bench-replay-memory``), named by the run count, the seed and a hash of ``sim/``'s sources, so
later runs (and the same benchmark against another commit) replay the very same bytes; writing it is not timed.

Timed: ``tracker replay CAPTURE --index FRESH.sqlite`` as a subprocess, no ``TRACKER_*`` setting (the defaults:
no retirement, so every run stays in the reducer to the end, the case whose memory grows with the capture). Its
peak RSS is ``VmHWM`` of that process sampled while it runs (every 50 ms at most: ``ru_maxrss`` of a child can
be its parent's at the fork), its CPU time from ``wait4``. Baselines in the same run, each a subprocess of its
own: a no-op ``tracker replay`` of an empty capture into a fresh index (start-up: everything the replay imports),
and reading and decoding the capture line by line with orjson (what the bytes alone cost to read).

``--retire-after DURATION`` adds a second timed replay of the same capture into another fresh index with
``tracker replay --retire-after DURATION`` (a finished run's facts freed once event time is that far past it: what
memory a replay needs when it retires, as ``serve`` does) and checks that both indexes hold the same runs.

``--tracker-root DIR`` measures the tracker of another checkout (``git worktree add /tmp/mem-<hash> <hash>``) with
this environment's interpreter and dependencies: ``python -m tracker.cli`` with ``PYTHONPATH=DIR``. A benchmark,
not a test: it prints figures and fails only when a replay fails or writes a dead letter.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/replay_memory.py
    sys.path.insert(0, str(REPO))

import orjson  # noqa: E402

from bench._common import Finished, load_average, run_timed, tracker_command, without_tracker_settings  # noqa: E402
from sim.lifecycles import generate_stream  # noqa: E402

DECODE = "import sys, orjson\nn = 0\nwith open(sys.argv[1], 'rb') as fh:\n    for line in fh:\n" \
         "        orjson.loads(line)\n        n += 1\nprint(n)\n"


def sim_hash() -> str:
    """A hash of the generator's sources: a cached capture is reused only while they are unchanged."""
    h = hashlib.sha256()
    for path in sorted((REPO / "sim").glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def capture(cache: Path, runs: int, seed: int) -> tuple[Path, int]:
    """The capture of ``runs`` runs (written once, then reused) and its record count."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"runs-{runs}-seed-{seed}-sim-{sim_hash()}.jsonl"
    count = path.with_suffix(".count")
    if path.exists() and count.exists():
        return path, int(count.read_text())
    started = time.perf_counter()
    part = path.with_suffix(".part")
    records = 0
    with part.open("wb") as fh:
        for rec in generate_stream(runs, seed):
            fh.write(orjson.dumps(rec) + b"\n")
            records += 1
    part.rename(path)
    count.write_text(str(records))
    print(f"capture written in {time.perf_counter() - started:.0f} s (not timed): {path}", flush=True)
    return path, records


def index_bytes(index: Path) -> int:
    return sum(p.stat().st_size for p in index.parent.glob(index.name + "*") if p.is_file())


def index_runs(index: Path) -> int:
    with sqlite3.connect(f"file:{index}?mode=ro", uri=True) as db:
        return int(db.execute("SELECT count(*) FROM runs").fetchone()[0])


def dead_letters(index: Path) -> int:
    path = index.with_name(index.stem + ".dead-letters.jsonl")
    return sum(1 for _ in path.open("rb")) if path.exists() else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100_000, help="runs in the capture")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "tracker-bench-replay-memory",
                    help="where captures are kept between runs")
    ap.add_argument("--tracker-root", type=Path, default=None, metavar="DIR",
                    help="measure the tracker package of this checkout (default: this one's)")
    ap.add_argument("--retire-after", default=None, metavar="DURATION",
                    help="also time a replay with --retire-after DURATION (e.g. 1h)")
    ap.add_argument("--timeout", type=float, default=3_600.0, help="seconds allowed to each subprocess")
    args = ap.parse_args(argv)

    env = without_tracker_settings(dict(os.environ))
    command = tracker_command()
    if args.tracker_root is not None:
        env["PYTHONPATH"] = str(args.tracker_root.resolve())
        command = [sys.executable, "-m", "tracker.cli"]
    cwd = args.tracker_root.resolve() if args.tracker_root is not None else REPO
    path, records = capture(args.cache, args.runs, args.seed)

    tmp = Path(tempfile.mkdtemp(prefix="tracker-bench-replay-memory-"))
    try:
        load_before = load_average()
        (tmp / "empty.jsonl").write_bytes(b"")

        def replay(what: Path, index: Path, *extra: str) -> Finished:
            return run_timed([*command, "replay", str(what), "--index", str(index), *extra], env=env, cwd=cwd,
                             timeout_s=args.timeout).check(f"tracker replay {what}")

        noop = replay(tmp / "empty.jsonl", tmp / "noop.sqlite")
        decode = run_timed([sys.executable, "-c", DECODE, str(path)], timeout_s=args.timeout).check("orjson decode")
        done = replay(path, tmp / "replay.sqlite")
        runs, size, letters = index_runs(tmp / "replay.sqlite"), index_bytes(tmp / "replay.sqlite"), \
            dead_letters(tmp / "replay.sqlite")
        retiring = None
        if args.retire_after is not None:
            retiring = replay(path, tmp / "retiring.sqlite", "--retire-after", args.retire_after)
            retiring_runs = index_runs(tmp / "retiring.sqlite")
            letters += dead_letters(tmp / "retiring.sqlite")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    root = args.tracker_root or REPO
    print(f"\ntracker replay of {args.runs:,} generated runs ({records:,} records, {path.stat().st_size / 1e6:,.0f} "
          f"MB, seed {args.seed}); tracker of {root}; python {sys.version.split()[0]}; {load_before} before, "
          f"{load_average()} after")
    print(f"  {'what':<40} {'peak RSS':>10} {'wall s':>8} {'CPU s':>8} {'runs/s':>8}")
    rows = [("no-op replay (empty capture)", noop, 0), ("orjson decode of the capture", decode, args.runs),
            ("tracker replay", done, args.runs)]
    if retiring is not None:
        rows.append((f"tracker replay --retire-after {args.retire_after}", retiring, args.runs))
    for label, f, n in rows:
        rate = f"{n / f.wall_s:>8,.0f}" if n else f"{'':>8}"
        print(f"  {label:<40} {f.maxrss_kib / 1024:>6,.0f} MiB {f.wall_s:>8.1f} {f.cpu_s:>8.1f} {rate}")
    net = (done.maxrss_kib - noop.maxrss_kib) / max(args.runs, 1)
    print(f"  replay net of the no-op: {net:.2f} KiB per run; index {size / 1e6:,.0f} MB ({size / max(runs, 1):,.0f} "
          f"B per run), {runs:,} runs in it; dead letters {letters}")
    if retiring is not None:
        print(f"  retiring replay net of the no-op: {(retiring.maxrss_kib - noop.maxrss_kib) / max(args.runs, 1):.2f} "
              f"KiB per run; {retiring_runs:,} runs in its index")
        if retiring_runs != runs:
            return 1
    return 0 if runs == args.runs and not letters else 1


if __name__ == "__main__":
    sys.exit(main())
