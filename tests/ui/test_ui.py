"""`tracker ui` over HTTP, on an index of the bundled captures: the runs page and its filters (those of `tracker
runs`, stuck runs first), a run's page (timeline, GPU figures, attempts), escaping, 404, 405, the Host check, the
security headers, an index left exactly as it was, and the command's start-up errors and graceful stop."""

from __future__ import annotations

import hashlib
import html
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, unquote

import pytest

from tests.support.ui_support import EVIL_RUN, EXTRA_HOST, NOW, NOW_TEXT, build_index, request, running
from tracker.cli import main
from tracker.ui.server import App, UiServer, allowed_hosts, serve_until

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_index(tmp_path_factory.mktemp("ui"))


@pytest.fixture(scope="module")
def server(index: Path) -> Iterator[UiServer]:
    with running(index) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACKER_INDEX", raising=False)


def linked_runs(body: str) -> list[str]:
    """The run ids the runs page links to, in order."""
    return [unquote(html.unescape(m)) for m in re.findall(r'<td class="run"><a href="/runs/([^"?]+)', body)]


def stuck_runs(body: str) -> list[str]:
    return [unquote(html.unescape(m)) for m in
            re.findall(r'<tr class="stuck [a-z]+"><td class="pick"><input [^>]*></td>'
                       r'<td class="run"><a href="/runs/([^"?]+)', body)]


def cli_names(capsys: pytest.CaptureFixture[str], index: Path, *args: str) -> list[str]:
    capsys.readouterr()
    assert main(["runs", "--index", str(index), "--now", NOW_TEXT, "-o", "name", *args]) == 0
    return capsys.readouterr().out.splitlines()


# ------------------------------------------------------------------------------------------ the runs page


