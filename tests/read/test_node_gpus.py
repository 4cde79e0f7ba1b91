"""The Nodes themselves on the read side (issue 28, point 1): the GPU model and count of the nodes a run's pods ran
on, and the nodes' conditions, in `show`, `compare` (a "GPU model" row), `tracker nodes` (GPU and CONDITION) and the
web view's run and compare pages. On an index of the bundled captures (their `nodes.json`) and of a capture in which
one of its nodes goes NotReady and another is cordoned; expectations are derived from the captured Node objects."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tracker.cli import main
from tracker.cli.args import DEMO_CAPTURES
from tracker.read.compare import compare_data, compare_rows
from tracker.read.nodeinfo import node_info
from tracker.read.pods import run_nodes
from tracker.read.store import IndexReader
from tracker.runtime.replay import replay
from tracker.ui import pages

NOW = "2026-08-20T13:00:00Z"
BROKEN_AT = "2026-08-20T12:30:00Z"


def captured_nodes() -> dict[str, dict[str, Any]]:
    """The bundled capture's Node objects (kubectl's concatenated JSON values), by name."""
    text = (DEMO_CAPTURES / "nodes.json").read_text()
    decoder, at, out = json.JSONDecoder(), 0, {}
    while at < len(text.rstrip()):
        value, end = decoder.raw_decode(text, at)
        out[value["object"]["metadata"]["name"]] = value["object"]
        at = end + 1
    return out


def gpu_of(obj: dict[str, Any]) -> str:
    labels = obj["metadata"]["labels"]
    return f"{labels['nvidia.com/gpu.product']} x{labels['nvidia.com/gpu.count']}"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled captures, and two of their nodes later: the first NotReady from BROKEN_AT, the second cordoned."""
    base = tmp_path_factory.mktemp("idx")
    caps = base / "caps"
    shutil.copytree(DEMO_CAPTURES, caps)
    nodes = captured_nodes()
    first, second = (json.loads(json.dumps(nodes[n])) for n in sorted(nodes)[:2])
    for c in first["status"]["conditions"]:
        if c["type"] == "Ready":
            c.update(status="False", reason="KubeletNotReady", message="PLEG is not healthy",
                     lastTransitionTime=BROKEN_AT)
    first["metadata"]["resourceVersion"] = str(int(first["metadata"]["resourceVersion"]) + 1_000_000)
    second["spec"]["unschedulable"] = True
    second["metadata"]["resourceVersion"] = str(int(second["metadata"]["resourceVersion"]) + 1_000_001)
    (caps / "nodes-later.jsonl").write_text("".join(json.dumps({"type": "MODIFIED", "object": o}) + "\n"
                                                    for o in (first, second)))
    path = base / "index.sqlite"
    replay(captures=[caps], index_path=path, console=Console(quiet=True), quiet=True)
    return path


@pytest.fixture(autouse=True)
def _columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # after conftest's _no_env


def run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def runs_on(index: Path) -> dict[str, list[str]]:
    """Each run's nodes, as its stored history has them."""
    with IndexReader(index) as reader:
        out = {}
        for r in reader.runs():
            h = reader.history(r.run_id)
            assert h is not None
            out[r.run_id] = run_nodes(h)
        return out


