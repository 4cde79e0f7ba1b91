"""The simulated cluster on top of the control plane: scheduler, controller-manager, kwok GPU nodes, Kueue, KubeRay.

Pods land on kwok nodes, go Running, then Succeeded after a few seconds (kwok "general" pod
stages; delays are tunable per pod with `pod-*.stage.kwok.x-k8s.io/delay` annotations).
Kueue runs out of cluster with no admission webhooks: Jobs and RayJobs it should manage must be created with
`spec.suspend: true` (its mutating webhook would otherwise set that). Kueue 0.17's conversion webhook is
registered (v1beta1 <-> v1beta2), by URL on loopback. The KubeRay operator runs out of cluster too; it reaches
each Ray head's dashboard (`http://<cluster>-head-svc.<ns>.svc.cluster.local:8265`) through the HTTP proxy named
in its environment, where the tests serve a stand-in of the Ray dashboard's job API
(`tests/support/ray_dashboard_standin.py`).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.infra import build
from tests.infra.config import KUEUE_BASE_CRDS_VERSION, KUEUE_VERSION
from tests.infra.kube import SERVICE_CIDR
from tests.infra.kubectl import Kubectl, Manifest
from tests.infra.pki import Pki
from tests.infra.proc import InfraError, Launcher, Process, free_port, http_ok, log, wait_for

_STARTUP_TIMEOUT = 120.0
#: controller-runtime reads Kueue's metrics serving cert from this fixed path when internal cert
#: management is off (kueue v0.12 cmd/kueue/main.go); it exits at start-up if the files are missing.
KUEUE_METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
KUEUE_NAMESPACE = "kueue-system"

RESOURCE_FLAVOR = "default-flavor"
CLUSTER_QUEUE = "cluster-queue"
LOCAL_QUEUE = "user-queue"
#: LocalQueue created by `up`; test namespaces get their own with the same name.
LOCAL_QUEUE_NAMESPACE = "default"
PRIORITY_CLASSES = {"low": 100, "high": 1000}
GPU = "nvidia.com/gpu"
NODES = ("kwok-gpu-0", "kwok-gpu-1")
_CPUS, _MEMORY_GI, _GPUS = 32, 256, 4  # per node
NODE_CAPACITY = {"cpu": str(_CPUS), "memory": f"{_MEMORY_GI}Gi", "pods": "110", GPU: str(_GPUS)}
#: The ClusterQueue's nominal quota is exactly what the nodes hold, so quota is the bottleneck.
CLUSTER_QUOTA = {
    "cpu": str(_CPUS * len(NODES)),
    "memory": f"{_MEMORY_GI * len(NODES)}Gi",
    GPU: str(_GPUS * len(NODES)),
}


#: Kueue's waitForPodsReady, short enough for tests to see it act: a Workload whose pods are not all ready this long
#: after admission is evicted (PodsReadyTimeout), requeued after a backoff of BASE·2^(n-1) s (at most MAX), and
#: deactivated at the timeout after BACKOFF_LIMIT requeues. Pods of the kwok "general" stages are ready 2-12 s after
#: they are bound; a pod that fails gets RECOVERY to be replaced before the Workload is evicted.
PODS_READY_TIMEOUT_S = 25
PODS_READY_RECOVERY_TIMEOUT_S = 60
REQUEUING_BACKOFF_LIMIT = 1
REQUEUING_BACKOFF_BASE_S = 1
REQUEUING_BACKOFF_MAX_S = 4
#: A kwok Stage of our own ("kwok can fail a pod"): a Ready pod labelled FAIL_FIRST_TRY_LABEL=true whose Indexed Job
#: has backoffLimitPerIndex fails (exit 1) while it is its index's first try, i.e. while the Job controller's
#: `batch.kubernetes.io/job-index-failure-count` annotation is "0"; the replacement pod (count "1") succeeds.
FAIL_FIRST_TRY_LABEL = "tracker-test/fail-first-try"
#: What the KubeRay operator is told: every dashboard request goes through this HTTP proxy, where the tests serve the
#: Ray dashboard stand-in (the real dashboard runs in the Ray head container, which kwok does not run).
CLUSTER_DOMAIN = "cluster.local"


@dataclass(frozen=True)
class ClusterInstance:
    processes: tuple[Process, ...]
    #: `host:port` of the HTTP proxy the KubeRay operator sends its Ray dashboard requests to.
    ray_dashboard_proxy: str


def start(state: Path, *, kubeconfig: Path, pki_dir: Path) -> ClusterInstance:
    """Start scheduler, controller-manager, kwok, Kueue and the KubeRay operator against the running apiserver."""
    kubernetes_bin = build.KUBERNETES.ensure() / "bin"
    kwok_dir = build.KWOK.ensure()
    kueue_binary = build.KUEUE.ensure() / "bin" / "kueue"
    kueue_crds = build.KUEUE_CRDS.ensure()
    kuberay_binary = build.KUBERAY.ensure() / "bin" / "ray-operator"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    kubectl = Kubectl(kubernetes_bin / "kubectl", kubeconfig)
    with Launcher() as launcher:
        # Everything is spawned first and awaited after: they start up concurrently.
        pki = Pki(pki_dir)
        starter = _Starter(launcher, state=state, kubeconfig=kubeconfig, pki=pki)
        starter.scheduler(kubernetes_bin / "kube-scheduler")
        starter.controller_manager(kubernetes_bin / "kube-controller-manager")
        starter.kwok(kwok_dir)
        kubectl.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}}])
        webhook_port = free_port()
        install_kueue_crds(kubectl, kueue_crds, state=state, webhook_port=webhook_port, ca=pki.ensure_ca().cert)
        starter.kueue(kueue_binary, webhook_port=webhook_port)
        proxy = f"127.0.0.1:{free_port()}"
        starter.kuberay(kuberay_binary, dashboard_proxy=proxy)
        kubectl.apply(_node(name) for name in NODES)
        starter.wait_ready()
        kubectl.wait(*(f"node/{name}" for name in NODES), condition="Ready", timeout=_STARTUP_TIMEOUT)
        kubectl.apply(_queue_objects())
        kubectl.wait(f"clusterqueue/{CLUSTER_QUEUE}", condition="Active", timeout=_STARTUP_TIMEOUT)
        kubectl.wait(
            f"localqueue/{LOCAL_QUEUE}", namespace=LOCAL_QUEUE_NAMESPACE, condition="Active", timeout=_STARTUP_TIMEOUT
        )
    return ClusterInstance(processes=tuple(launcher.processes), ray_dashboard_proxy=proxy)


def install_kueue_crds(kubectl: Kubectl, artifact: Path, *, state: Path, webhook_port: int, ca: Path) -> None:
    """Apply over the bare control plane's Kueue CRDs (Kueue 0.12's, v1beta1) with those of the Kueue the cluster runs.

    Kueue 0.15+ serves v1beta1 and v1beta2 and stores v1beta2; the patches upstream's kustomization applies
    (`config/components/crd/patches/webhook_in_*.yaml`) route the conversion of five of its CRDs to Kueue's webhook
    server (`/convert`). The same `spec.conversion` is set here with the server's loopback URL and our CA, so a
    v1beta1 client (and the tests' v1beta1 queue objects) is converted by Kueue itself, as in a cluster. A no-op when
    the cluster runs the base Kueue.
    """
    if KUEUE_VERSION == KUEUE_BASE_CRDS_VERSION:
        return
    converted = {_crd_name(path) for path in (artifact / "conversion").glob("webhook_in_*.yaml")}
    webhook = {
        "strategy": "Webhook",
        "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {
                "url": f"https://127.0.0.1:{webhook_port}/convert",
                "caBundle": base64.b64encode(ca.read_bytes()).decode(),
            },
        },
    }
    out = state / "kueue-crds"
    out.mkdir()
    crds = []
    for path in sorted((artifact / "crds").glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        if crd["metadata"]["name"] in converted:
            crd["spec"]["conversion"] = webhook
        (out / f"{path.stem}.json").write_text(json.dumps(crd))
        crds.append(crd)
    # A CRD whose stored versions the new one drops (0.12's Cohort and Topology stored v1alpha1) cannot be updated:
    # it is deleted (nothing of it exists before Kueue runs) and created anew.
    installed = json.loads(kubectl.run("get", "crd", "-o", "json", *(c["metadata"]["name"] for c in crds)))
    names = {c["metadata"]["name"]: {v["name"] for v in c["spec"]["versions"]} for c in crds}
    stale = [i["metadata"]["name"] for i in installed["items"]
             if not set(i.get("status", {}).get("storedVersions") or []) <= names[i["metadata"]["name"]]]
    if stale:
        kubectl.run("delete", "crd", *stale, "--wait=true", "--timeout=60s", timeout=90)
    # server-side apply over the base CRDs (an update needs no resourceVersion this way)
    kubectl.apply(crds)
    wait_for(
        f"Kueue {KUEUE_VERSION}'s CRDs served at kueue.x-k8s.io/v1beta2",
        lambda: _serves(kubectl, "/apis/kueue.x-k8s.io/v1beta2", "workloads"),
        timeout=_STARTUP_TIMEOUT,
    )


def _crd_name(patch: Path) -> str:
    """`workloads.kueue.x-k8s.io` from `webhook_in_workloads.yaml`, read from the patch itself."""
    name: str = yaml.safe_load(patch.read_text())["metadata"]["name"]
    return name


def _serves(kubectl: Kubectl, path: str, plural: str) -> bool:
    try:
        doc = json.loads(kubectl.run("get", "--raw", path, timeout=10))
    except (InfraError, ValueError):
        return False
    return any(r.get("name") == plural for r in doc.get("resources", []))


def local_queue(namespace: str) -> Manifest:
    """A LocalQueue named LOCAL_QUEUE in `namespace`, feeding the shared ClusterQueue."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "LocalQueue",
        "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
        "spec": {"clusterQueue": CLUSTER_QUEUE},
    }


