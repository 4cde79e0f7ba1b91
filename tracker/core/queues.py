"""Kueue's queues: what a pending run waits behind (issue 24, point 4).

ClusterQueues and LocalQueues are not parts of a run: the watcher publishes them keyed by queue (``queue_key``:
``queue:<ClusterQueue>``, ``queue:<namespace>/<LocalQueue>``), and the reducer keeps the newest state of each
(``QueueBook``): pending, reserving and admitted workload counts, the nominal quota and usage per flavor and
resource, the stopped state, the Active condition and the admission checks. The newest version of a queue wins by
``metadata.resourceVersion`` (as the run facts do, ``facts.newer``), so duplicates, relists and late versions
change nothing; a deletion is kept as a tombstone with its resourceVersion, so a late older version does not bring
the queue back.

Where Kueue's visibility API is served, the watcher polls the pending workloads of each ClusterQueue that has any
and publishes one *position record* per pending run (``QUEUE_POSITION_SCHEMA``, keyed by the run): the workload's
position in its ClusterQueue and LocalQueue at the poll's time (``polled_at``, a field of the record: the reducer
reads no clock). A position is null when the run was in the previous poll and is in the queue no longer. The newest
poll wins by ``polled_at``.

Pure: no clock, no I/O, no logging. ``Malformed`` (from ``extract``) says why an object or record cannot be used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tracker.core import extract as x
from tracker.core.facts import newer
from tracker.core.model import iso
from tracker.core.timefmt import BadTimestamp, ts
from tracker.core.wire import QUEUE_KEY_PREFIX

QUEUE_KINDS = ("ClusterQueue", "LocalQueue")  # a tuple: `in` compares, so an unhashable kind is simply not one
QUEUE_POSITION_SCHEMA = "taugrid.io/queue-position/v1"
MAX_RESOURCES = 256  # (flavor, resource) rows kept per queue; a larger queue is cut (the rest is not kept)
MAX_CHECKS = 64  # admission checks named per ClusterQueue


def queue_key(obj: dict[str, Any]) -> str:
    """The key of a ClusterQueue or LocalQueue object: ``queue:<name>`` or ``queue:<namespace>/<name>``. Raises
    Malformed when the object has no name (or a LocalQueue no namespace)."""
    kind = obj.get("kind")
    meta = x.obj_at(obj, "metadata")
    name = x.str_at(meta, "name")
    if not name:
        raise x.Malformed("metadata.name is missing")
    if kind == "ClusterQueue":
        return cluster_queue_key(name)
    if kind == "LocalQueue":
        namespace = x.str_at(meta, "namespace")
        if not namespace:
            raise x.Malformed("a LocalQueue without metadata.namespace")
        return local_queue_key(namespace, name)
    raise x.Malformed(f"not a queue kind: {kind!r}")


def cluster_queue_key(name: str) -> str:
    return f"{QUEUE_KEY_PREFIX}{name}"


def local_queue_key(namespace: str, name: str) -> str:
    return f"{QUEUE_KEY_PREFIX}{namespace}/{name}"


# ------------------------------------------------------------------------------------------ quantities

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {"": 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}


def quantity(value: Any) -> float | None:
    """A Kubernetes resource quantity (``8``, ``500m``, ``16Gi``) as a number; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str) or len(value) > 64:
        return None
    m = _QUANTITY.match(value.strip())
    if m is None:
        return None
    return float(m.group(1)) * _SUFFIX[m.group(2) or ""]


def _quantity_text(value: Any, where: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or quantity(value) is None:
        raise x.Malformed(f"{where} is not a resource quantity: {str(value)[:40]!r}")
    return value


# ------------------------------------------------------------------------------------------ state


@dataclass(frozen=True, slots=True)
class QueueResource:
    """One resource of one flavor of a queue: its nominal quota (ClusterQueues), what is reserved and what is used
    by admitted workloads, as the quantities Kueue wrote (``None``: not given)."""

    flavor: str
    resource: str
    nominal: str | None = None
    borrowing_limit: str | None = None
    reserved: str | None = None
    used: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"flavor": self.flavor, "resource": self.resource, "nominal": self.nominal,
                "borrowing_limit": self.borrowing_limit, "reserved": self.reserved, "used": self.used}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> QueueResource:
        return cls(d["flavor"], d["resource"], d.get("nominal"), d.get("borrowing_limit"), d.get("reserved"),
                   d.get("used"))


