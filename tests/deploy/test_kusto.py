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
from tracker.shell.adx import ALL_TABLES, mapping_name
from tracker.shell.kusto_apply import SCHEMA_DIR, schema_commands, split_script

ROOT = Path(__file__).resolve().parents[2]
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
    assert set(ours) == set(ALL_TABLES)
    adxmon = {name: t["columns"] for name, t in SCHEMA["tables"].items() if t["owner"] == "adx-mon"}
    assert set(adxmon) >= {"DCGMFIDEVGPUUTIL", "DCGMFIPROFGRENGINEACTIVE"}
    assert all(columns == ADXMON_METRIC_COLUMNS for columns in adxmon.values())
    # besides the GPU telemetry, only the tracker's own metrics (tests/deploy/test_prometheus.py checks they
    # are exported)
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
    for table in ALL_TABLES:
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
        "TaugridRunPodsDedup": "TaugridRunPods", "TaugridMetricPointsDedup": "TaugridMetricPoints",
        "TaugridQueueStateLatest": "TaugridQueueState", "TaugridQueuePositionsLatest": "TaugridQueuePositions",
        "TaugridNodeStateLatest": "TaugridNodeState", "TaugridCheckpointsDedup": "TaugridCheckpoints"}
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
            "TaugridGpuUtilization", "TaugridPhaseDurations", "TaugridGpuAudit", "TaugridGpuPodWindows",
            "TaugridGpuUsage", "TaugridIdleGpus", "TaugridCompareRuns", "TaugridQueues", "TaugridWaitingBehind",
            "TaugridCheckpointsLatest", "TaugridGoodput", "TaugridBadputByCategory"} <= set(names)


def test_adxmon_resources_are_rendered_from_the_schema() -> None:
    for path, text in render_adxmon.render().items():
        assert path.read_text() == text, f"{path} is stale: run uv run python -m tests.kql.render_adxmon"
    docs = [d for p in sorted(DEPLOY.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())]
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert ("ManagementCommand", "taugrid-schema") in kinds
    assert sum(k == "Function" for k, _ in kinds) == len([c for c in schema_commands()
                                                          if c.text.startswith(".create-or-alter function")])
    # the run-history alerts (the metric alerts of metric-alerts.yaml are tests/deploy/test_prometheus.py's)
    alerts = {d["metadata"]["name"]: d["spec"] for d in docs
              if d["kind"] == "AlertRule" and not d["metadata"]["name"].startswith("tracker-")}
    assert set(alerts) == {"taugrid-stuck-runs", "taugrid-gpu-idle-no-progress", "taugrid-idle-gpus-held"}
    for spec in alerts.values():
        assert {"database", "interval", "query", "destination"} <= set(spec)
        assert spec["database"] == SCHEMA["database"]
        assert re.search(r'CorrelationId = strcat\("taugrid-[a-z-]+/", Cluster, "/", RunId', spec["query"])
    assert "DCGMFIPROFGRENGINEACTIVE" in alerts["taugrid-gpu-idle-no-progress"]["query"]
    idle = alerts["taugrid-idle-gpus-held"]["query"]
    assert "TaugridIdleGpus(_endTime - window, _endTime, 5.0)" in idle and "where Open" in idle
    assert 'tostring(Attempt))' in idle  # one alert per run and attempt
    stuck = alerts["taugrid-stuck-runs"]["query"]
    assert "TaugridStuckRuns(30m)" in stuck and "PendingReason" in stuck and "Reason, Message" in stuck
    assert 'tostring(Attempt), "/", Phase)' in stuck  # one alert per run, attempt and phase, as the reducer's


def test_stuck_runs_function_covers_the_clis_phases() -> None:
    """TaugridStuckRuns selects what `tracker runs --stuck` does: pending, in the phases before running."""
    from tracker.read.filters import STUCK_PHASES

    body = next(c.text for c in schema_commands() if ") TaugridStuckRuns(" in c.text)
    phases = re.search(r'Status == "pending" and Phase in \(([^)]*)\)', body)
    assert phases and tuple(p.strip().strip('"') for p in phases.group(1).split(",")) == STUCK_PHASES


