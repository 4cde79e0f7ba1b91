"""`tracker runs` and `tracker show` in kubectl's idiom, on an index of the bundled captures: every filter, every
output, the table's width, run references, errors on stderr only, and a start that imports only what it uses."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import yaml
from rich.console import Console

from tests.support.histories import stored, ups
from tracker.cli import main
from tracker.cli.args import DEMO_CAPTURES
from tracker.cli.parser import build_parser
from tracker.core.model import Phase, RunRecord, Status, field_names
from tracker.core.vocab import PHASES, STATUSES
from tracker.read import store as index_store
from tracker.read.render import runs_json
from tracker.read.runs import NOW_FIELDS, kube_duration
from tracker.read.store import IndexReader
from tracker.runtime.replay import replay
from tracker.shell.index import ExperimentIndex
from tracker.shell.index_schema import SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[2]
NOW = "2026-08-20T13:00:00Z"  # the end of the bundled capture's day
UUID_RUN = "e55428ce-5266-4f6d-8b5d-2ae542ca77c4"  # Job team-a/eval-hotfix-0820


def run(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> str:
    assert main(list(args)) == code, capsys.readouterr().err
    out, err = capsys.readouterr()
    if code:
        assert out == "" and err.startswith("error: ") and len(err.strip().splitlines()) == 1, (out, err)
        return err
    return out


def ids(capsys: pytest.CaptureFixture[str], index: Path, *args: str) -> list[str]:
    return run(capsys, "runs", "--index", str(index), "--now", NOW, "-o", "name", *args).split()


def rows(capsys: pytest.CaptureFixture[str], index: Path, *args: str) -> list[dict[str, object]]:
    """The RunRecord fields of ``runs -o json`` (without what it reads at --now: read.runs.NOW_FIELDS)."""
    data: list[dict[str, object]] = json.loads(run(capsys, "runs", "--index", str(index), "-o", "json", *args))
    return [{k: v for k, v in d.items() if k not in NOW_FIELDS} for d in data]


# ------------------------------------------------------------------------------------------ the table


def test_the_table_fits_80_columns_with_age_and_short_ids_show_accepts(
        index: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    out = run(capsys, "runs", "--index", str(index), "--now", NOW)
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), "\n".join(f"{len(x)}: {x}" for x in lines)
    assert lines[0].split() == ["NAMESPACE", "RUN", "STATUS", "ATT", "EVICT", "WAIT", "AGE", "REASON"]
    assert len(lines) == 1 + len(ids(capsys, index))
    row = next(line for line in lines if line.split()[1].startswith("e55428ce"))
    short = row.split()[1]
    assert short != UUID_RUN and UUID_RUN.startswith(short)
    qwen = next(line for line in lines if "qwen-rm-5vt2j" in line).split()
    # pending in Admission since 12:24:00: its wait (queued then) grows up to --now
    assert qwen[2:7] == ["Admission", "2", "1", "36m+", "36m"]
    shown = run(capsys, "show", short, "--index", str(index), "--now", NOW)
    assert UUID_RUN in shown and "eval-hotfix-0820" in shown


def test_piped_output_is_neither_padded_nor_cut(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "runs", "--index", str(index), "--now", NOW)
    assert all(line == line.rstrip() for line in out.splitlines())
    assert "DeactivatedDueToRequeuingLimitExceeded" in out and "…" not in out
    assert max(len(line) for line in out.splitlines()) < 150


def test_wide_adds_the_rest_and_no_headers_drops_the_header(index: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    wide = run(capsys, "runs", "--index", str(index), "--now", NOW, "-o", "wide")
    header = wide.splitlines()[0].split()
    for column in ("RUN", "KIND", "NAMESPACE", "NAME", "PHASE", "RETRY", "QUEUE", "CLUSTER-QUEUE", "MESSAGE"):
        assert column in header
    assert UUID_RUN in wide and "RayJob" in wide and "eval-hotfix-0820" in wide
    bare = run(capsys, "runs", "--index", str(index), "--now", NOW, "--no-headers", "-n", "team-b")
    assert "RUN" not in bare and "NAMESPACE" not in bare and len(bare.splitlines()) == 6


def test_one_namespace_leaves_out_the_namespace_column(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "runs", "--index", str(index), "-n", "team-a")
    assert out.splitlines()[0].split()[0] == "RUN" and "team-b" not in out


def test_no_runs_says_so_on_stderr(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--index", str(index), "-n", "nowhere", "--now", NOW]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err == "No runs found.\n"
    assert rows(capsys, index, "-n", "nowhere") == []


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (math.nan, "-"), (-5, "<invalid>"), (-0.5, "0s"), (0, "0s"), (119, "119s"), (120, "2m"),
    (330, "5m30s"), (600, "10m"), (179 * 60 + 59, "179m"), (3 * 3600, "3h"), (3 * 3600 + 300, "3h5m"),
    (8 * 3600, "8h"), (47 * 3600, "47h"), (48 * 3600, "2d"), (6 * 86400 + 7200, "6d2h"), (8 * 86400, "8d"),
    (730 * 86400, "2y"), (800 * 86400, "2y70d"), (3000 * 86400, "8y")])
def test_durations_read_as_kubectl_writes_them(seconds: float | None, text: str) -> None:
    assert kube_duration(seconds) == text


# ------------------------------------------------------------------------------------------ filters


def test_namespaces(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    every = ids(capsys, index)
    team_a = ids(capsys, index, "-n", "team-a")
    team_b = ids(capsys, index, "--namespace", "team-b")
    assert team_a and team_b and sorted(team_a + team_b) == sorted(every)
    assert ids(capsys, index, "-n", "team-a", "-n", "team-b") == every
    assert ids(capsys, index, "-A", "-n", "team-a") == every == ids(capsys, index, "--all-namespaces")


def test_label_selectors(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = rows(capsys, index)
    by_project = {r["run_id"] for r in data if r["project"] == "llm"}
    assert set(ids(capsys, index, "-l", "taugrid.io/project=llm")) == by_project
    assert set(ids(capsys, index, "-l", "project==llm")) == by_project
    assert set(ids(capsys, index, "-l", "taugrid.io/project!=llm")) == {r["run_id"] for r in data} - by_project
    both = {r["run_id"] for r in data if r["project"] in ("llm", "vision")}
    assert set(ids(capsys, index, "-l", "taugrid.io/project in (llm, vision)")) == both
    assert set(ids(capsys, index, "-l", "taugrid.io/project notin (llm,vision)")) == {r["run_id"] for r in data} - both
    combined = {r["run_id"] for r in data if r["project"] == "llm" and r["namespace"] == "team-b"}
    assert set(ids(capsys, index, "-l", "taugrid.io/project=llm,taugrid.io/workspace=team-b")) == combined
    assert set(ids(capsys, index, "-l", "taugrid.io/project=llm", "-l", "workspace=team-b")) == combined
    assert set(ids(capsys, index, "--project", "llm", "--workspace", "team-b")) == combined
    # a label of the Job as stored with the run's state (not a column)
    low = ids(capsys, index, "-l", "kueue.x-k8s.io/priority-class=low")
    assert low and "bert-pt-2c5nw" in low
    assert set(ids(capsys, index, "-l", "!kueue.x-k8s.io/priority-class")).isdisjoint(low)
    assert set(ids(capsys, index, "-l", "kueue.x-k8s.io/priority-class")) >= set(low)
    assert ids(capsys, index, "-l", "kueue.x-k8s.io/priority-class=low", "--limit", "1") == low[:1]
    err = run(capsys, "runs", "--index", str(index), "-l", "a in b", code=2)
    assert "not a label selector term" in err


def test_queues_status_and_phase(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = rows(capsys, index)
    assert set(ids(capsys, index, "--queue", "team-a-lq")) == {r["run_id"] for r in data if r["queue"] == "team-a-lq"}
    assert set(ids(capsys, index, "--cluster-queue", "gpu-cq")) == {r["run_id"] for r in data
                                                                      if r["cluster_queue"] == "gpu-cq"}
    assert ids(capsys, index, "--cluster-queue", "none") == []
    pending = {r["run_id"] for r in data if r["status"] == "pending"}
    assert pending == {"qwen-rm-5vt2j", "sd-xl-3rp6f"}
    assert set(ids(capsys, index, "--status", "PENDING")) == pending
    assert ids(capsys, index, "--phase", "admission") == ["qwen-rm-5vt2j"] == ids(capsys, index, "--phase", "ADMISSION")
    assert set(ids(capsys, index, "--phase", "admission,scheduling")) == pending
    assert set(ids(capsys, index, "--phase", "Admission", "--phase", "scheduling")) == pending


def test_unknown_choices_and_abbreviations_are_refused(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--statu", "pending"], ["--phase", "queued"], ["-o", "xml"], ["--sort-by", "colour"],
                 ["--limit", "0"]):
        with pytest.raises(SystemExit) as exit_:
            main(["runs", "--index", str(index), *args])
        assert exit_.value.code == 2, args
        assert capsys.readouterr().out == ""


def test_time_window(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = rows(capsys, index)
    created = {r["run_id"]: r["created_at"] for r in data}
    after_noon = {k for k, v in created.items() if v is not None and v >= "2026-08-20T12:00:00Z"}
    assert set(ids(capsys, index, "--since", "1h")) == after_noon  # NOW is 13:00
    assert set(ids(capsys, index, "--since", "2026-08-20T12:00:00Z")) == after_noon
    assert set(ids(capsys, index, "--since", "2026-08-20T12:00")) == after_noon  # no offset: UTC
    before_ten = {k for k, v in created.items() if v is not None and v < "2026-08-20T10:00:00Z"}
    assert set(ids(capsys, index, "--until", "3h")) == before_ten
    assert set(ids(capsys, index, "--since", "4h", "--until", "3h")) == before_ten
    assert "--since takes a duration" in run(capsys, "runs", "--index", str(index), "--since", "yesterday", code=2)


def test_limit_and_sort(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    newest = ids(capsys, index)
    assert ids(capsys, index, "--limit", "3") == newest[:3]
    # the wait at --now: the recorded one, or up to --now for a run still waiting (qwen-rm-5vt2j, 36m)
    at_now = json.loads(run(capsys, "runs", "--index", str(index), "--now", NOW, "-o", "json"))
    waits = [r["run_id"] for r in sorted((r for r in at_now if r["admission_wait_now_s"] is not None),
                                         key=lambda r: (-float(r["admission_wait_now_s"]), r["run_id"]))]
    assert ids(capsys, index, "--sort-by", "wait")[: len(waits)] == waits
    assert waits[:2] == ["llama-sft-4xq9t", "qwen-rm-5vt2j"]
    assert ids(capsys, index, "--sort-by", "name") == sorted(newest, key=lambda rid: next(
        r["name"] for r in rows(capsys, index) if r["run_id"] == rid))  # type: ignore[arg-type, return-value]
    by_age = ids(capsys, index, "--sort-by", "age")  # longest in its phase first
    assert by_age[0] == "rn50-ft-k7q2m" and by_age[-1] == "sd-xl-3rp6f"


def test_stuck_runs_in_every_phase_before_running(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # qwen-rm-5vt2j waits for quota in Admission since 12:24:00, sd-xl-3rp6f is Unschedulable since 12:51:31
    assert ids(capsys, index, "--stuck", "30m") == ["qwen-rm-5vt2j"]
    assert ids(capsys, index, "--stuck", "5m") == ["qwen-rm-5vt2j", "sd-xl-3rp6f"]  # longest stuck first
    assert ids(capsys, index, "--stuck", "1h") == []
    out = run(capsys, "runs", "--index", str(index), "--now", NOW, "--stuck", "5m")
    assert "Unschedulable: 0/8 nodes are available" in out and "Scheduling" in out and "Admission" in out
    assert "insufficient unused quota for nvidia.com/gpu" in out  # Kueue's pending message, from the Workload
    assert ids(capsys, index, "--stalled-admission", "30m") == ["qwen-rm-5vt2j"]


# ------------------------------------------------------------------------------------------ outputs


def test_json_yaml_and_name_outputs(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with IndexReader(index) as ix:
        expected = runs_json(stored(ix).records())
    assert rows(capsys, index) == expected
    def plain(data: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{k: v for k, v in d.items() if k not in NOW_FIELDS} for d in data]

    assert plain(json.loads(run(capsys, "runs", "--index", str(index), "--json"))) == expected
    assert plain(yaml.safe_load(run(capsys, "runs", "--index", str(index), "-o", "yaml"))) == expected
    assert ids(capsys, index) == [r["run_id"] for r in expected]


# ------------------------------------------------------------------------------------------ show


def test_show_by_prefix_and_by_namespace_name(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert UUID_RUN in run(capsys, "show", "e55", "--index", str(index))
    out = run(capsys, "show", "team-a/eval-hotfix-0820", "--index", str(index))
    assert UUID_RUN in out
    err = run(capsys, "show", "gpt-moe", "--index", str(index), code=1)
    assert "gpt-moe-6wz8r" in err and "gpt-moe-tq3vb" in err
    err = run(capsys, "show", "nope", "--index", str(index), code=1)
    assert "no run 'nope'" in err
    run(capsys, "show", "team-a/nope", "--index", str(index), code=1)


def test_show_notes_when_a_name_had_several_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "index.sqlite"
    replay(captures=[DEMO_CAPTURES], index_path=path, console=Console(quiet=True), quiet=True)
    with ExperimentIndex(path) as ix:
        history = stored(ix).history("vit-l-9hx4d")
        assert history is not None and history.run.created_at is not None
        older = replace(history.run, run_id="vit-l-older", created_at=history.run.created_at.replace(hour=1))
        ix.write(ups([replace(history, run=older, transitions=[], attempts=[], metrics=[], resume_links=[],
                              metric_points=[], pods=[])]))
    assert main(["show", "team-b/vit-l-9hx4d", "--index", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "vit-l-9hx4d" in out.splitlines()[0]
    assert err.startswith("note: team-b/vit-l-9hx4d has 2 runs") and "vit-l-older" in err


def test_show_output_is_the_published_history_schema(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema = json.loads((REPO / "schemas" / "history" / "v5.schema.json").read_text())
    for fmt in ("json", "yaml"):
        text = run(capsys, "show", "gpt-moe-6wz8r", "--index", str(index), "-o", fmt)
        data = json.loads(text) if fmt == "json" else yaml.safe_load(text)
        jsonschema.validate(data, schema)
        assert data["run"]["run_id"] == "gpt-moe-6wz8r" and data["attempts"][0]["attempt"] == 1
    assert json.loads(run(capsys, "show", "gpt-moe-6wz8r", "--index", str(index), "--json"))["run"]["attempts"] == 2
    # the metric curves: every point the run reported (far fewer than reduce.metric_points_per_run), a step
    # reported again after its restart from a checkpoint once (the summaries count every report)
    data = json.loads(run(capsys, "show", "bert-pt-2c5nw", "--index", str(index), "-o", "json"))
    jsonschema.validate(data, schema)
    steps = {(p["metric"], p["step"]) for p in data["metric_points"]}
    reports = sum(m["points"] for m in data["metrics"])
    assert steps and len(steps) == len(data["metric_points"]) and len(steps) <= reports
    assert {(p["metric"], p["step"]) for p in data["metric_points"]} >= {(m["metric"], m["latest_step"])
                                                                        for m in data["metrics"]}
    # and its pods, each with its attempt: as many as the attempts say
    assert data["pods"] and len(data["pods"]) == sum(a["pod_count"] for a in data["attempts"])


def test_a_live_runs_axis_ends_now(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "show", "qwen-rm-5vt2j", "--index", str(index), "--now", "2026-08-20T15:24:00Z")
    assert "→ 2026-08-20 15:24:00Z" in out and "live" in out and "3h00m+" in out
    assert all(line == line.rstrip() for line in out.splitlines())  # piped: not padded


def test_compare(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(run(capsys, "compare", "vit-l-9hx4d", "team-a/bert-pt-2c5nw", "--index", str(index), "-o",
                          "json", "--now", NOW))
    vit, bert = data["runs"]
    assert (vit["run_id"], bert["run_id"]) == ("vit-l-9hx4d", "bert-pt-2c5nw")
    assert vit["evicted_by"] == ["PodsReadyTimeout"] and bert["evicted_by"] == ["Preempted"]
    assert bert["admission_waits_s"][1] == pytest.approx(1799.0, abs=2)
    assert vit["provenance"]["git_commit"] and vit["provenance"]["input_refs"]
    assert set(vit["metrics"]) == {"accuracy", "loss"}
    assert vit["metrics"]["loss"]["min"] <= vit["metrics"]["loss"]["latest"] <= vit["metrics"]["loss"]["max"]
    assert sum(vit["phase_durations_s"].values()) > 0 and "Completion" not in vit["phase_durations_s"]
    live = json.loads(run(capsys, "compare", "qwen-rm-5vt2j", "sd-xl-3rp6f", "--index", str(index), "--json",
                          "--now", NOW))["runs"]
    assert live[1]["phase_durations_s"]["Scheduling"] == pytest.approx(8 * 60 + 29, abs=1)  # up to --now
    table = run(capsys, "compare", "vit-l-9hx4d", "bert-pt-2c5nw", "--index", str(index))
    assert "PodsReadyTimeout" in table and "Preempted" in table and "loss" in table
    assert "no run 'nope'" in run(capsys, "compare", "vit-l-9hx4d", "nope", "--index", str(index), code=1)
    assert "two runs or more" in run(capsys, "compare", "vit-l-9hx4d", "--index", str(index), code=2)


def test_compare_marks_differing_rows_in_a_column_and_reads_lineage_both_ways(
        index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Piped (no colour), a row whose values differ starts with the mark, one whose values agree does not; the run
    that was resumed says by which run, in the table and in the JSON."""
    table = run(capsys, "compare", "gpt-moe-6wz8r", "gpt-moe-tq3vb", "--index", str(index), "--now", NOW)
    lines = {" ".join(line.split()[1:3]) if line.startswith("*") else " ".join(line.split()[:2]): line
             for line in table.splitlines()}
    assert lines["resume of"].startswith("*") and "gpt-moe-6wz8r" in lines["resume of"]
    assert lines["resumed by"].startswith("*") and "gpt-moe-tq3vb" in lines["resumed by"]
    assert lines["target h100-8x"].startswith(" ")  # the same for both
    assert table.rstrip().splitlines()[-1].strip() == "* the runs differ"
    data = json.loads(run(capsys, "compare", "gpt-moe-6wz8r", "gpt-moe-tq3vb", "--index", str(index), "-o", "json",
                          "--now", NOW))["runs"]
    assert [r["provenance"]["resumed_by"] for r in data] == [["gpt-moe-tq3vb"], []]


