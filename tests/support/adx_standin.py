"""A STAND-IN for Azure Data Explorer, for tests only: an HTTP server on 127.0.0.1 that answers the REST calls the
azure-kusto-data / azure-kusto-ingest SDK (6.0.x) makes, and records every request. It is not Kusto: it runs no
KQL and checks no schema. What it answers (paths and headers as read in the SDK source):

- streaming ingestion   POST /v1/rest/ingest/{db}/{table}?streamFormat=..&mappingName=..  (gzip body)
- management commands   POST /v1/rest/mgmt   {"db", "csl", "properties"}  -> a V1 data set; it answers
                        `.get ingestion resources` and `.get kusto identity token` (the queued client's set-up)
                        and acknowledges any other command with an empty table
- queries               POST /v2/rest/query  {"db", "csl"}  -> a V2 frame list; only a bare table name, which
                        returns the rows ingested into that table so far
- queued ingestion      the storage calls the SDK makes with the resources above, all on this server:
                        PUT /tempstorage/{blob} (blob upload) and POST /readyforaggregation/messages (the
                        ingestion message, whose blob's rows are then "ingested")

Failures are scripted per route with ``fail(route, *statuses)`` (answered in order, then normal service),
``stall(route, seconds)`` (a slow answer), a standing ``outage`` status, or ``down()`` / ``up()``, which close
and reopen the listening socket and cut open connections (connection refused in between). Ingested rows land in
``tables[table]``, with the path that brought each in ``routes``.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import socket
import threading
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit
from xml.etree import ElementTree

from tests.support.quiet_http import QuietHTTPServer

ROUTES = ("ingest", "mgmt", "query", "blob", "queue")


@dataclass
class Request:
    route: str
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes  # gunzipped when the request was gzip-encoded
    status: int = 0  # what the stand-in answered

    def json(self) -> Any:
        return json.loads(self.body)

    def rows(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.body.splitlines() if line.strip()]


@dataclass
class KustoStandIn:
    host: str = "127.0.0.1"
    port: int = 0
    requests: list[Request] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    routes: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # table -> route per row
    outage: int | None = None  # answer every request with this status while set
    _script: dict[str, deque[int]] = field(default_factory=lambda: defaultdict(deque))
    _stalls: dict[str, deque[float]] = field(default_factory=lambda: defaultdict(deque))
    _blobs: dict[str, bytes] = field(default_factory=dict)
    _connections: set[socket.socket] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: QuietHTTPServer | None = None
    _thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------------ control
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def up(self) -> KustoStandIn:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as Kusto: down() must cut open connections too

            def setup(self) -> None:
                super().setup()
                with standin._lock:
                    standin._connections.add(self.connection)

            def finish(self) -> None:
                with standin._lock:
                    standin._connections.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:
                standin._handle(self)

            def do_PUT(self) -> None:
                standin._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = QuietHTTPServer((self.host, self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="kusto-standin", daemon=True)
        self._thread.start()
        return self

    def down(self) -> None:
        """Stops listening: connections are refused until ``up()``."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._lock:
            for conn in self._connections:
                conn.shutdown(socket.SHUT_RDWR)
            self._connections.clear()

    def stall(self, route: str, seconds: float) -> None:
        """The next request on ``route`` is answered (normally) only after ``seconds``."""
        assert route in ROUTES, route
        with self._lock:
            self._stalls[route].append(seconds)

    def fail(self, route: str, *statuses: int) -> None:
        """The next requests on ``route`` get these statuses, in order."""
        assert route in ROUTES, route
        with self._lock:
            self._script[route].extend(statuses)

    def of(self, route: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.route == route]

    # ------------------------------------------------------------------------------------ serving
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        if h.headers.get("Content-Encoding") == "gzip" or body[:2] == b"\x1f\x8b":
            body = gzip.decompress(body)
        route = self._route(h.command, parts.path)
        req = Request(route, h.command, unquote(parts.path), dict(parse_qsl(parts.query)),
                      {k.lower(): v for k, v in h.headers.items()}, body)
        with self._lock:
            self.requests.append(req)
            scripted = self._script[route].popleft() if self._script[route] else None
            stall = self._stalls[route].popleft() if self._stalls[route] else 0.0
        time.sleep(stall)
        status = self.outage or scripted
        if status is not None:
            req.status = status
            self._reply(h, status, _error(status, permanent=400 <= status < 500 and status not in (408, 429)))
            return
        try:
            req.status, payload, headers = getattr(self, f"_{route}")(req)
        except _Refused as exc:
            req.status = 400
            self._reply(h, 400, _error(400, str(exc), permanent=True))
            return
        self._reply(h, req.status, payload, headers)

    @staticmethod
    def _route(method: str, path: str) -> str:
        if path.startswith("/v1/rest/ingest/"):
            return "ingest"
        if path == "/v1/rest/mgmt":
            return "mgmt"
        if path == "/v2/rest/query":
            return "query"
        return "blob" if method == "PUT" else "queue"

    @staticmethod
    def _reply(h: BaseHTTPRequestHandler, status: int, payload: bytes | Any,
               headers: dict[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        h.send_response(status)
        for k, v in (headers or {"Content-Type": "application/json; charset=utf-8"}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _ingested(self, table: str, rows: list[dict[str, Any]], route: str) -> None:
        with self._lock:
            self.tables[table].extend(rows)
            self.routes[table].extend([route] * len(rows))

    def _ingest(self, req: Request) -> tuple[int, Any, None]:
        m = re.fullmatch(r"/v1/rest/ingest/([^/]+)/([^/]+)", req.path)
        if m is None or "streamFormat" not in req.query:
            raise _Refused(f"bad streaming ingestion request {req.path}")
        self._ingested(m.group(2), req.rows(), "streaming")
        return 200, _v1([("ConsumedRecordsCount", "long")], [[len(req.rows())]]), None

    def _mgmt(self, req: Request) -> tuple[int, Any, None]:
        csl = req.json()["csl"].strip()
        if csl == ".get ingestion resources":
            rows = [["SecuredReadyForAggregationQueue", f"{self.url}/readyforaggregation?sig=standin"],
                    ["FailedIngestionsQueue", f"{self.url}/failedingestions?sig=standin"],
                    ["SuccessfulIngestionsQueue", f"{self.url}/successfulingestions?sig=standin"],
                    ["TempStorage", f"{self.url}/tempstorage?sig=standin"],
                    ["IngestionsStatusTable", f"{self.url}/ingestionsstatus?sig=standin"]]
            return 200, _v1([("ResourceTypeName", "string"), ("StorageRoot", "string")], rows), None
        if csl == ".get kusto identity token":
            return 200, _v1([("AuthorizationContext", "string")], [["standin-authorization-context"]]), None
        return 200, _v1([("Result", "string")], []), None

    def _query(self, req: Request) -> tuple[int, Any, None]:
        csl = req.json()["csl"].strip()
        if not re.fullmatch(r"\w+", csl):
            raise _Refused("the STAND-IN answers only bare table names")
        with self._lock:
            rows = list(self.tables.get(csl, []))
        columns = sorted({k for r in rows for k in r})
        return 200, _v2(csl, columns, [[r.get(c) for c in columns] for r in rows]), None

    def _blob(self, req: Request) -> tuple[int, bytes, dict[str, str]]:
        with self._lock:
            self._blobs[req.path] = req.body
        now = datetime.now(UTC).strftime("%a, %d %b %Y %H:%M:%S GMT")
        return 201, b"", {"ETag": f'"{uuid.uuid4()}"', "Last-Modified": now, "x-ms-version": "2021-08-06",
                          "x-ms-request-server-encrypted": "true", "Date": now}

    def _queue(self, req: Request) -> tuple[int, bytes, dict[str, str]]:
        text = ElementTree.fromstring(req.body).findtext("MessageText") or ""
        message = json.loads(base64.b64decode(text))
        blob_path = unquote(urlsplit(message["BlobPath"]).path)
        with self._lock:
            blob = self._blobs.get(blob_path)
        if blob is None:
            raise _Refused(f"ingestion message for an unknown blob {blob_path}")
        rows = [json.loads(line) for line in blob.splitlines() if line.strip()]
        self._ingested(message["TableName"], rows, "queued")
        now = datetime.now(UTC).strftime("%a, %d %b %Y %H:%M:%S GMT")
        xml = (f"<?xml version=\"1.0\" encoding=\"utf-8\"?><QueueMessagesList><QueueMessage>"
               f"<MessageId>{uuid.uuid4()}</MessageId><InsertionTime>{now}</InsertionTime>"
               f"<ExpirationTime>{now}</ExpirationTime><PopReceipt>standin</PopReceipt>"
               f"<TimeNextVisible>{now}</TimeNextVisible></QueueMessage></QueueMessagesList>")
        return 201, xml.encode(), {"Content-Type": "application/xml", "x-ms-version": "2021-08-06", "Date": now}


class _Refused(Exception):
    """A request the stand-in answers with 400 (a permanent error)."""


def _error(status: int, message: str = "", permanent: bool = False) -> dict[str, Any]:
    """An error body in Kusto's OneApiError shape (what the SDK parses into KustoApiError)."""
    return {"error": {"code": f"Http{status}", "message": message or f"STAND-IN answered {status}",
                      "@type": "StandIn.Error", "@message": message or f"STAND-IN answered {status}",
                      "@permanent": permanent}}


def _v1(columns: list[tuple[str, str]], rows: list[list[Any]]) -> dict[str, Any]:
    return {"Tables": [{"TableName": "Table_0",
                        "Columns": [{"ColumnName": n, "DataType": t.capitalize(), "ColumnType": t}
                                    for n, t in columns],
                        "Rows": rows}]}


def _v2(table: str, columns: list[str], rows: list[list[Any]]) -> list[dict[str, Any]]:
    return [
        {"FrameType": "DataSetHeader", "IsProgressive": False, "Version": "v2.0"},
        {"FrameType": "DataTable", "TableId": 0, "TableKind": "PrimaryResult", "TableName": table,
         "Columns": [{"ColumnName": c, "ColumnType": "dynamic"} for c in columns], "Rows": rows},
        {"FrameType": "DataSetCompletion", "HasErrors": False, "Cancelled": False},
    ]
