"""Watcher throughput and memory against a real kube-apiserver.

    uv run python bench/watcher.py [--jobs 1000] [--pods-per-job 4] [--events-per-job 1] [--kubeconfig PATH]

Without ``--kubeconfig`` it starts a private etcd + kube-apiserver (``tests.infra.kube``, from the cached test build)
so that no controller touches the objects and other users of the shared test apiserver are not slowed down.
It creates Jobs, their Pods and Events concurrently (at least 5,000 objects with the defaults), then measures:

1. initial sync: a watcher LISTs everything and publishes it (changes/s, and its CPU time per change, which does
   not depend on how busy the machine or the apiserver is), then again under tracemalloc for the memory it holds
   per watched object (Python allocations still live after the sync; RSS delta for reference), and again once the
   watcher has stopped: its state without its connections' TLS and read buffers (a fixed cost per connection,
   about 3 MiB for the 10 streams, whose share per object falls as objects grow) or anything in flight;
2. catch-up: every Pod is updated while the watcher is down; restarted from its checkpoint, the watcher WATCHes
   from its old resourceVersion and the apiserver replays the whole backlog from its watch cache (changes/s);
3. live: with the watcher running, every Pod is updated again; the rate at which the watcher publishes them and
   how far it trails the writes.

The publisher encodes every record to JSON bytes (as the Kafka publisher does) and counts them; nothing is kept.
The garbage collector is set as ``tracker watch`` sets it (``tracker.runtime.gctune``); ``--gc default`` keeps
CPython's defaults (the figures before 2026-12-06 were measured so: the collector's passes then cost more).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.config import new_client_from_config

from tracker.shell.watch import Change, KubeApi, Watcher, WatchSettings

Obj = dict[str, Any]
NAMESPACE = "tracker-bench"


@dataclass
class Counting:
    """A Publisher that encodes each record and counts it, with the time of every 100th."""

    published: int = 0
    bytes: int = 0
    marks: list[tuple[int, float]] = field(default_factory=list)

    async def publish(self, key: str, record: Change, *, source: str) -> None:
        self.bytes += len(json.dumps(record, separators=(",", ":")).encode()) + len(key)
        self.published += 1
        if self.published % 100 == 0:
            self.marks.append((self.published, time.perf_counter()))

    async def flush(self) -> None:
        return None

    async def reach(self, n: int, within_s: float = 600) -> float:
        deadline = time.perf_counter() + within_s
        while self.published < n:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"published {self.published} of {n}")
            await asyncio.sleep(0.005)
        return time.perf_counter()


async def call(client: ApiClient, method: str, path: str, body: Obj, content_type: str = "application/json") -> Obj:
    resp = await client.call_api(path, method, body=body, header_params={"Accept": "application/json",
                                                                          "Content-Type": content_type},
                                 auth_settings=["BearerToken"], _preload_content=False, _request_timeout=60)
    try:
        data: Obj = json.loads(await resp.read())
    finally:
        resp.release()
    if resp.status >= 300:
        raise RuntimeError(f"{method} {path}: {resp.status} {data.get('message')}")
    return data


async def bounded(calls: Iterable[Awaitable[Obj]], concurrency: int) -> list[Obj]:
    gate = asyncio.Semaphore(concurrency)

    async def one(c: Awaitable[Obj]) -> Obj:
        async with gate:
            return await c

    return await asyncio.gather(*(one(c) for c in calls))


def job(i: int, pods: int) -> Obj:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"job-{i:05d}", "labels": {"taugrid.io/run-id": f"bench-{i:05d}"}},
            "spec": {"suspend": True, "parallelism": pods, "completions": pods,
                     "managedBy": "tracker.bench/none",  # the Job controller (if any) leaves it alone
                     "template": {"spec": {"restartPolicy": "Never", "containers": [
                         {"name": "trainer", "image": "trainer:1", "resources": {"requests": {"cpu": "1"}}}]}}}}


def pod(owner: Obj, k: int) -> Obj:
    meta = owner["metadata"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{meta['name']}-{k}", "labels": {
                "batch.kubernetes.io/controller-uid": meta["uid"], "batch.kubernetes.io/job-name": meta["name"]},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                     "uid": meta["uid"], "controller": True}]},
            # no scheduler picks a pod for this scheduler name, so nothing else writes to it
            "spec": {"schedulerName": "tracker-bench-none", "restartPolicy": "Never", "containers": [
                {"name": "trainer", "image": "trainer:1", "resources": {"requests": {"cpu": "1"}},
                 "env": [{"name": f"VAR_{n}", "value": "x" * 40} for n in range(20)]}]}}


def event(owner: Obj, k: int, now: str) -> Obj:
    meta = owner["metadata"]
    return {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": f"{meta['name']}.{k}"},
            "eventTime": now, "reason": "Created", "note": "bench event", "action": "Create", "type": "Normal",
            "reportingController": "tracker.bench/controller", "reportingInstance": "bench",
            "regarding": {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "namespace": NAMESPACE,
                          "uid": meta["uid"]}}


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


async def update_pods(client: ApiClient, pods: list[Obj], round_: int, concurrency: int) -> None:
    patch = {"status": {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": f"bench round {round_}",
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]}}
    await bounded((call(client, "PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{p['metadata']['name']}/status",
                        patch, "application/merge-patch+json") for p in pods), concurrency)


async def bench(args: argparse.Namespace, kubeconfig: Path, workdir: Path) -> None:
    n_jobs, per_job, per_event = args.jobs, args.pods_per_job, args.events_per_job
    total = n_jobs * (1 + per_job + per_event)
    config = WatchSettings(namespaces=(NAMESPACE,), outbox_size=args.outbox, page_size=500,
                         checkpoint_interval_s=5.0, log_interval_s=3600)
    async with AsyncExitStack() as stack:
        admin = await stack.enter_async_context(await new_client_from_config(config_file=str(kubeconfig)))
        admin.configuration.connection_pool_maxsize = args.concurrency
        await call(admin, "POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        start = time.perf_counter()
        jobs = await bounded((call(admin, "POST", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", job(i, per_job))
                              for i in range(n_jobs)), args.concurrency)
        pods = await bounded((call(admin, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod(j, k))
                              for j in jobs for k in range(per_job)), args.concurrency)
        await bounded((call(admin, "POST", f"/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events", event(j, k, now))
                       for j in jobs for k in range(per_event)), args.concurrency)
        created_s = time.perf_counter() - start
        print(f"created {total} objects ({n_jobs} Jobs, {len(pods)} Pods, {n_jobs * per_event} Events) in "
              f"{created_s:.1f}s: {total / created_s:.0f} creates/s at concurrency {args.concurrency}")

        watcher_client = await stack.enter_async_context(await new_client_from_config(config_file=str(kubeconfig)))
        api = KubeApi(watcher_client)
        checkpoint = workdir / "watch.sqlite"

        # 1. initial sync: LIST everything and publish it (wall clock, and this process's CPU time: the watcher is
        #    all it runs meanwhile); then again under tracemalloc for the memory held per watched object
        out = Counting()
        watcher = Watcher(api, out, config)
        stop = asyncio.Event()
        t0, cpu0 = time.perf_counter(), time.process_time()
        task = asyncio.create_task(watcher.run(stop))
        t1 = await out.reach(total)
        cpu = time.process_time() - cpu0
        stop.set()
        await task
        stats = watcher.stats
        print(f"initial sync: {total} objects listed and published in {t1 - t0:.2f}s = {total / (t1 - t0):.0f} "
              f"changes/s; watcher CPU {cpu * 1e6 / total:.0f} us/change (CPU-bound ceiling {total / cpu:.0f}/s)")
        print(f"  record size: {stats.record_bytes / stats.changes:.0f} B slimmed (largest {stats.largest_record} B); "
              f"published {out.bytes / out.published:.0f} B/record")
        gc.collect()
        tracemalloc.start()
        before_py, before_rss = tracemalloc.get_traced_memory()[0], rss_kib()
        out = Counting()
        watcher = Watcher(api, out, config, checkpoint=checkpoint)
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(stop))
        await out.reach(total)
        await watcher.wait_synced()
        gc.collect()
        held_py, held_rss = tracemalloc.get_traced_memory()[0] - before_py, rss_kib() - before_rss
        stop.set()
        await task
        await asyncio.sleep(0.5)  # the connections' closing callbacks
        gc.collect()
        kept_py = tracemalloc.get_traced_memory()[0] - before_py  # the watcher stopped, still referenced: its state
        tracemalloc.stop()
        print(f"  memory per watched object: {held_py / total:.0f} B of Python allocations (tracemalloc) while it "
              f"runs, {held_rss * 1024 / total:.0f} B RSS delta (incl. tracemalloc's own overhead); once stopped "
              f"(its {len(watcher.streams)} watch connections closed, the objects it knows still held): "
              f"{kept_py / total:.0f} B")

        # 2. catch-up: the backlog written while the watcher was down, replayed by WATCH from the checkpoint
        await update_pods(admin, pods, 1, args.concurrency)
        out = Counting()
        watcher = Watcher(api, out, config, checkpoint=checkpoint)
        stop = asyncio.Event()
        t0, cpu0 = time.perf_counter(), time.process_time()
        task = asyncio.create_task(watcher.run(stop))
        t1 = await out.reach(len(pods))
        cpu = time.process_time() - cpu0
        stop.set()
        await task
        assert watcher.stats.relists == 0, "the backlog fell out of the watch cache: this measured a re-list"
        received = watcher.stats.received_bytes
        print(f"catch-up: {len(pods)} watch events replayed from the checkpoint in {t1 - t0:.2f}s = "
              f"{len(pods) / (t1 - t0):.0f} changes/s; watcher CPU {cpu * 1e6 / len(pods):.0f} us/change "
              f"(CPU-bound ceiling {len(pods) / cpu:.0f}/s); {received / len(pods):.0f} B/event on the wire, "
              f"{received / max(1, watcher.stats.record_bytes):.1f}x the slimmed size")

        # 3. live: the watcher runs while every pod is written again
        out = Counting()
        watcher = Watcher(api, out, config, checkpoint=checkpoint)
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(stop))
        await watcher.wait_synced()
        t0 = time.perf_counter()
        await update_pods(admin, pods, 2, args.concurrency)
        t_written = time.perf_counter()
        t1 = await out.reach(len(pods))
        stop.set()
        await task
        print(f"live: {len(pods)} pod updates written in {t_written - t0:.2f}s ({len(pods) / (t_written - t0):.0f} "
              f"writes/s), all published {(t1 - t_written) * 1000:.0f} ms after the last write: "
              f"{len(pods) / (t1 - t0):.0f} changes/s end to end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--pods-per-job", type=int, default=4)
    parser.add_argument("--events-per-job", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=64, help="creates and updates in flight")
    parser.add_argument("--outbox", type=int, default=10_000)
    parser.add_argument("--kubeconfig", type=Path, help="an existing apiserver (default: start a private one)")
    parser.add_argument("--gc", choices=("tracker", "default"), default="tracker",
                        help="the garbage collector as tracker watch sets it, or CPython's defaults")
    args = parser.parse_args()
    if args.gc == "tracker":
        from tracker.runtime.gctune import tune_gc

        tune_gc()
    with tempfile.TemporaryDirectory(prefix="tracker-bench-") as tmp:
        workdir = Path(tmp)
        if args.kubeconfig is not None:
            asyncio.run(bench(args, args.kubeconfig, workdir))
            return
        from tests.infra import kube

        started = time.perf_counter()
        instance = kube.start(workdir / "control-plane")
        print(f"private etcd + kube-apiserver {instance.server} up in {time.perf_counter() - started:.1f}s")
        try:
            asyncio.run(bench(args, instance.kubeconfig, workdir))
        finally:
            for process in reversed(instance.processes):
                process.stop()


if __name__ == "__main__":
    main()
