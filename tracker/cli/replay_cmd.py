"""``tracker replay``: fold capture files into the experiment index, through the bounded pipeline the service uses.

Kept as it was in ``tracker/cli.py`` while ``replay`` moves to ``tracker.runtime.replay`` (issue 26); imported by
the parser at start, so at the top it imports the standard library and ``tracker.cli.args`` only.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tracker.cli.args import UsageError, fail, parse_duration

if TYPE_CHECKING:
    import asyncio

    from rich.console import Console

    from tracker.runtime.pipeline import PipelineReport


def replay(captures: list[Path], index_path: Path, *, console: Console, quiet: bool = False,
           retire_after_s: float | None = None) -> PipelineReport:
    import asyncio

    from rich.markup import escape

    from tracker.runtime import pipeline
    from tracker.shell.capture import capture_files, capture_size, interleave
    from tracker.shell.index import ExperimentIndex

    files = capture_files(captures)
    if not files:
        raise UsageError("no capture files given (expected .json or .jsonl files or directories of them)")
    total_bytes = sum(capture_size(f) for f in files)
    dead_path = index_path.with_name(index_path.stem + ".dead-letters.jsonl")
    from tracker.core.reducer import ReducerLimits
    from tracker.shell.reducer_state import refuse_runs_without_state, restore

    # no retirement by default: a capture replayed a file (one watch stream) at a time has no event time that
    # holds for the others, and would lose records of runs retired too early (docs/limits.md)
    limits = ReducerLimits(accelerator_resources=_accelerator_resources()) if retire_after_s is None else \
        ReducerLimits(retire_after_us=round(retire_after_s * 1_000_000), max_retired=100_000,
                      accelerator_resources=_accelerator_resources())
    with ExperimentIndex(index_path) as index:
        refuse_runs_without_state(index)
        reducer = restore(index, limits)
        known = len(reducer.runs)
        progress = None
        on_progress = None
        if console.is_terminal and not quiet:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            progress = Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("records"), console=console, transient=True)
            task = progress.add_task("replay", total=None)

            def on_progress(n: int) -> None:
                progress.update(task, completed=n)

            progress.start()
        try:
            dead = pipeline.JsonlDeadLetters(dead_path)
            report = asyncio.run(_until_signalled(lambda stop: pipeline.run_pipeline(
                interleave(files), reducer, sinks=[], dead_letters=dead, on_progress=on_progress, store=index,
                stop=stop)))
        finally:
            if progress is not None:
                progress.stop()
    if report.stopped:
        fail(f"replay stopped by {_signal_name(report.stopped_by)} after {report.records} records (the last from "
              f"{report.last_source or 'nowhere'}); everything folded is committed to {index_path}: run the same "
              "replay again to finish (it continues from the index)")
    if not quiet:
        continued = f" (continuing {known} run(s) it held)" if known else ""
        console.print(f"folded {report.records} records from {len(files)} file(s) ({total_bytes / 1e6:.1f} MB) "
                      f"into [bold]{escape(str(index_path))}[/]{continued}: {report.runs_written} run histories "
                      f"written, {report.rows_changed} rows changed")
        if report.dead_letters:
            rotated = f"; the {dead.dropped} oldest were dropped by rotation" if dead.dropped else ""
            console.print(f"[yellow]{report.dead_letters} dead letter(s)[/] with reasons in "
                          f"{escape(str(dead_path))}{rotated}")
    return report


def _accelerator_resources() -> tuple[str, ...]:
    """The extended resources counted as GPUs: the setting ``reduce.accelerator_resources`` (its environment
    variable or the settings file), as the reducer of ``tracker serve`` and ``tracker reduce`` reads it."""
    from tracker.settings import SettingsError, load_settings

    try:
        return load_settings().reduce.accelerator_resources
    except SettingsError as exc:
        raise UsageError(str(exc)) from None


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


async def _until_signalled(body: Callable[[asyncio.Event], Awaitable[PipelineReport]]) -> PipelineReport:
    """Run ``body(stop)`` with SIGINT, SIGTERM and SIGHUP setting ``stop`` (the pipeline then stops taking records,
    folds and commits what it took); a second signal ends the process at once, by the signal's default action."""
    import asyncio

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


def cmd_replay(args: argparse.Namespace, console: Console) -> int:
    retire = None if args.retire_after is None else parse_duration(args.retire_after)
    report = replay(args.captures, args.index, console=console, retire_after_s=retire)
    return 128 + report.stopped_by if report.stopped and report.stopped_by else 0
