"""The ``tracker`` parser: every command's options, help and examples, and which module runs it.

Standard library only at the top, like the whole of ``tracker.cli``: the reader commands import what they use when
they run, and the service commands' modules (which import the Kafka, Kubernetes and Azure clients) are built only
when one of them is the command given (``SERVICE_COMMANDS`` lists them for ``tracker --help``).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from tracker.cli.args import DEFAULT_DEMO_INDEX, DEFAULT_INDEX, INDEX_ENV, choice, output, positive
from tracker.cli.reading import cmd_audit, cmd_compare, cmd_completion, cmd_demo, cmd_nodes, cmd_runs, cmd_show
from tracker.cli.replay_cmd import cmd_replay
from tracker.core.vocab import PHASES, STATUSES
from tracker.read.filters import SORT_KEYS

# The service commands and their one-line help, so that `tracker --help` lists them without importing them.
SERVICE_COMMANDS: dict[str, str] = {
    "watch": "list+watch Jobs, Pods, Events, Workloads, RayJobs and RayClusters; publish changes keyed by run id",
    "reduce": "run the Kafka reducer (a consumer group on the changes topic)",
    "sink": "run a history sink fed from the transitions topic",
    "serve": "intake, reducer and sinks in one process (Kafka or embedded bus)",
    "topics": "manage the tracker's Kafka topics",
    "kusto": "Azure Data Explorer schema (settings: TRACKER_ADX__*)",
    "doctor": "preflight checks: kubeconfig, RBAC, Kueue/KubeRay APIs, Kafka topics, ADX auth and schema",
}

AUDIT_GROUPS = ("namespace", "queue", "cluster-queue", "workspace", "project")  # tracker.read.audit.GROUP_BY


class _Parser(argparse.ArgumentParser):
    """No abbreviated options (``--statu`` is not ``--status``), for this parser and every sub-parser; a usage error
    is one line (what is wrong, the nearest option or value when one is close, where the usage is), not argparse's
    whole usage block before it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]  # one signature of several
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        ns, extras = self.parse_known_args(args, namespace)
        if extras:  # said by the (sub-)command they were given to, as `tracker runs: error: ...`
            _innermost(self, ns).error(f"unrecognized arguments: {' '.join(extras)}")
        return ns

    def error(self, message: str) -> NoReturn:
        hint = _did_you_mean(self, message)
        self.exit(2, f"{self.prog}: error: {message}{hint} (see `{self.prog} --help`)\n")


_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


