"""The gateway's client side: an HTTP/1.1 server protocol on asyncio with httptools' request parser.

The same hostile-client guarantees the pod gives (docs/reliability.md):

* **Header deadline**: a request's line and headers must arrive within ``header_timeout`` of the
  connection, of the request's first byte or of the previous answer's end; an idle keep-alive
  connection is closed at that deadline too (slowloris).
* **Body deadline**: the whole body within ``body_timeout`` of the headers, else 408 and close.
* **Max body**: a declared or streamed body over ``max_body`` gets 413 and the connection closes; the
  body is buffered, bounded by ``max_body`` (a refused request can be sent to a second pod).
* **Header flood**: more than ``max_headers`` headers or ``max_header_bytes`` of them: 431 and close.
* **Max connections**: a connection over ``max_connections`` gets 503 and is closed (after a lingering
  second in which what it sends is dropped, so the answer is not lost to a reset).
* **Pipelining**: requests parsed ahead wait in a per-connection queue of at most ``max_pipelined``
  (then the socket is not read) and are served one at a time, so answers go out in order.
* **Slow readers**: a client that stops reading its answer for ``body_timeout`` is disconnected.
* Malformed requests get 400 and the connection closes. Every parsed request gets one answer.
* **Client gone**: a handler may ask to be told when the client's connection closes
  (:meth:`Responder.on_client_gone`; the gateway drops a held request whose client left).

Concurrency model: protocol callbacks on the event loop; per connection one task at a time serves the
queued requests in order. The handler writes the answer through a :class:`Responder`, whose ``write``
waits while the client's socket applies back-pressure.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import httptools

from .errors import (
    BadRequest,
    BodyTimeout,
    GatewayError,
    HeadersTooLarge,
    PayloadTooLarge,
    TooManyConnections,
    error_body,
    http_status,
)

log = logging.getLogger("sluiceway.gateway")


@dataclass
class Request:
    method: str = ""
    url: bytearray = field(default_factory=bytearray)
    path: str = ""
    query: bytes = b""
    raw_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    keep_alive: bool = True
    #: answered with this error instead of the handler (decided while parsing)
    error: GatewayError | None = None
    close_after: bool = False


@dataclass
class ServerLimits:
    max_connections: int
    header_timeout: float
    body_timeout: float
    max_body: int
    max_header_bytes: int
    max_headers: int
    max_pipelined: int


class Responder:
    """Writes one answer. ``start`` once, then ``write``/``end`` (or ``send`` for a whole answer)."""

    def __init__(self, conn: ServerProtocol, keep_alive: bool, head_only: bool = False) -> None:
        self._conn = conn
        self.keep_alive = keep_alive
        #: the answer to a HEAD request: headers only, never a body
        self.head_only = head_only
        self.started = False
        self._chunked = False
        self.status = 0

    def start(self, status: int, headers: list[tuple[bytes, bytes]], length: int | None,
              declared: bool = False) -> None:
        """``length``: the body's length, or ``None`` (chunked). ``declared``: a HEAD answer's length."""
        assert not self.started
        self.started = True
        self.status = status
        reason = _REASONS.get(status, b"")
        parts = [b"HTTP/1.1 %d %s\r\n" % (status, reason)]
        for k, v in headers:
            parts.append(b"%s: %s\r\n" % (k, v))
        if length is None:
            self._chunked = not self.head_only
            parts.append(b"transfer-encoding: chunked\r\n")
        elif not self.head_only or declared or length:
            parts.append(b"content-length: %d\r\n" % length)
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        self._conn.write(b"".join(parts))

    async def write(self, chunk: bytes) -> None:
        if not chunk or self.head_only:
            return
        self._conn.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if self._chunked else chunk)
        await self._conn.drain()

    def end(self) -> None:
        if self._chunked:
            self._conn.write(b"0\r\n\r\n")

    def send(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.start(status, headers, len(body))
        if body and not self.head_only:
            self._conn.write(body)

    def on_client_gone(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (once, on the loop) when the client's connection closes before this
        answer is done (a held request whose client left); returns the function that cancels it."""
        return self._conn.watch_lost(callback)

    def send_error(self, err: GatewayError) -> None:
        headers = [(b"content-type", b"application/json")]
        ra = err.retry_after_header()
        if ra is not None:
            headers.append((b"retry-after", ra.encode()))
        self.send(http_status(err), headers, error_body(err))


_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
Handler = Callable[[Request, Responder], Awaitable[None]]


