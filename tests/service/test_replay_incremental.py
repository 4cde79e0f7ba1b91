"""Replay adds to an index, never replaces: captures that arrive in pieces, one `tracker replay` call per piece, leave
the index one call with everything leaves, because the index keeps the reducer's state with the rows."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from sim.lifecycles import generate_stream
from tests.support.histories import stored
from tests.support.laws import object_key
from tracker.cli import main
from tracker.cli.args import DEMO_CAPTURES
from tracker.core.model import HistoryUpdate
from tracker.core.reducer import Reducer
from tracker.read.render import history_json
from tracker.read.store import IndexReader
from tracker.runtime.replay import replay
from tracker.shell import jsonio
from tracker.shell.capture import Record, capture_files, interleave
from tracker.shell.index import ExperimentIndex

Event = dict[str, Any]
HISTORY_TABLES = ("runs", "transitions", "attempts", "pod_placements", "metric_summaries", "resume_links")


def contents(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every history row of the index, sorted (``updated_seq`` aside: it counts writes, not content)."""
    with sqlite3.connect(path) as conn:
        out = {}
        for table in HISTORY_TABLES:
            cur = conn.execute(f"SELECT * FROM {table}")
            names = [d[0] for d in cur.description]
            rows = [tuple(v for n, v in zip(names, row, strict=True) if n != "updated_seq") for row in cur]
            out[table] = sorted(rows, key=repr)
        return out


def write_piece(directory: Path, records: Sequence[Event]) -> list[Path]:
    """One piece of a capture as a cluster's capture would come: a file per kind (no order across files)."""
    directory.mkdir(parents=True)
    by_kind: dict[str, list[Event]] = {}
    for rec in records:
        kind = "intake" if "schema" in rec else rec["object"]["kind"]
        by_kind.setdefault(kind, []).append(rec)
    files = []
    for kind, recs in sorted(by_kind.items()):
        path = directory / f"{kind.lower()}.jsonl"
        path.write_bytes(b"".join(jsonio.dumps(r) + b"\n" for r in recs))
        files.append(path)
    return files


def replay_quietly(paths: Sequence[Path], index: Path) -> int:
    return replay(captures=list(paths), index_path=index, console=Console(quiet=True), quiet=True).rows_changed


def arrival_order(records: Sequence[Event], rng: random.Random) -> list[Event]:
    """A random arrival order that keeps each object's records in their own order."""
    seqs: dict[str, list[Event]] = {}
    for rec in records:
        seqs.setdefault(object_key(rec), []).append(rec)
    cursors = {k: 0 for k in seqs}
    live = list(seqs)
    out = []
    while live:
        key = rng.choice(live)
        out.append(seqs[key][cursors[key]])
        cursors[key] += 1
        if cursors[key] == len(seqs[key]):
            live.remove(key)
    return out


def cut(records: Sequence[Event], pieces: int, rng: random.Random) -> list[list[Event]]:
    points = sorted(rng.sample(range(1, len(records)), min(pieces - 1, len(records) - 1)))
    return [list(records[a:b]) for a, b in zip([0, *points], [*points, len(records)], strict=True)]


@given(seed=st.integers(0, 2**32 - 1), n_runs=st.integers(1, 6), pieces=st.integers(2, 5))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_capture_replayed_in_pieces_leaves_the_index_one_replay_leaves(
        tmp_path_factory: pytest.TempPathFactory, seed: int, n_runs: int, pieces: int) -> None:
    rng = random.Random(seed)
    records = arrival_order(list(generate_stream(n_runs, seed)), rng)
    work = tmp_path_factory.mktemp("pieces")
    whole = work / "whole.sqlite"
    replay_quietly(write_piece(work / "all", records), whole)
    pieced = work / "pieced.sqlite"
    for i, piece in enumerate(cut(records, pieces, rng)):
        replay_quietly(write_piece(work / f"piece-{i}", piece), pieced)
    assert contents(pieced) == contents(whole)
    # and both are what one reducer folding everything derives (not merely equal to each other)
    red = Reducer()
    for rec in records:
        red.apply(rec)
    with IndexReader(pieced) as ix:
        stored = {run_id: ix.history(run_id) for run_id in red.runs}
    assert len(stored) >= n_runs
    assert {k: history_json(v) for k, v in stored.items() if v is not None} == \
        {k: history_json(h) for k in red.runs if (h := red.history(k)) is not None}


