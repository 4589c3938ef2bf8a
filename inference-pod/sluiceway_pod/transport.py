"""The inference port's HTTP/1.1 protocol: uvicorn's httptools protocol, plus a header deadline and
answers decided on the headers alone.

**Header deadline.** A request's line and headers must arrive within ``header_timeout`` of the
connection (or of the request's first byte, or of the previous response's end); so must the rest of
a body nobody reads (a refused request's), else the connection is closed (slowloris). An idle
connection is closed at the header deadline too, whatever uvicorn's keep-alive timeout says.

**Answers on the headers** (:class:`InferenceProtocol`). A refusal of an infer request (429 token
bucket, full queue or spent body budget, 401, 403, 404, 503 not ready or draining, 400 on a bad
priority or deadline header, 413 on the declared length) is decided by
:meth:`~sluiceway_pod.fastpath.InferFastPath.before_body` when the request's headers are complete,
and the protocol writes its pre-encoded bytes to the socket there and then: no ASGI scope, request
cycle, task or ``receive``/``send`` messages. uvicorn's ASGI machinery is most of what a refusal
costs otherwise (``bench.overhead``'s 429 section measures both; docs/benchmarks.md). The request's
body, if any, is never read: the parser frames it by its ``Content-Length`` or chunks and drops it,
within the header deadline, which after such an answer also bounds how long the connection may
stay idle (``server.headerTimeoutSeconds``, not uvicorn's 30 s keep-alive: no keep-alive timer is
set per refusal). An admitted request goes on through uvicorn's ASGI cycle as before, and
what the headers decided rides along in the scope
(:data:`~sluiceway_pod.fastpath.ADMITTED_EXTENSION`), so the decision is
made once (the token bucket is charged once).

The protocol answers on the headers only when it may write at once: no earlier request on the
connection still in service (pipelining keeps answers in order), the socket not applying write
back-pressure, and uvicorn's connection/task limit not reached (its own 503 stands). Otherwise the
request takes the ASGI path, where the same decision is made. After the answer the connection is
kept alive unless the client asked to close it, the request announced ``Expect: 100-continue`` (the
body it announced may never come, and would be parsed as the next request: see
:mod:`~sluiceway_pod.fastpath`), or the server is shutting down; then it is closed.

**Start signal.** A request that asks for one (``X-Sluiceway-Start-Signal: 1``, HTTP/1.1) and goes
on through the ASGI cycle gets a callable in its scope
(:data:`~sluiceway_pod.fastpath.START_EXTENSION`) that writes ``HTTP/1.1 103 Early Hints`` with
``X-Sluiceway-Started: 1`` on the connection, at most once and only while the final answer has not
begun and the connection is open. The fast path uses it only for a request with the gateway's edge
token; the dispatcher calls it on the loop when the request starts executing. So a request refused
on its headers, or before it starts, gets no ``103``; a client without the token gets none at all.

Concurrency model: protocol callbacks run on the server's event loop, one connection per protocol
object; the decision runs inside the parser callback, synchronously, like the data plane it calls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httptools
from sluiceway_core.edge import START_SIGNAL_HEADER, STARTED_INFORMATIONAL
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from .data_plane import Admitted, Response
from .fastpath import ADMITTED_EXTENSION, START_EXTENSION, infer_model_name
from .logs import REQUEST_ID_HEADER, AccessLog, request_id

log = logging.getLogger("sluiceway.server")

#: ``(path, headers) -> decision``: a :class:`Response` to write now, what was :class:`Admitted`, or
#: ``None`` when the request is not one this decides (any path but infer).
Decide = Callable[[str, dict[str, str]], "Admitted | Response | None"]


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a deadline for each request's line and headers.

    The deadline runs from the connection (or a request's first byte) to the end of its headers; it
    is also set when a response completes (the idle connection, or the rest of a body nobody reads:
    the parser drops those bytes), so an idle connection never outlives it. When it passes and no
    request is being served, the connection is closed; when it passes while a request is in service
    (the next request's first bytes came early), it is kept and checked when that response
    completes: a late connection is closed then (issue 18, item 6).

    Setting and clearing the deadline is an assignment, not a timer per request: one timer per
    connection runs at a time; when it fires before a deadline that was moved later, it re-arms for
    the new one, and when no deadline is set it stops (the next request's first byte starts one).
    """

    header_timeout: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None
    _header_deadline_at: float | None = None

    def _arm(self) -> None:
        at = self._header_deadline_at = self.loop.time() + self.header_timeout
        if self._header_timer is None:
            self._header_timer = self.loop.call_at(at, self._header_deadline)

    def _disarm(self) -> None:
        self._header_deadline_at = None

    def _header_deadline(self) -> None:
        self._header_timer = None
        at = self._header_deadline_at
        if at is None:
            return  # the headers arrived; the next request's first byte sets a new deadline
        if self.loop.time() < at:  # moved later since this timer was armed
            self._header_timer = self.loop.call_at(at, self._header_deadline)
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # a request is in service (its body has its own deadline in the app): the passed deadline
            # is kept, and checked again when that request's response completes
            return
        self._header_deadline_at = None
        self._close_late()

    def _close_late(self) -> None:
        if not self.transport.is_closing():
            log.debug("closing a connection whose request headers did not arrive in %.1fs", self.header_timeout)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            return  # a pipelined request (its headers complete) started: in service now
        at = self._header_deadline_at
        if at is None:
            self._arm()  # idle (or the rest of an unread body): bounded by the header deadline
        elif self.loop.time() >= at:
            # the next request began while this one was in service and its headers are late
            self._header_deadline_at = None
            self._close_late()
        elif self._header_timer is None:
            self._header_timer = self.loop.call_at(at, self._header_deadline)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)


