"""A run's timeline as SVG: one bar per (attempt, phase) on a shared time axis, as ``tracker show`` draws it in the
terminal (``tracker.read.render.timeline``), with the reasons on hover (an SVG ``<title>`` per row) and in the table
below it on the page; then its goodput ledger on the same axis: its checkpoints (a save a filled circle at its
completion, a failed one hollow, a restore a triangle) and the time it lost (wasted progress, infrastructure
recovery; the span still going on up to ``now``).

The axis runs from the first transition to the last one, or to ``now`` while the run is live. Each bar spans from its
phase's entry to the next entry (in the order of the history, across attempts); Admission is hatched (waiting for
quota), a Completion followed by more transitions is the time a Kueue deactivation stopped the run until it was
reactivated (dashed), the final Completion is a point (a diamond), and a live run's current phase runs to ``now``
with an arrow. Positions are attributes, colours classes of the stylesheet: no inline style.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from tracker.core.model import FINAL_STATUSES, Attempt, Phase, RunHistory, RunRecord, Transition
from tracker.core.waits import PENDING_CATEGORIES
from tracker.read.render import (
    CHECKPOINT_LEGEND,
    LEDGER_BAR,
    LEDGER_LABEL,
    attempt_wait,
    checkpoint_at,
    checkpoint_text,
    human_duration,
    step_text,
    time_span,
    wait_text,
)
from tracker.ui.markup import clock, esc, utc

WIDTH = 1000
LABEL_W = 112  # the phase names
DURATION_W = 78  # the durations, right of the bars
LEFT = 8
BAR_X = LEFT + LABEL_W
BAR_W = WIDTH - BAR_X - DURATION_W - 8
ROW_H = 22
HEADER_H = 24
NOTE_H = 18
AXIS_H = 46
# Steps of the axis' grid, the first giving at most MAX_TICKS intervals is used.
TICK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
                172800, 604800)
MAX_TICKS = 8


def _reason(reason: str | None, message: str = "") -> str:
    if reason and message:
        return f"{reason}: {message}"
    return reason or message


def _ticks(start: datetime, end: datetime) -> list[datetime]:
    span = (end - start).total_seconds()
    step = next((s for s in TICK_STEPS_S if span / s <= MAX_TICKS), TICK_STEPS_S[-1])
    epoch = int(start.timestamp())
    first = epoch - epoch % step + (step if epoch % step else 0)
    out: list[datetime] = []
    t = first
    while t <= end.timestamp() and len(out) <= MAX_TICKS + 1:
        out.append(start + timedelta(seconds=t - start.timestamp()))
        t += step
    return out


class _Svg:
    """Rows of the drawing, top to bottom."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.y = 0

    def add(self, text: str) -> None:
        self.parts.append(text)


