"""The compiled core against the pure one, side by side in one run.

    uv run python bench/compiled.py [--rounds 2] [--runs 50000] [--objects 50000]

The working tree is copied to a temporary folder and its core compiled there with mypyc (``tests.compiled``: the
same build as ``./run compile``); this tree stays plain Python. Then, one after the other and alternating
(pure, compiled, pure, compiled, ...), each of:
- ``bench/reducer.py --runs N``: fold and fold + derive of generated narrow runs, in one process;
- ``bench/replay.py --objects N``: ``tracker replay`` of full objects (JSON lines), a subprocess; its CPU time.
Each run checks that the tree it ran is the one asked for (``tracker --version`` says what the core runs as), and
that both trees' replays wrote the same histories (``tracker runs -o json``). Printed: each figure per round and
tree, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.compiled import compiled_copy  # noqa: E402

FIGURES = {  # figure -> (benchmark, the pattern of its printed line)
    "fold, changes/s": ("reducer", r"^fold \(Reducer\.apply\)\s*:\s*([\d,]+) changes/s"),
    "fold + derive, changes/s": ("reducer", r"^fold \+ derive .*?:\s*([\d,]+) changes/s"),
    "replay, changes/s": ("replay", r"^\s+\S+\s+tracker replay\s+([\d,]+)\s"),
    "replay, CPU us/change": ("replay", r"^\s+\S+\s+tracker replay\s+[\d,]+\s+([\d.]+)\s"),
}


def _run(tree: Path, args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(args)} in {tree} failed (exit {done.returncode}): "
                         f"{done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


def _core(tree: Path) -> str:
    return _run(tree, ["-m", "tracker.cli", "--version"]).split("; core: ", 1)[1].strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", type=int, default=50_000, help="bench/reducer.py --runs")
    ap.add_argument("--objects", type=int, default=50_000, help="bench/replay.py --objects")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tracker-bench-compiled-") as tmp:
        compiled = compiled_copy(Path(tmp))
        if compiled is None:
            return 1
        trees = {"pure": REPO, "compiled": compiled}
        for name, tree in trees.items():
            core = _core(tree)
            if core.startswith("pure") != (name == "pure"):
                raise SystemExit(f"error: the {name} tree runs its core as {core}")
            print(f"{name:>8}: {tree} ({core})", flush=True)
        got: dict[str, dict[str, list[float]]] = {n: {f: [] for f in FIGURES} for n in trees}
        outputs: dict[str, list[str]] = {n: [] for n in trees}
        for round_ in range(args.rounds):
            for name, tree in trees.items():
                texts = {"reducer": _run(tree, ["bench/reducer.py", "--runs", str(args.runs), "--memory-runs", "1000"]),
                         "replay": _run(tree, ["bench/replay.py", "--objects", str(args.objects), "--noop-repeats",
                                               "1"])}
                if "histories: tracker runs -o json of every index identical" not in texts["replay"]:
                    raise SystemExit(f"error: the {name} tree's replays wrote different histories")
                outputs[name].append(texts["replay"])
                for figure, (bench, pattern) in FIGURES.items():
                    m = re.search(pattern, texts[bench], re.M)
                    if m is None:
                        raise SystemExit(f"error: no '{figure}' in bench/{bench}.py's output:\n{texts[bench]}")
                    got[name][figure].append(float(m.group(1).replace(",", "")))
                print(f"round {round_ + 1}, {name}: " + "; ".join(f"{f} {v[-1]:,.1f}" for f, v in got[name].items()),
                      flush=True)
        same = _histories(outputs)
        across = _across(trees, Path(tmp))
    print(f"\n{'figure':<26} {'pure (each round)':>28} {'compiled (each round)':>28} {'compiled / pure':>16}")
    for figure in FIGURES:
        p, c = got["pure"][figure], got["compiled"][figure]
        ratio = statistics.median(c) / statistics.median(p)
        print(f"{figure:<26} {' / '.join(f'{v:,.1f}' for v in p):>28} {' / '.join(f'{v:,.1f}' for v in c):>28} "
              f"{ratio:>15.2f}x")
    print(f"\nhistories of the replays: {same}; the bundled captures replayed by both trees: {across}")
    return 0


def _across(trees: dict[str, Path], tmp: Path) -> str:
    """Whether both trees replay the bundled captures into the same histories (``runs -o json``, every run's
    ``show -o json``)."""
    seen = {}
    for name, tree in trees.items():
        index = tmp / f"across-{name}.sqlite"
        _run(tree, ["-m", "tracker.cli", "replay", str(REPO / "tracker" / "captures" / "demo"), "--index", str(index)])
        runs = _run(tree, ["-m", "tracker.cli", "runs", "--index", str(index), "-o", "json"])
        ids = re.findall(r'"run_id": "([^"]+)"', runs)
        shows = [_run(tree, ["-m", "tracker.cli", "show", run_id, "--index", str(index), "-o", "json"]) for run_id in
                 sorted(set(ids))]
        seen[name] = (runs, shows)
    return "identical" if seen["pure"] == seen["compiled"] else "DIFFER"


def _histories(outputs: dict[str, list[str]]) -> str:
    """Whether both trees' replays found their indexes identical to the reference (each checks its own rounds)."""
    flags = {n: all("identical" in o for o in outs) for n, outs in outputs.items()}
    return "identical within each tree" if all(flags.values()) else f"DIFFER: {flags}"


if __name__ == "__main__":
    sys.exit(main())
