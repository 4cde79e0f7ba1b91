"""`tracker doctor` against the real kube-apiserver and Kafka broker of the test environment (and the Kusto
STAND-IN of tests/support/adx_standin.py): healthy, then one fault at a time, each failing exactly its own check.

Kubernetes identities are real ServiceAccounts with tokens from the TokenRequest API (or impersonated), bound
to the watcher's RBAC as deploy/k8s renders it; the CRD faults use a private control plane whose CRDs can be
deleted without disturbing other tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient

from tests.deploy.test_deploy import K8S, apply, kustomize_binary, render
from tests.infra import build, kube
from tests.infra.config import REPO_ROOT, Component
from tests.infra.fixtures import unavailable
from tests.infra.kubectl import Kubectl
from tests.infra.proc import InfraError, free_port
from tests.support.adx_standin import KustoStandIn, Request, _v1
from tracker.runtime.doctor import main as doctor_main
from tracker.runtime.doctor import watcher_rbac
from tracker.settings import KafkaSettings, TopicSettings
from tracker.shell import kafka
from tracker.shell.adx import ALL_TABLES
from tracker.shell.watch import all_resources

Checks = dict[tuple[str, str], dict[str, Any]]
RBAC = REPO_ROOT / "deploy" / "k8s" / "rbac" / "clusterrole.yaml"
ROLES = ("changes", "transitions", "run_state", "dead_letters", "alerts")


def run_doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Checks]:
    rc = doctor_main(["doctor", *args, "--timeout", "20", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] == (rc == 0)
    checks = {(c["area"], c["name"]): c for c in out["checks"]}
    assert len(checks) == len(out["checks"]), "check names are unique"
    return rc, checks


def failed(checks: Checks) -> set[tuple[str, str]]:
    return {key for key, c in checks.items() if c["status"] == "fail"}


def failures(checks: Checks) -> list[str]:
    """What failed and why: the message of a failed assertion."""
    return [f"{c['area']} {c['name']}: {c['detail']}" for c in checks.values() if c["status"] == "fail"]


def statuses(checks: Checks, area: str) -> set[str]:
    return {c["status"] for (a, _), c in checks.items() if a == area}


# ------------------------------------------------------------------------------------------ kubernetes


@dataclass(frozen=True)
class Account:
    namespace: str
    name: str
    kubeconfig: Path

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"


def token_kubeconfig(kubectl: Kubectl, namespace: str, name: str, path: Path) -> Account:
    """A kubeconfig with a TokenRequest token of ServiceAccount ``namespace/name``, for the admin's cluster."""
    token = kubectl.run("create", "token", name, f"--namespace={namespace}", "--duration=1h").strip()
    cluster = yaml.safe_load(kubectl.kubeconfig.read_text())["clusters"][0]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa", "clusters": [cluster],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": name}}]}))
    return Account(namespace, name, path)


@pytest.fixture(scope="module")
def rbac_install(kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The base's RBAC (deploy/k8s/rbac/clusterrole.yaml) installed for real in a fresh namespace, names suffixed."""
    namespace, suffix = f"doctor-{uuid.uuid4().hex[:6]}", f"-{uuid.uuid4().hex[:6]}"
    kubectl.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
    docs = render(kustomize_binary(), K8S / "base", tmp_path_factory.mktemp("rbac"), namespace=namespace,
                  suffix=suffix)
    apply(kubectl, [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                                     "RoleBinding")])
    yield namespace, suffix
    for kind in ("clusterrolebinding", "clusterrole"):
        kubectl.run("delete", kind, f"tracker-watcher{suffix}", f"tracker-partial{suffix}", "--ignore-not-found",
                    "--wait=false")
    kubectl.delete_namespace(namespace)