def timeline_svg(history: RunHistory, now: datetime | None) -> str:
    """The SVG of ``history``'s timeline (empty string when it has no transitions)."""
    run = history.run
    trs = history.transitions
    if not trs:
        return ""
    start, end, span, live = time_span(history, now)

    def x(dt: datetime) -> float:
        return BAR_X + min(1.0, max(0.0, (utc(dt) - start).total_seconds() / span)) * BAR_W

    svg = _Svg()
    same_day = start.date() == end.date()
    fmt = "%H:%M:%S" if span < 600 else "%H:%M" if same_day else "%m-%d %H:%M"
    svg.add(f'<text class="dim" x="{LEFT}" y="14">{esc(clock(start))} → {esc(clock(end))} '
            f'({esc(human_duration((end - start).total_seconds()))}{", live" if live else ""})</text>')
    ticks = _ticks(start, end)
    svg.y = AXIS_H
    grid_at = [x(t) for t in ticks]
    axis = [f'<line class="axis" x1="{BAR_X}" y1="{AXIS_H - 4}" x2="{BAR_X + BAR_W}" y2="{AXIS_H - 4}"/>']
    for tick, gx in zip(ticks, grid_at, strict=True):
        axis.append(f'<line class="axis" x1="{gx:.1f}" y1="{AXIS_H - 8}" x2="{gx:.1f}" y2="{AXIS_H - 4}"/>')
        axis.append(f'<text class="axis" x="{gx:.1f}" y="{AXIS_H - 11}" text-anchor="middle">'
                    f'{esc(tick.strftime(fmt))}</text>')
    svg.add("".join(axis))

    attempts = {a.attempt: a for a in history.attempts}
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(trs):
        groups.setdefault(t.attempt, []).append(i)
    body_top = svg.y
    for n in sorted(set(groups) | set(attempts)):
        a = attempts.get(n)
        if a is not None:
            _attempt_header(svg, a, run, now if live else None)
        for i in groups.get(n, []):
            t = trs[i]
            nxt = trs[i + 1].at if i + 1 < len(trs) else None
            ongoing = nxt is None and live
            seg_end = nxt if nxt is not None else (end if ongoing else None)
            _bar_row(svg, t, seg_end=seg_end, ongoing=ongoing, x=x)
        if a is not None:
            _steps_row(svg, a, x)
            _pending_row(svg, a, end if live else None, x)
            _attempt_notes(svg, a, [trs[i] for i in groups.get(n, [])])
    drew = _ledger_rows(svg, history, end if live else None, x)
    grid = "".join(f'<line class="grid" x1="{gx:.1f}" y1="{body_top}" x2="{gx:.1f}" y2="{svg.y}"/>'
                   for gx in grid_at)
    svg.y += 8
    _legend(svg, stopped=any(t.phase is Phase.COMPLETION for t in trs[:-1]), live=live)
    cats = [c for c in PENDING_CATEGORIES if any(s.category.value == c for a in history.attempts for s in a.pending)]
    if cats or any(a.admission_steps for a in history.attempts):
        _pending_legend(svg, cats, steps=any(a.admission_steps for a in history.attempts))
    if drew:
        _ledger_legend(svg, drew)
    height = svg.y + 6
    defs = ('<defs><pattern id="wait" width="6" height="6" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(45)"><rect class="stripe-bg" width="6" height="6"/>'
            '<rect class="stripe" width="3" height="6"/></pattern></defs>')
    label = f"timeline of run {run.run_id}"
    return (f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
            f'width="{WIDTH}" height="{height}" role="img" aria-label="{esc(label)}">{defs}'
            f'<title>{esc(label)}</title>{grid}{"".join(svg.parts)}</svg>')


def _attempt_header(svg: _Svg, a: Attempt, run: RunRecord, now: datetime | None) -> None:
    words = [f"attempt {a.attempt}", f"trigger {a.trigger}"]
    if a.cluster_queue:
        words.append(f"ClusterQueue {a.cluster_queue}")
    if a.ray_cluster:
        words.append(f"RayCluster {a.ray_cluster}")
    wait = attempt_wait(a, run, now)
    if wait.seconds is not None:
        words.append(f"{'waiting' if wait.growing else 'waited'} {wait_text(wait)} for admission")
    text = " · ".join(words)
    y = svg.y
    svg.add(f'<g class="attempt"><title>{esc(text)}</title>'
            f'<rect class="band" x="0" y="{y + 2}" width="{WIDTH}" height="{HEADER_H - 4}"/>'
            f'<text class="attempt" x="{LEFT}" y="{y + HEADER_H - 8}">{esc(text)}</text></g>')
    svg.y += HEADER_H


