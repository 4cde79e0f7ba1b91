"""Issue 25's outputs: the goodput ledger where users look (`tracker show`, `tracker runs -o wide`, `tracker audit`,
the web view's run page), on runs the reducer makes in memory (tests/support/goodput_runs.py, whose ledger is
computed there
by hand): checkpoints and the time lost on the timeline, ETTR, goodput and GPU-hours by category, a live run's open
category counted up to --now, the lineage both ways, a run without progress events said in one line."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console, RenderableType

from sim.builders import at
from tests.read.test_render import failed_after_eviction
from tests.support import goodput_runs as g
from tests.support.histories import ups
from tests.ui.test_ui import _script_or_style
from tracker.cli import main
from tracker.core.model import CheckpointRecord, GoodputCategory, RunHistory, to_json
from tracker.read.audit import audit
from tracker.read.audit import render as audit_render
from tracker.read.render import runs_json
from tracker.read.runs import GOODPUT_CATEGORIES, render
from tracker.read.store import Run
from tracker.read.timeline import timeline
from tracker.shell.index import ExperimentIndex
from tracker.ui.pages import run_page

HOTFIX = "e55428ce-5266-4f6d-8b5d-2ae542ca77c4"  # the preemptor: no progress events, 16 GPUs, nothing lost
HOTFIX_GPU_S = 8 * (1785 + 1783)
END = datetime(2026, 8, 20, 13, 0, tzinfo=UTC)
LIVE_NOW = datetime(2026, 8, 20, 11, 40, tzinfo=UTC)  # bert-pt-2c5nw cut at 11:30, read at 11:40


def text(renderable: RenderableType, width: int = 80) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(renderable)
    return console.export_text()


def gpu_s(by: dict[str, float]) -> dict[str, float]:
    return {k: round(v * 3600, 3) for k, v in by.items() if v}


def row(line: str) -> list[str]:
    return line.split()


def lines_of(out: str, start: str) -> list[str]:
    return [line for line in out.splitlines() if line.lstrip().startswith(start)]


@pytest.fixture(scope="module")
def done() -> RunHistory:
    return g.checkpointed()


@pytest.fixture(scope="module")
def live() -> RunHistory:
    return g.checkpointed(at("11:30:00"))


def test_the_categories_agree_with_the_model() -> None:
    assert tuple(c.value for c in GoodputCategory) == GOODPUT_CATEGORIES


def test_the_constructed_runs_ledger_is_the_one_computed_by_hand(done: RunHistory) -> None:
    r = done.run
    assert (r.ledger_basis, r.ledger_open, r.checkpoints_saved, r.resumed_from) == ("progress", None, 1, g.CKPT)
    assert r.ledger_wall_s_by == {k: float(v) for k, v in sorted(g.WALL.items())}
    assert gpu_s(r.ledger_gpu_hours_by) == dict(sorted(g.GPU_S.items()))
    assert [gpu_s(a.ledger_gpu_hours_by) for a in done.attempts] == [dict(sorted(a.items())) for a in g.ATTEMPT_GPU_S]
    assert r.ettr == pytest.approx(2544 / 6745) and r.goodput == pytest.approx(40_656 / 79_024)
    assert sum(g.WALL.values()) == 6745 and sum(g.GPU_S.values()) == 79_024 == round(r.gpu_hours * 3600)
    assert [(c.kind, c.step, c.status, c.attempt) for c in done.checkpoints] == [("save", 1000, "completed", 1),
                                                                                ("restore", 1000, "completed", 2)]
    assert [(s.category.value, s.start.strftime("%H:%M:%S"), s.end.strftime("%H:%M:%S")) for s in done.ledger] == [
        ("wasted-progress", "10:11:00", "10:40:01"), ("infrastructure-recovery", "10:40:01", "11:12:00"),
        ("checkpoint-restore", "11:12:00", "11:13:00"), ("infrastructure-recovery", "11:13:00", "11:15:00")]


# ------------------------------------------------------------------------------------------ tracker show


def test_show_marks_the_checkpoints_and_draws_the_time_lost_at_80_columns(done: RunHistory) -> None:
    out = text(timeline(done, width=80, resumed_by=[g.RESUMER]))
    assert all(len(line) <= 80 for line in out.splitlines())
    [head] = lines_of(out, "goodput ledger")
    assert "progress events" in head
    [ckpt] = lines_of(out, "checkpoint ")
    [wasted] = lines_of(out, "wasted ")
    [recovery] = lines_of(out, "recovery ")
    bars = slice(14, 14 + 33)  # the bars' columns at 80 (tracker.read.render's layout)
    assert ckpt[bars].strip("●▲ ") == "" and ckpt[bars].count("●") == 1 and ckpt[bars].count("▲") == 1
    assert "1 saved" in ckpt and "saved @1000 10:11:00Z" in ckpt
    # the save's completion is where the wasted progress begins; the wasted progress ends where the recovery begins
    assert ckpt.index("●") == wasted.index("░")
    assert wasted.rindex("░") + 1 == recovery.index("═")
    # the restore (11:12-11:13) is within the recovery (10:40:01-11:15 but the restore)
    assert recovery.index("═") < ckpt.index("▲") <= recovery.rindex("═") + 1
    assert wasted[bars].strip("░ ") == "" and "29m01s" in wasted and "wasted-progress" in wasted
    assert recovery[bars].strip("═ ") == "" and "33m59s" in recovery and "infrastructure-recove" in recovery
    assert lines_of(out, "● ") == ["              ● checkpoint saved   ▲ restored   ░ wasted progress   ═ recovery"]


def test_show_has_a_goodput_section_by_category_and_attempt(done: RunHistory) -> None:
    out = text(timeline(done, width=80, resumed_by=[g.RESUMER]))
    assert "ETTR 37.7% · 42m24s productive of 1h52m since queued\n" in out  # 2544 / 6745 s
    assert "goodput 51.4% · 11.29 of 21.95 GPU-h productive\n" in out  # 40,656 / 79,024 GPU-s
    assert row(lines_of(out, "category ")[0]) == ["category", "GPU-h", "share", "wall", "att", "1", "att", "2"]
    table = {line.split()[0]: row(line)[1:] for line in out.splitlines()
             if line.split() and line.split()[0] in (*GOODPUT_CATEGORIES, "total")}
    assert table == {
        "productive": ["11.29", "51.4%", "42m24s", "1.33", "9.96"],
        "scheduling": ["-", "-", "5s", "-", "-"],
        "startup": ["1.32", "6.0%", "4m56s", "1.32", "-"],
        "checkpoint-save": ["0.27", "1.2%", "1m00s", "0.27", "-"],
        "checkpoint-restore": ["0.27", "1.2%", "1m00s", "-", "0.27"],
        "wasted-progress": ["7.74", "35.3%", "29m01s", "7.74", "-"],
        "infrastructure-recovery": ["1.07", "4.9%", "33m59s", "0.01", "1.06"],
        "total": ["21.95", "1h52m", "10.66", "11.29"],
    }
    assert "checkpoints: 1 saved (last @1000), 1 restored (@1000)\n" in out  # the restore is of the save
    # narrower than the attempts' columns need: the run's figures only, and where the attempts' are
    narrow = text(timeline(done, width=60), width=60)
    assert row(lines_of(narrow, "category ")[0]) == ["category", "GPU-h", "share", "wall"]
    assert "(by attempt: tracker show -o json" in narrow
    assert all(len(line) <= 60 for line in narrow.splitlines())


def test_a_failed_save_is_hollow_and_a_restore_of_another_checkpoint_names_it(done: RunHistory) -> None:
    failed = CheckpointRecord(kind="save", step=2000, uri="s3://b/2000/", started_at=at_dt("10:20:00"),
                              ended_at=at_dt("10:21:00"), status="failed", attempt=1)
    restore = replace(done.checkpoints[1], uri="s3://other-run/1000/")
    h = replace(done, checkpoints=[done.checkpoints[0], failed, restore])
    out = text(timeline(h, width=80))
    [ckpt] = lines_of(out, "checkpoint ")
    assert ckpt.count("○") == 1 and ckpt.index("●") < ckpt.index("○") < ckpt.index("▲")
    assert "saved @1000 10:11:00Z, save @2000 failed 10:21:00Z, restored @1000 11" in text(
        timeline(h, width=200), width=200)
    assert "checkpoints: 1 saved (last @1000), 1 failed, 1 restored (@1000 from \ns3://other-run/1000/)\n" in out
    [legend] = lines_of(out, "● ")
    assert legend.startswith("              ● checkpoint saved   ○ save failed   ▲ restored   ░ wasted progre")


def test_a_live_runs_open_category_counts_up_to_now(live: RunHistory) -> None:
    r = live.run
    assert (r.status.value, r.ledger_open, r.ledger_until, r.gpus_open) == (
        "running", "productive", datetime(2026, 8, 20, 11, 25, tzinfo=UTC), 16)
    out = text(timeline(live, width=80, now=LIVE_NOW))
    # productive: 5m (attempt 1) + 10m to 11:25 + 15m to now; wall 09:59:59 to 11:40:00 (6001 s)
    assert "ETTR 30.0%+ · 30m00s+ productive of 1h40m+ since queued\n" in out
    # GPU-h: 1.33 + 16 x 10m + 16 x 15m up to now
    assert "goodput 42.9%+ · 8.00+ of 18.66+ GPU-h productive\n" in out
    assert row(lines_of(out, "productive ")[0]) == ["productive", "8.00+", "42.9%", "30m00s+", "1.33", "6.67+"]
    assert row(lines_of(out, "total ")[0]) == ["total", "18.66+", "1h40m+", "10.66", "8.00+"]
    # without a now, the ledger as it was written (up to 11:25)
    still = text(timeline(live, width=80, now=None))
    assert "ETTR 17.6% · 15m00s productive of 1h25m since queued\n" in still  # 900 / 5101 s


def test_a_run_waiting_after_its_eviction_grows_its_open_category() -> None:
    h = g.checkpointed(at("11:00:00"))
    assert h.run.status.value == "pending" and h.run.gpus_open == 0
    out = text(timeline(h, width=80, now=datetime(2026, 8, 20, 11, 0, tzinfo=UTC)))
    # nothing holds GPUs: the GPU figures do not grow, the wall time does (to the run's open category)
    assert "goodput 12.5% · 1.33 of 10.66 GPU-h productive\n" in out
    assert "ETTR 8.3%+ · 5m00s productive of 1h00m+ since queued\n" in out
    open_cat = h.run.ledger_open
    assert open_cat is not None
    [line] = [line for line in out.splitlines() if line.startswith(open_cat + " ")]  # the goodput table's
    assert row(line)[3].endswith("+")


def test_a_run_without_progress_events_says_so_in_one_line() -> None:
    out = text(timeline(failed_after_eviction(), width=80))
    [line] = [line for line in out.splitlines() if "no progress events" in line]
    assert line == "goodput - · no progress events: the ledger is the GPU accounting"
    assert "goodput ledger" not in out and "ETTR" not in out
    hotfix = g.reducer().history(HOTFIX)
    assert hotfix is not None and hotfix.run.ledger_basis == "accounting"
    assert "goodput 100.0% · no progress events: the ledger is the GPU accounting\n" in text(timeline(hotfix, 80))


def test_the_lineage_both_ways(done: RunHistory) -> None:
    resumer = g.resumer()
    assert (resumer.run.resume_of, resumer.run.resumed_from) == (g.RUN, g.CKPT)
    out = provenance(timeline(resumer, width=200, resumed_by=[]))
    assert out["resume of"] == f"{g.RUN} (from {g.CKPT})" and out["resumed by"] == "-"
    back = provenance(timeline(done, width=200, resumed_by=[g.RESUMER, "bert-ft-9zz"]))
    assert back["resumed by"] == f"{g.RESUMER}, bert-ft-9zz"
    assert back["resume of"] == "-"  # it restored its own checkpoint: no run's
    assert "resumed by" not in provenance(timeline(done, width=200))  # not known: no row


def provenance(renderable: RenderableType) -> dict[str, str]:
    """The provenance grid's rows, at 200 columns."""
    out = text(renderable, width=200)
    return {m.group(1): m.group(2) for m in re.finditer(r"^(resume of|resumed by) +(.*?) *$", out, re.M)}


