"""``tracker watch``: list+watch every run object and publish keyed changes to Kafka or a JSON-lines capture.

It runs as a service process (``tracker.runtime.service.run_process``: JSON logs, ``/metrics``, ``/healthz``,
``/readyz``, a graceful stop on SIGTERM that drains the outbox and writes a last checkpoint). Kafka settings come
from the same settings as the other service commands (``--bootstrap-servers``, ``TRACKER_KAFKA__*``, ``--config``);
records go to the changes topic keyed by run id, exactly as ``tracker serve`` publishes them.

With ``--lease-namespace``, replicas elect a leader through a ``coordination.k8s.io/v1`` Lease and only the leader
watches and publishes; a leader that loses the lease stops publishing at once and stands as a candidate again.
Without it, run exactly one replica.

Where the checkpoint lives (``checkpoint_store``): with a lease and Kafka (publishing to the changes topic), in the
compacted watch-state topic, shared by the replicas (``tracker.shell.watch.kafka_checkpoint``): every leadership
term resumes from the last checkpoint of whichever replica led before, and starting a term fences the previous
leader's saves.
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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio.config import ConfigException
from rich.console import Console
from rich.markup import escape

from tracker.runtime import service
from tracker.runtime.ops import Health, Metrics, Shutdown
from tracker.settings import LeaseSettings, Settings, SettingsError, WatchSettings, load_settings
from tracker.shell.changes import changes_producer
from tracker.shell.kube import ApiError, KubeApi, kube_client
from tracker.shell.leader import Lease, LeaseConfig, LeaseElector, lead
from tracker.shell.watch.checkpoint import CheckpointStore
from tracker.shell.watch.kafka_checkpoint import KafkaCheckpoint, transactional_id
from tracker.shell.watch.publish import JsonlCapture, Publisher
from tracker.shell.watch.resources import EVENTS_APIS, resources
from tracker.shell.watch.watcher import WatchCollector, Watcher

# what stops `tracker watch` with one "stopped_by_an_error" line and exit code 1 (also inside task groups)
WATCH_FATAL: service.Errors = (*service.FATAL, ApiError, ConfigException)


def add_watch_command(subparsers: Any) -> None:
    """Add ``tracker watch`` to an ``argparse`` sub-parser collection. A flag given overrides its setting
    (``watch.*``, ``lease.*``: ``TRACKER_WATCH__PAGE_SIZE``, the settings file...); defaults are the settings'."""
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
    d, dl = WatchSettings(), LeaseSettings()
    w.add_argument("--events-api", choices=sorted(EVENTS_APIS), default=d.events_api, action=_Given,
                   help="which API to read Events from (both serve the same objects)")
    w.add_argument("--page-size", type=int, default=d.page_size, action=_Given, help="LIST page size")
    w.add_argument("--watch-timeout", type=int, default=d.watch_timeout_s, action=_Given, metavar="SECONDS",
                   help="server-side timeout of one watch request")
    w.add_argument("--read-timeout", type=float, default=d.read_timeout_s, action=_Given, metavar="SECONDS",
                   help="a watch connection silent for this long is dropped and resumed")
    w.add_argument("--max-held", type=int, default=d.max_held, action=_Given,
                   help="records waiting for their owner, at most")
    w.add_argument("--checkpoint-interval", type=float, default=d.checkpoint_interval_s, action=_Given,
                   metavar="SECONDS", help="save the checkpoint (resourceVersions, held records) this often "
                                           "(default: %(default)s)")
    le = w.add_argument_group("leader election (all three durations in seconds)")
    le.add_argument("--lease-namespace", action=_Given,
                    help="elect a leader with a Lease in this namespace (the pod's own)")
    le.add_argument("--lease-name", default=dl.name, action=_Given,
                    help="name of the Lease; also the scope of the shared checkpoint, so watchers of two clusters "
                         "sharing Kafka need different names (default: %(default)s)")
    le.add_argument("--identity", action=_Given,
                    help="this replica's name in the Lease (default: host name and process id)")
    le.add_argument("--lease-duration", type=float, metavar="SECONDS", default=dl.lease_duration_s, action=_Given,
                    help="a standby takes the Lease over once it has seen it unrenewed this long "
                         "(default: %(default)s)")
    le.add_argument("--renew-deadline", type=float, metavar="SECONDS", default=dl.renew_deadline_s, action=_Given,
                    help="the leader stops publishing when it could not renew within this long; less than "
                         "--lease-duration (default: %(default)s)")
    le.add_argument("--retry-period", type=float, metavar="SECONDS", default=dl.retry_period_s, action=_Given,
                    help="time between two attempts to acquire or renew the Lease (default: %(default)s)")
    w.add_argument("--config", type=Path, help="settings file (YAML or JSON; also TRACKER_CONFIG_FILE)")
    w.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (also TRACKER_KAFKA__BOOTSTRAP_SERVERS)")
    w.add_argument("--metrics-port", type=int, help="serve /metrics, /healthz, /readyz on this port (0: any)")
    w.add_argument("--log-format", choices=["json", "console"],
                   help="log lines on stderr: json (one JSON object a line, the default; "
                        "ops.log_format) or console (for people)")
    w.set_defaults(func=cmd_watch)


