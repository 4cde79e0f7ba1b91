"""`tests.infra.compose`, the `docker compose config` stand-in that checks docker-compose.yml without Docker: each
rule refuses what compose refuses, so that `test_deploy.test_compose_config` passing means something."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.infra import compose
from tests.infra.compose import ComposeError
from tests.infra.config import REPO_ROOT

BASE: dict[str, Any] = {
    "name": "demo",
    "services": {
        "app": {"build": ".", "image": "app:dev", "ports": ["127.0.0.1:8080:80"], "volumes": ["data:/data"],
                "depends_on": {"db": {"condition": "service_healthy"}}},
        "db": {"image": "postgres:17", "healthcheck": {"test": ["CMD", "pg_isready"]}},
    },
    "volumes": {"data": {}},
}


@pytest.fixture(scope="module")
def schema(compose_schema: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(compose_schema.read_text())
    return loaded


def load(tmp_path: Path, schema: dict[str, Any], document: dict[str, Any] | str, *, env: dict[str, str] | None = None,
         profiles: tuple[str, ...] = ()) -> dict[str, Any]:
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    path = tmp_path / "compose.yaml"
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
    return compose.load(path, schema, env=env or {}, profiles=profiles)


def changed(**services: dict[str, Any] | None) -> dict[str, Any]:
    """BASE with some services replaced (None: removed)."""
    merged = {**BASE["services"], **services}
    return {**BASE, "services": {k: v for k, v in merged.items() if v is not None}}


def test_the_base_document_loads(tmp_path: Path, schema: dict[str, Any]) -> None:
    services = load(tmp_path, schema, BASE)["services"]
    assert services["app"]["depends_on"] == {"db": {"condition": "service_healthy", "required": True}}
    assert services["app"]["ports"] == [{"target": "80", "published": "8080", "host_ip": "127.0.0.1",
                                         "protocol": "tcp"}]


@pytest.mark.parametrize(("template", "env", "expected"), [
    ("plain", {}, "plain"),
    ("$$HOME and $$", {}, "$HOME and $"),
    ("$A-$A", {"A": "x"}, "x-x"),
    ("${A}", {"A": "x"}, "x"),
    ("${A:-fallback}", {}, "fallback"),
    ("${A:-fallback}", {"A": ""}, "fallback"),
    ("${A-fallback}", {"A": ""}, ""),
    ("${A:-${B:-inner}}/x", {}, "inner/x"),
    ("${A:-~/.kube/config}", {}, "~/.kube/config"),
    ("${A:+alt}", {"A": "x"}, "alt"),
    ("${A:+alt}", {"A": ""}, ""),
    ("${A+alt}", {"A": ""}, "alt"),
    ("${A+alt}", {}, ""),
    ("${A:?needed}", {"A": "x"}, "x"),
    ("cost: $ 5", {}, "cost: $ 5"),
])
def test_interpolation(template: str, env: dict[str, str], expected: str) -> None:
    assert compose.interpolate(template, env) == expected


@pytest.mark.parametrize(("template", "env", "error"), [
    ("${A", {}, "never closed"),
    ("${}", {}, "invalid template"),
    ("${1A}", {}, "invalid template"),
    ("${A:}", {"A": "x"}, "invalid template"),
    ("${A B}", {"A": "x"}, "invalid template"),
    ("$A", {}, "A is not set and has no default"),
    ("${A}", {}, "A is not set and has no default"),
    ("${A:?the kubeconfig}", {"A": ""}, "required variable A is missing a value: the kubeconfig"),
    ("${A?the kubeconfig}", {}, "required variable A is missing a value: the kubeconfig"),
])
def test_interpolation_refuses(template: str, env: dict[str, str], error: str) -> None:
    with pytest.raises(ComposeError, match=re.escape(error)):
        compose.interpolate(template, env)


def test_interpolated_values_are_what_the_schema_sees(tmp_path: Path, schema: dict[str, Any]) -> None:
    app = {**BASE["services"]["app"], "image": "${IMAGE:-app:dev}", "read_only": "${RO:-true}"}
    assert load(tmp_path, schema, changed(app=app))["services"]["app"]["image"] == "app:dev"
    app["image"] = "${IMAGE}"
    with pytest.raises(ComposeError, match=r"services\.app\.image: variable IMAGE is not set"):
        load(tmp_path, schema, changed(app=app))
    (tmp_path / ".env").write_text("# from the project's .env\nIMAGE=app:from-dotenv\n")
    assert load(tmp_path, schema, changed(app=app))["services"]["app"]["image"] == "app:from-dotenv"
    assert load(tmp_path, schema, changed(app=app), env={"IMAGE": "a:b"})["services"]["app"]["image"] == "a:b"


def test_yaml_is_read_as_compose_reads_it(tmp_path: Path, schema: dict[str, Any]) -> None:
    text = "services:\n  app:\n    image: x\n    restart: no\n    environment:\n      WHEN: 2024-01-01\n"
    app = load(tmp_path, schema, text)["services"]["app"]
    assert app["restart"] == "no" and app["environment"]["WHEN"] == "2024-01-01"  # YAML 1.2: strings
    with pytest.raises(ComposeError, match="line 4: mapping key 'image' already defined"):
        load(tmp_path, schema, "services:\n  app:\n    image: x\n    image: y\n")
    merged = "x-base: &base\n  image: x\n  read_only: true\nservices:\n  app:\n    <<: *base\n    image: y\n"
    assert load(tmp_path, schema, merged)["services"]["app"] == {
        "image": "y", "read_only": True, "depends_on": {}, "volumes": [], "ports": []}


@pytest.mark.parametrize(("service", "error"), [
    ({"image": "x", "imagee": "typo"},
     r"services\.app: Unevaluated properties are not allowed \('imagee' was unexpected"),
    ({"image": "x", "restart": ["no"]}, r"services\.app\.restart: \['no'\] is not of type 'string'"),
    ({"image": "x", "depends_on": {"db": {"condition": "service_ready"}}},
     r"services\.app\.depends_on: .*service_ready.* is not valid"),
    ({"image": "x", "cap_drop": "ALL"}, r"services\.app\.cap_drop: 'ALL' is not of type 'array'"),
])
def test_the_schema_refuses(tmp_path: Path, schema: dict[str, Any], service: dict[str, Any], error: str) -> None:
    with pytest.raises(ComposeError, match=error):
        load(tmp_path, schema, changed(app=service))


@pytest.mark.parametrize(("document", "error"), [
    (changed(app={"ports": ["80"]}), "has neither an image nor a build context"),
    ({**BASE, "volumes": {}}, "refers to undefined volume data"),
    (changed(app={"image": "x", "networks": ["backend"]}), "refers to undefined network backend"),
    (changed(app={"image": "x", "network_mode": "service:nope"}), "names no active service"),
    (changed(db=None), "depends on service 'db', which is undefined"),
    (changed(db={"image": "x", "profiles": ["extra"]}), "depends on service 'db', which is not active"),
    (changed(db={"image": "x", "healthcheck": {"test": ["RUN", "true"]}}), "healthcheck.test must start either"),
    (changed(db={"image": "x", "depends_on": ["app"]}), "dependency cycle: "),
    (changed(db={"image": "x", "env_file": ["db.env"]}), "env file db.env not found"),
    (changed(db={"image": "x", "secrets": ["password"]}), "refers to undefined secret password"),
    (changed(db={"image": "x", "volumes_from": ["nope"]}), "volumes_from: 'nope' names no active service"),
    (changed(db={"image": "x", "tmpfs": ["/data"], "volumes": ["data:/data"]}), "/data mounted twice"),
    (changed(db={"image": "x", "ports": ["localhost:9000:9000"]}), "'localhost' of 'localhost:9000:9000' is not an IP"),
    (changed(db={"image": "x", "ports": ["127.0.0.1:70000:80"]}), "'70000' of '127.0.0.1:70000:80' is not a port"),
    (changed(db={"image": "x", "ports": ["8080:5432"]}), "services app and db both publish host port 8080"),
    (changed(db={"image": "x", "build": {"context": "missing"}}), "context missing is not a directory"),
    (changed(db={"image": "x", "build": {"context": ".", "dockerfile": "db.Dockerfile"}}), "no Dockerfile at"),
    (changed(db={"image": "x", "extends": {"service": "app"}}), "extends is not supported"),
    ({**BASE, "name": "Demo"}, "not a valid project name"),
])
def test_consistency_refuses(tmp_path: Path, schema: dict[str, Any], document: dict[str, Any], error: str) -> None:
    with pytest.raises(ComposeError, match=re.escape(error)):
        load(tmp_path, schema, document)


def test_what_compose_allows_is_allowed(tmp_path: Path, schema: dict[str, Any]) -> None:
    """The counterparts of the refusals: these load."""
    (tmp_path / "db.env").write_text("A=1\n")
    document = changed(db={"image": "x", "env_file": ["db.env", {"path": "optional.env", "required": False}],
                           "ports": ["127.0.0.2:8080:5432", "[::1]:9000:9000/udp"],
                           "depends_on": {"extra": {"condition": "service_started", "required": False}}},
                       extra={"image": "x", "profiles": ["extra"]})
    loaded = load(tmp_path, schema, document)["services"]
    assert set(loaded) == {"app", "db"}  # "extra" is not active without its profile
    assert set(load(tmp_path, schema, document, profiles=("extra",))["services"]) == {"app", "db", "extra"}


def test_the_repository_file_would_be_refused_with_a_dangling_volume(tmp_path: Path, schema: dict[str, Any]) -> None:
    """The real docker-compose.yml, one named volume's declaration removed: refused."""
    text = (REPO_ROOT / "docker-compose.yml").read_text()
    assert "\n  tracker-index:\n" in text
    with pytest.raises(ComposeError, match="sink-index: refers to undefined volume tracker-index"):
        compose.load(_beside_the_repo(tmp_path, text.replace("\n  tracker-index:\n", "\n")), schema, env={})


def _beside_the_repo(tmp_path: Path, text: str) -> Path:
    """`text` as a Compose file whose build context is the repository (as the real file's `build: .` is)."""
    path = tmp_path / "docker-compose.yml"
    path.write_text(text.replace("build: .", f"build: {REPO_ROOT}"))
    return path
