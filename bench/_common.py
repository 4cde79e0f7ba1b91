"""Helpers shared by the benchmarks that drive the tracker from outside, through its stable paths only: the
``tracker`` command line as subprocesses (wall and CPU time, peak RSS), a Kafka broker's topics read and written
with aiokafka, the experiment index read-only, and the run keys of generated records.

Nothing here imports the reducer or its derivation: a benchmark built on these helpers measures whatever
``tracker`` the working tree holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
LABEL_RUN_ID = "taugrid.io/run-id"  # the run id label (README.md); the watcher keys a run's records by it
CLK_TCK = os.sysconf("SC_CLK_TCK")


def tracker_command() -> list[str]:
    """The ``tracker`` entry point of the environment running this script."""
    exe = Path(sys.executable).with_name("tracker")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tracker.cli"]


def load_average() -> str:
    """The machine's load average (1, 5, 15 minutes), as ``uptime`` prints it."""
    one, five, fifteen = Path("/proc/loadavg").read_text().split()[:3]
    return f"load average {one}, {five}, {fifteen} ({os.cpu_count()} cores)"


# ------------------------------------------------------------------------------------------ processes


@dataclass(frozen=True)
class Finished:
    """A finished subprocess: exit code, wall time, its own CPU time (user, system), peak RSS (``VmHWM``, sampled
    while it ran: its last 50 ms may be missed), output."""

    rc: int
    wall_s: float
    user_s: float
    sys_s: float
    maxrss_kib: int
    stdout: bytes
    stderr: bytes

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s

    def check(self, what: str) -> Finished:
        if self.rc != 0:
            tail = self.stderr.decode(errors="replace")[-2000:]
            raise RuntimeError(f"{what} exited with {self.rc}:\n{tail}")
        return self


def run_timed(args: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None,
              stdin: Path | None = None, cwd: Path = REPO) -> Finished:
    """Run ``args`` to its end; its wall time and the CPU time and peak RSS of that process alone (``wait4``).
    Stopped (SIGTERM, then SIGKILL) and TimeoutError raised if it runs longer than ``timeout_s``."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            (stdin.open("rb") if stdin is not None else open(os.devnull, "rb")) as inp:
        started = time.perf_counter()
        proc = subprocess.Popen(list(args), stdin=inp, stdout=out, stderr=err, cwd=cwd,
                                env=dict(env) if env is not None else None)
        try:
            status, usage, peak = _wait4(proc, started + timeout_s)
        except BaseException:
            stop_process(proc)
            raise
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        return Finished(os.waitstatus_to_exitcode(status), wall, usage.ru_utime, usage.ru_stime, peak,
                        out.read(), err.read())


def _wait4(proc: subprocess.Popen[bytes], deadline: float) -> tuple[int, Any, int]:
    """Reap ``proc`` with its resource usage, polling until ``deadline`` (perf_counter); also its peak RSS in KiB,
    sampled (``VmHWM``) while it runs: ``ru_maxrss`` of a child counts the parent's RSS when it forked it."""
    delay = 0.002
    peak = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
            return status, usage, peak
        with contextlib.suppress(OSError):
            peak = max(peak, memory_kib(proc.pid).get("VmHWM", 0))
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{proc.args!r} did not finish in time")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """SIGTERM, then SIGKILL if it has not ended within ``grace_s``; reaped either way."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


async def stop_async_process(proc: asyncio.subprocess.Process, grace_s: float = 60.0) -> int | None:
    """SIGTERM, then SIGKILL if it has not ended within ``grace_s``; its exit code (None if it had to be killed)."""
    if proc.returncode is not None:
        return proc.returncode
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        return await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.wait_for(proc.wait(), 30)
        return None


@dataclass(frozen=True)
class Fed:
    """A subprocess fed its input on standard input once it waited for it (see ``run_fed``)."""

    finished: Finished
    startup_cpu_s: float  # CPU time it used before it first waited on standard input (imports, opening, restoring)
    startup_wall_s: float
    feed_s: float  # from the first byte written to standard input closed
    drain_s: float  # from standard input closed to its exit

    @property
    def work_cpu_s(self) -> float:
        """CPU time from waiting for its input to its exit: the work the input caused, without the start-up."""
        return self.finished.cpu_s - self.startup_cpu_s


