"""What a pending run waits behind: read from the index's Kueue tables (``queue_context``: its LocalQueue, its
ClusterQueue and its position, from tables ``queues`` and ``queue_positions``), and said in words (its ClusterQueue's
pending count, GPU usage against nominal quota, stopped state, and its position when Kueue's visibility API gave
one).

Standard library only (``tracker runs`` imports it and starts without pydantic)."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable
from typing import Any

from tracker.read.store import IndexReader, parse_time


def _fmt(value: float | None) -> str:
    if value is None:
        return "?"
    return str(int(value)) if value == int(value) else f"{value:g}"


def _stopped(q: dict[str, Any]) -> str:
    policy = q.get("stop_policy")
    return f"stopped ({policy})" if policy and policy != "None" else "stopped"


def text(ctx: dict[str, Any] | None) -> str:
    """One sentence, e.g. 'waiting behind 3 pending workloads in ClusterQueue cq (nvidia.com/gpu 8/8 used),
    position 2'; '' when nothing is known."""
    if not ctx:
        return ""
    cq, lq, pos = ctx.get("cluster_queue"), ctx.get("local_queue"), ctx.get("position")
    parts: list[str] = []
    if cq:
        pending = int(cq.get("pending") or 0)
        if pending:
            plural = "" if pending == 1 else "s"
            head = f"waiting behind {pending} pending workload{plural} in ClusterQueue {cq['name']}"
        else:
            reserving = int(cq.get("reserving") or 0)
            head = f"no workload pending in ClusterQueue {cq['name']}, {reserving} reserving quota"
        gpu = cq.get("gpu")
        if gpu:
            head += f" ({gpu['resource']} {_fmt(gpu['used'])}/{_fmt(gpu['nominal'])} used)"
        parts.append(head)
        if cq.get("stopped"):
            parts.append(f"ClusterQueue {_stopped(cq)}")
        elif cq.get("active") is False:
            parts.append(f"ClusterQueue inactive ({cq.get('active_reason') or 'no reason'})")
        if cq.get("deleted"):
            parts.append("ClusterQueue deleted")
    if lq and lq.get("stopped"):
        parts.append(f"LocalQueue {lq['name']} {_stopped(lq)}")
    if pos and pos.get("position_in_cluster_queue") is not None:
        where = f"position {pos['position_in_cluster_queue']}"
        if pos.get("position_in_local_queue") is not None:
            where += f" ({pos['position_in_local_queue']} in LocalQueue {pos.get('local_queue') or '?'})"
        parts.append(f"{where} at {pos['polled_at']}")
    return ", ".join(parts)


def short(ctx: dict[str, Any] | None) -> str:
    """The ``runs -o wide`` cell: 'pos 2, 3 pending, nvidia.com/gpu 8/8, stopped'; '-' when nothing is known."""
    if not ctx:
        return "-"
    cq, lq, pos = ctx.get("cluster_queue"), ctx.get("local_queue"), ctx.get("position")
    parts: list[str] = []
    if pos and pos.get("position_in_cluster_queue") is not None:
        parts.append(f"pos {pos['position_in_cluster_queue']}")
    if cq:
        parts.append(f"{int(cq.get('pending') or 0)} pending")
        gpu = cq.get("gpu")
        if gpu:
            parts.append(f"{gpu['resource']} {_fmt(gpu['used'])}/{_fmt(gpu['nominal'])}")
    if (cq and cq.get("stopped")) or (lq and lq.get("stopped")):
        parts.append("stopped")
    return ", ".join(parts) or "-"


# ------------------------------------------------------------------------------------------ reading


