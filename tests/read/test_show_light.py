"""`tracker show` and `tracker compare` read a run's rows with the standard library (issue 28, point 8: they start
without pydantic): the rows ``tracker.read.history.build`` makes equal those pydantic validates from the same
columns, the document ``history.document`` writes is ``model.to_json``'s, the commands print the same bytes as the
full (pydantic) path in every format, and a command in a process of its own imports neither pydantic nor the
reducer (nor rich where its output does not need it)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest

from tests.read.test_cli_runs import HEAVY, imported
from tracker.cli import main
from tracker.core import model
from tracker.read import history as history_rows
from tracker.read.store import IndexReader

NOW = "2026-08-20T13:00:00Z"
# pairs of runs compare is asked about: a preemption and a success, a live run and a failed one, a resume lineage
PAIRS = (("vit-l-9hx4d", "bert-pt-2c5nw"), ("qwen-rm-5vt2j", "sd-xl-3rp6f"), ("gpt-moe-6wz8r", "gpt-moe-tq3vb"))
# what show and compare must never import: pydantic, the reducer and its derivation, the settings models
NEVER = ("pydantic", "tracker.core.reducer", "tracker.core.derive", "tracker.core.pending", "tracker.core.facts",
         "tracker.core.intake", "tracker.core.dead_letter", "tracker.settings")


@pytest.fixture(scope="module")
def run_ids(index: Path) -> list[str]:
    with IndexReader(index) as reader:
        return sorted(r.run_id for r in reader.runs(fields=("run_id",), phase_since=False))


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACKER_INDEX", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)


def _full_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the readers did before: every row validated by pydantic, the document dumped by pydantic."""
    monkeypatch.setattr(history_rows, "build", model.load)
    monkeypatch.setattr(history_rows, "document", model.to_json)


def test_the_rows_read_without_pydantic_are_the_validated_rows(
        index: Path, run_ids: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with IndexReader(index) as reader:
        light = {r: reader.history(r) for r in run_ids}
        _full_path(monkeypatch)
        full = {r: reader.history(r) for r in run_ids}
    assert len(run_ids) > 10
    kinds: set[str] = set()
    for run_id in run_ids:
        a, b = light[run_id], full[run_id]
        assert a is not None and b is not None
        assert a == b, run_id
        # equal as values is not enough (3 == 3.0): the same JSON text, floats where the model says float
        assert json.dumps(history_rows._plain(a)) == json.dumps(model.to_json(b)), run_id
        kinds |= {type(x).__name__ for at in a.attempts for x in (*at.failures, *at.admission_steps, *at.pending)}
        kinds |= {type(x).__name__ for x in (*a.metrics, *(a.metric_points or ()), *(a.pods or ()), *a.checkpoints,
                                             *a.ledger, *a.resume_links, *a.transitions)}
    # every row class of a history was read at least once
    assert kinds >= {"PodFailure", "AdmissionStep", "PendingSpan", "MetricSummary", "MetricPoint", "PodPlacement",
                     "CheckpointRecord", "LedgerSpan", "ResumeLink", "Transition"}, kinds


def test_every_field_of_the_history_rows_has_a_conversion() -> None:
    for cls in (model.RunRecord, model.Transition, model.Attempt, model.PodFailure, model.AdmissionStep,
                model.PendingSpan, model.MetricSummary, model.MetricPoint, model.ResumeLink, model.PodPlacement,
                model.CheckpointRecord, model.LedgerSpan):
        for f in dataclasses.fields(cls):
            history_rows._converter(str(f.type))  # raises TypeError for a type it cannot read
    with pytest.raises(TypeError):
        history_rows._converter("Annotated[set[int] | None, Field(description='x, y')]")


def _out(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0, capsys.readouterr().err
    return capsys.readouterr().out


@pytest.mark.parametrize("output", ["timeline", "json", "yaml",
                                    "jsonpath={.run.run_id} {.attempts[*].pending[*].start}"])
def test_show_prints_what_the_full_path_prints(index: Path, run_ids: list[str], output: str,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    args = ("--index", str(index), "--now", NOW, "-o", output)
    light = {r: _out(capsys, "show", r, *args) for r in run_ids}
    _full_path(monkeypatch)
    for run_id in run_ids:
        assert light[run_id] == _out(capsys, "show", run_id, *args), run_id
    assert all(light.values())


@pytest.mark.parametrize("output", ["table", "json", "yaml"])
def test_compare_prints_what_the_full_path_prints(index: Path, output: str, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    args = ("--index", str(index), "--now", NOW, "-o", output)
    light = [_out(capsys, "compare", *pair, *args) for pair in PAIRS]
    _full_path(monkeypatch)
    assert light == [_out(capsys, "compare", *pair, *args) for pair in PAIRS]
    assert all(light)


def test_show_and_compare_start_without_pydantic_or_the_reducer(index: Path) -> None:
    for args, uses_rich in ((["show", "vit-l-9hx4d"], True), (["show", "vit-l-9hx4d", "-o", "json"], False),
                            (["show", "vit-l-9hx4d", "-o", "yaml"], False), (["compare", *PAIRS[0]], True),
                            (["compare", *PAIRS[0], "-o", "json"], False),
                            (["compare", *PAIRS[0], "-o", "yaml"], False)):
        modules = imported([*args, "--index", str(index)])
        assert "tracker.read.history" in modules, args
        assert not {m for m in modules if m.startswith(NEVER) or m.startswith(HEAVY)}, args
        assert any(m.split(".")[0] == "rich" for m in modules) == uses_rich, args


def test_show_and_compare_read_the_index_by_its_indexes(index: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every statement show and compare run (a run by its id, a start of it or NAMESPACE/NAME) searches by a key or
    an index: none reads a whole table (EXPLAIN QUERY PLAN), so they cost the same on an index of any size."""
    from tracker.read import store

    statements: list[str] = []
    connect = store.IndexReader._connect

    def traced(self: store.IndexReader) -> sqlite3.Connection:
        conn = connect(self)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(store.IndexReader, "_connect", traced)
    for args in (["show", "vit-l-9hx4d"], ["show", "vit-l-9"], ["show", "team-a/qwen-rm-5vt2j", "-o", "json"],
                 ["compare", "team-a/gpt-moe-6wz8r", "gpt-moe-tq3vb"]):
        _out(capsys, *args, "--index", str(index))
    conn = sqlite3.connect(f"{index.resolve().as_uri()}?mode=ro", uri=True)
    try:
        plans = {sql: [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}")] for sql in set(statements)
                 if sql.split()[0].upper() not in ("BEGIN", "COMMIT", "PRAGMA")}
    finally:
        conn.close()
    assert any("name = 'qwen-rm-5vt2j'" in sql for sql in plans), "the NAMESPACE/NAME lookup was not run"
    scans = {sql: plan for sql, plan in plans.items()
             if any(step.startswith("SCAN") and step not in ("SCAN sqlite_master", "SCAN CONSTANT ROW")
                    for step in plan)}
    assert scans == {}
