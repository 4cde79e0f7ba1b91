"""The web view's HTML pages: the runs table (the filters of ``tracker runs``, stuck runs first; a box a row to
tick runs to compare), a run's page (timeline, GPU figures, attempts, pods and their nodes, goodput ledger,
provenance and lineage, metrics and their curves) and the error pages.

Every value is escaped with ``markup.esc`` (``markup.path_part`` in a link's path); the pages load one stylesheet and
no script.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from tracker.core.gpu import held_hours
from tracker.core.model import Attempt, CheckpointRecord, MetricSummary, RunHistory, RunRecord
from tracker.core.vocab import PHASES, STATUSES
from tracker.read.filters import SORT_KEYS, RunFilter
from tracker.read.pods import EVICTED, FAILED, OUTCOMES, by_attempt, groups_text, node_groups, pod_outcomes
from tracker.read.render import (
    NO_PROGRESS,
    attempt_ledgers,
    attempt_pending,
    attempt_wait,
    gpu_hours_text,
    human_duration,
    provenance_rows,
    resumes,
    run_ledger,
    run_wait,
    step_text,
    wait_text,
)
from tracker.read.runs import GOODPUT_CATEGORIES, PRODUCTIVE, age_seconds, display_status, kube_duration, runs_data
from tracker.read.runs import share_text as share
from tracker.read.runs import wait_text as row_wait_text
from tracker.read.store import IndexReader, Run
from tracker.ui.compare_page import compare_href
from tracker.ui.curves import run_curves
from tracker.ui.markup import clock, esc, path_part
from tracker.ui.timeline import timeline_svg

DEFAULT_LIMIT = 500  # runs on one page when the query string sets no limit
REASON_CHARS = 200  # of a stuck run's reason and message in the table
MAX_PODS_LISTED = 200  # pods in a run page's table (failed and evicted ones first); the rest are counted


def layout(title: str, body: str, *, index_name: str, now: datetime, refresh: int = 0) -> str:
    """The page around ``body``; ``refresh``: seconds after which the browser loads it again (a
    ``<meta http-equiv="refresh">``: no script), 0 for never."""
    reload = f'<meta http-equiv="refresh" content="{int(refresh)}">' if refresh > 0 else ""
    every = f" · reloads every {refresh} s" if refresh > 0 else ""
    return ('<!doctype html>\n<html lang="en"><head><meta charset="utf-8">' + reload +
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{esc(title)} · tracker</title><link rel="stylesheet" href="/static/ui.css"></head>'
            f'<body><header class="top"><a href="/">tracker</a><span class="meta">read-only view of '
            f'<code>{esc(index_name)}</code> · times in UTC · now {esc(clock(now))}{esc(every)}</span></header>'
            f'<main>{body}</main></body></html>\n')


def error_body(status: int, title: str, message: str) -> str:
    return (f'<h1>{status} {esc(title)}</h1><p class="error">{esc(message)}</p>'
            '<p><a href="/">all runs</a></p>')


# ------------------------------------------------------------------------------------------ runs


def _badge(status: str, text: str | None = None) -> str:
    return f'<span class="badge {esc(status)}">{esc(text or status)}</span>'


def _run_link(run_id: str, text: str, now_param: str | None) -> str:
    query = "?" + urlencode({"now": now_param}) if now_param else ""
    return f'<a href="/runs/{esc(path_part(run_id))}{esc(query)}" title="{esc(run_id)}">{esc(text)}</a>'


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _filter_form(values: Mapping[str, Sequence[str]]) -> str:
    def value(name: str) -> str:
        return ",".join(values.get(name, ()))

    def text(name: str, label: str, placeholder: str, wide: bool = False) -> str:
        css = ' class="wide"' if wide else ""
        return (f'<label>{esc(label)}<input{css} type="text" name="{name}" value="{esc(value(name))}" '
                f'placeholder="{esc(placeholder)}"></label>')

    def select(name: str, label: str, options: Iterable[str]) -> str:
        chosen = {v.lower() for v in value(name).split(",") if v}
        opts = "".join(f'<option value="{esc(o)}"{" selected" if o.lower() in chosen else ""}>{esc(o)}</option>'
                       for o in options)
        return f'<label>{esc(label)}<select name="{name}"><option value="">any</option>{opts}</select></label>'

    return ('<form class="filters" method="get" action="/">'
            + text("namespace", "namespace", "team-a,team-b")
            + text("selector", "label selector", "taugrid.io/project=llm", wide=True)
            + text("queue", "LocalQueue", "team-a-lq") + text("cluster-queue", "ClusterQueue", "gpu-cq")
            + select("status", "status", STATUSES) + select("phase", "phase", PHASES)
            + text("since", "since", "2h or a time") + text("until", "until", "1h or a time")
            + text("stuck", "stuck for", "30m") + text("stalled-admission", "waiting admission", "30m")
            + text("workspace", "workspace", "") + text("project", "project", "")
            + select("sort-by", "sort by", SORT_KEYS) + text("limit", "limit", str(DEFAULT_LIMIT))
            + text("now", "now", "ISO-8601 time")
            + "".join(f'<input type="hidden" name="refresh" value="{esc(v)}">' for v in values.get("refresh", ())[-1:])
            + '<button type="submit">Filter</button> <a href="/">clear</a></form>')


def runs_page(reader: IndexReader, query: RunFilter, *, values: Mapping[str, Sequence[str]], now: datetime,
              stuck_before: datetime, stuck_label: str) -> str:
    """The runs ``query`` selects: those stuck before running since before ``stuck_before`` first (longest first),
    then the others in the query's order."""
    limit = query.limit or DEFAULT_LIMIT
    stuck_query = query._replace(stuck_before=query.stuck_before or stuck_before, sort_by="age", limit=limit)
    stuck = reader.runs(stuck_query)
    stuck_ids = {r.run_id for r in stuck}
    others = [r for r in reader.runs(query._replace(limit=limit + len(stuck) + 1)) if r.run_id not in stuck_ids]
    runs = (stuck + others)[: limit + 1]
    cut = len(runs) > limit
    runs = runs[:limit]
    short = reader.short_ids(r.run_id for r in runs)
    now_param = ",".join(values.get("now", ())) or None
    held = {d["run_id"]: d for d in runs_data(runs, now)}
    rows = [_run_row(r, held[r.run_id], now=now, short=short, stuck=r.run_id in stuck_ids, now_param=now_param)
            for r in runs]
    summary = f"{len(runs)} run{'s' if len(runs) != 1 else ''}"
    if stuck:
        summary += f" · {len(stuck)} stuck before running for more than {stuck_label} (listed first)"
    if cut:
        summary += f" · showing the first {limit}: set a larger limit for more"
    head = '<th title="tick 2 to 8 runs to compare">cmp</th>' + "".join(
        f'<th{" class=num" if num else ""}>{esc(h)}</th>' for h, num in (
        ("run", False), ("namespace", False), ("workload", False), ("status", False), ("att", True),
        ("retry", True), ("evict", True), ("queue", False), ("wait", True), ("age", True), ("GPUs", True),
        ("GPU-h", True), ("created", False), ("reason", False)))
    keep_now = f'<input type="hidden" name="now" value="{esc(now_param)}">' if now_param else ""
    table = ('<form class="compare" method="get" action="/compare">'
             f'<table class="runs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
             f'{keep_now}<p><button type="submit">Compare the runs ticked</button> <span class="note">2 to 8 runs'
             '</span></p></form>' if rows else '<p class="note">No runs found.</p>')
    body = (f'<h1>Runs</h1>{_filter_form(values)}<p class="note summary">{esc(summary)}</p>{table}')
    return body


