"""`tracker compare`: runs side by side, what one asks of two runs of an experiment: where each came from
(commit, config, inputs; what ran: images, entrypoint, each hyperparameter that differs), how it went (attempts,
evictions and retries with their reasons, admission waits, time in each phase, the nodes its pods ran on with the
pods that failed or were evicted there) and what it reached (each metric's first, latest, min and max).

Pure: histories in, JSON-ready data or a rich table out (rich is imported by ``compare_table`` only). Nothing here
reads the clock: the time a live run has spent in its current phase is counted up to the ``now`` the caller gives.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tracker.core.model import FINAL_STATUSES, Phase, RunHistory
from tracker.core.waits import GROWING
from tracker.read.nodeinfo import NodeInfo, gpu_models, note
from tracker.read.pods import EVICTED, FAILED, node_groups, pod_outcomes, run_nodes
from tracker.read.render import attempt_pending, attempt_wait, cut, human_duration, param_text

if TYPE_CHECKING:  # rich is imported by compare_table only: `compare -o json` and yaml do without it
    from rich.table import Table


def _utc(dt: datetime) -> datetime:
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def _num(value: float) -> float | None:
    return value if math.isfinite(value) else None


def phase_durations(history: RunHistory, now: datetime | None) -> dict[str, float]:
    """Seconds spent in each phase, over every attempt: from each transition to the next; a live run's last
    phase up to ``now`` (not counted without one). A run's final Completion has no duration."""
    out: dict[str, float] = {}
    trs = history.transitions
    live = history.run.status not in FINAL_STATUSES
    for i, t in enumerate(trs):
        if i + 1 < len(trs):
            end = trs[i + 1].at
        elif live and now is not None:
            end = now
        else:
            continue
        seconds = max(0.0, (_utc(end) - _utc(t.at)).total_seconds())
        out[t.phase.value] = out.get(t.phase.value, 0.0) + seconds
    return {p.value: out[p.value] for p in Phase if p.value in out}


def compare_data(histories: Sequence[RunHistory], now: datetime | None,
                 resumed_by: Mapping[str, Sequence[str]] | None = None,
                 nodes: Mapping[str, NodeInfo] | None = None) -> dict[str, Any]:
    """JSON-ready comparison: one object per run, in the order given. ``resumed_by``: the runs that resume each
    (``IndexReader.resumed_by``), so that lineage reads both ways; ``nodes``: what the index knows of the nodes
    (``tracker.read.nodeinfo.node_info``: GPU model and count, conditions)."""
    runs = []
    infos = nodes or {}
    for h in histories:
        used = run_nodes(h)
        r = h.run
        waits = [attempt_wait(a, r, now) for a in h.attempts]
        pending = [attempt_pending(a, now) for a in h.attempts]
        attempts = [{
            "attempt": a.attempt, "trigger": a.trigger, "cluster_queue": a.cluster_queue,
            "admission_wait_s": w.seconds, "admission_wait_growing": w.growing,
            "pending_s_by": p, "end_reason": a.end_reason, "end_message": a.end_message,
            "underlying_cause": a.underlying_cause, "retries": a.retries,
            "failures": [{"pod": f.pod, "reason": f.reason, "exit_code": f.exit_code, "message": f.message}
                         for f in a.failures],
            "failed_pods": max(a.failed_pods, len(a.failures)),
        } for a, w, p in zip(h.attempts, waits, pending, strict=True)]
        runs.append({
            "run_id": r.run_id, "kind": r.kind, "namespace": r.namespace, "name": r.name,
            "status": r.status.value, "reason": r.reason, "phase": r.phase.value,
            "provenance": {"project": r.project, "workspace": r.workspace, "target": r.target,
                           "git_commit": r.git_commit, "config_digest": r.config_digest, "config_ref": r.config_ref,
                           "input_refs": list(r.input_refs), "output_uri": r.output_uri, "resume_of": r.resume_of,
                           "resumed_by": list((resumed_by or {}).get(r.run_id, ())),
                           "queue": r.queue, "cluster_queue": r.cluster_queue,
                           "images": list(r.images), "entrypoint": r.entrypoint,
                           "hyperparameters": dict(r.hyperparameters),
                           "hyperparameters_omitted": r.hyperparameters_omitted},
            "attempts": r.attempts, "retries": r.retries, "evictions": r.evictions,
            "evicted_by": [a.trigger for a in h.attempts[1:]],
            "admission_waits_s": [w.seconds for w in waits],  # a wait still growing: up to now
            "admission_wait_growing": any(w.growing for w in waits),
            "pending_s_by": _pending_sum(pending),
            "attempt_details": attempts,
            "nodes": used,  # where its pods ran, each node once (tracker.read.pods)
            "gpu_models": gpu_models(used, infos),  # their GPU models (the index's Nodes), '-' when not known
            "node_notes": {n: t for n in used if (t := note(infos.get(n)))},
            "pods_by_node": [g._asdict() for g in node_groups(pod_outcomes(h))],
            "phase_durations_s": phase_durations(h, now),
            "metrics": {m.metric: {"first": _num(m.first_value), "first_step": m.first_step,
                                   "latest": _num(m.latest_value), "latest_step": m.latest_step,
                                   "min": _num(m.min_value), "max": _num(m.max_value), "points": m.points}
                        for m in h.metrics},
        })
    return {"runs": runs}


