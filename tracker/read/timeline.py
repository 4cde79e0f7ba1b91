"""``tracker show``'s timeline in the terminal: one bar per phase and attempt on a shared time axis, the pending
reasons, checkpoints and lost time on the same axis, the goodput ledger in figures, then provenance and metrics.

Pure presentation, like ``tracker.read.render`` (whose helpers and marks it draws with): a history in, a rich
renderable out; nothing here reads the clock (a live run's axis ends at the ``now`` the caller passes). Text that
comes from the cluster is always wrapped in ``Text``, never parsed as rich markup.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tracker.core.model import (
    FINAL_STATUSES,
    Attempt,
    MetricPoint,
    MetricSummary,
    PendingSpan,
    Phase,
    RunHistory,
    RunRecord,
    Transition,
)
from tracker.core.waits import GROWING, Wait
from tracker.read.pods import EVICTED, FAILED, PodOutcome, attempt_lines, by_attempt, pod_outcomes
from tracker.read.render import (
    BAR,
    BAR_MAX_WIDTH,
    BAR_MIN_WIDTH,
    CATEGORY_LABEL,
    CATEGORY_STYLE,
    CHECKPOINT_LEGEND,
    CHECKPOINT_MARK,
    DURATION_WIDTH,
    EPOCH,
    LABEL_WIDTH,
    LEDGER_BAR,
    LEDGER_LABEL,
    LEDGER_LEGEND,
    LEDGER_STYLE,
    NO_PROGRESS,
    NOW,
    PENDING_BAR,
    PHASE_STYLE,
    POINT,
    REASON_MIN_WIDTH,
    REASON_SHARE,
    STATUS_STYLE,
    STEP_MARK,
    STOPPED_BAR,
    WAIT_BAR,
    WHAT_RAN_ROWS,
    attempt_ledgers,
    attempt_wait,
    checkpoint_at,
    checkpoint_text,
    clock_text,
    gpu_hours_text,
    human_duration,
    number_text,
    pending_text,
    provenance_rows,
    reason_text,
    run_ledger,
    run_wait,
    sparkline,
    step_text,
    time_span,
    utc,
    wait_text,
)
from tracker.read.runs import GOODPUT_CATEGORIES, PRODUCTIVE, share_text

MAX_FAILURES_SHOWN = 5  # pod failures listed per attempt; the rest are counted


MAX_INPUTS_SHOWN = 10
MAX_PARAMS_SHOWN = 6  # hyperparameters shown in the provenance grid; the rest are counted ("+N more")
POD_STYLE = {FAILED: "red", EVICTED: "yellow"}  # a pod line's style by outcome (the others: dim)


MAX_CHECKPOINTS_SAID = 8  # checkpoints said in words on the timeline's row (all are marked)


def timeline(history: RunHistory, width: int, *, now: datetime | None = None,
             resumed_by: Sequence[str] | None = None, node_notes: Mapping[str, str] | None = None) -> RenderableType:
    """The run at a glance: one bar per (attempt, phase) on a shared time axis, its goodput ledger (checkpoints and
    the time lost on the same axis, then in figures), then provenance and metrics.

    The axis runs from the first transition to the last one, or to ``now`` while the run is live (not
    succeeded, failed or stopped). Each bar spans from its phase's entry to the next entry. A Completion that is not
    the last entry is the time a run was stopped by a Kueue deactivation, until it was reactivated (drawn dashed).
    ``resumed_by``: the runs that resume this one (the index knows them, the history does not); None: not known.
    ``node_notes``: what the index knows of the nodes the pods ran on (``tracker.read.nodeinfo.notes``: GPU model,
    conditions), said with the pods by node.
    """
    run = history.run
    parts: list[RenderableType] = [_header(run)]
    live_header = _header_wait(run, now) if run.status not in FINAL_STATUSES else Text()
    if live_header.plain:
        parts.append(live_header)
    if history.transitions:
        parts.extend(_bars(history, width, now, node_notes))
    else:
        parts.append(Text("no phase transitions recorded yet", style="dim"))
    parts.append(Text(""))
    parts.extend(goodput_section(history, width, now))
    parts.append(Text(""))
    parts.append(_provenance(history, resumed_by))
    if history.metrics:
        parts.append(Text(""))
        parts.append(_metrics(history.metrics, history.metric_points or ()))
    return Group(*parts)


def _header(run: RunRecord) -> Text:
    t = Text(no_wrap=False)
    t.append(run.run_id, style="bold")
    t.append(f"  {run.kind or '?'} {run.namespace or '?'}/{run.name or '?'}  ")
    t.append(run.status.value, style=STATUS_STYLE[run.status])
    if run.reason:
        t.append(f" ({run.reason})", style=STATUS_STYLE[run.status])
    t.append(f"  in {run.phase.value}  ·  {run.attempts} attempt{'s' if run.attempts != 1 else ''}, "
             f"{run.retries} retr{'ies' if run.retries != 1 else 'y'}, "
             f"{run.evictions} eviction{'s' if run.evictions != 1 else ''}")
    if run.gpus:
        t.append(f"  ·  {run.gpus} GPUs, {gpu_hours_text(run.gpu_hours)} GPU-h held, "
                 f"{gpu_hours_text(run.lost_gpu_hours)} lost")
        if run.gpus_open:
            t.append(f" (+{run.gpus_open} GPUs still held)")
    if run.message:
        t.append(f"\n{run.message}", style="dim")
    if run.pending_reason:
        t.append(f"\npending: {reason_text(run.pending_reason, run.pending_message)}", style="yellow")
    return t


def _header_wait(run: RunRecord, now: datetime | None) -> Text:
    wait = run_wait(run, now)
    t = Text()
    if wait.growing:
        t.append("waiting for admission for ")
        t.append(wait_text(wait), style="bold yellow")
        t.append(f" (queued {clock_text(run.queued_at)})", style="dim")
    if run.pending_category:
        t.append(("  ·  " if wait.growing else "") + f"pending: {run.pending_category} since "
                 f"{clock_text(run.pending_since)}", style="yellow")
    return t


def _bars(history: RunHistory, width: int, now: datetime | None,
          node_notes: Mapping[str, str] | None = None) -> list[Text]:
    run = history.run
    trs = history.transitions
    start, end, span, live = time_span(history, now)
    free = width - (2 + LABEL_WIDTH + 1 + 1 + DURATION_WIDTH + 2)  # what bars and reasons share
    bar_w = max(BAR_MIN_WIDTH, min(BAR_MAX_WIDTH, free - max(REASON_MIN_WIDTH, int(free * REASON_SHARE))))
    lead = " " * (2 + LABEL_WIDTH + 1)

    def col(dt: datetime) -> int:
        return min(bar_w, max(0, round((dt - start).total_seconds() / span * bar_w)))

    lines = [Text(f"{clock_text(start)} → {clock_text(end)}  ({human_duration((end - start).total_seconds())}"
                  f"{', live' if live else ''})", style="dim")]
    fmt = "%H:%M:%SZ" if start.date() == end.date() else "%m-%d %H:%MZ"
    left, right = clock_text(start, fmt), clock_text(end, fmt)
    axis = Text(lead + left + " " * max(1, bar_w - len(left) - len(right)) + right, style="dim")
    lines.append(axis)
    lines.append(Text(lead + "├" + "─" * max(0, bar_w - 2) + "┤", style="dim"))

    attempts = {a.attempt: a for a in history.attempts}
    pods = by_attempt(pod_outcomes(history))
    stopped_between = any(t.phase is Phase.COMPLETION for t in trs[:-1])
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(trs):
        groups.setdefault(t.attempt, []).append(i)
    for n in sorted(set(groups) | set(attempts)):
        a = attempts.get(n)
        if a is not None:
            lines.append(_attempt_header(a, width, attempt_wait(a, run, now if live else None)))
        for i in groups.get(n, []):
            t = trs[i]
            nxt = trs[i + 1].at if i + 1 < len(trs) else None
            ongoing = nxt is None and live
            seg_end = nxt if nxt is not None else (end if ongoing and now is not None else None)
            lines.append(_bar_line(t, seg_end, ongoing, col, bar_w, width))
        if a is not None:
            lines.extend(_pending_lines(a, end if live else None, col, bar_w, width))
            lines.extend(_attempt_end(a, [trs[i] for i in groups.get(n, [])], width))
        lines.extend(_pod_lines(pods.get(n, []), width, node_notes))
    ledger_lines, ledger_legend = _ledger_lines(history, end if live else None, col, bar_w, width)
    lines.extend(ledger_lines)
    legend = f"{lead}{BAR} in phase   {WAIT_BAR} waiting for admission   {POINT} end of run"
    steps_legend = ""
    if any(a.admission_steps for a in history.attempts):
        steps_legend += (f"{STEP_MARK['QuotaReserved']} quota reserved   {STEP_MARK['AdmissionCheck']} admission "
                         f"check   {STEP_MARK['QuotaReleased']} quota released before admission   ")
    if any(a.pending for a in history.attempts):
        steps_legend += f"{PENDING_BAR} pending, by reason"
    if stopped_between:
        legend += f"   {STOPPED_BAR} deactivated"
    if live and now is None:
        legend += f"   {NOW} in this phase since"
    lines.append(Text(legend, style="dim", no_wrap=True, overflow="ellipsis"))
    if steps_legend:
        lines.append(Text(lead + steps_legend.rstrip(), style="dim", no_wrap=True, overflow="ellipsis"))
    if ledger_legend:
        lines.append(Text(lead + ledger_legend, style="dim", no_wrap=True, overflow="ellipsis"))
    return lines


def _bar_line(t: Transition, seg_end: datetime | None, ongoing: bool, col: Callable[[datetime], int],
              bar_w: int, width: int) -> Text:
    style = PHASE_STYLE[t.phase]
    x0 = min(col(t.at), bar_w - 1)
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append("  ")
    line.append(f"{t.phase.value:<{LABEL_WIDTH}}", style=style)
    line.append(" ")
    if seg_end is None:  # the end of the run, or a live phase with no `now`: a point in time, not a span
        line.append(" " * x0)
        line.append(NOW if ongoing else POINT, style=style)
        line.append(" " * (bar_w - x0 - 1))
        duration = clock_text(t.at, "%H:%M:%S")
    else:
        # a Completion followed by more transitions: the run was stopped (deactivated) until it was reactivated
        stopped = t.phase is Phase.COMPLETION and not ongoing
        glyph = WAIT_BAR if t.phase is Phase.ADMISSION else STOPPED_BAR if stopped else BAR
        x1 = min(bar_w, max(col(seg_end), x0 + 1))
        line.append(" " * x0)
        line.append(glyph * (x1 - x0), style=style)
        line.append(" " * (bar_w - x1))
        duration = human_duration((seg_end - t.at).total_seconds()) + ("+" if ongoing else "")
    line.append(" ")
    line.append(f"{duration:>{DURATION_WIDTH}}", style="bold yellow" if t.phase is Phase.ADMISSION else "bold")
    line.append("  ")
    reason = reason_text(t.reason, t.message) + (" (ongoing)" if ongoing else "")
    if t.phase is Phase.COMPLETION and seg_end is not None and not ongoing:
        reason = "stopped until reactivated: " + reason
    line.append(reason)
    line.truncate(width, overflow="ellipsis")
    return line


def _pending_lines(a: Attempt, now: datetime | None, col: Callable[[datetime], int], bar_w: int,
                   width: int) -> list[Text]:
    """The attempt's admission steps (markers on one row) and its pending spans (a row per category, each span
    drawn where it was, the open one up to ``now``), then its pending seconds by category in words."""
    lines: list[Text] = []
    if a.admission_steps:
        cells = [" "] * bar_w
        marks = [STEP_MARK["AdmissionCheck"], STEP_MARK["QuotaReserved"], STEP_MARK["QuotaReleased"]]
        for step in a.admission_steps:  # at one column, a quota released shows over a reservation over a check
            x = min(col(step.at), bar_w - 1)
            mark = STEP_MARK.get(step.kind, "•")
            if cells[x] == " " or marks.index(mark) > marks.index(cells[x]):
                cells[x] = mark
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f"  {' steps':<{LABEL_WIDTH}} ", style="dim")
        line.append("".join(cells), style="yellow")
        line.append(" " + " " * DURATION_WIDTH + "  ")
        line.append(", ".join(f"{clock_text(s.at, '%H:%M:%S')} {step_text(s)}" for s in a.admission_steps), style="dim")
        line.truncate(width, overflow="ellipsis")
        lines.append(line)
    by_cat: dict[str, list[PendingSpan]] = {}
    for span in a.pending:
        by_cat.setdefault(span.category.value, []).append(span)
    for cat, spans in by_cat.items():
        cells = [" "] * bar_w
        seconds = 0.0
        growing = False
        for span in spans:
            stop = span.end if span.end is not None else now
            x0 = min(col(span.start), bar_w - 1)
            x1 = min(bar_w, max(col(stop), x0 + 1)) if stop is not None else x0 + 1
            for x in range(x0, x1):
                cells[x] = PENDING_BAR
            if stop is not None:
                seconds += max(0.0, (utc(stop) - utc(span.start)).total_seconds())
            growing = growing or span.end is None
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f"  {' ' + CATEGORY_LABEL.get(cat, cat):<{LABEL_WIDTH}} ", style="dim")
        line.append("".join(cells), style="yellow" if cat != "unexplained" else "red")
        duration = human_duration(seconds) + (GROWING if growing else "")
        line.append(f" {duration:>{DURATION_WIDTH}}  ", style="dim")
        details = [s.detail for s in spans if s.detail]
        line.append(cat + (f": {details[-1]}" if details else ""), style="dim")
        line.truncate(width, overflow="ellipsis")
        lines.append(line)
    if a.pending:
        t = Text(f"   ↳ pending {pending_text(a, now)}", no_wrap=True, overflow="ellipsis", style="yellow")
        t.truncate(width, overflow="ellipsis")
        lines.append(t)
    return lines


def _ledger_lines(history: RunHistory, now: datetime | None, col: Callable[[datetime], int], bar_w: int,
                  width: int) -> tuple[list[Text], str]:
    """The run's goodput ledger on the axis (schemas/goodput.md): its checkpoints as marks on one row, then a row
    per category of lost time (wasted progress, infrastructure recovery) with each span where it was (the one still
    going on up to ``now``, marked +); and the legend of what it drew."""
    run = history.run
    spans = [sp for sp in history.ledger if sp.category.value in LEDGER_BAR]
    if not spans and not history.checkpoints:
        return [], ""
    head = Text(no_wrap=True, overflow="ellipsis")
    head.append(" goodput ledger ", style="bold")
    head.append(f"· {'progress events' if run.ledger_basis == 'progress' else 'GPU accounting'} ")
    head.append("─" * max(0, width - head.cell_len), style="dim")
    head.truncate(width, overflow="ellipsis")
    lines = [head]
    legend: list[str] = []
    if history.checkpoints:
        cells = [" "] * bar_w
        rank = list(CHECKPOINT_MARK.values())
        for c in history.checkpoints:
            when, kind = checkpoint_at(c)
            if when is None:
                continue
            x = min(col(when), bar_w - 1)
            mark = CHECKPOINT_MARK[kind]
            if cells[x] == " " or rank.index(mark) > rank.index(cells[x]):
                cells[x] = mark
        saved = sum(1 for c in history.checkpoints if c.kind == "save" and c.status == "completed")
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f"  {' checkpoint':<{LABEL_WIDTH}} ", style="dim")
        line.append("".join(cells), style="cyan")
        line.append(f" {f'{saved} saved':>{DURATION_WIDTH}}  ", style="dim")
        said = [checkpoint_text(c) for c in history.checkpoints[-MAX_CHECKPOINTS_SAID:]]
        more = len(history.checkpoints) - len(said)
        line.append((f"… {more} more, " if more > 0 else "") + ", ".join(said), style="dim")
        line.truncate(width, overflow="ellipsis")
        lines.append(line)
        kinds = {checkpoint_at(c)[1] for c in history.checkpoints}
        legend += [f"{CHECKPOINT_MARK[k]} {words}" for k, words in CHECKPOINT_LEGEND.items() if k in kinds]
    live = run.status not in FINAL_STATUSES
    for cat, glyph in LEDGER_BAR.items():
        of_cat = [sp for sp in spans if sp.category.value == cat]
        if not of_cat:
            continue
        cells = [" "] * bar_w
        seconds = 0.0
        growing = False
        for sp in of_cat:
            stop = sp.end
            if live and run.ledger_open == cat and sp.end == run.ledger_until and now is not None:
                stop, growing = max(utc(now), utc(sp.end)), True
            x0 = min(col(sp.start), bar_w - 1)
            x1 = min(bar_w, max(col(stop), x0 + 1))
            for x in range(x0, x1):
                cells[x] = glyph
            seconds += max(0.0, (utc(stop) - utc(sp.start)).total_seconds())
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f"  {' ' + LEDGER_LABEL[cat]:<{LABEL_WIDTH}} ", style="dim")
        line.append("".join(cells), style=LEDGER_STYLE[cat])
        duration = human_duration(seconds) + (GROWING if growing else "")
        line.append(f" {duration:>{DURATION_WIDTH}}  ", style="dim")
        line.append(cat, style="dim")
        line.truncate(width, overflow="ellipsis")
        lines.append(line)
        legend.append(f"{glyph} {LEDGER_LEGEND[cat]}")
    return lines, "   ".join(legend)


def _attempt_header(a: Attempt, width: int, wait: Wait | None = None) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f" attempt {a.attempt} ", style="bold")
    t.append(f"· trigger {a.trigger}")
    if a.cluster_queue:
        t.append(f" · ClusterQueue {a.cluster_queue}")
    if a.ray_cluster:
        t.append(f" · RayCluster {a.ray_cluster}")
    wait = wait or Wait(a.admission_wait_s, False)
    if wait.seconds is not None:
        t.append(" · waiting " if wait.growing else " · waited ")
        t.append(wait_text(wait), style="bold yellow")
        t.append(" for admission")
    t.append(" ")
    t.append("─" * max(0, width - t.cell_len), style="dim")
    t.truncate(width, overflow="ellipsis")
    return t


def _attempt_gpus(a: Attempt, width: int) -> Text:
    """The attempt's GPU accounting (schemas/gpu-accounting.md): GPUs, GPU-hours held, lost and why."""
    t = Text(f"   ↳ {a.gpus} GPU{'s' if a.gpus != 1 else ''} · {gpu_hours_text(a.gpu_hours)} GPU-h held",
             no_wrap=True, overflow="ellipsis", style="dim")
    if a.gpus_open and a.open_since is not None:
        t.append(f" + {a.gpus_open} still held since {clock_text(a.open_since)}")
    if a.lost_gpu_hours:
        t.append(f" · {gpu_hours_text(a.lost_gpu_hours)} lost", style="bold red")
        t.append(" (" + ", ".join(f"{k} {gpu_hours_text(v)}" for k, v in a.lost_gpu_hours_by.items()) + ")",
                 style="red")
    t.truncate(width, overflow="ellipsis")
    return t