def _run_row(run: Run, held: dict[str, Any], *, now: datetime, short: dict[str, str], stuck: bool,
             now_param: str | None) -> str:
    d = run.data
    status = str(d["status"])
    reason = str(d.get("reason") or "")
    message = str(d.get("message") or d.get("pending_message") or "")
    if stuck:
        reason_cell = esc(_one_line(f"{reason}: {message}" if reason and message else reason or message,
                                    REASON_CHARS))
    else:
        reason_cell = esc(reason or "-")
    title = f' title="{esc(_one_line(message, 1000))}"' if message else ""
    badge = " " + _badge("stuck") if stuck else ""
    cells = (
        f'<td class="run">{_run_link(run.run_id, short.get(run.run_id, run.run_id), now_param)}{badge}</td>',
        f'<td>{esc(d.get("namespace") or "-")}</td>',
        f'<td class="workload">{esc(d.get("name") or "-")} <span class="kind">{esc(d.get("kind") or "")}</span></td>',
        f'<td>{_badge(status, display_status(d))}</td>',
        f'<td class="num">{esc(d["attempts"])}</td>', f'<td class="num">{esc(d["retries"])}</td>',
        f'<td class="num">{esc(d["evictions"])}</td>',
        f'<td>{esc(d.get("queue") or "-")}</td>',
        f'<td class="num">{esc(row_wait_text(d, now))}</td>',
        f'<td class="num">{esc(kube_duration(age_seconds(run, now)))}</td>',
        f'<td class="num">{esc(d.get("gpus") or 0)}</td>',
        f'<td class="num">{esc(gpu_hours_text(float(held.get("gpu_hours") or 0.0)))}</td>',
        f'<td class="mono" title="{esc(d.get("created_at") or "")}">{esc(_created(d.get("created_at")))}</td>',
        f'<td class="reason"{title}>{reason_cell}</td>',
    )
    pick = (f'<td class="pick"><input type="checkbox" name="run" value="{esc(run.run_id)}" '
            f'title="compare {esc(run.run_id)}"></td>')
    return f'<tr class="{"stuck" if stuck else "run"} {esc(status)}">{pick}{"".join(cells)}</tr>'


