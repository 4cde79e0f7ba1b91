"""Capture files (or any record stream) into an experiment index, without Kafka: the one wiring of that pipeline.

``tracker replay``, ``tracker demo`` and the embedded ``tracker serve`` (``--from-capture`` or ``--watch`` without
Kafka) all fold through ``fold``: open the index, refuse runs it holds without reducer state, restore the reducer
from it, run the bounded pipeline (``runtime.pipeline``), write histories and state in one transaction per flush.
They used to be wired apart, and ``replay`` took its reducer bounds and its dead-letter file from constants while
``serve`` read the settings; now the settings decide for all of them:

- the reducer's bounds are ``reduce.*`` (``max_held``, ``max_dead_letters``, ``metric_points_per_run``,
  ``accelerator_resources``) and ``embedded.max_retired``;
- the pipeline's queues and flush interval are ``embedded.change_queue``, ``history_queue`` and ``flush_every``
  (``replay_flush_every`` for capture files);
- the dead-letter file ``<index>.dead-letters.jsonl`` rotates at ``embedded.dead_letter_file_bytes`` and keeps
  ``embedded.dead_letter_files`` files;
- the index records ``index.cluster`` and ``index.workspace`` (``serve`` did, ``replay`` did not);
- one writer per index: the fold holds the writer role (``shell.index_lock``) from restoring the reducer to its
  last write; a second writer waits up to ``index.writer_wait_s``, then stops (``WriterBusy``, exit 75).

Only retirement differs by caller: ``serve`` retires finished runs after ``reduce.retire_after_s`` of event time,
while a replay retires nothing unless ``--retire-after`` asks it to (a capture is read a file, that is one watch
stream, at a time: no event time holds for all of them, and runs retired too early would lose records;
docs/limits.md).

A replay of standard input or a pipe (``capture.is_stream``) reads it on a thread of its own (``tasks.in_thread``):
a quiet pipe never holds the loop, so a signal stops the replay at once and what was read is committed; regular
files are read on the loop, which gets a turn every ``pipeline.YIELD_EVERY_S``. README, "Signals and exit codes".

Capture files are read by ``capture_records``, which slims each object to what the reducer reads as the watcher
slims it before it publishes (``shell.slim``; a JSON line is decoded into the fields slimming keeps only,
``shell.typed``): folding slimmed objects gives the same histories, so a replay, a
``serve --from-capture`` and a watcher fold the same records.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tracker import errors
from tracker.core.limits import ReducerLimits
from tracker.core.reducer import Flushed, Reducer
from tracker.read.store import IndexReader
from tracker.runtime.pipeline import JsonlDeadLetters, PipelineLimits, PipelineReport, run_pipeline
from tracker.settings import EmbeddedSettings, Settings, SettingsError, load_settings
from tracker.shell import reducer_state, tasks
from tracker.shell.capture import STDIN, BadRecord, Capture, Record, capture_files, interleave, is_stream
from tracker.shell.index import ExperimentIndex
from tracker.shell.typed import SLIMMED

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["STOP_SIGNALS", "Folded", "ReplayError", "capture_records", "dead_letter_file", "fold", "pipeline_limits",
           "reducer_limits", "replay"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class ReplayError(errors.ConfigError):
    """A replay that cannot start as asked: no capture file among the paths given, or settings that do not
    validate (exit 2, as a command line that cannot work)."""

    exit_code = 2


# ------------------------------------------------------------------------------------------ from the settings


def reducer_limits(settings: Settings, *, retire_after_s: float | None) -> ReducerLimits:
    """The embedded reducer's bounds from ``settings``; it retires finished runs after ``retire_after_s`` of event
    time, or never (None). Without retirement it frees every finished run's derivation once its history is written
    (``ReducerLimits.finished_derivation_rows`` None): such a replay keeps every run it reads, and a finished run's
    facts are then all it holds (bench/README.md, replay_memory.py). Retiring, it frees a narrow finished run's only
    (``reduce.finished_derivation_rows``), and keeps a wider one's until the run retires: a late record within the
    grace (a pod deleted after the run ended) stays incremental, however wide the run."""
    limits = settings.reduce.reducer_limits(settings.embedded.max_retired)
    return replace(limits, retire_after_us=None if retire_after_s is None else round(retire_after_s * 1_000_000),
                   finished_derivation_rows=limits.finished_derivation_rows if retire_after_s is not None else None)


def dead_letter_file(es: EmbeddedSettings, index_path: Path, *, on_drop: Callable[[int], None] | None = None
                     ) -> JsonlDeadLetters:
    """The bounded dead-letter file of the embedded index at ``index_path``: ``<index>.dead-letters.jsonl``."""
    return JsonlDeadLetters(index_path.with_name(index_path.stem + ".dead-letters.jsonl"),
                            max_bytes=es.dead_letter_file_bytes, files=es.dead_letter_files, on_drop=on_drop)


def pipeline_limits(es: EmbeddedSettings) -> PipelineLimits:
    """The embedded pipeline's queue and flush bounds."""
    return PipelineLimits(change_queue=es.change_queue, history_queue=es.history_queue, flush_every=es.flush_every,
                          replay_flush_every=es.replay_flush_every)


