"""The settings of every process, one tree: environment (``TRACKER_`` prefix, ``__`` between levels), an optional
YAML/JSON file, flags. One section per concern: ``kafka`` (with ``topics``), ``reduce``, ``alerts``, ``sink``,
``index``, ``source``, ``embedded``, ``watch``, ``lease``, ``adx``, ``ops``. The reducer's limits
(``ReduceSettings.reducer_limits``) are built from here; the embedded pipeline's by ``tracker.runtime.service``
from ``embedded``.

This module is the layer just above ``tracker.core``: shell, runtime and cli import it; it imports only core (and
``tracker.settings.kafka``, the ``kafka`` section and its ``topics``, split off by size and re-exported here).

Precedence, highest first: command-line flags, environment variables, the settings file (``--config PATH`` or
``TRACKER_CONFIG_FILE``), the defaults below. Examples::

    TRACKER_KAFKA__BOOTSTRAP_SERVERS=broker-0:9093,broker-1:9093
    TRACKER_KAFKA__SECURITY_PROTOCOL=SASL_SSL
    TRACKER_KAFKA__SASL_MECHANISM=PLAIN
    TRACKER_KAFKA__SASL_USERNAME='$ConnectionString'        # Azure Event Hubs' Kafka endpoint
    TRACKER_KAFKA__SASL_PASSWORD='Endpoint=sb://...'         # a SecretStr: never logged or printed
    TRACKER_ALERTS__STALLED_ADMISSION_S=1800
    TRACKER_WATCH__PAGE_SIZE=250                             # or `tracker watch --page-size 250`
    TRACKER_ADX__CLUSTER_URI=https://<cluster>.<region>.kusto.windows.net
    TRACKER_ADX__CLIENT_SECRET=...                           # app-secret authentication: a SecretStr too

The ADX section's older names, ``TRACKER_ADX_<NAME>`` (one underscore), still work: one is used when its new name
is not set, and ``Settings.deprecated_env`` lists it (the processes log ``settings_deprecated_env`` for each).

Everything is validated when the process starts; ``load_settings`` raises ``SettingsError`` listing every bad
value by its dotted name. Every queue, timeout and retry the service uses is a setting here, with a default.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from tracker import errors
from tracker.core.curves import METRIC_POINTS_PER_RUN
from tracker.core.gpu import ACCELERATOR_RESOURCES
from tracker.core.limits import ReducerLimits
from tracker.core.model import Phase
from tracker.core.redact import secret_env, secret_fields, secret_values, validation_problems

# the Kafka section lives in tracker.settings.kafka (with the sections' base); re-exported
from tracker.settings.kafka import MIB as MIB
from tracker.settings.kafka import KafkaSettings as KafkaSettings
from tracker.settings.kafka import Section as _Section
from tracker.settings.kafka import TopicSettings as TopicSettings

CONFIG_FILE_ENV = "TRACKER_CONFIG_FILE"
DEAD_LETTER_FILE_BYTES = 64 * MIB  # an embedded index's dead-letter file is rotated when it reaches this size
DEAD_LETTER_FILES = 5  # the current file and the rotated ones kept: at most about 5 x 64 MiB
MAX_HELD = ReducerLimits().max_held  # records held until their owner is seen: the reducer's bound, everywhere


# an extended resource name (domain/name), or a prefix of one ending in * (at least the domain and the slash)
_EXTENDED_RESOURCE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?/([A-Za-z0-9][-A-Za-z0-9_.]*\*?|\*)")


class SettingsError(errors.ConfigError):
    """The settings are invalid; the message lists every problem."""


class ReduceSettings(_Section):
    group_id: str = Field(default="tracker-reduce", min_length=1)
    transactional_id_prefix: str = Field(
        default="tracker-reduce", min_length=1,
        description="One transactional producer per changes partition: <prefix>.<changes topic>.<partition>.")
    group_instance_id: str | None = Field(
        default=None, description="Static group membership: a restarted process gets its partitions back at once.")
    max_batch_records: int = Field(
        default=10_000, ge=1, le=100_000,
        description="Records fetched (and folded in one transaction) per poll, at most. Larger batches derive "
                    "each touched run once for more changes and commit fewer transactions (bench/kafka_pipeline.py: "
                    "+30-50% changes/s from 2,000 to 10,000, same end-to-end latency at 500 changes/s); a batch is "
                    "held in memory (~1 KB per change). At most max_dead_letters are taken (batch_records): every "
                    "record of a batch may be a dead letter, and each must be kept.")
    poll_timeout_ms: int = Field(default=200, ge=1, le=60_000)
    fetch_min_bytes: int = Field(
        default=256 * 1024, ge=1, le=64 * MIB,
        description="Kafka's fetch.min.bytes for the changes: the broker answers the reducer's fetch once it holds "
                    "this many bytes of changes, or after fetch_max_wait_ms. A transaction then folds more changes, "
                    "and a run they touch several times gets one history record, not several: less work for the "
                    "reducer and the sinks a change (bench/kafka_pipeline.py at 5,000 changes/s: CPU a change 152 "
                    "-> 108 us in the reducer, 131 -> 88 us in the index sink, p99 565-641 -> 489-511 ms), for up "
                    "to fetch_max_wait_ms more latency at low rates (p99 at 200 changes/s: 55-109 -> 150 ms). "
                    "1: the broker answers at the first byte.")
    fetch_max_wait_ms: int | None = Field(
        default=None, ge=0, le=10_000,
        description="Kafka's fetch.max.wait.ms for the changes: how long the broker may hold the reducer's fetch "
                    "while it has fewer than fetch_min_bytes; unset, kafka.fetch_max_wait_ms.")
    max_change_bytes: int = Field(default=int(1.5 * MIB), ge=1_024,
                                  description="A changes value larger than this is a dead letter (etcd's object "
                                              "limit is ~1.5 MiB).")
    max_held: int = Field(default=MAX_HELD, ge=1, description="Records held by the reducer until their owner is seen.")
    max_dead_letters: int = Field(default=10_000, ge=1, description="Dead letters kept between two commits.")
    max_retired: int = Field(default=1_000_000, ge=1, description="Finished runs remembered per partition.")
    retire_after_s: float = Field(
        default=3_600.0, ge=0,
        description="Event time a finished run stays in memory before it is retired, so that late records of "
                    "its other objects (pods, Events: their TTL is one hour) still fold into its history.")
    restore_timeout_s: float = Field(default=300.0, gt=0)
    max_retries: int = Field(default=8, ge=0, le=1_000,
                             description="Consecutive failed transactions or restores of one partition before exit.")
    retry_backoff_max_s: float = Field(default=10.0, gt=0, le=600)
    accelerator_resources: Annotated[tuple[str, ...], NoDecode] = Field(
        default=ACCELERATOR_RESOURCES, min_length=1,
        description="Extended resources counted as GPUs (schemas/gpu-accounting.md): names as in a container's "
                    "resources; a trailing * matches every resource starting with the rest (nvidia.com/mig-* counts "
                    "each MIG slice as one GPU). Comma-separated in the environment, or a JSON array. Every reducer "
                    "of a deployment (and each replay into one index) must use the same list.")
    metric_points_per_run: int = Field(
        default=METRIC_POINTS_PER_RUN, ge=0, le=10_000,
        description="Metric points kept per run over all its metrics, downsampled by step (schemas/index/README.md, "
                    "\"Metric points\"); 0 keeps none (the summaries stay). At most 10,000: a history (~150 bytes "
                    "a point) stays well within one Kafka message.")
    finished_derivation_rows: int = Field(
        default=64, ge=0, le=100_000,
        description="A finished run with at most this many pods and metric points together frees its derivation "
                    "(its last history and pod side, about 13 KiB of a narrow run's 23) once its history is written; "
                    "a late record of it (a pod deleted by the Job's TTL) first derives it again from its facts, "
                    "a cost that grows with its pods and points. A wider run keeps it until it retires. 0: only a run "
                    "without pods and points frees it (the memory of a tracker before it).")

    @field_validator("accelerator_resources", mode="before")
    @classmethod
    def _resource_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else [v.strip() for v in text.split(",") if v.strip()]
        return value

    @field_validator("accelerator_resources")
    @classmethod
    def _resource_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [v for v in value if not _EXTENDED_RESOURCE.fullmatch(v)]
        if bad:
            raise ValueError(f"not an extended resource name: {', '.join(map(repr, bad))} (a domain-prefixed name "
                             "such as nvidia.com/gpu, or a prefix of one ending in *, such as nvidia.com/mig-*)")
        return tuple(dict.fromkeys(value))

    @property
    def batch_records(self) -> int:
        """Records ``tracker reduce`` takes per poll: ``max_batch_records``, but never more than ``max_dead_letters``
        (a batch is folded and flushed as one transaction, and the reducer keeps that many dead letters until the
        flush: past it one would be counted but not kept)."""
        return min(self.max_batch_records, self.max_dead_letters)

    def reducer_limits(self, max_retired: int | None = None) -> ReducerLimits:
        """The reducer's bounds, retirement included (``tracker reduce`` and the embedded pipeline retire finished
        runs by one policy; only ``max_retired`` differs: see ``EmbeddedSettings.max_retired``)."""
        return ReducerLimits(max_held=self.max_held, max_dead_letters=self.max_dead_letters,
                             max_retired=self.max_retired if max_retired is None else max_retired,
                             retire_after_us=round(self.retire_after_s * 1_000_000),
                             accelerator_resources=self.accelerator_resources,
                             metric_points_per_run=self.metric_points_per_run,
                             finished_derivation_rows=self.finished_derivation_rows)


class AlertSettings(_Section):
    """Stuck runs (``tracker.core.stuck``): a live run in Admission, Scheduling or Runtime whose application has not
    started is alerted once per (run, attempt, phase) when its time in the phase reaches the phase's threshold."""

    stalled_admission_s: float = Field(default=1_800.0, gt=0,
                                       description="Alert when a run has waited this long for admission (phase "
                                                   "Admission: quota, backoff).")
    stuck_scheduling_s: float = Field(default=1_800.0, gt=0,
                                      description="Alert when a run has been this long in Scheduling (pods "
                                                  "unschedulable or not created).")
    stuck_runtime_s: float = Field(default=1_800.0, gt=0,
                                   description="Alert when a run has been this long in Runtime without its "
                                               "containers starting (image pulls, PodsReady waits).")
    clock: Literal["event", "wall"] = Field(
        default="event", description="event: the partition's latest transition time (deterministic; advances only "
                                     "with traffic); wall: this host's clock (also fires on a quiet partition).")
    metrics_clock: Literal["event", "wall"] = Field(
        default="wall", description="The clock of tracker_oldest_stuck_seconds (wall: the gauge grows while a "
                                    "partition is quiet); tracker_oldest_pending_admission_seconds keeps `clock`.")
    check_interval_s: float = Field(default=15.0, gt=0, description="How often the wall clock is checked.")

    def stuck_thresholds_s(self) -> dict[Phase, float]:
        """The alert threshold of each phase a run can be stuck in."""
        return {Phase.ADMISSION: self.stalled_admission_s, Phase.SCHEDULING: self.stuck_scheduling_s,
                Phase.RUNTIME: self.stuck_runtime_s}


