"""Kubernetes watchers: list+watch every run object, survive restarts and 410s, publish keyed changes.

Theory of operation
-------------------
One *stream* per watched resource (times each configured namespace, or cluster-wide) runs the loop of
shared/reference/lifecycle.md §5:

1. LIST with ``limit``/``continue`` (a consistent read) and keep the *list's* resourceVersion;
2. WATCH from it with ``allowWatchBookmarks``, a server-side ``timeoutSeconds`` and a client socket read
   timeout, so that a half-open connection is detected instead of hanging for ever;
3. when the watch ends (server timeout, broken or silent connection), WATCH again from the last
   resourceVersion seen (an event's or a bookmark's), after a jittered, capped backoff if it failed;
4. on ``410 Gone`` (the history was compacted while the stream was away), LIST again and *reconcile* with
   what the stream knew: objects whose resourceVersion is unchanged are not published again, changed ones
   are published as MODIFIED, new ones as ADDED, and objects that vanished become synthetic DELETED
   changes carrying their last known state.

Each stream keeps the last resourceVersion and slimmed state of every object it handled (``known``,
bounded; the state packed against a dictionary of the slimmed shapes, ``packed``, about a third of its JSON):
that is what step 4 reconciles against, and what drops exact repeats (same uid and resourceVersion).
resourceVersions are opaque: they are compared for equality only, never ordered.

A handled change is slimmed (``tracker.shell.slim``), keyed by run id with the reducer's own
``Correlator`` (an object whose owner has not been seen is held, bounded, and released when the owner is)
and put on one bounded outbox, in the order handled; one task drains the outbox into the ``Publisher``.
A change that cannot be handled (malformed, or a bug in slimming or keying it) becomes a ``DeadLetter`` on the
same outbox, for a ``DeadLetterPublisher`` (Kafka: the dead-letters topic) or the log; the stream goes on.
Only a broken connection or stream (a line that is not JSON or not a watch event) makes a stream reconnect;
any other error of a stream's loop stops the watcher (``WatchFatal``) rather than reconnecting for ever.
Changes are handled synchronously, never across an await, so a snapshot of the watcher's state always
falls between two whole changes.

At start, streams list in tiers (Jobs and RayJobs, then Workloads and RayClusters, then Pods, then Events)
so that owners are usually bound before their dependents arrive and little has to be held.

What is watched (``resources()``), cluster-wide or per configured namespace:

- ``batch/v1`` Jobs, all of them (any Job may be a run's root; a KubeRay submitter Job joins its RayJob's run);
- ``v1`` Pods, narrowed by label selector to the two kinds a run has. Selectors cannot express "or", so there
  are two disjoint streams: ``batch.kubernetes.io/controller-uid`` (pods of a Job, set by the Job controller since
  Kubernetes 1.27) and ``ray.io/cluster,!batch.kubernetes.io/controller-uid`` (KubeRay head and worker pods);
- Events from ``events.k8s.io/v1`` (default) or ``v1``: both APIs serve the same objects, so only one is
  watched. Every Event is captured as it happens, including MODIFIED updates of ``count``/``series``, because
  Events expire after an hour; an Event's DELETED (its expiry) is not published;
- Kueue ``Workloads`` at the served version found by discovery (the group's preferred one of v1beta2/v1beta1),
  KubeRay ``RayJobs`` and ``RayClusters`` (``ray.io/v1``). A resource that is not served (CRD not installed)
  or not allowed (RBAC) is reported once and looked for again with a capped backoff; the other streams run.
- Kueue's ClusterQueues and LocalQueues, keyed by queue (``tracker.core.queues``), and ``v1`` Nodes, cluster-wide and
  keyed by node (``node:<name>``, ``tracker.core.nodes``): no parts of a run, they say what a pending run waits behind
  and what a run's pods ran on (GPU model, conditions). Nodes are listed last; a watcher RBAC does not allow to list
  them says so once and runs without them (``watch.nodes`` false: not watched at all).

Checkpoint
----------
Stream resourceVersions, ``known`` sets and held records are checkpointed in one transaction, to a
``CheckpointStore``: a local SQLite file (``Checkpoint``, saved in a worker thread: one replica, or a capture), or
the compacted watch-state topic (``kafka_checkpoint.KafkaCheckpoint``), which leader-elected replicas
share, so that a new leader resumes from where the previous one checkpointed, not from its own stale state (a
re-list would publish only the latest state of what changed during the handover, and no DELETED for what the
new leader never knew). A deposed leader's save is fenced by the new leader's and ends its term
(``LeadershipLost``). A checkpoint is written only after every record enqueued before its snapshot has been
published and the publisher flushed, so it never claims an undelivered record. A restart resumes each watch from its
checkpointed resourceVersion; if that is too old the server answers 410 and step 4 reconciles against the
checkpointed ``known`` set, so objects deleted while the watcher was down still produce a DELETED. Owner
bindings are rebuilt from the checkpointed objects. Delivery is at-least-once: after a crash, the changes
handled since the last checkpoint are published again (the reducer is idempotent).

HTTP goes through ``tracker.shell.kube`` (kubernetes_asyncio's ``ApiClient``, decoded into plain dicts), shared
with the leader election and ``tracker doctor``.

Modules, one job each:

- ``resources``: what is watched (``Resource`` definitions, ``resources()``);
- ``stream``: one LIST+WATCH loop (``Stream``), given what it needs; ``WatchStats``; the stream errors;
- ``keying``: which run a record belongs to (``RunKeyer``, also used by ``tracker serve`` for capture files);
- ``publish``: where keyed records go (``Publisher`` and its implementations; Kafka's is ``tracker.shell.changes``,
  the one producer of ``changes``) and the bounded ``Outbox``;
- ``checkpoint``: the resumable state and its stores (``CheckpointStore``, SQLite); ``kafka_checkpoint``: the
  shared store on the watch-state topic;
- ``watcher``: ``Watcher``, which ties them together, and its Prometheus view ``WatchCollector``.

The watcher's settings are ``tracker.settings.WatchSettings`` (section ``watch``).
"""

