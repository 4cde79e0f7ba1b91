"""The tracker's Kafka security options against a real broker: SASL_SSL with PLAIN (the shape of Azure Event Hubs'
Kafka endpoint) and SCRAM-SHA-512, mutual TLS with a plain and an encrypted client key, host name checking, and how
a wrong password, an untrusted CA or a missing client certificate fail: at once, saying what is wrong.

One private KRaft broker serves the module (``SecureBroker``: the pipeline tests' ``PrivateBroker`` with more
listeners). Its PLAINTEXT listener stays for the controller, the inter-broker traffic and the readiness probe; the
clients here use

- ``SASL_SSL``: users ``$ConnectionString`` (PLAIN, a connection string as password) and ``tracker-scram``
  (SCRAM-SHA-512, added when the storage is formatted, as KRaft takes SCRAM credentials);
- ``MTLS`` (SSL): requires a client certificate of the test CA;
- ``MISNAMED`` (SSL): serves a certificate of the test CA whose names do not include 127.0.0.1.

Certificates come from a throwaway CA (tests/infra/pki.py); the broker reads PEM key and trust stores.
Not covered: OAUTHBEARER (its tokens come from Azure AD through azure-identity).
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError
from pydantic import SecretStr
from structlog.testing import capture_logs

from bench.kafka_pipeline import synthetic_stream
from tests.infra import kafka as infra_kafka
from tests.infra.pki import Pki
from tests.infra.proc import free_port, run
from tests.kafka.test_kafka_pipeline import (
    PARTITIONS,
    PrivateBroker,
    Service,
    check_transitions,
    configure,
    create_topics,
    drain_reducer,
    fault_free,
    items,
    keyed,
    latest_run_state,
    read_topic,
)
from tracker.runtime import service
from tracker.runtime.doctor import kafka_checks
from tracker.runtime.ops import Health, Metrics
from tracker.runtime.reduce import ReduceService
from tracker.settings import Settings, load_settings, redacted
from tracker.shell import kafka

pytestmark = pytest.mark.kafka

SHARED_ACCESS_KEY = secrets.token_urlsafe(24)
PLAIN_USER = "$ConnectionString"  # Event Hubs: this literal user name, the namespace connection string as password
PLAIN_PASSWORD = ("Endpoint=sb://tracker-test.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;"
                  f"SharedAccessKey={SHARED_ACCESS_KEY}")
SCRAM_USER, SCRAM_PASSWORD = "tracker-scram", f"scram-{secrets.token_hex(12)}"
KEY_PASSWORD = f"key-{secrets.token_hex(8)}"
FAIL_FAST = {"KAFKA__CALL_TIMEOUT_S": "8", "KAFKA__REQUEST_TIMEOUT_MS": "5000"}


def _properties(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and line[0] != "#")
    return {key: value for key, value in pairs}


class SecureBroker(PrivateBroker):
    """``PrivateBroker`` with the SASL_SSL, MTLS and MISNAMED listeners of the module docstring. The base class
    writes and formats a PLAINTEXT broker; the listeners are appended to its properties (the later of two equal
    keys wins in a Java properties file) and the storage is formatted again, with the SCRAM user."""

    def __init__(self, state: Path) -> None:
        super().__init__(state)
        pki = Pki(state / "pki")
        self.ca = pki.ensure_ca().cert
        self.foreign_ca = Pki(state / "foreign-pki").ensure_ca().cert  # not the CA of the broker's certificates
        self.client = pki.client("client", user="tracker-client")
        self.encrypted_key = pki.directory / "client-encrypted.key"
        run(["openssl", "pkey", "-in", self.client.key, "-aes256", "-passout", f"pass:{KEY_PASSWORD}",
             "-out", self.encrypted_key], what="encrypting the client key")
        keystores = {}
        for name, serving in (("broker", pki.serving("broker")),  # IP:127.0.0.1 and DNS:localhost
                              ("misnamed", pki.serving("misnamed", ips=(), dns=("kafka.elsewhere.invalid",)))):
            keystores[name] = pki.directory / f"{name}.pem"  # a PEM key store: the private key, then its chain
            keystores[name].write_text(serving.key.read_text() + serving.cert.read_text())

        ports = {"SASL_SSL": free_port(), "MTLS": free_port(), "MISNAMED": free_port()}
        self.sasl_bootstrap, self.mtls_bootstrap, self.misnamed_bootstrap = (
            f"127.0.0.1:{port}" for port in ports.values())
        base = _properties(self.properties)
        controller = base["controller.quorum.voters"].rsplit(":", 1)[1]
        advertised = [f"PLAINTEXT://127.0.0.1:{self.port}", *(f"{n}://127.0.0.1:{p}" for n, p in ports.items())]
        extra = [
            f"listeners={','.join(advertised)},CONTROLLER://127.0.0.1:{controller}",
            f"advertised.listeners={','.join(advertised)}",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL,"
            "MISNAMED:SSL",
            "ssl.keystore.type=PEM", f"ssl.keystore.location={keystores['broker']}",
            "ssl.truststore.type=PEM", f"ssl.truststore.location={self.ca}",
            "listener.name.sasl_ssl.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512",
            "listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
            f'required user_{PLAIN_USER}="{PLAIN_PASSWORD}";',
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "listener.name.mtls.ssl.client.auth=required",
            "listener.name.misnamed.ssl.keystore.type=PEM",
            f"listener.name.misnamed.ssl.keystore.location={keystores['misnamed']}",
        ]
        with self.properties.open("a") as f:
            f.write("\n".join(extra) + "\n")
        shutil.rmtree(base["log.dirs"])
        infra_kafka.format_storage(self.jvm, self.properties, infra_kafka.new_cluster_id(),
                                   f"--add-scram=SCRAM-SHA-512=[name={SCRAM_USER},password={SCRAM_PASSWORD}]",
                                   what="formatting the secure broker's storage")


@pytest.fixture(scope="module")
def secure_broker(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """Requires the session broker too: its fixture builds (or fails on) the same jars."""
    broker = SecureBroker(tmp_path_factory.mktemp("secure") / "broker")
    broker.start()
    yield broker
    broker.stop()


def sasl(broker: SecureBroker, mechanism: str, user: str, password: str) -> dict[str, str]:
    return {"KAFKA__SECURITY_PROTOCOL": "SASL_SSL", "KAFKA__SASL_MECHANISM": mechanism,
            "KAFKA__SASL_USERNAME": user, "KAFKA__SASL_PASSWORD": password, "KAFKA__SSL_CAFILE": str(broker.ca)}


def mtls(broker: SecureBroker, *, encrypted: bool = False) -> dict[str, str]:
    env = {"KAFKA__SECURITY_PROTOCOL": "SSL", "KAFKA__SSL_CAFILE": str(broker.ca),
           "KAFKA__SSL_CERTFILE": str(broker.client.cert), "KAFKA__SSL_KEYFILE": str(broker.client.key)}
    if encrypted:
        env |= {"KAFKA__SSL_KEYFILE": str(broker.encrypted_key), "KAFKA__SSL_KEY_PASSWORD": KEY_PASSWORD}
    return env


async def round_trip(settings: Settings) -> None:
    """Changes published by ``service.publish`` come back, all of them, through the tracker's consumer."""
    source = keyed(synthetic_stream(6, seed=3))
    assert await service.publish(items(source, 10_000), settings) == len(source)
    read = await read_topic(settings, settings.kafka.topics.changes, PARTITIONS)
    sent = Counter((key, json.dumps(record.value, sort_keys=True)) for record, key in source)
    assert Counter((r.key.decode() if r.key else None, json.dumps(json.loads(r.value), sort_keys=True))
                   for r in read) == sent


