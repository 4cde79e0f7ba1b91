"""The web view's live parts, through the App (no socket): pages of live data reload themselves (a meta refresh,
bounded, off for a fixed time or a finished run), a run's metric curves, the compare page and the links to it."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from tests.support.ui_support import EXTRA_HOST, NOW, NOW_TEXT, build_index
from tracker.ui.server import DEFAULT_REFRESH_S, App, Response, allowed_hosts

REFRESH = re.compile(r'<meta http-equiv="refresh" content="(\d+)">')


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> App:
    index = build_index(tmp_path_factory.mktemp("ui-live"))
    return App(index=index, hosts=allowed_hosts("127.0.0.1", [EXTRA_HOST]), stuck_after="30m", clock=lambda: NOW)


def get(app: App, target: str) -> Response:
    return app.respond("GET", target, "127.0.0.1")


def refresh_of(reply: Response) -> list[int]:
    return [int(n) for n in REFRESH.findall(reply.body.decode())]


def said(reply: Response) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", reply.body.decode())).split())


# ------------------------------------------------------------------------------------------ refresh


def test_pages_of_live_data_reload_themselves(app: App) -> None:
    assert refresh_of(get(app, "/")) == [DEFAULT_REFRESH_S]
    assert refresh_of(get(app, "/?status=pending")) == [DEFAULT_REFRESH_S]
    assert refresh_of(get(app, "/runs/qwen-rm-5vt2j")) == [DEFAULT_REFRESH_S]  # pending: not finished
    assert refresh_of(get(app, "/?refresh=30")) == [30] and refresh_of(get(app, "/runs/qwen-rm-5vt2j?refresh=2")) == [2]
    assert f"reloads every {DEFAULT_REFRESH_S} s" in said(get(app, "/"))
    # the filter form keeps a refresh given, so that filtering does not turn it back to the default
    assert '<input type="hidden" name="refresh" value="30">' in get(app, "/?refresh=30").body.decode()


@pytest.mark.parametrize("target", [
    "/?refresh=0", "/runs/qwen-rm-5vt2j?refresh=0",  # off
    f"/?now={NOW_TEXT}", f"/runs/qwen-rm-5vt2j?now={NOW_TEXT}",  # a fixed time: the page cannot change
    "/runs/vit-l-9hx4d", "/runs/vit-l-9hx4d?refresh=5",  # a finished run
    "/nope", "/?status=bogus",  # error pages
])
def test_pages_that_cannot_change_do_not_reload(app: App, target: str) -> None:
    reply = get(app, target)
    assert reply.status in (200, 400, 404) and refresh_of(reply) == [] and "reloads every" not in said(reply)


def test_a_server_at_a_fixed_time_never_reloads(app: App) -> None:
    fixed = App(index=app.index, hosts=app.hosts, stuck_after="30m", clock=lambda: NOW, now=NOW)
    assert refresh_of(get(fixed, "/")) == [] and refresh_of(get(fixed, "/runs/qwen-rm-5vt2j")) == []


@pytest.mark.parametrize("value", ["1", "3601", "-5", "abc", "2.5", "9" * 40, "\uff11\uff10"])  # full-width digits
def test_a_bad_refresh_is_a_400_saying_why(app: App, value: str) -> None:
    for target in (f"/?refresh={value}", f"/runs/qwen-rm-5vt2j?refresh={value}"):
        reply = get(app, target)
        assert reply.status == 400 and "refresh: 0 (off) or whole seconds from 2 to 3600" in said(reply), target


def test_the_edges_of_refresh_are_pages(app: App) -> None:
    assert refresh_of(get(app, "/?refresh=2")) == [2] and refresh_of(get(app, "/?refresh=3600")) == [3600]


# ------------------------------------------------------------------------------------------ metric curves


def _charts(body: str) -> dict[str, str]:
    """Each chart's SVG by its metric."""
    return {html.unescape(m.group(1)): m.group(0) for m in
            re.finditer(r'<svg class="curve"[^>]*aria-label="([^"]*) by step">.*?</svg>', body)}


def _polyline(svg: str) -> list[tuple[float, float]]:
    (coords,) = re.findall(r'<polyline class="curve-\d" points="([^"]+)"', svg)
    return [(float(x), float(y)) for x, y in (pair.split(",") for pair in coords.split())]


