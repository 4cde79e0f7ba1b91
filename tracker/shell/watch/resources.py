"""What the watcher lists and watches: every kind of object a run is made of (see ``tracker.shell.watch``)."""

from __future__ import annotations

from tracker import errors
from tracker.core.model import LABEL_CONTROLLER_UID, LABEL_RAY_CLUSTER
from tracker.shell.kube import Resource

JOBS = Resource("jobs", "batch", ("v1",), "jobs", "Job", tier=0)
RAYJOBS = Resource("rayjobs", "ray.io", ("v1",), "rayjobs", "RayJob", tier=0)
WORKLOADS = Resource("workloads", "kueue.x-k8s.io", ("v1beta2", "v1beta1"), "workloads", "Workload", tier=1)
# Kueue's queues are no part of a run: they are keyed by queue (``tracker.core.queues.queue_key``), and say what a
# pending run waits behind. Cluster-scoped ClusterQueues are listed cluster-wide whatever namespaces are watched.
CLUSTERQUEUES = Resource("clusterqueues", "kueue.x-k8s.io", ("v1beta2", "v1beta1"), "clusterqueues", "ClusterQueue",
                         tier=0, cluster_scoped=True)
LOCALQUEUES = Resource("localqueues", "kueue.x-k8s.io", ("v1beta2", "v1beta1"), "localqueues", "LocalQueue", tier=0)
QUEUE_RESOURCES = (CLUSTERQUEUES, LOCALQUEUES)
# Nodes are no part of a run either: keyed by node (``tracker.core.nodes.node_key``), they say what a run's pods ran
# on (GPU model and count, conditions). Cluster-scoped, listed cluster-wide whatever namespaces are watched; read-only;
# listed last (with Events), after the objects of runs.
NODES = Resource("nodes", "", ("v1",), "nodes", "Node", tier=3, cluster_scoped=True)
RAYCLUSTERS = Resource("rayclusters", "ray.io", ("v1",), "rayclusters", "RayCluster", tier=1)
# Pods are narrowed to the two kinds a run has; label selectors cannot express OR, hence two disjoint
# streams: Job pods carry the Job controller's uid label, KubeRay pods their cluster's name.
JOB_PODS = Resource("pods-job", "", ("v1",), "pods", "Pod", tier=2, label_selector=LABEL_CONTROLLER_UID)
RAY_PODS = Resource("pods-ray", "", ("v1",), "pods", "Pod", tier=2,
                    label_selector=f"{LABEL_RAY_CLUSTER},!{LABEL_CONTROLLER_UID}")
# Both Event APIs serve the same objects; watching both would publish every change twice.
EVENTS_V1 = Resource("events", "events.k8s.io", ("v1",), "events", "Event", tier=3)
CORE_EVENTS = Resource("events-core", "", ("v1",), "events", "Event", tier=3)
EVENTS_APIS = {"events.k8s.io/v1": EVENTS_V1, "v1": CORE_EVENTS}


def resources(events_api: str = "events.k8s.io/v1") -> tuple[Resource, ...]:
    """Everything a run is made of, with Events from ``events_api`` (``events.k8s.io/v1`` or ``v1``)."""
    if events_api not in EVENTS_APIS:
        raise errors.ConfigError(f"events_api must be one of {sorted(EVENTS_APIS)}, got {events_api!r}")
    return (JOBS, RAYJOBS, WORKLOADS, RAYCLUSTERS, JOB_PODS, RAY_PODS, EVENTS_APIS[events_api])


def all_resources(events_api: str = "events.k8s.io/v1", *, queues: bool = True,
                  nodes: bool = True) -> tuple[Resource, ...]:
    """What the watcher lists and watches: ``resources`` and, with ``queues``, Kueue's ClusterQueues and
    LocalQueues, with ``nodes`` the Nodes."""
    return resources(events_api) + (QUEUE_RESOURCES if queues else ()) + ((NODES,) if nodes else ())