@dataclass(frozen=True, slots=True)
class QueueState:
    """The newest state of one ClusterQueue or LocalQueue (``deleted``: its deletion, kept as a tombstone)."""

    key: str
    kind: str  # ClusterQueue | LocalQueue
    namespace: str | None  # a LocalQueue's
    name: str
    uid: str
    resource_version: int | None
    updated_at: int | None  # µs: the object's latest time (creation, a condition's lastTransitionTime)
    cluster_queue: str | None  # a ClusterQueue's own name; a LocalQueue's spec.clusterQueue
    cohort: str | None = None
    stop_policy: str | None = None  # spec.stopPolicy (None, Hold, HoldAndDrain)
    stopped: bool = False  # stopPolicy other than None, or Active=False with reason Stopped
    active: bool | None = None  # the Active condition's status (None: no such condition)
    active_reason: str = ""
    active_message: str = ""
    pending: int = 0
    reserving: int = 0
    admitted: int = 0
    admission_checks: tuple[str, ...] = ()
    resources: tuple[QueueResource, ...] = ()
    deleted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "kind": self.kind, "namespace": self.namespace, "name": self.name, "uid": self.uid,
                "resource_version": self.resource_version, "updated_at": self.updated_at,
                "cluster_queue": self.cluster_queue, "cohort": self.cohort, "stop_policy": self.stop_policy,
                "stopped": self.stopped, "active": self.active, "active_reason": self.active_reason,
                "active_message": self.active_message, "pending": self.pending, "reserving": self.reserving,
                "admitted": self.admitted, "admission_checks": list(self.admission_checks),
                "resources": [r.to_json() for r in self.resources], "deleted": self.deleted}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> QueueState:
        return cls(d["key"], d["kind"], d["namespace"], d["name"], d["uid"], d["resource_version"], d["updated_at"],
                   d["cluster_queue"], d.get("cohort"), d.get("stop_policy"), bool(d.get("stopped")), d.get("active"),
                   d.get("active_reason", ""), d.get("active_message", ""), d.get("pending", 0),
                   d.get("reserving", 0), d.get("admitted", 0), tuple(d.get("admission_checks", ())),
                   tuple(QueueResource.from_json(r) for r in d.get("resources", ())), bool(d.get("deleted")))


@dataclass(frozen=True, slots=True)
class QueuePosition:
    """A pending run's place in its queues at one poll of Kueue's visibility API (None: no longer listed)."""

    run_id: str
    namespace: str
    workload: str
    cluster_queue: str
    local_queue: str | None
    position_in_cluster_queue: int | None
    position_in_local_queue: int | None
    polled_at: int  # µs, the poll's time as the watcher recorded it

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "namespace": self.namespace, "workload": self.workload,
                "cluster_queue": self.cluster_queue, "local_queue": self.local_queue,
                "position_in_cluster_queue": self.position_in_cluster_queue,
                "position_in_local_queue": self.position_in_local_queue, "polled_at": self.polled_at}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> QueuePosition:
        return cls(d["run_id"], d["namespace"], d["workload"], d["cluster_queue"], d.get("local_queue"),
                   d.get("position_in_cluster_queue"), d.get("position_in_local_queue"), d["polled_at"])

    def sort_key(self) -> tuple[int, int, int, str, str]:
        """Newest poll wins; a tie is broken by the record's content, so either arrival order gives one result."""
        return (self.polled_at, -1 if self.position_in_cluster_queue is None else self.position_in_cluster_queue,
                -1 if self.position_in_local_queue is None else self.position_in_local_queue, self.cluster_queue,
                self.workload)


