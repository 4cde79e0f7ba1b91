"""The Kafka pipeline against a real broker: `tracker reduce` and `tracker sink index` as processes.

What "duplicate" means here. A transitions record carries a run's complete current history, not a delta. Which
intermediate histories get published depends on where the poll batches happen to end (a batch folds many changes
and publishes the result once), so two correct runs of the pipeline may publish different intermediate records.
What must hold, crashes or not:

- last per key: the final transitions record of every run is that run's history in a fault-free fold;
- no duplicate: within a run's records, read read_committed in offset order, no record has the content hash of
  the record before it (that is what a replayed, not-deduplicated transaction would produce); every record's
  ``content-hash`` header is the sha256 of its value. The records of a run's parts (a pod, a metric point) carry no
  hash: each is published when that part changed, and a redelivered batch sends them again as upserts;
- the experiment index equals the index that the embedded ``tracker replay`` builds from the same input.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka import AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from rich.console import Console

from bench.kafka_pipeline import synthetic_stream
from sim import builders
from tests.infra import build
from tests.infra import kafka as infra_kafka
from tests.infra.fixtures import unavailable
from tests.infra.proc import Process, free_port, spawn
from tracker import errors
from tracker.core import wire
from tracker.core.model import FINAL_STATUSES, HistoryUpdate, RunHistory, Status, adapter, load_json, pod_order
from tracker.core.reducer import Reducer
from tracker.core.snapshot import minute_of_state
from tracker.core.stuck import Stuck, StuckRunAlert, stuck_candidate
from tracker.core.timefmt import ts
from tracker.core.wire import CONTENT_HASH_HEADER
from tracker.read.store import IndexReader
from tracker.runtime import service
from tracker.runtime.commands import add_service_commands
from tracker.runtime.ops import Health, Metrics
from tracker.runtime.pipeline import run_pipeline
from tracker.runtime.reduce import ReduceService
from tracker.runtime.replay import replay
from tracker.runtime.sinks import SinkRunner, index_sink_runner
from tracker.settings import Settings, SettingsError, TopicSettings, load_settings, redacted
from tracker.shell import kafka
from tracker.shell import transitions as transitions_codec
from tracker.shell.capture import Record
from tracker.shell.index import ExperimentIndex
from tracker.shell.watch.keying import RunKeyer

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "tracker" / "captures" / "demo"
PARTITIONS = 4
STALLED_S = 120.0


# ------------------------------------------------------------------------------------------ helpers


def configure(monkeypatch: pytest.MonkeyPatch, bootstrap: str, **extra: str) -> Settings:
    """Unique topics and groups for one test, as environment (inherited by the service processes)."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    env = {
        "KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "KAFKA__TOPICS__CHANGES": f"{prefix}.changes",
        "KAFKA__TOPICS__TRANSITIONS": f"{prefix}.transitions",
        "KAFKA__TOPICS__RUN_STATE": f"{prefix}.run-state",
        "KAFKA__TOPICS__DEAD_LETTERS": f"{prefix}.dead-letters",
        "KAFKA__TOPICS__ALERTS": f"{prefix}.alerts",
        "KAFKA__TOPICS__PARTITIONS": str(PARTITIONS),
        "KAFKA__TOPICS__SIDE_PARTITIONS": "1",
        "KAFKA__TOPICS__REPLICATION_FACTOR": "1",
        "KAFKA__SESSION_TIMEOUT_MS": "6000",
        "KAFKA__HEARTBEAT_INTERVAL_MS": "500",
        "KAFKA__REQUEST_TIMEOUT_MS": "10000",
        "KAFKA__CALL_TIMEOUT_S": "20",
        "REDUCE__GROUP_ID": f"{prefix}-reduce",
        "REDUCE__TRANSACTIONAL_ID_PREFIX": prefix,
        "REDUCE__RETRY_BACKOFF_MAX_S": "2",
        "SINK__INDEX_GROUP": f"{prefix}-index",
        "ALERTS__STALLED_ADMISSION_S": str(STALLED_S),
        "ALERTS__STUCK_SCHEDULING_S": str(STALLED_S),
        "ALERTS__STUCK_RUNTIME_S": str(STALLED_S),
        "OPS__METRICS_INTERVAL_S": "1",
        **extra,
    }
    for name, value in env.items():
        monkeypatch.setenv(f"TRACKER_{name}", value)
    return load_settings()


async def create_topics(settings: Settings) -> None:
    result = await service.create_topics(settings)
    assert set(result.values()) == {"created"}, result


def keyed(records: Sequence[dict[str, Any]]) -> list[service.SourceItem]:
    """The records as the watcher would publish them: keyed by run (RunKeyer), in order."""
    keyer = RunKeyer(100_000)
    out = [item for i, rec in enumerate(records) for item in keyer.key_record(Record(f"synthetic:{i}", rec))]
    return out + keyer.unkeyed()


async def items(source: Sequence[service.SourceItem], rate: float) -> AsyncIterator[service.SourceItem]:
    """``source`` as an async intake offering ``rate`` records per second."""
    started = time.monotonic()
    for n, item in enumerate(source):
        if n % 50 == 0:
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
        yield item


class Service:
    """One `python -m tracker.runtime.commands ...` process, restartable; its log is JSON lines."""

    def __init__(self, tmp: Path, name: str, *argv: str) -> None:
        self.name, self.argv, self.log = name, argv, tmp / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> Service:
        self.starts += 1
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "tracker.runtime.commands", *self.argv], cwd=REPO,
                                         env=dict(os.environ), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=log)
        return self

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # a line cut short by kill -9
        return out

    async def wait_for(self, event: str, count: int = 1, within: float = 60) -> None:
        """Until the log holds ``count`` lines of ``event`` (e.g. the n-th start of a restarted process)."""
        deadline = time.monotonic() + within
        while sum(e.get("event") == event for e in self.events()) < count:
            self.check_alive()
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name}: no {count}x {event!r} within {within}s:\n{self.tail()}")
            await asyncio.sleep(0.05)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def services(tmp_path: Path) -> Iterator[list[Service]]:
    """Service processes of a test; whatever is still running at the end is killed."""
    started: list[Service] = []
    yield started
    for s in started:
        if s.proc is not None and s.proc.poll() is None:
            s.kill()


def launch(services: list[Service], tmp: Path, name: str, *argv: str) -> Service:
    s = Service(tmp, name, *argv).start()
    services.append(s)
    return s


