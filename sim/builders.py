"""Single Kubernetes, Kueue and KubeRay objects, and TauGrid intake events, as plain dicts.

Every function is pure: it returns a fresh dict built from its arguments, with the JSON field names and the
``omitempty`` behaviour of the upstream Go types (``k8s.io/api`` batch/v1, core/v1 and events/v1; Kueue
``apis/kueue/v1beta1`` and ``v1beta2``; KubeRay ``ray-operator/apis/ray/v1``) and the condition types,
reasons and messages listed in ``shared/reference/lifecycle.md``. Sub-dicts passed in (labels, specs,
templates) are shared, not copied: callers treat every built object as read-only.

Identifiers that a cluster would make up at random (uids, name suffixes, container ids, digests) are
derived here from a seeded hash of names instead, so the same inputs always give the same objects.
Times are integer milliseconds since the Unix epoch (``Ms``); objects show them as RFC 3339 UTC seconds,
Events' ``eventTime`` with microseconds.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Literal

from tracker.core.model import INTAKE_SCHEMA, LABEL_CONTROLLER_UID

Obj = dict[str, Any]
Ms = int
WorkloadApi = Literal["v1beta1", "v1beta2"]
EventsApi = Literal["v1", "events.k8s.io/v1"]

SECOND: Ms = 1000
MINUTE: Ms = 60 * SECOND
DAY: Ms = 1_787_184_000_000  # 2026-08-20T00:00:00Z, the day every sample happens on

# Label keys set by the Job controller, Kueue and KubeRay (tracker.core.model has the ones the tracker reads).
LABEL_JOB_NAME = "batch.kubernetes.io/job-name"
LABEL_LEGACY_JOB_NAME = "job-name"
LABEL_LEGACY_CONTROLLER_UID = "controller-uid"
LABEL_PODSET = "kueue.x-k8s.io/podset"
LABEL_LOCAL_QUEUE = "kueue.x-k8s.io/local-queue-name"
LABEL_CLUSTER_QUEUE = "kueue.x-k8s.io/cluster-queue-name"
LABEL_PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"
LABEL_RAY_GROUP = "ray.io/group"
LABEL_RAY_ORIGIN_NAME = "ray.io/originated-from-cr-name"
LABEL_RAY_ORIGIN_CRD = "ray.io/originated-from-crd"
LABEL_CREATED_BY = "app.kubernetes.io/created-by"

KUEUE_API_GROUP = "kueue.x-k8s.io"
RAY_API_VERSION = "ray.io/v1"

# Tolerations the DefaultTolerationSeconds admission plugin adds to every Pod.
_DEFAULT_TOLERATIONS = (
    {"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists",
     "tolerationSeconds": 300},
    {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists",
     "tolerationSeconds": 300},
)

# --------------------------------------------------------------------------------------------------
# Deterministic identifiers and times.

_SEED = "tracker.samples/v1"
_ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand: no vowels, no 0/1/3


def _digest(parts: Sequence[str]) -> bytes:
    return hashlib.sha256("\x1f".join((_SEED, *parts)).encode()).digest()


def uid(*parts: str) -> str:
    """A uuid4-shaped object uid derived from ``parts``."""
    b = bytearray(_digest(parts)[:16])
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def hex_id(length: int, *parts: str) -> str:
    """``length`` (at most 64) lower-case hex digits: container ids, digests, commits."""
    return _digest(parts).hex()[:length]


def rand_suffix(*parts: str, length: int = 5) -> str:
    """A generateName-style suffix (``x7k2p``) derived from ``parts``."""
    return "".join(_ALPHANUMS[b % len(_ALPHANUMS)] for b in _digest(parts)[:length])


def small_int(modulo: int, *parts: str) -> int:
    """A number in ``range(modulo)`` derived from ``parts`` (node picks, IP octets, sizes)."""
    return int.from_bytes(_digest(parts)[:4], "big") % modulo


def workload_name(kind: str, group: str, name: str, owner_uid: str) -> str:
    """Kueue's Workload name for an owner (``jobframework/workload_names.go``): ``job-<name>-<hash5>``."""
    h = hashlib.sha1(f"{kind}\n{group}\n{name}\n{owner_uid}".encode()).hexdigest()
    return f"{f'{kind.lower()}-{name}'[:247]}-{h[:5]}"


