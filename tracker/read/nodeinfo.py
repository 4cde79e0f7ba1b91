"""What the index knows of a node itself (table ``nodes``, schema 10: the watcher's Node objects, issue 28): its GPU
model and count, and its conditions, as the readers say them next to the pods that ran there (``tracker show``,
``tracker compare``'s "GPU model" row, ``tracker nodes``, the web view's run page).

An index of a schema before 10, or of a watcher that was not allowed to read Nodes, has no rows: a node is then said
without them, as before. ``note`` is the one wording: 'NVIDIA-H100-80GB-HBM3 x8', 'NotReady since 2026-08-20
10:00Z', 'cordoned', 'deleted'. Standard library only (a fast start, as the other readers).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from tracker.read.store import IndexReader

_CHUNK = 500  # names per query (SQLite's bound on parameters is far above)


class NodeInfo(NamedTuple):
    """One row of ``nodes``, as the readers use it."""

    name: str
    gpu_product: str | None
    gpu_count: int | None
    ready: bool | None
    ready_since: str | None
    unschedulable: bool
    deleted: bool
    problems: tuple[str, ...]  # conditions other than Ready that are True (MemoryPressure, a GPU problem), by type


def node_info(reader: IndexReader, names: Iterable[str] | None = None) -> dict[str, NodeInfo]:
    """The index's rows of the nodes named (every node when ``names`` is None); {} without a ``nodes`` table."""
    wanted = None if names is None else sorted(set(names))

    def query(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'nodes'").fetchone() is None:
            return []
        sql = ("SELECT name, gpu_product, gpu_count, ready, ready_since, unschedulable, deleted, conditions "
               "FROM nodes")
        if wanted is None:
            return conn.execute(sql).fetchall()
        rows: list[tuple[object, ...]] = []
        for i in range(0, len(wanted), _CHUNK):
            part = wanted[i:i + _CHUNK]
            rows += conn.execute(f"{sql} WHERE name IN ({', '.join('?' * len(part))})", part).fetchall()
        return rows

    if wanted == []:
        return {}
    out = {}
    for name, product, count, ready, since, unschedulable, deleted, conditions in reader.read(query):
        out[str(name)] = NodeInfo(str(name), None if product is None else str(product),
                                  count if isinstance(count, int) else None, None if ready is None else bool(ready),
                                  None if since is None else str(since), bool(unschedulable), bool(deleted),
                                  _problems(conditions))
    return out


def _problems(cell: object) -> tuple[str, ...]:
    try:
        listed = json.loads(str(cell)) if cell else []
    except ValueError:
        return ()
    return tuple(sorted(str(c.get("type")) for c in listed if isinstance(c, dict) and c.get("type") != "Ready"
                        and c.get("status") == "True"))


def gpu_text(info: NodeInfo | None) -> str | None:
    """'NVIDIA-H100-80GB-HBM3 x8'; None when the node's GPU model is not known."""
    if info is None or info.gpu_product is None:
        return None
    return info.gpu_product + (f" x{info.gpu_count}" if info.gpu_count else "")


def condition_text(info: NodeInfo | None) -> str | None:
    """What is wrong with the node as the watcher last saw it ('NotReady since 2026-08-20 10:00Z', 'cordoned',
    'MemoryPressure', 'deleted'), None when nothing is (or nothing is known)."""
    if info is None:
        return None
    said = []
    if info.deleted:
        said.append("deleted")
    elif info.ready is not True:
        state = "NotReady" if info.ready is False else "Ready unknown"
        said.append(state + (f" since {_when(info.ready_since)}" if info.ready_since else ""))
    if info.unschedulable and not info.deleted:
        said.append("cordoned")
    said.extend(info.problems)
    return ", ".join(said) or None


def note(info: NodeInfo | None) -> str | None:
    """The node's GPU model and what is wrong with it, in one parenthesis-free text; None when nothing is known."""
    said = [t for t in (gpu_text(info), condition_text(info)) if t]
    return ", ".join(said) or None


def notes(infos: Mapping[str, NodeInfo]) -> dict[str, str]:
    """``note`` of each node that has one."""
    return {name: text for name, info in infos.items() if (text := note(info))}


def gpu_models(nodes: Sequence[str], infos: Mapping[str, NodeInfo]) -> str:
    """The GPU models of ``nodes`` (a run's), each with how many of them have it: 'NVIDIA-H100-80GB-HBM3 x8 (2
    nodes)'; '-' when none is known, 'unknown (n nodes)' for those whose model is not."""
    counts: dict[str, int] = {}
    for n in nodes:
        text = gpu_text(infos.get(n)) or "unknown"
        counts[text] = counts.get(text, 0) + 1
    if not counts or set(counts) == {"unknown"}:
        return "-"
    return ", ".join(f"{t} ({c} node{'s' if c != 1 else ''})" for t, c in sorted(counts.items(),
                                                                             key=lambda kv: (kv[0] == "unknown",
                                                                                             -kv[1], kv[0])))


def _when(at: str) -> str:
    return at[:16].replace("T", " ") + "Z"
