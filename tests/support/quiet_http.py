"""The stand-ins' HTTP server: a ``ThreadingHTTPServer`` whose handler errors are recorded, not printed.

``socketserver`` prints "Exception occurred during processing of request from ..." and a traceback on
``sys.stderr`` when a handler raises, typically a BrokenPipe after the stand-in was taken ``down()`` under a
client, or a client that hung up mid-answer. Its handler threads are daemons that can outlive the test that
started them, so that print could land in a later test's captured stderr (a CLI test that checks its output is
one line failed on exactly that). Here the error is kept in ``errors`` for the test that owns the server.
"""

from __future__ import annotations

import sys
import threading
from http.server import ThreadingHTTPServer
from typing import Any


class QuietHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.errors: list[tuple[Any, BaseException]] = []
        self._errors_lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if exc is not None:
            with self._errors_lock:
                self.errors.append((client_address, exc))
