"""The Kusto schema (schemas/kusto) and the adx-mon resources (deploy/adx-mon): offline KQL analysis with
Microsoft's Kusto.Language (tests/kql/check.mjs, npm @kusto/language-service-next) against the declared schema,
a negative test proving that check is not vacuous, and drift checks between the declared schema, the .kql table
definitions, the ingestion mappings, the rendered adx-mon resources and `tracker kusto apply`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kql import render_adxmon
from tracker.shell.adx import TABLES, mapping_name
from tracker.shell.kusto_apply import SCHEMA_DIR, schema_commands, split_script

ROOT = Path(__file__).resolve().parents[1]
KQL = ROOT / "tests" / "kql"
DEPLOY = ROOT / "deploy" / "adx-mon"
SCHEMA = json.loads((SCHEMA_DIR / "schema.json").read_text())
ADXMON_METRIC_COLUMNS = {  # adx-mon schema/schema.go + the default collector's lifted labels, sorted by label
    "Timestamp": "datetime", "SeriesId": "long", "Labels": "dynamic", "Value": "real",
    "Container": "string", "Namespace": "string", "Pod": "string", "Cluster": "string", "Host": "string"}


@pytest.fixture(scope="session")
def node() -> str:
    exe = shutil.which("node")
    if exe is None:
        pytest.fail("node is needed for the KQL check (tests/kql); install Node.js 18 or newer")
    if not (KQL / "node_modules" / "@kusto" / "language-service-next").is_dir():
        npm = shutil.which("npm")
        assert npm is not None, "npm is needed to install tests/kql/node_modules"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=KQL, check=True, timeout=300)
    return exe


def check(node: str, *args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run([node, str(KQL / "check.mjs"), "--json", *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.stderr == "", proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def full_check(node: str) -> tuple[int, dict[str, Any]]:
    """The check of the repository's schema, resources and README (about 15 s: run once)."""
    return check(node)


def test_schema_and_adxmon_queries_analyse_without_any_diagnostic(full_check: tuple[int, dict[str, Any]]) -> None:
    rc, out = full_check
    assert out["diagnostics"] == []
    assert rc == 0
    assert sorted(out["commands"]) == [f"schemas/kusto/{p.name}" for p in sorted(SCHEMA_DIR.glob("*.kql"))]