def waiting_on_stdin(pid: int) -> bool:
    """Whether a thread of the process is blocked reading its standard input (a pipe): a read(2) on fd 0 or on a
    descriptor of the same pipe (the tracker reads ``-`` through a copy of fd 0, on a thread of its own in serve)."""
    proc = Path(f"/proc/{pid}")
    try:
        stdin = (proc / "fd" / "0").readlink()
    except OSError:
        return False
    try:
        tasks = list((proc / "task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            call = (task / "syscall").read_text().split()
            if len(call) > 1 and call[0] == "0":  # read(2) (x86-64 numbering)
                fd = int(call[1], 16)
                if fd == 0 or (proc / "fd" / str(fd)).readlink() == stdin:
                    return True
        except (OSError, ValueError):
            continue
    return False


def run_fed(args: Sequence[str], lines: Sequence[bytes], *, timeout_s: float, env: Mapping[str, str] | None = None,
            rate: float | None = None, cwd: Path = REPO) -> Fed:
    """Start ``args`` with a pipe as standard input; once it blocks reading it, note its CPU time, write ``lines``
    (all at once, or ``rate`` lines per second) and close the pipe; wait for its exit (``wait4``). The process is
    stopped (SIGTERM, then SIGKILL) and TimeoutError raised if it all takes longer than ``timeout_s``."""
    import threading

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        deadline = started + timeout_s
        proc = subprocess.Popen(list(args), stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=cwd,
                                env=dict(env) if env is not None else None)
        assert proc.stdin is not None
        stdin = proc.stdin
        times: dict[str, float] = {}
        failed: list[BaseException] = []

        def feed() -> None:
            try:
                times["first"] = time.perf_counter()
                if rate is None:
                    stdin.write(b"".join(lines))
                else:
                    for i, line in enumerate(lines):
                        delay = times["first"] + i / rate - time.perf_counter()
                        if delay > 0:
                            time.sleep(delay)
                        stdin.write(line)
                        stdin.flush()
                stdin.close()
            except BaseException as exc:  # a broken pipe: the process ended early (its exit code says why)
                failed.append(exc)
            times["closed"] = time.perf_counter()

        writer = threading.Thread(target=feed, daemon=True)
        try:
            while not waiting_on_stdin(proc.pid):
                if proc.poll() is not None:
                    err.seek(0)
                    raise RuntimeError(f"{args!r} exited with {proc.returncode} before reading its input: "
                                       + err.read().decode(errors="replace")[-2000:])
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"{args!r} never waited for its input")
                time.sleep(0.005)
            startup_cpu, startup_wall = cpu_seconds(proc.pid), time.perf_counter() - started
            writer.start()
            status, usage, peak = _wait4(proc, deadline)
        except BaseException:
            stop_process(proc)
            raise
        finally:
            if writer.ident is not None:
                writer.join(timeout=30)
        ended = time.perf_counter()
        out.seek(0)
        err.seek(0)
        done = Finished(os.waitstatus_to_exitcode(status), ended - started, usage.ru_utime, usage.ru_stime, peak,
                        out.read(), err.read())
        if failed and done.rc == 0:
            raise RuntimeError(f"feeding {args!r} failed: {failed[0]!r}")
        return Fed(done, startup_cpu, startup_wall, times.get("closed", ended) - times.get("first", ended),
                   ended - times.get("closed", ended))


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) a live process has used so far, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: fields 14 and 15 of proc(5)


def memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of a live process, KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0])
    return out


# ------------------------------------------------------------------------------------------ ops endpoints


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(port: int, path: str, timeout_s: float = 2.0) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError):
        return None


def metric_sums(exposition: str) -> dict[str, float]:
    """Each sample name of a Prometheus exposition (``tracker_changes_consumed_total``, ``..._sum``, ...) summed over
    its labels; ``name{label="v"}`` is kept as well for the labelled samples."""
    out: dict[str, float] = {}
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            continue
        sample, _, value = line.rpartition(" ")
        try:
            v = float(value)
        except ValueError:
            continue
        name = sample.partition("{")[0]
        out[name] = out.get(name, 0.0) + v
        if name != sample:
            out[sample] = v
    return out


def histogram_means(metrics: str) -> dict[str, float]:
    """Mean of each histogram in a Prometheus exposition, in seconds."""
    sums = metric_sums(metrics)
    return {name[:-4]: total / sums[name[:-4] + "_count"] for name, total in sums.items()
            if name.endswith("_sum") and "{" not in name and sums.get(name[:-4] + "_count")}


