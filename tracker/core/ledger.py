"""The goodput ledger: where a run's time, and the GPU-time its pods held, went.

The definitions are written once, in ``schemas/goodput.md``; this module is their only implementation. In short, each
instant of a run's time, from its first attempt's queueing to its end, falls in exactly one ``GoodputCategory``, the
first rule that matches deciding:

1. **checkpoint-save**: a checkpoint save is under way (its start to its completion or failure);
2. **checkpoint-restore**: a checkpoint restore is under way;
3. **wasted-progress**: after the point an interrupted stretch of training was kept to (the completion of the
   checkpoint the next stretch resumed from, else the time the step it resumed from was reached, else the last
   checkpoint completed before the interruption, else nothing is kept) and before the interruption;
4. **productive**: training, from a stretch's first step record to its interruption (or the run's end);
5. **infrastructure-recovery**: from an interruption to the next step record;
6. **scheduling**: an attempt pending in Kueue or for its pods' placement (its pending spans, but the image pulls
   and container creations), before any interruption;
7. **startup**: the rest of the time before the run's first step record;
8. **unclassified**: anything else (GPU-time after the run's end).

A *stretch* is a run of step records whose steps go up, within one attempt; a new attempt, or a step reported
again or lower (the training process restarted from a checkpoint), begins another. A stretch is *interrupted* when
another follows it, or when its attempt was lost (``gpu.attempt_losses``: an eviction, a retry, the run failing);
it ends at its attempt's end, else (a restart within an attempt) at its last record.

The GPU ledger integrates the GPUs held over each category's time (per attempt, exactly, in GPU-microseconds),
so its categories sum to the GPU-time held; the wall ledger measures the time itself. Without step records or
checkpoint events the ledger degrades to the GPU accounting: held less lost is productive, lost is wasted progress,
and the wall ledger (and ETTR) is empty.

Pure: the derivation (``derive.py``) gives it integer microsecond times taken from the objects and intake events.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import NamedTuple, Protocol

from tracker.core.model import GoodputCategory as G
from tracker.core.model import PendingCategory as P

US_PER_HOUR = 3_600_000_000
US_PER_S = 1_000_000

# the priorities of the rules above (a lower one wins)
_ORDER = (G.CHECKPOINT_SAVE, G.CHECKPOINT_RESTORE, G.WASTED_PROGRESS, G.PRODUCTIVE, G.INFRASTRUCTURE_RECOVERY,
          G.SCHEDULING, G.STARTUP, G.UNCLASSIFIED)
_RANK = {c: i for i, c in enumerate(_ORDER)}
# pending categories that are startup, not scheduling: the pods are bound and their containers are being made
_STARTUP_PENDING = frozenset({P.IMAGE_PULL.value, P.CONTAINER_CREATION.value})
# categories drawn on timelines (``RunHistory.ledger``): saves are the run's checkpoints, productive time the rest
SPAN_CATEGORIES = frozenset({G.WASTED_PROGRESS, G.INFRASTRUCTURE_RECOVERY, G.CHECKPOINT_RESTORE})
MAX_SPANS = 256  # ledger spans a history lists (the latest)


class Held(Protocol):
    """An attempt's GPUs held over time: ``derive_pods.PeakSet``, or ``Events`` (a plain list of events)."""

    def span(self) -> tuple[int, int] | None: ...  # the first and last event's times

    def areas(self) -> Callable[[int], int]: ...  # x -> the GPU-µs held up to x


class Events:
    """``Held`` from a list of (time, +GPUs at a bind / -GPUs at a release) events in time order."""

    __slots__ = ("events",)

    def __init__(self, events: Sequence[tuple[int, int]]) -> None:
        self.events = sorted(events)

    def span(self) -> tuple[int, int] | None:
        return (self.events[0][0], self.events[-1][0]) if self.events else None

    def areas(self) -> Callable[[int], int]:
        times = [t for t, _ in self.events]
        gpus = list(accumulate(d for _, d in self.events))
        weights = list(accumulate(d * t for t, d in self.events))

        def area(x: int) -> int:
            k = bisect_right(times, x)
            return 0 if k == 0 else x * gpus[k - 1] - weights[k - 1]

        return area


class LedgerAttempt(NamedTuple):
    """What the ledger reads of one attempt (µs)."""

    begin: int | None  # queued, else its Scheduling entry
    end: int | None  # its end (an eviction, a retry, the run's end), None while it goes on
    lost: bool  # its GPU-time was lost by the accounting's rules (gpu.attempt_losses): it was interrupted
    pending: Sequence[tuple[str, int, int | None]]  # its pending spans: (category, start, end or None)
    held: Held | Sequence[tuple[int, int]]  # its pods' GPUs held (a list: events (time, +GPUs / -GPUs))
    held_us: int  # the GPU-µs its released pods held (the accounting's)
    lost_us: int  # of them, the lost (the accounting's)


