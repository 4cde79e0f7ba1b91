"""The web view's stylesheet (served as ``/static/ui.css``; the pages carry no inline style)."""

from __future__ import annotations

CSS = """\
:root { color-scheme: light; --fg: #1f2328; --dim: #59636e; --line: #d1d9e0; --bg: #ffffff; --band: #f6f8fa;
  --resolution: #0891b2; --rendering: #3b82f6; --admission: #d97706; --scheduling: #c026d3; --runtime: #16a34a;
  --progress: #22c55e; --completion: #6b7280; --pending: #b45309; --running: #1d4ed8; --succeeded: #15803d;
  --failed: #b91c1c; --stopped: #a21caf; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
  color: var(--fg); background: var(--bg); }
header.top { display: flex; gap: 1rem; align-items: baseline; padding: .6rem 1.2rem; background: #24292f;
  color: #f0f3f6; }
header.top a { color: #ffffff; font-weight: 600; text-decoration: none; }
header.top .meta { color: #c9d1d9; font-size: 12px; }
main { padding: 1rem 1.2rem 2rem; }
h1 { font-size: 20px; margin: .2rem 0 .4rem; word-break: break-all; }
h2 { font-size: 16px; margin: 1.6rem 0 .5rem; border-bottom: 1px solid var(--line); padding-bottom: .2rem; }
a { color: #0969da; }
code, .mono, td.run, td.num { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace;
  font-size: 13px; }
.dim { color: var(--dim); }
.note { color: var(--dim); margin: .4rem 0; }
.error { color: var(--failed); font-weight: 600; }
form.filters { display: flex; flex-wrap: wrap; gap: .5rem .8rem; align-items: flex-end; padding: .7rem;
  background: var(--band); border: 1px solid var(--line); border-radius: 6px; margin-bottom: .8rem; }
form.filters label { display: flex; flex-direction: column; font-size: 12px; color: var(--dim); }
form.filters input, form.filters select { font: inherit; font-size: 13px; padding: 2px 4px; min-width: 7.5rem;
  border: 1px solid var(--line); border-radius: 4px; background: #fff; color: var(--fg); }
form.filters input.wide { min-width: 16rem; }
form.filters button { font: inherit; padding: 3px 14px; border-radius: 4px; border: 1px solid #1f883d;
  background: #1f883d; color: #fff; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--band); font-size: 12px; text-transform: uppercase; letter-spacing: .03em; color: var(--dim);
  white-space: nowrap; }
td.num, th.num { text-align: right; white-space: nowrap; }
td { white-space: nowrap; }
td.reason { white-space: normal; min-width: 14rem; max-width: 42rem; overflow-wrap: anywhere; }
td.workload { white-space: nowrap; }
td.workload .kind { color: var(--dim); font-size: 12px; }
table.kv td, table.attempts td.reason { white-space: normal; overflow-wrap: anywhere; }
/* the attempts table has 13 columns: its times wrap between date and time, so that it fits 1400 px with "ended by" */
table.attempts td.mono { white-space: normal; min-width: 5.5rem; }
table.attempts td.reason { min-width: 10rem; }
tr.stuck td { background: #fff8c5; }
tr.stuck td.pick { border-left: 4px solid var(--admission); }
.badge { display: inline-block; padding: 0 7px; border-radius: 10px; font-size: 12px; font-weight: 600;
  color: #fff; white-space: nowrap; }
.badge.pending { background: var(--pending); } .badge.running { background: var(--running); }
.badge.succeeded { background: var(--succeeded); } .badge.failed { background: var(--failed); }
.badge.stopped { background: var(--stopped); } .badge.stuck { background: #9a6700; }
dl.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(11rem, 1fr)); gap: .4rem 1rem;
  margin: .6rem 0; }
dl.figures div { background: var(--band); border: 1px solid var(--line); border-radius: 6px; padding: .35rem .6rem; }
dl.figures dt { font-size: 11px; text-transform: uppercase; color: var(--dim); }
dl.figures dd { margin: 0; font-size: 16px; font-weight: 600; }
dl.figures dd.bad { color: var(--failed); }
table.kv th { width: 14rem; text-transform: none; font-size: 13px; letter-spacing: 0; }
svg.timeline { width: 100%; max-width: 1200px; height: auto; display: block; margin: .4rem 0;
  font-family: system-ui, "DejaVu Sans", sans-serif; }
svg.timeline text { font-size: 12px; fill: var(--fg); }
svg.timeline text.dim, svg.timeline text.axis { fill: var(--dim); font-size: 11px; }
svg.timeline text.attempt { font-weight: 700; }
svg.timeline text.bad { fill: var(--failed); }
svg.timeline text.duration { font-weight: 600; }
svg.timeline line.grid { stroke: #e6eaef; }
svg.timeline line.axis { stroke: var(--dim); }
svg.timeline line.rule { stroke: var(--line); }
svg.timeline rect.band { fill: var(--band); }
svg.timeline g.row:hover rect.hover { fill: #eaeef2; }
svg.timeline rect.hover { fill: transparent; }
svg.timeline .phase-resolution { fill: var(--resolution); } svg.timeline .phase-rendering { fill: var(--rendering); }
svg.timeline .phase-admission { fill: var(--admission); } svg.timeline .phase-scheduling { fill: var(--scheduling); }
svg.timeline .phase-runtime { fill: var(--runtime); } svg.timeline .phase-progress { fill: var(--progress); }
svg.timeline .phase-completion { fill: var(--completion); }
svg.timeline text.label.phase-admission { font-weight: 700; }
svg.timeline rect.wait { stroke: var(--admission); stroke-width: 1; }
svg.timeline rect.stopped { fill: #ffffff; stroke: var(--completion); stroke-width: 1.5; stroke-dasharray: 4 3; }
svg.timeline rect.stripe { fill: var(--admission); }
svg.timeline rect.stripe-bg { fill: #fde8c4; }
svg.timeline path.ongoing { fill: var(--fg); }
svg.timeline .step-reserved { fill: var(--admission); }
svg.timeline circle.step-check { stroke: var(--admission); stroke-width: 1.5; fill: #ffffff; }
svg.timeline circle.step-check.ready { fill: var(--admission); }
svg.timeline path.step-released { stroke: var(--failed); stroke-width: 2; fill: none; }
svg.timeline .pending-queued { fill: #9ca3af; } svg.timeline .pending-quota { fill: #f59e0b; }
svg.timeline .pending-preemption { fill: #ea580c; } svg.timeline .pending-inadmissible { fill: #b91c1c; }
svg.timeline .pending-backoff { fill: #a16207; } svg.timeline .pending-admission-check { fill: #7c3aed; }
svg.timeline .pending-pod-creation { fill: #0ea5e9; } svg.timeline .pending-unschedulable { fill: #db2777; }
svg.timeline .pending-scheduling { fill: #c084fc; } svg.timeline .pending-image-pull { fill: #14b8a6; }
svg.timeline .pending-container-creation { fill: #84cc16; } svg.timeline .pending-unexplained { fill: #111827; }
table.pending td.reason { white-space: normal; overflow-wrap: anywhere; }
svg.timeline .ckpt-save { fill: #0e7490; } svg.timeline .ckpt-restore { fill: #7c3aed; }
svg.timeline .ckpt-save-open { fill: #ffffff; stroke: #0e7490; stroke-width: 1.5; }
svg.timeline .ledger-wasted-progress { fill: var(--failed); }
svg.timeline .ledger-infrastructure-recovery { fill: #ca8a04; }
table.ledger td.productive { color: var(--succeeded); font-weight: 600; }
table.ledger td.wasted-progress { color: var(--failed); font-weight: 600; }
table.ledger td.infrastructure-recovery { color: #a16207; font-weight: 600; }
table.ledger tr.total td { font-weight: 700; }
table.checkpoints td.uri { white-space: normal; overflow-wrap: anywhere; }
form.compare button { font: inherit; padding: 3px 14px; border-radius: 4px; border: 1px solid #0969da;
  background: #0969da; color: #fff; }
td.pick { text-align: center; }
table.compare caption { caption-side: bottom; text-align: left; color: var(--dim); padding-top: .3rem; }
table.compare td { white-space: normal; overflow-wrap: anywhere; min-width: 10rem; }
table.compare th { text-transform: none; letter-spacing: 0; font-size: 13px; color: var(--fg); }
table.compare tr.section th { background: #ffffff; color: var(--dim); font-size: 12px; text-transform: uppercase;
  padding-top: .8rem; }
table.compare td.mark, table.compare th.mark { width: 1.2rem; min-width: 1.2rem; text-align: center;
  font-weight: 700; color: #9a6700; }
table.compare tr.differs th, table.compare tr.differs td.mark { background: #fff8c5; }
div.curves { display: flex; flex-wrap: wrap; gap: .6rem 1rem; margin: .6rem 0; }
figure.curve { margin: 0; border: 1px solid var(--line); border-radius: 6px; padding: .3rem; }
svg.curve { display: block; font-family: system-ui, "DejaVu Sans", sans-serif; }
svg.curve text { font-size: 11px; fill: var(--dim); }
svg.curve text.metric { font-size: 12px; font-weight: 600; fill: var(--fg); }
svg.curve text.legend { fill: var(--fg); }
svg.curve rect.plot { fill: var(--band); stroke: var(--line); }
svg.curve polyline, svg.curve line { fill: none; stroke-width: 2; stroke-linejoin: round; }
svg.curve circle { stroke: none; }
svg.curve .curve-0 { stroke: #2563eb; } svg.curve circle.curve-0 { fill: #2563eb; }
svg.curve .curve-1 { stroke: #e8590c; } svg.curve circle.curve-1 { fill: #e8590c; }
svg.curve .curve-2 { stroke: #2f9e44; } svg.curve circle.curve-2 { fill: #2f9e44; }
svg.curve .curve-3 { stroke: #ae3ec9; } svg.curve circle.curve-3 { fill: #ae3ec9; }
svg.curve .curve-4 { stroke: #1098ad; } svg.curve circle.curve-4 { fill: #1098ad; }
svg.curve .curve-5 { stroke: #e03131; } svg.curve circle.curve-5 { fill: #e03131; }
svg.curve .curve-6 { stroke: #66a80f; } svg.curve circle.curve-6 { fill: #66a80f; }
svg.curve .curve-7 { stroke: #495057; } svg.curve circle.curve-7 { fill: #495057; }
"""