# ------------------------------------------------------------------------------------------ runs -o wide


def rows_of(*histories: RunHistory) -> list[Run]:
    """The runs as ``IndexReader.runs`` gives them (the RunRecord fields, JSON values)."""
    return [Run(data, None) for data in runs_json([h.run for h in histories])]


def test_runs_wide_has_an_ettr_column_and_json_the_record_as_is(done: RunHistory, live: RunHistory) -> None:
    hotfix = g.reducer().history(HOTFIX)
    assert hotfix is not None
    out = render(rows_of(done, hotfix), "wide", now=END, width=None, short={})
    header, *lines = out.splitlines()
    at_ = header.index("ETTR")
    assert [line[at_ - 2: at_ + 4].strip() for line in lines] == ["37.7%", "-"]
    out = render(rows_of(live), "wide", now=LIVE_NOW, width=None, short={})
    header, line = out.splitlines()
    assert line[header.index("ETTR") - 2: header.index("ETTR") + 4].strip() == "30.0%+"
    [data] = json.loads(render(rows_of(live), "json", now=LIVE_NOW, width=None, short={}))
    assert (data["ettr"], data["goodput"], data["ledger_open"], data["ledger_until"]) == (
        live.run.ettr, live.run.goodput, "productive", "2026-08-20T11:25:00Z")
    assert data["ledger_gpu_hours_by"] == live.run.ledger_gpu_hours_by  # as recorded, not moved to now