def _created(text: str | None) -> str:
    if not text:
        return "-"
    return text[5:16].replace("T", " ")


# ------------------------------------------------------------------------------------------ one run


def run_page(history: RunHistory, *, now: datetime, note: str | None, waiting: dict[str, Any] | None = None,
             resumed_by: Sequence[str] | None = None, now_param: str | None = None,
             node_notes: Mapping[str, str] | None = None) -> str:
    """``waiting``: what the run waits behind in Kueue's queues (``tracker.read.queues.queue_context``), when known;
    ``resumed_by``: the runs that resume it (``IndexReader.resumed_by``); ``now_param``: the page's own ``now=``,
    kept in its links to other runs."""
    run = history.run
    svg = timeline_svg(history, now)
    parts = [
        f'<p class="dim"><a href="/">runs</a> / {esc(run.namespace or "?")}</p>',
        f'<h1>{esc(run.run_id)}</h1>',
        _identity(run),
    ]
    if note:
        parts.append(f'<p class="note">{esc(note)}</p>')
    if waiting:
        from tracker.read.queues import text as waiting_text

        parts.append(f'<p class="error">queue: {esc(waiting_text(waiting))}</p>')
    parts.append(_figures(run, now))
    lineage = _lineage(history, resumed_by, now_param)
    if lineage:
        parts.append(lineage)
    parts.append("<h2>Timeline</h2>")
    parts.append(svg or '<p class="note">No phase transitions recorded yet.</p>')
    if history.transitions:
        parts.append(_transitions(history, now))
    parts.append("<h2>Attempts</h2>")
    parts.append(_attempts(history.attempts, run, now) if history.attempts
                 else '<p class="note">No attempt yet.</p>')
    if history.pods:
        parts.append("<h2>Pods and nodes</h2>")
        parts.append(_pods(history, now_param, node_notes or {}))
    if any(a.pending or a.admission_steps for a in history.attempts):
        parts.append("<h2>Pending, by reason</h2>")
        parts.append(_pending(history, now))
    parts.append("<h2>Goodput ledger</h2>")
    parts.append(_ledger(history, now))
    if history.checkpoints:
        parts.append(_checkpoints(history.checkpoints))
    parts.append("<h2>Provenance</h2>")
    parts.append(_provenance(history, resumed_by, now_param))
    if history.metrics or history.metric_points:
        parts.append('<h2 id="metrics">Metrics</h2>')
        if history.metrics:
            parts.append(_metrics(history.metrics))
        parts.append(run_curves(history.metric_points))
    return "".join(parts)


def _identity(run: RunRecord) -> str:
    status = run.status.value
    text = (f'<p>{esc(run.kind or "?")} <code>{esc(run.namespace or "?")}/{esc(run.name or "?")}</code> '
            f'{_badge(status)}')
    if run.reason:
        text += f' <strong>{esc(run.reason)}</strong>'
    text += f' in {esc(run.phase.value)}</p>'
    if run.message and run.message != run.pending_message:
        text += f'<p class="dim">{esc(run.message)}</p>'
    if run.pending_reason:
        pending = f"{run.pending_reason}: {run.pending_message}" if run.pending_message else run.pending_reason
        text += f'<p class="error">pending: {esc(pending)}</p>'
    return text


