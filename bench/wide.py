"""One run widened to hundreds or thousands of pods, arriving at a live-like rate: cost and bytes per change.

    uv run python -m tests.infra up --components kafka      # for the Kafka mode (or --bootstrap HOST:PORT)
    uv run python bench/wide.py [--pods 512 2048 4096] [--rate 200] [--modes embedded kafka]
                                [--embedded whole chunks live] [--chunks 8] [--baseline-pods 2]

The input is ONE generated run (``sim.lifecycles``, a batch Job of ``--pods`` pods that is queued,
admitted, scheduled, runs with progress reports and succeeds: per pod its creation, binding, Scheduled Event, start
and end, about 5 changes per pod), and, as the baseline of the same run, the same number of changes made of many
narrow runs (``--baseline-pods`` pods each), submitted 3 s apart and interleaved as a cluster writes them. The
figure is how the cost of a change grows with the width of the run it belongs to: flat is the goal.

Embedded (``--modes embedded``), subprocesses of the ``tracker`` command line, each into a fresh index and fed the
run's capture (JSON lines) on standard input:

- ``whole``: ``tracker replay - --index ...``, the whole capture at once (``--repeat`` times, the median);
- ``chunks``: the capture cut into ``--chunks`` pieces replayed by successive ``tracker replay -`` calls into one
  index, as captures that arrive in pieces are (each call restores the run's state from the index first);
- ``live``: ``tracker serve --from-capture - --index ... --exit-when-done`` fed at ``--rate`` changes/s, as
  ``kubectl get ... -w | tracker serve --from-capture -`` feeds it;

the CPU time of each process from the moment it blocks reading its input (``/proc/<pid>/syscall``; its start-up,
imports and restore, is printed apart) to its exit (``wait4``), per change; plus the size of ``tracker show RUN -o
json`` at the end.

Kafka (``--modes kafka``): per width, on topics, group and transactional ids of its own (``tracker topics
create``, 1 partition by default: one run is one partition anyway), a ``tracker reduce`` subprocess runs while the
run's changes are produced to the changes topic at ``--rate`` (keyed by run id and with the ``source`` header, as
the watcher publishes them). Measured: the reducer's CPU time (``/proc/<pid>/stat``) from the first change sent to
the last one committed (``tracker_changes_consumed_total``), per change, and beside it its CPU time while idle for
``--idle`` seconds before (polling an empty topic: the share of the figure that is not work); then the committed
records of the ``transitions`` and ``run-state`` topics (read_committed, key + value bytes), per change, and the
changes topic's own bytes per change (the input, for scale).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/wide.py
    sys.path.insert(0, str(REPO))

import orjson  # noqa: E402

from bench._common import (  # noqa: E402
    Fed,
    RunKeys,
    TopicTotals,
    cpu_seconds,
    default_bootstrap,
    delete_topics,
    environment,
    free_port,
    http_get,
    keep_every_version,
    load_average,
    memory_kib,
    metric_sums,
    read_topic,
    run_fed,
    run_timed,
    source_of,
    stop_async_process,
    tracker_command,
    wait_until_ready,
    without_tracker_settings,
)
from bench._objects import full_record  # noqa: E402
from sim.lifecycles import RunParams, generate_stream  # noqa: E402

NOW = "2026-09-01T00:00:00Z"
WIDE_RUN = "run-0000000"  # the generator's run id of run 0


@dataclass
class Input:
    label: str  # "512 pods", or "narrow" (the baseline)
    pods: int | None  # None: the narrow baseline
    records: list[dict[str, Any]]
    keys: list[str]
    lines: list[bytes] = field(default_factory=list)  # each record encoded, as a JSON line

    @property
    def changes(self) -> int:
        return len(self.records)


def wide_input(pods: int, seed: int, progress: int, detail: str) -> Input:
    params = RunParams(pods=pods, outcome="succeeded", progress_points=progress)
    records = list(generate_stream(1, seed, params=lambda _rng: params))
    return _input(f"{pods} pods", pods, records, detail)


def narrow_input(changes: int, pods: int, seed: int, progress: int, detail: str) -> Input:
    params = RunParams(pods=pods, outcome="succeeded", progress_points=progress)
    records = list(islice(generate_stream(changes, seed, params=lambda _rng: params), changes))
    return _input(f"narrow ({pods} pods/run)", None, records, detail)


def _input(label: str, pods: int | None, records: list[dict[str, Any]], detail: str) -> Input:
    if detail != "plain":
        records = [full_record(r, detail=detail) for r in records]
    keys = RunKeys().keys(records)
    if pods is not None and set(keys) != {WIDE_RUN}:
        raise AssertionError(f"the wide run's records are keyed {sorted(set(keys))[:5]}, expected {WIDE_RUN}")
    return Input(label, pods, records, keys, [orjson.dumps(r) + b"\n" for r in records])


def tracker_env() -> dict[str, str]:
    return without_tracker_settings(os.environ)


# ------------------------------------------------------------------------------------------ embedded


@dataclass
class EmbeddedResult:
    whole: Fed | None = None
    chunks: list[Fed] = field(default_factory=list)
    live: Fed | None = None
    show_bytes: dict[str, int] = field(default_factory=dict)  # mode -> bytes of `tracker show RUN -o json`
    runs: dict[str, int] = field(default_factory=dict)  # mode -> runs in the index


def replay_fed(lines: Sequence[bytes], index: Path, timeout_s: float) -> Fed:
    """``tracker replay - --index INDEX`` fed ``lines`` once it waits for them."""
    fed = run_fed([*tracker_command(), "replay", "-", "--index", str(index)], lines, env=tracker_env(),
                  timeout_s=timeout_s)
    fed.finished.check("tracker replay -")
    return fed


def serve_fed(lines: Sequence[bytes], index: Path, rate: float, timeout_s: float) -> Fed:
    """``tracker serve --from-capture - --index INDEX --exit-when-done`` fed ``lines`` at ``rate`` lines/s."""
    fed = run_fed([*tracker_command(), "serve", "--from-capture", "-", "--index", str(index), "--exit-when-done"],
                  lines, env=tracker_env(), timeout_s=timeout_s, rate=rate)
    fed.finished.check("tracker serve --from-capture -")
    return fed


def show_bytes(index: Path, run: str, timeout_s: float) -> int:
    done = run_timed([*tracker_command(), "show", run, "--index", str(index), "-o", "json", "--now", NOW],
                     env=tracker_env(), timeout_s=timeout_s).check("tracker show")
    return len(done.stdout)


def runs_in(index: Path, timeout_s: float) -> int:
    done = run_timed([*tracker_command(), "runs", "--index", str(index), "-o", "name", "--limit", "100000000"],
                     env=tracker_env(), timeout_s=timeout_s).check("tracker runs")
    return len(done.stdout.split())


def embedded(inp: Input, tmp: Path, modes: Sequence[str], chunks: int, rate: float, repeat: int, timeout_s: float
             ) -> EmbeddedResult:
    res = EmbeddedResult()
    name = inp.label.split(" ")[0]
    indexes: dict[str, Path] = {}
    if "whole" in modes:
        indexes["whole"] = tmp / f"{name}-whole-0.sqlite"
        feds = [replay_fed(inp.lines, tmp / f"{name}-whole-{i}.sqlite", timeout_s) for i in range(repeat)]
        res.whole = sorted(feds, key=lambda f: f.work_cpu_s)[len(feds) // 2]  # the median
    if "chunks" in modes:
        indexes["chunks"] = tmp / f"{name}-chunks.sqlite"
        size = -(-inp.changes // chunks)
        res.chunks = [replay_fed(inp.lines[k * size:(k + 1) * size], indexes["chunks"], timeout_s)
                      for k in range(chunks)]
    if "live" in modes:
        indexes["live"] = tmp / f"{name}-live.sqlite"
        res.live = serve_fed(inp.lines, indexes["live"], rate, timeout_s)
    for mode, index in indexes.items():
        res.runs[mode] = runs_in(index, timeout_s)
        if inp.pods is not None:
            res.show_bytes[mode] = show_bytes(index, WIDE_RUN, timeout_s)
    return res


@dataclass(frozen=True)
class Noop:
    """CPU seconds of a process fed nothing, from waiting for its input to its exit (closing, exiting): the medians
    of a few, subtracted once per process in the per-change figures."""

    replay: float
    serve: float

    @classmethod
    def measure(cls, tmp: Path, live: bool, timeout_s: float, n: int = 3) -> Noop:
        def fresh() -> Path:
            return tmp / f"noop-{uuid.uuid4().hex[:8]}.sqlite"

        replay = statistics.median(replay_fed([], fresh(), timeout_s).work_cpu_s for _ in range(n))
        serve = statistics.median(serve_fed([], fresh(), 1.0, timeout_s).work_cpu_s for _ in range(n)) if live \
            else 0.0
        return cls(replay, serve)


def _per_change(res: EmbeddedResult, mode: str, changes: int, noop: Noop) -> float | None:
    fed = {"whole": [res.whole] if res.whole else [], "chunks": res.chunks, "live": [res.live] if res.live else []}
    runs = fed[mode]
    base = noop.serve if mode == "live" else noop.replay
    return sum(f.work_cpu_s - base for f in runs) / changes * 1e6 if runs else None


def print_embedded(inputs: Sequence[Input], results: Sequence[EmbeddedResult], chunks: int, rate: float,
                   noop: Noop) -> None:
    print("\nembedded: CPU us per change, from the process waiting for its input (start-up excluded) to its exit, "
          f"net of the same for no input (tracker replay {noop.replay * 1e3:.0f} ms, tracker serve "
          f"{noop.serve * 1e3:.0f} ms: closing and exiting), per process")
    ref = next((i for i, inp in enumerate(inputs) if inp.pods is not None), 0)
    print(f"  {'input':<22} {'changes':>8}   {'replay whole':>12} {'ratio':>6}   {f'{chunks} replays':>12} "
          f"{'ratio':>6}   {f'serve {rate:g}/s':>12} {'ratio':>6}   {'show -o json':>12}  {'peak RSS':>8}")
    refs = {m: _per_change(results[ref], m, inputs[ref].changes, noop) for m in ("whole", "chunks", "live")}
    for inp, res in zip(inputs, results, strict=True):
        cells = []
        for mode in ("whole", "chunks", "live"):
            v, r = _per_change(res, mode, inp.changes, noop), refs[mode]
            cells.append(f"{v:>12.1f} {v / r if r else 0:>5.2f}x" if v is not None else f"{'-':>12} {'-':>6}")
        shown = max(res.show_bytes.values(), default=0)
        feds = ([res.whole] if res.whole else []) + res.chunks + ([res.live] if res.live else [])
        rss = max((f.finished.maxrss_kib for f in feds), default=0)
        print(f"  {inp.label:<22} {inp.changes:>8,}   " + "   ".join(cells)
              + f"   {f'{shown / 1024:,.0f} KiB' if shown else '-':>12}  {rss / 1024:>4.0f} MiB")
    print(f"  (ratios to {inputs[ref].label}; the narrow baseline's too)")
    for inp, res in zip(inputs, results, strict=True):
        notes = []
        if res.whole:
            notes.append(f"replay start-up {res.whole.startup_cpu_s * 1e3:.0f} ms CPU (excluded)")
        if len(res.chunks) > 1:
            later = statistics.median(f.startup_cpu_s for f in res.chunks[1:]) - res.chunks[0].startup_cpu_s
            last = res.chunks[-1]
            notes.append(f"each later replay restores the index's state first: start-up +{later * 1e3:.0f} ms CPU "
                         f"(median; excluded); the last replay {(last.work_cpu_s - noop.replay) * 1e3:.0f} ms CPU "
                         f"net for {-(-inp.changes // chunks):,} changes")
        if res.live:
            notes.append(f"serve start-up {res.live.startup_cpu_s * 1e3:.0f} ms CPU (excluded), fed at "
                         f"{inp.changes / max(res.live.feed_s, 1e-9):,.0f} changes/s, exited {res.live.drain_s:.2f} s "
                         "after its input ended")
        if len(set(res.show_bytes.values())) > 1:
            notes.append("show -o json sizes DIFFER by mode: " + ", ".join(f"{m} {b:,}" for m, b in
                                                                            res.show_bytes.items()))
        if len(set(res.runs.values())) > 1:
            notes.append("runs DIFFER by mode: " + ", ".join(f"{m} {n}" for m, n in res.runs.items()))
        if notes:
            print(f"  {inp.label}: " + "; ".join(notes))


# ------------------------------------------------------------------------------------------ Kafka


@dataclass
class KafkaResult:
    changes: int
    achieved_rate: float
    cpu_s: float  # from the first change sent to the last one committed
    span_s: float
    idle_cpu_per_s: float
    drain_s: float  # from the last change sent to the last one committed
    metrics: dict[str, float]
    transitions: TopicTotals
    run_state: TopicTotals
    changes_topic: TopicTotals
    dead_letters: TopicTotals
    rss_kib: dict[str, int]
    topics: dict[str, str]  # "transitions", "run-state" -> topic name


async def run_kafka(inp: Input, bootstrap: str, partitions: int, rate: float, idle_s: float, tmp: Path,
                    timeout_s: float, keep_topics: bool) -> KafkaResult:
    from aiokafka import AIOKafkaProducer

    prefix = f"bench-wide-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {**tracker_env(), **environment(bootstrap, prefix, port, partitions)}
    topics = {k: env[f"TRACKER_KAFKA__TOPICS__{k}"] for k in ("CHANGES", "TRANSITIONS", "RUN_STATE", "DEAD_LETTERS")}
    await asyncio.to_thread(lambda: run_timed([*tracker_command(), "topics", "create"], env=env,
                                              timeout_s=120).check("tracker topics create"))
    await keep_every_version(bootstrap, [topics["TRANSITIONS"], topics["RUN_STATE"]])
    log_path = tmp / f"{prefix}-reduce.log"
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    await asyncio.wait_for(producer.start(), 60)
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(*tracker_command(), "reduce", cwd=REPO, env=env,
                                                    stdout=asyncio.subprocess.DEVNULL, stderr=log)
        try:
            await wait_until_ready(port, proc, 120, log_path)
            c0, t0 = cpu_seconds(proc.pid), time.perf_counter()
            await asyncio.sleep(idle_s)
            c1, t1 = cpu_seconds(proc.pid), time.perf_counter()
            idle_rate = (c1 - c0) / (t1 - t0)
            sent_futures = []
            for i, (line, key, rec) in enumerate(zip(inp.lines, inp.keys, inp.records, strict=True)):
                delay = t1 + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                sent_futures.append(await producer.send(topics["CHANGES"], line.rstrip(b"\n"), key=key.encode(),
                                                        headers=[("source", source_of(rec).encode())]))
            t_sent = time.perf_counter()
            await asyncio.wait_for(asyncio.gather(*sent_futures), 60)
            deadline = time.perf_counter() + timeout_s
            while True:
                text: str | None = await asyncio.to_thread(http_get, port, "/metrics")
                m = metric_sums(text or "")
                if m.get("tracker_changes_consumed_total", 0) >= inp.changes:
                    break
                if proc.returncode is not None:
                    raise RuntimeError(f"tracker reduce exited with {proc.returncode}, see {log_path}")
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"tracker reduce committed {m.get('tracker_changes_consumed_total', 0):.0f} "
                                       f"of {inp.changes} changes in {timeout_s:g} s, see {log_path}")
                await asyncio.sleep(0.02)
            c2, t2 = cpu_seconds(proc.pid), time.perf_counter()
            rss = memory_kib(proc.pid)
        finally:
            await asyncio.wait_for(producer.stop(), 60)
            await stop_async_process(proc)
    try:
        transitions, run_state, changes, dead = [await read_topic(bootstrap, topics[k], 1 if k == "DEAD_LETTERS"
                                                                  else partitions)
                                                 for k in ("TRANSITIONS", "RUN_STATE", "CHANGES", "DEAD_LETTERS")]
    finally:
        if not keep_topics:
            await delete_topics(bootstrap, prefix)
    return KafkaResult(inp.changes, inp.changes / max(t_sent - t1, 1e-9), c2 - c1, t2 - t1, idle_rate, t2 - t_sent, m,
                       transitions, run_state, changes, dead, rss,
                       {"transitions": topics["TRANSITIONS"], "run-state": topics["RUN_STATE"]})


def print_kafka(inputs: Sequence[Input], results: Sequence[KafkaResult], rate: float, partitions: int) -> None:
    print(f"\nKafka: tracker reduce (1 process, {partitions} partition{'s' if partitions > 1 else ''}), changes "
          f"offered at {rate:g}/s; CPU from the first change sent to the last committed")
    ref = next((i for i, inp in enumerate(inputs) if inp.pods is not None), 0)
    ref_cpu = results[ref].cpu_s / results[ref].changes
    print(f"  {'input':<22} {'changes':>8} {'sent/s':>7} {'CPU us/chg':>10} {'ratio':>6} {'idle us/chg':>11} "
          f"{'transitions B/chg':>17} {'run-state B/chg':>15} {'records/chg':>11} {'txns':>6} {'chg/txn':>7} "
          f"{'largest history':>15} {'input B/chg':>11} {'drain s':>7} {'peak RSS':>8}")
    for inp, r in zip(inputs, results, strict=True):
        n = r.changes
        cpu = r.cpu_s / n
        idle = r.idle_cpu_per_s * r.span_s / n
        txns = r.metrics.get('tracker_transactions_total{outcome="committed"}',
                             r.metrics.get("tracker_transactions_total", 0))
        print(f"  {inp.label:<22} {n:>8,} {r.achieved_rate:>7,.0f} {cpu * 1e6:>10.1f} {cpu / ref_cpu:>5.2f}x "
              f"{idle * 1e6:>11.1f} {r.transitions.bytes / n:>17,.0f} {r.run_state.bytes / n:>15,.0f} "
              f"{(r.transitions.records + r.run_state.records) / n:>11.2f} {txns:>6,.0f} {n / max(txns, 1):>7.1f} "
              f"{r.transitions.largest_value / 1024:>11,.0f} KiB {r.changes_topic.bytes / n:>11,.0f} "
              f"{r.drain_s:>7.2f} {r.rss_kib.get('VmHWM', 0) / 1024:>4.0f} MiB")
    print(f"  (ratio to {inputs[ref].label}; idle: the reducer's CPU while polling an empty topic, per second, "
          "times the span, per change: the part of the CPU figure that is not folding; chg/txn: changes per "
          "transaction, which grow when the reducer falls behind the offered rate and lower the cost per change)")
    for inp, r in zip(inputs, results, strict=True):
        for what, totals in (("transitions", r.transitions), ("run-state", r.run_state)):
            counted = r.metrics.get(f'tracker_records_produced_total{{topic="{r.topics[what]}"}}')
            if counted is not None and counted != totals.records:
                print(f"  WARNING {inp.label}: {totals.records:,} {what} records read, the reducer counted "
                      f"{counted:,.0f} produced")
        fold = r.metrics.get("tracker_fold_seconds_sum", 0.0)
        txn = r.metrics.get("tracker_transaction_seconds_sum", 0.0)
        print(f"  {inp.label}: transitions {r.transitions.records:,} records {r.transitions.bytes / 1e6:,.1f} MB, "
              f"run-state {r.run_state.records:,} records {r.run_state.bytes / 1e6:,.1f} MB (largest "
              f"{r.run_state.largest_value / 1024:,.0f} KiB); fold+flush {fold / r.changes * 1e6:,.0f} us/change, "
              f"transactions {txn / r.changes * 1e6:,.0f} us/change (wall, the reducer's histograms)"
              + (f"; DEAD LETTERS {r.dead_letters.records}" if r.dead_letters.records else ""))


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, nargs="+", default=[512, 2048, 4096], help="widths of the run")
    ap.add_argument("--baseline-pods", type=int, default=2,
                    help="pods per run of the narrow baseline (0: no baseline)")
    ap.add_argument("--rate", type=float, default=200.0, help="changes/s offered (serve live and Kafka)")
    ap.add_argument("--modes", nargs="+", choices=["embedded", "kafka"], default=["embedded", "kafka"])
    ap.add_argument("--embedded", nargs="+", choices=["whole", "chunks", "live"], default=["whole", "chunks", "live"],
                    dest="embedded_modes", help="embedded measurements")
    ap.add_argument("--chunks", type=int, default=8, help="pieces of the capture in the chunks mode")
    ap.add_argument("--repeat", type=int, default=3, help="replays of the whole capture (the median is shown)")
    ap.add_argument("--progress", type=int, default=5, help="progress reports of the run (0..5)")
    ap.add_argument("--detail", choices=["plain", "medium", "full"], default="plain",
                    help="the watch objects: the generator's (plain, about what the watcher publishes after "
                         "slimming) or widened as the apiserver returns them (bench/_objects.py)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--bootstrap", help="Kafka bootstrap servers (default: the test environment's broker)")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--idle", type=float, default=3.0, help="seconds of idle reducer CPU measured before feeding")
    ap.add_argument("--timeout", type=float, default=1_800.0, help="seconds allowed to each process / drain")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory and the Kafka topics")
    args = ap.parse_args(argv)

    bootstrap = None
    if "kafka" in args.modes:
        bootstrap = args.bootstrap or default_bootstrap()
        if not bootstrap:
            print("no broker: pass --bootstrap or run `python -m tests.infra up --components kafka`", file=sys.stderr)
            return 2
    tmp = Path(tempfile.mkdtemp(prefix="tracker-bench-wide-"))
    try:
        load_before = load_average()
        inputs = [wide_input(p, args.seed, args.progress, args.detail) for p in args.pods]
        if args.baseline_pods:
            inputs.append(narrow_input(inputs[0].changes, args.baseline_pods, args.seed, args.progress, args.detail))
        print(f"inputs ({args.detail} objects, generated before anything is timed): "
              + "; ".join(f"{inp.label}: {inp.changes:,} changes, {len(set(inp.keys)):,} run(s), "
                          f"{sum(map(len, inp.lines)) / inp.changes:,.0f} B/change" for inp in inputs))
        if "embedded" in args.modes:
            noop = Noop.measure(tmp, "live" in args.embedded_modes, args.timeout)
            emb = [embedded(inp, tmp, args.embedded_modes, args.chunks, args.rate, args.repeat, args.timeout)
                   for inp in inputs]
            print_embedded(inputs, emb, args.chunks, args.rate, noop)
        if "kafka" in args.modes:
            assert bootstrap is not None
            kres = [asyncio.run(run_kafka(inp, bootstrap, args.partitions, args.rate, args.idle, tmp, args.timeout,
                                          args.keep))
                    for inp in inputs]
            print_kafka(inputs, kres, args.rate, args.partitions)
        print(f"\n{load_before} before, {load_average()} after; python {sys.version.split()[0]}")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