class SinkSettings(_Section):
    index_path: Path | None = None
    index_group: str = Field(default="tracker-sink-index", min_length=1)
    group_instance_id: str | None = None
    max_batch_records: int = Field(default=2_000, ge=1, le=100_000)
    poll_timeout_ms: int = Field(default=200, ge=1, le=60_000)
    max_retries: int = Field(default=8, ge=0, le=1_000, description="Consecutive failed writes before exit.")
    retry_backoff_max_s: float = Field(default=10.0, gt=0, le=600)


class IndexSettings(_Section):
    """What an experiment index says about itself in its ``meta`` table (schemas/index/README.md), so that Stellar
    knows which cluster and workspace an index belongs to, and how long a writer waits for another."""

    cluster: str = Field(default="", description="The Kubernetes cluster the index's runs are from (meta key "
                                                 "cluster); default: adx.source_cluster, the name the ADX rows "
                                                 "carry in Cluster.")
    workspace: str = Field(default="", description="The workspace the index serves (meta key workspace), when it "
                                                   "serves one; each run's own is in runs.workspace.")
    writer_wait_s: float = Field(
        default=30.0, ge=0, le=86_400,
        description="One writer per index (<index>.writer.lock): how long a second writer (replay, demo, serve "
                    "without Kafka) waits for the one writing, saying so on stderr, before it stops with exit 75; "
                    "0 refuses at once. tracker sink index waits without a bound (a second sink stands by).")

    def identity(self, *, default_cluster: str = "") -> dict[str, str]:
        """The meta values a writer records (empty ones are not written); ``Settings.index_identity`` gives the
        cluster its default."""
        return {"cluster": self.cluster or default_cluster, "workspace": self.workspace}