def _attempt_end(a: Attempt, transitions: list[Transition], width: int) -> list[Text]:
    lines: list[Text] = []
    ended_by_completion = any(t.phase is Phase.COMPLETION and t.reason == a.end_reason for t in transitions)
    if a.end_reason and not ended_by_completion:
        t = Text("   ↳ ended ", no_wrap=True, overflow="ellipsis")
        t.append(a.end_reason, style="bold red")
        if a.end_message:
            t.append(f": {a.end_message}")
        if a.underlying_cause:
            t.append(f" (cause: {a.underlying_cause})", style="red")
        if a.ended_at is not None:
            t.append(f" at {clock_text(a.ended_at)}", style="dim")
        t.truncate(width, overflow="ellipsis")
        lines.append(t)
    elif a.underlying_cause:
        lines.append(Text(f"   ↳ cause: {a.underlying_cause}", style="red", no_wrap=True, overflow="ellipsis"))
    if a.gpus:
        lines.append(_attempt_gpus(a, width))
    if a.retries:
        lines.append(Text(f"   ↳ {a.retries} pod retr{'ies' if a.retries != 1 else 'y'} within this attempt",
                          style="yellow"))
    for f in a.failures[:MAX_FAILURES_SHOWN]:
        t = Text("   ↳ pod ", no_wrap=True, overflow="ellipsis")
        t.append(f.pod)
        t.append(f" {f.reason}", style="bold red")
        if f.exit_code is not None:
            t.append(f" exit {f.exit_code}", style="red")
        if f.at is not None:
            t.append(f" at {clock_text(f.at)}", style="dim")
        if f.message:
            t.append(f": {f.message}")
        t.truncate(width, overflow="ellipsis")
        lines.append(t)
    failed = max(a.failed_pods, len(a.failures))  # the failures listed are the first 64 at most
    if failed > MAX_FAILURES_SHOWN:
        lines.append(Text(f"   ↳ … and {failed - MAX_FAILURES_SHOWN} more pod failures", style="red"))
    return lines