def test_the_runs_page_lists_every_run_stuck_first_each_linking_to_its_page(
        server: UiServer, index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reply = request(server, "/")
    assert reply.status == 200 and reply.headers["Content-Type"] == "text/html; charset=utf-8"
    every = cli_names(capsys, index)
    shown = linked_runs(reply.body)
    assert sorted(shown) == sorted(every) and len(shown) == 15
    # qwen-rm-5vt2j waits for quota since 12:24 (36m at 13:00): stuck for more than 30m, so first, and why
    assert stuck_runs(reply.body) == ["qwen-rm-5vt2j"] == shown[:1]
    assert shown[1:] == [r for r in every if r != "qwen-rm-5vt2j"]  # then newest first, as tracker runs
    assert "1 stuck before running for more than 30m (listed first)" in reply.body
    assert "insufficient unused quota for nvidia.com/gpu in flavor h100" in reply.body
    # the short id links to the whole one
    assert '<a href="/runs/e55428ce-5266-4f6d-8b5d-2ae542ca77c4" title="e55428ce-5266-4f6d-8b5d-2ae542ca77c4">' \
           'e55428ce</a>' in reply.body
    # a page's own now moves the stuck threshold: at 12:40 qwen-rm-5vt2j has waited 16m only
    assert stuck_runs(request(server, "/?now=2026-08-20T12:40:00Z").body) == []


@pytest.mark.parametrize("query, args", [
    ("namespace=team-a", ["-n", "team-a"]),
    ("namespace=team-a&namespace=team-b", ["-n", "team-a", "-n", "team-b"]),
    ("status=succeeded", ["--status", "succeeded"]),
    ("status=Pending,FAILED", ["--status", "pending,failed"]),
    ("phase=admission", ["--phase", "Admission"]),
    ("selector=" + quote("taugrid.io/project in (llm,rl)"), ["-l", "taugrid.io/project in (llm,rl)"]),
    ("selector=" + quote("project!=llm,!kueue.x-k8s.io/priority-class"),
     ["-l", "project!=llm,!kueue.x-k8s.io/priority-class"]),
    ("queue=team-b-lq", ["--queue", "team-b-lq"]),
    ("cluster_queue=gpu-cq", ["--cluster-queue", "gpu-cq"]),
    ("since=2h", ["--since", "2h"]),
    ("until=2026-08-20T11:00:00Z", ["--until", "2026-08-20T11:00:00Z"]),
    ("stuck=5m", ["--stuck", "5m"]),
    ("stalled-admission=30m", ["--stalled-admission", "30m"]),
    ("workspace=team-b&project=vision", ["--workspace", "team-b", "--project", "vision"]),
    ("sort-by=age", ["--sort-by", "age"]),
    ("sort_by=wait&namespace=&status=", ["--sort-by", "wait"]),  # fields left empty in the form: no filter
])
def test_the_filters_are_those_of_tracker_runs(server: UiServer, index: Path, capsys: pytest.CaptureFixture[str],
                                               query: str, args: list[str]) -> None:
    reply = request(server, f"/?{query}&now={NOW_TEXT}")
    assert reply.status == 200, reply.body
    expected = cli_names(capsys, index, *args)
    stuck = set(cli_names(capsys, index, *args, "--stuck", "5m" if "stuck=5m" in query else "30m"))
    shown = linked_runs(reply.body)
    assert expected, "a filter that keeps nothing proves little"
    assert sorted(shown) == sorted(expected)
    assert shown == [r for r in shown if r in stuck] + [r for r in expected if r not in stuck]
    assert stuck_runs(reply.body) == [r for r in shown if r in stuck]


def test_the_form_shows_the_filters_given(server: UiServer) -> None:
    body = request(server, "/?namespace=team-a&status=pending&sort-by=age").body
    assert '<input type="text" name="namespace" value="team-a"' in body
    assert '<option value="pending" selected>' in body and '<option value="age" selected>' in body


def test_a_limit_keeps_the_stuck_runs_first(server: UiServer) -> None:
    shown = linked_runs(request(server, "/?limit=3").body)
    assert len(shown) == 3 and shown[0] == "qwen-rm-5vt2j"
    assert "showing the first 3" in request(server, "/?limit=3").body


@pytest.mark.parametrize("query, says", [
    ("status=bogus", "unknown status 'bogus'"),
    ("phase=Nowhere", "unknown phase 'Nowhere'"),
    ("sort-by=size", "invalid choice: 'size'"),
    ("limit=0", "must be a whole number >= 1"),
    ("since=yesterday", "since takes a duration (e.g. 2h, 1d) or an ISO-8601 time"),
    ("stuck=soon", "not a duration: 'soon'"),
    ("selector=" + quote("a in ()"), "has no values"),
    ("now=noon", "must be an ISO-8601 time"),
    ("colour=red", "unknown filter 'colour'"),
    ("status=" + quote("<b>x</b>"), "unknown status '<b>x</b>'"),
])
def test_a_bad_filter_is_a_400_saying_why(server: UiServer, query: str, says: str) -> None:
    reply = request(server, f"/?{query}")
    assert reply.status == 400
    assert says in html.unescape(reply.body)
    assert "<b>" not in reply.body  # the value given is escaped too


# ------------------------------------------------------------------------------------------ a run's page


def test_a_runs_page_draws_its_timeline_gpu_figures_and_attempts(server: UiServer) -> None:
    reply = request(server, "/runs/vit-l-9hx4d")
    assert reply.status == 200
    body = reply.body
    assert "<h1>vit-l-9hx4d</h1>" in body and '<span class="badge succeeded">succeeded</span>' in body
    svg = body[body.index('<svg class="timeline"'): body.index("</svg>")]
    # one row per transition (10), in two attempts; the phases as the terminal draws them
    assert svg.count('<g class="row">') == 10 and svg.count('<g class="attempt">') == 2
    assert "attempt 2 · trigger PodsReadyTimeout · ClusterQueue gpu-cq · waited 1m01s for admission" in svg
    assert svg.count('fill="url(#wait)"') == 2 + 1  # the two admissions and the legend
    assert svg.count('<rect class="phase-runtime"') == 2 + 1 and svg.count('<rect class="phase-progress"') == 2
    assert '<path class="phase-completion"' in svg  # the end of the run: a point
    # the reasons on hover
    assert ("<title>Admission · attempt 2\n2026-08-20 11:10:03Z → 2026-08-20 11:11:04Z (1m01s)\nPodsReadyTimeout: "
            "Exceeded the PodsReady timeout team-b/job-vit-l-9hx4d-a01c3\nsource: Workload/team-b/"
            "job-vit-l-9hx4d-a01c3</title>") in svg
    # GPU figures and the attempts
    assert "<dt>GPU-hours held</dt><dd>12.64</dd>" in body and "<dt>GPU-hours lost</dt><dd class=bad>2.66</dd>" in body
    assert "PodsReadyTimeout 2.66" in body
    # the goodput ledger's: 8.67 of 12.64 GPU-h productive (attempt 1's 2.66 before any step are startup, attempt
    # 2's 1.31 before its first step recovery); 32m34s of 48m35s since queued productive
    assert "<dt>goodput</dt><dd>68.6%</dd>" in body and "<dt>ETTR</dt><dd>67.0%</dd>" in body
    assert "ETTR <strong>67.0%</strong>: 32m34s productive of 48m35s since queued" in body
    assert svg.count('<rect class="ledger-infrastructure-recovery"') == 1 + 1  # 11:10:03-11:16:00, the legend
    attempts = body[body.index('<table class="attempts">'): body.index("</table>", body.index('class="attempts"'))]
    assert attempts.count("<tr><td") == 2 and "WaitForStart" in attempts


def test_a_runs_page_says_what_ran(server: UiServer) -> None:
    """README "What ran": the images, the whole entrypoint (escaped) and every hyperparameter kept."""
    body = request(server, "/runs/rn50-ft-k7q2m").body
    assert '<tr><th>images</th><td class="mono">acr-taugrid.azurecr.io/vision-train:2026.08.19</td></tr>' in body
    assert ('<tr><th>entrypoint</th><td class="mono">torchrun &#x27;--nnodes=$(NNODES)&#x27; --nproc-per-node=8 -m '
            'taugrid.train --config /etc/taugrid/config.yaml</td></tr>') in body
    assert ('<tr><th>hyperparameters</th><td class="mono">optim.lr=0.0003, optim.weight_decay=0.1, seed=70, '
            'train.global_batch_size=1024, train.grad_checkpointing=true, train.precision=bf16</td></tr>') in body


def test_a_live_runs_axis_ends_now(server: UiServer) -> None:
    body = request(server, "/runs/qwen-rm-5vt2j").body
    assert "2026-08-20 13:00:00Z (" in body and ", live)" in body
    assert '<path class="ongoing"' in body and "(ongoing)" in body
    earlier = request(server, "/runs/qwen-rm-5vt2j?now=2026-08-20T12:30:00Z").body
    assert "2026-08-20 12:30:00Z (" in earlier


def test_a_run_is_found_by_a_start_of_its_id_or_by_namespace_and_name(server: UiServer) -> None:
    assert "<h1>e55428ce-5266-4f6d-8b5d-2ae542ca77c4</h1>" in request(server, "/runs/e55428ce").body
    assert "<h1>vit-l-9hx4d</h1>" in request(server, "/runs/team-b/vit-l-9hx4d").body
    assert "<h1>e55428ce-5266-4f6d-8b5d-2ae542ca77c4</h1>" in request(server, "/runs/team-a%2Feval-hotfix-0820").body


# ------------------------------------------------------------------------------------------ escaping


def test_everything_from_the_index_is_escaped(server: UiServer) -> None:
    runs = request(server, "/").body
    link = f'<a href="/runs/{html.escape(quote(EVIL_RUN, safe=""))}" title="{html.escape(EVIL_RUN)}">'
    assert link in runs and EVIL_RUN in linked_runs(runs)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#x27;/x" in runs
    page = request(server, "/runs/" + quote(EVIL_RUN, safe=""))
    assert page.status == 200
    assert "<h1>&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#x27;/x</h1>" in page.body
    assert "&lt;img src=x onerror=alert(2)&gt; &amp; &quot;quotes&quot;" in page.body
    assert "&lt;b&gt;proj&lt;/b&gt;" in page.body and "Bad&lt;Reason&gt;" in page.body
    for body in (runs, page.body):
        assert "<script" not in body and "<img" not in body and "<b>" not in body and "onerror=alert(2)>" not in body
    missing = request(server, "/runs/" + quote("<i>nope</i>", safe=""))
    assert missing.status == 404 and "<i>" not in missing.body and "&lt;i&gt;nope&lt;/i&gt;" in missing.body


# ------------------------------------------------------------------------------------------ the goodput ledger


@pytest.fixture(scope="module")
def ledger_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiServer]:
    """An index of bert-pt-2c5nw with its checkpoints (tests/support/goodput_runs.py), a run that resumes it, and
    one whose
    id and checkpoint URI are HTML that resumes it too."""
    from tests.support import goodput_runs as g
    from tests.support.histories import ups
    from tracker.shell.index import ExperimentIndex

    path = tmp_path_factory.mktemp("ledger") / "ui.sqlite"
    evil = g.intake_only(g.resumer_intake(EVIL_RUN, EVIL_URI))
    with ExperimentIndex(path) as ix:
        ix.write(ups([g.checkpointed(), g.resumer(), evil]))
    with running(path) as srv:
        yield srv


