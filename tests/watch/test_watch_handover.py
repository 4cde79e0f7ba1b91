"""A leadership handover between watcher replicas, with the shared checkpoint in Kafka (real broker, real
kube-apiserver; marked ``kafka`` and ``kube``).

When the lease moves from replica a to replica b, b must resume where a checkpointed: every watch from a's last
checkpointed resourceVersion, so that what changed while nobody watched is published state by state (the
apiserver still has the history) and what was deleted is published as DELETED. With one SQLite checkpoint per
replica, b resumes from its own (here: absent) state and re-lists instead: the intermediate states and the
deletions of the handover are lost; ``test_separate_local_checkpoints_lose_the_handover`` proves that, so that
``test_handover_resumes_from_the_previous_leaders_checkpoint`` proves the shared store matters.

A lost lease is emulated as ``tracker.shell.leader.lead`` handles one: the term's ``Watcher.run`` is cancelled,
without a final checkpoint. The control plane, the watcher's identity and the API helpers come from
``tests/watch/test_watch_kube.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from tests.support.laws import fold, histories
from tests.watch import test_watch_kube as kube_tests
from tests.watch.test_watch_kube import (
    CONFIG,
    Cluster,
    Identity,
    all_runs,
    assert_same_history,
    captured,
    missing,
    watcher_api,
)
from tracker.settings import KafkaSettings, TopicSettings
from tracker.shell import kafka
from tracker.shell.watch import (
    Checkpoint,
    CheckpointStore,
    JsonlCapture,
    KubeApi,
    LeadershipLost,
    Saved,
    Snapshot,
    Watcher,
    WatchSettings,
)
from tracker.shell.watch.kafka_checkpoint import KafkaCheckpoint, transactional_id

Obj = dict[str, Any]
MIB = 1024 * 1024

# the private control plane, the watcher's ServiceAccount, an admin client and a namespace per test
control_plane = kube_tests.control_plane
identity = kube_tests.identity
admin = kube_tests.admin
namespace = kube_tests.namespace


# ------------------------------------------------------------------------------------------ helpers


def kafka_settings(bootstrap: str, **topics: Any) -> KafkaSettings:
    """Topics of this test only (not created), one replica."""
    prefix = f"h{uuid.uuid4().hex[:10]}"
    return KafkaSettings(bootstrap_servers=bootstrap, request_timeout_ms=10_000, call_timeout_s=20,
                         topics=TopicSettings(changes=f"{prefix}.changes", transitions=f"{prefix}.transitions",
                                              run_state=f"{prefix}.run-state", dead_letters=f"{prefix}.dead-letters",
                                              alerts=f"{prefix}.alerts", replication_factor=1, **topics))


async def create_watch_state(ks: KafkaSettings) -> None:
    specs = [s for s in kafka.topic_specs(ks.topics) if s.role == "watch_state"]
    assert specs[0].name == ks.topics.watch_state_topic and specs[0].partitions == 1
    assert specs[0].configs["cleanup.policy"] == "compact"
    assert await kafka.create_topics(ks, specs) == {ks.topics.watch_state_topic: "created"}


def kafka_store(ks: KafkaSettings, scope: str = "tracker-system/tracker-watcher") -> KafkaCheckpoint:
    lease_namespace, lease_name = scope.split("/")
    return KafkaCheckpoint(ks, scope=scope, transactional_id=transactional_id(
                               ks, lease_namespace=lease_namespace, lease_name=lease_name),
                           load_timeout_s=30)


def entry(kind: str, name: str, rv: str, **extra: Any) -> tuple[str, bytes]:
    obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                                                           "resourceVersion": rv}, **extra}
    return rv, json.dumps(obj, separators=(",", ":")).encode()


def held(name: str, size: int = 0) -> tuple[str, tuple[str, Obj, str]]:
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                                                           "ownerReferences": [{"uid": "owner", "kind": "Job"}]},
           "pad": "x" * size}
    return "owner", ("ADDED", obj, "watch:pods-job@*")


def sqlite_equivalent(path: Path, snaps: list[Snapshot]) -> Saved:
    """What the SQLite checkpoint keeps after the same saves: the reference the Kafka store must equal."""
    cp = Checkpoint(path)
    try:
        for snap in snaps:
            cp.save(snap)
        return cp.load()
    finally:
        cp.close()


def same(a: Saved, b: Saved) -> None:
    assert {k: v for k, v in a.rvs.items() if v is not None} == {k: v for k, v in b.rvs.items() if v is not None}
    assert {k: v for k, v in a.known.items() if v} == {k: v for k, v in b.known.items() if v}
    assert a.held == b.held


# ------------------------------------------------------------------------------------------ the store


@pytest.mark.kafka
async def test_kafka_store_round_trip_equals_sqlite_and_a_fenced_store_cannot_save(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    ks = kafka_settings(kafka_bootstrap)
    await create_watch_state(ks)
    snaps = [
        Snapshot({"jobs@*": "10", "pods-job@*": None},
                 {"jobs@*": {"uid-a": entry("Job", "a", "8"), "uid-b": entry("Job", "b", "9")},
                  "pods-job@*": {"uid-p": entry("Pod", "p", "7")}},
                 [held("h1"), held("h2")]),
        # b forgotten (deleted), c new, p updated, a stream listed; the held list shrinks
        Snapshot({"jobs@*": "12", "pods-job@*": "11"},
                 {"jobs@*": {"uid-b": None, "uid-c": entry("Job", "c", "12")},
                  "pods-job@*": {"uid-p": entry("Pod", "p", "11")}},
                 [held("h2")]),
    ]
    a = kafka_store(ks)
    try:
        assert await a.load() == Saved()
        for snap in snaps:
            await a.save(snap)
        b = kafka_store(ks)  # the next leader: starting its producer fences a
        try:
            loaded = await b.load()
            same(loaded, sqlite_equivalent(tmp_path / "reference.sqlite", snaps))
            assert loaded.known["jobs@*"] == {"uid-a": entry("Job", "a", "8"), "uid-c": entry("Job", "c", "12")}
            # the deposed leader's late save fails with the documented error, and changes nothing
            with pytest.raises(LeadershipLost):
                await a.save(Snapshot({"jobs@*": "99"}, {"jobs@*": {"uid-a": None}}, []))
            third = Snapshot({"jobs@*": "13"}, {"jobs@*": {"uid-d": entry("Job", "d", "13")}}, [])
            await b.save(third)
        finally:
            await b.close()
        c = kafka_store(ks)
        try:
            same(await c.load(), sqlite_equivalent(tmp_path / "reference2.sqlite", [*snaps, third]))
        finally:
            await c.close()
        other = kafka_store(ks, "elsewhere/tracker-watcher")  # another deployment's scope in the same topic
        try:
            assert await other.load() == Saved()
        finally:
            await other.close()
    finally:
        await a.close()


@pytest.mark.kafka
async def test_kafka_store_records_stay_below_the_message_limit(kafka_bootstrap: str, tmp_path: Path) -> None:
    """With a 1 MiB limit (Event Hubs'): a held list of ~3.5 MiB, one held record larger than the limit, and a
    known object larger than it all save; the held records come back whole, the object as its identity."""
    ks = kafka_settings(kafka_bootstrap, max_message_bytes=MIB)
    await create_watch_state(ks)
    huge = entry("Job", "huge", "5", metadata_pad={"x": "y" * (2 * MIB)},
                 **{"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    snaps = [Snapshot({"jobs@*": "5"}, {"jobs@*": {"uid-huge": huge, "uid-a": entry("Job", "a", "4")}},
                      [held("big", 3 * MIB // 2), *(held(f"h{i}", 400 * 1024) for i in range(5))]),
             Snapshot({"jobs@*": "6"}, {}, [held("small")])]
    a = kafka_store(ks)
    try:
        await a.load()
        await a.save(snaps[0])
        assert a.trimmed == 1 and a.held_chunks >= 4
    finally:
        await a.close()
    b = kafka_store(ks)
    try:
        loaded = await b.load()
        assert loaded.held == [h for _owner, h in snaps[0].held]
        rv, blob = loaded.known["jobs@*"]["uid-huge"]
        assert rv == "5" and json.loads(blob) == {"apiVersion": "v1", "kind": "Job", "metadata": {
            "name": "huge", "namespace": "ns", "uid": "uid-huge", "resourceVersion": "5"}}
        assert loaded.known["jobs@*"]["uid-a"] == entry("Job", "a", "4")
        await b.save(snaps[1])  # the held list shrinks to one slice; the stale slices become tombstones
    finally:
        await b.close()
    c = kafka_store(ks)
    try:
        assert (await c.load()).held == [h for _owner, h in snaps[1].held]
        assert c.held_chunks == 1  # the stale slices are tombstones
    finally:
        await c.close()


# ------------------------------------------------------------------------------------------ handover


@dataclass
class Replica:
    """One replica's leadership term: a Watcher on ``store``, capturing into ``path``."""

    name: str
    path: Path
    watcher: Watcher
    task: asyncio.Task[None]
    capture: JsonlCapture

    def records(self) -> list[Obj]:
        return captured(self.path)

    async def lose_lease(self) -> None:
        """As ``lead`` ends a term when the lease is lost: the run is cancelled; no final checkpoint."""
        self.task.cancel()
        with suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 30)
        self.capture.close()


