"""Benchmark of the Kafka pipeline on one broker: raw consume, the reduce path, end-to-end latency, memory per run.

    uv run python -m tests.infra up --components kafka      # or any broker: --bootstrap HOST:PORT
    uv run python bench/kafka_pipeline.py [--runs 2000] [--rates 50 200 500] [--seconds 10] [--scale-out 1 2]
                                          [--sink inprocess|process] [--poll 0.01] [--progress-every-s 0]
                                          [--fetch-min-bytes BYTES] [--fetch-max-wait-ms MS]

Figures, in one run against the same broker and topic layout (4 partitions):

1. raw consume: an aiokafka consumer (read_committed, no processing) reading the changes topic: records/s;
2. reduce: ``tracker reduce`` (a subprocess, 4 partitions, transactions) folding the same changes: the changes it
   folded and committed between ready and every offset committed, divided by that interval (what it did while
   starting, before it was ready, counts on neither side): changes/s, and its ratio to (1);
3. end to end: progress changes offered at fixed rates (one phase per rate) while ``tracker reduce`` and the index
   sink run (``--progress-every-s``: the event time between two reports of one run; 0, all at one instant); latency
   from a change produced to the experiment-index row that reflects it committed (p50/p95/p99).
   A change not indexed within ``--miss-after`` seconds (default 60) of the phase's last send is a miss: it counts
   as an infinite latency in the percentiles, and the misses are reported. Beside them, per phase: the rate the
   changes were really sent at, the reducer's backlog (``tracker_consumer_lag``) right after the last send, the CPU
   time of the processes over the phase, in cores, and the reducer's transactions (changes and records each, fold
   and begin..commit time). ``--sink inprocess`` (the default) runs the index sink in this process, which notes its
   own commits; ``--sink process`` runs ``tracker sink index`` as a process of its own, as it is deployed, and
   reads the index read-only every ``--poll`` seconds (latencies late by up to that);
4. memory per active run: tracemalloc growth of a Reducer holding runs that are
   still running, divided by their number.
5. scale-out: N ``tracker reduce`` processes in one consumer group (default 1 and 2), each N on fresh topics
   holding the same input (``--scale-runs``): changes/s while all N work, and the ratio to one process. On one
   machine they share its cores with the broker; across machines, partitions and processes scale further.

The synthetic input (``synthetic_stream``) is Job + Kueue Workload + Pod + Event watch events and TauGrid intake
events per run, interleaved in time order; some runs stay pending, some keep running, the rest finish.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/kafka_pipeline.py
    sys.path.insert(0, str(REPO))

from aiokafka import TopicPartition  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient  # noqa: E402
from aiokafka.errors import KafkaError  # noqa: E402

import bench._common as common  # noqa: E402
from bench._common import (  # noqa: E402
    cpu_seconds,
    default_bootstrap,
    free_port,
    histogram_means,
    http_get,
    metric_sums,
    percentile,
    stop_async_process,
    tracker_command,
)
from sim import builders as b  # noqa: E402
from tracker.core.model import LABEL_QUEUE, LABEL_RUN_ID, HistoryUpdate  # noqa: E402
from tracker.core.reducer import Reducer  # noqa: E402
from tracker.runtime import service  # noqa: E402
from tracker.runtime.ops import Health, Metrics  # noqa: E402
from tracker.runtime.sinks import OffsetKey, index_sink_runner  # noqa: E402
from tracker.settings import Settings, load_settings  # noqa: E402
from tracker.shell import kafka  # noqa: E402
from tracker.shell.capture import Record  # noqa: E402
from tracker.shell.index import ExperimentIndex, StateRows  # noqa: E402
from tracker.shell.watch.keying import RunKeyer  # noqa: E402

Event = dict[str, Any]
QUEUE = "gpu-a"
CLUSTER_QUEUE = "gpu-cq"
IMAGE = "registry.local/train:1"


# ------------------------------------------------------------------------------------------ input


def run_id_of(i: int, seed: int) -> str:
    return f"run-{seed:x}-{i:05d}"


def synthetic_run(i: int, seed: int, rng: random.Random, *, progress: int = 3, outcome: str | None = None
                  ) -> list[tuple[int, Event]]:
    """One run's records as (time in ms, record). ``outcome``: pending, running, succeeded or failed."""
    run_id = run_id_of(i, seed)
    ns = f"team-{i % 3}"
    name = f"train-{seed:x}-{i:05d}"
    job_uid = b.uid("job", run_id)
    wl_uid = b.uid("workload", run_id)
    pod_name = f"{name}-{b.rand_suffix(run_id)}"
    pod_uid = b.uid("pod", run_id)
    if outcome is None:
        outcome = rng.choices(["pending", "running", "succeeded", "failed"], [1, 2, 5, 2])[0]
    t0 = b.DAY + 9 * 3_600_000 + i * 1_500 + rng.randrange(1_000)
    out: list[tuple[int, Event]] = []

    def watch(when: int, etype: str, obj: Event) -> None:
        out.append((when, {"type": etype, "object": obj}))

    out.append((t0, b.resolution_event(event_id=f"{run_id}-res", run_id=run_id, when=t0, status="succeeded",
                                       project="llm", workspace=ns, target="h100")))
    out.append((t0 + 500, b.rendering_event(event_id=f"{run_id}-ren", run_id=run_id, when=t0 + 500,
                                            status="succeeded", workload_kind="Job", namespace=ns, name=name,
                                            queue=QUEUE)))
    created = t0 + 1_000
    labels = {LABEL_RUN_ID: run_id, LABEL_QUEUE: QUEUE}
    template = b.pod_template({"app": "train"}, b.template_spec(
        containers=[b.container(name="train", image=IMAGE, command=["python", "train.py"], cpu_millis=4000,
                                memory_mi=16384, gpus=1)], restart_policy="Never"))
    job_meta = b.object_meta(name=name, namespace=ns, uid=job_uid, created=created, generation=1, labels=labels)

    def job(suspend: bool, status: Event) -> Event:
        spec = b.job_spec(uid=job_uid, template=template, parallelism=1, completions=1, backoff_limit=0,
                          suspend=suspend)
        return b.job(meta=job_meta, spec=spec, status=status)

    watch(created, "ADDED", job(True, b.job_status()))
    wl_meta = b.object_meta(name=b.workload_name("Job", "batch", name, job_uid), namespace=ns, uid=wl_uid,
                            created=created + 100, generation=1,
                            owners=[b.owner_reference("batch/v1", "Job", name, job_uid)])
    wl_spec = b.workload_spec(api="v1beta1", queue=QUEUE, pod_sets=[b.pod_set("main", 1, template)], priority=0,
                              priority_class=None, active=True)
    pending = b.condition("QuotaReserved", False, "Pending", "couldn't assign flavors to pod set main: "
                          "insufficient unused quota for nvidia.com/gpu", created + 200, generation=1)
    watch(created + 100, "ADDED", b.workload(api="v1beta1", meta=wl_meta, spec=wl_spec, status=None))
    watch(created + 200, "MODIFIED", b.workload(api="v1beta1", meta=wl_meta, spec=wl_spec,
                                                status=b.workload_status(api="v1beta1", conditions=[pending])))
    if outcome == "pending":
        return out
    admitted = created + rng.randrange(2_000, 90_000)
    conds = [b.condition("QuotaReserved", True, "QuotaReserved", f"Quota reserved in ClusterQueue {CLUSTER_QUEUE}",
                         admitted, generation=1),
             b.condition("Admitted", True, "Admitted", "The workload is admitted", admitted, generation=1)]
    adm = b.admission(CLUSTER_QUEUE, [b.pod_set_assignment("main", 1, {"nvidia.com/gpu": "h100"},
                                                           {"nvidia.com/gpu": "1"})])
    watch(admitted, "MODIFIED", b.workload(api="v1beta1", meta=wl_meta, spec=wl_spec,
                                           status=b.workload_status(api="v1beta1", conditions=conds, admission=adm)))
    watch(admitted + 50, "MODIFIED", job(False, b.job_status(start=admitted + 50, active=1)))
    pod_meta = b.object_meta(name=pod_name, namespace=ns, uid=pod_uid, created=admitted + 100,
                             labels={"batch.kubernetes.io/controller-uid": job_uid, "job-name": name},
                             owners=[b.owner_reference("batch/v1", "Job", name, job_uid)])
    node = f"node-{b.small_int(8, run_id)}"
    spec_unbound, spec_bound = b.pod_spec(template["spec"], None), b.pod_spec(template["spec"], node)
    sched = admitted + 600
    sched_cond = b.pod_condition("PodScheduled", True, sched)
    watch(admitted + 100, "ADDED", b.pod(meta=pod_meta, spec=spec_unbound, status=b.pod_status(phase="Pending")))
    watch(sched, "MODIFIED", b.pod(meta=pod_meta, spec=spec_bound,
                                   status=b.pod_status(phase="Pending", conditions=[sched_cond])))
    ev_meta = b.object_meta(name=b.event_name(pod_name, sched), namespace=ns, uid=b.uid("event", run_id),
                            created=sched)
    regarding = b.object_reference("v1", "Pod", ns, pod_name, pod_uid)
    watch(sched, "ADDED", b.core_event(meta=ev_meta, regarding=regarding, reason="Scheduled",
                                       message=f"Successfully assigned {ns}/{pod_name} to {node}", warning=False,
                                       component="default-scheduler", instance="", first=sched, last=sched, count=1,
                                       series=True, action="Binding"))
    started = sched + rng.randrange(3_000, 30_000)
    running = b.container_status(name="train", image=IMAGE, state=b.running_state(started), ready=True,
                                 started=True)
    watch(started, "MODIFIED", b.pod(meta=pod_meta, spec=spec_bound, status=b.pod_status(
        phase="Running", conditions=[sched_cond], containers=[running], started=started)))
    step_at = started
    for step in range(1, progress + 1):
        step_at += rng.randrange(5_000, 60_000)
        out.append((step_at, b.progress_event(event_id=f"{run_id}-p{step}", run_id=run_id, when=step_at,
                                              step=step * 100, metrics={"loss": 3.0 / step, "lr": 1e-4})))
    if outcome == "running":
        return out
    ended = step_at + rng.randrange(1_000, 20_000)
    ok = outcome == "succeeded"
    term = b.terminated_state(exit_code=0 if ok else 137, reason="Completed" if ok else "OOMKilled", started=started,
                              finished=ended, container_id="containerd://" + b.hex_id(64, run_id))
    watch(ended, "MODIFIED", b.pod(meta=pod_meta, spec=spec_bound, status=b.pod_status(
        phase="Succeeded" if ok else "Failed", conditions=[sched_cond],
        containers=[b.container_status(name="train", image=IMAGE, state=term)], started=started)))
    done = ended + 1_000
    final = ([b.job_condition("SuccessCriteriaMet", True, "CompletionsReached", "Reached expected number of "
                              "succeeded pods", done), b.job_condition("Complete", True, "CompletionsReached",
                                                                        "Reached expected number of succeeded pods",
                                                                        done)]
             if ok else
             [b.job_condition("FailureTarget", True, "BackoffLimitExceeded", "Job has reached the specified backoff "
                              "limit", done), b.job_condition("Failed", True, "BackoffLimitExceeded",
                                                              "Job has reached the specified backoff limit", done)])
    watch(done, "MODIFIED", job(False, b.job_status(conditions=final, start=admitted + 50,
                                                    completion=done if ok else None, succeeded=int(ok),
                                                    failed=int(not ok))))
    finished = [*conds, b.condition("Finished", True, "Succeeded" if ok else "Failed",
                                    "Job finished successfully" if ok else "Job failed", done + 100, generation=1)]
    watch(done + 100, "MODIFIED", b.workload(api="v1beta1", meta=wl_meta, spec=wl_spec, status=b.workload_status(
        api="v1beta1", conditions=finished, admission=adm)))
    return out


