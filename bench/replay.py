"""`tracker replay` of a capture of full kubectl objects, one process: changes/s, wall and CPU.

    uv run python bench/replay.py [--objects 100000] [--detail full] [--object-bytes 0] [--formats jsonl kubectl]

The capture: ``--objects`` records of generated lifecycles (``sim.lifecycles.generate_stream``: Jobs,
RayJobs, Kueue Workloads, Pods, RayClusters, Events and TauGrid intake events of runs submitted 3 s apart, in time
order) with every watch object widened to what the apiserver returns (``bench/_objects.py``): ``--detail full``
adds ``managedFields``, annotations, the containers' environment, ports and mounts, volumes, tolerations, node
selector, IPs and container IDs; ``medium`` all of it but ``managedFields``; ``plain`` leaves the generator's
objects as they are. ``--object-bytes N`` pads Pods, Jobs and Workloads up to about N bytes (more environment
variables). Formats: ``jsonl`` (JSON lines of watch events, as ``tracker watch --capture`` writes them) and
``kubectl`` (what ``kubectl get ... -w --output-watch-events -o json`` prints: concatenated JSON values, indented
by 4). The capture is written to a temporary directory before anything is timed.

Timed, each ``tracker replay CAPTURE --index FRESH.sqlite`` as a subprocess (wall time; CPU time and peak RSS of
that process alone, from ``wait4``), with in the same run:

- baselines on the same file, in this process: reading and decoding every record with orjson (the decoder the
  tracker's Kafka path uses) and with the standard library's ``json`` (the one the capture reader uses);
- a no-op ``tracker replay`` (an empty capture into a fresh index): start-up and shut-down, subtracted in the
  "net" figures;
- the same lifecycles as the generator writes them (``plain``): what the size of the objects costs.

The histories are checked: ``tracker runs -o json`` of every index must be the same (the widened objects carry no
lifecycle meaning), and no replay may write a dead letter.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/replay.py
    sys.path.insert(0, str(REPO))

import orjson  # noqa: E402

from bench._common import Finished, load_average, run_timed, tracker_command, without_tracker_settings  # noqa: E402
from bench._objects import full_record  # noqa: E402
from sim.lifecycles import generate_stream  # noqa: E402

NOW = "2026-09-01T00:00:00Z"  # reference time of `tracker runs` (the captures are of 2026-08-20)
_INDENT = re.compile(rb"^( +)", re.MULTILINE)


@dataclass
class Capture:
    name: str
    path: Path
    records: int = 0
    bytes: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    kind_bytes: Counter[str] = field(default_factory=Counter)
    spans: list[int] = field(default_factory=list)  # kubectl format: the end offset of each value


def kind_of(record: dict[str, Any]) -> str:
    obj = record.get("object")
    return str(obj.get("kind")) if isinstance(obj, dict) else "intake"


def kubectl_json(value: Any) -> bytes:
    """A value as kubectl prints it with -o json: indented by 4, keys in their order, a newline at the end."""
    return _INDENT.sub(lambda m: m.group(1) * 2, orjson.dumps(value, option=orjson.OPT_INDENT_2)) + b"\n"


def write_captures(tmp: Path, objects: int, seed: int, detail: str, object_bytes: int,
                   formats: list[str]) -> tuple[Capture, dict[str, Capture]]:
    """The plain capture (JSON lines of the generator's records) and the widened one in each format."""
    plain = Capture("plain", tmp / "plain.jsonl")
    full = {fmt: Capture(f"{detail}/{fmt}", tmp / f"{detail}.{'jsonl' if fmt == 'jsonl' else 'json'}")
            for fmt in formats}
    handles = {fmt: c.path.open("wb") for fmt, c in full.items()}
    try:
        with plain.path.open("wb") as plain_fh:
            for rec in islice(generate_stream(objects, seed), objects):  # ~20 records a run: runs to spare
                kind = kind_of(rec)
                line = orjson.dumps(rec) + b"\n"
                plain_fh.write(line)
                plain.records += 1
                plain.bytes += len(line)
                plain.kinds[kind] += 1
                plain.kind_bytes[kind] += len(line)
                wide = rec if detail == "plain" else full_record(rec, object_bytes, detail=detail)
                for fmt, cap in full.items():
                    data = orjson.dumps(wide) + b"\n" if fmt == "jsonl" else kubectl_json(wide)
                    handles[fmt].write(data)
                    cap.records += 1
                    cap.bytes += len(data)
                    cap.kinds[kind] += 1
                    cap.kind_bytes[kind] += len(data)
                    if fmt == "kubectl":
                        cap.spans.append(cap.bytes)
    finally:
        for fh in handles.values():
            fh.close()
    return plain, full


def values(cap: Capture) -> Iterator[bytes]:
    """The encoded records of a capture, read from its file."""
    with cap.path.open("rb") as fh:
        if not cap.spans:
            yield from fh
            return
        at = 0
        for end in cap.spans:
            yield fh.read(end - at)
            at = end


def decode_baselines(cap: Capture) -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds to read and decode every record of ``cap`` with orjson and with the stdlib json."""
    out = {}
    for name, loads in (("orjson", orjson.loads), ("json", json.loads)):
        w0, c0 = time.perf_counter(), time.process_time()
        n = sum(1 for v in values(cap) if loads(v) is not None)
        out[name] = (time.perf_counter() - w0, time.process_time() - c0)
        assert n == cap.records
    return out


def replay(paths: list[Path], index: Path, timeout_s: float) -> Finished:
    env = without_tracker_settings(dict(os.environ))
    return run_timed([*tracker_command(), "replay", *map(str, paths), "--index", str(index)], env=env,
                     timeout_s=timeout_s).check(f"tracker replay {' '.join(map(str, paths))}")


def runs_json(index: Path, timeout_s: float) -> Any:
    env = without_tracker_settings(dict(os.environ))
    done = run_timed([*tracker_command(), "runs", "--index", str(index), "-o", "json", "--now", NOW,
                      "--limit", "100000000"], env=env, timeout_s=timeout_s).check("tracker runs")
    return json.loads(done.stdout)


def dead_letters(index: Path) -> int:
    path = index.with_name(index.stem + ".dead-letters.jsonl")
    return sum(1 for _ in path.open("rb")) if path.exists() else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=100_000, help="records in the capture (watch and intake events)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--detail", choices=["full", "medium", "plain"], default="full",
                    help="what the watch objects carry (see above)")
    ap.add_argument("--object-bytes", type=int, default=0, metavar="N",
                    help="pad Pods, Jobs and Workloads up to about N bytes (0: their natural size)")
    ap.add_argument("--formats", nargs="+", choices=["jsonl", "kubectl"], default=["jsonl"])
    ap.add_argument("--noop-repeats", type=int, default=3, help="no-op replays (their median is subtracted)")
    ap.add_argument("--timeout", type=float, default=3_600.0, help="seconds allowed to each subprocess")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (captures and indexes)")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="tracker-bench-replay-"))
    try:
        return run(args, tmp)
    finally:
        if args.keep:
            print(f"captures and indexes kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, tmp: Path) -> int:
    load_before = load_average()
    t0 = time.perf_counter()
    plain, full = write_captures(tmp, args.objects, args.seed, args.detail, args.object_bytes, args.formats)
    print(f"captures written in {time.perf_counter() - t0:.1f} s (not timed) to {tmp}")

    (tmp / "empty.jsonl").write_bytes(b"")
    noop = [replay([tmp / "empty.jsonl"], tmp / f"noop-{i}.sqlite", args.timeout) for i in range(args.noop_repeats)]
    noop_wall = statistics.median(f.wall_s for f in noop)
    noop_cpu = statistics.median(f.cpu_s for f in noop)

    results: list[tuple[Capture, Finished, dict[str, tuple[float, float]]]] = []
    for cap in [plain, *full.values()]:
        baselines = decode_baselines(cap)
        done = replay([cap.path], tmp / f"{cap.name.replace('/', '-')}.sqlite", args.timeout)
        results.append((cap, done, baselines))

    # the histories: the same from every capture, and nothing dead-lettered
    reference = runs_json(tmp / "plain.sqlite", args.timeout)
    same = all(runs_json(tmp / f"{cap.name.replace('/', '-')}.sqlite", args.timeout) == reference
               for cap in full.values())
    letters = {cap.name: dead_letters(tmp / f"{cap.name.replace('/', '-')}.sqlite") for cap, _, _ in results}

    n = plain.records
    print(f"\ntracker replay, one process; {n:,} records of {len(reference):,} runs "
          f"(seed {args.seed}), python {sys.version.split()[0]}; {load_before} before, {load_average()} after")
    for cap in [plain, *full.values()]:
        kinds = ", ".join(f"{k} {c:,} ({cap.kind_bytes[k] / c / 1024:.1f} KiB)" for k, c in cap.kinds.most_common())
        print(f"  capture {cap.name}: {cap.bytes / 1e6:,.1f} MB, {cap.bytes / cap.records / 1024:.2f} KiB per "
              f"record on average; {kinds}")
    print(f"  no-op replay (empty capture, fresh index; median of {len(noop)}): wall {noop_wall * 1e3:.0f} ms, "
          f"CPU {noop_cpu * 1e3:.0f} ms  (subtracted in the net figures)")
    print(f"\n  {'capture':<16} {'what':<34} {'changes/s':>11} {'CPU us/change':>14} {'wall s':>8} {'CPU s':>7} "
          f"{'peak RSS':>9}")
    for cap, done, baselines in results:
        for name, (wall, cpu) in baselines.items():
            label = "orjson.loads (baseline)" if name == "orjson" else "json.loads, stdlib (baseline)"
            print(f"  {cap.name:<16} {label:<34} {n / wall:>11,.0f} {cpu / n * 1e6:>14.1f} {wall:>8.2f} "
                  f"{cpu:>7.2f} {'':>9}")
        print(f"  {cap.name:<16} {'tracker replay':<34} {n / done.wall_s:>11,.0f} {done.cpu_s / n * 1e6:>14.1f} "
              f"{done.wall_s:>8.2f} {done.cpu_s:>7.2f} {done.maxrss_kib / 1024:>6.0f} MiB")
        net_wall, net_cpu = done.wall_s - noop_wall, done.cpu_s - noop_cpu
        print(f"  {cap.name:<16} {'tracker replay, net of the no-op':<34} {n / net_wall:>11,.0f} "
              f"{net_cpu / n * 1e6:>14.1f} {net_wall:>8.2f} {net_cpu:>7.2f}")
        print(f"  {'':<16} {'  = x times orjson decoding (CPU)':<34} {net_cpu / baselines['orjson'][1]:>11.1f}")
    print(f"\n  histories: tracker runs -o json of every index {'identical' if same else 'DIFFER'} "
          f"({len(reference):,} runs); dead letters: "
          + ", ".join(f"{k} {v}" for k, v in letters.items()))
    return 0 if same and not any(letters.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
