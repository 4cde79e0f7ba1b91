"""Read the facts a run needs out of one Kubernetes object and merge them into its RunFacts.

Every function here is pure apart from mutating the RunFacts it is given. Objects are plain dicts as a
watch or ``kubectl -o json`` returns them. A missing optional field is fine; a structurally wrong one
raises ``Malformed`` with the reason, before anything is merged.

This is where the objects' text enters the tracker's facts, so this is where it is redacted
(``tracker.core.redact``, README "What is redacted"): every free-text field is read with ``text_at`` (messages,
reasons, an Event's note, eviction causes), annotations with ``redact.annotation`` and labels with
``redact.label``. Whatever the reducer keeps, publishes or stores (histories, run-state, the index, ADX rows, the
pages) is made of these facts and never sees the text as the object had it.
"""

from __future__ import annotations

from sys import intern
from typing import Any

from tracker import errors
from tracker.core import provenance
from tracker.core.facts import (
    EventFacts,
    PodEnd,
    RayClusterFacts,
    RayOutcome,
    RunFacts,
    Unschedulable,
    newer,
)
from tracker.core.gpu import DEFAULT_ACCELERATORS, Accelerators, pod_gpus
from tracker.core.ledger_facts import _max, _min
from tracker.core.model import LABEL_QUEUE, TAUGRID_ANNOTATION_PREFIX
from tracker.core.redact import annotation, label, redact_inline
from tracker.core.timefmt import BadTimestamp, in_range, ts


class Malformed(errors.InvalidInput):
    """The object cannot be used; the message says why."""


# Field readers, one per type the API gives a field (``obj_at``: a sub-object, ``list_at``: a list, ``str_at``: a
# string, ``time_at``: a timestamp, ``int_at``: an integer). Each checks that type and raises Malformed otherwise;
# an absent or null field reads as empty. The exact class is tested first: the fast path.


def obj_at(obj: Any, key: str) -> dict[str, Any]:
    """A sub-object that may be absent or null, but must be an object when present."""
    v = obj.get(key)
    if v.__class__ is dict:
        return v
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise Malformed(f"{key} must be an object, got {type(v).__name__}")
    return v


def list_at(obj: dict[str, Any], key: str) -> list[Any]:
    """A list that may be absent or null (then empty)."""
    v = obj.get(key)
    if v.__class__ is list:
        return v
    if v is None:
        return []
    if not isinstance(v, list):
        raise Malformed(f"{key} must be a list, got {type(v).__name__}")
    return v


def str_at(obj: dict[str, Any], key: str) -> str:
    """A string that may be absent or null (then empty). Interned: the facts keep the same reasons, statuses, types,
    queue and namespace names thousands of times over, each decoded anew from its object (one copy each saves about
    4 KiB per run, bench/README.md); an interned string is freed with its last use."""
    v = obj.get(key)
    if v.__class__ is str:
        return intern(v)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise Malformed(f"{key} must be a string, got {type(v).__name__}")
    return v


def text_at(obj: dict[str, Any], key: str) -> str:
    """A free-text string (a message, a reason) as ``str_at`` reads it, with the secrets in it redacted."""
    return intern(redact_inline(str_at(obj, key)))


_CUT_READ = 4  # a text cut to N characters is redacted over its first 4*N: a secret the cut splits is still seen


def cut_text(text: str, limit: int) -> str:
    """A free text kept to ``limit`` characters, redacted before it is cut (so that the cut never leaves the start of
    a secret that is no longer recognisable); what lies past ``4 * limit`` characters is not read."""
    return redact_inline(text[:_CUT_READ * limit])[:limit]


_TS_CACHE: dict[str, int] = {}
_TS_CACHE_MAX = 32_768  # a timestamp recurs in the versions of its object, which come close together: 4 MiB at most


def time_at(obj: dict[str, Any], key: str) -> int | None:
    """An RFC 3339 timestamp in microseconds since the epoch; None when absent, null or empty. Parsed values are
    memoised (the same timestamps recur across the versions of an object and across objects)."""
    v = obj.get(key)
    if v.__class__ is str:
        hit = _TS_CACHE.get(v)
        if hit is not None:
            return hit
    if v is None or v == "":
        return None
    try:
        parsed = ts(v)
    except BadTimestamp as exc:
        raise Malformed(f"{key}: {exc}") from exc
    if v.__class__ is str and parsed is not None:
        if len(_TS_CACHE) >= _TS_CACHE_MAX:
            _TS_CACHE.clear()  # a plain memo: clearing it changes speed, never results
        _TS_CACHE[v] = parsed
    return parsed


