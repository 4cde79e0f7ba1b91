"""pytest plugin: real Kafka, a real kube-apiserver and the simulated Kueue cluster as session fixtures.

Enable with `pytest_plugins = ["tests.infra.fixtures"]` in tests/conftest.py. Each endpoint is chosen in
this order:

1. an external endpoint named by `TRACKER_TEST_KAFKA_BOOTSTRAP` / `TRACKER_TEST_KUBECONFIG`;
2. Kafka only: a testcontainers `KafkaContainer`, if a Docker engine answers and the `testcontainers`
   package is installed (there is no container path for Kubernetes: Kueue, kwok and the CRDs would
   still need the local build);
3. the local processes of `python -m tests.infra up`: reused if already running, otherwise started
   here and stopped again at the end of the session.

A missing or failing environment fails the test, always: no test is skipped for want of a service (`./run test`
and CI provision everything first). A cold cache is not built from inside pytest (that takes 9 to 35 minutes on
2 cores, longer than a test's timeout): an unbuilt artifact fails the test at once, naming the
`python -m tests.infra up` command that builds it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlparse

import pytest
import pytest_asyncio
from kubernetes_asyncio.client import ApiClient, VersionApi
from kubernetes_asyncio.config import new_client_from_config

from tests.infra import build, cluster, kafka, system
from tests.infra.config import Component
from tests.infra.env import Environment
from tests.infra.kubectl import Kubectl
from tests.infra.proc import InfraError


def unavailable(reason: str) -> NoReturn:
    """Fail the test: a service or artifact it needs is missing. Never a skip, whatever the environment says."""
    pytest.fail(reason, pytrace=False)


class LocalEnvironment:
    """The local processes, as used by one pytest session; remembers what it started itself."""

    def __init__(self) -> None:
        self.environment = Environment()
        self.started: list[Component] = []

    def provide(self, component: Component) -> dict[str, Any]:
        entry = self.environment.running(component)
        if entry is not None:
            return entry
        unbuilt = [a.path.name for a in build.required_artifacts({component}) if not a.is_built()]
        if unbuilt:
            unavailable(
                f"{component} environment is not built ({', '.join(unbuilt)}); run "
                f"`python -m tests.infra up --components {component}` first (`./run test` does)"
            )
        try:
            self.started += self.environment.up({component})
        except InfraError as exc:
            unavailable(f"could not start the {component} environment: {exc}")
        entry = self.environment.running(component)
        if entry is None:
            unavailable(f"{component} environment started but is not healthy; see {self.environment.state}")
        return entry

    def stop_started(self) -> None:
        if self.started:
            self.environment.down(set(self.started))


@pytest.fixture(scope="session")
def local_testenv() -> Iterator[LocalEnvironment]:
    local = LocalEnvironment()
    yield local
    local.stop_started()


# --- Kafka -----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    """`host:port` of a Kafka broker that supports transactions and idempotent producers."""
    external = os.environ.get("TRACKER_TEST_KAFKA_BOOTSTRAP")
    if external:
        if not kafka.is_ready(external):
            unavailable(f"TRACKER_TEST_KAFKA_BOOTSTRAP={external} does not answer a metadata request")
        yield external
        return
    if _docker_engine_answers() and importlib.util.find_spec("testcontainers") is not None:
        yield from _kafka_container()
        return
    local: LocalEnvironment = request.getfixturevalue("local_testenv")
    yield local.provide(Component.KAFKA)["bootstrap"]


def _kafka_container() -> Iterator[str]:
    from testcontainers.kafka import KafkaContainer  # type: ignore[import-not-found]  # optional

    container = KafkaContainer().with_kraft()
    # One broker: internal topics must not ask for more replicas than exist.
    for setting in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        container.with_env(setting, "1")
    try:
        container.start()
    except Exception as exc:  # docker-py raises its own tree; any failure means "no container Kafka"
        unavailable(f"testcontainers KafkaContainer did not start: {exc}")
    try:
        yield str(container.get_bootstrap_server())
    finally:
        container.stop()


def _docker_engine_answers() -> bool:
    """True if the engine at DOCKER_HOST (default: the local unix socket) answers GET /_ping."""
    url = urlparse(os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"))
    try:
        if url.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(2)
            sock.connect(url.path)
        elif url.scheme == "tcp" and url.hostname and url.port:
            sock = socket.create_connection((url.hostname, url.port), timeout=2)
        else:
            return False
        with sock:
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            status_line = sock.recv(64)
    except OSError:
        return False
    return status_line.startswith(b"HTTP/1.") and b" 200 " in status_line


# --- Artifacts without a service -------------------------------------------------------------------


@pytest.fixture(scope="session")
def compose_schema() -> Path:
    """The Compose Specification's JSON schema (`build.COMPOSE_SPEC`, fetched by every `up`)."""
    if not build.COMPOSE_SPEC.is_built():
        unavailable(f"{build.COMPOSE_SPEC.path.name} is not fetched; run `python -m tests.infra up` first")
    return build.COMPOSE_SPEC.path / "compose-spec.json"


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's Chromium (`system.CHROMIUM`, installed by every `up`); missing, the test fails."""
    found = system.CHROMIUM.which()
    if found is None:
        unavailable("chromium is not installed; run `python -m tests.infra up` first (it installs Debian's "
                    "chromium package), or `apt-get install -y --no-install-recommends chromium` as root")
    return found


