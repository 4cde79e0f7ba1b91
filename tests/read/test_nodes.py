"""Nodes on the read side (issue 28, point 1): `runs --node`, the pods by node in `show` and `compare`, and
`tracker nodes` (the bad-node signal), on an index of the bundled captures. Every expectation is derived from the
runs' published histories (`show -o json`: their pods, nodes and pod failures), not written down."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from tracker.cli import main
from tracker.read.filters import FILTERS, LIST_FILTERS, FilterError, run_filter

NOW = "2026-08-20T13:00:00Z"  # the end of the bundled capture's day
EVICTIONS = ("PodEvicted", "Preempted", "PodsReadyTimeout", "Evicted")  # tracker.read.pods.EVICTION_LOSSES


def run(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> str:
    assert main(list(args)) == code, capsys.readouterr().err
    out, err = capsys.readouterr()
    if code:
        assert out == "" and err.startswith("error: ") and len(err.strip().splitlines()) == 1, (out, err)
        return err
    assert err == "", err  # --now given: no recording note
    return out


@pytest.fixture(scope="module")
def histories(index: Path) -> dict[str, dict[str, Any]]:
    """Every run's published history (`show -o json`), by run id."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["runs", "--index", str(index), "--now", NOW, "-o", "name"]) == 0
    docs = {}
    for run_id in out.getvalue().split():
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["show", run_id, "--index", str(index), "--now", NOW, "-o", "json"]) == 0
        docs[run_id] = json.loads(buf.getvalue())
    return docs


def failed_pods(doc: dict[str, Any]) -> dict[tuple[int, str], dict[str, Any]]:
    return {(a["attempt"], f["pod"]): f for a in doc["attempts"] for f in a["failures"]}


def the_bad_node(histories: dict[str, dict[str, Any]]) -> tuple[str, str, int, str]:
    """The (run, node, pods, reason) of the most pods of one run that failed on one node."""
    counts: dict[tuple[str, str, str], int] = {}
    for run_id, doc in histories.items():
        failed = failed_pods(doc)
        for p in doc["pods"]:
            f = failed.get((p["attempt"], p["pod"]))
            if f is not None and p["node"]:
                key = (run_id, p["node"], f"{f['reason']} exit {f['exit_code']}")
                counts[key] = counts.get(key, 0) + 1
    (run_id, node, reason), n = max(counts.items(), key=lambda kv: kv[1])
    return run_id, node, n, reason


def gpus_of(capsys: pytest.CaptureFixture[str], index: Path) -> dict[str, str]:
    """Each node's GPU model and count as `tracker nodes -o json` gives them: 'NVIDIA-H100-80GB-HBM3 x8'."""
    rows = json.loads(run(capsys, "nodes", "--index", str(index), "--now", NOW, "-o", "json"))["nodes"]
    return {r["node"]: f"{r['gpu_product']} x{r['gpu_count']}" for r in rows if r["gpu_product"]}


# ------------------------------------------------------------------------------------------ runs --node


def test_runs_node_keeps_the_runs_with_a_pod_on_the_nodes(
        index: Path, capsys: pytest.CaptureFixture[str], histories: dict[str, dict[str, Any]]) -> None:
    nodes = sorted({p["node"] for d in histories.values() for p in d["pods"] if p["node"]})
    assert len(nodes) >= 3
    for node in nodes:
        want = {r for r, d in histories.items() if any(p["node"] == node for p in d["pods"])}
        got = run(capsys, "runs", "--index", str(index), "--now", NOW, "-o", "name", "--node", node).split()
        assert set(got) == want and len(got) == len(want), node
        assert len(want) < len(histories)  # the filter keeps some runs, not all
    a, b = nodes[0], nodes[-1]
    both = {r for r, d in histories.items() if any(p["node"] in (a, b) for p in d["pods"])}
    for args in (("--node", f"{a},{b}"), ("--node", a, "--node", b)):
        assert set(run(capsys, "runs", "--index", str(index), "--now", NOW, "-o", "name", *args).split()) == both
    assert run(capsys, "runs", "--index", str(index), "--now", NOW, "-o", "name", "--node", "no-such-node") == ""