class SourceSettings(_Section):
    max_held: int = Field(default=MAX_HELD, ge=1,
                          description="Records held by the run keyer until their owner is seen.")
    max_in_flight: int = Field(default=10_000, ge=1, description="Changes sent but not yet acknowledged.")
    max_retries: int = Field(default=8, ge=0, le=1_000, description="Failed deliveries in a row before giving up.")
    retry_backoff_max_s: float = Field(default=10.0, gt=0, le=600)


class EmbeddedSettings(_Section):
    max_retired: int = Field(
        default=100_000, ge=1,
        description="Retired runs the embedded reducer remembers (their late records are recognised); the index "
                    "remembers every retirement, so forgetting one never loses a history. Bounds memory at about "
                    "0.4 KiB per remembered run (bench/memory.py).")
    change_queue: int = Field(default=10_000, ge=1)
    history_queue: int = Field(default=64, ge=1)
    flush_every: int = Field(default=5_000, ge=1,
                             description="Records folded between two flushes at most (a live source also flushes "
                                         "whenever its input runs dry).")
    replay_flush_every: int = Field(
        default=20_000, ge=1,
        description="Records folded between two flushes when replaying capture files (which never wait for their "
                    "input): each run touched is derived and written once a batch, so larger batches replay faster "
                    "(bench/README.md) and hold more changed runs in memory at once.")
    dead_letter_file_bytes: int = Field(
        default=DEAD_LETTER_FILE_BYTES, ge=64 * 1024,
        description="<index>.dead-letters.jsonl is rotated (to .1, .2, ...) when it reaches this size.")
    dead_letter_files: int = Field(
        default=DEAD_LETTER_FILES, ge=1, le=1_000,
        description="Dead-letter files kept, the current one included; the letters of older ones are dropped "
                    "(counted: tracker_dead_letters_dropped_total).")