@pytest.fixture(scope="session")
def promtool() -> Path:
    """Prometheus' promtool (`build.PROMTOOL`, fetched by every `up`): a missing one fails the test."""
    if not build.PROMTOOL.is_built():
        unavailable(f"{build.PROMTOOL.path.name} is not fetched; run `python -m tests.infra up` first")
    return build.PROMTOOL.path / "bin" / "promtool"


# --- Kubernetes ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kubeconfig(request: pytest.FixtureRequest) -> Path:
    """Path of a kubeconfig for a cluster-admin of a kube-apiserver with the Kueue and KubeRay CRDs."""
    external = os.environ.get("TRACKER_TEST_KUBECONFIG")
    if external:
        problem = asyncio.run(_kube_problem(Path(external))) if Path(external).is_file() else "no such file"
        if problem:
            unavailable(f"TRACKER_TEST_KUBECONFIG={external}: {problem}")
        return Path(external)
    local: LocalEnvironment = request.getfixturevalue("local_testenv")
    return Path(local.provide(Component.KUBE)["kubeconfig"])


async def _kube_problem(path: Path) -> str | None:
    """Why the cluster of kubeconfig `path` cannot be used, or None if it answers."""
    try:
        async with await new_client_from_config(config_file=str(path)) as client:
            await VersionApi(client).get_code()
    except Exception as exc:  # config errors, TLS errors, HTTP errors: all mean "unusable"
        return f"the apiserver does not answer ({exc!r})"
    return None


@pytest.fixture(scope="session")
def kubectl(kubeconfig: Path) -> Kubectl:
    """Synchronous helper: the kubectl of the local build (or the one on PATH) bound to `kubeconfig`."""
    built = build.KUBERNETES.path / "bin" / "kubectl"
    binary = built if build.KUBERNETES.is_built() else shutil.which("kubectl")
    if binary is None:
        unavailable("no kubectl: build the local environment or put kubectl on PATH")
    return Kubectl(Path(binary), kubeconfig)


@pytest.fixture
def kube_namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace, deleted (without waiting) after the test."""
    name = kubectl.create_namespace("test")
    yield name
    kubectl.delete_namespace(name)


@pytest_asyncio.fixture
async def kube_api(kubeconfig: Path) -> AsyncIterator[ApiClient]:
    """A kubernetes_asyncio ApiClient for `kubeconfig`, closed after the test."""
    async with await new_client_from_config(config_file=str(kubeconfig)) as client:
        yield client


# --- Simulated cluster -----------------------------------------------------------------------------


@dataclass(frozen=True)
class KubeCluster:
    """Scheduler, controller-manager, kwok GPU nodes and Kueue on top of `kubeconfig`."""

    kubeconfig: Path
    kubectl: Kubectl
    cluster_queue: str = cluster.CLUSTER_QUEUE
    local_queue: str = cluster.LOCAL_QUEUE
    #: `host:port` where the KubeRay operator sends its Ray dashboard requests
    #: (tests/support/ray_dashboard_standin.py serves
    #: it); None on an external cluster, whose operator reaches real dashboards.
    ray_dashboard_proxy: str | None = None
    #: the versions `up` started (an external cluster: unknown)
    kueue_version: str | None = None
    kuberay_version: str | None = None

    def create_namespace(self, prefix: str = "test") -> str:
        """A fresh namespace holding a LocalQueue `local_queue` that feeds `cluster_queue`."""
        name = self.kubectl.create_namespace(prefix)
        self.kubectl.apply([cluster.local_queue(name)])
        self.kubectl.wait(f"localqueue/{self.local_queue}", namespace=name, condition="Active", timeout=60)
        return name


@pytest.fixture(scope="session")
def kube_cluster(request: pytest.FixtureRequest, kubectl: Kubectl) -> KubeCluster:
    """The simulated cluster. An external TRACKER_TEST_KUBECONFIG must provide the same queue names."""
    if os.environ.get("TRACKER_TEST_KUBECONFIG"):
        try:
            kubectl.run("get", f"clusterqueue/{cluster.CLUSTER_QUEUE}")
        except InfraError as exc:
            unavailable(f"TRACKER_TEST_KUBECONFIG has no simulated cluster set up like `tests.infra up`: {exc}")
        return KubeCluster(kubeconfig=kubectl.kubeconfig, kubectl=kubectl)
    local: LocalEnvironment = request.getfixturevalue("local_testenv")
    entry = local.provide(Component.CLUSTER)
    return KubeCluster(kubeconfig=kubectl.kubeconfig, kubectl=kubectl,
                       ray_dashboard_proxy=entry.get("ray_dashboard_proxy"), kueue_version=entry.get("kueue_version"),
                       kuberay_version=entry.get("kuberay_version"))


@pytest.fixture
def queue_namespace(kube_cluster: KubeCluster) -> Iterator[str]:
    """A fresh namespace with a LocalQueue, deleted (without waiting) after the test."""
    name = kube_cluster.create_namespace("queued")
    yield name
    kube_cluster.kubectl.delete_namespace(name)