def synthetic_stream(runs: int, seed: int = 0, *, progress: int = 3, start: int = 0,
                     outcomes: Sequence[str] | None = None) -> list[Event]:
    """``runs`` runs' records interleaved in time order (each object's own order is kept)."""
    rng = random.Random(seed)
    timed: list[tuple[int, int, Event]] = []
    for i in range(start, start + runs):
        outcome = outcomes[i % len(outcomes)] if outcomes else None
        for when, ev in synthetic_run(i, seed, rng, progress=progress, outcome=outcome):
            timed.append((when, len(timed), ev))
    timed.sort(key=lambda t: (t[0], t[1]))
    return [ev for _, _, ev in timed]



# ------------------------------------------------------------------------------------------ benchmark

PARTITIONS = 4
WAIT_S = 600  # the longest any wait of this benchmark may take (a reducer that stalls fails the run, not hangs it)
LATENCY_RUNS = 200  # running runs that receive the progress changes of the latency phase
REPORTS_FROM = datetime(2026, 8, 20, 12, tzinfo=UTC)  # the event time of their first report


def latency_report(run_ids: Sequence[str], k: int, every_s: float) -> Event:
    """The latency phase's ``k``-th progress report (from 0): the runs in turn, step 10,000 + ``k``, a run's reports
    ``every_s`` seconds apart in event time from ``REPORTS_FROM`` (``bench/progress_reports.py`` folds the same)."""
    run_id, step = run_ids[k % len(run_ids)], 10_000 + k
    at = REPORTS_FROM + timedelta(seconds=every_s * (k // len(run_ids)))
    return {"schema": "taugrid.io/intake/v1", "event_id": f"{run_id}-bench-{step}", "run_id": run_id,
            "at": at.isoformat().replace("+00:00", "Z"), "kind": "Progress", "step": step,
            "metrics": {"loss": 1 / step}}


def keyed(records: Sequence[Event], label: str) -> list[service.SourceItem]:
    keyer = RunKeyer(100_000)
    return [item for i, rec in enumerate(records) for item in keyer.key_record(Record(f"{label}:{i}", rec))]


async def as_source(items: Sequence[service.SourceItem]) -> AsyncIterator[service.SourceItem]:
    for item in items:
        yield item


def environment(bootstrap: str, prefix: str, metrics_port: int) -> dict[str, str]:
    """Settings of this run (as environment: the reducer subprocess inherits them)."""
    return common.environment(bootstrap, prefix, metrics_port, PARTITIONS)


def consumed_total(port: int) -> int:
    """Changes the reducer process folded and committed so far (its ``tracker_changes_consumed_total``)."""
    total = 0.0
    for line in (http_get(port, "/metrics") or "").splitlines():
        if line.startswith("tracker_changes_consumed_total{"):
            total += float(line.rpartition(" ")[2])
    return int(total)


async def raw_consume(settings: Settings, expected: int) -> float:
    """Records/s of a bare read_committed consumer reading the changes topic."""
    consumer = kafka.make_consumer(settings.kafka, group_id=None, max_poll_records=10_000)
    await kafka.start(consumer, settings.kafka, what="raw consumer")
    try:
        tps = [TopicPartition(settings.kafka.topics.changes, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        seen = 0
        started = time.perf_counter()
        while seen < expected:
            if time.perf_counter() - started > WAIT_S:
                raise TimeoutError(f"raw consume read {seen} of {expected} records in {WAIT_S} s")
            for records in (await consumer.getmany(timeout_ms=500, max_records=10_000)).values():
                seen += len(records)
        return seen / (time.perf_counter() - started)
    finally:
        await kafka.stop(consumer, settings.kafka, what="raw consumer")


async def committed_total(admin: AIOKafkaAdminClient, group: str) -> int:
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    except KafkaError:
        return 0
    return sum(int(o.offset) for o in offsets.values())


async def scale_out(bootstrap: str, items: Sequence[service.SourceItem], processes: int, tmp: Path) -> float:
    """Changes/s of ``processes`` ``tracker reduce`` processes in one consumer group, on topics of their own
    holding the same input, while all of them work: from the moment every process owns partitions (the group
    settled) to every offset committed; what was committed before that moment counts on neither side."""
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    ports = [free_port() for _ in range(processes)]
    env = [{**os.environ, **environment(bootstrap, prefix, port), "TRACKER_OPS__METRICS_INTERVAL_S": "0.1"}
           for port in ports]
    saved = dict(os.environ)
    os.environ.update(env[0])
    try:
        settings = load_settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    await service.create_topics(settings)
    produced = await service.publish(as_source(items), settings)
    admin = AIOKafkaAdminClient(**kafka.client_options(settings.kafka))
    await admin.start()
    procs: list[asyncio.subprocess.Process] = []
    logs = [(tmp / f"scale-{processes}-{i}.log").open("wb") for i in range(processes)]
    try:
        for i in range(processes):
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tracker.runtime.commands", "reduce", cwd=REPO, env=env[i],
                stdout=asyncio.subprocess.DEVNULL, stderr=logs[i]))
        # ready, and the group settled: every process owns partitions (a joining one makes the others rebalance)
        deadline = time.perf_counter() + WAIT_S
        while not all(http_get(port, "/readyz") == "ready\n" and _owns_partitions(port) for port in ports):
            if any(p.returncode is not None for p in procs):
                raise RuntimeError(f"a reducer exited, see {tmp}/scale-*.log")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"the group did not settle within {WAIT_S} s")
            await asyncio.sleep(0.02)
        started, before = time.perf_counter(), await committed_total(admin, settings.reduce.group_id)
        if produced - before < produced // 2:
            raise RuntimeError(f"the group took too long to settle: {before} of {produced} changes were reduced "
                               "before every process owned partitions; use more --scale-runs")
        while True:  # polling the group's committed offsets: there is nothing to wait on
            if await committed_total(admin, settings.reduce.group_id) >= produced:
                break
            if time.perf_counter() - started > WAIT_S:
                raise TimeoutError(f"the group did not commit every offset within {WAIT_S} s")
            await asyncio.sleep(0.02)
        return (produced - before) / (time.perf_counter() - started)
    finally:
        await asyncio.gather(*(stop_async_process(proc) for proc in procs))
        for log in logs:
            log.close()
        await admin.close()


def _owns_partitions(port: int) -> bool:
    metrics = http_get(port, "/metrics") or ""
    return any(line.startswith("tracker_partitions_assigned{") and not line.endswith(" 0.0")
               for line in metrics.splitlines())


def memory_per_active_run(runs: int, seed: int) -> float:
    """Bytes a Reducer holds per running run, fed as the Kafka reducer feeds it (records keyed by run)."""
    items = keyed(synthetic_stream(runs, seed, outcomes=["running"]), "memory")
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    reducer = Reducer()
    for item, key in items:
        assert isinstance(item, Record)
        reducer.apply(item.value, item.source, run_hint=key)
    reducer.flush()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    assert len(reducer.runs) == runs
    return sum(stat.size_diff for stat in after.compare_to(before, "filename")) / runs


Sent = dict[str, list[tuple[int, float]]]  # run -> [(step, perf_counter when produced)] not yet seen indexed


def resolve(sent: Sent, latencies: list[float], latest: Iterable[tuple[str, int]], now: float) -> None:
    """Each awaited change of a run whose indexed ``loss`` summary has reached its step was committed by ``now``."""
    for run_id, step_seen in latest:
        waiting = sent.get(run_id)
        if waiting:
            latencies.extend(now - at for step, at in waiting if step <= step_seen)
            sent[run_id] = [(step, at) for step, at in waiting if step > step_seen]


class TimedIndex(ExperimentIndex):
    """The experiment index, noting when the metric summary of each awaited progress change is committed."""

    def __init__(self, path: Path, sent: Sent, latencies: list[float]) -> None:
        super().__init__(path)
        self.sent = sent  # shared with the producing loop
        self.latencies = latencies

    def write(self, updates: Sequence[HistoryUpdate], offsets: Mapping[OffsetKey, int] | None = None,
              *, state: StateRows | None = None) -> int:
        changed = super().write(updates, offsets, state=state)
        now = time.perf_counter()
        histories = [u.history for u in updates if u.history is not None]
        resolve(self.sent, self.latencies, ((h.run.run_id, latest) for h in histories if (latest := next(
            (m.latest_step for m in h.metrics if m.metric == "loss"), None)) is not None), now)
        return changed


class IndexPoller:
    """The experiment index that a ``tracker sink index`` subprocess writes, read-only every ``poll_s``: a change
    counts as indexed at the start of the first read that sees it (so latencies are late by at most ``poll_s`` and
    the read's own time)."""

    def __init__(self, path: Path, sent: Sent, latencies: list[float], poll_s: float) -> None:
        self.path, self.sent, self.latencies, self.poll_s = path, sent, latencies, poll_s
        self._conn: sqlite3.Connection | None = None

    def _query(self, sql: str) -> list[Any]:
        if self._conn is None:
            if not self.path.exists():
                return []
            self._conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=5)
        try:
            return self._conn.execute(sql).fetchall()
        except sqlite3.OperationalError:  # the sink has not created its tables yet
            return []

    def runs(self) -> int:
        rows = self._query("SELECT count(*) FROM runs")
        return int(rows[0][0]) if rows else 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            now = time.perf_counter()
            if any(self.sent.values()):
                resolve(self.sent, self.latencies, self._query(
                    "SELECT run_id, latest_step FROM metric_summaries WHERE metric = 'loss'"), now)
            await asyncio.sleep(self.poll_s)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