from tracker.settings import WatchSettings
from tracker.shell.kube import ApiError, Backoff, KubeApi, Resource, discover
from tracker.shell.leader import Leadership, LeadershipLost
from tracker.shell.watch.checkpoint import (
    CHECKPOINT_VERSION,
    Checkpoint,
    CheckpointStore,
    Entry,
    Saved,
    Snapshot,
    SqliteCheckpoint,
)
from tracker.shell.watch.keying import KeyedRecord, RunKeyer
from tracker.shell.watch.publish import (
    BusPublisher,
    Change,
    DeadLetterPublisher,
    JsonlCapture,
    Outbox,
    Publisher,
)
from tracker.shell.watch.resources import (
    CORE_EVENTS,
    EVENTS_APIS,
    EVENTS_V1,
    JOB_PODS,
    JOBS,
    RAY_PODS,
    RAYCLUSTERS,
    RAYJOBS,
    WORKLOADS,
    all_resources,
    resources,
)
from tracker.shell.watch.stream import BrokenStream, Gone, Stream, WatchFatal, WatchStats
from tracker.shell.watch.watcher import WatchCollector, Watcher

__all__ = [
    "CHECKPOINT_VERSION", "CORE_EVENTS", "EVENTS_APIS", "EVENTS_V1", "JOBS", "JOB_PODS", "RAYCLUSTERS", "RAYJOBS",
    "RAY_PODS", "WORKLOADS", "ApiError", "Backoff", "BrokenStream", "BusPublisher", "Change", "Checkpoint",
    "CheckpointStore", "DeadLetterPublisher", "Entry", "Gone", "JsonlCapture", "KeyedRecord",
    "KubeApi", "Leadership", "LeadershipLost", "Outbox", "Publisher", "Resource", "RunKeyer", "Saved", "Snapshot",
    "SqliteCheckpoint", "Stream", "WatchCollector", "WatchFatal", "WatchSettings", "WatchStats", "Watcher",
    "all_resources", "discover", "resources",
]
