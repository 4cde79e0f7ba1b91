"""Reducer throughput and memory per active run, on one core.

    uv run python bench/reducer.py [--runs 50000] [--seed 7] [--flush-every 50000]

Input: a generated, interleaved stream of realistic watch and intake events (sim.lifecycles),
about 20 changes per run. Generation is done in chunks outside the timed sections. Printed figures:
- baseline: decoding the same records from their JSON encoding with the decoder the reducer's consumer uses
  (``tracker.shell.jsonio.loads``, orjson; bytes as a Kafka record value holds them);
- fold: Reducer.apply alone (changes folded per second);
- fold + derive: apply plus flush every --flush-every changes (histories derived for changed runs);
- memory per run: tracemalloc over a separate sample, reducer state only, flushing every 5,000 records; then apart:
  the core's bounded process-wide memos (timestamps, datetimes, redactions: a few MB whatever the number of runs,
  counted in the figure per run as before, and given apart), the facts and bindings every run holds, and the
  derivations kept (a live run's; a finished run frees its own, ``finished_derivation_rows``, and its facts are
  packed from the next flush on, ``tracker.core.run_table``);
- resident memory per run (``--rss-runs``, in a process of its own after the rest): the growth of the process's
  RSS while a Reducer folds that many runs decoded one by one from their JSON (as a consumer decodes them, so no
  string is shared with the input), flushing every 5,000 records: Python's allocations plus the allocator's
  overhead and fragmentation, what a container's memory limit sees.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from itertools import islice
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/reducer.py
    sys.path.insert(0, str(REPO))

from bench._common import memory_kib  # noqa: E402
from sim.lifecycles import generate_stream  # noqa: E402
from tracker.core import extract, model, redact, timefmt  # noqa: E402
from tracker.core.reducer import Reducer  # noqa: E402
from tracker.runtime.gctune import tune_gc  # noqa: E402
from tracker.shell import jsonio  # noqa: E402

CHUNK = 100_000


def chunks(n_runs: int, seed: int) -> Any:
    it = generate_stream(n_runs, seed)
    while True:
        block = list(islice(it, CHUNK))
        if not block:
            return
        yield block


def bench_throughput(n_runs: int, seed: int, flush_every: int) -> dict[str, float]:
    red_fold = Reducer()
    red_full = Reducer()
    t_decode = t_fold = t_full = t_derive = 0.0
    n = 0
    histories = 0
    since = 0
    for block in chunks(n_runs, seed):
        texts = [jsonio.dumps(r) for r in block]  # what `tracker reduce` reads: UTF-8 JSON record values
        loads = jsonio.loads
        t0 = time.perf_counter()
        for text in texts:
            loads(text)
        t_decode += time.perf_counter() - t0
        del texts

        apply = red_fold.apply
        t0 = time.perf_counter()
        for rec in block:
            apply(rec, "bench")
        t_fold += time.perf_counter() - t0

        apply = red_full.apply
        t0 = time.perf_counter()
        for rec in block:
            apply(rec, "bench")
            since += 1
            if since >= flush_every:
                t1 = time.perf_counter()
                histories += len(red_full.flush().histories)
                t_derive += time.perf_counter() - t1
                since = 0
        t_full += time.perf_counter() - t0
        n += len(block)
    t0 = time.perf_counter()
    histories += len(red_full.flush().histories)
    dt = time.perf_counter() - t0
    t_full += dt
    t_derive += dt
    return {"changes": n, "runs": len(red_fold.runs), "decode_s": t_decode, "fold_s": t_fold,
            "full_s": t_full, "derive_s": t_derive, "histories": histories,
            "dead_letters": red_fold.stats.dead_letters}


def active_runs(red: Reducer) -> int:
    """The runs of ``red`` still pending or running."""
    return sum(1 for h in (red.history(k) for k in red.runs) if h and h.run.status in ("pending", "running"))


MEMORY_FLUSH_EVERY = 5_000  # as the RSS figure, and the pipeline's flush_every: a finished run is packed a flush later


def bench_memory(n_runs: int, seed: int) -> dict[str, float]:
    records = list(generate_stream(n_runs, seed))
    gc.collect()
    tracemalloc.start()
    red = Reducer()
    base = tracemalloc.get_traced_memory()[0]
    for i, rec in enumerate(records, start=1):
        red.apply(rec, "bench")
        if i % MEMORY_FLUSH_EVERY == 0:
            red.flush()
    red.flush()
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    clear_memos()  # what the bounded memos hold: the same for 5,000 runs as for 500,000
    gc.collect()
    memos = used - (tracemalloc.get_traced_memory()[0] - base)
    packed, packed_bytes = red.runs.packed_size()
    kept = len(red.derivations)
    red.derivations.clear()  # what the kept derivations held: the rest is the facts (and bindings) of every run
    gc.collect()
    derivations = used - (tracemalloc.get_traced_memory()[0] - base)
    tracemalloc.stop()
    active = active_runs(red)  # after: reading a packed run's history unpacks it
    return {"runs": len(red.runs), "active": active, "bytes": used, "kept": kept, "derivations": derivations - memos,
            "packed": packed, "packed_bytes": packed_bytes, "memos": memos}


def clear_memos() -> None:
    """Empty the core's process-wide memos, each bounded (a few MB in all, whatever the number of runs): parsed
    timestamps, datetimes, redacted short texts, secret key names."""
    extract._TS_CACHE.clear()
    for memo in (model._utc, timefmt._parse, redact.secret_key, redact._redact_short):
        memo.cache_clear()


def write_encoded(n_runs: int, seed: int, path: Path) -> None:
    """The generated stream as JSON lines (one encoded record a line)."""
    with path.open("wb") as out:
        for block in chunks(n_runs, seed):
            out.write(b"".join(jsonio.dumps(rec) + b"\n" for rec in block))


def bench_rss(path: Path) -> dict[str, float]:
    """RSS growth of a Reducer folding the records of ``path`` decoded one by one. Run in a fresh process: only the
    encoded lines are allocated before the first reading, so no memory freed earlier is reused by the reducer."""
    encoded = path.read_bytes().splitlines()
    gc.collect()
    before = memory_kib(os.getpid())["VmRSS"] * 1024
    red = Reducer()
    for i, raw in enumerate(encoded, start=1):
        red.apply(jsonio.loads(raw), "bench")
        if i % 5_000 == 0:
            red.flush()
    red.flush()
    gc.collect()
    grown = memory_kib(os.getpid())["VmRSS"] * 1024 - before
    active = active_runs(red)
    return {"runs": len(red.runs), "active": active, "bytes": grown, "derivations": len(red.derivations)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--flush-every", type=int, default=50_000)
    ap.add_argument("--memory-runs", type=int, default=5_000)
    ap.add_argument("--rss-runs", type=int, default=20_000,
                    help="runs of the resident-memory figure, measured in a process of its own (0: skip)")
    ap.add_argument("--rss-input", type=Path, help=argparse.SUPPRESS)  # that process: the encoded records
    args = ap.parse_args(argv)
    if args.rss_input is not None:
        tune_gc()
        m = bench_rss(args.rss_input)
        print(f"resident memory: +{m['bytes'] / 2**20:.0f} MiB RSS for {m['runs']:,} runs ({m['active']:,} still "
              f"active, {m['derivations']:,} derivations kept) decoded from JSON: "
              f"{m['bytes'] / max(1, m['runs']) / 1024:.1f} KiB per run")
        return 0

    default_gc = bench_throughput(min(args.runs, 10_000), args.seed, args.flush_every)
    tune_gc()  # what the tracker's processes run with (tracker/runtime/gctune.py)
    r = bench_throughput(args.runs, args.seed, args.flush_every)
    n = r["changes"]
    print(f"input: {n:,} changes over {r['runs']:,} runs ({n / max(1, r['runs']):.1f} per run), "
          f"python {sys.version.split()[0]}, one core")
    print(f"baseline decode, jsonio.loads (orjson)  : {n / r['decode_s']:>12,.0f} records/s "
          "(the reducer's own decoder, on the same records)")
    print(f"fold (Reducer.apply)                    : {n / r['fold_s']:>12,.0f} changes/s")
    print(f"fold + derive (flush every {args.flush_every:,})      : {n / r['full_s']:>12,.0f} changes/s "
          f"({r['histories']:,} histories derived in {r['derive_s']:.1f} s, "
          f"{r['histories'] / max(r['derive_s'], 1e-9):,.0f} histories/s)")
    print(f"fold with CPython's default GC thresholds ({default_gc['changes']:,} changes): "
          f"{default_gc['changes'] / default_gc['fold_s']:,.0f} changes/s (tuned figures above)")
    print(f"dead letters: {r['dead_letters']}")
    m = bench_memory(args.memory_runs, args.seed + 1)
    rest = (m["bytes"] - m["memos"] - m["derivations"]) / max(1, m["runs"])
    print(f"memory: {m['bytes'] / 1e6:.1f} MB of reducer state for {m['runs']:,} runs "
          f"({m['active']:,} still active): {m['bytes'] / max(1, m['runs']) / 1024:.1f} KiB per run; of it, "
          f"{m['memos'] / 1e6:.1f} MB the bounded memos, {(m['bytes'] - m['memos']) / max(1, m['runs']) / 1024:.1f} "
          f"KiB a run without them; facts and bindings {rest / 1024:.1f} KiB a run, and {m['kept']:,} derivations "
          f"kept, {m['derivations'] / max(1, m['kept']) / 1024:.1f} KiB each; {m['packed']:,} runs' facts packed, "
          f"{m['packed_bytes'] / max(1, m['packed']):,.0f} bytes each")
    sys.stdout.flush()
    if args.rss_runs > 0:  # a fresh process: the memory this one freed would hide the growth
        with tempfile.TemporaryDirectory(prefix="tracker-bench-") as tmp:
            path = Path(tmp) / "records.jsonl"
            write_encoded(args.rss_runs, args.seed + 2, path)
            subprocess.run([sys.executable, __file__, "--rss-input", str(path)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