class _Given(argparse.Action):
    """Stores a flag's value and notes that it was given: a given flag overrides its setting (``watch.*``,
    ``lease.*``), one not given leaves it to the environment, the settings file or the default."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.given = {*getattr(namespace, "given", ()), self.dest}


# flag dest -> (settings section, field)
_FLAG_SETTINGS = {
    "events_api": ("watch", "events_api"), "page_size": ("watch", "page_size"),
    "watch_timeout": ("watch", "watch_timeout_s"), "read_timeout": ("watch", "read_timeout_s"),
    "max_held": ("watch", "max_held"), "checkpoint_interval": ("watch", "checkpoint_interval_s"),
    "lease_namespace": ("lease", "namespace"), "lease_name": ("lease", "name"), "identity": ("lease", "identity"),
    "lease_duration": ("lease", "lease_duration_s"), "renew_deadline": ("lease", "renew_deadline_s"),
    "retry_period": ("lease", "retry_period_s"),
}


@dataclass(frozen=True, slots=True)
class WatchOptions:
    config: WatchSettings
    kubeconfig: Path | None = None
    context: str | None = None
    capture: Path | None = None
    checkpoint: Path | None = None
    lease: LeaseConfig | None = None
    checkpoint_load_timeout_s: float = 300.0


def cmd_watch(args: argparse.Namespace, console: Console) -> int:
    try:
        flags: dict[str, dict[str, Any]] = {
            "kafka": {"bootstrap_servers": args.bootstrap_servers},
            "ops": {"metrics_port": args.metrics_port, "log_format": args.log_format},
            "watch": {"namespaces": tuple(args.namespaces) or None}, "lease": {}}
        for dest in getattr(args, "given", ()):
            section, name = _FLAG_SETTINGS[dest]
            flags[section][name] = getattr(args, dest)
        overrides = {section: {k: v for k, v in values.items() if v is not None} for section, values in flags.items()}
        settings = load_settings(args.config, {k: v for k, v in overrides.items() if v})
        if args.capture is None and not settings.kafka.enabled:
            raise SettingsError("`tracker watch` needs an output: --capture FILE, or Kafka (--bootstrap-servers or "
                                "TRACKER_KAFKA__BOOTSTRAP_SERVERS)")
        config = settings.watch
        if not args.checkpoint_load_timeout > 0:
            raise ValueError(f"--checkpoint-load-timeout must be positive, got {args.checkpoint_load_timeout}")
        lease = lease_config(settings.lease)
    except (SettingsError, ValueError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 2
    opts = WatchOptions(config=config, kubeconfig=args.kubeconfig, context=args.context, capture=args.capture,
                        checkpoint=args.checkpoint, lease=lease, checkpoint_load_timeout_s=args.checkpoint_load_timeout)
    return asyncio.run(service.run_process(settings, "watch", body=watch_body(settings, opts), fatal=WATCH_FATAL))


def lease_config(ls: LeaseSettings) -> LeaseConfig | None:
    """This replica's election (``LeaseConfig`` checks the durations), or None without ``lease.namespace``."""
    if not ls.namespace:
        return None
    identity = ls.identity or f"{socket.gethostname()}-{os.getpid()}"
    return LeaseConfig(namespace=ls.namespace, name=ls.name, identity=identity, lease_duration_s=ls.lease_duration_s,
                       renew_deadline_s=ls.renew_deadline_s, retry_period_s=ls.retry_period_s)


def watch_body(settings: Settings, opts: WatchOptions, *, into: Publisher | None = None) -> service.Body:
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
                watcher = Watcher(api, publisher, opts.config, checkpoint=checkpoint_store(settings, opts, into=into),
                                  leadership=lease)
                collector.watcher, collector.standby = watcher, False
                try:
                    await watcher.run(shutdown.requested)
                finally:
                    collector.watcher, collector.standby = None, opts.lease is not None

            if opts.lease is None:
                await term(None)
            else:
                await lead(LeaseElector(api, opts.lease), shutdown.requested, body=term)
    return body


def checkpoint_store(settings: Settings, opts: WatchOptions, *, into: Publisher | None = None
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
                           transactional_id=transactional_id(settings.kafka, lease_namespace=lease.namespace,
                                                            lease_name=lease.name),
                           load_timeout_s=opts.checkpoint_load_timeout_s)


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
    async with changes_producer(ks=settings.kafka, source=settings.source) as out:
        yield out
