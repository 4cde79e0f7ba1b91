"""Typed decoding of watch events (``tracker.shell.typed``): ``slim_line(text)`` is ``slim_event(jsonio.loads(text))``
for every text, well-formed or not, and a capture replayed through it folds into the same histories and the same
dead letters; a watch stream publishes the same records; the typed path is the one taken for well-formed events."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.lifecycles import generate_stream
from tests.core.test_reducer_input import JOB, added, broken
from tracker.core.reducer import Reducer
from tracker.settings import WatchSettings
from tracker.shell import jsonio, slim, typed
from tracker.shell.capture import AS_WRITTEN, Record, capture_files, interleave
from tracker.shell.kube import Resource
from tracker.shell.slim import META_SHAPE, SHAPES, Shape, slim_event
from tracker.shell.typed import SLIMMED, slim_line
from tracker.shell.watch.stream import Stream, WatchStats

DEMO = Path(__file__).resolve().parents[2] / "tracker" / "captures" / "demo"

SECRETISH = ["password=hunter2", "Authorization: Bearer abcdefghijklmnop", "https://u:p4ss@host/x?sig=abcdef",
             "OOMKilled", "ghp_0123456789abcdefghijklmnopqrstuvwxyz", "Preempted", ""]
LEAF = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats(allow_nan=False) | st.text(max_size=8) | st.sampled_from(SECRETISH))
VALUE = st.recursive(LEAF, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=6) | st.sampled_from(["message", "reason", "token"]), inner,
                                       max_size=3), max_leaves=8)


def rarely(usual: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``usual`` nineteen times in twenty, else ``other``: most objects well-formed, so that both paths are taken."""
    return st.integers(0, 19).flatmap(lambda i: other if i == 0 else usual)


