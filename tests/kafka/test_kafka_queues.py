"""Kueue's queues through the Kafka path (issue 24, point 4): ClusterQueue/LocalQueue objects and a position record go
in through ``changes``; `tracker reduce` publishes each queue's newest state and each run's position on
``transitions`` (kinds ``queue`` and ``position``, content-hash deduplicated, kept in ``run-state`` so a new owner
of the partition does not publish them again), and `tracker sink index` writes them with ``write_queues``, so the
index says what a pending run waits behind as the embedded replay's does; `tracker sink adx` (against the Kusto
stand-in) writes the same records as rows of TaugridQueueState and TaugridQueuePositions."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.core.test_queues import cq, ev, lq, position
from tests.kafka.test_kafka_pipeline import (
    DEMO,
    PARTITIONS,
    Service,
    configure,
    create_topics,
    drain_reducer,
    index_rows,
    launch,
    read_topic,
    settle,
)
from tests.support.adx_standin import KustoStandIn
from tracker.cli import main
from tracker.core import wire
from tracker.core.publish import POSITION, QUEUE
from tracker.core.queues import QueuePosition, QueueState
from tracker.core.wire import CONTENT_HASH_HEADER
from tracker.runtime import service
from tracker.runtime.ops import Health, Metrics
from tracker.runtime.replay import replay
from tracker.runtime.sinks import adx_sink_runner
from tracker.settings import Settings, load_settings
from tracker.shell import transitions as transitions_codec
from tracker.shell.adx import NODES, POSITIONS, QUEUES

RUN = "qwen-rm-5vt2j"  # pending in Admission at the end of the demo capture


@pytest.fixture
def services() -> Iterator[list[Service]]:
    """Service processes of a test; whatever is still running at the end is killed."""
    started: list[Service] = []
    yield started
    for s in started:
        if s.proc is not None and s.proc.poll() is None:
            s.kill()


def queue_capture(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


async def queue_records(settings: Settings) -> list[tuple[str, str, bytes, dict[str, str]]]:
    """(kind, key, value, headers) of every queue, position and Node record on transitions, in offset order."""
    out = []
    for rec in await read_topic(settings, settings.kafka.topics.transitions, PARTITIONS):
        headers = {k: v.decode() for k, v in rec.headers or ()}
        if headers.get(wire.KIND_HEADER) in (QUEUE, POSITION, wire.NODE):
            assert rec.key is not None and rec.value is not None
            out.append((headers[wire.KIND_HEADER], rec.key.decode(), rec.value, headers))
    return out


def adx_queues(standin: KustoStandIn) -> dict[str, tuple[Any, ...]]:
    """The newest TaugridQueueState row per key (by Revision, as TaugridQueueStateLatest keeps them)."""
    newest: dict[str, dict[str, Any]] = {}
    for r in standin.tables[QUEUES]:
        if r["Key"] not in newest or r["Revision"] > newest[r["Key"]]["Revision"]:
            newest[r["Key"]] = r
    return {k: (r["Cluster"], r["ResourceVersion"], r["Pending"], r["Stopped"]) for k, r in newest.items()}


def adx_nodes(standin: KustoStandIn) -> dict[str, tuple[Any, ...]]:
    """The newest TaugridNodeState row per node (by Revision, as TaugridNodeStateLatest keeps them)."""
    newest: dict[str, dict[str, Any]] = {}
    for r in standin.tables[NODES]:
        if r["Node"] not in newest or r["Revision"] > newest[r["Node"]]["Revision"]:
            newest[r["Node"]] = r
    return {k: (r["Cluster"], r["ResourceVersion"], r["GpuProduct"], r["GpuCount"]) for k, r in newest.items()}


def adx_position(standin: KustoStandIn) -> tuple[Any, ...] | None:
    """The newest TaugridQueuePositions row, once it is the last poll's."""
    rows = standin.tables[POSITIONS]
    if not rows:
        return None
    r = max(rows, key=lambda row: row["Revision"])
    got = (r["RunId"], r["PositionInClusterQueue"], r["PositionInLocalQueue"], r["PolledAt"])
    return got if got[-1] == "2026-08-20T12:59:30Z" else None