def _pod_lines(pods: Sequence[PodOutcome], width: int, notes: Mapping[str, str] | None = None) -> list[Text]:
    """The attempt's pods by node and outcome (tracker.read.pods): failed and evicted ones a line per group."""
    lines = []
    for text, outcome in attempt_lines(pods, notes=notes):
        t = Text("   ↳ ", no_wrap=True, overflow="ellipsis")
        t.append(text, style=POD_STYLE.get(outcome, "dim"))
        t.truncate(width, overflow="ellipsis")
        lines.append(t)
    return lines


def _provenance(history: RunHistory, resumed_by: Sequence[str] | None = None) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows = provenance_rows(history, max_inputs=MAX_INPUTS_SHOWN, max_params=MAX_PARAMS_SHOWN, resumed_by=resumed_by)
    for key, value in rows:
        line = key in WHAT_RAN_ROWS  # one line each, cut to the width with an ellipsis (show -o json has them whole)
        grid.add_row(Text(key), Text(value, style="dim" if value.strip("-/ ") == "" else "", no_wrap=line,
                                     overflow="ellipsis" if line else "fold"))
    return grid


CATEGORY_WIDTH = len("infrastructure-recovery")


FIGURES_WIDTH = CATEGORY_WIDTH + 1 + 7 + 1 + 6 + 1 + 7  # category, GPU-h, share, wall