class Save(NamedTuple):
    start: int | None  # None: not reported (a v1 checkpoint_uri), the save takes no time
    end: int | None  # completed or failed at
    step: int
    completed: bool


class Restore(NamedTuple):
    start: int
    end: int
    step: int


class LedgerInput(NamedTuple):
    attempts: Sequence[LedgerAttempt]
    steps: Sequence[tuple[int, int]]  # (at, step), in order
    saves: Sequence[Save]
    restores: Sequence[Restore]
    final_at: int | None  # the run's end, None while it goes on
    lost_at_end: bool  # the run's last attempt was lost (the run failed or was stopped by an eviction)
    # the run's stretches as its last derivation found them, asked for those of ``steps`` (``Stretches.of``) when the
    # ledger reads them; None: found anew
    kept: Stretches | None = None


class Ledger(NamedTuple):
    basis: str  # "progress" or "accounting"
    gpu_us: list[dict[str, int]]  # per attempt: GPU-µs by category
    wall_us: list[dict[str, int]]  # per attempt: µs by category (an attempt's time: its begin to the next's)
    until: int | None  # the open pods are counted up to here
    open: str | None  # the category at ``until`` while the run goes on
    spans: list[tuple[str, int, int]]  # (category, start, end) of SPAN_CATEGORIES, merged, in order


def ledger(inp: LedgerInput) -> Ledger:
    """The ledger of one run."""
    atts = inp.attempts
    if not atts or (not inp.steps and not inp.saves and not inp.restores):
        return _accounting(atts)  # no attempt yet (intake events before any object): no time to divide either
    pieces, lo, hi = _pieces(inp)
    # the wall time of each attempt: from its begin to the next attempt's begin (the first from the run's start)
    cuts: list[int] = []
    for a in atts:
        cuts.append(a.begin if a.begin is not None else (cuts[-1] if cuts else lo))
    gpu_out: list[dict[str, int]] = []
    wall_out: list[dict[str, int]] = [{} for _ in atts]
    wall_end = inp.final_at if inp.final_at is not None else hi
    for a in atts:
        gpu_out.append(_integrate(pieces, a.held))
    for cat, s, e in pieces:
        e = min(e, wall_end)
        if e <= s:
            continue
        # split the piece over the attempts' wall windows
        for i in range(len(atts)):
            w0 = lo if i == 0 else cuts[i]
            w1 = cuts[i + 1] if i + 1 < len(atts) else wall_end
            x0, x1 = max(s, w0), min(e, w1)
            if x1 > x0:
                wall_out[i][cat] = wall_out[i].get(cat, 0) + x1 - x0
    open_cat = None
    if inp.final_at is None and pieces:
        open_cat = pieces[-1][0]
    spans: list[tuple[str, int, int]] = []
    for cat, s, e in pieces:
        if cat in SPAN_CATEGORIES:
            if spans and spans[-1][0] == cat and spans[-1][2] == s:
                spans[-1] = (cat, spans[-1][1], e)
            else:
                spans.append((cat, s, e))
    return Ledger("progress", gpu_out, wall_out, hi, open_cat, spans[-MAX_SPANS:])


def _accounting(atts: Sequence[LedgerAttempt]) -> Ledger:
    """No progress events: the GPU accounting's figures, productive and wasted."""
    gpu_out = []
    for a in atts:
        by: dict[str, int] = {}
        if a.held_us:
            by[G.PRODUCTIVE.value] = a.held_us - a.lost_us
            by[G.WASTED_PROGRESS.value] = a.lost_us
        gpu_out.append(by)
    return Ledger("accounting", gpu_out, [{} for _ in atts], None, None, [])


class Stretch(NamedTuple):
    """A stretch of the step records (the module's docstring): ``steps[start:end]``, all in attempt ``attempt``."""

    start: int
    end: int
    attempt: int  # index


def stretches(steps: Sequence[tuple[int, int]], begins: Sequence[int | None]) -> list[Stretch]:
    """The stretches of ``steps`` (in order), the attempts beginning at ``begins``."""
    return _scan(steps, begins, [], 0)


def _scan(steps: Sequence[tuple[int, int]], begins: Sequence[int | None], out: list[Stretch], i: int) -> list[Stretch]:
    """``out``, the stretches begun in ``steps[:i]`` (the last one may go on past ``i``: only its start and attempt
    are read), with those of the rest."""
    if out:
        cur_start, _end, cur_att = out.pop()
    else:
        cur_start, cur_att = i, -1
    for j in range(i, len(steps)):
        at, step = steps[j]
        a = attempt_at(begins, at)
        if j > cur_start and (a != cur_att or step <= steps[j - 1][1]):
            out.append(Stretch(cur_start, j, cur_att))
            cur_start = j
        if j == cur_start:
            cur_att = a
    if cur_start < len(steps):
        out.append(Stretch(cur_start, len(steps), cur_att))
    return out


