"""`tracker show`'s metric curves: ``render.sparkline`` (pure: step buckets, non-finite values skipped) and its
column in the metrics table of ``timeline``."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

from tests.read.test_render import resumed_with_metrics, text
from tracker.core.model import MetricPoint
from tracker.read.render import SPARK_WIDTH, sparkline
from tracker.read.timeline import timeline


def test_each_step_its_level_from_least_to_greatest() -> None:
    assert sparkline([(s, float(s)) for s in range(8)]) == "▁▂▃▄▅▆▇█"
    assert sparkline([(s, -float(s)) for s in range(8)]) == "█▇▆▅▄▃▂▁"
    assert sparkline([(2, 5.0), (0, 1.0), (1, 3.0)]) == "▁▅█"  # by step, whatever the order; halfway rounds up


def test_more_steps_than_the_width_are_averaged_in_equal_step_buckets() -> None:
    line = sparkline([(s, float(s)) for s in range(96)])  # 4 steps a bucket
    assert len(line) == SPARK_WIDTH == 24 and line[0] == "▁" and line[-1] == "█"
    assert list(line) == sorted(line)  # rising, never falling back
    # a bucket is the mean of its points: steps 0-3 all 100 (the top), one 100 among 0s in steps 40-43 a quarter up
    spiked = [(s, 100.0 if s < 4 or s == 41 else 0.0) for s in range(96)]
    assert sparkline(spiked) == "█" + "▁" * 9 + "▃" + "▁" * 13
    assert sparkline([(s, float(s)) for s in range(10)], width=5) == "▁▃▅▆█"


def test_gaps_flat_curves_and_non_finite_values() -> None:
    assert sparkline([(0, 0.0), (1, 0.0), (100, 10.0)]) == "▁ █"  # steps 2..99 hold no point: a gap
    assert sparkline([(0, 2.0), (5, 2.0), (9, 2.0)]) == "▄▄▄"
    assert sparkline([(0, 1.0), (1, math.nan), (2, math.inf), (3, 3.0), (4, -math.inf)]) == "▁█"
    assert sparkline([(7, 1.0)]) == "▄"
    assert sparkline([]) == "" and sparkline([(0, math.nan)]) == ""
    assert sparkline([(0, -1e308), (1, 1e308)]) == "▄▄"  # a range wider than a float: flat, not an error


def test_show_draws_each_metrics_curve_beside_its_summary() -> None:
    history = resumed_with_metrics()
    at = datetime(2026, 8, 20, 10, tzinfo=UTC)
    loss = [2.31, 1.9, 1.4, 1.0, 0.7, 0.5, 0.42]
    points = [MetricPoint(run_id=history.run.run_id, metric="loss", step=200 * i, value=v, at=at)
              for i, v in enumerate(loss)]
    points.append(MetricPoint(run_id=history.run.run_id, metric="grad_norm", step=0, value=math.nan, at=at))
    out = text(timeline(replace(history, metric_points=points), 160, now=at))
    table = out[out.index("metrics"):]
    assert "curve" in table
    (loss_row,) = [line for line in table.splitlines() if "│ loss" in line]
    assert sparkline((p.step, p.value) for p in points if p.metric == "loss") == "█▆▅▃▂▁▁"
    assert loss_row.rstrip("│ ").endswith("█▆▅▃▂▁▁")
    (grad_row,) = [line for line in table.splitlines() if "│ grad_norm" in line]
    assert not any(c in grad_row for c in "▁▂▃▄▅▆▇█")  # its one point is NaN: no curve