def _pending_sum(parts: Iterable[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out.get(k, 0.0) + v
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


ENTRYPOINT_SHOWN = 60  # characters of an entrypoint in the comparison (its JSON has it whole)
DIFFERS = "*"  # the mark of a row whose values differ between the runs compared


def compare_rows(data: dict[str, Any]) -> list[tuple[str, list[str] | None]]:
    """The comparison's rows, as ``compare_table`` and the web view's compare page show them: (label, one value per
    run), or (title, None) for a section's heading."""
    runs: list[dict[str, Any]] = data["runs"]
    out: list[tuple[str, list[str] | None]] = []

    def row(label: str, values: list[str]) -> None:
        out.append((label, values))

    def section(title: str) -> None:
        out.append((title, None))

    section("provenance")
    row("workload", [f"{r['kind'] or '?'} {r['namespace'] or '?'}/{r['name'] or '?'}" for r in runs])
    for key, label in (("project", "project"), ("workspace", "workspace"), ("target", "target"),
                       ("queue", "queue"), ("cluster_queue", "ClusterQueue"), ("git_commit", "git commit"),
                       ("config_digest", "config digest"), ("config_ref", "config ref"),
                       ("output_uri", "output"), ("resume_of", "resume of")):
        row(label, [str(r["provenance"][key] or "-") for r in runs])
    row("resumed by", [", ".join(r["provenance"]["resumed_by"]) or "-" for r in runs])
    row("inputs", [", ".join(r["provenance"]["input_refs"]) or "-" for r in runs])
    row("images", [", ".join(r["provenance"].get("images", ())) or "-" for r in runs])
    row("entrypoint", [cut(r["provenance"].get("entrypoint") or "-", ENTRYPOINT_SHOWN) for r in runs])
    params = [r["provenance"].get("hyperparameters") or {} for r in runs]
    for key in sorted({k for p in params for k in p}):  # each hyperparameter that differs (the same ones: not shown)
        values = [param_text(p[key]) if key in p else "-" for p in params]
        if differs(values):
            row(f"hp {key}", values)
    section("outcome")
    row("status", [r["status"] + (f" ({r['reason']})" if r["reason"] else "") for r in runs])
    row("phase", [r["phase"] for r in runs])
    row("attempts", [str(r["attempts"]) for r in runs])
    row("evictions", [str(r["evictions"]) + (f": {', '.join(r['evicted_by'])}" if r["evicted_by"] else "")
                      for r in runs])
    row("retries", [str(r["retries"]) + _failures(r) for r in runs])
    row("admission waits", [", ".join(human_duration(w) for w in r["admission_waits_s"])
                            + (GROWING if r["admission_wait_growing"] else "") or "-" for r in runs])
    row("pending by reason", [", ".join(f"{k} {human_duration(v)}" for k, v in r["pending_s_by"].items()) or "-"
                              for r in runs])
    row("attempt ends", [", ".join(f"{a['attempt']}: {a['end_reason']}"
                                   + (f" ({a['underlying_cause']})" if a["underlying_cause"] else "")
                                   for a in r["attempt_details"] if a["end_reason"]) or "-" for r in runs])
    row("nodes", [_nodes(r) for r in runs])
    row("GPU model", [r.get("gpu_models", "-") for r in runs])
    section("time in phase")
    for phase in Phase:
        if any(phase.value in r["phase_durations_s"] for r in runs):
            row(phase.value, [human_duration(r["phase_durations_s"].get(phase.value)) for r in runs])
    names = sorted({m for r in runs for m in r["metrics"]})
    if names:
        section("metrics")
    for name in names:
        values = []
        for r in runs:
            m = r["metrics"].get(name)
            values.append("-" if m is None else f"{_fmt(m['first'])} → {_fmt(m['latest'])} @{m['latest_step']} "
                                                f"(min {_fmt(m['min'])}, max {_fmt(m['max'])})")
        row(name, values)
    return out


def differs(values: Sequence[str]) -> bool:
    """Whether a row's values differ between the runs (its ``DIFFERS`` mark)."""
    return len(set(values)) > 1


def compare_table(data: dict[str, Any]) -> Table:
    """One column per run, one row per property (``compare_rows``); rows whose values differ between runs are
    marked in a column of their own (``DIFFERS``, as ``diff`` marks lines: it shows in piped output and to a reader
    without colour), and their labels in colour."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    runs: list[dict[str, Any]] = data["runs"]
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, show_edge=False,
                  caption=f"{DIFFERS} the runs differ", caption_justify="left")
    table.add_column("", no_wrap=True, width=1)
    table.add_column("", style="bold", no_wrap=True)
    for r in runs:
        table.add_column(r["run_id"], overflow="fold")
    for label, values in compare_rows(data):
        if values is None:
            table.add_row("", Text(label, style="dim"), *("" for _ in runs))
            continue
        mark = differs(values)
        table.add_row(DIFFERS if mark else "", Text(label, style="bold yellow" if mark else "bold"),
                      *(Text(v) for v in values))
    return table


def _failures(r: dict[str, Any]) -> str:
    reasons: dict[str, int] = {}
    for a in r["attempt_details"]:
        for f in a["failures"]:
            reasons[f["reason"]] = reasons.get(f["reason"], 0) + 1
    return (": " + ", ".join(f"{k} x{n}" if n > 1 else k for k, n in reasons.items())) if reasons else ""


def _nodes(r: dict[str, Any]) -> str:
    """The nodes the run's pods ran on, each with its failed and evicted pods: 'node-a (3 failed), node-b'."""
    bad: dict[str, list[str]] = {}
    for g in r["pods_by_node"]:
        if g["outcome"] in (FAILED, EVICTED):
            bad.setdefault(g["node"], []).append(f"{g['pods']} {g['outcome']}")
    return ", ".join(n + (f" ({', '.join(bad[n])})" if n in bad else "") for n in r["nodes"]) or "-"
