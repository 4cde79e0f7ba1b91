"""Kafka clients for the tracker (aiokafka): security options, producers, consumers and topic administration.

Every producer is idempotent with ``acks=all``; the reducer's are transactional. Every call the service makes
through these helpers is bounded by ``KafkaSettings.call_timeout_s`` (``bounded``), because several aiokafka
calls otherwise retry without end (a producer's ``start`` waits for a producer id forever, for one).

Security: ``PLAINTEXT``, ``SSL`` (CA file, optional client certificate), ``SASL_PLAINTEXT`` / ``SASL_SSL`` with
PLAIN or SCRAM, and ``OAUTHBEARER`` with a token from azure-identity. Azure Event Hubs' Kafka endpoint takes
``SASL_SSL`` + ``PLAIN`` with the user name ``$ConnectionString`` and the namespace connection string as the
password (see deploy/kafka/topics.md). A client that cannot bootstrap says why (``start``): refused SASL
credentials and untrusted broker certificates raise ``KafkaSecurityError`` at once, which is not retried; TLS
files that do not load (a wrong ``ssl_key_password``, say) are a ValueError. tests/kafka/test_kafka_security.py runs
all of these, OAUTHBEARER excepted, against a real broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.abc import AbstractTokenProvider, ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    IllegalSaslStateError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
    for_code,
)
from aiokafka.helpers import create_ssl_context

from tracker import errors
from tracker.settings import KafkaSettings, TopicSettings

T = TypeVar("T")
log = structlog.get_logger("tracker.kafka")



class KafkaCallTimeout(errors.Retryable, TimeoutError):
    """A Kafka call did not finish within ``call_timeout_s``."""


class KafkaSecurityError(errors.Fatal, KafkaError):  # type: ignore[misc]  # aiokafka is untyped
    """The broker refused this client's credentials (SASL), or TLS failed on a certificate: a configuration error,
    which ``retrying`` does not retry."""

    retriable = False


class TopicLayoutError(errors.Fatal, RuntimeError):
    """The topics are missing or laid out differently from what the tracker needs."""


async def bounded(call: Awaitable[T], seconds: float, *, what: str) -> T:
    """Await ``call`` for at most ``seconds``; raise KafkaCallTimeout naming ``what`` otherwise."""
    try:
        async with asyncio.timeout(seconds):
            return await call
    except TimeoutError as exc:
        raise KafkaCallTimeout(f"{what} did not finish within {seconds:g}s") from exc


def backoff_s(attempt: int, cap_s: float) -> float:
    """The wait before retry number ``attempt`` (1, 2, ...): 0.2 s doubling each time, at most ``cap_s``."""
    return float(min(cap_s, 0.2 * 2 ** (attempt - 1)))


async def retrying(what: str, attempt: Callable[[], Awaitable[T]], *, retries: int, backoff_max_s: float,
                   stop: asyncio.Event | None = None) -> T | None:
    """``attempt()``, tried again after Kafka errors and timeouts with exponential backoff, ``retries`` times at
    most (errors of the tracker's own, such as a wrong topic layout, and refused credentials or certificates,
    KafkaSecurityError, are not retried). ``stop``: once it is set (a SIGTERM while Kafka does not answer), the
    attempt in flight is cancelled (``start`` closes the client it was starting) and the result is None."""
    if stop is None:
        return await _retrying(what, attempt, retries=retries, backoff_max_s=backoff_max_s)
    return await unless_set(stop, _retrying(what, attempt, retries=retries, backoff_max_s=backoff_max_s))


async def unless_set(stop: asyncio.Event, call: Awaitable[T]) -> T | None:
    """``call``'s result, or None if ``stop`` is set first (``call`` is then cancelled and awaited)."""
    task = asyncio.ensure_future(call)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        waiter.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