# ------------------------------------------------------------------------------------------ the wiring


def capture_records(files: Sequence[Capture]) -> Iterator[Record | BadRecord]:
    """The records of capture files, interleaved (each file in its own order), each object slimmed as the watcher
    slims it (a capture holds whole objects: managedFields, env values); a JSON line is decoded into the fields the
    reducer reads only (``tracker.shell.typed``)."""
    return interleave(files, decoding=SLIMMED)


@dataclass(slots=True)
class Folded:
    report: PipelineReport
    dead_letters: JsonlDeadLetters
    continued: int  # runs the index held (with their state) before this fold


def fold(records: Iterable[Record | BadRecord] | AsyncIterable[Record | BadRecord], *, index_path: Path,
         settings: Settings, retire_after_s: float | None, stop_on_signals: bool = False, threaded: bool = False,
         on_progress: Callable[[int], None] | None = None, on_restored: Callable[[Reducer], None] | None = None,
         on_flush: Callable[[Flushed, int, int], None] | None = None,
         on_dead_letters_dropped: Callable[[int], None] | None = None, recorded: bool = False) -> Folded:
    """Fold ``records`` into the index at ``index_path``, continuing from the reducer state it keeps; bounds and
    the dead-letter file from ``settings``. Runs its own event loop (call it on a thread of its own from a loop).

    With ``stop_on_signals`` (and on the main thread) SIGINT, SIGTERM and SIGHUP stop the intake: what was taken
    is folded and committed, and the report says so (``_until_signalled``). ``threaded``: ``records`` (an
    iterable) may block without end (standard input, a pipe): it is read on a thread of its own
    (``tasks.in_thread``), so that a signal stops the fold while the read waits, and what the thread read before
    the signal is folded and committed. ``recorded``: the index is a recording (``tracker replay``): readers read
    it as of the latest time it holds (``ExperimentIndex.set_clock``)."""
    dead = dead_letter_file(settings.embedded, index_path, on_drop=on_dead_letters_dropped)
    identity = settings.index.identity(default_cluster=settings.adx.source_cluster)
    # the writer role is held from the restore to the last write: a second writer waits for it (or stops)
    with ExperimentIndex(index_path, identity=identity, writer_wait_s=settings.index.writer_wait_s) as index:
        reducer_state.refuse_runs_without_state(index)
        reducer = reducer_state.restore(index, reducer_limits(settings, retire_after_s=retire_after_s))
        continued = len(reducer.runs)
        if on_restored is not None:
            on_restored(reducer)

        async def body(stop: asyncio.Event | None) -> PipelineReport:
            source = records
            if threaded and not isinstance(records, AsyncIterable):
                source = tasks.in_thread(records, name="capture-reader", until=stop)
            return await run_pipeline(source, reducer, sinks=[], dead_letters=dead,
                                      limits=pipeline_limits(settings.embedded), on_progress=on_progress,
                                      store=index, stop=stop, on_flush=on_flush)

        report = asyncio.run(_until_signalled(body) if stop_on_signals else body(None))
        index.set_clock(recorded=recorded)
    return Folded(report, dead, continued)


