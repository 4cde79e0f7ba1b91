"""The reducer's edge: records held for their owner are read when released, and records of any shape are kept safely."""

from __future__ import annotations

import copy
from typing import Any

from sim.scenarios import SCENARIOS
from tests.support.laws import fold, histories
from tracker.core import validate
from tracker.shell import jsonio

Event = dict[str, Any]


def _streams() -> dict[str, list[Event]]:
    return SCENARIOS["quick-success"].streams()


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": [value]}
    return value


def test_a_malformed_record_released_by_its_owner_is_its_own_dead_letter() -> None:
    """A pod held until its Job came is read only then: when it is malformed, the dead letter is the pod's (with its
    own source), the Job folds, and the other pods that waited with it fold too."""
    s = _streams()
    pods = s["pods"]
    bad = copy.deepcopy(pods[0])
    bad["object"]["metadata"]["creationTimestamp"] = "yesterday"
    red = fold([])
    red.apply(bad, "pods:1")
    for i, ev in enumerate(pods[1:], start=2):
        red.apply(ev, f"pods:{i}")
    for ev in s["jobs"]:
        red.apply(ev, "jobs")
    out = red.flush()
    assert [(d.source, d.reason) for d in out.dead_letters] == [("pods:1", "malformed Pod")]
    assert not red.corr.held
    assert histories(red) == histories(fold([*s["jobs"], *pods[1:]]))


def test_a_record_nested_deeply_folds_the_same_held_or_not_and_its_state_encodes() -> None:
    s = _streams()
    pod = copy.deepcopy(s["pods"][-1])
    pod["object"]["spec"]["deep"] = _deep(300)
    assert validate.too_deep(pod)
    red = fold([pod])  # held: its Job is not there yet
    (held,) = red.corr.held_items()
    assert not validate.too_deep(held[2][1])
    jsonio.dumps(red.snapshot())  # the state a replay or the Kafka reducer keeps
    after = fold([*s["jobs"], pod])
    fold(s["jobs"], red)
    assert histories(red) == histories(after)


def test_a_record_nested_thousands_of_levels_deep_is_a_dead_letter_with_an_excerpt() -> None:
    job = copy.deepcopy(_streams()["jobs"][0])
    job["object"]["kind"] = _deep(5000)
    red = fold([job])
    (dead,) = red.flush().dead_letters
    assert dead.reason == "unknown kind" and "kind=a JSON object" in dead.detail and dead.excerpt


def test_pruned_and_brief() -> None:
    assert validate.pruned({"a": [1]}) == {"a": [1]}
    assert validate.pruned({"a": {"b": {"c": 1}}}, limit=2) == {"a": {"b": validate.CUT}}
    assert validate.brief("x" * 100) == repr("x" * 64) + "…"
    assert validate.brief(2**200) == "a very large integer" and validate.brief([1]) == "a JSON array"
