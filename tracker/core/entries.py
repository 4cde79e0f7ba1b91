"""Phase entries per phase of a run's history, for counting ``tracker_transitions_total`` exactly once.

A history is derived anew on every change, and an entry can move in time (a record that arrives late tells an
earlier time) or appear before entries already seen (an intake Rendering event after the Job's admission): the
entries added by a change are therefore not the tail of the list beyond its previous length. What is counted is,
per phase, the growth of the number of the run's entries of that phase.
"""

from __future__ import annotations

from collections.abc import Sequence

from tracker.core.model import Phase, RunHistory

PHASES = tuple(Phase)
_INDEX = {phase: i for i, phase in enumerate(PHASES)}
NONE: tuple[int, ...] = (0,) * len(PHASES)


def phase_entries(history: RunHistory) -> tuple[int, ...]:
    """The number of the history's entries of each phase, in ``PHASES`` order."""
    counts = [0] * len(PHASES)
    for t in history.transitions:
        counts[_INDEX[t.phase]] += 1
    return tuple(counts)


def added(before: Sequence[int], after: Sequence[int]) -> dict[Phase, int]:
    """The entries to count, per phase, going from ``before`` to ``after`` (none for a phase that lost some)."""
    return {phase: a - b for phase, b, a in zip(PHASES, before, after, strict=True) if a > b}