_INT32 = 2**31


def int_at(obj: dict[str, Any], key: str, default: int = 0) -> int:
    """A count or code: every one the tracker reads is an int32 in its API, so sums of them stay in int64."""
    v = obj.get(key)
    if v.__class__ is int and -_INT32 <= v < _INT32:
        return v
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise Malformed(f"{key} must be an integer, got {type(v).__name__}")
    raise Malformed(f"{key} is out of the 32-bit integer range")


def uid_of(meta: dict[str, Any]) -> str:
    """An object's ``metadata.uid``; Malformed when it is missing or empty (every object the reducer keeps has one)."""
    uid = str_at(meta, "uid")
    if not uid:
        raise Malformed("metadata.uid is missing")
    return uid


def resource_version(meta: dict[str, Any]) -> int | None:
    """``metadata.resourceVersion`` as an integer: etcd's revision, which it is in practice, so a larger one is a
    later version of the object. None when it is absent or not an integer (opaque, as the API allows): then the
    values an object version sets are last-write-wins, in the order the versions arrive (docs/limits.md)."""
    v = meta.get("resourceVersion")
    if v.__class__ is str and 0 < len(v) <= 19 and v.isascii() and v.isdigit():
        return int(v)
    if v.__class__ is int and v >= 0:
        return v
    return None


def conditions(status: dict[str, Any]) -> list[tuple[str, str, str, int, str]]:
    """``status.conditions`` as (type, status, reason, lastTransitionTime, message); one without a time is skipped."""
    out = []
    for c in list_at(status, "conditions"):
        if not isinstance(c, dict):
            raise Malformed("status.conditions[] must be objects")
        ltt = time_at(c, "lastTransitionTime")
        if ltt is None:
            continue
        out.append((str_at(c, "type"), str_at(c, "status"), text_at(c, "reason"), ltt, text_at(c, "message")))
    return out


def controller_owner(meta: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, uid) of the controlling owner, else of the first owner."""
    refs = list_at(meta, "ownerReferences")
    first = None
    for ref in refs:
        if not isinstance(ref, dict):
            raise Malformed("metadata.ownerReferences[] must be objects")
        pair = (str_at(ref, "kind"), str_at(ref, "uid"))
        if ref.get("controller") is True:
            return pair
        first = first or pair
    return first


# ------------------------------------------------------------------------------------------ roots


def merge_root(r: RunFacts, kind: str, etype: str, obj: dict[str, Any]) -> None:
    """The Job or RayJob that is the run's root."""
    meta = obj_at(obj, "metadata")
    spec = obj_at(obj, "spec")
    status = obj_at(obj, "status")
    labels = obj_at(meta, "labels")
    annotations = obj_at(meta, "annotations")
    created = time_at(meta, "creationTimestamp")
    uid = str_at(meta, "uid")
    rv = resource_version(meta)
    ray = None
    if kind == "Job":
        conds = conditions(status)
        par = int_at(spec, "parallelism", 1)
        comp = spec.get("completions")
        expected = min(par, comp) if isinstance(comp, int) and comp > 0 else par
        failed = int_at(status, "failed")
    else:
        conds = []
        expected = ray_expected_pods(spec)
        failed = 0
        ray = rayjob_status(status)
    deleted = deletion_time(meta, conds, status) if etype == "DELETED" else None
    deletion = deletion_requested(meta)  # any version may carry it (a root with finalizers, foreground deletion)
    # merge (everything above may raise Malformed; nothing below does)
    if ray is not None:
        merge_rayjob_status(r, ray)
    if deleted is not None:
        r.root_deleted = _max(r.root_deleted, deleted)
    r.root_deletion = _min(r.root_deletion, deletion)
    r.kind, r.uid = kind, uid
    r.namespace, r.name = str_at(meta, "namespace") or None, str_at(meta, "name") or None
    r.created = _min(r.created, created)
    if newer(rv, r.root_rv):  # the newest version's labels, annotations and size
        r.root_rv = rv
        r.labels = {k: label(k, v) for k, v in labels.items() if isinstance(v, str)}
        # only TauGrid's own annotations (provenance the history reports): others may hold anything, e.g. a
        # kubectl last-applied-configuration with env values, and facts are persisted (run-state, index)
        r.annotations = {k: annotation(k, v) for k, v in annotations.items()
                         if isinstance(v, str) and k.startswith(TAUGRID_ANNOTATION_PREFIX)}
        r.expected_pods = max(1, expected)
        r.workload = provenance.workload(kind, spec)  # what ran: images, entrypoint (redacted, bounded)
    r.job_failed = max(r.job_failed, failed)
    for ctype, cstatus, reason, ltt, msg in conds:
        r.cond(r.job_conds, r.job_conds_rv, (ctype, cstatus, reason, ltt), msg, rv)
    if not r.wl_queue and isinstance(labels.get(LABEL_QUEUE), str):
        r.wl_queue = labels[LABEL_QUEUE]