async def _retrying(what: str, attempt: Callable[[], Awaitable[T]], *, retries: int, backoff_max_s: float) -> T:
    tries = 0
    while True:
        tries += 1
        try:
            return await attempt()
        except KafkaSecurityError:
            raise
        except (KafkaError, TimeoutError, OSError) as exc:
            if tries > retries:
                raise
            delay = backoff_s(tries, backoff_max_s)
            log.warning("kafka_call_retrying", call=what, attempt=tries, retry_in_s=delay, error=repr(exc))
            await asyncio.sleep(delay)


# ------------------------------------------------------------------------------------------ clients


class AzureTokenProvider(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka is untyped
    """SASL OAUTHBEARER tokens from azure-identity's DefaultAzureCredential, reused until shortly before expiry."""

    _REFRESH_MARGIN_S = 300

    def __init__(self, scope: str, timeout_s: float) -> None:
        self.scope = scope
        self.timeout_s = timeout_s
        self._token: tuple[str, float] | None = None

    async def token(self) -> str:
        if self._token is None or self._token[1] - self._REFRESH_MARGIN_S < time.time():
            from azure.identity.aio import DefaultAzureCredential

            async with DefaultAzureCredential() as credential:
                access = await bounded(credential.get_token(self.scope), self.timeout_s,
                                       what="azure-identity get_token")
            self._token = (access.token, float(access.expires_on))
        return self._token[0]


def client_options(ks: KafkaSettings) -> dict[str, Any]:
    """Options every aiokafka client (producer, consumer, admin) of the tracker takes."""
    if not ks.bootstrap_servers:
        raise errors.ConfigError("no Kafka bootstrap servers configured (TRACKER_KAFKA__BOOTSTRAP_SERVERS)")
    opts: dict[str, Any] = {
        "bootstrap_servers": [s.strip() for s in ks.bootstrap_servers.split(",") if s.strip()],
        "client_id": ks.client_id,
        "request_timeout_ms": ks.request_timeout_ms,
        "retry_backoff_ms": ks.retry_backoff_ms,
        "metadata_max_age_ms": ks.metadata_max_age_ms,
        "connections_max_idle_ms": ks.connections_max_idle_ms,
        "security_protocol": ks.security_protocol,
    }
    if ks.security_protocol in ("SSL", "SASL_SSL"):
        opts["ssl_context"] = _ssl_context(ks)
    if ks.sasl_mechanism is not None:
        opts["sasl_mechanism"] = ks.sasl_mechanism
        if ks.sasl_mechanism == "OAUTHBEARER":
            assert ks.oauth_scope is not None  # validated by KafkaSettings
            opts["sasl_oauth_token_provider"] = AzureTokenProvider(ks.oauth_scope, ks.call_timeout_s)
        else:
            assert ks.sasl_password is not None  # validated by KafkaSettings
            opts["sasl_plain_username"] = ks.sasl_username
            opts["sasl_plain_password"] = ks.sasl_password.get_secret_value()
    return opts


def _ssl_context(ks: KafkaSettings) -> ssl.SSLContext:
    """The TLS context of ``ks``; ConfigError saying which file does not load (never retried: a setting is wrong).
    A key without ``ssl_key_password`` is loaded with an empty password: for an encrypted key OpenSSL would
    otherwise ask for one on the terminal, which blocks an interactive command."""
    try:
        ctx: ssl.SSLContext = create_ssl_context(cafile=ks.ssl_cafile)
    except (ssl.SSLError, OSError) as exc:
        raise errors.ConfigError(
            f"kafka.ssl_cafile {ks.ssl_cafile} does not load as PEM CA certificates: {exc}") from exc
    if ks.ssl_certfile is not None:
        password = ks.ssl_key_password.get_secret_value() if ks.ssl_key_password else ""
        try:
            ctx.load_cert_chain(ks.ssl_certfile, ks.ssl_keyfile, password)
        except (ssl.SSLError, OSError) as exc:
            encrypted = ks.ssl_keyfile is not None and b"ENCRYPTED" in _head(ks.ssl_keyfile)
            why = (("it is encrypted and kafka.ssl_key_password is not set" if ks.ssl_key_password is None else
                    "kafka.ssl_key_password does not decrypt it") if encrypted else
                   "is it the PEM key of that certificate?")
            raise errors.ConfigError(f"the client certificate kafka.ssl_certfile {ks.ssl_certfile} with "
                                     f"kafka.ssl_keyfile {ks.ssl_keyfile} does not load: {why} ({exc})") from exc
    ctx.check_hostname = ks.ssl_check_hostname
    return ctx


def _head(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(1 << 20)
    except OSError:
        return b""


def make_producer(ks: KafkaSettings, transactional_id: str | None = None) -> AIOKafkaProducer:
    """An idempotent producer with acks=all (transactional when ``transactional_id`` is given)."""
    return AIOKafkaProducer(
        **client_options(ks),
        acks="all",
        enable_idempotence=True,
        transactional_id=transactional_id,
        transaction_timeout_ms=ks.transaction_timeout_ms,
        max_request_size=ks.topics.max_message_bytes,
        max_batch_size=ks.batch_bytes,
        # a transaction's records go out when it commits: lingering would only delay every commit
        # (bench/kafka_pipeline.py: end-to-end p50 22 -> 11 ms at 50 changes/s, same throughput)
        linger_ms=0 if transactional_id else ks.linger_ms,
        compression_type=None,
    )


def make_consumer(ks: KafkaSettings, *, group_id: str | None, group_instance_id: str | None = None,
                  max_poll_records: int = 1_000, fetch_min_bytes: int = 1,
                  fetch_max_wait_ms: int | None = None) -> AIOKafkaConsumer:
    """A read_committed consumer without auto-commit; offsets are the caller's business. The broker answers a
    fetch once it holds ``fetch_min_bytes`` for it, or after ``fetch_max_wait_ms`` (``ks.fetch_max_wait_ms`` by
    default): Kafka's fetch.min.bytes and fetch.max.wait.ms."""
    group: dict[str, Any] = {}
    if group_id is not None:
        group = {"group_id": group_id, "group_instance_id": group_instance_id,
                 "session_timeout_ms": ks.session_timeout_ms, "heartbeat_interval_ms": ks.heartbeat_interval_ms,
                 "max_poll_interval_ms": ks.max_poll_interval_ms}
    return AIOKafkaConsumer(
        **client_options(ks),
        **group,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=max_poll_records,
        fetch_min_bytes=fetch_min_bytes,
        fetch_max_wait_ms=ks.fetch_max_wait_ms if fetch_max_wait_ms is None else fetch_max_wait_ms,
        max_partition_fetch_bytes=ks.topics.max_message_bytes,
        fetch_max_bytes=max(ks.topics.max_message_bytes * 4, 50 * 1024 * 1024),
    )


async def start(client: AIOKafkaProducer | AIOKafkaConsumer | AIOKafkaAdminClient, ks: KafkaSettings,
                *, what: str) -> None:
    """Start a client within the call timeout; on failure it is closed again and the error raised.

    aiokafka reports a failed bootstrap as "Unable to bootstrap from [...]" whatever the cause (it only logs the
    cause): the cause is then found by connecting once more, within what is left of the call timeout, and raised
    instead: KafkaSecurityError for refused credentials and certificate failures, otherwise KafkaConnectionError
    naming the cause."""
    deadline = time.monotonic() + ks.call_timeout_s
    try:
        await bounded(client.start(), ks.call_timeout_s, what=f"starting the {what}")
    except KafkaConnectionError as exc:
        await stop(client, ks, what=what)
        cause = await _bootstrap_failure(ks, f"starting the {what}", deadline - time.monotonic())
        if cause is None:
            raise
        raise cause from exc
    except BaseException:
        await stop(client, ks, what=what)
        raise


_REFUSED = (SaslAuthenticationFailed, AuthenticationFailedError, IllegalSaslStateError)
_CERTIFICATE_ALERTS = ("ALERT_BAD_CERT", "ALERT_CERTIFICATE", "ALERT_UNKNOWN_CA")  # a broker refusing our certificate


async def _bootstrap_failure(ks: KafkaSettings, what: str, seconds: float) -> KafkaError | None:
    """Why no bootstrap server can be used: one connection attempt per server (TLS, SASL, version lookup), all
    within ``seconds``; None when one succeeds or the time runs out."""
    opts = client_options(ks)
    keys = ("client_id", "request_timeout_ms", "ssl_context", "security_protocol", "sasl_mechanism",
            "sasl_plain_username", "sasl_plain_password", "sasl_oauth_token_provider")
    conn_opts = {k: opts[k] for k in keys if k in opts}
    causes = []
    try:
        async with asyncio.timeout(seconds):
            for server in opts["bootstrap_servers"]:
                host, _, port = server.rpartition(":")
                try:
                    conn = await create_conn(host.strip("[]"), int(port), **conn_opts)
                    conn.close()
                    return None
                except UnsupportedSaslMechanismError as err:
                    return KafkaSecurityError(f"{what}: {server} does not offer the SASL mechanism "
                                              f"{ks.sasl_mechanism} ({err}; check kafka.sasl_mechanism)")
                except _REFUSED as err:
                    return KafkaSecurityError(f"{what}: {server} refused the SASL {ks.sasl_mechanism} authentication "
                                              f"as {ks.sasl_username or 'the token of oauth_scope'}: {err} (check "
                                              "kafka.sasl_mechanism, sasl_username and sasl_password)")
                except ssl.SSLCertVerificationError as err:
                    return KafkaSecurityError(f"{what}: the TLS certificate of {server} is not trusted: "
                                              f"{err.verify_message} (check kafka.ssl_cafile and ssl_check_hostname)")
                except ssl.SSLError as err:
                    if any(alert in (err.reason or "") for alert in _CERTIFICATE_ALERTS):
                        return KafkaSecurityError(f"{what}: {server} refused this client's certificate: {err} (check "
                                                  "kafka.ssl_certfile and ssl_keyfile)")
                    causes.append(f"{server}: {err}")
                except Exception as err:  # OSError, KafkaError; an OAUTHBEARER token provider's own errors
                    causes.append(f"{server}: {err or type(err).__name__}")
    except TimeoutError:
        return None
    hint = (" (a broker that requires a client certificate closes the connection: check kafka.ssl_certfile and "
            "ssl_keyfile)" if ks.security_protocol == "SSL" and ks.ssl_certfile is None else "")
    return KafkaConnectionError(f"{what}: no bootstrap server answered: {'; '.join(causes)}{hint}")


async def stop(client: AIOKafkaProducer | AIOKafkaConsumer | AIOKafkaAdminClient, ks: KafkaSettings,
               *, what: str) -> None:
    """Stop a client within the call timeout; errors are logged, not raised (the client is being dropped)."""
    try:
        close = client.close() if isinstance(client, AIOKafkaAdminClient) else client.stop()
        await bounded(close, ks.call_timeout_s, what=f"stopping the {what}")
    except (KafkaError, OSError, TimeoutError) as exc:
        log.warning("client_stop_unclean", client=what, error=str(exc))


# ------------------------------------------------------------------------------------------ reading


async def read_to_end(consumer: AIOKafkaConsumer, tp: TopicPartition, *, ks: KafkaSettings,
                      timeout_s: float) -> dict[bytes, bytes | None]:
    """The latest value per key of one partition, read from the beginning to its end (read_committed: the last
    stable offset), in the order of those latest writes. ``consumer`` must have no group; it is left assigned to
    ``tp``. The last stable offset is complete here only because the caller first started the partition's
    transactional producer: that fences the previous owner and waits for its last transaction's markers."""
    consumer.assign([tp])
    end = (await bounded(consumer.end_offsets([tp]), ks.call_timeout_s, what=f"end offset of {tp}"))[tp]
    await bounded(consumer.seek_to_beginning(tp), ks.call_timeout_s, what=f"beginning of {tp}")
    latest: dict[bytes, bytes | None] = {}
    async with asyncio.timeout(timeout_s):
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=500, max_records=10_000)
            for rec in batch.get(tp, ()):
                if rec.offset >= end:
                    break
                if rec.key is not None:
                    latest.pop(rec.key, None)  # keep the order of the latest writes
                    latest[rec.key] = rec.value
    return latest


async def drain_targets(ks: KafkaSettings, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
    """The offsets a drain must reach: each partition's high watermark, read by a short-lived read_uncommitted
    client. Not the read_committed end (the last stable offset): a transaction's commit returns before the
    coordinator has written its markers to the partitions, so right after a commit the last stable offset can
    still sit before that transaction (measured: 2 times in 3 on the test broker), and a drain to it would stop
    one transaction short. A read_committed position reaches the high watermark once every transaction below
    it has ended (aborted records and markers are stepped over)."""
    tps = sorted(tps)
    if not tps:
        return {}
    client = AIOKafkaConsumer(**client_options(ks), isolation_level="read_uncommitted", enable_auto_commit=False)
    await start(client, ks, what="high-watermark reader")
    try:
        ends: dict[TopicPartition, int] = await bounded(client.end_offsets(tps), ks.call_timeout_s,
                                                        what="high watermarks")
        return ends
    finally:
        await stop(client, ks, what="high-watermark reader")


class Drain:
    """When a group consumer's loop must stop. ``request(drain=False)``: after the batch in hand;
    ``request(drain=True)``: once it has joined its group and caught up with the drain targets
    (``drain_targets``) of its assignment, computed when the drain starts and again whenever the assignment moved
    since (a rebalance while draining, which topics created at start make likely, must not leave a partition
    undrained)."""

    def __init__(self) -> None:
        self.requested: Literal["now", "drain"] | None = None
        self.targets: dict[TopicPartition, int] | None = None
        # ends a wait for Kafka at start (``retrying(stop=)``): set by a request to stop now, or by ``give_up``
        # (a signal to a process that drains on its way out); a drain alone connects, to catch up
        self.give_up_connecting = asyncio.Event()

    def request(self, drain: bool) -> None:
        self.requested = "drain" if drain else "now"
        if not drain:
            self.give_up_connecting.set()

    async def done(self, consumer: AIOKafkaConsumer, ks: KafkaSettings, *, joined: bool,
                   settled: Callable[[dict[TopicPartition, int]], bool]) -> bool:
        """Whether to stop now. ``joined``: partitions were assigned once (draining starts when the partitions
        to drain are known); ``settled(targets)``: the caller's own partitions are ready to be counted."""
        if self.requested is None:
            return False
        if self.requested == "now":
            return True
        if not joined:
            return False
        if self.targets is None or set(self.targets) != consumer.assignment():
            self.targets = await drain_targets(ks, consumer.assignment())
        return settled(self.targets) and await caught_up(consumer, self.targets, timeout_s=ks.call_timeout_s)


class Poller:
    """``getmany`` for a consumer loop, within the call timeout. A failed poll is counted (``on_failure``),
    waited out with a capped backoff and answered with None; one more than ``retries`` failures in a row raises
    what ``fatal`` makes of the message."""

    def __init__(self, consumer: AIOKafkaConsumer, ks: KafkaSettings, *, what: str, timeout_ms: int,
                 max_records: int, retries: int, backoff_max_s: float, on_failure: Callable[[], None],
                 fatal: Callable[[str], Exception], **log_context: Any) -> None:
        self.consumer, self.ks, self.what = consumer, ks, what
        self.timeout_ms, self.max_records = timeout_ms, max_records
        self.retries, self.backoff_max_s = retries, backoff_max_s
        self.on_failure, self.fatal, self.log_context = on_failure, fatal, log_context
        self.failures = 0

    async def poll(self) -> dict[TopicPartition, list[ConsumerRecord]] | None:
        try:
            batches: dict[TopicPartition, list[ConsumerRecord]] = await bounded(
                self.consumer.getmany(timeout_ms=self.timeout_ms, max_records=self.max_records),
                self.ks.call_timeout_s, what=self.what)
        except (KafkaError, TimeoutError) as exc:
            self.failures += 1
            self.on_failure()
            if self.failures > self.retries:
                raise self.fatal(f"{self.what} failed {self.failures} times in a row: {exc}") from exc
            log.warning("kafka_poll_failed", call=self.what, **self.log_context, error=str(exc), attempt=self.failures)
            await asyncio.sleep(backoff_s(self.failures, self.backoff_max_s))
            return None
        self.failures = 0
        return batches


async def caught_up(consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int], *, timeout_s: float) -> bool:
    """Whether the consumer's position reached ``ends`` on every partition. (A position steps over transaction
    markers; the offset of the last record processed does not, so it can stay below a read_committed end.)"""
    for tp, end in ends.items():
        if await bounded(consumer.position(tp), timeout_s, what=f"position of {tp}") < end:
            return False
    return True


# ------------------------------------------------------------------------------------------ topics


@dataclass(frozen=True, slots=True)
class TopicSpec:
    role: str  # the TopicSettings field naming it
    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str]
    purpose: str


