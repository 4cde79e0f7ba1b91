"""Build-once artifacts: Kafka jars from Maven, Go binaries and CRDs from the Go module proxy.

Each artifact lives in `<cache>/<name>-<version>/` and is complete once it holds a `.complete`
marker. Builds run in a sibling `.partial` directory that is renamed into place at the end, under
a file lock, so an interrupted or concurrent build never leaves a half-filled artifact behind.
Go's own module and build caches (`go env GOMODCACHE GOCACHE`) are reused between artifacts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import yaml

from tests.infra.config import (
    COMPOSE_GO_VERSION,
    ETCD_VERSION,
    KAFKA_VERSION,
    KUBERAY_VERSION,
    KUBERNETES_VERSION,
    KUEUE_BASE_CRDS_VERSION,
    KUEUE_VERSION,
    KWOK_VERSION,
    PROMTOOL_VERSION,
    Component,
    cache_root,
    with_dependencies,
)
from tests.infra.proc import InfraError, file_lock, format_duration, log, tail

_HEARTBEAT_SECONDS = 60.0


@dataclass(frozen=True)
class Artifact:
    name: str
    version: str
    description: str
    #: Shown before a cold build so nobody mistakes a long compile for a hang: the range measured on machines of 2
    #: cores, idle to busy, with empty Go (or Maven) caches (tests/infra/README.md, "Measured times"); a warm
    #: ``GOCACHE`` builds in seconds (``_WARM_NOTE``). The heartbeat then says how long it has taken.
    estimate: str
    build: Callable[[Path, Path], None]

    @property
    def path(self) -> Path:
        return cache_root() / f"{self.name}-{self.version}"

    def is_built(self) -> bool:
        return (self.path / ".complete").is_file()

    def ensure(self) -> Path:
        """Return the artifact directory, building it first if needed."""
        if self.is_built():
            return self.path
        root = cache_root()
        root.mkdir(parents=True, exist_ok=True)
        with file_lock(root / f"{self.path.name}.lock"):
            if self.is_built():  # built by whoever held the lock before us
                return self.path
            staging = root / f".{self.path.name}.partial"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            build_log = staging / "build.log"
            log(
                f"building {self.description} (first run only; {self.estimate}; load average now {_load()}); "
                f"log: {build_log}"
            )
            started = time.monotonic()
            self.build(staging, build_log)
            (staging / ".complete").write_text(datetime.now(UTC).isoformat() + "\n")
            shutil.rmtree(self.path, ignore_errors=True)
            staging.rename(self.path)
            log(f"built {self.path.name} in {format_duration(time.monotonic() - started)}")
        return self.path


_WARM_NOTE = " from empty build caches; seconds with warm ones"


def _load() -> str:
    """The 1-minute load average, as uptime shows it (a busy machine builds several times slower)."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "unknown"


