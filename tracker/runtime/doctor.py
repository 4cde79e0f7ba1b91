"""``tracker doctor``: preflight checks of everything the tracker needs, each with what is wrong and how to fix it.

Four areas, checked concurrently; every network call is bounded by ``--timeout``:

- **kube**: the kubeconfig (or the pod's ServiceAccount) loads and the apiserver answers; who the apiserver says
  we are (SelfSubjectReview); a SelfSubjectAccessReview for every verb of every rule of the watcher's RBAC
  (``deploy/k8s/rbac/clusterrole.yaml``, read at run time, so the checks cannot drift from the role): the
  ClusterRole's rules cluster-wide (or in each ``--namespace``), the leader-election Role's rules in the lease
  namespace; and discovery of every resource the watcher watches, at a version the watcher reads (the same
  ``Resource`` definitions and ``discover`` the watcher uses);
- **kafka**: the brokers answer; every topic of the configured layout exists with its partition count and
  configs (``cleanup.policy`` exactly: run-state and transitions are compacted, changes is not); changes,
  transitions and run-state have one partition count;
- **adx** (when ``TRACKER_ADX__CLUSTER_URI`` is set): the configured authentication gets a token and the
  database can be read; the TauGrid tables exist with the columns ``schemas/kusto/schema.json`` declares.

A failed check makes the exit status 1; warnings (a layout that works but differs from the settings) do not.
``--json`` prints ``{"ok": bool, "checks": [...]}`` instead of the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
import yaml
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tracker.runtime.ops import configure_logging, log_deprecated_env
from tracker.settings import KafkaSettings, Settings, SettingsError, load_settings
from tracker.shell import deadline, kafka, tasks
from tracker.shell.kube import FIX_KUBECONFIG, ApiError, KubeApi, KubeconfigError, Resource, discover, kube_client
from tracker.shell.watch.resources import EVENTS_APIS, all_resources
from tracker.shell.watch.visibility import GROUP as VISIBILITY_GROUP
from tracker.shell.watch.visibility import VERSIONS as VISIBILITY_VERSIONS

if TYPE_CHECKING:
    from tracker.settings import AdxSettings

Status = Literal["ok", "warn", "fail", "skip"]
AREAS = ("kube", "kafka", "adx")

REPO = Path(__file__).resolve().parents[2]
RBAC_FILE = REPO / "deploy" / "k8s" / "rbac" / "clusterrole.yaml"
KUSTO_SCHEMA = REPO / "schemas" / "kusto" / "schema.json"
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
APPLY_RBAC = "kubectl apply --server-side -f deploy/k8s/rbac/clusterrole.yaml (or the deploy/k8s overlay)"

# Kusto's column types as `.show database ... schema` reports them (.NET names) and as declared in KQL
_KUSTO_TYPES = {"System.String": "string", "System.Int64": "long", "System.Int32": "int", "System.Double": "real",
                "System.DateTime": "datetime", "System.Object": "dynamic", "System.SByte": "bool",
                "System.Boolean": "bool", "System.TimeSpan": "timespan", "System.Guid": "guid",
                "System.Data.SqlTypes.SqlDecimal": "decimal"}


@dataclass(frozen=True, slots=True)
class Check:
    area: str
    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True, slots=True)
class DoctorOptions:
    kubeconfig: Path | None = None
    context: str | None = None
    impersonate: str | None = None  # check as this user (needs the right to impersonate)
    namespaces: tuple[str, ...] = ()  # the watcher's --namespace list; empty: cluster-wide
    lease_namespace: str | None = None  # default: the pod's namespace, else the Role's in the RBAC file
    lease: bool = True  # check the leader-election Role (a watcher without --lease-namespace needs none)
    rbac_file: Path = RBAC_FILE
    events_api: str = "events.k8s.io/v1"
    timeout_s: float = 10.0
    skip: frozenset[str] = frozenset()


# ------------------------------------------------------------------------------------------ kube


@dataclass(frozen=True, slots=True)
class Permission:
    """Verbs on one resource, cluster-wide (``namespace`` None) or in a namespace, optionally on one name."""

    granted_by: str  # "ClusterRole <name>" or "Role <name>" of the RBAC file
    group: str
    resource: str
    verbs: tuple[str, ...]
    namespace: str | None = None
    name: str | None = None

    def describe(self) -> str:
        what = f"{self.resource}.{self.group}" if self.group else self.resource
        if self.name:
            what += f"/{self.name}"
        where = f"in {self.namespace}" if self.namespace else "cluster-wide"
        return f"{','.join(self.verbs)} {what} {where}"


def watcher_rbac(path: Path, *, namespaces: Sequence[str], lease_namespace: str | None, lease: bool
                 ) -> list[Permission]:
    """Every permission the watcher's RBAC file grants: the ClusterRole's rules in each of ``namespaces`` (or
    cluster-wide), the Role's in ``lease_namespace`` (default: the Role's own namespace)."""
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if isinstance(d, dict)]
    cluster_roles = [d for d in docs if d.get("kind") == "ClusterRole"]
    roles = [d for d in docs if d.get("kind") == "Role"]
    if len(cluster_roles) != 1:
        raise ValueError(f"{path}: expected one ClusterRole, found {len(cluster_roles)}")
    scopes: list[str | None] = list(namespaces) or [None]
    cluster_role = cluster_roles[0]
    perms = [p for rule in cluster_role.get("rules") or [] for scope in scopes
             for p in _rule_permissions(f"ClusterRole {cluster_role['metadata']['name']}", rule, scope)]
    for role in roles if lease else []:
        namespace = lease_namespace or role["metadata"].get("namespace")
        if not namespace:
            raise ValueError(f"{path}: Role {role['metadata'].get('name')} has no namespace; pass --lease-namespace")
        perms += [p for rule in role.get("rules") or []
                  for p in _rule_permissions(f"Role {role['metadata']['name']}", rule, namespace)]
    return perms


def _rule_permissions(granted_by: str, rule: dict[str, Any], namespace: str | None) -> list[Permission]:
    verbs = tuple(rule.get("verbs") or ())
    names: list[str | None] = list(rule.get("resourceNames") or [None])
    return [Permission(granted_by, group, resource, verbs, namespace, name) for group in rule.get("apiGroups") or []
            for resource in rule.get("resources") or [] for name in names]


async def _allowed(api: KubeApi, p: Permission, verb: str) -> tuple[bool, str]:
    resource, _, subresource = p.resource.partition("/")  # clusterqueues/pendingworkloads: a subresource
    attributes = {"group": p.group, "resource": resource, "verb": verb, "namespace": p.namespace or "",
                  "name": p.name or ""}
    if subresource:
        attributes["subresource"] = subresource
    review = await api.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes}})
    status = review.get("status") or {}
    return bool(status.get("allowed")), str(status.get("evaluationError") or "")


async def _whoami(api: KubeApi) -> str:
    try:
        review = await api.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    except ApiError as exc:
        if exc.status in (403, 404):  # older than 1.28, or the review is not allowed: not worth a failure
            return ""
        raise
    return str(((review.get("status") or {}).get("userInfo") or {}).get("username") or "")


async def _rbac_check(api: KubeApi, p: Permission, who: str, rbac_file: Path) -> Check:
    answers = await tasks.all_of(_allowed(api, p, verb) for verb in p.verbs)
    denied = [verb for verb, (allowed, _) in zip(p.verbs, answers, strict=True) if not allowed]
    errors = sorted({err for _, err in answers if err})
    if not denied:
        return Check("kube", f"rbac {p.describe()}", "ok", "allowed")
    subject = who or "this identity"
    if p.granted_by.startswith("Role "):
        fix = (f"bind {subject} to the {p.granted_by} of {rbac_file.name} in namespace {p.namespace} (the "
               f"namespace the watcher runs in, its --lease-namespace): {APPLY_RBAC}")
    else:
        fix = f"bind {subject} to the {p.granted_by} of {rbac_file.name}: {APPLY_RBAC}"
    detail = f"denied: {', '.join(denied)}" + (f" ({'; '.join(errors)})" if errors else "")
    return Check("kube", f"rbac {p.describe()}", "fail", detail, fix)


_INSTALL_HINT = {
    "kueue.x-k8s.io": "install Kueue, whose CRDs serve kueue.x-k8s.io/v1beta1 or v1beta2 (tested with Kueue "
                      "0.12, and Kueue 0.17's Workload CRD at v1beta2)",
    "ray.io": "install the KubeRay CRDs, which serve ray.io/v1 since KubeRay 1.0 (tested with 1.4)",
}


async def _api_check(api: KubeApi, res: Resource) -> Check:
    name = f"api {res.plural}.{res.group}" if res.group else f"api {res.plural}"
    version = await discover(api, res)
    if version is not None:
        return Check("kube", name, "ok", f"served at {res.api_version(version)}")
    wanted = " or ".join(res.versions)
    hint = _INSTALL_HINT.get(res.group, "a built-in API: check the apiserver version")
    if not res.group:
        return Check("kube", name, "fail", f"{res.plural} not served at {wanted}", hint)
    try:
        group = await api.get(f"/apis/{res.group}")
    except ApiError as exc:
        if exc.status != 404:
            raise
        return Check("kube", name, "fail", f"API group {res.group} is not served (its CRDs are not installed)", hint)
    served = [str(v.get("version")) for v in group.get("versions") or [] if isinstance(v, dict)]
    return Check("kube", name, "fail",
                 f"{res.plural}.{res.group} is not served at {wanted}, the versions the watcher reads "
                 f"(the group serves {', '.join(served) or 'nothing'})",
                 f"{hint}; an unsupported Kueue/KubeRay version needs a tracker that reads it")


def _watched(events_api: str) -> list[Resource]:
    """The watcher's resources, one per (group, plural): its two pod streams read one resource."""
    seen: dict[tuple[str, str], Resource] = {}
    for res in all_resources(events_api):
        seen.setdefault((res.group, res.plural), res)
    return list(seen.values())


