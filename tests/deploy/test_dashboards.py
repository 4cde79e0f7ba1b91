"""The dashboards (issue 17): deploy/grafana/tracker.json (Grafana, Prometheus and Azure Data Explorer data sources)
and deploy/adx-dashboards/tracker.json (the Azure Data Explorer web UI's format), loaded and checked by tools that
parse them: every KQL query, with the dashboard's macros and variables replaced by what the data source sends, is
analysed by Microsoft's Kusto.Language against the schema (tests/kql/check.mjs, as tests/deploy/test_kusto.py
does); every
PromQL expression uses only metric names a scrape of the tracker's processes shows, and is parsed by
`promtool check rules` (provisioned by tests/infra; a missing promtool fails the test)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.test_kusto import SCHEMA, check, node  # noqa: F401  (node: the fixture installing the KQL checker)
from tests.support.adx_standin import KustoStandIn
from tracker.runtime.ops import PROCESS_FAMILIES, Metrics
from tracker.runtime.sinks import AdxCollector
from tracker.shell.adx import AdxSettings, AdxSink
from tracker.shell.bus import InProcessBus
from tracker.shell.kube import KubeApi
from tracker.shell.watch.publish import BusPublisher
from tracker.shell.watch.watcher import WatchCollector, Watcher

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana" / "tracker.json"
ADX_DASHBOARD = ROOT / "deploy" / "adx-dashboards" / "tracker.json"
ADX_PLUGIN = "grafana-azure-data-explorer-datasource"

# What the data sources put in place of the macros and variables (grafana azure-data-explorer-datasource
# pkg/azuredx/models/macro.go and datasource.ts interpolateVariable: a multi-value variable becomes 'a','b'; the
# Prometheus data source turns one into a regular expression (a|b)).
FROM, TO = "2026-08-01T00:00:00Z", "2026-08-02T00:00:00Z"
GRAFANA_KQL = [
    (re.compile(r"\$__timeFilter\((\w+)\)"), rf"\1 >= datetime({FROM}) and \1 <= datetime({TO})"),
    (re.compile(r"\$__timeFrom(?:\(\))?"), f"datetime({FROM})"),
    (re.compile(r"\$__timeTo(?:\(\))?"), f"datetime({TO})"),
    (re.compile(r"\$__timeInterval(?:\(\))?"), "60000ms"),
    (re.compile(r"\$cluster\b"), "'aks-east-1','aks-west-2'"),
    (re.compile(r"\$namespace\b"), "'team-a'"),
    (re.compile(r"\$queue\b"), "'gpu-a100','-'"),
    (re.compile(r"\$run\b"), "run-7f3c2a"),
]
GRAFANA_PROMQL = [
    ("$__rate_interval", "2m"), ("$__range", "1d"), ("$cluster", "(aks-east-1|aks-west-2)"),
    ("$namespace", "(team-a)"), ("$queue", "(gpu-a100|-)"),
]
# The ADX web UI declares a dashboard's parameters as query parameters of each query it runs.
ADX_PARAMETERS = ("declare query_parameters(_startTime:datetime, _endTime:datetime, _cluster:dynamic, "
                  "_namespace:dynamic, _queue:dynamic, _run:string);\n")


def load(path: Path) -> Any:
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------------------ what the code exports


def sample_names(exposition: str) -> set[str]:
    """Every series name a scraper can see, also of labelled families that have no child yet: counters with
    _total and _created, histograms with _bucket, _sum, _count and _created."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("_sum", "_count", "_created")}
    names = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(s.name for s in family.samples)
    return names


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """A scrape of every process's families: the reducer's and sinks' (Metrics("all")), the ADX sink's collector
    over a real sink and the watcher's collector over a real (not started) watcher."""
    standin = KustoStandIn().up()
    sink = AdxSink(AdxSettings(cluster_uri=standin.url, auth="none", database="TauGridTest",
                               source_cluster="aks-east-1", spool_dir=tmp_path_factory.mktemp("spool")))

    async def scrape() -> str:
        registry = CollectorRegistry()
        adx = AdxCollector()
        adx.sink = sink
        watch = WatchCollector()
        async with ApiClient() as client:
            watch.watcher = Watcher(KubeApi(client), BusPublisher(InProcessBus(10)))
            for collector in (adx, watch):
                registry.register(collector)  # type: ignore[arg-type]
            return generate_latest(registry).decode()

    try:
        names = sample_names(Metrics().exposition().decode()) | sample_names(asyncio.run(scrape()))
    finally:
        sink.close(timeout_s=30)
        standin.down()
    assert {"tracker_watch_leading", "tracker_adx_spool_bytes", "tracker_adx_rows_sent_total",
            "tracker_consumer_lag", "tracker_fold_seconds_bucket"} <= names
    assert set(PROCESS_FAMILIES) == {"reduce", "sink-index", "sink-adx", "serve", "serve-embedded", "watch"}
    return names


