"""The web view's nodes (issue 28, point 1): the runs page's ``node=`` filter is ``tracker runs --node``, and a run's
page lists its pods with their nodes and outcomes (failed and evicted pods grouped by node), each node linking to
the runs with a pod on it. Expectations come from the run's published history (``tracker show -o json``)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import pytest

from tests.support.ui_support import NOW_TEXT, build_index, request, running
from tracker.cli import main
from tracker.ui.server import UiServer

NODE = "aks-h100-36541870-vmss000003"  # nodes of the bundled captures (the test checks they keep some runs)
OTHER = "aks-h100-36541870-vmss000000"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_index(tmp_path_factory.mktemp("ui-nodes"))


@pytest.fixture(scope="module")
def server(index: Path) -> Iterator[UiServer]:
    with running(index) as srv:
        yield srv


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert main(list(args)) == 0
    return capsys.readouterr().out


def linked_runs(body: str) -> list[str]:
    return [unquote(html.unescape(m)) for m in re.findall(r'<td class="run"><a href="/runs/([^"?]+)', body)]


def test_the_node_filter_is_that_of_tracker_runs(server: UiServer, index: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for query, args in ((f"node={NODE}", ["--node", NODE]),
                        (f"node={NODE},{OTHER}", ["--node", f"{NODE},{OTHER}"]),
                        (f"node={NODE}&node=aks-h100-36541870-vmss000005",
                         ["--node", NODE, "--node", "aks-h100-36541870-vmss000005"])):
        reply = request(server, f"/?{query}&now={NOW_TEXT}")
        assert reply.status == 200, reply.body
        want = cli(capsys, "runs", "--index", str(index), "--now", NOW_TEXT, "-o", "name", *args).split()
        every = cli(capsys, "runs", "--index", str(index), "--now", NOW_TEXT, "-o", "name").split()
        assert want and len(want) < len(every)
        assert sorted(linked_runs(reply.body)) == sorted(want)


def test_a_run_page_lists_its_pods_by_node_with_their_outcomes(server: UiServer, index: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    grouped = 0
    for run_id in cli(capsys, "runs", "--index", str(index), "--now", NOW_TEXT, "-o", "name").split():
        doc = json.loads(cli(capsys, "show", run_id, "--index", str(index), "--now", NOW_TEXT, "-o", "json"))
        body = request(server, f"/runs/{quote(run_id, safe='')}?now={NOW_TEXT}").body
        if not doc["pods"]:
            assert "<h2>Pods and nodes</h2>" not in body
            continue
        assert "<h2>Pods and nodes</h2>" in body, run_id
        table = body.split('<table class="pods">', 1)[1].split("</table>", 1)[0]
        assert table.count("<tr>") == 1 + len(doc["pods"])  # the header and a row per pod
        failed = {(a["attempt"], f["pod"]): f for a in doc["attempts"] for f in a["failures"]}
        for p in doc["pods"]:
            assert f'<td class="mono">{html.escape(p["pod"])}</td>' in table
            if p["node"]:
                link = f'<a href="/?{html.escape("node=" + quote(p["node"]) + "&now=" + quote(NOW_TEXT))}"'
                assert link in table, (run_id, p["node"])
            f = failed.get((p["attempt"], p["pod"]))
            if f is not None:
                assert f'<td class="reason">{html.escape(f["reason"])} exit {f["exit_code"]}</td>' in table
        # the failed pods of an attempt on one node are said together
        by_node: dict[tuple[int, str], int] = {}
        for p in doc["pods"]:
            if (p["attempt"], p["pod"]) in failed and p["node"]:
                by_node[(p["attempt"], p["node"])] = by_node.get((p["attempt"], p["node"]), 0) + 1
        for (attempt, node), n in by_node.items():
            said = f"{n} pod{'s' if n != 1 else ''} failed on {node}"
            assert re.search(rf'<p class="error">attempt {attempt}: [^<]*{re.escape(said)}', body), (run_id, said)
        grouped += sum(n > 1 for n in by_node.values())
    assert grouped, "the captures hold several failed pods of one attempt on one node"
