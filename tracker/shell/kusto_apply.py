"""Applying the Kusto schema: create or update the TauGrid tables, mappings, policies, views and functions (the
command line, `tracker kusto apply [--dry-run]`, is ``tracker.runtime.kusto_cmd``).

Runs the scripts under ``schemas/kusto/*.kql`` in file-name order, each command on its own as a management
command in the configured database (the ``adx`` settings section, ``tracker.settings.AdxSettings``), and
stops at the first failure. Every command is idempotent, so applying again after a schema change is safe.

A cluster that does not answer costs ``connect_timeout_s`` (30 s), not a command's ``mgmt_timeout_s`` (600 s): the
first request is a ``.show version`` with that deadline. Progress is printed (and flushed) as it happens: the
command sent, its place among all, and a line every 15 s while one runs.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import TextIO, TypeVar

from azure.kusto.data import ClientRequestProperties, KustoClient

from tracker import errors
from tracker.settings import AdxSettings
from tracker.shell.adx import connection
from tracker.shell.deadline import DeadlineExceeded, call_with_deadline

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas" / "kusto"

_BLANK_LINE = re.compile(r"\n[ \t]*\n")


@dataclass(frozen=True, slots=True)
class Command:
    file: str
    index: int  # 1-based position in its file
    text: str


def split_script(text: str) -> list[str]:
    """The commands of a script: blocks separated by blank lines (as Kusto.Language and Kusto.Explorer split
    them), without their leading comment lines; blocks of comments only are skipped."""
    commands = []
    for block in _BLANK_LINE.split(text.replace("\r\n", "\n")):
        lines = block.strip("\n").split("\n")
        while lines and (not lines[0].strip() or lines[0].lstrip().startswith("//")):
            lines.pop(0)
        command = "\n".join(lines).strip()
        if command:
            commands.append(command)
    return commands


def schema_commands(schema_dir: Path = SCHEMA_DIR) -> list[Command]:
    files = sorted(schema_dir.glob("*.kql"))
    if not files:
        raise FileNotFoundError(f"no .kql files in {schema_dir}")
    return [Command(f.name, i, text) for f in files
            for i, text in enumerate(split_script(f.read_text(encoding="utf-8")), start=1)]


class ApplyError(errors.Fatal, RuntimeError):
    """The cluster did not answer, or refused a command."""


PROGRESS_EVERY_S = 15.0  # while a command runs, how often a "still waiting" line is printed
PROBE = ".show version"  # the first request: it proves the cluster answers (and that the credentials work)


def apply_schema(settings: AdxSettings, *, dry_run: bool, schema_dir: Path = SCHEMA_DIR,
                 out: TextIO | None = None, progress_every_s: float = PROGRESS_EVERY_S) -> list[Command]:
    """Runs (or with ``dry_run`` only prints) every schema command in order; returns the commands.

    The connect phase (the cluster's answer to ``.show version``, authentication included) may take
    ``connect_timeout_s``; each command then ``mgmt_timeout_s``. Progress goes to ``out`` as it happens: which
    command of how many, and a line every ``progress_every_s`` while one runs."""
    out = out or sys.stdout

    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    commands = schema_commands(schema_dir)
    if dry_run:
        out.write(f"// {len(commands)} commands for database {settings.database} (dry run: nothing sent)\n")
        for c in commands:
            out.write(f"\n// {c.file} #{c.index}\n{c.text}\n")
        return commands
    uri, total = settings.cluster_uri, len(commands)
    with KustoClient(connection(settings, uri)) as client:
        say(f"connecting to {uri} (database {settings.database}; up to {settings.connect_timeout_s:g}s, "
            "TRACKER_ADX__CONNECT_TIMEOUT_S)")
        probe = _properties(settings.connect_timeout_s)
        _wait(lambda: client.execute_mgmt(settings.database, PROBE, probe), settings.connect_timeout_s, None,
              f"{uri} did not answer within {settings.connect_timeout_s:g}s (the connect phase; "
              "TRACKER_ADX__CONNECT_TIMEOUT_S): nothing was applied")
        properties = _properties(settings.mgmt_timeout_s)
        for n, c in enumerate(commands, start=1):
            head = f"[{n}/{total}] {c.file} #{c.index}"
            say(f"{head}: {c.text.splitlines()[0][:100]}")
            started = time.monotonic()

            def waiting(elapsed: float, head: str = head) -> None:
                say(f"{head}: still running after {elapsed:.0f}s (up to {settings.mgmt_timeout_s:g}s, "
                    "TRACKER_ADX__MGMT_TIMEOUT_S)")

            # the SDK's own deadline is the server timeout + 30 s; this one is a backstop if a call hangs
            _wait(partial(client.execute_mgmt, settings.database, c.text, properties),
                  settings.mgmt_timeout_s + 60, (progress_every_s, waiting),
                  f"{head} got no answer within {settings.mgmt_timeout_s + 60:g}s; commands {n}..{total} were "
                  "not applied (each is idempotent: apply again)")
            if time.monotonic() - started >= progress_every_s:
                say(f"{head}: done after {time.monotonic() - started:.0f}s")
    say(f"applied {total} commands to database {settings.database} at {uri}")
    return commands


def _properties(timeout_s: float) -> ClientRequestProperties:
    properties = ClientRequestProperties()  # type: ignore[no-untyped-call]  # (unannotated in the SDK)
    properties.set_option(ClientRequestProperties.request_timeout_option_name, timedelta(seconds=timeout_s))
    return properties


T = TypeVar("T")


def _wait(fn: Callable[[], T], timeout_s: float, progress: tuple[float, Callable[[float], None]] | None,
          timeout_message: str) -> T:
    """``call_with_deadline``; ``ApplyError(timeout_message)`` when ``fn()`` does not return in time."""
    try:
        return call_with_deadline(fn, timeout_s=timeout_s, what="kusto apply", progress=progress)
    except DeadlineExceeded:
        raise ApplyError(timeout_message) from None