def topic_specs(ts: TopicSettings) -> list[TopicSpec]:
    """The tracker's six topics. changes, transitions and run-state have one partition count, so that a run's
    state (and its histories) live in the partition number of its changes; watch-state has one partition (the
    leader-elected watcher's shared checkpoint, read whole at the start of every leadership term)."""
    rf = ts.replication_factor
    base = {"min.insync.replicas": str(min(2, rf)), "max.message.bytes": str(ts.max_message_bytes)}
    compacted = {**base, "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"}
    kept = {**base, "cleanup.policy": "delete", "retention.ms": str(ts.side_retention_ms)}
    return [
        TopicSpec("changes", ts.changes, ts.partitions, rf,
                  {**base, "cleanup.policy": "delete", "retention.ms": str(ts.changes_retention_ms)},
                  "Watch events and TauGrid intake events; key: run id; header source."),
        TopicSpec("transitions", ts.transitions, ts.partitions, rf,
                  {**compacted, "min.compaction.lag.ms": str(ts.transitions_min_compaction_lag_ms)},
                  "A run's parts, each a record of its own when it changes: its RunHistory (history/v5, key: run "
                  "id, header content-hash), its metric points (key: <run id>/points) and each of its pods (key: "
                  "<run id>/pod/<uid>, a tombstone when it is no longer the run's); header kind."),
        TopicSpec("run_state", ts.run_state, ts.partitions, rf, compacted,
                  "The reducer's per-run changelog (Reducer.snapshot_run JSON plus shell state; key: run id), "
                  "each pod's state apart (key: <run id>/pod/<uid>, header kind: pod)."),
        TopicSpec("dead_letters", ts.dead_letters, ts.side_partitions, rf, kept,
                  "Inputs that could not be used: DeadLetter JSON (source, reason, detail, excerpt)."),
        TopicSpec("alerts", ts.alerts, ts.side_partitions, rf, kept,
                  "Stuck-run alerts (stuck-run-alert/v1), one per (run, attempt, phase); key: run id."),
        TopicSpec("watch_state", ts.watch_state_topic, 1, rf, compacted,
                  "The leader-elected watcher's shared checkpoint (stream resourceVersions, known objects, held "
                  "records), one transaction per save; key: lease and entry."),
    ]