@pytest.fixture(scope="module")
def watcher(kubectl: Kubectl, rbac_install: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Account:
    namespace, suffix = rbac_install
    return token_kubeconfig(kubectl, namespace, f"tracker-watcher{suffix}",
                            tmp_path_factory.mktemp("watcher") / "kubeconfig")


def expected_rbac_checks(namespace: str, namespaces: tuple[str, ...] = (), lease: bool = True) -> set[tuple[str, str]]:
    return {("kube", f"rbac {p.describe()}") for p in watcher_rbac(
        RBAC, namespaces=namespaces, lease_namespace=namespace, lease=lease)}


@pytest.mark.kube
@pytest.mark.kafka
def test_healthy(capsys: pytest.CaptureFixture[str], watcher: Account, topics: KafkaSettings, kubectl: Kubectl,
                 kafka_bootstrap: str) -> None:
    rc, checks = run_doctor(capsys, "--kubeconfig", str(watcher.kubeconfig), "--lease-namespace", watcher.namespace,
                            "--bootstrap-servers", kafka_bootstrap)
    assert rc == 0, failures(checks)
    # the bare apiserver does not serve Kueue's visibility API: a warning (positions are not recorded), no failure
    assert checks.pop(("kube", "api visibility.kueue.x-k8s.io"))["status"] == "warn"
    assert statuses(checks, "kube") == {"ok"} and statuses(checks, "kafka") == {"ok"}
    assert checks[("adx", "settings")]["status"] == "skip"
    assert watcher.user in checks[("kube", "apiserver")]["detail"]  # SelfSubjectReview: who the apiserver sees
    rbac = {key for key in checks if key[1].startswith("rbac ")}
    assert rbac == expected_rbac_checks(watcher.namespace)
    assert ("kube", f"rbac get,update leases.coordination.k8s.io/tracker-watcher in {watcher.namespace}") in rbac
    apis = {key[1] for key in checks if key[1].startswith("api ")}
    assert apis == {f"api {r.plural}.{r.group}" if r.group else f"api {r.plural}" for r in all_resources()}
    # the shared control plane serves Kueue 0.12's v1beta1 CRDs until a Kueue 0.17 cluster replaced them (v1beta2)
    served = {v["version"] for v in json.loads(kubectl.run("get", "--raw", "/apis/kueue.x-k8s.io"))["versions"]}
    version = "v1beta2" if "v1beta2" in served else "v1beta1"
    assert checks[("kube", "api workloads.kueue.x-k8s.io")]["detail"] == f"served at kueue.x-k8s.io/{version}"
    assert checks[("kube", "api rayjobs.ray.io")]["detail"] == "served at ray.io/v1"
    assert checks[("kafka", "partition counts")]["detail"].endswith("2 partitions each")
    for role in ROLES:
        assert checks[("kafka", f"topic {role}")]["status"] == "ok"


@pytest.mark.kube
def test_impersonating_the_watcher(capsys: pytest.CaptureFixture[str], kubeconfig: Path, watcher: Account) -> None:
    rc, checks = run_doctor(capsys, "--kubeconfig", str(kubeconfig), "--as", watcher.user, "--lease-namespace",
                            watcher.namespace, "--skip", "kafka", "--skip", "adx")
    assert rc == 0, failures(checks)
    assert watcher.user in checks[("kube", "apiserver")]["detail"]
    assert {key for key in checks if key[1].startswith("rbac ")} == expected_rbac_checks(watcher.namespace)
    # and as an account that exists nowhere: every permission denied, discovery still answers
    rc, checks = run_doctor(capsys, "--kubeconfig", str(kubeconfig), "--as", "system:serviceaccount:x:nobody",
                            "--lease-namespace", watcher.namespace, "--skip", "kafka", "--skip", "adx")
    assert rc == 1 and failed(checks) == expected_rbac_checks(watcher.namespace), failures(checks)


@pytest.mark.kube
def test_an_account_without_the_binding_fails_every_permission(
        capsys: pytest.CaptureFixture[str], kubectl: Kubectl, rbac_install: tuple[str, str], tmp_path: Path) -> None:
    namespace, _ = rbac_install
    kubectl.apply([{"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": "unbound", "namespace": namespace}}])
    account = token_kubeconfig(kubectl, namespace, "unbound", tmp_path / "kubeconfig")
    rc, checks = run_doctor(capsys, "--kubeconfig", str(account.kubeconfig), "--lease-namespace", namespace,
                            "--skip", "kafka", "--skip", "adx")
    assert rc == 1
    assert failed(checks) == expected_rbac_checks(namespace)
    pods = checks[("kube", "rbac get,list,watch pods cluster-wide")]
    assert pods["detail"] == "denied: get, list, watch"
    assert account.user in pods["fix"] and "ClusterRole tracker-watcher" in pods["fix"]
    lease = checks[("kube", f"rbac create leases.coordination.k8s.io in {namespace}")]
    assert "Role tracker-watcher-lease" in lease["fix"] and namespace in lease["fix"]


