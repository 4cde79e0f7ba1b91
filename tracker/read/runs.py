"""`tracker runs` output in kubectl's manner: a plain table (fitted to a width, or unpadded when piped), the wide
table, one run id per line, JSON and YAML.

Pure presentation on the rows of ``tracker.read.store`` (plain dicts), standard library only, so listing
runs starts fast. Durations follow kubectl's ``AGE`` format (``95s``, ``5m30s``, ``45m``, ``3h5m``, ``30h``,
``6d2h``, ``90d``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from tracker.core.vocab import GOODPUT_CATEGORIES as GOODPUT_CATEGORIES  # re-exported
from tracker.core.vocab import GoodputCategory
from tracker.core.waits import GROWING, Wait, admission_wait, open_seconds
from tracker.read.store import Run, parse_time

OUTPUTS = ("table", "wide", "json", "yaml", "name")
# The run fields each output reads (json and yaml: all of them).
FIELDS: dict[str, tuple[str, ...]] = {
    "table": ("run_id", "namespace", "status", "phase", "attempts", "evictions", "admission_wait_s", "reason",
              "created_at", "queued_at", "admitted_at"),
    "wide": ("run_id", "kind", "namespace", "name", "status", "phase", "attempts", "retries", "evictions", "queue",
             "cluster_queue", "project", "workspace", "created_at", "admission_wait_s", "reason", "message",
             "pending_message", "queued_at", "admitted_at", "pending_category", "ledger_basis", "ledger_wall_s_by",
             "ledger_until", "ledger_open", "ettr"),
    "name": ("run_id",),
}
GAP = "  "
ELLIPSIS = "…"
PRODUCTIVE = GoodputCategory.PRODUCTIVE.value


def kube_duration(seconds: float | None) -> str:
    """kubectl's human duration (k8s.io/apimachinery/pkg/util/duration.HumanDuration); '-' for None."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if int(seconds) < -1:
        return "<invalid>"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" + (f"{s % 60}s" if s % 60 else "")
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" + (f"{minutes % 60}m" if minutes % 60 else "")
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if days < 8:
        return f"{days}d" + (f"{hours % 24}h" if hours % 24 else "")
    if days < 365 * 2:
        return f"{days}d"
    years = days // 365
    if years < 8:
        return f"{years}y" + (f"{days % 365}d" if days % 365 else "")
    return f"{years}y"


def display_status(data: dict[str, Any]) -> str:
    """One word in the way of a pod's STATUS: the outcome of a finished run, ``Running`` once the application
    started, else the phase the run waits in (Admission, Scheduling, Runtime, ...)."""
    status = str(data["status"])
    if status == "pending":
        return str(data["phase"])
    return status.capitalize()


def wait_text(data: dict[str, Any], now: datetime | None) -> str:
    """The admission WAIT: the recorded one, or while the run still waits ``now - queued_at`` marked ``+``."""
    wait = live_wait(data, now)
    return kube_duration(wait.seconds) + (GROWING if wait.growing else "")


def live_wait(data: dict[str, Any], now: datetime | None) -> Wait:
    """``tracker.core.waits.admission_wait`` of a row (a ``Wait``)."""
    return admission_wait(str(data.get("status")), parse_time(data.get("queued_at")),
                          parse_time(data.get("admitted_at")), data.get("admission_wait_s"), now)


class LedgerAt(NamedTuple):
    """A run's (or attempt's) goodput ledger read at a time (schemas/goodput.md)."""

    gpu_hours_by: dict[str, float]  # GPU-hours by category, the open pods' up to ``now``, in GOODPUT_CATEGORIES order
    wall_s_by: dict[str, float]  # seconds by category, the time since ``ledger_until`` up to ``now`` (basis progress)
    ettr: float | None  # productive wall time over the wall time (None: basis accounting, or no time)
    goodput: float | None  # productive GPU-time over the GPU-time held (None: nothing held)
    gpu_growing: str | None  # the category whose GPU-time is counted up to ``now`` (GPUs still held), else None
    wall_growing: str | None  # the category whose wall time is counted up to ``now`` (the run goes on), else None

    def gpu_mark(self, category: str | None = None) -> str:
        """``+`` when the GPU-time (of ``category``; else any) grows up to ``now``, else ''."""
        return GROWING if self.gpu_growing and category in (None, self.gpu_growing) else ""

    def wall_mark(self, category: str | None = None) -> str:
        """``+`` when the wall time (of ``category``; else any) grows up to ``now``, else ''."""
        return GROWING if self.wall_growing and category in (None, self.wall_growing) else ""

    @property
    def held(self) -> float:
        return sum(self.gpu_hours_by.values())

    @property
    def wall(self) -> float:
        return sum(self.wall_s_by.values())


