"""`tracker replay` (and `serve --from-capture`) of a capture with poison records between good ones: exit 0, the good
runs written as without them, each poison record a dead letter with its reason, at its line. Also through standard
input and gzip."""

from __future__ import annotations

import copy
import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sim.scenarios import SCENARIOS
from tests.support.histories import stored
from tracker.cli import main
from tracker.read.store import IndexReader

REPO = Path(__file__).resolve().parents[2]
GOOD = ("quick-success", "backoff-limit")


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def _good() -> list[dict[str, Any]]:
    return [rec for name in GOOD for stream in SCENARIOS[name].streams().values() for rec in stream]


def _first(kind: str, scenario: str = "quick-success") -> dict[str, Any]:
    rec = next(r for s in SCENARIOS[scenario].streams().values() for r in s
               if r.get("object", {}).get("kind") == kind or r.get("kind") == kind)
    return copy.deepcopy(rec)


def _with(rec: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    cur = rec
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value
    return rec


def _poisons() -> list[tuple[str, str]]:
    """(JSON text of one line, the reason its dead letter gives)."""
    other = _first("Job", "unschedulable")  # a run of its own, so that a malformed root hides nothing good
    conflict = _with(_with(_first("Job"), ["object", "metadata", "uid"], "another-uid"),
                     ["object", "metadata", "creationTimestamp"], "2026-08-20T12:00:00Z")
    deep_job = json.dumps(_first("Job"))[:-2] + ', "deep": ' + _deep(5000) + "}}"
    pod = _first("Pod")
    pod["type"] = "DELETED"
    pod["object"]["metadata"] |= {"deletionTimestamp": "2026-08-20T12:00:00Z", "deletionGracePeriodSeconds": 2**70}
    workload = _first("Workload")
    workload["object"]["status"] = {"schedulingStats": {"evictions": [{"reason": "Preempted", "count": 2**63}]}}
    progress = _first("Progress")
    return [
        (_deep(5000), "invalid JSON: nested too deeply"),
        (deep_job, "invalid JSON: nested too deeply"),
        ('{"type": "ADDED", "object": {"kind": 7' + "0" * 5000 + "}}", "invalid JSON: Exceeds the limit"),
        (json.dumps(_with(_first("Job"), ["object", "kind"], ["Job"])), "unknown kind"),
        (json.dumps(_with(_first("Job"), ["object", "kind"], {"Job": 1})), "unknown kind"),
        (json.dumps(_with(copy.deepcopy(other), ["object", "metadata", "creationTimestamp"], "0000-01-01T00:00:00Z")),
         "malformed Job"),
        (json.dumps(_with(copy.deepcopy(other), ["object", "metadata", "creationTimestamp"], "10000-01-01T00:00:00Z")),
         "malformed Job"),
        (json.dumps(_with(copy.deepcopy(other), ["object", "metadata", "creationTimestamp"],
                          "0001-01-01T00:00:00+14:00")), "malformed Job"),
        (json.dumps(_with(copy.deepcopy(progress), ["step"], 2**63)), "invalid intake event"),
        (json.dumps(_with(copy.deepcopy(progress), ["at"], "9999-12-31T23:59:59-14:00")), "invalid intake event"),
        (json.dumps(_with(_first("Event"), ["object", "count"], 2**63)), "malformed Event"),
        (json.dumps(pod), "malformed Pod"),
        (json.dumps(workload), "malformed Workload"),
        (json.dumps(conflict), "run id taken by another root"),
    ]


def _capture(poisons: list[tuple[str, str]]) -> tuple[str, dict[int, str]]:
    """The good records as JSON lines with a poison after every few; the poisons' line numbers and reasons."""
    good = [json.dumps(r) for r in _good()]
    every = len(good) // (len(poisons) + 1)
    lines: list[str] = []
    where: dict[int, str] = {}
    for i, text in enumerate(good):
        lines.append(text)
        k = i // every
        if (i + 1) % every == 0 and k < len(poisons):
            lines.append(poisons[k][0])
            where[len(lines)] = poisons[k][1]
    return "\n".join(lines) + "\n", where


def _histories(index: Path) -> dict[str, Any]:
    with IndexReader(index) as idx:
        return {r.run_id: stored(idx).history(r.run_id) for r in stored(idx).records()}


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The index a replay of the good records alone gives."""
    d = tmp_path_factory.mktemp("clean")
    (d / "good.jsonl").write_text("\n".join(json.dumps(r) for r in _good()) + "\n")
    assert main(["replay", str(d / "good.jsonl"), "--index", str(d / "index.sqlite")]) == 0
    return d / "index.sqlite"


def _check(index: Path, clean: Path, source: str, where: dict[int, str]) -> None:
    got_runs = _histories(index)
    assert sorted(got_runs) == sorted(rid for name in GOOD for rid in SCENARIOS[name].run_ids)
    assert got_runs == _histories(clean), "the good runs differ from a replay without the poison records"
    letters_file = index.with_name(index.stem + ".dead-letters.jsonl")
    letters = [json.loads(line) for line in letters_file.read_text().splitlines()]
    got = {int(d["source"].rsplit(":", 1)[1]): d["reason"] for d in letters}
    assert all(d["source"].rsplit(":", 1)[0] == source for d in letters), letters
    assert sorted(got) == sorted(where), (got, where)
    for line, reason in where.items():
        assert got[line].startswith(reason), (line, got[line], reason)


def test_replay_of_a_capture_with_poison_records_writes_the_good_runs_and_a_dead_letter_for_each(
        tmp_path: Path, clean: Path) -> None:
    text, where = _capture(_poisons())
    assert len(where) == len(_poisons())
    capture = tmp_path / "poisoned.jsonl"
    capture.write_text(text)
    assert main(["replay", str(capture), "--index", str(tmp_path / "index.sqlite")]) == 0
    _check(tmp_path / "index.sqlite", clean, str(capture), where)


def test_replay_from_standard_input_gzip_compressed(tmp_path: Path, clean: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    text, where = _capture(_poisons())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(text.encode()))))
    assert main(["replay", "-", "--index", str(tmp_path / "index.sqlite")]) == 0
    _check(tmp_path / "index.sqlite", clean, "stdin", where)


def test_serve_from_a_capture_on_standard_input(tmp_path: Path, clean: Path) -> None:
    text, where = _capture(_poisons())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACKER_")}
    proc = subprocess.run([sys.executable, "-m", "tracker.cli", "serve", "--from-capture", "-", "--index",
                           str(tmp_path / "index.sqlite"), "--exit-when-done", "--metrics-port", "0"],
                          input=b"\xef\xbb\xbf" + text.encode(), env=env, cwd=REPO, capture_output=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert b"Traceback" not in proc.stderr
    _check(tmp_path / "index.sqlite", clean, "stdin", where)