def test_a_runs_page_draws_a_chart_per_metric_from_its_points(app: App) -> None:
    body = get(app, "/runs/vit-l-9hx4d").body.decode()
    metrics = body[body.index('<h2 id="metrics">Metrics</h2>'):]
    charts = _charts(metrics)
    assert sorted(charts) == ["accuracy", "loss"]
    # the demo's vit-l-9hx4d: 4 points a metric, steps 400..1600; loss 4.4 -> 2.146, accuracy 0.22 -> 0.4
    loss, accuracy = _polyline(charts["loss"]), _polyline(charts["accuracy"])
    assert len(loss) == len(accuracy) == 4
    assert [x for x, _ in loss] == sorted(x for x, _ in loss)  # by step, left to right
    assert [y for _, y in loss] == sorted(y for _, y in loss)  # falling loss: SVG y grows downwards
    assert [y for _, y in accuracy] == sorted((y for _, y in accuracy), reverse=True)  # rising accuracy
    labels = re.findall(r'<text class="axis"[^>]*>([^<]+)</text>', charts["loss"])
    assert labels == ["4.4", "2.146", "400", "1600"]  # value max, min; step min, max
    assert "<title>loss: 4 points</title>" in charts["loss"]


def test_a_chart_skips_non_finite_values_and_escapes_every_text() -> None:
    from datetime import UTC, datetime

    from tracker.core.model import MetricPoint
    from tracker.ui.curves import MAX_POINTS_PER_CURVE, run_curves

    at = datetime(2026, 8, 20, tzinfo=UTC)
    evil = '<script>x</script>"&'

    def point(metric: str, step: int, value: float) -> MetricPoint:
        return MetricPoint(run_id="r", metric=metric, step=step, value=value, at=at)

    points = [point(evil, 1, 1.0), point(evil, 2, float("nan")), point(evil, 3, float("inf")), point(evil, 4, 3.0),
              point("one", 7, 0.5), point("none", 1, float("nan"))]
    svg = run_curves(points)
    assert "<script" not in svg and html.escape(evil) in svg
    charts = _charts(svg)
    assert sorted(charts) == sorted(["one", evil])  # "none" has no finite value: a note, no chart
    assert len(_polyline(charts[evil])) == 2  # NaN and inf left out
    assert re.findall(r'<text class="axis"[^>]*>([^<]+)</text>', charts[evil]) == ["3", "1", "1", "4"]
    assert '<circle class="curve-0"' in charts["one"]  # a lone point is a dot
    assert "no finite value to draw" in svg
    many = [point("m", i, float(i % 7)) for i in range(3 * MAX_POINTS_PER_CURVE)]
    drawn = _polyline(_charts(run_curves(many))["m"])
    assert len(drawn) == MAX_POINTS_PER_CURVE and drawn[-1][0] == 288.0  # capped, the last step kept (right edge)


# ------------------------------------------------------------------------------------------ the compare page


def _marked(body: str) -> list[str]:
    """The labels of the compare table's rows marked as differing, in order."""
    return [html.unescape(m) for m in re.findall(r'<tr class="differs"><td class="mark">\*</td><th>([^<]*)</th>', body)]