# ------------------------------------------------------------------------------------------ tracker replay


def replay(*, captures: Sequence[Path], index_path: Path, console: Console, settings: Settings | None = None,
           quiet: bool = False, retire_after_s: float | None = None) -> PipelineReport:
    """``tracker replay`` (and ``tracker demo``): fold capture files into the index at ``index_path``, with the
    bounds and the dead-letter file of ``settings`` (default: loaded from the environment and the settings file).

    Shows a progress bar on a terminal and one summary line (unless ``quiet``); a stop by signal is reported on
    stderr, everything folded until then committed (``report.stopped``, ``report.stopped_by``)."""
    from rich.markup import escape

    from tracker.shell.capture import capture_size

    files = capture_files(list(captures))
    if not files:
        raise ReplayError("no capture files given (expected .json or .jsonl files or directories of them)")
    if settings is None:
        try:
            settings = load_settings()
        except SettingsError as exc:
            raise ReplayError(str(exc)) from None
    total_bytes = sum(capture_size(f) for f in files)
    progress = None
    on_progress = None
    if console.is_terminal and not quiet:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        progress = Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("records"), console=console, transient=True)
        task = progress.add_task("replay", total=None)

        def on_progress(n: int) -> None:
            progress.update(task, completed=n)

    def started(_reducer: Reducer) -> None:
        if progress is not None:
            progress.start()

    try:
        folded = fold(capture_records(files), index_path=index_path, settings=settings, retire_after_s=retire_after_s,
                      stop_on_signals=True, threaded=any(is_stream(f) for f in files), on_progress=on_progress,
                      on_restored=started, recorded=True)
    finally:
        if progress is not None:
            progress.stop()
    report, dead = folded.report, folded.dead_letters
    if report.stopped:
        again = ("what standard input held after it was not read" if STDIN in files else
                 "run the same replay again to finish (it continues from the index)")
        _fail(f"replay stopped by {_signal_name(report.stopped_by)} after {report.records} records (the last from "
              f"{report.last_source or 'nowhere'}); everything folded is committed to {index_path}: {again}")
    if not quiet:
        continued = f" (continuing {folded.continued} run(s) it held)" if folded.continued else ""
        with IndexReader(index_path) as reader:  # the runs it holds: what `tracker runs` lists next
            held = sum(reader.counts_by_status().values())
        console.print(f"folded {report.records} records from {len(files)} file(s) ({total_bytes / 1e6:.1f} MB) "
                      f"into [bold]{escape(str(index_path))}[/]{continued}: it holds {held} run(s) "
                      f"({report.runs_written} history writes, {report.rows_changed} rows changed)")
        if report.dead_letters:
            rotated = f"; the {dead.dropped} oldest were dropped by rotation" if dead.dropped else ""
            console.print(f"[yellow]{report.dead_letters} dead letter(s)[/] with reasons in "
                          f"{escape(str(dead.path))}{rotated}")
    return report


def _fail(message: str) -> None:
    """One line on stderr, never read as markup (as the command line reports an error)."""
    sys.stderr.write(f"error: {' '.join(message.split())}\n")


async def _until_signalled(body: Callable[[asyncio.Event], Awaitable[PipelineReport]]) -> PipelineReport:
    """Run ``body(stop)`` with SIGINT, SIGTERM and SIGHUP setting ``stop`` (the pipeline then stops taking records,
    folds and commits what it took); a second signal ends the process at once, by the signal's default action."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[int] = []

    def on_signal(signum: int) -> None:
        if received:
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)
            signal.raise_signal(signum)
        received.append(signum)
        stop.set()

    # signal handlers belong to the main thread; replay called from another thread (a library user, a test) is
    # stopped by its caller instead
    handled = STOP_SIGNALS if threading.current_thread() is threading.main_thread() else ()
    for sig in handled:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        report = await body(stop)
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
    if received:
        report.stopped_by = received[0]
    return report


def _signal_name(signum: int) -> str:
    return signal.Signals(signum).name if signum else "a stop request"
