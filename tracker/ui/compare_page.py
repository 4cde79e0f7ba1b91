"""The web view's compare page: what ``tracker compare`` prints (``tracker.read.compare``: provenance, outcome, time
in phase, metrics) as a table, one column per run and a column marking the rows whose values differ (the command's
``*``), then per metric one chart with a curve per run (``tracker.ui.curves``).

Every value is escaped with ``markup.esc`` (``markup.path_part`` in a link's path); no script, no inline style.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from urllib.parse import urlencode

from tracker.core.model import RunHistory
from tracker.read.compare import DIFFERS, compare_data, compare_rows, differs
from tracker.read.nodeinfo import NodeInfo
from tracker.ui.curves import compare_curves
from tracker.ui.markup import esc, path_part


def compare_href(run_ids: Sequence[str], now_param: str | None = None) -> str:
    """The compare page's URL for ``run_ids`` (not escaped for HTML: pass it through ``esc``)."""
    pairs = [("run", r) for r in run_ids] + ([("now", now_param)] if now_param else [])
    return "/compare?" + urlencode(pairs)


def _run_head(run_id: str, now_param: str | None) -> str:
    query = "?" + urlencode({"now": now_param}) if now_param else ""
    return f'<th><a href="/runs/{esc(path_part(run_id))}{esc(query)}" title="{esc(run_id)}">{esc(run_id)}</a></th>'


def compare_page(histories: Sequence[RunHistory], *, now: datetime, resumed_by: Mapping[str, Sequence[str]],
                 notes: Sequence[str] = (), now_param: str | None = None,
                 nodes: Mapping[str, NodeInfo] | None = None) -> str:
    """``histories`` side by side in the order given; ``resumed_by``: the runs that resume each; ``notes``: what
    resolving the references said (``IndexReader.resolve``); ``now_param``: the page's own ``now=``, kept in its
    links; ``nodes``: what the index knows of the runs' nodes (their GPU models)."""
    data = compare_data(histories, now, resumed_by, nodes)
    ids = [h.run.run_id for h in histories]
    span = len(ids) + 2
    rows = []
    for label, values in compare_rows(data):
        if values is None:
            rows.append(f'<tr class="section"><th colspan="{span}">{esc(label)}</th></tr>')
            continue
        mark = differs(values)
        cells = "".join(f"<td>{esc(v)}</td>" for v in values)
        rows.append(f'<tr class="{"differs" if mark else "same"}"><td class="mark">{DIFFERS if mark else ""}</td>'
                    f'<th>{esc(label)}</th>{cells}</tr>')
    head = "".join(_run_head(r, now_param) for r in ids)
    parts = [f'<p class="dim"><a href="/">runs</a> / compare</p><h1>Compare {len(ids)} runs</h1>']
    parts += [f'<p class="note">{esc(n)}</p>' for n in notes]
    parts.append(f'<table class="compare"><caption>{DIFFERS} the runs differ</caption><thead><tr>'
                 f'<th class="mark"></th><th></th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>')
    curves = compare_curves([(h.run.run_id, h.metric_points) for h in histories])
    if curves:
        parts.append("<h2>Metric curves</h2>" + curves)
    return "".join(parts)
