"""The wire format: the key, the kind and the headers of every record the tracker writes to Kafka, encoder and
decoder side by side (deploy/kafka/topics.md describes the topics).

A record's *value* is the JSON of a model (``tracker.core.model``, ``tracker.core.queues``, ``tracker.core.stuck``)
and is encoded and decoded where the model is; what tells records apart on a topic (their key, the header ``kind``)
is written here once, so that a change of key layout is one change, and the module that reads a record back
(``tracker.shell.transitions``, ``tracker.runtime.reduce``'s restore) uses the very rule the writer used.

- ``changes`` (written by ``tracker.shell.changes``, read by ``tracker reduce``): the value a watch event
  ``{"type", "object"}``; the key the run id the record belongs to (``change_key``: no key, the reducer
  dead-letters the record), ``queue:...`` for a Kueue queue object, ``node:<name>`` for a Node; header ``source``
  (``SOURCE_HEADER``): where the change was read (``watch:<stream>``, ``path:line``), so a dead letter can name it.
- ``transitions`` (``tracker.core.publish`` decides, ``tracker reduce`` writes, the sinks read): a run's parts as
  records of their own, told apart by the header ``kind`` (``HISTORY``, ``POINT``, ``POD``, ``QUEUE``,
  ``POSITION``, ``NODE``) and keyed so that compaction keeps the latest of each part (``record_key``): ``<run id>``,
  ``<run id>/point/<step>/<metric>`` (a metric point; a tombstone: the point is no longer kept),
  ``<run id>/pod/<uid>`` (a tombstone: the pod is no longer the run's), ``<run id>/position``,
  ``queue:<ClusterQueue>`` or ``queue:<namespace>/<LocalQueue>`` for a queue, ``node:<name>`` for a Node. A history
  carries its content hash (``CONTENT_HASH_HEADER``, the sha256 of the value). A record without ``kind`` is a whole
  history as a tracker before the split published it; one of kind ``POINTS`` (key ``<run id>/points``) is a run's
  complete set of points as a tracker before per-point records published it (its tombstone: that record is
  replaced by the run's point records). A run id is a label value or a uid: it holds no ``/`` and no ``:``.
- ``run-state`` (``tracker reduce`` writes and restores from it): a run's snapshot keyed by its run id, each of its
  pods keyed ``<run id>/pod/<uid>`` with header ``kind: pod`` (``POD_STATE_HEADERS``), each of its metric points
  keyed as on ``transitions`` (``point_key``) with header ``kind: point`` (``POINT_STATE_HEADERS``; snapshot version
  3: the run's snapshot holds their width only), each of its progress minutes (the report ids it remembers of the
  minute, its earliest report, its step records) keyed ``<run id>/minute/<minute>`` (``minute_key``) with header
  ``kind: minute`` (``MINUTE_STATE_HEADERS``; snapshot version 4: the run's snapshot holds none), a queue's, a
  position's or a Node's state under its transitions key with its ``kind``; a tombstone for what was forgotten.
- ``alerts``: a stuck-run alert keyed by its run id (``alert_key``). ``dead-letters``: no key, no header.

Pure: the standard library only (headers are ``(name, bytes)`` pairs as aiokafka takes and gives them).
"""

from __future__ import annotations

from collections.abc import Sequence

Headers = Sequence[tuple[str, bytes]]

# ------------------------------------------------------------------------------------------ changes

SOURCE_HEADER = "source"  # where the change was read ("watch:<stream>", "path:line")


def change_key(run_key: str | None) -> bytes | None:
    """The key of a changes record: its run key (an empty one is no key: the reducer dead-letters the record)."""
    return run_key.encode() if run_key else None


def change_headers(source: str) -> list[tuple[str, bytes]]:
    return [(SOURCE_HEADER, source.encode())]


def change_source(headers: Headers | None) -> str | None:
    """The ``source`` header of a changes record, if it has one."""
    value = header(headers, SOURCE_HEADER)
    return None if value is None else value.decode(errors="replace")


# ------------------------------------------------------------------------------------------ transitions

KIND_HEADER = "kind"  # of a transitions record: history, point, pod, queue, position, node (points: older ones);
# of a run-state one: pod, point, minute, queue, position or node
CONTENT_HASH_HEADER = "content-hash"  # of a history (or older points) record: the sha256 of its value, hex
HISTORY, POINT, POD = "history", "point", "pod"  # the kinds of a run's records on transitions
POINTS = "points"  # a run's complete set of points, as trackers before per-point records published it
QUEUE, POSITION = "queue", "position"  # Kueue's queues: a queue's newest state, a pending run's newest position
NODE = "node"  # a Kubernetes Node's newest state (``tracker.core.nodes``)
POINTS_SUFFIX = "/points"
POSITION_SUFFIX = "/position"
POD_KEY = "/pod/"  # a pod's key: <run id>/pod/<uid>
POINT_KEY = "/point/"  # a metric point's key: <run id>/point/<step>/<metric>
MINUTE_KEY = "/minute/"  # on run-state, a run's progress minute: <run id>/minute/<minute>
QUEUE_KEY_PREFIX = "queue:"  # a queue's key: queue:<ClusterQueue> or queue:<namespace>/<LocalQueue>
NODE_KEY_PREFIX = "node:"  # a Node's key on changes: node:<name> (``tracker.core.nodes``)