@dataclass(frozen=True, config=ConfigDict(extra="forbid", hide_input_in_errors=True))
class WatchSettings:
    """`tracker watch` (and `tracker serve --watch`): how the watcher talks to the apiserver and how much it may
    remember. Durations in seconds. A dataclass (``dataclasses.replace`` works on it); its flags: ``--namespace``,
    ``--events-api``, ``--page-size``, ``--watch-timeout``, ``--read-timeout``, ``--max-held``,
    ``--checkpoint-interval``."""

    namespaces: tuple[str, ...] = ()  # empty: cluster-wide (one stream per resource)
    events_api: str = "events.k8s.io/v1"  # or "v1": both serve the same Events, only one is watched
    page_size: int = Field(default=500, ge=1)  # LIST limit: bounds one response's memory
    watch_timeout_s: int = Field(default=240, ge=1)  # server-side timeoutSeconds: the apiserver ends the watch cleanly
    read_timeout_s: float = Field(default=90.0, gt=0)  # silence on a watch longer than this = dead connection
    connect_timeout_s: float = Field(default=10.0, gt=0)
    request_timeout_s: float = Field(default=60.0, gt=0)  # one LIST page or discovery request, in total
    backoff_base_s: float = Field(default=0.5, gt=0)  # reconnect backoff: doubles per failure, jittered, capped
    backoff_cap_s: float = Field(default=30.0, gt=0)
    unavailable_retry_cap_s: float = Field(default=300.0, gt=0)  # a missing CRD or forbidden resource: this rarely
    max_held: int = Field(default=MAX_HELD, ge=1)  # records waiting for their owner
    max_runs: int = Field(default=200_000, ge=1)  # runs whose owner bindings are kept (least recently seen forgotten)
    max_known: int = Field(default=1_000_000, ge=1)  # objects remembered per stream (resourceVersion and last state)
    outbox_size: int = Field(default=10_000, ge=1)  # records handled but not yet published
    checkpoint_interval_s: float = Field(default=2.0, gt=0)
    log_interval_s: float = Field(default=60.0, gt=0)  # one progress line per interval
    # Kueue's queues (tracker.core.queues): watch ClusterQueues and LocalQueues (read-only), and poll Kueue's
    # visibility API (visibility.kueue.x-k8s.io) for the positions of pending workloads where it is served
    queues: bool = True  # watch ClusterQueues and LocalQueues
    visibility: bool = True  # poll the visibility API where it is served (said once when it is not)
    visibility_interval_s: float = Field(default=30.0, ge=1.0)  # between two polls of the pending ClusterQueues
    visibility_timeout_s: float = Field(default=10.0, gt=0)  # one request to the visibility API, in total
    visibility_page_limit: int = Field(default=1_000, ge=1, le=100_000)  # pending workloads read per ClusterQueue
    visibility_max_cluster_queues: int = Field(default=200, ge=1)  # ClusterQueues polled per round (most pending)
    # Nodes (tracker.core.nodes): watch them (read-only, cluster-wide) for the GPU model and conditions of the nodes
    # runs ran on; where RBAC does not allow it the watcher says so once and goes on without them
    nodes: bool = True