async def refused(settings: Settings) -> str:
    """The error of a refused connection, as three doors of the tracker report it: a retried call, the reducer and
    ``tracker doctor``. Each fails within ``call_timeout_s`` and nothing is retried (it would not help)."""
    bound = settings.kafka.call_timeout_s
    with capture_logs() as logs:
        started = time.monotonic()
        with pytest.raises(kafka.KafkaSecurityError) as err:
            await kafka.retrying("creating topics", lambda: service.create_topics(settings), retries=5,
                                 backoff_max_s=1.0)
        assert time.monotonic() - started < bound
        started = time.monotonic()
        with pytest.raises(kafka.KafkaSecurityError) as by_reducer:
            await ReduceService(settings, metrics=Metrics(), health=Health()).run()
        assert time.monotonic() - started < bound
    assert not [e for e in logs if "retrying" in e["event"]], logs
    checks = await kafka_checks(settings, bound)
    assert [(c.name, c.status) for c in checks] == [("brokers", "fail")]
    message = str(err.value)
    assert message.split(": ", 2)[2] == str(by_reducer.value).split(": ", 2)[2]  # the same cause, another client
    assert message in checks[0].detail
    for secret in (PLAIN_PASSWORD, SCRAM_PASSWORD, KEY_PASSWORD, settings.kafka.sasl_password):
        if secret:
            assert str(secret) not in message + repr(logs)
    return message