# ------------------------------------------------------------------------------------------ tracker audit


def audit_of(runs: list[Run], now: datetime, by: str = "namespace") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return audit(runs, {}, by=by, now=now)


def test_audit_sums_the_ledger_per_group(done: RunHistory) -> None:
    hotfix, resumer = g.reducer().history(HOTFIX), g.resumer()
    assert hotfix is not None
    groups, total = audit_of(rows_of(done, hotfix, resumer), END)
    [team_a, none] = groups
    assert team_a["namespace"] == "team-a" and none["namespace"] is None
    assert (team_a["runs"], team_a["runs_with_progress"], team_a["runs_without_progress"]) == (2, 1, 1)
    assert (none["runs"], none["runs_with_progress"], none["runs_without_progress"]) == (1, 0, 1)
    expected = dict.fromkeys(GOODPUT_CATEGORIES, 0.0) | {k: float(v) for k, v in g.GPU_S.items()}
    expected["productive"] += HOTFIX_GPU_S
    assert {k: round(v * 3600, 3) for k, v in team_a["ledger_gpu_hours_by"].items()} == expected
    assert team_a["ledger_wall_s_by"] == dict.fromkeys(GOODPUT_CATEGORIES, 0.0) | {k: float(v)
                                                                                  for k, v in g.WALL.items()}
    held = 79_024 + HOTFIX_GPU_S
    assert team_a["goodput"] == pytest.approx((40_656 + HOTFIX_GPU_S) / held)
    assert team_a["gpu_hours"] == pytest.approx(held / 3600)  # the ledger's GPU-time is the GPU-time held
    assert team_a["badput_gpu_hours"] == pytest.approx((79_024 - 40_656) / 3600)
    assert team_a["ettr"] == pytest.approx(2544 / 6745)  # over the run with progress events only
    assert none["ettr"] is None and none["goodput"] is None
    assert (total["runs_with_progress"], total["runs_without_progress"]) == (1, 2)