EVIL_URI = "s3://x/\"><script>alert(3)</script>"


def test_a_runs_page_marks_its_checkpoints_draws_its_time_lost_and_its_goodput(ledger_server: UiServer) -> None:
    body = request(ledger_server, "/runs/bert-pt-2c5nw").body
    # tests/support/goodput_runs.py computes this ledger by hand: 2544 of 6745 s productive, 40,656 of 79,024 GPU-s
    assert "<dt>goodput</dt><dd>51.4%</dd>" in body and "<dt>ETTR</dt><dd>37.7%</dd>" in body
    svg = body[body.index('<svg class="timeline"'): body.index("</svg>")]
    assert "goodput ledger · progress events" in svg
    assert svg.count('<circle class="ckpt-save"') == 2 and svg.count('<path class="ckpt-restore"') == 2  # + legend
    assert svg.count('<rect class="ledger-wasted-progress"') == 2
    assert "<title>infrastructure-recovery\n2026-08-20 10:40:01Z → 2026-08-20 11:12:00Z (31m59s)</title>" in svg
    ledger = body[body.index('<table class="ledger">'):]
    assert ('<tr><td class="productive">productive</td><td class="num">11.29</td><td class="num">51.4%</td>'
            '<td class="num">42m24s</td><td class="num">1.33</td><td class="num">9.96</td></tr>') in ledger
    checkpoints = body[body.index('<table class="checkpoints">'):]
    assert "<td>save</td><td class=\"num\">1000</td><td>completed</td>" in checkpoints
    assert "<td>restore</td><td class=\"num\">1000</td><td>completed</td>" in checkpoints


