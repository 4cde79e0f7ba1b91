"""Alert rules and scrapes as Prometheus and adx-mon see them (issue 17).

deploy/prometheus/rules.yaml passes `promtool check rules` and its unit tests (`promtool test rules
rules_test.yaml`), uses only metric names a tracker process exports, and is what the PrometheusRule component
carries; deploy/adx-mon/metric-alerts.yaml has one adx-mon AlertRule per Prometheus alert, on the tables adx-mon
makes of the same metrics; the exposition of every process passes `promtool check metrics`. promtool is the test
environment's (`tests.infra.build.PROMTOOL`, fetched by every `up`): without it these tests fail, never skip.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.test_deploy import K8S, kustomize_binary, render
from tracker.runtime.ops import PROCESS_FAMILIES, Metrics
from tracker.runtime.sinks import AdxCollector
from tracker.shell.watch.stream import WatchStats
from tracker.shell.watch.watcher import WatchCollector

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "rules_test.yaml"
COMPONENT = K8S / "components" / "prometheus-rules"
ADXMON_ALERTS = ROOT / "deploy" / "adx-mon" / "metric-alerts.yaml"


@pytest.fixture(scope="module")
def kustomize() -> Path:
    return kustomize_binary()


def promtool_run(promtool: Path, *args: str, stdin: str | None = None, cwd: Path = ROOT
                 ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], input=stdin, capture_output=True, text=True, timeout=120,
                          cwd=cwd, check=False)


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule_groups() for r in g["rules"] if "alert" in r}


def exposition(process: str) -> str:
    """What a scrape of ``process`` returns, with the collectors its command registers (the watcher's, the ADX
    sink's) reading statistics of the shape they read in production."""
    metrics = Metrics(process)
    if process in ("watch", "serve"):
        watch = WatchCollector()
        keys = SimpleNamespace(ignored=1, held=2, released=2, dropped=0, corr=SimpleNamespace(held={}))
        stream = SimpleNamespace(key="pods@*", known={"uid": object()})
        watch.watcher = cast(Any, SimpleNamespace(stats=WatchStats(), keys=keys, outbox=SimpleNamespace(items=[]),
                                                  streams=[stream]))
        metrics.registry.register(watch)
    if process == "sink-adx":
        adx = AdxCollector()
        stats = SimpleNamespace(rows_sent=3, retries=1, spooled_rows=2, rejected_rows=0, spool_files=1,
                                spool_bytes=100)
        adx.sink = cast(Any, SimpleNamespace(stats=stats, spool_oldest_age_s=lambda: 1.5))
        metrics.registry.register(adx)
    return metrics.exposition().decode()


_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count"), "info": ("_info",)}


def exported_series() -> set[str]:
    """Every series name a tracker process exports (``tracker_`` ones), as a query names it; also of the families
    whose labelled series do not exist yet (before the first dead letter or stuck run)."""
    names: set[str] = set()
    for process in PROCESS_FAMILIES:
        for family in text_string_to_metric_families(exposition(process)):
            if family.name.startswith("tracker_"):
                names |= {family.name + suffix for suffix in _SUFFIXES[family.type]}
    return names


# ------------------------------------------------------------------------------------------ Prometheus


def test_the_rules_pass_promtool_check(promtool: Path) -> None:
    out = promtool_run(promtool, "check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in rule_groups())} rules found" in out.stdout


def test_the_rules_pass_their_unit_tests(promtool: Path) -> None:
    out = promtool_run(promtool, "test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
    # every alert is tested firing, with its labels and annotations, and quiet somewhere
    tested = yaml.safe_load(RULES_TEST.read_text())
    cases = [c for t in tested["tests"] for c in t.get("alert_rule_test", ())]
    # ... and every recording rule is evaluated on its own series (promql_expr_test)
    records = {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}
    assert records == {e["expr"] for t in tested["tests"] for e in t.get("promql_expr_test", ())}
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == set(alerts())
    assert {c["alertname"] for c in cases if not c["exp_alerts"]} == set(alerts())
    assert all(a["exp_annotations"] for c in cases for a in c["exp_alerts"])


def test_a_broken_rule_fails_the_unit_tests(promtool: Path, tmp_path: Path) -> None:
    """The unit tests catch a wrong threshold: the check above is not vacuous."""
    (tmp_path / "rules.yaml").write_text(RULES.read_text().replace("> 1800", "> 3600", 1))
    (tmp_path / RULES_TEST.name).write_text(RULES_TEST.read_text())
    out = promtool_run(promtool, "test", "rules", RULES_TEST.name, cwd=tmp_path)
    assert out.returncode != 0 and "TrackerRunsStalledInAdmission" in out.stdout + out.stderr


def test_the_rules_use_only_metrics_the_tracker_exports() -> None:
    exported = exported_series()
    assert {"tracker_watch_leading", "tracker_adx_spool_bytes", "tracker_watch_reconnects_total",
            "tracker_dead_letters_total", "tracker_consumer_lag"} <= exported  # the scan sees every process
    for name, rule in alerts().items():
        used = set(re.findall(r"\btracker_[a-z_]+\b", rule["expr"]))
        assert used and used <= exported, (name, used - exported)
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert {"summary", "description"} <= set(rule["annotations"]), name


def test_the_prometheusrule_component_carries_the_rule_file(kustomize: Path, tmp_path: Path) -> None:
    for overlay in ("scaled-out", "all-in-one"):
        docs = render(kustomize, K8S / "overlays" / overlay, tmp_path, components=[COMPONENT])
        [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        assert rule["metadata"]["namespace"] == "tracker"
        assert rule["spec"] == {"groups": rule_groups()}, "run: uv run python -m tests.deploy.test_prometheus"


def render_component() -> str:
    """components/prometheus-rules/prometheusrule.yaml: rules.yaml's groups as a PrometheusRule."""
    header = ("# Generated from deploy/prometheus/rules.yaml by `uv run python -m tests.deploy.test_prometheus`:"
              " edit that\n"
              "# file and re-render (tests/deploy/test_prometheus.py fails while this one differs).\n")
    doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
           "metadata": {"name": "tracker", "namespace": "tracker", "labels": {"app.kubernetes.io/name": "tracker"}},
           "spec": {"groups": rule_groups()}}
    return header + yaml.safe_dump(doc, sort_keys=False, width=120)


@pytest.mark.parametrize("process", sorted(PROCESS_FAMILIES))
def test_every_process_scrape_passes_promtool_check_metrics(promtool: Path, process: str) -> None:
    text = exposition(process)
    out = promtool_run(promtool, "check", "metrics", stdin=text)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), out.stdout + out.stderr
    assert "tracker_build_info" in text


# ------------------------------------------------------------------------------------------ adx-mon


def adx_table(metric: str) -> str:
    """adx-mon's table name of a metric: ProperCase, separators dropped (schema.NormalizeMetricName)."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", metric))


def test_adxmon_alert_rules_mirror_the_prometheus_alerts() -> None:
    docs = [d for d in yaml.safe_load_all(ADXMON_ALERTS.read_text()) if d]
    rules = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "AlertRule"}
    kebab = {re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower(): name for name in alerts()}
    assert set(rules) == set(kebab)
    tables = {adx_table(m): m for m in exported_series()}
    for name, spec in rules.items():
        query = re.sub(r"//.*", "", spec["query"])  # tables, not the comments naming a Prometheus alert
        used = set(re.findall(r"\bTracker[A-Z][A-Za-z]+\b", query))
        assert used and used <= set(tables), (name, used - set(tables))
        prometheus = set(re.findall(r"\btracker_[a-z_]+\b", alerts()[kebab[name]]["expr"]))
        assert {tables[t] for t in used} == prometheus, name  # the same metrics as the Prometheus alert
        assert spec["database"] == "Metrics" and spec["interval"] and spec["destination"]
        assert re.search(r'CorrelationId = strcat\("tracker-[a-z-]+/"', spec["query"]), name


def test_adx_table_names_follow_adxmon() -> None:
    assert adx_table("tracker_consumer_lag") == "TrackerConsumerLag"
    assert adx_table("DCGM_FI_DEV_GPU_UTIL") == "DCGMFIDEVGPUUTIL"
    assert adx_table("used_cpu_user_children") == "UsedCpuUserChildren"


if __name__ == "__main__":
    (COMPONENT / "prometheusrule.yaml").write_text(render_component())
    sys.exit(0)