@pytest.mark.kube
def test_a_role_missing_one_verb_fails_that_check_only(
        capsys: pytest.CaptureFixture[str], kubectl: Kubectl, rbac_install: tuple[str, str], tmp_path: Path) -> None:
    """The watcher's ClusterRole without `watch` on pods, bound to its own account: exactly that check fails."""
    namespace, suffix = rbac_install
    role = next(d for d in yaml.safe_load_all(RBAC.read_text()) if d and d["kind"] == "ClusterRole")
    for rule in role["rules"]:
        if rule["resources"] == ["pods", "events"]:
            rule["resources"] = ["events"]
            role["rules"].append({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]})
            break
    role["metadata"]["name"] = f"tracker-partial{suffix}"
    kubectl.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "partial", "namespace": namespace}},
        role,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"tracker-partial{suffix}"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": f"tracker-partial{suffix}"},
         "subjects": [{"kind": "ServiceAccount", "name": "partial", "namespace": namespace}]}])
    account = token_kubeconfig(kubectl, namespace, "partial", tmp_path / "kubeconfig")
    rc, checks = run_doctor(capsys, "--kubeconfig", str(account.kubeconfig), "--no-lease", "--skip", "kafka",
                            "--skip", "adx")
    assert rc == 1
    assert failed(checks) == {("kube", "rbac get,list,watch pods cluster-wide")}
    assert checks[("kube", "rbac get,list,watch pods cluster-wide")]["detail"] == "denied: watch"
    assert not any("lease" in name for _, name in checks)  # --no-lease


@pytest.mark.kube
def test_a_namespaced_watcher_is_checked_in_its_namespaces(
        capsys: pytest.CaptureFixture[str], kubectl: Kubectl, rbac_install: tuple[str, str], tmp_path: Path) -> None:
    """Bound to the ClusterRole by a RoleBinding in one namespace: fine for `watch -n NS`, not cluster-wide."""
    namespace, suffix = rbac_install
    kubectl.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "scoped", "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "scoped", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": f"tracker-watcher{suffix}"},
         "subjects": [{"kind": "ServiceAccount", "name": "scoped", "namespace": namespace}]}])
    account = token_kubeconfig(kubectl, namespace, "scoped", tmp_path / "kubeconfig")
    args = ("--kubeconfig", str(account.kubeconfig), "--no-lease", "--skip", "kafka", "--skip", "adx")
    rc, checks = run_doctor(capsys, *args, "--namespace", namespace)
    assert rc == 0, failures(checks)
    assert {k for k in checks if k[1].startswith("rbac ")} == expected_rbac_checks(namespace, (namespace,), False)
    rc, checks = run_doctor(capsys, *args)
    assert rc == 1 and failed(checks) == expected_rbac_checks(namespace, (), False), failures(checks)


@pytest.fixture(scope="module")
def private_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    """An apiserver of our own (etcd + kube-apiserver + the Kueue and KubeRay CRDs), to remove CRDs from."""
    unbuilt = [a.path.name for a in build.artifacts_for(Component.KUBE) if not a.is_built()]
    if unbuilt:
        unavailable(f"kube environment is not built ({', '.join(unbuilt)}); run `python -m tests.infra up "
                    "--components kube` once")
    instance = kube.start(tmp_path_factory.mktemp("doctor-plane"))
    try:
        yield kube.kubectl(instance.kubeconfig)
    finally:
        for process in reversed(instance.processes):
            process.stop()


