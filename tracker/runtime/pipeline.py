"""The embedded pipeline: captures (or watchers) -> bus -> reducer -> bus -> sinks, in one process.

Every stage is connected by a bounded ``InProcessBus``; a slow sink back-pressures the reducer, which
back-pressures the source. The reducer flushes what changed in each run (``HistoryUpdate``) every ``flush_every``
records and, when the source is asynchronous (a live watch, standard input), whenever its input runs dry, so a live
run's history reaches the index without waiting for a batch. A synchronous source (capture files) never waits for
its input: its queue runs dry only when the reducer has caught up with the reader, which happened every 50 ms
(``YIELD_EVERY_S``, about 700 records), so it flushes every ``replay_flush_every`` records and at its end: each run
touched is derived and written once a batch instead of once per turn of the reader.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

from tracker import errors
from tracker.core.model import DeadLetter, HistoryUpdate
from tracker.core.nodes import NodeState
from tracker.core.queues import QueuePosition, QueueState
from tracker.core.reducer import Flushed, Reducer
from tracker.settings import DEAD_LETTER_FILE_BYTES, DEAD_LETTER_FILES
from tracker.shell import tasks
from tracker.shell.bus import InProcessBus
from tracker.shell.capture import BadRecord, Record
from tracker.shell.index import StateRows
from tracker.shell.reducer_state import StateTracker


class HistorySink(Protocol):
    def write(self, updates: Sequence[HistoryUpdate]) -> int: ...


class StateStore(Protocol):
    """A sink that keeps the reducer's state with the histories, in one transaction (``ExperimentIndex``)."""

    def write(self, updates: Sequence[HistoryUpdate], offsets: None = None, *,
              state: StateRows | None = None) -> int: ...


@runtime_checkable
class QueueStore(Protocol):
    """A sink that keeps Kueue's queues and pending runs' positions (``ExperimentIndex.write_queues``)."""

    def write_queues(self, queues: Sequence[QueueState], positions: Sequence[QueuePosition]) -> int: ...


@runtime_checkable
class NodeStore(Protocol):
    """A sink that keeps the Nodes runs ran on (``ExperimentIndex.write_nodes``, ``AdxSink.write_nodes``)."""

    def write_nodes(self, nodes: Sequence[NodeState]) -> int: ...


class DeadLetterSink(Protocol):
    def write_dead_letters(self, letters: Sequence[DeadLetter]) -> None: ...


# a synchronous source (a capture file read on the loop) gives the loop a turn at least this often: the reducer
# runs, and a signal handler sets ``stop`` (a record is at most ``capture.MAX_VALUE_BYTES`` of input away)
YIELD_EVERY_S = 0.05


@dataclass(frozen=True, slots=True)
class PipelineLimits:
    change_queue: int = 10_000  # records between source and reducer
    history_queue: int = 64  # flushed batches between reducer and sinks
    flush_every: int = 5_000  # records folded between two flushes at most
    replay_flush_every: int = 20_000  # the same for a synchronous source (capture files: module docstring)


@dataclass(slots=True)
class PipelineReport:
    records: int = 0
    runs_written: int = 0
    rows_changed: int = 0
    dead_letters: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    stopped: bool = False  # a stop request ended the intake before the records did
    stopped_by: int = 0  # the signal that asked to stop, when one did
    last_source: str = ""  # where the last record folded came from ("path:line")