LEASE_NAME = "tracker-watcher"
LEASE_DURATION_S = 15.0
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 2.0


class LeaseSettings(_Section):
    """Leader election of `tracker watch` replicas through a ``coordination.k8s.io/v1`` Lease (flags
    ``--lease-namespace``, ``--lease-name``, ``--identity``, ``--lease-duration``, ``--renew-deadline``,
    ``--retry-period``); checked as ``tracker.shell.leader.LeaseConfig`` when the watcher starts."""

    namespace: str | None = Field(default=None, description="Elect a leader with a Lease in this namespace (the "
                                                             "pod's own); none: no election, run one replica.")
    name: str = LEASE_NAME
    identity: str | None = Field(default=None, description="This replica's name in the Lease (default: host name "
                                                            "and process id).")
    lease_duration_s: float = LEASE_DURATION_S
    renew_deadline_s: float = RENEW_DEADLINE_S
    retry_period_s: float = RETRY_PERIOD_S


AuthMode = Literal["workload-identity", "managed-identity", "app-secret", "none"]


class AdxSettings(_Section):
    """The Azure Data Explorer sink (``tracker sink adx``), ``tracker kusto apply`` and the doctor's adx checks
    (``tracker.shell.adx``). No ``cluster_uri``: no ADX."""

    cluster_uri: str = Field("", description="Engine endpoint, e.g. https://<cluster>.<region>.kusto.windows.net.")
    ingest_uri: str = Field("", description="Data-management endpoint for queued ingestion (default: derived "
                                            "from cluster_uri by the SDK, the ingest- host).")
    database: str = Field("Metrics", description="Database holding the TauGrid tables and adx-mon's metrics.")
    auth: AuthMode = Field("workload-identity", description="workload-identity (AKS), managed-identity, "
                                                            "app-secret, or none (Kusto emulator / stand-in).")
    client_id: str = Field("", description="Client id: of the managed identity (user-assigned), of the app, or "
                                           "of the workload identity (default AZURE_CLIENT_ID).")
    tenant_id: str = Field("", description="Tenant of the app (app-secret) or workload identity.")
    client_secret: SecretStr | None = Field(None, description="App secret (app-secret auth). Never logged.")
    source_cluster: str = Field("", description="Name of the Kubernetes cluster watched, written to Cluster.")
    batch_max_rows: int = Field(2_000, ge=1, description="Rows per batch at most.")
    batch_max_bytes: int = Field(1 << 20, ge=1_024, le=4 << 20,
                                 description="Bytes of row JSON per batch at most (streaming takes 4 MiB).")
    batch_max_delay_s: float = Field(2.0, gt=0, description="Longest a queued row waits for its batch to fill.")
    queue_max_rows: int = Field(50_000, ge=1, description="Rows queued in memory before write() blocks.")
    retry_attempts: int = Field(4, ge=1, description="Attempts at a batch before it goes to the spool.")
    retry_initial_s: float = Field(0.5, gt=0, description="First backoff; doubles after each failure.")
    retry_max_s: float = Field(60.0, gt=0, description="Backoff cap, also between spool drain attempts.")
    ingest_timeout_s: float = Field(120.0, gt=0, description="Deadline of one ingestion call.")
    mgmt_timeout_s: float = Field(600.0, gt=0, description="Server timeout of one management command.")
    connect_timeout_s: float = Field(
        30.0, gt=0, le=600, description="Connect phase of `tracker kusto apply`: how long the cluster has to answer "
                                        "its first request (`.show version`, authentication included) before the "
                                        "apply gives up.")
    spool_dir: Path = Field(Path("out/adx-spool"), description="Where rows wait during an outage.")
    spool_max_bytes: int = Field(512 << 20, ge=1, description="Spool size at which write() starts to block.")
    memo_max_runs: int = Field(100_000, ge=1, description="Runs whose sent rows are remembered (LRU).")

    @model_validator(mode="after")
    def _auth_complete(self) -> AdxSettings:
        if self.auth == "app-secret" and not (self.client_id and self.tenant_id and self.client_secret):
            raise ValueError("auth app-secret needs client_id, tenant_id and client_secret")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.cluster_uri)