async def read_topic(settings: Settings, topic: str, partitions: int) -> list[ConsumerRecord]:
    """Every record of ``topic``, read_committed, partition by partition in offset order."""
    consumer = kafka.make_consumer(settings.kafka, group_id=None)
    await kafka.start(consumer, settings.kafka, what="test reader")
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await kafka.drain_targets(settings.kafka, tps)  # not the LSO: it can lag a commit just returned
        out: list[ConsumerRecord] = []
        async with asyncio.timeout(30):
            while not await kafka.caught_up(consumer, ends, timeout_s=10):
                for recs in (await consumer.getmany(timeout_ms=200)).values():
                    out.extend(recs)
        return sorted(out, key=lambda r: (r.partition, r.offset))
    finally:
        await kafka.stop(consumer, settings.kafka, what="test reader")


async def settle(settings: Settings, index: Path, procs: Sequence[Service] = (),
                 tasks: Sequence[asyncio.Task[None]] = (), within: float = 45) -> list[ConsumerRecord]:
    """Once every change is produced: wait until the reducer committed them all and the index stored the offset
    after every transitions record; return the transitions records. Fails early when a service dies."""
    ks, topics = settings.kafka, settings.kafka.topics
    changes = [TopicPartition(topics.changes, p) for p in range(PARTITIONS)]
    ends = await end_offsets(settings, changes)
    admin = AIOKafkaAdminClient(**kafka.client_options(ks))
    await admin.start()
    try:
        deadline = time.monotonic() + within
        while True:
            for p in procs:
                p.check_alive()
            for t in tasks:
                if t.done():
                    pytest.fail(f"a service task stopped: {t.exception()!r}")
            if time.monotonic() > deadline:
                logs = "\n\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
                pytest.fail(f"pipeline did not settle within {within}s\n{logs}")
            try:
                committed = await admin.list_consumer_group_offsets(settings.reduce.group_id)
            except KafkaError:
                await asyncio.sleep(0.5)
                continue
            if all(tp in committed and committed[tp].offset >= end for tp, end in ends.items()):
                transitions = await read_topic(settings, topics.transitions, PARTITIONS)
                want = {(topics.transitions, r.partition): r.offset + 1 for r in transitions}
                have = stored_offsets(index, settings.sink.index_group)
                if all(have.get(k, -1) >= v for k, v in want.items()):
                    return transitions
            await asyncio.sleep(0.5)
    finally:
        await admin.close()


async def end_offsets(settings: Settings, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    return await kafka.drain_targets(settings.kafka, tps)


def stored_offsets(index: Path, group: str) -> dict[tuple[str, int], int]:
    if not index.exists():
        return {}
    # read-only, as a reader: the sink process holds the index's writer lock while it runs
    try:
        with contextlib.closing(sqlite3.connect(f"file:{index}?mode=ro", uri=True, timeout=5)) as db:
            cur = db.execute('SELECT topic, "partition", next_offset FROM consumer_offsets WHERE consumer_group = ?',
                             (group,))
            return {(topic, partition): offset for topic, partition, offset in cur}
    except sqlite3.Error:
        return {}


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def index_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows (updated_seq, consumer offsets and the reducer state a replay keeps excluded: they are
    bookkeeping, not content)."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with sqlite3.connect(path) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT IN "
                                           "('meta', 'consumer_offsets', 'reducer_runs', 'reducer_held', "
                                           "'reducer_pods') ORDER BY name")]
        for table in tables:
            cols = [r[1] for r in db.execute(f"PRAGMA table_info({table})") if r[1] != "updated_seq"]
            columns = ", ".join(f'"{c}"' for c in cols)  # identifiers: double quotes (single ones are literals)
            rows = db.execute(f"SELECT {columns} FROM {table}").fetchall()
            out[table] = sorted(rows, key=repr)
    return out


