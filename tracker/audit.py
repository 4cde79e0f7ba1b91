"""`tracker audit`: the retries, resumes and lost GPU-time of the runs created in a time window, per namespace,
LocalQueue, ClusterQueue, workspace or project, worst first (most GPU-hours lost).

A run counts in the window its creation time falls in (as ``tracker runs --since/--until`` selects), with all its
GPU-time (held up to ``--now`` for pods still holding GPUs): windows that do not overlap never count a run twice,
and the figures of a window are sums over its runs (schemas/gpu-accounting.md defines held, lost and goodput).

Pure presentation and arithmetic on the rows of ``tracker.shell.index_query`` (plain dicts), standard library only,
like ``tracker runs``.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from itertools import pairwise
from typing import Any

from tracker.core.waits import PENDING_CATEGORIES, pending_by_category
from tracker.runs_view import Column, render_table, runs_data
from tracker.shell.index_query import Run, parse_time, time_text

# --by: the run field each grouping reads
GROUP_BY = {"namespace": "namespace", "queue": "queue", "cluster-queue": "cluster_queue", "workspace": "workspace",
            "project": "project"}
OUTPUTS = ("table", "json", "csv")
# the run fields the audit reads
FIELDS = ("run_id", "namespace", "queue", "cluster_queue", "workspace", "project", "status", "reason", "attempts",
          "retries", "evictions", "resume_of", "gpu_hours", "lost_gpu_hours", "lost_gpu_hours_by", "gpus_open",
          "open_since", "pending_s_by", "pending_category", "pending_since")
# tracker.core.gpu.LOST_REASONS (not imported: this module starts without pydantic; a test checks they agree)
LOST_REASONS = ("PodFailure", "PodEvicted", "Preempted", "PodsReadyTimeout", "Evicted", "RayJobRetry", "RunFailed")
# attempt triggers that are not evictions (tracker.core.derive_attempts), and the prefixes of a deactivation
_NOT_EVICTIONS = ("RayJobRetry", "EvictionNotObserved")
_DEACTIVATIONS = ("InactiveWorkload", "Deactivated")
NOT_OBSERVED = "EvictionNotObserved"  # evictions Kueue counted whose reason the tracker did not see
_FINAL = ("succeeded", "failed", "stopped")


def eviction_reasons(run: Mapping[str, Any], attempts: Sequence[tuple[str, str | None]]) -> dict[str, int]:
    """A run's evictions by reason, summing to its ``evictions`` as the reducer counts them: each attempt ended by
    a Kueue eviction that the next attempt re-queued (its reason: how the attempt ended, else the next one's
    trigger), a final deactivation, and what Kueue counted beyond those (``EvictionNotObserved``)."""
    out: dict[str, int] = {}
    for (_, end_reason), (trigger, _) in pairwise(attempts):
        if trigger not in _NOT_EVICTIONS:
            why = end_reason or trigger
            out[why] = out.get(why, 0) + 1
    final = run.get("reason")
    if attempts and run.get("status") in _FINAL and isinstance(final, str) and attempts[-1][1] == final \
            and final.startswith(_DEACTIVATIONS):
        out[final] = out.get(final, 0) + 1
    missing = int(run.get("evictions") or 0) - sum(out.values())
    if missing > 0:
        out[NOT_OBSERVED] = out.get(NOT_OBSERVED, 0) + missing
    return dict(sorted(out.items()))


class _Group:
    __slots__ = ("attempts", "evictions", "held", "key", "lost", "lost_by", "pending", "resumes", "retries", "runs",
                 "worst")

    def __init__(self, key: str | None) -> None:
        self.key = key
        self.runs = self.attempts = self.retries = self.resumes = 0
        self.evictions: dict[str, int] = {}
        self.held = self.lost = 0.0
        self.lost_by: dict[str, float] = {}
        self.pending = dict.fromkeys(PENDING_CATEGORIES, 0.0)  # seconds by category (schemas/pending.md)
        self.worst: tuple[float, str] | None = None  # (lost GPU-hours, run id) of the run that lost the most

    def add(self, run: Mapping[str, Any], evictions: Mapping[str, int], now: datetime) -> None:
        self.runs += 1
        self.attempts += int(run["attempts"])
        self.retries += int(run["retries"])
        self.resumes += 1 if run.get("resume_of") else 0
        for reason, n in evictions.items():
            self.evictions[reason] = self.evictions.get(reason, 0) + n
        lost = float(run.get("lost_gpu_hours") or 0.0)
        self.held += float(run.get("gpu_hours") or 0.0)
        self.lost += lost
        for reason, hours in (run.get("lost_gpu_hours_by") or {}).items():
            self.lost_by[reason] = self.lost_by.get(reason, 0.0) + float(hours)
        since = run.get("pending_since")
        for cat, seconds in pending_by_category(run.get("pending_s_by") or {}, run.get("pending_category"),
                                                None if since is None else parse_time(since), now).items():
            self.pending[cat] = self.pending.get(cat, 0.0) + seconds
        if lost > 0 and (self.worst is None or (-lost, run["run_id"]) < (-self.worst[0], self.worst[1])):
            self.worst = (lost, str(run["run_id"]))

    def data(self, field: str) -> dict[str, Any]:
        return {
            field: self.key, "runs": self.runs, "attempts": self.attempts, "evictions": sum(self.evictions.values()),
            "evictions_by": dict(sorted(self.evictions.items())), "pod_retries": self.retries,
            "resumes": self.resumes, "gpu_hours": self.held, "lost_gpu_hours": self.lost,
            "lost_gpu_hours_by": {k: self.lost_by[k] for k in _lost_order(self.lost_by)},
            "goodput": None if self.held <= 0 else 1 - self.lost / self.held,
            "worst_run": self.worst[1] if self.worst else None,
            "worst_run_lost_gpu_hours": self.worst[0] if self.worst else 0.0,
            "pending_s": sum(self.pending.values()), "pending_s_by": dict(self.pending),
        }


def _lost_order(by: Iterable[str]) -> list[str]:
    return sorted(by, key=lambda k: (LOST_REASONS.index(k) if k in LOST_REASONS else len(LOST_REASONS), k))


def audit(runs: Sequence[Run], attempts: Mapping[str, Sequence[tuple[str, str | None]]], *, by: str,
          now: datetime) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The groups, worst first (most GPU-hours lost, then most held, then by name), and the total over them."""
    field = GROUP_BY[by]
    groups: dict[str | None, _Group] = {}
    total = _Group(None)
    for data in runs_data(runs, now):
        evictions = eviction_reasons(data, attempts.get(str(data["run_id"]), ()))
        key = data.get(field)
        groups.setdefault(key, _Group(key)).add(data, evictions, now)
        total.add(data, evictions, now)
    ordered = sorted(groups.values(), key=lambda g: (-g.lost, -g.held, g.key is None, g.key or ""))
    return [g.data(field) for g in ordered], total.data(field)


