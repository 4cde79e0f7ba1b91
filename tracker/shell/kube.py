"""The Kubernetes API as the watcher, the leader election and ``tracker doctor`` use it: JSON requests and line
streams over kubernetes_asyncio's ``ApiClient``, API discovery, and the reconnect backoff.

HTTP goes through kubernetes_asyncio's ``ApiClient`` (configuration, authentication, TLS, connection pool)
with ``_preload_content=False``: responses and watch events are decoded once into plain dicts (the camelCase JSON
the reducer reads), never into the generated models, and ERROR events and 410s are left to the caller rather than
to ``kubernetes_asyncio.watch.Watch`` (which retries a 410 once with the same, still too old, version).
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import ConfigException, load_incluster_config, load_kube_config

from tracker import errors
from tracker.settings import yaml_problem
from tracker.shell import jsonio

MAX_EVENT_BYTES = 4 * 1024 * 1024  # an object is at most ~1.5 MiB in etcd; a watch line adds little


# ------------------------------------------------------------------------------------------ resources


@dataclass(frozen=True, slots=True)
class Resource:
    """One collection the watcher lists and watches."""

    name: str  # stream name, also the checkpoint key's first part
    group: str  # "" for the core group
    versions: tuple[str, ...]  # acceptable served versions; the group's preferred one wins, else the first
    plural: str
    kind: str
    tier: int  # initial-sync order: a stream lists after every stream of a lower tier has
    label_selector: str = ""
    cluster_scoped: bool = False  # listed cluster-wide even when the watcher is limited to namespaces

    def version_path(self, version: str) -> str:
        return f"/apis/{self.group}/{version}" if self.group else f"/api/{version}"

    def collection_path(self, version: str, namespace: str | None) -> str:
        scope = f"/namespaces/{namespace}" if namespace else ""
        return f"{self.version_path(version)}{scope}/{self.plural}"

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version


# ------------------------------------------------------------------------------------------ HTTP


class ApiError(errors.TrackerError):
    """A non-2xx answer or an ERROR watch event; ``status`` is the HTTP code (410 means Gone)."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message


