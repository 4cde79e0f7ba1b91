"""`tracker audit`: the retries, resumes and lost GPU-time of the runs created in a time window, per namespace,
LocalQueue, ClusterQueue, workspace or project, worst first (most GPU-hours lost), and where their GPU-time and wall
time went (the goodput ledger).

A run counts in the window its creation time falls in (as ``tracker runs --since/--until`` selects), with all its
GPU-time (held up to ``--now`` for pods still holding GPUs): windows that do not overlap never count a run twice,
and the figures of a window are sums over its runs (schemas/gpu-accounting.md defines held and lost,
schemas/goodput.md the ledger's categories). A group's ledger is the sum of its runs' (a live run's open category
counted up to ``--now``): goodput is its productive GPU-hours over all its GPU-hours, ETTR its productive wall time
over its wall time, over the runs with progress events only (the others' ledger is the GPU accounting, which has
no wall time: ``runs_without_progress`` counts them).

Pure presentation and arithmetic on the rows of ``tracker.read.store`` (plain dicts), standard library only,
like ``tracker runs``.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from itertools import pairwise
from typing import Any

from tracker.core.vocab import (
    EVICTION_NOT_OBSERVED,
    FINAL_STATUSES,
    LOST_REASONS,
    RAYJOB_RETRY,
    is_deactivation,
)
from tracker.core.waits import PENDING_CATEGORIES, pending_by_category
from tracker.read.filters import time_text
from tracker.read.runs import (
    GOODPUT_CATEGORIES,
    PRODUCTIVE,
    Column,
    render_table,
    row_ledger,
    runs_data,
    share_text,
)
from tracker.read.store import Run, parse_time

# --by: the run field each grouping reads
GROUP_BY = {"namespace": "namespace", "queue": "queue", "cluster-queue": "cluster_queue", "workspace": "workspace",
            "project": "project"}
OUTPUTS = ("table", "json", "csv")
# the run fields the audit reads
FIELDS = ("run_id", "namespace", "queue", "cluster_queue", "workspace", "project", "status", "reason", "attempts",
          "retries", "evictions", "evictions_by", "resume_of", "gpu_hours", "lost_gpu_hours", "lost_gpu_hours_by",
          "gpus_open", "open_since", "pending_s_by", "pending_category", "pending_since", "ledger_basis",
          "ledger_gpu_hours_by", "ledger_wall_s_by", "ledger_until", "ledger_open")
NOT_OBSERVED = EVICTION_NOT_OBSERVED  # evictions Kueue counted whose reason the tracker did not see
# attempt triggers that are not evictions (a RayJob retry, a re-admission after a relist; tracker.core.derive's rule,
# which TaugridGpuAudit in schemas/kusto/050-functions.kql follows too)
NOT_EVICTIONS = (RAYJOB_RETRY, EVICTION_NOT_OBSERVED)


def eviction_reasons(run: Mapping[str, Any], attempts: Sequence[tuple[str, str | None]]) -> dict[str, int]:
    """A run's evictions by reason, summing to its ``evictions``: the ``evictions_by`` the reducer stored
    (``tracker.core.derive``). A row of an index written before schema 9 has none (None): for it only, they are
    derived from its ``attempts`` rows, (trigger, end_reason) in order, by the reducer's rule."""
    stored = run.get("evictions_by")
    if stored is not None:
        return dict(stored)
    out: dict[str, int] = {}
    for (_, end_reason), (trigger, _) in pairwise(attempts):
        if trigger not in NOT_EVICTIONS:
            out[end_reason or trigger] = out.get(end_reason or trigger, 0) + 1
    final = run.get("reason")
    if attempts and run.get("status") in FINAL_STATUSES and isinstance(final, str) and attempts[-1][1] == final \
            and is_deactivation(final):
        out[final] = out.get(final, 0) + 1
    missing = int(run.get("evictions") or 0) - sum(out.values())
    if missing > 0:
        out[NOT_OBSERVED] = out.get(NOT_OBSERVED, 0) + missing
    return dict(sorted(out.items()))


class _Group:
    __slots__ = ("attempts", "evictions", "held", "key", "ledger", "lost", "lost_by", "pending", "progress", "resumes",
                 "retries", "runs", "wall", "worst")

    def __init__(self, key: str | None) -> None:
        self.key = key
        self.runs = self.attempts = self.retries = self.resumes = self.progress = 0
        self.ledger = dict.fromkeys(GOODPUT_CATEGORIES, 0.0)  # GPU-hours by category (schemas/goodput.md)
        self.wall = dict.fromkeys(GOODPUT_CATEGORIES, 0.0)  # seconds by category, of the runs with progress events
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
        led = row_ledger(run, now)
        for cat, hours in led.gpu_hours_by.items():
            self.ledger[cat] = self.ledger.get(cat, 0.0) + hours
        if run.get("ledger_basis") == "progress":
            self.progress += 1
            for cat, seconds in led.wall_s_by.items():
                self.wall[cat] = self.wall.get(cat, 0.0) + seconds
        if lost > 0 and (self.worst is None or (-lost, run["run_id"]) < (-self.worst[0], self.worst[1])):
            self.worst = (lost, str(run["run_id"]))

    def data(self, field: str) -> dict[str, Any]:
        ledger_held, wall = sum(self.ledger.values()), sum(self.wall.values())
        return {
            field: self.key, "runs": self.runs, "attempts": self.attempts, "evictions": sum(self.evictions.values()),
            "evictions_by": dict(sorted(self.evictions.items())), "pod_retries": self.retries,
            "resumes": self.resumes, "gpu_hours": self.held, "lost_gpu_hours": self.lost,
            "lost_gpu_hours_by": {k: self.lost_by[k] for k in _lost_order(self.lost_by)},
            "goodput": None if ledger_held <= 0 else self.ledger[PRODUCTIVE] / ledger_held,
            "ettr": None if wall <= 0 else self.wall[PRODUCTIVE] / wall,
            "runs_with_progress": self.progress, "runs_without_progress": self.runs - self.progress,
            "ledger_gpu_hours_by": dict(self.ledger), "badput_gpu_hours": ledger_held - self.ledger[PRODUCTIVE],
            "ledger_wall_s_by": dict(self.wall),
            "worst_run": self.worst[1] if self.worst else None,
            "worst_run_lost_gpu_hours": self.worst[0] if self.worst else 0.0,
            "pending_s": sum(self.pending.values()), "pending_s_by": dict(self.pending),
        }