# ------------------------------------------------------------------------------------------ the Grafana dashboard


def grafana_targets(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, target) of every panel query and every query variable."""
    found = [(f"panel {p['id']} {p['title']!r}", t) for p in dashboard["panels"] for t in p.get("targets", [])]
    found += [(f"variable {v['name']}", v["query"]) for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return found


def test_grafana_dashboard_structure() -> None:
    d = load(GRAFANA)
    assert d["uid"] == "taugrid-tracker" and d["title"] and isinstance(d["schemaVersion"], int)
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert [v for v in variables if v in ("prometheus", "adx", "cluster", "namespace", "queue", "run")] == [
        "prometheus", "adx", "cluster", "namespace", "queue", "run"]
    assert variables["prometheus"]["type"] == variables["adx"]["type"] == "datasource"
    assert variables["prometheus"]["query"] == "prometheus" and variables["adx"]["query"] == ADX_PLUGIN
    for name in ("cluster", "namespace", "queue"):
        assert variables[name]["multi"] and variables[name]["includeAll"]
        assert "allValue" not in variables[name], "All is the list of values, which ADX and PromQL both take"
    assert not variables["run"]["multi"] and not variables["run"]["includeAll"], "$run is quoted as one string"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    by_kind: dict[str, int] = {}
    for where, target in grafana_targets(d):
        ds = target["datasource"]
        assert ds in ({"type": "prometheus", "uid": "${prometheus}"}, {"type": ADX_PLUGIN, "uid": "${adx}"}), where
        by_kind[ds["type"]] = by_kind.get(ds["type"], 0) + 1
        if ds["type"] == ADX_PLUGIN:
            assert target["queryType"] == "KQL" and target["rawMode"] and target["database"] == "$database", where
            assert target["resultFormat"] in ("table", "time_series"), where
            assert target["query"].strip(), where
        else:
            assert target["expr"].strip(), where
    assert by_kind["prometheus"] >= 20 and by_kind[ADX_PLUGIN] >= 10
    for p in d["panels"]:
        if p["type"] != "row":
            assert p["datasource"] in ({"type": "prometheus", "uid": "${prometheus}"},
                                       {"type": ADX_PLUGIN, "uid": "${adx}"}), p["title"]
            g = p["gridPos"]
            assert g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
    titles = " ".join(p["title"] for p in d["panels"])
    for words in ("Runs", "Stuck runs", "Stalled in admission", "Admission wait per queue", "GPU utilisation",
                  "TaugridGpuUtilization", "Watcher", "ADX spool", "Consumer lag", "TaugridBadputByCategory",
                  "TaugridGoodput"):
        assert words in titles, words


def grafana_kql() -> list[dict[str, Any]]:
    queries = []
    for where, target in grafana_targets(load(GRAFANA)):
        if target["datasource"]["type"] != ADX_PLUGIN:
            continue
        text = target["query"]
        for pattern, value in GRAFANA_KQL:
            text = pattern.sub(value, text)
        assert "$" not in text, f"{where}: a macro or variable the test does not replace: {text}"
        queries.append({"file": "deploy/grafana/tracker.json", "label": where, "text": text})
    return queries


def test_grafana_promql_uses_only_exported_metrics(exported: set[str]) -> None:
    used: set[str] = set()
    for where, target in grafana_targets(load(GRAFANA)):
        if target["datasource"]["type"] != "prometheus":
            continue
        expr = target["expr"]
        names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{", expr))
        assert names, f"{where}: every selector names its metric with a label matcher: {expr}"
        assert names <= exported, f"{where}: not exported by any tracker process: {sorted(names - exported)}"
        assert set(re.findall(r"\b(?:tracker|process)_\w+", expr)) <= exported, where
        assert 'cluster=~"$cluster|"' in expr, f"{where}: filters on the cluster variable"
        used |= names
    # the processes' health, their stuck-run gauges and every sink are on the dashboard
    for name in ("tracker_build_info", "tracker_consumer_lag", "tracker_oldest_stuck_seconds",
                 "tracker_oldest_pending_admission_seconds", "tracker_watch_leading", "tracker_adx_spool_bytes",
                 "tracker_sink_rows_changed_total", "tracker_dead_letters_total"):
        assert name in used, name


def test_grafana_promql_parses(tmp_path: Path, exported: set[str], promtool: Path) -> None:
    """Each expression, with Grafana's variables replaced, as a recording rule: `promtool check rules` parses it
    with Prometheus's own PromQL parser (the test environment provisions promtool; missing, the test fails)."""
    rules = []
    for i, (where, target) in enumerate(grafana_targets(load(GRAFANA))):
        if target["datasource"]["type"] != "prometheus":
            continue
        expr = target["expr"]
        for var, value in GRAFANA_PROMQL:
            expr = expr.replace(var, value)
        assert "$" not in expr, f"{where}: {expr}"
        rules.append({"record": f"dashboard:query_{i}:check", "expr": expr})
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "grafana-dashboard", "rules": rules}]}, sort_keys=False))
    proc = subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------ the ADX web UI dashboard