class JsonlDeadLetters:
    """Dead letters appended to a JSON-lines file, one record per line, with the reason.

    The file is readable by its owner only (0600: even redacted, a dead letter describes the cluster's objects),
    and bounded: when the next letter would take it past ``max_bytes`` it is renamed ``<name>.1`` (the older
    ``<name>.1`` becomes ``<name>.2``, and so on) and a new one is started; of the rotated files only ``files - 1``
    are kept, and the letters of the ones deleted are counted in ``dropped`` (and passed to ``on_drop``)."""

    def __init__(self, path: Path, *, max_bytes: int = DEAD_LETTER_FILE_BYTES, files: int = DEAD_LETTER_FILES,
                 on_drop: Callable[[int], None] | None = None) -> None:
        if max_bytes < 1 or files < 1:
            raise errors.ConfigError("a dead-letter file needs max_bytes >= 1 and files >= 1")
        self.path = path
        self.max_bytes = max_bytes
        self.files = files
        self.on_drop = on_drop
        self.dropped = 0  # letters deleted by rotation, by this writer
        self.rotations = 0

    def write_dead_letters(self, letters: Sequence[DeadLetter]) -> None:
        if not letters:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = self._open()
        try:
            size = os.fstat(fh.fileno()).st_size
            for dl in letters:
                line = dl.model_dump_json().encode() + b"\n"
                if size and size + len(line) > self.max_bytes:
                    fh.close()
                    self._rotate()
                    fh = self._open()
                    size = 0
                fh.write(line)
                size += len(line)
        finally:
            fh.close()

    def rotated(self) -> list[Path]:
        """The rotated files that exist, newest first (``<name>.1``, ``<name>.2``, ...)."""
        found = []
        for p in self.path.parent.glob(self.path.name + ".*"):
            suffix = p.name[len(self.path.name) + 1:]
            if suffix.isdigit() and suffix[0] != "0":
                found.append((int(suffix), p))
        return [p for _n, p in sorted(found)]

    def _open(self) -> BinaryIO:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if os.fstat(fd).st_mode & 0o077:  # a file from before, or made under a wider umask
                os.fchmod(fd, 0o600)
            return os.fdopen(fd, "ab")
        except BaseException:
            os.close(fd)
            raise

    def _rotate(self) -> None:
        keep = self.files - 1  # rotated files kept, the one made now included
        rotated = self.rotated()
        survivors = rotated[:keep - 1] if keep else []
        dropped = 0
        for p in rotated[len(survivors):] if keep else [*rotated, self.path]:
            dropped += _lines(p)
            p.unlink()
        for i, p in reversed(list(enumerate(survivors, start=2))):
            p.rename(p.with_name(f"{self.path.name}.{i}"))
        if keep:
            self.path.rename(self.path.with_name(f"{self.path.name}.1"))
        self.rotations += 1
        if dropped:
            self.dropped += dropped
            if self.on_drop is not None:
                self.on_drop(dropped)


def _lines(path: Path) -> int:
    n = 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            n += chunk.count(b"\n")
    return n