@dataclass
class Phase:
    """One offered load of the end-to-end measurement."""

    latencies: list[float]  # seconds, inf for each miss
    misses: int
    sent: int
    offered_s: float  # first to last send
    reducer_cpu: float  # CPU seconds of the reducer process over the phase (sends and drain)
    sink_cpu: float | None  # the same of the sink process (None: the sink ran in this process)
    bench_cpu: float  # the same of this process (producing; and the sink when it runs here)
    span_s: float  # first send to the last change indexed (or the miss deadline)
    backlog: float  # the reducer's consumer lag (tracker_consumer_lag) right after the last send
    reducer_metrics: dict[str, float]  # the increase of each of the reducer's metrics over the phase


async def end_to_end(settings: Settings, producer: Any, tmp: Path, rates: Sequence[float], seconds: float,
                     seed: int, runs_before: int, miss_after: float, *, reducer: asyncio.subprocess.Process,
                     reducer_port: int, sink: str = "inprocess", poll_s: float = 0.01,
                     every_s: float = 0.0) -> dict[float, Phase]:
    """Per offered load (changes/s, one phase each): seconds from a progress change produced to the index row
    showing it committed, with ``inf`` for each change not indexed within ``miss_after`` seconds of the phase's
    last send; and how many such misses there were. ``sink``: ``inprocess`` (the index sink runs in this process
    and notes its own commits) or ``process`` (``tracker sink index`` in a process of its own, the index polled
    read-only every ``poll_s``). ``every_s``: the event time between two reports of one run (0: all at one
    instant)."""
    warm = keyed(synthetic_stream(LATENCY_RUNS, seed + 1, start=100_000, outcomes=["running"]), "warm")
    await service.publish(as_source(warm), settings)
    run_ids = sorted({key for _, key in warm if key})
    sent: Sent = {}
    latencies: list[float] = []
    path = tmp / f"index-{sink}.sqlite"
    stop = asyncio.Event()
    sink_proc: asyncio.subprocess.Process | None = None
    poller: IndexPoller | None = None
    tasks: list[asyncio.Task[None]] = []
    runner = None
    log = (tmp / "sink.log").open("wb")
    try:
        if sink == "inprocess":
            runner = index_sink_runner(settings, metrics=Metrics(), health=Health(), index_path=path)
            runner.open_sink = lambda: TimedIndex(path, sent, latencies)
            tasks.append(asyncio.create_task(runner.run()))

            # read-only: the sink holds the index's writer role (one writer per index) while it runs
            indexed_runs = IndexPoller(path, sent, latencies, poll_s).runs
        else:
            env = {**os.environ, "TRACKER_OPS__METRICS_PORT": str(free_port())}
            sink_proc = await asyncio.create_subprocess_exec(
                *tracker_command(), "sink", "index", "--index", str(path), cwd=REPO, env=env,
                stdout=asyncio.subprocess.DEVNULL, stderr=log)
            poller = IndexPoller(path, sent, latencies, poll_s)
            tasks.append(asyncio.create_task(poller.run(stop)))
            indexed_runs = poller.runs
        deadline = time.perf_counter() + WAIT_S
        while indexed_runs() < runs_before + LATENCY_RUNS:  # the sink first catches up with everything so far
            if sink_proc is not None and sink_proc.returncode is not None:
                raise RuntimeError(f"tracker sink index exited with {sink_proc.returncode}, see {tmp / 'sink.log'}")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"the index sink did not catch up within {WAIT_S} s")
            await asyncio.sleep(0.2)
        results: dict[float, Phase] = {}
        k = 0
        for rate in rates:
            latencies.clear()
            m0 = metric_sums(http_get(reducer_port, "/metrics") or "")
            cpu0 = (cpu_seconds(reducer.pid), cpu_seconds(sink_proc.pid) if sink_proc else 0.0, time.process_time())
            started = time.perf_counter()
            n_sends = int(rate * seconds)
            for n in range(n_sends):
                delay = started + n / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                event = latency_report(run_ids, k, every_s)
                k += 1
                run_id, step = event["run_id"], event["step"]
                sent.setdefault(run_id, []).append((step, time.perf_counter()))
                await producer.send(settings.kafka.topics.changes, json.dumps(event).encode(), key=run_id.encode())
            last_send = time.perf_counter()
            backlog = sum(v for name, v in metric_sums(http_get(reducer_port, "/metrics") or "").items()
                          if name.startswith("tracker_consumer_lag{"))
            while time.perf_counter() - last_send < miss_after:  # the last changes reach the index
                if not any(sent.values()):
                    break
                await asyncio.sleep(0.01)
            ended = time.perf_counter()
            cpu1 = (cpu_seconds(reducer.pid), cpu_seconds(sink_proc.pid) if sink_proc else 0.0, time.process_time())
            m1 = metric_sums(http_get(reducer_port, "/metrics") or "")
            misses = sum(len(waiting) for waiting in sent.values())
            sent.clear()  # a miss is not measured later, in another phase
            results[rate] = Phase([*latencies, *[float("inf")] * misses], misses, n_sends, last_send - started,
                                  cpu1[0] - cpu0[0], cpu1[1] - cpu0[1] if sink_proc else None, cpu1[2] - cpu0[2],
                                  ended - started, backlog, {k: v - m0.get(k, 0.0) for k, v in m1.items()})
    finally:
        stop.set()
        if runner is not None:
            runner.request_stop()
        if tasks:
            await asyncio.wait_for(asyncio.gather(*tasks), 120)
        if sink_proc is not None:
            await stop_async_process(sink_proc)
        if poller is not None:
            poller.close()
        log.close()
    return results


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: the test environment's broker)")
    parser.add_argument("--runs", type=int, default=2_000, help="runs in the throughput input")
    parser.add_argument("--rates", type=float, nargs="+", default=[50.0, 200.0, 500.0],
                        help="offered loads of the latency phases, changes/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each latency phase")
    parser.add_argument("--miss-after", type=float, default=60.0, metavar="SECONDS",
                        help="a change of a latency phase not indexed this long after the phase's last send is a "
                        "miss (an infinite latency)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scale-out", type=int, nargs="*", default=[1, 2], metavar="N",
                        help="also measure N reduce processes in one group, each N on fresh topics (none: skip)")
    parser.add_argument("--scale-runs", type=int, default=20_000,
                        help="runs in the scale-out input (large enough that the group settles early in it)")
    parser.add_argument("--sink", choices=["inprocess", "process"], default="inprocess",
                        help="end to end: the index sink in this process, noting its own commits (inprocess), or "
                             "`tracker sink index` in a process of its own, the index polled read-only (process)")
    parser.add_argument("--poll", type=float, default=0.01, metavar="SECONDS",
                        help="with --sink process: how often the index is read")
    parser.add_argument("--progress-every-s", type=float, default=0.0, metavar="SECONDS",
                        help="end to end: the event time between two progress reports of a run, as a training loop "
                             "reporting every SECONDS would send them (default 0: all at one instant, as before)")
    parser.add_argument("--fetch-min-bytes", type=int, metavar="BYTES",
                        help="the reducers' reduce.fetch_min_bytes (Kafka's fetch.min.bytes of the changes; "
                             "default: the tracker's)")
    parser.add_argument("--fetch-max-wait-ms", type=int, metavar="MS",
                        help="the reducers' reduce.fetch_max_wait_ms (default: the tracker's)")
    args = parser.parse_args(argv)
    for name, value in (("FETCH_MIN_BYTES", args.fetch_min_bytes), ("FETCH_MAX_WAIT_MS", args.fetch_max_wait_ms)):
        if value is not None:
            os.environ[f"TRACKER_REDUCE__{name}"] = str(value)  # the reducer processes inherit it
    bootstrap = args.bootstrap or default_bootstrap()
    if not bootstrap:
        print("no broker: pass --bootstrap or run `python -m tests.infra up --components kafka`", file=sys.stderr)
        return 2
    port = free_port()
    os.environ.update(environment(bootstrap, f"bench-{uuid.uuid4().hex[:8]}", port))
    settings = load_settings()
    await service.create_topics(settings)
    tmp = Path(tempfile.mkdtemp(prefix="tracker-bench-"))

    producer = kafka.make_producer(settings.kafka)
    await kafka.start(producer, settings.kafka, what="bench producer")
    admin = AIOKafkaAdminClient(**kafka.client_options(settings.kafka))
    await admin.start()
    log = (tmp / "reduce.log").open("wb")
    reducer: asyncio.subprocess.Process | None = None
    try:
        items = keyed(synthetic_stream(args.runs, args.seed), "bench")
        started = time.perf_counter()
        produced = await service.publish(as_source(items), settings)
        produce_rate = produced / (time.perf_counter() - started)

        raw_rate = await raw_consume(settings, produced)

        reducer = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tracker.runtime.commands", "reduce", cwd=REPO, env=dict(os.environ),
            stdout=asyncio.subprocess.DEVNULL, stderr=log)
        deadline = time.perf_counter() + WAIT_S
        while http_get(port, "/readyz") != "ready\n":
            if reducer.returncode is not None:
                raise RuntimeError(f"the reducer exited, see {tmp / 'reduce.log'}")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"the reducer was not ready within {WAIT_S} s, see {tmp / 'reduce.log'}")
            await asyncio.sleep(0.02)
        # measured from ready: what the reducer folded while it started counts neither as work nor as time
        before = consumed_total(port)
        started = time.perf_counter()
        while True:
            if await committed_total(admin, settings.reduce.group_id) >= produced:
                break
            if time.perf_counter() - started > WAIT_S:
                raise TimeoutError(f"the reducer did not commit every offset within {WAIT_S} s")
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - started
        measured = consumed_total(port) - before
        if measured + before != produced:
            print(f"warning: the reducer counted {measured + before} changes folded for {produced} produced",
                  file=sys.stderr)
        reduce_rate = measured / elapsed

        latencies = await end_to_end(settings, producer, tmp, args.rates, args.seconds, args.seed, args.runs,
                                     args.miss_after, reducer=reducer, reducer_port=port, sink=args.sink,
                                     poll_s=args.poll, every_s=args.progress_every_s)
        stages = histogram_means(http_get(port, "/metrics") or "")
        rss = common.memory_kib(reducer.pid).get("VmRSS", 0) / 1024
    finally:
        if reducer is not None:
            await stop_async_process(reducer)
        log.close()
        await admin.close()
        await kafka.stop(producer, settings.kafka, what="bench producer")
    scale_items = keyed(synthetic_stream(args.scale_runs, args.seed + 1), "scale") if args.scale_out else []
    scaled = {n: await scale_out(bootstrap, scale_items, n, tmp) for n in args.scale_out}
    per_run = memory_per_active_run(1_000, args.seed)

    wait_ms = settings.reduce.fetch_max_wait_ms
    print(f"broker {bootstrap}, {PARTITIONS} partitions, {args.runs} runs = {produced} changes "
          "(Job, Workload, Pod, Event watch events and intake events); the reducer's fetch of changes: at least "
          f"{settings.reduce.fetch_min_bytes:,} bytes or "
          f"{settings.kafka.fetch_max_wait_ms if wait_ms is None else wait_ms:,} ms")
    print(f"  produce (idempotent, acks=all):          {produce_rate:9,.0f} changes/s")
    print(f"  raw consume (read_committed):            {raw_rate:9,.0f} records/s  (baseline)")
    print(f"  tracker reduce (1 process, transactions): {reduce_rate:8,.0f} changes/s  "
          f"= {reduce_rate / raw_rate:.1%} of raw consume  ({measured:,} changes in {elapsed:.2f} s from ready; "
          f"{before:,} folded before it was ready are not counted)")
    print(f"      per poll batch and partition: fold+flush {stages.get('tracker_fold_seconds', 0) * 1e3:.1f} ms, "
          f"transaction {stages.get('tracker_transaction_seconds', 0) * 1e3:.1f} ms (means)")
    where = ("the index sink in this process" if args.sink == "inprocess" else
             f"`tracker sink index` in its own process, the index read every {args.poll * 1e3:g} ms")
    print(f"  end to end, progress changes to {LATENCY_RUNS} running runs, produced -> index row committed "
          f"({args.seconds:g} s per load; {where}; a run's reports {args.progress_every_s:g} s apart in event time):")
    for rate, ph in latencies.items():
        values, misses = ph.latencies, ph.misses
        print(f"      {rate:6,.0f} changes/s offered: p50 {percentile(values, 50) * 1e3:5.0f} ms   "
              f"p95 {percentile(values, 95) * 1e3:5.0f} ms   p99 {percentile(values, 99) * 1e3:5.0f} ms   "
              f"max {max(values) * 1e3:5.0f} ms   ({len(values)} changes, "
              + (f"MISSED {misses}: not indexed within {args.miss_after:g} s, counted as inf)" if misses else
                 "none missed)"))
        sink_cpu = (f", sink process {ph.sink_cpu / ph.span_s:.2f}" if ph.sink_cpu is not None else "")
        print(f"          sent at {ph.sent / max(ph.offered_s, 1e-9):,.0f} changes/s ({ph.sent:,} in "
              f"{ph.offered_s:.2f} s); reducer backlog at the last send {ph.backlog:,.0f} changes; CPU over the "
              f"{ph.span_s:.1f} s to the last indexed, in cores: reducer {ph.reducer_cpu / ph.span_s:.2f}{sink_cpu}, "
              f"this process {ph.bench_cpu / ph.span_s:.2f}")
        print(f"          CPU per change sent (less dependent on the machine's load): reducer "
              f"{ph.reducer_cpu / ph.sent * 1e6:,.0f} us"
              + (f", sink process {ph.sink_cpu / ph.sent * 1e6:,.0f} us" if ph.sink_cpu is not None else "")
              + f", this process {ph.bench_cpu / ph.sent * 1e6:,.0f} us"
              + (" (producing and the sink)" if ph.sink_cpu is None else " (producing and polling the index)"))
        rm = ph.reducer_metrics
        txns = rm.get('tracker_transactions_total{outcome="committed"}', 0.0)
        if txns:
            print(f"          reducer over the phase: {txns:,.0f} transactions "
                  f"({rm.get('tracker_changes_consumed_total', 0) / txns:,.0f} changes, "
                  f"{rm.get('tracker_records_produced_total', 0) / txns:,.0f} records produced each); per "
                  f"transaction fold+flush {rm.get('tracker_fold_seconds_sum', 0) / txns * 1e3:,.0f} ms, "
                  f"begin..commit {rm.get('tracker_transaction_seconds_sum', 0) / txns * 1e3:,.0f} ms (wall, means)")
    for n, rate in scaled.items():
        print(f"  scale-out: {n} reduce process{'es' if n > 1 else ''} in one group: {rate:9,.0f} changes/s"
              + (f"  = {rate / scaled[1]:.2f}x one process" if 1 in scaled and n != 1 else "")
              + f"  ({os.cpu_count()} cores, shared with the broker)")
    print(f"  memory per active run (Reducer facts and bindings, tracemalloc): {per_run / 1024:.1f} KiB")
    print(f"  reducer process RSS at the end: {rss:.0f} MiB (finished runs retired); logs in {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
