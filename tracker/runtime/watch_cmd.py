"""``tracker watch``: list+watch every run object and publish keyed changes to Kafka or a JSON-lines capture.

It runs as a service process (``tracker.runtime.service.run_process``: JSON logs, ``/metrics``, ``/healthz``,
``/readyz``, a graceful stop on SIGTERM that drains the outbox and writes a last checkpoint). Kafka settings come
from the same settings as the other service commands (``--bootstrap-servers``, ``TRACKER_KAFKA__*``, ``--config``);
records go to the changes topic keyed by run id, exactly as ``tracker serve`` publishes them.

With ``--lease-namespace``, replicas elect a leader through a ``coordination.k8s.io/v1`` Lease and only the leader
watches and publishes; a leader that loses the lease stops publishing at once and stands as a candidate again.
Without it, run exactly one replica.

Where the checkpoint lives (``checkpoint_store``): with a lease and Kafka (publishing to the changes topic), in the
compacted watch-state topic, shared by the replicas (``tracker.shell.watch_state``): every leadership term resumes
from the last checkpoint of whichever replica led before, and starting a term fences the previous leader's saves.
``--checkpoint FILE`` always means a local SQLite file instead (each replica its own: a new leader then resumes
from its own, possibly stale, state and re-lists); so does a single replica, or a capture output, which has no
checkpoint unless ``--checkpoint`` is given.

``add_watch_command(subparsers)`` adds the command to the ``tracker`` parser (``func(args, console) -> int``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import ConfigException, load_incluster_config, load_kube_config
from rich.console import Console
from rich.markup import escape

from tracker.core.model import DeadLetter
from tracker.runtime import service
from tracker.runtime.ops import Health, Metrics, Shutdown
from tracker.runtime.reduce import SOURCE_HEADER
from tracker.settings import KafkaSettings, Settings, SettingsError, load_settings
from tracker.shell import jsonio, kafka, watch_state
from tracker.shell.leader import Lease, LeaseConfig, LeaseElector, lead
from tracker.shell.watch import (
    EVENTS_APIS,
    ApiError,
    Change,
    CheckpointStore,
    JsonlCapture,
    KubeApi,
    Publisher,
    WatchCollector,
    WatchConfig,
    Watcher,
    WatchFatal,
    resources,
)
from tracker.shell.watch_state import KafkaCheckpoint

# what stops `tracker watch` with one "stopped by an error" line and exit code 1 (also inside task groups)
WATCH_FATAL: service.Errors = (*service.FATAL, WatchFatal, ApiError, ConfigException, sqlite3.Error)


def add_watch_command(subparsers: Any) -> None:
    """Add ``tracker watch`` to an ``argparse`` sub-parser collection."""
    d = WatchConfig()
    w = subparsers.add_parser("watch", help="list+watch Jobs, Pods, Events, Workloads, RayJobs and RayClusters; "
                                            "publish changes keyed by run id")
    w.add_argument("--kubeconfig", type=Path, help="default: the in-cluster service account, else ~/.kube/config")
    w.add_argument("--context", help="kubeconfig context (default: the current one)")
    w.add_argument("-n", "--namespace", dest="namespaces", action="append", default=[], metavar="NS",
                   help="watch only this namespace (repeatable; default: every namespace)")
    w.add_argument("--capture", type=Path, metavar="FILE",
                   help="append the changes as JSON lines (`tracker replay` reads them) instead of publishing to Kafka")
    w.add_argument("--checkpoint", type=Path, metavar="FILE",
                   help="local SQLite checkpoint to resume from after a restart (created if missing). Default: with "
                        "--lease-namespace and Kafka, the replicas share one checkpoint in the watch-state topic "
                        "(kafka.topics.watch_state), so a new leader resumes where the previous one stopped; "
                        "otherwise none (a restart lists again). Giving a FILE with a lease keeps one stale "
                        "checkpoint per replica")
    w.add_argument("--checkpoint-load-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="reading the shared checkpoint at the start of a leadership term, at most")
    w.add_argument("--events-api", choices=sorted(EVENTS_APIS), default=d.events_api,
                   help="which API to read Events from (both serve the same objects)")
    w.add_argument("--page-size", type=int, default=d.page_size, help="LIST page size")
    w.add_argument("--watch-timeout", type=int, default=d.watch_timeout_s, metavar="SECONDS",
                   help="server-side timeout of one watch request")
    w.add_argument("--read-timeout", type=float, default=d.read_timeout_s, metavar="SECONDS",
                   help="a watch connection silent for this long is dropped and resumed")
    w.add_argument("--max-held", type=int, default=d.max_held, help="records waiting for their owner, at most")
    w.add_argument("--checkpoint-interval", type=float, default=d.checkpoint_interval_s, metavar="SECONDS")
    le = w.add_argument_group("leader election (all three durations in seconds)")
    le.add_argument("--lease-namespace", help="elect a leader with a Lease in this namespace (the pod's own)")
    le.add_argument("--lease-name", default="tracker-watcher")
    le.add_argument("--identity", help="this replica's name in the Lease (default: host name and process id)")
    le.add_argument("--lease-duration", type=float, default=15.0)
    le.add_argument("--renew-deadline", type=float, default=10.0)
    le.add_argument("--retry-period", type=float, default=2.0)
    w.add_argument("--config", type=Path, help="settings file (YAML or JSON; also TRACKER_CONFIG_FILE)")
    w.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (also TRACKER_KAFKA__BOOTSTRAP_SERVERS)")
    w.add_argument("--metrics-port", type=int, help="serve /metrics, /healthz, /readyz on this port (0: any)")
    w.add_argument("--log-format", choices=["json", "console"])
    w.set_defaults(func=cmd_watch)


@dataclass(frozen=True, slots=True)
class WatchOptions:
    config: WatchConfig
    kubeconfig: Path | None = None
    context: str | None = None
    capture: Path | None = None
    checkpoint: Path | None = None
    lease: LeaseConfig | None = None
    checkpoint_load_timeout_s: float = 300.0


def cmd_watch(args: argparse.Namespace, console: Console) -> int:
    try:
        overrides = {section: {k: v for k, v in values.items() if v is not None} for section, values in {
            "kafka": {"bootstrap_servers": args.bootstrap_servers},
            "ops": {"metrics_port": args.metrics_port, "log_format": args.log_format}}.items()}
        settings = load_settings(args.config, {k: v for k, v in overrides.items() if v})
        if args.capture is None and not settings.kafka.enabled:
            raise SettingsError("`tracker watch` needs an output: --capture FILE, or Kafka (--bootstrap-servers or "
                                "TRACKER_KAFKA__BOOTSTRAP_SERVERS)")
        config = WatchConfig(namespaces=tuple(args.namespaces), events_api=args.events_api, page_size=args.page_size,
                             watch_timeout_s=args.watch_timeout, read_timeout_s=args.read_timeout,
                             max_held=args.max_held, checkpoint_interval_s=args.checkpoint_interval)
        if not args.checkpoint_load_timeout > 0:
            raise ValueError(f"--checkpoint-load-timeout must be positive, got {args.checkpoint_load_timeout}")
        lease = None
        if args.lease_namespace:
            lease = LeaseConfig(namespace=args.lease_namespace, name=args.lease_name,
                                identity=args.identity or f"{socket.gethostname()}-{os.getpid()}",
                                lease_duration_s=args.lease_duration, renew_deadline_s=args.renew_deadline,
                                retry_period_s=args.retry_period)
    except (SettingsError, ValueError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 2
    opts = WatchOptions(config=config, kubeconfig=args.kubeconfig, context=args.context, capture=args.capture,
                        checkpoint=args.checkpoint, lease=lease, checkpoint_load_timeout_s=args.checkpoint_load_timeout)
    return asyncio.run(service.run_process(settings, "watch", watch_body(settings, opts), fatal=WATCH_FATAL))


def watch_body(settings: Settings, opts: WatchOptions, into: Publisher | None = None) -> service.Body:
    """The watcher as a process body; ``into`` replaces the configured output (``tracker serve --watch``)."""
    async def body(metrics: Metrics, health: Health, shutdown: Shutdown) -> None:
        streams = len(resources(opts.config.events_api)) * max(1, len(opts.config.namespaces))
        async with await kube_client(opts.kubeconfig, opts.context, connections=streams + 8) as client, \
                _publisher(settings, opts.capture, into) as publisher:
            api = KubeApi(client, connect_timeout_s=opts.config.connect_timeout_s,
                          request_timeout_s=opts.config.request_timeout_s)
            collector = WatchCollector(standby=opts.lease is not None)
            metrics.registry.register(collector)
            health.register("watch", collector.ready)

            async def term(lease: Lease | None) -> None:
                watcher = Watcher(api, publisher, opts.config, checkpoint=checkpoint_store(settings, opts, into),
                                  leadership=lease)
                collector.watcher, collector.standby = watcher, False
                try:
                    await watcher.run(shutdown.requested)
                finally:
                    collector.watcher, collector.standby = None, opts.lease is not None

            if opts.lease is None:
                await term(None)
            else:
                await lead(LeaseElector(api, opts.lease), shutdown.requested, term)
    return body


def checkpoint_store(settings: Settings, opts: WatchOptions, into: Publisher | None = None
                     ) -> Path | CheckpointStore | None:
    """The checkpoint of one leadership term: ``--checkpoint FILE`` if given; else, for leader-elected replicas
    publishing to Kafka, the shared watch-state topic (a new store per term: its start fences the previous
    leader); else none."""
    if opts.checkpoint is not None:
        return opts.checkpoint
    if opts.lease is None or into is not None or opts.capture is not None or not settings.kafka.enabled:
        return None
    lease = opts.lease
    return KafkaCheckpoint(settings.kafka, scope=f"{lease.namespace}/{lease.name}",
                           transactional_id=watch_state.transactional_id(settings.kafka, lease.namespace, lease.name),
                           load_timeout_s=opts.checkpoint_load_timeout_s)


async def kube_client(kubeconfig: Path | None, context: str | None, *, connections: int) -> ApiClient:
    """An ApiClient from ``kubeconfig``; without one, the in-cluster service account, else ~/.kube/config."""
    cfg = Configuration()
    if kubeconfig is None:
        try:
            load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]  # untyped upstream
        except ConfigException:
            await load_kube_config(context=context, client_configuration=cfg)
    else:
        await load_kube_config(config_file=str(kubeconfig), context=context, client_configuration=cfg)
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize, connections)  # one connection per watch
    return ApiClient(cfg)


class KafkaPublisher:
    """Changes to the changes topic, keyed by run id, encoded as ``tracker serve`` encodes them, and dead letters
    to the dead-letters topic; at most ``max_in_flight`` unacknowledged. ``flush`` waits until every record sent
    so far is acknowledged."""

    def __init__(self, producer: AIOKafkaProducer, ks: KafkaSettings, max_in_flight: int) -> None:
        self.producer = producer
        self.ks = ks
        self.max_in_flight = max_in_flight
        self.in_flight: list[asyncio.Future[object]] = []

    async def publish(self, key: str, record: Change, source: str) -> None:
        value = jsonio.dumps(record)
        self.in_flight.append(await kafka.bounded(
            self.producer.send(self.ks.topics.changes, value=value, key=key.encode(),
                               headers=[(SOURCE_HEADER, source.encode())]),
            self.ks.call_timeout_s, "sending a change"))
        if len(self.in_flight) >= self.max_in_flight:
            await self.flush()

    async def dead_letter(self, letter: DeadLetter) -> None:
        self.in_flight.append(await kafka.bounded(
            self.producer.send(self.ks.topics.dead_letters, value=letter.model_dump_json().encode()),
            self.ks.call_timeout_s, "sending a dead letter"))
        if len(self.in_flight) >= self.max_in_flight:
            await self.flush()

    async def flush(self) -> None:
        pending, self.in_flight = self.in_flight, []
        if pending:
            await kafka.bounded(asyncio.gather(*pending), self.ks.call_timeout_s, "delivering changes")


@asynccontextmanager
async def _publisher(settings: Settings, capture: Path | None, into: Publisher | None = None
                     ) -> AsyncIterator[Publisher]:
    if into is not None:
        yield into
        return
    if capture is not None:
        sink = JsonlCapture(capture)
        try:
            yield sink
        finally:
            sink.close()
        return
    producer = kafka.make_producer(settings.kafka)
    await kafka.start(producer, settings.kafka, "changes producer")
    try:
        yield KafkaPublisher(producer, settings.kafka, settings.source.max_in_flight)
    finally:
        await kafka.stop(producer, settings.kafka, "changes producer")