def test_gpu_audit_function_groups_and_loses_as_tracker_audit() -> None:
    """TaugridGpuAudit takes `tracker audit --by`'s groupings, counts evictions as it does (the same triggers are
    not evictions) and has a column per reason GPU-time is lost (schemas/gpu-accounting.md)."""
    from tracker.core.vocab import DEACTIVATION_REASONS
    from tracker.read.audit import GROUP_BY, LOST_REASONS, NOT_EVICTIONS

    body = next(c.text for c in schema_commands() if ") TaugridGpuAudit(" in c.text)
    for by in GROUP_BY:
        assert f'"{by}"' in body or by == "namespace", by  # namespace: the default
    assert f'Trigger !in ("{NOT_EVICTIONS[0]}", "{NOT_EVICTIONS[1]}")' in body
    assert all(f'RunReason startswith "{d}"' in body for d in DEACTIVATION_REASONS)
    for reason in LOST_REASONS:
        assert f"Lost{reason} = sum(todouble(LostGpuHoursBy.{reason}))" in body, reason
    usage = next(c.text for c in schema_commands() if ") TaugridGpuUsage(" in c.text)
    assert "on Cluster, Namespace, Pod" in usage and "DCGMFIDEVGPUUTIL" in usage


_PARAM = re.compile(r"(\w+):(\w+)(?:\s*=\s*(\w+\([^)]*\)|[^,]+))?")
_SAMPLE = {"string": '"run-7f3c2a"', "datetime": "ago(3d)", "timespan": "2h", "real": "10.0",
           "dynamic": 'dynamic(["run-7f3c2a", "run-9d41e0"])'}


def _signatures() -> dict[str, list[tuple[str, str, str | None]]]:
    """name -> [(parameter, type, default or None)] of every stored function, from its command."""
    signatures = {}
    for c in schema_commands():
        m = re.match(r'\.create-or-alter function with \((?:[^()"]|"[^"]*")*\) (\w+)\(', c.text)
        if m:
            depth, end = 1, m.end()
            while depth:  # to the parenthesis closing the parameter list (defaults hold some: datetime(null))
                depth += {"(": 1, ")": -1}.get(c.text[end], 0)
                end += 1
            signatures[m.group(1)] = [(p, t, d.strip() if d else None)
                                      for p, t, d in _PARAM.findall(c.text[m.end():end - 1])]
    return signatures


def test_functions_take_defaults_and_are_called_with_and_without_arguments(node: str, tmp_path: Path) -> None:
    """Every stored function, called through the language service as a dashboard or a person would: with every
    argument, with none where all have defaults, and with each defaulted one by name; leaving out a required
    argument is an error (so the check is not vacuous)."""
    signatures = _signatures()
    defaults = {name: {p: d for p, _, d in params} for name, params in signatures.items()}
    assert defaults["TaugridRuns"] == {"workspaceName": '""', "projectName": '""', "runStatus": '""',
                                       "since": "datetime(null)", "lookback": "30d"}
    assert defaults["TaugridStuckRuns"] == defaults["TaugridStalledAdmission"] == {"threshold": "30m",
                                                                                   "lookback": "30d"}
    assert defaults["TaugridRetryAudit"] == defaults["TaugridPhaseDurations"] == {"since": "datetime(null)",
                                                                                  "lookback": "30d"}
    assert defaults["TaugridRunHistory"] == defaults["TaugridGpuUtilization"] == {"runId": None, "cluster": '""',
                                                                                  "lookback": "30d"}
    assert defaults["TaugridGpuAudit"] == {"since": "datetime(null)", "until": "datetime(null)",
                                           "groupBy": '"namespace"', "lookback": "30d"}
    assert defaults["TaugridIdleGpus"]["maxUtilPct"] == "5.0"
    assert defaults["TaugridCompareRuns"] == {"runIds": None, "metric": '"loss"', "lookback": "30d"}
    assert defaults["TaugridGoodput"] == {"lookback": "7d"}
    assert defaults["TaugridBadputByCategory"] == {"lookback": "7d", "groupBy": '"project"'}
    calls = []
    for name, params in signatures.items():
        calls.append(f"{name}({', '.join(_SAMPLE[t] for _, t, _ in params)}) | take 10")
        if all(d is not None for _, _, d in params):
            calls.append(f"{name}() | count")
            calls += [f"{name}({p}={_SAMPLE[t]}) | take 1" for p, t, _ in params]
    assert "TaugridRuns() | count" in calls and "TaugridStuckRuns(threshold=2h) | take 1" in calls
    wrong = ["TaugridRunHistory() | take 1", 'TaugridRuns(status="failed") | take 1']
    queries = tmp_path / "calls.json"
    queries.write_text(json.dumps([{"file": "calls.kql", "line": i + 1, "text": q}
                                   for i, q in enumerate([*calls, *wrong])]))
    # against the schema's functions only (no adx-mon resources nor README: the full check covers those)
    rc, out = check(node, "--queries", str(queries), "--deploy", str(tmp_path / "none"),
                    "--readme", str(tmp_path / "none"))
    assert out["queries"] == len(calls) + len(wrong)
    found = [(d["file"], d["line"]) for d in out["diagnostics"]]
    assert found == [("calls.kql", len(calls) + 1), ("calls.kql", len(calls) + 2)], out["diagnostics"]
    assert rc == 1