async def wait_until_ready(port: int, proc: asyncio.subprocess.Process, timeout_s: float, log: Path) -> None:
    """Until ``/readyz`` of the process answers ready; RuntimeError if it exits, TimeoutError after ``timeout_s``."""
    deadline = time.perf_counter() + timeout_s
    while await asyncio.to_thread(http_get, port, "/readyz") != "ready\n":
        if proc.returncode is not None:
            raise RuntimeError(f"the process exited with {proc.returncode}, see {log}")
        if time.perf_counter() > deadline:
            raise TimeoutError(f"not ready within {timeout_s:g} s, see {log}")
        await asyncio.sleep(0.05)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; misses are in ``values`` as ``inf`` (so a p99 with more than 1% misses is inf)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


# ------------------------------------------------------------------------------------------ Kafka


TOPIC_NAMES = {"CHANGES": "changes", "TRANSITIONS": "transitions", "RUN_STATE": "run-state",
               "DEAD_LETTERS": "dead-letters", "ALERTS": "alerts"}


def default_bootstrap() -> str | None:
    """The broker of this worktree's test environment (``python -m tests.infra up --components kafka``)."""
    from tests.infra.env import Environment

    entry = Environment().read().get("kafka")
    return str(entry["bootstrap"]) if entry else None


def environment(bootstrap: str, prefix: str, metrics_port: int, partitions: int) -> dict[str, str]:
    """Settings (as environment variables, which the tracker's subprocesses inherit) of topics, groups and
    transactional ids of their own, named ``<prefix>.*``, on one broker (replication 1)."""
    return {
        "TRACKER_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        **{f"TRACKER_KAFKA__TOPICS__{k}": f"{prefix}.{v}" for k, v in TOPIC_NAMES.items()},
        "TRACKER_KAFKA__TOPICS__PARTITIONS": str(partitions),
        "TRACKER_KAFKA__TOPICS__SIDE_PARTITIONS": "1",
        "TRACKER_KAFKA__TOPICS__REPLICATION_FACTOR": "1",
        "TRACKER_REDUCE__GROUP_ID": f"{prefix}-reduce",
        "TRACKER_REDUCE__TRANSACTIONAL_ID_PREFIX": prefix,
        "TRACKER_SINK__INDEX_GROUP": f"{prefix}-index",
        "TRACKER_OPS__METRICS_PORT": str(metrics_port),
        "TRACKER_OPS__LOG_LEVEL": "WARNING",
    }


def without_tracker_settings(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without any ``TRACKER_*`` variable (an embedded command must not pick up a broker)."""
    return {k: v for k, v in env.items() if not k.startswith("TRACKER_")}


@dataclass
class TopicTotals:
    records: int = 0
    key_bytes: int = 0
    value_bytes: int = 0
    tombstones: int = 0
    largest_value: int = 0

    @property
    def bytes(self) -> int:
        return self.key_bytes + self.value_bytes


async def read_topic(bootstrap: str, topic: str, partitions: int, timeout_s: float = 120.0) -> TopicTotals:
    """Every committed record of ``topic`` (``partitions`` of them; read_committed, beginning to end): counts and
    sizes."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20)
    await asyncio.wait_for(consumer.start(), timeout_s)
    totals = TopicTotals()
    try:
        async with asyncio.timeout(timeout_s):
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)  # read_committed: the last stable offset
            left = {tp for tp in tps if ends[tp] > 0}
            while left:
                for tp, records in (await consumer.getmany(*left, timeout_ms=500)).items():
                    for r in records:
                        totals.records += 1
                        totals.key_bytes += len(r.key or b"")
                        size = len(r.value) if r.value is not None else 0
                        totals.value_bytes += size
                        totals.tombstones += r.value is None
                        totals.largest_value = max(totals.largest_value, size)
                    if records and records[-1].offset + 1 >= ends[tp]:
                        left.discard(tp)
                for tp in list(left):  # transaction markers at the end leave nothing more to read
                    if await consumer.position(tp) >= ends[tp]:
                        left.discard(tp)
    finally:
        await asyncio.wait_for(consumer.stop(), timeout_s)
    return totals