def record_key(run_id: str, kind: str, uid: str = "") -> str:
    """The key of a transitions record: the run id for its history, ``<run id>/points`` (older trackers),
    ``<run id>/pod/<uid>``, ``<run id>/position``; a queue's is its queue key (``queue:...``), a Node's its node key
    (``node:<name>``), each passed as ``run_id``; a metric point's is ``point_key``. Compaction keeps the latest
    record of each."""
    if kind in (HISTORY, QUEUE, NODE):
        return run_id
    if kind == POINTS:
        return f"{run_id}{POINTS_SUFFIX}"
    if kind == POSITION:
        return f"{run_id}{POSITION_SUFFIX}"
    return f"{run_id}{POD_KEY}{uid}"


def point_key(run_id: str, metric: str, step: int) -> str:
    """The key of a metric point's record: ``<run id>/point/<step>/<metric>`` (a metric's name may hold ``/``)."""
    return f"{run_id}{POINT_KEY}{step}/{metric}"


def point_of_key(key: str) -> tuple[str, str, int] | None:
    """``(run id, metric, step)`` of a metric point's key; None if ``key`` is not one."""
    run_id, sep, rest = key.partition(POINT_KEY)
    step, slash, metric = rest.partition("/")
    if not sep or not slash or not run_id:
        return None
    try:
        n = int(step)
    except ValueError:
        return None
    return (run_id, metric, n) if str(n) == step else None  # the step as record_key wrote it, nothing else


def minute_key(run_id: str, minute: int) -> str:
    """The run-state key of a run's progress minute (its report ids, its earliest report, its step records):
    ``<run id>/minute/<minute>``."""
    return f"{run_id}{MINUTE_KEY}{minute}"


def minute_of_key(key: str) -> tuple[str, int] | None:
    """``(run id, minute)`` of a key written by ``minute_key``; None if ``key`` is not one (a run id holds no ``/``,
    so no metric point's key is one)."""
    run_id, sep, minute = key.partition(MINUTE_KEY)
    if not sep or not run_id or "/" in run_id:
        return None
    try:
        n = int(minute)
    except ValueError:
        return None
    return (run_id, n) if str(n) == minute else None


def run_of_points_key(key: str) -> str | None:
    """The run id of an older tracker's points key (``<run id>/points``); None if ``key`` is not one."""
    run_id = key.removesuffix(POINTS_SUFFIX)
    return run_id if run_id != key and run_id and "/" not in run_id else None


def pod_of_key(key: str) -> tuple[str, str] | None:
    """``(run id, uid)`` of a pod's key (``<run id>/pod/<uid>``); None if ``key`` is not one."""
    run_id, sep, uid = key.partition(POD_KEY)
    return (run_id, uid) if sep else None


def is_queue_key(key: str) -> bool:
    """Whether a key is a queue's (``queue:...``) or a position's (``<run id>/position``), not a run's part."""
    return key.startswith(QUEUE_KEY_PREFIX) or key.endswith(POSITION_SUFFIX)


def is_node_key(key: str) -> bool:
    """Whether a key is a Node's (``node:<name>``)."""
    return key.startswith(NODE_KEY_PREFIX)


def kind_headers(kind: str, digest: str | None = None) -> tuple[tuple[str, bytes], ...]:
    """The headers of a transitions or run-state record of ``kind``, with its content hash if given."""
    out: tuple[tuple[str, bytes], ...] = ((KIND_HEADER, kind.encode()),)
    return out if digest is None else (*out, (CONTENT_HASH_HEADER, digest.encode()))


def kind_of(headers: Headers | None) -> str | None:
    """The ``kind`` header of a record, if it has one."""
    value = header(headers, KIND_HEADER)
    return None if value is None else value.decode(errors="replace")


def header(headers: Headers | None, name: str) -> bytes | None:
    """The first header called ``name``, if any."""
    return next((v for k, v in headers or () if k == name), None)


# ------------------------------------------------------------------------------------------ run-state, alerts

POD_STATE_HEADERS = ((KIND_HEADER, POD.encode()),)  # a pod's run-state record (key: record_key(run, POD, uid))
POINT_STATE_HEADERS = ((KIND_HEADER, POINT.encode()),)  # a metric point's run-state record (key: point_key)
MINUTE = "minute"  # the kind of a run's progress minute on run-state
MINUTE_STATE_HEADERS = ((KIND_HEADER, MINUTE.encode()),)  # (key: minute_key)


def alert_key(run_id: str) -> bytes:
    return run_id.encode()