def _innermost(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> argparse.ArgumentParser:
    """The sub-parser of the command ``ns`` chose (``tracker sink index`` -> that of ``index``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = action.choices.get(getattr(ns, action.dest, None) or "")
            if sub is not None:
                return _innermost(sub, ns)
    return parser


def _options(parser: argparse.ArgumentParser) -> list[str]:
    """Every long option of ``parser`` and of its sub-parsers (an unrecognized option is reported by the top one)."""
    found = [o for o in parser._option_string_actions if o.startswith("--")]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_options(sub))
    return list(dict.fromkeys(found))


def _did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """``; did you mean --limit?`` for a close miss of an option or a choice, else nothing."""
    if m := _UNRECOGNIZED.search(message):
        words = [w.split("=", 1)[0] for w in m.group(1).split() if w.startswith("--")]
        candidates = _options(parser)
    elif m := _INVALID_CHOICE.search(message):
        words = [m.group(1)]
        candidates = [c.strip().strip("'") for c in m.group(2).split(",")]
    else:
        return ""
    for word in words:
        close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.7)
        if close:
            return f"; did you mean {close[0]}?"
    return ""


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
        from tracker import errors
        from tracker.shell import compiled_core

        try:
            core = compiled_core.check().describe()
        except errors.Fatal as exc:
            core = str(exc)
        sys.stdout.write(f"tracker {v}; core: {core}\n")
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
  tracker runs --node aks-h100-vmss000003 --status failed   # failed runs with a pod on that node
  tracker runs --since 2h -o wide                # created in the last two hours, every column
  tracker runs -o name | head -1 | xargs tracker show
"""

AUDIT_EPILOG = """\
examples:
  tracker audit                                  # every run in the index, per namespace, worst first
  tracker audit --since 7d --by cluster-queue    # runs created in the last week, per ClusterQueue
  tracker audit --since 2026-08-01 --until 2026-09-01 --by project -o csv > august.csv
  tracker audit --by workspace -o json
"""

NODES_EPILOG = """\
examples:
  tracker nodes                                  # every node pods were bound to, worst first
  tracker nodes --since 7d                       # pods on their node in the last week (the KQL twin: TaugridNodes)
  tracker nodes --since 2026-08-20T09:00:00Z --until 2026-08-20T12:00:00Z -o json
  tracker runs --node NODE                       # then the runs that had a pod there
"""

SHOW_EPILOG = """\
examples:
  tracker show e55428ce                          # a unique start of a run id
  tracker show team-a/qwen-rm-5vt2j              # the latest run of the Job or RayJob team-a/qwen-rm-5vt2j
  tracker show qwen-rm-5vt2j --now 2026-08-20T13:00:00Z
  tracker show qwen-rm-5vt2j -o json             # the published history schema (schemas/history/v5)
"""


COMPARE_EPILOG = """\
examples:
  tracker compare vit-l-9hx4d bert-pt-2c5nw      # two runs of an experiment
  tracker compare team-a/gpt-moe-6wz8r team-a/gpt-moe-tq3vb -o json
"""


WATCH_INTERVAL_S = 2.0  # how often -w reads the index again (--watch-interval)


def _watch_options(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("-w", "--watch", action="store_true", help=f"{what}; reads the index every --watch-interval "
                                                             "seconds until interrupted (exit 0)")
    p.add_argument("--watch-interval", type=_interval, default=WATCH_INTERVAL_S, metavar="SECONDS",
                   help=f"with -w: seconds between two reads of the index (default {WATCH_INTERVAL_S:g}, "
                        "0.2 to 3600)")


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.2 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0.2 and 3600 seconds, got {text!r}")
    return value


def build_parser(service_commands: bool = True) -> argparse.ArgumentParser:
    """The ``tracker`` parser. Without ``service_commands`` the service commands are listed but not built (their
    modules import the Kafka, Kubernetes and Azure clients): ``main`` builds them only when one is the command."""
    p = _Parser(prog="tracker", description="TauGrid run lifecycle tracker: what happened to every training run",
                epilog=f"The readers (runs, audit, nodes, show, compare, ui) use --index, else ${INDEX_ENV}, else "
                       f"{DEFAULT_INDEX}.\n"
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
    r.add_argument("--retire-after", metavar="DURATION",
                   help="free finished runs once the captures' event time is DURATION past their last change "
                        "(e.g. 1h), as `tracker serve` does: memory stays flat on a long capture. Only for captures "
                        "read in step (one time-ordered file, or a directory read together), and the same on every "
                        "replay into one index; off by default")
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
    q.add_argument("--status", action="append", type=choice(STATUSES, "status"), metavar="STATUS",
                   help="only runs with this status: " + ", ".join(STATUSES) + " (any case)")
    q.add_argument("--phase", action="append", type=choice(PHASES, "phase"), metavar="PHASE",
                   help="only runs now in this phase: " + ", ".join(PHASES) + " (any case)")
    q.add_argument("--node", action="append", metavar="NODE",
                   help="only runs with a pod (in any attempt) bound to this node (repeatable, or comma-separated); "
                        "list the nodes with: tracker nodes")
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
    q.add_argument("--sort-by", choices=list(SORT_KEYS), metavar="KEY",
                   help="order by: " + ", ".join(list(SORT_KEYS)) + " (times: newest first; age, counts and wait: "
                        "largest first; names: A to Z; default: created)")
    q.add_argument("--limit", type=positive, metavar="N", help="at most N runs")
    q.add_argument("-o", "--output", type=output(("table", "wide", "json", "yaml", "name")), default="table",
                   metavar="FORMAT",
                   help="table (default: fits the terminal), wide (every column), json or yaml (every field), "
                        "name (one run id per line), jsonpath=TEMPLATE or custom-columns=NAME:.path,... as kubectl "
                        "(over {\"kind\": \"List\", \"items\": [the runs' json]}; e.g. "
                        "-o jsonpath='{range .items[*]}{.run_id}{\"\\t\"}{.status}{\"\\n\"}{end}')")
    q.add_argument("--json", dest="output", action="store_const", const="json", help="same as -o json")
    q.add_argument("--no-headers", action="store_true", help="table, wide and custom-columns: leave out the header "
                                                             "line")
    _watch_options(q, "print the table, then a line for each run that is new or changed (-o name: its id; -o "
                      "json: its object on one line)")
    q.set_defaults(func=cmd_runs, needs_console=False)

    au = sub.add_parser("audit", help="retries, resumes, evictions, GPU-hours held and lost, goodput and ETTR, per "
                                      "group",
                        description="The runs created in a window, grouped: runs, attempts, evictions by reason, pod\n"
                                    "retries, resumes, GPU-hours held and lost, worst groups first (most GPU-hours\n"
                                    "lost); then their goodput ledger: GPU-hours by category, goodput (productive\n"
                                    "over held) and ETTR (productive over wall time, of the runs with progress\n"
                                    "events). A run counts whole in the window it was created in; GPUs still held\n"
                                    "count up to --now (schemas/gpu-accounting.md, schemas/goodput.md).",
                        epilog=AUDIT_EPILOG)
    _index_option(au)
    au.add_argument("--since", metavar="WHEN", help="only runs created at or after WHEN: a duration back from now "
                                                    "(7d, 24h) or an ISO-8601 time")
    au.add_argument("--until", metavar="WHEN", help="only runs created before WHEN (a duration or a time)")
    au.add_argument("--now", metavar="TIME", help="the reference time of --since, --until and of GPUs still held "
                                                  "(ISO-8601; default: the current time)")
    au.add_argument("--by", type=choice(AUDIT_GROUPS, "grouping"), metavar="GROUP",
                    help="group by: " + ", ".join(AUDIT_GROUPS) + " (default: namespace)")
    au.add_argument("-o", "--output", choices=("table", "json", "csv"), default="table", metavar="FORMAT",
                    help="table (default: fits the terminal), json (with evictions and GPU-hours lost by reason, the "
                         "ledger's GPU-hours and wall seconds by category) or csv (the same, one row per group, for "
                         "spreadsheets)")
    au.add_argument("--json", dest="output", action="store_const", const="json", help="same as -o json")
    au.set_defaults(func=cmd_audit, needs_console=False)

    nd = sub.add_parser("nodes", help="nodes by the failed and evicted pods and runs on them (the bad-node signal)",
                        description="One row per node the pods were bound to: runs and pods seen there, pods that\n"
                                    "failed or were evicted, runs that failed (a pod of their last attempt there) or\n"
                                    "were evicted there, the last failure's time and reason; worst first (most\n"
                                    "failed pods, then evicted pods, runs failed, runs evicted, latest failure). A\n"
                                    "pod counts in the window when it was on its node during it.",
                        epilog=NODES_EPILOG)
    _index_option(nd)
    nd.add_argument("--since", metavar="WHEN", help="only pods on their node at or after WHEN: a duration back from "
                                                    "now (7d, 24h) or an ISO-8601 time (default: every pod)")
    nd.add_argument("--until", metavar="WHEN", help="only pods bound before WHEN (a duration or a time)")
    nd.add_argument("--now", metavar="TIME", help="the reference time of --since and --until (ISO-8601; default: "
                                                  "the current time)")
    nd.add_argument("-o", "--output", choices=("table", "json"), default="table", metavar="FORMAT",
                    help="table (default: fits the terminal) or json (every field, with the window)")
    nd.add_argument("--json", dest="output", action="store_const", const="json", help="same as -o json")
    nd.set_defaults(func=cmd_nodes, needs_console=False)

    s = sub.add_parser("show", help="show one run's timeline, provenance and metrics",
                       description="One run: a bar per phase and attempt on a shared time axis (a live run's\n"
                                   "axis ends now), its checkpoints and the time it lost on the same axis, its\n"
                                   "goodput ledger (ETTR, goodput, GPU-hours by category), then provenance with\n"
                                   "the runs it resumes and that resume it, and metrics.", epilog=SHOW_EPILOG)
    s.add_argument("run", metavar="RUN", help="a run id, a unique start of one, or NAMESPACE/NAME of a Job or "
                                              "RayJob (its latest run)")
    _index_option(s)
    s.add_argument("--now", metavar="TIME", help="end of a live run's time axis (ISO-8601; default: the current "
                                                 "time)")
    s.add_argument("-o", "--output", type=output(("timeline", "json", "yaml")), default="timeline", metavar="FORMAT",
                   help="timeline (default), or json or yaml in the shape of schemas/history/v5.schema.json, or "
                        "jsonpath=TEMPLATE over that document as kubectl "
                        "(e.g. -o jsonpath='{.attempts[*].end_reason}')")
    s.add_argument("--json", dest="output", action="store_const", const="json", help="same as -o json")
    _watch_options(s, "print the timeline again (-o json: the document on one line) whenever the run changes")
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
    c.set_defaults(func=cmd_completion, needs_console=False, build_parser=build_parser)

    from tracker.cli.ui import add_ui_command

    add_ui_command(sub)

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