def _run_logged(argv: Sequence[str | Path], *, build_log: Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a build step, stderr to `build_log`, with a heartbeat while it runs; return its stdout."""
    command = [str(a) for a in argv]
    with build_log.open("a") as err, tempfile.TemporaryFile("w+") as out:
        err.write(f"$ {' '.join(command)}\n")
        err.flush()
        started = time.monotonic()
        try:
            popen = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=err, env={**os.environ, **(env or {})})
        except FileNotFoundError as exc:
            raise InfraError(f"`{command[0]}` is not on PATH (needed for the build logged in {build_log})") from exc
        next_beat = started + _HEARTBEAT_SECONDS
        while popen.poll() is None:
            time.sleep(0.5)
            if time.monotonic() >= next_beat:
                elapsed = format_duration(time.monotonic() - started)
                log(f"  ... still running `{command[0]} {command[1]}` ({elapsed})")
                next_beat += _HEARTBEAT_SECONDS
        out.seek(0)
        stdout = out.read()
        err.write(stdout)
    if popen.returncode != 0:
        raise InfraError(f"`{' '.join(command)}` failed (rc={popen.returncode}):\n{tail(build_log, 40)}")
    return stdout


# --- Go helpers -------------------------------------------------------------------------------------

_GO_BUILD_ENV = {"CGO_ENABLED": "0"}


def _go_module_dir(module: str, version: str, *, build_log: Path, cwd: Path) -> tuple[Path, Path]:
    """Download `module@version` into the module cache; return its source dir and go.mod file."""
    info = json.loads(
        _run_logged(["go", "mod", "download", "-json", f"{module}@{version}"], build_log=build_log, cwd=cwd)
    )
    return Path(info["Dir"]), Path(info["GoMod"])


def _copy_files(sources: Sequence[Path], destination: Path) -> None:
    destination.mkdir(parents=True, exist_ok=True)
    for source in sources:
        if not source.is_file():
            raise InfraError(f"expected upstream file {source} is missing")
        shutil.copyfile(source, destination / source.name)


def _version_ldflags(version: str) -> str:
    """The variables k/k's hack/lib/version.sh sets; without them binaries report v0.0.0-master."""
    major, minor, _ = version.split(".")
    build_date = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion=v{version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
            f"-X {package}.buildDate={build_date}",
        ]
    return " ".join(flags)


_STAGING_REPLACE = re.compile(r"^\s*(k8s\.io/[a-z0-9-]+)\s+=>\s+\./staging/src/", re.MULTILINE)


def _build_kubernetes(out: Path, build_log: Path) -> None:
    """A wrapper module requiring k8s.io/kubernetes with every staging module pinned to v0.<minor>.<patch>.

    k8s.io/kubernetes lists its staging modules as v0.0.0 plus `replace => ./staging/...`, so it cannot
    be `go install`ed; the replace set is read from the proxy's copy of its go.mod (kubernetes#79384).
    """
    _, minor, patch = KUBERNETES_VERSION.split(".")
    src = out / "src"
    src.mkdir()
    _, upstream_gomod = _go_module_dir("k8s.io/kubernetes", f"v{KUBERNETES_VERSION}", build_log=build_log, cwd=src)
    staging_modules = _STAGING_REPLACE.findall(upstream_gomod.read_text())
    if not staging_modules:
        raise InfraError(f"no staging replaces found in {upstream_gomod}")
    (src / "go.mod").write_text("module local/kubernetes-testenv\n\ngo 1.23.0\n\ngodebug default=go1.23\n")
    _run_logged(
        [
            "go",
            "mod",
            "edit",
            f"-require=k8s.io/kubernetes@v{KUBERNETES_VERSION}",
            *(f"-replace={m}={m}@v0.{minor}.{patch}" for m in staging_modules),
        ],
        build_log=build_log,
        cwd=src,
    )
    _run_logged(
        [
            "go",
            "build",
            "-trimpath",
            "-ldflags",
            _version_ldflags(KUBERNETES_VERSION),
            "-o",
            f"{out / 'bin'}/",
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            "k8s.io/kubernetes/cmd/kube-scheduler",
            "k8s.io/kubernetes/cmd/kubectl",
        ],
        build_log=build_log,
        cwd=src,
        env={**_GO_BUILD_ENV, "GOFLAGS": "-mod=mod"},
    )


def _build_etcd(out: Path, build_log: Path) -> None:
    """etcd's server module carries `replace ../` lines, which only a wrapper module can ignore."""
    src = out / "src"
    src.mkdir()
    (src / "go.mod").write_text(
        f"module local/etcd-testenv\n\ngo 1.23.0\n\nrequire go.etcd.io/etcd/server/v3 v{ETCD_VERSION}\n"
    )
    _run_logged(
        [
            "go",
            "build",
            "-trimpath",
            "-ldflags",
            "-s -w",
            "-o",
            out / "bin" / "etcd",
            "go.etcd.io/etcd/server/v3",
        ],
        build_log=build_log,
        cwd=src,
        env={**_GO_BUILD_ENV, "GOFLAGS": "-mod=mod"},
    )


def _build_kwok(out: Path, build_log: Path) -> None:
    _go_install("sigs.k8s.io/kwok/cmd/kwok", KWOK_VERSION, out=out, build_log=build_log)
    source, _ = _go_module_dir("sigs.k8s.io/kwok", f"v{KWOK_VERSION}", build_log=build_log, cwd=out)
    stages = source / "kustomize" / "stage"
    _copy_files(
        [
            stages / "node" / "fast" / "node-initialize.yaml",
            stages / "node" / "heartbeat-with-lease" / "node-heartbeat-with-lease.yaml",
            # "general" pod stages honour per-pod delay annotations (pod-complete.stage.kwok.x-k8s.io/delay).
            *(
                stages / "pod" / "general" / f"{stage}.yaml"
                for stage in (
                    "pod-create",
                    "pod-init-container-running",
                    "pod-init-container-completed",
                    "pod-ready",
                    "pod-complete",
                )
            ),
        ],
        out / "stages",
    )
    # The "fast" pod-delete finalises at once instead of waiting out the grace period, so suspended
    # (preempted) Jobs release their pods, and with them their Kueue quota, quickly.
    _copy_files([stages / "pod" / "fast" / "pod-delete.yaml"], out / "stages")


def _build_kueue(out: Path, build_log: Path) -> None:
    _go_install(
        "sigs.k8s.io/kueue/cmd/kueue",
        KUEUE_VERSION,
        out=out,
        build_log=build_log,
        extra_ldflags=f"-X sigs.k8s.io/kueue/pkg/version.GitVersion=v{KUEUE_VERSION}",
    )


def _build_kuberay(out: Path, build_log: Path) -> None:
    """The KubeRay operator: `main.go` at the root of the ray-operator module, no go.mod replaces since v1.4."""
    _go_install("github.com/ray-project/kuberay/ray-operator", KUBERAY_VERSION, out=out, build_log=build_log)
    if not (out / "bin" / "ray-operator").is_file():
        raise InfraError(f"go install left no bin/ray-operator in {out}:\n{tail(build_log)}")


def _go_install(package: str, version: str, *, out: Path, build_log: Path, extra_ldflags: str = "") -> None:
    _run_logged(
        ["go", "install", "-trimpath", "-ldflags", f"-s -w {extra_ldflags}".strip(), f"{package}@v{version}"],
        build_log=build_log,
        cwd=out,
        env={**_GO_BUILD_ENV, "GOBIN": str(out / "bin")},
    )


_KUEUE_CRDS = (
    "workloads",
    "clusterqueues",
    "localqueues",
    "resourceflavors",
    "workloadpriorityclasses",
    "admissionchecks",
    "cohorts",
    "topologies",
    "provisioningrequestconfigs",
    "multikueueclusters",
    "multikueueconfigs",
)


def _kueue_crds_fetcher(version: str) -> Callable[[Path, Path], None]:
    def fetch(out: Path, build_log: Path) -> None:
        """All Kueue CRDs: its controllers watch AdmissionChecks, Cohorts, Topologies and friends too."""
        source, _ = _go_module_dir("sigs.k8s.io/kueue", f"v{version}", build_log=build_log, cwd=out)
        bases = source / "config" / "components" / "crd" / "bases"
        _copy_files([bases / f"kueue.x-k8s.io_{name}.yaml" for name in _KUEUE_CRDS], out / "crds")
        # The kustomize patches that put Kueue's conversion webhook into CRDs serving two versions (0.15+), those the
        # kustomization applies (it ships webhook_in_resourceflavors.yaml too, unused: ResourceFlavor v1beta1 is
        # not convertible): `cluster` sets the same `spec.conversion` on them, pointing at the Kueue it runs.
        kustomization = source / "config" / "components" / "crd" / "kustomization.yaml"
        used = [entry["path"] for entry in (yaml.safe_load(kustomization.read_text()) or {}).get("patches") or []]
        patches = [kustomization.parent / path for path in used if Path(path).name.startswith("webhook_in_")]
        if patches:
            _copy_files(patches, out / "conversion")

    return fetch


#: A later Kueue than KUEUE_VERSION, for its Workload CRD alone: it serves (and stores) v1beta2, and the watcher
#: prefers v1beta2 when served (tests/watch/test_watch_v1beta2.py). Only the CRD is used, never its controller.
KUEUE_V1BETA2_VERSION = "0.17.0"


def _fetch_kueue_v1beta2_workload_crd(out: Path, build_log: Path) -> None:
    source, _ = _go_module_dir("sigs.k8s.io/kueue", f"v{KUEUE_V1BETA2_VERSION}", build_log=build_log, cwd=out)
    _copy_files([source / "config" / "components" / "crd" / "bases" / "kueue.x-k8s.io_workloads.yaml"], out / "crds")


def _fetch_kuberay_crds(out: Path, build_log: Path) -> None:
    source, _ = _go_module_dir(
        "github.com/ray-project/kuberay/ray-operator", f"v{KUBERAY_VERSION}", build_log=build_log, cwd=out
    )
    bases = source / "config" / "crd" / "bases"
    _copy_files([bases / f"ray.io_{name}.yaml" for name in ("rayjobs", "rayclusters", "rayservices")], out / "crds")


def _fetch_compose_spec(out: Path, build_log: Path) -> None:
    """The Compose Specification's JSON schema as compose-go (the loader of `docker compose`) embeds it, with the
    module's LICENSE and NOTICE (Apache-2.0)."""
    source, _ = _go_module_dir(
        "github.com/compose-spec/compose-go/v2", f"v{COMPOSE_GO_VERSION}", build_log=build_log, cwd=out
    )
    _copy_files([source / "schema" / "compose-spec.json", source / "LICENSE", source / "NOTICE"], out)


def _fetch_promtool(out: Path, build_log: Path) -> None:
    """promtool from Debian's `prometheus` package (`apt-get download` and `dpkg-deb -x`: no root, nothing
    installed) when the machine's apt offers PROMTOOL_VERSION, else built from the Go module proxy."""
    deb = out / "deb"
    deb.mkdir()
    try:
        _run_logged(["apt-get", "download", "prometheus"], build_log=build_log, cwd=deb)
        [package] = deb.glob("prometheus_*.deb")
        _run_logged(["dpkg-deb", "-x", package, deb / "root"], build_log=build_log, cwd=deb)
        version = _run_logged([deb / "root" / "usr" / "bin" / "promtool", "--version"], build_log=build_log, cwd=deb)
        if not re.match(rf"promtool, version {re.escape(PROMTOOL_VERSION)}\b", version):
            raise InfraError(f"apt offers {version.splitlines()[0]!r}, not {PROMTOOL_VERSION}")
        (out / "bin").mkdir()
        shutil.copy2(deb / "root" / "usr" / "bin" / "promtool", out / "bin" / "promtool")
        (out / "SOURCE").write_text(f"Debian package {package.name}\n")
    except (InfraError, ValueError) as exc:  # no apt, no such package, another version: build it
        with build_log.open("a") as err:
            err.write(f"Debian's promtool not used ({exc}); building it from the Go module proxy\n")
        _build_promtool(out, build_log)
    finally:
        shutil.rmtree(deb, ignore_errors=True)


def _build_promtool(out: Path, build_log: Path) -> None:
    """github.com/prometheus/prometheus carries replace directives, so `go install` refuses it: a wrapper module."""
    _, minor, patch = PROMTOOL_VERSION.split(".")
    src = out / "src"
    src.mkdir()
    (src / "go.mod").write_text(
        f"module local/promtool-testenv\n\ngo 1.23.0\n\nrequire github.com/prometheus/prometheus v0.{minor}.{patch}\n"
    )
    _run_logged(
        [
            "go",
            "build",
            "-trimpath",
            "-ldflags",
            f"-s -w -X github.com/prometheus/common/version.Version={PROMTOOL_VERSION}",
            "-o",
            out / "bin" / "promtool",
            "github.com/prometheus/prometheus/cmd/promtool",
        ],
        build_log=build_log,
        cwd=src,
        env={**_GO_BUILD_ENV, "GOFLAGS": "-mod=mod"},
    )
    (out / "SOURCE").write_text(f"github.com/prometheus/prometheus v0.{minor}.{patch} (Go module proxy)\n")


def _build_kafka(out: Path, build_log: Path) -> None:
    """kafka_2.13 alone resolves the broker classpath; reload4j is the SLF4J binding 3.9 expects."""
    (out / "pom.xml").write_text(_KAFKA_POM.format(version=KAFKA_VERSION))
    _run_logged(
        [
            "mvn",
            "-B",
            "-q",
            "-f",
            out / "pom.xml",
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={out / 'lib'}",
        ],
        build_log=build_log,
        cwd=out,
    )
    if not (out / "lib" / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file():
        raise InfraError(f"Maven did not produce kafka_2.13-{KAFKA_VERSION}.jar:\n{tail(build_log)}")


_KAFKA_POM = """\
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.testenv</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{version}</version></dependency>
    <dependency><groupId>ch.qos.reload4j</groupId><artifactId>reload4j</artifactId><version>1.2.25</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId><version>1.7.36</version></dependency>
  </dependencies>
</project>
"""

KAFKA = Artifact("kafka", KAFKA_VERSION, f"Kafka {KAFKA_VERSION} broker jars (Maven)", "measured 10-30 s", _build_kafka)
KUBERNETES = Artifact(
    "kubernetes",
    KUBERNETES_VERSION,
    f"Kubernetes {KUBERNETES_VERSION} kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (Go)",
    "measured 4.5-43 min on 2 cores: 5-6 on idle ones, 13-15 on busy ones, 43 on the slowest cold run",
    _build_kubernetes,
)
ETCD = Artifact("etcd", ETCD_VERSION, f"etcd {ETCD_VERSION} (Go)", "measured 20 s-4 min", _build_etcd)
KWOK = Artifact(
    "kwok", KWOK_VERSION, f"kwok {KWOK_VERSION} and its stage manifests (Go)", "measured 1.5-11 min", _build_kwok
)
KUEUE = Artifact(
    "kueue",
    KUEUE_VERSION,
    f"Kueue {KUEUE_VERSION} controller (Go)",
    "measured 2-17 min on 2 cores: 2-4 on idle ones, 12-17 on busy ones",
    _build_kueue,
)
#: The CRDs of the Kueue the cluster runs (`cluster` installs them, replacing the base ones when they differ).
KUEUE_CRDS = Artifact(
    "kueue-crds", KUEUE_VERSION, f"Kueue {KUEUE_VERSION} CRDs", "seconds", _kueue_crds_fetcher(KUEUE_VERSION)
)
#: The CRDs the bare control plane (`kube`) installs: Kueue 0.12's, v1beta1 only, whatever Kueue the cluster runs.
KUEUE_BASE_CRDS = (
    KUEUE_CRDS
    if KUEUE_BASE_CRDS_VERSION == KUEUE_VERSION
    else Artifact(
        "kueue-crds",
        KUEUE_BASE_CRDS_VERSION,
        f"Kueue {KUEUE_BASE_CRDS_VERSION} CRDs",
        "seconds",
        _kueue_crds_fetcher(KUEUE_BASE_CRDS_VERSION),
    )
)
KUBERAY = Artifact(
    "kuberay-operator",
    KUBERAY_VERSION,
    f"KubeRay {KUBERAY_VERSION} operator (Go)",
    "measured 1.5-5 min on 2 cores (after Kueue: they share most Go modules)",
    _build_kuberay,
)
#: Fetched with the kube component, so that set-up does every download (the test only reads the cache).
KUEUE_V1BETA2_WORKLOAD_CRD = Artifact(
    "kueue-workload-crd",
    KUEUE_V1BETA2_VERSION,
    f"Kueue {KUEUE_V1BETA2_VERSION} Workload CRD (v1beta1 and v1beta2)",
    "seconds",
    _fetch_kueue_v1beta2_workload_crd,
)
KUBERAY_CRDS = Artifact(
    "kuberay-crds", KUBERAY_VERSION, f"KubeRay {KUBERAY_VERSION} CRDs", "seconds", _fetch_kuberay_crds
)

COMPOSE_SPEC = Artifact(
    "compose-spec",
    COMPOSE_GO_VERSION,
    f"Compose Specification JSON schema (compose-go {COMPOSE_GO_VERSION})",
    "seconds",
    _fetch_compose_spec,
)

PROMTOOL = Artifact(
    "promtool",
    PROMTOOL_VERSION,
    f"promtool {PROMTOOL_VERSION} (Debian's prometheus package, else Go)",
    "seconds from Debian; measured 7-40 min from Go",
    _fetch_promtool,
)

#: What tests need whichever components run (no service behind them): every `up` ensures these.
SHARED: tuple[Artifact, ...] = (COMPOSE_SPEC, PROMTOOL)


def artifacts_for(component: Component) -> tuple[Artifact, ...]:
    """The artifacts of `component` alone (not of what it requires, nor the shared ones)."""
    return {
        Component.KAFKA: (KAFKA,),
        Component.KUBE: (KUBERNETES, ETCD, KUEUE_BASE_CRDS, KUBERAY_CRDS, KUEUE_V1BETA2_WORKLOAD_CRD),
        Component.CLUSTER: (KUBERNETES, KWOK, KUEUE, KUEUE_CRDS, KUBERAY, KUBERAY_CRDS),
    }[component]


def required_artifacts(components: Iterable[Component]) -> tuple[Artifact, ...]:
    """Everything `up` of `components` ensures, and what the pytest fixtures of these components require before
    they start them: the shared artifacts, then those of each component and of what it requires, each once.

    The one list both sides use, so a fixture never needs what set-up does not fetch."""
    wanted = [*SHARED, *(a for c in with_dependencies(set(components)) for a in artifacts_for(c))]
    return tuple(dict.fromkeys(wanted))
