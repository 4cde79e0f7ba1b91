"""The goodput ledger's facts of a run (``tracker.core.ledger``; schemas/goodput.md "Bounds"): its step records
(``StepTrail``) and its checkpoint saves and restores (``Checkpoints``), each merged so that any order and any repeat
of the reports give the same facts. Part of a run's facts (``tracker.core.facts.RunFacts``). Pure."""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field
from typing import Any

from tracker.core.curves import _MAX_WIDTH

# The goodput ledger's facts (tracker.core.ledger; schemas/goodput.md "Bounds")
STEP_TRAIL_BUCKETS = 2048  # time buckets of step records a run keeps (two records each)
STEP_TRAIL_WIDTH = 1 << 20  # µs: the first bucket width, about a second; it doubles as a run grows
MAX_CHECKPOINT_SAVES = 1024  # checkpoint saves a run keeps (those of the highest steps)
MAX_CHECKPOINT_RESTORES = 64  # checkpoints whose restores a run keeps (those of the highest steps)
MAX_RESTORE_TIMES = 8  # start (and end) times kept of the restores of one checkpoint
StepRecord = tuple[int, int]  # (at, step)


def _time(rec: StepRecord) -> int:
    return rec[0]


@dataclass(slots=True)
class StepTrail:
    """A run's step records (the time each reported step was reached), bounded: records fall in time buckets of one
    width for the whole run (a power of two times ``STEP_TRAIL_WIDTH``), each bucket keeps its earliest and its
    latest record (by time, then step), and the width doubles while more than ``STEP_TRAIL_BUCKETS`` buckets are
    held. As with ``MetricPoints``, the width is the smallest that fits every record seen and each bucket's two
    records are its extremes at that width: a function of the set of records, whatever their order or repeats."""

    width: int = STEP_TRAIL_WIDTH
    buckets: dict[int, tuple[StepRecord, StepRecord]] = field(default_factory=dict)
    # not a fact: ``records`` kept up to date by ``add`` once asked for (None: built at the next ``records``), so that
    # a report does not sort a long run's every record again (a record replaced or added is moved in place)
    kept: list[StepRecord] | None = field(default=None, compare=False, repr=False)

    def add(self, at: int, step: int, cap: int = STEP_TRAIL_BUCKETS) -> tuple[int, ...]:
        """Take a step record; the times of the records it added or dropped (none: nothing changed), so that a
        changelog keeping them by time (``RunFacts.minutes_changed``) rewrites those only."""
        rec = (at, step)
        b = at // self.width
        cur = self.buckets.get(b)
        if cur is None:
            self.buckets[b] = (rec, rec)
            if self.kept is not None:
                insort(self.kept, rec)
            if len(self.buckets) <= cap or self.width >= _MAX_WIDTH:
                return (at,)
            before = {r for pair in self.buckets.values() for r in pair}
            while len(self.buckets) > cap and self.width < _MAX_WIDTH:
                self.kept = None  # records merged away: built again when asked for
                self.width *= 2
                coarse: dict[int, tuple[StepRecord, StepRecord]] = {}
                for k, (lo, hi) in self.buckets.items():
                    ck = k >> 1  # floor division by two, negative buckets too
                    old = coarse.get(ck)
                    coarse[ck] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
                self.buckets = coarse
            after = {r for pair in self.buckets.values() for r in pair}
            return (at, *sorted(r[0] for r in before - after))
        if rec < cur[0] or rec > cur[1]:
            self.buckets[b] = (min(cur[0], rec), max(cur[1], rec))
            kept = self.kept
            if cur[0] == cur[1]:  # the bucket's one record stays, as its other extreme
                if kept is not None:
                    insort(kept, rec)
                return (at,)
            gone = cur[0] if rec < cur[0] else cur[1]  # the record it replaces
            if kept is not None:
                del kept[bisect_left(kept, gone)]
                insort(kept, rec)
            return (at, gone[0])
        return ()

    def records_in(self, lo: int, hi: int) -> list[StepRecord]:
        """The kept records of times in [lo, hi), by time then step."""
        kept = self._kept()
        return kept[bisect_left(kept, lo, key=_time):bisect_left(kept, hi, key=_time)]

    @classmethod
    def of_records(cls, width: int, records: list[list[int]]) -> list[Any]:
        """The JSON of a trail of ``width`` holding ``records`` ([[at, step], ...], as ``records`` gives them): each
        bucket's two records are its extremes, so the records alone give the buckets back (``to_json``)."""
        buckets: dict[int, tuple[StepRecord, StepRecord]] = {}
        for at, step in records:
            rec, b = (at, step), at // width
            cur = buckets.get(b)
            buckets[b] = (rec, rec) if cur is None else (min(cur[0], rec), max(cur[1], rec))
        return [width, [[lo[0], lo[1], hi[0], hi[1]] for lo, hi in buckets.values()]]

    def records(self) -> list[StepRecord]:
        """The kept records, by time then step, each once."""
        return list(self._kept())

    def _kept(self) -> list[StepRecord]:
        if self.kept is None:
            self.kept = sorted({r for pair in self.buckets.values() for r in pair})
        return self.kept

    def to_json(self) -> list[Any]:
        return [self.width, [[lo[0], lo[1], hi[0], hi[1]] for lo, hi in self.buckets.values()]]

    @classmethod
    def from_json(cls, v: list[Any] | None) -> StepTrail:
        t = cls()
        if v:
            t.width = v[0]
            t.buckets = {row[0] // t.width: ((row[0], row[1]), (row[2], row[3])) for row in v[1]}
        return t


@dataclass(slots=True)
class Checkpoints:
    """A run's checkpoint saves and restores, as its intake events told (merged by min, max and bounded set union,
    so any order and any repeat give the same facts).

    ``saves``: (step, uri) -> [started, completed, failed, bytes] (the latest start, the earliest completion and
    failure, the largest size: a save interrupted before it completed, by an eviction or a crash, is begun again
    under the same step and URI once training is back there, and the save that completed is the later one; the
    earliest start would stretch the save over the interruption and the recovery), at most
    ``MAX_CHECKPOINT_SAVES`` (those of the highest (step, uri)). ``restores``: (step, uri) -> the
    start times and the end times of its restores (the earliest ``MAX_RESTORE_TIMES`` of each), at most
    ``MAX_CHECKPOINT_RESTORES``. ``resume``: the run's Resume event (the latest, by time then content)."""

    saves: dict[tuple[int, str], list[int | None]] = field(default_factory=dict)
    restores: dict[tuple[int, str], tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    resume: tuple[int, str, str | None, int | None] | None = None  # (at, resume_of, checkpoint uri, step)

    def save(self, step: int, uri: str, phase: str, at: int, size: int | None) -> None:
        key = (step, uri)
        cur = self.saves.get(key)
        if cur is None:
            if len(self.saves) >= MAX_CHECKPOINT_SAVES and key < min(self.saves):
                return  # below every kept one: never kept (a function of the set)
            cur = self.saves[key] = [None, None, None, None]
            if len(self.saves) > MAX_CHECKPOINT_SAVES:
                del self.saves[min(self.saves)]
        i = {"started": 0, "completed": 1, "failed": 2}[phase]
        cur[i] = _max(cur[i], at) if i == 0 else _min(cur[i], at)
        if size is not None:
            cur[3] = _max(cur[3], size)

    def restore(self, step: int, uri: str, phase: str, at: int) -> None:
        key = (step, uri)
        cur = self.restores.get(key)
        if cur is None:
            if len(self.restores) >= MAX_CHECKPOINT_RESTORES and key < min(self.restores):
                return
            cur = self.restores[key] = ((), ())
            if len(self.restores) > MAX_CHECKPOINT_RESTORES:
                del self.restores[min(self.restores)]
        starts, ends = cur
        if phase == "started":
            starts = tuple(sorted({*starts, at}))[:MAX_RESTORE_TIMES]
        else:  # completed or failed: either ends it
            ends = tuple(sorted({*ends, at}))[:MAX_RESTORE_TIMES]
        self.restores[key] = (starts, ends)

    def resumed(self, at: int, resume_of: str, uri: str | None, step: int | None) -> None:
        new = (at, resume_of, uri, step)
        if self.resume is None or _order(new) > _order(self.resume):
            self.resume = new

    def __bool__(self) -> bool:
        return bool(self.saves or self.restores or self.resume)

    def to_json(self) -> dict[str, Any]:
        return {"saves": [[k[0], k[1], *v] for k, v in sorted(self.saves.items())],
                "restores": [[k[0], k[1], list(v[0]), list(v[1])] for k, v in sorted(self.restores.items())],
                "resume": list(self.resume) if self.resume else None}

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> Checkpoints:
        c = cls()
        if d:
            c.saves = {(r[0], r[1]): list(r[2:6]) for r in d["saves"]}
            c.restores = {(r[0], r[1]): (tuple(r[2]), tuple(r[3])) for r in d["restores"]}
            res = d["resume"]
            c.resume = (res[0], res[1], res[2], res[3]) if res else None
        return c


def _order(resume: tuple[int, str, str | None, int | None]) -> tuple[int, str, str, int]:
    return resume[0], resume[1], resume[2] or "", -1 if resume[3] is None else resume[3]


def _min(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a <= b else b


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a >= b else b
