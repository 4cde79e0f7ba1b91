"""The ``kafka`` section of the settings (``KafkaSettings``, with its ``topics``: ``TopicSettings``), and the base of
every section (``Section``: unknown keys refused, values frozen, secrets kept out of error messages).

A part of ``tracker.settings`` (split off by size), which re-exports every name here: import them from there. Same
layer: it imports only pydantic and the standard library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

MIB = 1024 * 1024


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


class TopicSettings(Section):
    """Names and layout of the tracker's topics (see deploy/kafka/topics.md)."""

    changes: str = Field(default="taugrid.tracker.changes", min_length=1, max_length=249)
    transitions: str = Field(default="taugrid.tracker.transitions", min_length=1, max_length=249)
    run_state: str = Field(default="taugrid.tracker.run-state", min_length=1, max_length=249)
    dead_letters: str = Field(default="taugrid.tracker.dead-letters", min_length=1, max_length=249)
    alerts: str = Field(default="taugrid.tracker.alerts", min_length=1, max_length=249)
    watch_state: str | None = Field(
        default=None, min_length=1, max_length=249,
        description="Compacted topic of the leader-elected watcher's shared checkpoint. Default: beside the "
                    "changes topic, its name with the trailing 'changes' replaced by 'watch-state' "
                    "(taugrid.tracker.watch-state for the default names), so that renaming the topics of a "
                    "deployment renames this one too.")
    partitions: int = Field(default=12, ge=1, le=1024,
                            description="Partitions of changes, transitions and run-state (always equal).")
    side_partitions: int = Field(default=3, ge=1, le=1024, description="Partitions of dead-letters and alerts.")
    replication_factor: int = Field(default=3, ge=1, le=16)
    changes_retention_ms: int = Field(default=7 * 24 * 3_600_000, ge=3_600_000)
    side_retention_ms: int = Field(default=30 * 24 * 3_600_000, ge=3_600_000,
                                   description="Retention of dead-letters and alerts.")
    transitions_min_compaction_lag_ms: int = Field(
        default=24 * 3_600_000, ge=0, description="How long every intermediate history stays before compaction.")
    max_message_bytes: int = Field(default=4 * MIB, ge=MIB, le=64 * MIB,
                                   description="Topic max.message.bytes, and the producers' max request size.")

    @model_validator(mode="after")
    def _distinct(self) -> TopicSettings:
        names = [self.changes, self.transitions, self.run_state, self.dead_letters, self.alerts, self.watch_state_topic]
        if len(set(names)) != len(names):
            raise ValueError(f"topic names must be distinct, got {names}")
        if len(self.watch_state_topic) > 249:
            raise ValueError(f"watch_state: the name derived from the changes topic is too long: "
                             f"{self.watch_state_topic}")
        return self

    @property
    def watch_state_topic(self) -> str:
        """The watch-state topic's name: ``watch_state``, or derived from the changes topic's name."""
        if self.watch_state is not None:
            return self.watch_state
        stem = self.changes.removesuffix("changes") if self.changes.endswith("changes") else f"{self.changes}."
        return f"{stem}watch-state"

    def name(self, role: str) -> str:
        """The topic name of a role (a field naming a topic: changes, ..., watch_state)."""
        return self.watch_state_topic if role == "watch_state" else str(getattr(self, role))


class KafkaSettings(Section):
    """Connection, security and client limits. No bootstrap servers means: no Kafka (embedded bus)."""

    bootstrap_servers: str | None = Field(default=None, description="host:port[,host:port...]")
    client_id: str = "tracker"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    oauth_scope: str | None = Field(
        default=None, description="OAUTHBEARER: token scope requested through azure-identity, "
                                  "e.g. https://<namespace>.servicebus.windows.net/.default")
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    ssl_check_hostname: bool = True
    request_timeout_ms: int = Field(default=30_000, ge=1_000, le=600_000)
    call_timeout_s: float = Field(default=60.0, gt=0, le=3_600,
                                  description="Upper bound on any one client call (start, commit, admin...).")
    retry_backoff_ms: int = Field(default=200, ge=10, le=60_000)
    metadata_max_age_ms: int = Field(default=180_000, ge=1_000)
    connections_max_idle_ms: int = Field(default=180_000, ge=1_000,
                                         description="Below Azure Event Hubs' 240 s idle disconnect.")
    session_timeout_ms: int = Field(default=10_000, ge=1_000, le=1_800_000)
    heartbeat_interval_ms: int = Field(default=3_000, ge=100)
    max_poll_interval_ms: int = Field(default=300_000, ge=1_000)
    transaction_timeout_ms: int = Field(default=60_000, ge=1_000, le=900_000)
    linger_ms: int = Field(default=5, ge=0, le=10_000,
                           description="Batching delay of the changes producers (watcher, intake); the reducer's "
                                       "transactional producers never linger.")
    batch_bytes: int = Field(default=MIB, ge=16_384, le=64 * MIB,
                             description="Producer batch size per partition: a transaction's records to one "
                                         "partition travel in one request instead of one by one.")
    fetch_max_wait_ms: int = Field(default=100, ge=0, le=10_000)
    topics: TopicSettings = TopicSettings()

    @model_validator(mode="after")
    def _security(self) -> KafkaSettings:
        for server in (self.bootstrap_servers or "").split(","):
            host, sep, port = server.strip().rpartition(":")
            if server.strip() and not (sep and host and port.isdigit() and 0 < int(port) < 65536):
                raise ValueError(f"bootstrap_servers: {server.strip()!r} is not host:port (a port from 1 to 65535; "
                                 "several are separated by commas)")
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and self.sasl_mechanism is None:
            raise ValueError(f"security_protocol {self.security_protocol} needs sasl_mechanism")
        if not sasl and self.sasl_mechanism is not None:
            raise ValueError(f"sasl_mechanism is set but security_protocol is {self.security_protocol}")
        if self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and (
                not self.sasl_username or self.sasl_password is None):
            raise ValueError(f"SASL {self.sasl_mechanism} needs sasl_username and sasl_password")
        if self.sasl_mechanism == "OAUTHBEARER" and not self.oauth_scope:
            raise ValueError("SASL OAUTHBEARER needs oauth_scope (the token is obtained with azure-identity)")
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: no such file: {path}")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together (client certificate authentication)")
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be at most a third of session_timeout_ms")
        if self.batch_bytes > self.topics.max_message_bytes:
            raise ValueError("batch_bytes must not exceed topics.max_message_bytes (a batch is one broker message)")
        if self.request_timeout_ms > self.call_timeout_s * 1000:
            raise ValueError("request_timeout_ms must not exceed call_timeout_s")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.bootstrap_servers)
