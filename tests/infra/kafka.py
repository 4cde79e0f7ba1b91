"""Single-node KRaft Kafka (combined broker + controller) on loopback, from the cached jars."""

from __future__ import annotations

import asyncio
import base64
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from tests.infra import build
from tests.infra.proc import InfraError, Launcher, Process, free_port, port_open, run, wait_for

_STARTUP_TIMEOUT = 90.0

# Replication settings of 1 are what make transactions and idempotent producers work on one broker.
_SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data}
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
"""

_LOG4J_PROPERTIES = """\
log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaRaftServer=INFO
"""


@dataclass(frozen=True)
class KafkaInstance:
    bootstrap: str
    process: Process


def start(state: Path) -> KafkaInstance:
    """Format a fresh log dir under `state` and start the broker; return once it serves metadata."""
    java = shutil.which("java")
    if java is None:
        raise InfraError("`java` is not on PATH; it is needed to run the Kafka broker")
    classpath = f"{build.KAFKA.ensure() / 'lib'}/*"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    port, controller_port = free_port(), free_port()
    properties = state / "server.properties"
    properties.write_text(_SERVER_PROPERTIES.format(port=port, controller_port=controller_port, data=state / "data"))
    (state / "log4j.properties").write_text(_LOG4J_PROPERTIES)
    jvm = [
        java,
        "-Xms256m",
        "-Xmx512m",
        f"-Dlog4j.configuration=file:{state / 'log4j.properties'}",
        "-Djava.awt.headless=true",
        "-cp",
        classpath,
    ]
    format_storage(jvm, properties, new_cluster_id())
    bootstrap = f"127.0.0.1:{port}"
    with Launcher() as launcher:
        process = launcher.spawn("kafka", [*jvm, "kafka.Kafka", properties], log_path=state / "kafka.log")
        wait_for(f"Kafka at {bootstrap}", lambda: is_ready(bootstrap), timeout=_STARTUP_TIMEOUT, process=process)
    return KafkaInstance(bootstrap=bootstrap, process=process)


def new_cluster_id() -> str:
    """A random KRaft cluster id: a UUID in base64url without padding, redrawn while it starts with `-` (as Kafka's
    own `Uuid.randomUuid()` does), which command-line parsers read as an option (1 draw in 64)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def format_storage(
    jvm: Sequence[str | Path], properties: Path, cluster_id: str, *extra: str, what: str = "formatting Kafka storage"
) -> None:
    """`kafka-storage format` of the log dirs of `properties` (`extra`: more options, e.g. `--add-scram=...`).
    `--cluster-id=<id>` in one argument, so that even an id starting with `-` is a value and not an option."""
    run(
        [*jvm, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", f"--config={properties}", *extra],
        what=what,
    )


def is_ready(bootstrap: str) -> bool:
    """True once the broker answers a metadata request and knows a controller."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    # Probing the port first keeps aiokafka from logging a connection error per attempt.
    return port_open(host, int(port)) and asyncio.run(_has_controller(bootstrap))


async def _has_controller(bootstrap: str) -> bool:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
    except (KafkaError, OSError):
        return False
    finally:
        await admin.close()
    controller_id: int = cluster.get("controller_id", -1)
    return controller_id != -1