def _bar_row(svg: _Svg, t: Transition, *, seg_end: datetime | None, ongoing: bool,
             x: Callable[[datetime], float]) -> None:
    phase = t.phase.value.lower()
    y = svg.y
    mid = y + ROW_H / 2
    x0 = x(t.at)
    reason = _reason(t.reason, t.message) + (" (ongoing)" if ongoing else "")
    stopped = t.phase is Phase.COMPLETION and seg_end is not None and not ongoing
    if stopped:
        reason = "stopped until reactivated: " + reason
    if seg_end is None:  # the end of the run: a point in time
        mark = (f'<path class="phase-{phase}" d="M{x0:.1f} {mid - 6:.1f} L{x0 + 6:.1f} {mid:.1f} '
                f'L{x0:.1f} {mid + 6:.1f} L{x0 - 6:.1f} {mid:.1f} Z"/>')
        duration = clock(t.at, "%H:%M:%S")
        when = f"at {clock(t.at)}"
    else:
        x1 = max(x(seg_end), x0 + 2)
        if t.phase is Phase.ADMISSION:  # waiting for quota: hatched
            mark = (f'<rect class="wait" x="{x0:.1f}" y="{y + 4}" width="{x1 - x0:.1f}" height="{ROW_H - 8}" '
                    'fill="url(#wait)"/>')
        elif stopped:
            mark = f'<rect class="stopped" x="{x0:.1f}" y="{y + 5}" width="{x1 - x0:.1f}" height="{ROW_H - 10}"/>'
        else:
            mark = (f'<rect class="phase-{phase}" x="{x0:.1f}" y="{y + 4}" width="{x1 - x0:.1f}" '
                    f'height="{ROW_H - 8}" rx="2"/>')
        if ongoing:
            mark += (f'<path class="ongoing" d="M{x1:.1f} {y + 3} L{x1 + 7:.1f} {mid:.1f} L{x1:.1f} {y + ROW_H - 3} '
                     'Z"/>')
        duration = human_duration((seg_end - t.at).total_seconds()) + ("+" if ongoing else "")
        when = f"{clock(t.at)} → {clock(seg_end)}"
    tip = f"{t.phase.value} · attempt {t.attempt}\n{when} ({duration})\n{reason}\nsource: {t.source}"
    svg.add(f'<g class="row"><title>{esc(tip)}</title>'
            f'<rect class="hover" x="0" y="{y}" width="{WIDTH}" height="{ROW_H}"/>'
            f'<text class="label phase-{phase}" x="{LEFT + 8}" y="{mid + 4:.1f}">{esc(t.phase.value)}</text>{mark}'
            f'<text class="duration" x="{WIDTH - 8}" y="{mid + 4:.1f}" text-anchor="end">{esc(duration)}</text></g>')
    svg.y += ROW_H


STEP_CLASS = {"QuotaReserved": "step-reserved", "AdmissionCheck": "step-check", "QuotaReleased": "step-released"}


def _steps_row(svg: _Svg, a: Attempt, x: Callable[[datetime], float]) -> None:
    """The attempt's admission steps as markers on one row: a quota reservation (a diamond), each admission check's
    state change (a circle; Ready filled), a quota released before admission (a cross: an eviction before any
    admission); each step's words on hover."""
    if not a.admission_steps:
        return
    y = svg.y
    mid = y + ROW_H / 2
    marks = []
    for step in a.admission_steps:
        sx = x(step.at)
        tip = f"{clock(step.at)} {step_text(step)}"
        css = STEP_CLASS.get(step.kind, "step-check")
        if step.kind == "QuotaReserved":
            shape = (f'<path class="{css}" d="M{sx:.1f} {mid - 5:.1f} L{sx + 5:.1f} {mid:.1f} L{sx:.1f} {mid + 5:.1f} '
                     f'L{sx - 5:.1f} {mid:.1f} Z"/>')
        elif step.kind == "QuotaReleased":
            shape = (f'<path class="{css}" d="M{sx - 5:.1f} {mid - 5:.1f} L{sx + 5:.1f} {mid + 5:.1f} '
                     f'M{sx + 5:.1f} {mid - 5:.1f} L{sx - 5:.1f} {mid + 5:.1f}"/>')
        else:
            state = "ready" if step.state == "Ready" else "waiting"
            shape = f'<circle class="{css} {state}" cx="{sx:.1f}" cy="{mid:.1f}" r="4"/>'
        marks.append(f'<g class="step"><title>{esc(tip)}</title>{shape}</g>')
    svg.add(f'<g class="steps"><text class="dim" x="{LEFT + 16}" y="{mid + 4:.1f}">steps</text>{"".join(marks)}</g>')
    svg.y += ROW_H


