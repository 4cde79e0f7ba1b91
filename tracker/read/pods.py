"""A run's pods and the nodes they ran on, as the readers say them: each pod's outcome (failed, evicted, ended,
running), grouped by node ("3 pods failed on node-a (Error exit 1)"). One definition for ``tracker show``,
``tracker compare``, the web view's run page and ``tracker nodes`` (which reads the same stored fields per pod).

A pod **failed** when its attempt lists it among its pod failures (``attempts.failures``: the reason and exit code
are the container's) or its GPU-time was lost as ``PodFailure`` (an attempt lists its first 64 failures only); it
was **evicted** when it was killed from outside (``PodEvicted``: a disruption, a deletion) or its attempt was ended
by Kueue (``Preempted``, ``PodsReadyTimeout``, any other eviction or a deactivation: ``Evicted``; the reason said is
the attempt's end reason). Any other pod **ended** (it finished or was released), is **running** (bound to a node)
or **pending** (not bound to a node yet). The
classification reads the pod's ``lost`` (schemas/gpu-accounting.md) and its attempt's failures and end reason only,
never the clock. Pure functions, standard library and the core model only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

from tracker.core.vocab import LOST_EVICTED, LOST_POD_EVICTED, LOST_POD_FAILURE, LOST_PODS_READY_TIMEOUT, LOST_PREEMPTED

if TYPE_CHECKING:
    from tracker.core.model import RunHistory

FAILED, EVICTED, ENDED, RUNNING, PENDING = "failed", "evicted", "ended", "running", "pending"
#: The outcomes in the order they are said (the worst first); pending: not bound to a node yet.
OUTCOMES = (FAILED, EVICTED, ENDED, RUNNING, PENDING)
#: The GPU-time losses that mean the pod was evicted: killed from outside, or its attempt ended by Kueue.
EVICTION_LOSSES = (LOST_POD_EVICTED, LOST_PREEMPTED, LOST_PODS_READY_TIMEOUT, LOST_EVICTED)
UNSCHEDULED = "(no node)"  # what a pod never bound to a node is said to run on
MAX_GROUPS_SAID = 6  # (node, outcome, reason) groups said per attempt; the rest are counted


class PodOutcome(NamedTuple):
    """One pod of a run: where it ran and how it ended. ``at``: when it failed or was evicted (else finished)."""

    attempt: int
    pod: str
    node: str | None
    outcome: str
    reason: str | None
    at: datetime | None


class NodeGroup(NamedTuple):
    """The pods of one attempt on one node with one outcome and reason."""

    node: str
    outcome: str
    reason: str | None
    pods: int


def classify(*, lost: str | None, failure: str | None, end_reason: str | None,
             finished: bool) -> tuple[str, str | None]:
    """(outcome, reason) of a pod: ``failure`` the reason its attempt lists it with (None: not listed), ``lost`` why
    its GPU-time was lost, ``end_reason`` its attempt's, ``finished`` whether it finished or released its GPUs."""
    if failure is not None:
        return FAILED, failure
    if lost == LOST_POD_FAILURE:
        return FAILED, LOST_POD_FAILURE
    if lost in EVICTION_LOSSES:
        return EVICTED, lost if lost == LOST_POD_EVICTED else (end_reason or lost)
    return (ENDED if finished else RUNNING), None


def failure_text(reason: str, exit_code: int | None) -> str:
    return reason if exit_code is None else f"{reason} exit {exit_code}"


def pod_outcomes(history: RunHistory) -> list[PodOutcome]:
    """Every pod of the run with its outcome, in the history's order (by attempt, then creation)."""
    failures = {(a.attempt, f.pod): f for a in history.attempts for f in a.failures}
    end_reasons = {a.attempt: a.end_reason for a in history.attempts}
    out: list[PodOutcome] = []
    for p in history.pods or ():
        f = failures.get((p.attempt, p.pod))
        outcome, reason = classify(lost=p.lost, failure=None if f is None else failure_text(f.reason, f.exit_code),
                                   end_reason=end_reasons.get(p.attempt),
                                   finished=p.finished_at is not None or p.released_at is not None)
        if outcome == RUNNING and not p.node:
            outcome = PENDING
        at = (f.at if f is not None else None) or p.finished_at or p.released_at
        out.append(PodOutcome(p.attempt, p.pod, p.node, outcome, reason, at))
    return out