def wait_for_discovery(kubectl: Kubectl, path: str, done: Callable[[dict[str, Any] | None], bool]) -> None:
    """Until ``done(discovery document at path, None once it is gone)``: CRD changes reach discovery
    asynchronously, the group document and each version's document each in their own time."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            document: dict[str, Any] | None = json.loads(kubectl.run("get", "--raw", path))
        except InfraError as exc:
            if "NotFound" not in str(exc):
                raise
            document = None
        if done(document):
            return
        time.sleep(0.5)
    raise AssertionError(f"discovery at {path} did not change within 60 s")


def lists(plural: str) -> Callable[[dict[str, Any] | None], bool]:
    return lambda doc: doc is not None and any(r["name"] == plural for r in doc["resources"])


@pytest.mark.kube
def test_missing_crds_and_unsupported_versions(capsys: pytest.CaptureFixture[str], private_plane: Kubectl) -> None:
    kubectl = private_plane
    args = ("--kubeconfig", str(kubectl.kubeconfig), "--skip", "kafka", "--skip", "adx")
    rc, checks = run_doctor(capsys, *args)
    assert rc == 0, failures(checks)

    # KubeRay not installed: both of its resources fail, with what to install
    kubectl.run("delete", "crd", "rayjobs.ray.io", "rayclusters.ray.io", "rayservices.ray.io")
    wait_for_discovery(kubectl, "/apis/ray.io", lambda doc: doc is None)
    rc, checks = run_doctor(capsys, *args)
    assert rc == 1 and failed(checks) == {("kube", "api rayjobs.ray.io"), ("kube", "api rayclusters.ray.io")}
    rayjobs = checks[("kube", "api rayjobs.ray.io")]
    assert rayjobs["detail"] == "API group ray.io is not served (its CRDs are not installed)"
    assert "KubeRay" in rayjobs["fix"]

    # a Kueue whose Workloads are served at a version the watcher does not read
    kubectl.run("delete", "crd", "workloads.kueue.x-k8s.io")
    wait_for_discovery(kubectl, "/apis/kueue.x-k8s.io/v1beta1", lambda doc: not lists("workloads")(doc))
    kubectl.apply([{
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "workloads.kueue.x-k8s.io"},
        "spec": {"group": "kueue.x-k8s.io", "scope": "Namespaced",
                 "names": {"kind": "Workload", "plural": "workloads", "singular": "workload",
                           "listKind": "WorkloadList"},
                 "versions": [{"name": "v1alpha9", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}])
    kubectl.wait("crd/workloads.kueue.x-k8s.io", condition="Established", timeout=60)
    wait_for_discovery(kubectl, "/apis/kueue.x-k8s.io/v1alpha9", lists("workloads"))
    wait_for_discovery(kubectl, "/apis/kueue.x-k8s.io",
                       lambda doc: doc is not None and any(v["version"] == "v1alpha9" for v in doc["versions"]))
    rc, checks = run_doctor(capsys, *args)
    assert rc == 1
    assert failed(checks) == {("kube", "api rayjobs.ray.io"), ("kube", "api rayclusters.ray.io"),
                              ("kube", "api workloads.kueue.x-k8s.io")}
    workloads = checks[("kube", "api workloads.kueue.x-k8s.io")]
    assert workloads["detail"].startswith("workloads.kueue.x-k8s.io is not served at v1beta2 or v1beta1")
    assert "v1alpha9" in workloads["detail"] and "Kueue" in workloads["fix"]


@pytest.mark.kube
def test_an_unreachable_apiserver_fails_within_the_timeout(capsys: pytest.CaptureFixture[str], kubeconfig: Path,
                                                           tmp_path: Path) -> None:
    config = yaml.safe_load(kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    started = time.monotonic()
    rc, checks = run_doctor(capsys, "--kubeconfig", str(tmp_path / "kubeconfig"), "--skip", "kafka", "--skip", "adx")
    assert rc == 1 and set(checks) == {("kube", "apiserver"), ("kafka", "kafka"), ("adx", "adx")}
    assert checks[("kube", "apiserver")]["status"] == "fail" and "did not answer" in checks[("kube", "apiserver")][
        "detail"]
    assert time.monotonic() - started < 30
    rc, checks = run_doctor(capsys, "--kubeconfig", str(tmp_path / "missing"), "--skip", "kafka", "--skip", "adx")
    assert rc == 1 and checks[("kube", "kubeconfig")]["status"] == "fail"


# ------------------------------------------------------------------------------------------ kafka


@pytest.fixture
def layout(monkeypatch: pytest.MonkeyPatch, kafka_bootstrap: str) -> Iterator[KafkaSettings]:
    """Topic names of this test only (TRACKER_KAFKA__TOPICS__*, 2 partitions, side topics 1, one replica), not
    created yet; whatever was created under them is deleted afterwards."""
    prefix = f"doctor-{uuid.uuid4().hex[:8]}"
    names = {role: f"{prefix}.{role.replace('_', '-')}" for role in ROLES}
    env = {f"TRACKER_KAFKA__TOPICS__{role.upper()}": name for role, name in names.items()}
    env |= {"TRACKER_KAFKA__TOPICS__PARTITIONS": "2", "TRACKER_KAFKA__TOPICS__SIDE_PARTITIONS": "1",
            "TRACKER_KAFKA__TOPICS__REPLICATION_FACTOR": "1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    ks = KafkaSettings(bootstrap_servers=kafka_bootstrap, topics=TopicSettings.model_validate(
        {**names, "partitions": 2, "side_partitions": 1, "replication_factor": 1}))
    yield ks
    asyncio.run(_delete_topics(ks, [s.name for s in kafka.topic_specs(ks.topics)]))  # incl. derived names


async def _delete_topics(ks: KafkaSettings, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(**kafka.client_options(ks))
    await kafka.start(admin, ks, what="admin client")
    try:
        existing = [n for n in await admin.list_topics() if n in names]
        if existing:
            await admin.delete_topics(existing)
    finally:
        await kafka.stop(admin, ks, what="admin client")


def create(ks: KafkaSettings, **overrides: dict[str, Any]) -> None:
    """The topics of ``ks``, each spec field overridden per role (e.g. run_state={"partitions": 3}), and once
    the broker's metadata shows them with a leader for every partition (it lags the controller a little)."""
    specs = [dataclasses.replace(s, **overrides.get(s.role, {})) for s in kafka.topic_specs(ks.topics)]
    asyncio.run(kafka.create_topics(ks, specs))
    asyncio.run(_await_metadata(ks, {s.name: s.partitions for s in specs}))