# ------------------------------------------------------------------------------------------ habits


def test_tracker_index_variable(index: Path, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_INDEX", str(index))
    assert "qwen-rm-5vt2j" in run(capsys, "runs")
    assert "qwen-rm-5vt2j" in run(capsys, "show", "qwen-rm")
    monkeypatch.delenv("TRACKER_INDEX")
    err = run(capsys, "runs", code=2)  # the documented default, absent here
    assert "/var/lib/tracker/index.sqlite" in err


def test_a_reader_that_goes_away_is_no_error(index: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            raise io.UnsupportedOperation("fileno")

    monkeypatch.setattr(sys, "stdout", Gone())
    assert main(["runs", "--index", str(index)]) == 141
    assert capsys.readouterr().err == ""


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("tracker 0.")


def test_every_option_has_help_and_every_command_an_example() -> None:
    import argparse

    parser = build_parser(service_commands=False)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("replay", "runs", "audit", "show", "compare", "demo", "completion"):
        p = sub.choices[name]
        assert p.epilog and f"tracker {name}" in p.epilog, name
        for action in p._actions:
            assert action.help, (name, action.option_strings or action.dest)


def test_completion_scripts(index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bash = run(capsys, "completion", "bash")
    assert "complete -o default -F _tracker tracker" in bash and "--stuck" in bash and "runs -o name" in bash
    script = tmp_path / "c.bash"
    script.write_text(bash)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    # what bash offers, words as typed; run ids come from `tracker runs -o name` on the --index given
    probe = tmp_path / "probe.bash"
    probe.write_text(f"""source {script}
tracker() {{ {sys.executable} -m tracker.cli "$@"; }}
t() {{ COMP_WORDS=("$@"); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=(); _tracker; echo "${{COMPREPLY[*]}}"; }}
t tracker ru
t tracker runs --stu
t tracker runs --phase Sch
t tracker show --index {index} gpt-moe
t tracker au
t tracker audit --by cl
t tracker audit -o c
""")
    lines = subprocess.run(["bash", str(probe)], capture_output=True, text=True, cwd=REPO, timeout=60).stdout
    assert lines.splitlines() == ["runs", "--stuck", "Scheduling", "gpt-moe-tq3vb gpt-moe-6wz8r", "audit",
                                  "cluster-queue", "csv"]
    zsh = run(capsys, "completion", "zsh")
    assert zsh.startswith("#compdef tracker") and "bashcompinit" in zsh


def test_the_readers_constants_match_the_models() -> None:
    assert tuple(field_names(RunRecord)) == index_store.RUN_FIELDS
    assert index_store.KNOWN_SCHEMA_VERSION == SCHEMA_VERSION, "the store reads this schema via the slow path"
    assert tuple(s.value for s in Status) == STATUSES
    assert tuple(p.value for p in Phase) == PHASES


# ------------------------------------------------------------------------------------------ fast start


HEAVY = ("kubernetes_asyncio", "aiokafka", "azure", "aiohttp", "tracker.runtime.service", "tracker.runtime.commands")


def imported(args: list[str]) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRACKER_INDEX"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "tracker.cli", *args], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


def test_readers_import_only_what_they_use(index: Path) -> None:
    for args in (["--help"], ["--version"], ["runs", "--index", str(index)], ["runs", "--index", str(index), "-o",
                                                                                "wide"],
                 ["audit", "--index", str(index), "-o", "csv"]):
        modules = imported(args)
        assert not {m for m in modules if m.split(".")[0] in ("pydantic", "rich") or m.startswith(HEAVY)}, args
    modules = imported(["show", "gpt-moe-6wz8r", "--index", str(index)])
    assert not {m for m in modules if m.startswith(HEAVY)}


@pytest.mark.parametrize("columns", ["80", ""])
def test_the_demo_piped_fits_columns_and_pads_no_line(tmp_path: Path, columns: str) -> None:
    """`./run demo | less` at 80 columns: every line fits, none ends in blanks (150 columns when COLUMNS is unset)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TRACKER_INDEX")}
    if columns:
        env["COLUMNS"] = columns
    proc = subprocess.run([sys.executable, "-m", "tracker.cli", "demo", "--index", str(tmp_path / "demo.sqlite")],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) > 50
    assert max(len(line) for line in lines) <= int(columns or 150)
    assert [line for line in lines if line != line.rstrip()] == []


# ------------------------------------------------------------------------------------------ what ran


def test_show_says_what_ran_within_80_columns_and_whole_in_json(index: Path, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """README "What ran": the image, the entrypoint (cut to the width with an ellipsis) and the hyperparameters in
    the provenance grid of `show`; `show -o json` has the entrypoint whole."""
    monkeypatch.setenv("COLUMNS", "80")
    out = run(capsys, "show", "rn50-ft-k7q2m", "--index", str(index), "--now", NOW)
    assert max(len(line) for line in out.splitlines()) <= 80
    lines = {line.split("  ")[0]: line for line in out.splitlines() if line and not line.startswith(" ")}
    assert lines["images"].split() == ["images", "acr-taugrid.azurecr.io/vision-train:2026.08.19"]
    assert lines["entrypoint"].split()[1:3] == ["torchrun", "'--nnodes=$(NNODES)'"]
    assert lines["entrypoint"].endswith("…")
    assert lines["hyperparameters"].split()[1:3] == ["optim.lr=0.0003,", "optim.weight_decay=0.1,"]
    run_json = json.loads(run(capsys, "show", "rn50-ft-k7q2m", "--index", str(index), "-o", "json"))["run"]
    assert run_json["images"] == ["acr-taugrid.azurecr.io/vision-train:2026.08.19"]
    assert run_json["entrypoint"] == ("torchrun '--nnodes=$(NNODES)' --nproc-per-node=8 -m taugrid.train "
                                      "--config /etc/taugrid/config.yaml")
    assert run_json["hyperparameters"] == {"optim.lr": 0.0003, "optim.weight_decay": 0.1, "seed": 70,
                                           "train.global_batch_size": 1024, "train.grad_checkpointing": True,
                                           "train.precision": "bf16"}
    ray = json.loads(run(capsys, "show", "rl-ppo-8mc2k", "--index", str(index), "-o", "json"))["run"]
    assert ray["entrypoint"] == "python -m taugrid.rl.ppo --config /etc/taugrid/config.yaml"
    assert ray["images"] == ["acr-taugrid.azurecr.io/ray-train:2.49.0-py311-cu128"]


def test_compare_shows_images_entrypoints_and_the_hyperparameters_that_differ(
        index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = run(capsys, "compare", "vit-l-9hx4d", "bert-pt-2c5nw", "--index", str(index), "--now", NOW)

    def line(label: str) -> str | None:
        return next((x for x in table.splitlines() if x[1:].lstrip().startswith(label + " ")), None)

    assert (line("images") or "").startswith("*")
    assert (line("entrypoint") or "").startswith(" ")  # the same command line for both
    assert (line("hp optim.lr") or "").split()[-2:] == ["0.0003", "0.0002"]
    assert line("hp optim.weight_decay") is None and line("hp train.precision") is None  # the same: no row
    data = json.loads(run(capsys, "compare", "vit-l-9hx4d", "bert-pt-2c5nw", "--index", str(index), "-o", "json",
                          "--now", NOW))["runs"]
    assert [r["provenance"]["images"] for r in data] == [["acr-taugrid.azurecr.io/vision-train:2026.08.20-rc1"],
                                                         ["acr-taugrid.azurecr.io/nlp-train:2026.08.20"]]
    assert [r["provenance"]["hyperparameters"]["optim.lr"] for r in data] == [0.0003, 0.0002]
    assert all(r["provenance"]["entrypoint"].endswith("--config /etc/taugrid/config.yaml") for r in data)