# ------------------------------------------------------------------------------------------ outputs


def render(groups: Sequence[dict[str, Any]], total: dict[str, Any], *, by: str, output: str,
           window: Mapping[str, datetime | None], width: int | None) -> str:
    field = GROUP_BY[by]
    if output == "json":
        return json.dumps({"by": by, **{k: None if v is None else time_text(v) for k, v in window.items()},
                           "groups": list(groups), "total": {k: v for k, v in total.items() if k != field}},
                          indent=2) + "\n"
    if output == "csv":
        return _csv(groups, field)
    return _table(groups, total, by, field, width)


def _csv(groups: Sequence[dict[str, Any]], field: str) -> str:
    """One row per group; the GPU-hours lost per reason (every reason) and the evictions per reason (those seen)."""
    evictions = sorted({r for g in groups for r in g["evictions_by"]})
    head = [field, "runs", "attempts", "evictions", "pod_retries", "resumes", "gpu_hours",
            "lost_gpu_hours", "goodput", *(f"lost_gpu_hours_{r}" for r in LOST_REASONS),
            *(f"evictions_{r}" for r in evictions), "worst_run", "worst_run_lost_gpu_hours", "pending_s",
            *(f"pending_s_{c}" for c in PENDING_CATEGORIES)]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    for g in groups:
        w.writerow([g[field] or "", g["runs"], g["attempts"], g["evictions"], g["pod_retries"], g["resumes"],
                    g["gpu_hours"], g["lost_gpu_hours"], "" if g["goodput"] is None else g["goodput"],
                    *(g["lost_gpu_hours_by"].get(r, 0.0) for r in LOST_REASONS),
                    *(g["evictions_by"].get(r, 0) for r in evictions), g["worst_run"] or "",
                    g["worst_run_lost_gpu_hours"], g["pending_s"], *(g["pending_s_by"][c] for c in PENDING_CATEGORIES)])
    return buf.getvalue()


def _hours(value: float) -> str:
    return f"{value:.1f}" if value >= 0.05 or value == 0 else "<0.1"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _table(groups: Sequence[dict[str, Any]], total: dict[str, Any], by: str, field: str, width: int | None) -> str:
    rows = [Run(g, None) for g in groups] + [Run({**total, field: "TOTAL"}, None)]
    cols = [
        Column(by.upper(), lambda r: str(r.data[field] or "-"), 9, shrink_first=True),
        Column("RUNS", lambda r: str(r.data["runs"]), right=True),
        Column("ATT", lambda r: str(r.data["attempts"]), right=True),
        Column("EVICT", lambda r: str(r.data["evictions"]), right=True),
        Column("RETRY", lambda r: str(r.data["pod_retries"]), right=True),
        Column("RESUME", lambda r: str(r.data["resumes"]), right=True),
        Column("GPU-H", lambda r: _hours(r.data["gpu_hours"]), right=True),
        Column("LOST-H", lambda r: _hours(r.data["lost_gpu_hours"]), right=True),
        Column("GOODPUT", lambda r: _share(r.data["goodput"]), right=True),
        Column("PEND-H", lambda r: _hours(r.data["pending_s"] / 3600), right=True),
    ]
    return render_table(rows, cols, width=width)