def test_adx_dashboard_structure() -> None:
    d = load(ADX_DASHBOARD)
    assert {"schema_version", "title", "tiles", "queries", "parameters", "dataSources", "pages"} <= set(d)
    sources = {s["id"]: s for s in d["dataSources"]}
    assert [s["database"] for s in sources.values()] == [SCHEMA["database"]]
    assert all(s["kind"] == "manual-kusto" and s["clusterUri"].startswith("https://") for s in sources.values())
    pages = {p["id"] for p in d["pages"]}
    queries = {q["id"]: q for q in d["queries"]}
    assert len(queries) == len(d["queries"])
    params = {p.get("variableName", p.get("beginVariableName")): p for p in d["parameters"]}
    assert set(params) == {"_startTime", "_cluster", "_namespace", "_queue", "_run"}
    assert params["_startTime"]["kind"] == "duration" and params["_startTime"]["endVariableName"] == "_endTime"
    for name in ("_cluster", "_namespace", "_queue"):
        assert params[name]["selectionType"] == "array" and params[name]["includeAllOption"]
    assert params["_run"]["selectionType"] == "scalar"
    declared = {"_startTime", "_endTime", "_cluster", "_namespace", "_queue", "_run"}
    for q in queries.values():
        assert q["dataSource"]["dataSourceId"] in sources
        used = {v for v in declared if re.search(rf"\b{v}\b", q["text"])}
        assert set(q["usedVariables"]) == used, (q["id"], q["usedVariables"], used)
    referenced = []
    for p in d["parameters"]:
        if p["kind"] != "duration":
            assert p["dataSource"]["queryRef"]["queryId"] in queries
            referenced.append(p["dataSource"]["queryRef"]["queryId"])
    ids = set()
    for t in d["tiles"]:
        assert t["pageId"] in pages and t["queryRef"]["queryId"] in queries, t["title"]
        assert t["visualType"] in ("table", "timechart", "pie", "bar", "column", "card", "multistat"), t["title"]
        lay = t["layout"]
        assert lay["x"] + lay["width"] <= 24 and lay["height"] > 0, t["title"]
        ids.add(t["id"])
        referenced.append(t["queryRef"]["queryId"])
    assert len(ids) == len(d["tiles"])
    assert sorted(referenced) == sorted(queries), "every query is used once, by a tile or a parameter"
    text = " ".join(q["text"] for q in queries.values())
    for function in ("TaugridRuns(", "TaugridStuckRuns()", "TaugridStalledAdmission()", "TaugridRunHistory(_run)",
                     "TaugridGpuUtilization(_run)", "TaugridPhaseDurations(", "DCGMFIDEVGPUUTIL",
                     "TaugridBadputByCategory(lookback = _endTime - _startTime", "TaugridGoodput(lookback = "):
        assert function in text, function


def adx_kql() -> list[dict[str, Any]]:
    d = load(ADX_DASHBOARD)
    return [{"file": "deploy/adx-dashboards/tracker.json", "label": f"query {q['id']}",
             "text": ADX_PARAMETERS + q["text"]} for q in d["queries"]]


# ------------------------------------------------------------------------------------------ KQL of both


def test_every_dashboard_query_analyses_against_the_schema(node: str, tmp_path: Path) -> None:  # noqa: F811
    queries = grafana_kql() + adx_kql()
    gpu = [q for q in queries if "DCGMFIDEVGPUUTIL" in q["text"]]
    assert gpu and all("on Cluster, Namespace, Pod" in q["text"] for q in gpu), "the GPU join matches the cluster"
    path = tmp_path / "dashboard-queries.json"
    path.write_text(json.dumps(queries))
    # against the schema's functions only (the adx-mon resources and README are tests/deploy/test_kusto.py's)
    rc, out = check(node, "--queries", str(path), "--deploy", str(tmp_path / "none"),
                    "--readme", str(tmp_path / "none"))
    assert out["diagnostics"] == []
    assert out["queries"] == len(queries) >= 25
    assert rc == 0  # tests/deploy/test_kusto.py proves the same check reports what is wrong in such a list