def ledger_at(basis: str | None, gpu_hours_by: Mapping[str, float], wall_s_by: Mapping[str, float],
              until: datetime | None, open_category: str | None, gpus_open: int, now: datetime | None) -> LedgerAt:
    """The ledger at ``now``: while the run goes on (``open_category`` set) the ``gpus_open`` GPUs' time from
    ``until`` to ``now`` goes to ``open_category``, and so does the wall time (basis ``progress``: the accounting's
    ledger has no wall time); ETTR and goodput from those sums."""
    gpu = {k: float(v) for k, v in gpu_hours_by.items()}
    wall = {k: float(v) for k, v in wall_s_by.items()}
    gpu_growing = wall_growing = None
    if open_category and until is not None and now is not None:
        seconds = open_seconds(until, now)
        if gpus_open:
            gpu[open_category] = gpu.get(open_category, 0.0) + gpus_open * seconds / 3600
            gpu_growing = open_category
        if basis == "progress":
            wall[open_category] = wall.get(open_category, 0.0) + seconds
            wall_growing = open_category
    held, total = sum(gpu.values()), sum(wall.values())
    return LedgerAt(_ordered(gpu), _ordered(wall),
                    wall.get(PRODUCTIVE, 0.0) / total if basis == "progress" and total > 0 else None,
                    gpu.get(PRODUCTIVE, 0.0) / held if held > 0 else None, gpu_growing, wall_growing)


def _ordered(by: dict[str, float]) -> dict[str, float]:
    rank = {c: i for i, c in enumerate(GOODPUT_CATEGORIES)}
    return {k: by[k] for k in sorted(by, key=lambda k: (rank.get(k, len(rank)), k))}


def row_ledger(data: Mapping[str, Any], now: datetime | None) -> LedgerAt:
    """``ledger_at`` of a row (the RunRecord fields, as ``IndexReader.runs`` gives them)."""
    return ledger_at(data.get("ledger_basis"), data.get("ledger_gpu_hours_by") or {},
                     data.get("ledger_wall_s_by") or {}, parse_time(data.get("ledger_until")),
                     data.get("ledger_open"), int(data.get("gpus_open") or 0), now)


def share_text(value: float | None) -> str:
    """A ratio as a percentage to a tenth (``37.7%``), '-' for None."""
    return "-" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


def age_seconds(run: Run, now: datetime) -> float | None:
    """How long the run has been in its current phase (since its last transition, else since it was created)."""
    since = parse_time(run.phase_since) or parse_time(run.data.get("created_at"))
    return None if since is None else (now - since).total_seconds()


# ------------------------------------------------------------------------------------------ table


class Column(NamedTuple):
    header: str
    cell: Callable[[Run], str]
    min_width: int = 0  # > 0: elastic, cut to no less than this to fit the width
    right: bool = False
    shrink_first: bool = False  # elastic columns marked so are cut before the others
    free_text: bool = False  # text from the cluster: runs of white space (new lines too) become one space


def _reason(run: Run) -> str:
    return str(run.data.get("reason") or "-")


def _message(run: Run) -> str:
    d = run.data
    return " ".join(str(d.get("message") or d.get("pending_message") or "-").split())


def _reason_why(run: Run) -> str:
    reason, message = run.data.get("reason"), run.data.get("message")
    return f"{reason}: {message}" if reason and message else str(reason or message or "-")