def _pending_row(svg: _Svg, a: Attempt, now: datetime | None, x: Callable[[datetime], float]) -> None:
    """The attempt's pending spans on one row, coloured by category (the open one up to ``now``), each span's
    category, detail and times on hover; its pending seconds by category at the right."""
    if not a.pending:
        return
    y = svg.y
    parts = []
    total = 0.0
    for span in a.pending:
        stop = span.end if span.end is not None else now
        x0 = x(span.start)
        x1 = max(x(stop), x0 + 1) if stop is not None else x0 + 2
        seconds = 0.0 if stop is None else max(0.0, (utc(stop) - utc(span.start)).total_seconds())
        total += seconds
        lasted = human_duration(seconds) + ("+" if span.end is None else "")
        tip = (f"{span.category.value}{': ' + span.detail if span.detail else ''}\n{clock(span.start)} → "
               f"{clock(stop) if stop is not None else 'now'} ({lasted})")
        parts.append(f'<g class="span"><title>{esc(tip)}</title><rect class="pending-{esc(span.category.value)}" '
                     f'x="{x0:.1f}" y="{y + 7}" width="{x1 - x0:.1f}" height="{ROW_H - 14}"/></g>')
    growing = a.pending[-1].end is None
    svg.add(f'<g class="pending"><text class="dim" x="{LEFT + 16}" y="{y + ROW_H / 2 + 4:.1f}">pending</text>'
            f'{"".join(parts)}<text class="duration dim" x="{WIDTH - 8}" y="{y + ROW_H / 2 + 4:.1f}" '
            f'text-anchor="end">{esc(human_duration(total) + ("+" if growing else ""))}</text></g>')
    svg.y += ROW_H


def _pending_legend(svg: _Svg, categories: Sequence[str], *, steps: bool) -> None:
    y = svg.y
    items: list[str] = []
    cursor = float(LEFT)
    if steps:
        items.append(f'<path class="step-reserved" d="M{cursor + 5:.0f} {y + 3} L{cursor + 10:.0f} {y + 8} '
                     f'L{cursor + 5:.0f} {y + 13} L{cursor:.0f} {y + 8} Z"/>'
                     f'<text class="dim" x="{cursor + 14:.0f}" y="{y + 12}">quota reserved</text>')
        cursor += 110
        items.append(f'<circle class="step-check ready" cx="{cursor + 5:.0f}" cy="{y + 8}" r="4"/>'
                     f'<text class="dim" x="{cursor + 14:.0f}" y="{y + 12}">admission check</text>')
        cursor += 118
        items.append(f'<path class="step-released" d="M{cursor:.0f} {y + 3} L{cursor + 10:.0f} {y + 13} '
                     f'M{cursor + 10:.0f} {y + 3} L{cursor:.0f} {y + 13}"/>'
                     f'<text class="dim" x="{cursor + 14:.0f}" y="{y + 12}">quota released</text>')
        cursor += 112
    for cat in categories:
        items.append(f'<rect class="pending-{esc(cat)}" x="{cursor:.0f}" y="{y + 3}" width="14" height="10"/>'
                     f'<text class="dim" x="{cursor + 18:.0f}" y="{y + 12}">{esc(cat)}</text>')
        cursor += 26 + 7 * len(cat)
        if cursor > WIDTH - 120:
            svg.add(f'<g class="legend">{"".join(items)}</g>')
            items, cursor = [], float(LEFT)
            svg.y += 18
            y = svg.y
    if items:
        svg.add(f'<g class="legend">{"".join(items)}</g>')
        svg.y += 18