def _lost_order(by: Iterable[str]) -> list[str]:
    return sorted(by, key=lambda k: (LOST_REASONS.index(k) if k in LOST_REASONS else len(LOST_REASONS), k))


def audit(runs: Sequence[Run], attempts: Mapping[str, Sequence[tuple[str, str | None]]], *, by: str,
          now: datetime) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The groups, worst first (most GPU-hours lost, then most held, then by name), and the total over them.
    ``attempts``: the attempts of the runs without ``evictions_by`` (``eviction_reasons``), by run id."""
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
    """One row per group; the GPU-hours lost per reason (every reason), the evictions per reason (those seen), the
    pending seconds and the ledger's GPU-hours and wall seconds per category (every category)."""
    evictions = sorted({r for g in groups for r in g["evictions_by"]})
    head = [field, "runs", "attempts", "evictions", "pod_retries", "resumes", "gpu_hours",
            "lost_gpu_hours", "goodput", *(f"lost_gpu_hours_{r}" for r in LOST_REASONS),
            *(f"evictions_{r}" for r in evictions), "worst_run", "worst_run_lost_gpu_hours", "pending_s",
            *(f"pending_s_{c}" for c in PENDING_CATEGORIES), "ettr", "runs_with_progress", "runs_without_progress",
            "badput_gpu_hours", *(f"ledger_gpu_hours_{c}" for c in GOODPUT_CATEGORIES),
            *(f"ledger_wall_s_{c}" for c in GOODPUT_CATEGORIES)]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    for g in groups:
        w.writerow([_cell(g[field] or ""), g["runs"], g["attempts"], g["evictions"], g["pod_retries"], g["resumes"],
                    g["gpu_hours"], g["lost_gpu_hours"], "" if g["goodput"] is None else g["goodput"],
                    *(g["lost_gpu_hours_by"].get(r, 0.0) for r in LOST_REASONS),
                    *(g["evictions_by"].get(r, 0) for r in evictions), _cell(g["worst_run"] or ""),
                    g["worst_run_lost_gpu_hours"], g["pending_s"], *(g["pending_s_by"][c] for c in PENDING_CATEGORIES),
                    "" if g["ettr"] is None else g["ettr"], g["runs_with_progress"], g["runs_without_progress"],
                    g["badput_gpu_hours"], *(g["ledger_gpu_hours_by"][c] for c in GOODPUT_CATEGORIES),
                    *(g["ledger_wall_s_by"][c] for c in GOODPUT_CATEGORIES)])
    return buf.getvalue()


# a spreadsheet reads a cell that starts with one of these as a formula (CSV injection): such a text cell (a group
# name, a run id: texts from labels and intake events) is written with a leading apostrophe, which it shows as text
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(text: str) -> str:
    """A text cell safe in a spreadsheet: a formula's start made text; a carriage return a new line (the writer
    quotes a cell with a new line, not one with a lone carriage return, which would end the row)."""
    text = "'" + text if text.startswith(_FORMULA_START) else text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _hours(value: float) -> str:
    return f"{value:.1f}" if value >= 0.05 or value == 0 else "<0.1"


def _share(value: float | None) -> str:
    return share_text(value)


# the ledger table's column of each category (schemas/goodput.md), GPU-hours
LEDGER_HEADERS = {"productive": "PROD", "scheduling": "SCHED", "startup": "START", "checkpoint-save": "SAVE",
                  "checkpoint-restore": "RESTORE", "wasted-progress": "WASTED", "infrastructure-recovery": "RECOVERY",
                  "unclassified": "OTHER"}


def _ledger_hours(category: str) -> Callable[[Run], str]:
    return lambda r: _hours(r.data["ledger_gpu_hours_by"][category])


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
    # the ledger: ETTR over the runs with progress events (PROG of RUNS), GPU-hours by category (those with any)
    shown = [c for c in GOODPUT_CATEGORIES if c == PRODUCTIVE or total["ledger_gpu_hours_by"][c] > 0]
    ledger = [
        Column(by.upper(), lambda r: str(r.data[field] or "-"), 9, shrink_first=True),
        Column("PROG", lambda r: f"{r.data['runs_with_progress']}/{r.data['runs']}", right=True),
        Column("ETTR", lambda r: _share(r.data["ettr"]), right=True),
        *(Column(LEDGER_HEADERS.get(c, c.upper()), _ledger_hours(c), right=True) for c in shown),
    ]
    return (render_table(rows, cols, width=width) + "\nGoodput ledger, GPU-hours (ETTR of the PROG runs with progress "
            "events):\n" + render_table(rows, ledger, width=width))