@pytest.mark.kafka
async def test_queues_and_positions_go_through_reduce_and_the_index_sink(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, services: list[Service],
        capsys: pytest.CaptureFixture[str]) -> None:
    settings = configure(monkeypatch, kafka_bootstrap)
    await create_topics(settings)
    first = queue_capture(tmp_path / "queues-1.jsonl", [
        {"apiVersion": "v1", "kind": "List", "items": [cq("10", pending=5), lq()]},  # kubectl get -o json
        ev("MODIFIED", cq("12", pending=3, stop="Hold")), ev("MODIFIED", cq("11", pending=9)),  # 11: older, ignored
        position(at="2026-08-20T12:58:00Z", pos=4), position()])
    captures = [DEMO, first]
    assert await service.publish(service.capture_source(captures, settings.source.max_held), settings) > 0
    await drain_reducer(settings)

    records = await queue_records(settings)
    newest = {key: (kind, value) for kind, key, value, _ in records}
    nodes = {key for key in newest if key.startswith("node:")}
    assert len(nodes) == 8, nodes  # the demo's nodes.json
    assert set(newest) == {"queue:gpu-cq", "queue:team-a/team-a-lq", f"{RUN}/position", *nodes}
    for kind, key, value, headers in records:
        assert headers[CONTENT_HASH_HEADER] == hashlib.sha256(value).hexdigest()
        if kind == wire.NODE:
            assert transitions_codec.decode_node(key.encode(), value, [(wire.KIND_HEADER, b"node")]).key == key
            continue
        item = transitions_codec.decode_queue(key.encode(), value, [(wire.KIND_HEADER, kind.encode())])
        assert isinstance(item, QueueState if kind == QUEUE else QueuePosition)
    gpu_cq = QueueState.from_json(json.loads(newest["queue:gpu-cq"][1]))
    assert (gpu_cq.resource_version, gpu_cq.pending, gpu_cq.stopped) == (12, 3, True)
    pos = QueuePosition.from_json(json.loads(newest[f"{RUN}/position"][1]))
    assert (pos.position_in_cluster_queue, pos.position_in_local_queue) == (2, 1)
    # no two records of a key in a row with one content (the fold of a batch publishes its newest state once)
    by_key: dict[str, list[str]] = {}
    for _, key, _, headers in records:
        by_key.setdefault(key, []).append(headers[CONTENT_HASH_HEADER])
    assert all(len(hashes) == len(set(hashes)) for hashes in by_key.values()), by_key

    # the same queues, position and Nodes again, folded by a new reducer (the partition restored from run-state):
    # the content hashes it restored say nothing changed, so nothing is published
    assert await service.publish(service.capture_source([first, DEMO / "nodes.json"], settings.source.max_held),
                                 settings) > 0
    await drain_reducer(settings)
    assert await queue_records(settings) == records
    run_state = await read_topic(settings, settings.kafka.topics.run_state, PARTITIONS)
    kept = {r.key.decode(): json.loads(r.value) for r in run_state
            if r.key is not None and r.value is not None and dict(r.headers or ()).get("kind") in (b"queue",
                                                                                                   b"position",
                                                                                                   b"node")}
    assert set(kept) == set(newest)
    assert kept["queue:gpu-cq"]["hash"] == hashlib.sha256(newest["queue:gpu-cq"][1]).hexdigest()
    some_node = sorted(nodes)[0]
    assert kept[some_node]["hash"] == hashlib.sha256(newest[some_node][1]).hexdigest()

    # a newer poll: one position record more, nothing else
    later = queue_capture(tmp_path / "queues-2.jsonl", [position(at="2026-08-20T12:59:30Z", pos=1)])
    await service.publish(service.capture_source([later], settings.source.max_held), settings)
    await drain_reducer(settings)
    added = await queue_records(settings)  # in partition order: what is new is what was not there before
    for old in records:
        added.remove(old)
    assert [(kind, key) for kind, key, _, _ in added] == [(POSITION, f"{RUN}/position")]

    # the index sink writes them: the index equals the embedded replay's, queues and positions included
    index = tmp_path / "index.sqlite"
    sink = launch(services, tmp_path, "sink", "sink", "index", "--index", str(index))
    await settle(settings, index, [sink])
    assert sink.terminate() == 0
    await asyncio.to_thread(replay, captures=[*captures, later], index_path=tmp_path / "replay.sqlite",
                            console=Console(file=io.StringIO()), quiet=True)
    rows = index_rows(index)
    assert rows["runs"] and len(rows["queues"]) == 2 and len(rows["queue_positions"]) == 1 and rows["nodes"]
    assert rows == index_rows(tmp_path / "replay.sqlite")
    assert [r[:4] for r in rows["queues"]] == [("queue:gpu-cq", "ClusterQueue", None, "gpu-cq"),
                                                ("queue:team-a/team-a-lq", "LocalQueue", "team-a", "team-a-lq")]

    # and what a pending run waits behind, as `tracker show` says it
    capsys.readouterr()
    assert main(["show", RUN, "--index", str(index), "--now", "2026-08-20T13:00:00Z"]) == 0
    assert "Queue: waiting behind 3 pending workloads in ClusterQueue gpu-cq (nvidia.com/gpu 8/8 used), " \
           "ClusterQueue stopped (Hold), position 1 (1 in LocalQueue team-a-lq)" in capsys.readouterr().out

    # the ADX sink, its own consumer group on the same records: the newest row per queue and per run is the
    # index's state
    standin = KustoStandIn().up()
    try:
        for name, value in {"CLUSTER_URI": standin.url, "AUTH": "none", "DATABASE": "TauGridTest",
                            "SOURCE_CLUSTER": "aks-east-1", "SPOOL_DIR": str(tmp_path / "spool"),
                            "BATCH_MAX_DELAY_S": "0.05"}.items():
            monkeypatch.setenv(f"TRACKER_ADX__{name}", value)
        runner = adx_sink_runner(load_settings(), metrics=Metrics(), health=Health())
        task = asyncio.create_task(runner.run())
        async with asyncio.timeout(60):
            while not (standin.tables["TaugridRunState"] and len(adx_queues(standin)) == 2
                       and adx_position(standin) is not None and len(adx_nodes(standin)) == len(rows["nodes"])):
                assert not task.done(), task.exception()
                await asyncio.sleep(0.1)
        runner.request_stop(drain=True)
        await asyncio.wait_for(task, 60)
    finally:
        standin.down()
    assert adx_queues(standin) == {"queue:gpu-cq": ("aks-east-1", 12, 3, True),
                                   "queue:team-a/team-a-lq": ("aks-east-1", 11, 2, False)}
    assert adx_position(standin) == (RUN, 1, 1, "2026-08-20T12:59:30Z")
    # the Nodes too: the newest row per node is the index's (name, resourceVersion, GPU model and count)
    assert {name: rest[1:] for name, rest in adx_nodes(standin).items()} == {
        r[0]: (r[2], r[5], r[6]) for r in rows["nodes"]}
    assert standin.tables["TaugridRunState"], "and the runs' rows"
