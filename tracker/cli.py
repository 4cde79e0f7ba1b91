"""The `tracker` command line: replay, runs, show, demo, completion (and the service commands).

Start-up is kept short: this module imports only the standard library, and each command imports what it uses
when it runs. The reader commands (``runs``, ``show``) import neither the Kubernetes, Kafka and Azure clients
nor, for ``runs``, pydantic; the service commands' modules (which import those clients) are loaded only when
one of them is the command given (``tracker --help`` lists them from ``SERVICE_COMMANDS``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracker import errors

if TYPE_CHECKING:
    import asyncio

    from rich.console import Console

    from tracker.runtime.pipeline import PipelineReport

DEMO_CAPTURES = Path(__file__).parent / "captures" / "demo"
DEFAULT_DEMO_INDEX = Path("out") / "demo-index.sqlite"
INDEX_ENV = "TRACKER_INDEX"
# Where readers look when neither --index nor TRACKER_INDEX is given: the index the deployed tracker writes
# (deploy/k8s/base/settings.yaml), so `kubectl exec deploy/tracker-sink-index -- tracker runs` needs no flag.
DEFAULT_INDEX = Path("/var/lib/tracker/index.sqlite")
SHOW_WIDTH_PIPED = 120  # layout width of `show` when the output is not a terminal and COLUMNS is not set

# The service commands and their one-line help, so that `tracker --help` lists them without importing them.
SERVICE_COMMANDS: dict[str, str] = {
    "watch": "list+watch Jobs, Pods, Events, Workloads, RayJobs and RayClusters; publish changes keyed by run id",
    "reduce": "run the Kafka reducer (a consumer group on the changes topic)",
    "sink": "run a history sink fed from the transitions topic",
    "serve": "intake, reducer and sinks in one process (Kafka or embedded bus)",
    "topics": "manage the tracker's Kafka topics",
    "kusto": "Azure Data Explorer schema (settings: TRACKER_ADX_* variables)",
    "doctor": "preflight checks: kubeconfig, RBAC, Kueue/KubeRay APIs, Kafka topics, ADX auth and schema",
}

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


class UsageError(errors.Fatal):
    """A command line that cannot work (exit 2)."""


class NotFound(errors.Fatal):
    """What was asked for is not there (exit 1)."""


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


def parse_time(text: str, flag: str = "--now") -> datetime:
    """An ISO-8601 time (a date alone is midnight; no offset is UTC)."""
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise UsageError(f"{flag} must be an ISO-8601 time, got {text!r}") from exc
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def parse_now(text: str | None) -> datetime | None:
    return None if text is None else parse_time(text)


def parse_when(text: str, now: datetime, flag: str) -> datetime:
    """A duration back from ``now`` ('2h': two hours ago) or a time."""
    stripped = text.strip()
    if stripped and (_DURATION.match(stripped) or re.fullmatch(r"\d+(\.\d+)?", stripped)):
        try:
            return now - timedelta(seconds=parse_duration(text))
        except OverflowError:
            return datetime.min.replace(tzinfo=UTC)
    try:
        return parse_time(text, flag)
    except UsageError:
        raise UsageError(f"{flag} takes a duration (e.g. 2h, 1d) or an ISO-8601 time, got {text!r}") from None


def index_path(args: argparse.Namespace) -> Path:
    """--index, else $TRACKER_INDEX, else the deployed tracker's index."""
    given: Path | None = getattr(args, "index", None)
    if given is not None:
        return given
    env = os.environ.get(INDEX_ENV)
    return Path(env) if env else DEFAULT_INDEX


# ------------------------------------------------------------------------------------------ commands


def replay(captures: list[Path], index_path: Path, console: Console, quiet: bool = False) -> PipelineReport:
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
            dead = pipeline.JsonlDeadLetters(dead_path)
            report = asyncio.run(_until_signalled(lambda stop: pipeline.run_pipeline(
                interleave(files), reducer, sinks=[], dead_letters=dead, on_progress=on_progress, store=index,
                stop=stop)))
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
    report = replay(args.captures, args.index, console)
    return 128 + report.stopped_by if report.stopped and report.stopped_by else 0