def at(clock: str) -> Ms:
    """``"09:02:05"`` or ``"09:02:05.250"`` on 2026-08-20 (UTC), in milliseconds."""
    hms, _, frac = clock.partition(".")
    h, m, s = (int(p) for p in hms.split(":"))
    return DAY + ((h * 60 + m) * 60 + s) * SECOND + (int(frac.ljust(3, "0")) if frac else 0)


@lru_cache(maxsize=1 << 16)
def _rfc3339_seconds(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def ts(ms: Ms) -> str:
    """metav1.Time: RFC 3339 UTC with whole seconds."""
    return _rfc3339_seconds(ms // SECOND) + "Z"


def micro_ts(ms: Ms) -> str:
    """metav1.MicroTime: RFC 3339 UTC with microseconds."""
    return f"{_rfc3339_seconds(ms // SECOND)}.{ms % SECOND:03d}000Z"


def _bool(value: bool) -> str:
    return "True" if value else "False"


# --------------------------------------------------------------------------------------------------
# Metadata, references and conditions.


def object_meta(
    *,
    name: str,
    namespace: str,
    uid: str,
    created: Ms,
    generation: int | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owners: Sequence[Obj] = (),
    finalizers: Sequence[str] = (),
    generate_name: str | None = None,
    deletion: tuple[Ms, int] | None = None,
) -> Obj:
    """metav1.ObjectMeta without resourceVersion (the object store assigns that on every write).

    ``deletion`` is (deletionTimestamp, deletionGracePeriodSeconds) once a graceful delete started.
    """
    meta: Obj = {"creationTimestamp": ts(created), "name": name, "namespace": namespace, "uid": uid}
    if generation is not None:
        meta["generation"] = generation
    if generate_name:
        meta["generateName"] = generate_name
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    if owners:
        meta["ownerReferences"] = list(owners)
    if finalizers:
        meta["finalizers"] = list(finalizers)
    if deletion is not None:
        meta["deletionTimestamp"] = ts(deletion[0])
        meta["deletionGracePeriodSeconds"] = deletion[1]
    return meta


def owner_reference(api_version: str, kind: str, name: str, uid: str) -> Obj:
    """The controller ownerReference a controller puts on what it creates."""
    return {"apiVersion": api_version, "blockOwnerDeletion": True, "controller": True, "kind": kind,
            "name": name, "uid": uid}


def object_reference(
    api_version: str, kind: str, namespace: str, name: str, uid: str, field_path: str | None = None
) -> Obj:
    """core/v1 ObjectReference, as in an Event's involvedObject / regarding."""
    ref: Obj = {"apiVersion": api_version, "kind": kind, "name": name, "namespace": namespace, "uid": uid}
    if field_path:
        ref["fieldPath"] = field_path
    return ref


def condition(type_: str, status: bool, reason: str, message: str, when: Ms, *, generation: int) -> Obj:
    """metav1.Condition (Workload, RayCluster)."""
    return {"lastTransitionTime": ts(when), "message": message, "observedGeneration": generation,
            "reason": reason, "status": _bool(status), "type": type_}


def job_condition(type_: str, status: bool, reason: str, message: str, when: Ms) -> Obj:
    """batch/v1 JobCondition."""
    return {"lastProbeTime": ts(when), "lastTransitionTime": ts(when), "message": message,
            "reason": reason, "status": _bool(status), "type": type_}


def pod_condition(
    type_: str, status: bool, when: Ms, reason: str | None = None, message: str | None = None
) -> Obj:
    """core/v1 PodCondition."""
    c: Obj = {"lastProbeTime": None, "lastTransitionTime": ts(when), "status": _bool(status), "type": type_}
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


def find_condition(conditions: Sequence[Obj], type_: str) -> Obj | None:
    return next((c for c in conditions if c["type"] == type_), None)


def set_condition(conditions: Sequence[Obj], new: Obj) -> list[Obj]:
    """``apimeta.SetStatusCondition``: replace in place, keep lastTransitionTime if the status is unchanged."""
    out = list(conditions)
    for i, old in enumerate(out):
        if old["type"] == new["type"]:
            if old["status"] == new["status"]:
                new = {**new, "lastTransitionTime": old["lastTransitionTime"]}
            out[i] = new
            return out
    out.append(new)
    return out


def without_condition(conditions: Sequence[Obj], type_: str) -> list[Obj]:
    return [c for c in conditions if c["type"] != type_]


# --------------------------------------------------------------------------------------------------
# Pod templates and Pods.


def quantity_cpu(millis: int) -> str:
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def quantity_memory(mebibytes: int) -> str:
    return f"{mebibytes // 1024}Gi" if mebibytes % 1024 == 0 else f"{mebibytes}Mi"


def resource_list(cpu_millis: int, memory_mi: int, gpus: int) -> dict[str, str]:
    """A ResourceList (requests of one pod, or usage of a pod set)."""
    res = {"cpu": quantity_cpu(cpu_millis), "memory": quantity_memory(memory_mi)}
    if gpus:
        res["nvidia.com/gpu"] = str(gpus)
    return res


def container(
    *, name: str, image: str, command: Sequence[str], cpu_millis: int, memory_mi: int, gpus: int = 0,
    ports: Sequence[Obj] = (),
) -> Obj:
    """core/v1 Container as defaulted by the API server (requests; limits only for GPUs)."""
    resources: Obj = {"requests": resource_list(cpu_millis, memory_mi, gpus)}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    c: Obj = {"command": list(command), "image": image, "imagePullPolicy": "IfNotPresent", "name": name,
              "resources": resources, "terminationMessagePath": "/dev/termination-log",
              "terminationMessagePolicy": "File"}
    if ports:
        c["ports"] = list(ports)
    return c


def template_spec(
    *, containers: Sequence[Obj], restart_policy: str, node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Obj] = (),
) -> Obj:
    """core/v1 PodSpec of a pod template, with the API server's template defaults."""
    spec: Obj = {"containers": list(containers), "dnsPolicy": "ClusterFirst", "restartPolicy": restart_policy,
                 "schedulerName": "default-scheduler", "securityContext": {},
                 "terminationGracePeriodSeconds": 30}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if tolerations:
        spec["tolerations"] = list(tolerations)
    return spec


def pod_template(labels: Mapping[str, str], spec: Obj) -> Obj:
    """core/v1 PodTemplateSpec."""
    return {"metadata": {"creationTimestamp": None, "labels": labels}, "spec": spec}


def pod_spec(template: Obj, node_name: str | None) -> Obj:
    """A Pod's spec: the template's plus what admission adds on create and binding sets later."""
    spec: Obj = {**template, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
                 "priority": 0, "serviceAccount": "default", "serviceAccountName": "default",
                 "tolerations": [*template.get("tolerations", ()), *_DEFAULT_TOLERATIONS]}
    if node_name:
        spec["nodeName"] = node_name
    return spec


def waiting_state(reason: str, message: str | None = None) -> Obj:
    waiting: Obj = {"reason": reason}
    if message:
        waiting["message"] = message
    return {"waiting": waiting}


def running_state(started: Ms) -> Obj:
    return {"running": {"startedAt": ts(started)}}


def terminated_state(
    *, exit_code: int, reason: str, started: Ms | None, finished: Ms | None, container_id: str | None,
    message: str | None = None,
) -> Obj:
    """ContainerStateTerminated; times and id are None for a container that never started."""
    term: Obj = {"exitCode": exit_code, "finishedAt": ts(finished) if finished is not None else None,
                 "reason": reason, "startedAt": ts(started) if started is not None else None}
    if container_id:
        term["containerID"] = container_id
    if message:
        term["message"] = message
    return {"terminated": term}


def container_status(
    *, name: str, image: str, state: Obj, ready: bool = False, started: bool = False,
    container_id: str | None = None, image_id: str = "",
) -> Obj:
    """core/v1 ContainerStatus."""
    cs: Obj = {"image": image, "imageID": image_id, "lastState": {}, "name": name, "ready": ready,
               "restartCount": 0, "started": started, "state": state}
    if container_id:
        cs["containerID"] = container_id
    return cs


def pod_status(
    *, phase: str, conditions: Sequence[Obj] = (), containers: Sequence[Obj] = (),
    host_ip: str | None = None, pod_ip: str | None = None, started: Ms | None = None,
) -> Obj:
    """core/v1 PodStatus (QoS Burstable: requests without matching limits)."""
    status: Obj = {"phase": phase, "qosClass": "Burstable"}
    if conditions:
        status["conditions"] = list(conditions)
    if containers:
        status["containerStatuses"] = list(containers)
    if host_ip:
        status["hostIP"] = host_ip
        status["hostIPs"] = [{"ip": host_ip}]
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    if started is not None:
        status["startTime"] = ts(started)
    return status


def pod(*, meta: Obj, spec: Obj, status: Obj) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


# --------------------------------------------------------------------------------------------------
# batch/v1 Job.


def job_spec(
    *, uid: str, template: Obj, parallelism: int, completions: int, backoff_limit: int, suspend: bool
) -> Obj:
    """batch/v1 JobSpec as defaulted by the API server (selector generated from the uid)."""
    return {"backoffLimit": backoff_limit, "completionMode": "NonIndexed", "completions": completions,
            "parallelism": parallelism, "podReplacementPolicy": "TerminatingOrFailed",
            "selector": {"matchLabels": {LABEL_CONTROLLER_UID: uid}}, "suspend": suspend,
            "template": template}


def job_status(
    *, conditions: Sequence[Obj] = (), start: Ms | None = None, completion: Ms | None = None,
    active: int = 0, ready: int = 0, succeeded: int = 0, failed: int = 0, terminating: int = 0,
    uncounted_succeeded: Sequence[str] = (), uncounted_failed: Sequence[str] = (),
) -> Obj:
    """batch/v1 JobStatus as the Job controller writes it (ready/terminating/uncounted always present)."""
    status: Obj = {}
    if conditions:
        status["conditions"] = list(conditions)
    if start is not None:
        status["startTime"] = ts(start)
    if completion is not None:
        status["completionTime"] = ts(completion)
    if active:
        status["active"] = active
    if succeeded:
        status["succeeded"] = succeeded
    if failed:
        status["failed"] = failed
    status["ready"] = ready
    status["terminating"] = terminating
    uncounted: Obj = {}
    if uncounted_succeeded:
        uncounted["succeeded"] = list(uncounted_succeeded)
    if uncounted_failed:
        uncounted["failed"] = list(uncounted_failed)
    status["uncountedTerminatedPods"] = uncounted
    return status


def job(*, meta: Obj, spec: Obj, status: Obj) -> Obj:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec, "status": status}


