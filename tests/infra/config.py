"""Pinned versions, cache and state locations, and the component model of the test environment."""

from __future__ import annotations

import enum
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

KAFKA_VERSION = "3.9.1"
#: Newest 1.32 patch for which the Go module proxy serves every staging module the four binaries
#: compile (v0.32.<patch>). 1.32.13 lacks k8s.io/endpointslice, 1.32.12 k8s.io/kubernetes itself,
#: 1.32.11 k8s.io/kms and csi-translation-lib, 1.32.10 nine modules. The missing sample-* modules of
#: 1.32.9 are harmless: nothing built imports them.
KUBERNETES_VERSION = "1.32.9"
#: Same minor line as the etcd client that Kubernetes 1.32 vendors (3.5.16), newer patch.
ETCD_VERSION = "3.5.21"
#: Last kwok release that falls back to built-in stages; we still pass ours explicitly.
KWOK_VERSION = "0.7.0"
#: The Kueue controllers the simulated cluster can run, the default first: 0.17.0 (the newest the Go module proxy
#: serves; its CRDs serve v1beta1 and v1beta2 and store v1beta2, through its conversion webhook) and 0.12.10 (the last
#: line built against k8s 0.32, v1beta1 only). `TRACKER_TESTENV_KUEUE_VERSION` (or `up --kueue-version`) chooses.
KUEUE_VERSIONS = ("0.17.0", "0.12.10")
KUEUE_VERSION_ENV = "TRACKER_TESTENV_KUEUE_VERSION"
#: The Kueue whose CRDs (v1beta1 only) the bare control plane (`kube`) installs, whatever Kueue the cluster runs:
#: the API the watcher tests write to by hand. The `cluster` component replaces them with its own Kueue's.
KUEUE_BASE_CRDS_VERSION = "0.12.10"
#: The KubeRay operator the simulated cluster runs, and the RayJob/RayCluster/RayService CRDs every control plane
#: installs (its own, so that nothing it writes is pruned); v1.4+ needs no go.mod replaces.
KUBERAY_VERSION = "1.5.0"
#: The Go module that ships the Compose Specification's JSON schema (`schema/compose-spec.json`), the schema
#: `docker compose config` validates against; tests/deploy/test_deploy.py checks docker-compose.yml with it.
COMPOSE_GO_VERSION = "2.16.2"
#: promtool (`check rules`, `test rules`, `check metrics`) for tests/deploy/test_prometheus.py: the version
#: Debian 12 ships in
#: its `prometheus` package (taken from there when the machine's apt offers it), else built from the Go module proxy
#: (Prometheus 2.x is tagged v0.<minor>.<patch> there).
PROMTOOL_VERSION = "2.42.0"


def kueue_version() -> str:
    """The Kueue the simulated cluster runs: `$TRACKER_TESTENV_KUEUE_VERSION`, else the newest supported."""
    chosen = os.environ.get(KUEUE_VERSION_ENV, "").strip() or KUEUE_VERSIONS[0]
    if chosen not in KUEUE_VERSIONS:
        supported = " or ".join(KUEUE_VERSIONS)
        raise ValueError(f"{KUEUE_VERSION_ENV}={chosen!r}: the test environment runs Kueue {supported}")
    return chosen


KUEUE_VERSION = kueue_version()


class Component(enum.StrEnum):
    """What `python -m tests.infra up --components` accepts, in start order."""

    KAFKA = "kafka"
    KUBE = "kube"
    CLUSTER = "cluster"

    @property
    def requires(self) -> tuple[Component, ...]:
        return (Component.KUBE,) if self is Component.CLUSTER else ()


def with_dependencies(components: set[Component]) -> list[Component]:
    """The requested components plus what they need, in start order."""
    closed = set(components)
    for component in components:
        closed.update(component.requires)
    return [c for c in Component if c in closed]


def with_dependents(components: set[Component]) -> list[Component]:
    """The requested components plus everything that needs them, in start order."""
    closed = set(components) | {c for c in Component if set(c.requires) & components}
    return [c for c in Component if c in closed]


def cache_root() -> Path:
    """Built binaries and jars, keyed by version; survives `down` and `git clean`."""
    configured = os.environ.get("TRACKER_TESTENV_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "tracker-testenv"


def state_root() -> Path:
    """Runtime state of one environment: data dirs, logs, pki, kubeconfig, env.json."""
    configured = os.environ.get("TRACKER_TESTENV_DIR")
    return Path(configured) if configured else REPO_ROOT / ".testenv"