def test_the_lineage_links_both_ways_escaped(ledger_server: UiServer) -> None:
    from tests.support import goodput_runs as g

    page = request(ledger_server, f"/runs/{g.RUN}?now={NOW_TEXT}")
    assert page.status == 200 and _script_or_style(page.body) == []
    now = quote(NOW_TEXT, safe="")
    resumer = f'<a href="/runs/{g.RESUMER}?now={now}" title="{g.RESUMER}">{g.RESUMER}</a>'
    evil = (f'<a href="/runs/{html.escape(quote(EVIL_RUN, safe=""))}?now={now}" title="{html.escape(EVIL_RUN)}">'
            f'{html.escape(EVIL_RUN)}</a>')
    # the first created first: neither has a creation time (no workload), their ids order them
    assert f'<p class="lineage">resumed by {evil}, {resumer}</p>' in page.body
    back = request(ledger_server, f"/runs/{g.RESUMER}")
    assert f'resume of <a href="/runs/{g.RUN}" title="{g.RUN}">{g.RUN}</a> (from <code>{g.CKPT}</code>)' in back.body
    assert "no progress events: the ledger is the GPU accounting" in back.body
    bad = request(ledger_server, "/runs/" + quote(EVIL_RUN, safe=""))
    assert bad.status == 200 and _script_or_style(bad.body) == [] and "<script" not in bad.body
    assert f"(from <code>{html.escape(EVIL_URI)}</code>)" in bad.body
    assert f'<a href="/runs/{g.RUN}" title="{g.RUN}">{g.RUN}</a>' in bad.body