async def _await_metadata(ks: KafkaSettings, partitions: dict[str, int]) -> None:
    admin = AIOKafkaAdminClient(**kafka.client_options(ks))
    await kafka.start(admin, ks, what="admin client")
    try:
        async with asyncio.timeout(30):
            while True:
                if set(partitions) <= set(await admin.list_topics()):
                    described = {t["topic"]: t["partitions"] for t in await admin.describe_topics(list(partitions))}
                    if all(len(described[n]) == p and all(part["leader"] >= 0 for part in described[n])
                           for n, p in partitions.items()):
                        return
                await asyncio.sleep(0.2)
    finally:
        await kafka.stop(admin, ks, what="admin client")


@pytest.fixture
def topics(layout: KafkaSettings) -> KafkaSettings:
    create(layout)
    return layout


@pytest.mark.kafka
def test_kafka_healthy_layout(capsys: pytest.CaptureFixture[str], topics: KafkaSettings) -> None:
    rc, checks = run_doctor(capsys, "--bootstrap-servers", str(topics.bootstrap_servers), "--skip", "kube",
                            "--skip", "adx")
    assert rc == 0, failures(checks)
    assert checks[("kafka", "brokers")]["detail"] == f"1 broker(s) via {topics.bootstrap_servers}"
    assert checks[("kafka", "topic run_state")]["detail"] == f"{topics.topics.run_state}: 2 partitions, " \
                                                           "cleanup.policy=compact"
    assert checks[("kafka", "topic changes")]["detail"] == f"{topics.topics.changes}: 2 partitions, " \
                                                         "cleanup.policy=delete"


@pytest.mark.kafka
def test_missing_topics(capsys: pytest.CaptureFixture[str], layout: KafkaSettings) -> None:
    rc, checks = run_doctor(capsys, "--bootstrap-servers", str(layout.bootstrap_servers), "--skip", "kube",
                            "--skip", "adx")
    assert rc == 1 and failed(checks) == {("kafka", f"topic {role}") for role in ROLES}, failures(checks)
    assert checks[("kafka", "topic changes")]["detail"] == f"{layout.topics.changes} is missing"
    assert "tracker topics create" in checks[("kafka", "topic changes")]["fix"]
    assert checks[("kafka", "partition counts")]["status"] == "skip"