class Stretches:
    """A run's stretches kept between its derivations (``derive.Derivation``): a report adds a step record at the end,
    or replaces the last one of its time bucket (``ledger_facts.StepTrail``), so ``of`` scans the records from the
    first that changed on, not all of them again (up to 4,096 a report). The same as ``stretches``, from any steps.
    It keeps the list of steps it was given, not a copy: a caller gives a new list when the records change (as
    ``Derivation`` does: ``StepTrail.records``), never the same list changed in place."""

    __slots__ = ("_begins", "_out", "_steps")

    def __init__(self) -> None:
        self._steps: Sequence[tuple[int, int]] = ()
        self._begins: Sequence[int | None] = ()
        self._out: list[Stretch] = []

    def of(self, steps: Sequence[tuple[int, int]], begins: Sequence[int | None]) -> list[Stretch]:
        begins = tuple(begins)
        if begins != self._begins:
            out = stretches(steps, begins)
        else:
            p = _common(self._steps, steps)
            # those begun before the first record that changed: the last goes on from there (``_scan``)
            out = _scan(steps, begins, [st for st in self._out if st.start < p], p)
        self._steps, self._begins, self._out = steps, begins, out
        return list(out)


def _common(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``; the usual cases (one or two records added or
    replaced at the end) in a few comparisons of slices, the others by bisection (a common prefix's prefixes are)."""
    n = min(len(a), len(b))
    for j in range(n, max(n - 3, -1), -1):
        if a[:j] == b[:j]:
            return j
    lo, hi = 0, n - 3  # a[:lo] == b[:lo], a[:hi + 1] != b[:hi + 1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def attempt_at(begins: Sequence[int | None], at: int) -> int:
    """The attempt a time falls in: the last one begun at or before it (the first before any)."""
    i = 0
    for j, b in enumerate(begins):
        if b is not None and b <= at:
            i = j
    return i


def _reached(records: Sequence[tuple[int, int]], step: int) -> int | None:
    """When a stretch reached ``step``: the record of that step, else interpolated between the records around it;
    None when it is beyond the stretch's last record."""
    prev = None
    for at, s in records:
        if s == step:
            return at
        if s > step:
            if prev is None:
                return records[0][0]
            (a0, s0), (a1, s1) = prev, (at, s)
            return a0 + (a1 - a0) * (step - s0) // (s1 - s0)
        prev = (at, s)
    return None


def _pieces(inp: LedgerInput) -> tuple[list[tuple[str, int, int]], int, int]:
    """The run's time cut into (category, start, end) pieces, in order, covering [lo, hi)."""
    atts, steps = inp.attempts, inp.steps
    begins = [a.begin for a in atts]
    sts = inp.kept.of(steps, begins) if inp.kept is not None else stretches(steps, begins)
    times = [t for a in atts for t in (a.begin, a.end) if t is not None]
    times += [t for a in atts for t in (_held(a.held).span() or ())]
    times += [steps[0][0], steps[-1][0]] if steps else []
    times += [t for s in inp.saves for t in (s.start, s.end) if t is not None]
    times += [t for r in inp.restores for t in (r.start, r.end)]
    times += [t for a in atts for _c, s, e in a.pending for t in (s, e) if t is not None]
    if inp.final_at is not None:
        times.append(inp.final_at)
    lo, hi = min(times), max(times)
    intervals: list[tuple[int, int, int]] = [(lo, hi, _RANK[G.UNCLASSIFIED])]  # (start, end, rank)

    def add(cat: G, s: int | None, e: int | None) -> None:
        if s is not None and e is not None and e > s:
            intervals.append((s, e, _RANK[cat]))

    for sv in inp.saves:
        add(G.CHECKPOINT_SAVE, sv.start, sv.end)
    for rs in inp.restores:
        add(G.CHECKPOINT_RESTORE, rs.start, rs.end)
    completed = sorted((sv.end, sv.step) for sv in inp.saves if sv.completed and sv.end is not None)
    # interruptions: of each stretch that another follows or whose attempt was lost, and of lost attempts
    interruptions: list[int] = []
    last = len(atts) - 1
    for k, st in enumerate(sts):
        a = atts[st.attempt]
        nxt = sts[k + 1] if k + 1 < len(sts) else None
        first_at, last_at = steps[st.start][0], steps[st.end - 1][0]
        same_attempt_next = nxt is not None and nxt.attempt == st.attempt
        if same_attempt_next:
            x = last_at
        elif a.lost and a.end is not None and (st.attempt < last or inp.lost_at_end):
            x = a.end
        elif nxt is not None:
            x = a.end if a.end is not None else last_at
        else:
            # the run's last stretch, not interrupted: productive to the run's end (or to now)
            add(G.PRODUCTIVE, first_at, inp.final_at if inp.final_at is not None else hi)
            continue
        x = max(x, last_at)
        interruptions.append(x)
        kept = _kept(steps, st, nxt, x, inp.restores, completed)
        add(G.PRODUCTIVE, first_at, kept)
        add(G.WASTED_PROGRESS, kept, x)
    for i, a in enumerate(atts):
        if a.lost and a.end is not None and (i < last or inp.lost_at_end):
            interruptions.append(a.end)
    first_record = steps[0][0] if steps else hi
    record_times = sorted(steps[st.start][0] for st in sts)
    for x in sorted(set(interruptions)):
        j = bisect_right(record_times, x)
        add(G.INFRASTRUCTURE_RECOVERY, x, record_times[j] if j < len(record_times) else
            (inp.final_at if inp.final_at is not None else hi))
    for a in atts:
        for cat, s, e in a.pending:
            if cat not in _STARTUP_PENDING:
                add(G.SCHEDULING, s, e if e is not None else (a.end if a.end is not None else hi))
    add(G.STARTUP, lo, first_record)
    return _sweep(intervals), lo, hi


def _kept(steps: Sequence[tuple[int, int]], st: Stretch, nxt: Stretch | None, x: int, restores: Sequence[Restore],
          completed: Sequence[tuple[int, int]]) -> int:
    """The point an interrupted stretch's training was kept to (rule 3 of the module's docstring)."""
    first_at = steps[st.start][0]
    resume_step: int | None = None
    if nxt is not None:
        next_at, resume_step = steps[nxt.start]
        # a restore between the interruption and the next stretch's first record says where it went on from
        for rs in restores:
            if x <= rs.start <= next_at:
                resume_step = rs.step
    if resume_step is not None:
        # the completion of that checkpoint's save, if it was saved in this stretch
        ends = [end for end, step in completed if step == resume_step and first_at <= end <= x]
        if ends:
            return max(ends)
        reached = _reached(steps[st.start:st.end], resume_step)
        if reached is None:
            return x  # beyond the last record: everything up to the interruption was kept
        return max(first_at, min(reached, x))
    # nothing resumed it (yet): the last checkpoint it completed
    ends = [end for end, _step in completed if first_at <= end <= x]
    return max(ends) if ends else first_at


def _sweep(intervals: list[tuple[int, int, int]]) -> list[tuple[str, int, int]]:
    """Disjoint pieces of the union of the intervals, each with the category of the lowest rank covering it."""
    edges: list[tuple[int, int, int]] = []  # (time, +1/-1, rank)
    for s, e, rank in intervals:
        edges.append((s, 1, rank))
        edges.append((e, -1, rank))
    edges.sort()
    counts = [0] * len(_ORDER)
    out: list[tuple[str, int, int]] = []
    prev: int | None = None
    i = 0
    while i < len(edges):
        t = edges[i][0]
        if prev is not None and t > prev:
            cat = next((_ORDER[r].value for r, c in enumerate(counts) if c > 0), None)
            if cat is not None:
                if out and out[-1][0] == cat and out[-1][2] == prev:
                    out[-1] = (cat, out[-1][1], t)
                else:
                    out.append((cat, prev, t))
        while i < len(edges) and edges[i][0] == t:
            counts[edges[i][2]] += edges[i][1]
            i += 1
        prev = t
    return out


def _held(h: Held | Sequence[tuple[int, int]]) -> Held:
    return Events(h) if isinstance(h, Sequence) else h


def _integrate(pieces: Sequence[tuple[str, int, int]], held: Held | Sequence[tuple[int, int]]) -> dict[str, int]:
    """GPU-µs by category: the GPUs ``held`` integrated over each piece (the pieces cover every bind and release,
    and the open pods up to the last piece's end). Costs a query of ``held`` per piece edge, not a pass over its
    events: a change of one pod of a 4,096-pod run does not read the other pods."""
    h = _held(held)
    span = h.span()
    if span is None:
        return {}
    area = h.areas()
    out: dict[str, int] = {}
    prev_x, prev_a = None, 0
    for cat, s, e in pieces:
        if e <= span[0]:
            continue
        a0 = prev_a if s == prev_x else area(s)
        a1 = area(e)
        prev_x, prev_a = e, a1
        if a1 != a0:
            out[cat] = out.get(cat, 0) + a1 - a0
    return out
