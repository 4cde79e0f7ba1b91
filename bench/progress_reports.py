"""Progress reports of running runs folded and derived in one process: the reducer's cost a report, without Kafka.

    uv run python bench/progress_reports.py [--runs 200] [--reports 50000] [--every-s 10] [--flush-every 150]

The input is the latency phase of ``kafka_pipeline.py`` without the broker and the sink, built by that benchmark's
own functions: ``--runs`` Jobs admitted by Kueue and running on one pod each (``synthetic_stream``, folded first and
not timed), then ``--reports`` progress reports (``latency_report``: the runs in turn, a run's reports ``--every-s``
seconds apart in event time), and a flush every ``--flush-every`` reports (what one transaction of
``tracker reduce`` folds at 5,000 changes/s). It prints the CPU time a report costs, folding it (``Reducer.apply``)
and its share of the flushes (``Reducer.flush``: deriving each touched run's history and what changed), the shapes
derived again, and the cyclic garbage collector's passes (all of them, and those that started inside
``MetricPoints.drain``, where the profiles of ``tracker reduce`` put them). The baseline, in the same run: decoding
the same reports from their JSON (``jsonio.loads``, the decoder of the reducer's consumer). The load average is
printed before and after. On 2 shared cores the Kafka benchmark's end-to-end figures depend on the broker and the
sink; this one is the reducer's alone. Pure: no Kafka, no index.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/progress_reports.py
    sys.path.insert(0, str(REPO))

from bench.kafka_pipeline import LATENCY_RUNS, latency_report, synthetic_stream  # noqa: E402
from tracker.core import curves  # noqa: E402
from tracker.core.reducer import Reducer  # noqa: E402
from tracker.runtime.gctune import tune_gc  # noqa: E402
from tracker.shell import jsonio  # noqa: E402


def load_average() -> str:
    one, five, fifteen = Path("/proc/loadavg").read_text().split()[:3]
    return f"load average {one}, {five}, {fifteen} ({os.cpu_count()} cores)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=LATENCY_RUNS)
    ap.add_argument("--reports", type=int, default=50_000)
    ap.add_argument("--every-s", type=float, default=10.0)
    ap.add_argument("--flush-every", type=int, default=150)
    args = ap.parse_args(argv)
    if min(args.runs, args.reports, args.flush_every) < 1 or args.every_s < 0:
        ap.error("--runs, --reports, --flush-every: at least 1; --every-s: at least 0")
    print(load_average())
    tune_gc()  # what the tracker's processes run with (tracker/runtime/gctune.py)
    red = Reducer()
    # the runs of the Kafka benchmark's latency phase (its seed: the default's, plus one, as it draws them)
    for rec in synthetic_stream(args.runs, 2, start=100_000, outcomes=["running"]):
        red.apply(rec, "bench")
    updates = red.flush().updates
    assert len(updates) == args.runs and all(u.history is not None and u.history.run.status.value == "running"
                                             for u in updates), "a generated run is not running"
    run_ids = sorted(red.runs)
    shapes = sum(d.shapes for d in red.derivations.values())
    events = [latency_report(run_ids, k, args.every_s) for k in range(args.reports)]

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
