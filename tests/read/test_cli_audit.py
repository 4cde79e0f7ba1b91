"""`tracker audit` on an index of the bundled captures: exact runs, attempts, evictions by reason, pod retries,
resumes and GPU-seconds held and lost per group (from the per-run figures tests/core/test_gpu.py proves), worst first;
the goodput ledger's sums per group (goodput, ETTR: from the runs' own ledgers); the time window; the table's width;
JSON and CSV that parse and agree; one-line errors."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.core.test_gpu import EXPECTED, _s
from tests.core.test_scenarios import fold_scenario
from tests.read.test_cli_runs import NOW, run
from tracker.cli import main
from tracker.core import gpu
from tracker.read.audit import LOST_REASONS, NOT_OBSERVED, eviction_reasons

# GPU-seconds held and lost of every bundled run (tests/core/test_gpu.py's EXPECTED, checked there against the reducer)
HELD = {run_id: exp[1] for runs in EXPECTED.values() for run_id, exp in runs.items()}
LOST = {run_id: sum(exp[2].values()) for runs in EXPECTED.values() for run_id, exp in runs.items()}
NOW_DT = datetime(2026, 8, 20, 13, 0, tzinfo=UTC)
TEAM_A = ("rn50-ft-k7q2m", "bert-pt-2c5nw", "e55428ce-5266-4f6d-8b5d-2ae542ca77c4", "gpt-moe-6wz8r",
          "qwen-rm-5vt2j", "dpo-sweep-7tj2h", "gpt-moe-tq3vb", "seg-sam-4nb8x")
TEAM_B = ("llama-sft-4xq9t", "mixtral-sft-8pz3c", "rl-ppo-8mc2k", "vit-l-9hx4d", "whisper-ft-5gd7s", "sd-xl-3rp6f")
# each run's ledger as the reducer writes it (at 13:00 every bundled run has ended or holds no GPU: no GPU-time to
# add; the one still waiting, qwen-rm-5vt2j, adds its wall time since ledger_until to its open category)
RECORDS = {run_id: h.run for name, runs in EXPECTED.items() for run_id in runs
           if (h := fold_scenario(name).history(run_id)) is not None}


def ledger_goodput(runs: tuple[str, ...]) -> float:
    return sum(RECORDS[r].ledger_gpu_hours_by.get("productive", 0.0) for r in runs) / \
        sum(sum(RECORDS[r].ledger_gpu_hours_by.values()) for r in runs)


def ledger_ettr(runs: tuple[str, ...]) -> float:
    progress = [RECORDS[r] for r in runs if RECORDS[r].ledger_basis == "progress"]
    growing = [(NOW_DT - r.ledger_until).total_seconds() for r in progress if r.ledger_open and r.ledger_until]
    assert len(growing) == (1 if "qwen-rm-5vt2j" in runs else 0) and all(s > 0 for s in growing)
    assert all(r.ledger_open != "productive" for r in progress)
    return sum(r.ledger_wall_s_by.get("productive", 0.0) for r in progress) / \
        (sum(sum(r.ledger_wall_s_by.values()) for r in progress) + sum(growing))


def audit_json(capsys: pytest.CaptureFixture[str], index: Path, *args: str) -> dict[str, object]:
    data = json.loads(run(capsys, "audit", "--index", str(index), "--now", NOW, "-o", "json", *args))
    assert isinstance(data, dict)
    return data


def test_the_sums_per_namespace_are_exact(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sum(HELD[r] for r in TEAM_A) == 214_232 and sum(LOST[r] for r in TEAM_A) == 74_488
    assert sum(HELD[r] for r in TEAM_B) == 232_632 and sum(LOST[r] for r in TEAM_B) == 73_040
    data = audit_json(capsys, index)
    assert (data["by"], data["since"], data["until"], data["now"]) == ("namespace", None, None,
                                                                       "2026-08-20T13:00:00.000000Z")
    groups = data["groups"]
    assert isinstance(groups, list)
    got = [(g["namespace"], g["runs"], g["attempts"], g["evictions"], g["evictions_by"], g["pod_retries"],
            g["resumes"], _s(g["gpu_hours"]), _s(g["lost_gpu_hours"]),
            {k: _s(v) for k, v in g["lost_gpu_hours_by"].items()}, g["worst_run"]) for g in groups]
    assert got == [  # worst first: team-a lost 74,488 GPU-s, team-b 73,040
        ("team-a", 8, 10, 4, {"Deactivated": 1, "DeactivatedDueToRequeuingLimitExceeded": 1, "PodsReadyTimeout": 1,
                              "Preempted": 1}, 2, 1, 214_232, 74_488,
         {"PodFailure": 8 * (109 + 104), "Preempted": 16 * 2399, "PodsReadyTimeout": 16 * 599,
          "Evicted": 16 * 600 + 16 * 899, "RunFailed": 8 * 104}, "bert-pt-2c5nw"),
        ("team-b", 6, 9, 2, {"Deactivated": 1, "PodsReadyTimeout": 1}, 1, 0, 232_632, 73_040,
         {"PodFailure": 8 * 578, "PodsReadyTimeout": 16 * 599, "Evicted": 16 * 2039, "RayJobRetry": 16 * 1638},
         "mixtral-sft-8pz3c"),
    ]
    # goodput and ETTR: the ledger's (productive GPU-time over GPU-time held; productive wall time over wall time,
    # of the runs with progress events), summed over the group's runs
    assert groups[0]["goodput"] == pytest.approx(ledger_goodput(TEAM_A), abs=1e-12)
    assert groups[1]["goodput"] == pytest.approx(ledger_goodput(TEAM_B), abs=1e-12)
    assert groups[0]["ettr"] == pytest.approx(ledger_ettr(TEAM_A), abs=1e-12)
    assert groups[1]["ettr"] == pytest.approx(ledger_ettr(TEAM_B), abs=1e-12)
    assert [(g["runs_with_progress"], g["runs_without_progress"]) for g in groups] == [
        (sum(RECORDS[r].ledger_basis == "progress" for r in team), sum(RECORDS[r].ledger_basis != "progress"
                                                                       for r in team)) for team in (TEAM_A, TEAM_B)]
    assert [_s(sum(g["ledger_gpu_hours_by"].values())) for g in groups] == [214_232, 232_632]  # = held
    total = data["total"]
    assert isinstance(total, dict) and "namespace" not in total
    assert (total["runs"], total["attempts"], total["evictions"], total["pod_retries"], total["resumes"],
            _s(total["gpu_hours"]), _s(total["lost_gpu_hours"])) == (14, 19, 6, 3, 1, 446_864, 147_528)
    assert total["goodput"] == pytest.approx(ledger_goodput(TEAM_A + TEAM_B), abs=1e-12)


def test_other_groupings(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def rows(by: str) -> list[tuple[object, ...]]:
        groups = audit_json(capsys, index, "--by", by)["groups"]
        assert isinstance(groups, list)
        key = by.lower().replace("-", "_")
        return [(g[key], g["runs"], _s(g["gpu_hours"]), _s(g["lost_gpu_hours"])) for g in groups]

    assert rows("queue") == [("team-a-lq", 8, 214_232, 74_488), ("team-b-lq", 6, 232_632, 73_040)]
    # the run whose rendering failed was never queued: no ClusterQueue, nothing held
    assert rows("cluster-queue") == [("gpu-cq", 13, 446_864, 147_528), (None, 1, 0, 0)]
    # eval-hotfix (the run id that is a uuid) has no workspace: its group is null, and last among equals
    hotfix = "e55428ce-5266-4f6d-8b5d-2ae542ca77c4"
    assert rows("WORKSPACE") == [("team-a", 7, 214_232 - HELD[hotfix], 74_488), ("team-b", 6, 232_632, 73_040),
                                 (None, 1, HELD[hotfix], 0)]
    llm = ("dpo-sweep-7tj2h", "gpt-moe-tq3vb", "gpt-moe-6wz8r", "qwen-rm-5vt2j", "llama-sft-4xq9t",
           "mixtral-sft-8pz3c")
    vision = ("rn50-ft-k7q2m", "vit-l-9hx4d", "sd-xl-3rp6f", "seg-sam-4nb8x")
    assert rows("project") == [
        ("llm", 6, sum(HELD[r] for r in llm), sum(LOST[r] for r in llm)),
        ("nlp", 1, HELD["bert-pt-2c5nw"], LOST["bert-pt-2c5nw"]),
        ("rl", 1, HELD["rl-ppo-8mc2k"], LOST["rl-ppo-8mc2k"]),
        ("vision", 4, sum(HELD[r] for r in vision), sum(LOST[r] for r in vision)),
        ("speech", 1, HELD["whisper-ft-5gd7s"], LOST["whisper-ft-5gd7s"]),
        (None, 1, HELD[hotfix], 0)]


def test_the_window_selects_runs_by_creation_time(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # NOW is 13:00: --since 2h keeps the runs created from 11:00 (gpt-moe-6wz8r at 11:19:59 onwards)
    data = audit_json(capsys, index, "--since", "2h")
    after_11 = ("gpt-moe-6wz8r", "qwen-rm-5vt2j", "whisper-ft-5gd7s", "gpt-moe-tq3vb", "dpo-sweep-7tj2h",
                "sd-xl-3rp6f")
    assert data["since"] == "2026-08-20T11:00:00.000000Z"
    total = data["total"]
    assert isinstance(total, dict)
    assert (total["runs"], _s(total["gpu_hours"]), _s(total["lost_gpu_hours"]), total["evictions"],
            total["resumes"]) == (6, sum(HELD[r] for r in after_11), sum(LOST[r] for r in after_11), 3, 1)
    same = audit_json(capsys, index, "--since", "2026-08-20T11:00:00Z", "--until", "2026-08-20T13:00")
    assert same["groups"] == data["groups"]
    early = audit_json(capsys, index, "--until", "2026-08-20T09:03:00Z")["total"]
    assert isinstance(early, dict) and (early["runs"], _s(early["gpu_hours"])) == (1, HELD["rn50-ft-k7q2m"])
    assert run(capsys, "audit", "--index", str(index), "--now", NOW, "--since", "2026-08-21") == ""
    assert capsys.readouterr() == ("", "")
    assert main(["audit", "--index", str(index), "--since", "2026-08-21", "--now", NOW]) == 0
    assert capsys.readouterr() == ("", "No runs found.\n")


def test_table_fits_80_columns_and_agrees_with_json(index: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    text = run(capsys, "audit", "--index", str(index), "--now", NOW)
    assert text == (
        "NAMESPACE  RUNS  ATT  EVICT  RETRY  RESUME  GPU-H  LOST-H  GOODPUT  PEND-H\n"
        "team-a        8   10      4      2       1   59.5    20.7    71.2%     1.5\n"
        "team-b        6    9      2      1       0   64.6    20.3    76.4%     1.4\n"
        "TOTAL        14   19      6      3       1  124.1    41.0    73.9%     2.9\n"
        "\n"
        "Goodput ledger, GPU-hours (ETTR of the PROG runs with progress events):\n"
        "NAMESPACE  PROG   ETTR  PROD  START  SAVE  RESTORE  WASTED  RECOVERY  OTHER\n"
        "team-a      4/8  50.5%  42.4    4.0   1.7      0.4    10.1       0.9    0.0\n"
        "team-b      5/6  54.3%  49.4    7.3   1.5      0.5     2.6       3.0    0.3\n"
        "TOTAL      9/14  52.7%  91.8   11.2   3.2      1.0    12.7       4.0    0.3\n")
    data = audit_json(capsys, index)
    assert [f"{100 * g['goodput']:.1f}%" for g in data["groups"]] == ["71.2%", "76.4%"]  # type: ignore[index]
    assert [f"{100 * g['ettr']:.1f}%" for g in data["groups"]] == ["50.5%", "54.3%"]  # type: ignore[index]
    text = run(capsys, "audit", "--index", str(index), "--now", NOW, "--by", "cluster-queue")
    assert text.splitlines()[2] == "-                 1    0      0      0       0    0.0     0.0        -     0.0"
    assert text.splitlines()[-2] == "-               0/1      -   0.0    0.0   0.0      0.0     0.0       0.0    0.0"
    assert all(len(line) <= 80 for line in text.splitlines())


def test_csv_parses_and_carries_the_json_figures(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    groups = audit_json(capsys, index, "--by", "project")["groups"]
    assert isinstance(groups, list)
    text = run(capsys, "audit", "--index", str(index), "--now", NOW, "--by", "project", "-o", "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["project"] for r in rows] == [g["project"] or "" for g in groups]
    assert list(rows[0])[:9] == ["project", "runs", "attempts", "evictions", "pod_retries", "resumes", "gpu_hours",
                                 "lost_gpu_hours", "goodput"]
    for r, g in zip(rows, groups, strict=True):
        assert (int(r["runs"]), int(r["attempts"]), int(r["evictions"]), int(r["pod_retries"]),
                int(r["resumes"])) == (g["runs"], g["attempts"], g["evictions"], g["pod_retries"], g["resumes"])
        assert float(r["gpu_hours"]) == g["gpu_hours"] and float(r["lost_gpu_hours"]) == g["lost_gpu_hours"]
        assert (float(r["goodput"]) if r["goodput"] else None) == g["goodput"]
        assert {k: float(r[f"lost_gpu_hours_{k}"]) for k in LOST_REASONS if float(r[f"lost_gpu_hours_{k}"])} == \
            g["lost_gpu_hours_by"]
        assert {k.removeprefix("evictions_"): int(v) for k, v in r.items()
                if k.startswith("evictions_") and int(v)} == g["evictions_by"]
    llm = rows[0]
    assert (llm["project"], llm["evictions_Preempted"], llm["evictions_PodsReadyTimeout"], llm["worst_run"]) == \
        ("llm", "0", "1", "mixtral-sft-8pz3c")


def test_bad_flags_are_one_line_errors_with_exit_2(index: Path, capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    assert "--since takes a duration" in run(capsys, "audit", "--index", str(index), "--since", "lastweek", code=2)
    assert "--until takes a duration" in run(capsys, "audit", "--index", str(index), "--until", "soon", code=2)
    err = run(capsys, "audit", "--index", str(index), "--since", "1h", "--until", "2h", code=2)
    assert "--until (" in err and "must be after --since" in err
    assert "--by takes one grouping" in run(capsys, "audit", "--index", str(index), "--by", "queue,project", code=2)
    assert "--now must be an ISO-8601 time" in run(capsys, "audit", "--index", str(index), "--now", "x", code=2)
    assert "missing.sqlite" in run(capsys, "audit", "--index", str(tmp_path / "missing.sqlite"), code=2)
    for args in (["--by", "team"], ["-o", "xlsx"], ["--sinc", "1h"]):
        with pytest.raises(SystemExit) as exit_:
            main(["audit", "--index", str(index), *args])
        assert exit_.value.code == 2, args
        assert capsys.readouterr().out == ""


def test_evictions_by_reason_sum_to_the_runs_count() -> None:
    assert LOST_REASONS == gpu.LOST_REASONS
    attempts = [("Submitted", "Preempted"), ("Preempted", None)]
    assert eviction_reasons({"status": "running", "evictions": 1}, attempts) == {"Preempted": 1}
    # the eviction seen only through the re-admission after it: the next attempt's trigger names it
    assert eviction_reasons({"status": "running", "evictions": 1}, [("Submitted", None), ("Preempted", None)]) == \
        {"Preempted": 1}
    # a RayJob retry and an eviction lost to a relist are no Kueue eviction; Kueue's count beyond what was seen is
    assert eviction_reasons({"status": "succeeded", "evictions": 2}, [
        ("Submitted", "AppFailed"), ("RayJobRetry", "x"), ("EvictionNotObserved", "Succeeded")]) == {NOT_OBSERVED: 2}
    final = {"status": "stopped", "reason": "InactiveWorkload", "evictions": 1}
    assert eviction_reasons(final, [("Submitted", "InactiveWorkload")]) == {"InactiveWorkload": 1}
    assert eviction_reasons({"status": "failed", "reason": "BackoffLimitExceeded", "evictions": 0},
                            [("Submitted", "BackoffLimitExceeded")]) == {}


def test_rows_written_before_schema_9_give_the_same_audit(index: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The audit sums the evictions by reason the reducer stored; for rows of an index written before schema 9
    (evictions_by NULL) it derives them from the attempts rows by the reducer's rule: the same figures."""
    import shutil
    import sqlite3

    from tracker.read.store import IndexReader

    with IndexReader(index) as reader:
        runs = reader.runs()
        attempts = reader.attempt_ends(r.run_id for r in runs)
    assert any(r.data["evictions_by"] for r in runs)
    for r in runs:  # the stored counts are what the derivation from the attempts rows gives
        assert r.data["evictions_by"] == eviction_reasons({**r.data, "evictions_by": None},
                                                          attempts.get(r.run_id, ())), r.run_id
    old = tmp_path / "old.sqlite"
    shutil.copy(index, old)
    with sqlite3.connect(old) as conn:
        conn.execute("UPDATE runs SET evictions_by = NULL")
    conn.close()
    for args in (["-o", "json"], ["-o", "csv"], ["--by", "queue", "-o", "json"], []):
        assert run(capsys, "audit", "--index", str(old), "--now", NOW, *args) == \
            run(capsys, "audit", "--index", str(index), "--now", NOW, *args), args
