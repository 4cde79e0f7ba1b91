"""Kueue's queues (issue 24): extraction, the reducer's newest-wins queue state, positions, dead letters, replay of
captures with queue objects into the index, migration from schema 6, and what the readers say. Pure code and SQLite."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tracker.core import extract as x
from tracker.core.queues import QUEUE_POSITION_SCHEMA, extract_queue, position_record, quantity, queue_key
from tracker.core.reducer import Reducer
from tracker.read.queues import gpu_usage, queue_context, short, text
from tracker.read.store import IndexReader
from tracker.shell.capture import Record
from tracker.shell.index import ExperimentIndex
from tracker.shell.index_schema import MIGRATIONS, SCHEMA_VERSION, statements
from tracker.shell.slim import slim
from tracker.shell.watch.keying import RunKeyer

Obj = dict[str, Any]
DEMO = Path(__file__).resolve().parents[2] / "tracker" / "captures" / "demo"


def cq(rv: str = "10", *, pending: int = 3, used: str = "8", stop: str | None = None, active: str = "True",
       reason: str = "Ready", name: str = "gpu-cq") -> Obj:
    spec: Obj = {"cohortName": "all", "admissionChecksStrategy": {"admissionChecks": [{"name": "prov"}]},
                 "resourceGroups": [{"coveredResources": ["nvidia.com/gpu", "cpu"], "flavors": [
                     {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "8"},
                                                    {"name": "cpu", "nominalQuota": "96", "borrowingLimit": "8"}]}]}]}
    if stop is not None:
        spec["stopPolicy"] = stop
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": name, "uid": "cq-uid", "resourceVersion": rv,
                         "creationTimestamp": "2026-08-20T09:00:00Z", "managedFields": [{"x": 1}]},
            "spec": spec,
            "status": {"pendingWorkloads": pending, "reservingWorkloads": 1, "admittedWorkloads": 1,
                       "flavorsReservation": [{"name": "h100",
                                               "resources": [{"name": "nvidia.com/gpu", "total": used}]}],
                       "flavorsUsage": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": used},
                                                                      {"name": "cpu", "total": "500m"}]}],
                       "conditions": [{"type": "Active", "status": active, "reason": reason, "message": "m",
                                       "lastTransitionTime": "2026-08-20T09:00:05Z"}]}}


def lq(rv: str = "11", *, stop: str | None = None) -> Obj:
    spec: Obj = {"clusterQueue": "gpu-cq"}
    if stop is not None:
        spec["stopPolicy"] = stop
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
            "metadata": {"name": "team-a-lq", "namespace": "team-a", "uid": "lq-uid", "resourceVersion": rv,
                         "creationTimestamp": "2026-08-20T09:00:00Z"},
            "spec": spec,
            "status": {"pendingWorkloads": 2, "reservingWorkloads": 0, "admittedWorkloads": 1,
                       "flavorUsage": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": 4}]}]}}


def position(run_id: str = "qwen-rm-5vt2j", at: str = "2026-08-20T12:59:00Z", pos: int | None = 2) -> Obj:
    return position_record(run_id=run_id, namespace="team-a", workload="job-qwen-rm-5vt2j", cluster_queue="gpu-cq",
                           local_queue="team-a-lq", position_in_cluster_queue=pos,
                           position_in_local_queue=None if pos is None else 1, polled_at=at)


def ev(etype: str, obj: Obj) -> Obj:
    return {"type": etype, "object": obj}


def test_cluster_queue_facts() -> None:
    s = extract_queue("ADDED", cq())
    assert (s.key, s.kind, s.name, s.namespace, s.cluster_queue, s.cohort) == \
        ("queue:gpu-cq", "ClusterQueue", "gpu-cq", None, "gpu-cq", "all")
    assert (s.pending, s.reserving, s.admitted, s.resource_version) == (3, 1, 1, 10)
    assert (s.active, s.active_reason, s.stopped, s.stop_policy) == (True, "Ready", False, None)
    assert s.admission_checks == ("prov",)
    assert s.updated_at == x.time_at({"t": "2026-08-20T09:00:05Z"}, "t")
    rows = {(r.flavor, r.resource): r for r in s.resources}
    gpu, cpu = rows[("h100", "nvidia.com/gpu")], rows[("h100", "cpu")]
    assert (gpu.nominal, gpu.reserved, gpu.used) == ("8", "8", "8")
    assert (cpu.nominal, cpu.borrowing_limit, cpu.used) == ("96", "8", "500m")
    assert extract_queue("MODIFIED", cq(stop="HoldAndDrain")).stopped
    assert extract_queue("MODIFIED", cq(stop="None")).stopped is False
    stopped = extract_queue("MODIFIED", cq(active="False", reason="Stopped"))
    assert stopped.stopped and stopped.active is False
    assert extract_queue("DELETED", cq()).deleted


def test_local_queue_facts() -> None:
    s = extract_queue("ADDED", lq(stop="Hold"))
    assert (s.key, s.namespace, s.cluster_queue, s.pending, s.admitted, s.stopped) == \
        ("queue:team-a/team-a-lq", "team-a", "gpu-cq", 2, 1, True)
    assert [(r.resource, r.used) for r in s.resources] == [("nvidia.com/gpu", "4")]


def test_quantities() -> None:
    assert quantity("8") == 8 and quantity("500m") == 0.5 and quantity("16Gi") == 16 * 2**30
    assert quantity("eight") is None and quantity(True) is None
    assert gpu_usage([{"resource": "nvidia.com/gpu", "used": "6", "nominal": "8"},
                      {"resource": "nvidia.com/gpu", "used": None, "reserved": "2", "nominal": "8"},
                      {"resource": "cpu", "used": "1", "nominal": "2"}]) == \
        {"resource": "nvidia.com/gpu", "used": 8.0, "nominal": 16.0}


def test_slimmed_queues_fold_as_the_originals() -> None:
    for obj in (cq(), lq()):
        small = slim(obj)
        assert "managedFields" not in small["metadata"]
        assert extract_queue("ADDED", small) == extract_queue("ADDED", obj)


@pytest.mark.parametrize(("obj", "why"), [
    ({**cq(), "status": {"pendingWorkloads": "three"}}, "pendingWorkloads must be an integer"),
    ({**cq(), "status": {"pendingWorkloads": -1}}, "negative"),
    ({**cq(), "metadata": {"uid": "u", "resourceVersion": "1"}}, "metadata.name is missing"),
    ({**lq(), "metadata": {"name": "q", "uid": "u"}}, "without metadata.namespace"),
    ({**cq(), "spec": {"resourceGroups": [{"flavors": [{"name": "f", "resources": [
        {"name": "nvidia.com/gpu", "nominalQuota": "lots"}]}]}]}}, "not a resource quantity"),
    ({**cq(), "status": {"flavorsUsage": "all"}}, "flavorsUsage must be a list"),
    ({**cq(), "spec": {"admissionChecks": [1]}}, "admissionChecks[] must be strings"),
])
def test_malformed_queues_are_dead_letters(obj: Obj, why: str) -> None:
    red = Reducer()
    red.apply(ev("ADDED", obj), "capture:1")
    red.apply(ev("ADDED", lq()), "capture:2")  # the rest keeps flowing
    out = red.flush()
    assert len(out.dead_letters) == 1, out.dead_letters
    letter = out.dead_letters[0]
    assert letter.reason == f"malformed {obj['kind']}" and why in letter.detail and letter.source == "capture:1"
    assert [q.key for q in out.queues] == ["queue:team-a/team-a-lq"]


def test_newest_version_wins_whatever_the_order() -> None:
    versions = [ev("ADDED", cq("10", pending=3)), ev("MODIFIED", cq("12", pending=1)), ev("MODIFIED", cq("11"))]
    for order in ([0, 1, 2], [2, 1, 0], [1, 0, 2, 1, 0]):
        red = Reducer()
        for i in order:
            red.apply(versions[i], "t")
        assert red.queues.queues["queue:gpu-cq"].pending == 1
        assert red.queues.queues["queue:gpu-cq"].resource_version == 12
    red = Reducer()
    red.apply(versions[1], "t")
    assert len(red.flush().queues) == 1
    red.apply(versions[1], "t")  # a duplicate, an older version: nothing changed
    red.apply(versions[0], "t")
    assert red.flush().queues == []
    red.apply(ev("DELETED", cq("12")), "t")  # its deletion is newer than its last version
    gone = red.flush().queues
    assert [q.deleted for q in gone] == [True]
    red.apply(ev("MODIFIED", cq("11")), "t")  # a late older version does not bring it back
    assert red.flush().queues == [] and red.queues.queues["queue:gpu-cq"].deleted


def test_positions_newest_poll_wins_and_malformed_are_dead_letters() -> None:
    red = Reducer()
    red.apply(position(at="2026-08-20T12:59:00Z", pos=2), "v:1")
    red.apply(position(at="2026-08-20T12:58:00Z", pos=5), "v:2")  # older poll, later arrival
    out = red.flush()
    assert [(p.run_id, p.position_in_cluster_queue) for p in out.positions] == [("qwen-rm-5vt2j", 2)]
    red.apply(position(at="2026-08-20T13:00:00Z", pos=None), "v:3")  # left the queue
    assert [p.position_in_cluster_queue for p in red.flush().positions] == [None]
    for bad, why in [({**position(), "position_in_cluster_queue": -1}, "non-negative"),
                     ({**position(), "polled_at": "yesterday"}, "polled_at"),
                     ({**position(), "run_id": ""}, "run_id"),
                     ({**position(), "extra": 1}, "unknown fields")]:
        red.apply(bad, "v:bad")
        letters = red.flush().dead_letters
        assert [(d.reason, why in d.detail) for d in letters] == [("malformed queue position", True)], letters
    assert position()["schema"] == QUEUE_POSITION_SCHEMA


def test_snapshot_keeps_the_queues() -> None:
    red = Reducer()
    red.apply(ev("ADDED", cq()), "t")
    red.apply(position(), "t")
    back = Reducer.restore(json.loads(json.dumps(red.snapshot())))
    assert back.queues.queues == red.queues.queues and back.queues.positions == red.queues.positions
    assert [q.key for q in back.flush().queues] == ["queue:gpu-cq"]


def test_capture_records_are_keyed_by_queue() -> None:
    keyer = RunKeyer(100)
    for obj, key in ((cq(), "queue:gpu-cq"), (lq(), "queue:team-a/team-a-lq")):
        rec = Record("c:1", ev("ADDED", obj))
        assert keyer.key_record(rec) == [(rec, key)]
        assert queue_key(obj) == key
    rec = Record("c:2", position())
    assert keyer.key_record(rec) == [(rec, "qwen-rm-5vt2j")]


def _replay(paths: list[Path], index: Path) -> int:
    """Replay ``paths`` into ``index``; the number of dead letters."""
    import asyncio

    from tracker.runtime.pipeline import run_pipeline
    from tracker.shell.capture import capture_files, interleave

    with ExperimentIndex(index) as store:
        report = asyncio.run(run_pipeline(interleave(capture_files(paths)), Reducer(), sinks=[], store=store))
    return report.dead_letters


def test_replay_of_queue_captures_and_what_readers_say(tmp_path: Path) -> None:
    capture = tmp_path / "queues.jsonl"
    listed = {"apiVersion": "v1", "kind": "List", "items": [cq("10", pending=5), lq()]}  # kubectl get -o json
    capture.write_text("\n".join(json.dumps(r) for r in [
        listed, ev("MODIFIED", cq("12", pending=3, stop="Hold")), ev("MODIFIED", cq("11", pending=9)), position(),
        {"apiVersion": "v1", "kind": "List", "items": [{"kind": "Job", "metadata": {"name": "j"}}]},
    ]) + "\n")
    index = tmp_path / "runs.sqlite"
    assert _replay([DEMO, capture], index) == 1  # the List's Job: a dead letter (not a watch event)
    conn = sqlite3.connect(index)
    rows = conn.execute("SELECT key, pending, stopped, deleted FROM queues ORDER BY key").fetchall()
    assert rows == [("queue:gpu-cq", 3, 1, 0), ("queue:team-a/team-a-lq", 2, 0, 0)]
    assert conn.execute("SELECT run_id, position_in_cluster_queue FROM queue_positions").fetchall() == \
        [("qwen-rm-5vt2j", 2)]
    conn.close()
    with IndexReader(index) as reader:
        ctx = queue_context(reader, ["qwen-rm-5vt2j", "vit-l-9hx4d"])
    assert set(ctx) == {"qwen-rm-5vt2j"}  # a finished run waits behind nothing
    said = text(ctx["qwen-rm-5vt2j"])
    assert said.startswith("waiting behind 3 pending workloads in ClusterQueue gpu-cq (nvidia.com/gpu 8/8 used), "
                           "ClusterQueue stopped (Hold), position 2 (1 in LocalQueue team-a-lq) at "
                           "2026-08-20T12:59:00Z")
    assert short(ctx["qwen-rm-5vt2j"]) == "pos 2, 3 pending, nvidia.com/gpu 8/8, stopped"
    # replaying again changes nothing; an older capture of the queue changes nothing either
    _replay([capture], index)
    conn = sqlite3.connect(index)
    assert conn.execute("SELECT pending FROM queues WHERE key = 'queue:gpu-cq'").fetchone() == (3,)
    conn.close()


def test_readers_show_the_queue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tracker.cli import main

    capture = tmp_path / "queues.jsonl"
    capture.write_text("\n".join(json.dumps(r) for r in [ev("ADDED", cq()), ev("ADDED", lq()), position()]) + "\n")
    index = tmp_path / "runs.sqlite"
    _replay([DEMO, capture], index)
    capsys.readouterr()
    assert main(["runs", "--index", str(index), "--status", "pending", "-o", "json"]) == 0
    runs = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    waiting = runs["qwen-rm-5vt2j"]["waiting_behind"]
    assert waiting["cluster_queue"]["pending"] == 3 and waiting["position"]["position_in_cluster_queue"] == 2
    assert waiting["cluster_queue"]["gpu"] == {"resource": "nvidia.com/gpu", "used": 8.0, "nominal": 8.0}
    assert main(["runs", "--index", str(index), "--status", "pending", "-o", "wide"]) == 0
    wide = capsys.readouterr().out
    assert "WAITING-BEHIND" in wide and "pos 2, 3 pending, nvidia.com/gpu 8/8" in wide
    assert main(["show", "qwen-rm-5vt2j", "--index", str(index), "--now", "2026-08-20T13:00:00Z"]) == 0
    assert "Queue: waiting behind 3 pending workloads in ClusterQueue gpu-cq (nvidia.com/gpu 8/8 used), position 2" \
        in capsys.readouterr().out


def test_an_index_of_schema_6_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    for version in range(1, 7):
        for statement in statements(MIGRATIONS[version]):
            conn.execute(statement)
    conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '6')")
    conn.close()
    with IndexReader(path) as reader:  # a reader of a schema-6 index: nothing known of queues, no error
        assert queue_context(reader, ["x"]) == {}
    with ExperimentIndex(path):
        pass
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    assert conn.execute("SELECT COUNT(*) FROM queues").fetchone() == (0,)
    assert conn.execute("SELECT COUNT(*) FROM queue_positions").fetchone() == (0,)
    conn.close()


def test_a_run_reserving_quota_for_its_admission_checks_is_said_to_wait_behind_nothing_pending() -> None:
    """A run whose quota is reserved while its admission checks run is not pending in Kueue's count: the sentence
    says so instead of "waiting behind 0 pending workloads"; the GPUs counted are those reserved (issue 24)."""
    from tracker.read.queues import gpu_usage, text
    gpu = gpu_usage([{"flavor": "h100", "resource": "nvidia.com/gpu", "nominal": "2", "reserved": "2", "used": "0"}])
    assert gpu == {"resource": "nvidia.com/gpu", "used": 2.0, "nominal": 2.0}
    cq = {"name": "gpu-checked", "pending": 0, "reserving": 1, "gpu": gpu, "stopped": False, "active": True}
    assert text({"cluster_queue": cq}) == ("no workload pending in ClusterQueue gpu-checked, 1 reserving quota "
                                           "(nvidia.com/gpu 2/2 used)")
