"""Command-line entry points of the service: ``reduce``, ``sink index``, ``serve``, ``topics create``.

``add_service_commands(subparsers)`` adds them to the ``tracker`` parser (each sets ``func(args, console) -> int``
like the other commands); ``python -m tracker.runtime.commands`` runs them on their own.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any

import yaml
from aiokafka.errors import KafkaError
from rich.console import Console
from rich.markup import escape

from tracker.runtime import service
from tracker.runtime.ops import Health, Metrics, Shutdown
from tracker.settings import Settings, SettingsError, load_settings
from tracker.shell import kafka


def _membership(p: Any, default_group: str) -> None:
    p.add_argument("--group", help=f"consumer group (default: {default_group})")
    p.add_argument("--instance-id", help="static group membership id, unique per process")


def add_service_commands(subparsers: Any) -> None:
    """Add the service commands to an ``argparse`` sub-parser collection."""
    r = subparsers.add_parser("reduce", help="run the Kafka reducer (a consumer group on the changes topic)")
    _common(r)
    _membership(r, "reduce.group_id")
    r.set_defaults(func=cmd_reduce)

    sink = subparsers.add_parser("sink", help="run a history sink fed from the transitions topic")
    sinks = sink.add_subparsers(dest="sink", required=True)
    si = sinks.add_parser("index", help="write histories to the SQLite experiment index, offsets included")
    _common(si)
    si.add_argument("--index", type=Path, help="SQLite experiment index (default: sink.index_path)")
    _membership(si, "sink.index_group")
    si.set_defaults(func=cmd_sink_index)
    sa = sinks.add_parser("adx", help="write histories to Azure Data Explorer (settings: TRACKER_ADX__*)")
    _common(sa)
    _membership(sa, "tracker-sink-adx")
    sa.set_defaults(func=cmd_sink_adx)

    s = subparsers.add_parser("serve", help="intake, reducer and sinks in one process (Kafka or embedded bus)")
    _common(s)
    s.add_argument("--from-capture", dest="captures", nargs="+", type=Path, default=[], metavar="PATH",
                   help="replay capture files or directories as the intake source (- for standard input)")
    s.add_argument("--index", type=Path, help="SQLite experiment index to keep up to date")
    s.add_argument("--create-topics", action="store_true", help="create missing topics first (Kafka only)")
    s.add_argument("--exit-when-done", action="store_true",
                   help="shut down gracefully once the intake source is exhausted")
    s.add_argument("--watch", action="store_true",
                   help="watch the cluster as the intake source (the watcher, reducer and sinks in one process)")
    s.add_argument("--kubeconfig", type=Path, help="with --watch: default in-cluster, else ~/.kube/config")
    s.add_argument("--context", help="with --watch: kubeconfig context")
    s.add_argument("-n", "--namespace", dest="namespaces", action="append", default=[], metavar="NS",
                   help="with --watch: only this namespace (repeatable; default: every namespace)")
    s.set_defaults(func=cmd_serve)

    t = subparsers.add_parser("topics", help="manage the tracker's Kafka topics")
    topics = t.add_subparsers(dest="topics", required=True)
    tc = topics.add_parser("create", help="create missing topics with explicit partitions and configs")
    _common(tc)
    tc.add_argument("--partitions", type=int, help="partitions of changes, transitions and run-state")
    tc.add_argument("--replication-factor", type=int,
                    help="replicas of every topic, at most the number of brokers "
                         "(default: kafka.topics.replication_factor, 3)")
    tc.add_argument("--dry-run", action="store_true", help="print the layout (YAML) without contacting Kafka")
    tc.set_defaults(func=cmd_topics_create)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="settings file (YAML or JSON; also TRACKER_CONFIG_FILE)")
    p.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (also TRACKER_KAFKA__BOOTSTRAP_SERVERS)")
    p.add_argument("--metrics-port", type=int, help="serve /metrics, /healthz, /readyz on this port (0: any)")
    p.add_argument("--log-format", choices=["json", "console"],
                   help="log lines on stderr: json (one JSON object a line, the default; "
                        "ops.log_format) or console (for people)")


def _settings(args: argparse.Namespace, **sections: dict[str, Any]) -> Settings:
    """Settings with the flags that were given (``sections``: command-specific flags, by settings section)."""
    flags: dict[str, dict[str, Any]] = {"kafka": {"bootstrap_servers": args.bootstrap_servers},
                                        "ops": {"metrics_port": args.metrics_port, "log_format": args.log_format}}
    for section, values in sections.items():
        flags[section] = {**flags.get(section, {}), **values}
    overrides = {section: given for section, values in flags.items()
                 if (given := {k: v for k, v in values.items() if v is not None and v != {}})}
    return load_settings(args.config, overrides)


def _run(settings: Settings, name: str, body: service.Body, fatal: service.Errors = service.FATAL) -> int:
    return asyncio.run(service.run_process(settings, name, body=body, fatal=fatal))


def _needs_kafka(settings: Settings, command: str) -> None:
    if not settings.kafka.enabled:
        raise SettingsError(f"`tracker {command}` needs Kafka: set --bootstrap-servers or "
                            "TRACKER_KAFKA__BOOTSTRAP_SERVERS")


def cmd_reduce(args: argparse.Namespace, console: Console) -> int:
    try:
        settings = _settings(args, reduce={"group_id": args.group, "group_instance_id": args.instance_id})
        _needs_kafka(settings, "reduce")
    except SettingsError as exc:
        return _usage(exc)
    return _run(settings, "reduce", service.reduce_body(settings))


def cmd_sink_index(args: argparse.Namespace, console: Console) -> int:
    try:
        settings = _settings(args, sink={"index_path": args.index, "index_group": args.group,
                                         "group_instance_id": args.instance_id})
        _needs_kafka(settings, "sink index")
        if settings.sink.index_path is None:
            raise SettingsError("`tracker sink index` needs --index PATH (or TRACKER_SINK__INDEX_PATH)")
    except SettingsError as exc:
        return _usage(exc)
    return _run(settings, "sink-index", service.sink_body(settings, index_path=None))


def cmd_sink_adx(args: argparse.Namespace, console: Console) -> int:
    try:
        settings = _settings(args, sink={"group_instance_id": args.instance_id})
        _needs_kafka(settings, "sink adx")
    except SettingsError as exc:
        return _usage(exc)
    return _run(settings, "sink-adx", service.sink_body(settings, index_path=None, kind="adx", group=args.group))


def cmd_serve(args: argparse.Namespace, console: Console) -> int:
    try:
        settings = _settings(args)
        opts = service.ServeOptions(captures=tuple(args.captures), index_path=args.index,
                                    create_topics=args.create_topics, exit_when_done=args.exit_when_done)
        if args.watch and opts.captures:
            raise SettingsError("`tracker serve` takes one intake source: --watch or --from-capture")
        has_source = bool(opts.captures) or args.watch
        if not settings.kafka.enabled and not (has_source and (opts.index_path or settings.sink.index_path)):
            raise SettingsError("`tracker serve` without Kafka runs the embedded pipeline: it needs an intake "
                                "(--watch or --from-capture PATH) and --index PATH")
    except SettingsError as exc:
        return _usage(exc)
    if args.watch:
        from tracker.runtime.watch_cmd import WATCH_FATAL  # the watcher's own fatal errors stop it in one line too

        return _run(settings, "serve", _serve_watching(settings, opts, args), fatal=WATCH_FATAL)
    return _run(settings, "serve", service.serve_body(settings, opts))


def _serve_watching(settings: Settings, opts: service.ServeOptions, args: argparse.Namespace) -> service.Body:
    """The watcher publishing onto a bounded in-process bus that is the intake of the serve pipeline.

    The embedded watcher keeps no checkpoint: the bus cannot confirm what the reducer committed, so it lists
    again at start, and the reducer's facts absorb the repeats."""
    from tracker.runtime.watch_cmd import WatchOptions, watch_body
    from tracker.shell.bus import InProcessBus
    from tracker.shell.capture import Record
    from tracker.shell.watch.publish import BusPublisher

    # the watch settings tree (TRACKER_WATCH__*, the settings file), as `tracker watch` reads it; -n overrides
    config = dataclasses.replace(settings.watch, namespaces=tuple(args.namespaces) or settings.watch.namespaces)
    wopts = WatchOptions(config=config, kubeconfig=args.kubeconfig, context=args.context)

    async def body(metrics: Metrics, health: Health, shutdown: Shutdown) -> None:
        bus: InProcessBus[tuple[Record, str]] = InProcessBus(settings.source.max_in_flight)

        async def intake() -> service.Source:
            async for record, key in bus:
                yield record, key

        async def watch() -> None:
            try:
                await watch_body(settings, wopts, into=BusPublisher(bus))(metrics, health, shutdown)
            finally:
                await bus.close()

        async with asyncio.TaskGroup() as tg:  # one failing cancels the other; their errors leave as a group
            tg.create_task(watch())
            tg.create_task(service.serve_body(settings, opts, source=intake())(metrics, health, shutdown))
    return body


def cmd_topics_create(args: argparse.Namespace, console: Console) -> int:
    try:
        settings = _settings(args, kafka={"topics": {k: v for k, v in (
            ("partitions", args.partitions), ("replication_factor", args.replication_factor)) if v is not None}})
        if args.dry_run:
            sys.stdout.write(yaml.safe_dump(kafka.topics_document(settings.kafka.topics), sort_keys=False))
            return 0
        _needs_kafka(settings, "topics create")
    except SettingsError as exc:
        return _usage(exc)
    try:
        result = asyncio.run(service.create_topics(settings))
    except (kafka.TopicLayoutError, KafkaError, TimeoutError, OSError) as exc:
        _error(exc)
        return 1
    for topic, outcome in result.items():
        console.print(f"{topic}: {outcome}")
    return 0


def _usage(exc: ValueError) -> int:
    _error(exc)
    return 2


def _error(exc: BaseException) -> None:
    Console(stderr=True, soft_wrap=True).print("[red]error:[/]", escape(" ".join(str(exc).split())), highlight=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tracker", description="TauGrid run lifecycle tracker: service commands")
    add_service_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    rc: int = args.func(args, Console())
    return rc


if __name__ == "__main__":
    sys.exit(main())