async def _visibility_check(api: KubeApi) -> Check:
    """Kueue's visibility API: served, the watcher records pending runs' positions; else a warning (it goes on
    without them)."""
    name = f"api {VISIBILITY_GROUP}"
    try:
        group = await api.get(f"/apis/{VISIBILITY_GROUP}")
    except ApiError as exc:
        if exc.status not in (403, 404):
            raise
        return Check("kube", name, "warn", f"not served ({exc.status}): positions in queue are not recorded",
                     "enable Kueue's visibility API (its APIService visibility.kueue.x-k8s.io) to record them")
    served = [str(v.get("version")) for v in group.get("versions") or [] if isinstance(v, dict)]
    usable = [v for v in VISIBILITY_VERSIONS if v in served]
    if usable:
        return Check("kube", name, "ok", f"served at {VISIBILITY_GROUP}/{usable[0]}: positions in queue recorded")
    return Check("kube", name, "warn", f"serves none of {', '.join(VISIBILITY_VERSIONS)} (serves "
                 f"{', '.join(served) or 'nothing'}): positions in queue are not recorded")


def _lease_namespace(opts: DoctorOptions) -> str | None:
    if opts.lease_namespace:
        return opts.lease_namespace
    with contextlib.suppress(OSError):
        return POD_NAMESPACE_FILE.read_text(encoding="utf-8").strip() or None
    return None