@asynccontextmanager
async def replicas(api: KubeApi, config: WatchSettings, tmp_path: Path) -> AsyncIterator[
        Callable[[str, Path | CheckpointStore], Any]]:
    started: list[Replica] = []

    async def start(name: str, checkpoint: Path | CheckpointStore) -> Replica:
        path = tmp_path / f"{name}.jsonl"
        capture = JsonlCapture(path)
        watcher = Watcher(api, capture, config, checkpoint=checkpoint)
        task = asyncio.create_task(watcher.run(asyncio.Event()))
        started.append(Replica(name, path, watcher, task, capture))
        await asyncio.wait_for(watcher.wait_synced(), 60)
        return started[-1]

    try:
        yield start
    finally:
        for r in started:
            if not r.task.done():
                await r.lose_lease()


@dataclass
class Handover:
    a: Replica
    b: Replica
    before: list[Obj]  # written while a led (and published by a)
    gap: list[Obj]  # written while no replica watched
    after: list[Obj]  # written while b led


async def handover(c: Cluster, api: KubeApi, config: WatchSettings, tmp_path: Path,
                   store_a: Path | CheckpointStore, store_b: Path | CheckpointStore) -> Handover:
    """The three runs of tests/watch/test_watch_kube.py; replica a leads until the victim run is evicted, then loses the
    lease. While no replica watches, the victim's pods are deleted, its Job and Workload change several times
    (suspended, requeued, re-admitted, resumed) and new pods come and go through three states; then b leads."""
    marks: dict[str, int] = {}
    async with replicas(api, config, tmp_path) as start:
        a: Replica = await start("a", store_a)
        b: Replica | None = None

        async def fault(point: str) -> None:
            nonlocal b
            if point == "victim:evicted":
                await wait_published(c.written, a.records)
                await a.watcher.save()  # a's checkpoint covers all it published (the periodic one, forced)
                await a.lose_lease()
                marks["gap"] = len(c.written)
            elif point == "victim:readmitted":
                marks["after"] = len(c.written)
                b = await start("b", store_b)

        await all_runs(c, fault)
        assert b is not None
        await wait_published(c.written[marks["after"]:], b.records)
        await asyncio.sleep(4 * config.checkpoint_interval_s)  # whatever else b would publish
        await b.lose_lease()
    return Handover(a, b, c.written[:marks["gap"]], c.written[marks["gap"]:marks["after"]],
                    c.written[marks["after"]:])