def _split(values: Sequence[str] | None) -> tuple[str, ...]:
    """Repeated and comma-separated values, in order, without repeats."""
    out: dict[str, None] = {}
    for v in values or ():
        for part in v.split(","):
            if part.strip():
                out[part.strip()] = None
    return tuple(out)


def _choice(allowed: Sequence[str], what: str) -> Callable[[str], str]:
    """An argparse type: one or more of ``allowed`` (comma-separated), matched case-insensitively."""
    by_lower = {a.lower(): a for a in allowed}

    def convert(text: str) -> str:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        bad = [p for p in parts if p.lower() not in by_lower]
        if bad or not parts:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(map(repr, bad or [text]))} "
                                             f"(one of: {', '.join(allowed)})")
        return ",".join(by_lower[p.lower()] for p in parts)
    convert.__name__ = what
    return convert


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _ago(now: datetime, seconds: float) -> datetime:
    """``now`` minus ``seconds``; the first representable time when that is before year 1."""
    try:
        return now - timedelta(seconds=seconds)
    except OverflowError:
        return datetime.min.replace(tzinfo=UTC)


def table_width() -> int | None:
    """The width a table must fit: the terminal's; COLUMNS when set; else none (piped output is not cut)."""
    if sys.stdout.isatty():
        import shutil

        return shutil.get_terminal_size().columns
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


def cmd_runs(args: argparse.Namespace, console: object) -> int:
    from tracker.runs_view import FIELDS, render
    from tracker.shell.index_query import (
        RUN_FIELDS,
        IndexQueryError,
        IndexReader,
        Requirement,
        RunFilter,
        parse_selector,
    )

    now = parse_now(args.now) or datetime.now(UTC)
    selector: tuple[Requirement, ...] = ()
    try:
        for text in args.selector or ():
            selector += parse_selector(text)
    except IndexQueryError as exc:
        raise UsageError(str(exc)) from None
    for key, value in (("taugrid.io/workspace", args.workspace), ("taugrid.io/project", args.project)):
        if value is not None:
            selector += (Requirement(key, "=", (value,)),)
    namespaces = () if args.all_namespaces else _split(args.namespace)
    stalled = stuck = None
    if args.stalled_admission is not None:
        stalled = _ago(now, parse_duration(args.stalled_admission))
    if args.stuck is not None:
        stuck = _ago(now, parse_duration(args.stuck))
    query = RunFilter(
        namespaces=namespaces, selector=selector, queues=_split(args.queue), cluster_queues=_split(args.cluster_queue),
        statuses=_split(args.status), phases=_split(args.phase),
        since=None if args.since is None else parse_when(args.since, now, "--since"),
        until=None if args.until is None else parse_when(args.until, now, "--until"),
        stalled_admission_before=stalled, stuck_before=stuck,
        sort_by="age" if args.stuck is not None and args.sort_by is None else (args.sort_by or "created"),
        limit=args.limit)
    with IndexReader(index_path(args)) as reader:
        why = args.stuck is not None  # the table says why the runs are stuck: the message too
        fields = FIELDS.get(args.output, RUN_FIELDS) + (("message",) if why and args.output == "table" else ())
        runs = reader.runs(query, fields, phase_since=args.output in ("table", "wide"))
        short = reader.short_ids(r.run_id for r in runs) if args.output == "table" else {}
    if not runs and args.output in ("table", "wide"):
        sys.stderr.write("No runs found.\n")
        return 0
    text = render(runs, args.output, now=now, width=table_width(), short=short, one_namespace=len(namespaces) == 1,
                  why=why)
    if args.no_headers and args.output in ("table", "wide"):
        text = text.split("\n", 1)[1]
    sys.stdout.write(text)
    return 0


