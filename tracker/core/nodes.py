"""Kubernetes Nodes: what a run's pods ran on (issue 28, point 1).

Nodes are not parts of a run: the watcher lists and watches them read-only, cluster-wide, and publishes them keyed by
node (``node_key``: ``node:<name>``); the reducer keeps the newest state of each (``NodeBook``) and flushes what
changed apart from the runs (``Flushed.nodes``), for the index's ``nodes`` table and ADX's ``TaugridNodeState``. The
readers join a run's pods to them by ``spec.nodeName``: the GPU model (``nvidia.com/gpu.product``) and count a run
ran on, and the nodes' conditions (NotReady since when).

What is kept of a Node (``tracker.shell.slim`` keeps no more): its name, uid, resourceVersion and creation and
deletion times; the labels of ``NODE_LABELS`` (GPU product, count and memory, instance type, zone, AKS agent pool);
the capacity and allocatable of its accelerator resources (``ReducerLimits.accelerator_resources``, the resources
counted as GPUs); its conditions (type, status, reason, redacted message, lastTransitionTime: not the heartbeat,
which changes every few seconds and says nothing the transition does not); ``spec.unschedulable`` (cordoned); the
keys and effects of its taints (not their values).

The newest version of a node wins by ``metadata.resourceVersion`` (as the run facts do, ``facts.newer``), so
duplicates, relists and late versions change nothing; a deletion is kept as a tombstone with its resourceVersion
(and its time: ``metadata.deletionTimestamp``, which a Node carries when it was deleted through the API; a Node
removed without one has no deletion time, since the reducer reads no clock), so a late older version does not bring
the node back. A version that changes nothing the tracker keeps (a heartbeat, an image list) moves the node's kept
resourceVersion but is not flushed again. Tombstones are bounded (``MAX_TOMBSTONES``: autoscaled node pools name
new nodes for ever); the one of the smallest resourceVersion goes first.

Pure: no clock, no I/O, no logging. ``Malformed`` (from ``extract``) says why an object cannot be used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracker.core import extract as x
from tracker.core.facts import newer
from tracker.core.gpu import DEFAULT_ACCELERATORS, Accelerators
from tracker.core.wire import NODE_KEY_PREFIX

NODE_KINDS = ("Node",)  # a tuple: `in` compares, so an unhashable kind is simply not one

LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"  # NVIDIA GPU feature discovery: e.g. NVIDIA-H100-80GB-HBM3
LABEL_GPU_COUNT = "nvidia.com/gpu.count"
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB per GPU
LABEL_AMD_GPU_PRODUCT = "amd.com/gpu.product"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_AGENT_POOL = "kubernetes.azure.com/agentpool"
#: The labels of a Node the tracker keeps (every other label is left out by the watcher and here).
NODE_LABELS = (LABEL_GPU_PRODUCT, LABEL_GPU_COUNT, LABEL_GPU_MEMORY, LABEL_INSTANCE_TYPE, LABEL_ZONE,
               LABEL_AGENT_POOL, LABEL_AMD_GPU_PRODUCT)
MAX_CONDITIONS = 32  # conditions kept per node (node-problem-detector adds its own to the kubelet's five)
MAX_TAINTS = 32
MAX_RESOURCES = 16  # accelerator resources kept per node in capacity and in allocatable
MAX_LABEL_VALUE = 256
MAX_MESSAGE = 256  # of a condition's message (redacted)
MAX_TOMBSTONES = 10_000  # deleted nodes remembered (each keeps a late older version from reviving its node)


def node_key(obj: dict[str, Any]) -> str:
    """The key of a Node object: ``node:<name>``. Raises Malformed when the object has no name."""
    if obj.get("kind") != "Node":
        raise x.Malformed(f"not a Node: {obj.get('kind')!r}")
    name = x.str_at(x.obj_at(obj, "metadata"), "name")
    if not name:
        raise x.Malformed("metadata.name is missing")
    return f"{NODE_KEY_PREFIX}{name}"


# ------------------------------------------------------------------------------------------ state


@dataclass(frozen=True, slots=True)
class NodeCondition:
    """One of a node's conditions: ``since`` is its lastTransitionTime (µs; None when it has none)."""

    type: str
    status: str  # True | False | Unknown
    reason: str = ""
    message: str = ""
    since: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "status": self.status, "reason": self.reason, "message": self.message,
                "since": self.since}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NodeCondition:
        return cls(d["type"], d["status"], d.get("reason", ""), d.get("message", ""), d.get("since"))