def test_pending_by_reason_and_live_waits() -> None:
    """Issue 24: TaugridPendingByReason sums the attempts' pending spans by category (an open span up to now()), and
    the functions that show admission waits count a run still waiting up to now() - QueuedAt."""
    bodies = {m.group(1): c.text for c in schema_commands()
              if (m := re.search(r"\) (\w+)\(", c.text)) and c.text.startswith(".create-or-alter function")}
    pending = bodies["TaugridPendingByReason"]
    assert "mv-expand Span = Pending" in pending and "coalesce(SpanEnd, now())" in pending
    assert 'Category == "admission-check", Detail' in pending
    from tracker.core.waits import PENDING_CATEGORIES

    docstring = re.search(r'docstring="([^"]+)"', pending)
    assert docstring and all(c in docstring.group(1) for c in PENDING_CATEGORIES)
    for name in ("TaugridRuns", "TaugridRunHistory", "TaugridStuckRuns", "TaugridPhaseDurations",
                 "TaugridStalledAdmission"):
        assert "now() - QueuedAt" in bodies[name], name
    for column in ("Pending", "AdmissionSteps", "PendingSecBy", "QuotaReservedAt"):
        assert column in SCHEMA["tables"]["TaugridRunAttempts"]["columns"], column
    for column in ("PendingSecBy", "PendingCategory", "PendingSince", "QuotaReservedAt"):
        assert column in SCHEMA["tables"]["TaugridRunState"]["columns"], column


def test_goodput_functions_read_the_ledger_as_the_history_defines_it() -> None:
    """Issue 25: TaugridGoodput reads each run's ledger (TaugridRunState's Ledger* columns) at now(): every goodput
    category a column of its own and a key of GpuHoursBy and WallSecBy, the open category grown by GpusOpen GPUs from
    LedgerUntil (the wall time too, on the progress basis only), Goodput and Ettr as ratios; TaugridBadputByCategory
    sums TaugridGoodput's columns per group (the groupings of TaugridGpuAudit, but cluster-wide by default per project)
    and takes its ratios of the sums."""
    from tracker.core.model import GoodputCategory, RunRecord, field_names
    from tracker.read.audit import GROUP_BY
    from tracker.shell.adx import STATE_COLUMNS

    bodies = {m.group(1): c.text for c in schema_commands()
              if (m := re.search(r"\) (\w+)\(", c.text)) and c.text.startswith(".create-or-alter function")}
    goodput, badput = bodies["TaugridGoodput"], bodies["TaugridBadputByCategory"]
    names = {c: "".join(w.capitalize() for w in c.value.split("-")) for c in GoodputCategory}
    for cat, name in names.items():
        assert f'{name}GpuHours = coalesce(todouble(LedgerGpuHoursBy["{cat}"]), 0.0) + iff(LedgerOpen == "{cat}", ' \
               "OpenGpuHours, 0.0)" in goodput, cat
        assert f'{name}WallSec = coalesce(todouble(LedgerWallSecBy["{cat}"]), 0.0) + iff(LedgerOpen == "{cat}", ' \
               "OpenWallSec, 0.0)" in goodput, cat
        assert f'"{cat}", {name}GpuHours' in goodput and f'"{cat}", {name}WallSec' in goodput, cat
        assert f"{name}GpuHours = sum({name}GpuHours)" in badput, cat
        assert cat in re.search(r'docstring="([^"]+)"', goodput).group(1)  # type: ignore[union-attr]
    assert "GpuHours = " + " + ".join(f"{n}GpuHours" for n in names.values()) in goodput
    assert "OpenSec = iff(Open, max_of((now() - LedgerUntil) / 1s, 0.0), 0.0)" in goodput
    assert 'OpenGpuHours = GpusOpen * OpenSec / 3600.0, OpenWallSec = iff(LedgerBasis == "progress", OpenSec, 0.0)' \
        in goodput
    assert "Goodput = iff(GpuHours > 0, ProductiveGpuHours / GpuHours, real(null))" in goodput + badput
    assert 'Ettr = iff(LedgerBasis == "progress" and WallSec > 0, ProductiveWallSec / WallSec, real(null))' in goodput
    assert "Ettr = iff(WallSec > 0, ProductiveWallSec / WallSec, real(null))" in badput
    assert "TaugridGoodput(lookback)" in badput
    for by in GROUP_BY:
        assert f'"{by}"' in badput or by == "project", by  # project: the default
    # the columns it reads are the history's (RunRecord's ledger fields, as the sink writes them)
    ledger = ("ledger_basis", "ledger_gpu_hours_by", "ledger_wall_s_by", "ledger_until", "ledger_open", "gpus_open")
    assert set(ledger) <= set(field_names(RunRecord))
    for f in ledger:
        assert STATE_COLUMNS[f] in goodput, f