def position_record(*, run_id: str, namespace: str, workload: str, cluster_queue: str, local_queue: str | None,
                    position_in_cluster_queue: int | None, position_in_local_queue: int | None,
                    polled_at: str) -> dict[str, Any]:
    """The record the watcher publishes for one pending run at one poll (``polled_at``: RFC 3339)."""
    return {"schema": QUEUE_POSITION_SCHEMA, "run_id": run_id, "namespace": namespace, "workload": workload,
            "cluster_queue": cluster_queue, "local_queue": local_queue,
            "position_in_cluster_queue": position_in_cluster_queue,
            "position_in_local_queue": position_in_local_queue, "polled_at": polled_at}


# ------------------------------------------------------------------------------------------ extraction


def _bool_status(value: str) -> bool | None:
    return True if value == "True" else False if value == "False" else None


def _updated_at(meta: dict[str, Any], status: dict[str, Any]) -> int | None:
    at = x.time_at(meta, "creationTimestamp")
    for c in x.list_at(status, "conditions"):
        if isinstance(c, dict):
            t = x.time_at(c, "lastTransitionTime")
            if t is not None and (at is None or t > at):
                at = t
    return at


def _active(status: dict[str, Any]) -> tuple[bool | None, str, str]:
    for c in x.list_at(status, "conditions"):
        if not isinstance(c, dict):
            raise x.Malformed("status.conditions[] must be objects")
        if x.str_at(c, "type") == "Active":
            return _bool_status(x.str_at(c, "status")), x.text_at(c, "reason"), x.cut_text(x.str_at(c, "message"), 1024)
    return None, "", ""


def _usage(status: dict[str, Any], key: str, into: dict[tuple[str, str], dict[str, str | None]], field_: str) -> None:
    """``status.<key>``: [{name: flavor, resources: [{name, total}]}] into ``into[(flavor, resource)][field_]``."""
    for f in x.list_at(status, key):
        if not isinstance(f, dict):
            raise x.Malformed(f"status.{key}[] must be objects")
        flavor = x.str_at(f, "name")
        for r in x.list_at(f, "resources"):
            if not isinstance(r, dict):
                raise x.Malformed(f"status.{key}[].resources[] must be objects")
            name = x.str_at(r, "name")
            if not flavor or not name:
                raise x.Malformed(f"status.{key}[]: a flavor or resource without a name")
            total = r.get("total")
            into.setdefault((flavor, name), {})[field_] = None if total is None else \
                _quantity_text(total, f"status.{key}[{flavor}].{name}.total")


def _nominal(spec: dict[str, Any], into: dict[tuple[str, str], dict[str, str | None]]) -> None:
    for g in x.list_at(spec, "resourceGroups"):
        if not isinstance(g, dict):
            raise x.Malformed("spec.resourceGroups[] must be objects")
        for f in x.list_at(g, "flavors"):
            if not isinstance(f, dict):
                raise x.Malformed("spec.resourceGroups[].flavors[] must be objects")
            flavor = x.str_at(f, "name")
            for r in x.list_at(f, "resources"):
                if not isinstance(r, dict):
                    raise x.Malformed("spec.resourceGroups[].flavors[].resources[] must be objects")
                name = x.str_at(r, "name")
                if not flavor or not name:
                    raise x.Malformed("spec.resourceGroups[]: a flavor or resource without a name")
                row = into.setdefault((flavor, name), {})
                if r.get("nominalQuota") is not None:
                    row["nominal"] = _quantity_text(r["nominalQuota"], f"nominalQuota of {flavor}/{name}")
                if r.get("borrowingLimit") is not None:
                    row["borrowing_limit"] = _quantity_text(r["borrowingLimit"], f"borrowingLimit of {flavor}/{name}")


