"""The deployment: Kubernetes manifests (deploy/k8s), docker-compose.yml, the Dockerfile's contract.

Manifests are rendered by kustomize as an SRE renders them (a plain `kubectl kustomize DIR`, no flags, with the
kubectl of the test environment's build). Without an apiserver: every pod is hardened
and probed, every container's arguments parse with the real `tracker` command line, the RBAC is exactly what the
watcher watches, and the topic definitions match the code. Against the real kube-apiserver (marked ``kube``):
every object passes a server-side dry run, and the watcher's ServiceAccount, created for real with its bindings,
can list and watch everything the watcher watches (impersonated) and is refused anything else.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.config import new_client_from_config

from tests.infra import build, compose
from tests.infra.config import REPO_ROOT
from tests.infra.fixtures import unavailable
from tests.infra.kubectl import Kubectl
from tests.infra.proc import InfraError
from tracker.cli.parser import build_parser
from tracker.settings import TopicSettings, load_settings
from tracker.shell.kafka import topic_specs, topics_document
from tracker.shell.watch import EVENTS_APIS, KubeApi, all_resources, discover

K8S = REPO_ROOT / "deploy" / "k8s"
OVERLAYS = ("scaled-out", "all-in-one")
RBAC = REPO_ROOT / "deploy" / "k8s" / "rbac" / "clusterrole.yaml"
WRITABLE = {"/var/lib/tracker", "/tmp"}  # the Dockerfile's VOLUMEs
IMAGE_USER = 10001  # the Dockerfile's USER
METRICS_PORT = 9090

Obj = dict[str, Any]


# ------------------------------------------------------------------------------------------ rendering


def kustomize_binary() -> Path:
    """A kubectl with kustomize: the test environment's build (no apiserver needed), else the one on PATH."""
    built = build.KUBERNETES.path / "bin" / "kubectl"
    binary = built if build.KUBERNETES.is_built() else shutil.which("kubectl")
    if binary is None:
        unavailable("no kubectl to render the manifests: run `python -m tests.infra up --components kube` once")
    return Path(binary)


@pytest.fixture(scope="session")
def kustomize() -> Path:
    return kustomize_binary()


def render(kubectl: Path, target: Path, tmp: Path, *, namespace: str | None = None, suffix: str = "",
           components: Sequence[Path] = ()) -> list[Obj]:
    """``kubectl kustomize`` of ``target``, optionally through an overlay that moves it to ``namespace``, appends
    ``suffix`` to every name and adds ``components``: how a test installs it beside others."""
    root = target
    if namespace or suffix or components:
        root = tmp / f"overlay-{uuid.uuid4().hex[:6]}"
        root.mkdir()
        overlay: Obj = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                        "resources": [os.path.relpath(target, root)],
                        "components": [os.path.relpath(c, root) for c in components]}
        if namespace:
            overlay["namespace"] = namespace
        if suffix:
            overlay["nameSuffix"] = suffix
        # written as JSON (which is YAML): every string quoted, so a suffix like "-819e76" is not read as a number
        # by kustomize's YAML 1.2 parser (PyYAML leaves it unquoted: a YAML 1.1 float needs a dot)
        (root / "kustomization.yaml").write_text(json.dumps(overlay, indent=2))
    out = subprocess.run([str(kubectl), "kustomize", str(root)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def overlays(kustomize: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Obj]]:
    tmp = tmp_path_factory.mktemp("render")
    return {name: render(kustomize, K8S / "overlays" / name, tmp) for name in OVERLAYS}


def of_kind(docs: Sequence[Obj], kind: str) -> list[Obj]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: Sequence[Obj], kind: str, name: str) -> Obj:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def pod_specs(docs: Sequence[Obj]) -> Iterator[tuple[str, Obj]]:
    for d in of_kind(docs, "Deployment"):
        yield d["metadata"]["name"], d["spec"]["template"]["spec"]


def matches(selector: Obj, labels: dict[str, str]) -> bool:
    ok = all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())
    for expr in selector.get("matchExpressions") or []:
        value = labels.get(expr["key"])
        ok &= value in expr["values"] if expr["operator"] == "In" else value not in expr["values"]
    return ok


