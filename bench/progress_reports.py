"""Progress reports of running runs folded and derived in one process: the reducer's cost a report, without Kafka.

    uv run python bench/progress_reports.py [--runs 200] [--reports 50000] [--every-s 10] [--flush-every 150]

The input is the latency phase of ``kafka_pipeline.py`` without the broker and the sink: ``--runs`` Jobs admitted by
Kueue and running on one pod each (the simulator's objects, folded first and not timed), then ``--reports`` progress
reports (intake ``Progress`` events, one metric) given to the runs in turn, a run's reports ``--every-s`` seconds
apart in event time, and a flush every ``--flush-every`` reports (what one transaction of ``tracker reduce`` folds
at 5,000 changes/s). It prints the CPU time a report costs, folding it (``Reducer.apply``) and its share of the
flushes (``Reducer.flush``: deriving each touched run's history and what changed), the shapes derived again, and
the cyclic garbage collector's passes (all of them, and those that started inside ``MetricPoints.drain``, where the
profiles of ``tracker reduce`` put them). The baseline, in the same run: decoding the same reports from their JSON
(``jsonio.loads``, the decoder of the reducer's consumer). The load average is printed before and after. On 2 shared
cores the Kafka benchmark's end-to-end figures depend on the broker and the sink; this one is the reducer's alone.
Pure: no Kafka, no index.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sim.lifecycles import RunParams, RunPlan, generate_cluster
from tracker.core import curves
from tracker.core.reducer import Reducer
from tracker.runtime.gctune import tune_gc
from tracker.shell import jsonio


def load_average() -> str:
    one, five, fifteen = Path("/proc/loadavg").read_text().split()[:3]
    return f"load average {one}, {five}, {fifteen} ({os.cpu_count()} cores)"


def running_jobs(n: int) -> tuple[list[dict[str, Any]], list[str], datetime]:
    """The watch events of ``n`` Jobs admitted and running on one pod, their run ids, and a minute after the last
    one's pod started (the first report's time)."""
    cluster = generate_cluster([RunPlan(RunParams(pods=1, outcome="running", progress_points=2), index=i)
                                for i in range(n)])
    records = [rec for stream in cluster.streams.values() for rec in stream]
    probe = Reducer()
    for rec in records:
        probe.apply(rec, "bench")
    started = [u.history.run.started_at for u in probe.flush().updates if u.history is not None]
    assert len(started) == n and all(s is not None for s in started), "a simulated run did not start"
    return records, sorted(probe.runs), max(s for s in started if s is not None) + timedelta(minutes=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--reports", type=int, default=50_000)
    ap.add_argument("--every-s", type=float, default=10.0)
    ap.add_argument("--flush-every", type=int, default=150)
    args = ap.parse_args(argv)
    if min(args.runs, args.reports, args.flush_every) < 1 or args.every_s < 0:
        ap.error("--runs, --reports, --flush-every: at least 1; --every-s: at least 0")
    print(load_average())
    records, run_ids, first = running_jobs(args.runs)
    tune_gc()  # what the tracker's processes run with (tracker/runtime/gctune.py)
    red = Reducer()
    for rec in records:
        red.apply(rec, "bench")
    red.flush()
    shapes = sum(d.shapes for d in red.derivations.values())
    events = []
    for k in range(args.reports):
        run_id, step = run_ids[k % args.runs], 10_000 + k
        at = first + timedelta(seconds=args.every_s * (k // args.runs))
        events.append({"schema": "taugrid.io/intake/v1", "event_id": f"{run_id}-bench-{step}", "run_id": run_id,
                       "at": at.isoformat().replace("+00:00", "Z"), "kind": "Progress", "step": step,
                       "metrics": {"loss": 1 / step}})

    encoded = [jsonio.dumps(ev) for ev in events]
    t0 = time.process_time()
    for raw in encoded:
        jsonio.loads(raw)
    decode = time.process_time() - t0

    passes = {"all": 0, "in drain": 0}
    inside = [False]
    drain = curves.MetricPoints.drain

    def counted(self: curves.MetricPoints) -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
        inside[0] = True
        try:
            return drain(self)
        finally:
            inside[0] = False

    def on_gc(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            passes["all"] += 1
            passes["in drain"] += inside[0]

    curves.MetricPoints.drain = counted  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)
    fold = flush = 0.0
    try:
        for k, ev in enumerate(events, start=1):
            t0 = time.process_time()
            red.apply(ev, "bench")
            t1 = time.process_time()
            fold += t1 - t0
            if k % args.flush_every == 0 or k == len(events):
                red.flush()
                flush += time.process_time() - t1
    finally:
        gc.callbacks.remove(on_gc)
        curves.MetricPoints.drain = drain  # type: ignore[method-assign]
    n = len(events)
    shapes = sum(d.shapes for d in red.derivations.values()) - shapes
    print(f"{args.runs} running Jobs, {n:,} progress reports {args.every_s:g} s apart in turn, a flush every "
          f"{args.flush_every}; CPU a report:")
    print(f"  fold {fold / n * 1e6:7.1f} us   flush {flush / n * 1e6:7.1f} us   both {(fold + flush) / n * 1e6:7.1f} us"
          f"   ({n / (fold + flush):,.0f} reports/s)")
    print(f"  baseline, decoding the same reports (jsonio.loads): {decode / n * 1e6:5.1f} us")
    print(f"  shapes derived again: {shapes:,}; collector passes: {passes['all']:,}, "
          f"{passes['in drain']:,} of them started inside MetricPoints.drain")
    print(load_average())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
