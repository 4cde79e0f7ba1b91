"""A run's metrics as the reducer keeps them: each metric's summary (``MetricFacts``: first, latest, least and
largest value, points reported) and its curves, bounded and downsampled (``MetricPoints``), with what changed in them
since the derivation last took them. Part of a run's facts (``facts.RunFacts.metrics``, ``points``); the same
commutative merging holds (see ``facts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

METRIC_POINTS_PER_RUN = 512  # the default of ``ReducerLimits.metric_points_per_run``
_MAX_WIDTH = 1 << 63  # a step bucket this wide holds every step (steps are below 2**63)

MetricPoint = tuple[int, float, int]  # (step, value, at): one kept point of a metric's curve

__all__ = ["METRIC_POINTS_PER_RUN", "MetricFacts", "MetricPoint", "MetricPoints"]


@dataclass(slots=True)
class MetricFacts:
    first: tuple[int, float]
    latest: tuple[int, float]
    lo: float
    hi: float
    points: int

    def add(self, step: int, value: float) -> None:
        pt = (step, value)
        if pt < self.first:
            self.first = pt
        if pt > self.latest:
            self.latest = pt
        if value < self.lo:
            self.lo = value
        if value > self.hi:
            self.hi = value
        self.points += 1


@dataclass(slots=True)
class MetricPoints:
    """A run's metric curves, bounded and downsampled: at most ``cap`` points over all its metrics (or one per
    metric when it has more metrics than that).

    Steps fall in buckets of one width for the whole run, a power of two (1 at first): point (metric, step) is in
    bucket ``step // width``, and each (metric, bucket) keeps the point of the smallest step; of two reports of one
    (metric, step), the one of the latest event time, then the larger value. When the run holds more than ``cap``
    points the width doubles (each coarser bucket keeps the smallest step of the two it merges) until it holds
    ``cap`` or fewer, or every metric is down to one bucket. The number of buckets only grows with the points
    seen and only shrinks as the width grows, so the width is the smallest that fits all the points seen, and
    the kept points are each bucket's least point at that width: a function of the set of points, whatever the
    order they arrive in and however often (``tests/core/test_metric_points.py``). ``schemas/index/README.md``
    documents the rule for readers.
    """

    width: int = 1
    curves: dict[str, dict[int, MetricPoint]] = field(default_factory=dict)  # metric -> bucket -> its point
    size: int = 0  # points kept over every metric (not serialized: recounted)
    # what changed since the derivation last took the points (``drain``; not serialized, not compared): the
    # (metric, step) of the points added or replaced, and of the points no longer kept (None: none; an empty set
    # is 216 bytes a run). At most one entry each per point reported since then: every run whose facts changed is
    # derived and taken at the next flush.
    changed: set[tuple[str, int]] | None = field(default=None, compare=False, repr=False)
    gone: set[tuple[str, int]] | None = field(default=None, compare=False, repr=False)

    def add(self, metric: str, step: int, value: float, at: int, cap: int) -> None:
        if cap <= 0:
            return
        value += 0.0  # -0.0 and 0.0 are one value: keep a single representation
        curve = self.curves.get(metric)
        if curve is None:
            curve = self.curves[metric] = {}
        b = step // self.width
        cur = curve.get(b)
        if cur is None:
            curve[b] = (step, value, at)
            self.size += 1
            self._changed(metric, step, None)
            if self.size > cap:
                self._coarsen(cap)
        elif step < cur[0] or (step == cur[0] and (at, value) > (cur[2], cur[1])):
            curve[b] = (step, value, at)
            self._changed(metric, step, cur[0] if cur[0] != step else None)

    def _changed(self, metric: str, step: int, dropped: int | None) -> None:
        if self.changed is None:
            self.changed = set()
        self.changed.add((metric, step))
        if dropped is not None:
            self._dropped(metric, dropped)

    def _dropped(self, metric: str, step: int) -> None:
        if self.gone is None:
            self.gone = set()
        self.gone.add((metric, step))

    def drain(self) -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
        """What changed since the last drain, and forget it: the (metric, step) of the points added or replaced
        that are still kept, and of the points kept at some time since then that no longer are."""
        changed, gone = self.changed or set(), self.gone or set()
        self.changed = self.gone = None
        if not changed and not gone:
            return changed, gone
        kept = {k for k in changed | gone if self.holds(*k)}
        return changed & kept, gone - kept

    def holds(self, metric: str, step: int) -> bool:
        """Whether (metric, step) is a point kept."""
        curve = self.curves.get(metric)
        pt = None if curve is None else curve.get(step // self.width)
        return pt is not None and pt[0] == step

    def point(self, metric: str, step: int) -> tuple[int, float, int]:
        """The kept point (step, value, at) of (metric, step) (``holds`` says whether there is one)."""
        return self.curves[metric][step // self.width]

    def _coarsen(self, cap: int) -> None:
        while self.size > cap and self.width < _MAX_WIDTH and \
                any(b for curve in self.curves.values() for b in curve):  # some metric has a bucket above 0
            self.width *= 2
            size = 0
            for metric, curve in self.curves.items():
                coarse: dict[int, MetricPoint] = {}
                for b, pt in curve.items():  # of two fine buckets merged, the smaller step wins (steps differ)
                    cb = b >> 1
                    old = coarse.get(cb)
                    if old is None or pt[0] < old[0]:
                        coarse[cb] = pt
                        if old is not None:
                            self._dropped(metric, old[0])
                    else:
                        self._dropped(metric, pt[0])
                self.curves[metric] = coarse
                size += len(coarse)
            self.size = size

    def to_json(self) -> list[Any]:
        return [self.width, {k: sorted(c.values()) for k, c in self.curves.items()}]

    @classmethod
    def from_json(cls, v: list[Any] | None) -> MetricPoints:
        if not v:  # older snapshots kept no points
            return cls()
        width = v[0]
        curves = {k: {p[0] // width: (p[0], p[1], p[2]) for p in pts} for k, pts in v[1].items()}
        return cls(width, curves, sum(len(c) for c in curves.values()))
