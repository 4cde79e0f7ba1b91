"""No request makes the web view fail: random paths and query strings (every filter, unknown and repeated names,
blank names, any text, percent-escapes that decode to nothing valid) and random request heads (methods, targets,
versions, up to 120 headers of any text) are answered with a page or a 4xx, never a 500 (nor a 503 blaming the
index, which is fine); the head's own limits (request line, header count and size) are 4xx too."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.ui_support import NOW, build_index, running
from tracker.read.filters import FILTERS
from tracker.ui.connections import MAX_HEAD_BYTES, MAX_REQUEST_LINE
from tracker.ui.server import App, UiServer, allowed_hosts

PAGES = frozenset({200, 400, 404, 405, 414})
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
                derandomize=True)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_index(tmp_path_factory.mktemp("ui-fuzz"))


@pytest.fixture(scope="module")
def app(index: Path) -> App:
    return App(index=index, hosts=allowed_hosts("127.0.0.1", []), stuck_after="30m", clock=lambda: NOW)


@pytest.fixture(scope="module")
def server(index: Path) -> Iterator[UiServer]:
    with running(index) as srv:
        yield srv


ATOMS = st.sampled_from([
    "0", "-1", "+1", "1_000", "9" * 30, "1d", "99999999999d", "age", "name", "-age", "2026-08-20T13:00:00Z",
    "2026-08-20T13:00:00+23:59", "2026-08-20", "now", "%", "%ZZ", "%00", "%ED%A0%80", "%FF", "a=b", "!=", "in",
    "notin", "(", ")", "a,b", ",", "1.5", "NaN", "inf", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "P1D",
    "-5m", "0s", "pending", "Admission", "x in (a,b)", "!x", "x==y", "a.b/c", "\u0661", "T", "Z", "+00:00", "%2B",
])
TEXT = st.text(max_size=12)
VALUES = st.lists(st.one_of(ATOMS, TEXT.map(quote), TEXT), max_size=4).map("".join)
NAMES = st.one_of(st.sampled_from([*FILTERS, *(f.replace("-", "_") for f in FILTERS), "", "x", "sort", "order"]),
                  TEXT.map(quote))
QUERIES = st.lists(st.tuples(NAMES, VALUES).map("=".join), max_size=8).map("&".join)
PATHS = st.one_of(
    st.sampled_from(["/", "/runs", "/runs/", "/runs/qwen", "/runs/vit-l-9hx4d", "//", "/static/ui.css", "/healthz",
                     "/runs/team-a/", "/runs/%", "/runs/%00", "http://x/", "*"]),
    st.lists(st.one_of(ATOMS, TEXT.map(quote)), max_size=4).map(lambda parts: "/runs/" + "".join(parts)),
    TEXT.map(lambda text: "/" + quote(text)),
)


@FUZZ
@given(path=PATHS, query=QUERIES, host=st.one_of(st.just("localhost:8321"), st.none(), TEXT))
def test_no_path_or_query_string_is_a_server_error(app: App, path: str, query: str, host: str | None) -> None:
    target = f"{path}?{query}" if query else path
    reply = app.respond("GET", target, host)
    assert reply.status in PAGES, (target, reply.status, reply.body[-400:])


HEADER_TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=255, exclude_characters="\r\n"), max_size=40)
HEADERS = st.lists(st.tuples(st.one_of(st.sampled_from(["Host", "host", "Content-Length", "Transfer-Encoding",
                                                        "Connection", "Expect", "X"]), HEADER_TEXT), HEADER_TEXT),
                   max_size=120)


@FUZZ
@given(method=st.one_of(st.sampled_from(["GET", "HEAD", "POST", "OPTIONS", "get", ""]), HEADER_TEXT),
       target=st.one_of(PATHS, HEADER_TEXT), version=st.sampled_from(["HTTP/1.0", "HTTP/1.1", "HTTP/0.9", "HTTP/1",
                                                                       "HTTP/x", "", "HTTP/1.1 x"]),
       headers=HEADERS)
def test_no_request_head_is_a_server_error(server: UiServer, method: str, target: str, version: str,
                                           headers: list[tuple[str, str]]) -> None:
    head = " ".join(p for p in (method, target, version) if p) + "\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers) + "\r\n"
    reply = server._answer(head.encode("latin-1"), ("127.0.0.1", 1))
    status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/") else 200  # HTTP/0.9: a bare body
    assert 200 <= status < 500, (head[:300], reply[:300])


def exchange(server: UiServer, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=30) as conn:
        conn.sendall(data)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_the_heads_limits_are_4xx(server: UiServer) -> None:
    assert exchange(server, b"GET /" + b"a" * MAX_REQUEST_LINE + b" HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 414 ")
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(101))
    assert exchange(server, b"GET / HTTP/1.0\r\nHost: localhost\r\n" + many + b"\r\n").startswith(b"HTTP/1.0 431 ")
    big = b"X-Big: " + b"b" * MAX_HEAD_BYTES + b"\r\n"
    assert exchange(server, b"GET / HTTP/1.0\r\nHost: localhost\r\n" + big + b"\r\n").startswith(b"HTTP/1.0 431 ")
    assert exchange(server, b"GET /" + b"p" * 3000 + b" HTTP/1.0\r\nHost: localhost\r\n\r\n").startswith(
        b"HTTP/1.0 414 ")