async def run_pipeline(
    records: Iterable[Record | BadRecord] | AsyncIterable[Record | BadRecord],
    reducer: Reducer,
    *,
    sinks: Sequence[HistorySink],
    dead_letters: DeadLetterSink | None = None,
    limits: PipelineLimits | None = None,
    on_progress: Callable[[int], None] | None = None,
    store: StateStore | None = None,
    stop: asyncio.Event | None = None,
    on_flush: Callable[[Flushed, int, int], None] | None = None,
) -> PipelineReport:
    """Fold ``records`` and write the histories of the runs they change to ``store`` (with the reducer's state
    for those runs, so that a later call continues from it) and to ``sinks``; dead letters to ``dead_letters``.

    Once ``stop`` is set no further record is taken from a synchronous source (an iterable: checked after each
    record, and the loop gets a turn every ``YIELD_EVERY_S``); an asynchronous source is read to its end and must
    end on ``stop`` itself (``tasks.in_thread(until=stop)`` hands what it read, then ends, even while its thread
    waits on a quiet pipe). Every record taken is folded and written, and the report says ``stopped`` and the source
    of the last record folded. ``on_flush`` is called after each flush of the reducer
    with what it flushed, the records folded since the previous flush and the reducer's watermark (metrics)."""
    lim = limits or PipelineLimits()
    flush_when_dry = isinstance(records, AsyncIterable)  # a source that may wait for its input (module docstring)
    flush_every = lim.flush_every if flush_when_dry else lim.replay_flush_every
    changes: InProcessBus[Record | BadRecord] = InProcessBus(lim.change_queue)
    batches: InProcessBus[tuple[list[HistoryUpdate], list[DeadLetter], StateRows | None,
                                tuple[list[QueueState], list[QueuePosition], list[NodeState]]]] = \
        InProcessBus(lim.history_queue)
    report = PipelineReport()
    state = StateTracker(reducer) if store is not None else None

    folded = 0

    async def flush() -> None:
        nonlocal folded
        out = reducer.flush()
        if on_flush is not None:
            on_flush(out, folded, reducer.watermark)
        folded = 0
        rows = None if state is None else state.capture([*(u.run_id for u in out.updates), *out.retired],
                                                        out.forgotten_seq)
        if out.updates or out.dead_letters or out.queues or out.positions or out.nodes or \
                (rows is not None and (rows.held is not None or rows.retired or rows.clock is not None)):
            await batches.put((out.updates, out.dead_letters, rows, (out.queues, out.positions, out.nodes)))

    def stopping() -> bool:
        if stop is not None and stop.is_set():
            report.stopped = True
        return report.stopped

    async def source() -> None:
        # a record taken from the source is always folded: stopping means taking no further one
        try:
            if isinstance(records, AsyncIterable):
                async for rec in records:  # it ends by itself on ``stop`` (``tasks.in_thread(until=stop)``)
                    await changes.put(rec)
                stopping()
            elif not stopping():
                loop = asyncio.get_running_loop()
                turn = loop.time() + YIELD_EVERY_S
                for rec in records:
                    await changes.put(rec)
                    if loop.time() >= turn:  # let the reducer (and a stop request) run while the source is fast
                        await asyncio.sleep(0)
                        turn = loop.time() + YIELD_EVERY_S
                    if stopping():
                        break
        finally:
            await changes.close()

    async def reduce() -> None:
        nonlocal folded
        try:
            since_flush = 0
            async for rec in changes:
                for item in [rec, *changes.drain_nowait(flush_every)]:
                    _fold(reducer, item)
                    report.records += 1
                    since_flush += 1
                    folded += 1
                    if reducer.dead_letters_full:  # before a further dead letter would be counted but not kept
                        await flush()
                        since_flush = 0
                report.last_source = item.source
                if on_progress is not None:
                    on_progress(report.records)
                if since_flush >= flush_every or (flush_when_dry and changes.qsize() == 0):
                    await flush()
                    since_flush = 0
            await flush()
        finally:
            await batches.close()

    async def sink() -> None:
        async for updates, letters, rows, (queues, positions, nodes) in batches:
            if store is not None:
                report.rows_changed += store.write(updates, state=rows)
            for s in sinks:
                report.rows_changed += s.write(updates)
            if queues or positions:  # Kueue's queues: to every sink that keeps them
                for q in dict.fromkeys([store, *sinks]):
                    if isinstance(q, QueueStore):
                        report.rows_changed += q.write_queues(queues, positions)
            if nodes:  # Nodes: likewise
                for n in dict.fromkeys([store, *sinks]):
                    if isinstance(n, NodeStore):
                        report.rows_changed += n.write_nodes(nodes)
            report.runs_written += len(updates)
            report.dead_letters += len(letters)
            if dead_letters is not None:
                dead_letters.write_dead_letters(letters)

    await tasks.all_of([source(), reduce(), sink()])
    report.stats = reducer.stats.as_dict()
    refused = getattr(store, "refused_after_retirement", 0)
    if refused:
        report.stats["refused_after_retirement"] = refused
    return report


def _fold(reducer: Reducer, item: Record | BadRecord) -> None:
    if isinstance(item, BadRecord):
        reducer.reject(item.source, item.reason, item.excerpt)
    else:
        reducer.apply(item.value, item.source)