class _Event:
    def set(self) -> None:
        pass


class _Answered:
    """Stands for the request cycle of a request answered on its headers: complete, its body (if
    any) unread. uvicorn's protocol reads only these attributes of its current cycle; nothing
    writes them once the response is complete, so one instance serves every connection."""

    response_complete = True
    more_body = True
    disconnected = False
    keep_alive = True
    message_event = _Event()


_ANSWERED: Any = _Answered()
_CLOSE = b"connection: close\r\n"
_START_SIGNAL = START_SIGNAL_HEADER.encode()


def start_signal(cycle: Any) -> Callable[[], None]:
    """The start signal of the request served by uvicorn's request cycle ``cycle``: writes the
    ``103`` on its connection once, if the final answer has not begun and the connection is open.
    Called on the loop."""
    sent = False

    def started() -> None:
        nonlocal sent
        transport = cycle.transport
        if sent or cycle.response_started or cycle.disconnected or transport.is_closing():
            return
        sent = True
        transport.write(STARTED_INFORMATIONAL)

    return started


def _wire(r: Response) -> bytes:
    """The answer's own headers, ``content-length``, the blank line and the body: cached on the
    (reused) refusal, so a cached 429 is encoded once."""
    wire = r.wire
    if wire is None:
        head = b"".join(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in r.headers.items())
        wire = r.wire = b"%scontent-length: %d\r\n\r\n%s" % (head, len(r.body), r.body)
    return wire


