"""The test environment's own rules, without its services: `up` fetches and builds everything a test reads, a
missing service fails a test and never skips it, and the Kafka cluster id is never read as an option."""

from __future__ import annotations

import ast
import base64
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.infra import build, fixtures, kafka, proc, system
from tests.infra.config import REPO_ROOT, Component, with_dependencies
from tests.infra.env import Environment

TESTS = REPO_ROOT / "tests"
COMPONENT_SETS = [{c} for c in Component] + [set(Component)]


class _NoProcesses(Exception):
    """Raised where start-up would run a process: everything before it (the artifacts it ensures) has run."""


def _record_ensures(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[build.Artifact]:
    """Artifact.ensure records instead of building. Each component's real start-up code runs up to its first
    process (so its own `ensure()` calls are recorded too), and is then taken as started."""
    ensured: list[build.Artifact] = []

    def ensure(self: build.Artifact) -> Path:
        ensured.append(self)
        return tmp_path / "cache" / self.path.name

    def no_process(*args: object, **kwargs: object) -> None:
        raise _NoProcesses

    real_start = Environment._start

    def start(self: Environment, component: Component) -> dict[str, Any]:
        with pytest.raises(_NoProcesses):
            real_start(self, component)
        return {"processes": [], "kubeconfig": str(tmp_path / "kubeconfig")}

    monkeypatch.setattr(build.Artifact, "ensure", ensure)
    monkeypatch.setattr(system.SystemPackage, "ensure", lambda self, *, log_dir: Path("/usr/bin") / self.program)
    monkeypatch.setattr(proc, "spawn", no_process)
    monkeypatch.setattr(kafka, "run", no_process)
    monkeypatch.setattr(Environment, "_start", start)
    return ensured


def _fixture_requirements(tmp_path: Path, component: Component) -> set[Any]:
    """The artifacts the pytest fixture of `component` checks before it would start it, on an empty cache."""
    queried: list[build.Artifact] = []
    real_is_built = build.Artifact.is_built

    def is_built(self: build.Artifact) -> bool:
        queried.append(self)
        return real_is_built(self)

    def ensure(self: build.Artifact) -> Path:
        raise AssertionError(f"a fixture built {self.path.name}: builds belong to `up`")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(build.Artifact, "is_built", is_built)
        patch.setattr(build.Artifact, "ensure", ensure)
        patch.setenv("TRACKER_TESTENV_CACHE", str(tmp_path / "empty-cache"))
        patch.setenv("TRACKER_TESTENV_DIR", str(tmp_path / "fixture-state"))
        local = fixtures.LocalEnvironment()
        try:
            local.provide(component)
        except pytest.fail.Exception as failure:
            assert "is not built" in str(failure)
        except BaseException as other:  # a skip included: that is the bug
            pytest.fail(f"an unbuilt {component} environment gave {other!r}, not a failure")
        else:
            pytest.fail(f"an unbuilt {component} environment was provided")
    return set(queried)


@pytest.mark.parametrize("components", COMPONENT_SETS, ids=lambda c: ",".join(sorted(c)))
@pytest.mark.parametrize("already_running", [False, True], ids=["cold", "running"])
def test_up_ensures_exactly_what_the_fixtures_require(
    components: set[Component], already_running: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a fresh machine `up` must fetch every artifact a fixture requires (the v1beta2 Workload CRD was missed),
    also for components that already run (started by an older `up`), and nothing a fixture does not name."""
    required: set[Any] = set()
    for component in components:
        required |= _fixture_requirements(tmp_path, component)
    assert required >= {a for c in components for a in build.artifacts_for(c)}  # the recorder saw the real lists
    ensured = _record_ensures(monkeypatch, tmp_path)
    monkeypatch.setattr(Environment, "running",
                        lambda self, component: {"processes": []} if already_running else None)
    started = Environment(tmp_path / "state").up(components)
    ensured_names, required_names = {a.path.name for a in ensured}, {a.path.name for a in required}
    missed, unasked = sorted(required_names - ensured_names), sorted(ensured_names - required_names)
    assert (missed, unasked) == ([], [])
    assert set(ensured) == set(build.required_artifacts(components))
    assert started == ([] if already_running else with_dependencies(components))


def test_up_installs_the_system_packages_whatever_the_components(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Chromium (the web view's browser tests) is installed by every `up`, like the shared artifacts."""
    _record_ensures(monkeypatch, tmp_path)
    installed: list[str] = []
    monkeypatch.setattr(system.SystemPackage, "ensure",
                        lambda self, *, log_dir: installed.append(self.package) or Path("/usr/bin") / self.program)
    Environment(tmp_path / "state").up(set())
    assert installed == ["chromium"] == [p.package for p in system.PACKAGES]


def test_a_missing_package_is_installed_with_apt_get_and_a_failure_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The real install path with a stand-in `apt-get` and `apt-cache` on PATH: update only when the package lists do
    not know the package, then `install -y --no-install-recommends`, waiting for the dpkg lock."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "apt-cache").write_text("#!/bin/sh\necho \"$@\" >> " + str(calls) + "\necho 'Candidate: (none)'\n")
    (bin_dir / "apt-get").write_text(
        "#!/bin/sh\necho \"$@\" >> " + str(calls) + "\n"
        "case \"$*\" in *install*) printf '#!/bin/sh\\n' > " + str(bin_dir / "fakebrowser")
        + " && chmod +x " + str(bin_dir / "fakebrowser") + ";; esac\n")
    for tool in ("apt-cache", "apt-get"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    package = system.SystemPackage("fakebrowser-pkg", "fakebrowser", "a stand-in browser")
    assert package.ensure(log_dir=tmp_path / "logs") == bin_dir / "fakebrowser"
    assert calls.read_text().splitlines() == [
        "policy fakebrowser-pkg",
        "-q -o DPkg::Lock::Timeout=600 update",
        "-q -o DPkg::Lock::Timeout=600 install -y --no-install-recommends fakebrowser-pkg",
    ]
    assert package.ensure(log_dir=tmp_path / "logs") == bin_dir / "fakebrowser"  # found: nothing run again
    assert len(calls.read_text().splitlines()) == 3
    missing = system.SystemPackage("nothing-pkg", "nothing-at-all", "nothing")
    (bin_dir / "apt-get").write_text("#!/bin/sh\necho 'E: Unable to locate package nothing-pkg' >&2\nexit 100\n")
    with pytest.raises(proc.InfraError, match="Unable to locate package nothing-pkg"):
        missing.ensure(log_dir=tmp_path / "logs")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(proc.InfraError, match="install the Debian package as root"):
        missing.ensure(log_dir=tmp_path / "logs")


def _artifact_references(path: Path) -> set[str]:
    """Names of `tests.infra.build` attributes a module uses (`build.X` or `from tests.infra.build import X`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "build":
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module == "tests.infra.build":
            names.update(alias.name for alias in node.names)
    return names


def test_every_artifact_a_test_or_start_up_reads_is_one_up_ensures() -> None:
    """Tests and start-up code read some artifacts directly (the v1beta2 CRD, kubectl, the Kafka jars, the Compose
    schema): each must be in what `up` of all components ensures, and `up` ensures no artifact nothing defines."""
    referenced: dict[build.Artifact, list[str]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(build.__file__):
            continue
        for name in _artifact_references(path):
            artifact = getattr(build, name, None)
            if isinstance(artifact, build.Artifact):
                referenced.setdefault(artifact, []).append(str(path.relative_to(REPO_ROOT)))
    ensured = set(build.required_artifacts(set(Component)))
    assert build.KUEUE_V1BETA2_WORKLOAD_CRD in referenced and build.KAFKA in referenced  # the scan sees the uses
    assert {a.path.name: users for a, users in referenced.items() if a not in ensured} == {}
    defined = {value for value in vars(build).values() if isinstance(value, build.Artifact)}
    assert {a.path.name for a in defined} == {a.path.name for a in ensured}


# --- a missing service fails, never skips ------------------------------------------------------------------------


def _inner_pytest(tmp_path: Path, test_source: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run one test module in a pytest of its own with the test-environment plugin, without
    TRACKER_TESTENV_REQUIRED: what `./run test` and a plain `uv run pytest` did."""
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "conftest.py").write_text('pytest_plugins = ["tests.infra.fixtures"]\n')
    (inner / "test_inner.py").write_text(test_source)
    environment = {k: v for k, v in os.environ.items() if k != "TRACKER_TESTENV_REQUIRED"}
    environment.update(PYTHONPATH=str(REPO_ROOT), **env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "--rootdir", str(inner), str(inner)],
        cwd=inner, env=environment, capture_output=True, text=True, timeout=120, check=False,
    )


def _outcome(result: subprocess.CompletedProcess[str]) -> str:
    """The counts of pytest's last line, e.g. "1 error" or "1 skipped"."""
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    return re.sub(r" in [0-9.]+s.*$", "", summary).strip("= ")


def test_a_service_that_does_not_answer_fails_the_test(tmp_path: Path) -> None:
    result = _inner_pytest(
        tmp_path, "def test_needs_kafka(kafka_bootstrap):\n    pass\n", TRACKER_TEST_KAFKA_BOOTSTRAP="127.0.0.1:1"
    )
    assert _outcome(result) == "1 error", result.stdout + result.stderr  # a fixture failing: the test errors
    assert "does not answer a metadata request" in result.stdout


def test_an_unbuilt_environment_fails_the_test_naming_the_set_up_command(tmp_path: Path) -> None:
    result = _inner_pytest(
        tmp_path,
        "def test_needs_kube(kubeconfig):\n    pass\n",
        TRACKER_TESTENV_CACHE=str(tmp_path / "empty-cache"),
        TRACKER_TESTENV_DIR=str(tmp_path / "state"),
    )
    assert _outcome(result) == "1 error", result.stdout + result.stderr  # a fixture failing: the test errors
    assert "python -m tests.infra up --components kube" in result.stdout
    assert not (tmp_path / "empty-cache").exists() or not any((tmp_path / "empty-cache").iterdir())  # built nothing


_SKIPS = {"skip", "skipif", "importorskip", "xfail"}


def test_no_test_skips() -> None:
    """No `pytest.skip(...)`, `pytest.importorskip`, `pytest.xfail`, `@pytest.mark.skip/skipif/xfail` anywhere in
    tests/: a test that cannot run fails (a skipped test counts as a failure in CI)."""
    found: list[str] = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Attribute) and node.attr in _SKIPS):
                continue
            owner = node.value
            is_pytest = isinstance(owner, ast.Name) and owner.id == "pytest"
            is_mark = isinstance(owner, ast.Attribute) and owner.attr == "mark"
            if is_pytest or is_mark:
                found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


