"""The `tracker` command line: replay, runs, show, demo (and the service commands as they land)."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sqlite3
import sys
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from tracker.core.model import Phase, Status
from tracker.runtime.gctune import tune_gc
from tracker.runtime.pipeline import JsonlDeadLetters, PipelineReport, run_pipeline
from tracker.shell.capture import capture_files, capture_size, interleave

DEMO_CAPTURES = Path(__file__).parent / "captures" / "demo"
DEFAULT_DEMO_INDEX = Path("out") / "demo-index.sqlite"

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


class UsageError(Exception):
    pass


def parse_duration(text: str) -> float:
    """'90' (seconds), '90s', '30m', '1h30m', '2d' -> seconds."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    m = _DURATION.match(text)
    if not text or m is None or not any(m.groups()):
        raise UsageError(f"not a duration: {text!r} (use e.g. 90s, 30m, 1h30m, 2d)")
    d, h, mi, s = (int(g) if g else 0 for g in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


def parse_now(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        dt = datetime.fromisoformat(text)
    except ValueError as exc:
        raise UsageError(f"--now must be an ISO-8601 time, got {text!r}") from exc
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


# ------------------------------------------------------------------------------------------ commands


def replay(captures: list[Path], index_path: Path, console: Console, quiet: bool = False) -> PipelineReport:
    from tracker.shell.index import ExperimentIndex

    files = capture_files(captures)
    if not files:
        raise UsageError("no capture files given (expected .json or .jsonl files or directories of them)")
    total_bytes = sum(capture_size(f) for f in files)
    dead_path = index_path.with_name(index_path.stem + ".dead-letters.jsonl")
    from tracker.shell.reducer_state import refuse_runs_without_state, restore

    with ExperimentIndex(index_path) as index:
        refuse_runs_without_state(index)
        reducer = restore(index)
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
            dead = JsonlDeadLetters(dead_path)
            report = asyncio.run(_until_signalled(lambda stop: run_pipeline(
                interleave(files), reducer, [], dead, on_progress=on_progress, store=index, stop=stop)))
        finally:
            if progress is not None:
                progress.stop()
    if report.stopped:
        _fail(f"replay stopped by {_signal_name(report.stopped_by)} after {report.records} records (the last from "
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


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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


def cmd_replay(args: argparse.Namespace, console: Console) -> int:
    report = replay(args.captures, args.index, console)
    return 128 + report.stopped_by if report.stopped and report.stopped_by else 0


def cmd_runs(args: argparse.Namespace, console: Console) -> int:
    from tracker.render import runs_json, runs_table
    from tracker.shell.index import ExperimentIndex

    stalled = parse_duration(args.stalled_admission) if args.stalled_admission is not None else None
    with ExperimentIndex(args.index, readonly=True) as index:
        records = index.runs(status=args.status, phase=args.phase, stalled_admission_s=stalled,
                             now=parse_now(args.now), workspace=args.workspace, project=args.project)
    if args.json:
        sys.stdout.write(json.dumps(runs_json(records), indent=2) + "\n")
    else:
        console.print(runs_table(records))
    return 0


def cmd_show(args: argparse.Namespace, console: Console) -> int:
    from tracker.render import history_json, timeline
    from tracker.shell.index import ExperimentIndex

    with ExperimentIndex(args.index, readonly=True) as index:
        history = index.history(args.run_id)
    if history is None:
        _fail(f"no run {args.run_id!r} in {args.index} (list runs with: tracker runs --index {args.index})")
        return 1
    if args.json:
        sys.stdout.write(json.dumps(history_json(history), indent=2) + "\n")
    else:
        console.print(timeline(history, width=console.width, now=parse_now(args.now)))
    return 0


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from tracker.render import runs_table, timeline
    from tracker.shell.index import ExperimentIndex

    index_path: Path = args.index
    _remove_demo_index(index_path, force=args.force)
    with ExperimentIndex(index_path) as index:
        index.set_meta(DEMO_MARK, "true")
    console.rule("[bold]TauGrid tracker demo")
    console.print(f"Replaying the bundled captures of one cluster ({DEMO_CAPTURES}),\n"
                  "through the same bounded pipeline the service uses, into a fresh experiment index.\n")
    replay([DEMO_CAPTURES], index_path, console)
    with ExperimentIndex(index_path) as index:
        records = index.runs()
        console.print(runs_table(records))
        # the most telling runs: a preemption, a RayJob retry, a deactivation, a run waiting for quota again
        # after a reactivation (else whatever there is)
        picks = [next((r for r in records if r.evictions and r.status == "succeeded"), None),
                 next((r for r in records if r.kind == "RayJob" and r.attempts > 1), None),
                 next((r for r in records if r.status == "stopped"), None),
                 next((r for r in records if r.status == "pending" and r.phase == Phase.ADMISSION
                       and r.attempts > 1), None)]
        shown = [r for r in picks if r is not None] or records[:1]
        for rec in shown:
            history = index.history(rec.run_id)
            if history is not None:
                console.rule(f"run {rec.run_id}")
                console.print(timeline(history, width=console.width, now=None))
    console.rule()
    console.print(f"The experiment index is at [bold]{index_path.resolve()}[/] (SQLite, schema in schemas/index/).\n"
                  "Try:\n"
                  f"  tracker runs --index {index_path} --status pending\n"
                  f"  tracker runs --index {index_path} --stalled-admission 30m --now 2026-08-20T13:00:00Z\n"
                  f"  tracker show <run-id> --index {index_path} [--json]")
    return 0


DEMO_MARK = "created_by_demo"  # meta key: the demo made this index, so a later demo may replace it


def _remove_demo_index(path: Path, force: bool) -> None:
    """Delete the index a previous demo made (never one it did not make, unless ``force``)."""
    from tracker.shell.index import ExperimentIndex, IndexSchemaError

    if not path.exists():
        return
    if not force:
        try:
            with ExperimentIndex(path, readonly=True) as index:
                made_by_demo = index.meta(DEMO_MARK) == "true"
        except IndexSchemaError:
            made_by_demo = False
        if not made_by_demo:
            raise UsageError(f"{path} exists and was not made by `tracker demo`: the demo replaces its index, so it "
                             "will not touch this one (give another --index, or --force to replace it)")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.with_name(path.stem + ".dead-letters.jsonl").unlink(missing_ok=True)


def _fail(message: str) -> None:
    """One line on stderr, never read as markup."""
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {escape(message)}", highlight=False)


# ------------------------------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tracker", description="TauGrid run lifecycle tracker")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("replay", help="fold capture files into the experiment index")
    r.add_argument("captures", nargs="+", type=Path, help="capture files or directories (.json, .jsonl, "
                   "also gzip-compressed); - for standard input")
    r.add_argument("--index", type=Path, required=True, help="SQLite experiment index (created if missing)")
    r.set_defaults(func=cmd_replay)

    q = sub.add_parser("runs", help="list runs from the experiment index")
    q.add_argument("--index", type=Path, required=True)
    q.add_argument("--status", choices=[s.value for s in Status])
    q.add_argument("--phase", choices=[ph.value for ph in Phase])
    q.add_argument("--stalled-admission", metavar="DURATION",
                   help="only runs waiting for admission longer than this (e.g. 30m)")
    q.add_argument("--now", help="reference time for --stalled-admission (ISO-8601; default: the current time)")
    q.add_argument("--workspace")
    q.add_argument("--project")
    q.add_argument("--json", action="store_true", help="print a JSON array")
    q.set_defaults(func=cmd_runs)

    s = sub.add_parser("show", help="show one run's timeline")
    s.add_argument("run_id")
    s.add_argument("--index", type=Path, required=True)
    s.add_argument("--now", help="end of the time axis for a live run (ISO-8601; default: last transition)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_show)

    dm = sub.add_parser("demo", help="replay the bundled captures and show run timelines")
    dm.add_argument("--index", type=Path, default=DEFAULT_DEMO_INDEX,
                    help=f"experiment index to create (default: {DEFAULT_DEMO_INDEX}; replaced on the next demo)")
    dm.add_argument("--force", action="store_true",
                    help="replace --index even if the demo did not create it")
    dm.set_defaults(func=cmd_demo)

    # the service commands (their modules import the Kafka, Kubernetes and Azure clients)
    from tracker.runtime.commands import add_service_commands
    from tracker.runtime.doctor import add_doctor_command
    from tracker.runtime.kusto_cmd import add_kusto_commands
    from tracker.runtime.watch_cmd import add_watch_command

    add_watch_command(sub)
    add_service_commands(sub)
    add_kusto_commands(sub)
    add_doctor_command(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from tracker.shell.index import IndexSchemaError
    from tracker.shell.reducer_state import StateError

    args = build_parser().parse_args(argv)
    tune_gc()
    # a pipe or a CI log gets a fixed, readable width instead of rich's 80-column fallback
    console = Console(width=None if sys.stdout.isatty() else 150)
    try:
        rc: int = args.func(args, console)
    except (UsageError, FileNotFoundError, IndexSchemaError, StateError) as exc:
        _fail(str(exc))
        return 2
    except (OSError, sqlite3.Error) as exc:
        _fail(f"{exc.__class__.__name__}: {exc}")
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