def _cli_marked(capsys: pytest.CaptureFixture[str], index: Path, *runs: str) -> list[str]:
    from tracker.cli import main

    capsys.readouterr()
    assert main(["compare", "--index", str(index), "--now", NOW_TEXT, *runs]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "* the runs differ"  # the caption
    return [line[1:].strip().split("  ")[0] for line in lines[:-1] if line.startswith("*")]


def test_the_compare_page_marks_the_rows_tracker_compare_marks_and_draws_a_curve_per_run(
        app: App, capsys: pytest.CaptureFixture[str]) -> None:
    # a run, the run it resumes (stopped, no metric points) and another project's run, referred to three ways
    reply = get(app, f"/compare?run=gpt-moe-tq3vb&run=team-a/gpt-moe-6wz8r&run=vit-l&now={NOW_TEXT}")
    assert reply.status == 200
    body = reply.body.decode()
    heads = re.findall(r'<th><a href="/runs/([^"?]+)\?now=[^"]+" title="[^"]*">', body)
    assert heads == ["gpt-moe-tq3vb", "gpt-moe-6wz8r", "vit-l-9hx4d"]  # each a link to its page, now kept
    marked = _marked(body)
    assert marked == _cli_marked(capsys, app.index, "gpt-moe-tq3vb", "gpt-moe-6wz8r", "vit-l-9hx4d")
    assert {"project", "resume of", "status", "attempts", "accuracy", "loss"} <= set(marked)
    assert "target" not in marked and '<tr class="same"><td class="mark"></td><th>target</th>' in body
    assert "<td>succeeded (CompletionsReached)</td><td>stopped (DeactivatedDueToRequeuingLimitExceeded)</td>" in body
    charts = _charts(body[body.index("<h2>Metric curves</h2>"):])
    assert sorted(charts) == ["accuracy", "loss"]
    for svg in charts.values():  # gpt-moe-6wz8r has no points: no curve, nor a legend line; colours by column
        assert re.findall(r'<polyline class="(curve-\d)"', svg) == ["curve-0", "curve-2"]
        assert re.findall(r'<text class="legend"[^>]*>([^<]+)<title>', svg) == ["gpt-moe-tq3vb", "vit-l-9hx4d"]
    assert refresh_of(reply) == []  # a fixed now


def test_the_compare_page_reloads_while_a_run_it_shows_is_live(app: App) -> None:
    assert refresh_of(get(app, "/compare?run=qwen-rm-5vt2j&run=vit-l-9hx4d")) == [DEFAULT_REFRESH_S]
    assert refresh_of(get(app, "/compare?run=gpt-moe-tq3vb&run=vit-l-9hx4d")) == []  # both finished


@pytest.mark.parametrize("query, status, says", [
    ("", 400, "compare 2 to 8 runs (run=RUN, once each), got 0"),
    ("run=vit-l-9hx4d", 400, "compare 2 to 8 runs (run=RUN, once each), got 1"),
    ("&".join(f"run={r}" for r in ["vit", "qwen", "bert", "gpt-moe-tq", "llama", "mixtral", "rl-ppo", "rn50",
                                   "whisper"]), 400, "compare 2 to 8 runs (run=RUN, once each), got 9"),
    ("run=vit-l-9hx4d&run=team-b/vit-l-9hx4d", 400, "run 'vit-l-9hx4d' is given twice"),
    ("run=vit-l-9hx4d&run=qwen&status=failed", 400, "the compare page takes only run=RUN"),
    ("run=vit-l-9hx4d&run=qwen&refresh=1", 400, "refresh: 0 (off)"),
    ("run=vit-l-9hx4d&run=no-such-run", 404, "no run 'no-such-run' in ui.sqlite"),
    ("run=vit-l-9hx4d&run=gpt-moe", 404, "gpt-moe"),  # not unique
])
def test_a_bad_compare_is_a_4xx_saying_why(app: App, query: str, status: int, says: str) -> None:
    reply = get(app, "/compare?" + query)
    assert reply.status == status and says in said(reply), said(reply)[-300:]


def test_eight_runs_compare(app: App) -> None:
    runs = ["vit", "qwen", "bert", "gpt-moe-tq", "llama", "mixtral", "rl-ppo", "rn50"]
    reply = get(app, "/compare?" + "&".join(f"run={r}" for r in runs))
    assert reply.status == 200 and reply.body.decode().count('<polyline class="curve-7"') == 2


def test_the_compare_page_escapes_the_runs_it_shows(app: App) -> None:
    from urllib.parse import quote

    from tests.support.ui_support import EVIL_RUN

    body = get(app, f"/compare?run={quote(EVIL_RUN, safe='')}&run=vit-l-9hx4d").body.decode()
    assert "<script" not in body and "<b>" not in body and html.escape(EVIL_RUN) in body
    assert "&lt;b&gt;proj&lt;/b&gt;" in body and "Bad&lt;Reason&gt;" in body


def test_the_runs_page_ticks_runs_to_compare_and_a_resumed_run_links_to_its_comparison(app: App) -> None:
    from urllib.parse import quote

    from tests.support.ui_support import EVIL_RUN

    body = get(app, f"/?now={NOW_TEXT}").body.decode()
    form = body[body.index('<form class="compare" method="get" action="/compare">'):]
    form = form[: form.index("</form>")]
    boxes = [html.unescape(v) for v in re.findall(r'<input type="checkbox" name="run" value="([^"]*)"', form)]
    assert len(boxes) == 15 and "vit-l-9hx4d" in boxes and EVIL_RUN in boxes  # one a run, escaped
    assert f'<input type="hidden" name="now" value="{NOW_TEXT}">' in form and '<button type="submit">' in form
    # what the browser sends for two boxes ticked is the compare page
    assert get(app, f"/compare?run={quote(EVIL_RUN, safe='')}&run=vit-l-9hx4d&now={quote(NOW_TEXT)}").status == 200
    page = get(app, "/runs/gpt-moe-tq3vb").body.decode()
    assert ('<a href="/compare?run=gpt-moe-tq3vb&amp;run=gpt-moe-6wz8r" title="gpt-moe-6wz8r">compare with '
            "gpt-moe-6wz8r</a>") in page
    back = get(app, "/runs/gpt-moe-6wz8r").body.decode()
    assert '<a href="/compare?run=gpt-moe-6wz8r&amp;run=gpt-moe-tq3vb"' in back
    assert "compare with" not in get(app, "/runs/vit-l-9hx4d").body.decode()  # no lineage: nothing to compare with
