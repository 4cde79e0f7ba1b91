"""The simulated cluster on top of the control plane: scheduler, controller-manager, kwok GPU nodes, Kueue.

Pods land on kwok nodes, go Running, then Succeeded after a few seconds (kwok "general" pod
stages; delays are tunable per pod with `pod-*.stage.kwok.x-k8s.io/delay` annotations).
Kueue runs out of cluster with no webhooks: Jobs it should manage must be created with
`spec.suspend: true` (its mutating webhook would otherwise set that).
"""

from __future__ import annotations

import shutil
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.infra import build
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


@dataclass(frozen=True)
class ClusterInstance:
    processes: tuple[Process, ...]


def start(state: Path, *, kubeconfig: Path, pki_dir: Path) -> ClusterInstance:
    """Start scheduler, controller-manager, kwok and Kueue against the running apiserver."""
    kubernetes_bin = build.KUBERNETES.ensure() / "bin"
    kwok_dir = build.KWOK.ensure()
    kueue_binary = build.KUEUE.ensure() / "bin" / "kueue"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    kubectl = Kubectl(kubernetes_bin / "kubectl", kubeconfig)
    with Launcher() as launcher:
        # Everything is spawned first and awaited after: the four start up concurrently.
        starter = _Starter(launcher, state=state, kubeconfig=kubeconfig, pki=Pki(pki_dir))
        starter.scheduler(kubernetes_bin / "kube-scheduler")
        starter.controller_manager(kubernetes_bin / "kube-controller-manager")
        starter.kwok(kwok_dir)
        kubectl.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}}])
        starter.kueue(kueue_binary)
        kubectl.apply(_node(name) for name in NODES)
        starter.wait_ready()
        kubectl.wait(*(f"node/{name}" for name in NODES), condition="Ready", timeout=_STARTUP_TIMEOUT)
        kubectl.apply(_queue_objects())
        kubectl.wait(f"clusterqueue/{CLUSTER_QUEUE}", condition="Active", timeout=_STARTUP_TIMEOUT)
        kubectl.wait(
            f"localqueue/{LOCAL_QUEUE}", namespace=LOCAL_QUEUE_NAMESPACE, condition="Active", timeout=_STARTUP_TIMEOUT
        )
    return ClusterInstance(processes=tuple(launcher.processes))


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
        config.write_text("---\n".join([header, *(stage.read_text() for stage in stages)]))
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

    def kueue(self, binary: Path) -> None:
        _ensure_metrics_cert(self.pki)
        webhook_dir = self.state / "kueue-webhook-certs"
        webhook_dir.mkdir()
        webhook = self.pki.serving("kueue-webhook")
        shutil.copyfile(webhook.cert, webhook_dir / "tls.crt")
        shutil.copyfile(webhook.key, webhook_dir / "tls.key")
        health_port = free_port()
        config: dict[str, Any] = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta1",
            "kind": "Configuration",
            "namespace": KUEUE_NAMESPACE,
            "leaderElection": {"leaderElect": False},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "metrics": {"bindAddress": "0"},
            # Kueue serves its webhooks although nothing calls them (not registered with the apiserver).
            "webhook": {"host": "127.0.0.1", "port": free_port(), "certDir": str(webhook_dir)},
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