async def replay_index(records: Sequence[dict[str, Any]], path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """The embedded pipeline (what `tracker replay` runs) over the same records, unkeyed."""
    with ExperimentIndex(path) as idx:
        await run_pipeline([Record(f"synthetic:{i}", r) for i, r in enumerate(records)], Reducer(), sinks=[idx])
    return index_rows(path)


def fault_free(records: Sequence[dict[str, Any]]) -> dict[str, RunHistory]:
    """Each run's complete history (metric points and pods included) after one fault-free fold."""
    red = Reducer()
    for i, rec in enumerate(records):
        red.apply(rec, f"synthetic:{i}")
    return {run_id: h for run_id in red.runs if (h := red.history(run_id)) is not None}


def check_transitions(transitions: Sequence[ConsumerRecord], expected: dict[str, RunHistory]) -> None:
    """No duplicate history record (see the module docstring), valid hashes, and each run's
    records (history, metric points, pods), applied in order, are its expected complete history."""
    previous: dict[bytes, str] = {}
    updates: dict[str, HistoryUpdate] = {}
    duplicates = []
    for rec in sorted(transitions, key=lambda r: (r.partition, r.offset)):
        headers = dict(rec.headers)
        if CONTENT_HASH_HEADER in headers:  # a history, a queue, a Node: published by content
            digest = headers[CONTENT_HASH_HEADER].decode()
            assert digest == hashlib.sha256(rec.value).hexdigest(), f"bad hash at {rec.partition}@{rec.offset}"
            if previous.get(rec.key) == digest:
                duplicates.append((rec.key, rec.partition, rec.offset))
            previous[rec.key] = digest
        else:
            assert headers[wire.KIND_HEADER] in (b"pod", b"point"), f"{rec.partition}@{rec.offset}"
        if transitions_codec.is_node_record(rec.headers) or transitions_codec.is_queue_record(rec.headers):
            continue  # no part of a run (the index comparison checks what the sink made of them)
        u = transitions_codec.decode(rec.key, rec.value, rec.headers)
        updates[u.run_id] = updates[u.run_id].then(u) if u.run_id in updates else u
    assert not duplicates, f"{len(duplicates)} duplicated transitions records, e.g. {duplicates[:5]}"
    assert sorted(updates) == sorted(expected), "runs missing from (or extra in) the transitions topic"
    got = {run_id: replace(u.history, metric_points=u.points or [], pods=sorted(u.pods, key=pod_order))
           for run_id, u in updates.items() if u.history is not None}
    wrong = [run_id for run_id, h in expected.items() if got.get(run_id) != h]
    assert not wrong, f"{len(wrong)} runs end with another history than a fault-free fold, e.g. {wrong[:5]}"


def last_histories(transitions: Sequence[ConsumerRecord]) -> dict[str, tuple[int, RunHistory]]:
    """The last history record of each run, with its partition."""
    return {r.key.decode(): (r.partition, load_json(RunHistory, r.value)) for r in transitions
            if dict(r.headers).get(wire.KIND_HEADER) == b"history"}


def alert_keys(alerts: Sequence[ConsumerRecord]) -> list[tuple[str, int, str]]:
    """(run, attempt, phase) of each stuck-run alert, checked against the published schema."""
    docs = [json.loads(a.value) for a in alerts]
    for doc, rec in zip(docs, alerts, strict=True):
        StuckRunAlert.model_validate(doc)
        assert rec.key.decode() == doc["run_id"]
    return [(d["run_id"], d["attempt"], d["phase"]) for d in docs]


def stuck_at_end(histories: Iterable[RunHistory]) -> dict[tuple[str, int, str], Stuck]:
    return {(s.run_id, s.attempt, s.phase.value): s for h in histories if (s := stuck_candidate(h)) is not None}


def check_alerts(alerts: Sequence[ConsumerRecord], transitions: Sequence[ConsumerRecord]) -> None:
    """Alerts are unique per (run, attempt, phase); every run still stuck at the end (pending in Admission,
    Scheduling or Runtime) and longer than the threshold in its phase by its partition's event clock (the latest
    transition time the partition published) has its alert."""
    keys = alert_keys(alerts)
    assert len(keys) == len(set(keys)), f"alerts repeated: {[k for k, n in Counter(keys).items() if n > 1][:5]}"
    last = last_histories(transitions)
    watermark: dict[int, int] = {}
    for partition, h in last.values():
        for t in h.transitions:
            watermark[partition] = max(watermark.get(partition, 0), ts(t.at) or 0)
    partition_of = {run_id: p for run_id, (p, _) in last.items()}
    due = {k for k, s in stuck_at_end(h for _, h in last.values()).items()
           if s.age_us(watermark[partition_of[s.run_id]]) >= STALLED_S * 1_000_000}
    assert {k for k in due if k[2] == "Admission"}, "the input should leave some runs stalled in admission"
    assert due <= set(keys), f"stuck runs without an alert: {sorted(due - set(keys))[:5]}"


def index_histories(index: Path) -> dict[str, RunHistory]:
    with IndexReader(index) as idx:
        return {r.run_id: h for r in idx.records() if (h := idx.history(r.run_id)) is not None}


def dead_reasons(records: Sequence[ConsumerRecord]) -> Counter[str]:
    return Counter(json.loads(r.value)["reason"] for r in records)


def synthetic_captures(directory: Path, runs: int, seed: int) -> list[Path]:
    """A synthetic cluster as per-stream capture files (interleaved by the reader, so some records precede their
    owner and the run keyer must hold them)."""
    directory.mkdir()
    streams: dict[str, list[str]] = {}
    for rec in synthetic_stream(runs, seed):
        kind = "intake" if "schema" in rec else rec["object"]["kind"].lower()
        streams.setdefault(kind, []).append(json.dumps(rec))
    for kind, lines in streams.items():
        (directory / f"{kind}.jsonl").write_text("\n".join(lines) + "\n")
    return [directory]


# ------------------------------------------------------------------------------------------ without a broker


def test_topics_yaml_matches_the_code() -> None:
    document = yaml.safe_load((REPO / "deploy" / "kafka" / "topics.yaml").read_text())
    assert document == kafka.topics_document(TopicSettings())
    assert (REPO / "deploy" / "kafka" / "topics.md").read_text().count("taugrid.tracker.") >= 5


def test_settings_are_validated_with_clear_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRACKER_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("TRACKER_KAFKA__SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("TRACKER_REDUCE__MAX_BATCH_RECORDS", "0")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "kafka: Value error, SASL PLAIN needs sasl_username and sasl_password" in str(err.value)
    assert "reduce.max_batch_records" in str(err.value)
    config = tmp_path / "tracker.yaml"
    config.write_text("kafka:\n  bootstrap_servers: 127.0.0.1:9092\n  sasl_username: $ConnectionString\n"
                      "reduce:\n  max_batch_records: 5\n")
    monkeypatch.setenv("TRACKER_KAFKA__SASL_PASSWORD", "Endpoint=sb://secret")
    monkeypatch.setenv("TRACKER_REDUCE__MAX_BATCH_RECORDS", "7")  # the environment wins over the file
    settings = load_settings(config)
    assert (settings.kafka.bootstrap_servers, settings.reduce.max_batch_records) == ("127.0.0.1:9092", 7)
    assert "sb://secret" not in json.dumps(redacted(settings))  # (adx.client_secret is a field name)
    assert kafka.client_options(settings.kafka)["sasl_plain_password"] == "Endpoint=sb://secret"


def test_service_commands_parse() -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="tracker")
    add_service_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["sink", "index", "--index", "x.sqlite", "--bootstrap-servers", "h:1"])
    assert (args.index, args.bootstrap_servers, args.func.__name__) == (Path("x.sqlite"), "h:1", "cmd_sink_index")
    assert parser.parse_args(["serve", "--from-capture", "a", "b", "--exit-when-done"]).captures == [Path("a"),
                                                                                                   Path("b")]
    assert parser.parse_args(["topics", "create", "--partitions", "6"]).partitions == 6
    assert parser.parse_args(["reduce", "--instance-id", "r0"]).func.__name__ == "cmd_reduce"


def test_every_service_command_option_has_help() -> None:
    import argparse

    from tracker.cli.parser import build_parser

    def walk(p: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, f"{path} {name}")
            else:
                yield path, action

    seen = set()
    for path, action in walk(build_parser(service_commands=True), "tracker"):
        seen.add(path)
        assert action.help, (path, action.option_strings or action.dest)
    assert {"tracker watch", "tracker reduce", "tracker serve", "tracker topics create", "tracker doctor"} <= seen


