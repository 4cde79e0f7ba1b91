"""The reducer's evictions by reason (``RunRecord.evictions_by``, history/v5), over generated clusters: they sum to
``evictions`` for every run, and where the watcher saw every change they are the generator's evictions (each
Evicted=True the run's Workload was written with, by its reason). After relists that missed changes they still sum
to ``evictions`` (Kueue's count), a reason the tracker did not see being ``EvictionNotObserved``; ``tracker audit``
sums them (tests/read/test_cli_audit.py)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from hypothesis import given

from sim.lifecycles import STREAMS, RunParams, RunPlan, generate_cluster
from tests.core.test_reducer_laws import _gaps, law_settings, plans, seeds
from tests.support.laws import by_object, fold, histories, interleave, watch_with_gaps
from tracker.core.vocab import EVICTION_NOT_OBSERVED


def _sums(hists: dict[str, Any]) -> list[str]:
    return [f"{run_id}: evictions_by {h['run']['evictions_by']} does not sum to evictions {h['run']['evictions']}"
            for run_id, h in hists.items() if sum(h["run"]["evictions_by"].values()) != h["run"]["evictions"]]


@law_settings(150)
@given(plans(), seeds)
def test_evictions_by_reason_are_the_generators(plan: list[RunPlan], seed: int) -> None:
    cluster = generate_cluster(plan)
    hists = histories(fold(interleave(by_object(cluster.streams), random.Random(seed))))
    assert not _sums(hists)
    for run_id, exp in cluster.expected.items():
        got = hists[run_id]["run"]["evictions_by"]
        assert got == dict(sorted(Counter(reason for _, reason in exp.evicted).items())), (run_id, exp.evicted)
        assert all(n > 0 for n in got.values())


@law_settings(150)
@given(plans(), seeds)
def test_after_relists_they_still_sum_to_kueues_count(plan: list[RunPlan], seed: int) -> None:
    cluster = generate_cluster(plan)
    rng = random.Random(seed)
    delivered = {s: cluster.streams[s] if s == "intake" else
                 watch_with_gaps(cluster.streams[s], _gaps(len(cluster.streams[s]), rng)) for s in STREAMS}
    hists = histories(fold(interleave(by_object(delivered), rng)))
    assert not _sums(hists)
    for run_id, exp in cluster.expected.items():
        if run_id in hists:
            seen = Counter(reason for _, reason in exp.evicted)
            got = hists[run_id]["run"]["evictions_by"]
            assert set(got) <= {*seen, EVICTION_NOT_OBSERVED}, (run_id, got, exp.evicted)
            # a reason is never counted more often than the run was evicted for it
            assert all(got[r] <= seen[r] for r in got if r != EVICTION_NOT_OBSERVED), (run_id, got, exp.evicted)


def test_examples() -> None:
    """A run preempted twice, then deactivated: each eviction under its reason, the deactivation under its own."""
    cluster = generate_cluster([RunPlan(RunParams(kind="Job", evictions=2, eviction_reason="Preempted",
                                                  outcome="deactivated"))])
    (exp,) = cluster.expected.values()
    run = histories(fold(ev for seq in by_object(cluster.streams) for ev in seq))[exp.run_id]["run"]
    assert run["evictions"] == 3 and run["evictions_by"]["Preempted"] == 2
    assert sum(run["evictions_by"].values()) == 3 and run["reason"] in run["evictions_by"]