# --------------------------------------------------------------------------------------------------
# Kueue Workload.


def pod_set(name: str, count: int, template: Obj) -> Obj:
    return {"count": count, "name": name, "template": template}


def pod_set_assignment(name: str, count: int, flavors: Mapping[str, str], usage: Mapping[str, str]) -> Obj:
    return {"count": count, "flavors": {r: flavors[r] for r in usage}, "name": name,
            "resourceUsage": dict(usage)}


def admission(cluster_queue: str, assignments: Sequence[Obj]) -> Obj:
    return {"clusterQueue": cluster_queue, "podSetAssignments": list(assignments)}


def workload_spec(
    *, api: WorkloadApi, queue: str, pod_sets: Sequence[Obj], priority: int, priority_class: str | None,
    active: bool,
) -> Obj:
    """WorkloadSpec; v1beta2 names the priority class with priorityClassRef."""
    spec: Obj = {"active": active, "podSets": list(pod_sets), "priority": priority, "queueName": queue}
    if api == "v1beta1":
        spec["priorityClassSource"] = "kueue.x-k8s.io/workloadpriorityclass" if priority_class else ""
        if priority_class:
            spec["priorityClassName"] = priority_class
    elif priority_class:
        spec["priorityClassRef"] = {"group": KUEUE_API_GROUP, "kind": "WorkloadPriorityClass",
                                    "name": priority_class}
    return spec


