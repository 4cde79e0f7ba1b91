"""What the tracker knows about one run: facts gathered from every object of the run.

Each fact is merged with a commutative, associative and idempotent operation (set union, min, max,
k-smallest). A fact that is an object's current value (a condition's message, the reason a Workload waits, a
root's labels) is kept from the object version with the highest ``metadata.resourceVersion`` that carried it,
so a version that arrives again, or late, changes nothing (``newer``). That is what makes the reducer's laws
hold: duplicates and relists add nothing new, and interleaving the streams of different objects cannot change
the result. History is derived from these facts (``derive.py``), never accumulated from arrival order.

All times are integer microseconds since the epoch, UTC.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tracker.core.curves import MetricFacts, MetricPoints
from tracker.core.ledger_facts import Checkpoints, StepTrail

CondKey = tuple[str, str, str, int]  # (type, status, reason, lastTransitionTime)
# condition -> message
CondFacts = dict[CondKey, str]
# condition -> resourceVersion of the object version its message is from
CondVersions = dict[CondKey, int]

MAX_EVENTS_PER_RUN = 64
MAX_PROGRESS_BUCKETS = 20_000
MAX_PROGRESS_SEEN = 10_000
PROGRESS_BUCKET_US = 60_000_000


def seen_minute(at: int) -> int:
    """The progress minute of a report's time (``PROGRESS_BUCKET_US``): a run-state changelog keeps each minute's
    report ids, earliest report and step records apart."""
    return at // PROGRESS_BUCKET_US


def newer(rv: int | None, seen: int | None) -> bool:
    """Whether an object version with resourceVersion ``rv`` may set a value last set by version ``seen``: it is
    not older. Without a resourceVersion on either side, the later arrival sets it (the object's own order)."""
    return rv is None or seen is None or rv >= seen


class Unschedulable(NamedTuple):
    """A pod's condition PodScheduled=False."""

    at: int  # lastTransitionTime
    reason: str
    message: str


class PodEnd(NamedTuple):
    """How a pod ended: its phase Succeeded or Failed, with when and why."""

    at: int  # the last container's finishedAt; else the deletion asked for; else the last Ready=False
    phase: str  # Succeeded or Failed
    reason: str  # the first failed container's (e.g. OOMKilled, Error), else the pod's; Completed if it succeeded
    exit_code: int  # -1 if no container exited non-zero
    message: str


class RayOutcome(NamedTuple):
    """How a RayJob deployment ended (or that it is retried), as the RayJob's status said."""

    end: int  # status.endTime (or rayJobInfo.endTime), -1 if neither
    deployment_status: str  # jobDeploymentStatus: Complete, Failed or Retrying
    job_status: str  # the Ray job's jobStatus (SUCCEEDED, FAILED, STOPPED, ...)
    reason: str
    message: str


class RayClusterFacts(NamedTuple):
    uid: str
    created: int | None
    ready: int | None  # stateTransitionTimes.ready, else RayClusterProvisioned=True of a ready one


# Snapshots hold these named tuples as plain JSON arrays: ``to_json`` turns them into plain tuples (orjson, which
# encodes the snapshots, does not encode a NamedTuple), ``from_json`` back into named ones.


@dataclass(slots=True)
class PodFacts:
    name: str
    owner_uid: str | None = None
    ray_cluster: str | None = None
    created: int | None = None
    node: str | None = None
    scheduled: int | None = None
    unschedulable: Unschedulable | None = None  # the latest
    started: int | None = None
    finished: PodEnd | None = None
    delete_requested: int | None = None
    disrupted: bool = False
    waiting_reason: str | None = None
    # resourceVersions of the pod versions ``unschedulable`` and ``waiting_reason`` are from
    unschedulable_rv: int | None = None
    waiting_rv: int | None = None
    gpus: int = 0  # accelerators its containers request (tracker.core.gpu)

    def to_json(self) -> list[Any]:
        return [self.name, self.owner_uid, self.ray_cluster, self.created, self.node, self.scheduled,
                _plain(self.unschedulable), self.started, _plain(self.finished), self.delete_requested, self.disrupted,
                self.waiting_reason, self.unschedulable_rv, self.waiting_rv, self.gpus]

    @classmethod
    def from_json(cls, v: list[Any]) -> PodFacts:
        return cls(v[0], v[1], v[2], v[3], v[4], v[5], Unschedulable(*v[6]) if v[6] else None, v[7],
                   PodEnd(*v[8]) if v[8] else None, v[9], v[10], v[11], *v[12:15])  # older snapshots: no versions, gpus


@dataclass(slots=True)
class RayAttemptFacts:
    """One RayJob deployment, keyed by its status.startTime (regenerated on every New -> Initializing)."""

    cluster: str | None = None
    failed: int = 0
    app_started: int | None = None
    outcome: RayOutcome | None = None

    def to_json(self) -> list[Any]:
        return [self.cluster, self.failed, self.app_started, _plain(self.outcome)]

    @classmethod
    def from_json(cls, v: list[Any]) -> RayAttemptFacts:
        return cls(v[0], v[1], v[2], RayOutcome(*v[3]) if v[3] else None)


@dataclass(slots=True)
class EventFacts:
    reason: str
    type: str
    message: str
    object_kind: str
    object_name: str
    first: int
    last: int
    count: int

    def to_json(self) -> list[Any]:
        return [self.reason, self.type, self.message, self.object_kind, self.object_name, self.first,
                self.last, self.count]

    @classmethod
    def from_json(cls, v: list[Any]) -> EventFacts:
        return cls(*v)


@dataclass(slots=True)
class RunFacts:
    run_id: str
    # root object (Job or RayJob): identity and last-write-wins metadata
    kind: str | None = None
    uid: str | None = None
    namespace: str | None = None
    name: str | None = None
    created: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    expected_pods: int = 1
    root_deleted: int | None = None  # time of deletion (or the last time known) once DELETED is seen
    root_rv: int | None = None  # resourceVersion of the root version labels, annotations, expected_pods are from
    workload: tuple[tuple[str, ...], str | None] | None = None  # that version's (images, entrypoint): provenance
    job_conds: CondFacts = field(default_factory=dict)
    job_conds_rv: CondVersions = field(default_factory=dict)
    job_failed: int = 0
    # Kueue Workload
    wl_uid: str | None = None
    wl_name: str | None = None
    wl_created: int | None = None
    wl_conds: CondFacts = field(default_factory=dict)
    wl_conds_rv: CondVersions = field(default_factory=dict)
    wl_evictions: dict[str, int] = field(default_factory=dict)  # "reason\x1fcause" -> count
    wl_queue: str | None = None
    cq_by_admission: dict[int, str] = field(default_factory=dict)
    wl_pending: tuple[str, str] | None = None  # current QuotaReserved=False (reason, message)
    wl_rv: int | None = None  # resourceVersion of the Workload version wl_pending and wl_queue are from
    # status.admissionChecks: every (check name, state, "", lastTransitionTime) seen -> its message (as conditions)
    wl_checks: CondFacts = field(default_factory=dict)
    wl_checks_rv: CondVersions = field(default_factory=dict)
    wl_deletion: int | None = None  # the Workload's metadata.deletionTimestamp (less its grace period)
    root_deletion: int | None = None  # the root's metadata.deletionTimestamp (less its grace period)
    # the latest deletion asked for of any pod (less its grace period), and the latest container finishedAt: evidence
    # of when a deleted run ended (derive_rules._root_deleted)
    pods_deleted: int | None = None
    pods_finished: int | None = None
    # pods, Ray
    pods: dict[str, PodFacts] = field(default_factory=dict)
    ray: dict[int, RayAttemptFacts] = field(default_factory=dict)
    ray_clusters: dict[str, RayClusterFacts] = field(default_factory=dict)
    events: dict[str, EventFacts] = field(default_factory=dict)
    # intake: event id -> (kind, status, at, the event's other fields) of Resolution and Rendering events
    intake: dict[str, tuple[str, str, int, dict[str, Any]]] = field(default_factory=dict)
    # intake event ids of the most recent progress reports (bounded: see seen_progress)
    progress_seen: dict[str, int] = field(default_factory=dict)
    progress_buckets: dict[int, int] = field(default_factory=dict)
    metrics: dict[str, MetricFacts] = field(default_factory=dict)
    points: MetricPoints = field(default_factory=MetricPoints)  # the metrics' curves, downsampled
    checkpoint: tuple[int, int, str] | None = None  # the latest (step, at, uri)
    steps: StepTrail = field(default_factory=StepTrail)  # step records (the goodput ledger's)
    ckpts: Checkpoints = field(default_factory=Checkpoints)  # checkpoint saves, restores and the resume
    # Not a fact (not kept in snapshots): counts the progress reports merged, so that the derivation rebuilds the
    # metric curves, summaries and progress times only when one changed them (``derive.Derivation``).
    progress_seq: int = 0
    # Not a fact either: counts the merges that may change the history's shape (``derive._Shape``): every merge but
    # a progress report's, and a progress report's that changed the latest checkpoint (the derivation checks the
    # progress times itself: ``derive._Shape.holds``).
    shape_seq: int = 0
    # Nor this: once the run remembers MAX_PROGRESS_SEEN report ids, those ids by (time, id) (``seen_progress``),
    # built from the dict ``seen_of`` (another dict, as after a restore: built again)
    seen_order: list[str] | None = field(default=None, compare=False, repr=False)
    seen_of: dict[str, int] | None = field(default=None, compare=False, repr=False)
    # Nor this: the progress minutes (``seen_minute``) whose remembered report ids, earliest report or step records
    # changed since the last snapshot that kept them apart (``snapshot.Snapshots.snapshot_run(points_apart=True)``,
    # which sets it); None: every minute (a run never kept apart, or restored from a record that held them inside)
    minutes_changed: set[int] | None = field(default=None, compare=False, repr=False)

    # ---------------------------------------------------------------- merges used by the extractor
    def cond(self, conds: CondFacts, versions: CondVersions, key: CondKey, message: str, rv: int | None) -> None:
        """A condition, with the message of the newest object version that carried it."""
        seen = versions.get(key)
        if key in conds and not newer(rv, seen):
            return
        conds[key] = message
        if rv is not None:
            versions[key] = rv
        elif seen is not None:
            del versions[key]  # from a version without one: any version may replace it

    def pod(self, uid: str, name: str) -> PodFacts:
        p = self.pods.get(uid)
        if p is None:
            p = self.pods[uid] = PodFacts(name)
        return p

    def ray_attempt(self, start: int) -> RayAttemptFacts:
        a = self.ray.get(start)
        if a is None:
            a = self.ray[start] = RayAttemptFacts()
        return a

    def event(self, uid: str, ev: EventFacts) -> None:
        old = self.events.get(uid)
        if old is None:
            self.events[uid] = ev
            if len(self.events) > MAX_EVENTS_PER_RUN:
                # keep the k earliest events: a commutative bound, so order of arrival cannot matter
                drop = max(self.events.items(), key=lambda kv: (kv[1].first, kv[0]))[0]
                del self.events[drop]
            return
        old.first = min(old.first, ev.first)
        if (ev.last, ev.count) >= (old.last, old.count):
            old.message = ev.message
        old.last = max(old.last, ev.last)
        old.count = max(old.count, ev.count)

    def seen_progress(self, event_id: str, at: int) -> bool:
        """Whether this progress report was already counted; remembers it if not.

        Only the latest ``MAX_PROGRESS_SEEN`` reports (by time, then id) are remembered, so a long run's state
        stays small enough to snapshot; a report older than all of them is taken as a late repeat and ignored.
        """
        seen = self.progress_seen
        if event_id in seen:
            return True
        order = self.seen_order if self.seen_of is seen else None
        if len(seen) >= MAX_PROGRESS_SEEN:
            if order is None:  # the ids by (time, id), so that the oldest is found without a scan of them all
                order = self.ordered_seen()
            oldest = order[0]
            if (at, event_id) < (seen[oldest], oldest):
                return True
            self._minute_changed(seen.pop(order.pop(0)))
        seen[event_id] = at
        self._minute_changed(at)
        if order is not None:  # kept in order once built: reports come in time order, so near the end
            insort(order, event_id, key=lambda k: (seen[k], k))
        return False

    def ordered_seen(self) -> list[str]:
        """The remembered report ids by (time, id); ``seen_progress`` keeps the list in order from then on (built
        again for another dict of ids, as after a restore)."""
        seen = self.progress_seen
        if self.seen_order is None or self.seen_of is not seen:
            self.seen_order = sorted(seen, key=lambda k: (seen[k], k))
            self.seen_of = seen
        return self.seen_order

    def seen_in(self, minute: int) -> list[tuple[str, int]]:
        """The remembered report ids (and times) of one progress minute (``seen_minute``), by (time, id)."""
        seen, order = self.progress_seen, self.ordered_seen()
        lo = bisect_left(order, (minute * PROGRESS_BUCKET_US, ""), key=lambda k: (seen[k], k))
        hi = bisect_left(order, ((minute + 1) * PROGRESS_BUCKET_US, ""), key=lambda k: (seen[k], k))
        return [(k, seen[k]) for k in order[lo:hi]]

    def minutes(self) -> set[int]:
        """Every progress minute the run keeps something of: a remembered report id, a minute's earliest report or a
        step record (what a changelog keeps apart, ``snapshot.Snapshots.snapshot_run``)."""
        return {seen_minute(at) for at in self.progress_seen.values()} | self.progress_buckets.keys() | \
            {seen_minute(rec[0]) for rec in self.steps.records()}

    def _minute_changed(self, at: int) -> None:
        if self.minutes_changed is not None:
            self.minutes_changed.add(seen_minute(at))

    def step(self, at: int, step: int) -> None:
        """A step record (``StepTrail.add``), noting the progress minutes of the records it changed."""
        for t in self.steps.add(at, step):
            self._minute_changed(t)

    def progress_time(self, at: int) -> None:
        b = seen_minute(at)
        cur = self.progress_buckets.get(b)
        if cur is None or at < cur:
            self.progress_buckets[b] = at  # the shape reads it (``derive._Shape.holds``): no shape_seq
            self._minute_changed(at)
            if len(self.progress_buckets) > MAX_PROGRESS_BUCKETS:
                last = max(self.progress_buckets)
                self._minute_changed(self.progress_buckets.pop(last))

    def latest_checkpoint(self, step: int, at: int, uri: str) -> None:
        """A completed checkpoint reported with progress: kept if it is the latest (by step, time, then URI)."""
        cp = (step, at, uri)
        if self.checkpoint is None or cp > self.checkpoint:
            self.checkpoint = cp
            self.shape_seq += 1

    # ---------------------------------------------------------------- snapshot
    def to_json(self, pods: bool = True, points: bool = True) -> dict[str, Any]:
        """The facts as JSON values; ``pods=False`` leaves the pods out (a per-pod changelog keeps them apart:
        ``PodFacts.to_json``), and ``from_json`` then reads none; ``points=False`` leaves the metric points out but
        their width, the remembered report ids, the progress minutes and the step records but their width (a changelog
        keeps each point, and each progress minute's ids, earliest report and step records, apart:
        ``snapshot.Snapshots.snapshot_run``)."""
        doc = {
            "run_id": self.run_id, "kind": self.kind, "uid": self.uid, "namespace": self.namespace,
            "name": self.name, "created": self.created, "labels": self.labels,
            "annotations": self.annotations, "expected_pods": self.expected_pods,
            "root_deleted": self.root_deleted, "root_rv": self.root_rv,
            "job_conds": _conds_out(self.job_conds, self.job_conds_rv),
            "job_failed": self.job_failed, "wl_uid": self.wl_uid, "wl_name": self.wl_name,
            "wl_created": self.wl_created, "wl_conds": _conds_out(self.wl_conds, self.wl_conds_rv),
            "wl_evictions": self.wl_evictions, "wl_queue": self.wl_queue,
            "cq_by_admission": [[k, v] for k, v in self.cq_by_admission.items()],
            "wl_pending": self.wl_pending, "wl_rv": self.wl_rv,
            "wl_checks": _conds_out(self.wl_checks, self.wl_checks_rv), "wl_deletion": self.wl_deletion,
            "root_deletion": self.root_deletion, "pods_deleted": self.pods_deleted, "pods_finished": self.pods_finished,
            "pods": {k: v.to_json() for k, v in self.pods.items()} if pods else None,
            "ray": [[k, v.to_json()] for k, v in self.ray.items()],
            "ray_clusters": {k: tuple(v) for k, v in self.ray_clusters.items()},
            "events": {k: v.to_json() for k, v in self.events.items()},
            "intake": self.intake, "progress_seen": sorted(self.progress_seen.items()) if points else [],
            "progress_buckets": [[k, v] for k, v in self.progress_buckets.items()] if points else [],
            "metrics": {k: [list(m.first), list(m.latest), m.lo, m.hi, m.points]
                        for k, m in self.metrics.items()},
            "checkpoint": self.checkpoint, "points": self.points.to_json() if points else [self.points.width, {}],
            "steps": self.steps.to_json() if points else [self.steps.width, []], "ckpts": self.ckpts.to_json(),
            "workload": self.workload,
        }
        if not pods:
            del doc["pods"]
        return doc

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunFacts:
        r = cls(d["run_id"])
        r.kind, r.uid, r.namespace, r.name = d["kind"], d["uid"], d["namespace"], d["name"]
        r.created, r.labels, r.annotations = d["created"], d["labels"], d["annotations"]
        r.expected_pods, r.root_deleted, r.root_rv = d["expected_pods"], d["root_deleted"], d.get("root_rv")
        (r.job_conds, r.job_conds_rv), r.job_failed = _conds_in(d["job_conds"]), d["job_failed"]
        r.wl_uid, r.wl_name, r.wl_created = d["wl_uid"], d["wl_name"], d["wl_created"]
        (r.wl_conds, r.wl_conds_rv), r.wl_evictions = _conds_in(d["wl_conds"]), d["wl_evictions"]
        r.wl_queue = d["wl_queue"]
        r.cq_by_admission = {k: v for k, v in d["cq_by_admission"]}
        r.wl_pending = tuple(d["wl_pending"]) if d["wl_pending"] else None
        r.wl_rv = d.get("wl_rv")  # older snapshots have no resourceVersions: the next version sets the values
        r.wl_checks, r.wl_checks_rv = _conds_in(d.get("wl_checks") or [])  # older snapshots: none
        r.wl_deletion, r.root_deletion = d.get("wl_deletion"), d.get("root_deletion")
        r.pods_deleted, r.pods_finished = d.get("pods_deleted"), d.get("pods_finished")
        r.pods = {k: PodFacts.from_json(v) for k, v in d.get("pods", {}).items()}
        r.ray = {k: RayAttemptFacts.from_json(v) for k, v in d["ray"]}
        r.ray_clusters = {k: RayClusterFacts(v[0], v[1], v[2]) for k, v in d["ray_clusters"].items()}
        r.events = {k: EventFacts.from_json(v) for k, v in d["events"].items()}
        r.intake = {k: (v[0], v[1], v[2], v[3]) for k, v in d["intake"].items()}
        r.progress_seen = {k: v for k, v in d["progress_seen"]}
        r.progress_buckets = {k: v for k, v in d["progress_buckets"]}
        r.metrics = {k: MetricFacts((m[0][0], m[0][1]), (m[1][0], m[1][1]), m[2], m[3], m[4])
                     for k, m in d["metrics"].items()}
        r.checkpoint = tuple(d["checkpoint"]) if d["checkpoint"] else None
        r.points = MetricPoints.from_json(d.get("points"))
        r.steps = StepTrail.from_json(d.get("steps"))  # older snapshots: none (the ledger then says "accounting")
        r.ckpts = Checkpoints.from_json(d.get("ckpts"))
        r.workload = (tuple(w[0]), w[1]) if (w := d.get("workload")) else None  # older snapshots: none
        return r


def _plain(t: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    return None if t is None else tuple(t)


def _conds_out(c: CondFacts, versions: CondVersions) -> list[list[Any]]:
    """One row per condition: its key, its message, and the resourceVersion the message is from when known."""
    return [[*k, v, versions[k]] if k in versions else [*k, v] for k, v in c.items()]


def _conds_in(rows: list[list[Any]]) -> tuple[CondFacts, CondVersions]:
    conds: CondFacts = {}
    versions: CondVersions = {}
    for r in rows:
        key = (r[0], r[1], r[2], r[3])
        conds[key] = r[4]
        if len(r) > 5:
            versions[key] = r[5]
    return conds, versions


__all__ = [
    "Checkpoints",
    "CondFacts",
    "CondKey",
    "CondVersions",
    "EventFacts",
    "PodEnd",
    "PodFacts",
    "RayAttemptFacts",
    "RayClusterFacts",
    "RayOutcome",
    "RunFacts",
    "StepTrail",
    "Unschedulable",
    "newer",
]