def _checks(spec: dict[str, Any]) -> tuple[str, ...]:
    names: list[str] = []
    for c in x.list_at(spec, "admissionChecks"):
        if not isinstance(c, str):
            raise x.Malformed("spec.admissionChecks[] must be strings")
        names.append(c)
    strategy = x.obj_at(spec, "admissionChecksStrategy")
    for rule in x.list_at(strategy, "admissionChecks"):
        if not isinstance(rule, dict):
            raise x.Malformed("spec.admissionChecksStrategy.admissionChecks[] must be objects")
        name = x.str_at(rule, "name")
        if name:
            names.append(name)
    return tuple(sorted(set(names)))[:MAX_CHECKS]


def _count(status: dict[str, Any], key: str) -> int:
    n = x.int_at(status, key)
    if n < 0:
        raise x.Malformed(f"status.{key} is negative")
    return n


def extract_queue(etype: str, obj: dict[str, Any]) -> QueueState:
    """The state of a ClusterQueue or LocalQueue object (a DELETED one: its tombstone). Raises Malformed."""
    kind = obj.get("kind")
    key = queue_key(obj)
    meta = x.obj_at(obj, "metadata")
    uid = x.uid_of(meta)
    spec = x.obj_at(obj, "spec")
    status = x.obj_at(obj, "status")
    rv = x.resource_version(meta)
    name = x.str_at(meta, "name")
    namespace = x.str_at(meta, "namespace") or None if kind == "LocalQueue" else None
    stop_policy = x.str_at(spec, "stopPolicy") or None
    active, active_reason, active_message = _active(status)
    stopped = (stop_policy not in (None, "None")) or (active is False and active_reason == "Stopped")
    rows: dict[tuple[str, str], dict[str, str | None]] = {}
    if kind == "ClusterQueue":
        cluster_queue: str | None = name
        cohort = x.str_at(spec, "cohort") or x.str_at(spec, "cohortName") or None
        _nominal(spec, rows)
        _usage(status, "flavorsReservation", rows, "reserved")
        _usage(status, "flavorsUsage", rows, "used")
        checks = _checks(spec)
    else:
        cluster_queue = x.str_at(spec, "clusterQueue") or None
        cohort = None
        _usage(status, "flavorsReservation", rows, "reserved")
        _usage(status, "flavorUsage", rows, "used")  # v1beta1's name
        _usage(status, "flavorsUsage", rows, "used")
        checks = ()
    resources = tuple(QueueResource(f, r, v.get("nominal"), v.get("borrowing_limit"), v.get("reserved"),
                                    v.get("used")) for (f, r), v in sorted(rows.items()))[:MAX_RESOURCES]
    return QueueState(key=key, kind=str(kind), namespace=namespace, name=name, uid=uid, resource_version=rv,
                      updated_at=_updated_at(meta, status), cluster_queue=cluster_queue, cohort=cohort,
                      stop_policy=stop_policy, stopped=stopped, active=active, active_reason=active_reason,
                      active_message=active_message, pending=_count(status, "pendingWorkloads"),
                      reserving=_count(status, "reservingWorkloads"), admitted=_count(status, "admittedWorkloads"),
                      admission_checks=checks, resources=resources, deleted=etype == "DELETED")


def _position(record: dict[str, Any], key: str) -> int | None:
    v = record.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**31:
        raise x.Malformed(f"{key} must be a non-negative integer or null")
    return v


