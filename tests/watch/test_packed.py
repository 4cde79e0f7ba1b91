"""What a watch stream keeps of each known object (``tracker.shell.watch.packed``): packed and unpacked exactly,
smaller than its JSON for every kind, and what a relist's synthetic deletion carries is the object's last state."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sim import builders as b
from tracker.settings import WatchSettings
from tracker.shell import jsonio
from tracker.shell.capture import Record, capture_files, interleave
from tracker.shell.kube import Resource
from tracker.shell.slim import META_SHAPE, SHAPES, slim
from tracker.shell.watch.checkpoint import Saved
from tracker.shell.watch.packed import DICTIONARY, pack, unpack
from tracker.shell.watch.stream import Stream, WatchStats
from tracker.shell.watch.watcher import RESTORE_YIELD_EVERY, Watcher

DEMO = Path(__file__).resolve().parents[2] / "tracker" / "captures" / "demo"


def demo_objects() -> list[dict[str, Any]]:
    objs = [rec.value["object"] for rec in interleave(capture_files([DEMO]))
            if isinstance(rec, Record) and isinstance(rec.value, dict) and isinstance(rec.value.get("object"), dict)]
    return [o for o in objs if o.get("kind") in SHAPES]


@given(st.binary(max_size=20_000))
def test_any_bytes_unpack_to_what_was_packed(blob: bytes) -> None:
    assert unpack(pack(blob)) == blob


def test_every_demo_object_round_trips_and_packs_smaller_than_its_json() -> None:
    objs = demo_objects()
    by_kind: dict[str, list[tuple[int, int]]] = {}
    for obj in objs:
        blob = jsonio.dumps(slim(obj))
        packed = pack(blob)
        assert unpack(packed) == blob
        by_kind.setdefault(obj["kind"], []).append((len(blob), len(packed)))
    assert {"Job", "RayJob", "Workload", "Pod", "Event", "RayCluster", "Node"} <= by_kind.keys()
    for kind, sizes in by_kind.items():
        raw, packed = sum(s[0] for s in sizes), sum(s[1] for s in sizes)
        assert packed * 2 < raw, f"{kind}: {packed} packed bytes for {raw} of JSON"


def test_the_dictionary_holds_every_key_of_the_numerous_kinds_and_fits_the_window() -> None:
    def keys(shape: Any) -> set[str]:
        out: set[str] = set()
        for k, sub in shape.items():
            out.add(k)
            if isinstance(sub, list):
                out |= keys(sub[0])
            elif isinstance(sub, dict):
                out |= keys(sub)
        return out

    text = DICTIONARY.decode()
    kinds = ("Job", "RayJob", "Workload", "Pod", "Event", "RayCluster")
    missing = sorted(k for kind in kinds for k in keys(SHAPES[kind]) | keys(META_SHAPE)
                     if json.dumps(k) + ":" not in text)
    assert missing == []
    assert len(DICTIONARY) <= 4096 - 512  # the deflate window (``_WBITS``) keeps it and an object's last 512 B


def test_a_relist_deletes_what_vanished_with_its_last_state_and_the_checkpoint_gets_json() -> None:
    emitted: list[tuple[str, dict[str, Any]]] = []
    res = Resource(name="jobs", group="batch", versions=("v1",), plural="jobs", kind="Job", tier=0)
    stream = Stream(res, None, api=None, config=WatchSettings(), stats=WatchStats(),  # type: ignore[arg-type]
                    rng=random.Random(0), emit=lambda etype, obj, _src: emitted.append((etype, obj)),
                    dead_letter=lambda *_a: None, wait_room=_never)
    kept, gone = _job("kept", "10"), _job("gone", "11")
    gone["status"] = {"failed": 1, "startTime": "2026-08-20T10:00:00Z", "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "lastTransitionTime": "2026-08-20T10:05:00Z"}]}
    for obj in (kept, gone):
        stream.handle("ADDED", obj)
    increment = {uid: entry for uid, entry in stream.changed.items()}
    assert all(entry is not None and entry[1] != jsonio.dumps(slim(obj))
               for entry, obj in zip(increment.values(), (kept, gone), strict=True))  # kept packed, not as JSON
    stream.reconcile_end({kept["metadata"]["uid"]}, "20")
    assert emitted[-1] == ("DELETED", slim(gone))
    assert gone["metadata"]["uid"] not in stream.known and stream.stats.synthetic_deletes == 1


def _job(name: str, rv: str) -> dict[str, Any]:
    return b.job(meta={"name": name, "namespace": "team-a", "uid": b.uid("job", name), "resourceVersion": rv,
                       "creationTimestamp": "2026-08-20T09:00:00Z", "labels": {"taugrid.io/run-id": name}},
                 spec={"parallelism": 1, "completions": 1}, status={})


async def _never() -> None:
    return None


async def test_restoring_a_large_checkpoint_packs_it_rebinds_owners_and_lets_the_loop_run() -> None:
    watcher = Watcher(None, _Nowhere(), WatchSettings(visibility=False))  # type: ignore[arg-type]
    jobs_key = next(s.key for s in watcher.streams if s.res.kind == "Job")
    pods_key = next(s.key for s in watcher.streams if s.res.kind == "Pod")
    count = 2 * RESTORE_YIELD_EVERY + 1
    jobs = {b.uid("job", f"train-{i}"): ("1", jsonio.dumps(slim(_job(f"train-{i}", "1")))) for i in range(count)}
    owner = b.uid("job", "train-7")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "train-7-0", "namespace": "team-a", "uid": b.uid("pod", "7"), "resourceVersion": "2",
        "creationTimestamp": "2026-08-20T09:00:01Z", "labels": {"batch.kubernetes.io/controller-uid": owner},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train-7", "uid": owner,
                             "controller": True}]}}
    saved = Saved(rvs={jobs_key: "5"}, known={jobs_key: jobs, pods_key: {b.uid("pod", "7"): ("2", jsonio.dumps(pod))}})
    turns = 0

    async def tick() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    before = turns
    await watcher.restore(saved)
    ticker.cancel()
    assert turns - before >= 2  # the loop ran while it restored
    stream = next(s for s in watcher.streams if s.key == jobs_key)
    assert stream.rv == "5" and len(stream.known) == count
    assert all(unpack(packed) == jobs[uid][1] for uid, (_rv, packed) in stream.known.items())
    keyed = watcher.keys.key("MODIFIED", pod, source="test")
    assert [k[0] for k in keyed] == ["train-7"]  # the pod's owner was rebound from the checkpoint


class _Nowhere:
    async def publish(self, key: str, record: Any, *, source: str) -> None:
        raise AssertionError("nothing is published while restoring")

    async def flush(self) -> None:
        return None