def test_node_is_a_list_filter_the_web_view_takes() -> None:
    from datetime import UTC, datetime

    assert "node" in FILTERS and "node" in LIST_FILTERS
    f = run_filter({"node": ["a,b", "c", "a"]}, now=datetime(2026, 8, 20, tzinfo=UTC))
    assert f.nodes == ("a", "b", "c")
    with pytest.raises(FilterError):  # the other filters still refuse bad values alongside it
        run_filter({"node": ["a"], "status": ["nope"]}, now=datetime(2026, 8, 20, tzinfo=UTC))


# ------------------------------------------------------------------------------------------ show and compare


def test_show_lists_the_pods_by_attempt_grouping_a_node_s_failures(
        index: Path, capsys: pytest.CaptureFixture[str], histories: dict[str, dict[str, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    run_id, node, n, reason = the_bad_node(histories)
    assert n >= 2  # the captures hold several failed pods of one run on one node
    out = run(capsys, "show", run_id, "--index", str(index), "--now", NOW)
    gpu = gpus_of(capsys, index)[node]  # the node's GPU model, from the captured Node (nodes.json)
    assert f"↳ {n} pods failed on {node} [{gpu}] ({reason})" in out
    # every node of every run is named on its timeline, and evicted pods with the attempt's end reason
    unbound_said = False
    for rid, doc in histories.items():
        out = run(capsys, "show", rid, "--index", str(index), "--now", NOW)
        for p in doc["pods"]:
            if p["node"]:
                assert p["node"] in out, (rid, p["node"])
        waiting = sum(1 for p in doc["pods"] if not p["node"] and not p["finished_at"] and not p["released_at"])
        if waiting:  # pods not bound yet are pending, not running
            assert f"pods pending: {waiting} without a node" in out and "(no node)" not in out, rid
            unbound_said = True
        ends = {a["attempt"]: a["end_reason"] for a in doc["attempts"]}
        for p in doc["pods"]:
            if p["lost"] in EVICTIONS[1:] and (p["attempt"], p["pod"]) not in failed_pods(doc):
                assert f"evicted on {p['node']} [{gpus_of(capsys, index)[p['node']]}] ({ends[p['attempt']]})" in out, \
                    (rid, p)
    assert unbound_said, "the captures hold a run whose pods are not bound yet"


def test_compare_has_a_nodes_row(index: Path, capsys: pytest.CaptureFixture[str],
                                 histories: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    run_id, node, n, _ = the_bad_node(histories)
    other = next(r for r, d in histories.items() if r != run_id and d["pods"])
    data = json.loads(run(capsys, "compare", run_id, other, "--index", str(index), "--now", NOW, "-o", "json"))
    for r in data["runs"]:
        want = list(dict.fromkeys(p["node"] for p in histories[r["run_id"]]["pods"] if p["node"]))
        assert r["nodes"] == want
        assert sum(g["pods"] for g in r["pods_by_node"]) == len(histories[r["run_id"]]["pods"])
    assert {"node": node, "outcome": "failed", "pods": n}.items() <= next(
        g for g in data["runs"][0]["pods_by_node"] if g["node"] == node).items()
    table = run(capsys, "compare", run_id, other, "--index", str(index), "--now", NOW)
    line = next(x for x in table.splitlines() if x.lstrip("* ").startswith("nodes "))
    assert f"{node} ({n} failed)" in line


# ------------------------------------------------------------------------------------------ tracker nodes


def expected_nodes(histories: dict[str, dict[str, Any]], until: str | None = None) -> dict[str, dict[str, Any]]:
    """The nodes' counts as the published histories give them (pods bound before ``until``)."""
    out: dict[str, dict[str, Any]] = {}
    for run_id, doc in histories.items():
        failed = failed_pods(doc)
        last = doc["run"]["attempts"]
        for p in doc["pods"]:
            start = p["scheduled_at"] or p["created_at"]
            if not p["node"] or (until is not None and start is not None and start >= until):
                continue
            row = out.setdefault(p["node"], {"runs": set(), "pods": 0, "failed_pods": 0, "evicted_pods": 0,
                                             "runs_failed": set(), "runs_evicted": set()})
            row["runs"].add(run_id)
            row["pods"] += 1
            if (p["attempt"], p["pod"]) in failed or p["lost"] == "PodFailure":
                row["failed_pods"] += 1
            elif p["lost"] in EVICTIONS:
                row["evicted_pods"] += 1
                row["runs_evicted"].add(run_id)
            if doc["run"]["status"] == "failed" and p["attempt"] == last:
                row["runs_failed"].add(run_id)
    return {n: {k: len(v) if isinstance(v, set) else v for k, v in r.items()} for n, r in out.items()}


def test_nodes_counts_each_node_s_runs_pods_failures_and_evictions_worst_first(
        index: Path, capsys: pytest.CaptureFixture[str], histories: dict[str, dict[str, Any]]) -> None:
    data = json.loads(run(capsys, "nodes", "--index", str(index), "--now", NOW, "-o", "json"))
    rows = data["nodes"]
    want = expected_nodes(histories)
    assert {r["node"]: {k: r[k] for k in want[r["node"]]} for r in rows} == want
    keys = [(-r["failed_pods"], -r["evicted_pods"], -r["runs_failed"], -r["runs_evicted"]) for r in rows]
    assert keys == sorted(keys) and rows[0]["failed_pods"] > 0  # worst first: the bad node on top
    run_id, node, _, reason = the_bad_node(histories)
    top = rows[0]
    assert (top["node"], top["last_failure_run"]) == (node, run_id) and top["last_failure_reason"] == reason
    assert top["last_failure_at"] == max(f["at"] for f in histories[run_id]["attempts"][-1]["failures"])
    # the table: the same nodes in the same order, names never cut, even at 80 columns
    table = run(capsys, "nodes", "--index", str(index), "--now", NOW).splitlines()
    assert table[0].split()[:5] == ["NODE", "RUNS", "PODS", "FAIL", "EVICT"]
    assert [line.split()[0] for line in table[1:]] == [r["node"] for r in rows]


def test_nodes_window_counts_the_pods_on_their_node_in_it(
        index: Path, capsys: pytest.CaptureFixture[str], histories: dict[str, dict[str, Any]]) -> None:
    until = "2026-08-20T11:00:00Z"
    data = json.loads(run(capsys, "nodes", "--index", str(index), "--now", NOW, "--until", until, "-o", "json"))
    want = expected_nodes(histories, until)
    assert {r["node"]: {k: r[k] for k in want[r["node"]]} for r in data["nodes"]} == want
    assert sum(r["pods"] for r in data["nodes"]) < sum(r["pods"] for r in expected_nodes(histories).values())
    assert data["until"].startswith("2026-08-20T11:00:00")
    # after the last pod finished: no node (the table says so on stderr, nothing on stdout)
    assert main(["nodes", "--index", str(index), "--now", "2026-08-22T00:00:00Z", "--since", "1d"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("No nodes found")


def test_nodes_refuses_a_bad_window_in_one_line(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = run(capsys, "nodes", "--index", str(index), "--now", NOW, "--since", "1h", "--until", "2h", code=2)
    assert "--until" in err
    err = run(capsys, "nodes", "--index", str(index), "--now", NOW, "--since", "yesterday", code=2)
    assert "--since" in err
    err = run(capsys, "nodes", "--index", str(index.parent / "missing.sqlite"), "--now", NOW, code=2)
    assert "no experiment index" in err


def test_nodes_and_runs_node_start_without_pydantic_or_rich(index: Path) -> None:
    from tests.read.test_cli_runs import HEAVY, imported

    for args in (["nodes", "--index", str(index), "--now", NOW], ["nodes", "--index", str(index), "-o", "json"],
                 ["runs", "--index", str(index), "--node", "a,b"]):
        modules = imported(args)
        assert "tracker.read.nodes" in modules or args[0] == "runs"
        assert not {m for m in modules if m.split(".")[0] in ("pydantic", "rich") or m.startswith(HEAVY)}, args