_RUN_KEYS = re.compile(r"\bsummarize\b[^|;]*?\bby\b([^|;]*)|\b(?:join|lookup)\b[^|;]*?\bon\s+([A-Za-z_$][^|;\n]*)")


def _run_keyed_queries() -> dict[str, str]:
    """Every KQL text that reads the run tables: the views, the functions, the alerts and the dashboard tiles,
    without comments and the functions' docstrings."""
    texts = {}
    for c in schema_commands():
        if c.text.startswith((".create-or-alter function", ".create ifnotexists materialized-view")):
            texts[f"{c.file}#{c.index}"] = c.text[c.text.index("{"):]
    for d in yaml.safe_load_all((DEPLOY / "alerts.yaml").read_text()):
        texts[d["metadata"]["name"]] = d["spec"]["query"]
    dashboard = json.loads((ROOT / "deploy" / "adx-dashboards" / "tracker.json").read_text())
    texts.update({q["id"]: q["text"] for q in dashboard["queries"]})
    return {k: re.sub(r"//[^\n]*", "", v) for k, v in texts.items() if "Taugrid" in v}


def test_every_run_key_join_and_lookup_has_the_cluster() -> None:
    """Issue 28: a run id is unique within one cluster only: every summarize (arg_max included), join and lookup
    keyed by RunId keys by Cluster too, in the views, the functions, the alerts and the dashboards (before, every
    one keyed on RunId alone and two clusters' runs merged)."""
    keys = [(name, (m.group(1) or m.group(2)).strip()) for name, text in _run_keyed_queries().items()
            for m in _RUN_KEYS.finditer(text)]
    by_run = [(name, k) for name, k in keys if re.search(r"\bRunId\b", k)]
    assert len(by_run) >= 30, by_run  # the check sees the keys it is about
    assert [(name, k) for name, k in by_run if not re.search(r"\b(Cluster|GroupCluster)\b", k)] == []
    views = {c.text.split(" on table ")[0].rsplit(" ", 1)[-1]: c.text for c in schema_commands()
             if c.text.startswith(".create ifnotexists materialized-view")}
    assert "by Cluster, RunId\n" in views["TaugridRunStateLatest"]
    assert "by Cluster, RunId, Metric\n" in views["TaugridMetricSummariesLatest"]


def test_every_function_takes_a_lookback_applied_first() -> None:
    """Issue 28: every stored function takes a lookback (a timespan with a default) and reads rows written in it
    (IngestedAt, filtered before any summarize) or passes it to the functions it reads, so no call scans the whole
    retention; one that takes a window (since) reads from the window's start when that is earlier."""
    signatures = _signatures()
    bodies = {m.group(1): c.text for c in schema_commands()
              if (m := re.match(r'\.create-or-alter function with \((?:[^()"]|"[^"]*")*\) (\w+)\(', c.text))}
    assert set(signatures) == set(bodies) and len(bodies) >= 21
    for name, params in signatures.items():
        lookback = [(t, d) for p, t, d in params if p == "lookback"]
        assert lookback and lookback[0][0] == "timespan" and lookback[0][1], name
        body = bodies[name][bodies[name].index("{"):]
        for table in re.findall(r"\b(Taugrid\w+(?:Dedup|Latest))\b(?!\()", body):
            # each read of a view is filtered on IngestedAt at once
            for m in re.finditer(rf"\b{table}\b(?!\()", body):
                assert re.match(r"\s*\|\s*where IngestedAt > ", body[m.end():]), (name, table)
        for called in re.findall(r"\b(Taugrid\w+)\(", body):
            assert re.search(rf"\b{called}\([^;\n]*\b(lookback|scanFrom)\b", body), (name, called)
        if any(p == "since" for p, _, _ in params):
            assert ("let scanFrom = iff(sinceTime < ago(lookback), sinceTime, ago(lookback));" in body
                    or "(sinceTime, untilTime, lookback)" in body), name
