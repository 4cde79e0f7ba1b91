"""A run's metric points (``RunHistory.metric_points``: step, value) as small SVG line charts: one chart per
metric, x the step and y the value, each axis labelled with its least and greatest value; on the compare page one
curve per run in each chart, with a legend naming the runs.

Non-finite values (NaN, ±inf) are left out (a curve joins the points either side). A curve draws at most
``MAX_POINTS_PER_CURVE`` points (evenly picked, the last one kept; the index already keeps at most
``reduce.metric_points_per_run``, 512 by default, a run), a page at most ``MAX_CHARTS`` charts (the metrics in name
order; a note says how many more). Every text goes through ``markup.esc``; positions are attributes and colours the
stylesheet's classes (``curve-0`` ... ``curve-7``, by the run's place on the page): no inline style.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from tracker.core.model import MetricPoint
from tracker.ui.markup import esc

WIDTH = 300  # a chart's width, in the SVG's units (the stylesheet scales it)
PLOT_H = 120  # the plot's height
LEFT = 56  # room for the value labels
RIGHT = 12
TOP = 22  # the metric's name
BOTTOM = 22  # the step labels
LEGEND_ROW_H = 16  # one legend line a run (compare)
LEGEND_CHARS = 40  # a run id longer than this is cut in the legend (whole in its <title>)
COLOURS = 8  # curve-0 .. curve-7 in the stylesheet: the compare page's most runs
MAX_POINTS_PER_CURVE = 1_024
MAX_CHARTS = 32  # metrics drawn on one page


class Curve(NamedTuple):
    label: str  # the run, in the legend
    colour: int  # its class, curve-N (N modulo COLOURS)
    points: Sequence[tuple[int, float]]  # (step, value), finite, by step


def _number(value: float) -> str:
    return f"{value:.4g}"


def finite_points(points: Iterable[MetricPoint], metric: str) -> list[tuple[int, float]]:
    """``metric``'s points by step, the non-finite values left out, at most ``MAX_POINTS_PER_CURVE`` (evenly
    picked, first and last kept)."""
    kept = sorted((p.step, p.value) for p in points if p.metric == metric and math.isfinite(p.value))
    if len(kept) <= MAX_POINTS_PER_CURVE:
        return kept
    last = len(kept) - 1
    picks = sorted({round(i * last / (MAX_POINTS_PER_CURVE - 1)) for i in range(MAX_POINTS_PER_CURVE)})
    return [kept[i] for i in picks]


def _span(low: float, high: float) -> tuple[float, float]:
    """A range that is never empty: a flat curve is drawn in the middle."""
    if high > low:
        return low, high
    pad = abs(low) * 0.05 or 1.0
    return low - pad, high + pad


def chart(metric: str, curves: Sequence[Curve], *, legend: bool = False) -> str:
    """One metric's chart: each curve a polyline (a lone point a dot); its axes' least and greatest step and value.
    ``legend``: a line per curve under the plot naming its run."""
    drawn = [c for c in curves if c.points]
    if not drawn:
        return (f'<figure class="curve"><figcaption class="mono">{esc(metric)}</figcaption>'
                '<p class="note">no finite value to draw</p></figure>')
    steps = [s for c in drawn for s, _ in c.points]
    values = [v for c in drawn for _, v in c.points]
    x0, x1 = min(steps), max(steps)
    y0, y1 = min(values), max(values)
    sx0, sx1 = (x0, x1) if x1 > x0 else (x0 - 1, x1 + 1)
    sy0, sy1 = _span(y0, y1)
    plot_w = WIDTH - LEFT - RIGHT
    bottom = TOP + PLOT_H

    def x(step: int) -> float:
        return LEFT + (step - sx0) / (sx1 - sx0) * plot_w

    def y(value: float) -> float:
        return bottom - (value - sy0) / (sy1 - sy0) * PLOT_H

    rows = len(drawn) if legend else 0
    height = TOP + PLOT_H + BOTTOM + rows * LEGEND_ROW_H
    parts = [f'<svg class="curve" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
             f'aria-label="{esc(metric)} by step">',
             f'<text class="metric" x="{LEFT}" y="14">{esc(metric)}</text>',
             f'<rect class="plot" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{PLOT_H}"/>',
             f'<text class="axis" x="{LEFT - 4}" y="{y(y1) + 4:.1f}" text-anchor="end">{esc(_number(y1))}</text>',
             f'<text class="axis" x="{LEFT - 4}" y="{y(y0) + 4:.1f}" text-anchor="end">{esc(_number(y0))}</text>',
             f'<text class="axis" x="{x(x0):.1f}" y="{bottom + 14}" text-anchor="start">{esc(x0)}</text>',
             f'<text class="axis" x="{x(x1):.1f}" y="{bottom + 14}" text-anchor="end">{esc(x1)}</text>']
    for c in drawn:
        css = f"curve-{c.colour % COLOURS}"
        title = f"<title>{esc(c.label + ' · ' if c.label else '')}{esc(metric)}: {len(c.points)} points</title>"
        if len(c.points) == 1:
            step, value = c.points[0]
            parts.append(f'<circle class="{css}" cx="{x(step):.1f}" cy="{y(value):.1f}" r="3">{title}</circle>')
        else:
            coords = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in c.points)
            parts.append(f'<polyline class="{css}" points="{coords}">{title}</polyline>')
    for i, c in enumerate(drawn[:rows]):
        top = bottom + BOTTOM + i * LEGEND_ROW_H
        name = c.label if len(c.label) <= LEGEND_CHARS else c.label[: LEGEND_CHARS - 1] + "…"
        parts.append(f'<line class="curve-{c.colour % COLOURS}" x1="{LEFT}" y1="{top + 8}" x2="{LEFT + 18}" '
                     f'y2="{top + 8}"/><text class="legend" x="{LEFT + 24}" y="{top + 12}">{esc(name)}'
                     f'<title>{esc(c.label)}</title></text>')
    parts.append("</svg>")
    return f'<figure class="curve">{"".join(parts)}</figure>'


def _charts(metrics: Sequence[str], curves_of: dict[str, list[Curve]], *, legend: bool) -> str:
    shown = metrics[:MAX_CHARTS]
    more = len(metrics) - len(shown)
    note = f'<p class="note">{more} more metrics not drawn (at most {MAX_CHARTS})</p>' if more > 0 else ""
    return ('<div class="curves">' + "".join(chart(m, curves_of[m], legend=legend) for m in shown) + "</div>"
            + note)


def run_curves(points: Sequence[MetricPoint] | None) -> str:
    """A run's charts, one per metric in name order; '' when it has no points."""
    if not points:
        return ""
    metrics = sorted({p.metric for p in points})
    return _charts(metrics, {m: [Curve("", 0, finite_points(points, m))] for m in metrics}, legend=False)


def compare_curves(runs: Sequence[tuple[str, Sequence[MetricPoint] | None]]) -> str:
    """Per metric any of ``runs`` (run id, its points) has, one chart with a curve per run that has it (a run keeps
    its colour in every chart) and a legend; '' when none has points."""
    metrics = sorted({p.metric for _, points in runs for p in points or ()})
    if not metrics:
        return ""
    curves_of = {m: [Curve(run_id, i, finite_points(points or (), m)) for i, (run_id, points) in enumerate(runs)
                     if any(p.metric == m for p in points or ())] for m in metrics}
    return _charts(metrics, curves_of, legend=True)