def topics_document(ts: TopicSettings) -> dict[str, Any]:
    """The machine-readable topic layout (what deploy/kafka/topics.yaml holds for the default settings)."""
    return {"topics": [{"role": s.role, "name": s.name, "partitions": s.partitions,
                        "replication_factor": s.replication_factor, "configs": dict(sorted(s.configs.items())),
                        "purpose": s.purpose} for s in topic_specs(ts)],
            "same_partition_count": [ts.changes, ts.transitions, ts.run_state]}


async def create_topics(ks: KafkaSettings, specs: Iterable[TopicSpec]) -> dict[str, str]:
    """Create the topics that do not exist yet; check the partition count of those that do.

    Returns topic -> "created" | "exists". Raises TopicLayoutError for an existing topic with another partition
    count, KafkaError for anything the broker refused.
    """
    specs = list(specs)
    admin = AIOKafkaAdminClient(**client_options(ks))
    await start(admin, ks, what="admin client")
    try:
        existing = set(await bounded(admin.list_topics(), ks.call_timeout_s, what="listing topics"))
        missing = [s for s in specs if s.name not in existing]
        result = {s.name: "exists" for s in specs if s.name in existing}
        if missing:
            resp = await bounded(admin.create_topics(
                [NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=s.configs) for s in missing],
                timeout_ms=ks.request_timeout_ms), ks.call_timeout_s, what="creating topics")
            for topic, code, *rest in resp.topic_errors:
                error = for_code(code)
                if code == 0:
                    result[topic] = "created"
                elif error.__name__ == "TopicAlreadyExistsError":
                    result[topic] = "exists"
                else:
                    raise error(f"creating topic {topic}: {rest[0] if rest and rest[0] else error.__name__}")
        await _check_partitions(admin, ks, {s.name: s.partitions for s in specs if result[s.name] == "exists"})
        return result
    finally:
        await stop(admin, ks, what="admin client")


