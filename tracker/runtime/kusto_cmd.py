"""``tracker kusto apply [--dry-run] [--schema-dir DIR]``: the command line of ``tracker.shell.kusto_apply``.

``add_kusto_commands(subparsers)`` adds the command to the ``tracker`` parser (``func(args, console) -> int``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from azure.kusto.data.exceptions import KustoError

from tracker.runtime.ops import configure_logging, log_deprecated_env
from tracker.settings import SettingsError, load_settings
from tracker.shell.kusto_apply import SCHEMA_DIR, ApplyError, apply_schema


def cmd_kusto_apply(args: argparse.Namespace, console: object = None) -> int:
    """The `kusto apply` command (``console``, passed by the CLI to every command, is not used). Exit codes: 0
    applied, 1 the cluster did not answer or refused a command, 2 bad settings."""
    try:
        settings = load_settings(args.config)
    except SettingsError as exc:
        sys.stderr.write(f"error: kusto apply: {exc}\n")
        return 2
    configure_logging("WARNING", settings.ops.log_format)  # warnings to stderr; stdout is the apply's progress
    log_deprecated_env(settings)
    try:
        apply_schema(settings.adx, dry_run=args.dry_run, schema_dir=args.schema_dir)
    except (ApplyError, ValueError, KustoError, FileNotFoundError) as exc:
        sys.stderr.write(f"error: kusto apply: {exc}\n")
        return 1
    return 0


def add_kusto_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `kusto apply [--dry-run] [--schema-dir DIR]` to the tracker's argparse sub-commands."""
    kusto = subparsers.add_parser("kusto", help="Azure Data Explorer schema (settings: TRACKER_ADX__*)")
    sub = kusto.add_subparsers(dest="kusto_command", required=True)
    apply = sub.add_parser("apply", help="create or update the TauGrid tables, mappings, policies, views and "
                                         "functions (idempotent)")
    apply.add_argument("--dry-run", action="store_true", help="print the commands in order; send nothing")
    apply.add_argument("--config", type=Path, help="settings file (YAML or JSON; also TRACKER_CONFIG_FILE)")
    apply.add_argument("--schema-dir", type=Path, default=SCHEMA_DIR, help=f"default: {SCHEMA_DIR}")
    apply.set_defaults(func=cmd_kusto_apply)