def workload_status(
    *, api: WorkloadApi, conditions: Sequence[Obj], admission: Obj | None = None,
    requeue: tuple[int, Ms | None] | None = None, evictions: Sequence[Obj] = (),
    resource_requests: Sequence[Obj] = (), accumulated_s: int = 0,
) -> Obj:
    """WorkloadStatus. ``requeue`` is (requeueState.count, requeueAt or None once the backoff elapsed)."""
    status: Obj = {"conditions": list(conditions)}
    if admission is not None:
        status["admission"] = admission
    if requeue is not None:
        count, requeue_at = requeue
        status["requeueState"] = {"count": count} if requeue_at is None else {
            "count": count, "requeueAt": ts(requeue_at)}
    if evictions:
        status["schedulingStats"] = {"evictions": list(evictions)}
    if resource_requests:
        status["resourceRequests"] = list(resource_requests)
    if accumulated_s:
        # v1beta1 keeps the original misspelling of the field.
        key = ("accumulatedPastExexcutionTimeSeconds" if api == "v1beta1"
               else "accumulatedPastExecutionTimeSeconds")
        status[key] = accumulated_s
    return status


def workload(*, api: WorkloadApi, meta: Obj, spec: Obj, status: Obj | None) -> Obj:
    obj: Obj = {"apiVersion": f"{KUEUE_API_GROUP}/{api}", "kind": "Workload", "metadata": meta, "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


# --------------------------------------------------------------------------------------------------
# KubeRay RayJob and RayCluster.


def worker_group(name: str, replicas: int, template: Obj) -> Obj:
    return {"groupName": name, "maxReplicas": replicas, "minReplicas": replicas, "numOfHosts": 1,
            "rayStartParams": {}, "replicas": replicas, "template": template}


def ray_cluster_spec(*, ray_version: str, head_template: Obj, worker_groups: Sequence[Obj]) -> Obj:
    return {"headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0"}, "template": head_template},
            "rayVersion": ray_version, "workerGroupSpecs": list(worker_groups)}