def deletion_time(meta: dict[str, Any], conds: list[tuple[str, str, str, int, str]],
                  status: dict[str, Any]) -> int | None:
    """When a deleted object went away: its deletionTimestamp, else the latest time it carries."""
    when = deletion_requested(meta)
    if when is not None:
        return when
    latest = time_at(meta, "creationTimestamp")
    for c in conds:
        latest = _max(latest, c[3])
    for key in ("startTime", "completionTime", "endTime"):
        latest = _max(latest, time_at(status, key))
    return latest


def deletion_requested(meta: dict[str, Any]) -> int | None:
    """When the deletion was asked for: the deletionTimestamp less the grace period (None if not deleted)."""
    when = time_at(meta, "deletionTimestamp")
    if when is None:
        return None
    grace = meta.get("deletionGracePeriodSeconds")
    if grace is None:
        return when
    if grace.__class__ is not int:
        raise Malformed(f"deletionGracePeriodSeconds must be an integer, got {type(grace).__name__}")
    if grace < 0 or not in_range(when - grace * 1_000_000):
        raise Malformed("deletionGracePeriodSeconds is negative or puts the deletion before the year 0001")
    return when - grace * 1_000_000


def ray_expected_pods(spec: dict[str, Any]) -> int:
    rc = obj_at(spec, "rayClusterSpec")
    total = 1  # head
    for g in list_at(rc, "workerGroupSpecs"):
        if not isinstance(g, dict):
            raise Malformed("workerGroupSpecs[] must be objects")
        total += int_at(g, "replicas", 0) * max(1, int_at(g, "numOfHosts", 1))
    return total


TERMINAL_RAY = ("Complete", "Failed", "Retrying")

# One RayJob deployment as its status shows it: (startTime, rayClusterName, failed, Ray app start, outcome)
RayStatus = tuple[int, str, int, int | None, RayOutcome | None]


def rayjob_status(status: dict[str, Any]) -> RayStatus | None:
    """The deployment a RayJob status describes (None before KubeRay set its startTime). Raises Malformed."""
    start = time_at(status, "startTime")
    if start is None:
        return None
    cluster = str_at(status, "rayClusterName")
    failed = int_at(status, "failed")
    info = obj_at(status, "rayJobInfo")
    app_started = time_at(info, "startTime")
    jds = str_at(status, "jobDeploymentStatus")
    outcome = None
    if jds in TERMINAL_RAY:
        end = time_at(status, "endTime") or time_at(info, "endTime") or -1
        outcome = RayOutcome(end, jds, text_at(status, "jobStatus"), text_at(status, "reason"),
                             text_at(status, "message"))
    return start, cluster, failed, app_started, outcome


def merge_rayjob_status(r: RunFacts, ray: RayStatus) -> None:
    start, cluster, failed, app_started, outcome = ray
    a = r.ray_attempt(start)
    if cluster:
        a.cluster = cluster
    a.failed = max(a.failed, failed)
    a.app_started = _min(a.app_started, app_started)
    # Retrying is followed by a terminal state only in a later deployment; within one, the
    # terminal write (with endTime) is the later one, so the larger tuple wins.
    if outcome is not None and (a.outcome is None or (outcome.deployment_status != "Retrying", outcome)
                                > (a.outcome.deployment_status != "Retrying", a.outcome)):
        a.outcome = outcome


# ------------------------------------------------------------------------------------------ others