def test_check_reports_unknown_tables_columns_and_type_errors(node: str, tmp_path: Path) -> None:
    kql = tmp_path / "kql"
    deploy = tmp_path / "deploy"
    kql.mkdir()
    deploy.mkdir()
    (kql / "010-bad.kql").write_text(
        "// a valid function first: later commands may use it\n"
        ".create-or-alter function with (docstring=\"ok\") Good() { TaugridRunState | project RunId, Status }\n"
        "\n"
        ".create-or-alter function Bad1() { Good() | where NoSuchColumn == 1 }\n"
        "\n"
        ".create-or-alter function Bad2() {\n    NoSuchTable | take 1\n}\n"
        "\n"
        ".create-or-alter function Bad3() { TaugridRunState | where Attempts > \"x\" }\n"
        "\n"
        "TaugridRunState | take 1\n")
    (deploy / "rules.yaml").write_text(
        "apiVersion: adx-mon.azure.com/v1\nkind: AlertRule\nmetadata:\n  name: broken\n  namespace: x\n"
        f"spec:\n  database: {SCHEMA['database']}\n  interval: 5m\n  destination: d\n  query: |\n"
        "    DCGMFIDEVGPUUTIL\n    | where Timestamp > _startTime and Labels.pod == \"p\"\n"
        "    | summarize Severity = 3 by Pood = tostring(Labels.pod)\n"
        "---\n"
        "apiVersion: adx-mon.azure.com/v1\nkind: Function\nmetadata:\n  name: f\n  namespace: x\n"
        "spec:\n  database: Logs\n  body: |\n    .create-or-alter function G() {\n        Bad1() | take 1\n"
        "        | extend X = Missing\n    }\n")
    readme = tmp_path / "README.md"
    readme.write_text("Example:\n\n```kusto\nGood() | take 3\nGood() | where Nope > 1\n```\n")
    rc, out = check(node, "--kql", str(kql), "--deploy", str(deploy), "--readme", str(readme))
    assert rc == 1
    found = sorted((Path(d["file"]).name, d["line"], d["code"]) for d in out["diagnostics"])
    assert found == [
        ("010-bad.kql", 4, "KS142"),  # unknown column, through a function defined earlier in the script
        ("010-bad.kql", 7, "KS204"),  # unknown table
        ("010-bad.kql", 10, "KS106"),  # long compared with a string
        ("010-bad.kql", 12, "TG001"),  # a query in a schema script
        ("README.md", 5, "KS142"),  # an example query with an unknown column
        ("rules.yaml", 1, "TG006"),  # the alert returns no Title ...
        ("rules.yaml", 1, "TG006"),  # ... nor CorrelationId
        ("rules.yaml", 14, "TG004"),  # a resource for another database (at its document marker)
        ("rules.yaml", 25, "KS142"),  # unknown name in a Function body, located in the YAML file
    ]
    messages = " ".join(d["message"] for d in out["diagnostics"])
    for text in ("'NoSuchColumn'", "'NoSuchTable'", "no Title column", "no CorrelationId column", "'Missing'",
                 "'Nope'"):
        assert text in messages

    proc = subprocess.run([node, str(KQL / "check.mjs"), "--kql", str(kql), "--deploy", str(deploy),
                           "--readme", str(readme)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "010-bad.kql:7:5: Error KS204 The name 'NoSuchTable' does not refer to any known table" in proc.stdout


def test_kusto_language_splits_the_scripts_as_kusto_apply_does(full_check: tuple[int, dict[str, Any]]) -> None:
    _, out = full_check
    by_file: dict[str, list[str]] = {}
    for c in schema_commands():
        by_file.setdefault(f"schemas/kusto/{c.file}", []).append(c.text)
    assert out["commands"] == by_file


def _tables_in_kql() -> dict[str, list[tuple[str, str]]]:
    tables = {}
    for command in split_script((SCHEMA_DIR / "010-tables.kql").read_text()):
        m = re.fullmatch(r"\.create-merge table (\w+) \(([^)]*)\) with \(.*\)", command, re.S)
        assert m, command
        tables[m.group(1)] = [tuple(col.strip().split(":")) for col in m.group(2).split(",")]
    return tables  # type: ignore[return-value]


def test_declared_schema_matches_the_table_definitions() -> None:
    ours = {name: list(t["columns"].items()) for name, t in SCHEMA["tables"].items() if t["owner"] == "tracker"}
    assert ours == _tables_in_kql()
    assert set(ours) == set(TABLES)
    adxmon = {name: t["columns"] for name, t in SCHEMA["tables"].items() if t["owner"] == "adx-mon"}
    assert set(adxmon) >= {"DCGMFIDEVGPUUTIL", "DCGMFIPROFGRENGINEACTIVE"}
    assert all(columns == ADXMON_METRIC_COLUMNS for columns in adxmon.values())
    # besides the GPU telemetry, only the tracker's own metrics (tests/test_prometheus.py checks they are exported)
    assert all(name.startswith("Tracker") for name in set(adxmon) - {"DCGMFIDEVGPUUTIL", "DCGMFIPROFGRENGINEACTIVE"})


def test_json_mappings_map_every_column_by_name() -> None:
    mappings = {}
    for command in split_script((SCHEMA_DIR / "020-mappings.kql").read_text()):
        head, *literals = command.split("\n")
        m = re.fullmatch(r'\.create-or-alter table (\w+) ingestion json mapping "(\w+)"', head)
        assert m, head
        assert m.group(2) == mapping_name(m.group(1))
        mappings[m.group(1)] = json.loads("".join(re.fullmatch(r"'(.*)'", lit).group(1) for lit in literals))  # type: ignore[union-attr]
    for table, columns in _tables_in_kql().items():
        assert mappings[table] == [{"Column": c, "Properties": {"Path": f"$.{c}"}} for c, _ in columns]


def test_every_table_has_policies_and_a_deduplicating_view() -> None:
    commands = [c.text for c in schema_commands()]
    for table in TABLES:
        for policy in (f".alter-merge table {table} policy retention softdelete = 730d",
                       f".alter table {table} policy caching hot = 31d",
                       f".alter table {table} policy streamingingestion enable",
                       f".alter table {table} policy ingestionbatching"):
            assert any(c.startswith(policy) for c in commands), policy
    views = {m.group(1): m.group(2) for c in commands
             if (m := re.match(r"\.create ifnotexists materialized-view with \(.*?\) (\w+) on table (\w+)", c))}
    assert views == {
        "TaugridRunStateLatest": "TaugridRunState", "TaugridMetricSummariesLatest": "TaugridMetricSummaries",
        "TaugridRunTransitionsDedup": "TaugridRunTransitions", "TaugridRunAttemptsDedup": "TaugridRunAttempts",
        "TaugridRunPodsDedup": "TaugridRunPods"}
    assert commands[-1].startswith(".create-or-alter function"), "functions come after the views they read"


def test_functions_have_docstrings_and_readme_examples() -> None:
    readme = (SCHEMA_DIR / "README.md").read_text()
    examples = "\n".join(re.findall(r"```kusto\n(.*?)```", readme, re.S))
    functions = [c.text for c in schema_commands() if c.text.startswith(".create-or-alter function")]
    names = []
    for text in functions:
        m = re.match(r'\.create-or-alter function with \(folder="taugrid", docstring="([^"]+)"\) (\w+)\(', text)
        assert m, text[:120]
        names.append(m.group(2))
        assert re.search(rf"\b{m.group(2)}\(", examples), f"{m.group(2)} has no example in schemas/kusto/README.md"
    assert {"TaugridRunHistory", "TaugridRuns", "TaugridStalledAdmission", "TaugridStuckRuns", "TaugridRetryAudit",
            "TaugridGpuUtilization", "TaugridPhaseDurations"} <= set(names)


def test_adxmon_resources_are_rendered_from_the_schema() -> None:
    for path, text in render_adxmon.render().items():
        assert path.read_text() == text, f"{path} is stale: run uv run python -m tests.kql.render_adxmon"
    docs = [d for p in sorted(DEPLOY.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())]
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert ("ManagementCommand", "taugrid-schema") in kinds
    assert sum(k == "Function" for k, _ in kinds) == len([c for c in schema_commands()
                                                          if c.text.startswith(".create-or-alter function")])
    # the run-history alerts (the metric alerts of metric-alerts.yaml are tests/test_prometheus.py's)
    alerts = {d["metadata"]["name"]: d["spec"] for d in docs
              if d["kind"] == "AlertRule" and not d["metadata"]["name"].startswith("tracker-")}
    assert set(alerts) == {"taugrid-stuck-runs", "taugrid-gpu-idle-no-progress"}
    for spec in alerts.values():
        assert {"database", "interval", "query", "destination"} <= set(spec)
        assert spec["database"] == SCHEMA["database"]
        assert re.search(r'CorrelationId = strcat\("taugrid-[a-z-]+/", Cluster, "/", RunId', spec["query"])
    assert "DCGMFIPROFGRENGINEACTIVE" in alerts["taugrid-gpu-idle-no-progress"]["query"]
    stuck = alerts["taugrid-stuck-runs"]["query"]
    assert "TaugridStuckRuns(30m)" in stuck and "PendingReason" in stuck and "Reason, Message" in stuck
    assert 'tostring(Attempt), "/", Phase)' in stuck  # one alert per run, attempt and phase, as the reducer's


def test_stuck_runs_function_covers_the_clis_phases() -> None:
    """TaugridStuckRuns selects what `tracker runs --stuck` does: pending, in the phases before running."""
    from tracker.shell.index_query import STUCK_PHASES

    body = next(c.text for c in schema_commands() if ") TaugridStuckRuns(" in c.text)
    phases = re.search(r'Status == "pending" and Phase in \(([^)]*)\)', body)
    assert phases and tuple(p.strip().strip('"') for p in phases.group(1).split(",")) == STUCK_PHASES