class InferenceProtocol(HeaderDeadlineProtocol):
    """:class:`HeaderDeadlineProtocol` that answers infer requests refused on their headers itself
    (module doc). ``decide`` and ``closing`` are set on the subclass the server builds."""

    decide: Decide | None = None
    closing: Callable[[], bool] = staticmethod(lambda: False)
    access: AccessLog | None = None
    _defaults: tuple[list[tuple[bytes, bytes]], bytes] = ([], b"")


    def on_headers_complete(self) -> None:
        before = self.cycle
        self._answer_or_pass()
        cycle = self.cycle
        if cycle is before or cycle is _ANSWERED or cycle is None:
            return  # answered on the headers, or an upgrade: no request cycle of its own
        if self.parser.get_http_version() == "1.1" and (_START_SIGNAL, b"1") in self.headers:
            extensions: Any = self.scope.setdefault("extensions", {})
            extensions[START_EXTENSION] = start_signal(cycle)

    def _answer_or_pass(self) -> None:
        """Answer a refusal on the headers, or pass the request on to uvicorn's ASGI cycle."""
        decide = self.decide
        if decide is None or not self._may_answer_now():
            return super().on_headers_complete()
        if self.parser.get_method() != b"POST" or self.parser.should_upgrade():
            return super().on_headers_complete()
        raw_path = httptools.parse_url(self.url).path
        if b"%" in raw_path:  # percent-encoded: uvicorn's own decoding and the ASGI path decide
            return super().on_headers_complete()
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in self.headers}
        decided = decide(self.root_path + raw_path.decode("ascii"), headers)
        if decided is None:
            return super().on_headers_complete()
        if isinstance(decided, Admitted):
            super().on_headers_complete()
            self.scope.setdefault("extensions", {})[ADMITTED_EXTENSION] = {"admitted": decided, "headers": headers}
            return None
        self._disarm()
        keep = (
            not self.expect_100_continue
            and self.parser.get_http_version() == "1.1"
            and self.parser.should_keep_alive()
            and not self.closing()
        )
        rid = request_id(headers.get(REQUEST_ID_HEADER))  # validated: no CR/LF can get in
        self.transport.write(
            b"".join(
                (
                    STATUS_LINE[decided.status],
                    self._default_headers(),
                    b"x-request-id: %s\r\n" % rid.encode("ascii"),
                    b"" if keep else _CLOSE,
                    _wire(decided),
                )
            )
        )
        access = self.access
        if access is not None and access.sampled():
            declared = headers.get("content-length", "")
            access.emit(
                model=infer_model_name(raw_path.decode("ascii")) or "-",
                tenant=decided.tenant,
                status=decided.status,
                reason=decided.reason,
                queue_wait_ms=None,
                exec_ms=None,
                request_id=rid,
                bytes_in=int(declared) if declared.isdigit() else 0,
                bytes_out=len(decided.body),
            )
        self.cycle = _ANSWERED
        self.server_state.total_requests += 1
        if keep:
            # what uvicorn's on_response_complete does, less its keep-alive timer (a timer per
            # request): the header deadline bounds the unread body and the idle connection instead
            self.flow.resume_reading()
            self._arm()
        else:
            self.transport.close()
        return None

    def _may_answer_now(self) -> bool:
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            return False  # an earlier request on this connection is still being answered
        if self.flow.write_paused:
            return False
        limit = self.limit_concurrency
        return limit is None or (len(self.connections) < limit and len(self.tasks) < limit)

    def _default_headers(self) -> bytes:
        """uvicorn's ``date`` and ``server`` headers; uvicorn replaces the list once a second."""
        current = self.server_state.default_headers
        cached, encoded = InferenceProtocol._defaults
        if cached is not current:
            encoded = b"".join(b"%s: %s\r\n" % kv for kv in current)
            InferenceProtocol._defaults = (current, encoded)
        return encoded


def inference_protocol(header_timeout: float, decide: Decide | None = None,
                       closing: Callable[[], bool] | None = None,
                       access: AccessLog | None = None) -> type[InferenceProtocol]:
    """The protocol class for uvicorn's ``http=`` setting. Without ``decide`` it answers nothing on
    the headers (the header deadline only). With ``access``, the refusals it writes are sampled into
    the access log too."""
    attrs: dict[str, Any] = {
        "header_timeout": header_timeout,
        "decide": staticmethod(decide) if decide else None,
        "access": access,
    }
    if closing is not None:
        attrs["closing"] = staticmethod(closing)
    return type("InferenceProtocol", (InferenceProtocol,), attrs)
