"""One long run reporting progress: what a progress report costs as the run ages, and what its state weighs.

    uv run python bench/long_run.py [--reports 250 1000 10000 12000] [--every-s 10] [--sample 200] [--attempt]

The input is ONE run's progress reports (intake ``Progress`` events, two metrics each, a UUID event id, one every
``--every-s`` seconds, as a training loop reports them), folded by a ``Reducer`` and flushed after each report, as
``tracker reduce`` flushes a running run at every transaction that touches it. At each of the ``--reports`` marks,
over ``--sample`` further reports (each folded, flushed, and the run's run-state snapshot taken, as the Kafka
reducer does per transaction), it prints:

- the CPU time a report costs: folding it (``Reducer.apply``), flushing it (``Reducer.flush``: the derivation and
  its update), the run's state records (``snapshot_run(points_apart=True)`` and their JSON, as
  ``tracker.runtime.run_state`` writes them; a tracker from before that option, run through ``PYTHONPATH``, keeps
  the points inside the record, and one from before snapshot version 4 the report ids, progress minutes and step
  records);
- the bytes of the run's own run-state record, of its largest parts (the seen report ids, the step records, the
  progress minutes), and of all the run-state records the report wrote (the run's, its changed points', its
  minute's ids'), and the metric points kept;
- the reducer's memory for the run (tracemalloc at the mark, the derivation included).

With ``--attempt``, the run is a Job admitted by Kueue and running on one pod (the simulator's objects, folded
first) and its reports come after its pod started: the goodput ledger, which reads the step records of a run with
attempts, is then part of the flush. Without it the run is its reports alone, as in the earlier figures.

The figure to look at is how each cost grows with the reports seen: flat is the goal. Pure: no Kafka, no index.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import time
import tracemalloc
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sim.lifecycles import RunParams, RunPlan, generate_cluster
from tracker.core.reducer import Reducer
from tracker.runtime.gctune import tune_gc
from tracker.shell import jsonio

try:  # snapshot version 4: the run's parts as the Kafka reducer writes them
    from tracker.runtime.run_state import run_records
except ImportError:  # an older tree (``PYTHONPATH``): its snapshot is one record
    run_records = None  # type: ignore[assignment]

T0 = datetime(2026, 8, 20, tzinfo=UTC)


def report(i: int, every_s: float, run_id: str = "long-run", t0: datetime = T0) -> dict[str, Any]:
    return {"schema": "taugrid.io/intake/v1", "event_id": str(uuid.UUID(int=i + 1)), "run_id": run_id,
            "at": (t0 + timedelta(seconds=every_s * i)).isoformat(), "kind": "Progress", "step": 10 * i,
            "metrics": {"loss": 1.0 / (i + 1), "lr": 1e-4}}


def running_job() -> tuple[list[dict[str, Any]], str, datetime]:
    """The watch events of a Job admitted by Kueue and running on one pod, its run id, and a minute after its
    pod started (its first report)."""
    cluster = generate_cluster([RunPlan(RunParams(pods=1, outcome="running", progress_points=0))])
    records = [rec for stream in cluster.streams.values() for rec in stream]
    probe = Reducer()
    for rec in records:
        probe.apply(rec, "bench")
    [update] = probe.flush().updates
    assert update.history is not None
    started = update.history.run.started_at
    assert started is not None, "the simulated run did not start"
    return records, update.run_id, started + timedelta(minutes=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reports", type=int, nargs="+", default=[250, 1_000, 10_000, 12_000])
    ap.add_argument("--every-s", type=float, default=10.0)
    ap.add_argument("--sample", type=int, default=200)
    ap.add_argument("--attempt", action="store_true",
                    help="the run is a running Job admitted by Kueue (the goodput ledger reads its step records)")
    args = ap.parse_args(argv)
    if sorted(args.reports) != args.reports or args.reports[0] < 1 or args.sample < 1:
        ap.error("--reports: increasing counts of at least 1; --sample: at least 1")
    tune_gc()
    objects, run_id, first = running_job() if args.attempt else ([], "long-run", T0)
    red = Reducer()
    for rec in objects:
        red.apply(rec, "bench")
    # a tracker before run-state snapshot version 3 (``PYTHONPATH`` of an older tree) keeps the points inside
    apart: dict[str, Any] = {"points_apart": True} if "points_apart" in inspect.signature(red.snapshot_run).parameters \
        else {}
    i = 0
    print(f"one run{' (a running Job admitted by Kueue)' if args.attempt else ''}, a progress report every "
          f"{args.every_s:g} s (UUID event ids, 2 metrics), flushed after each; per report, over {args.sample} "
          f"reports at each mark:")
    print(f"{'reports seen':>12} | {'fold us':>8} {'flush us':>9} {'state us':>9} | {'state B':>9} "
          f"{'seen ids B':>10} {'steps B':>8} {'minutes B':>9} {'written B':>9} {'points':>6} | {'memory KiB':>10}")
    for mark in args.reports:
        while i < mark:  # fold up to the mark (flushing now and then: what it costs is not measured here)
            red.apply(report(i, args.every_s, run_id, first), "bench")
            i += 1
            if i % 1_000 == 0:
                red.flush()
        red.flush()
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        probe = Reducer()
        for rec in objects:
            probe.apply(rec, "bench")
        for k in range(i):  # the run's facts and derivation alone, as the reducer holds them at the mark
            probe.apply(report(k, args.every_s, run_id, first), "bench")
        probe.flush()
        memory = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        del probe
        fold = flush = state = 0.0
        size = written = 0
        parts: dict[str, int] = {}
        for _ in range(args.sample):
            rec = report(i, args.every_s, run_id, first)
            i += 1
            t0 = time.process_time()
            red.apply(rec, "bench")
            t1 = time.process_time()
            red.flush()
            t2 = time.process_time()
            snap = red.snapshot_run(run_id, None, **apart)
            assert snap is not None
            facts = snap["facts"]
            if run_records is not None:
                values = [v for _k, v, _h in run_records(run_id, snap)[1]]
            else:
                values = [jsonio.dumps(snap)]
            t3 = time.process_time()
            fold, flush, state = fold + t1 - t0, flush + t2 - t1, state + t3 - t2
            size, written = len(values[0]), written + sum(len(v) for v in values)
            parts = {k: len(jsonio.dumps(facts[k])) for k in ("progress_seen", "steps", "progress_buckets")}
        n = args.sample
        points = red.runs[run_id].points.size
        print(f"{mark:>12,} | {fold / n * 1e6:>8.0f} {flush / n * 1e6:>9.0f} {state / n * 1e6:>9.0f} | {size:>9,} "
              f"{parts['progress_seen']:>10,} {parts['steps']:>8,} {parts['progress_buckets']:>9,} "
              f"{written // n:>9,} {points:>6} | "
              f"{memory / 1024:>10,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
