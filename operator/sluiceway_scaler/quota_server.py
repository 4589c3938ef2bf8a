"""The quota coordinator: hands every inference pod its lease of each tenant's service-wide quota.

The scaler process is one central service per cluster, so it also serves this small HTTP API
(``sluiceway-scaler serve --quota-port 9092``):

``POST /v1/lease``  body: a :class:`sluiceway_core.quota.LeaseRequest` (JSON, at most 256 KiB) that
                    carries the operator's signed charter; answer: the pod's
                    :class:`~sluiceway_core.quota.LeaseGrant`; 400 ``{"error": ...}`` for a message
                    that does not follow the schema, 403 when the charter's signature does not
                    verify (or no key is configured), 429 when a bound on the state is reached,
                    503 when every worker thread is busy.
``GET /healthz``    200 ``ok``.

Trust: the service name, the quotas and the pod bound come only from the charter, verified with
the quota key (:mod:`sluiceway_core.quota_charter`); nothing the caller claims beyond its pod name,
demand and current holding is used. Without a key every lease is refused (403), and start-up says so.

Concurrency model: a :class:`http.server.ThreadingHTTPServer` in a background thread, with at most
``max_threads`` handler threads (a connection beyond them gets 503 at once and is closed); a
connection has ``request_deadline`` seconds in all (one reaper thread shuts down any that takes
longer, so clients trickling bytes cannot hold the threads), and each read at most
``Handler.timeout``. Allocation is per service
(:class:`~sluiceway_core.quota.Allocator` has one lock per service), so one service's renewal never
waits on another's, and its cost is bounded by the signed charter. Time comes from an injected
clock (monotonic). Errors map to HTTP codes in one place (:func:`_status`).

Restart: state is in memory only. A fresh coordinator, for one lease period, grants a pod no more
than it reports holding from a lease still valid, and nothing new where it holds nothing (that pod
stays on its fallback share), so the leases in force never sum above the quota across a restart;
afterwards shares are rebuilt from the reports. Two coordinators serving at once (a rolling update,
``scaler.replicas > 1``) would each allow the quota: the chart renders ``Recreate`` and refuses more
than one replica while quotas are on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sluiceway_core.quota import (
    LEASE_PATH,
    Allocator,
    LeaseRequest,
    LeaseTerms,
    QuotaBusy,
    QuotaError,
    QuotaForbidden,
)
from sluiceway_core.quota_charter import QuotaCharter, load_key, verify_charter

log = logging.getLogger("sluiceway_scaler.quota")

MAX_BODY = 256 * 1024
MAX_THREADS = 32
REQUEST_DEADLINE = 10.0  # seconds a connection may take in all (one lease request per connection)


class QuotaCoordinator:
    """Verifies a renewal's charter and allocates (thread-safe: see the module docstring)."""

    def __init__(
        self, lease_seconds: float = 3.0, clock: Callable[[], float] = time.monotonic, *, key: bytes | None = None
    ) -> None:
        self._clock = clock
        self.allocator = Allocator(lease_seconds, started=clock())
        self._key = key
        if key is None:
            log.warning("no quota key (--quota-key-file): every lease request is refused with 403")

    def lease(self, doc: Any) -> dict[str, Any]:
        """One renewal. Raises :class:`QuotaError` (400), :class:`QuotaForbidden` (403) or
        :class:`QuotaBusy` (429)."""
        req = LeaseRequest.from_json(doc)
        charter = QuotaCharter.from_json(req.charter)  # malformed: 400
        if self._key is None:
            raise QuotaForbidden("this coordinator has no quota key: it refuses every lease")
        try:
            verify_charter(self._key, req.charter, req.signature)
        except QuotaError:
            raise QuotaForbidden(
                "the charter's signature does not verify: not signed by this cluster's operator"
            ) from None
        terms = LeaseTerms(charter.service, charter.quotas, charter.max_pods, charter.digest())
        return self.allocator.renew(terms, req, self._clock()).to_json()


def _status(e: BaseException) -> int:
    """The one mapping of the coordinator's errors to HTTP status codes."""
    if isinstance(e, QuotaForbidden):
        return 403
    if isinstance(e, QuotaBusy):
        return 429
    return 400  # QuotaError, malformed JSON (ValueError), nesting too deep (RecursionError)