def test_audit_counts_a_live_runs_open_category_up_to_now(live: RunHistory) -> None:
    [group], _ = audit_of(rows_of(live), LIVE_NOW)
    assert group["ledger_gpu_hours_by"]["productive"] == pytest.approx(8.0)  # 1.33 + 2.67 + 16 GPUs x 15m
    assert group["ledger_wall_s_by"]["productive"] == pytest.approx(1800)
    assert group["ettr"] == pytest.approx(1800 / 6001)
    assert group["gpu_hours"] == pytest.approx(sum(group["ledger_gpu_hours_by"].values()))


def test_audit_table_json_and_csv_carry_the_ledger(done: RunHistory) -> None:
    hotfix = g.reducer().history(HOTFIX)
    assert hotfix is not None
    runs = rows_of(done, hotfix)
    groups, total = audit_of(runs, END)
    window = {"since": None, "until": None, "now": END}
    table = audit_render(groups, total, by="namespace", output="table", window=window, width=80)
    assert all(len(line) <= 80 for line in table.splitlines())
    ledger = table.split("\n\n")[1].splitlines()
    assert ledger[0] == "Goodput ledger, GPU-hours (ETTR of the PROG runs with progress events):"
    assert row(ledger[1]) == ["NAMESPACE", "PROG", "ETTR", "PROD", "START", "SAVE", "RESTORE", "WASTED", "RECOVERY"]
    assert row(ledger[2]) == ["team-a", "1/2", "37.7%", "19.2", "1.3", "0.3", "0.3", "7.7", "1.1"]
    assert row(ledger[3])[0] == "TOTAL"
    assert row(table.splitlines()[1])[8] == f"{100 * (40_656 + HOTFIX_GPU_S) / (79_024 + HOTFIX_GPU_S):.1f}%"
    data = json.loads(audit_render(groups, total, by="namespace", output="json", window=window, width=None))
    assert data["groups"][0]["ettr"] == pytest.approx(2544 / 6745)
    assert data["total"]["ledger_gpu_hours_by"] == groups[0]["ledger_gpu_hours_by"]
    [csv_row] = list(csv.DictReader(io.StringIO(audit_render(groups, total, by="namespace", output="csv",
                                                             window=window, width=None))))
    assert float(csv_row["ettr"]) == groups[0]["ettr"]
    assert (csv_row["runs_with_progress"], csv_row["runs_without_progress"]) == ("1", "1")
    for cat in GOODPUT_CATEGORIES:
        assert float(csv_row[f"ledger_gpu_hours_{cat}"]) == groups[0]["ledger_gpu_hours_by"][cat]
        assert float(csv_row[f"ledger_wall_s_{cat}"]) == groups[0]["ledger_wall_s_by"][cat]
    assert float(csv_row["badput_gpu_hours"]) == groups[0]["badput_gpu_hours"]