def merge_workload(r: RunFacts, etype: str, obj: dict[str, Any]) -> None:
    meta = obj_at(obj, "metadata")
    spec = obj_at(obj, "spec")
    status = obj_at(obj, "status")
    conds = conditions(status)
    admission = obj_at(status, "admission")
    cq = str_at(admission, "clusterQueue")
    evictions = []
    for e in list_at(obj_at(status, "schedulingStats"), "evictions"):
        if not isinstance(e, dict):
            raise Malformed("schedulingStats.evictions[] must be objects")
        evictions.append((f"{text_at(e, 'reason')}\x1f{text_at(e, 'underlyingCause')}", int_at(e, "count")))
    created = time_at(meta, "creationTimestamp")
    queue = str_at(spec, "queueName")
    # read whatever the run already knows, so that whether this record is a dead letter never depends on
    # the order the objects arrived in
    deleted = deletion_time(meta, conds, status) if etype == "DELETED" else None
    deletion = deletion_requested(meta)
    rv = resource_version(meta)
    checks = admission_checks(status)
    # merge (everything above may raise Malformed; nothing below does)
    r.wl_deletion = _min(r.wl_deletion, deletion)
    for name, state, ltt, msg in checks:
        r.cond(r.wl_checks, r.wl_checks_rv, (name, state, "", ltt), msg, rv)
    latest = newer(rv, r.wl_rv)  # the newest Workload version seen: its identity, queue, what it waits for now
    if latest or not r.wl_name:
        r.wl_uid = str_at(meta, "uid") or r.wl_uid
        r.wl_name = str_at(meta, "name") or r.wl_name
    r.wl_created = _min(r.wl_created, created)
    if queue and (latest or not r.wl_queue):
        r.wl_queue = queue
    pending = None
    for ctype, cstatus, reason, ltt, msg in conds:
        r.cond(r.wl_conds, r.wl_conds_rv, (ctype, cstatus, reason, ltt), msg, rv)
        if cq and ctype in ("Admitted", "QuotaReserved") and cstatus == "True":
            r.cq_by_admission[ltt] = cq
        if ctype == "QuotaReserved" and cstatus == "False":
            pending = (reason, msg)
    if latest:
        r.wl_pending, r.wl_rv = pending, rv
    for key, count in evictions:
        if count > r.wl_evictions.get(key, 0):
            r.wl_evictions[key] = count
    if deleted is not None and r.root_deleted is None and r.kind is None:
        # a Workload deleted while its owner was never seen: remember when, for a stopped status
        r.root_deleted = deleted


def admission_checks(status: dict[str, Any]) -> list[tuple[str, str, int, str]]:
    """A Workload's ``status.admissionChecks``: (name, state, lastTransitionTime, message) of each. Raises Malformed."""
    out = []
    for c in list_at(status, "admissionChecks"):
        if not isinstance(c, dict):
            raise Malformed("status.admissionChecks[] must be objects")
        name, state = str_at(c, "name"), str_at(c, "state")
        ltt = time_at(c, "lastTransitionTime")
        if not name or not state or ltt is None:
            raise Malformed("status.admissionChecks[] needs name, state and lastTransitionTime")
        out.append((name, state, ltt, text_at(c, "message")))
    return out


