"""How service processes fail: a fatal error raised inside a task group still stops the process with the one
"stopped_by_an_error" line and exit code 1 (``run_process``), and a partition of ``tracker reduce`` that raises
cancels and waits for the other partitions' work before their producers are stopped. No services needed."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaConnectionError
from rich.console import Console

from tests.watch.test_watch_unit import NS, FakeApiServer, job_run
from tracker.core.reducer import Reducer
from tracker.runtime import service
from tracker.runtime.ops import Health, Metrics, Shutdown
from tracker.runtime.reduce import ReduceFatal, ReduceService, _Partition
from tracker.runtime.watch_cmd import add_watch_command
from tracker.settings import Settings


def log_lines(err: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


# ------------------------------------------------------------------------------------------ run_process


async def test_a_fatal_error_inside_nested_task_groups_is_the_one_stopped_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    async def fail() -> None:
        await asyncio.sleep(0.01)
        raise OSError(28, "No space left on device")

    async def body(metrics: Metrics, health: Health, shutdown: Shutdown) -> None:
        async with asyncio.TaskGroup() as outer:
            outer.create_task(asyncio.sleep(30))

            async def inner() -> None:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(fail())
                    tg.create_task(asyncio.sleep(30))
            outer.create_task(inner())

    assert await asyncio.wait_for(service.run_process(Settings(), "reduce", body=body), 10) == 1
    err = capsys.readouterr().err
    stopped = [line for line in log_lines(err) if line["event"] == "stopped_by_an_error"]
    assert len(stopped) == 1, err
    assert stopped[0]["error_type"] == "OSError" and "No space left on device" in stopped[0]["error"]
    assert "Traceback" not in err


@pytest.mark.parametrize("content", [b"my notes\n", b""])
async def test_embedded_serve_on_a_file_that_is_not_an_index_is_the_one_stopped_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, content: bytes) -> None:
    from tracker.cli.args import DEMO_CAPTURES

    for name in [n for n in os.environ if n.startswith("TRACKER_KAFKA__")]:
        monkeypatch.delenv(name)
    index = tmp_path / "notes.sqlite"
    index.write_bytes(content)
    if not content:  # an index of runs a replay cannot continue (written as the Kafka sink writes)
        from tracker.shell.capture import Record, read_capture
        from tracker.shell.index import ExperimentIndex

        red = Reducer()
        for rec in read_capture(DEMO_CAPTURES / "jobs.json"):
            assert isinstance(rec, Record)
            red.apply(rec.value)
        with ExperimentIndex(index) as ix:
            ix.write(red.flush().updates)
    opts = service.ServeOptions(captures=(DEMO_CAPTURES / "jobs.json",), index_path=index, exit_when_done=True)
    body = service.serve_body(Settings(), opts)
    assert await asyncio.wait_for(service.run_process(Settings(), "serve", body=body), 60) == 1
    err = capsys.readouterr().err
    stopped = [line for line in log_lines(err) if line["event"] == "stopped_by_an_error"]
    assert len(stopped) == 1 and "Traceback" not in err, err
    assert stopped[0]["error_type"] in ("IndexOpenError", "StateError")
    if content:
        assert index.read_bytes() == content


async def test_a_bug_inside_a_task_group_is_not_taken_for_a_fatal_error() -> None:
    async def body(metrics: Metrics, health: Health, shutdown: Shutdown) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(asyncio.sleep(30))
            raise KeyError("a bug")

    with pytest.raises(ExceptionGroup) as info:
        await asyncio.wait_for(service.run_process(Settings(), "reduce", body=body), 10)
    assert info.group_contains(KeyError)


@contextmanager
def fake_apiserver(objects: list[dict[str, Any]]) -> Iterator[str]:
    """A ``FakeApiServer`` holding ``objects``, served from its own thread (the command under test runs its own
    event loop in this one, as the process does); yields its URL."""
    loop = asyncio.new_event_loop()
    server = FakeApiServer()
    ready = threading.Event()

    def serve() -> None:
        async def start() -> None:
            await server.start()
            for obj in objects:
                await server.write(obj)
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(server.stop())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10), "the fake apiserver did not start"
    try:
        yield server.url
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_tracker_watch_failing_inside_a_task_group_exits_1_with_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader-elected watcher runs its term inside the election's task group: an error there (here a checkpoint
    of an unsupported version) arrives as an ExceptionGroup."""
    for name in ("TRACKER_KAFKA__BOOTSTRAP_SERVERS", "TRACKER_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    checkpoint = tmp_path / "watch.sqlite"
    with sqlite3.connect(checkpoint) as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('version', '999')")
    db.close()
    with fake_apiserver([job_run("train")[0]["object"]]) as url:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        parser = argparse.ArgumentParser(prog="tracker")
        add_watch_command(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(["watch", "--kubeconfig", str(kubeconfig), "-n", NS, "--capture",
                                  str(tmp_path / "capture.jsonl"), "--checkpoint", str(checkpoint),
                                  "--lease-namespace", NS, "--identity", "a", "--lease-duration", "3",
                                  "--renew-deadline", "2", "--retry-period", "0.2", "--log-format", "json"])
        rc = args.func(args, Console(file=None, force_terminal=False, width=200))
    err = capsys.readouterr().err
    assert rc == 1, err
    stopped = [line for line in log_lines(err) if line["event"] == "stopped_by_an_error"]
    assert len(stopped) == 1 and stopped[0]["process"] == "watch", err
    assert "unsupported watch checkpoint version 999" in stopped[0]["error"]
    assert "Traceback" not in err


# ------------------------------------------------------------------------------------------ tracker reduce


class FakeProducer:
    """A transactional producer that records what is done with it, and when it is used after ``stop``."""

    def __init__(self, name: str, events: list[str], *, fail: bool = False, slow_s: float = 0.0) -> None:
        self.name, self.events, self.fail, self.slow_s = name, events, fail, slow_s
        self.stopped = False

    def _use(self, what: str) -> None:
        self.events.append(f"{self.name} {what}" + (" AFTER STOP" if self.stopped else ""))

    async def begin_transaction(self) -> None:
        self._use("begin")
        if self.fail:
            raise KafkaConnectionError("broker gone")
        try:
            await asyncio.sleep(self.slow_s)  # a slow broker
        except asyncio.CancelledError:
            self.events.append(f"{self.name} cancelled")
            raise
        self._use("began")

    async def send(self, topic: str, **_kwargs: Any) -> asyncio.Future[None]:
        self._use("send")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def send_offsets_to_transaction(self, offsets: Any, group_id: str) -> None:
        self._use("offsets")

    async def commit_transaction(self) -> None:
        self._use("commit")

    async def stop(self) -> None:
        self.stopped = True
        self.events.append(f"{self.name} stopped")


class FakeConsumer:
    """One poll with a record on each of two partitions, then nothing."""

    def __init__(self, batches: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]) -> None:
        self.batches = batches
        self.stopped = False

    def subscribe(self, topics: list[str], listener: Any) -> None:
        return None

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None
                      ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        batches, self.batches = self.batches, {}
        if not batches:
            await asyncio.sleep(timeout_ms / 1000)
        return batches

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        return None

    async def stop(self) -> None:
        self.stopped = True


def record(tp: TopicPartition) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(topic=tp.topic, partition=tp.partition, offset=0, timestamp=0, timestamp_type=0,
                          key=b"run-a", value=b"not json", checksum=None, serialized_key_size=5,
                          serialized_value_size=8, headers=[])


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in leaves(e)]
    return [exc]


