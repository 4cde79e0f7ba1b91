"""Human and JSON output of runs and run histories: the runs table, the timeline, and their JSON shapes.

Pure presentation: values in, rich renderables or JSON-ready data out. Nothing here reads the clock (a live
run's timeline ends at the ``now`` the caller passes). Text that comes from the cluster (reasons, messages,
names) is always wrapped in ``Text``, never parsed as rich markup.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

from tracker.core.model import (
    FINAL_STATUSES,
    AdmissionStep,
    Attempt,
    CheckpointRecord,
    Phase,
    RunHistory,
    RunRecord,
    Status,
    iso,
)
from tracker.core.timefmt import ts
from tracker.core.vocab import span_key
from tracker.core.waits import GROWING, Wait, admission_wait, open_seconds
from tracker.read.runs import LedgerAt, ledger_at

if TYPE_CHECKING:  # rich is imported where a renderable is made: `compare -o json` does without it
    from rich.table import Table
    from rich.text import Text

STATUS_STYLE: dict[Status, str] = {
    Status.PENDING: "yellow",
    Status.RUNNING: "blue",
    Status.SUCCEEDED: "green",
    Status.FAILED: "bold red",
    Status.STOPPED: "magenta",
}
PHASE_STYLE: dict[Phase, str] = {
    Phase.RESOLUTION: "cyan",
    Phase.RENDERING: "bright_blue",
    Phase.ADMISSION: "bold yellow",  # waiting for quota: meant to stand out
    Phase.SCHEDULING: "magenta",
    Phase.RUNTIME: "green",
    Phase.PROGRESS: "bright_green",
    Phase.COMPLETION: "white",
}
BAR = "█"
WAIT_BAR = "▒"  # Admission: the run is waiting for quota
STOPPED_BAR = "┄"  # Completion that did not last: deactivated by Kueue until it was reactivated
POINT = "◆"  # a phase entered at the end of the run (Completion)
NOW = "▶"  # the phase a live run is in, when no `now` was given to measure it against

# Layout and size limits of the timeline.
LABEL_WIDTH = 11  # "Scheduling" + 1
DURATION_WIDTH = 8  # "23h59m+"
REASON_MIN_WIDTH = 20
REASON_SHARE = 0.4  # of the width left beside the labels and durations
BAR_MIN_WIDTH = 10
BAR_MAX_WIDTH = 120
REASON_MAX_CHARS = 80  # runs table: longer reasons and messages are cut


# ------------------------------------------------------------------------------------------ formatting


def human_duration(seconds: float | None) -> str:
    """45m12s, 2h03m, 1d04h, 7s, <1s; '-' for None (and for NaN or infinity)."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if 0 < seconds < 1:
        return "<1s"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86_400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86_400}d{s % 86_400 // 3600:02d}h"


def _iso(dt: datetime | None) -> str | None:
    return iso(ts(dt)) if dt is not None else None


def utc(dt: datetime) -> datetime:
    """A naive datetime is UTC (the core's convention)."""
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def clock_text(dt: datetime | None, fmt: str = "%Y-%m-%d %H:%M:%SZ") -> str:
    """A time for people, in UTC to the second."""
    return "-" if dt is None else utc(dt).strftime(fmt)


def time_span(history: RunHistory, now: datetime | None) -> tuple[datetime, datetime, float, bool]:
    """What a run's timeline spans (the text one and the web view's): its first to its last transition, or to
    ``now`` for a live run; the seconds between (never 0) and whether the run is live. Needs a transition."""
    trs = history.transitions
    live = history.run.status not in FINAL_STATUSES
    start = utc(min(t.at for t in trs))
    end = utc(max(t.at for t in trs))
    if live and now is not None and utc(now) > end:
        end = utc(now)
    return start, end, max((end - start).total_seconds(), 1e-6), live


def number_text(value: float) -> str:
    return f"{value:.4g}"


SPARK_LEVELS = "▁▂▃▄▅▆▇█"  # a sparkline's characters, lowest to highest
SPARK_WIDTH = 24  # a sparkline's most characters (`tracker show`'s metrics)


def sparkline(points: Iterable[tuple[int, float]], width: int = SPARK_WIDTH) -> str:
    """A metric's curve in at most ``width`` characters: the finite points' (step, value) pairs, their step range
    cut into ``min(width, distinct steps)`` equal buckets, each the mean of its values scaled from the least bucket
    (``▁``) to the greatest (``█``); a bucket without a point is a space, a flat curve all ``▄``; '' without a finite
    point (NaN and infinities are left out)."""
    kept = [(step, value) for step, value in points if math.isfinite(value)]
    if not kept or width < 1:
        return ""
    low, high = min(s for s, _ in kept), max(s for s, _ in kept)
    count = min(width, len({s for s, _ in kept}))
    sums, ns = [0.0] * count, [0] * count
    for step, value in kept:
        i = 0 if high == low else min(count - 1, int((step - low) * count / (high - low)))
        sums[i] += value
        ns[i] += 1
    means = [total / n if n else None for total, n in zip(sums, ns, strict=True)]
    present = [m for m in means if m is not None]
    least, most = min(present), max(present)
    top = len(SPARK_LEVELS) - 1
    if not most > least or not math.isfinite(most - least):  # flat, or a range too wide for a float
        return "".join(" " if m is None else SPARK_LEVELS[top // 2] for m in means)
    return "".join(" " if m is None else SPARK_LEVELS[min(top, int((m - least) / (most - least) * top + 0.5))]
                   for m in means)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _status_text(status: Status) -> Text:
    from rich.text import Text

    return Text(status.value, style=STATUS_STYLE[status])


def reason_text(reason: str | None, message: str = "") -> str:
    if reason and message:
        return f"{reason}: {message}"
    return reason or message


def run_wait(run: RunRecord, now: datetime | None) -> Wait:
    """The run's admission wait at ``now`` (``tracker.core.waits``): while it still waits, ``now - queued_at``."""
    return admission_wait(run.status.value, run.queued_at, run.admitted_at, run.admission_wait_s, now)


def attempt_wait(a: Attempt, run: RunRecord, now: datetime | None) -> Wait:
    """An attempt's admission wait at ``now``: the current attempt of a run still waiting grows up to ``now``."""
    live = a.ended_at is None and a.attempt == run.attempts
    return admission_wait(run.status.value if live else "", a.queued_at, a.admitted_at, a.admission_wait_s, now)


def wait_text(wait: Wait) -> str:
    return human_duration(wait.seconds) + (GROWING if wait.growing else "")


def attempt_pending(a: Attempt, now: datetime | None) -> dict[str, float]:
    """An attempt's pending seconds by key (``span_key``), its open span counted up to ``now``, longest first."""
    out = dict(a.pending_s_by)
    last = a.pending[-1] if a.pending else None
    if last is not None and last.end is None:
        key = span_key(last.category, last.detail)
        out[key] = out.get(key, 0.0) + open_seconds(last.start, now)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def pending_text(a: Attempt, now: datetime | None) -> str:
    """``quota 12m00s, admission-check:prov 3m00s+`` (the open span's key marked ``+``)."""
    last = a.pending[-1] if a.pending else None
    open_key = span_key(last.category, last.detail) if last is not None and last.end is None else None
    return ", ".join(f"{k} {human_duration(v)}{GROWING if k == open_key else ''}"
                     for k, v in attempt_pending(a, now).items())


def step_text(step: AdmissionStep) -> str:
    """An admission step in words: ``QuotaReserved (cq)``, ``check prov Ready: msg``, ``QuotaReleased (reason)``."""
    if step.kind == "AdmissionCheck":
        text = f"check {step.check} {step.state}"
    else:
        text = f"{step.kind} ({step.state})" if step.state else step.kind
    return f"{text}: {step.message}" if step.message else text


# short labels of the pending categories, as wide as a phase's label at most
CATEGORY_LABEL = {"queued": "queued", "quota": "quota", "preemption": "preemption", "inadmissible": "inadmiss.",
                  "backoff": "backoff", "admission-check": "adm. check", "pod-creation": "pod create",
                  "unschedulable": "unsched.", "scheduling": "scheduling", "image-pull": "image pull",
                  "container-creation": "containers", "unexplained": "unexplain."}
STEP_MARK = {"QuotaReserved": "◇", "AdmissionCheck": "•", "QuotaReleased": "✕"}
PENDING_BAR = "─"
# the goodput ledger on the timeline (schemas/goodput.md): checkpoints as marks, the time lost as spans
CHECKPOINT_MARK = {"save-open": "○", "save": "●", "restore": "▲"}  # at one column the latter shows over the former
CHECKPOINT_LEGEND = {"save": "checkpoint saved", "save-open": "save failed", "restore": "restored"}
LEDGER_BAR = {"wasted-progress": "░", "infrastructure-recovery": "═"}
LEDGER_LABEL = {"wasted-progress": "wasted", "infrastructure-recovery": "recovery"}
LEDGER_LEGEND = {"wasted-progress": "wasted progress", "infrastructure-recovery": "recovery"}
LEDGER_STYLE = {"wasted-progress": "red", "infrastructure-recovery": "yellow"}
CATEGORY_STYLE = {"productive": "green", "wasted-progress": "red", "infrastructure-recovery": "yellow"}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# ------------------------------------------------------------------------------------------ runs table


def runs_table(records: Sequence[RunRecord], now: datetime | None = None) -> Table:
    """One row per run: identity, status, phase, attempt counters, queue time and admission wait (a run still
    waiting: up to ``now``, marked ``+``)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{len(records)} run{'s' if len(records) != 1 else ''}", title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False)
    table.add_column("run", no_wrap=True, overflow="ellipsis", min_width=12, max_width=26)
    table.add_column("kind", no_wrap=True, min_width=6)
    table.add_column("ns/name", no_wrap=True, overflow="ellipsis", max_width=36)
    table.add_column("status", no_wrap=True, min_width=9)
    table.add_column("phase", no_wrap=True, min_width=10)
    for header in ("att", "retry", "evict"):  # attempts, retries (pod failures replaced), evictions
        table.add_column(header, justify="right", no_wrap=True, min_width=len(header))
    table.add_column("queued (UTC)", no_wrap=True, min_width=14)
    table.add_column("adm. wait", justify="right", no_wrap=True, min_width=9)
    table.add_column("reason", no_wrap=True, overflow="ellipsis", ratio=1)
    for r in records:
        table.add_row(
            Text(r.run_id), Text(r.kind or "-"), Text(f"{r.namespace or '?'}/{r.name or '?'}"),
            _status_text(r.status), Text(r.phase.value, style=PHASE_STYLE[r.phase]),
            Text(str(r.attempts)), Text(str(r.retries)), Text(str(r.evictions), style="yellow" if r.evictions else ""),
            Text(clock_text(r.queued_at, "%m-%d %H:%M:%S")),
            Text(wait_text(run_wait(r, now)), style="yellow" if r.admission_wait_s or r.status == Status.PENDING
                 else ""),
            Text(r.reason or "-"),
        )
    return table


# ------------------------------------------------------------------------------------------ timeline


def checkpoint_at(c: CheckpointRecord) -> tuple[datetime | None, str]:
    """Where a checkpoint is marked on a timeline, and how (a ``CHECKPOINT_MARK`` key): a save at its completion
    (``save``), a failed one where it failed and one still going on at its start (``save-open``), a restore at its
    completion, else its start (``restore``)."""
    if c.kind == "restore":
        return c.ended_at or c.started_at, "restore"
    if c.status == "completed":
        return c.ended_at or c.started_at, "save"
    if c.status == "failed":
        return c.ended_at or c.started_at, "save-open"
    return c.started_at or c.ended_at, "save-open"


def checkpoint_text(c: CheckpointRecord) -> str:
    """``saved @1000 10:11:00Z``, ``restored @1000 ...``, ``save @2000 failed ...``, ``saving @3000 since ...``."""
    when, _ = checkpoint_at(c)
    at = f" {clock_text(when, '%H:%M:%SZ')}" if when is not None else ""
    if c.kind == "restore":
        return f"{'restored' if c.status == 'completed' else 'restoring'} @{c.step}{at}"
    if c.status == "completed":
        return f"saved @{c.step}{at}"
    return f"save @{c.step} failed{at}" if c.status == "failed" else f"saving @{c.step} since{at}"


def gpu_hours_text(hours: float) -> str:
    return f"{hours:.2f}"


#: Rows whose values are long single lines: a table view cuts them to its width with an ellipsis (JSON has them whole).
WHAT_RAN_ROWS = ("entrypoint",)


def cut(text: str, limit: int | None) -> str:
    """``text`` cut to ``limit`` characters, its last an ellipsis when cut (None: whole)."""
    return text if limit is None or len(text) <= limit else text[:max(0, limit - 1)] + "…"


def param_text(value: str | int | float | bool | None) -> str:
    """A hyperparameter's value as shown: a string as it is, other scalars as JSON writes them (true, null, 0.0003)."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def hyperparameters_text(run: RunRecord, max_params: int | None = None) -> str:
    """``name=value, ...`` in key order, the first ``max_params`` (None: all kept), then ``+N more`` (those not shown
    and those the tracker did not keep: it keeps 64)."""
    items = sorted(run.hyperparameters.items())
    shown = items if max_params is None else items[:max_params]
    more = len(items) - len(shown) + run.hyperparameters_omitted
    text = ", ".join(f"{k}={param_text(v)}" for k, v in shown)
    return (text + (f", +{more} more" if text else f"+{more} more") if more else text) or "-"


def provenance_rows(history: RunHistory, *, max_inputs: int | None = None, max_params: int | None = None,
                    resumed_by: Sequence[str] | None = None) -> tuple[tuple[str, str], ...]:
    """Where a run came from and what ran, as (label, value) rows: the terminal's provenance grid and the web view's
    table. ``max_inputs`` cuts a long list of inputs, ``max_params`` the hyperparameters (saying how many more).
    ``resumed_by``: the runs that resume this one (a row of its own; None: not known, no row)."""
    run = history.run
    inputs = ", ".join(run.input_refs[:max_inputs])
    if max_inputs is not None and len(run.input_refs) > max_inputs:
        inputs += f", … ({len(run.input_refs) - max_inputs} more)"
    config = run.config_digest or "-"
    if run.config_ref:
        config += f" ({run.config_ref})"
    rows: tuple[tuple[str, str], ...] = (
        ("project / workspace / target", f"{run.project or '-'} / {run.workspace or '-'} / {run.target or '-'}"),
        ("workload", f"{run.kind or '-'} {run.namespace or '?'}/{run.name or '?'}"
                     + (f" (uid {run.uid})" if run.uid else "")),
        ("images", ", ".join(run.images) or "-"),
        ("entrypoint", run.entrypoint or "-"),
        ("queue", f"{run.queue or '-'} → ClusterQueue {run.cluster_queue or '-'}"),
        ("git commit", run.git_commit or "-"),
        ("config", config),
        ("hyperparameters", hyperparameters_text(run, max_params)),
        ("inputs", inputs or "-"),
        ("output", run.output_uri or "-"),
        ("last checkpoint", run.last_checkpoint or "-"),
        ("resume of", resume_text(history)),
    )
    if resumed_by is not None:
        rows += (("resumed by", ", ".join(resumed_by) or "-"),)
    return rows


def resumes(history: RunHistory) -> list[str]:
    """The runs this run resumes (its ``resume_of``, and its resume links)."""
    run = history.run
    return sorted({link.resume_of for link in history.resume_links} | ({run.resume_of} if run.resume_of else set()))


def resume_text(history: RunHistory) -> str:
    """``<run> (from <checkpoint>)``: the run it resumes and the checkpoint it resumed from, when known; '-'."""
    runs = resumes(history)
    if not runs:
        return "-"
    return ", ".join(runs) + (f" (from {history.run.resumed_from})" if history.run.resumed_from else "")


# ------------------------------------------------------------------------------------------ goodput


NO_PROGRESS = "no progress events: the ledger is the GPU accounting"


def run_ledger(run: RunRecord, now: datetime | None) -> LedgerAt:
    """The run's goodput ledger at ``now`` (while it goes on: its open category counted up to ``now``)."""
    return ledger_at(run.ledger_basis, run.ledger_gpu_hours_by, run.ledger_wall_s_by, run.ledger_until,
                     run.ledger_open if run.status not in FINAL_STATUSES else None, run.gpus_open, now)


def attempt_ledgers(history: RunHistory, now: datetime | None) -> list[LedgerAt]:
    """Each attempt's ledger at ``now``: its open pods' GPU-time since the run's ``ledger_until`` (the accounting's:
    since their ``open_since``) goes to the run's open category, and the wall time since to the last attempt's."""
    run = history.run
    live = run.status not in FINAL_STATUSES
    out = []
    for i, a in enumerate(history.attempts):
        last = i == len(history.attempts) - 1
        until = run.ledger_until if run.ledger_basis == "progress" else a.open_since
        open_cat = run.ledger_open if live and (a.gpus_open or last) else None
        out.append(ledger_at(run.ledger_basis if last else "accounting", a.ledger_gpu_hours_by,
                             a.ledger_wall_s_by, until, open_cat, a.gpus_open, now))
    return out


# ------------------------------------------------------------------------------------------ JSON


def _plain(value: Any) -> Any:
    """JSON-ready data: times as ISO-8601 UTC 'Z' strings, enums as their values, NaN and infinities as null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _without_run_id(row: Any) -> dict[str, Any]:
    data: dict[str, Any] = _plain(row)
    del data["run_id"]
    return data


def runs_json(records: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """Every RunRecord field per run (times as ISO-8601 UTC 'Z' strings, null where not reached)."""
    return [_plain(r) for r in records]


def history_json(history: RunHistory) -> dict[str, Any]:
    """The run object (as in ``runs_json``) plus its transitions (in order), attempt details, metrics, resume links,
    pods (with their attempt numbers), checkpoints and ledger spans. The attempt objects are under
    ``attempt_details``: ``attempts`` is the run's attempt count."""
    data: dict[str, Any] = _plain(history.run)
    data["transitions"] = [{"at": _iso(t.at), "phase": t.phase.value, "attempt": t.attempt, "reason": t.reason,
                            "message": t.message, "source": t.source} for t in history.transitions]
    data["attempt_details"] = [_without_run_id(a) for a in history.attempts]  # "attempts" is the count
    data["metrics"] = [_without_run_id(m) for m in history.metrics]
    data["resume_links"] = [_without_run_id(link) for link in history.resume_links]
    data["pods"] = [_without_run_id(p) for p in history.pods or ()]
    data["checkpoints"] = _plain(history.checkpoints)
    data["ledger"] = _plain(history.ledger)
    return data