async def wait_published(written: list[Obj], records: Callable[[], list[Obj]], within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while lost := missing(written, records()):
        assert time.monotonic() < deadline, f"{len(lost)} written states never published, e.g. {lost[:5]}"
        await asyncio.sleep(0.1)


def kinds(lost: list[str]) -> set[str]:
    """"MODIFIED Job/victim@123" -> "MODIFIED Job/victim"."""
    return {x.split("@")[0] for x in lost}


@pytest.mark.kafka
@pytest.mark.kube
async def test_handover_resumes_from_the_previous_leaders_checkpoint(
        admin: ApiClient, namespace: str, identity: Identity, kafka_bootstrap: str, tmp_path: Path) -> None:
    ks = kafka_settings(kafka_bootstrap)
    await create_watch_state(ks)
    c = Cluster(admin, namespace)
    config = replace(CONFIG, namespaces=(namespace,))
    async with watcher_api(identity.kubeconfig) as api:
        h = await handover(c, api, config, tmp_path, kafka_store(ks), kafka_store(ks))
    gap_types = {w["type"] for w in h.gap}
    assert gap_types == {"ADDED", "MODIFIED", "DELETED"}
    # b published every state of the handover itself, the deletions as the watch's own DELETED events
    assert missing(h.gap, h.b.records()) == []
    b = h.b.watcher.stats
    assert b.relists == 0 and b.synthetic_deletes == 0
    assert {s.key: s.rv for s in h.b.watcher.streams} != {}
    assert_same_history(c.written, h.a.records() + h.b.records(), allow_duplicates=True)
    # b resumed at a's checkpoint: it published nothing a had published before that checkpoint, except what a's
    # last save did not cover (nothing: it was forced just before a lost the lease)
    first = {(r["object"]["metadata"]["uid"], r["object"]["metadata"]["resourceVersion"]) for r in h.a.records()}
    again = [r for r in h.b.records()
             if (r["object"]["metadata"]["uid"], r["object"]["metadata"]["resourceVersion"]) in first]
    assert again == []


@pytest.mark.kube
async def test_separate_local_checkpoints_lose_the_handover(
        admin: ApiClient, namespace: str, identity: Identity, tmp_path: Path) -> None:
    """The same handover with one SQLite checkpoint per replica (b never led: it has none) loses states."""
    c = Cluster(admin, namespace)
    config = replace(CONFIG, namespaces=(namespace,))
    async with watcher_api(identity.kubeconfig) as api:
        h = await handover(c, api, config, tmp_path, tmp_path / "a.sqlite", tmp_path / "b.sqlite")
    lost = missing(c.written, h.a.records() + h.b.records())
    assert lost and set(lost) <= set(missing(h.gap, []))  # only states of the handover, each at most once
    victim_pods = {w["object"]["metadata"]["name"] for w in h.gap if w["type"] == "DELETED"}
    assert victim_pods and {f"DELETED Pod/{p}" for p in victim_pods} <= set(lost)  # deletions never published
    assert {"MODIFIED Job/victim", "MODIFIED Workload/" + next(
        w["object"]["metadata"]["name"] for w in h.gap if w["object"]["kind"] == "Workload")} <= kinds(lost)
    assert h.b.watcher.stats.synthetic_deletes == 0  # b never knew the deleted pods: nothing to reconcile


@pytest.mark.kafka
@pytest.mark.kube
async def test_a_deposed_leader_stops_at_its_next_save(
        admin: ApiClient, namespace: str, identity: Identity, kafka_bootstrap: str, tmp_path: Path) -> None:
    """A leader that has not noticed it lost the lease: the next leader's store fences it, and its next save
    ends its term with LeadershipLost instead of overwriting the new leader's checkpoint."""
    ks = kafka_settings(kafka_bootstrap)
    await create_watch_state(ks)
    c = Cluster(admin, namespace)
    config = replace(CONFIG, namespaces=(namespace,))
    async with watcher_api(identity.kubeconfig) as api:
        capture = JsonlCapture(tmp_path / "a.jsonl")
        a = Watcher(api, capture, config, checkpoint=kafka_store(ks))
        task = asyncio.create_task(a.run(asyncio.Event()))
        try:
            await asyncio.wait_for(a.wait_synced(), 60)
            await c.job("before", pods=1)
            await wait_published(c.written, lambda: captured(tmp_path / "a.jsonl"))
            await a.save()
            b = kafka_store(ks)
            try:
                taken_over = await b.load()
                await c.job("after", pods=1)  # a handles it and tries to checkpoint it
                with pytest.raises(ExceptionGroup) as ended:
                    await asyncio.wait_for(task, 30)
                assert ended.value.subgroup(LeadershipLost) is not None
            finally:
                await b.close()
        finally:
            if not task.done():
                task.cancel()
            capture.close()
        check = kafka_store(ks)
        try:
            assert await check.load() == taken_over  # a's late save did not land
        finally:
            await check.close()
    names = {json.loads(blob)["metadata"]["name"] for known in taken_over.known.values()
             for _rv, blob in known.values()}
    assert "before" in names and "after" not in names


# ------------------------------------------------------------------------------------------ wiring


def test_tracker_watch_shares_the_checkpoint_only_with_a_lease_and_kafka(tmp_path: Path) -> None:
    """`tracker watch`: the watch-state topic with a lease and Kafka; `--checkpoint FILE` always wins; a single
    replica, a capture or an embedded watcher keep what they had (a file if given, else none)."""
    from tracker.runtime.watch_cmd import WatchOptions, checkpoint_store
    from tracker.settings import Settings
    from tracker.shell.bus import InProcessBus
    from tracker.shell.leader import LeaseConfig
    from tracker.shell.watch import BusPublisher

    with_kafka = Settings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"))
    lease = LeaseConfig(namespace="tracker", identity="pod-a", name="tracker-watcher")
    shared = checkpoint_store(with_kafka, WatchOptions(config=CONFIG, lease=lease))
    assert isinstance(shared, KafkaCheckpoint)
    assert shared.topic == "taugrid.tracker.watch-state" and shared.scope == "tracker/tracker-watcher"
    assert shared.transactional_id == "taugrid.tracker.watch-state.watcher.tracker.tracker-watcher"
    assert checkpoint_store(with_kafka, WatchOptions(config=CONFIG, lease=lease)) is not shared  # one per term
    file = tmp_path / "watch.sqlite"
    assert checkpoint_store(with_kafka, WatchOptions(config=CONFIG, lease=lease, checkpoint=file)) == file
    assert checkpoint_store(with_kafka, WatchOptions(config=CONFIG)) is None
    assert checkpoint_store(with_kafka, WatchOptions(config=CONFIG, lease=lease, capture=tmp_path / "c")) is None
    assert checkpoint_store(Settings(), WatchOptions(config=CONFIG, lease=lease)) is None
    embedded = BusPublisher(InProcessBus(10))
    assert checkpoint_store(with_kafka, WatchOptions(config=CONFIG, lease=lease), into=embedded) is None
    renamed = TopicSettings(changes="team-a.changes", transitions="team-a.transitions", run_state="team-a.run-state",
                            dead_letters="team-a.dead-letters", alerts="team-a.alerts")
    assert renamed.watch_state_topic == "team-a.watch-state"
    assert TopicSettings(watch_state="explicit").watch_state_topic == "explicit"


@pytest.mark.kafka
@pytest.mark.kube
async def test_tracker_watch_terms_resume_from_the_watch_state_topic(
        admin: ApiClient, namespace: str, identity: Identity, kafka_bootstrap: str, tmp_path: Path) -> None:
    """The wiring end to end: `tracker watch`'s body with a Lease and Kafka (no --checkpoint), one replica's term,
    a graceful stop (lease released, last checkpoint saved), changes and a create+delete while nobody watches,
    then another replica's term: it resumes from the topic and publishes every state of the gap to Kafka."""
    from aiokafka import TopicPartition

    from tracker.runtime.ops import Health, Metrics, Shutdown
    from tracker.runtime.watch_cmd import WatchOptions, watch_body
    from tracker.settings import Settings
    from tracker.shell.leader import LeaseConfig

    ks = kafka_settings(kafka_bootstrap, partitions=1, side_partitions=1)
    settings = Settings(kafka=ks)
    assert set((await kafka.create_topics(ks, kafka.topic_specs(ks.topics))).values()) == {"created"}
    c = Cluster(admin, namespace)
    consumer = kafka.make_consumer(ks, group_id=None)
    await kafka.start(consumer, ks, what="test reader")
    tp = TopicPartition(ks.topics.changes, 0)
    consumer.assign([tp])
    records: list[Obj] = []

    async def published(written: list[Obj], within_s: float = 60) -> None:
        deadline = time.monotonic() + within_s
        while missing(written, records):
            assert time.monotonic() < deadline, f"never published: {missing(written, records)[:5]}"
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                records.extend(json.loads(r.value) for r in batch)

    async def term(identity_name: str) -> tuple[asyncio.Future[None], Shutdown]:
        lease = LeaseConfig(namespace=kube_tests.SYSTEM_NS, identity=identity_name, name=kube_tests.SA,
                            lease_duration_s=4, renew_deadline_s=2.5, retry_period_s=0.5)
        opts = WatchOptions(config=replace(CONFIG, namespaces=(namespace,)), kubeconfig=identity.kubeconfig,
                            lease=lease)
        shutdown = Shutdown(30)
        return asyncio.ensure_future(watch_body(settings, opts)(Metrics(), Health(), shutdown)), shutdown

    try:
        first, stop_first = await term("replica-a")
        job = await c.job("handed-over", pods=1)  # listed or watched: its latest state is published either way
        await published([c.written[-1]])
        stop_first.requested.set()
        await asyncio.wait_for(first, 60)
        gap_start = len(c.written)
        for n in range(3):  # three states nobody watched
            job = await c.patch(job, {"metadata": {"labels": {"step": str(n)}}}, status=False)
        gone = await c.job("short-lived", pods=1)
        await c.delete(gone)
        second, stop_second = await term("replica-b")
        try:
            await published(c.written[gap_start:])
        finally:
            stop_second.requested.set()
            await asyncio.wait_for(second, 60)
    finally:
        await kafka.stop(consumer, ks, what="test reader")
    gap = c.written[gap_start:]
    assert [w["type"] for w in gap] == ["MODIFIED"] * 3 + ["ADDED", "MODIFIED", "DELETED"]
    assert histories(fold(records)) == histories(fold(c.written))
