"""Test helpers for complete histories (``RunHistory`` with its metric points and pods)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

import pytest

from tracker.core.model import HistoryUpdate, RunHistory
from tracker.read.store import IndexReader
from tracker.shell import index_schema
from tracker.shell.index import ExperimentIndex


def ups(histories: Iterable[RunHistory]) -> list[HistoryUpdate]:
    """The updates that write these complete histories, each as a whole (as a replay of its run from scratch)."""
    return [HistoryUpdate.of(h) for h in histories]


def copy_into_older(conn: sqlite3.Connection) -> None:
    """Copy the rows of the attached index ``cur`` into the older index ``main``, as that version held them: its
    attempts' ``pods`` column (schema 5 and older) is the JSON array of their pods."""
    for table in ("runs", "transitions", "attempts", "metric_summaries", "resume_links", "pod_placements"):
        have = {r[1] for r in conn.execute(f"PRAGMA cur.table_info({table})")}
        cols = [r[1] for r in conn.execute(f"PRAGMA main.table_info({table})")]
        exprs = [f'c."{c}"' if c in have else
                 "(SELECT json_group_array(json_object('pod', p.pod)) FROM cur.pod_placements p "
                 "WHERE p.run_id = c.run_id AND p.attempt = c.attempt)" for c in cols]
        conn.execute(f"INSERT INTO main.{table} ({', '.join(cols)}) SELECT {', '.join(exprs)} FROM cur.{table} c")


def index_of_schema(path: Path, version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Create an empty experiment index at ``path`` as the tracker of schema ``version`` made it (its migrations
    up to that version only)."""
    with monkeypatch.context() as m:
        m.setattr(index_schema, "MIGRATIONS", {k: v for k, v in index_schema.MIGRATIONS.items() if k <= version})
        m.setattr(index_schema, "SCHEMA_VERSION", version)
        with ExperimentIndex(path):
            pass


def stored(index: ExperimentIndex | IndexReader) -> IndexReader:
    """What an index holds, read as the read side reads it: a reader of the index a test wrote (``index`` itself
    when it is one). The writer only writes; each call reads afresh, seeing every write made before it."""
    if isinstance(index, IndexReader):
        return index
    return IndexReader(index.path).open()