class _Starter:
    def __init__(self, launcher: Launcher, *, state: Path, kubeconfig: Path, pki: Pki) -> None:
        self.launcher = launcher
        self.state = state
        self.kubeconfig = kubeconfig
        self.pki = pki
        self.ca = pki.ensure_ca()
        self._readiness: list[tuple[str, Callable[[], bool], Process]] = []

    def wait_ready(self) -> None:
        for what, ready, process in self._readiness:
            wait_for(what, ready, timeout=_STARTUP_TIMEOUT, process=process)

    def scheduler(self, binary: Path) -> None:
        self._control_plane_component(binary, [])

    def controller_manager(self, binary: Path) -> None:
        self._control_plane_component(
            binary,
            [
                f"--root-ca-file={self.ca.cert}",
                f"--service-account-private-key-file={self.pki.service_account_key().key}",
                f"--cluster-signing-cert-file={self.ca.cert}",
                f"--cluster-signing-key-file={self.ca.key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--kube-api-qps=100",
                "--kube-api-burst=200",
            ],
        )

    def _control_plane_component(self, binary: Path, extra_args: list[str]) -> None:
        """kube-scheduler and kube-controller-manager share their serving, auth and health flags."""
        name = binary.name
        serving = self.pki.serving(name)
        port = free_port()
        process = self.launcher.spawn(
            name,
            [
                binary,
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                *extra_args,
            ],
            log_path=self.state / f"{name}.log",
        )
        verify = ssl.create_default_context(cafile=str(self.ca.cert))
        url = f"https://127.0.0.1:{port}/healthz"
        self._readiness.append((f"{name} /healthz", lambda: http_ok(url, verify), process))

    def kwok(self, kwok_dir: Path) -> None:
        stages = sorted((kwok_dir / "stages").glob("*.yaml"))
        header = "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions: {}\n"
        config = self.state / "kwok.yaml"
        config.write_text("---\n".join([header, *(stage.read_text() for stage in stages), _FAIL_FIRST_TRY_STAGE]))
        self.launcher.spawn(
            "kwok",
            [
                kwok_dir / "bin" / "kwok",
                f"--kubeconfig={self.kubeconfig}",
                f"--config={config}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.0.0.2",
                "--node-lease-duration-seconds=40",
            ],
            log_path=self.state / "kwok.log",
        )

    def kueue(self, binary: Path, *, webhook_port: int) -> None:
        _ensure_metrics_cert(self.pki)
        webhook_dir = self.state / "kueue-webhook-certs"
        webhook_dir.mkdir()
        webhook = self.pki.serving("kueue-webhook")
        shutil.copyfile(webhook.cert, webhook_dir / "tls.crt")
        shutil.copyfile(webhook.key, webhook_dir / "tls.key")
        health_port = free_port()
        pods_ready: dict[str, Any] = {
            "timeout": f"{PODS_READY_TIMEOUT_S}s",
            "recoveryTimeout": f"{PODS_READY_RECOVERY_TIMEOUT_S}s",
            "blockAdmission": False,
            "requeuingStrategy": {
                "timestamp": "Eviction",
                "backoffLimitCount": REQUEUING_BACKOFF_LIMIT,
                "backoffBaseSeconds": REQUEUING_BACKOFF_BASE_S,
                "backoffMaxSeconds": REQUEUING_BACKOFF_MAX_S,
            },
        }
        v1beta2 = KUEUE_VERSION != KUEUE_BASE_CRDS_VERSION
        if not v1beta2:
            pods_ready["enable"] = True  # v1beta1's switch; v1beta2 enables it by the section's presence
        config: dict[str, Any] = {
            "apiVersion": f"config.kueue.x-k8s.io/{'v1beta2' if v1beta2 else 'v1beta1'}",
            "kind": "Configuration",
            "namespace": KUEUE_NAMESPACE,
            "leaderElection": {"leaderElect": False},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "metrics": {"bindAddress": "0"},
            # Kueue serves its webhooks; only the conversion webhook (0.17) is registered with the apiserver.
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(webhook_dir)},
            "waitForPodsReady": pods_ready,
            # Kueue's own cert rotation waits forever for the in-cluster webhook configurations.
            "internalCertManagement": {"enable": False},
            "integrations": {"frameworks": ["batch/job", "ray.io/rayjob", "ray.io/raycluster"]},
            # The visibility API is an aggregated apiserver that needs in-cluster config.
            "featureGates": {"VisibilityOnDemand": False},
        }
        config_path = self.state / "kueue.yaml"
        config_path.write_text(yaml.safe_dump(config))
        process = self.launcher.spawn(
            "kueue",
            [binary, f"--config={config_path}", f"--kubeconfig={self.kubeconfig}"],
            log_path=self.state / "kueue.log",
        )
        url = f"http://127.0.0.1:{health_port}/readyz"
        self._readiness.append(("Kueue /readyz", lambda: http_ok(url), process))

    def kuberay(self, binary: Path, *, dashboard_proxy: str) -> None:
        """The KubeRay operator, out of cluster: no leader election, loopback metrics and probes, no webhooks (they
        are only registered with ENABLE_WEBHOOKS=true). Its Ray dashboard client is a plain `net/http` client
        (`utils.GetRayDashboardClientFunc`: `http.Client{Timeout: 2s}`, the default transport), which honours
        HTTP_PROXY, so the `http://<head svc>.<ns>.svc.cluster.local:8265` requests reach `dashboard_proxy`;
        NO_PROXY keeps the apiserver (https on loopback) direct."""
        probe_port = free_port()
        proxies = ("http_proxy", "https_proxy", "no_proxy")
        environment = {k: v for k, v in os.environ.items() if k.lower() not in proxies}
        environment.update(
            HTTP_PROXY=f"http://{dashboard_proxy}",
            NO_PROXY="127.0.0.1,localhost",
            CLUSTER_DOMAIN=CLUSTER_DOMAIN,
            KUBECONFIG=str(self.kubeconfig),
        )
        process = self.launcher.spawn(
            "kuberay-operator",
            [
                binary,
                f"--kubeconfig={self.kubeconfig}",
                "--enable-leader-election=false",
                f"--metrics-addr=127.0.0.1:{free_port()}",
                f"--health-probe-bind-address=127.0.0.1:{probe_port}",
                "--log-stdout-encoder=console",
            ],
            log_path=self.state / "kuberay-operator.log",
            env=environment,
        )
        url = f"http://127.0.0.1:{probe_port}/readyz"
        self._readiness.append(("KubeRay operator /readyz", lambda: http_ok(url), process))