def merge_pod(r: RunFacts, obj: dict[str, Any], owner_uid: str | None,
              accelerators: Accelerators = DEFAULT_ACCELERATORS) -> str:
    """A pod of the run; returns its uid. Whether the watch said DELETED does not matter: a deleted pod's last state
    says all. ``accelerators``: the extended resources counted as its GPUs."""
    meta = obj_at(obj, "metadata")
    spec = obj_at(obj, "spec")
    status = obj_at(obj, "status")
    uid = uid_of(meta)
    rv = resource_version(meta)
    labels = obj_at(meta, "labels")
    created = time_at(meta, "creationTimestamp")
    node = str_at(spec, "nodeName")
    phase = str_at(status, "phase")
    scheduled = None
    unsched = None
    disrupted = False
    ready_false = None
    for ctype, cstatus, reason, ltt, msg in conditions(status):
        if ctype == "PodScheduled":
            if cstatus == "True":
                scheduled = ltt
            else:
                unsched = Unschedulable(ltt, reason, msg)
        elif ctype == "DisruptionTarget" and cstatus == "True":
            disrupted = True
        elif ctype == "Ready" and cstatus == "False":
            ready_false = ltt
    started = None
    finished_at = None
    fail = None
    waiting = None
    for cs in list_at(status, "containerStatuses"):
        if not isinstance(cs, dict):
            raise Malformed("status.containerStatuses[] must be objects")
        state = obj_at(cs, "state")
        run = obj_at(state, "running")
        term = obj_at(state, "terminated")
        wait = obj_at(state, "waiting")
        if run:
            started = _min(started, time_at(run, "startedAt"))
        if term:
            started = _min(started, time_at(term, "startedAt"))
            finished_at = _max(finished_at, time_at(term, "finishedAt"))
            code = int_at(term, "exitCode")
            if code != 0 and fail is None:
                fail = (text_at(term, "reason") or "Error", code, text_at(term, "message"))
        if wait and str_at(wait, "reason") not in ("", "ContainerCreating", "PodInitializing"):
            waiting = text_at(wait, "reason")
    delete_req = deletion_requested(meta)
    try:
        gpus = pod_gpus(spec, accelerators)
    except ValueError as exc:
        raise Malformed(str(exc)) from None
    finished = None
    if phase in ("Succeeded", "Failed"):
        # a pod failed without any container terminating was stopped from outside: when deleted, that is
        # its deletion; otherwise the last readiness change is the best time it carries
        at = finished_at or delete_req or ready_false
        if at is not None:
            if phase == "Failed":
                reason, code, msg = fail or (text_at(status, "reason") or "Failed", -1, text_at(status, "message"))
            else:
                reason, code, msg = "Completed", 0, ""
            finished = PodEnd(at, phase, reason, code, msg)
    # merge
    p = r.pod(uid, str_at(meta, "name"))
    p.owner_uid = owner_uid or p.owner_uid
    cluster = labels.get("ray.io/cluster")
    if isinstance(cluster, str) and cluster:
        p.ray_cluster = cluster
    p.created = _min(p.created, created)
    if node:
        p.node = node
    p.scheduled = _min(p.scheduled, scheduled)
    if unsched is not None and (p.unschedulable is None or unsched.at > p.unschedulable.at or (
            unsched.at == p.unschedulable.at and newer(rv, p.unschedulable_rv))):
        # the latest PodScheduled=False; its message as the newest pod version with it says
        p.unschedulable, p.unschedulable_rv = unsched, rv
    p.started = _min(p.started, started)
    if finished is not None and (p.finished is None or finished > p.finished):
        p.finished = finished
    p.delete_requested = _min(p.delete_requested, delete_req)
    r.pods_deleted = _max(r.pods_deleted, delete_req)
    r.pods_finished = _max(r.pods_finished, finished_at)
    p.disrupted = p.disrupted or disrupted
    p.gpus = max(p.gpus, gpus)
    if waiting and newer(rv, p.waiting_rv):
        p.waiting_reason, p.waiting_rv = waiting, rv
    return uid


def merge_raycluster(r: RunFacts, obj: dict[str, Any]) -> None:
    """A RayCluster of the run: when it was created and became ready (its deletion, as a pod's, says nothing more)."""
    meta = obj_at(obj, "metadata")
    status = obj_at(obj, "status")
    name = str_at(meta, "name")
    if not name:
        raise Malformed("metadata.name is missing")
    ready = time_at(obj_at(status, "stateTransitionTimes"), "ready")
    if ready is None and str_at(status, "state") == "ready":
        for ctype, cstatus, _reason, ltt, _msg in conditions(status):
            if ctype == "RayClusterProvisioned" and cstatus == "True":
                ready = ltt
    old = r.ray_clusters.get(name)
    created = time_at(meta, "creationTimestamp")
    if old is not None:
        created, ready = _min(old.created, created), _min(old.ready, ready)
    r.ray_clusters[name] = RayClusterFacts(str_at(meta, "uid"), created, ready)


def merge_event(r: RunFacts, obj: dict[str, Any], involved: dict[str, Any]) -> None:
    meta = obj_at(obj, "metadata")
    uid = str_at(meta, "uid") or str_at(meta, "name")
    if not uid:
        raise Malformed("event has neither metadata.uid nor metadata.name")
    series = obj_at(obj, "series")
    first = (time_at(obj, "firstTimestamp") or time_at(obj, "deprecatedFirstTimestamp") or time_at(obj, "eventTime")
             or time_at(meta, "creationTimestamp"))
    last = (time_at(obj, "lastTimestamp") or time_at(series, "lastObservedTime")
            or time_at(obj, "deprecatedLastTimestamp") or first)
    if first is None or last is None:
        raise Malformed("event has no timestamp (firstTimestamp, eventTime or creationTimestamp)")
    count = int_at(obj, "count", 0) or int_at(series, "count", 0) or int_at(obj, "deprecatedCount", 0) or 1
    message = cut_text(str_at(obj, "message") or str_at(obj, "note"), 1024)
    r.event(uid, EventFacts(text_at(obj, "reason"), str_at(obj, "type"), message, str_at(involved, "kind"),
                            str_at(involved, "name"), first, last, count))
