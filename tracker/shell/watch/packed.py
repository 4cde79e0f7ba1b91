"""What a watch stream keeps of each object it knows, packed: the slimmed object's compact JSON compressed with
zlib (raw deflate) against a preset dictionary of the slimmed shapes.

A stream keeps the last slimmed state of every object it knows (``Stream.known``), so that a relist after a gap
can publish the deletion it missed with the object's last state. Kept as JSON, that state was about half of the
watcher's memory per object (``bench/watcher.py``). Most of a slimmed object's bytes are its keys, a few
vocabularies (condition types, ``"status":"True"``, apiVersions, label keys) and its timestamps' common prefix:
``DICTIONARY`` holds them, built from ``tracker.shell.slim.SHAPES`` (one JSON skeleton per numerous kind, in the
order ``slim`` writes its keys) and the values the watched kinds repeat, so the shapes and the dictionary cannot
drift.

Packing is memory-only: checkpoints (``tracker.shell.watch.checkpoint``, the SQLite file and the watch-state topic)
hold the JSON, unpacked by ``Watcher.snapshot`` and packed by ``Watcher.restore``; the dictionary may change from
one version to the next without touching stored state. ``unpack(pack(b)) == b`` for any bytes.

Cost: about 8 us to pack a handled change and 3.5 us to unpack a checkpoint increment's object (the generator's
objects, 31% of their JSON), and a restart packs every checkpointed object once. ``bench/watcher.py``, alternated
with the tree before on a quiet machine: the state kept per watched object 1,056 -> 721 B, the watcher's CPU a change
200-219 -> 212-261 us in the initial sync and 108-126 -> 144-150 us in a catch-up of 4,000 changes after a restart
from a checkpoint of 6,000 objects (bench/README.md).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from tracker.core.vocab import LABEL_QUEUE, LABEL_RUN_ID
from tracker.shell.slim import CHILD_LABELS, META_SHAPE, SHAPES, Shape

#: Raw deflate with a 4 KiB window: the dictionary fits in it, and a slimmed object (most are under 1.5 KiB) finds
#: most of it within reach. A larger object packs less well, never wrongly.
_WBITS = -12
#: Level 2, small hash tables: 268 B for the generator's objects (level 6: 236 B) at 13 us instead of 17 (measured
#: on this machine); copying the primed compressor costs about 4 us of that.
_LEVEL = 2
_MEM_LEVEL = 2


def _skeleton(shape: Shape) -> Any:
    """``shape`` as a JSON value with every copied field empty: the keys a slimmed object of it carries, in order."""
    out: dict[str, Any] = {}
    for key, sub in shape.items():
        if sub is True:
            out[key] = ""
        elif isinstance(sub, list):
            out[key] = [_skeleton(sub[0])]
        else:
            out[key] = _skeleton(sub)
    return out


#: The kinds of the dictionary's skeletons, with their apiVersions: the numerous ones, the rarest first (queues and
#: Nodes are few objects and would push the dictionary past the window).
_KINDS = {"Event": "v1", "RayCluster": "ray.io/v1", "RayJob": "ray.io/v1", "Job": "batch/v1",
          "Workload": "kueue.x-k8s.io/v1beta1", "Pod": "v1"}
#: The labels slimmed objects keep: a child's (``CHILD_LABELS``, sorted: the same dictionary in every process) and
#: the run's and queue's of a root.
_LABELS = (*sorted(CHILD_LABELS), LABEL_RUN_ID, LABEL_QUEUE)
#: Values the watched kinds repeat: condition types and statuses, reasons, phases, events' reasons, resource names.
_VALUES = (
    '"status":"True"', '"status":"False"', '"status":"Unknown"', '"controller":true', '"type":"Normal"',
    '"type":"Warning"', '"kueue.x-k8s.io/v1beta2"', '"events.k8s.io/v1"', '"nvidia.com/gpu"', '"cpu"', '"memory"',
    '"Pending"', '"Running"', '"Succeeded"', '"Failed"', '"Complete"', '"SuccessCriteriaMet"', '"FailureTarget"',
    '"Suspended"', '"PodScheduled"', '"Initialized"', '"ContainersReady"', '"Ready"', '"PodReadyToStartContainers"',
    '"DisruptionTarget"', '"QuotaReserved"', '"Admitted"', '"PodsReady"', '"Evicted"', '"Preempted"', '"Requeued"',
    '"Finished"', '"Deactivated"', '"Scheduled"', '"FailedScheduling"', '"Pulling"', '"Pulled"', '"Created"',
    '"Started"', '"Killing"', '"SuccessfulCreate"', '"Completed"', '"PodCompleted"', '"Error"', '"OOMKilled"',
    '"BackoffLimitExceeded"', '"ContainerCreating"', '"RUNNING"', '"SUCCEEDED"', '"FAILED"', '"PENDING"',
    '"Initializing"', '"ready"',
)


def _dictionary() -> bytes:
    parts = [",".join(_VALUES)]
    for kind, api_version in _KINDS.items():
        skeleton = _skeleton(SHAPES[kind])
        skeleton["apiVersion"] = api_version
        skeleton["kind"] = kind
        parts.append(json.dumps(skeleton, separators=(",", ":"))[:-1])
    meta = _skeleton(META_SHAPE)  # every kind's, once: the nearest, as the most frequent
    meta["labels"] = dict.fromkeys(_LABELS, "")
    parts.append(',"metadata":' + json.dumps(meta, separators=(",", ":")))
    parts.append('"creationTimestamp":"2026-01-01T00:00:00Z","lastTransitionTime":"20')
    return "".join(parts).encode()


#: The preset dictionary (about 3.4 KiB, within the deflate window's 4 KiB).
DICTIONARY = _dictionary()
_PRIMED = zlib.compressobj(_LEVEL, zlib.DEFLATED, _WBITS, _MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY, DICTIONARY)


def pack(blob: bytes) -> bytes:
    """``blob`` (a slimmed object's JSON) compressed against ``DICTIONARY``."""
    c = _PRIMED.copy()
    return c.compress(blob) + c.flush()


def unpack(packed: bytes) -> bytes:
    """The bytes ``pack`` was given."""
    d = zlib.decompressobj(_WBITS, DICTIONARY)
    return d.decompress(packed) + d.flush()

