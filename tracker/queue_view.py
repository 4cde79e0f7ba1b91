"""What a pending run waits behind, in words: its ClusterQueue's pending count, GPU usage against nominal quota,
stopped state, and its position when Kueue's visibility API gave one (``IndexReader.queue_context``).

Standard library only (``tracker runs`` imports it and starts without pydantic)."""

from __future__ import annotations

from typing import Any


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
