"""A second Job or RayJob claiming a run id that another root already has.

The ``taugrid.io/run-id`` label is TauGrid's identity for a run; a root is one object (one uid). When two roots carry
the same run id (a copy submitted twice, or a Job deleted and re-created under the same name and label: Kubernetes
lets a name be reused, the run id is still taken), the root created first keeps the run (at the same creation time,
the smaller uid), whatever order the records arrive in: the other root and everything that belongs to it are dead
letters ("run id taken by another root", counted in ``Stats.run_id_conflicts``), never merged into the run.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from sim.scenarios import SCENARIOS
from tests.support.laws import by_object, fold, histories, interleave
from tracker.core.reducer import Reducer

CONFLICT = "run id taken by another root"
Event = dict[str, Any]


def _run(scenario: str) -> tuple[str, list[Event], list[Event]]:
    """The run id of a scenario's run, its watch events and its intake events."""
    (run_id,) = SCENARIOS[scenario].run_ids
    streams = SCENARIOS[scenario].streams()
    watch = [ev for name, evs in streams.items() if name != "intake" for ev in evs]
    return run_id, watch, streams["intake"]


def _uids(watch: list[Event]) -> set[str]:
    return {ev["object"]["metadata"]["uid"] for ev in watch}


def _copy(watch: list[Event], *, namespace: str | None = None, created: str, tag: str = "copy") -> list[Event]:
    """The same objects as another submission: every uid of the run changed (and so every reference to one), the
    root's creationTimestamp set to ``created``, optionally in another namespace; the run id label is the same."""
    text = json.dumps(watch)
    for uid in _uids(watch):
        text = text.replace(uid, f"{tag}-{uid[len(tag) + 1:]}")
    if namespace is not None:
        ns = watch[0]["object"]["metadata"]["namespace"]
        text = text.replace(f'"namespace": "{ns}"', f'"namespace": "{namespace}"')
    out: list[Event] = json.loads(text)
    for ev in out:
        if ev["object"]["kind"] in ("Job", "RayJob") and not ev["object"]["metadata"].get("ownerReferences"):
            ev["object"]["metadata"]["creationTimestamp"] = created
    return out


def _fold(records: list[Event]) -> tuple[dict[str, Any], Reducer, list[Any]]:
    red = fold(records)
    dead = red.flush().dead_letters
    return histories(red), red, dead


CASES = {
    # the copy is in another namespace and created an hour later: the original keeps the run
    "Job, copy created later": ("quick-success", "team-z", "2026-08-20T10:02:03Z", False),
    # deleted and re-created under the same name (same namespace) before: the earlier one keeps the run
    "Job, same name, copy created earlier": ("quick-success", None, "2026-08-20T08:02:03Z", True),
    "RayJob, copy created later": ("rayjob-retry", "team-z", "2026-08-20T12:00:00Z", False),
    "RayJob, copy created earlier": ("rayjob-retry", "team-z", "2026-08-20T08:00:00Z", True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_root_created_first_keeps_the_run_whatever_arrives_first(case: str) -> None:
    scenario, namespace, created, copy_wins = CASES[case]
    run_id, watch, intake = _run(scenario)
    copy = _copy(watch, namespace=namespace, created=created)
    winner = copy if copy_wins else watch
    expected = histories(fold([*winner, *intake]))
    assert list(expected) == [run_id]
    loser_uids = _uids(watch if copy_wins else copy)
    seqs = by_object({"a": watch, "b": copy, "intake": intake})
    orders = {"original first": [*watch, *copy, *intake], "copy first": [*copy, *watch, *intake],
              "intake first": [*intake, *copy, *watch]}
    orders |= {f"interleaving {seed}": interleave(seqs, random.Random(seed)) for seed in range(6)}
    for name, order in orders.items():
        got, red, dead = _fold(order)
        assert got == expected, f"{case}, {name}: the history depends on arrival order"
        assert dead, f"{case}, {name}: the second root is not reported"
        assert {d.reason for d in dead} == {CONFLICT}, name
        assert red.stats.run_id_conflicts == len(dead) == red.stats.dead_letters
        assert any(run_id in d.detail and "created" in d.detail for d in dead)
        assert not loser_uids & set(red.corr.owners_of(run_id)), "a uid of the losing root is bound to the run"


def test_the_records_of_the_losing_root_after_it_are_dead_letters_too() -> None:
    run_id, watch, _intake = _run("quick-success")
    copy = _copy(watch, namespace="team-z", created="2026-08-20T10:02:03Z")
    red = fold([*copy, *watch])  # the loser first: folded until the winner takes the run from it
    first = red.flush()
    assert [d.reason for d in first.dead_letters] == [CONFLICT]
    assert "what was folded from its objects is dropped" in first.dead_letters[0].detail
    for ev in copy:  # every record of the loser again (a relist): each one is a dead letter, none is held
        red.apply(ev, "relist")
    again = red.flush()
    assert [d.reason for d in again.dead_letters] == [CONFLICT] * len(copy)
    assert not again.histories and not red.corr.held
    assert red.stats.run_id_conflicts == 1 + len(copy)
    assert red.history(run_id) == fold(watch).history(run_id)


def test_a_tie_on_creation_time_goes_to_the_smaller_uid() -> None:
    run_id, watch, _intake = _run("quick-success")
    created = next(ev for ev in watch if ev["object"]["kind"] == "Job")["object"]["metadata"]["creationTimestamp"]
    low = _copy(watch, namespace="team-y", created=created, tag="0000")
    high = _copy(watch, namespace="team-z", created=created, tag="ffff")
    expected = histories(fold(low))
    assert histories(fold([*high, *low])) == histories(fold([*low, *high])) == expected
    assert expected[run_id]["run"]["namespace"] == "team-y"


def test_a_replay_in_pieces_keeps_the_decision() -> None:
    """The loser folded, the state written to the index and read back (``snapshot_run``/``restore_run``), then the
    winner: the same history as everything at once, and the loser's later records are dead letters (not held)."""
    _run_id, watch, intake = _run("quick-success")
    copy = _copy(watch, namespace="team-z", created="2026-08-20T10:02:03Z")
    jobs = [ev for ev in watch if ev["object"]["kind"] == "Job"]
    red = fold([*copy[: len(copy) // 2], *jobs])
    snaps = [red.snapshot_run(r) for r in red.runs]
    resumed = Reducer()
    for snap in snaps:
        assert snap is not None
        resumed.restore_run(json.loads(json.dumps(snap)))
    fold([*watch, *copy[len(copy) // 2:], *intake], resumed)
    assert histories(resumed) == histories(fold([*watch, *intake]))
    dead = resumed.flush().dead_letters
    assert dead and {d.reason for d in dead} == {CONFLICT}
    assert not resumed.corr.held