def columns(kind: str, now: datetime, *, short: dict[str, str], one_namespace: bool,
            why: bool = False) -> list[Column]:
    """The default (``table``) or ``wide`` columns. ``why``: the table's REASON has the message too (``--stuck``:
    the scheduler's or Kueue's words, cut to fit)."""
    def age(r: Run) -> str:
        return kube_duration(age_seconds(r, now))

    def wait(r: Run) -> str:
        return wait_text(r.data, now)

    def ettr(r: Run) -> str:  # at now: a live run's open stretch counts up to now, marked +
        led = row_ledger(r.data, now)
        return share_text(led.ettr) + (led.wall_mark() if led.ettr is not None else "")

    if kind == "table":
        namespace = [] if one_namespace else [Column("NAMESPACE", lambda r: str(r.data.get("namespace") or "-"),
                                                     9, shrink_first=True)]
        return [
            *namespace,
            Column("RUN", lambda r: short.get(r.run_id, r.run_id)),
            Column("STATUS", lambda r: display_status(r.data)),
            Column("ATT", lambda r: str(r.data["attempts"]), right=True),
            Column("EVICT", lambda r: str(r.data["evictions"]), right=True),
            Column("WAIT", wait, right=True),
            Column("AGE", age, right=True),
            Column("REASON", _reason_why if why else _reason, 12, free_text=True),
        ]
    return [
        Column("RUN", lambda r: r.run_id),
        Column("KIND", lambda r: str(r.data.get("kind") or "-")),
        Column("NAMESPACE", lambda r: str(r.data.get("namespace") or "-")),
        Column("NAME", lambda r: str(r.data.get("name") or "-")),
        Column("STATUS", lambda r: str(r.data["status"])),
        Column("PHASE", lambda r: str(r.data["phase"])),
        Column("ATT", lambda r: str(r.data["attempts"]), right=True),
        Column("RETRY", lambda r: str(r.data["retries"]), right=True),
        Column("EVICT", lambda r: str(r.data["evictions"]), right=True),
        Column("QUEUE", lambda r: str(r.data.get("queue") or "-")),
        Column("CLUSTER-QUEUE", lambda r: str(r.data.get("cluster_queue") or "-")),
        Column("PROJECT", lambda r: str(r.data.get("project") or "-")),
        Column("WORKSPACE", lambda r: str(r.data.get("workspace") or "-")),
        Column("CREATED", lambda r: _clock(r.data.get("created_at"))),
        Column("WAIT", wait, right=True),
        Column("AGE", age, right=True),
        Column("PENDING", lambda r: str(r.data.get("pending_category") or "-")),
        Column("ETTR", ettr, right=True),
        Column("REASON", _reason, free_text=True),
        Column("MESSAGE", _message, free_text=True),
    ]


def _clock(text: str | None) -> str:
    dt = parse_time(text)
    return "-" if dt is None else dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + ELLIPSIS


def render_table(runs: Sequence[Run], cols: Sequence[Column], *, width: int | None) -> str:
    """Aligned columns separated by two spaces, no trailing blanks. With a ``width``, the elastic columns are cut
    (those marked ``shrink_first`` first, then from the right, each to its minimum) until every line fits; without
    one nothing is cut."""
    values: list[list[str]] = []
    for c in cols:  # column by column: one function over every run
        f = c.cell
        column = [c.header, *(f(r) for r in runs)]
        if c.free_text:
            column = [" ".join(v.split()) for v in column]
        values.append(column)
    natural = [max(map(len, column)) for column in values]
    widths = list(natural)
    if width is not None:
        excess = sum(widths) + len(GAP) * (len(cols) - 1) - width
        order = sorted(reversed(range(len(cols))), key=lambda i: not cols[i].shrink_first)
        for i in order:
            if excess <= 0:
                break
            floor = max(cols[i].min_width, len(cols[i].header))
            if cols[i].min_width and widths[i] > floor:
                cut = min(excess, widths[i] - floor)
                widths[i] -= cut
                excess -= cut
    last = len(cols) - 1
    for i, (c, column) in enumerate(zip(cols, values, strict=True)):
        w = widths[i]
        if natural[i] > w:
            column = [_cut(v, w) if len(v) > w else v for v in column]
        if c.right:
            column = [v.rjust(w) for v in column]
        elif i != last:
            column = [v.ljust(w) for v in column]
        values[i] = column
    return "".join(GAP.join(parts).rstrip() + "\n" for parts in zip(*values, strict=True))