def test_run_keyer_holds_records_until_their_owner_is_seen() -> None:
    records = synthetic_stream(3, seed=5, outcomes=["succeeded"])
    pods = [r for r in records if r.get("object", {}).get("kind") == "Pod"]
    rest = [r for r in records if r.get("object", {}).get("kind") != "Pod"]
    out = keyed([*pods, *rest])  # every pod before its Job
    assert len(out) == len(records) and all(key is not None for _, key in out)
    kinds = [item.value.get("object", {}).get("kind") for item, _ in out if isinstance(item, Record)]
    assert kinds.index("Job") < kinds.index("Pod"), "a pod is released only after its Job bound the run"
    jobs = {item.value["object"]["metadata"]["uid"]: key for item, key in out
            if isinstance(item, Record) and item.value.get("object", {}).get("kind") == "Job"}
    for item, key in out:
        if isinstance(item, Record) and item.value.get("object", {}).get("kind") == "Pod":
            assert key == jobs[item.value["object"]["metadata"]["ownerReferences"][0]["uid"]]


async def test_embedded_serve_equals_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Kafka, `serve --from-capture` runs the embedded pipeline: same index as `tracker replay`."""
    for name in [n for n in os.environ if n.startswith("TRACKER_KAFKA__")]:
        monkeypatch.delenv(name)
    captures = synthetic_captures(tmp_path / "captures", runs=40, seed=9)
    settings = load_settings()
    health = Health()
    opts = service.ServeOptions(captures=tuple(captures), index_path=tmp_path / "serve.sqlite")
    body = service.serve_body(settings, opts)
    from tracker.runtime.ops import Shutdown

    await body(Metrics(), health, Shutdown(10))
    await asyncio.to_thread(replay, captures=captures, index_path=tmp_path / "replay.sqlite",
                            console=Console(file=io.StringIO()), quiet=True)
    assert index_rows(tmp_path / "serve.sqlite") == index_rows(tmp_path / "replay.sqlite")
    assert index_rows(tmp_path / "serve.sqlite")["runs"]


async def test_a_restarted_embedded_serve_continues_from_its_index(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded `serve` keeps the reducer's state in its index: a restart on the next captures continues the
    runs (and the records that wait for their owner) instead of replacing their histories."""
    from tracker.runtime.ops import Shutdown

    for name in [n for n in os.environ if n.startswith("TRACKER_KAFKA__")]:
        monkeypatch.delenv(name)
    captures = synthetic_captures(tmp_path / "captures", runs=40, seed=11)
    files = sorted(captures[0].glob("*.jsonl"))
    pods = [f for f in files if f.name == "pod.jsonl"]
    assert pods and len(files) > 2
    settings = load_settings()
    index = tmp_path / "serve.sqlite"
    for part in (pods, [f for f in files if f not in pods]):  # the pods first, the rest after a restart
        opts = service.ServeOptions(captures=tuple(part), index_path=index)
        await service.serve_body(settings, opts)(Metrics(), Health(), Shutdown(10))
    await asyncio.to_thread(replay, captures=captures, index_path=tmp_path / "replay.sqlite",
                            console=Console(file=io.StringIO()), quiet=True)
    assert index_rows(index) == index_rows(tmp_path / "replay.sqlite")
    assert index_rows(index)["runs"]


# ------------------------------------------------------------------------------------------ with a broker


@pytest.mark.kafka
async def test_reduce_and_index_sink_processes_equal_replay(kafka_bootstrap: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            services: list[Service]) -> None:
    settings = configure(monkeypatch, kafka_bootstrap)
    await create_topics(settings)
    has_demo = DEMO.is_dir() and any(DEMO.iterdir())
    captures = [DEMO] if has_demo else synthetic_captures(tmp_path / "captures", runs=150, seed=11)
    produced = await service.publish(service.capture_source(captures, settings.source.max_held), settings)
    index = tmp_path / "index.sqlite"
    reducer = launch(services, tmp_path, "reduce", "reduce", "--metrics-port", "0")
    sink = launch(services, tmp_path, "sink", "sink", "index", "--index", str(index))
    assert produced > 0
    transitions = await settle(settings, index, [reducer, sink])
    await reducer.wait_for("ops_endpoint_listening")
    port = next(e["port"] for e in reducer.events() if e["event"] == "ops_endpoint_listening")
    assert http_get(port, "/healthz")[0] == 200
    assert http_get(port, "/readyz") == (200, "ready\n")
    group, changes_topic = settings.reduce.group_id, settings.kafka.topics.changes
    lag = f'tracker_consumer_lag{{group="{group}",partition="0",topic="{changes_topic}"}} 0.0'
    deadline = time.monotonic() + 10  # gauges refresh every ops.metrics_interval_s (1 s here)
    while True:
        metrics = http_get(port, "/metrics")[1]
        if lag in metrics or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert lag in metrics, "\n".join(line for line in metrics.splitlines() if not line.startswith("#"))
    assert f'tracker_partitions_assigned{{group="{settings.reduce.group_id}"}} {PARTITIONS}.0' in metrics
    assert 'tracker_changes_consumed_total{partition="0"}' in metrics
    assert 'tracker_transactions_total{outcome="committed"}' in metrics
    held = {line.split()[0] for line in metrics.splitlines() if line.startswith("tracker_reducer_")}
    assert held == {"tracker_reducer_packed_runs", "tracker_reducer_packed_bytes", "tracker_reducer_derivations"}
    if has_demo:  # the demo leaves runs stuck in Admission (quota) and Scheduling (unschedulable): wall-clock ages
        for phase in ("Admission", "Scheduling"):
            assert f'tracker_oldest_stuck_seconds{{phase="{phase}",queue=' in metrics, phase
    assert reducer.terminate() == 0 and sink.terminate() == 0  # graceful shutdown on SIGTERM
    assert any(e["event"] == "reducer_stopped" for e in reducer.events())

    await asyncio.to_thread(replay, captures=captures, index_path=tmp_path / "replay.sqlite",
                            console=Console(file=io.StringIO()), quiet=True)
    rows = index_rows(index)
    assert rows["runs"], "no runs reached the index"
    assert rows["nodes"] or not has_demo, "the demo's Nodes did not reach the index"
    assert rows == index_rows(tmp_path / "replay.sqlite")
    check_transitions(transitions, index_histories(tmp_path / "replay.sqlite"))
    replay_dead = tmp_path / "replay.dead-letters.jsonl"
    expected_dead = Counter(json.loads(line)["reason"] for line in replay_dead.read_text().splitlines()) \
        if replay_dead.exists() else Counter()
    kafka_dead = dead_reasons(await read_topic(settings, settings.kafka.topics.dead_letters, 1))
    kafka_dead.pop("record without a run key", None)  # held records whose owner never came: replay keeps them
    assert kafka_dead == expected_dead
    if not has_demo:
        check_alerts(await read_topic(settings, settings.kafka.topics.alerts, 1), transitions)


