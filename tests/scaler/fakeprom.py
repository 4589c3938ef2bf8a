"""A small Prometheus HTTP API stand-in for fault tests and for counting queries.

It answers ``/api/v1/query`` from a table of ``{query substring: value}`` (first match wins; no match
gives an empty vector), counts every request, and can be switched into a fault ``mode``:

* ``ok``       -- well-formed answers;
* ``slow``     -- sleep ``delay`` seconds before answering (beyond the scaler's query timeout);
* ``trickle``  -- send the whole answer (status line, headers, body) one byte every 0.1 s, so that
  each read is quick and the answer takes minutes;
* ``huge``     -- a well-formed answer padded to 5 MiB;
* ``http500``  -- HTTP 500 with a JSON error body;
* ``notjson``  -- 200 with an HTML body;
* ``shape``    -- 200 with JSON of the wrong shapes (cycled: no ``data``, a scalar result, a sample
  without ``value``, a non-numeric value);
* ``nan`` / ``inf`` -- every value ``NaN`` / ``+Inf``.

Binds 127.0.0.1 on a free port; serves on a daemon thread until ``close()``.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_SHAPES: list[Any] = [
    {"status": "success"},
    {"status": "success", "data": {"resultType": "scalar", "result": [1700000000, "3"]}},
    {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}},
    {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [0, "lots"]}]}},
    {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": "7"}]}},
    [1, 2, 3],
]


class FakePrometheus:
    def __init__(self, values: dict[str, float] | None = None) -> None:
        self.values: dict[str, float] = dict(values or {})
        self.mode = "ok"
        self.delay = 3.0
        self.requests = 0
        self.queries: list[str] = []
        self._lock = threading.Lock()
        self._shapes = itertools.cycle(_SHAPES)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                url = urllib.parse.urlparse(self.path)
                params = urllib.parse.parse_qs(url.query)
                if self.command == "POST":
                    n = int(self.headers.get("content-length") or 0)
                    params |= urllib.parse.parse_qs(self.rfile.read(n).decode())
                query = (params.get("query") or [""])[0]
                with fake._lock:
                    fake.requests += 1
                    fake.queries.append(query)
                    mode = fake.mode
                status, body = fake.respond(mode, query)
                if mode == "slow":
                    time.sleep(fake.delay)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                if mode == "huge":
                    data += b" " * (5 << 20)
                if mode == "trickle":
                    raw = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    raw += b"content-length: %d\r\n\r\n" % len(data) + data
                    try:
                        for i in range(len(raw)):
                            self.wfile.write(raw[i : i + 1])
                            self.wfile.flush()
                            time.sleep(0.1)
                    except OSError:
                        pass  # the client gave up
                    self.close_connection = True
                    return
                try:
                    self.send_response(status)
                    self.send_header("content-type", "text/html" if mode == "notjson" else "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (slow mode)

            do_GET = _answer
            do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def respond(self, mode: str, query: str) -> tuple[int, Any]:
        if mode == "http500":
            return 500, {"status": "error", "errorType": "internal", "error": "injected"}
        if mode == "notjson":
            return 200, b"<html><body>502 Bad Gateway</body></html>"
        if mode == "shape":
            with self._lock:
                return 200, next(self._shapes)
        value: float | None = None
        for sub, v in self.values.items():
            if sub in query:
                value = v
                break
        if mode == "nan":
            value = float("nan")
        elif mode == "inf":
            value = float("inf")
        result = [] if value is None else [{"metric": {}, "value": [time.time(), _fmt(value)]}]
        return 200, {"status": "success", "data": {"resultType": "vector", "result": result}}

    def reset_count(self) -> None:
        with self._lock:
            self.requests = 0
            self.queries.clear()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _fmt(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)
