"""Stuck runs as the service sees them (tracker.core.stuck, pure): the same runs, phases, ages and reasons as
`tracker runs --stuck` on an index of the bundled captures; alerts once per (run, attempt, phase); the alert
records against their published schemas; the reducer's run-state keeps what was alerted."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import jsonschema
import pytest
from rich.console import Console

from tests.support.histories import stored
from tracker.cli import main
from tracker.cli.args import DEMO_CAPTURES
from tracker.core import stuck
from tracker.core.model import Phase, RunHistory, RunRecord, Status, Transition
from tracker.core.publish import RunShell
from tracker.core.timefmt import ts
from tracker.read.filters import STUCK_PHASES
from tracker.read.store import IndexReader
from tracker.runtime.replay import replay
from tracker.settings import AlertSettings

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime.fromisoformat("2026-08-20T13:00:00+00:00")  # the end of the bundled capture's day
MIN = 60.0


@pytest.fixture(scope="module")
def histories(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, RunHistory]]:
    path = tmp_path_factory.mktemp("idx") / "index.sqlite"
    replay(captures=[DEMO_CAPTURES], index_path=path, console=Console(quiet=True), quiet=True)
    with IndexReader(path) as ix:
        return path, {r.run_id: h for r in stored(ix).records() if (h := stored(ix).history(r.run_id)) is not None}


def us(at: datetime) -> int:
    value = ts(at)
    assert value is not None
    return value


def thresholds(seconds: float) -> dict[Phase, float]:
    return dict.fromkeys(stuck.STUCK_PHASES, seconds)


def test_the_phases_are_the_clis() -> None:
    assert tuple(p.value for p in stuck.STUCK_PHASES) == STUCK_PHASES
    assert set(AlertSettings().stuck_thresholds_s()) == set(stuck.STUCK_PHASES)


@pytest.mark.parametrize("minutes", [1, 5, 20, 30, 45, 60, 600])
def test_due_runs_are_the_clis_stuck_runs(histories: tuple[Path, dict[str, RunHistory]], minutes: int,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path, by_id = histories
    candidates = [c for h in by_id.values() if (c := stuck.stuck_candidate(h)) is not None]
    due = {s.run_id for s in stuck.due(candidates, us(NOW), thresholds(minutes * MIN), {})}
    assert main(["runs", "--index", str(path), "--now", NOW.isoformat(), "-o", "name", "--stuck", f"{minutes}m"]) == 0
    assert due == set(capsys.readouterr().out.split())


def test_candidates_carry_phase_age_and_the_reason_from_the_objects(
        histories: tuple[Path, dict[str, RunHistory]]) -> None:
    _, by_id = histories
    quota = stuck.stuck_candidate(by_id["qwen-rm-5vt2j"])
    unschedulable = stuck.stuck_candidate(by_id["sd-xl-3rp6f"])
    assert quota is not None and unschedulable is not None
    assert quota.phase == Phase.ADMISSION and quota.since_us == quota.queued_at_us
    assert quota.age_us(us(NOW)) == 36 * 60 * 1_000_000  # queued at 12:24:00
    assert quota.pending_reason is not None and "insufficient unused quota" in quota.pending_message
    assert unschedulable.phase == Phase.SCHEDULING and unschedulable.reason == "Unschedulable"
    assert unschedulable.message.startswith("0/8 nodes are available")
    assert unschedulable.queue.startswith(by_id["sd-xl-3rp6f"].run.namespace or "?")
    # runs that started, or finished, are never candidates
    for h in by_id.values():
        if h.run.status != Status.PENDING or h.run.phase not in stuck.STUCK_PHASES:
            assert stuck.stuck_candidate(h) is None


def _in_runtime(h: RunHistory, waiting: str) -> RunHistory:
    """``h`` cut back to pods bound with containers not started (an image pull that does not end)."""
    cut = next(i for i, t in enumerate(h.transitions) if t.phase == Phase.RUNTIME) + 1
    run = replace(h.run, status=Status.PENDING, phase=Phase.RUNTIME,
                  reason=waiting, message="Back-off pulling image", finished_at=None)
    return replace(h, run=run, transitions=h.transitions[:cut])


def test_a_run_stuck_in_runtime_is_alerted_once_per_attempt_and_phase(
        histories: tuple[Path, dict[str, RunHistory]]) -> None:
    _, by_id = histories
    source = next(h for h in by_id.values() if any(t.phase == Phase.RUNTIME for t in h.transitions))
    h = _in_runtime(source, "ImagePullBackOff")
    s = stuck.stuck_candidate(h)
    assert s is not None and s.phase == Phase.RUNTIME and s.reason == "ImagePullBackOff"
    entered = h.transitions[-1].at
    limits = {Phase.ADMISSION: 60.0, Phase.SCHEDULING: 60.0, Phase.RUNTIME: 600.0}
    assert stuck.due([s], us(entered + timedelta(seconds=599)), limits, {}) == []
    assert stuck.due([s], us(entered + timedelta(seconds=600)), limits, {}) == [s]
    assert stuck.due([s], us(entered + timedelta(hours=5)), limits, {s.run_id: [(s.attempt, Phase.RUNTIME)]}) == []
    # the same attempt stuck in another phase is another alert
    assert stuck.due([s], us(entered + timedelta(hours=5)), limits,
                     {s.run_id: [(s.attempt, Phase.ADMISSION), (s.attempt - 1, Phase.RUNTIME)]}) == [s]
    # a phase without a threshold is never due
    assert stuck.due([s], us(entered + timedelta(days=9)), {Phase.ADMISSION: 1.0}, {}) == []


def test_oldest_per_phase_and_queue(histories: tuple[Path, dict[str, RunHistory]]) -> None:
    _, by_id = histories
    candidates = [c for h in by_id.values() if (c := stuck.stuck_candidate(h)) is not None]
    oldest = stuck.oldest(candidates, us(NOW))
    assert {phase for phase, _ in oldest} <= set(stuck.STUCK_PHASES)
    for (phase, queue), age in oldest.items():
        assert age == max(c.age_us(us(NOW)) for c in candidates if (c.phase, c.queue) == (phase, queue)) / 1e6
    # before a run entered its phase its age is 0, never negative
    assert all(age == 0.0 for age in stuck.oldest(candidates, 0).values())


@pytest.mark.parametrize("run_id", ["qwen-rm-5vt2j", "sd-xl-3rp6f"])
def test_alerts_match_their_published_schema_and_the_stalled_admission_fields(
        histories: tuple[Path, dict[str, RunHistory]], run_id: str) -> None:
    _, by_id = histories
    s = stuck.stuck_candidate(by_id[run_id])
    assert s is not None
    alert = json.loads(stuck.stuck_alert(s, us(NOW), "wall", 1_800.0).model_dump_json(by_alias=True))
    published = json.loads((ROOT / "schemas" / "stuck-run-alert" / "v1.schema.json").read_text())
    jsonschema.validate(alert, published)
    assert alert["schema"] == published["$id"] == "taugrid.io/stuck-run-alert/v1"
    assert alert["phase"] == s.phase.value and alert["age_s"] == s.age_us(us(NOW)) / 1e6
    assert alert["threshold_s"] == 1_800.0 and alert["reason"] == s.reason and alert["clock"] == "wall"
    old = json.loads((ROOT / "schemas" / "stalled-admission-alert" / "v1.schema.json").read_text())
    assert set(old["properties"]) <= set(published["properties"])  # a v1 reader finds every field it knows
    if s.phase == Phase.ADMISSION:  # ... and, in Admission, a record it validates but for the schema id
        legacy = {k: v for k, v in alert.items() if k in old["properties"]}
        jsonschema.validate(legacy | {"schema": old["$id"]}, old)
        assert alert["queued_at"] == alert["since"]


def test_run_state_remembers_alerts_per_phase_and_reads_older_state() -> None:
    shell = RunShell(alerted=[1])  # as an older reducer persisted it: attempts alerted in Admission
    shell.remember_alert(2, Phase.SCHEDULING)
    shell.remember_alert(2, Phase.ADMISSION)
    assert shell.alerted == [1, 2] and shell.alerted_stuck == [(2, Phase.SCHEDULING)]
    assert sorted(shell.alerted_pairs()) == [(1, Phase.ADMISSION), (2, Phase.ADMISSION), (2, Phase.SCHEDULING)]


def test_transition_order_decides_the_phase_entry() -> None:
    """``since`` is the last transition's time, as the CLI's AGE (not the latest time of any transition)."""
    at = datetime.fromisoformat("2026-08-20T10:00:00+00:00")
    t = [Transition(run_id="r", attempt=1, phase=Phase.ADMISSION, at=at + timedelta(minutes=5), reason="Queued",
                    source="Job/ns/r"),
         Transition(run_id="r", attempt=1, phase=Phase.SCHEDULING, at=at, reason="Created", source="Job/ns/r")]
    run = RunRecord(run_id="r", kind="Job", namespace="ns", name="r", uid=None, project=None, workspace=None,
                    target=None, queue="q", cluster_queue=None, status=Status.PENDING, reason="WaitingForPods",
                    phase=Phase.SCHEDULING, attempts=1, retries=0, evictions=0, created_at=at, queued_at=None,
                    admitted_at=None, started_at=None, finished_at=None, admission_wait_s=None)
    s = stuck.stuck_candidate(RunHistory(run=run, transitions=t, attempts=[], metrics=[], resume_links=[]))
    assert s is not None and s.since_us == us(at) and s.queue == "ns/q" and s.queued_at_us is None