def cmd_show(args: argparse.Namespace, console: object) -> int:
    from tracker.shell.index_query import IndexQueryError, IndexReader

    path = index_path(args)
    with IndexReader(path) as reader:
        try:
            run_id, note = reader.resolve(args.run)
        except IndexQueryError as exc:
            raise NotFound(str(exc)) from None
    from tracker.shell.index import ExperimentIndex

    with ExperimentIndex(path, readonly=True) as index:
        history = index.history(run_id)
    if history is None:  # deleted between the two reads
        raise NotFound(f"no run {args.run!r} in {path}")
    if note:
        _note(note)
    if args.output in ("json", "yaml"):
        import json

        data = json.loads(history.model_dump_json())  # the published history schema (schemas/history/)
        if args.output == "json":
            sys.stdout.write(json.dumps(data, indent=2) + "\n")
        else:
            import yaml

            sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        return 0
    from tracker.render import timeline

    now = parse_now(args.now) or datetime.now(UTC)
    _print_rich(lambda width: timeline(history, width=width, now=now))
    return 0


def cmd_compare(args: argparse.Namespace, console: object) -> int:
    from tracker.shell.index_query import IndexQueryError, IndexReader

    if len(args.runs) < 2:
        raise UsageError("compare needs two runs or more (tracker compare RUN RUN...)")
    path = index_path(args)
    with IndexReader(path) as reader:
        resolved = []
        for ref in args.runs:
            try:
                resolved.append(reader.resolve(ref))
            except IndexQueryError as exc:
                raise NotFound(str(exc)) from None
    from tracker.compare import compare_data, compare_table
    from tracker.shell.index import ExperimentIndex

    histories = []
    with ExperimentIndex(path, readonly=True) as index:
        for ref, (run_id, note) in zip(args.runs, resolved, strict=True):
            history = index.history(run_id)
            if history is None:
                raise NotFound(f"no run {ref!r} in {path}")
            if note:
                _note(note)
            histories.append(history)
    data = compare_data(histories, parse_now(args.now) or datetime.now(UTC))
    if args.output == "json":
        import json

        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif args.output == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    else:
        _print_rich(lambda width: compare_table(data))
    return 0


def _print_rich(make: Callable[[int], Any]) -> None:
    """Print a rich renderable laid out for the terminal; piped, at COLUMNS (or SHOW_WIDTH_PIPED) and with no
    trailing blanks."""
    from rich.console import Console

    if sys.stdout.isatty():
        console = Console()
        console.print(make(console.width))
        return
    width = table_width() or SHOW_WIDTH_PIPED
    console = Console(width=width, color_system=None, force_terminal=False)
    with console.capture() as captured:
        console.print(make(width))
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def _note(message: str) -> None:
    sys.stderr.write(f"note: {message}\n")


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from tracker.core.model import Phase
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
                  f"  export {INDEX_ENV}={index_path}\n"
                  "  tracker runs --status pending\n"
                  "  tracker runs --stuck 30m --now 2026-08-20T13:00:00Z      # stuck before running, any phase\n"
                  "  tracker runs -n team-a -o wide\n"
                  "  tracker show team-a/qwen-rm-5vt2j --now 2026-08-20T13:00:00Z   # or a run id, or its start\n"
                  "  tracker compare vit-l-9hx4d bert-pt-2c5nw")
    return 0


DEMO_MARK = "created_by_demo"  # meta key: the demo made this index, so a later demo may replace it


def _remove_demo_index(path: Path, force: bool) -> None:
    """Delete the index a previous demo made (never one it did not make, unless ``force``)."""
    from tracker.shell.index import ExperimentIndex
    from tracker.shell.index_schema import IndexSchemaError

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
    sys.stderr.write(f"error: {' '.join(message.split())}\n")


# ------------------------------------------------------------------------------------------ completion


def cmd_completion(args: argparse.Namespace, console: object) -> int:
    sys.stdout.write(completion_script(args.shell))
    return 0


def completion_script(shell: str) -> str:
    """A bash function completing commands, options, option values and run ids (``tracker runs -o name``);
    zsh runs it through bashcompinit."""
    parser = build_parser(service_commands=False)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    cases = []
    for name, p in sub.choices.items():
        opts = sorted({s for a in p._actions for s in a.option_strings})
        cases.append(f"        {name}) opts=\"{' '.join(opts)}\" ;;")
    values = {"-o|--output": "table wide json yaml name", "--status": "pending running succeeded failed stopped",
              "--phase": "Resolution Rendering Admission Scheduling Runtime Progress Completion",
              "--sort-by": " ".join(_sort_keys()), "completion": "bash zsh"}
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