def test_nodes_has_each_node_s_gpu_model_and_condition(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = captured_nodes()
    first, second = sorted(nodes)[:2]
    rows = {r["node"]: r for r in json.loads(run(capsys, "nodes", "--index", str(index), "--now", NOW,
                                                 "-o", "json"))["nodes"]}
    assert set(rows) <= set(nodes) and rows  # every node a pod ran on was captured
    for name, r in rows.items():
        labels = nodes[name]["metadata"]["labels"]
        assert (r["gpu_product"], r["gpu_count"]) == (labels["nvidia.com/gpu.product"],
                                                      int(labels["nvidia.com/gpu.count"]))
    assert rows[first]["condition"] == "NotReady since 2026-08-20 12:30Z"
    assert rows[second]["condition"] == "cordoned"
    assert all(r["condition"] is None for n, r in rows.items() if n not in (first, second))
    table = run(capsys, "nodes", "--index", str(index), "--now", NOW).splitlines()
    assert table[0].split()[-2:] == ["GPU", "CONDITION"]
    line = next(x for x in table if x.startswith(first + " "))
    assert gpu_of(nodes[first]) in line and line.rstrip().endswith("NotReady since 2026-08-20 12:30Z")


def test_show_says_the_gpu_model_and_state_of_each_node_of_its_pods(
        index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = captured_nodes()
    first = sorted(nodes)[0]
    said_broken = False
    for run_id, used in runs_on(index).items():
        out = run(capsys, "show", run_id, "--index", str(index), "--now", NOW)
        for n in used:
            extra = ", NotReady since 2026-08-20 12:30Z" if n == first else ", cordoned" if n == sorted(nodes)[1] \
                else ""
            assert f"on {n} [{gpu_of(nodes[n])}{extra}]" in out, (run_id, n)
            said_broken |= bool(extra)
        if not used:
            assert "[NVIDIA" not in out
    assert said_broken


def test_compare_has_a_gpu_model_row(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = captured_nodes()
    used = {r: n for r, n in runs_on(index).items()}
    ran = sorted(r for r, n in used.items() if n)
    idle = next(r for r, n in used.items() if not n)
    data = json.loads(run(capsys, "compare", ran[0], idle, "--index", str(index), "--now", NOW, "-o", "json"))
    models = {gpu_of(nodes[n]) for n in used[ran[0]]}
    assert len(models) == 1
    want = f"{models.pop()} ({len(used[ran[0]])} node{'s' if len(used[ran[0]]) != 1 else ''})"
    assert [r["gpu_models"] for r in data["runs"]] == [want, "-"]
    table = run(capsys, "compare", ran[0], idle, "--index", str(index), "--now", NOW)
    line = next(x for x in table.splitlines() if x.lstrip("* ").startswith("GPU model"))
    assert want in line and line.startswith("*")  # the runs differ


def test_the_web_view_says_the_nodes_gpus_and_state(index: Path) -> None:
    nodes = captured_nodes()
    first = sorted(nodes)[0]
    run_id = next(r for r, used in runs_on(index).items() if first in used)
    now = datetime(2026, 8, 20, 13, tzinfo=UTC)
    with IndexReader(index) as reader:
        h = reader.history(run_id)
        assert h is not None
        infos = node_info(reader, run_nodes(h))
    from tracker.read.nodeinfo import notes

    page = pages.run_page(h, now=now, note=None, node_notes=notes(infos))
    assert f"{gpu_of(nodes[first])}, NotReady since 2026-08-20 12:30Z" in page and "node GPUs, state" in page
    rows = dict(compare_rows(compare_data([h, h], now, nodes=infos)))
    assert rows["GPU model"] == [f"{gpu_of(nodes[first])} ({len(run_nodes(h))} nodes)"] * 2


def test_an_index_without_nodes_says_the_pods_as_before(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    caps = tmp_path / "caps"
    shutil.copytree(DEMO_CAPTURES, caps)
    (caps / "nodes.json").unlink()  # a watcher RBAC did not allow to read Nodes
    path = tmp_path / "index.sqlite"
    replay(captures=[caps], index_path=path, console=Console(quiet=True), quiet=True)
    rows = json.loads(run(capsys, "nodes", "--index", str(path), "--now", NOW, "-o", "json"))["nodes"]
    assert rows and all(r["gpu_product"] is None and r["condition"] is None for r in rows)
    run_id = next(r for r, used in runs_on(path).items() if used)
    assert "[" not in "".join(x for x in run(capsys, "show", run_id, "--index", str(path), "--now", NOW).splitlines()
                              if " on aks-" in x)
