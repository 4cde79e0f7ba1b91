"""Every pending second explained: how each scenario's time before the application started splits by category.

    uv run python bench/pending.py [--runs 2000] [--seed 7]

For the bundled demo scenarios (sim.scenarios), every capture the real controllers produced
(tests/captures/controllers*/, Kueue 0.17 and 0.12) and a generated cluster (sim.lifecycles), it folds the
objects, sums each attempt's ended pending spans (``Attempt.pending``) by category and prints the seconds per category
and the share no evidence explains (``unexplained``; the goal of issue 24 is at most 5% on every scenario).
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from sim.lifecycles import generate_stream
from sim.scenarios import SCENARIOS
from tracker.core.model import PendingCategory, RunHistory
from tracker.core.reducer import Reducer

CAPTURES = Path(__file__).resolve().parent.parent / "tests" / "captures"


def fold(records: Iterable[dict[str, Any]]) -> list[RunHistory]:
    red = Reducer()
    for rec in records:
        red.apply(rec, "bench")
    return [h for run_id in sorted(red.runs) if (h := red.history(run_id)) is not None]


def by_category(histories: Iterable[RunHistory]) -> dict[str, float]:
    out: dict[str, float] = {}
    for h in histories:
        for a in h.attempts:
            for s in a.pending:
                if s.end is not None:
                    out[s.category] = out.get(s.category, 0.0) + (s.end - s.start).total_seconds()
    return out


def line(name: str, secs: dict[str, float]) -> str:
    total = sum(secs.values())
    unexplained = secs.get(PendingCategory.UNEXPLAINED, 0.0)
    share = 100 * unexplained / total if total else 0.0
    parts = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(secs.items(), key=lambda kv: -kv[1]))
    return f"{name:<58} {total:>11,.0f} s  unexplained {share:5.1f}%  ({parts})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2000, help="runs of the generated cluster")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    print(f"{'scenario':<58} {'pending':>13}  share of unexplained seconds  (seconds by category)")
    worst = 0.0
    rows: list[tuple[str, dict[str, float]]] = []
    for name, scenario in sorted(SCENARIOS.items()):
        rows.append((f"demo/{name}", by_category(fold(rec for stream in scenario.streams().values()
                                                          for rec in stream))))
    for path in sorted(CAPTURES.glob("*/*/capture.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            records = [json.loads(x) for x in fh if x.strip()]
        rows.append((f"{path.parent.parent.name}/{path.parent.name}", by_category(fold(records))))
    rows.append((f"generated ({args.runs} runs, seed {args.seed})",
                 by_category(fold(rec for _stream, rec in _generated(args.runs, args.seed)))))
    for name, secs in rows:
        print(line(name, secs))
        total = sum(secs.values())
        if total:
            worst = max(worst, secs.get(PendingCategory.UNEXPLAINED, 0.0) / total)
    print(f"worst unexplained share: {100 * worst:.1f}% (at {datetime.now().astimezone():%Y-%m-%d %H:%M %Z})")


def _generated(runs: int, seed: int) -> Iterable[tuple[str, dict[str, Any]]]:
    for rec in generate_stream(runs, seed):
        yield "generated", rec


if __name__ == "__main__":
    main()