def _sort_keys() -> list[str]:
    from tracker.shell.index_query import SORT_KEYS

    return list(SORT_KEYS)


# ------------------------------------------------------------------------------------------ parser


class _Parser(argparse.ArgumentParser):
    """No abbreviated options (``--statu`` is not ``--status``), for this parser and every sub-parser."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)


class _Version(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the tracker's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("taugrid-tracker")
        except PackageNotFoundError:
            v = "unknown (not installed)"
        sys.stdout.write(f"tracker {v}\n")
        parser.exit()


def _index_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", type=Path, metavar="PATH",
                   help=f"experiment index to read (default: ${INDEX_ENV}, else {DEFAULT_INDEX})")


RUNS_EPILOG = """\
examples:
  tracker runs                                   # every run, newest first (table fitted to the terminal)
  tracker runs -n team-a --status pending        # one namespace, runs not yet running
  tracker runs -l taugrid.io/project=llm,'taugrid.io/target in (h100-8x,a100)'
  tracker runs --queue team-a-lq --phase admission --sort-by age
  tracker runs --stuck 30m                       # live runs stuck before the application started
  tracker runs --since 2h -o wide                # created in the last two hours, every column
  tracker runs -o name | head -1 | xargs tracker show
"""

SHOW_EPILOG = """\
examples:
  tracker show e55428ce                          # a unique start of a run id
  tracker show team-a/qwen-rm-5vt2j              # the latest run of the Job or RayJob team-a/qwen-rm-5vt2j
  tracker show qwen-rm-5vt2j --now 2026-08-20T13:00:00Z
  tracker show qwen-rm-5vt2j -o json             # the published history schema (schemas/history/v1)
"""


COMPARE_EPILOG = """\
examples:
  tracker compare vit-l-9hx4d bert-pt-2c5nw      # two runs of an experiment
  tracker compare team-a/gpt-moe-6wz8r team-a/gpt-moe-tq3vb -o json
