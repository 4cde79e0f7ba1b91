"""`tracker kusto apply [--dry-run]`: create or update the TauGrid tables, mappings, policies, views and functions.

Runs the scripts under ``schemas/kusto/*.kql`` in file-name order, each command on its own as a management
command in the configured database (``TRACKER_ADX_*`` settings, see ``tracker.shell.adx.AdxSettings``), and
stops at the first failure. Every command is idempotent, so applying again after a schema change is safe.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TextIO

from azure.kusto.data import ClientRequestProperties, KustoClient
from azure.kusto.data.exceptions import KustoError
from pydantic import ValidationError

from tracker.shell.adx import AdxSettings, connection

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


def apply_schema(settings: AdxSettings, dry_run: bool, schema_dir: Path = SCHEMA_DIR,
                 out: TextIO | None = None) -> list[Command]:
    """Runs (or with ``dry_run`` only prints) every schema command in order; returns the commands."""
    out = out or sys.stdout
    commands = schema_commands(schema_dir)
    if dry_run:
        out.write(f"// {len(commands)} commands for database {settings.database} (dry run: nothing sent)\n")
        for c in commands:
            out.write(f"\n// {c.file} #{c.index}\n{c.text}\n")
        return commands
    properties = ClientRequestProperties()  # type: ignore[no-untyped-call]  # (unannotated in the SDK)
    properties.set_option(ClientRequestProperties.request_timeout_option_name,
                          timedelta(seconds=settings.mgmt_timeout_s))
    with KustoClient(connection(settings, settings.cluster_uri)) as client:
        for n, c in enumerate(commands, start=1):
            out.write(f"[{n}/{len(commands)}] {c.file} #{c.index}: {c.text.splitlines()[0][:100]}\n")
            client.execute_mgmt(settings.database, c.text, properties)
    out.write(f"applied {len(commands)} commands to database {settings.database} at {settings.cluster_uri}\n")
    return commands


def cmd_kusto_apply(args: argparse.Namespace, console: object = None) -> int:
    """The `kusto apply` command (``console``, passed by the CLI to every command, is not used)."""
    try:
        apply_schema(AdxSettings(), args.dry_run, args.schema_dir)
    except (ValidationError, ValueError, KustoError, FileNotFoundError) as exc:
        sys.stderr.write(f"error: kusto apply: {exc}\n")
        return 1
    return 0


def add_kusto_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `kusto apply [--dry-run] [--schema-dir DIR]` to the tracker's argparse sub-commands."""
    kusto = subparsers.add_parser("kusto", help="Azure Data Explorer schema (settings: TRACKER_ADX_* variables)")
    sub = kusto.add_subparsers(dest="kusto_command", required=True)
    apply = sub.add_parser("apply", help="create or update the TauGrid tables, mappings, policies, views and "
                                         "functions (idempotent)")
    apply.add_argument("--dry-run", action="store_true", help="print the commands in order; send nothing")
    apply.add_argument("--schema-dir", type=Path, default=SCHEMA_DIR, help=f"default: {SCHEMA_DIR}")
    apply.set_defaults(func=cmd_kusto_apply)
