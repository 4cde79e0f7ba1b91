"""``tracker runs -w`` and ``tracker show -w``: the readers, live, in kubectl's manner.

The index is read again every ``--watch-interval`` seconds (read-only, a new snapshot each time: a writer is never
waited for or blocked). ``runs -w`` prints the table (its header once), then a line for each run that is new or
whose stored row changed since the last read, with the columns of the whole table as it is then; a run's age going
up is not a change. ``-o name`` prints the run id, ``-o json`` the run's JSON object on one line (for ``jq``), as
``kubectl get -w -o json`` prints each changed object. ``show -w`` prints the timeline (or, with ``-o json``, the
history document on one line) again whenever the run's history changes.

SIGINT, SIGTERM and SIGHUP end a watch at once with exit code 0 (the watch was asked to end; nothing is left
half-written); an index that goes away or breaks while watched is one error line, as for the commands without
``-w``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

from tracker.cli.args import (
    NotFound,
    UsageError,
    index_path,
    print_rich,
    reading_now,
    recorded_now,
    recording_note,
    run_filter,
    table_width,
)

WATCH_OUTPUTS = ("table", "wide", "name", "json")
SHOW_WATCH_OUTPUTS = ("timeline", "json")


class _Stop(Exception):
    """A signal asked the watch to end."""


@contextmanager
def _stoppable() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise ``_Stop`` in the main thread (a sleep or a read ends at once)."""
    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Stop

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    except _Stop:
        pass
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _say_recorded(args: argparse.Namespace, path: Path) -> None:
    """A watch says at its start (it has no end to say it at) when it reads a recording (``reading_now``)."""
    recorded = None if args.now else recorded_now(path)
    if recorded is not None:
        sys.stderr.write(recording_note(path, recorded) + "\n")
        sys.stderr.flush()


def _key(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, default=str)


def watch_runs(args: argparse.Namespace) -> int:
    from tracker.read.runs import FIELDS, render, runs_json
    from tracker.read.store import RUN_FIELDS, IndexReader

    if args.output not in WATCH_OUTPUTS:
        raise UsageError(f"-w/--watch prints {', '.join(WATCH_OUTPUTS)} (not -o {args.output})")
    path = index_path(args)
    seen: dict[str, str] = {}
    first = True
    fields = RUN_FIELDS if args.output == "json" else FIELDS.get(args.output, RUN_FIELDS)
    with _stoppable():
        while True:
            now = reading_now(args, path, say=False)
            if first:
                _say_recorded(args, path)
            query = run_filter(args, now)
            with IndexReader(path) as reader:
                runs = reader.runs(query, fields, phase_since=args.output in ("table", "wide"))
                short = reader.short_ids(r.run_id for r in runs) if args.output == "table" else {}
            keys = {r.run_id: _key({**r.data, "phase_since": r.phase_since}) for r in runs}
            changed = [i for i, r in enumerate(runs) if seen.get(r.run_id) != keys[r.run_id]]
            seen = keys
            if args.output == "json":
                items = runs_json([runs[i] for i in changed], now)
                sys.stdout.write("".join(json.dumps(item, separators=(",", ":")) + "\n" for item in items))
            elif args.output == "name":
                sys.stdout.write("".join(f"{runs[i].run_id}\n" for i in changed))
            elif changed or first:
                lines = render(runs, args.output, now=now, width=table_width(), short=short,
                               one_namespace=len(query.namespaces) == 1).splitlines() if runs else []
                if first and not args.no_headers:
                    sys.stdout.write((lines[0] if lines else _header(args.output, now)) + "\n")
                sys.stdout.write("".join(lines[i + 1] + "\n" for i in changed))
            sys.stdout.flush()
            first = False
            time.sleep(args.watch_interval)
    return 0


def _header(output: str, now: datetime) -> str:
    """The table's header line when there are no runs yet (they may come)."""
    from tracker.read.runs import columns

    return "  ".join(c.header for c in columns(output, now, short={}, one_namespace=False)).rstrip()


def watch_show(args: argparse.Namespace) -> int:
    from tracker.core.model import to_json
    from tracker.read.store import IndexQueryError, IndexReader
    from tracker.read.timeline import timeline

    if args.output not in SHOW_WATCH_OUTPUTS:
        raise UsageError(f"-w/--watch prints {', '.join(SHOW_WATCH_OUTPUTS)} (not -o {args.output})")
    path = index_path(args)
    shown = ""
    with _stoppable():
        while True:
            with IndexReader(path) as reader:
                try:
                    run_id, _ = reader.resolve(args.run)
                except IndexQueryError as exc:
                    raise NotFound(str(exc)) from None
                resumed_by = reader.resumed_by(run_id)
                history = reader.history(run_id)
            if history is None:
                raise NotFound(f"no run {args.run!r} in {path}")
            data = to_json(history)
            key = _key(data)
            if key != shown:
                first, shown = not shown, key
                if args.output == "json":
                    sys.stdout.write(json.dumps(data, separators=(",", ":")) + "\n")
                else:
                    now = reading_now(args, path, say=False)
                    if first:
                        _say_recorded(args, path)
                    print_rich(partial(timeline, history, now=now, resumed_by=resumed_by))
                sys.stdout.flush()
            time.sleep(args.watch_interval)
    return 0