ATTEMPT_COLUMN_WIDTH = 1 + 7  # a space and an attempt's GPU-h


def goodput_section(history: RunHistory, width: int, now: datetime | None) -> list[RenderableType]:
    """The run's goodput ledger in figures (schemas/goodput.md): ETTR and goodput, then GPU-hours, their share and
    the wall time by category (per attempt too when the width allows), the checkpoints; a live run's open category
    counted up to ``now`` (marked +). Without progress events, one line says the ledger is the GPU accounting."""
    run = history.run
    live = run.status not in FINAL_STATUSES
    led = run_ledger(run, now if live else None)
    goodput = Text("goodput ", style="bold")
    goodput.append(share_text(led.goodput) + (led.gpu_mark() if led.goodput is not None else ""), style="bold")
    if run.ledger_basis != "progress":
        goodput.append(f" · {NO_PROGRESS}")
        goodput.truncate(width, overflow="ellipsis")
        return [goodput]
    goodput.append(f" · {gpu_hours_text(led.gpu_hours_by.get(PRODUCTIVE, 0.0))}{led.gpu_mark(PRODUCTIVE)} of "
                   f"{gpu_hours_text(led.held)}{led.gpu_mark()} GPU-h productive")
    ettr = Text("ETTR ", style="bold")
    ettr.append(share_text(led.ettr) + (led.wall_mark() if led.ettr is not None else ""), style="bold")
    ettr.append(f" · {human_duration(led.wall_s_by.get(PRODUCTIVE, 0.0))}{led.wall_mark(PRODUCTIVE)} productive "
                f"of {human_duration(led.wall)}{led.wall_mark()} since queued")
    attempts = attempt_ledgers(history, now if live else None)
    per_attempt = 1 < len(attempts) <= (width - FIGURES_WIDTH) // ATTEMPT_COLUMN_WIDTH
    table = Table(box=None, padding=(0, 0, 0, 1), pad_edge=False, show_edge=False, header_style="bold")
    table.add_column("category", no_wrap=True, min_width=CATEGORY_WIDTH)
    for header in ("GPU-h", "share", "wall"):
        table.add_column(header, justify="right", no_wrap=True)
    if per_attempt:
        for a in history.attempts:
            table.add_column(f"att {a.attempt}", justify="right", no_wrap=True)
    for cat in (c for c in GOODPUT_CATEGORIES if c in led.gpu_hours_by or c in led.wall_s_by):
        hours = led.gpu_hours_by.get(cat)
        seconds = led.wall_s_by.get(cat)
        cells = [Text(cat, style=CATEGORY_STYLE.get(cat, "")),
                 Text("-" if hours is None else gpu_hours_text(hours) + led.gpu_mark(cat)),
                 Text(share_text(None if hours is None or led.held <= 0 else hours / led.held)),
                 Text("-" if seconds is None else human_duration(seconds) + led.wall_mark(cat))]
        if per_attempt:
            cells += [Text("-" if cat not in a.gpu_hours_by else gpu_hours_text(a.gpu_hours_by[cat])
                           + a.gpu_mark(cat), style="dim") for a in attempts]
        table.add_row(*cells)
    table.add_row(Text("total", style="bold"), Text(gpu_hours_text(led.held) + led.gpu_mark()), Text(""),
                  Text(human_duration(led.wall) + led.wall_mark()),
                  *([Text(gpu_hours_text(a.held) + a.gpu_mark(), style="dim") for a in attempts] if per_attempt
                    else []))
    parts: list[RenderableType] = [ettr, goodput, table]
    if len(attempts) > 1 and not per_attempt:
        parts.append(Text("  (by attempt: tracker show -o json, attempts[].ledger_gpu_hours_by)", style="dim"))
    said = _checkpoints_said(history)
    if said:  # folded, not cut: the URIs are to be read whole
        parts.append(Text(f"checkpoints: {said}", overflow="fold"))
    return parts