class ServerState:
    """Shared by every connection of one server: the limits, the handler, the open connections."""

    def __init__(self, handler: Handler, limits: ServerLimits) -> None:
        self.handler = handler
        self.limits = limits
        self.connections: set[ServerProtocol] = set()
        self.closing = False
        self.on_refused: Callable[[str], None] = lambda reason: None


class ServerProtocol(asyncio.Protocol):
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Request] = deque()
        self.current: Request | None = None
        self.busy = False
        self.dead = False
        self.stop_parsing = False
        self.read_paused = False
        self.header_bytes = 0
        self.body_bytes = 0
        self._write_ready: asyncio.Event | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._late = False
        self._on_lost: list[Callable[[], None]] = []

    def watch_lost(self, callback: Callable[[], None]) -> Callable[[], None]:
        if self.dead:
            handle = self.loop.call_soon(callback)
            return handle.cancel
        self._on_lost.append(callback)

        def cancel() -> None:
            if callback in self._on_lost:
                self._on_lost.remove(callback)

        return cancel

    # ---------------------------------------------------------------- connection
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        lim = self.state.limits
        if len(self.state.connections) >= lim.max_connections:
            self.state.on_refused(TooManyConnections.reason)
            err = TooManyConnections(f"over {lim.max_connections} open connections")
            Responder(self, keep_alive=False).send_error(err)
            self.dead = True
            # half-close and drop what the client sends for a moment, then close: closing with the
            # client's request unread would reset the connection and could lose the 503 (lingering close)
            self.stop_parsing = True
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(1.0, self.transport.close)
            return
        self.state.connections.add(self)
        self._arm(lim.header_timeout, self._header_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self.dead = True
        self.state.connections.discard(self)
        self._disarm()
        if self._write_ready is not None:
            self._write_ready.set()
        callbacks, self._on_lost = self._on_lost, []
        for cb in callbacks:
            cb()

    def pause_writing(self) -> None:
        if self._write_ready is None:
            self._write_ready = asyncio.Event()
        self._write_ready.clear()

    def resume_writing(self) -> None:
        if self._write_ready is not None:
            self._write_ready.set()

    def write(self, data: bytes) -> None:
        if not self.dead:
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the client's socket applies back-pressure, at most the body deadline: a client
        that stops reading its answer is disconnected rather than holding a pod connection for good."""
        ev = self._write_ready
        if ev is not None and not ev.is_set() and not self.dead:
            try:
                await asyncio.wait_for(ev.wait(), self.state.limits.body_timeout)
            except TimeoutError:
                self.state.on_refused("slow_reader")
                self.dead = True
                self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.stop_parsing:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(BadRequest("upgrades are not supported"))
        except httptools.HttpParserCallbackError:
            pass  # a callback already queued the refusal
        except httptools.HttpParserError:
            self._reject(BadRequest("malformed HTTP request"))

    # ---------------------------------------------------------------- timers
    def _arm(self, delay: float, cb: Callable[[], None]) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay, cb)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _header_late(self) -> None:
        self._deadline = None
        if self.busy:
            self._late = True  # checked when the answer in service completes
            return
        self.state.on_refused("header_timeout")
        self._close()

    def _body_late(self) -> None:
        self._deadline = None
        self._reject(BodyTimeout("request body not complete within the body deadline"))

    # ---------------------------------------------------------------- parser callbacks
    def on_message_begin(self) -> None:
        self.current = Request()
        self.header_bytes = 0
        self.body_bytes = 0
        if not self.busy or self._deadline is None:
            self._arm(self.state.limits.header_timeout, self._header_late)

    def on_url(self, url: bytes) -> None:
        assert self.current is not None
        self.current.url += url
        self._count_header_bytes(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self.current
        assert req is not None
        req.raw_headers.append((name, value))
        self._count_header_bytes(len(name) + len(value) + 4)
        if len(req.raw_headers) > self.state.limits.max_headers:
            self._reject(HeadersTooLarge(f"more than {self.state.limits.max_headers} headers"))
            raise _Stop

    def _count_header_bytes(self, n: int) -> None:
        self.header_bytes += n
        if self.header_bytes > self.state.limits.max_header_bytes:
            self._reject(HeadersTooLarge(f"request line and headers over {self.state.limits.max_header_bytes} bytes"))
            raise _Stop

    def on_headers_complete(self) -> None:
        req = self.current
        assert req is not None
        self._disarm()
        self._late = False  # its headers came while an earlier answer was in service: it is owed one
        p = self.parser
        req.method = p.get_method().decode("ascii", "replace")
        req.keep_alive = p.should_keep_alive() and p.get_http_version() == "1.1"
        try:
            u = httptools.parse_url(bytes(req.url))
        except httptools.HttpParserInvalidURLError:
            self._reject(BadRequest("malformed request target"))
            raise _Stop from None
        req.path = u.path.decode("latin-1")
        req.query = u.query or b""
        hd: dict[str, str] = {}
        for k, v in req.raw_headers:
            name = k.decode("latin-1").lower()
            val = v.decode("latin-1")
            hd[name] = f"{hd[name]}, {val}" if name in hd and name != "content-length" else val
        req.headers = hd
        declared = hd.get("content-length")
        if declared is not None:
            try:
                n = int(declared)
            except ValueError:
                self._reject(BadRequest("bad Content-Length"))
                raise _Stop from None
            if n > self.state.limits.max_body:
                self._reject(PayloadTooLarge(f"body of {n} bytes over {self.state.limits.max_body}"))
                raise _Stop
        if hd.get("expect", "").lower() == "100-continue" and not self.busy and not self.queue:
            # only when nothing is being answered on this connection: an interim answer must not land
            # inside an earlier request's answer (a client sends its body anyway after a short wait)
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if declared not in (None, "0") or "transfer-encoding" in hd:
            self._arm(self.state.limits.body_timeout, self._body_late)

    def on_body(self, body: bytes) -> None:
        req = self.current
        assert req is not None
        self.body_bytes += len(body)
        if self.body_bytes > self.state.limits.max_body:
            self._reject(PayloadTooLarge(f"body over {self.state.limits.max_body} bytes"))
            raise _Stop
        req.body += body

    def on_message_complete(self) -> None:
        req = self.current
        assert req is not None
        self.current = None
        self._disarm()
        self.queue.append(req)
        if len(self.queue) >= self.state.limits.max_pipelined and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()
        self._kick()

    # ---------------------------------------------------------------- serving
    def _reject(self, err: GatewayError) -> None:
        """Answer ``err`` after the requests already queued, then close; read nothing more."""
        if self.stop_parsing:
            return
        self.stop_parsing = True
        self._disarm()
        req = self.current or Request()
        self.current = None
        req.error, req.close_after, req.keep_alive = err, True, False
        self.queue.append(req)
        self._kick()

    def _kick(self) -> None:
        if self.busy or not self.queue or self.dead:
            return
        self.busy = True
        req = self.queue.popleft()
        self.loop.create_task(self._serve(req))

    async def _serve(self, req: Request) -> None:
        keep = req.keep_alive and not req.close_after and not self.state.closing
        out = Responder(self, keep, head_only=req.method == "HEAD")
        try:
            if req.error is not None:
                self.state.on_refused(req.error.reason)
                out.send_error(req.error)
            else:
                await self.state.handler(req, out)
        except Exception:  # every request one answer: a fault of the gateway is a 500
            log.exception("gateway fault")
            if not out.started:
                out.keep_alive = keep = False
                out.send(500, [(b"content-type", b"application/json")],
                         b'{"error": "gateway fault", "reason": "internal"}')
            else:
                keep = False
        self.busy = False
        if not (keep and out.keep_alive) or self.dead:
            self._close(linger=req.error is not None)
            return
        if self.read_paused and len(self.queue) < self.state.limits.max_pipelined:
            self.read_paused = False
            self.transport.resume_reading()
        if self._late and not self.queue:  # a request whose headers are still incomplete, and late
            self.state.on_refused("header_timeout")
            self._close()
            return
        if self.queue:
            self._kick()
        elif self.current is None:
            self._arm(self.state.limits.header_timeout, self._header_late)  # idle: bounded

    def _close(self, linger: bool = False) -> None:
        """Close; with ``linger`` (a refusal while the client may still be sending its body) half-close
        first and drop input for up to a second, so the refusal is not lost to a reset."""
        self.stop_parsing = True
        self._disarm()
        if self.transport is None or self.transport.is_closing():
            return
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(1.0, self.transport.close)
        else:
            self.transport.close()


class _Stop(Exception):
    """Raised from a parser callback to stop parsing (httptools wraps it)."""


async def serve(state: ServerState, host: str, port: int) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: ServerProtocol(state), host, port, backlog=2048, reuse_address=True)
