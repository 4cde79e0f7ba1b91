"""The hot-path JSON helpers accept and refuse exactly what the standard library does."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracker.shell import jsonio

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@given(JSON)
def test_round_trips_like_the_standard_library(value: object) -> None:
    encoded = jsonio.dumps(value)
    assert json.loads(encoded) == value
    assert jsonio.loads(encoded) == value
    assert jsonio.loads(json.dumps(value)) == value


def test_the_edges_keep_the_standard_library_behaviour() -> None:
    big = {"n": 2 ** 70, "x": float("nan")}  # orjson alone refuses both
    text = json.dumps(big)
    decoded = jsonio.loads(text)
    assert decoded["n"] == 2 ** 70 and decoded["x"] != decoded["x"]
    for n in (-(2 ** 63) - 1, 2 ** 64, -(2 ** 64), 10 ** 25):  # orjson alone turns these into floats, silently
        for text in (str(n), f"[{n}]", f'{{"n": {n}}}'):
            assert jsonio.loads(text.encode()) == jsonio.loads(text) == json.loads(text)
            assert type(jsonio.loads(str(n))) is int
    assert json.loads(jsonio.dumps({"n": 2 ** 70, 1: "int key"})) == {"n": 2 ** 70, "1": "int key"}
    assert jsonio.dumps({"name": "résumé"}) == '{"name":"résumé"}'.encode()  # UTF-8, not \\u escapes
    for bad in (b"", b"{", b"{'a': 1}", b"\xff"):
        with pytest.raises(ValueError):
            jsonio.loads(bad)


def test_an_encoding_kept_costs_its_own_size() -> None:
    """orjson's output alone would keep a 4 KiB buffer per value (the watcher keeps one per object it knows)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [jsonio.dumps({"kind": "Pod", "name": f"train-{i}", "labels": {"a": "x" * 400}}) for i in range(2_000)]
        per_value = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()
    assert per_value < 2 * len(kept[0]), f"{per_value:.0f} B kept per {len(kept[0])} B encoding"