# --- the Kafka cluster id ---------------------------------------------------------------------------------------

#: base64url of 0xF8... starts with "-" (0xF8 >> 2 == 62, the alphabet's "-").
DASH_UUID = uuid.UUID(bytes=b"\xf8" + bytes(range(1, 16)))


def test_the_cluster_id_is_redrawn_when_it_would_start_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    assert base64.urlsafe_b64encode(DASH_UUID.bytes).decode().startswith("-")
    draws = iter([DASH_UUID, DASH_UUID, uuid.UUID(int=7 << 100)])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(draws))
    cluster_id = kafka.new_cluster_id()
    assert cluster_id == base64.urlsafe_b64encode(uuid.UUID(int=7 << 100).bytes).rstrip(b"=").decode()
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_the_cluster_id_is_passed_as_one_argument(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Even an id starting with `-` cannot be read as an option: `--cluster-id=<id>`, never `-t <id>`."""
    argvs: list[list[str]] = []
    monkeypatch.setattr(kafka, "run", lambda argv, what: argvs.append([str(a) for a in argv]))
    kafka.format_storage(["java", "-cp", "lib/*"], tmp_path / "server.properties", "-abc")
    [argv] = argvs
    assert "--cluster-id=-abc" in argv and "-t" not in argv and "--cluster-id" not in argv