"""


def build_parser(service_commands: bool = True) -> argparse.ArgumentParser:
    """The ``tracker`` parser. Without ``service_commands`` the service commands are listed but not built (their
    modules import the Kafka, Kubernetes and Azure clients): ``main`` builds them only when one is the command."""
    p = _Parser(prog="tracker", description="TauGrid run lifecycle tracker: what happened to every training run",
                epilog=f"The readers (runs, show, compare) use --index, else ${INDEX_ENV}, else {DEFAULT_INDEX}.\n"
                       "Shell completion: source <(tracker completion bash)   # or zsh")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("replay", help="fold capture files into the experiment index",
                       description="Fold capture files into the experiment index (adds to it, never replaces).",
                       epilog="examples:\n  tracker replay captures/ more.jsonl --index runs.sqlite\n"
                              "  kubectl get pods -A -w --output-watch-events -o json | tracker replay - "
                              "--index runs.sqlite")
    r.add_argument("captures", nargs="+", type=Path, help="capture files or directories (.json, .jsonl, "
                   "also gzip-compressed); - for standard input")
    r.add_argument("--index", type=Path, default=os.environ.get(INDEX_ENV) or None, required=not os.environ.get(
        INDEX_ENV), metavar="PATH", help=f"SQLite experiment index (created if missing; default: ${INDEX_ENV})")
    r.set_defaults(func=cmd_replay, needs_console=True)

    q = sub.add_parser("runs", help="list runs from the experiment index (kubectl style)",
                       description="List runs, newest first. Filters combine (all must hold); a flag given twice\n"
                                   "or a comma-separated value means any of them.", epilog=RUNS_EPILOG)
    _index_option(q)
    q.add_argument("-n", "--namespace", action="append", metavar="NS",
                   help="only runs in this namespace (repeatable; default: every namespace)")
    q.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace (overrides -n)")
    q.add_argument("-l", "--selector", action="append", metavar="SELECTOR",
                   help="label selector as kubectl's, on the run's labels: taugrid.io/project, /workspace, /target, "
                        "kueue.x-k8s.io/queue-name (or project, workspace, target, queue) and the Job's or RayJob's "
                        "labels as stored: k=v, k!=v, 'k in (a,b)', 'k notin (a,b)', k, !k")
    q.add_argument("--queue", action="append", metavar="LOCALQUEUE", help="only runs submitted to this LocalQueue")
    q.add_argument("--cluster-queue", action="append", metavar="CLUSTERQUEUE",
                   help="only runs admitted by (or last queued for) this ClusterQueue")
    q.add_argument("--status", action="append", type=_choice(STATUSES, "status"), metavar="STATUS",
                   help="only runs with this status: " + ", ".join(STATUSES) + " (any case)")
    q.add_argument("--phase", action="append", type=_choice(PHASES, "phase"), metavar="PHASE",
                   help="only runs now in this phase: " + ", ".join(PHASES) + " (any case)")
    q.add_argument("--since", metavar="WHEN", help="only runs created at or after WHEN: a duration back from now "
                                                   "(2h, 1d) or an ISO-8601 time")
    q.add_argument("--until", metavar="WHEN", help="only runs created before WHEN (a duration or a time)")
    q.add_argument("--stalled-admission", metavar="DURATION",
                   help="only runs waiting for admission (pending in Admission) longer than this, e.g. 30m")
    q.add_argument("--stuck", metavar="DURATION",
                   help="only live runs whose application has not started, in Admission, Scheduling or Runtime for "
                        "longer than this (e.g. 30m); sorted longest first")
    q.add_argument("--now", metavar="TIME", help="the reference time of AGE, --since, --until, --stuck and "
                                                 "--stalled-admission (ISO-8601; default: the current time)")
    q.add_argument("--workspace", metavar="WS", help="only runs of this TauGrid workspace "
                                                     "(same as -l taugrid.io/workspace=WS)")
    q.add_argument("--project", metavar="PROJECT", help="only runs of this TauGrid project "
                                                        "(same as -l taugrid.io/project=PROJECT)")
    q.add_argument("--sort-by", choices=_sort_keys(), metavar="KEY",
                   help="order by: " + ", ".join(_sort_keys()) + " (times: newest first; age, counts and wait: "
                        "largest first; names: A to Z; default: created)")
    q.add_argument("--limit", type=_positive, metavar="N", help="at most N runs")
    q.add_argument("-o", "--output", choices=("table", "wide", "json", "yaml", "name"), default="table",
                   metavar="FORMAT",
                   help="table (default: fits the terminal), wide (every column), json or yaml (every field), "
                        "name (one run id per line)")
    q.add_argument("--json", dest="output", action="store_const", const="json", help="same as -o json")
    q.add_argument("--no-headers", action="store_true", help="table and wide: leave out the header line")
    q.set_defaults(func=cmd_runs, needs_console=False)

    s = sub.add_parser("show", help="show one run's timeline, provenance and metrics",
                       description="One run: a bar per phase and attempt on a shared time axis (a live run's\n"
                                   "axis ends now), then provenance and metrics.", epilog=SHOW_EPILOG)
    s.add_argument("run", metavar="RUN", help="a run id, a unique start of one, or NAMESPACE/NAME of a Job or "
                                              "RayJob (its latest run)")
    _index_option(s)
    s.add_argument("--now", metavar="TIME", help="end of a live run's time axis (ISO-8601; default: the current "
                                                 "time)")
    s.add_argument("-o", "--output", choices=("timeline", "json", "yaml"), default="timeline", metavar="FORMAT",
                   help="timeline (default), or json or yaml in the shape of schemas/history/v1.schema.json")
    s.add_argument("--json", dest="output", action="store_const", const="json", help="same as -o json")
    s.set_defaults(func=cmd_show, needs_console=False)

    cp = sub.add_parser("compare", help="runs side by side: provenance, attempts, evictions, retries, waits, "
                                         "time per phase, metrics",
                        description="Runs side by side; rows whose values differ are highlighted.",
                        epilog=COMPARE_EPILOG)
    cp.add_argument("runs", nargs="+", metavar="RUN", help="run ids, unique starts of them, or NAMESPACE/NAME of "
                                                           "Jobs or RayJobs (two or more)")
    _index_option(cp)
    cp.add_argument("--now", metavar="TIME", help="count a live run's current phase up to TIME (ISO-8601; "
                                                  "default: the current time)")
    cp.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table", metavar="FORMAT",
                    help="table (default), json or yaml")
    cp.add_argument("--json", dest="output", action="store_const", const="json", help="same as -o json")
    cp.set_defaults(func=cmd_compare, needs_console=False)

    dm = sub.add_parser("demo", help="replay the bundled captures and show run timelines",
                        epilog="examples:\n  tracker demo\n  tracker demo --index /tmp/demo.sqlite")
    dm.add_argument("--index", type=Path, default=DEFAULT_DEMO_INDEX, metavar="PATH",
                    help=f"experiment index to create (default: {DEFAULT_DEMO_INDEX}; replaced on the next demo)")
    dm.add_argument("--force", action="store_true",
                    help="replace --index even if the demo did not create it")
    dm.set_defaults(func=cmd_demo, needs_console=True)

    c = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                       epilog="examples:\n  source <(tracker completion bash)     # in ~/.bashrc\n"
                              "  source <(tracker completion zsh)      # in ~/.zshrc")
    c.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")
    c.set_defaults(func=cmd_completion, needs_console=False)

    if service_commands:
        # the service commands (their modules import the Kafka, Kubernetes and Azure clients)
        from tracker.runtime.commands import add_service_commands
        from tracker.runtime.doctor import add_doctor_command
        from tracker.runtime.kusto_cmd import add_kusto_commands
        from tracker.runtime.watch_cmd import add_watch_command

        services: Any = sub
        add_watch_command(services)
        add_service_commands(services)
        add_kusto_commands(services)
        add_doctor_command(services)
    else:
        for name, help_text in SERVICE_COMMANDS.items():
            sub.add_parser(name, help=help_text, add_help=False)
    return p


STATUSES = ("pending", "running", "succeeded", "failed", "stopped")
PHASES = ("Resolution", "Rendering", "Admission", "Scheduling", "Runtime", "Progress", "Completion")


def _command(argv: Sequence[str]) -> str | None:
    """The command word: the first argument that is not an option (the top level has no option with a value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(service_commands=_command(argv) in SERVICE_COMMANDS).parse_args(argv)
    console: Any = None
    if getattr(args, "needs_console", True):
        from rich.console import Console

        from tracker.runtime.gctune import tune_gc

        tune_gc()
        # a pipe or a CI log gets a fixed, readable width instead of rich's 80-column fallback
        console = Console(width=None if sys.stdout.isatty() else 150)
    try:
        rc: int = args.func(args, console)
    except NotFound as exc:
        _fail(str(exc))
        return 1
    except BrokenPipeError:  # the reader went away (tracker runs | head): no message, and none at exit either
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as exc:
        if isinstance(exc, (UsageError, FileNotFoundError, *_loaded("tracker.shell.index_schema", "IndexSchemaError"),
                            *_loaded("tracker.shell.reducer_state", "StateError"))):
            _fail(str(exc))
            return 2
        if isinstance(exc, (OSError, *_loaded("sqlite3", "Error"))):
            _fail(f"{exc.__class__.__name__}: {exc}")
            return 1
        raise
    return rc


def _loaded(module: str, name: str) -> tuple[type[BaseException], ...]:
    """An exception class of a module, if the module was imported (if not, nothing raised it)."""
    mod = sys.modules.get(module)
    cls = getattr(mod, name, None) if mod is not None else None
    return (cls,) if isinstance(cls, type) and issubclass(cls, BaseException) else ()


if __name__ == "__main__":
    sys.exit(main())