_FAIL_FIRST_TRY_STAGE = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-fail-first-try
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.labels["{FAIL_FIRST_TRY_LABEL}"]'
      operator: 'In'
      values: ['true']
    - key: '.metadata.annotations["batch.kubernetes.io/job-index-failure-count"]'
      operator: 'In'
      values: ['0']
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values: ['True']
  weight: 10000
  delay:
    durationMilliseconds: 1000
    jitterDurationMilliseconds: 2000
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        reason: PodFailed
        type: Ready
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        reason: PodFailed
        type: ContainersReady
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 1
            reason: Error
            message: failed by the kwok stage pod-fail-first-try
            startedAt: {{{{ $now | Quote }}}}
            finishedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      phase: Failed
"""


def _node(name: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
            },
        },
        "status": {"allocatable": NODE_CAPACITY, "capacity": NODE_CAPACITY},
    }


def _ensure_metrics_cert(pki: Pki) -> None:
    if (KUEUE_METRICS_CERT_DIR / "tls.crt").is_file() and (KUEUE_METRICS_CERT_DIR / "tls.key").is_file():
        return
    pair = pki.serving("kueue-metrics")
    try:
        KUEUE_METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pair.cert, KUEUE_METRICS_CERT_DIR / "tls.crt")
        shutil.copyfile(pair.key, KUEUE_METRICS_CERT_DIR / "tls.key")
    except PermissionError as exc:
        raise InfraError(
            f"Kueue {build.KUEUE.version} needs a serving cert at {KUEUE_METRICS_CERT_DIR}/tls.{{crt,key}}; "
            "create it once as root, e.g. by running `python -m tests.infra up` with sudo"
        ) from exc
    log(f"wrote a Kueue metrics serving certificate to {KUEUE_METRICS_CERT_DIR}")


def _queue_objects() -> list[Manifest]:
    objects: list[Manifest] = [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "ResourceFlavor",
            "metadata": {"name": RESOURCE_FLAVOR},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {},
                "queueingStrategy": "BestEffortFIFO",
                "preemption": {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Never"},
                "resourceGroups": [
                    {
                        "coveredResources": list(CLUSTER_QUOTA),
                        "flavors": [
                            {
                                "name": RESOURCE_FLAVOR,
                                "resources": [{"name": r, "nominalQuota": q} for r, q in CLUSTER_QUOTA.items()],
                            }
                        ],
                    }
                ],
            },
        },
        local_queue(LOCAL_QUEUE_NAMESPACE),
    ]
    objects += [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name},
            "value": value,
            "description": f"{name} priority for tracker tests",
        }
        for name, value in PRIORITY_CLASSES.items()
    ]
    return objects