def node_groups(pods: Sequence[PodOutcome]) -> list[NodeGroup]:
    """The pods grouped by (node, outcome, reason): failed first, then evicted, ended and running; within an outcome
    the largest group first, then by node."""
    counts: dict[tuple[str, str, str | None], int] = {}
    for p in pods:
        key = (p.node or UNSCHEDULED, p.outcome, p.reason)
        counts[key] = counts.get(key, 0) + 1
    groups = [NodeGroup(node, outcome, reason, n) for (node, outcome, reason), n in counts.items()]
    groups.sort(key=lambda g: (OUTCOMES.index(g.outcome), -g.pods, g.node, g.reason or ""))
    return groups


def group_text(g: NodeGroup, notes: Mapping[str, str] | None = None) -> str:
    """'3 pods failed on node-a (Error exit 1)', '1 pod ended on node-b'; with ``notes`` (node -> what the index
    knows of it, ``tracker.read.nodeinfo.notes``): 'on node-a [NVIDIA-H100-80GB-HBM3 x8]'."""
    text = f"{g.pods} pod{'s' if g.pods != 1 else ''} {g.outcome} {_on(g.node, notes)}"
    return f"{text} ({g.reason})" if g.reason else text


def _on(node: str, notes: Mapping[str, str] | None = None) -> str:
    if node == UNSCHEDULED:
        return "without a node"
    said = (notes or {}).get(node)
    return f"on {node} [{said}]" if said else f"on {node}"


def groups_text(groups: Sequence[NodeGroup], limit: int = MAX_GROUPS_SAID,
                notes: Mapping[str, str] | None = None) -> str:
    """The groups said in one line, at most ``limit`` of them, the rest counted."""
    said = [group_text(g, notes) for g in groups[:limit]]
    rest = len(groups) - limit
    if rest > 0:
        said.append(f"… and {rest} more group{'s' if rest != 1 else ''} ({sum(g.pods for g in groups[limit:])} pods)")
    return ", ".join(said)


def by_attempt(pods: Sequence[PodOutcome]) -> Mapping[int, list[PodOutcome]]:
    out: dict[int, list[PodOutcome]] = {}
    for p in pods:
        out.setdefault(p.attempt, []).append(p)
    return out


def run_nodes(history: RunHistory) -> list[str]:
    """The nodes the run's pods were bound to, each once, in the order first used."""
    return list(dict.fromkeys(p.node for p in history.pods or () if p.node))


def attempt_lines(pods: Sequence[PodOutcome], limit: int = MAX_GROUPS_SAID,
                  notes: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """What ``tracker show`` says of one attempt's pods, as (text, outcome of the worst pod said): a line per failed
    or evicted group (at most ``limit``, the rest counted on one more line), then one line for the pods that ended
    or run, by node ('pods ended: 2 on node-a, 1 on node-b'); each node with its ``notes`` (its GPU model and what is
    wrong with it: 'on node-a [NVIDIA-H100-80GB-HBM3 x8, NotReady since 2026-08-20 10:00Z]') where the index has
    its Node."""
    groups = node_groups(pods)
    bad = [g for g in groups if g.outcome in (FAILED, EVICTED)]
    lines = [(group_text(g, notes), g.outcome) for g in bad[:limit]]
    if len(bad) > limit:
        rest = bad[limit:]
        lines.append((f"… and {sum(g.pods for g in rest)} more pods failed or evicted on "
                      f"{len({g.node for g in rest})} more node(s)", rest[0].outcome))
    for outcome in (ENDED, RUNNING, PENDING):
        same = [g for g in groups if g.outcome == outcome]
        if same:
            said = ", ".join(f"{g.pods} {_on(g.node, notes)}" for g in same[:limit])
            more = len(same) - limit
            lines.append((f"pods {outcome}: {said}" + (f", … and {more} more node(s)" if more > 0 else ""), outcome))
    return lines