def rayjob_spec(
    *, entrypoint: str, cluster_spec: Obj, submitter_template: Obj, backoff_limit: int, suspend: bool,
    ttl_s: int,
) -> Obj:
    """RayJobSpec in K8sJobMode; Kueue requires shutdownAfterJobFinishes."""
    return {"backoffLimit": backoff_limit, "entrypoint": entrypoint, "rayClusterSpec": cluster_spec,
            "shutdownAfterJobFinishes": True, "submissionMode": "K8sJobMode",
            "submitterPodTemplate": submitter_template, "suspend": suspend, "ttlSecondsAfterFinished": ttl_s}


EMPTY_RAY_CLUSTER_STATUS: Obj = {"desiredCPU": "0", "desiredGPU": "0", "desiredMemory": "0", "desiredTPU": "0"}


def raycluster_status(
    *, conditions: Sequence[Obj], desired: Mapping[str, str], workers: int, ready_workers: int,
    head: Mapping[str, str], updated: Ms, generation: int, state: str | None = None,
    transitions: Mapping[str, Ms] | None = None,
) -> Obj:
    """RayClusterStatus (``state`` is set once all pods run and are ready; it is sticky)."""
    status: Obj = {
        "conditions": list(conditions),
        "desiredCPU": desired["cpu"], "desiredGPU": desired.get("nvidia.com/gpu", "0"),
        "desiredMemory": desired["memory"], "desiredTPU": "0",
        "desiredWorkerReplicas": workers, "maxWorkerReplicas": workers, "minWorkerReplicas": workers,
        "endpoints": {"client": "10001", "dashboard": "8265", "gcs-server": "6379", "metrics": "8080"},
        "head": dict(head), "lastUpdateTime": ts(updated), "observedGeneration": generation,
    }
    if ready_workers:
        status["readyWorkerReplicas"] = ready_workers
        status["availableWorkerReplicas"] = ready_workers
    if state is not None:
        status["state"] = state
    if transitions:
        status["stateTransitionTimes"] = {k: ts(v) for k, v in transitions.items()}
    return status