def _checkpoints_said(history: RunHistory) -> str:
    """``2 saved (last @3000), 1 restored (@1000 from s3://...)``: the restored checkpoint's URI when it is not the
    last saved (which is the provenance's last checkpoint); '' without any."""
    run = history.run
    saves = [c for c in history.checkpoints if c.kind == "save"]
    done = [c for c in saves if c.status == "completed"]
    failed = [c for c in saves if c.status == "failed"]
    restores = [c for c in history.checkpoints if c.kind == "restore"]
    last = max(done, key=lambda c: (c.ended_at is not None, c.ended_at or c.started_at or EPOCH, c.step), default=None)
    words = []
    if run.checkpoints_saved or done:
        words.append(f"{max(run.checkpoints_saved, len(done))} saved" + (f" (last @{last.step})" if last else ""))
    if failed:
        words.append(f"{len(failed)} failed")
    if restores:
        first = restores[0]
        uri = "" if last is not None and first.uri == last.uri else f" from {first.uri}"
        words.append(f"{len(restores)} restored ({'first ' if len(restores) > 1 else ''}@{first.step}{uri})")
    return ", ".join(words)


def _metrics(metrics: Sequence[MetricSummary], points: Sequence[MetricPoint] = ()) -> Table:
    """Each metric's summary and its curve (``render.sparkline`` of the points the index keeps)."""
    table = Table(title="metrics", title_justify="left", header_style="bold")
    for header in ("metric", "first → latest", "change", "min", "max", "points", "curve"):
        table.add_column(header, justify="left" if header in ("metric", "first → latest", "curve") else "right")
    for m in metrics:
        delta = m.latest_value - m.first_value
        change = f"{delta:+.4g}"
        if m.first_value != 0 and math.isfinite(delta):
            change += f" ({delta / abs(m.first_value):+.1%})"
        table.add_row(Text(m.metric),
                      Text(f"{number_text(m.first_value)} @{m.first_step} → "
                           f"{number_text(m.latest_value)} @{m.latest_step}"),
                      Text(change), Text(number_text(m.min_value)), Text(number_text(m.max_value)), Text(str(m.points)),
                      Text(sparkline((p.step, p.value) for p in points if p.metric == m.metric), no_wrap=True))
    return table
