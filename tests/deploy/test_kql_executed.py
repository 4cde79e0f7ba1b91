"""The stored KQL functions (schemas/kusto/050-functions.kql) EXECUTED, not only analysed: duckdb-kql (PyPI, pinned
in uv.lock) runs them on DuckDB over the rows the ADX sink writes for the demo, and their answers are compared with
the CLI's JSON on the same replay (issue 28).

duckdb-kql APPROXIMATES Kusto: it translates KQL to DuckDB SQL and does not implement every operator and function
(its refusals are listed in kql_not_executed.txt next to this file, and any change to that list fails
``test_the_functions_duckdb_kql_cannot_run_are_the_listed_ones``). The syntax and schema check of every KQL text is
Microsoft's language service (tests/kql/check.mjs, test_kusto.py); this is the semantic check of what it can run.

How the rows get there: the demo captures (tracker.cli.args.DEMO_CAPTURES) are replayed into an index by
``tracker.runtime.replay.replay`` (what ``tracker audit``/``runs`` read) and folded by the same reducer through the
ADX sink into the Kusto stand-in (tests/support/adx_standin.py), which keeps the ingested rows. Each table of
schemas/kusto/schema.json becomes a DuckDB table of the same name and column types; the materialized views are
built from their own query by duckdb-kql (``…Latest``), except the ``…Dedup`` views (``take_any(*)``, which it
cannot run), built as one row per EventId in SQL. ``now()`` is the CLI's ``--now`` (duckdb-kql's ``query_now``).
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections.abc import Iterator
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb_kql
import pytest
from rich.console import Console

from tests.support.adx_standin import KustoStandIn
from tracker.cli import main
from tracker.cli.args import DEMO_CAPTURES
from tracker.core.reducer import Reducer
from tracker.runtime.pipeline import PipelineLimits, run_pipeline
from tracker.runtime.replay import replay
from tracker.settings import AdxSettings
from tracker.shell.adx import AdxSink
from tracker.shell.capture import capture_files, interleave
from tracker.shell.kusto_apply import SCHEMA_DIR, schema_commands

SCHEMA = json.loads((SCHEMA_DIR / "schema.json").read_text())
NOT_EXECUTED = Path(__file__).with_name("kql_not_executed.txt")
NOW = "2026-08-20T13:00:00Z"  # the demo's reference time (README: tracker audit --now 2026-08-20T13:00:00Z)
CLUSTER = "aks-east-1"
TYPES = {"string": "VARCHAR", "long": "BIGINT", "int": "INTEGER", "bool": "BOOLEAN", "datetime": "TIMESTAMP",
         "real": "DOUBLE", "dynamic": "JSON"}
# The only rewrite of a function's text: duckdb-kql has no make_bag; make_list of the same one-key bags, merged here,
# is the same bag (a bag per group of distinct EvictionReason keys).
REWRITES = {"make_bag(bag_pack(EvictionReason, N))": "make_list(bag_pack(EvictionReason, N))"}
_NAME = re.compile(r'\.create-or-alter function with \((?:[^()"]|"[^"]*")*\) (\w+)\(')


@dataclass(frozen=True)
class Demo:
    con: Any  # a DuckDB connection
    functions: dict[str, str]  # name -> .create-or-alter command, rewritten (REWRITES)
    index: Path


def _fold_to_adx(tmp: Path) -> dict[str, list[dict[str, Any]]]:
    """The rows the ADX sink writes for the demo, as the Kusto stand-in received them."""
    standin = KustoStandIn().up()
    try:
        sink = AdxSink(AdxSettings(cluster_uri=standin.url, auth="none", database=SCHEMA["database"],
                                   source_cluster=CLUSTER, spool_dir=tmp / "spool", batch_max_delay_s=0.05,
                                   retry_attempts=2, retry_initial_s=0.01, retry_max_s=0.2, ingest_timeout_s=30))
        try:
            asyncio.run(run_pipeline(interleave(capture_files([DEMO_CAPTURES])), Reducer(), sinks=[sink],
                                     limits=PipelineLimits(flush_every=500, replay_flush_every=500)))
            assert sink.flush(60)
        finally:
            sink.close(timeout_s=30)
        return {table: list(rows) for table, rows in standin.tables.items()}
    finally:
        standin.down()


def _load(con: Any, rows: dict[str, list[dict[str, Any]]], tmp: Path) -> None:
    for table, spec in SCHEMA["tables"].items():
        cols = spec["columns"]
        con.sql(f'CREATE TABLE "{table}" ({", ".join(f"{json.dumps(c)} {TYPES[t]}" for c, t in cols.items())})')
        if not rows.get(table):
            continue
        path = tmp / f"{table}.jsonl"
        path.write_text("".join(json.dumps({c: json.dumps(r[c]) if t == "dynamic" and r.get(c) is not None
                                            else r.get(c) for c, t in cols.items()}) + "\n" for r in rows[table]))
        types = ", ".join(f"'{c}': '{'VARCHAR' if t == 'dynamic' else TYPES[t]}'" for c, t in cols.items())
        con.sql(f"INSERT INTO \"{table}\" SELECT * FROM read_json('{path}', format='newline_delimited', "
                f"columns={{{types}}})")
    for c in schema_commands():
        if not c.text.startswith(".create ifnotexists materialized-view"):
            continue
        name, source = re.findall(r"(\w+) on table (\w+)", c.text)[0]
        query = c.text[c.text.index("{") + 1:c.text.rindex("}")].strip()
        if "take_any(*)" in query:  # listed in kql_not_executed.txt
            con.sql(f'CREATE TABLE "{name}" AS SELECT * FROM "{source}" '
                    "QUALIFY row_number() OVER (PARTITION BY EventId ORDER BY Revision) = 1")
        else:
            duckdb_kql.script(con, f".set-or-replace {name} <| {query}")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    tmp = tmp_path_factory.mktemp("kql")
    index = tmp / "demo.sqlite"
    replay(captures=[DEMO_CAPTURES], index_path=index, console=Console(quiet=True), quiet=True)
    rows = _fold_to_adx(tmp)
    assert {t for t, r in rows.items() if r} >= {"TaugridRunState", "TaugridRunAttempts", "TaugridRunTransitions"}
    con = duckdb_kql.connect()
    _load(con, rows, tmp)
    functions = {}
    for c in schema_commands():
        if (m := _NAME.match(c.text)) is not None:
            text = c.text
            for old, new in REWRITES.items():
                text = text.replace(old, new)
            functions[m.group(1)] = text
    yield Demo(con, functions, index)
    con.close()


def kql(demo: Demo, query: str) -> list[dict[str, Any]]:
    rel = duckdb_kql.kql(demo.con, query, functions=list(demo.functions.values()), query_now=NOW)
    return [dict(zip(rel.columns, row, strict=True)) for row in rel.fetchall()]


def cli(demo: Demo, *args: str) -> Any:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main([*args, "--index", str(demo.index), "--now", NOW, "-o", "json"]) == 0
    return json.loads(out.getvalue())


def _call(name: str, text: str) -> str:
    """A call of every function with its defaults, a run id or ids where one is required (a run of the demo)."""
    header = text[:text.index("{")]
    if "runIds:dynamic" in header:
        return f'{name}(dynamic(["vit-l-9hx4d", "bert-pt-2c5nw"]))'
    return f'{name}("vit-l-9hx4d")' if "runId:string" in header else f"{name}()"


def _refusal(exc: Exception) -> str:
    """What duckdb-kql refused, without positions (the innermost construct it names)."""
    constructs = re.findall(r"unsupported KQL construct '([^']+)'", str(exc))
    return constructs[-1] if constructs else f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


def _listed() -> dict[str, str]:
    listed = {}
    for line in NOT_EXECUTED.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.partition(":")
            listed[name.strip()] = reason.strip()
    return listed


def test_the_functions_duckdb_kql_cannot_run_are_the_listed_ones(demo: Demo) -> None:
    """Every stored function is called (with its defaults; a demo run where a run id is required); the ones
    duckdb-kql refuses, with the construct it refuses, are exactly those of kql_not_executed.txt: a function newly
    runnable, or newly refused, fails here until the list says so. The ones it runs return rows of the demo."""
    refused, ran = {}, {}
    for name, text in demo.functions.items():
        try:
            ran[name] = kql(demo, _call(name, text))
        except (duckdb_kql.KqlError, NotImplementedError) as exc:
            refused[name] = _refusal(exc)
    listed = _listed()
    assert refused == listed, (
        "duckdb-kql's refusals changed: update tests/deploy/kql_not_executed.txt")
    assert len(ran) >= 12, sorted(refused)
    assert {"TaugridGpuAudit", "TaugridStuckRuns", "TaugridGoodput", "TaugridAttemptsLatest"} <= set(ran)
    # the demo's rows came through (the functions read something; nothing here is live at NOW but one stuck run)
    assert {n for n, rows in ran.items() if rows} >= {"TaugridGpuAudit", "TaugridGoodput", "TaugridTransitionsLatest",
                                                      "TaugridAttemptsLatest", "TaugridPodsLatest",
                                                      "TaugridCheckpointsLatest", "TaugridPendingByReason",
                                                      "TaugridGpuPodWindows", "TaugridStuckRuns"}


def _close(a: float | None, b: float | None) -> bool:
    return (a or 0.0) == pytest.approx(b or 0.0, abs=1e-6)


LOST = {"PodFailure": "LostPodFailure", "PodEvicted": "LostPodEvicted", "Preempted": "LostPreempted",
        "PodsReadyTimeout": "LostPodsReadyTimeout", "Evicted": "LostEvicted", "RayJobRetry": "LostRayJobRetry",
        "RunFailed": "LostRunFailed"}


@pytest.mark.parametrize("by", ["namespace", "queue", "cluster-queue", "workspace", "project"])
def test_gpu_audit_gives_what_tracker_audit_gives(demo: Demo, by: str) -> None:
    """TaugridGpuAudit(groupBy=...) over the demo's ADX rows, per group, equals `tracker audit --by ... -o json`
    over the same replay (the default window, the last 7 days of --now): runs, attempts, evictions and EvictionsBy,
    pod retries, resumes, GPU-hours held and lost (each reason), the worst run. Before issue 28 EvictionsBy was
    empty for every workspace and project (the runs' Cluster was blanked, then the join's own Cluster1: the
    evictions' lookup never matched)."""
    got = {(r["Group"] or None): r for r in kql(demo, f'TaugridGpuAudit(datetime(null), datetime(null), "{by}")')}
    want = {g[by.replace("-", "_")] or None: g for g in cli(demo, "audit", "--since", "7d", "--by", by)["groups"]}
    assert set(got) == set(want) and want
    cross_cluster = by in ("workspace", "project")
    for group, w in want.items():
        g = got[group]
        assert g["Cluster"] == ("" if cross_cluster else CLUSTER)
        bag: dict[str, int] = {}
        evictions_by = json.loads(g["EvictionsBy"]) if isinstance(g["EvictionsBy"], str) else g["EvictionsBy"]
        for one in evictions_by if isinstance(evictions_by, list) else [evictions_by]:
            bag |= one
        assert (g["Runs"], g["Attempts"], g["Evictions"], bag, g["PodRetries"], g["Resumes"]) == \
            (w["runs"], w["attempts"], w["evictions"], w["evictions_by"], w["pod_retries"], w["resumes"]), group
        assert _close(g["GpuHours"], w["gpu_hours"]) and _close(g["LostGpuHours"], w["lost_gpu_hours"]), group
        for reason, column in LOST.items():
            assert _close(g[column], w["lost_gpu_hours_by"].get(reason)), (group, reason)
        assert (g["WorstRun"] or None) == (w["worst_run"] if w["worst_run_lost_gpu_hours"] else None), group
    assert sum(len(w["evictions_by"]) for w in want.values()) > 0  # the comparison covers evictions by reason


def test_stuck_runs_and_goodput_give_what_tracker_runs_gives(demo: Demo) -> None:
    """TaugridStuckRuns() lists the runs `tracker runs --stuck 30m` lists at the same --now, and TaugridGoodput()
    each run's status, GPU-hours, goodput and ETTR as `tracker runs -o json` has them, every run keyed by its
    cluster (one cluster here: the demo's)."""
    stuck = kql(demo, "TaugridStuckRuns()")
    want_stuck = cli(demo, "runs", "--stuck", "30m")
    assert sorted((r["Cluster"], r["RunId"], r["Phase"]) for r in stuck) == \
        sorted((CLUSTER, r["run_id"], r["phase"].capitalize()) for r in want_stuck)
    assert want_stuck
    goodput = {(r["Cluster"], r["RunId"]): r for r in kql(demo, "TaugridGoodput()")}
    runs = {(CLUSTER, r["run_id"]): r for r in cli(demo, "runs")}
    assert set(goodput) == set(runs) and len(runs) >= 10
    for key, w in runs.items():
        g = goodput[key]
        assert g["Status"] == w["status"], key
        assert _close(g["Goodput"], w["goodput"]) and _close(g["Ettr"], w["ettr"]), key
