"""``tracker nodes``: the bad-node signal. One row per node the index's pods were bound to, with the runs and pods
seen there in a window, how many of those pods failed or were evicted (``tracker.read.pods`` says which), the runs
that failed or were evicted there, and the last failure or eviction (time, reason, run), worst first: most failed
pods (a pod's own failure is the node's first suspect), then most evicted pods, runs failed, runs evicted, the latest
failure, the node's name.

A pod counts in the window ``[since, until)`` when it was on its node during it: bound (else created) before
``until``, and not finished (or released) before ``since``; no window: every pod. The rows come from the pods table
(``pod_placements``: node, lost, times) joined with its attempt (failures, end reason) and its run (status, attempts);
a run **failed there** when it ended failed with a pod of its last attempt on the node, and was **evicted there**
when one of its pods there was evicted. Each node has what the index knows of the Node itself (table ``nodes``,
``tracker.read.nodeinfo``; none before schema 10 or where the watcher could not read Nodes): its GPU model and count,
and what is wrong with it as last seen (NotReady since, cordoned, a pressure condition, deleted). The same answer
across clusters is the Kusto function ``TaugridNodes`` (deploy/adx-mon/functions.yaml). Standard library only (a fast
start, as ``tracker runs``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from tracker.read.filters import exact, time_text
from tracker.read.nodeinfo import NodeInfo, condition_text, gpu_text, node_info
from tracker.read.pods import EVICTED, FAILED, classify, failure_text
from tracker.read.runs import Column, render_table
from tracker.read.store import IndexReader, Run

#: ``tracker nodes -o json``'s fields of a node, in order.
FIELDS = ("node", "runs", "pods", "failed_pods", "evicted_pods", "runs_failed", "runs_evicted", "last_failure_at",
          "last_failure_reason", "last_failure_run", "gpu_product", "gpu_count", "condition")


def _pods_sql(columns: set[str], since: datetime | None, until: datetime | None) -> tuple[str, list[str]]:
    """The pods bound to a node in the window, each with its attempt's failures and end reason and its run's status
    and attempts (an index of a schema before 4 has no ``lost`` nor ``released_at``: they read NULL)."""
    lost = "p.lost" if "lost" in columns else "NULL"
    released = "p.released_at" if "released_at" in columns else "NULL"
    where, params = ["p.node IS NOT NULL"], []
    if until is not None:
        start = "COALESCE(p.scheduled_at, p.created_at)"
        where.append(f"({start} IS NULL OR {exact(start)} < ?)")
        params.append(time_text(until))
    if since is not None:
        end = f"COALESCE(p.finished_at, {released})"
        where.append(f"({end} IS NULL OR {exact(end)} >= ?)")
        params.append(time_text(since))
    sql = (f"SELECT p.node, p.run_id, p.attempt, p.pod, {lost}, p.finished_at, {released}, a.failures, a.end_reason, "
           "r.status, r.attempts FROM pod_placements p "
           "LEFT JOIN attempts a ON a.run_id = p.run_id AND a.attempt = p.attempt "
           "LEFT JOIN runs r ON r.run_id = p.run_id WHERE " + " AND ".join(where))
    return sql, params


_Failures = dict[str, tuple[str, str | None]]  # pod -> (reason text, time)


def _failures(cell: str | None, cache: dict[str, _Failures]) -> _Failures:
    """An attempt's failures as pod -> (reason text, time), decoded once per attempt (``cache``)."""
    if not cell or cell == "[]":
        return {}
    if cell not in cache:
        try:
            listed = json.loads(cell)
        except ValueError:
            listed = []
        cache[cell] = {str(f.get("pod")): (failure_text(str(f.get("reason") or "Failed"), f.get("exit_code")),
                                           f.get("at")) for f in listed if isinstance(f, dict)}
    return cache[cell]