# ------------------------------------------------------------------------------------------ HTTP


def test_unknown_pages_and_runs_are_404(server: UiServer, index: Path) -> None:
    assert request(server, "/nope").status == 404
    reply = request(server, "/runs/no-such-run")
    assert reply.status == 404 and "no run &#x27;no-such-run&#x27; in ui.sqlite" in reply.body
    assert str(index.parent) not in reply.body  # the server's paths stay on the server
    several = request(server, "/runs/gpt-moe")
    assert several.status == 404 and "is the start of several run ids" in several.body
    assert request(server, "/runs/vit-l-9hx4d?colour=red").status == 400


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "PROPFIND"])
def test_only_get_and_head_are_allowed(server: UiServer, method: str) -> None:
    reply = request(server, "/", method=method)
    assert reply.status == 405 and reply.headers["Allow"] == "GET, HEAD"
    assert "Content-Security-Policy" in reply.headers


def test_head_is_get_without_a_body(server: UiServer) -> None:
    get, head = request(server, "/runs/vit-l-9hx4d"), request(server, "/runs/vit-l-9hx4d", method="HEAD")
    assert head.status == 200 and head.body == ""
    assert head.headers["Content-Length"] == get.headers["Content-Length"] == str(len(get.body.encode()))


@pytest.mark.parametrize("host, status", [
    ("localhost", 200), ("LOCALHOST:8321", 200), ("127.0.0.1", 200), ("[::1]:8321", 200), (EXTRA_HOST, 200),
    (EXTRA_HOST + ".", 200), ("evil.example", 400), ("evil.example:8321", 400), ("127.0.0.1.evil.example", 400),
    ("localhost.evil.example", 400), ("::1", 400), (None, 400),
])
def test_the_host_header_must_name_an_allowed_host(server: UiServer, host: str | None, status: int) -> None:
    reply = request(server, "/", host=host)
    assert reply.status == status
    if status == 400:
        assert "unknown Host header" in reply.body and "vit-l-9hx4d" not in reply.body


def test_health_answers_probes_whatever_their_host(server: UiServer) -> None:
    probe = request(server, "/healthz", host="10.1.2.3:8321")
    assert (probe.status, probe.body) == (200, "ok\n")
    assert request(server, "/", host="10.1.2.3:8321").status == 400


def test_a_request_in_flight_when_it_stops_is_answered(index: Path) -> None:
    """Stopping stops accepting, then waits for the requests in flight (their threads are not daemons)."""
    app = App(index=index, hosts=allowed_hosts("127.0.0.1", []), stuck_after="30m", clock=lambda: NOW)
    srv = UiServer("127.0.0.1", 0, app)
    stop = threading.Event()
    thread = threading.Thread(target=serve_until, args=(srv, stop))
    thread.start()
    with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=30) as conn:
        conn.sendall(b"GET /runs/vit-l-9hx4d HTTP/1.0\r\n")  # the rest comes after the stop
        time.sleep(0.5)
        stop.set()
        time.sleep(1.5)
        assert thread.is_alive()  # waiting for the request it took
        conn.sendall(b"Host: localhost\r\n\r\n")
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    thread.join(timeout=30)
    assert not thread.is_alive() and reply.startswith(b"HTTP/1.0 200 ") and b"<h1>vit-l-9hx4d</h1>" in reply
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=5).close()


def test_every_response_forbids_scripts_frames_and_other_origins(server: UiServer) -> None:
    for target in ("/", "/runs/vit-l-9hx4d", "/nope", "/static/ui.css", "/?status=bogus"):
        reply = request(server, target)
        csp = reply.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "style-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "script-src" not in csp and "unsafe" not in csp
        assert reply.headers["X-Content-Type-Options"] == "nosniff" and reply.headers["Cache-Control"] == "no-store"
        assert reply.headers["Server"] == "tracker-ui"
        if target != "/static/ui.css":
            assert _script_or_style(reply.body) == []
    css = request(server, "/static/ui.css")
    assert css.status == 200 and css.headers["Content-Type"] == "text/css; charset=utf-8" and "svg.timeline" in css.body
    assert request(server, "/healthz").body == "ok\n"