def demo_records() -> dict[str, list[Event]]:
    """The bundled capture of one cluster (every scenario), per file, in each file's order."""
    out: dict[str, list[Event]] = {}
    for rec in interleave(capture_files([DEMO_CAPTURES])):
        assert isinstance(rec, Record), rec
        out.setdefault(rec.source.rsplit(":", 1)[0], []).append(rec.value)
    return out


@pytest.mark.parametrize("order", ["as-listed", "reversed", "shuffled"])
def test_every_scenario_replayed_file_by_file_and_in_thirds_equals_one_replay(tmp_path: Path, order: str) -> None:
    whole = tmp_path / "whole.sqlite"
    replay_quietly([DEMO_CAPTURES], whole)
    files = list(demo_records().values())
    if order == "reversed":
        files.reverse()
    elif order == "shuffled":
        random.Random(7).shuffle(files)
    pieced = tmp_path / "pieced.sqlite"
    n = 0
    for records in files:  # each file in three calls: a day's capture, then the next
        for piece in cut(records, 3, random.Random(n)):
            piece_file = tmp_path / f"piece-{n}.jsonl"
            piece_file.write_bytes(b"".join(jsonio.dumps(r) + b"\n" for r in piece))
            replay_quietly([piece_file], pieced)
            n += 1
    assert n >= 15
    assert contents(pieced) == contents(whole)
    assert len(contents(whole)["runs"]) >= 12  # every scenario of the bundled capture


def test_replaying_the_same_capture_again_changes_nothing(tmp_path: Path) -> None:
    index = tmp_path / "index.sqlite"
    assert replay_quietly([DEMO_CAPTURES], index) > 0
    before = contents(index)
    assert replay_quietly([DEMO_CAPTURES], index) == 0
    assert contents(index) == before


@pytest.mark.parametrize("name", sorted(p.name for p in DEMO_CAPTURES.iterdir() if p.suffix in (".json", ".jsonl")))
def test_one_file_replayed_into_the_demo_index_keeps_every_run_whole(tmp_path: Path, name: str) -> None:
    """The case from the field: one stream file of the demo replayed into the demo index cut a run from 11
    transitions, 2 attempts and 2 metrics to 2, 1 and 0."""
    index = tmp_path / "demo.sqlite"
    assert main(["demo", "--index", str(index)]) == 0
    before = contents(index)
    assert main(["replay", str(DEMO_CAPTURES / name), "--index", str(index)]) == 0
    assert contents(index) == before


def test_held_records_wait_across_calls_for_their_owner(tmp_path: Path) -> None:
    """Pods and Events replayed before their Job (another day's file) are kept in the index until it comes."""
    records = demo_records()
    owners = [r for name, recs in records.items() if name.endswith(("jobs.json", "rayjobs.json")) for r in recs]
    others = [r for name, recs in records.items() if not name.endswith(("jobs.json", "rayjobs.json")) for r in recs]
    index = tmp_path / "index.sqlite"
    replay_quietly(write_piece(tmp_path / "first", others), index)
    with sqlite3.connect(index) as conn:
        assert conn.execute("SELECT COUNT(*) FROM reducer_held").fetchone()[0] > 0
    replay_quietly(write_piece(tmp_path / "then", owners), index)
    with sqlite3.connect(index) as conn:
        assert conn.execute("SELECT COUNT(*) FROM reducer_held").fetchone()[0] == 0
    whole = tmp_path / "whole.sqlite"
    replay_quietly([DEMO_CAPTURES], whole)
    assert contents(index) == contents(whole)