async def kube_checks(opts: DoctorOptions) -> list[Check]:
    try:
        rbac = watcher_rbac(opts.rbac_file, namespaces=opts.namespaces, lease_namespace=_lease_namespace(opts),
                            lease=opts.lease)
    except (OSError, ValueError, KeyError, yaml.YAMLError) as exc:
        return [Check("kube", "rbac file", "fail", f"cannot read the watcher's RBAC from {opts.rbac_file}: {exc}",
                      "pass --rbac-file PATH (deploy/k8s/rbac/clusterrole.yaml of this tracker version)")]
    try:
        client = await asyncio.wait_for(kube_client(opts.kubeconfig, opts.context, connections=16), opts.timeout_s)
    except KubeconfigError as exc:
        return [Check("kube", "kubeconfig", "fail", f"no usable kubeconfig ({exc.where}: {exc.why})", FIX_KUBECONFIG)]
    except TimeoutError:
        return [Check("kube", "kubeconfig", "fail", f"loading the kubeconfig took over {opts.timeout_s:g} s",
                      FIX_KUBECONFIG)]
    async with client:
        if opts.impersonate:
            client.set_default_header("Impersonate-User", opts.impersonate)
        api = KubeApi(client, connect_timeout_s=opts.timeout_s, request_timeout_s=opts.timeout_s)
        server = str(client.configuration.host)
        try:
            version = await api.get("/version")
            who = await _whoami(api)
        except (ApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            return [Check("kube", "apiserver", "fail", f"{server} did not answer: {_reason(exc)}",
                          "check the server address and credentials of the kubeconfig; in a pod, the "
                          "NetworkPolicy must allow egress to the apiserver (443/6443)")]
        checks = [Check("kube", "apiserver", "ok",
                        f"{server}: Kubernetes {version.get('gitVersion', '?')}" + (f", as {who}" if who else ""))]
        try:
            checks += await tasks.all_of(_rbac_check(api, p, who, opts.rbac_file) for p in rbac)
            checks += await tasks.all_of(_api_check(api, res) for res in _watched(opts.events_api))
            checks.append(await _visibility_check(api))
        except (ApiError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            checks.append(Check("kube", "requests", "fail", f"a check request failed: {_reason(exc)}",
                                "run again; if it persists, check the apiserver's health"))
        return checks


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ApiError) and exc.status == 401:
        return f"{exc} (the credentials were rejected)"
    return str(exc) or type(exc).__name__


# ------------------------------------------------------------------------------------------ kafka


async def kafka_checks(settings: Settings, timeout_s: float) -> list[Check]:
    ks = settings.kafka
    if not ks.enabled:
        return [Check("kafka", "brokers", "skip", "no bootstrap servers configured (the embedded bus is used)",
                      "set TRACKER_KAFKA__BOOTSTRAP_SERVERS (or --bootstrap-servers) to check Kafka")]
    # every call of this check within --timeout: client start, requests and close
    ks = ks.model_copy(update={"call_timeout_s": timeout_s,
                               "request_timeout_ms": min(ks.request_timeout_ms, int(timeout_s * 1000))})
    try:
        admin = AIOKafkaAdminClient(**kafka.client_options(ks))
    except (ValueError, OSError) as exc:  # e.g. a CA or client certificate that does not load
        return [Check("kafka", "brokers", "fail", f"cannot set up the Kafka client: {exc}",
                      "check the TRACKER_KAFKA__SSL_* settings")]
    try:
        await kafka.start(admin, ks, what="admin client")
    except (KafkaError, TimeoutError, OSError) as exc:
        return [Check("kafka", "brokers", "fail", f"{ks.bootstrap_servers} unreachable: {_reason(exc)}",
                      "check kafka.bootstrap_servers, the security settings (TRACKER_KAFKA__SECURITY_PROTOCOL, "
                      "SASL), and that the NetworkPolicy allows egress to the brokers")]
    try:
        return await _topic_checks(admin, ks)
    except (KafkaError, TimeoutError, OSError) as exc:
        return [Check("kafka", "brokers", "fail", f"a request to {ks.bootstrap_servers} failed: {_reason(exc)}",
                      "check the brokers' health and this identity's ACLs (Describe, DescribeConfigs on the "
                      "topics)")]
    finally:
        await kafka.stop(admin, ks, what="admin client")


async def _topic_checks(admin: AIOKafkaAdminClient, ks: KafkaSettings) -> list[Check]:
    t = ks.call_timeout_s
    cluster = await kafka.bounded(admin.describe_cluster(), t, what="describing the cluster")
    checks = [Check("kafka", "brokers", "ok", f"{len(cluster['brokers'])} broker(s) via {ks.bootstrap_servers}")]
    specs = kafka.topic_specs(ks.topics)
    existing = set(await kafka.bounded(admin.list_topics(), t, what="listing topics"))
    present = [s for s in specs if s.name in existing]
    partitions: dict[str, list[dict[str, Any]]] = {}
    configs: dict[str, dict[str, str]] = {}
    if present:  # described only once known to exist: a metadata request may auto-create a topic
        for topic in await kafka.bounded(admin.describe_topics([s.name for s in present]), t, what="describing topics"):
            partitions[topic["topic"]] = topic["partitions"]
        resources_ = [ConfigResource(ConfigResourceType.TOPIC, s.name, dict.fromkeys(s.configs)) for s in present]
        for response in await kafka.bounded(admin.describe_configs(resources_), t, what="describing topic configs"):
            for res in response.to_object()["resources"]:
                configs[res["resource_name"]] = {e["config_names"]: e["config_value"] for e in res["config_entries"]}
    for spec in specs:
        checks.append(_topic_check(spec, partitions.get(spec.name), configs.get(spec.name, {})))
    aligned = {ks.topics.changes, ks.topics.transitions, ks.topics.run_state}
    counts = {name: len(parts) for name, parts in partitions.items() if name in aligned}
    if len(counts) < len(aligned):
        checks.append(Check("kafka", "partition counts", "skip", "not all of changes, transitions and run-state exist"))
    elif len(set(counts.values())) > 1:
        checks.append(Check("kafka", "partition counts", "fail",
                            "changes, transitions and run-state differ: "
                            + ", ".join(f"{n} {c}" for n, c in sorted(counts.items())),
                            "a run's state must live in the partition number of its changes: recreate the topics "
                            "with one partition count (tracker topics create --partitions N) and replay"))
    else:
        checks.append(Check("kafka", "partition counts", "ok",
                            f"changes, transitions and run-state: {next(iter(counts.values()))} partitions each"))
    return checks


def _topic_check(spec: kafka.TopicSpec, parts: list[dict[str, Any]] | None, have: dict[str, str]) -> Check:
    name = f"topic {spec.role}"
    if parts is None and spec.role == "watch_state":  # only leader-elected watchers publishing to Kafka use it
        return Check("kafka", name, "warn", f"{spec.name} is missing: `tracker watch --lease-namespace` with Kafka "
                                           "needs it for the replicas' shared checkpoint",
                     "tracker topics create (creates the missing topics with the configured layout)")
    if parts is None:
        return Check("kafka", name, "fail", f"{spec.name} is missing",
                     "tracker topics create (creates the missing topics with the configured layout; "
                     "deploy/kafka/topics.yaml lists them)")
    problems: list[tuple[Status, str]] = []
    if len(parts) != spec.partitions:
        problems.append(("warn", f"{len(parts)} partitions, configured {spec.partitions} "
                                 "(set kafka.topics.partitions or side_partitions to match)"))
    replicas = min((len(p["replicas"]) for p in parts), default=0)
    if replicas < spec.replication_factor:
        problems.append(("warn", f"replication factor {replicas}, configured {spec.replication_factor}"))
    for key, want in sorted(spec.configs.items()):
        got = have.get(key)
        if got == want:
            continue
        smaller = key == "max.message.bytes" and got is not None and int(got) < int(want)
        severity: Status = "fail" if key == "cleanup.policy" or smaller else "warn"
        problems.append((severity, f"{key}={got}, configured {want}"))
    if not problems:
        return Check("kafka", name, "ok", f"{spec.name}: {len(parts)} partitions, "
                                          f"cleanup.policy={have.get('cleanup.policy')}")
    status: Status = "fail" if any(s == "fail" for s, _ in problems) else "warn"
    return Check("kafka", name, status, f"{spec.name}: " + "; ".join(p for _, p in problems),
                 f"kafka-configs.sh --alter --entity-type topics --entity-name {spec.name} --add-config KEY=VALUE "
                 "for configs; partitions and replicas need a new topic")


# ------------------------------------------------------------------------------------------ adx


async def adx_checks(settings: AdxSettings, timeout_s: float) -> list[Check]:
    if not settings.cluster_uri:
        return [Check("adx", "settings", "skip", "TRACKER_ADX__CLUSTER_URI is not set (no ADX sink)")]
    try:
        rows = await deadline.await_with_deadline(lambda: _database_schema(settings, timeout_s), timeout_s=timeout_s,
                                                   what="doctor-adx")
    except TimeoutError:
        return [Check("adx", "auth", "fail", f"{settings.cluster_uri} did not answer within {timeout_s:g}s",
                      "check TRACKER_ADX__CLUSTER_URI and that the NetworkPolicy allows egress on 443")]
    except Exception as exc:  # the Kusto SDK and azure-identity raise many unrelated types; each is a failure here
        return [_adx_failure(settings.auth, settings.database, exc)]
    checks = [Check("adx", "auth", "ok", f"{settings.auth}: database {settings.database} readable at "
                                         f"{settings.cluster_uri}")]
    declared = json.loads(KUSTO_SCHEMA.read_text(encoding="utf-8"))["tables"]
    served: dict[str, dict[str, str]] = {}
    for table, column, ctype in rows:
        served.setdefault(table, {})[column] = _KUSTO_TYPES.get(ctype, ctype)
    for table, spec in sorted(declared.items()):
        if spec.get("owner") != "tracker":
            continue
        columns: dict[str, str] = spec["columns"]
        have = served.get(table)
        if have is None:
            checks.append(Check("adx", f"table {table}", "fail", "missing", "tracker kusto apply"))
            continue
        wrong = [f"{c} missing" if c not in have else f"{c} is {have[c]}, expected {t}"
                 for c, t in columns.items() if have.get(c) != t]
        checks.append(Check("adx", f"table {table}", "fail" if wrong else "ok",
                            "; ".join(wrong) if wrong else f"{len(columns)} columns as declared",
                            "tracker kusto apply (adds missing columns; a changed type needs a new column)"
                            if wrong else ""))
    return checks


def _database_schema(settings: AdxSettings, timeout_s: float) -> list[tuple[str, str, str]]:
    from azure.kusto.data import ClientRequestProperties, KustoClient

    from tracker.shell.adx import connection

    properties = ClientRequestProperties()  # type: ignore[no-untyped-call]  # (unannotated in the SDK)
    properties.set_option(ClientRequestProperties.request_timeout_option_name, timedelta(seconds=timeout_s))
    with KustoClient(connection(settings, settings.cluster_uri)) as client:
        db = settings.database
        name = db if re.fullmatch(r"[A-Za-z_]\w*", db) else f"['{db}']"
        result = client.execute_mgmt(db, f".show database {name} schema", properties)
    return [(str(r["TableName"]), str(r["ColumnName"]), str(r["ColumnType"]))
            for r in result.primary_results[0] if r["TableName"] and r["ColumnName"]]


def _adx_failure(auth: str, database: str, exc: Exception) -> Check:
    from azure.kusto.data.exceptions import KustoAuthenticationError, KustoNetworkError, KustoServiceError

    status = None
    if isinstance(exc, KustoServiceError) and exc.http_response is not None:
        status = getattr(exc.http_response, "status_code", None) or getattr(exc.http_response, "status", None)
    detail = f"{type(exc).__name__}: {str(exc)[:300]}"
    if isinstance(exc, KustoAuthenticationError) or status == 401:
        fixes = {"workload-identity": "the ServiceAccount needs the annotation azure.workload.identity/client-id, "
                                      "the pod the label azure.workload.identity/use: \"true\", and the identity a "
                                      "federated credential for system:serviceaccount:<namespace>:<serviceaccount>",
                 "app-secret": "check TRACKER_ADX__CLIENT_ID, TRACKER_ADX__TENANT_ID and the secret tracker-adx",
                 "managed-identity": "assign the managed identity to the node pool or VM (and set "
                                     "TRACKER_ADX__CLIENT_ID for a user-assigned one)"}
        return Check("adx", "auth", "fail", f"authentication failed ({auth}): {detail}",
                     fixes.get(auth, "check TRACKER_ADX__AUTH"))
    if status == 403:
        return Check("adx", "auth", "fail", f"authenticated, but not allowed to read database {database}: {detail}",
                     f".add database ['{database}'] viewers ('aadapp=<client-id>;<tenant-id>') and ingestors (the "
                     "same principal), run by a database admin")
    if isinstance(exc, (KustoNetworkError, OSError)):
        return Check("adx", "auth", "fail", f"cannot reach the cluster: {detail}",
                     "check TRACKER_ADX__CLUSTER_URI and that the NetworkPolicy allows egress on 443")
    return Check("adx", "auth", "fail", detail, "check the TRACKER_ADX__* settings")


# ------------------------------------------------------------------------------------------ running


async def run_checks(opts: DoctorOptions, settings: Settings | None, *, settings_error: str | None = None
                     ) -> list[Check]:
    """Every check of the areas not in ``opts.skip``, kube, kafka and adx concurrently, in that order."""
    async def skipped(area: str) -> list[Check]:
        return [Check(area, area, "skip", "skipped (--skip)")]

    def invalid(area: str) -> list[Check]:
        return [Check(area, "settings", "fail", settings_error or "invalid settings",
                      "fix the settings file or the TRACKER_* environment variables")]

    async def kafka_area() -> list[Check]:
        return invalid("kafka") if settings is None else await kafka_checks(settings, opts.timeout_s)

    async def adx_area() -> list[Check]:
        return invalid("adx") if settings is None else await adx_checks(settings.adx, opts.timeout_s)

    areas: dict[str, Callable[[], Coroutine[Any, Any, list[Check]]]] = {
        "kube": lambda: kube_checks(opts), "kafka": kafka_area, "adx": adx_area}
    groups = await tasks.all_of(skipped(a) if a in opts.skip else run() for a, run in areas.items())
    return [check for group in groups for check in group]


_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def render(checks: Sequence[Check], console: Console) -> None:
    """The checks as a table; each distinct fix once, below it, referred to by number (many checks share one)."""
    fixes: dict[str, int] = {}
    table = Table(title="tracker doctor", show_lines=False)
    for column in ("area", "check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for c in checks:
        ref = ""
        if c.status in ("fail", "warn") and c.fix:
            ref = f"#{fixes.setdefault(c.fix, len(fixes) + 1)}"
        table.add_row(c.area, escape(c.name), f"[{_STYLE[c.status]}]{c.status.upper()}[/]", escape(c.detail), ref)
    console.print(table)
    if fixes:
        console.print("[bold]How to fix[/]")
        for fix, number in fixes.items():
            console.print(f"  #{number}  {escape(fix)}")
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    console.print(f"[bold red]{failed} check(s) failed[/]" if failed else "[green]all checks passed[/]",
                  f"[yellow]({warned} warning(s))[/]" if warned else "")


def add_doctor_command(subparsers: Any) -> None:
    """Add ``tracker doctor`` to an ``argparse`` sub-parser collection."""
    d = subparsers.add_parser("doctor", help="preflight checks: kubeconfig, RBAC, Kueue/KubeRay APIs, Kafka topics, "
                                             "ADX auth and schema")
    d.add_argument("--kubeconfig", type=Path, help="default: the in-cluster service account, else KUBECONFIG or "
                                                   "~/.kube/config")
    d.add_argument("--context", help="kubeconfig context (default: the current one)")
    d.add_argument("--as", dest="impersonate", metavar="USER",
                   help="check the permissions of USER, e.g. system:serviceaccount:tracker:tracker-watcher "
                        "(needs the right to impersonate)")
    d.add_argument("-n", "--namespace", dest="namespaces", action="append", default=[], metavar="NS",
                   help="the watcher watches only these namespaces (repeatable; default: every namespace)")
    d.add_argument("--lease-namespace", help="namespace of the watcher's Lease (default: this pod's namespace, "
                                             "else the Role's namespace in the RBAC file)")
    d.add_argument("--no-lease", dest="lease", action="store_false",
                   help="skip the Lease permissions (a single watcher without leader election)")
    d.add_argument("--rbac-file", type=Path, default=RBAC_FILE, help=f"the watcher's RBAC (default: {RBAC_FILE})")
    d.add_argument("--events-api", choices=sorted(EVENTS_APIS), default="events.k8s.io/v1",
                   help="the Events API the watcher reads (its --events-api): the one whose access is checked "
                        "(default: %(default)s)")
    d.add_argument("--config", type=Path, help="settings file (YAML or JSON; also TRACKER_CONFIG_FILE)")
    d.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (also TRACKER_KAFKA__BOOTSTRAP_SERVERS)")
    d.add_argument("--skip", action="append", default=[], choices=AREAS, help="skip an area (repeatable)")
    d.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="bound on each network call")
    d.add_argument("--json", action="store_true", help='print {"ok": ..., "checks": [...]} instead of a table')
    d.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace, console: Console) -> int:
    opts = DoctorOptions(kubeconfig=args.kubeconfig, context=args.context, impersonate=args.impersonate,
                         namespaces=tuple(args.namespaces), lease_namespace=args.lease_namespace, lease=args.lease,
                         rbac_file=args.rbac_file, events_api=args.events_api, timeout_s=args.timeout,
                         skip=frozenset(args.skip))
    configure_logging("WARNING", "console")  # library warnings to stderr, never into the table or the JSON
    settings: Settings | None = None
    error = None
    try:
        overrides = {"kafka": {"bootstrap_servers": args.bootstrap_servers}} if args.bootstrap_servers else {}
        settings = load_settings(args.config, overrides)
        log_deprecated_env(settings)
    except SettingsError as exc:
        error = str(exc)
    checks = asyncio.run(run_checks(opts, settings, settings_error=error))
    ok = not any(c.status == "fail" for c in checks)
    if args.json:
        sys.stdout.write(json.dumps({"ok": ok, "checks": [asdict(c) for c in checks]}, indent=2) + "\n")
    else:
        render(checks, console)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tracker", description="TauGrid run lifecycle tracker: preflight checks")
    add_doctor_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    rc: int = args.func(args, Console(width=None if sys.stdout.isatty() else 150))
    return rc


if __name__ == "__main__":
    sys.exit(main())