def _figure(label: str, value: str, bad: bool = False) -> str:
    return f'<div><dt>{esc(label)}</dt><dd{" class=bad" if bad else ""}>{esc(value)}</dd></div>'


def _figures(run: RunRecord, now: datetime) -> str:
    held = held_hours(run.gpu_hours, run.gpus_open, run.open_since, now)
    live = run.status.value in ("pending", "running")
    led = run_ledger(run, now if live else None)
    figures = [
        _figure("attempts", str(run.attempts)), _figure("pod retries", str(run.retries)),
        _figure("evictions", str(run.evictions), bad=run.evictions > 0),
        _figure("admission wait", wait_text(run_wait(run, now))),
        _figure("GPUs", str(run.gpus)), _figure("GPU-hours held", gpu_hours_text(held)),
        _figure("GPU-hours lost", gpu_hours_text(run.lost_gpu_hours), bad=run.lost_gpu_hours > 0),
        _figure("goodput", share(led.goodput) + (led.gpu_mark() if led.goodput is not None else "")),
        _figure("ETTR", share(led.ettr) + (led.wall_mark() if led.ettr is not None else "")),
        _figure("created", clock(run.created_at)), _figure("started", clock(run.started_at)),
        _figure("finished", clock(run.finished_at)),
    ]
    if run.gpus_open:
        figures.append(_figure("GPUs still held", f"{run.gpus_open} since {clock(run.open_since)}"))
    if run.pending_category and run.status.value == "pending":
        figures.append(_figure("pending now", f"{run.pending_category} since {clock(run.pending_since)}"))
    lost_by = ""
    if run.lost_gpu_hours_by:
        lost_by = ('<p class="note">GPU-hours lost by reason: ' + esc(", ".join(
            f"{k} {gpu_hours_text(v)}" for k, v in sorted(run.lost_gpu_hours_by.items()))) + "</p>")
    return f'<dl class="figures">{"".join(figures)}</dl>{lost_by}'


def _lineage(history: RunHistory, resumed_by: Sequence[str] | None, now_param: str | None) -> str:
    """``resume of <run> (from <checkpoint>) · resumed by <run>, <run>``, each run a link to its page, then a link
    to compare it with each of them; '' when the run is neither."""
    words = []
    if resumes(history):
        words.append("resume of " + _resume_of(history, now_param))
    if resumed_by:
        words.append("resumed by " + _runs_links(resumed_by, now_param))
    if not words:
        return ""
    me = history.run.run_id
    compare = ", ".join(f'<a href="{esc(compare_href([me, other], now_param))}" title="{esc(other)}">'
                        f'compare with {esc(other)}</a>' for other in [*resumes(history), *(resumed_by or ())])
    return f'<p class="lineage">{" · ".join(words)}</p><p class="lineage compare">{compare}</p>'



def _resume_of(history: RunHistory, now_param: str | None) -> str:
    """The runs it resumes, linked, and the checkpoint it resumed from (HTML)."""
    source = history.run.resumed_from
    return _runs_links(resumes(history), now_param) + (f" (from <code>{esc(source)}</code>)" if source else "")


def _runs_links(run_ids: Sequence[str], now_param: str | None) -> str:
    return ", ".join(_run_link(r, r, now_param) for r in run_ids)


def _ledger(history: RunHistory, now: datetime) -> str:
    """The goodput ledger (schemas/goodput.md): ETTR and goodput, then GPU-hours, their share and the wall time by
    category, and each attempt's GPU-hours; a live run's open category counted up to ``now`` (marked +)."""
    run = history.run
    live = run.status.value in ("pending", "running")
    led = run_ledger(run, now if live else None)
    if run.ledger_basis != "progress":
        return (f'<p class="note">{esc(NO_PROGRESS)} (GPU-hours held less lost are productive, lost are wasted '
                'progress): no ETTR.</p>' + (_ledger_table(history, now) if led.held > 0 else ""))
    productive_s = led.wall_s_by.get(PRODUCTIVE, 0.0)
    ettr = share(led.ettr) + (led.wall_mark() if led.ettr is not None else "")
    goodput = share(led.goodput) + (led.gpu_mark() if led.goodput is not None else "")
    return (f'<p>ETTR <strong>{esc(ettr)}</strong>: {esc(human_duration(productive_s) + led.wall_mark(PRODUCTIVE))} '
            f'productive of {esc(human_duration(led.wall) + led.wall_mark())} since queued · goodput <strong>'
            f'{esc(goodput)}</strong>: {esc(gpu_hours_text(led.gpu_hours_by.get(PRODUCTIVE, 0.0)))}'
            f'{esc(led.gpu_mark(PRODUCTIVE))} of {esc(gpu_hours_text(led.held) + led.gpu_mark())} GPU-hours '
            'productive</p>' + _ledger_table(history, now))