class OpsSettings(_Section):
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "console"] = "json"
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(default=None, ge=0, le=65_535,
                                     description="/metrics, /healthz, /readyz; none when unset.")
    http_timeout_s: float = Field(default=5.0, gt=0, description="Reading one HTTP request, at most.")
    metrics_interval_s: float = Field(default=5.0, gt=0, description="Refresh of lag and gauge metrics.")
    shutdown_timeout_s: float = Field(default=30.0, gt=0,
                                      description="Graceful shutdown budget; the process exits when it runs out.")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRACKER_", env_nested_delimiter="__", extra="forbid",
                                      frozen=True, nested_model_default_partial_update=True,
                                      hide_input_in_errors=True)

    kafka: KafkaSettings = KafkaSettings()
    reduce: ReduceSettings = ReduceSettings()
    alerts: AlertSettings = AlertSettings()
    sink: SinkSettings = SinkSettings()
    index: IndexSettings = IndexSettings()
    source: SourceSettings = SourceSettings()
    embedded: EmbeddedSettings = EmbeddedSettings()
    watch: WatchSettings = WatchSettings()
    lease: LeaseSettings = LeaseSettings()
    adx: AdxSettings = AdxSettings()
    ops: OpsSettings = OpsSettings()

    _deprecated_env: tuple[tuple[str, str], ...] = PrivateAttr(default=())

    @property
    def deprecated_env(self) -> tuple[tuple[str, str], ...]:
        """(old name, new name) of each deprecated environment variable these settings were read from."""
        return self._deprecated_env

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _DeprecatedEnvSource(settings_cls), _FileSource(settings_cls)


SECRET_FIELDS = secret_fields(Settings)
_FILE_DATA: ContextVar[Mapping[str, Any] | None] = ContextVar("tracker_settings_file", default=None)


class _FileSource(PydanticBaseSettingsSource):
    """The settings file read by ``load_settings`` (lowest precedence above the defaults)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return (_FILE_DATA.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_DATA.get() or {})


# sections whose variables had names of their own before the tree: TRACKER_ADX_<NAME> is now TRACKER_ADX__<NAME>
_DEPRECATED_PREFIXES = {"adx": "TRACKER_ADX_"}


def deprecated_env(environ: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(section, field, old variable name) of every deprecated variable set in ``environ`` whose new name
    (``TRACKER_<SECTION>__<FIELD>``) is not: the ones to read, and to warn about. Names match in any case."""
    names = {k.upper(): k for k in environ}
    found = []
    for section, prefix in _DEPRECATED_PREFIXES.items():
        model = Settings.model_fields[section].annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for field in model.model_fields:
            old, new = f"{prefix}{field.upper()}", f"TRACKER_{section.upper()}__{field.upper()}"
            if old in names and new not in names:
                found.append((section, field, names[old]))
    return found


