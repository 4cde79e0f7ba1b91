"""Issue 24's outputs: live admission waits up to --now, and every pending second where users look (the runs
table, show, compare, audit, the web view), on the hand-written capture of tests/support/pending_capture.py."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import pytest

from tests.service.test_metrics import values
from tests.support import pending_capture as cap
from tests.support.histories import stored
from tracker.cli import main
from tracker.core import stuck
from tracker.core.limits import ReducerLimits
from tracker.core.model import PendingCategory
from tracker.core.reducer import Reducer
from tracker.core.waits import PENDING_CATEGORIES, admission_wait, pending_by_category
from tracker.read.store import IndexReader
from tracker.runtime.embedded_metrics import EmbeddedMetrics
from tracker.runtime.ops import Metrics
from tracker.runtime.pipeline import PipelineLimits, run_pipeline
from tracker.settings import load_settings
from tracker.shell.capture import Record, capture_files
from tracker.shell.capture import interleave as round_robin
from tracker.ui.pages import run_page

NOW = cap.NOW
NOW_DT = datetime(2026, 8, 20, 10, 30, tzinfo=UTC)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cap.build(tmp_path_factory.mktemp("pending"))


@pytest.fixture(autouse=True)
def _columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # after conftest's _no_env


def run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert err == ""
    return out


def test_the_categories_agree_with_the_model() -> None:
    assert tuple(c.value for c in PendingCategory) == PENDING_CATEGORIES


def test_a_wait_grows_only_while_queued_and_not_admitted() -> None:
    q = datetime(2026, 8, 20, 10, 0, tzinfo=UTC)
    assert admission_wait("pending", q, None, None, NOW_DT) == (1800.0, True)
    assert admission_wait("pending", q, None, None, None) == (None, False)
    assert admission_wait("pending", q, q, 0.0, NOW_DT) == (0.0, False)
    assert admission_wait("stopped", q, None, None, NOW_DT) == (None, False)
    assert admission_wait("pending", None, None, None, NOW_DT) == (None, False)
    by = pending_by_category({"quota": 10.0, "admission-check:prov": 5.0}, "admission-check", q, NOW_DT)
    assert set(by) == set(PENDING_CATEGORIES) and by["admission-check"] == 1805.0 and by["quota"] == 10.0


def test_the_runs_table_shows_a_live_wait_up_to_now(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = run(capsys, "runs", "--index", str(index), "--now", NOW)
    assert all(len(line) <= 80 for line in text.splitlines())
    check = next(line.split() for line in text.splitlines() if cap.CHECK_RUN in line)
    assert check[2:6] == ["Admission", "1", "0", "30m+"]  # queued 10:00:00, never admitted
    retry = next(line.split() for line in text.splitlines() if cap.RETRY_RUN in line)
    assert retry[2:6] == ["Scheduling", "1", "1", "9m"]  # admitted at 10:09:00: an ended wait, no +
    earlier = run(capsys, "runs", "--index", str(index), "--now", "2026-08-20T10:12:00Z")
    assert next(line.split() for line in earlier.splitlines() if cap.CHECK_RUN in line)[5] == "12m+"
    stuck = run(capsys, "runs", "--index", str(index), "--now", NOW, "--stuck", "10m")
    assert cap.CHECK_RUN in stuck and "30m+" in stuck
    stalled = run(capsys, "runs", "--index", str(index), "--now", NOW, "--stalled-admission", "10m")
    assert cap.CHECK_RUN in stalled and "30m+" in stalled and cap.RETRY_RUN not in stalled


def test_wide_and_json_show_the_current_pending_category(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wide = run(capsys, "runs", "--index", str(index), "--now", NOW, "-o", "wide").splitlines()
    head = wide[0].split()
    assert "PENDING" in head
    check = next(line for line in wide if line.startswith(cap.CHECK_RUN))
    assert "admission-check" in check and "30m+" in check
    data = {d["run_id"]: d for d in json.loads(run(capsys, "runs", "--index", str(index), "--now", NOW, "-o",
                                                   "json"))}
    c = data[cap.CHECK_RUN]
    assert (c["admission_wait_s"], c["admission_wait_now_s"], c["admission_wait_growing"]) == (None, 1800.0, True)
    assert (c["pending_category"], c["pending_since"], c["pending_open_s"]) == \
        ("admission-check", "2026-08-20T10:10:00Z", 1200.0)
    assert c["pending_s_by"] == {"queued": 5.0, "quota": 595.0}
    r = data[cap.RETRY_RUN]
    assert (r["admission_wait_now_s"], r["admission_wait_growing"], r["pending_category"]) == \
        (540.0, False, "pod-creation")


def test_show_draws_the_steps_and_the_pending_spans(index: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    out = run(capsys, "show", cap.CHECK_RUN, "--index", str(index), "--now", NOW)
    assert "waiting for admission for 30m00s+" in out
    assert "waiting 30m00s+ for admission" in out  # the attempt's header
    steps = next(line for line in out.splitlines() if line.strip().startswith("steps"))
    assert "◇" in steps and "10:10:00 QuotaReserved (cq-c)" in steps
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("   ")}
    assert "5s" in rows["queued"] and "9m55s" in rows["quota"]
    assert "20m00s+" in rows["adm."] and "admission-check: prov" in rows["adm."]
    assert "↳ pending admission-check:prov 20m00s+, quota 9m55s, queued 5s" in out
    out = run(capsys, "show", cap.RETRY_RUN, "--index", str(index), "--now", NOW)
    steps = next(line for line in out.splitlines() if line.strip().startswith("steps"))
    assert "✕" in steps  # the quota released at 10:05 (the check in Retry): an eviction before any admission
    assert "↳ pending pod-creation 21m00s+, admission-check:prov 5m00s, queued 4m00s" in out
    assert "quota released before admission" in out  # the legend
    # the same history's steps and spans
    with IndexReader(index) as ix:
        h = stored(ix).history(cap.RETRY_RUN)
    assert h is not None
    a = h.attempts[0]
    assert [(s.kind, s.state) for s in a.admission_steps if s.kind == "QuotaReleased"] == [
        ("QuotaReleased", "AdmissionCheck")]
    assert (h.run.attempts, h.run.evictions) == (1, 1)  # not a new attempt, but an eviction


def test_compare_shows_live_waits_and_pending(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(run(capsys, "compare", cap.CHECK_RUN, cap.RETRY_RUN, "--index", str(index), "--now", NOW,
                          "-o", "json"))
    check, retry = data["runs"]
    assert (check["admission_waits_s"], check["admission_wait_growing"]) == ([1800.0], True)
    assert check["pending_s_by"] == {"admission-check:prov": 1200.0, "quota": 595.0, "queued": 5.0}
    assert (retry["admission_waits_s"], retry["admission_wait_growing"]) == ([540.0], False)
    table = run(capsys, "compare", cap.CHECK_RUN, cap.RETRY_RUN, "--index", str(index), "--now", NOW)
    assert "30m00s+" in table and "pending by reason" in table


def test_audit_counts_every_pending_second_by_category(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(run(capsys, "audit", "--index", str(index), "--now", NOW, "-o", "json"))
    total = data["total"]
    # two runs created at 10:00:00, neither running its application at 10:30:00: every second is pending
    assert total["pending_s"] == 2 * 1800.0
    assert list(total["pending_s_by"]) == list(PENDING_CATEGORIES)
    by = {k: v for k, v in total["pending_s_by"].items() if v}
    assert by == {"queued": 5.0 + 240.0, "quota": 595.0, "admission-check": 1200.0 + 300.0, "pod-creation": 1260.0}
    rows = list(csv.DictReader(io.StringIO(run(capsys, "audit", "--index", str(index), "--now", NOW, "-o", "csv"))))
    assert float(rows[0]["pending_s"]) == 3600.0
    assert {c: float(rows[0][f"pending_s_{c}"]) for c in PENDING_CATEGORIES} == total["pending_s_by"]
    table = run(capsys, "audit", "--index", str(index), "--now", NOW)
    first = table.split("\n\n")[0].splitlines()  # then the ledger's table
    assert first[0].split()[-1] == "PEND-H" and first[-1].split()[-1] == "1.0"
    assert all(len(line) <= 80 for line in table.splitlines())
    # the open spans count up to --now
    later = json.loads(run(capsys, "audit", "--index", str(index), "--now", "2026-08-20T11:00:00Z", "-o", "json"))
    assert later["total"]["pending_s"] == 2 * 3600.0


def test_the_run_page_draws_the_steps_and_the_categories(index: Path) -> None:
    with IndexReader(index) as ix:
        check, retry = stored(ix).history(cap.CHECK_RUN), stored(ix).history(cap.RETRY_RUN)
    assert check is not None and retry is not None
    page = run_page(check, now=NOW_DT, note=None)
    assert "waiting 30m00s+ for admission" in page and "30m00s+" in page
    assert 'class="step-reserved"' in page and 'class="step-check waiting"' in page
    assert 'class="pending-admission-check"' in page and 'class="pending-quota"' in page
    assert "check prov Pending: waiting for nodes" in page
    assert "<h2>Pending, by reason</h2>" in page and "admission-check:prov" in page and "20m00s+" in page
    assert "admission-check since 2026-08-20 10:10:00Z" in page
    page = run_page(retry, now=NOW_DT, note=None)
    assert 'class="step-released"' in page and "QuotaReleased (AdmissionCheck)" in page
    assert "check prov Retry: provisioning failed, retrying" in page
    assert "style=" not in page and "<script" not in page


# ------------------------------------------------------------------------------------------ metrics and alerts


def _us(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000)


def test_the_reducer_counts_pending_seconds_and_the_open_spans(tmp_path: Path) -> None:
    """``tracker_pending_seconds_total`` counts the ended spans by category (once each, whatever the batches),
    ``tracker_pending_open_seconds`` the open spans' summed age at the metrics clock (here the wall clock at
    10:30)."""
    capture = tmp_path / "c.jsonl"
    capture.write_text("".join(json.dumps(r) + "\n" for r in cap.records()))
    records = [rec for rec in round_robin(capture_files([capture])) if isinstance(rec, Record)]
    metrics = Metrics("serve-embedded")
    settings = load_settings(None, {"alerts": {"clock": "wall"}})  # both clocks: the wall clock
    gauges = EmbeddedMetrics(metrics, settings, wall_us=lambda: _us(NOW_DT), monotonic=lambda: 0.0)
    reducer = Reducer(ReducerLimits())
    asyncio.run(run_pipeline(records, reducer, sinks=[], limits=PipelineLimits(flush_every=1, replay_flush_every=1),
                             on_flush=gauges.flushed))
    gauges.refresh(reducer.watermark)
    ended = {dict(k)["category"]: v for k, v in values(metrics, "tracker_pending_seconds").items()}
    # run-check: queued 5s, quota 9m55s; run-retry: queued 4m (quota released 10:05 to 10:08, reserved at once
    # at 10:01), admission-check:prov 5m
    assert ended == {"queued": 245.0, "quota": 595.0, "admission-check": 300.0}
    open_ = {dict(k)["category"]: v for k, v in values(metrics, "tracker_pending_open_seconds").items()}
    assert set(open_) == set(PENDING_CATEGORIES)
    assert {k: v for k, v in open_.items() if v} == {"admission-check": 1200.0, "pod-creation": 1260.0}
    # every pending second up to 10:30: two runs queued at 10:00
    assert sum(ended.values()) + sum(open_.values()) == 3600.0
    # the live wait of the run still waiting, as the queue's oldest pending admission
    waits = {dict(k)["queue"]: v for k, v in values(metrics, "tracker_oldest_pending_admission_seconds").items()}
    assert waits == {"team-c/lq-c": 1800.0}


def test_an_admission_alert_carries_the_live_wait_and_the_open_category(index: Path) -> None:
    with IndexReader(index) as ix:
        check, retry = stored(ix).history(cap.CHECK_RUN), stored(ix).history(cap.RETRY_RUN)
    assert check is not None and retry is not None
    s = stuck.stuck_candidate(check)
    assert s is not None and s.phase.value == "Admission"
    alert = json.loads(stuck.stuck_alert(s, _us(NOW_DT), "wall", 600.0).model_dump_json(by_alias=True))
    published = json.loads((Path(__file__).parents[2] / "schemas" / "stuck-run-alert" / "v1.schema.json")
                           .read_text())
    jsonschema.validate(alert, published)
    assert (alert["admission_wait_s"], alert["pending_category"], alert["pending_since"]) == \
        (1800.0, "admission-check", "2026-08-20T10:10:00Z")
    s = stuck.stuck_candidate(retry)
    assert s is not None and s.phase.value == "Scheduling"
    alert = json.loads(stuck.stuck_alert(s, _us(NOW_DT), "wall", 600.0).model_dump_json(by_alias=True))
    assert (alert["admission_wait_s"], alert["pending_category"]) == (None, "pod-creation")  # admitted: no wait


def test_the_runs_page_shows_the_live_wait(index: Path) -> None:
    from tracker.read.filters import RunFilter
    from tracker.ui.pages import runs_page

    with IndexReader(index) as reader:
        body = runs_page(reader, RunFilter(), values={}, now=NOW_DT, stuck_before=NOW_DT, stuck_label="0s")
    row = next(r for r in body.split("<tr") if f">{cap.CHECK_RUN}<" in r)
    assert '<td class="num">30m+</td>' in row
    row = next(r for r in body.split("<tr") if f">{cap.RETRY_RUN}<" in r)
    assert '<td class="num">9m</td>' in row


def test_the_kafka_reducers_policy_counts_each_ended_second_once_and_keeps_it_in_run_state(tmp_path: Path) -> None:
    """``PartitionPolicy.decide`` (the Kafka reducer's decisions) gives the ended pending seconds to count, once
    each whatever the batches; the run-state keeps what was counted, so a restored partition does not count again."""
    from tracker.core.publish import Limits, PartitionPolicy

    capture = tmp_path / "c.jsonl"
    capture.write_text("".join(json.dumps(r) + "\n" for r in cap.records()))
    records = [rec for rec in round_robin(capture_files([capture])) if isinstance(rec, Record)]
    limits = Limits(max_value_bytes=10_000_000, transitions_topic="t", thresholds_s={}, clock="event")
    policy, reducer = PartitionPolicy(), Reducer(ReducerLimits())
    counted: dict[str, float] = {}
    for rec in records:  # a batch per record
        reducer.apply(rec.value, rec.source)
        for category, seconds in policy.decide(reducer.flush(), limits, now_us=None).pending.items():
            counted[category] = counted.get(category, 0.0) + seconds
    assert counted == {"queued": 245.0, "quota": 595.0, "admission-check": 300.0}
    restored = PartitionPolicy()
    for run_id in policy.runs:
        restored.restore_shell(run_id, json.loads(json.dumps(policy.shell_doc(run_id))), retired=False)
    assert {r: s.pending for r, s in restored.runs.items()} == {r: s.pending for r, s in policy.runs.items()}
    again = Reducer(ReducerLimits())
    for rec in records:
        again.apply(rec.value, rec.source)
    assert restored.decide(again.flush(), limits, now_us=None).pending == {}


def test_sort_by_wait_counts_a_live_wait_up_to_now(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def order(now: str) -> list[str]:
        return run(capsys, "runs", "--index", str(index), "--now", now, "--sort-by", "wait", "-o", "name").split()

    assert order(NOW) == [cap.CHECK_RUN, cap.RETRY_RUN]  # waited 30m (and waits on) > 9m
    assert order("2026-08-20T10:05:00Z") == [cap.RETRY_RUN, cap.CHECK_RUN]  # 9m > 5m so far