@pytest.mark.kafka
def test_partition_counts_that_differ(capsys: pytest.CaptureFixture[str], layout: KafkaSettings) -> None:
    create(layout, run_state={"partitions": 3})
    rc, checks = run_doctor(capsys, "--bootstrap-servers", str(layout.bootstrap_servers), "--skip", "kube",
                            "--skip", "adx")
    assert rc == 1 and failed(checks) == {("kafka", "partition counts")}, failures(checks)
    t = layout.topics
    assert checks[("kafka", "partition counts")]["detail"] == (
        "changes, transitions and run-state differ: " + ", ".join(sorted(
            [f"{t.changes} 2", f"{t.transitions} 2", f"{t.run_state} 3"])))
    # the topic itself works but differs from the settings: a warning, which does not fail the run
    assert checks[("kafka", "topic run_state")]["status"] == "warn"
    assert "3 partitions, configured 2" in checks[("kafka", "topic run_state")]["detail"]


@pytest.mark.kafka
def test_a_run_state_topic_that_is_not_compacted(capsys: pytest.CaptureFixture[str], layout: KafkaSettings) -> None:
    run_state = next(s for s in kafka.topic_specs(layout.topics) if s.role == "run_state")
    create(layout, run_state={"configs": {**run_state.configs, "cleanup.policy": "delete"}})
    rc, checks = run_doctor(capsys, "--bootstrap-servers", str(layout.bootstrap_servers), "--skip", "kube",
                            "--skip", "adx")
    assert rc == 1 and failed(checks) == {("kafka", "topic run_state")}, failures(checks)
    assert "cleanup.policy=delete, configured compact" in checks[("kafka", "topic run_state")]["detail"]
    assert checks[("kafka", "partition counts")]["status"] == "ok"


def test_an_unreachable_broker_fails_within_the_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    rc, checks = run_doctor(capsys, "--bootstrap-servers", address, "--skip", "kube", "--skip", "adx")
    assert rc == 1 and failed(checks) == {("kafka", "brokers")}, failures(checks)
    assert checks[("kafka", "brokers")]["detail"].startswith(f"{address} unreachable")
    assert "bootstrap_servers" in checks[("kafka", "brokers")]["fix"]
    assert not any(name.startswith("topic") for _, name in checks)
    assert time.monotonic() - started < 30


