"""``tracker replay``: the command's arguments to ``tracker.runtime.replay.replay``, the one capture -> index
wiring (shared with ``tracker demo`` and the embedded ``tracker serve``). Standard library only at the top: the
parser imports this module at start."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tracker.cli.args import parse_duration

if TYPE_CHECKING:
    from rich.console import Console


def cmd_replay(args: argparse.Namespace, console: Console) -> int:
    from tracker.runtime.replay import replay

    retire = None if args.retire_after is None else parse_duration(args.retire_after)
    report = replay(captures=args.captures, index_path=args.index, console=console, retire_after_s=retire)
    return 128 + report.stopped_by if report.stopped and report.stopped_by else 0
