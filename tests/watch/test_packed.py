"""What a watch stream keeps of each known object (``tracker.shell.watch.packed``): packed and unpacked exactly,
smaller than its JSON for every kind, and what a relist's synthetic deletion carries is the object's last state."""

from __future__ import annotations

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
from tracker.shell.watch.packed import DICTIONARY, pack, unpack
from tracker.shell.watch.stream import Stream, WatchStats

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
