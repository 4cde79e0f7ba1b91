"""`docker compose config` without Docker: load a Compose file the way compose-go (the loader of `docker compose`)
does, and refuse it where compose would.

The steps, in compose-go's order:

1. YAML as compose-go's YAML library reads it (YAML 1.2 scalars: `no`, `on`, `1:20` and `2024-01-01` are strings;
   a mapping key defined twice is an error); anchors and `<<` merges resolved.
2. Interpolation of every value: `$$`, `$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?error}`,
   `${VAR?error}`, `${VAR:+alternative}`, `${VAR+alternative}`, nested in defaults; a malformed `${...}` is an
   error. Variables come from `env`, then from a `.env` file beside the Compose file.
3. The Compose Specification's JSON schema (`schema/compose-spec.json` of compose-go), on the whole file.
4. Profiles: the services that run with the given `--profile`s.
5. compose-go's consistency checks on those services: an image or a build; `depends_on` (a service of an inactive
   profile only with `required: false`), `volumes_from`, `network_mode: service:...` name active services;
   named volumes, networks, secrets and configs are declared at the top level; healthcheck tests start with
   CMD/CMD-SHELL/NONE; no mount target twice; no `depends_on` cycle; `env_file`s exist (unless not required);
   the project name is valid; ports parse and their host IPs are IP addresses.

Stricter than compose, on purpose: a variable that is unset and has no default is an error (compose warns and
uses ""), a local build context and its Dockerfile must exist, and two active services must not publish the same
host port (the engine would refuse the second at `up`). Not supported, and refused rather than passed unchecked:
`include`, `extends`, and interpolation type casts (a `${...}` where the schema wants a number or a boolean).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml


class ComposeError(ValueError):
    """The file would not load; the message names where in the file."""


# --- YAML as compose-go reads it --------------------------------------------------------------------------------


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with the YAML 1.2 core schema's implicit types instead of YAML 1.1's, and duplicate keys
    refused: what compose-go's YAML library (go-yaml v3) gives when decoding into untyped values."""

    yaml_implicit_resolvers: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise ComposeError(f"line {key_node.start_mark.line + 1}: mapping key {key!r} already defined")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        text = str(self.construct_scalar(node)).replace("_", "")
        return int(text, 0) if re.match(r"[-+]?0[oOxX]", text) else int(text, 10)


for _tag, _pattern, _first in (
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        "float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+.0123456789",
    ),
    ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("merge", r"^(?:<<)$", "<"),
):
    _Yaml12Loader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(_pattern), list(_first))
_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _Yaml12Loader.construct_yaml_int)


def parse_yaml(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_Yaml12Loader)  # a safe loader (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        raise ComposeError(f"not valid YAML: {exc}") from exc


# --- interpolation ----------------------------------------------------------------------------------------------

_NAME = re.compile(r"[_A-Za-z][_A-Za-z0-9]*")
_BRACED = re.compile(r"(?P<name>[_A-Za-z][_A-Za-z0-9]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?", re.DOTALL)