def test_invalid_kafka_settings(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    rc, checks = run_doctor(capsys, "--bootstrap-servers", "127.0.0.1:1", "--skip", "kube", "--skip", "adx")
    assert rc == 1 and failed(checks) == {("kafka", "settings")}, failures(checks)
    assert "needs sasl_mechanism" in checks[("kafka", "settings")]["detail"]


def test_without_kafka_there_is_nothing_to_check(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACKER_KAFKA__BOOTSTRAP_SERVERS", raising=False)
    rc, checks = run_doctor(capsys, "--skip", "kube", "--skip", "adx")
    assert rc == 0 and checks[("kafka", "brokers")]["status"] == "skip"


# ------------------------------------------------------------------------------------------ adx


_NET_TYPES = {"string": "System.String", "long": "System.Int64", "int": "System.Int32", "real": "System.Double",
              "datetime": "System.DateTime", "dynamic": "System.Object", "bool": "System.SByte"}


@dataclass
class SchemaStandIn(KustoStandIn):
    """The STAND-IN, also answering `.show database <db> schema` (rows as Kusto returns them) from ``schema``."""

    schema: dict[str, dict[str, str]] = field(default_factory=dict)

    def _mgmt(self, req: Request) -> tuple[int, Any, None]:
        body = req.json()
        if re.fullmatch(r"\.show database \w+ schema", body["csl"].strip()):
            columns = [("DatabaseName", "string"), ("TableName", "string"), ("ColumnName", "string"),
                       ("ColumnType", "string"), ("IsDefaultTable", "bool"), ("IsDefaultColumn", "bool"),
                       ("PrettyName", "string"), ("Version", "string"), ("Folder", "string"), ("DocString", "string")]
            db = body["db"]
            rows: list[list[Any]] = [[db, "", "", "", False, False, "", "v1.0", "", ""]]
            for table, cols in self.schema.items():
                rows.append([db, table, "", "", False, False, "", "", "taugrid", ""])
                rows += [[db, table, c, _NET_TYPES[t], False, False, "", "", "", ""] for c, t in cols.items()]
            return 200, _v1(columns, rows), None
        return super()._mgmt(req)


@pytest.fixture
def kusto(monkeypatch: pytest.MonkeyPatch) -> Iterator[SchemaStandIn]:
    declared = json.loads((REPO_ROOT / "schemas" / "kusto" / "schema.json").read_text())["tables"]
    standin = SchemaStandIn(schema={t: dict(spec["columns"]) for t, spec in declared.items()})
    standin.up()
    monkeypatch.setenv("TRACKER_ADX__CLUSTER_URI", standin.url)
    monkeypatch.setenv("TRACKER_ADX__AUTH", "none")
    monkeypatch.setenv("TRACKER_ADX__DATABASE", "Metrics")
    yield standin
    standin.down()


ADX_ONLY = ("--skip", "kube", "--skip", "kafka")


def test_adx_healthy(capsys: pytest.CaptureFixture[str], kusto: SchemaStandIn) -> None:
    rc, checks = run_doctor(capsys, *ADX_ONLY)
    assert rc == 0, failures(checks)
    assert {name for area, name in checks if area == "adx"} == {"auth", *(f"table {t}" for t in ALL_TABLES)}
    assert checks[("adx", "auth")]["detail"] == f"none: database Metrics readable at {kusto.url}"
    [request] = kusto.of("mgmt")
    assert request.json()["csl"] == ".show database Metrics schema" and request.json()["db"] == "Metrics"


def test_adx_schema_drift(capsys: pytest.CaptureFixture[str], kusto: SchemaStandIn) -> None:
    del kusto.schema["TaugridRunPods"]
    kusto.schema["TaugridRunState"]["Attempts"] = "long"
    del kusto.schema["TaugridRunState"]["Workspace"]
    rc, checks = run_doctor(capsys, *ADX_ONLY)
    assert rc == 1 and failed(checks) == {("adx", "table TaugridRunPods"), ("adx", "table TaugridRunState")}
    assert checks[("adx", "table TaugridRunPods")]["detail"] == "missing"
    assert checks[("adx", "table TaugridRunState")]["detail"] == "Workspace missing; Attempts is long, expected int"
    assert "tracker kusto apply" in checks[("adx", "table TaugridRunState")]["fix"]


@pytest.mark.parametrize(("status", "says"), [(401, "authentication failed (none)"),
                                              (403, "authenticated, but not allowed to read database Metrics")])
def test_adx_refused(capsys: pytest.CaptureFixture[str], kusto: SchemaStandIn, status: int, says: str) -> None:
    kusto.fail("mgmt", status)
    rc, checks = run_doctor(capsys, *ADX_ONLY)
    assert rc == 1 and set(checks) == {("kube", "kube"), ("kafka", "kafka"), ("adx", "auth")}
    assert checks[("adx", "auth")]["detail"].startswith(says)


def test_adx_unreachable(capsys: pytest.CaptureFixture[str], kusto: SchemaStandIn) -> None:
    kusto.down()
    rc, checks = run_doctor(capsys, *ADX_ONLY)
    assert rc == 1 and checks[("adx", "auth")]["status"] == "fail"
    assert "443" in checks[("adx", "auth")]["fix"]


def test_adx_not_configured(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACKER_ADX__CLUSTER_URI", raising=False)
    rc, checks = run_doctor(capsys, *ADX_ONLY)
    assert rc == 0 and checks[("adx", "settings")]["status"] == "skip"
    monkeypatch.setenv("TRACKER_ADX__CLUSTER_URI", "https://example.invalid")
    monkeypatch.setenv("TRACKER_ADX__AUTH", "app-secret")
    rc, checks = run_doctor(capsys, *ADX_ONLY)
    assert rc == 1 and "needs client_id, tenant_id and client_secret" in checks[("adx", "settings")]["detail"]


# ------------------------------------------------------------------------------------------ the command


def test_the_table_says_what_is_wrong_and_how_to_fix_it() -> None:
    """As a person runs it: a process, a table on stdout, exit status 1."""
    address = f"127.0.0.1:{free_port()}"
    out = subprocess.run([sys.executable, "-m", "tracker.runtime.doctor", "doctor", "--bootstrap-servers", address,
                          "--skip", "kube", "--skip", "adx", "--timeout", "5"], capture_output=True, text=True,
                         timeout=120, check=False, cwd=REPO_ROOT)
    assert out.returncode == 1, out.stderr
    lines = out.stdout
    for text in ("tracker doctor", "How to fix", "#1", "FAIL", "unreachable", "bootstrap_servers", "SKIP",
                 "1 check(s) failed"):
        assert text in lines, text