def nodes(reader: IndexReader, *, since: datetime | None = None, until: datetime | None = None) -> list[dict[str, Any]]:
    """The nodes' rows (``FIELDS``), worst first."""
    def query(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
        columns = {r[1] for r in conn.execute("PRAGMA table_info(pod_placements)")}
        sql, params = _pods_sql(columns, since, until)
        return conn.execute(sql, params).fetchall()

    rows: dict[str, dict[str, Any]] = {}
    cache: dict[str, _Failures] = {}
    for (node, run_id, attempt, pod, lost, finished_at, released_at, failures, end_reason, status,
         attempts) in reader.read(query):
        row = rows.setdefault(node, {"node": node, "runs": set(), "pods": 0, "failed_pods": 0, "evicted_pods": 0,
                                     "runs_failed": set(), "runs_evicted": set(), "last_failure_at": None,
                                     "last_failure_reason": None, "last_failure_run": None})
        failure = _failures(failures, cache).get(pod)
        outcome, reason = classify(lost=lost, failure=None if failure is None else failure[0], end_reason=end_reason,
                                   finished=finished_at is not None or released_at is not None)
        row["runs"].add(run_id)
        row["pods"] += 1
        if status == "failed" and attempt == attempts:
            row["runs_failed"].add(run_id)
        if outcome not in (FAILED, EVICTED):
            continue
        row["failed_pods" if outcome == FAILED else "evicted_pods"] += 1
        if outcome == EVICTED:
            row["runs_evicted"].add(run_id)
        at = (failure[1] if failure is not None else None) or finished_at or released_at
        if at is not None and (row["last_failure_at"] is None or _later(at, row["last_failure_at"])):
            row["last_failure_at"], row["last_failure_reason"], row["last_failure_run"] = at, reason, run_id
        elif row["last_failure_reason"] is None:
            row["last_failure_reason"], row["last_failure_run"] = reason, run_id
    infos = node_info(reader, rows)
    out = [{**r, "runs": len(r["runs"]), "runs_failed": len(r["runs_failed"]), "runs_evicted": len(r["runs_evicted"]),
            "gpu_product": None if (i := infos.get(r["node"])) is None else i.gpu_product,
            "gpu_count": None if i is None else i.gpu_count, "condition": condition_text(i)} for r in rows.values()]
    out.sort(key=lambda r: r["node"])
    out.sort(key=lambda r: _stamp(r["last_failure_at"]), reverse=True)
    out.sort(key=lambda r: (-r["failed_pods"], -r["evicted_pods"], -r["runs_failed"], -r["runs_evicted"]))
    return out


def _stamp(at: str | None) -> str:
    """A stored time in a form that orders as text ('' for none: last when newest first)."""
    if at is None:
        return ""
    return at[:19] + ".000000Z" if len(at) == 20 else at


def _later(a: str, b: str) -> bool:
    return _stamp(a) > _stamp(b)


def render(rows: Sequence[dict[str, Any]], *, output: str, since: datetime | None, until: datetime | None,
           now: datetime, width: int | None) -> str:
    if output == "json":
        return json.dumps({"since": None if since is None else time_text(since),
                           "until": None if until is None else time_text(until), "now": time_text(now),
                           "nodes": list(rows)}, indent=2) + "\n"
    cols = [
        Column("NODE", lambda r: str(r.data["node"])),  # never cut: node names often differ only at their end
        Column("RUNS", lambda r: str(r.data["runs"]), right=True),
        Column("PODS", lambda r: str(r.data["pods"]), right=True),
        Column("FAIL", lambda r: str(r.data["failed_pods"]), right=True),
        Column("EVICT", lambda r: str(r.data["evicted_pods"]), right=True),
        Column("RUN-F", lambda r: str(r.data["runs_failed"]), right=True),
        Column("RUN-E", lambda r: str(r.data["runs_evicted"]), right=True),
        Column("LAST-FAILURE", lambda r: _when(r.data["last_failure_at"])),
        Column("REASON", lambda r: str(r.data["last_failure_reason"] or "-"), 6, shrink_first=True, free_text=True),
        Column("GPU", lambda r: _gpu(r.data), 5, shrink_first=True),
        Column("CONDITION", lambda r: str(r.data["condition"] or "-"), 5, shrink_first=True, free_text=True),
    ]
    return render_table([Run(r, None) for r in rows], cols, width=width)


def _gpu(row: dict[str, Any]) -> str:
    return gpu_text(NodeInfo(row["node"], row["gpu_product"], row["gpu_count"], None, None, False, False, ())) or "-"


def _when(at: str | None) -> str:
    return "-" if at is None else at[:16].replace("T", " ") + "Z"
