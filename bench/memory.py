"""Memory of the embedded pipeline's reducer over a long stream: flat once finished runs are retired.

    uv run python bench/memory.py [--runs 1000000] [--every 100000] [--grace-s 3600] [--max-retired 100000]
                                  [--mix ending|realistic] [--baseline-runs 100000] [--seed 7]

The stream is generated (sim.lifecycles.generate_stream: realistic watch and intake records of runs
submitted 3 s apart, about 20 records per run, in time order, as a live watch delivers them). It is folded by a
``Reducer`` with the limits `tracker serve` gives its embedded pipeline (retirement on: ``retire_after_s``, and
``max_retired`` retirements remembered), flushing every 5,000 records as the pipeline does. Every ``--every``
runs it prints the runs in memory, the retirements remembered, the process's RSS and the Python heap in allocated
blocks (``sys.getallocatedblocks``; ``tracemalloc`` is not used: it would slow the fold tenfold; ``gc.collect``
runs before each reading). Each phase runs in a process of its own, so one's freed memory does not hide the other's
growth.

``--pool N`` (default 10,000) generates N runs once and then sends them again and again, each round a day later
and with its own run ids, names and uids (a bytes rewrite of the encoded records, far cheaper than generating),
until ``--runs`` runs were sent: the reducer sees 1,000,000 distinct runs in time order in minutes instead of
hours. ``--pool 0`` generates every run.

Baseline, in a process of its own first: the same stream without retirement for ``--baseline-runs`` runs (the memory
per run that grows without bound). ``--mix ending`` (the default) makes every run end for good: the generator's
"running" runs (which never end) succeed and its "deactivated" ones are deleted, as they are in a cluster whose
finished Jobs are cleaned up. ``--mix realistic`` keeps them: those runs are live (a deactivated Job that still
exists may be reactivated) and are rightly kept, so memory grows by their share.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from sim.lifecycles import RunParams, generate_stream, random_params
from tracker.core.limits import ReducerLimits
from tracker.core.reducer import Reducer
from tracker.runtime.gctune import tune_gc
from tracker.shell import jsonio

FLUSH_EVERY = 5_000  # the embedded pipeline's default flush_every
RECORDS_PER_RUN_HINT = 20


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def ending(rng: random.Random) -> RunParams:
    p = random_params(rng)
    if p.outcome == "running":
        return dataclasses.replace(p, outcome="succeeded")
    if p.outcome == "deactivated":
        return dataclasses.replace(p, outcome="deleted")
    return p


UUID = re.compile(rb'"[0-9a-f]{8}-')


def stream(runs: int, seed: int, mix: str, pool: int) -> Iterator[dict[str, Any]]:
    """``runs`` runs in time order: generated, or a pool of them sent again a day later with new identities."""
    params = ending if mix == "ending" else random_params
    if not pool or pool >= runs:
        yield from generate_stream(runs, seed, params)
        return
    encoded = [jsonio.dumps(rec) for rec in generate_stream(pool, seed, params)]
    day = b"2026-08-20T"
    assert all(b"2026-08-21T" not in e for e in encoded[-100:]), "the pool must fit in one day"
    sent = 0
    for k in range(-(-runs // pool)):
        date = (datetime(2026, 8, 20, tzinfo=UTC) + timedelta(days=k)).strftime("%Y-%m-%dT").encode()
        mark = f'"{k:08x}-'.encode()
        for blob in encoded:
            if k:
                blob = UUID.sub(mark, blob.replace(day, date).replace(b"-000", f"-{k:04d}".encode()))
            rec = jsonio.loads(blob)
            if "object" in rec and rec["object"].get("kind") in ("Job", "RayJob") and rec["type"] == "ADDED":
                sent += 1
                if sent > runs:
                    return
            yield rec


def fold(label: str, runs: int, every: int, limits: ReducerLimits, mix: str, seed: int,
         pool: int) -> list[tuple[int, float]]:
    red = Reducer(limits)
    started = time.perf_counter()
    submitted = 0
    readings: list[tuple[int, float]] = []
    print(f"\n{label}: {runs:,} runs (pool {pool:,}), mix={mix}, retire_after_us={limits.retire_after_us}, "
          f"max_retired={limits.max_retired:,}")
    print(f"{'runs':>10} {'records':>12} {'in memory':>10} {'retired':>10} {'RSS MiB':>9} {'blocks':>11} "
          f"{'rec/s':>7}")
    n = 0
    for n, rec in enumerate(stream(runs, seed, mix, pool), start=1):
        red.apply(rec)
        if n % FLUSH_EVERY == 0:
            red.flush()
        if "object" in rec and rec["object"]["kind"] in ("Job", "RayJob") and rec["type"] == "ADDED":
            submitted += 1
            if submitted % every == 0:
                red.flush()
                gc.collect()
                mib = rss_mib()
                readings.append((submitted, mib))
                print(f"{submitted:>10,} {n:>12,} {len(red.runs):>10,} {len(red.retired):>10,} {mib:>9.1f} "
                      f"{sys.getallocatedblocks():>11,} {n / (time.perf_counter() - started):>7,.0f}", flush=True)
    red.flush()
    print(f"done: {n:,} records in {time.perf_counter() - started:.0f} s; {red.stats.retired:,} runs retired, "
          f"{red.stats.after_retirement:,} records after retirement ignored")
    return readings


def summary(label: str, readings: list[tuple[int, float]], half: bool) -> None:
    """Memory growth per run over the readings (their second half: after the grace and ``max_retired`` filled)."""
    if half:
        readings = readings[len(readings) // 2 - 1:]
    if len(readings) >= 2:
        (r0, m0), (r1, m1) = readings[0], readings[-1]
        print(f"{label} ({r0:,} -> {r1:,} runs): {(m1 - m0) * 1024 / (r1 - r0):.3f} KiB RSS per run; "
              f"peak RSS {max(m for _r, m in readings):.1f} MiB", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--every", type=int, default=100_000, help="print a reading every this many runs")
    ap.add_argument("--grace-s", type=float, default=3_600.0, help="retire_after_s (the service's default: 1 h)")
    ap.add_argument("--max-retired", type=int, default=100_000, help="retirements remembered (embedded default)")
    ap.add_argument("--mix", choices=("ending", "realistic"), default="ending")
    ap.add_argument("--baseline-runs", type=int, default=100_000, help="runs folded without retirement first")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--pool", type=int, default=10_000, help="runs generated once and sent again (0: generate all)")
    ap.add_argument("--phase", choices=("both", "baseline", "retiring"), default="both", help=argparse.SUPPRESS)
    args = ap.parse_args()
    tune_gc()
    if args.phase == "both":  # each phase in a process of its own: one's freed memory would hide the other's growth
        for phase in ("baseline", "retiring") if args.baseline_runs else ("retiring",):
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--phase", phase], check=True)
        return 0
    if args.phase == "baseline":
        base = fold("baseline (no retirement)", args.baseline_runs, max(1, args.baseline_runs // 4),
                    ReducerLimits(), args.mix, args.seed, args.pool)
        summary("baseline growth", base, half=False)
        return 0
    limits = ReducerLimits(retire_after_us=round(args.grace_s * 1_000_000), max_retired=args.max_retired)
    got = fold("retiring (the embedded pipeline's limits)", args.runs, args.every, limits, args.mix, args.seed,
               args.pool)
    summary("retiring, second half", got, half=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
