"""The web view's query parameters at and beyond their edges: every one capped in length, ``limit`` capped at
``MAX_LIMIT``, times outside years 1 to 9999 in UTC and run references of any length: a 4xx page saying why, never
a 500 (nor a 503 blaming the index)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.support.ui_support import NOW_TEXT, build_index, request, running
from tracker.ui.server import MAX_LIMIT, MAX_PARAM_CHARS, MAX_QUERY_CHARS, UiServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiServer]:
    with running(build_index(tmp_path_factory.mktemp("ui-params"))) as srv:
        yield srv


def said(body: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", body).split())


@pytest.mark.parametrize("query, says", [
    (f"limit={10**30}", "limit"),
    (f"limit={2**63}", "limit"),
    (f"limit={MAX_LIMIT + 1}", f"at most {MAX_LIMIT}"),
    ("limit=" + "9" * 5000, "limit"),
    ("now=0001-01-01T00:00:00%2B05:00", "between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z"),
    ("now=9999-12-31T23:59:59-05:00", "between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z"),
    ("since=9999-12-31T23:59:59-05:00", "between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z"),
    ("until=0001-01-01T00:00:00%2B14:00", "between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z"),
    ("since=" + "9" * 5000 + "d", "since"),
    ("stuck=" + "9" * 5000 + "d", "stuck"),
    ("namespace=" + "n" * (MAX_PARAM_CHARS + 1), f"at most {MAX_PARAM_CHARS} characters"),
    ("selector=" + "a" * (MAX_PARAM_CHARS + 1), f"at most {MAX_PARAM_CHARS} characters"),
    ("now=" + "2" * (MAX_PARAM_CHARS + 1), f"at most {MAX_PARAM_CHARS} characters"),
])
def test_a_parameter_out_of_range_is_a_400_saying_why(server: UiServer, query: str, says: str) -> None:
    reply = request(server, "/?" + query)
    assert reply.status == 400, (reply.status, said(reply.body)[:300])
    assert says in said(reply.body)


@pytest.mark.parametrize("query", [f"limit={MAX_LIMIT}", "now=9999-12-31T23:59:59Z", "now=0001-01-01T00:00:00Z",
                                   "since=0001-01-01T00:00:00Z", "until=9999-12-31T23:59:59Z", "since=999999999d",
                                   f"now={NOW_TEXT}&namespace=" + "n" * MAX_PARAM_CHARS])
def test_a_parameter_at_its_edge_is_a_page(server: UiServer, query: str) -> None:
    assert request(server, "/?" + query).status == 200


@pytest.mark.parametrize("now", ["0001-01-01T00:00:00%2B05:00", "9999-12-31T23:59:59-05:00"])
def test_a_runs_page_refuses_a_now_outside_the_years_1_to_9999(server: UiServer, now: str) -> None:
    reply = request(server, "/runs/qwen?now=" + now)
    assert reply.status == 400 and "between 0001-01-01T00:00:00Z" in said(reply.body)


@pytest.mark.parametrize("now", ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z"])
def test_a_runs_page_at_the_edges_of_time_is_a_page(server: UiServer, now: str) -> None:
    assert request(server, "/runs/qwen?now=" + now).status == 200


@pytest.mark.parametrize("length", [MAX_PARAM_CHARS + 1, 50_001])
def test_an_over_long_run_reference_is_a_400(server: UiServer, length: int) -> None:
    reply = request(server, "/runs/" + quote("a" * length))
    assert reply.status == 400 and f"at most {MAX_PARAM_CHARS} characters" in said(reply.body)


def test_a_query_string_of_many_short_values_is_capped(server: UiServer) -> None:
    reply = request(server, "/?" + "&".join(f"namespace=n{i}" for i in range(3_000)))
    assert reply.status == 414 and f"at most {MAX_QUERY_CHARS} characters" in said(reply.body)


def test_the_limits_are_documented() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    limits = (Path(__file__).parents[2] / "docs" / "limits.md").read_text()
    for text in (readme, limits):
        assert all(f"{n:,}" in text for n in (MAX_LIMIT, MAX_PARAM_CHARS, MAX_QUERY_CHARS))
