"""A bare control plane: etcd + kube-apiserver with client-cert auth, plus the Kueue and KubeRay CRDs."""

from __future__ import annotations

import shutil
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.infra import build
from tests.infra.kubectl import Kubectl
from tests.infra.pki import KeyPair, Pki
from tests.infra.proc import Launcher, Process, free_port, http_ok, wait_for

_STARTUP_TIMEOUT = 120.0
SERVICE_CIDR = "10.0.0.0/24"


@dataclass(frozen=True)
class KubeInstance:
    server: str
    kubeconfig: Path
    processes: tuple[Process, ...]


def start(state: Path, *, crd_overrides: Sequence[Path] = ()) -> KubeInstance:
    """Start etcd and kube-apiserver on free ports under `state`, then install and await the CRDs.

    A file of `crd_overrides` is installed instead of the bundled CRD file of the same name (upstream names
    them `<group>_<plural>.yaml`), or in addition if there is none.
    """
    bin_dir = build.KUBERNETES.ensure() / "bin"
    etcd_binary = build.ETCD.ensure() / "bin" / "etcd"
    crds = sorted((build.KUEUE_BASE_CRDS.ensure() / "crds").glob("*.yaml"))
    crds += sorted((build.KUBERAY_CRDS.ensure() / "crds").glob("*.yaml"))
    overridden = {override.name for override in crd_overrides}
    crds = [crd for crd in crds if crd.name not in overridden] + list(crd_overrides)

    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    pki = Pki(state / "pki")
    ca = pki.ensure_ca()
    serving = pki.serving(
        "kube-apiserver",
        ips=("127.0.0.1", "10.0.0.1"),
        dns=("kubernetes", "kubernetes.default", "kubernetes.default.svc"),
    )
    admin = pki.client("admin", user="admin", groups=("system:masters",))
    service_accounts = pki.service_account_key()

    etcd_url = f"http://127.0.0.1:{free_port()}"
    peer_url = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    server = f"https://127.0.0.1:{port}"
    kubeconfig = _write_kubeconfig(state / "kubeconfig", server=server, ca=ca.cert, user=admin)
    with Launcher() as launcher:
        etcd = launcher.spawn(
            "etcd",
            [
                etcd_binary,
                "--name=testenv",
                f"--data-dir={state / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=testenv={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            log_path=state / "etcd.log",
        )
        wait_for("etcd /health", lambda: http_ok(f"{etcd_url}/health"), timeout=30, process=etcd)
        apiserver = launcher.spawn(
            "kube-apiserver",
            [
                bin_dir / "kube-apiserver",
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--cert-dir={state / 'certs'}",
                f"--client-ca-file={ca.cert}",
                # Published in kube-system/extension-apiserver-authentication, where the delegated
                # authentication of kube-scheduler and kube-controller-manager expects to find it.
                f"--requestheader-client-ca-file={ca.cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--service-account-issuer={server}",
                f"--service-account-key-file={service_accounts.cert}",
                f"--service-account-signing-key-file={service_accounts.key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                # As in envtest: pods need no ServiceAccount, so tests need not create any.
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
            ],
            log_path=state / "kube-apiserver.log",
        )
        wait_for(
            f"kube-apiserver {server}/readyz",
            lambda: is_ready(kubeconfig),
            timeout=_STARTUP_TIMEOUT,
            process=apiserver,
        )
        kubectl = Kubectl(bin_dir / "kubectl", kubeconfig)
        kubectl.wait(*kubectl.create_files(crds), condition="Established", timeout=_STARTUP_TIMEOUT)
    return KubeInstance(server=server, kubeconfig=kubeconfig, processes=(etcd, apiserver))


def _write_kubeconfig(path: Path, *, server: str, ca: Path, user: KeyPair) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testenv", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "admin", "user": {"client-certificate": str(user.cert), "client-key": str(user.key)}}],
        "contexts": [{"name": "testenv", "context": {"cluster": "testenv", "user": "admin"}}],
        "current-context": "testenv",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def is_ready(kubeconfig: Path) -> bool:
    """True if the apiserver behind `kubeconfig` (one we wrote) answers /readyz."""
    try:
        config = yaml.safe_load(kubeconfig.read_text())
    except FileNotFoundError:
        return False
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    context = ssl.create_default_context(cafile=cluster["certificate-authority"])
    context.load_cert_chain(user["client-certificate"], user["client-key"])
    return http_ok(f"{cluster['server']}/readyz", context)


def kubectl(kubeconfig: Path) -> Kubectl:
    """A kubectl from the cached Kubernetes build, talking to `kubeconfig`."""
    return Kubectl(build.KUBERNETES.ensure() / "bin" / "kubectl", kubeconfig)
