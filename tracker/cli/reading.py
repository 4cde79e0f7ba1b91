"""The reader commands of `tracker`: ``runs``, ``audit``, ``nodes``, ``show``, ``compare``, ``demo`` and
``completion``: each reads through ``tracker.read`` (one ``IndexReader`` per command) and prints.

Imported by ``tracker.cli.parser`` at start, so at the top this module imports only the standard library; each command
imports what it uses when it runs (``runs`` imports neither pydantic nor rich: tests/read/test_cli_runs.py; ``show``
and ``compare`` no pydantic, and rich only for a table or timeline: tests/read/test_show_light.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracker.cli.args import (
    DEMO_CAPTURED_UNTIL,
    DEMO_CAPTURES,
    INDEX_ENV,
    NotFound,
    UsageError,
    index_path,
    parse_when,
    print_rich,
    reading_now,
    run_filter,
    table_width,
)

if TYPE_CHECKING:
    from rich.console import Console



def cmd_runs(args: argparse.Namespace, console: object) -> int:
    from tracker.read.queues import queue_context
    from tracker.read.runs import FIELDS, render
    from tracker.read.store import RUN_FIELDS, IndexReader

    if args.watch:
        from tracker.cli.watching import watch_runs

        return watch_runs(args)
    now = reading_now(args, index_path(args))
    query = run_filter(args, now)
    namespaces = query.namespaces
    waiting: dict[str, dict[str, Any]] = {}
    with IndexReader(index_path(args)) as reader:
        why = args.stuck is not None  # the table says why the runs are stuck: the message too
        fields = FIELDS.get(args.output, RUN_FIELDS) + (("message",) if why and args.output == "table" else ())
        runs = reader.runs(query, fields, phase_since=args.output in ("table", "wide"))
        short = reader.short_ids(r.run_id for r in runs) if args.output == "table" else {}
        if args.output in ("wide", "json", "yaml") or args.output.startswith(("jsonpath=", "custom-columns=")):
            # what pending runs wait behind (Kueue's queues)
            for run_id, ctx in queue_context(reader, (r.run_id for r in runs if r.data.get("status") == "pending")
                                             ).items():
                waiting.setdefault(run_id, ctx)
    if not runs and args.output in ("table", "wide"):
        sys.stderr.write("No runs found.\n")
        return 0
    text = render(runs, args.output, now=now, width=table_width(), short=short, one_namespace=len(namespaces) == 1,
                  why=why, waiting=waiting)
    if args.no_headers and (args.output in ("table", "wide") or args.output.startswith("custom-columns=")):
        text = text.split("\n", 1)[1]
    sys.stdout.write(text)
    return 0


def cmd_audit(args: argparse.Namespace, console: object) -> int:
    from tracker.read.audit import FIELDS, GROUP_BY, audit, render
    from tracker.read.filters import RunFilter
    from tracker.read.store import IndexReader

    now = reading_now(args, index_path(args))
    since = None if args.since is None else parse_when(args.since, now, flag="--since")
    until = None if args.until is None else parse_when(args.until, now, flag="--until")
    if since is not None and until is not None and until <= since:
        raise UsageError(f"--until ({until.isoformat()}) must be after --since ({since.isoformat()})")
    by = args.by or "namespace"
    if by not in GROUP_BY:  # one grouping (the option's type takes a list, for any case)
        raise UsageError(f"--by takes one grouping, got {by!r} (one of: {', '.join(GROUP_BY)})")
    with IndexReader(index_path(args)) as reader:
        runs = reader.runs(RunFilter(since=since, until=until), FIELDS, phase_since=False)
        # the attempts of rows written before schema 9 only (no evictions_by: the audit derives it from them)
        attempts = reader.attempt_ends(r.run_id for r in runs if r.data.get("evictions_by") is None)
    groups, total = audit(runs, attempts, by=by, now=now)
    if not runs and args.output == "table":
        sys.stderr.write("No runs found.\n")
        return 0
    sys.stdout.write(render(groups, total, by=by, output=args.output, window={"since": since, "until": until,
                                                                               "now": now}, width=table_width()))
    return 0


def cmd_nodes(args: argparse.Namespace, console: object) -> int:
    from tracker.read.nodes import nodes, render
    from tracker.read.store import IndexReader

    now = reading_now(args, index_path(args))
    since = None if args.since is None else parse_when(args.since, now, flag="--since")
    until = None if args.until is None else parse_when(args.until, now, flag="--until")
    if since is not None and until is not None and until <= since:
        raise UsageError(f"--until ({until.isoformat()}) must be after --since ({since.isoformat()})")
    with IndexReader(index_path(args)) as reader:
        rows = nodes(reader, since=since, until=until)
    if not rows and args.output == "table":
        sys.stderr.write("No nodes found (no pod in the window was bound to a node).\n")
        return 0
    sys.stdout.write(render(rows, output=args.output, since=since, until=until, now=now, width=table_width()))
    return 0


def cmd_show(args: argparse.Namespace, console: object) -> int:
    from tracker.read.queues import queue_context
    from tracker.read.store import IndexQueryError, IndexReader

    if args.watch:
        from tracker.cli.watching import watch_show

        return watch_show(args)
    path = index_path(args)
    node_notes: dict[str, str] = {}
    with IndexReader(path) as reader:
        try:
            run_id, note = reader.resolve(args.run)
        except IndexQueryError as exc:
            raise NotFound(str(exc)) from None
        waiting = queue_context(reader, [run_id]).get(run_id)
        resumed_by = reader.resumed_by(run_id)  # the lineage in reverse: the history knows only its own
        history = reader.history(run_id)
        if history is not None and args.output not in ("json", "yaml") and not args.output.startswith(
                ("jsonpath=", "custom-columns=")):
            from tracker.read.nodeinfo import node_info, notes
            from tracker.read.pods import run_nodes

            node_notes = notes(node_info(reader, run_nodes(history)))  # GPU model, conditions of its nodes
    if history is None:  # deleted between the reads (the reader read again after a writer appeared)
        raise NotFound(f"no run {args.run!r} in {path}")
    if note:
        _note(note)
    if args.output in ("json", "yaml") or args.output.startswith(("jsonpath=", "custom-columns=")):
        import json

        from tracker.read.history import document

        data = document(history)  # the published history schema (schemas/history/v5.schema.json)
        if args.output.startswith(("jsonpath=", "custom-columns=")):
            from tracker.read.jsonpath import output_format

            fmt = output_format(args.output, ())
            sys.stdout.write(fmt.template.render(data) if fmt.template is not None else
                             fmt.columns.render([data]) if fmt.columns is not None else "")
        elif args.output == "json":
            sys.stdout.write(json.dumps(data, indent=2) + "\n")
        else:
            import yaml

            sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        return 0
    from tracker.read.timeline import timeline

    now = reading_now(args, path)
    print_rich(lambda width: timeline(history, width=width, now=now, resumed_by=resumed_by, node_notes=node_notes))
    if waiting:
        from tracker.read.queues import text

        said = text(waiting)
        if said:
            sys.stdout.write(f"Queue: {said}\n")
    return 0


def cmd_compare(args: argparse.Namespace, console: object) -> int:
    from tracker.read.store import IndexQueryError, IndexReader

    if len(args.runs) < 2:
        raise UsageError("compare needs two runs or more (tracker compare RUN RUN...)")
    path = index_path(args)
    from tracker.read.compare import compare_data, compare_table

    histories, resumed_by = [], {}
    with IndexReader(path) as reader:
        resolved = []
        for ref in args.runs:
            try:
                resolved.append(reader.resolve(ref))
            except IndexQueryError as exc:
                raise NotFound(str(exc)) from None
        for ref, (run_id, note) in zip(args.runs, resolved, strict=True):
            history = reader.history(run_id)
            if history is None:
                raise NotFound(f"no run {ref!r} in {path}")
            if note:
                _note(note)
            histories.append(history)
            resumed_by[run_id] = reader.resumed_by(run_id)
        from tracker.read.nodeinfo import node_info
        from tracker.read.pods import run_nodes

        nodes = node_info(reader, [n for h in histories for n in run_nodes(h)])  # their GPU models
    data = compare_data(histories, reading_now(args, path), resumed_by, nodes)
    if args.output == "json":
        import json

        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif args.output == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    else:
        print_rich(lambda width: compare_table(data))
    return 0


def _note(message: str) -> None:
    sys.stderr.write(f"note: {message}\n")


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from tracker.core.vocab import Phase
    from tracker.read.render import runs_table
    from tracker.read.store import IndexReader
    from tracker.read.timeline import timeline
    from tracker.runtime.replay import replay
    from tracker.shell.index import RECORDED_UNTIL_KEY, ExperimentIndex

    index_path: Path = args.index
    _remove_demo_index(index_path, force=args.force)
    with ExperimentIndex(index_path) as index:
        index.set_meta(DEMO_MARK, "true")
    console.rule("[bold]TauGrid tracker demo")
    console.print(f"Replaying the bundled captures of one cluster ({DEMO_CAPTURES}),\n"
                  "through the same bounded pipeline the service uses, into a fresh experiment index.\n")
    report = replay(captures=[DEMO_CAPTURES], index_path=index_path, console=console)
    if report.stopped:  # by a signal: replay said so in one line, and committed what it folded
        return 128 + report.stopped_by if report.stopped_by else 1
    with ExperimentIndex(index_path) as index:  # the captures' window ends later than their last change
        index.set_meta(RECORDED_UNTIL_KEY, DEMO_CAPTURED_UNTIL)
    with IndexReader(index_path) as reader:
        records = reader.records()
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
            history = reader.history(rec.run_id)
            if history is not None:
                console.rule(f"run {rec.run_id}")
                console.print(timeline(history, width=console.width, now=None))
    console.rule()
    console.print(f"The experiment index is at [bold]{index_path.resolve()}[/] (SQLite, schema in schemas/index/).\n"
                  "Try:\n"
                  f"  export {INDEX_ENV}={index_path}\n"
                  "  tracker runs --status pending\n"
                  "  # stuck before running, in any phase:\n"
                  "  tracker runs --stuck 30m\n"
                  "  tracker runs -n team-a -o wide\n"
                  "  # a run by NAMESPACE/NAME, by its id or the start of its id:\n"
                  "  tracker show team-a/qwen-rm-5vt2j\n"
                  "  tracker compare vit-l-9hx4d bert-pt-2c5nw\n"
                  "  tracker audit                               # GPU-hours held and lost\n"
                  "  tracker ui                                  # the same in a browser")
    return 0


DEMO_MARK = "created_by_demo"  # meta key: the demo made this index, so a later demo may replace it


def _remove_demo_index(path: Path, force: bool) -> None:
    """Delete the index a previous demo made (never one it did not make, unless ``force``), holding its writer role
    (``shell.index_lock``): an index another writer holds is never deleted; the demo refuses at once in one line
    (``WriterBusy``, exit 75)."""
    from tracker.shell.index_lock import WriterLock

    if not path.exists():
        return
    lock = WriterLock(path, wait_s=0)
    try:
        lock.acquire()
    except OSError as exc:
        raise UsageError(f"cannot replace {path}: cannot take its writer lock {lock.path}: {exc.strerror or exc}") \
            from None
    try:
        _remove_unlocked(path, force)
    finally:
        lock.release()


def _remove_unlocked(path: Path, force: bool) -> None:
    from tracker.read.store import IndexReader
    from tracker.shell.index_schema import IndexSchemaError

    if not force:
        try:
            with IndexReader(path) as reader:
                made_by_demo = reader.meta(DEMO_MARK) == "true"
        except IndexSchemaError:
            made_by_demo = False
        if not made_by_demo:
            raise UsageError(f"{path} exists and was not made by `tracker demo`: the demo replaces its index, so it "
                             "will not touch this one (give another --index, or --force to replace it)")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.with_name(path.stem + ".dead-letters.jsonl").unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------ completion


def cmd_completion(args: argparse.Namespace, console: object) -> int:
    sys.stdout.write(completion_script(args.shell, args.build_parser(service_commands=False)))
    return 0


def completion_script(shell: str, parser: argparse.ArgumentParser) -> str:
    """A bash function completing the commands, options and option values of ``parser`` (the ``tracker`` parser),
    and run ids (``tracker runs -o name``); zsh runs it through bashcompinit."""
    from tracker.core.vocab import PHASES, STATUSES
    from tracker.read.filters import SORT_KEYS

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    cases = []
    for name, p in sub.choices.items():
        opts = sorted({s for a in p._actions for s in a.option_strings})
        cases.append(f"        {name}) opts=\"{' '.join(opts)}\" ;;")
    values = {"-o|--output": "table wide json yaml name csv", "--by": "namespace queue cluster-queue workspace project",
              "--status": " ".join(STATUSES), "--phase": " ".join(PHASES),
              "--sort-by": " ".join(SORT_KEYS), "completion": "bash zsh"}
    value_cases = "\n".join(f"        {k}) COMPREPLY=($(compgen -W \"{v}\" -- \"$cur\")); return ;;"
                            for k, v in values.items())
    script = f"""# tracker completion for {shell}: add to your shell's startup file
#   source <(tracker completion {shell})
_tracker() {{
    local cur prev cmd opts index i
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    cmd="" index=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            --index) index="${{COMP_WORDS[i+1]}}" ;;
            -*) ;;
            *) [ -z "$cmd" ] && cmd="${{COMP_WORDS[i]}}" ;;
        esac
    done
    if [ -z "$cmd" ]; then
        COMPREPLY=($(compgen -W "{' '.join(sub.choices)} --help --version" -- "$cur"))
        return
    fi
    case "$prev" in
{value_cases}
        --index|--config|--kubeconfig) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    esac
    case "$cmd" in
{chr(10).join(cases)}
        *) opts="--help" ;;
    esac
    if [[ "$cur" != -* && ( "$cmd" == show || "$cmd" == compare ) ]]; then
        COMPREPLY=($(compgen -W "$(tracker runs -o name ${{index:+--index "$index"}} 2>/dev/null)" -- "$cur"))
        return
    fi
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}}
complete -o default -F _tracker tracker
"""
    if shell == "zsh":
        return "#compdef tracker\nautoload -U +X bashcompinit && bashcompinit\n" + script
    return script