@pytest.mark.parametrize("name", ["=HYPERLINK(\"http://x\")", "+1+2", "-2+3", "@SUM(A1)", "\tx", "\rx"])
def test_audit_csv_neutralizes_formulas_in_text_cells(done: RunHistory, name: str) -> None:
    runs = rows_of(done)
    runs[0].data["project"] = name
    runs[0].data["run_id"] = name  # the worst run (it lost GPU-hours)
    groups, total = audit_of(runs, END, by="project")
    text_ = audit_render(groups, total, by="project", output="csv", window={}, width=None)
    [r] = list(csv.DictReader(io.StringIO(text_)))
    safe = "'" + name.replace("\r", "\n")
    assert r["project"] == safe and r["worst_run"] == safe
    plain = audit_of(rows_of(done), END, by="project")
    [r] = list(csv.DictReader(io.StringIO(audit_render(*plain, by="project", output="csv", window={},
                                                       width=None))))
    assert (r["project"], r["worst_run"]) == ("nlp", g.RUN)  # ordinary text as it is


# ------------------------------------------------------------------------------------------ the commands


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, done: RunHistory) -> Path:
    hotfix = g.reducer().history(HOTFIX)
    assert hotfix is not None
    path = tmp_path_factory.mktemp("goodput") / "index.sqlite"
    with ExperimentIndex(path) as ix:
        ix.write(ups([done, g.resumer(), hotfix]))
    return path


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert err == ""
    return out


def test_tracker_show_reads_the_lineage_back_from_the_index(index: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            done: RunHistory) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    out = cli(capsys, "show", g.RUN, "--index", str(index), "--now", "2026-08-20T13:00:00Z")
    assert all(len(line) <= 80 for line in out.splitlines())
    assert f"resumed by                    {g.RESUMER}\n" in out
    assert "ETTR 37.7% · 42m24s productive of 1h52m since queued\n" in out
    assert any(line.lstrip().startswith("checkpoint ") and "●" in line for line in out.splitlines())
    back = cli(capsys, "show", g.RESUMER, "--index", str(index))
    assert f"resume of                     {g.RUN} (from" in back and "resumed by                    -\n" in back
    # -o json is the history itself, its ledger, checkpoints and spans as the reducer made them
    assert json.loads(cli(capsys, "show", g.RUN, "--index", str(index), "-o", "json")) == to_json(done)