def extract_position(record: dict[str, Any]) -> QueuePosition:
    """A position record (``QUEUE_POSITION_SCHEMA``) as a QueuePosition. Raises Malformed."""
    if record.get("schema") != QUEUE_POSITION_SCHEMA:
        raise x.Malformed(f"schema must be {QUEUE_POSITION_SCHEMA!r}")
    for key in ("run_id", "namespace", "workload", "cluster_queue"):
        v = record.get(key)
        if not isinstance(v, str) or not v or len(v) > 512:
            raise x.Malformed(f"{key} must be a non-empty string")
    local = record.get("local_queue")
    if local is not None and (not isinstance(local, str) or len(local) > 512):
        raise x.Malformed("local_queue must be a string or null")
    polled = record.get("polled_at")
    if not isinstance(polled, str):
        raise x.Malformed("polled_at must be an RFC 3339 time")
    try:
        polled_at = ts(polled)
    except BadTimestamp as exc:
        raise x.Malformed(f"polled_at: {exc}") from exc
    if polled_at is None:
        raise x.Malformed("polled_at must be an RFC 3339 time")
    extra = set(record) - {"schema", "key", "run_id", "namespace", "workload", "cluster_queue", "local_queue",
                           "position_in_cluster_queue", "position_in_local_queue", "polled_at"}
    if extra:
        raise x.Malformed(f"unknown fields: {', '.join(sorted(extra))[:200]}")
    return QueuePosition(run_id=record["run_id"], namespace=record["namespace"], workload=record["workload"],
                         cluster_queue=record["cluster_queue"], local_queue=local or None,
                         position_in_cluster_queue=_position(record, "position_in_cluster_queue"),
                         position_in_local_queue=_position(record, "position_in_local_queue"), polled_at=polled_at)


# ------------------------------------------------------------------------------------------ the book


@dataclass(slots=True)
class QueueBook:
    """The newest state of every queue and the newest position of every run, and what changed since ``take``."""

    queues: dict[str, QueueState] = field(default_factory=dict)
    positions: dict[str, QueuePosition] = field(default_factory=dict)
    dirty_queues: set[str] = field(default_factory=set)
    dirty_positions: set[str] = field(default_factory=set)

    def apply(self, etype: str, obj: dict[str, Any]) -> bool:
        """Fold one watch event of a queue; True if it changed the kept state. Raises Malformed."""
        state = extract_queue(etype, obj)
        old = self.queues.get(state.key)
        if old is not None:
            if not newer(state.resource_version, old.resource_version):
                return False
            if old.resource_version == state.resource_version and (old.deleted or not state.deleted):
                return False  # the same version again (a deletion of it is newer than it)
        if old == state:
            return False
        self.queues[state.key] = state
        self.dirty_queues.add(state.key)
        return True

    def position(self, record: dict[str, Any]) -> bool:
        """Fold one position record; True if it changed the kept position. Raises Malformed."""
        pos = extract_position(record)
        old = self.positions.get(pos.run_id)
        if old is not None and pos.sort_key() <= old.sort_key():
            return False
        self.positions[pos.run_id] = pos
        self.dirty_positions.add(pos.run_id)
        return True

    def take(self) -> tuple[list[QueueState], list[QueuePosition]]:
        """What changed since the last ``take``, sorted by key and run id."""
        queues = [self.queues[k] for k in sorted(self.dirty_queues)]
        positions = [self.positions[k] for k in sorted(self.dirty_positions)]
        self.dirty_queues, self.dirty_positions = set(), set()
        return queues, positions

    def restore(self, item: QueueState | QueuePosition) -> None:
        """Keep a queue's state or a run's position read back from a changelog (``take`` does not report it)."""
        if isinstance(item, QueueState):
            self.queues[item.key] = item
        else:
            self.positions[item.run_id] = item

    def forget_run(self, run_id: str) -> None:
        """A retired run's position goes with it (its row stays where it was written)."""
        self.positions.pop(run_id, None)
        self.dirty_positions.discard(run_id)

    def to_json(self) -> dict[str, Any]:
        return {"queues": [self.queues[k].to_json() for k in sorted(self.queues)],
                "positions": [self.positions[k].to_json() for k in sorted(self.positions)],
                "dirty_queues": sorted(self.dirty_queues), "dirty_positions": sorted(self.dirty_positions)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> QueueBook:
        book = cls()
        book.queues = {q["key"]: QueueState.from_json(q) for q in d.get("queues", ())}
        book.positions = {p["run_id"]: QueuePosition.from_json(p) for p in d.get("positions", ())}
        book.dirty_queues = set(d.get("dirty_queues", ()))
        book.dirty_positions = set(d.get("dirty_positions", ()))
        return book


def iso_time(us: int | None) -> str | None:
    """µs since the epoch as the index writes times."""
    return iso(us)