def rayjob_status(
    *, deployment: str, generation: int, cluster_status: Obj, job_status: str = "", job_id: str = "",
    cluster: str = "", dashboard: str = "", start: Ms | None = None, end: Ms | None = None,
    ray_start: Ms | None = None, ray_end: Ms | None = None, counts: tuple[int, int] | None = None,
    reason: str = "", message: str = "",
) -> Obj:
    """RayJobStatus; ``counts`` is (succeeded, failed) once KubeRay initialised them. No conditions."""
    status: Obj = {"observedGeneration": generation, "rayClusterStatus": cluster_status}
    for key, value in (("jobDeploymentStatus", deployment), ("jobStatus", job_status), ("jobId", job_id),
                       ("rayClusterName", cluster), ("dashboardURL", dashboard), ("reason", reason),
                       ("message", message)):
        if value:
            status[key] = value
    if start is not None:
        status["startTime"] = ts(start)
    if end is not None:
        status["endTime"] = ts(end)
    if ray_start is not None:
        status["rayJobInfo"] = {"startTime": ts(ray_start)}
        if ray_end is not None:
            status["rayJobInfo"]["endTime"] = ts(ray_end)
    if counts is not None:
        status["succeeded"], status["failed"] = counts
    return status


def rayjob(*, meta: Obj, spec: Obj, status: Obj | None) -> Obj:
    obj: Obj = {"apiVersion": RAY_API_VERSION, "kind": "RayJob", "metadata": meta, "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


def raycluster(*, meta: Obj, spec: Obj, status: Obj | None) -> Obj:
    obj: Obj = {"apiVersion": RAY_API_VERSION, "kind": "RayCluster", "metadata": meta, "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


# --------------------------------------------------------------------------------------------------
# Events. Two recorders write them: client-go ``tools/record`` (kubelet, Job controller, Kueue <= v0.17:
# count/firstTimestamp/lastTimestamp/source) and ``tools/events`` (kube-scheduler, KubeRay >= v1.7:
# eventTime/series/action). Either kind can be read through either API, core/v1 or events.k8s.io/v1.


def event_name(regarding_name: str, first: Ms, nanos: int = 0) -> str:
    """``<object name>.<UnixNano in hex>``, as both recorders name Events (``nanos``: the sub-millisecond part,
    which tells apart two Events about one object recorded in the same millisecond)."""
    return f"{regarding_name}.{first * 1_000_000 + nanos:x}"


def core_event(
    *, meta: Obj, regarding: Obj, reason: str, message: str, warning: bool, component: str, instance: str,
    first: Ms, last: Ms, count: int, series: bool, action: str = "",
) -> Obj:
    """core/v1 Event. ``series`` selects the tools/events recorder (seen through core/v1)."""
    ev: Obj = {"apiVersion": "v1", "kind": "Event", "metadata": meta, "involvedObject": regarding,
               "reason": reason, "message": message, "type": "Warning" if warning else "Normal",
               "reportingComponent": component, "reportingInstance": instance}
    if series:
        ev |= {"action": action, "eventTime": micro_ts(first), "firstTimestamp": None,
               "lastTimestamp": None, "source": {}}
        if count > 1:
            ev["series"] = {"count": count, "lastObservedTime": micro_ts(last)}
    else:
        source = {"component": component, "host": instance} if instance else {"component": component}
        ev |= {"count": count, "eventTime": None, "firstTimestamp": ts(first), "lastTimestamp": ts(last),
               "source": source}
    return ev


def events_v1_event(
    *, meta: Obj, regarding: Obj, reason: str, message: str, warning: bool, component: str, instance: str,
    first: Ms, last: Ms, count: int, series: bool, action: str = "",
) -> Obj:
    """events.k8s.io/v1 Event. ``series`` selects the tools/events recorder; else the deprecated* fields."""
    ev: Obj = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": meta, "regarding": regarding,
               "reason": reason, "note": message, "type": "Warning" if warning else "Normal",
               "reportingController": component, "reportingInstance": instance}
    if series:
        ev |= {"action": action, "deprecatedFirstTimestamp": None, "deprecatedLastTimestamp": None,
               "deprecatedSource": {}, "eventTime": micro_ts(first)}
        if count > 1:
            ev["series"] = {"count": count, "lastObservedTime": micro_ts(last)}
    else:
        source = {"component": component, "host": instance} if instance else {"component": component}
        ev |= {"deprecatedCount": count, "deprecatedFirstTimestamp": ts(first),
               "deprecatedLastTimestamp": ts(last), "deprecatedSource": source, "eventTime": None}
    return ev


# --------------------------------------------------------------------------------------------------
# TauGrid intake events (tracker.core.model: ResolutionEvent, RenderingEvent, ProgressEvent, and the training
# process's CheckpointSaveEvent, CheckpointRestoreEvent, ResumeEvent).


def _intake(kind: str, event_id: str, run_id: str, when: Ms, fields: Mapping[str, Any]) -> Obj:
    ev: Obj = {"schema": INTAKE_SCHEMA, "event_id": event_id, "run_id": run_id, "at": ts(when), "kind": kind}
    ev.update((k, v) for k, v in fields.items() if v is not None)
    return ev


def resolution_event(
    *, event_id: str, run_id: str, when: Ms, status: str, project: str | None = None,
    workspace: str | None = None, target: str | None = None, git_commit: str | None = None,
    config_digest: str | None = None, config_ref: str | None = None, input_refs: Sequence[str] = (),
) -> Obj:
    return _intake("Resolution", event_id, run_id, when, {
        "status": status, "project": project, "workspace": workspace, "target": target,
        "git_commit": git_commit, "config_digest": config_digest, "config_ref": config_ref,
        "input_refs": list(input_refs) or None})


def rendering_event(
    *, event_id: str, run_id: str, when: Ms, status: str, workload_kind: str | None = None,
    namespace: str | None = None, name: str | None = None, queue: str | None = None,
    output_uri: str | None = None, reason: str | None = None, message: str | None = None,
    hyperparameters: Mapping[str, str | int | float | bool] | None = None,
) -> Obj:
    return _intake("Rendering", event_id, run_id, when, {
        "status": status, "workload_kind": workload_kind, "namespace": namespace, "name": name,
        "queue": queue, "output_uri": output_uri, "reason": reason, "message": message,
        "hyperparameters": dict(hyperparameters) if hyperparameters else None})


def progress_event(
    *, event_id: str, run_id: str, when: Ms, step: int, metrics: Mapping[str, float],
    checkpoint_uri: str | None = None,
) -> Obj:
    return _intake("Progress", event_id, run_id, when, {
        "step": step, "metrics": dict(metrics), "checkpoint_uri": checkpoint_uri})


def checkpoint_save_event(*, event_id: str, run_id: str, when: Ms, phase: str, step: int, uri: str,
                          size: int | None = None) -> Obj:
    return _intake("CheckpointSave", event_id, run_id, when, {"phase": phase, "step": step, "uri": uri,
                                                              "bytes": size})


def checkpoint_restore_event(*, event_id: str, run_id: str, when: Ms, phase: str, step: int, uri: str) -> Obj:
    return _intake("CheckpointRestore", event_id, run_id, when, {"phase": phase, "step": step, "uri": uri})


def resume_event(*, event_id: str, run_id: str, when: Ms, resume_of: str, checkpoint_uri: str | None = None,
                 step: int | None = None) -> Obj:
    return _intake("Resume", event_id, run_id, when, {"resume_of": resume_of, "checkpoint_uri": checkpoint_uri,
                                                      "step": step})