def interpolate(text: str, env: Mapping[str, str], where: str = "value") -> str:
    """`text` with its variables substituted as compose substitutes them (see the module docstring)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$":
            out.append(char)
            i += 1
            continue
        following = text[i + 1 : i + 2]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "{":
            end = _closing_brace(text, i + 2)
            if end < 0:
                raise ComposeError(f"{where}: invalid template {text!r}: `${{` is never closed")
            out.append(_substitute(text[i + 2 : end], env, where, text))
            i = end + 1
        elif named := _NAME.match(text, i + 1):
            out.append(_lookup(named.group(), env, where))
            i = named.end()
        else:  # a lone `$` (e.g. before a space) stays, as in compose
            out.append("$")
            i += 1
    return "".join(out)


def _closing_brace(text: str, start: int) -> int:
    depth = 1
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return index
    return -1


def _substitute(body: str, env: Mapping[str, str], where: str, template: str) -> str:
    match = _BRACED.fullmatch(body)
    if match is None:
        raise ComposeError(f"{where}: invalid template {template!r}")
    name, op, arg = match.group("name"), match.group("op"), match.group("arg")
    if op is None:
        return _lookup(name, env, where)
    value = env.get(name)
    missing = value is None or (op.startswith(":") and value == "")
    if op.endswith("-"):
        return interpolate(arg, env, where) if missing or value is None else value
    if op.endswith("?"):
        if missing or value is None:
            raise ComposeError(f"{where}: required variable {name} is missing a value: {arg}")
        return value
    return "" if missing else interpolate(arg, env, where)  # `+`: the alternative when set


def _lookup(name: str, env: Mapping[str, str], where: str) -> str:
    value = env.get(name)
    if value is None:
        raise ComposeError(f"{where}: variable {name} is not set and has no default (compose would use \"\")")
    return value


def _interpolate_tree(value: Any, env: Mapping[str, str], path: str) -> Any:
    if isinstance(value, str):
        return interpolate(value, env, path)
    if isinstance(value, dict):
        return {key: _interpolate_tree(item, env, f"{path}.{key}" if path else str(key)) for key, item in value.items()}
    if isinstance(value, list):
        return [_interpolate_tree(item, env, f"{path}[{index}]") for index, item in enumerate(value)]
    return value


def read_dotenv(path: Path) -> dict[str, str]:
    """`KEY=VALUE` lines of a `.env` file (blank lines, `#` comments and `export ` prefixes allowed)."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not _NAME.fullmatch(key.strip()):
            raise ComposeError(f"{path}:{number}: not KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


# --- the loader -------------------------------------------------------------------------------------------------


def load(
    path: Path, schema: Mapping[str, Any], *, env: Mapping[str, str], profiles: Sequence[str] = ()
) -> dict[str, Any]:
    """The Compose file at `path` as `docker compose [--profile P]... config` resolves it, with only the services
    active under `profiles`; raises ComposeError where compose would refuse it (or where it is stricter, see the
    module docstring)."""
    project_dir = path.parent
    dotenv = project_dir / ".env"
    variables = {**(read_dotenv(dotenv) if dotenv.is_file() else {}), **env}
    raw = parse_yaml(path.read_text())
    if not isinstance(raw, dict):
        raise ComposeError("top-level object must be a mapping")
    model: dict[str, Any] = _interpolate_tree(raw, variables, "")
    validate_schema(model, schema)
    for unsupported in ("include",):
        if unsupported in model:
            raise ComposeError(f"`{unsupported}` is not supported by this checker")
    name = model.get("name")
    if name is not None and not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", str(name)):
        raise ComposeError(f"name: {name!r} is not a valid project name (lowercase letters, digits, - and _)")
    services: dict[str, dict[str, Any]] = model.get("services") or {}
    wanted = set(profiles)
    active = {
        name: service
        for name, service in services.items()
        if not service.get("profiles") or "*" in wanted or wanted & set(service["profiles"])
    }
    resolved = {name: _check_service(name, service, model, active, project_dir) for name, service in active.items()}
    _check_cycles(resolved)
    _check_published_ports(resolved)
    return {**model, "services": resolved}


def validate_schema(model: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    """Every violation of the Compose Specification's JSON schema, in one error."""
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(dict(schema))
    errors = sorted(validator_class(schema).iter_errors(model), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = [f"{'.'.join(str(p) for p in e.absolute_path) or '(top level)'}: {e.message}" for e in errors]
        raise ComposeError("does not match the Compose Specification:\n  " + "\n  ".join(lines))


def _names(entries: Any) -> list[str]:
    """Keys of a mapping, or the items of a list (of strings or of `{source: ...}` mappings)."""
    if isinstance(entries, dict):
        return list(entries)
    return [entry["source"] if isinstance(entry, dict) else str(entry) for entry in entries or []]


def _check_service(
    name: str, service: dict[str, Any], model: Mapping[str, Any], active: Mapping[str, Any], project_dir: Path
) -> dict[str, Any]:
    where = f"services.{name}"
    services: Mapping[str, Any] = model.get("services") or {}
    if "extends" in service:
        raise ComposeError(f"{where}.extends is not supported by this checker")
    if not service.get("image") and not service.get("build") and not service.get("provider"):
        raise ComposeError(f"{where}: has neither an image nor a build context specified")
    if service.get("build"):
        _check_build(where, service["build"], project_dir)

    networks = _names(service.get("networks"))
    if service.get("network_mode") and networks:
        raise ComposeError(f"{where}: declares mutually exclusive `network_mode` and `networks`")
    for network in networks:
        if network != "default" and network not in (model.get("networks") or {}):
            raise ComposeError(f"{where}: refers to undefined network {network}")
    network_mode = str(service.get("network_mode", ""))
    if network_mode.startswith("service:") and network_mode.removeprefix("service:") not in active:
        raise ComposeError(f"{where}: network_mode {network_mode!r} names no active service")

    test = (service.get("healthcheck") or {}).get("test")
    if isinstance(test, list) and test and test[0] not in ("CMD", "CMD-SHELL", "NONE"):
        raise ComposeError(f'{where}.healthcheck.test must start either by "CMD", "CMD-SHELL" or "NONE"')

    depends_on = _depends_on(service.get("depends_on"))
    for target, condition in depends_on.items():
        if target in active:
            continue
        if target in services and condition.get("required") is False:
            continue
        state = "is not active with these profiles" if target in services else "is undefined"
        raise ComposeError(f"{where}: depends on service {target!r}, which {state}")
    for source in service.get("volumes_from") or []:
        target = str(source).split(":")[0]
        if target != "container" and target not in active:
            raise ComposeError(f"{where}.volumes_from: {source!r} names no active service")

    volumes = [_volume(where, entry) for entry in service.get("volumes") or []]
    for volume in volumes:
        if volume["type"] == "volume" and volume.get("source") and volume["source"] not in (model.get("volumes") or {}):
            raise ComposeError(f"{where}: refers to undefined volume {volume['source']}")
    for kind in ("secrets", "configs"):
        for source in _names(service.get(kind)):
            if source not in (model.get(kind) or {}):
                raise ComposeError(f"{where}: refers to undefined {kind[:-1]} {source}")

    tmpfs = service.get("tmpfs") or []
    targets = [str(t).split(":")[0] for t in ([tmpfs] if isinstance(tmpfs, str) else tmpfs)]
    targets += [v["target"] for v in volumes]
    duplicated = sorted({t for t in targets if targets.count(t) > 1})
    if duplicated:
        raise ComposeError(f"{where}: mount target(s) {', '.join(duplicated)} mounted twice")

    env_files = service.get("env_file") or []
    for entry in [env_files] if isinstance(env_files, str) else env_files:
        file, required = (entry, True) if isinstance(entry, str) else (entry["path"], entry.get("required", True))
        if required and not (project_dir / Path(file).expanduser()).is_file():
            raise ComposeError(f"{where}: env file {file} not found")

    ports = [_port(where, entry) for entry in service.get("ports") or []]
    return {**service, "depends_on": depends_on, "volumes": volumes, "ports": ports}


def _check_build(where: str, build: Any, project_dir: Path) -> None:
    spec = {"context": build} if isinstance(build, str) else build
    context = str(spec.get("context", "."))
    if "://" in context or context.startswith("git@"):
        return  # a remote context: nothing local to check
    directory = project_dir / Path(context).expanduser()
    if not directory.is_dir():
        raise ComposeError(f"{where}.build: context {context} is not a directory")
    if "dockerfile_inline" in spec:
        if "dockerfile" in spec:
            raise ComposeError(f"{where}.build: declares mutually exclusive dockerfile and dockerfile_inline")
        return
    dockerfile = directory / spec.get("dockerfile", "Dockerfile")
    if not dockerfile.is_file():
        raise ComposeError(f"{where}.build: no Dockerfile at {dockerfile}")


def _depends_on(value: Any) -> dict[str, dict[str, Any]]:
    if isinstance(value, dict):
        default = {"condition": "service_started", "required": True}
        return {name: {**default, **(spec or {})} for name, spec in value.items()}
    return {str(name): {"condition": "service_started", "required": True} for name in value or []}


def _volume(where: str, entry: Any) -> dict[str, Any]:
    """A service volume in long syntax; short syntax parsed as compose-go's format.ParseVolume parses it."""
    if isinstance(entry, dict):
        return entry
    spec = str(entry)
    parts = spec.split(":")
    if any(not part for part in parts) or len(parts) > 3:
        raise ComposeError(f"{where}.volumes: invalid spec {spec!r}")
    if len(parts) == 1:
        return {"type": "volume", "target": spec}
    source, target = parts[0], parts[1]
    options = parts[2].split(",") if len(parts) == 3 else []
    kind = "bind" if source.startswith((".", "/", "~")) else "volume"
    return {"type": kind, "source": source, "target": target, "read_only": "ro" in options}


_PORTS = re.compile(r"\d+(?:-\d+)?")


def _port(where: str, entry: Any) -> dict[str, Any]:
    """A service port in long syntax; `[[host_ip:]published:]target[/protocol]` parsed and checked."""
    if isinstance(entry, dict):
        return entry
    spec, _, protocol = str(entry).partition("/")
    host_ip, published = "", ""
    if spec.startswith("["):  # an IPv6 host address
        host_ip, separator, spec = spec[1:].partition("]:")
        if not separator:
            raise ComposeError(f"{where}.ports: invalid spec {entry!r}")
    parts = spec.split(":")
    if len(parts) > 3 or (host_ip and len(parts) != 2):
        raise ComposeError(f"{where}.ports: invalid spec {entry!r}")
    if len(parts) == 3:
        host_ip = parts.pop(0)
    if len(parts) == 2:
        published = parts.pop(0)
    target = parts[0]
    if host_ip:
        try:
            ipaddress.ip_address(host_ip)
        except ValueError:
            raise ComposeError(f"{where}.ports: {host_ip!r} of {entry!r} is not an IP address") from None
    for value in (target, published) if published else (target,):
        if not _PORTS.fullmatch(value) or not all(0 < int(p) < 65536 for p in value.split("-")):
            raise ComposeError(f"{where}.ports: {value!r} of {entry!r} is not a port or a port range")
    if protocol not in ("", "tcp", "udp", "sctp"):
        raise ComposeError(f"{where}.ports: unknown protocol {protocol!r} in {entry!r}")
    port: dict[str, Any] = {"target": target, "protocol": protocol or "tcp"}
    if published:
        port["published"] = published
    if host_ip:
        port["host_ip"] = host_ip
    return port


def _check_cycles(services: Mapping[str, Mapping[str, Any]]) -> None:
    done: set[str] = set()

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if name in trail:
            raise ComposeError(f"dependency cycle: {' -> '.join((*trail[trail.index(name):], name))}")
        if name in done or name not in services:
            return
        for target in services[name].get("depends_on") or {}:
            visit(target, (*trail, name))
        done.add(name)

    for name in services:
        visit(name, ())


def _check_published_ports(services: Mapping[str, Mapping[str, Any]]) -> None:
    """No two services publish the same host port (same protocol, overlapping host IPs)."""
    taken: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for name, service in services.items():
        for port in service.get("ports") or []:
            published = str(port.get("published") or "")
            if not published:
                continue
            low, _, high = published.partition("-")
            for number in range(int(low), int(high or low) + 1):
                host_ip = str(port.get("host_ip") or "")
                for other, other_ip in taken.get((port.get("protocol", "tcp"), number), []):
                    if not host_ip or not other_ip or host_ip == other_ip:
                        raise ComposeError(f"services {other} and {name} both publish host port {number}")
                taken.setdefault((port.get("protocol", "tcp"), number), []).append((name, host_ip))
