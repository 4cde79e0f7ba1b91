"""The goodput ledger's part of ``derive``: what the ledger (``ledger.py``) reads of a run's facts and derived
attempts, and the history fields it fills (schemas/goodput.md). Pure, like the rest of the derivation."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

from tracker.core.derive_attempts import _Att
from tracker.core.derive_pods import AttemptPods
from tracker.core.facts import RunFacts
from tracker.core.ledger import (
    US_PER_HOUR,
    US_PER_S,
    Ledger,
    LedgerAttempt,
    LedgerInput,
    Restore,
    Save,
    Stretches,
    attempt_at,
    ledger,
)
from tracker.core.ledger_facts import Checkpoints
from tracker.core.model import (
    Attempt,
    CheckpointRecord,
    GoodputCategory,
    LedgerSpan,
    RunRecord,
    utc,
)
from tracker.core.timefmt import micros

_PRODUCTIVE = GoodputCategory.PRODUCTIVE.value


def saves(c: Checkpoints) -> list[Save]:
    return [Save(v[0], v[1] if v[1] is not None else v[2], step, v[1] is not None)
            for (step, _uri), v in sorted(c.saves.items())]


def restores(c: Checkpoints) -> list[tuple[int, str, int, int | None]]:
    """Each restore: (step, uri, start, end or None), by (step, uri) then start; each end closes the latest restore
    begun at or before it (a restore interrupted before it completed, by an eviction or a crash, stays without an
    end: the next restore of the same checkpoint is the one that completed)."""
    out: list[tuple[int, str, int, int | None]] = []
    for (step, uri), (starts, ends) in sorted(c.restores.items()):
        free = list(starts)  # in order
        closed: dict[int, int] = {}
        for e in ends:  # in order
            j = bisect_right(free, e)
            if j:
                closed[free.pop(j - 1)] = e
        out.extend((step, uri, s, closed.get(s)) for s in starts)
    return out


def run_ledger(r: RunFacts, steps: Sequence[tuple[int, int]], rs_all: Sequence[tuple[int, str, int, int | None]],
               atts: Sequence[_Att], losses: Sequence[str | None], pods: Sequence[AttemptPods],
               attempts: Sequence[Attempt], final_at: int | None, kept: Stretches | None = None) -> Ledger:
    """The run's ledger, from its facts, its restores (``restores``) and its derived attempts; ``kept``: the run's
    stretches as its last derivation found them (``ledger.Stretches``), None: found again."""
    la = []
    for a, loss, p, out in zip(atts, losses, pods, attempts, strict=True):
        pending = [(sp.category.value, micros(sp.start), None if sp.end is None else micros(sp.end))
                   for sp in out.pending]
        la.append(LedgerAttempt(_begin(a), a.end, loss is not None, pending, p.peak, p.held, p.lost))
    rs = [Restore(s, e, step) for step, _uri, s, e in rs_all if e is not None]
    return ledger(LedgerInput(la, steps, saves(r.ckpts), rs, final_at, bool(losses) and losses[-1] is not None, kept))


def _begin(a: _Att) -> int | None:
    """Where an attempt begins, for the ledger: queued, else its Scheduling entry."""
    return a.queued if a.queued is not None else a.start


def _per(by: dict[str, int], unit: int) -> dict[str, float]:
    """Integer µs (or GPU-µs) by category in ``unit``s, the categories in order."""
    return {k: by[k] / unit for k in sorted(by)}


def attempt_fields(led: Ledger, i: int) -> dict[str, Any]:
    return {"ledger_gpu_hours_by": _per(led.gpu_us[i], US_PER_HOUR),
            "ledger_wall_s_by": _per(led.wall_us[i], US_PER_S)}


def record_fields(r: RunFacts, led: Ledger, record: RunRecord, rs_all: Sequence[tuple[int, str, int, int | None]],
                  own: tuple[str | None, str | None]) -> RunRecord:
    """The run record with its ledger fields, lineage and checkpoint summary (``rs_all``: ``restores``). ``own``: the
    ``resume_of`` and ``last_checkpoint`` of the record before these fields, so that a record that already has them
    (the one ``derive.Derivation`` keeps) is given them anew from the same base."""
    resume_of, last_checkpoint = own
    gpu: dict[str, int] = {}
    wall: dict[str, int] = {}
    for by in led.gpu_us:
        for k, v in by.items():
            gpu[k] = gpu.get(k, 0) + v
    for by in led.wall_us:
        for k, v in by.items():
            wall[k] = wall.get(k, 0) + v
    total_gpu, total_wall = sum(gpu.values()), sum(wall.values())
    if led.basis == "accounting":
        until = record.open_since
        open_cat = _PRODUCTIVE if record.gpus_open else None
        ettr = None
    else:
        until = utc(led.until)
        open_cat = led.open
        ettr = wall.get(_PRODUCTIVE, 0) / total_wall if total_wall > 0 else None
    goodput = gpu.get(_PRODUCTIVE, 0) / total_gpu if total_gpu > 0 else None
    c = r.ckpts
    resume = c.resume
    first_restore = min(((s, uri) for _step, uri, s, _e in rs_all), default=None)
    completed = [(v[1], step, uri) for (step, uri), v in c.saves.items() if v[1] is not None]
    last = max(((step, at, uri) for at, step, uri in completed if at is not None), default=None)
    return replace(
        record,
        resume_of=resume_of or (resume[1] if resume else None),
        last_checkpoint=last[2] if last else last_checkpoint,
        ledger_basis="progress" if led.basis == "progress" else "accounting",
        ledger_gpu_hours_by=_per(gpu, US_PER_HOUR), ledger_wall_s_by=_per(wall, US_PER_S),
        ledger_until=until, ledger_open=open_cat if record.finished_at is None else None, ettr=ettr, goodput=goodput,
        resumed_from=(resume[2] if resume and resume[2] else None) or (first_restore[1] if first_restore else None),
        checkpoints_saved=len(completed),
    )


def checkpoint_rows(r: RunFacts, rs_all: Sequence[tuple[int, str, int, int | None]], atts: Sequence[_Att]
                    ) -> list[CheckpointRecord]:
    """The run's checkpoint saves and restores (``rs_all``: ``restores``), by start time (else end time), with the
    attempt of each (the ledger's: the last one begun at or before it)."""
    begins = [_begin(a) for a in atts]

    def attempt(t: int) -> int | None:
        return attempt_at(begins, t) + 1 if atts else None

    rows: list[tuple[int, CheckpointRecord]] = []
    for (step, uri), v in r.ckpts.saves.items():
        started, completed, failed, size = v
        end = completed if completed is not None else failed
        status: Literal["started", "completed", "failed"] = (
            "completed" if completed is not None else ("failed" if failed is not None else "started"))
        at = started if started is not None else end
        assert at is not None  # a save is known from one of its events
        rows.append((at, CheckpointRecord(kind="save", step=step, uri=uri, started_at=utc(started),
                                          ended_at=utc(end), status=status, bytes=size, attempt=attempt(at))))
    for step, uri, s, e in rs_all:
        rows.append((s, CheckpointRecord(kind="restore", step=step, uri=uri, started_at=utc(s), ended_at=utc(e),
                                         status="completed" if e is not None else "started", attempt=attempt(s))))
    rows.sort(key=lambda x: (x[0], x[1].kind, x[1].step, x[1].uri))
    return [row for _at, row in rows]


def spans(led: Ledger) -> list[LedgerSpan]:
    return [LedgerSpan(category=GoodputCategory(cat), start=utc(s), end=utc(e)) for cat, s, e in led.spans]


__all__ = ["attempt_fields", "checkpoint_rows", "record_fields", "restores", "run_ledger", "spans"]