class _Tags(HTMLParser):
    """Elements and attributes that would run script or carry inline style, as a browser parses the page."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style", "iframe", "object", "embed", "base"):
            self.found.append(tag)
        self.found += [f"{tag} {name}" for name, value in attrs
                       if name.startswith("on") or name == "style" or "javascript:" in (value or "").lower()]


def _script_or_style(body: str) -> list[str]:
    parser = _Tags()
    parser.feed(body)
    parser.close()
    return parser.found


def test_no_page_has_script_or_inline_style_even_with_html_in_the_index(server: UiServer) -> None:
    for target in ("/", "/runs/" + quote(EVIL_RUN, safe=""), "/runs/vit-l-9hx4d", "/runs/qwen-rm-5vt2j"):
        reply = request(server, target)
        assert reply.status == 200 and _script_or_style(reply.body) == []
    assert _script_or_style('<p title="x" onclick="y">') == ["p onclick"]  # the check sees what it looks for


def test_the_index_is_left_exactly_as_it_was(tmp_path: Path) -> None:
    index = build_index(tmp_path)
    before = {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    with running(index) as srv:
        for target in ("/", "/?stuck=5m", "/runs/vit-l-9hx4d", "/runs/qwen-rm-5vt2j", "/runs/gpt", "/?sort-by=age"):
            assert request(srv, target).status in (200, 404)
        for method in ("POST", "PUT", "DELETE"):
            assert request(srv, "/runs/vit-l-9hx4d", method=method).status == 405
    after = {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    assert after == before  # no -wal, -shm or journal file either


# ------------------------------------------------------------------------------------------ the command


def _tracker(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRACKER_INDEX"}
    return subprocess.Popen([sys.executable, "-m", "tracker.cli", "ui", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize("kind", ["missing", "directory", "not a database"])
def test_an_index_it_cannot_read_is_one_line_and_exit_2(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "index.sqlite"
    if kind == "directory":
        path.mkdir()
    elif kind == "not a database":
        path.write_bytes(b"x" * 4096)
    proc = _tracker("--index", str(path), "--port", "0")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and str(path) in err
    assert not (tmp_path / "index.sqlite-wal").exists()


def test_a_bad_option_or_a_busy_port_is_one_line_and_exit_2(index: Path) -> None:
    proc = _tracker("--index", str(index), "--stuck-after", "soon")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and err == "error: not a duration: 'soon' (use e.g. 90s, 30m, 1h30m, 2d)\n"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        proc = _tracker("--index", str(index), "--port", str(busy.getsockname()[1]))
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "cannot listen on 127.0.0.1:" in err


def _started(proc: subprocess.Popen[str]) -> str:
    """The URL the server logged it serves, read from its stderr."""
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if match := re.search(r"url=(http://\S+/)", line):
            return match.group(1)
        assert line, f"the server ended before serving (rc={proc.poll()})"
    raise AssertionError("the server did not start within 60 s")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_it_serves_from_tracker_index_and_stops_gracefully_on_a_signal(index: Path, signum: int) -> None:
    env = {**os.environ, "TRACKER_INDEX": str(index)}
    proc = subprocess.Popen([sys.executable, "-m", "tracker.cli", "ui", "--port", "0", "--now", NOW_TEXT], cwd=REPO,
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = _started(proc)
        assert url.startswith("http://127.0.0.1:")
        port = int(url.rsplit(":", 1)[1].rstrip("/"))
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(b"GET /runs/vit-l-9hx4d HTTP/1.0\r\nHost: localhost\r\n\r\n")
            reply = b""
            while chunk := conn.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.0 200 ") and b"<h1>vit-l-9hx4d</h1>" in reply
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert f"signal={signal.Signals(signum).name}" in err and "ui_stopped" in err and "Traceback" not in err


def test_the_command_has_help_an_example_and_shell_completion(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from tracker.cli.parser import build_parser

    parser = build_parser(service_commands=False)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    ui = sub.choices["ui"]
    assert ui.epilog and "tracker ui" in ui.epilog
    assert all(action.help for action in ui._actions)
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert re.search(r"ui\) opts=\"[^\"]*--allowed-host[^\"]*--stuck-after", script)