def _note(svg: _Svg, text: str, css: str = "dim") -> None:
    svg.add(f'<g class="note"><title>{esc(text)}</title><text class="{css}" x="{LEFT + 16}" '
            f'y="{svg.y + NOTE_H - 5}">{esc(_cut(text, 150))}</text></g>')
    svg.y += NOTE_H


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _attempt_notes(svg: _Svg, a: Attempt, transitions: Sequence[Transition]) -> None:
    ended_by_completion = any(t.phase is Phase.COMPLETION and t.reason == a.end_reason for t in transitions)
    if a.end_reason and not ended_by_completion:
        text = f"↳ ended {_reason(a.end_reason, a.end_message)}"
        if a.underlying_cause:
            text += f" (cause: {a.underlying_cause})"
        if a.ended_at is not None:
            text += f" at {clock(a.ended_at)}"
        _note(svg, text, "bad")
    elif a.underlying_cause:
        _note(svg, f"↳ cause: {a.underlying_cause}", "bad")
    if a.retries:
        _note(svg, f"↳ {a.retries} pod retr{'ies' if a.retries != 1 else 'y'} within this attempt")


def _legend(svg: _Svg, *, stopped: bool, live: bool) -> None:
    y = svg.y
    items: list[str] = []
    cursor = float(LEFT)
    for phase in Phase:
        name = phase.value.lower()
        fill = 'fill="url(#wait)" class="wait"' if phase is Phase.ADMISSION else f'class="phase-{name}"'
        items.append(f'<rect {fill} x="{cursor:.0f}" y="{y + 3}" width="14" height="10"/>'
                     f'<text class="dim" x="{cursor + 18:.0f}" y="{y + 12}">{esc(phase.value)}</text>')
        cursor += 26 + 7 * len(phase.value)
    items.append(f'<path class="phase-completion" d="M{cursor + 6:.0f} {y + 2} L{cursor + 12:.0f} {y + 8} '
                 f'L{cursor + 6:.0f} {y + 14} L{cursor:.0f} {y + 8} Z"/>'
                 f'<text class="dim" x="{cursor + 16:.0f}" y="{y + 12}">end of run</text>')
    cursor += 90
    if stopped:
        items.append(f'<rect class="stopped" x="{cursor:.0f}" y="{y + 3}" width="14" height="10"/>'
                     f'<text class="dim" x="{cursor + 18:.0f}" y="{y + 12}">deactivated</text>')
        cursor += 100
    if live:
        items.append(f'<path class="ongoing" d="M{cursor:.0f} {y + 2} L{cursor + 7:.0f} {y + 8} L{cursor:.0f} '
                     f'{y + 14} Z"/><text class="dim" x="{cursor + 12:.0f}" y="{y + 12}">ongoing</text>')
    svg.add(f'<g class="legend">{"".join(items)}</g>')
    svg.y += 18


def _checkpoint_mark(css: str, cx: float, cy: float) -> str:
    if css == "ckpt-restore":
        return (f'<path class="{css}" d="M{cx:.1f} {cy - 5:.1f} L{cx + 5:.1f} {cy + 4:.1f} L{cx - 5:.1f} {cy + 4:.1f} '
                'Z"/>')
    return f'<circle class="{css}" cx="{cx:.1f}" cy="{cy:.1f}" r="4.5"/>'