def test_replay_refuses_an_index_whose_runs_it_cannot_continue(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Runs written without reducer state (by `tracker sink index`, whose reducer keeps its state in Kafka) would
    be replaced by what the replay's records alone give: refused, in one line, and nothing is written."""
    index = tmp_path / "index.sqlite"
    red = Reducer()
    for records in demo_records().values():
        for rec in records:
            red.apply(rec)
    with ExperimentIndex(index) as ix:
        ix.write(red.flush().updates, {("tracker-sink-index", "transitions", 0): 7})  # as the Kafka sink does
    before = contents(index)
    assert main(["replay", str(DEMO_CAPTURES / "workloads.json"), "--index", str(index)]) == 2
    err = capsys.readouterr().err
    assert "written without the reducer state" in err and "Replay into a new index" in err
    assert len(err.strip().splitlines()) == 1
    assert contents(index) == before


def test_a_history_written_without_state_drops_the_state_kept_for_it(tmp_path: Path) -> None:
    index = tmp_path / "index.sqlite"
    replay_quietly([DEMO_CAPTURES], index)
    with ExperimentIndex(index) as ix:
        assert ix.runs_without_state() == []
        one = stored(ix).history("gpt-moe-6wz8r")
        assert one is not None
        ix.write([HistoryUpdate.of(one)])
        assert ix.runs_without_state() == ["gpt-moe-6wz8r"]


def test_demo_never_deletes_an_index_it_did_not_create(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "mine.sqlite"
    replay_quietly([DEMO_CAPTURES / "jobs.json"], mine)
    before = contents(mine)
    assert main(["demo", "--index", str(mine)]) == 2
    assert "was not made by `tracker demo`" in capsys.readouterr().err
    assert contents(mine) == before
    not_an_index = tmp_path / "notes.txt"
    not_an_index.write_text("my notes\n")
    assert main(["demo", "--index", str(not_an_index)]) == 2
    assert not_an_index.read_text() == "my notes\n"
    whole = tmp_path / "whole.sqlite"
    replay_quietly([DEMO_CAPTURES], whole)
    assert main(["demo", "--index", str(mine), "--force"]) == 0
    assert contents(mine) == contents(whole)
    assert main(["demo", "--index", str(mine)]) == 0  # the demo's own index: replaced without --force
    assert contents(mine) == contents(whole)


def test_the_state_kept_in_the_index_holds_no_secret(tmp_path: Path) -> None:
    """The reducer state in the index holds what the reducer reads, not whole objects: a Pod held for its Job is
    stored slimmed (no env values), and a root's annotations other than TauGrid's are not kept at all."""
    import zlib

    secret = "s3cr3t-VALUE-4242"
    records = demo_records()
    pods = [json_copy(r) for name, recs in records.items() if name.endswith("pods.jsonl") for r in recs]
    for rec in pods:
        for c in rec["object"].get("spec", {}).get("containers", []):
            c["env"] = [{"name": "WANDB_API_KEY", "value": secret}]
    jobs = [json_copy(r) for name, recs in records.items() if name.endswith("jobs.json") for r in recs]
    for rec in jobs:
        meta = rec["object"]["metadata"]
        meta.setdefault("annotations", {})["kubectl.kubernetes.io/last-applied-configuration"] = \
            '{"spec":{"template":{"spec":{"containers":[{"env":[{"name":"TOKEN","value":"' + secret + '"}]}]}}}}'
    index = tmp_path / "index.sqlite"
    replay_quietly(write_piece(tmp_path / "pods", pods), index)  # held: their Jobs come in the next call
    with sqlite3.connect(index) as conn:
        held = [zlib.decompress(b) for (b,) in conn.execute("SELECT record FROM reducer_held")]
    assert held and not any(secret.encode() in b for b in held)
    replay_quietly(write_piece(tmp_path / "jobs", jobs), index)
    with sqlite3.connect(index) as conn:
        states = [zlib.decompress(b) for (b,) in conn.execute("SELECT state FROM reducer_runs")]
        provenance = conn.execute("SELECT COUNT(*) FROM runs WHERE git_commit IS NOT NULL").fetchone()[0]
    assert states and not any(secret.encode() in b for b in states)
    assert provenance > 0  # TauGrid's own annotations are still read


def json_copy(value: Event) -> Event:
    out: Event = jsonio.loads(jsonio.dumps(value))
    return out