# ------------------------------------------------------------------------------------------ data


def runs_data(runs: Sequence[Run], now: datetime | None = None) -> list[dict[str, Any]]:
    """Every RunRecord field per run, as ``tracker.read.render.runs_json`` gives them; with ``now``, ``gpu_hours``
    counts the GPUs still held up to ``now`` (schemas/gpu-accounting.md)."""
    if now is None:
        return [r.data for r in runs]
    return [_held_to(r.data, now) for r in runs]


NOW_FIELDS = ("admission_wait_now_s", "admission_wait_growing", "pending_open_s")  # what runs_json reads at now


def runs_json(runs: Sequence[Run], now: datetime) -> list[dict[str, Any]]:
    """``runs_data`` at ``now`` plus what is read at ``now``: ``admission_wait_now_s`` (the recorded wait, or
    ``now - queued_at`` while the run still waits, then ``admission_wait_growing`` is true) and
    ``pending_open_s`` (the span still going on, ``pending_category`` since ``pending_since``, up to ``now``)."""
    out = []
    for data in runs_data(runs, now):
        wait = live_wait(data, now)
        out.append({**data, "admission_wait_now_s": wait.seconds, "admission_wait_growing": wait.growing,
                    "pending_open_s": open_seconds(parse_time(data.get("pending_since")), now)
                    if data.get("pending_category") else 0.0})
    return out


def _held_to(data: dict[str, Any], now: datetime) -> dict[str, Any]:
    """``gpu_hours + gpus_open * (now - open_since)``, as ``tracker.core.gpu.held_hours`` (not imported: this module
    starts without pydantic)."""
    open_gpus, since = data.get("gpus_open"), parse_time(data.get("open_since"))
    if not open_gpus or since is None or "gpu_hours" not in data:
        return data
    seconds = max(0.0, (now - since).total_seconds())
    return {**data, "gpu_hours": (data["gpu_hours"] or 0.0) + open_gpus * seconds / 3600}


def _with_waiting(data: list[dict[str, Any]], waiting: dict[str, dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A pending run's ``waiting_behind`` (its queues and position, ``IndexReader.queue_context``), when known."""
    if not waiting:
        return data
    return [{**d, "waiting_behind": waiting[d["run_id"]]} if d.get("run_id") in waiting else d for d in data]


def render(runs: Sequence[Run], output: str, *, now: datetime, width: int | None, short: dict[str, str],
           one_namespace: bool = False, why: bool = False, waiting: dict[str, dict[str, Any]] | None = None) -> str:
    if output == "json":
        return json.dumps(_with_waiting(runs_json(runs, now), waiting), indent=2) + "\n"
    if output == "yaml":
        import yaml

        return str(yaml.safe_dump(_with_waiting(runs_json(runs, now), waiting), sort_keys=False,
                                  allow_unicode=True))
    if output == "name":
        return "".join(f"{r.run_id}\n" for r in runs)
    if output.startswith(("jsonpath=", "custom-columns=")):  # kubectl's, over the json (tracker.read.jsonpath)
        from tracker.read.jsonpath import output_format

        fmt = output_format(output, ())
        items = _with_waiting(runs_json(runs, now), waiting)
        if fmt.template is not None:
            return fmt.template.render({"kind": "List", "items": items})
        assert fmt.columns is not None
        return fmt.columns.render(items)
    cols = columns(output, now, short=short, one_namespace=one_namespace, why=why)
    if output == "wide":
        from tracker.read.queues import short as queue_short

        known = waiting or {}
        cols.insert(len(cols) - 2, Column("WAITING-BEHIND", lambda r: queue_short(known.get(r.run_id))))
    return render_table(runs, cols, width=width if output == "table" else None)