@dataclass(frozen=True, slots=True)
class NodeState:
    """The newest state of one Node (``deleted``: its deletion, kept as a tombstone)."""

    key: str
    name: str
    uid: str
    resource_version: int | None
    created_at: int | None  # µs
    updated_at: int | None  # µs: the object's latest time (creation, a condition's lastTransitionTime, deletion)
    labels: tuple[tuple[str, str], ...] = ()  # those of NODE_LABELS it has, by name
    capacity: tuple[tuple[str, str], ...] = ()  # accelerator resource -> quantity, by resource
    allocatable: tuple[tuple[str, str], ...] = ()
    conditions: tuple[NodeCondition, ...] = ()  # by type
    unschedulable: bool = False  # spec.unschedulable: cordoned
    taints: tuple[tuple[str, str], ...] = ()  # (key, effect), sorted
    deleted: bool = False
    deleted_at: int | None = None  # µs: metadata.deletionTimestamp, when it had one

    def label(self, name: str) -> str | None:
        return next((v for k, v in self.labels if k == name), None)

    @property
    def gpu_product(self) -> str | None:
        """The GPU model its labels name (NVIDIA's feature discovery, else AMD's), None when none does."""
        return self.label(LABEL_GPU_PRODUCT) or self.label(LABEL_AMD_GPU_PRODUCT)

    @property
    def gpu_count(self) -> int | None:
        """Its GPUs: the ``nvidia.com/gpu.count`` label, else the sum of its accelerator capacity; None when
        neither says."""
        text = self.label(LABEL_GPU_COUNT)
        if text is not None and text.isdigit():
            return int(text)
        counts = [int(q) for _r, q in self.capacity if q.isdigit()]
        return sum(counts) if counts else None

    def condition(self, type_: str) -> NodeCondition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    @property
    def ready(self) -> bool | None:
        """The Ready condition's status (None: no such condition, or Unknown)."""
        c = self.condition("Ready")
        return None if c is None else True if c.status == "True" else False if c.status == "False" else None

    def content(self) -> tuple[Any, ...]:
        """What the tracker keeps of the node but its resourceVersion (a heartbeat changes only that)."""
        return (self.key, self.name, self.uid, self.created_at, self.updated_at, self.labels, self.capacity,
                self.allocatable, self.conditions, self.unschedulable, self.taints, self.deleted, self.deleted_at)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "name": self.name, "uid": self.uid, "resource_version": self.resource_version,
                "created_at": self.created_at, "updated_at": self.updated_at, "labels": dict(self.labels),
                "capacity": dict(self.capacity), "allocatable": dict(self.allocatable),
                "conditions": [c.to_json() for c in self.conditions], "unschedulable": self.unschedulable,
                "taints": [list(t) for t in self.taints], "deleted": self.deleted, "deleted_at": self.deleted_at}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NodeState:
        return cls(d["key"], d["name"], d["uid"], d["resource_version"], d.get("created_at"), d.get("updated_at"),
                   tuple(sorted(d.get("labels", {}).items())), tuple(sorted(d.get("capacity", {}).items())),
                   tuple(sorted(d.get("allocatable", {}).items())),
                   tuple(NodeCondition.from_json(c) for c in d.get("conditions", ())), bool(d.get("unschedulable")),
                   tuple((str(k), str(e)) for k, e in d.get("taints", ())), bool(d.get("deleted")),
                   d.get("deleted_at"))


# ------------------------------------------------------------------------------------------ extraction


