"""The quota coordinator: hands every inference pod its lease of each tenant's service-wide quota.

The scaler process is one central service per cluster, so it also serves this small HTTP API
(``sluiceway-scaler serve --quota-port 9092``):

``POST /v1/lease``  body: a :class:`sluiceway_core.quota.LeaseRequest` (JSON, at most 256 KiB);
                    answer: the pod's :class:`~sluiceway_core.quota.LeaseGrant`, or 400 with
                    ``{"error": ...}`` for a message that does not follow the schema.
``GET /healthz``    200 ``ok``.

Concurrency model: a :class:`http.server.ThreadingHTTPServer` (one thread per connection, daemon
threads) in a background thread; every call into the :class:`~sluiceway_core.quota.Allocator`
holds one lock, so allocations are serialised. Time comes from an injected clock (monotonic).

State is in memory only: after a restart every pod is on its fallback share until its next
renewal (at most a third of a lease later), and then shares are rebuilt from the reports.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sluiceway_core.quota import LEASE_PATH, Allocator, LeaseRequest, QuotaError

log = logging.getLogger("sluiceway_scaler.quota")

MAX_BODY = 256 * 1024


class QuotaCoordinator:
    def __init__(self, lease_seconds: float = 3.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.allocator = Allocator(lease_seconds)
        self._clock = clock
        self._lock = threading.Lock()

    def lease(self, doc: Any) -> dict[str, Any]:
        """One renewal. Raises :class:`QuotaError` on a malformed request."""
        req = LeaseRequest.from_json(doc)
        with self._lock:
            grant = self.allocator.renew(req, self._clock())
        return grant.to_json()


def _handler(coord: QuotaCoordinator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "sluiceway-quota"
        timeout = 10  # seconds to read a request: a slow client cannot hold a thread forever

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _send(self, code: int, doc: Any) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(200, "ok")
            else:
                self._send(404, {"error": f"no such path {self.path!r}"})

        def do_POST(self) -> None:
            if self.path != LEASE_PATH:
                self._send(404, {"error": f"no such path {self.path!r}; use POST {LEASE_PATH}"})
                return
            try:
                length = int(self.headers.get("content-length", ""))
            except ValueError:
                self._send(411, {"error": "content-length is required"})
                return
            if not 0 < length <= MAX_BODY:
                self._send(413, {"error": f"body must be 1..{MAX_BODY} bytes"})
                return
            try:
                doc = json.loads(self.rfile.read(length))
                self._send(200, coord.lease(doc))
            except (QuotaError, ValueError) as e:  # json.JSONDecodeError is a ValueError
                self._send(400, {"error": str(e)})

    return Handler


def serve_quota(
    coord: QuotaCoordinator, host: str, port: int
) -> tuple[ThreadingHTTPServer, int, threading.Thread]:
    """Start serving in a daemon thread; returns the server, its port (``0`` picks one) and the thread."""
    server = ThreadingHTTPServer((host, port), _handler(coord))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="sluiceway-quota", daemon=True)
    thread.start()
    return server, int(server.server_address[1]), thread
