"""The infer request on raw ASGI: the one hot path, without FastAPI's per-request machinery.

A profile of the pod serving a no-op model (``bench/overhead.py``, docs/benchmarks.md) put about
two thirds of the event loop's time per request in FastAPI/Starlette itself (route matching over
every route, dependency solving for the path parameters, ``Request``/``Response`` objects), more
than decoding, admission and metrics together. :class:`InferFastPath` answers
``/v2/models/{name}[/versions/{version}]/infer`` directly (POST; any other method gets 405) and
hands every other request to the wrapped (FastAPI) app, which has no infer route.

The order of work: the declared
``Content-Length`` (413), then everything the headers decide
(:meth:`~sluiceway_pod.data_plane.DataPlane.admit_headers`), and only then the body, read within
``server.bodyTimeoutSeconds`` (408); a refusal returns before the body is read.

A refusal never awaits the body. The connection stays open: uvicorn's parser (httptools) still
frames the request by its ``Content-Length`` or chunks and drops the unread bytes once the answer is
complete (:class:`~sluiceway_pod.transport.HeaderDeadlineProtocol` bounds how long that may take), so
they cannot be read as the next request. The one exception is a request that announced
``Expect: 100-continue``: no ``100 Continue`` was sent, so the client may never send the body its
headers announced, and the next request would be parsed as that body; such a refusal carries
``Connection: close``.

The start signal: for a request the gateway vouched for (its edge token:
:attr:`~sluiceway_pod.data_plane.Admitted.edge`) that asked for it (``X-Sluiceway-Start-Signal: 1``),
the protocol puts a callable in the scope (:data:`START_EXTENSION`) that writes an HTTP/1.1 ``103``
with ``X-Sluiceway-Started: 1``; this path hands it to the data plane, which calls it when the
request starts executing. Without the edge token the callable is never used: a direct client gets
no informational answer whatever it sends.

Concurrency model: runs on the server's event loop, like the data plane it calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .data_plane import Admitted, DataPlane, Response
from .errors import BodyTimeout, ClientGone, PayloadTooLarge
from .logs import REQUEST_ID, REQUEST_ID_HEADER, request_id

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def infer_model_name(path: str) -> str | None:
    """``name`` from ``/v2/models/{name}/infer`` or ``/v2/models/{name}/versions/{v}/infer``."""
    if not path.startswith("/v2/models/") or not path.endswith("/infer"):
        return None
    parts = path[len("/v2/models/") : -len("/infer")].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0]
    if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
        return parts[0]
    return None


#: The ASGI scope extension in which the transport hands on what it decided on the headers of an
#: admitted infer request: ``{"admitted": Admitted, "headers": headers}``, the headers as a ``str``
#: dict with lower-case names.
ADMITTED_EXTENSION = "sluiceway.admitted"

#: The ASGI scope extension in which the transport puts the start signal of a request that asked for
#: one (``X-Sluiceway-Start-Signal: 1`` on HTTP/1.1): a ``() -> None`` to call on the loop when the
#: request starts executing, which writes the ``103`` on its connection (at most once, and only while
#: the final answer has not begun). Used only for a request with the gateway's edge token.
START_EXTENSION = "sluiceway.start_signal"

_NOT_ALLOWED = {"content-type": "application/json", "allow": "POST"}

#: Encoded header pairs of the answers the fast path sends most (every refusal, every JSON answer).
_ENCODED: dict[tuple[str, str], tuple[bytes, bytes]] = {
    ("content-type", "application/json"): (b"content-type", b"application/json"),
    **{("retry-after", str(s)): (b"retry-after", str(s).encode()) for s in range(1, 61)},
}
_CLOSE = (b"connection", b"close")
_RID = b"x-request-id"


class _Disconnected(Exception):
    pass


class InferFastPath:
    def __init__(self, app: ASGIApp, plane: DataPlane) -> None:
        self.app = app
        self.plane = plane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            name = infer_model_name(scope["path"])
            if name is not None:
                closing = self.plane.shutting_down
                if scope["method"] == "POST":
                    await self._post(name, scope, receive, send, closing)
                    return
                # the infer paths take POST only (as a FastAPI route would answer)
                r = Response(405, b'{"detail":"Method Not Allowed"}', dict(_NOT_ALLOWED))
                rid = _scope_request_id(scope)
                await _send(send, r, closing, self.plane.load_headers(), rid)
                return
        await self.app(scope, receive, send)

    async def _post(self, name: str, scope: Scope, receive: Receive, send: Send, closing: bool) -> None:
        """One infer request: decide (or take the transport's decision), read, answer; the request
        id, the access log line and the span (when on) around it."""
        plane = self.plane
        extensions = scope.get("extensions")
        early = extensions.get(ADMITTED_EXTENSION) if extensions else None
        if early is not None:  # the transport decided on the headers (it answers refusals)
            decided, headers = early["admitted"], early["headers"]
        else:
            # ASGI header names are lower-case bytes; a repeated header keeps its last
            # value, as the dict the FastAPI route builds does
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            decided = self._before_body(name, headers)
        rid = request_id(headers.get(REQUEST_ID_HEADER))
        token = REQUEST_ID.set(rid)
        tracer, span = plane.tracer, None
        r: Response | None = None
        try:
            if isinstance(decided, Admitted):
                if tracer is not None:
                    span = tracer.start(headers)
                start = extensions.get(START_EXTENSION) if extensions and decided.edge else None
                r = await self._infer(decided, headers, receive, start)
            else:
                r = decided
                if headers.get("expect", "").lower() == "100-continue":
                    closing = True  # the announced body may never come: see the module doc
            await _send(send, r, closing, plane.load_headers(), rid)
        finally:
            REQUEST_ID.reset(token)
            if span is not None and r is None:  # cancelled or failed before an answer: end it anyway
                span.end()
        assert r is not None
        adm = decided if isinstance(decided, Admitted) else None
        if span is not None and adm is not None and tracer is not None:
            tracer.finish(
                span,
                status=r.status,
                tenant=adm.tenant.label,
                reason=r.reason,
                request_id=rid,
                enqueued=adm.enqueued,
                dispatched=adm.dispatched,
                finished=adm.finished,
            )
        access = plane.access
        if access is not None and access.sampled():
            log_access(plane, name, r, adm, rid, headers)

    def before_body(self, path: str, headers: dict[str, str]) -> Admitted | Response | None:
        """What the headers of a POST to ``path`` decide (:meth:`_before_body`), or ``None`` when
        ``path`` is not an infer path. :class:`~sluiceway_pod.transport.InferenceProtocol` calls this
        when a request's headers are complete, writes a refusal itself, and passes an admission on
        in the scope (:data:`ADMITTED_EXTENSION`)."""
        name = infer_model_name(path)
        return None if name is None else self._before_body(name, headers)

    def _before_body(self, name: str, headers: dict[str, str]) -> Admitted | Response:
        """What is decided before the body is read: a 413 on the declared length (over
        ``server.maxBodyBytes`` or what the inputs' ``maxShape`` allows), a 429 ``body_budget`` when
        the declared length does not fit the pod's budget for bodies in flight, a refusal on the
        headers (counted and answered), or the admission so far, holding its declared length of
        the budget (``Admitted.held``). Nothing is awaited."""
        plane = self.plane
        declared = headers.get("content-length")
        n = int(declared) if declared is not None and declared.isdigit() else 0
        if n:
            if n > plane.body_limit:
                return plane.refuse(
                    PayloadTooLarge(f"body of {declared} bytes exceeds {plane.body_limit} ({plane.body_limit_why})")
                )
            if not plane.bodies.fits(n):  # checked before the token bucket is charged
                return plane.body_budget_spent()
        decided = plane.admit_headers(name, headers)
        if n and isinstance(decided, Admitted):
            plane.bodies.take(decided, n)  # fits: nothing ran since the check
        return decided

    async def _infer(
        self, admitted: Admitted, headers: dict[str, str], receive: Receive, on_start: Callable[[], None] | None = None
    ) -> Response:
        """Read the body (within ``server.bodyTimeoutSeconds``), then decode, admit and answer.
        What the request holds of the body budget is given back exactly once on every path
        (:meth:`~sluiceway_pod.data_plane.BodyBudget.release` is idempotent; this ``finally`` also
        covers a refusal while reading and a cancelled task)."""
        plane = self.plane
        try:
            box = await self._read(admitted, receive)
            if isinstance(box, Response):
                return box

            async def disconnected() -> None:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return

            return await plane.infer_body(admitted, box, headers, disconnected, on_start)
        finally:
            plane.bodies.release(admitted)

    async def _read(self, admitted: Admitted, receive: Receive) -> list[bytes] | Response:
        """The body, boxed (:meth:`~sluiceway_pod.data_plane.DataPlane.infer_body`), or the refusal:
        413 over the limit, 429 ``body_budget`` when a chunked body outgrows the budget (a declared
        length was reserved at the headers), 499 client gone, 408 too slow."""
        plane = self.plane
        server = plane.config.server
        limit, bodies = plane.body_limit, plane.bodies
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(server.body_timeout_seconds):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise _Disconnected
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        return plane.refuse(PayloadTooLarge(f"body exceeds {limit} bytes ({plane.body_limit_why})"))
                    if size > admitted.held and not bodies.take(admitted, size - admitted.held):
                        return plane.body_budget_spent()
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except _Disconnected:
            return plane.refuse(ClientGone("the client disconnected while sending the body"))
        except TimeoutError:
            return plane.refuse(
                BodyTimeout(f"the request body did not arrive within {server.body_timeout_seconds:g}s")
            )
        box = [chunks[0] if len(chunks) == 1 else b"".join(chunks)]
        chunks.clear()
        return box


def _scope_request_id(scope: Scope) -> str:
    raw = None
    for k, v in scope["headers"]:
        if k == b"x-request-id":
            raw = v.decode("latin-1")
    return request_id(raw)


def log_access(
    plane: DataPlane, model: str, r: Response, adm: Admitted | None, rid: str, headers: dict[str, str]
) -> None:
    """One access log line (:mod:`sluiceway_pod.logs`) for an infer request's answer ``r``."""
    access = plane.access
    assert access is not None
    declared = headers.get("content-length", "")
    queue_ms = exec_ms = None
    if adm is not None and adm.enqueued:
        end_q = adm.dispatched or adm.finished
        queue_ms = (end_q - adm.enqueued) * 1000.0 if end_q else None
        if adm.dispatched and adm.finished:
            exec_ms = (adm.finished - adm.dispatched) * 1000.0
    access.emit(
        model=model,
        tenant=adm.tenant.label if adm is not None else r.tenant,
        status=r.status,
        reason=r.reason,
        queue_wait_ms=queue_ms,
        exec_ms=exec_ms,
        request_id=rid,
        bytes_in=int(declared) if declared.isdigit() else 0,
        bytes_out=len(r.body),
    )


async def _send(
    send: Send,
    r: Response,
    closing: bool,
    load: list[tuple[bytes, bytes]] | None = None,
    rid: str | None = None,
) -> None:
    raw = r.encoded
    if raw is None:
        raw = [_ENCODED.get(kv) or (kv[0].encode("latin-1"), kv[1].encode("latin-1")) for kv in r.headers.items()]
        raw.append((b"content-length", b"%d" % len(r.body)))
        r.encoded = raw
    if load is not None or rid is not None:  # a fresh list: ``r.encoded`` may be a cached refusal's
        raw = raw + load if load is not None else [*raw]
        if rid is not None:
            raw.append((_RID, rid.encode("latin-1")))
        if closing:
            raw.append(_CLOSE)
    elif closing:  # after SIGTERM (clients reconnect to other replicas, see app.CloseWhileShuttingDown),
        raw = [*raw, _CLOSE]  # or a refused request whose announced body may never come
    await send({"type": "http.response.start", "status": r.status, "headers": raw})
    await send({"type": "http.response.body", "body": r.body})