# ------------------------------------------------------------------------------------------ without an apiserver


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_hardened_probed_and_sized(overlays: dict[str, list[Obj]], overlay: str) -> None:
    docs = overlays[overlay]
    assert of_kind(docs, "Deployment"), overlay
    for name, spec in pod_specs(docs):
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] == IMAGE_USER, name
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            where = f"{name}/{c['name']}"
            sc = c["securityContext"]
            assert sc == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                          "capabilities": {"drop": ["ALL"]}}, where
            assert set(c["resources"]["requests"]) == {"cpu", "memory"} and "memory" in c["resources"]["limits"], where
            # writable only where the image declares volumes; the settings ConfigMap read-only
            for m in c["volumeMounts"]:
                if "configMap" in volumes[m["name"]]:
                    assert m.get("readOnly") is True, where
                else:
                    assert m["mountPath"] in WRITABLE, where
            assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/tmp", "/etc/tracker"}, where
            env = {e["name"]: e for e in c.get("env", [])}
            assert env["TRACKER_CONFIG_FILE"]["value"] == "/etc/tracker/settings.yaml", where
            # secrets only by reference, and optional (PLAINTEXT Kafka and workload identity need none)
            for e in env.values():
                assert "value" in e or e["valueFrom"].get("fieldRef") or e["valueFrom"]["secretKeyRef"]["optional"]
        for c in spec["containers"]:  # long-running: probes on the metrics port the process serves
            where = f"{name}/{c['name']}"
            port = int({e["name"]: e.get("value") for e in c["env"]}["TRACKER_OPS__METRICS_PORT"])
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"),
                                ("readinessProbe", "/readyz")):
                assert c[probe]["httpGet"]["path"] == path, where
                assert ports[c[probe]["httpGet"]["port"]] == port, where
        uses_api = spec["serviceAccountName"] == "tracker-watcher"
        assert uses_api == any(c["args"][0] == "watch" for c in spec["containers"]), name
        if not uses_api:
            assert spec["automountServiceAccountToken"] is False, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_a_real_tracker_command(overlays: dict[str, list[Obj]], overlay: str) -> None:
    parser = build_parser()
    for name, spec in pod_specs(overlays[overlay]):
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            args = [re.sub(r"\$\((\w+)\)", "x", a) for a in c["args"]]  # $(POD_NAME): expanded by the kubelet
            try:
                parser.parse_args(args)
            except SystemExit:
                pytest.fail(f"{overlay} {name}/{c['name']}: `tracker {shlex.join(args)}` does not parse")