class _DeprecatedEnvSource(PydanticBaseSettingsSource):
    """The deprecated variables (``deprecated_env``), below the environment and above the settings file."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self().get(field_name), field_name, True

    def __call__(self) -> dict[str, Any]:
        data: dict[str, dict[str, str]] = {}
        for section, field, old in deprecated_env(os.environ):
            data.setdefault(section, {})[field] = os.environ[old]
        return data


def load_settings(config_file: Path | None = None, overrides: Mapping[str, Any] | None = None) -> Settings:
    """Settings from flags (``overrides``, nested dicts), the environment and the settings file."""
    path = config_file or (Path(os.environ[CONFIG_FILE_ENV]) if os.environ.get(CONFIG_FILE_ENV) else None)
    data = _read_file(path) if path is not None else None
    token = _FILE_DATA.set(data)
    try:
        settings = Settings(**dict(overrides or {}))
    except ValidationError as exc:
        where = f" (settings file {path})" if path is not None else ""
        # a message names the field, never a secret's value (whatever pydantic said about it)
        secrets = [*secret_values(data, SECRET_FIELDS), *secret_values(overrides, SECRET_FIELDS),
                   *secret_env(os.environ, "TRACKER_", SECRET_FIELDS)]
        problems = validation_problems(exc.errors(include_input=False, include_url=False), SECRET_FIELDS, secrets)
        # one line (a log collector keeps it whole): every problem, then where the settings come from
        raise SettingsError(f"invalid settings{where}: " + "; ".join(" ".join(p.split()) for p in problems)
                            + " (environment variables are TRACKER_<SECTION>__<NAME>)") from None
    finally:
        _FILE_DATA.reset(token)
    settings._deprecated_env = tuple((old, f"TRACKER_{section.upper()}__{field.upper()}")
                                     for section, field, old in deprecated_env(os.environ))
    return settings


def _read_file(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"cannot read settings file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise SettingsError(f"settings file {path} is not UTF-8 text (byte {exc.start})") from None
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=_NoAliasLoader)
    except _AliasFound as exc:
        raise SettingsError(f"settings file {path} uses YAML anchors or aliases ({exc}): a settings file needs "
                            "none, write each value out") from None
    except json.JSONDecodeError as exc:
        raise SettingsError(f"settings file {path} is not valid JSON: {exc.msg} at line {exc.lineno}, "
                            f"column {exc.colno}") from None
    except (ValueError, yaml.YAMLError) as exc:
        raise SettingsError(f"settings file {path} is not valid {kind}: {yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"settings file {path} must hold a mapping of sections, got {type(data).__name__}")
    return data


class _AliasFound(Exception):
    """A YAML anchor or alias, found before any alias is expanded."""


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` refusing anchors and aliases (``_AliasFound``): a nest of aliases ("billion laughs") takes
    the composer minutes and gigabytes; a settings file has no need of them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            mark = event.start_mark
            raise _AliasFound(f"line {mark.line + 1}, column {mark.column + 1}")
        return super().compose_node(parent, index)


def yaml_problem(exc: BaseException) -> str:
    """What a YAML error says, without the text it quotes: the offending line is never shown (it may hold a
    secret), and quoted words longer than two characters (an alias, a tag, a token) are elided."""
    if isinstance(exc, yaml.MarkedYAMLError):
        problem = exc.problem or exc.context or "syntax error"
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    else:
        problem, where = type(exc).__name__, ""
    return _QUOTED.sub(lambda m: m.group() if len(m.group()) <= 4 else f"{m.group()[0]}...{m.group()[0]}",
                       problem) + where


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def redacted(settings: Settings, *, changed_only: bool = False) -> dict[str, Any]:
    """The settings as JSON-ready data for a start-up log line; secrets show as '**********'. ``changed_only``: only
    the values that differ from the defaults (what the operator set), the start-up line at INFO; the whole tree is
    for DEBUG (about 3.5 KB: too much for every start)."""
    data: dict[str, Any] = json.loads(settings.model_dump_json(exclude_defaults=changed_only))
    return data
