"""Run keying: which run a watched object belongs to, so that every record of a run goes to one Kafka partition
(the reducer's own ``Correlator``, bounded)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from tracker.core import extract as x
from tracker.core.correlate import KINDS, Correlator, Held, Link, link
from tracker.core.nodes import NODE_KINDS, node_key
from tracker.core.queues import QUEUE_KINDS, queue_key
from tracker.shell.capture import BadRecord, Record

KeyedRecord = tuple[Record | BadRecord, str | None]  # a record and its run key (None: not keyed)


class RunKeyer:
    """Key records by run id with the reducer's ``Correlator``, bounded in held records and in runs: the watcher
    keys the changes it publishes with it (``key``), and ``tracker serve`` the records of capture files it
    publishes to Kafka (``key_record``), so both key as the reducer correlates.

    A record whose owner has not been seen yet is held (at most ``max_held``) and released, keyed, right after the
    record that binds its owner. Owner bindings are kept for the ``max_runs`` most recently seen runs (all of
    them if None); older runs are forgotten (a late record of a forgotten run is held, then dropped as
    uncorrelated, like a record whose owner was never seen).
    """

    def __init__(self, max_held: int, max_runs: int | None = None) -> None:
        self.corr = Correlator(max_held)
        self.max_runs = max_runs
        self.runs: OrderedDict[str, None] = OrderedDict()
        self.ignored = 0  # records of no run (a bare pod, an Event about a Node)
        self.held = 0
        self.released = 0
        self.dropped = 0
        self.just_dropped: list[tuple[str, Held]] = []  # for the caller to report, then clear

    def key(self, etype: str, obj: dict[str, Any], *, source: str) -> list[tuple[str, str, dict[str, Any], str]]:
        """``(run, type, object, source)`` for ``obj`` and every record its binding released, in order;
        empty if ``obj`` is held or belongs to no run. Raises ``Malformed``."""
        ln = link(obj)
        if ln is None:
            self.ignored += 1
            return []
        run = self.corr.run_of(ln)
        if run is None:
            assert ln.owner is not None
            self.held += 1
            dropped = self.corr.hold(ln.owner, (etype, obj, source))
            self.dropped += len(dropped)
            self.just_dropped.extend(dropped)
            return []
        self._touch(run)
        out = [(run, etype, obj, source)]
        if ln.uid:
            for held_etype, held_obj, held_source in self.corr.bind(ln.uid, run):
                self.released += 1
                out.extend(self.key(held_etype, held_obj, source=held_source))
        return out

    def restore(self, objects: Iterable[dict[str, Any]]) -> None:
        """Rebind the owners of checkpointed live objects: roots first, then their dependents by depth."""
        self.rebind([ln for obj in objects if (ln := self.link_of(obj)) is not None])

    @staticmethod
    def link_of(obj: dict[str, Any]) -> Link | None:
        """What ``rebind`` needs of a checkpointed object (None: nothing, or malformed)."""
        try:
            ln = link(obj)
        except x.Malformed:
            return None
        return ln if ln is not None and ln.uid else None

    def rebind(self, links: list[Link]) -> None:
        """``restore`` of the links of the objects (``link_of``), in any order."""
        depth = {"RayCluster": 1, "Job": 1, "Workload": 1, "Pod": 2}
        for ln in sorted(links, key=lambda ln: 0 if ln.run_id is not None else depth.get(ln.kind, 3)):
            run = self.corr.run_of(ln)
            if run is not None:
                self._touch(run)
                self.corr.bind(ln.uid, run)

    def held_records(self) -> list[tuple[str, Held]]:
        """(owner uid, record) of everything waiting, oldest first."""
        return [(owner, item) for (owner, _seq), item in self.corr.held.items()]

    def _touch(self, run: str) -> None:
        if self.max_runs is None:
            return
        self.runs[run] = None
        self.runs.move_to_end(run)
        while len(self.runs) > self.max_runs:
            old, _ = self.runs.popitem(last=False)
            self.corr.forget_run(old)

    # ------------------------------------------------------------ records of capture files (tracker serve)

    def key_record(self, item: Record | BadRecord) -> list[KeyedRecord]:
        """``(record, run key)`` for ``item`` and every record its binding released, in order. Records that belong
        to no run (and bookmarks) are dropped; records that cannot be keyed (malformed, or held too long: the
        oldest held when the bound is reached) come out with no key, for the reducer to dead-letter."""
        if isinstance(item, BadRecord) or not isinstance(item.value, dict):
            return [(item, None)]
        value = item.value
        if "schema" in value:
            run_id = value.get("run_id")
            return [(item, run_id if isinstance(run_id, str) and run_id else None)]
        etype, obj = value.get("type"), value.get("object")
        if etype is None and "object" not in value and value.get("kind") in (*QUEUE_KINDS, *NODE_KINDS, "List"):
            return _bare_queues(item)  # ``kubectl get clusterqueues,localqueues,nodes -o json``: no watch event
        if etype in ("BOOKMARK", "ERROR"):
            return []
        if isinstance(obj, dict) and isinstance(obj.get("kind"), str) and obj["kind"] in QUEUE_KINDS:  # by queue
            try:
                return [(item, queue_key(obj))]
            except x.Malformed:
                return [(item, None)]
        if isinstance(obj, dict) and isinstance(obj.get("kind"), str) and obj["kind"] in NODE_KINDS:  # by node
            try:
                return [(item, node_key(obj))]
            except x.Malformed:
                return [(item, None)]
        if etype not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(obj, dict) \
                or not isinstance(obj.get("kind"), str) or obj["kind"] not in KINDS:
            return [(item, None)]  # the reducer makes it a dead letter
        try:
            keyed = self.key(etype, obj, source=item.source)
        except x.Malformed:
            return [(item, None)]
        dropped, self.just_dropped = self.just_dropped, []
        out: list[KeyedRecord] = [(item, keyed[0][0])] if keyed else []  # empty: held, or of no run
        out += [(Record(src, {"type": e, "object": o}), run_id) for run_id, e, o, src in keyed[1:]]
        out += [(Record(src, {"type": e, "object": o}), None) for _owner, (e, o, src) in dropped]
        return out

    def unkeyed(self) -> list[KeyedRecord]:
        """The records still held (their owner never came): with no key; the keyer holds nothing after."""
        held: list[KeyedRecord] = [(Record(src, {"type": e, "object": o}), None)
                                   for e, o, src in self.corr.held.values()]
        self.corr.held.clear()
        self.corr.held_by_owner.clear()
        return held


def _bare_queues(item: Record) -> list[KeyedRecord]:
    """A bare queue or Node object keyed by its queue or node; a List, each of its items apart (a queue or Node
    object keyed so, anything else unkeyed, for the reducer to dead-letter as it does in a replay)."""
    value = item.value
    items = value.get("items") if value.get("kind") == "List" else [value]
    if not isinstance(items, list):
        return [(item, None)]
    out: list[KeyedRecord] = []
    for obj in items:
        rec = item if obj is value else Record(item.source, obj)
        try:
            kind = obj.get("kind") if isinstance(obj, dict) else None
            out.append((rec, queue_key(obj) if kind in QUEUE_KINDS else node_key(obj) if kind in NODE_KINDS else None))
        except x.Malformed:
            out.append((rec, None))
    return out