def queue_context(reader: IndexReader, run_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """What each pending run of ``run_ids`` waits behind (tables ``queues`` and ``queue_positions``, schema 7):
    {"cluster_queue": {...}, "local_queue": {...}, "position": {...}}, each present when known. A position is
    kept only when it was polled after the run was last queued. Runs that are not pending, and an index from
    before schema 7, give nothing."""
    ids = list(dict.fromkeys(run_ids))

    def query(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'queues'").fetchone() is None:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            marks = ", ".join("?" * len(chunk))
            runs = conn.execute(
                f"SELECT run_id, namespace, queue, cluster_queue, queued_at FROM runs "
                f"WHERE status = 'pending' AND run_id IN ({marks})", chunk).fetchall()
            positions = {r[0]: r for r in conn.execute(
                f"SELECT run_id, cluster_queue, local_queue, position_in_cluster_queue, position_in_local_queue, "
                f"polled_at, polled_us FROM queue_positions WHERE run_id IN ({marks})", chunk)}
            for run_id, namespace, queue, cluster_queue, queued_at in runs:
                ctx: dict[str, Any] = {}
                pos = positions.get(run_id)
                lq = _queue(conn, f"queue:{namespace}/{queue}") if namespace and queue else None
                if lq is not None:
                    ctx["local_queue"] = lq
                if cluster_queue is None and pos is not None:
                    cluster_queue = pos[1]
                if cluster_queue is None and lq is not None:  # not admitted yet: its LocalQueue's ClusterQueue
                    cluster_queue = lq.get("cluster_queue")
                if cluster_queue:
                    cq = _queue(conn, f"queue:{cluster_queue}")
                    if cq is not None:
                        ctx["cluster_queue"] = cq
                queued = parse_time(queued_at)
                if pos is not None and pos[3] is not None and (
                        queued is None or pos[6] >= int(queued.timestamp() * 1_000_000)):
                    ctx["position"] = {"cluster_queue": pos[1], "local_queue": pos[2],
                                       "position_in_cluster_queue": pos[3], "position_in_local_queue": pos[4],
                                       "polled_at": pos[5]}
                if ctx:
                    out[run_id] = ctx
        return out

    return reader.read(query)

def _queue(conn: sqlite3.Connection, key: str) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT kind, namespace, name, cluster_queue, cohort, stop_policy, stopped, active, active_reason, "
        "active_message, pending, reserving, admitted, admission_checks, resources, deleted, updated_at "
        "FROM queues WHERE key = ?", (key,)).fetchone()
    if row is None:
        return None
    resources = json.loads(row[14])
    return {"kind": row[0], "namespace": row[1], "name": row[2], "cluster_queue": row[3], "cohort": row[4],
            "stop_policy": row[5], "stopped": bool(row[6]), "active": None if row[7] is None else bool(row[7]),
            "active_reason": row[8], "active_message": row[9], "pending": row[10], "reserving": row[11],
            "admitted": row[12], "admission_checks": json.loads(row[13]), "resources": resources,
            "gpu": gpu_usage(resources), "deleted": bool(row[15]), "updated_at": row[16]}


# tracker.core.gpu.ACCELERATOR_RESOURCES, not imported (it imports pydantic): the resources shown as GPUs
ACCELERATORS = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe", "habana.ai/gaudi")
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {"": 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}


def _number(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    m = _QUANTITY.match(text.strip())
    return None if m is None else float(m.group(1)) * _SUFFIX[m.group(2) or ""]


def _accelerator(resource: str) -> bool:
    return resource in ACCELERATORS or resource.startswith("nvidia.com/mig-")


def gpu_usage(resources: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first accelerator resource of a queue, summed over its flavors: {resource, used (reserved), nominal}."""
    sums: dict[str, list[float | None]] = {}
    for r in resources:
        name = r.get("resource")
        if not isinstance(name, str) or not _accelerator(name):
            continue
        # quota reserved (flavorsReservation) includes what admitted workloads use (flavorsUsage), and also what
        # workloads hold while their admission checks run: what a pending workload waits behind
        used = _number(r.get("reserved")) if r.get("reserved") is not None else _number(r.get("used"))
        nominal = _number(r.get("nominal"))
        acc = sums.setdefault(name, [None, None])
        if used is not None:
            acc[0] = (acc[0] or 0.0) + used
        if nominal is not None:
            acc[1] = (acc[1] or 0.0) + nominal
    if not sums:
        return None
    name = min(sums, key=lambda n: (n not in ACCELERATORS, n))
    used, nominal = sums[name]
    return {"resource": name, "used": used, "nominal": nominal}