def _ledger_table(history: RunHistory, now: datetime) -> str:
    run = history.run
    live = run.status.value in ("pending", "running")
    led = run_ledger(run, now if live else None)
    attempts = attempt_ledgers(history, now if live else None)
    rows = []
    for cat in (c for c in GOODPUT_CATEGORIES if c in led.gpu_hours_by or c in led.wall_s_by):
        hours, seconds = led.gpu_hours_by.get(cat), led.wall_s_by.get(cat)
        cells = [f'<td class="{esc(cat)}">{esc(cat)}</td>',
                 f'<td class="num">{esc("-" if hours is None else gpu_hours_text(hours) + led.gpu_mark(cat))}</td>',
                 f'<td class="num">{esc(share(None if hours is None or led.held <= 0 else hours / led.held))}</td>',
                 f'<td class="num">{esc("-" if seconds is None else human_duration(seconds) + led.wall_mark(cat))}'
                 '</td>']
        for a in attempts:
            value = a.gpu_hours_by.get(cat)
            cells.append(f'<td class="num">{esc("-" if value is None else gpu_hours_text(value) + a.gpu_mark(cat))}'
                         '</td>')
        rows.append(f'<tr>{"".join(cells)}</tr>')
    rows.append(f'<tr class="total"><td>total</td><td class="num">{esc(gpu_hours_text(led.held) + led.gpu_mark())}'
                f'</td><td class="num"></td><td class="num">{esc(human_duration(led.wall or None) + led.wall_mark())}'
                '</td>' + "".join(f'<td class="num">{esc(gpu_hours_text(a.held) + a.gpu_mark())}</td>'
                                  for a in attempts) + "</tr>")
    head = "".join(f'<th{" class=num" if num else ""}>{esc(h)}</th>' for h, num in (
        ("category", False), ("GPU-h", True), ("share", True), ("wall", True),
        *((f"attempt {a.attempt} GPU-h", True) for a in history.attempts)))
    return f'<table class="ledger"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _node_link(node: str | None, now_param: str | None) -> str:
    """A node, linked to the runs with a pod on it (the runs page's ``node=`` filter)."""
    if not node:
        return '<span class="dim">-</span>'
    query = urlencode({"node": node, **({"now": now_param} if now_param else {})})
    return f'<a href="/?{esc(query)}" title="runs with a pod on {esc(node)}">{esc(node)}</a>'


def _pods(history: RunHistory, now_param: str | None, node_notes: Mapping[str, str]) -> str:
    """The run's pods by attempt (tracker.read.pods): a line per attempt grouping its failed and evicted pods by node,
    then a table of the pods (at most ``MAX_PODS_LISTED``, the worst first; the rest counted), each node with what the
    index knows of it (``node_notes``: GPU model and count, NotReady since, cordoned)."""
    pods = pod_outcomes(history)
    said = []
    for attempt, those in by_attempt(pods).items():
        bad = [g for g in node_groups(those) if g.outcome in (FAILED, EVICTED)]
        if bad:
            said.append(f'<p class="error">attempt {attempt}: {esc(groups_text(bad, notes=node_notes))}</p>')
    ranked = sorted(pods, key=lambda p: (OUTCOMES.index(p.outcome), p.attempt))[:MAX_PODS_LISTED]
    rows = "".join(
        f'<tr><td class="num">{p.attempt}</td><td class="mono">{esc(p.pod)}</td>'
        f'<td class="mono">{_node_link(p.node, now_param)}</td>'
        f'<td class="reason">{esc(node_notes.get(p.node or "", "-"))}</td>'
        f'<td class="{"error" if p.outcome in (FAILED, EVICTED) else "dim"}">{esc(p.outcome)}</td>'
        f'<td class="reason">{esc(p.reason or "-")}</td><td class="mono">{esc(clock(p.at))}</td></tr>'
        for p in sorted(ranked, key=lambda p: (p.attempt, OUTCOMES.index(p.outcome), p.node or "", p.pod)))
    more = (f'<p class="note">… and {len(pods) - MAX_PODS_LISTED} more pods (tracker show {esc(history.run.run_id)} '
            '-o json lists them all).</p>' if len(pods) > MAX_PODS_LISTED else "")
    return ("".join(said) + '<table class="pods"><thead><tr><th class="num">attempt</th><th>pod</th><th>node</th>'
            '<th>node GPUs, state</th><th>outcome</th><th>reason</th><th>at</th></tr></thead>'
            f'<tbody>{rows}</tbody></table>' + more)