async def verify_topics(ks: KafkaSettings, roles: Iterable[str]) -> dict[str, int]:
    """Partition count per topic of the given roles; TopicLayoutError if one is missing, or if changes,
    transitions and run-state (those among ``roles``) differ in partition count."""
    ts = ks.topics
    names = [ts.name(role) for role in roles]
    admin = AIOKafkaAdminClient(**client_options(ks))
    await start(admin, ks, what="admin client")
    try:
        existing = set(await bounded(admin.list_topics(), ks.call_timeout_s, what="listing topics"))
        missing = [n for n in names if n not in existing]
        if missing:
            raise TopicLayoutError(f"missing topic(s) {', '.join(missing)}: create them with `tracker topics create` "
                                   "(see deploy/kafka/topics.md)")
        counts = await _partition_counts(admin, ks, names)
    finally:
        await stop(admin, ks, what="admin client")
    aligned = {n: counts[n] for n in (ts.changes, ts.transitions, ts.run_state) if n in counts}
    if len(set(aligned.values())) > 1:
        raise TopicLayoutError(f"changes, transitions and run-state must have the same partition count, got {aligned}")
    return counts


async def _partition_counts(admin: AIOKafkaAdminClient, ks: KafkaSettings, names: list[str]) -> dict[str, int]:
    described = await bounded(admin.describe_topics(names), ks.call_timeout_s, what="describing topics")
    counts: dict[str, int] = {}
    for t in described:
        if t["error_code"]:
            raise for_code(t["error_code"])(f"describing topic {t['topic']}")
        counts[t["topic"]] = len(t["partitions"])
    return counts


async def _check_partitions(admin: AIOKafkaAdminClient, ks: KafkaSettings, wanted: dict[str, int]) -> None:
    if not wanted:
        return
    counts = await _partition_counts(admin, ks, list(wanted))
    wrong = {n: (counts[n], p) for n, p in wanted.items() if counts[n] != p}
    if wrong:
        raise TopicLayoutError("existing topic(s) have another partition count than configured: " + ", ".join(
            f"{n} has {have}, configured {want}" for n, (have, want) in sorted(wrong.items())))


class PartitionOwner(Protocol):
    """What a consumer-group member does when the group moves partitions to or from it."""

    async def on_revoked(self, revoked: set[TopicPartition]) -> None: ...

    async def on_assigned(self, assigned: set[TopicPartition]) -> None: ...


class Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    """Forwards aiokafka's rebalance callbacks to a ``PartitionOwner`` (the reducer, a sink runner)."""

    def __init__(self, owner: PartitionOwner) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.owner.on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.owner.on_assigned(set(assigned))