def shaped(shape: Shape, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Objects of ``shape``: each key absent or present, with a value of its shape (null too), or rarely of another
    type; some keys no shape names beside them."""
    def value(sub: Any) -> st.SearchStrategy[Any]:
        if sub is True:
            return VALUE
        if isinstance(sub, list):
            return rarely(st.lists(rarely(shaped(sub[0], depth + 1), LEAF), max_size=3) | st.none(), LEAF)
        return rarely(shaped(sub, depth + 1) | st.none(), LEAF)
    known = st.fixed_dictionaries({}, optional={k: value(sub) for k, sub in shape.items()})
    return st.tuples(known, st.dictionaries(st.sampled_from(["extra", "managedFields", "x"]), VALUE, max_size=2)
                     ).map(lambda kv: {**kv[1], **kv[0]})


LABELS = st.dictionaries(st.sampled_from([*sorted(slim.CHILD_LABELS), "taugrid.io/run-id", "team", "token"]),
                         LEAF, max_size=4)
ANNOTATIONS = st.dictionaries(st.sampled_from(["taugrid.io/config-digest", "taugrid.io/note", "other/secret", "x"]),
                              LEAF, max_size=3)
METADATA = st.tuples(shaped(META_SHAPE), st.fixed_dictionaries({}, optional={"labels": rarely(LABELS, LEAF),
                                                                              "annotations": rarely(ANNOTATIONS, LEAF)})
                     ).map(lambda ma: {**ma[0], **ma[1]})


@st.composite
def objects(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from([*SHAPES, "Secret", None]))
    obj: dict[str, Any] = draw(shaped(SHAPES.get(kind or "", {})))
    if kind is not None:
        obj["kind"] = kind
    if draw(st.booleans()):
        obj["apiVersion"] = draw(st.sampled_from(["v1", "batch/v1", "kueue.x-k8s.io/v1beta2"]) | LEAF)
    if draw(st.integers(0, 5)):
        obj["metadata"] = draw(rarely(METADATA, LEAF))
    return obj


@st.composite
def events(draw: st.DrawFn) -> Any:
    shape = draw(st.integers(0, 9))
    if shape == 0:
        return draw(VALUE)
    if shape == 1:  # an intake event
        return {"schema": "taugrid.intake/v1", "kind": "rendered", "run_id": "r", "message": draw(LEAF)}
    event: dict[str, Any] = {"type": draw(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]) | LEAF)}
    if shape != 2:
        event["object"] = draw(rarely(objects(), LEAF))
    if shape == 3:
        event[draw(st.sampled_from(["extra", "schema", "object2"]))] = draw(VALUE)
    if draw(st.booleans()):
        event = dict(reversed(event.items()))
    return event


def both(text: str) -> tuple[Any, Any]:
    try:
        general: Any = slim_event(jsonio.loads(text))
    except ValueError as exc:
        general = ("ValueError", str(exc))
    try:
        fast: Any = slim_line(text)
    except ValueError as exc:
        fast = ("ValueError", str(exc))
    return general, fast


def test_typed_decoding_is_slimming_the_whole_decoded_value() -> None:
    taken: list[bool] = []  # per example: whether the typed decoder gave the result

    @settings(max_examples=600, deadline=None)
    @given(events(), st.booleans())
    def compare(event: Any, ascii_only: bool) -> None:
        text = json.dumps(event, ensure_ascii=ascii_only)
        general, fast = both(text)
        assert fast == general
        try:
            taken.append(typed._DECODER.decode(text).object is not typed.UNSET)
        except (typed.msgspec.MsgspecError, RecursionError):
            taken.append(False)

    compare()
    assert sum(taken) > len(taken) // 4 and taken.count(False) > len(taken) // 10, (sum(taken), len(taken))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40) | st.sampled_from(['{"type": "ADDED", "object": {"kind": "Job"', '{"type": NaN}',
                                               '{"object": {"kind": "Job", "spec": {"parallelism": 1e400}}}',
                                               '{"object": {"kind": "Pod", "metadata": {"name": "\\ud800"}}}',
                                               '{"object": {"kind": "Job", "spec": 1' + "0" * 5000 + "}}",
                                               '{"object": {"kind": "Job"}, "object": 1}',
                                               '{"object": {"kind": "Job", "kind": "Pod"}}']))
def test_any_text_decodes_or_fails_as_the_general_way_does(text: str) -> None:
    general, fast = both(text)
    assert json.dumps(fast, sort_keys=True) == json.dumps(general, sort_keys=True)  # NaN is not NaN


def demo_lines() -> list[str]:
    return [json.dumps(rec.value) for rec in interleave(capture_files([DEMO])) if isinstance(rec, Record)]


def test_the_demo_capture_and_generated_records_take_the_typed_path_and_slim_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lines = demo_lines() + [json.dumps(r) for r in generate_stream(3_000, seed=11)]
    general = [slim_event(jsonio.loads(text)) for text in lines]
    calls: list[Any] = []
    monkeypatch.setattr(typed, "slim_event", lambda v: calls.append(v) or slim_event(v))
    assert [slim_line(text) for text in lines] == general
    intake = sum(1 for v in general if isinstance(v, dict) and "schema" in v)
    assert len(lines) > 3_000 and intake > 0
    assert len(calls) == intake  # every watch event decoded typed; intake events the general way


MALFORMED = [
    broken(["metadata", "labels"], "not-a-dict"),
    broken(["metadata", "creationTimestamp"], 12),
    broken(["status"], "done"),
    broken(["status", "conditions"], {"type": "Complete"}),
    broken(["status", "conditions"], [None, 3, {"type": "Complete", "status": "True"}]),
    broken(["spec", "parallelism"], "two"),
    broken(["metadata", "ownerReferences"], [{"kind": 1}, "x"]),
    broken(["metadata"], None),
    added({**copy.deepcopy(JOB), "kind": "Secret"}),
    {"type": "ADDED", "object": None},
    {"type": "ADDED"},
    [1, 2],
]


def test_malformed_records_fold_into_the_same_dead_letters_on_both_paths(tmp_path: Path) -> None:
    good = [added(copy.deepcopy(JOB))]
    capture = tmp_path / "mixed.jsonl"
    capture.write_text("".join(json.dumps(v) + "\n" for v in good + MALFORMED + good))

    def fold(decoded: list[Any]) -> tuple[Any, Any]:
        red = Reducer()
        for rec in decoded:
            if isinstance(rec, Record):
                red.apply(rec.value, rec.source)
        flushed = red.flush()
        return flushed.histories, flushed.dead_letters

    typed_records = list(interleave([capture], decoding=SLIMMED))
    general_records = [Record(r.source, slim_event(r.value)) if isinstance(r, Record) else r
                       for r in interleave([capture], decoding=AS_WRITTEN)]
    assert typed_records == general_records
    histories, dead = fold(typed_records)
    assert (histories, dead) == fold(general_records)
    assert len(dead) >= 6 and histories


def _stream(kind: str, emitted: list[Any], dead: list[Any]) -> Stream:
    res = Resource(name=kind.lower() + "s", group="", versions=("v1",), plural=kind.lower() + "s", kind=kind, tier=0)
    return Stream(res, None, api=None, config=WatchSettings(), stats=WatchStats(),  # type: ignore[arg-type]
                  rng=random.Random(0), emit=lambda etype, obj, _src: emitted.append((etype, obj)),
                  dead_letter=lambda *a: dead.append(a), wait_room=_never)


async def _never() -> None:
    return None


def test_a_watch_stream_publishes_the_same_records_from_typed_lines() -> None:
    """A watch line decoded typed (as ``Stream.run`` decodes it) publishes what the whole object, slimmed by the
    stream, publishes: the demo's objects, one without its kind (slimmed once the stream gives it its kind), and
    malformed ones (dead letters either way)."""
    values = [rec.value for rec in interleave(capture_files([DEMO])) if isinstance(rec, Record)
              and isinstance(rec.value, dict) and isinstance(rec.value.get("object"), dict)]
    pod = next(v for v in values if v["object"].get("kind") == "Pod")
    kindless = {"type": "MODIFIED", "object": {k: v for k, v in pod["object"].items() if k != "kind"}}
    no_uid = {"type": "ADDED", "object": {**pod["object"], "metadata": {"name": "x"}}}
    bad_status = {"type": "ADDED", "object": {**pod["object"], "status": "Running"}}
    for value in [*values, kindless, no_uid, bad_status]:
        kind = value["object"].get("kind") or "Pod"
        text = json.dumps(value).encode()
        typed_out: tuple[list[Any], list[Any]] = ([], [])
        general_out: tuple[list[Any], list[Any]] = ([], [])
        _stream(kind, *typed_out).event(slim_line(text), slimmed=True)
        _stream(kind, *general_out).event(jsonio.loads(text))
        assert typed_out == general_out
    assert len(values) > 100


def general_list(text: bytes, kind: str, api_version: str) -> Any:
    """A LIST page as ``Stream.list`` decodes it without the typed decoder, its items slimmed as ``handle`` slims
    them (an item that is not an object is skipped there)."""
    page = jsonio.loads(text)
    items = []
    for item in page.get("items") or []:
        if isinstance(item, dict):
            item["kind"], item["apiVersion"] = kind, api_version
            items.append(slim.slim(item))
    return {**page, "items": items} if "items" in page else page


def test_a_list_page_is_slimmed_as_its_items_are_one_by_one() -> None:
    objs = [rec.value["object"] for rec in interleave(capture_files([DEMO])) if isinstance(rec, Record)
            and isinstance(rec.value, dict) and isinstance(rec.value.get("object"), dict)]
    by_kind: dict[str, list[Any]] = {}
    for obj in objs:
        item = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}  # as a LIST gives them
        by_kind.setdefault(obj["kind"], []).append(item)
    assert {"Job", "Pod", "Workload", "RayJob", "RayCluster", "Event", "Node"} <= by_kind.keys()
    for kind, items in by_kind.items():
        text = json.dumps({"apiVersion": "v1", "kind": f"{kind}List",
                           "metadata": {"resourceVersion": "7", "continue": "abc"}, "items": items}).encode()
        typed_page = typed.slim_list(text, kind, "example/v1")
        assert typed_page is not None and typed_page["items"]
        assert typed_page["items"] == general_list(text, kind, "example/v1")["items"]
        assert typed_page["metadata"] == {"resourceVersion": "7", "continue": "abc"}


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(SHAPES)).flatmap(lambda kind: st.tuples(
    st.just(kind), st.lists(rarely(shaped(SHAPES[kind]).flatmap(
        lambda obj: st.fixed_dictionaries({}, optional={"metadata": rarely(METADATA, LEAF)}).map(
            lambda m: {**obj, **m})), LEAF), max_size=4))),
    st.sampled_from(["items", "missing", "null"]))
def test_any_list_page_is_slimmed_or_left_to_the_general_way(kind_items: tuple[str, list[Any]], form: str) -> None:
    kind, items = kind_items
    page: dict[str, Any] = {"kind": f"{kind}List", "metadata": {"resourceVersion": "1"}}
    if form != "missing":
        page["items"] = items if form == "items" else None
    text = json.dumps(page).encode()
    typed_page = typed.slim_list(text, kind, "v1")
    if typed_page is not None:  # else Stream.list decodes it whole and slims each item as it handles it, as before
        general = general_list(text, kind, "v1")
        assert (typed_page.get("items") or []) == (general.get("items") or [])  # Stream.list reads both so
        assert typed_page["metadata"] == general["metadata"]