def _checkpoints(checkpoints: Sequence[CheckpointRecord]) -> str:
    rows = "".join(
        f'<tr><td>{esc(c.kind)}</td><td class="num">{c.step}</td><td>{esc(c.status)}</td>'
        f'<td class="num">{esc(c.attempt or "-")}</td><td class="mono">{esc(clock(c.started_at))}</td>'
        f'<td class="mono">{esc(clock(c.ended_at))}</td>'
        f'<td class="num">{esc("-" if c.bytes is None else f"{c.bytes:,}")}</td>'
        f'<td class="mono uri">{esc(c.uri)}</td></tr>' for c in checkpoints)
    return ('<table class="checkpoints"><thead><tr><th>checkpoint</th><th class="num">step</th><th>status</th>'
            '<th class="num">attempt</th><th>started</th><th>ended</th><th class="num">bytes</th><th>URI</th></tr>'
            f'</thead><tbody>{rows}</tbody></table>')


def _transitions(history: RunHistory, now: datetime) -> str:
    trs = history.transitions
    live = history.run.status.value in ("pending", "running")
    rows = []
    for i, t in enumerate(trs):
        nxt = trs[i + 1].at if i + 1 < len(trs) else (now if live else None)
        lasted = "-" if nxt is None else human_duration((nxt - t.at).total_seconds()) + (
            "+" if i + 1 == len(trs) else "")
        rows.append(f'<tr><td class="mono">{esc(clock(t.at))}</td><td class="num">{t.attempt}</td>'
                    f'<td>{esc(t.phase.value)}</td><td class="num">{esc(lasted)}</td>'
                    f'<td class="reason">{esc(t.reason)}{": " + esc(t.message) if t.message else ""}</td>'
                    f'<td class="mono">{esc(t.source)}</td></tr>')
    return ('<table class="transitions"><thead><tr><th>entered</th><th class="num">attempt</th><th>phase</th>'
            '<th class="num">for</th><th>reason</th><th>source</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _attempts(attempts: Sequence[Attempt], run: RunRecord, now: datetime) -> str:
    rows = []
    live = run.status.value in ("pending", "running")
    for a in attempts:
        wait = attempt_wait(a, run, now if live else None)
        held = held_hours(a.gpu_hours, a.gpus_open, a.open_since, now)
        lost = gpu_hours_text(a.lost_gpu_hours)
        if a.lost_gpu_hours_by:
            lost += " (" + ", ".join(f"{k} {gpu_hours_text(v)}" for k, v in sorted(a.lost_gpu_hours_by.items())) + ")"
        ended = a.end_reason or "-"
        if a.end_message:
            ended += f": {a.end_message}"
        if a.underlying_cause:
            ended += f" (cause: {a.underlying_cause})"
        failures = "".join(
            f'<li><code>{esc(f.pod)}</code> <strong>{esc(f.reason)}</strong>'
            f'{" exit " + esc(f.exit_code) if f.exit_code is not None else ""}'
            f'{" at " + esc(clock(f.at)) if f.at is not None else ""}{": " + esc(f.message) if f.message else ""}'
            '</li>' for f in a.failures)
        if a.failed_pods > len(a.failures):  # the first 64 are listed
            failures += f"<li>… and {a.failed_pods - len(a.failures)} more pod failures</li>"
        rows.append(
            f'<tr><td class="num">{a.attempt}</td><td>{esc(a.trigger)}</td><td>{esc(a.cluster_queue or "-")}</td>'
            f'<td class="mono">{esc(clock(a.queued_at))}</td><td class="mono">{esc(clock(a.admitted_at))}</td>'
            f'<td class="mono">{esc(clock(a.started_at))}</td><td class="mono">{esc(clock(a.ended_at))}</td>'
            f'<td class="num">{esc(wait_text(wait))}</td><td class="num">{a.retries}</td>'
            f'<td class="num">{a.gpus}</td><td class="num">{esc(gpu_hours_text(held))}</td>'
            f'<td class="num">{esc(lost)}</td><td class="reason">{esc(ended)}'
            f'{"<ul>" + failures + "</ul>" if failures else ""}</td></tr>')
    head = "".join(f'<th{" class=num" if num else ""}>{esc(h)}</th>' for h, num in (
        ("#", True), ("trigger", False), ("ClusterQueue", False), ("queued", False), ("admitted", False),
        ("started", False), ("ended", False), ("wait", True), ("retries", True), ("GPUs", True), ("GPU-h", True),
        ("lost GPU-h", True), ("ended by", False)))
    return f'<table class="attempts"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _pending(history: RunHistory, now: datetime) -> str:
    """Per attempt: its admission steps, then its pending seconds by category (an admission check by its name; the
    span still going on up to ``now``, marked +), longest first, with what explains the longest span of each."""
    live = history.run.status.value in ("pending", "running")
    at = now if live else None
    rows = []
    for a in history.attempts:
        for step in a.admission_steps:
            rows.append(f'<tr class="step"><td class="num">{a.attempt}</td><td>step</td>'
                        f'<td class="mono">{esc(clock(step.at))}</td><td class="num"></td>'
                        f'<td class="reason">{esc(step_text(step))}</td></tr>')
        last = a.pending[-1] if a.pending else None
        for key, seconds in attempt_pending(a, at).items():
            spans = [sp for sp in a.pending if (f"{sp.category.value}:{sp.detail}" if sp.category.value ==
                                                "admission-check" and sp.detail else sp.category.value) == key]
            growing = last is not None and last.end is None and spans and spans[-1] is last
            detail = next((sp.detail for sp in sorted(spans, key=lambda sp: sp.start, reverse=True) if sp.detail), "")
            since = clock(spans[0].start) if spans else "-"
            rows.append(f'<tr class="category"><td class="num">{a.attempt}</td><td>{esc(key)}</td>'
                        f'<td class="mono">{esc(since)}</td>'
                        f'<td class="num">{esc(human_duration(seconds) + ("+" if growing else ""))}</td>'
                        f'<td class="reason">{esc(detail)}</td></tr>')
    return ('<table class="pending"><thead><tr><th class="num">attempt</th><th>category</th><th>from</th>'
            '<th class="num">time</th><th>what says so</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _provenance(history: RunHistory, resumed_by: Sequence[str] | None = None, now_param: str | None = None) -> str:
    rows = []
    for k, v in provenance_rows(history, resumed_by=resumed_by):
        if k == "resume of" and resumes(history):
            value = _resume_of(history, now_param)
        elif k == "resumed by" and resumed_by:
            value = _runs_links(resumed_by, now_param)
        else:
            value = esc(v)
        rows.append(f'<tr><th>{esc(k)}</th><td class="mono">{value}</td></tr>')
    return f'<table class="kv"><tbody>{"".join(rows)}</tbody></table>'


def _num(value: float) -> str:
    return f"{value:.4g}"


def _metrics(metrics: Sequence[MetricSummary]) -> str:
    rows = []
    for m in metrics:
        delta = m.latest_value - m.first_value
        change = f"{delta:+.4g}"
        if m.first_value != 0 and math.isfinite(delta):
            change += f" ({delta / abs(m.first_value):+.1%})"
        rows.append(f'<tr><td class="mono">{esc(m.metric)}</td><td class="num">{esc(_num(m.first_value))} '
                    f'@{m.first_step} → {esc(_num(m.latest_value))} @{m.latest_step}</td>'
                    f'<td class="num">{esc(change)}</td><td class="num">{esc(_num(m.min_value))}</td>'
                    f'<td class="num">{esc(_num(m.max_value))}</td><td class="num">{m.points}</td></tr>')
    return ('<table class="metrics"><thead><tr><th>metric</th><th class="num">first → latest</th>'
            '<th class="num">change</th><th class="num">min</th><th class="num">max</th><th class="num">points</th>'
            f'</tr></thead><tbody>{"".join(rows)}</tbody></table>')