# ------------------------------------------------------------------------------------------ SASL_SSL


async def test_sasl_ssl_plain_as_on_event_hubs_carries_the_pipeline(secure_broker: SecureBroker,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    settings = configure(monkeypatch, secure_broker.sasl_bootstrap,
                         **sasl(secure_broker, "PLAIN", PLAIN_USER, PLAIN_PASSWORD))
    assert kafka.client_options(settings.kafka)["sasl_plain_username"] == "$ConnectionString"
    records = synthetic_stream(30, seed=23)
    expected = fault_free(records)
    with capture_logs() as logs:
        await create_topics(settings)
        assert await service.publish(items(keyed(records), 10_000), settings) == len(keyed(records))
        await drain_reducer(settings)  # transactional producers, a consumer group, the run-state restore
    assert logs and SHARED_ACCESS_KEY not in repr(logs)
    check_transitions(await read_topic(settings, settings.kafka.topics.transitions, PARTITIONS), expected)
    assert set(await latest_run_state(settings)) == set(expected)
    checks = await kafka_checks(settings, 20)
    assert {c.status for c in checks} <= {"ok", "skip"}, [c for c in checks if c.status not in ("ok", "skip")]


async def test_sasl_ssl_scram_sha_512_round_trip(secure_broker: SecureBroker,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    settings = configure(monkeypatch, secure_broker.sasl_bootstrap,
                         **sasl(secure_broker, "SCRAM-SHA-512", SCRAM_USER, SCRAM_PASSWORD))
    await create_topics(settings)
    await round_trip(settings)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_a_wrong_password_fails_at_once_saying_so(secure_broker: SecureBroker, monkeypatch: pytest.MonkeyPatch,
                                                        mechanism: str) -> None:
    user = PLAIN_USER if mechanism == "PLAIN" else SCRAM_USER
    wrong = f"wrong-{secrets.token_hex(6)}"
    settings = configure(monkeypatch, secure_broker.sasl_bootstrap, **sasl(secure_broker, mechanism, user, wrong),
                         **FAIL_FAST)
    message = await refused(settings)
    assert f"refused the SASL {mechanism} authentication as {user}" in message
    assert ("Invalid username or password" if mechanism == "PLAIN" else "invalid credentials") in message
    assert "sasl_password" in message and wrong not in message


async def test_a_mechanism_the_broker_does_not_offer_fails_at_once_saying_so(
        secure_broker: SecureBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = configure(monkeypatch, secure_broker.sasl_bootstrap,
                         **sasl(secure_broker, "SCRAM-SHA-256", SCRAM_USER, SCRAM_PASSWORD), **FAIL_FAST)
    assert "does not offer the SASL mechanism SCRAM-SHA-256" in await refused(settings)


async def test_an_untrusted_broker_certificate_fails_at_once_saying_so(
        secure_broker: SecureBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = configure(monkeypatch, secure_broker.sasl_bootstrap,
                         **{**sasl(secure_broker, "PLAIN", PLAIN_USER, PLAIN_PASSWORD),
                            "KAFKA__SSL_CAFILE": str(secure_broker.foreign_ca)}, **FAIL_FAST)
    message = await refused(settings)
    assert f"the TLS certificate of {secure_broker.sasl_bootstrap} is not trusted" in message
    assert "unable to get local issuer certificate" in message and "kafka.ssl_cafile" in message


# ------------------------------------------------------------------------------------------ TLS


@pytest.mark.parametrize("encrypted", [False, True], ids=["key", "encrypted-key"])
async def test_mutual_tls_round_trip(secure_broker: SecureBroker, monkeypatch: pytest.MonkeyPatch,
                                     encrypted: bool) -> None:
    settings = configure(monkeypatch, secure_broker.mtls_bootstrap, **mtls(secure_broker, encrypted=encrypted))
    await create_topics(settings)
    await round_trip(settings)


async def test_a_client_key_that_does_not_load_is_a_settings_error(secure_broker: SecureBroker,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Not retried, and never a pass phrase prompt on the terminal (OpenSSL's, for an encrypted key without one)."""
    ks = configure(monkeypatch, secure_broker.mtls_bootstrap, **mtls(secure_broker, encrypted=True)).kafka
    for password, why in ((None, "it is encrypted and kafka.ssl_key_password is not set"),
                          (SecretStr("wrong"), "kafka.ssl_key_password does not decrypt it")):
        with pytest.raises(ValueError, match=why):
            kafka.client_options(ks.model_copy(update={"ssl_key_password": password}))
    with pytest.raises(ValueError, match="is it the PEM key of that certificate"):
        kafka.client_options(ks.model_copy(update={"ssl_keyfile": secure_broker.ca.with_suffix(".key")}))
    with pytest.raises(ValueError, match=r"ssl_cafile .* does not load"):
        kafka.client_options(ks.model_copy(update={"ssl_cafile": secure_broker.encrypted_key}))


async def test_no_client_certificate_where_one_is_required_fails_saying_why(
        secure_broker: SecureBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """TLS 1.3 refuses the missing certificate after the handshake: the client sees the connection close, which a
    restarting broker does too, so this stays a retriable error; its message points at the certificate."""
    settings = configure(monkeypatch, secure_broker.mtls_bootstrap, KAFKA__SECURITY_PROTOCOL="SSL",
                         KAFKA__SSL_CAFILE=str(secure_broker.ca), **FAIL_FAST)
    started = time.monotonic()
    with pytest.raises(KafkaConnectionError) as err:
        await service.create_topics(settings)
    assert time.monotonic() - started < settings.kafka.call_timeout_s
    assert "requires a client certificate" in str(err.value) and "kafka.ssl_certfile" in str(err.value)


async def test_host_names_are_checked_unless_turned_off(secure_broker: SecureBroker,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"KAFKA__SECURITY_PROTOCOL": "SSL", "KAFKA__SSL_CAFILE": str(secure_broker.ca), **FAIL_FAST}
    settings = configure(monkeypatch, secure_broker.misnamed_bootstrap, **env)
    assert "IP address mismatch, certificate is not valid for '127.0.0.1'" in await refused(settings)
    monkeypatch.setenv("TRACKER_KAFKA__SSL_CHECK_HOSTNAME", "false")  # the CA is still checked
    settings = load_settings()
    await create_topics(settings)
    await round_trip(settings)


# ------------------------------------------------------------------------------------------ secrets


async def test_secrets_are_never_logged_by_a_service(secure_broker: SecureBroker, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """`tracker reduce` at DEBUG (aiokafka's own logs included) with SASL PLAIN and an encrypted client key: its
    settings dump shows the user but masks both secrets, and neither appears anywhere in its log."""
    settings = configure(monkeypatch, secure_broker.sasl_bootstrap,
                         **sasl(secure_broker, "PLAIN", PLAIN_USER, PLAIN_PASSWORD),
                         KAFKA__SSL_CERTFILE=str(secure_broker.client.cert),
                         KAFKA__SSL_KEYFILE=str(secure_broker.encrypted_key), KAFKA__SSL_KEY_PASSWORD=KEY_PASSWORD,
                         OPS__LOG_LEVEL="DEBUG")
    for shown in (repr(settings), str(settings.kafka), json.dumps(redacted(settings))):
        assert SHARED_ACCESS_KEY not in shown and KEY_PASSWORD not in shown
    await create_topics(settings)
    reducer = Service(tmp_path, "reduce", "reduce").start()
    try:
        await reducer.wait_for("partition_restored", count=PARTITIONS)
        assert reducer.terminate() == 0
    finally:
        if reducer.proc is not None and reducer.proc.poll() is None:
            reducer.kill()
    dumped = next(e for e in reducer.events() if e["event"] == "starting")["settings"]["kafka"]
    assert (dumped["sasl_username"], dumped["sasl_password"], dumped["ssl_key_password"]) == \
        (PLAIN_USER, "**********", "**********")
    text = reducer.log.read_text()
    assert "Authenticated as $ConnectionString via PLAIN" in text, "the DEBUG log should include aiokafka's"
    assert SHARED_ACCESS_KEY not in text and KEY_PASSWORD not in text
