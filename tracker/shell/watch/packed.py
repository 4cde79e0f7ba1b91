"""What a watch stream keeps of each object it knows, packed: the slimmed object's compact JSON compressed with
zlib (raw deflate) against a preset dictionary of the slimmed shapes.

A stream keeps the last slimmed state of every object it knows (``Stream.known``), so that a relist after a gap
can publish the deletion it missed with the object's last state. Kept as JSON, that state was about half of the
watcher's memory per object (``bench/watcher.py``). Most of a slimmed object's bytes are its keys, a few
vocabularies (condition types, ``"status":"True"``, apiVersions, label keys) and its timestamps' common prefix:
``DICTIONARY`` holds them, built from ``tracker.shell.slim.SHAPES`` (one JSON skeleton per kind, in the order
``slim`` writes its keys) and the values the watched kinds repeat, so the shapes and the dictionary cannot drift.

Packing is memory-only: checkpoints (``tracker.shell.watch.checkpoint``, the SQLite file and the watch-state topic)
hold the JSON, unpacked by ``Watcher.snapshot`` and packed by ``Watcher.restore``; the dictionary may change from
one version to the next without touching stored state. ``unpack(pack(b)) == b`` for any bytes.

Cost (``bench/watcher.py``): about 10 us per handled change to pack; unpacking happens only for a checkpoint's
increment and for a deletion found by a relist.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from tracker.core.vocab import (
    LABEL_CONTROLLER_UID,
    LABEL_JOB_UID,
    LABEL_QUEUE,
    LABEL_RAY_CLUSTER,
    LABEL_RAY_NODE_TYPE,
    LABEL_RUN_ID,
)
from tracker.shell.slim import META_SHAPE, SHAPES, Shape

#: Raw deflate with an 8 KiB window: the dictionary fits in it, and a slimmed object (most are under 1.5 KiB) finds
#: all of it within reach. A larger object packs less well, never wrongly.
_WBITS = -13
_LEVEL = 6
_MEM_LEVEL = 4  # small hash tables: objects are small, and copying the primed compressor is cheaper


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


_API_VERSIONS = {"Job": "batch/v1", "RayJob": "ray.io/v1", "RayCluster": "ray.io/v1", "Pod": "v1", "Node": "v1",
                 "Workload": "kueue.x-k8s.io/v1beta1", "ClusterQueue": "kueue.x-k8s.io/v1beta1",
                 "LocalQueue": "kueue.x-k8s.io/v1beta1", "Event": "v1"}
_LABELS = (LABEL_CONTROLLER_UID, LABEL_JOB_UID, LABEL_RAY_CLUSTER, LABEL_RAY_NODE_TYPE, LABEL_QUEUE, LABEL_RUN_ID)
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
    '"Initializing"', '"Complete"', '"ready"',
)


def _dictionary() -> bytes:
    parts = [",".join(_VALUES)]
    for kind, shape in SHAPES.items():
        skeleton = _skeleton(shape)
        skeleton["apiVersion"] = _API_VERSIONS.get(kind, "v1")
        skeleton["kind"] = kind
        parts.append(json.dumps(skeleton, separators=(",", ":"))[:-1])
    meta = _skeleton(META_SHAPE)  # every kind's, once: the nearest, as the most frequent
    meta["labels"] = dict.fromkeys(_LABELS, "")
    parts.append(',"metadata":' + json.dumps(meta, separators=(",", ":")))
    parts.append('"creationTimestamp":"2026-01-01T00:00:00Z","lastTransitionTime":"20')
    return "".join(parts).encode()


#: The preset dictionary (about 4.7 KiB; the deflate window, 8 KiB, keeps it and the object's last 3 KiB in reach).
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