class KubeApi:
    """JSON requests and line streams over a kubernetes_asyncio ``ApiClient`` (which it does not own)."""

    def __init__(self, client: ApiClient, *, connect_timeout_s: float = 10.0, request_timeout_s: float = 60.0
                 ) -> None:
        self.client = client
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s

    async def request(self, method: str, path: str, *, params: Sequence[tuple[str, str]] = (),
                      body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.decoded(*await self.request_bytes(method, path, params=params, body=body))

    async def request_bytes(self, method: str, path: str, *, params: Sequence[tuple[str, str]] = (),
                            body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        """A request's status and body, undecoded (``decoded`` decodes it as ``request`` does)."""
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s, sock_connect=self.connect_timeout_s)
        resp = await self._call(method, path, params, body, timeout)
        try:
            return resp.status, await resp.read()
        finally:
            resp.release()

    @staticmethod
    def decoded(status: int, data: bytes) -> dict[str, Any]:
        """A response's body as a JSON object; ApiError if it is not one."""
        try:
            out = jsonio.loads(data)
        except ValueError as exc:  # a proxy's error page, a cut body
            raise ApiError(status, "response is not JSON", f"{exc}: {data[:200]!r}") from exc
        if not isinstance(out, dict):
            raise ApiError(status, "unexpected response", repr(out)[:200])
        return out

    async def get(self, path: str, params: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
        return await self.request("GET", path, params=params)

    @asynccontextmanager
    async def lines(self, path: str, params: Sequence[tuple[str, str]], *, read_timeout_s: float
                    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """A streaming GET; yields its body line by line. Silence longer than ``read_timeout_s`` raises."""
        # connect: establishing the connection including the TLS handshake, which a half-open peer can stall
        timeout = aiohttp.ClientTimeout(total=None, connect=self.connect_timeout_s, sock_connect=self.connect_timeout_s,
                                        sock_read=read_timeout_s)
        resp = await self._call("GET", path, params, None, timeout)

        async def read() -> AsyncIterator[bytes]:
            while True:
                line = await resp.content.readline(max_line_length=MAX_EVENT_BYTES)
                if not line:
                    return
                yield line

        try:
            yield read()
        finally:
            resp.close()

    async def _call(self, method: str, path: str, params: Sequence[tuple[str, str]], body: dict[str, Any] | None,
                    client_timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        resp: aiohttp.ClientResponse = await self.client.call_api(
            path, method, query_params=list(params), body=body,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False, _request_timeout=client_timeout)
        if 200 <= resp.status < 300:
            return resp
        try:
            status = json.loads(await resp.read())
        except (json.JSONDecodeError, UnicodeDecodeError):  # not a Status: the code and reason say enough
            status = {}
        finally:
            resp.release()
        if not isinstance(status, dict):
            status = {}
        raise ApiError(resp.status, str(status.get("reason") or resp.reason), str(status.get("message") or ""))


async def discover(api: KubeApi, res: Resource) -> str | None:
    """The version ``res`` is served at, or None if it is not served (a CRD that is not installed)."""
    candidates = list(res.versions)
    if res.group:
        try:
            group = await api.get(f"/apis/{res.group}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        served = {v.get("version") for v in group.get("versions") or [] if isinstance(v, dict)}
        preferred = (group.get("preferredVersion") or {}).get("version")
        candidates = sorted((v for v in candidates if v in served), key=lambda v: v != preferred)
    for version in candidates:
        try:
            listing = await api.get(res.version_path(version))
        except ApiError as exc:
            if exc.status == 404:
                continue
            raise
        if any(isinstance(r, dict) and r.get("name") == res.plural for r in listing.get("resources") or []):
            return version
    return None


class Backoff:
    """Capped exponential backoff with jitter: the n-th delay is uniform in [d/2, d], d = min(cap, base·2ⁿ)."""

    def __init__(self, *, base_s: float, cap_s: float, rng: random.Random) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.rng = rng
        self.failures = 0

    def next(self) -> float:
        d = min(self.cap_s, self.base_s * 2.0 ** min(self.failures, 32))
        self.failures += 1
        return d / 2 + self.rng.random() * d / 2

    def reset(self) -> None:
        self.failures = 0


class KubeconfigError(errors.ConfigError):
    """No usable kubeconfig: the file is missing or does not read, or names no usable context."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"no usable kubeconfig ({where}: {why}): {FIX_KUBECONFIG}")
        self.where, self.why = where, why


FIX_KUBECONFIG = "pass --kubeconfig PATH (and --context), set KUBECONFIG, or run in a pod with a ServiceAccount token"


def _which_kubeconfig(kubeconfig: Path | None) -> str:
    """Where the kubeconfig was looked for, for the one-line error."""
    if kubeconfig is not None:
        return str(kubeconfig)
    env = os.environ.get("KUBECONFIG")
    return f"KUBECONFIG={env}" if env else "~/.kube/config (KUBECONFIG is not set; not in a pod)"


async def kube_client(kubeconfig: Path | None, context: str | None, *, connections: int) -> ApiClient:
    """An ApiClient from ``kubeconfig``; without one, the in-cluster service account, else ~/.kube/config.

    No usable configuration is one ``KubeconfigError`` line saying where it was looked for and how to give one
    (kubernetes_asyncio's own warning, which says less, is not logged)."""
    cfg = Configuration()
    logging.getLogger("kubernetes_asyncio.config.kube_config").setLevel(logging.ERROR)
    try:
        if kubeconfig is None:
            try:
                load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]  # untyped upstream
            except ConfigException:
                await load_kube_config(context=context, client_configuration=cfg)
        else:
            await load_kube_config(config_file=str(kubeconfig), context=context, client_configuration=cfg)
    except (ConfigException, OSError, ValueError, TypeError, KeyError, yaml.YAMLError) as exc:
        # (a file that is not a kubeconfig raises any of these; a YAML error quotes the offending line, which may
        # hold a token: only where, and what is wrong)
        if not _any_file(kubeconfig):
            why = "no such file"
        elif isinstance(exc, yaml.YAMLError):
            why = f"not valid YAML: {yaml_problem(exc)}"
        else:
            why = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise KubeconfigError(_which_kubeconfig(kubeconfig), why) from exc
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize, connections)  # one connection per watch
    return ApiClient(cfg)


def _any_file(kubeconfig: Path | None) -> bool:
    """Whether any of the files the kubeconfig is read from exists."""
    if kubeconfig is not None:
        return kubeconfig.exists()
    env = os.environ.get("KUBECONFIG")
    paths = env.split(os.pathsep) if env else [os.path.expanduser("~/.kube/config")]
    return any(Path(p).exists() for p in paths if p)