def test_every_compose_service_runs_a_real_tracker_command() -> None:
    parser = build_parser()
    for name, svc in yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"].items():
        if svc.get("image") == "tracker:dev":
            try:
                parser.parse_args(svc["command"])
            except SystemExit:
                pytest.fail(f"compose service {name}: `tracker {shlex.join(svc['command'])}` does not parse")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_configured_settings_load(overlays: dict[str, list[Obj]], overlay: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings file of the ConfigMap, the environment of every container and the ADX ConfigMap are what the
    tracker's own loaders accept (they refuse unknown keys), and put state where the volumes are."""
    docs = overlays[overlay]
    path = tmp_path / "settings.yaml"
    path.write_text(named(docs, "ConfigMap", _generated(docs, "tracker-settings"))["data"]["settings.yaml"])
    for name, spec in pod_specs(docs):
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            with monkeypatch.context() as env:
                for e in c.get("env", []):
                    if "value" in e and e["name"].startswith("TRACKER_") and e["name"] != "TRACKER_CONFIG_FILE":
                        env.setenv(e["name"], e["value"])
                settings = load_settings(path)
            assert settings.kafka.enabled and settings.ops.metrics_host in ("127.0.0.1", "0.0.0.0"), name
            assert settings.sink.index_path is not None and settings.sink.index_path.parent == Path("/var/lib/tracker")
    for d in of_kind(docs, "ConfigMap"):
        if d["metadata"]["name"].startswith("tracker-adx-settings-"):
            with monkeypatch.context() as env:
                for key, value in d["data"].items():
                    env.setenv(key, value)
                adx = load_settings().adx
            assert adx.spool_dir.parent == Path("/var/lib/tracker") and adx.auth == "workload-identity"


def test_scaled_out_topology(overlays: dict[str, list[Obj]]) -> None:
    docs = overlays["scaled-out"]
    deployments = {d["metadata"]["name"]: d for d in of_kind(docs, "Deployment")}
    assert set(deployments) == {"tracker-watcher", "tracker-reducer", "tracker-sink-index", "tracker-sink-adx"}
    watcher = deployments["tracker-watcher"]
    assert watcher["spec"]["replicas"] == 2
    args = watcher["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--lease-namespace=$(POD_NAMESPACE)" in args and "--identity=$(POD_NAME)" in args
    settings = yaml.safe_load(named(docs, "ConfigMap", _generated(docs, "tracker-settings"))["data"]["settings.yaml"])
    assert 1 <= deployments["tracker-reducer"]["spec"]["replicas"] <= settings["kafka"]["topics"]["partitions"]
    for single in ("tracker-sink-index", "tracker-sink-adx"):  # one writer per ReadWriteOnce volume
        assert deployments[single]["spec"]["replicas"] == 1
        assert deployments[single]["spec"]["strategy"] == {"type": "Recreate"}
    budgets = {d["metadata"]["name"]: d["spec"] for d in of_kind(docs, "PodDisruptionBudget")}
    assert budgets == {"tracker-watcher": {"minAvailable": 1, "selector": {"matchLabels": _labels(watcher)}},
                       "tracker-reducer": {"maxUnavailable": 1,
                                           "selector": {"matchLabels": _labels(deployments["tracker-reducer"])}}}
    for claim in of_kind(docs, "PersistentVolumeClaim"):
        users = [n for n, spec in pod_specs(docs)
                 if any(v.get("persistentVolumeClaim", {}).get("claimName") == claim["metadata"]["name"]
                        for v in spec["volumes"])]
        assert len(users) == 1 and deployments[users[0]]["spec"]["replicas"] == 1, claim["metadata"]["name"]


def test_all_in_one_is_one_pod_with_the_index_on_a_volume(overlays: dict[str, list[Obj]]) -> None:
    docs = overlays["all-in-one"]
    [deployment] = of_kind(docs, "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert [c["args"][0] for c in spec["containers"]] == ["watch", "serve"]  # serve last: see test_scraping
    assert [c["args"] for c in spec["initContainers"]] == [["topics", "create"]]
    [claim] = of_kind(docs, "PersistentVolumeClaim")
    state = next(v["name"] for v in spec["volumes"]
                 if v.get("persistentVolumeClaim", {}).get("claimName") == claim["metadata"]["name"])
    for c in spec["containers"]:
        assert {"name": state, "mountPath": "/var/lib/tracker"} in c["volumeMounts"]
    settings = yaml.safe_load(named(docs, "ConfigMap", _generated(docs, "tracker-settings"))["data"]["settings.yaml"])
    assert Path(settings["sink"]["index_path"]).parent == Path("/var/lib/tracker")
    ports = [p["containerPort"] for c in spec["containers"] for p in c["ports"]]
    assert len(ports) == len(set(ports)), "containers of one pod share its ports"
    service_ports = {p["targetPort"] for p in named(docs, "Service", "tracker-metrics")["spec"]["ports"]}
    assert service_ports == {p["name"] for c in spec["containers"] for p in c["ports"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_allows_only_dns_kafka_apiserver_adx(overlays: dict[str, list[Obj]], overlay: str) -> None:
    docs = overlays[overlay]
    policies = of_kind(docs, "NetworkPolicy")
    deny = [p for p in policies if p["spec"]["podSelector"] == {}]
    assert len(deny) == 1 and deny[0]["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in deny[0]["spec"] and "egress" not in deny[0]["spec"]
    for name, spec in pod_specs(docs):
        deployment = named(docs, "Deployment", name)
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        egress = {(p["protocol"], p["port"]) for pol in policies if matches(pol["spec"]["podSelector"], labels)
                  for rule in pol["spec"].get("egress", []) for p in rule["ports"]}
        wanted = {("UDP", 53), ("TCP", 53), ("TCP", 9092), ("TCP", 9093)}
        commands = {c["args"][0] if c["args"][0] != "sink" else f"sink {c['args'][1]}" for c in spec["containers"]}
        if "watch" in commands:
            wanted |= {("TCP", 443), ("TCP", 6443)}
        if "sink adx" in commands:
            wanted |= {("TCP", 443)}
        assert egress == wanted, name
        ingress = {p["port"] for pol in policies if matches(pol["spec"]["podSelector"], labels)
                   for rule in pol["spec"].get("ingress", []) for p in rule["ports"]}
        assert ingress == {p["containerPort"] for c in spec["containers"] for p in c["ports"]}, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_metrics_service_selects_every_pod(overlays: dict[str, list[Obj]], overlay: str) -> None:
    docs = overlays[overlay]
    service = named(docs, "Service", "tracker-metrics")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    for d in of_kind(docs, "Deployment"):
        template = d["spec"]["template"]
        assert matches({"matchLabels": service["spec"]["selector"]}, template["metadata"]["labels"])
        assert template["metadata"]["annotations"]["prometheus.io/port"] == str(METRICS_PORT)
    service_ports = {p["targetPort"] for p in service["spec"]["ports"]}
    for _, spec in pod_specs(docs):  # every metrics port of every container is in the Service
        assert {p["name"] for c in spec["containers"] for p in c["ports"]} <= service_ports


def adxmon_targets(pod: Obj) -> list[str]:
    """The URLs (path and port) adx-mon's collector scrapes on a pod, as collector/scraper.go `makeTargets` picks
    them (Azure/adx-mon 905bfa4): opted in by adx-mon/scrape; adx-mon/targets (path:port pairs) if set, else the
    one adx-mon/port (with adx-mon/path, default /metrics), else every container port. A port matches a container
    port's number or name, or the port of its readiness or liveness probe. It then keeps one target per pod (its
    map is keyed by the pod's UID): the last of these, which is what this returns last."""
    annotations = pod["metadata"].get("annotations", {})
    if annotations.get("adx-mon/scrape", "false").lower() != "true":
        return []
    path = annotations.get("adx-mon/path") or "/metrics"
    wanted = dict(reversed(pair.split(":")) for pair in annotations.get("adx-mon/targets", "").split(",") if pair)
    port = annotations.get("adx-mon/port", "")
    found: list[str] = []
    for c in pod["spec"]["containers"]:
        probes = [str(c[p]["httpGet"]["port"]) for p in ("readinessProbe", "livenessProbe") if p in c]
        for cp in c.get("ports", []):
            names = {str(cp["containerPort"]), cp.get("name", ""), *probes}
            if wanted:
                found += [f"{wanted.pop(n)}:{cp['containerPort']}/{c['name']}" for n in sorted(names) if n in wanted]
            elif port:
                if port in names:
                    return [f"{path}:{cp['containerPort']}/{c['name']}"]
            else:
                found.append(f"{path}:{cp['containerPort']}/{c['name']}")
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scraping_by_annotations(overlays: dict[str, list[Obj]], overlay: str) -> None:
    """Every pod is scraped by Prometheus' annotation convention and by adx-mon's collector, on its metrics port.
    Both conventions take one port per pod: the all-in-one pod's two (serve's and watch's) are both named for
    adx-mon (adx-mon/targets), which today keeps the last container's, serve's (the reducer's and index sink's
    families, most of the alert rules'); the ServiceMonitor component scrapes both ports."""
    for d in of_kind(overlays[overlay], "Deployment"):
        template = d["spec"]["template"]
        annotations = template["metadata"]["annotations"]
        assert {k: annotations[k] for k in ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")} == {
            "prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT), "prometheus.io/path": "/metrics"}
        ports = [(c["name"], p["containerPort"]) for c in template["spec"]["containers"] for p in c["ports"]]
        targets = adxmon_targets(template)
        assert sorted(targets) == sorted(f"/metrics:{port}/{name}" for name, port in ports), d["metadata"]["name"]
        assert targets[-1] == f"/metrics:{METRICS_PORT}/{'serve' if overlay == 'all-in-one' else ports[0][0]}"


def test_adxmon_target_selection_follows_the_collector() -> None:
    """adxmon_targets as adx-mon picks: one port by number or probe name, a list of targets, or every port."""
    container = {"name": "c", "ports": [{"name": "metrics", "containerPort": 9090}, {"containerPort": 8080}],
                 "readinessProbe": {"httpGet": {"port": "metrics"}}}
    def pod(**annotations: str) -> Obj:
        return {"metadata": {"annotations": annotations}, "spec": {"containers": [container]}}
    assert adxmon_targets(pod(**{"adx-mon/port": "9090"})) == []  # not opted in
    assert adxmon_targets(pod(**{"adx-mon/scrape": "true", "adx-mon/port": "metrics", "adx-mon/path": "/m"})) == [
        "/m:9090/c"]
    assert adxmon_targets(pod(**{"adx-mon/scrape": "true"})) == ["/metrics:9090/c", "/metrics:8080/c"]
    assert adxmon_targets(pod(**{"adx-mon/scrape": "true", "adx-mon/targets": "/a:8080,/b:9090"})) == [
        "/b:9090/c", "/a:8080/c"]


def test_servicemonitor_component_scrapes_every_service_port(kustomize: Path, tmp_path: Path) -> None:
    for overlay in OVERLAYS:
        docs = render(kustomize, K8S / "overlays" / overlay, tmp_path,
                      components=[K8S / "components" / "servicemonitor"])
        [monitor] = of_kind(docs, "ServiceMonitor")
        service = named(docs, "Service", "tracker-metrics")
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
        assert matches(monitor["spec"]["selector"], service["metadata"]["labels"])
        endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
        assert {p["name"] for p in service["spec"]["ports"]} <= set(endpoints), overlay
        assert all(e["path"] == "/metrics" for e in endpoints.values())


def kustomizations() -> list[Path]:
    """Every directory with a kustomization (overlays, base, RBAC, topics, components)."""
    return sorted(p.parent for p in K8S.rglob("kustomization.yaml"))


def test_every_kustomization_renders_without_flags(kustomize: Path, tmp_path: Path) -> None:
    """`kubectl kustomize DIR` with no flag (no --load-restrictor) renders every overlay, and every component on
    each overlay: nothing reads a file outside its kustomization's directory."""
    dirs = kustomizations()
    components = [d for d in dirs if yaml.safe_load((d / "kustomization.yaml").read_text())["kind"] == "Component"]
    assert {d.name for d in components} >= {"workload-identity", "servicemonitor", "prometheus-rules"}
    assert {d.name for d in dirs} >= {*OVERLAYS, "base", "rbac", "strimzi-topics"}
    for d in dirs:
        if d in components:
            for overlay in OVERLAYS:
                assert render(kustomize, K8S / "overlays" / overlay, tmp_path, components=[d])
            continue
        out = subprocess.run([str(kustomize), "kustomize", str(d)], capture_output=True, text=True, timeout=120,
                             check=False)
        assert out.returncode == 0 and not out.stderr.strip(), (d, out.stderr)
    for path in [*K8S.rglob("*.yaml"), REPO_ROOT / "deploy" / "README.md"]:  # no instruction needs the flag
        assert "load-restrictor" not in path.read_text(), path


def project_version() -> str:
    match = re.search(r'^version = "([^"]+)"$', (REPO_ROOT / "pyproject.toml").read_text(), re.M)
    assert match
    return match.group(1)


PLACEHOLDER_IMAGE = "registry.example.invalid/taugrid/tracker"  # deploy/README.md: the one to replace


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_fully_qualified_and_pinned(overlays: dict[str, list[Obj]], overlay: str) -> None:
    """A registry host (with a dot), a repository and the project's version as tag (or a digest); never :latest
    nor a bare name a runtime would resolve against its default registry."""
    for name, spec in pod_specs(overlays[overlay]):
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            image = c["image"]
            m = re.fullmatch(r"(?P<host>[a-z0-9.-]+\.[a-z]+(?::\d+)?)/(?P<repo>[a-z0-9._/-]+)"
                             r"(?::(?P<tag>[\w.-]+))?(?:@sha256:[0-9a-f]{64})?", image)
            assert m and (m["tag"] or "@sha256:" in image), (name, image)
            assert m["tag"] != "latest", (name, image)
            assert image == f"{PLACEHOLDER_IMAGE}:{project_version()}", (name, image)
    assert PLACEHOLDER_IMAGE in (REPO_ROOT / "deploy" / "README.md").read_text()


def test_the_rbac_is_exactly_what_the_watcher_watches(overlays: dict[str, list[Obj]]) -> None:
    """deploy/k8s/rbac/clusterrole.yaml is used as it is (not a copy), and its ClusterRole grants get/list/watch on
    every resource of the watcher's streams (both Event APIs, which --events-api chooses from) and nothing else."""
    original = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(RBAC.read_text()) if d}
    for overlay in OVERLAYS:
        docs = overlays[overlay]
        for (kind, name), doc in original.items():
            rendered = named(docs, kind, name)
            for key in ("rules", "roleRef", "subjects"):
                assert rendered.get(key) == doc.get(key), (overlay, kind, name, key)
    rules = named(overlays["scaled-out"], "ClusterRole", "tracker-watcher")["rules"]
    assert all("resourceNames" not in r for r in rules)
    # read-only: what is watched, get/list/watch; Kueue's visibility API (pending workloads), get
    visibility = [r for r in rules if r["apiGroups"] == ["visibility.kueue.x-k8s.io"]]
    assert visibility == [{"apiGroups": ["visibility.kueue.x-k8s.io"], "verbs": ["get"],
                           "resources": ["clusterqueues/pendingworkloads", "localqueues/pendingworkloads"]}]
    rules = [r for r in rules if r not in visibility]
    assert all(r["verbs"] == ["get", "list", "watch"] for r in rules)
    granted = {(g, res) for r in rules for g in r["apiGroups"] for res in r["resources"]}
    watched = {(res.group, res.plural) for api in EVENTS_APIS for res in all_resources(api)}
    assert granted == watched
    roles = of_kind(overlays["scaled-out"], "Role")
    assert [r["metadata"]["name"] for r in roles] == ["tracker-watcher-lease"]
    lease_rules = roles[0]["rules"]
    assert {(tuple(r["resources"]), tuple(r.get("resourceNames", ())), tuple(r["verbs"])) for r in lease_rules} == {
        (("leases",), ("tracker-watcher",), ("get", "update")), (("leases",), (), ("create",))}
    rbac_kinds = ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")
    for docs in overlays.values():  # no RBAC but that file's
        assert {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in rbac_kinds} == {
            key for key in original if key[0] in rbac_kinds}


def test_workload_identity_component(kustomize: Path, tmp_path: Path) -> None:
    docs = render(kustomize, K8S / "overlays" / "scaled-out", tmp_path,
                  components=[K8S / "components" / "workload-identity"])
    for sa in of_kind(docs, "ServiceAccount"):
        assert re.fullmatch(r"[0-9a-f-]{36}", sa["metadata"]["annotations"]["azure.workload.identity/client-id"])
    for d in of_kind(docs, "Deployment"):
        assert d["spec"]["template"]["metadata"]["labels"]["azure.workload.identity/use"] == "true"
        assert "azure.workload.identity/use" not in d["spec"]["selector"]["matchLabels"]


def test_topic_definitions_match_the_code(kustomize: Path, tmp_path: Path) -> None:
    specs = topic_specs(TopicSettings())
    reference = yaml.safe_load((REPO_ROOT / "deploy" / "kafka" / "topics.yaml").read_text())
    assert reference == topics_document(TopicSettings())
    strimzi = {d["metadata"]["name"]: d for d in render(kustomize, K8S / "strimzi-topics", tmp_path)}
    assert set(strimzi) == {s.name for s in specs}
    for s in specs:
        topic = strimzi[s.name]
        assert topic["apiVersion"] == "kafka.strimzi.io/v1beta2" and topic["kind"] == "KafkaTopic"
        assert topic["metadata"]["labels"]["strimzi.io/cluster"]
        assert topic["spec"] == {"partitions": s.partitions, "replicas": s.replication_factor, "config": s.configs}


def test_compose_stack(tmp_path: Path) -> None:
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"kafka", "topics", "watch", "reduce", "sink-index", "kusto", "kusto-apply", "sink-adx"}
    kafka_env = services["kafka"]["environment"]
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert kafka_env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert kafka_env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093"
    for key in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"):  # transactions on one broker
        assert kafka_env[key] == 1, key
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)  # loopback only
        if name in ("kafka", "kusto"):
            assert svc.get("profiles") == (["adx"] if name == "kusto" else None)
            continue
        assert svc["image"] == "tracker:dev" and svc["build"] == "."
        assert svc["read_only"] is True and svc["user"] == f"{IMAGE_USER}:{IMAGE_USER}" and svc["cap_drop"] == ["ALL"]
        for volume in svc.get("volumes", []):
            target = volume.removesuffix(":ro").rsplit(":", 1)[1]
            assert target in WRITABLE or volume.endswith(":ro"), (name, volume)
        env = svc["environment"]
        if svc["command"][0] != "kusto":
            assert env["TRACKER_KAFKA__BOOTSTRAP_SERVERS"] == "kafka:9092"
            assert env["TRACKER_KAFKA__TOPICS__REPLICATION_FACTOR"] == "1"
            assert svc["depends_on"]["topics" if name != "topics" else "kafka"]["condition"] in (
                "service_completed_successfully", "service_healthy")
        if name in ("kusto-apply", "sink-adx"):
            assert svc["profiles"] == ["adx"] and env["TRACKER_ADX__AUTH"] == "none"
            assert env["TRACKER_ADX__CLUSTER_URI"] == "http://kusto:8080"
    assert services["watch"]["volumes"][0].endswith(":/kube/config:ro")
    assert services["topics"]["command"] == ["topics", "create"] and services["topics"]["restart"] == "no"


@pytest.mark.parametrize("env", [{}, {"KUBECONFIG": "/home/sre/.kube/kind", "KUSTO_EMULATOR_IMAGE": "kustainer:1"}],
                         ids=["defaults", "variables-set"])
def test_compose_config(compose_schema: Path, env: dict[str, str]) -> None:
    """What `docker compose config` checks, without Docker (`tests.infra.compose`): the file against the Compose
    Specification's JSON schema as compose-go ships it, after interpolating every ``${VAR:-default}`` (each
    variable it uses has a default), and the references a schema cannot see (depends_on, volumes, networks, env
    files, the build context and Dockerfile, host ports), with and without the ``adx`` profile."""
    schema = json.loads(compose_schema.read_text())
    for profiles in ([], ["adx"]):
        services = compose.load(REPO_ROOT / "docker-compose.yml", schema, env=env, profiles=profiles)["services"]
        assert ("sink-adx" in services) == bool(profiles) and ("kusto" in services) == bool(profiles)
        assert services["reduce"]["read_only"] is True
        assert services["sink-index"]["depends_on"]["topics"]["condition"] == "service_completed_successfully"
        assert services["sink-index"]["environment"]["TRACKER_KAFKA__BOOTSTRAP_SERVERS"] == "kafka:9092"  # merged
        kubeconfig = next(v for v in services["watch"]["volumes"] if v["target"] == "/kube/config")
        assert kubeconfig == {"type": "bind", "source": env.get("KUBECONFIG", "~/.kube/config"),
                              "target": "/kube/config", "read_only": True}
        if profiles:
            assert services["kusto"]["image"] == env.get("KUSTO_EMULATOR_IMAGE", "kustainer-linux")
            assert services["sink-adx"]["environment"]["TRACKER_ADX__AUTH"] == "none"  # both anchors merged


def test_dockerfile_contract() -> None:
    """What the manifests rely on: the user, the volumes, the port, the entrypoint, the health check; and what the
    build context must carry for the commands that read files of the source tree at run time."""
    text = (REPO_ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+) AS (\w+)$", text, re.M)
    assert [s for _, s in stages] == ["build", "runtime"]
    assert re.search(r"uv sync --frozen --no-dev --no-install-project", text)
    # the core is plain Python unless asked; compiled, by the build script of ./run compile, and the compile group
    # (mypy, setuptools) removed again before the runtime stage copies the environment
    assert re.search(r"^ARG TRACKER_CORE=pure$", text, re.M)
    compiled = re.search(r"compiled\) (.+?);;", text, re.S)
    assert compiled and ".venv/bin/python deploy/compiled/build_core.py" in compiled.group(1)
    assert compiled.group(1).rstrip(" \\\n").endswith("uv sync --frozen --no-dev")
    assert re.search(r"^USER 10001:10001$", text, re.M)
    assert 'VOLUME ["/var/lib/tracker", "/tmp"]' in text
    assert re.search(r"^EXPOSE 9090$", text, re.M) and "TRACKER_OPS__METRICS_PORT=9090" in text
    assert re.search(r'^ENTRYPOINT \["tracker"\]$', text, re.M)
    assert re.search(r"^HEALTHCHECK .*\n\s+CMD .*/healthz", text, re.M)
    copied = {src.rstrip("/") for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M)
              for src in line.split()[:-1]}
    ignore = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    included = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert copied == included, copied ^ included
    for path in included:
        assert (REPO_ROOT / path).exists(), path
    # the files read at run time from the source tree are in the image
    from tracker.runtime import doctor
    from tracker.shell import kusto_apply

    for needed in (doctor.RBAC_FILE, doctor.KUSTO_SCHEMA, kusto_apply.SCHEMA_DIR):
        assert any(needed.relative_to(REPO_ROOT).parts[: len(Path(p).parts)] == Path(p).parts for p in included), needed


# ------------------------------------------------------------------------------------------ against the apiserver


@pytest.fixture
def install(kubectl: Kubectl, kustomize: Path, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A namespace and a name suffix to install a rendering under; cluster-scoped objects removed afterwards."""
    namespace, suffix = f"tracker-{uuid.uuid4().hex[:6]}", f"-{uuid.uuid4().hex[:6]}"
    kubectl.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
    yield namespace, suffix
    for kind in ("clusterrolebinding", "clusterrole"):
        kubectl.run("delete", kind, f"tracker-watcher{suffix}", "--ignore-not-found", "--wait=false")
    kubectl.delete_namespace(namespace)


def apply(kubectl: Kubectl, docs: Sequence[Obj], *dry_run: str) -> str:
    return kubectl.run("apply", "--server-side", "--field-manager=tracker-test", *dry_run, "-f", "-",
                       stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)}))


@pytest.mark.kube
@pytest.mark.parametrize("overlay", [*OVERLAYS, "scaled-out+workload-identity"])
def test_every_manifest_passes_a_server_side_dry_run(kubectl: Kubectl, kustomize: Path, tmp_path: Path,
                                                     install: tuple[str, str], overlay: str) -> None:
    """The namespace is created for real, as rendered: it enforces (and warns about) the `restricted` Pod Security
    Standard, which the apiserver evaluates on every pod template of the dry run; no warning may come back."""
    namespace, suffix = install
    name, _, component = overlay.partition("+")
    docs = render(kustomize, K8S / "overlays" / name, tmp_path, namespace=namespace, suffix=suffix,
                  components=[K8S / "components" / component] if component else [])
    [ns] = of_kind(docs, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    apply(kubectl, [ns])
    out = subprocess.run([str(kubectl.binary), f"--kubeconfig={kubectl.kubeconfig}", "apply", "--server-side",
                          "--field-manager=tracker-test", "--dry-run=server", "-f", "-"],
                         input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}), capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
    for d in docs:
        assert re.search(rf"^\S*{d['kind'].lower()}\S*/{re.escape(d['metadata']['name'])} serverside-applied "
                         r"\(server dry run\)$", out.stdout, re.M), (d["kind"], d["metadata"]["name"], out.stdout)
    assert not kubectl.run("get", "deployments,networkpolicies", f"--namespace={namespace}", "-o", "name").strip()


@pytest.mark.kube
def test_the_watcher_account_can_watch_everything_it_needs_and_nothing_else(
        kubectl: Kubectl, kustomize: Path, tmp_path: Path, install: tuple[str, str]) -> None:
    namespace, suffix = install
    docs = render(kustomize, K8S / "overlays" / "scaled-out", tmp_path, namespace=namespace, suffix=suffix)
    rbac = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                             "RoleBinding")]
    apply(kubectl, rbac)
    watcher = f"system:serviceaccount:{namespace}:tracker-watcher{suffix}"
    other = f"system:serviceaccount:{namespace}:tracker{suffix}"

    def as_(user: str, *args: str) -> str:
        return kubectl.run(*args, f"--as={user}")

    def refused(user: str, *args: str) -> None:
        with pytest.raises(InfraError) as denied:
            as_(user, *args)
        assert f'is forbidden: User "{user}" cannot' in str(denied.value), (args, str(denied.value))  # a 403

    # sufficient: list and watch every collection of every stream the watcher runs, at the version it reads
    versions = asyncio.run(served_versions(kubectl.kubeconfig))
    for api in EVENTS_APIS:
        for res in all_resources(api):
            path = res.collection_path(versions[(res.group, res.plural)], None)
            selector = [f"labelSelector={res.label_selector}"] if res.label_selector else []
            listed = json.loads(as_(watcher, "get", "--raw", f"{path}?{'&'.join(['limit=1', *selector])}"))
            assert listed["kind"].endswith("List"), path
            as_(watcher, "get", "--raw", f"{path}?watch=1&timeoutSeconds=1&allowWatchBookmarks=true")
    # and its Lease: create, get, update
    lease: Obj = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                  "metadata": {"name": "tracker-watcher", "namespace": namespace}, "spec": {"holderIdentity": "a"}}
    created = json.loads(kubectl.run("create", "-f", "-", "-o", "json", f"--as={watcher}", stdin=json.dumps(lease)))
    as_(watcher, "get", "lease/tracker-watcher", f"--namespace={namespace}")
    created["spec"]["holderIdentity"] = "b"
    kubectl.run("replace", "-f", "-", f"--as={watcher}", stdin=json.dumps(created))

    # minimal: anything else is refused
    refused(watcher, "get", "secrets", "--all-namespaces")
    refused(watcher, "get", "configmaps", f"--namespace={namespace}")
    refused(watcher, "create", "job", "x", "--image=busybox", f"--namespace={namespace}", "--dry-run=server")
    kubectl.apply([{"apiVersion": f"kueue.x-k8s.io/{versions[('kueue.x-k8s.io', 'workloads')]}", "kind": "Workload",
                    "metadata": {"name": "w", "namespace": namespace},
                    "spec": {"queueName": "q", "podSets": [{"name": "main", "count": 1, "template": {
                        "spec": {"containers": [{"name": "c", "image": "x"}]}}}]}}])
    as_(watcher, "get", "workloads.kueue.x-k8s.io/w", f"--namespace={namespace}")
    refused(watcher, "patch", "workloads.kueue.x-k8s.io/w", f"--namespace={namespace}", "--type=merge",
            "-p", '{"spec": {"active": false}}')
    refused(watcher, "delete", "pod", "x", f"--namespace={namespace}", "--dry-run=server")
    refused(watcher, "delete", "clusterqueues.kueue.x-k8s.io/x", "--dry-run=server")
    refused(watcher, "get", "resourceflavors.kueue.x-k8s.io")
    refused(watcher, "get", "lease/another", f"--namespace={namespace}")
    refused(watcher, "delete", "lease/tracker-watcher", f"--namespace={namespace}")
    refused(watcher, "get", "leases", "--namespace=default")
    # the reducer's and sinks' account reads nothing at all
    refused(other, "get", "pods", "--all-namespaces")
    refused(other, "get", "jobs", f"--namespace={namespace}")


async def served_versions(kubeconfig: Path) -> dict[tuple[str, str], str]:
    """The version each watched resource is served at, found by the watcher's own discovery."""
    found: dict[tuple[str, str], str] = {}
    async with await new_client_from_config(config_file=str(kubeconfig)) as client:
        api = KubeApi(client)
        for events_api in EVENTS_APIS:
            for res in all_resources(events_api):
                version = await discover(api, res)
                assert version is not None, res
                found[(res.group, res.plural)] = version
    return found


def _generated(docs: Sequence[Obj], prefix: str) -> str:
    """The name kustomize gave a generated ConfigMap (with its content hash)."""
    names = [str(d["metadata"]["name"]) for d in of_kind(docs, "ConfigMap")
             if re.fullmatch(rf"{prefix}-[a-z0-9]{{10}}", d["metadata"]["name"])]
    assert len(names) == 1, names
    return names[0]


def _labels(deployment: Obj) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["selector"]["matchLabels"]
    return labels


def test_a_name_suffix_that_looks_like_a_number_stays_a_name(kustomize: Path, tmp_path: Path) -> None:
    """Random suffixes such as "-819e76" are numbers to kustomize's YAML parser unless quoted (seen in CI)."""
    docs = render(kustomize, K8S / "base", tmp_path, namespace="ns-819e76", suffix="-819e76")
    names = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
    assert names and all(n.endswith("-819e76") for n in names)