def _labels(meta: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    labels = x.obj_at(meta, "labels")
    out = []
    for name in NODE_LABELS:
        v = labels.get(name)
        if v is None:
            continue
        if not isinstance(v, str):
            raise x.Malformed(f"label {name} must be a string")
        out.append((name, x.cut_text(v, MAX_LABEL_VALUE)))
    return tuple(sorted(out))


def _resources(status: dict[str, Any], key: str, accelerators: Accelerators) -> tuple[tuple[str, str], ...]:
    out = []
    for name, q in x.obj_at(status, key).items():
        if name not in accelerators:
            continue
        if isinstance(q, int) and not isinstance(q, bool):
            q = str(q)
        if not isinstance(q, str) or not q.strip().isdigit():
            raise x.Malformed(f"status.{key}.{name} is not a whole number: {str(q)[:40]!r}")
        out.append((name, q.strip()))
    return tuple(sorted(out))[:MAX_RESOURCES]


def _conditions(status: dict[str, Any]) -> tuple[NodeCondition, ...]:
    out: dict[str, NodeCondition] = {}
    for c in x.list_at(status, "conditions"):
        if not isinstance(c, dict):
            raise x.Malformed("status.conditions[] must be objects")
        type_ = x.str_at(c, "type")
        if not type_:
            continue
        out[type_] = NodeCondition(type_, x.str_at(c, "status"), x.cut_text(x.text_at(c, "reason"), MAX_MESSAGE),
                                   x.cut_text(x.str_at(c, "message"), MAX_MESSAGE), x.time_at(c, "lastTransitionTime"))
    return tuple(out[k] for k in sorted(out))[:MAX_CONDITIONS]


def _taints(spec: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    out = set()
    for t in x.list_at(spec, "taints"):
        if not isinstance(t, dict):
            raise x.Malformed("spec.taints[] must be objects")
        key = x.str_at(t, "key")
        if key:
            out.add((key[:MAX_LABEL_VALUE], x.str_at(t, "effect")[:64]))
    return tuple(sorted(out))[:MAX_TAINTS]


def extract_node(etype: str, obj: dict[str, Any], accelerators: Accelerators = DEFAULT_ACCELERATORS) -> NodeState:
    """The state of a Node object (a DELETED one: its tombstone). Raises Malformed."""
    key = node_key(obj)
    meta = x.obj_at(obj, "metadata")
    uid = x.uid_of(meta)
    spec = x.obj_at(obj, "spec")
    status = x.obj_at(obj, "status")
    unschedulable = spec.get("unschedulable")
    if unschedulable is not None and not isinstance(unschedulable, bool):
        raise x.Malformed("spec.unschedulable must be a boolean")
    created = x.time_at(meta, "creationTimestamp")
    deleted_at = x.time_at(meta, "deletionTimestamp")
    conditions = _conditions(status)
    times = [t for t in (created, deleted_at, *(c.since for c in conditions)) if t is not None]
    return NodeState(key=key, name=x.str_at(meta, "name"), uid=uid, resource_version=x.resource_version(meta),
                     created_at=created, updated_at=max(times) if times else None, labels=_labels(meta),
                     capacity=_resources(status, "capacity", accelerators),
                     allocatable=_resources(status, "allocatable", accelerators), conditions=conditions,
                     unschedulable=bool(unschedulable), taints=_taints(spec), deleted=etype == "DELETED",
                     deleted_at=deleted_at)


# ------------------------------------------------------------------------------------------ the book


@dataclass(slots=True)
class NodeBook:
    """The newest state of every node, and the nodes whose kept state changed since ``take``."""

    nodes: dict[str, NodeState] = field(default_factory=dict)
    dirty: set[str] = field(default_factory=set)

    def apply(self, etype: str, obj: dict[str, Any], accelerators: Accelerators = DEFAULT_ACCELERATORS) -> bool:
        """Fold one watch event of a Node; True if it changed what is kept of it. Raises Malformed."""
        state = extract_node(etype, obj, accelerators)
        old = self.nodes.get(state.key)
        if old is not None:
            if not newer(state.resource_version, old.resource_version):
                return False
            if old.resource_version == state.resource_version and (old.deleted or not state.deleted):
                return False  # the same version again (a deletion of it is newer than it)
            if old.content() == state.content():
                self.nodes[state.key] = state  # a newer version of the same content: not flushed again
                return False
        self.nodes[state.key] = state
        self.dirty.add(state.key)
        if state.deleted:
            self._bound_tombstones()
        return True

    def _bound_tombstones(self) -> None:
        tombstones = [n for n in self.nodes.values() if n.deleted]
        if len(tombstones) <= MAX_TOMBSTONES:
            return
        tombstones.sort(key=lambda n: (n.resource_version or 0, n.key))
        for n in tombstones[:len(tombstones) - MAX_TOMBSTONES]:
            del self.nodes[n.key]
            self.dirty.discard(n.key)

    def restore(self, state: NodeState) -> None:
        """Keep ``state`` as the node's newest, as published before (a new owner of a partition restoring it): not
        flushed again."""
        self.nodes[state.key] = state
        if state.deleted:
            self._bound_tombstones()

    def take(self) -> list[NodeState]:
        """What changed since the last ``take``, sorted by key."""
        out = [self.nodes[k] for k in sorted(self.dirty) if k in self.nodes]
        self.dirty = set()
        return out

    def to_json(self) -> dict[str, Any]:
        return {"nodes": [self.nodes[k].to_json() for k in sorted(self.nodes)], "dirty": sorted(self.dirty)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NodeBook:
        book = cls()
        book.nodes = {n["key"]: NodeState.from_json(n) for n in d.get("nodes", ())}
        book.dirty = set(d.get("dirty", ()))
        return book