def test_tracker_runs_wide_and_audit_read_the_ledger_from_the_index(index: Path, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    wide = cli(capsys, "runs", "--index", str(index), "--now", "2026-08-20T13:00:00Z", "-o", "wide")
    header, *lines = wide.splitlines()
    at_ = header.index("ETTR")
    assert {line.split()[0]: line[at_ - 2: at_ + 4].strip() for line in lines} == {
        g.RUN: "37.7%", HOTFIX: "-", g.RESUMER: "-"}
    [data] = [r for r in json.loads(cli(capsys, "runs", "--index", str(index), "-o", "json"))
              if r["run_id"] == g.RUN]
    assert (data["ettr"], data["ledger_basis"], data["checkpoints_saved"]) == (pytest.approx(2544 / 6745),
                                                                             "progress", 1)
    table = cli(capsys, "audit", "--index", str(index), "--now", "2026-08-20T13:00:00Z")
    assert all(len(line) <= 80 for line in table.splitlines())
    assert row(table.split("\n\n")[1].splitlines()[2]) == ["team-a", "1/2", "37.7%", "19.2", "1.3", "0.3", "0.3",
                                                          "7.7", "1.1"]


# ------------------------------------------------------------------------------------------ the web view


EVIL = "<script>alert(1)</script>&\"'/x"


def test_the_run_page_draws_the_ledger_and_links_the_lineage(done: RunHistory) -> None:
    body = run_page(done, now=END, note=None, resumed_by=[g.RESUMER], now_param="2026-08-20T13:00:00Z")
    assert "<dt>goodput</dt><dd>51.4%</dd>" in body and "<dt>ETTR</dt><dd>37.7%</dd>" in body
    svg = body[body.index('<svg class="timeline"'): body.index("</svg>")]
    assert svg.count('<circle class="ckpt-save"') == 1 + 1 and svg.count('<path class="ckpt-restore"') == 1 + 1
    assert svg.count('<rect class="ledger-wasted-progress"') == 1 + 1  # the span, and the legend's
    assert svg.count('<rect class="ledger-infrastructure-recovery"') == 2 + 1  # the restore cuts it in two
    assert "<title>wasted-progress\n2026-08-20 10:11:00Z → 2026-08-20 10:40:01Z (29m01s)</title>" in svg
    assert f"<title>saved @1000 10:11:00Z (attempt 1)\n{g.CKPT}\n2026-08-20 10:10:00Z → 2026-08-20 10:11:00Z, " \
           "2,000,000,000 bytes</title>" in svg
    ledger = body[body.index('<table class="ledger">'): body.index("</table>", body.index('<table class="ledger">'))]
    assert ('<tr><td class="wasted-progress">wasted-progress</td><td class="num">7.74</td><td class="num">35.3%</td>'
            '<td class="num">29m01s</td><td class="num">7.74</td><td class="num">-</td></tr>') in ledger
    assert "ETTR <strong>37.7%</strong>: 42m24s productive of 1h52m since queued" in body
    link = f'<a href="/runs/{g.RESUMER}?now=2026-08-20T13%3A00%3A00Z" title="{g.RESUMER}">{g.RESUMER}</a>'
    assert f'<p class="lineage">resumed by {link}</p>' in body
    assert f"<th>resumed by</th><td class=\"mono\">{link}</td>" in body
    back = run_page(g.resumer(), now=END, note=None, resumed_by=[])
    assert (f'resume of <a href="/runs/{g.RUN}" title="{g.RUN}">{g.RUN}</a> (from <code>{g.CKPT}</code>)'
            in back)
    assert "no progress events: the ledger is the GPU accounting" in back


def test_the_run_page_escapes_run_ids_and_uris(done: RunHistory) -> None:
    evil_ckpt = CheckpointRecord(kind="save", step=7, uri=EVIL, started_at=None, ended_at=at_dt("10:30:00"),
                                 status="completed", attempt=1)
    h = replace(done, run=replace(done.run, resume_of=EVIL, resumed_from=EVIL),
                checkpoints=[*done.checkpoints, evil_ckpt])
    body = run_page(h, now=END, note=None, resumed_by=[EVIL, g.RESUMER])
    assert _script_or_style(body) == []
    assert "<script" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#x27;/x" in body
    assert re.search(r'<a href="/runs/%3Cscript%3Ealert%281%29%3C%2Fscript%3E%26%22%27%2Fx" '
                     r'title="&lt;script&gt;', body)
    assert "<code>&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#x27;/x</code>" in body


def at_dt(clock: str) -> datetime:
    return datetime.fromisoformat(f"2026-08-20T{clock}+00:00")