def _ledger_rows(svg: _Svg, history: RunHistory, now: datetime | None, x: Callable[[datetime], float]) -> set[str]:
    """The goodput ledger's rows: a band, the checkpoints as marks (each one's step, URI and times on hover), then
    a row per category of lost time with its spans (the one still going on up to ``now``) and its total. The classes
    drawn (for the legend)."""
    run = history.run
    spans = [sp for sp in history.ledger if sp.category.value in LEDGER_BAR]
    if not spans and not history.checkpoints:
        return set()
    drew: set[str] = set()
    basis = "progress events" if run.ledger_basis == "progress" else "GPU accounting"
    text = f"goodput ledger · {basis}"
    y = svg.y
    svg.add(f'<g class="attempt ledger"><title>{esc(text)}</title>'
            f'<rect class="band" x="0" y="{y + 2}" width="{WIDTH}" height="{HEADER_H - 4}"/>'
            f'<text class="attempt" x="{LEFT}" y="{y + HEADER_H - 8}">{esc(text)}</text></g>')
    svg.y += HEADER_H
    if history.checkpoints:
        y = svg.y
        mid = y + ROW_H / 2
        marks = []
        for c in history.checkpoints:
            when, kind = checkpoint_at(c)
            if when is None:
                continue
            css = f"ckpt-{kind}"
            drew.add(css)
            size = f", {c.bytes:,} bytes" if c.bytes is not None else ""
            tip = (f"{checkpoint_text(c)} (attempt {c.attempt or '?'})\n{c.uri}\n{clock(c.started_at)} → "
                   f"{clock(c.ended_at)}{size}")
            marks.append(f'<g class="checkpoint"><title>{esc(tip)}</title>{_checkpoint_mark(css, x(when), mid)}</g>')
        saved = sum(1 for c in history.checkpoints if c.kind == "save" and c.status == "completed")
        svg.add(f'<g class="checkpoints"><text class="dim" x="{LEFT + 16}" y="{mid + 4:.1f}">checkpoints</text>'
                f'{"".join(marks)}<text class="duration dim" x="{WIDTH - 8}" y="{mid + 4:.1f}" text-anchor="end">'
                f'{esc(f"{saved} saved")}</text></g>')
        svg.y += ROW_H
    live = run.status not in FINAL_STATUSES
    for cat in LEDGER_BAR:
        of_cat = [sp for sp in spans if sp.category.value == cat]
        if not of_cat:
            continue
        drew.add(f"ledger-{cat}")
        y = svg.y
        parts = []
        total = 0.0
        growing = False
        for sp in of_cat:
            stop, open_ = sp.end, False
            if live and run.ledger_open == cat and sp.end == run.ledger_until and now is not None:
                stop, open_ = max(utc(now), utc(sp.end)), True
                growing = True
            seconds = max(0.0, (utc(stop) - utc(sp.start)).total_seconds())
            total += seconds
            x0 = x(sp.start)
            x1 = max(x(stop), x0 + 1)
            lasted = human_duration(seconds) + ("+" if open_ else "")
            tip = f"{cat}\n{clock(sp.start)} → {'now' if open_ else clock(stop)} ({lasted})"
            parts.append(f'<g class="span"><title>{esc(tip)}</title><rect class="ledger-{esc(cat)}" x="{x0:.1f}" '
                         f'y="{y + 6}" width="{x1 - x0:.1f}" height="{ROW_H - 12}"/></g>')
        svg.add(f'<g class="ledger"><text class="dim" x="{LEFT + 16}" y="{y + ROW_H / 2 + 4:.1f}">'
                f'{esc(LEDGER_LABEL[cat])}</text>{"".join(parts)}<text class="duration dim" x="{WIDTH - 8}" '
                f'y="{y + ROW_H / 2 + 4:.1f}" text-anchor="end">{esc(human_duration(total) + ("+" if growing else ""))}'
                '</text></g>')
        svg.y += ROW_H
    return drew


LEDGER_LEGEND = (*((f"ckpt-{kind}", words) for kind, words in CHECKPOINT_LEGEND.items()),
                 ("ledger-wasted-progress", "wasted progress"),
                 ("ledger-infrastructure-recovery", "infrastructure recovery"))


def _ledger_legend(svg: _Svg, drew: set[str]) -> None:
    y = svg.y
    items: list[str] = []
    cursor = float(LEFT)
    for css, words in LEDGER_LEGEND:
        if css not in drew:
            continue
        if css.startswith("ckpt-"):
            items.append(_checkpoint_mark(css, cursor + 5, y + 8))
        else:
            items.append(f'<rect class="{css}" x="{cursor:.0f}" y="{y + 3}" width="14" height="10"/>')
        items.append(f'<text class="dim" x="{cursor + 18:.0f}" y="{y + 12}">{esc(words)}</text>')
        cursor += 30 + 7 * len(words)
    svg.add(f'<g class="legend">{"".join(items)}</g>')
    svg.y += 18