async def keep_every_version(bootstrap: str, topics: Sequence[str], timeout_s: float = 60.0) -> None:
    """Keep the log cleaner off the records of the compacted ``topics`` for a day (``min.compaction.lag.ms``), so
    that every record the benchmark made can be counted after it: a compacted topic otherwise loses the older
    versions of a key once a segment rolls (1 GiB by default, a few minutes of a wide run's run-state)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await asyncio.wait_for(admin.start(), timeout_s)
    try:
        for topic in topics:
            described = await asyncio.wait_for(admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic)]), timeout_s)
            entries = described[0].to_object()["resources"][0]["config_entries"]
            own = {e["config_names"]: e["config_value"] for e in entries if e["config_source"] == 1}  # the topic's
            own["min.compaction.lag.ms"] = str(24 * 3_600_000)
            # AlterConfigs replaces the topic's own settings with the ones given: all of them are given again
            done = await asyncio.wait_for(admin.alter_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic, configs=own)]), timeout_s)
            for response in done:
                for res in response.to_object()["resources"]:
                    if res["error_code"]:
                        raise RuntimeError(f"altering {topic}: {res['error_message'] or res['error_code']}")
    finally:
        await asyncio.wait_for(admin.close(), timeout_s)


async def delete_topics(bootstrap: str, prefix: str, timeout_s: float = 60.0) -> None:
    """Delete the benchmark's own topics, every one named ``<prefix>.*`` (``tracker topics create`` makes a
    watch-state topic too); a wide run leaves gigabytes in them."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await asyncio.wait_for(admin.start(), timeout_s)
    try:
        doomed = [t for t in await asyncio.wait_for(admin.list_topics(), timeout_s) if t.startswith(prefix + ".")]
        if doomed:
            await asyncio.wait_for(admin.delete_topics(doomed), timeout_s)
    finally:
        await asyncio.wait_for(admin.close(), timeout_s)


async def group_committed(bootstrap: str, group: str, timeout_s: float = 30.0) -> int:
    """The sum of a consumer group's committed offsets (0 if it has none yet)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await asyncio.wait_for(admin.start(), timeout_s)
    try:
        offsets = await asyncio.wait_for(admin.list_consumer_group_offsets(group), timeout_s)
    except KafkaError:
        return 0
    finally:
        await asyncio.wait_for(admin.close(), timeout_s)
    return sum(int(o.offset) for o in offsets.values() if o.offset > 0)


# ------------------------------------------------------------------------------------------ run keys


class RunKeys:
    """The run id of each generated record, as the watcher keys it: a Job or RayJob by its run id label, an
    object by the run of its owner (``ownerReferences``), an Event by the run of the object it is about, an intake
    event by its ``run_id``. Owners must come before what they own (as in a time-ordered stream)."""

    def __init__(self) -> None:
        self.run_of_uid: dict[str, str] = {}

    def key(self, record: Mapping[str, Any]) -> str:
        if "object" not in record:
            return str(record["run_id"])
        obj = record["object"]
        meta = obj["metadata"]
        run: str | None = None
        if obj["kind"] == "Event":
            about = obj.get("involvedObject") or obj.get("regarding") or {}
            run = self.run_of_uid.get(about.get("uid", ""))
        else:
            for owner in meta.get("ownerReferences") or ():
                run = self.run_of_uid.get(owner["uid"])
                if run is not None:
                    break
            if run is None and obj["kind"] in ("Job", "RayJob"):
                run = (meta.get("labels") or {}).get(LABEL_RUN_ID)
        if run is None:
            raise KeyError(f"no run for {obj['kind']} {meta.get('namespace')}/{meta['name']}")
        self.run_of_uid[meta["uid"]] = run
        return run

    def keys(self, records: Iterable[Mapping[str, Any]]) -> list[str]:
        return [self.key(r) for r in records]


def source_of(record: Mapping[str, Any]) -> str:
    """The ``source`` header a watcher of every namespace gives a change (``watch:<resource>@*``), or ``intake``."""
    if "object" not in record:
        return "intake"
    return "watch:" + {"Job": "jobs", "RayJob": "rayjobs", "RayCluster": "rayclusters", "Workload": "workloads",
                       "Pod": "pods", "Event": "events"}.get(record["object"]["kind"], "other") + "@*"


def write_lines(fh: IO[bytes], values: Iterable[bytes]) -> int:
    n = 0
    for v in values:
        fh.write(v)
        fh.write(b"\n")
        n += 1
    return n
