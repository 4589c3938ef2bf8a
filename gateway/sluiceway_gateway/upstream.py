"""Pooled HTTP/1.1 keep-alive connections to the pods (httptools' response parser on asyncio).

A :class:`UpstreamConn` carries one request at a time. :meth:`Pool.acquire` reuses the most recently
released connection to a pod (LIFO) if it was idle for less than ``idle_seconds`` (well under the
pod's own keep-alive and header deadlines, so the pod never closes a connection the gateway is about
to reuse), else connects within ``connect_timeout``. A connect failure raises :class:`ConnectFailed`:
nothing was sent, so the request may go elsewhere. A connection lost after the request was written
raises :class:`Lost` (the pod may have started it).

Informational answers (1xx but ``101``) are skipped, as HTTP/1.1 requires of a client: the caller
sees only the final answer. One that carries ``X-Sluiceway-Started`` (the pod's start signal, asked
for with ``start_signal=True``: :mod:`sluiceway_core.edge`) sets :attr:`UpstreamConn.started`, so
when the connection dies before the final answer :attr:`UpstreamConn.unstarted` tells a request the
pod had only queued (safe to send elsewhere) from one it was running.

The response body is streamed: chunks wait in a bounded buffer (``high_water`` bytes, then the pod's
socket stops being read) until the consumer takes them with :meth:`UpstreamResponse.chunks`.

Concurrency model: asyncio protocol callbacks on the gateway's event loop; one request per connection
at a time; the pool is owned by the loop.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable

import httptools
from sluiceway_core.edge import STARTED_HEADER


class ConnectFailed(Exception):
    """The connection to the pod could not be opened: the request was not sent."""


class Lost(Exception):
    """The pod's connection closed or broke after the request was sent."""


_STARTED = STARTED_HEADER.encode()


class UpstreamResponse:
    def __init__(self, conn: UpstreamConn) -> None:
        self._conn = conn
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunked = False
        self.content_length: int | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        c = self._conn
        while True:
            while c.body:
                chunk = c.body.popleft()
                c.buffered -= len(chunk)
                if c.reading_paused and c.buffered < c.high_water // 2:
                    c.reading_paused = False
                    c.transport.resume_reading()
                yield chunk
            if c.complete:
                return
            if c.error is not None:
                raise c.error
            c.wake = asyncio.get_running_loop().create_future()
            await c.wake

    def complete_body(self) -> bytes | None:
        """The whole body when it has already arrived (a small answer usually comes in one read), else
        ``None``: no await, no task."""
        c = self._conn
        if not c.complete:
            return None
        out = b"".join(c.body)
        c.body.clear()
        c.buffered = 0
        return out

    async def read_all(self, limit: int) -> bytes:
        out = bytearray()
        async for chunk in self.chunks():
            out += chunk
            if len(out) > limit:
                raise Lost(f"pod answer over {limit} bytes")
        return bytes(out)


class UpstreamConn(asyncio.Protocol):
    high_water = 256 * 1024

    def __init__(self, key: str, loop: asyncio.AbstractEventLoop) -> None:
        self.key = key
        self.loop = loop
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.head_request = False
        self._reset()

    def _reset(self) -> None:
        self.response: UpstreamResponse | None = None
        self.head: asyncio.Future[UpstreamResponse] | None = None
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.reading_paused = False
        self.complete = False
        self.error: Exception | None = None
        self.wake: asyncio.Future[None] | None = None
        self.keep_alive = False
        self._headers: list[tuple[bytes, bytes]] = []
        #: the pod was asked for its start signal / sent it (a 1xx with ``X-Sluiceway-Started``)
        self.signalled = False
        self.started = False
        self._informational = False  # the message being parsed is a 1xx: skipped

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.head is None:  # bytes nobody asked for: the connection is not reusable
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(Lost("pod answered with an upgrade"))
        except httptools.HttpParserError as err:
            self._fail(Lost(f"pod answer unparsable: {err}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.head is not None and not self.complete and not self.head_request:
            self._fail(Lost("pod connection closed before the answer was complete"))

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        r = self.response
        assert r is not None and self.head is not None
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # informational: skipped (101 is an upgrade: refused)
            self._informational = True
            if any(k == _STARTED for k, _ in self._headers):
                self.started = True
            self._headers = []
            return
        r.status = status
        r.headers = self._headers
        if self.head_request:
            # an answer to HEAD has no body whatever its content-length says; the parser cannot be
            # told so, so the answer ends here and the connection is not reused
            self.keep_alive = False
            self.complete = True
            self.head_request = False
            self.close()
        if not self.head.done():
            self.head.set_result(r)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered >= self.high_water and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._informational:  # the final answer is still to come
            self._informational = False
            return
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True
        self._wake()

    # -- helpers
    def _wake(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    def _fail(self, err: Exception) -> None:
        self.error = err
        if self.head is not None and not self.head.done():
            self.head.set_exception(err)
        self._wake()
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def send(self, data: bytes, head_request: bool = False,
             start_signal: bool = False) -> asyncio.Future[UpstreamResponse]:
        """Write the request; ``start_signal``: ``data`` asks the pod for its start signal."""
        self._reset()
        self.signalled = start_signal
        self.head_request = head_request
        self.response = UpstreamResponse(self)
        self.head = self.loop.create_future()
        self.head.add_done_callback(_consume)
        self.transport.write(data)
        return self.head

    @property
    def unstarted(self) -> bool:
        """The pod was asked for its start signal and has not sent it: it had not started the request."""
        return self.signalled and not self.started

    @property
    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and not self.transport.is_closing()


def _consume(fut: asyncio.Future[UpstreamResponse]) -> None:
    if not fut.cancelled():
        fut.exception()  # never "exception was never retrieved"


class Pool:
    """Idle keep-alive connections per pod, LIFO, bounded by ``max_idle`` per pod."""

    def __init__(self, connect_timeout: float, idle_seconds: float, max_idle: int,
                 clock: Callable[[], float]) -> None:
        self.connect_timeout = connect_timeout
        self.idle_seconds = idle_seconds
        self.max_idle = max_idle
        self._clock = clock
        self._idle: dict[str, list[UpstreamConn]] = {}

    def idle(self, key: str) -> UpstreamConn | None:
        """A pooled connection to reuse now, or ``None`` (then :meth:`connect`)."""
        idle = self._idle.get(key)
        now = self._clock()
        while idle:
            conn = idle.pop()
            if not conn.closed and not conn.transport.is_closing() and now - conn.idle_since < self.idle_seconds:
                return conn
            conn.close()
        return None

    async def acquire(self, key: str, host: str, port: int) -> UpstreamConn:
        return self.idle(key) or await self.connect(key, host, port)

    async def connect(self, key: str, host: str, port: int) -> UpstreamConn:
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(lambda: UpstreamConn(key, loop), host, port), self.connect_timeout
            )
        except (OSError, TimeoutError) as err:
            raise ConnectFailed(f"connect to {host}:{port}: {err or type(err).__name__}") from None
        return proto

    def release(self, conn: UpstreamConn) -> None:
        if not conn.reusable:
            conn.close()
            return
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle:
            conn.close()
            return
        conn.head = None
        conn.idle_since = self._clock()
        idle.append(conn)

    def forget(self, key: str) -> None:
        for conn in self._idle.pop(key, []):
            conn.close()

    def close(self) -> None:
        for key in list(self._idle):
            self.forget(key)
