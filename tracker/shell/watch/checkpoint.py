"""The watcher's resumable state: what a checkpoint holds (``Snapshot`` saved, ``Saved`` loaded), the
``CheckpointStore`` protocol, and its local SQLite store. The shared store of leader-elected replicas, on the
compacted watch-state topic, is ``tracker.shell.watch.kafka_checkpoint.KafkaCheckpoint``."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tracker import errors
from tracker.core.correlate import Held

CHECKPOINT_VERSION = 1



class CheckpointError(errors.StoredStateError):
    """A watch checkpoint of another version, or one that does not decode: the watcher cannot resume from it."""


Entry = tuple[str, bytes]  # (resourceVersion, slimmed object as compact JSON)


@dataclass(slots=True)
class Snapshot:
    rvs: dict[str, str | None]  # stream key -> resourceVersion to resume from (None: list first)
    changed: dict[str, dict[str, Entry | None]]  # stream key -> uid -> entry (None: forgotten)
    held: list[tuple[str, Held]]


@dataclass(slots=True)
class Saved:
    rvs: dict[str, str | None] = field(default_factory=dict)
    known: dict[str, dict[str, Entry]] = field(default_factory=dict)
    held: list[Held] = field(default_factory=list)


class CheckpointStore(Protocol):
    """Where a watcher keeps its resumable state: ``load`` once at the start of a run (for a shared store, after
    fencing whoever saved before), ``save`` every increment (one transaction; raises ``LeadershipLost`` if a newer
    owner took the store over), ``close`` at the end."""

    async def load(self) -> Saved: ...

    async def save(self, snap: Snapshot) -> None: ...

    async def close(self) -> None: ...


class SqliteCheckpoint:
    """The ``CheckpointStore`` of one local SQLite file: opened, loaded and saved in a worker thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db: Checkpoint | None = None

    async def load(self) -> Saved:
        self.db = await asyncio.to_thread(Checkpoint, self.path)
        return await asyncio.to_thread(self.db.load)

    async def save(self, snap: Snapshot) -> None:
        assert self.db is not None, "load first"
        await asyncio.to_thread(self.db.save, snap)

    async def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None


class Checkpoint:
    """The watcher's resumable state in one SQLite file; every save is one transaction."""

    SCHEMA = """
        CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE IF NOT EXISTS streams (stream TEXT PRIMARY KEY, rv TEXT);
        CREATE TABLE IF NOT EXISTS objects (stream TEXT NOT NULL, uid TEXT NOT NULL, rv TEXT NOT NULL,
                                            obj BLOB NOT NULL, PRIMARY KEY (stream, uid)) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS held (seq INTEGER PRIMARY KEY, type TEXT NOT NULL, obj BLOB NOT NULL,
                                         source TEXT NOT NULL);
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.lock = threading.Lock()  # one user at a time: saves run in a worker thread
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(self.SCHEMA)
        row = self.db.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        if row is None:
            self.db.execute("INSERT INTO meta VALUES ('version', ?)", (str(CHECKPOINT_VERSION),))
        elif row[0] != str(CHECKPOINT_VERSION):
            raise CheckpointError(f"{path}: unsupported watch checkpoint version {row[0]}")

    def load(self) -> Saved:
        with self.lock:
            return self._load()

    def _load(self) -> Saved:
        saved = Saved()
        for stream, rv in self.db.execute("SELECT stream, rv FROM streams"):
            saved.rvs[stream] = rv
        for stream, uid, rv, obj in self.db.execute("SELECT stream, uid, rv, obj FROM objects"):
            saved.known.setdefault(stream, {})[uid] = (rv, bytes(obj))
        for etype, obj, source in self.db.execute("SELECT type, obj, source FROM held ORDER BY seq"):
            try:
                saved.held.append((etype, json.loads(obj), source))
            except ValueError as exc:
                raise CheckpointError(f"{self.path}: a held record does not decode: {exc}") from exc
        return saved

    def save(self, snap: Snapshot) -> None:
        with self.lock:
            self._save(snap)

    def _save(self, snap: Snapshot) -> None:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("INSERT OR REPLACE INTO streams VALUES (?, ?)", snap.rvs.items())
            for stream, changed in snap.changed.items():
                db.executemany("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?)",
                               [(stream, uid, e[0], e[1]) for uid, e in changed.items() if e is not None])
                db.executemany("DELETE FROM objects WHERE stream = ? AND uid = ?",
                               [(stream, uid) for uid, e in changed.items() if e is None])
            db.execute("DELETE FROM held")
            db.executemany("INSERT INTO held (type, obj, source) VALUES (?, ?, ?)",
                           [(etype, json.dumps(obj, separators=(",", ":")), source)
                            for _owner, (etype, obj, source) in snap.held])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self.lock:
            self.db.close()
