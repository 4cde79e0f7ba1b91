"""Which run an object belongs to.

A run is keyed by the ``taugrid.io/run-id`` label of its root (the Job or RayJob), else by the root's uid.
Everything else reaches its root through owners: a Workload through its ownerReference or
``kueue.x-k8s.io/job-uid``; a Pod through its owner Job (or, for Ray, its RayCluster); a RayCluster and the
KubeRay submitter Job through their RayJob; an Event through the object it is about.

An object seen before its owner is held (bounded, oldest dropped first with a reason) and handed back when
the owner is bound. Both the watcher (to key Kafka records by run) and the reducer use this one class.

A run id is TauGrid's identity for a run, and only one root has it: when a second Job or RayJob (another uid)
carries the same label, the reducer keeps the run for the root created first (then the smaller uid) and binds the
other's uids to ``lost_key(run_id)``, which is no run: what belongs to it is a dead letter.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tracker.core import extract as x
from tracker.core.model import LABEL_CONTROLLER_UID, LABEL_JOB_UID, LABEL_RUN_ID

ROOT_KINDS = ("Job", "RayJob")
HOLDABLE_EVENT_KINDS = frozenset({"Job", "Pod", "Workload", "RayJob", "RayCluster"})
KINDS = frozenset({"Job", "RayJob", "Workload", "Pod", "RayCluster", "Event"})
_LOST = "\x00lost\x00"  # no label has a NUL (they are [-A-Za-z0-9_.]); the reducer refuses intake run ids with it


def lost_key(run_id: str) -> str:
    """What the uids of a root that lost ``run_id`` to another root (and of its objects) are bound to."""
    return _LOST + run_id


def taken_run_id(key: str) -> str | None:
    """The run id a ``lost_key`` is for; None for a run id."""
    return key[len(_LOST):] if key.startswith(_LOST) else None


@dataclass(frozen=True, slots=True)
class Link:
    """How one object connects to its run."""

    kind: str
    uid: str  # the object's own uid, bound to the run so that others may refer to it ("" for Events)
    run_id: str | None  # set for a root: the run it defines
    owner: str | None  # else: the uid whose run this object belongs to
    submitter: bool = False  # the KubeRay submitter Job (part of a RayJob's run)


def link(obj: dict[str, Any]) -> Link | None:
    """How ``obj`` relates to a run; None when it is not part of any run. Raises Malformed."""
    kind = obj.get("kind")
    meta = x.obj_at(obj, "metadata")
    if kind in ROOT_KINDS:
        uid = x.uid_of(meta)
        owner = x.controller_owner(meta)
        if kind == "Job" and owner is not None and owner[0] == "RayJob":
            return Link("Job", uid, None, owner[1], submitter=True)
        label = x.obj_at(meta, "labels").get(LABEL_RUN_ID)
        return Link(kind, uid, label if isinstance(label, str) and label else uid, None)
    if kind == "Workload":
        owner = x.controller_owner(meta)
        owner_uid = owner[1] if owner and owner[0] in ROOT_KINDS else x.str_at(x.obj_at(meta, "labels"), LABEL_JOB_UID)
        if not owner_uid:
            raise x.Malformed("Workload has no Job/RayJob owner reference and no kueue.x-k8s.io/job-uid label")
        return Link(kind, x.str_at(meta, "uid"), None, owner_uid)
    if kind == "Pod":
        owner = x.controller_owner(meta)
        owner_uid = owner[1] if owner else x.str_at(x.obj_at(meta, "labels"), LABEL_CONTROLLER_UID)
        if not owner_uid:
            return None  # a bare pod is not part of a run
        return Link(kind, x.str_at(meta, "uid"), None, owner_uid)
    if kind == "RayCluster":
        owner = x.controller_owner(meta)
        if owner is None or owner[0] != "RayJob":
            return None  # a RayCluster not created by a RayJob is not a run
        return Link(kind, x.str_at(meta, "uid"), None, owner[1])
    if kind == "Event":
        involved = x.obj_at(obj, "regarding") or x.obj_at(obj, "involvedObject")
        uid = x.str_at(involved, "uid")
        if not uid or x.str_at(involved, "kind") not in HOLDABLE_EVENT_KINDS:
            return None
        return Link(kind, "", None, uid)
    raise x.Malformed(f"unknown kind {kind!r}")


Held = tuple[str, dict[str, Any], str]  # (watch event type, object, source)


class Correlator:
    """Owner uid -> run id bindings, and the records waiting for their owner. Deterministic, no I/O."""

    def __init__(self, max_held: int) -> None:
        if max_held <= 0:
            raise ValueError("max_held must be positive")
        self.max_held = max_held
        self.owner_run: dict[str, str] = {}
        self.run_owners: dict[str, set[str]] = {}  # inverse of owner_run
        self.held: OrderedDict[tuple[str, int], Held] = OrderedDict()
        self.held_by_owner: dict[str, list[tuple[str, int]]] = {}
        self.seq = 0

    def run_of(self, ln: Link) -> str | None:
        if ln.run_id is not None:
            return ln.run_id
        return self.owner_run.get(ln.owner) if ln.owner else None

    def hold(self, owner: str, item: Held) -> list[tuple[str, Held]]:
        """Keep ``item`` until ``owner`` is bound; returns what had to be dropped to stay within bounds."""
        key = (owner, self.seq)
        self.seq += 1
        self.held[key] = item
        self.held_by_owner.setdefault(owner, []).append(key)
        dropped = []
        while len(self.held) > self.max_held:
            old_key, old = self.held.popitem(last=False)
            keys = self.held_by_owner[old_key[0]]
            keys.remove(old_key)
            if not keys:
                del self.held_by_owner[old_key[0]]
            dropped.append((old_key[0], old))
        return dropped

    def bind(self, uid: str, run_id: str) -> list[Held]:
        """Bind ``uid`` to ``run_id``; returns the records that were waiting for it, in arrival order."""
        if not uid or self.owner_run.get(uid) == run_id:
            return []
        previous = self.owner_run.get(uid)
        if previous is not None:
            self.run_owners[previous].discard(uid)
        self.owner_run[uid] = run_id
        self.run_owners.setdefault(run_id, set()).add(uid)
        keys = self.held_by_owner.pop(uid, None)
        return [self.held.pop(k) for k in keys] if keys else []

    def rebind_run(self, run_id: str, to: str) -> None:
        """Bind every uid bound to ``run_id`` to ``to`` instead."""
        uids = self.run_owners.pop(run_id, set())
        for uid in uids:
            self.owner_run[uid] = to
        self.run_owners.setdefault(to, set()).update(uids)

    def owners_of(self, run_id: str) -> list[str]:
        return sorted(self.run_owners.get(run_id, ()))

    def forget_run(self, run_id: str) -> None:
        for uid in self.run_owners.pop(run_id, ()):
            self.owner_run.pop(uid, None)

    def held_items(self) -> list[tuple[int, str, Held]]:
        """The records waiting for their owner, in arrival order: (seq, owner uid, record)."""
        return [(seq, owner, item) for (owner, seq), item in self.held.items()]

    def held_version(self) -> tuple[int, int]:
        """Changes whenever the held records change (a hold advances ``seq``; a release or drop shrinks them)."""
        return self.seq, len(self.held)

    def load_held(self, items: list[tuple[int, str, Held]]) -> None:
        """Add records held before (by ``held_items``), keeping their order; the next ones come after them."""
        for seq, owner, item in sorted(items, key=lambda i: i[0]):
            self.held[(owner, seq)] = item
            self.held_by_owner.setdefault(owner, []).append((owner, seq))
            self.seq = max(self.seq, seq + 1)

    def to_json(self) -> dict[str, Any]:
        return {"owner_run": self.owner_run, "seq": self.seq,
                "held": [[k[0], k[1], *v] for k, v in self.held.items()]}

    @classmethod
    def from_json(cls, d: dict[str, Any], max_held: int) -> Correlator:
        c = cls(max_held)
        for uid, run_id in d["owner_run"].items():
            c.owner_run[uid] = run_id
            c.run_owners.setdefault(run_id, set()).add(uid)
        c.seq = d["seq"]
        for owner, seq, etype, obj, source in d["held"]:
            c.held[(owner, seq)] = (etype, obj, source)
            c.held_by_owner.setdefault(owner, []).append((owner, seq))
        return c