@pytest.mark.kafka
async def test_kill_9_reducer_and_sink_repeatedly_loses_and_duplicates_nothing(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, services: list[Service]) -> None:
    seed = 20261129
    rng = random.Random(seed)
    settings = configure(monkeypatch, kafka_bootstrap, REDUCE__MAX_BATCH_RECORDS="150",
                         SINK__MAX_BATCH_RECORDS="100")
    await create_topics(settings)
    records = synthetic_stream(320, seed=seed)
    source = keyed(records)
    index = tmp_path / "index.sqlite"
    reducer = launch(services, tmp_path, "reduce", "reduce", "--instance-id", "reduce-0")
    sink = launch(services, tmp_path, "sink", "sink", "index", "--index", str(index), "--instance-id", "sink-0")
    producing = asyncio.create_task(service.publish(items(source, rate=400), settings))
    kills: Counter[str] = Counter()
    started = {"reduce": "reducer_started", "sink": "sink_started"}
    for round_ in range(6):
        victims = [s for i, s in enumerate((reducer, sink)) if round_ % 2 == i or rng.random() < 0.35]
        for victim in victims:  # kill at a random point after it came up: restoring, or folding and committing
            await victim.wait_for(started[victim.name], count=victim.starts)
        await asyncio.sleep(rng.uniform(0.2, 1.5))
        for victim in victims:
            victim.kill()
            kills[victim.name] += 1
        await asyncio.sleep(rng.uniform(0.0, 0.3))
        for victim in victims:
            victim.start()
    assert await producing == len(source)
    assert kills["reduce"] >= 3 and kills["sink"] >= 3
    transitions = await settle(settings, index, [reducer, sink])

    check_transitions(transitions, fault_free(records))
    assert index_rows(index) == await replay_index(records, tmp_path / "replay.sqlite")
    check_alerts(await read_topic(settings, settings.kafka.topics.alerts, 1), transitions)
    restored = [e for e in reducer.events() if e["event"] == "partition_restored" and e["runs"] > 0]
    assert restored, "a restarted reducer should have restored runs from the run-state changelog"


@pytest.mark.kafka
async def test_two_reducers_rebalance_mid_stream(kafka_bootstrap: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, services: list[Service]) -> None:
    settings = configure(monkeypatch, kafka_bootstrap, REDUCE__MAX_BATCH_RECORDS="200")
    await create_topics(settings)
    records = synthetic_stream(240, seed=7)
    index = tmp_path / "index.sqlite"
    first = launch(services, tmp_path, "reduce-a", "reduce")
    sink = launch(services, tmp_path, "sink", "sink", "index", "--index", str(index))
    source = keyed(records)
    producing = asyncio.create_task(service.publish(items(source, rate=1000), settings))
    await first.wait_for("partition_restored", count=PARTITIONS)
    await asyncio.sleep(0.5)
    second = launch(services, tmp_path, "reduce-b", "reduce")  # joins: the partitions are split
    await second.wait_for("partition_restored")
    await asyncio.sleep(1.0)
    assert first.terminate() == 0  # leaves: the second takes every partition over, state included
    assert await producing == len(source)
    transitions = await settle(settings, index, [second, sink])

    check_transitions(transitions, fault_free(records))
    assert index_rows(index) == await replay_index(records, tmp_path / "replay.sqlite")
    assert any(e["event"] == "partitions_revoked" for e in first.events())
    taken_over = [e for e in second.events() if e["event"] == "partition_restored" and e["runs"] > 0]
    assert taken_over, "the second reducer should have restored runs the first one had folded"


@pytest.mark.kafka
async def test_a_reducer_that_waits_for_more_changes_folds_them_in_fewer_transactions(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, services: list[Service]) -> None:
    """reduce.fetch_min_bytes: the broker holds the reducer's fetch until that many bytes of changes arrived (or
    reduce.fetch_max_wait_ms passed), so a transaction folds more of each run's changes and publishes one history
    of it where an eager reducer publishes several; the histories end the same."""
    records = synthetic_stream(12, seed=17)
    source = keyed(records)
    value_bytes = sum(len(json.dumps(rec.value)) for rec, _key in source if isinstance(rec, Record))
    expected = fault_free(records)
    histories: dict[str, int] = {}
    for name, extra in (("eager", {"REDUCE__FETCH_MIN_BYTES": "1"}),
                        ("gathering", {"REDUCE__FETCH_MIN_BYTES": str(value_bytes),
                                       "REDUCE__FETCH_MAX_WAIT_MS": "4000"})):
        settings = configure(monkeypatch, kafka_bootstrap, **extra)
        assert settings.reduce.fetch_min_bytes == (value_bytes if name == "gathering" else 1)
        await create_topics(settings)
        index = tmp_path / f"{name}.sqlite"
        reducer = launch(services, tmp_path, f"reduce-{name}", "reduce")
        sink = launch(services, tmp_path, f"sink-{name}", "sink", "index", "--index", str(index))
        await reducer.wait_for("partition_restored", count=PARTITIONS)
        assert await service.publish(items(source, rate=40), settings) == len(source)  # 50 records every 1.25 s
        transitions = await settle(settings, index, [reducer, sink])
        check_transitions(transitions, expected)
        histories[name] = sum(dict(r.headers).get(wire.KIND_HEADER) == b"history" for r in transitions)
        assert reducer.terminate() == 0 and sink.terminate() == 0
    assert histories["gathering"] <= 2 * len(expected) < histories["eager"], histories