async def test_a_failing_partition_cancels_and_awaits_the_others_before_their_producers_stop() -> None:
    """Partition 0's transaction fails once more than ``max_retries`` (the reducer cannot go on) while partition
    1's transaction is still in flight: partition 1's work is cancelled and finished before its producer is
    stopped, and nothing uses a producer after it was stopped."""
    settings = Settings()
    reducer = ReduceService(settings, metrics=Metrics(), health=Health())
    events: list[str] = []
    changes = settings.kafka.topics.changes
    tp0, tp1 = TopicPartition(changes, 0), TopicPartition(changes, 1)
    p0 = FakeProducer("p0", events, fail=True)
    p1 = FakeProducer("p1", events, slow_s=0.5)
    reducer._parts = {tp0: _Partition(tp0, p0, Reducer(reducer.limits)),  # type: ignore[arg-type]
                      tp1: _Partition(tp1, p1, Reducer(reducer.limits))}  # type: ignore[arg-type]
    reducer._joined = True
    reducer._failures[tp0] = (settings.reduce.max_retries, 0.0)  # this failure is one too many
    consumer, restorer = FakeConsumer({tp0: [record(tp0)], tp1: [record(tp1)]}), FakeConsumer({})

    async def connect() -> tuple[FakeConsumer, FakeConsumer]:
        return consumer, restorer

    reducer._connect = connect  # type: ignore[assignment,method-assign]
    with pytest.raises(BaseException) as info:
        await asyncio.wait_for(reducer.run(), 10)
    assert any(isinstance(e, ReduceFatal) for e in leaves(info.value)), info.value
    await asyncio.sleep(0.7)  # whatever was left running would now go on with its stopped producer
    assert not [e for e in events if "AFTER STOP" in e], events
    assert "p1 cancelled" in events and events.index("p1 cancelled") < events.index("p1 stopped"), events
    assert consumer.stopped and restorer.stopped
