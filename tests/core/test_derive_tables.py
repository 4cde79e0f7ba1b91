"""The derivation rules of ``tracker/core/derive.py`` are tables: check what they must hold.

- the final-status precedence: each rule decides only the statuses it names, together they decide every final
  status, and the first rule whose evidence is present wins (its row order is the precedence);
- the phase-entry rules: every Phase has one, in Phase order, and histories carry only the reasons they list;
- the wait rules: one per phase at most, in Phase order;
- facts held as named tuples still snapshot as plain JSON arrays, with orjson (which refuses a NamedTuple).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import orjson
import pytest

from sim.lifecycles import generate_stream
from sim.scenarios import SCENARIOS
from tests.support.laws import fold
from tracker.core import derive as dv
from tracker.core.derive import derive
from tracker.core.derive_rules import ATTEMPT_PHASES, FINAL_STATUS_RULES, INTAKE_PHASES, WAIT_RULES
from tracker.core.facts import RayOutcome, RunFacts
from tracker.core.model import FINAL_STATUSES, Phase, RunHistory, Status
from tracker.core.reducer import Reducer

ORDER = list(Phase)
T = 1_787_216_400_000_000  # 2026-08-20T09:00:00Z, in microseconds


# ------------------------------------------------------------------------------------------ final status

def _intake_failed(r: RunFacts) -> None:
    r.intake["e1"] = ("Rendering", "failed", T, {"reason": "ValidationFailed", "message": "gpus"})


def _job_complete(r: RunFacts) -> None:
    r.job_conds[("Complete", "True", "CompletionsReached", T + 9)] = ""


def _job_failed(r: RunFacts) -> None:
    r.job_conds[("Failed", "True", "BackoffLimitExceeded", T + 8)] = ""


def _rayjob_finished(r: RunFacts) -> None:
    r.ray_attempt(T + 2).outcome = RayOutcome(T + 7, "Complete", "SUCCEEDED", "", "")


def _workload_finished(r: RunFacts) -> None:
    r.wl_conds[("Finished", "True", "Failed", T + 6)] = "failed"


def _deactivated(r: RunFacts) -> None:
    r.wl_conds[("Admitted", "True", "Admitted", T + 1)] = ""
    r.wl_conds[("Evicted", "True", "InactiveWorkload", T + 5)] = "The workload is deactivated"


def _root_deleted(r: RunFacts) -> None:
    r.root_deleted = T + 4


# rule name -> (evidence, the status and reason it decides)
EVIDENCE: dict[str, tuple[Callable[[RunFacts], None], Status, str]] = {
    "intake-failed": (_intake_failed, Status.FAILED, "ValidationFailed"),
    "job-complete": (_job_complete, Status.SUCCEEDED, "CompletionsReached"),
    "job-failed": (_job_failed, Status.FAILED, "BackoffLimitExceeded"),
    "rayjob-finished": (_rayjob_finished, Status.SUCCEEDED, "Succeeded"),
    "workload-finished": (_workload_finished, Status.FAILED, "Failed"),
    "deactivated": (_deactivated, Status.STOPPED, "InactiveWorkload"),
    "root-deleted": (_root_deleted, Status.STOPPED, "Deleted"),
}


def test_final_rules_are_named_once_and_decide_every_final_status() -> None:
    names = [rule.name for rule in FINAL_STATUS_RULES]
    assert len(set(names)) == len(names)
    assert names == list(EVIDENCE), "the evidence below follows the table's rows"
    decided = set().union(*(rule.statuses for rule in FINAL_STATUS_RULES))
    assert decided == FINAL_STATUSES
    for rule in FINAL_STATUS_RULES:
        assert rule.statuses <= FINAL_STATUSES, rule.name
        assert rule.evidence, rule.name


@pytest.mark.parametrize("first", range(len(FINAL_STATUS_RULES)), ids=[r.name for r in FINAL_STATUS_RULES])
def test_final_rules_precedence_is_the_row_order(first: int) -> None:
    """With the evidence of a rule and of every rule after it, that rule decides."""
    r = RunFacts("run-1")
    for name in list(EVIDENCE)[first:]:
        EVIDENCE[name][0](r)
    rule = FINAL_STATUS_RULES[first]
    _evidence, status, reason = EVIDENCE[rule.name]
    run = derive(r).run
    assert (run.status, run.reason) == (status, reason)
    assert run.status in rule.statuses
    assert run.phase is Phase.COMPLETION


def test_no_final_evidence_no_final_status() -> None:
    r = RunFacts("run-1")
    r.kind, r.created = "Job", T
    r.wl_conds[("Admitted", "True", "Admitted", T + 1)] = ""
    assert derive(r).run.status not in FINAL_STATUSES


# ------------------------------------------------------------------------------------------ phase entries

def test_every_phase_has_an_entry_rule_in_phase_order() -> None:
    rows = [p.phase for p in INTAKE_PHASES] + [p.phase for p in ATTEMPT_PHASES]
    # Completion is also entered once per finished run, by the final status (FINAL_STATUS_RULES)
    assert set(rows) | {Phase.COMPLETION} == set(Phase)
    indexes = [ORDER.index(p) for p in rows]
    assert indexes == sorted(indexes), "rules in Phase order"
    assert len(set(rows)) == len(rows), "one rule per phase"
    for row in ATTEMPT_PHASES:
        assert row.when and (row.reasons or row.other_reasons), row.phase
    assert len({p.kind for p in INTAKE_PHASES}) == len(INTAKE_PHASES)


def _histories() -> Iterator[RunHistory]:
    for sc in SCENARIOS.values():
        red = fold(r for stream in sc.streams().values() for r in stream)
        yield from red.flush().histories
    red = Reducer()
    for rec in generate_stream(400, 5):
        red.apply(rec, "test")
    yield from red.flush().histories


def test_histories_give_only_the_reasons_the_tables_list() -> None:
    closed = {p.phase: set(p.reasons) for p in INTAKE_PHASES}
    closed |= {p.phase: set(p.reasons) for p in ATTEMPT_PHASES if not p.other_reasons}
    seen: dict[Phase, set[str]] = {}
    for h in _histories():
        phases_by_attempt: dict[int, list[Phase]] = {}
        for t in h.transitions:
            seen.setdefault(t.phase, set()).add(t.reason)
            if t.phase in closed:
                assert t.reason in closed[t.phase], (h.run.run_id, t)
            phases_by_attempt.setdefault(t.attempt, []).append(t.phase)
        for attempt, phases in phases_by_attempt.items():
            indexes = [ORDER.index(p) for p in phases]
            assert indexes == sorted(indexes), (h.run.run_id, attempt, phases)
    assert set(seen) == set(Phase), "the samples enter every phase"


# ------------------------------------------------------------------------------------------ waits

def test_wait_rules_one_per_phase_in_order() -> None:
    phases = [w.phase for w in WAIT_RULES]
    assert len(set(phases)) == len(phases)
    assert [ORDER.index(p) for p in phases] == sorted(ORDER.index(p) for p in phases)
    for w in WAIT_RULES:
        assert w.evidence and w.warnings, w.phase
    # a run waits only in a phase before it runs: RUNNING_PHASES come after Admission and Scheduling
    assert all(ORDER.index(p) > ORDER.index(Phase.SCHEDULING) for p in dv.RUNNING_PHASES)


# ------------------------------------------------------------------------------------------ snapshots

@pytest.mark.parametrize("name", ["rayjob-retry", "oom-retry", "unschedulable", "backoff-limit"])
def test_named_tuple_facts_snapshot_with_orjson(name: str) -> None:
    red = fold(r for stream in SCENARIOS[name].streams().values() for r in stream)
    for run_id, r in red.runs.items():
        snap = r.to_json()
        text = orjson.dumps(snap)  # raises for a NamedTuple left in the snapshot
        again = RunFacts.from_json(orjson.loads(text))
        assert orjson.dumps(again.to_json()) == text, run_id
        assert derive(again) == derive(r), run_id