@pytest.mark.kafka
async def test_poison_records_go_to_dead_letters_and_the_rest_flows(kafka_bootstrap: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    settings = configure(monkeypatch, kafka_bootstrap, ALERTS__CLOCK="wall", ALERTS__CHECK_INTERVAL_S="0.2")
    await create_topics(settings)
    records = synthetic_stream(40, seed=3)
    good = keyed(records)
    pod = next(r for r in records if r.get("object", {}).get("kind") == "Pod")
    huge = dict(next(r for r in records if "object" in r))
    huge["object"] = {**huge["object"], "metadata": {**huge["object"]["metadata"],
                                                     "annotations": {"blob": "x" * (2 * 1024 * 1024)}}}
    poison: list[tuple[int, bytes | None, bytes]] = [
        (10, b"run-poison", b'{"type": "ADDED", "object": {"kind": "Job"'),
        (20, b"run-poison", json.dumps({"schema": "taugrid.io/intake/v999", "event_id": "e", "run_id": "run-poison",
                                        "at": "2026-08-20T09:00:00Z", "kind": "Resolution"}).encode()),
        (30, b"run-poison", json.dumps(huge).encode()),  # 2 MiB: the broker takes it, the reducer does not
        (35, None, json.dumps(pod).encode()),  # a valid change (a copy) without a run key
    ]
    producer = AIOKafkaProducer(**kafka.client_options(settings.kafka), acks="all", enable_idempotence=True,
                                max_request_size=settings.kafka.topics.max_message_bytes)
    await producer.start()
    try:
        for i, (item, key) in enumerate(good):
            for at, pkey, value in poison:
                if at == i:
                    await producer.send_and_wait(settings.kafka.topics.changes, value, key=pkey,
                                                 partition=0 if pkey is None else None)
            assert isinstance(item, Record) and key is not None
            await producer.send(settings.kafka.topics.changes, json.dumps(item.value).encode(), key=key.encode())
        await producer.flush()
    finally:
        await producer.stop()

    metrics, health = Metrics(), Health()
    reducer = ReduceService(settings, metrics=metrics, health=health)
    index = tmp_path / "index.sqlite"
    sink = index_sink_runner(settings, metrics=metrics, health=health, index_path=index)
    tasks = [asyncio.create_task(reducer.run()), asyncio.create_task(sink.run())]
    try:
        await settle(settings, index, tasks=tasks)
        assert health.not_ready() == []
        reducer.request_stop(drain=True)
        sink.request_stop(drain=True)
        async with asyncio.timeout(30):
            await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()

    letters = await read_topic(settings, settings.kafka.topics.dead_letters, 1)
    assert dead_reasons(letters) == Counter({"invalid JSON": 1, "unknown intake schema version": 1,
                                             "value too large": 1, "record without a run key": 1})
    assert all(f"{settings.kafka.topics.changes}/" in json.loads(r.value)["source"] for r in letters)
    assert sum(s.value for m in metrics.dead_letters.collect() for s in m.samples if s.name.endswith("_total")) == 4
    assert index_rows(index) == await replay_index(records, tmp_path / "replay.sqlite")
    # wall clock: every run still stuck (in its phase since August 2026) is older than the threshold, alerted once
    alert_records = await read_topic(settings, settings.kafka.topics.alerts, 1)
    alerts = [json.loads(r.value) for r in alert_records]
    waiting = stuck_at_end(fault_free(records).values())
    assert any(k[2] == "Admission" for k in waiting) and sorted(alert_keys(alert_records)) == sorted(waiting)
    assert {a["clock"] for a in alerts} == {"wall"}
    assert all(a["reason"] == waiting[(a["run_id"], a["attempt"], a["phase"])].reason for a in alerts)


@pytest.mark.kafka
async def test_serve_runs_intake_reducer_and_sink_in_one_process(kafka_bootstrap: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 services: list[Service]) -> None:
    settings = configure(monkeypatch, kafka_bootstrap)
    captures = synthetic_captures(tmp_path / "captures", runs=60, seed=13)
    index = tmp_path / "index.sqlite"
    serve = launch(services, tmp_path, "serve", "serve", "--from-capture", *map(str, captures), "--index",
                   str(index), "--create-topics", "--exit-when-done")
    assert serve.proc is not None
    assert await asyncio.to_thread(serve.proc.wait, 50) == 0, serve.tail()
    await asyncio.to_thread(replay, captures=captures, index_path=tmp_path / "replay.sqlite",
                            console=Console(file=io.StringIO()), quiet=True)
    assert index_rows(index) == index_rows(tmp_path / "replay.sqlite")
    assert index_rows(index)["runs"]
    events = [e["event"] for e in serve.events()]
    stops = [events.index(e) for e in ("intake_source_exhausted", "reducer_stopped", "sink_stopped")]
    assert stops == sorted(stops), "shutdown must follow the data flow: intake, reducer, sinks"
    assert stored_offsets(index, settings.sink.index_group), "the sink stores its offsets in the index"


async def drain_reducer(settings: Settings) -> None:
    """One in-process ``tracker reduce``: joins, reads every partition to its end, commits and stops."""
    reducer = ReduceService(settings, metrics=Metrics(), health=Health())
    task = asyncio.create_task(reducer.run())
    reducer.request_stop(drain=True)
    await asyncio.wait_for(task, 60)


async def latest_run_state(settings: Settings) -> dict[str, dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for rec in await read_topic(settings, settings.kafka.topics.run_state, PARTITIONS):
        assert rec.key is not None
        if b"/pod/" in rec.key or b"/point/" in rec.key or b"/minute/" in rec.key:  # a pod's, a point's, a
            continue  # progress minute's: apart from its run's
        if rec.value is None:
            latest.pop(rec.key.decode(), None)
        else:
            latest[rec.key.decode()] = json.loads(rec.value)
    return latest


@pytest.mark.kafka
async def test_finished_runs_are_retired_after_their_grace_also_across_a_restart(
        kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = configure(monkeypatch, kafka_bootstrap, REDUCE__RETIRE_AFTER_S=str(10 ** 9))
    await create_topics(settings)
    records = synthetic_stream(24, seed=9, outcomes=["succeeded", "running"])
    expected = fault_free(records)
    done = {run_id for run_id, h in expected.items() if h.run.status in FINAL_STATUSES}
    assert done and done != set(expected)
    await service.publish(items(keyed(records), 10_000), settings)
    await drain_reducer(settings)
    state = await latest_run_state(settings)
    assert set(state) == set(expected) and not any(doc.get("retired") for doc in state.values())

    # a restart with no grace: the runs that finished before it retire at their partition's next batch
    monkeypatch.setenv("TRACKER_REDUCE__RETIRE_AFTER_S", "0")
    settings = load_settings()
    producer = kafka.make_producer(settings.kafka)
    await kafka.start(producer, settings.kafka, what="test producer")
    try:
        for p in range(PARTITIONS):
            tick = builders.resolution_event(event_id=f"tick-{p}", run_id=f"tick-{p}", when=0, status="started")
            await producer.send(settings.kafka.topics.changes, json.dumps(tick).encode(), key=f"tick-{p}".encode(),
                                partition=p)
        await producer.flush()
    finally:
        await kafka.stop(producer, settings.kafka, what="test producer")
    await drain_reducer(settings)
    state = await latest_run_state(settings)
    assert {run_id for run_id, doc in state.items() if doc.get("retired")} == done
    assert {run_id for run_id, doc in state.items() if not doc.get("retired")} == \
        (set(expected) - done) | {f"tick-{p}" for p in range(PARTITIONS)}
    # each metric point is a run-state record of its own, and each progress minute (its report ids; snapshot
    # version 4); a retired run keeps none
    points, seen, firsts = await run_state_parts(settings)
    assert points == {run_id: {(p.metric, p.step) for p in h.metric_points or ()}
                      for run_id, h in expected.items() if run_id not in done and h.metric_points}
    folded = Reducer()
    for i, rec in enumerate(records):
        folded.apply(rec, f"synthetic:{i}")
    live = {run_id: r for run_id, r in folded.runs.items() if run_id not in done}
    assert seen == {run_id: set(r.progress_seen) for run_id, r in live.items() if r.progress_seen}
    assert firsts == {run_id: r.progress_buckets for run_id, r in live.items() if r.progress_buckets}
    assert seen and all(doc["version"] == 4 and doc["facts"]["points"][1] == {} and doc["facts"]["progress_seen"] == []
                        and doc["facts"]["progress_buckets"] == [] for doc in state.values() if not doc.get("retired"))


async def run_state_parts(settings: Settings) -> tuple[dict[str, set[tuple[str, int]]], dict[str, set[str]],
                                                        dict[str, dict[int, int]]]:
    """Each run's metric points kept in run-state (tombstones applied), from their records' keys, and from its
    progress minutes' records the report ids it remembers and each minute's earliest report."""
    latest: dict[str, bytes | None] = {}
    for rec in await read_topic(settings, settings.kafka.topics.run_state, PARTITIONS):
        assert rec.key is not None
        key = rec.key.decode()
        if wire.point_of_key(key) is not None or wire.minute_of_key(key) is not None:
            latest[key] = rec.value
    points: dict[str, set[tuple[str, int]]] = {}
    seen: dict[str, set[str]] = {}
    firsts: dict[str, dict[int, int]] = {}
    for key, value in latest.items():
        point, minute = wire.point_of_key(key), wire.minute_of_key(key)
        if value is not None and point is not None:
            points.setdefault(point[0], set()).add((point[1], point[2]))
        elif value is not None and minute is not None:
            ids, first, _steps = minute_of_state(json.loads(value), *minute)
            seen.setdefault(minute[0], set()).update(k for k, _at in ids)
            if first is not None:
                firsts.setdefault(minute[0], {})[minute[1]] = first
    return points, seen, firsts


@pytest.mark.kafka
async def test_a_deactivated_run_is_not_retired_and_its_reactivation_reopens_it(
        kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped by a Kueue deactivation whose Job still exists may come back: `tracker reduce` keeps it (no
    grace at all here) until a later batch brings the reactivation, re-admission and success."""
    from sim.scenarios import SCENARIOS, _cluster

    settings = configure(monkeypatch, kafka_bootstrap, REDUCE__RETIRE_AFTER_S="0")
    await create_topics(settings)
    writes = sorted((w for ws in _cluster().by_scenario["reactivated"].values() for w in ws), key=lambda w: w.at)

    def reactivated(record: dict[str, Any]) -> bool:
        conds = record.get("object", {}).get("status", {}).get("conditions", []) \
            if record.get("object", {}).get("kind") == "Workload" else []
        return any(c.get("type") == "Requeued" and c.get("reason") == "Reactivated" for c in conds)

    cut = next(i for i, w in enumerate(writes) if reactivated(w.record))
    records = [w.record for w in writes]
    run_id = SCENARIOS["reactivated"].run_ids[0]
    expected = fault_free(records)[run_id]
    assert expected.run.status is Status.SUCCEEDED and expected.run.attempts >= 2
    assert fault_free(records[:cut])[run_id].run.status is Status.STOPPED
    await service.publish(items(keyed(records[:cut]), 10_000), settings)
    await drain_reducer(settings)
    assert not (await latest_run_state(settings))[run_id].get("retired")  # stopped, but it may come back
    await service.publish(items(keyed(records[cut:]), 10_000), settings)
    await drain_reducer(settings)
    assert (await latest_run_state(settings))[run_id].get("retired")  # succeeded: finished for good
    out = await read_topic(settings, settings.kafka.topics.transitions, PARTITIONS)
    latest = last_histories(out)[run_id][1]
    assert latest == replace(expected, metric_points=None, pods=None)


class RefusingSink:
    """A sink without offsets of its own (as the ADX sink): it refuses one run's history (``errors.InvalidInput``, the
    sinks' "refused data": a bare ValueError is a bug and stops the sink)."""

    def __init__(self, refused: str) -> None:
        self.refused = refused
        self.written: dict[str, RunHistory] = {}

    def write(self, updates: Sequence[HistoryUpdate]) -> int:
        if any(u.run_id == self.refused for u in updates):
            raise errors.InvalidInput(f"run {self.refused} refused")
        self.written.update((u.run_id, u.history) for u in updates if u.history is not None)
        return len(updates)


@pytest.mark.kafka
async def test_sink_without_offset_storage_commits_to_kafka_and_skips_refused_histories(
        kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = configure(monkeypatch, kafka_bootstrap)
    await create_topics(settings)
    histories = fault_free(synthetic_stream(12, seed=21))
    refused = sorted(histories)[3]
    producer = kafka.make_producer(settings.kafka)
    await kafka.start(producer, settings.kafka, what="test producer")
    try:
        for run_id, h in histories.items():
            value = adapter(RunHistory).dump_json(replace(h, metric_points=None, pods=None))
            await producer.send(settings.kafka.topics.transitions, value, key=run_id.encode(),
                                headers=[(wire.KIND_HEADER, b"history")])
        await producer.flush()
    finally:
        await kafka.stop(producer, settings.kafka, what="test producer")

    sink, metrics, group = RefusingSink(refused), Metrics(), f"{settings.sink.index_group}-refusing"
    runner = SinkRunner("refusing", open_sink=lambda: contextlib.nullcontext(sink), group=group, settings=settings,
                        metrics=metrics, health=Health())
    task = asyncio.create_task(runner.run())
    async with asyncio.timeout(30):
        while len(sink.written) < len(histories) - 1:
            assert not task.done(), task.exception()
            await asyncio.sleep(0.1)
    runner.request_stop(drain=True)
    await asyncio.wait_for(task, 30)

    assert sink.written == {run_id: replace(h, metric_points=None, pods=None) for run_id, h in histories.items()
                            if run_id != refused}
    assert [s.value for m in metrics.sink_bad_records.collect() for s in m.samples if s.name.endswith("_total")] \
        == [1.0]
    admin = AIOKafkaAdminClient(**kafka.client_options(settings.kafka))
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    ends = {r.partition: r.offset + 1 for r in await read_topic(settings, settings.kafka.topics.transitions,
                                                                 PARTITIONS)}
    assert {tp.partition: o.offset for tp, o in committed.items()} == ends  # at least once: committed after writing


@pytest.mark.kafka
async def test_drain_targets_cover_the_transaction_committed_just_before(
        kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain stops at the high watermark, not at the last stable offset: a commit returns before its markers are
    written, so the LSO read right after it often still excludes the transaction. (The cause of a flaky
    ``serve --exit-when-done`` that lost one partition's runs: the reducer's last commit, then the sink's drain
    targets.) Every round here reads the targets right after a commit returned."""
    settings = configure(monkeypatch, kafka_bootstrap)
    await create_topics(settings)
    tp = TopicPartition(settings.kafka.topics.transitions, 1)
    producer = kafka.make_producer(settings.kafka, transactional_id=f"{settings.reduce.transactional_id_prefix}.t")
    await kafka.start(producer, settings.kafka, what="test producer")
    lso_short = 0
    try:
        reader = kafka.make_consumer(settings.kafka, group_id=None)
        await kafka.start(reader, settings.kafka, what="lso reader")
        try:
            for _ in range(40):
                async with producer.transaction():
                    sent = await (await producer.send(tp.topic, b"{}", key=b"k", partition=tp.partition))
                lso_short += (await reader.end_offsets([tp]))[tp] <= sent.offset  # the race, for the record only
                assert (await kafka.drain_targets(settings.kafka, [tp]))[tp] > sent.offset
        finally:
            await kafka.stop(reader, settings.kafka, what="lso reader")
    finally:
        await kafka.stop(producer, settings.kafka, what="test producer")
    print(f"read_committed end offset short of the just-committed transaction in {lso_short} of 40 rounds")


class PrivateBroker:
    """A single-node KRaft broker of this test alone, restartable on the same port with the same data."""

    def __init__(self, state: Path) -> None:
        java = shutil.which("java")
        if java is None or not build.KAFKA.is_built():
            unavailable("a private broker needs java and the Kafka jars (python -m tests.infra up "
                        "--components kafka)")
        assert java is not None
        self.state = state
        self.port, controller = free_port(), free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        state.mkdir(parents=True)
        (state / "log4j.properties").write_text("log4j.rootLogger=WARN, stdout\nlog4j.appender.stdout="
                                                "org.apache.log4j.ConsoleAppender\nlog4j.appender.stdout.layout="
                                                "org.apache.log4j.PatternLayout\n")
        self.properties = state / "server.properties"
        self.properties.write_text("\n".join([
            "process.roles=broker,controller", "node.id=1", f"controller.quorum.voters=1@127.0.0.1:{controller}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}", "inter.broker.listener.name=PLAINTEXT",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT", f"log.dirs={state / 'data'}",
            "auto.create.topics.enable=false", "offsets.topic.replication.factor=1", "offsets.topic.num.partitions=1",
            "transaction.state.log.replication.factor=1", "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=1", "group.initial.rebalance.delay.ms=0", ""]))
        self.jvm = [java, "-Xms256m", "-Xmx512m", f"-Dlog4j.configuration=file:{state / 'log4j.properties'}",
                    "-cp", f"{build.KAFKA.path / 'lib'}/*"]
        infra_kafka.format_storage(self.jvm, self.properties, infra_kafka.new_cluster_id(),
                                   what="formatting the private broker's storage")
        self.process: Process | None = None

    def start(self) -> None:
        self.process = spawn("kafka-private", [*self.jvm, "kafka.Kafka", self.properties],
                             log_path=self.state / "kafka.log")
        deadline = time.monotonic() + 90
        while not infra_kafka.is_ready(self.bootstrap):
            if not self.process.alive() or time.monotonic() > deadline:
                pytest.fail(f"private broker did not start:\n{(self.state / 'kafka.log').read_text()[-3000:]}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=30)
            self.process = None


@pytest.fixture
def private_broker(kafka_bootstrap: str, tmp_path: Path) -> Iterator[PrivateBroker]:
    """Requires the session broker too: its fixture builds (or fails on) the same jars."""
    broker = PrivateBroker(tmp_path / "broker")
    broker.start()
    yield broker
    broker.stop()


@pytest.mark.kafka
async def test_broker_restart_during_load_resumes_by_itself(private_broker: PrivateBroker, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            services: list[Service]) -> None:
    settings = configure(monkeypatch, private_broker.bootstrap, REDUCE__MAX_BATCH_RECORDS="200",
                         REDUCE__MAX_RETRIES="30", SINK__MAX_RETRIES="30", SOURCE__MAX_RETRIES="30",
                         KAFKA__REQUEST_TIMEOUT_MS="5000", KAFKA__CALL_TIMEOUT_S="8")  # a hung call ends sooner
    await create_topics(settings)
    records = synthetic_stream(200, seed=17)
    index = tmp_path / "index.sqlite"
    reducer = launch(services, tmp_path, "reduce", "reduce")
    sink = launch(services, tmp_path, "sink", "sink", "index", "--index", str(index))
    await reducer.wait_for("partition_restored", count=PARTITIONS)
    await sink.wait_for("positioned")
    source = keyed(records)
    producing = asyncio.create_task(service.publish(items(source, rate=300), settings))  # ~10 s of load
    await asyncio.sleep(2.0)
    assert not producing.done(), "the broker should go down under load"
    await asyncio.to_thread(private_broker.stop)
    await asyncio.sleep(1.0)
    await asyncio.to_thread(private_broker.start)
    restarted = time.time()
    assert await producing == len(source)  # delivered in the end, some of it twice (the reducer ignores that)
    transitions = await settle(settings, index, [reducer, sink], within=50)

    assert (reducer.starts, sink.starts) == (1, 1)  # nobody restarted them
    assert any(r.timestamp / 1000 > restarted for r in transitions), "nothing was reduced after the restart"
    check_transitions(transitions, fault_free(records))
    assert index_rows(index) == await replay_index(records, tmp_path / "replay.sqlite")