def _handler(coord: QuotaCoordinator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "sluiceway-quota"
        timeout = 5  # seconds to read a request: a slow client cannot hold a thread for long

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
                self._send(404, {"error": "no such path"})

        def do_POST(self) -> None:
            if self.path != LEASE_PATH:
                self._send(404, {"error": f"no such path; use POST {LEASE_PATH}"})
                return
            raw = self.headers.get("content-length", "")
            if not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
                self._send(411, {"error": "content-length is required"})
                return
            length = int(raw)
            if not 0 < length <= MAX_BODY:
                self._send(413, {"error": f"body must be 1..{MAX_BODY} bytes"})
                return
            try:
                body = self.rfile.read(length)
            except OSError:
                self.close_connection = True
                return
            try:
                doc = json.loads(body)
                answer = coord.lease(doc)
            except (ValueError, RecursionError) as e:  # QuotaError and JSONDecodeError are ValueErrors
                code = _status(e)
                self._send(code, {"error": str(e) if isinstance(e, QuotaError) else "the body is not valid JSON"})
                return
            self._send(200, answer)

    return Handler


class _BoundedServer(ThreadingHTTPServer):
    """At most ``max_threads`` connections in service; one more is answered 503 and closed. A
    connection older than ``deadline`` seconds is shut down by :meth:`reap` (its handler then ends)."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_threads: int, deadline: float
    ) -> None:
        self._slots = threading.BoundedSemaphore(max_threads)
        self.deadline = deadline
        self._active: dict[Any, float] = {}
        self._active_lock = threading.Lock()
        self.closed = threading.Event()
        super().__init__(address, handler)

    def reap(self) -> None:
        """The reaper thread: shut down connections past their deadline until the server closes."""
        while not self.closed.wait(min(1.0, self.deadline / 4)):
            now = time.monotonic()
            with self._active_lock:
                late = [sock for sock, since in self._active.items() if now - since > self.deadline]
            for sock in late:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def server_close(self) -> None:
        self.closed.set()
        super().server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that broke (client gone, cut at its deadline): one debug line, no traceback
        on stderr. Anything else is logged with its traceback."""
        err = sys.exc_info()[1]
        if isinstance(err, OSError):
            log.debug("quota connection from %s ended: %s", client_address, err)
        else:
            log.exception("quota request from %s failed", client_address)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(
                    b"HTTP/1.0 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                    b'content-length: 31\r\nconnection: close\r\n\r\n{"error": "too many renewals"}\n'
                )
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._active_lock:
            self._active[request] = time.monotonic()
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._active_lock:
                self._active.pop(request, None)
            self._slots.release()


def serve_quota(
    coord: QuotaCoordinator,
    host: str,
    port: int,
    *,
    max_threads: int = MAX_THREADS,
    request_deadline: float = REQUEST_DEADLINE,
) -> tuple[ThreadingHTTPServer, int, threading.Thread]:
    """Start serving in a daemon thread; returns the server, its port (``0`` picks one) and the thread."""
    server = _BoundedServer((host, port), _handler(coord), max_threads, request_deadline)
    threading.Thread(target=server.reap, name="sluiceway-quota-reaper", daemon=True).start()
    thread = threading.Thread(target=server.serve_forever, name="sluiceway-quota", daemon=True)
    thread.start()
    return server, int(server.server_address[1]), thread


def main(argv: list[str] | None = None) -> int:
    """The coordinator alone (``python -m sluiceway_scaler.quota_server``), for tests and debugging;
    in a cluster it runs inside ``sluiceway-scaler serve --quota-port``."""
    p = argparse.ArgumentParser(prog="sluiceway_scaler.quota_server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--lease-seconds", type=float, default=3.0)
    p.add_argument("--key-file")
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        key = load_key(args.key_file) if args.key_file else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    server, port, thread = serve_quota(QuotaCoordinator(args.lease_seconds, key=key), args.host, args.port)
    print(f"quota coordinator listening on {args.host}:{port}", flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

