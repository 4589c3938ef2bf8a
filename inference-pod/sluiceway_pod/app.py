"""The HTTP adapters: the inference app (Open Inference Protocol v2) and the admin app (``/metrics``).

Only translation happens here: bytes and headers go to :class:`~sluiceway_pod.data_plane.DataPlane`
and its :class:`~sluiceway_pod.data_plane.Response` comes back. Status codes are decided once, in
:mod:`sluiceway_pod.errors`. Both apps run on the uvicorn event loop that also owns the data plane.

Two ports (as Triton does): the inference port (``server.port``, container port ``http``) serves the
protocol and the health probes; the metrics port (``server.metricsPort``, container port ``metrics``,
not exposed to tenants by the Service) serves ``/metrics`` and the health probes again, outside the
inference port's connection limit.

Order of work for an infer request: the declared ``Content-Length`` (413), then everything the
headers decide (:meth:`~sluiceway_pod.data_plane.DataPlane.admit_headers`: key, model, priority,
token bucket, queue room) and only then the body, read within ``server.bodyTimeoutSeconds`` (408). A
refusal returns before the body is read; uvicorn discards the rest of it without buffering.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import __version__
from .data_plane import Admitted, DataPlane, error_response
from .errors import BodyTimeout, ClientGone, ModelNotFound, PayloadTooLarge, SluicewayError
from .fastpath import InferFastPath
from .openapi import openapi_document


def _reply(r: Any) -> Response:
    return Response(content=r.body, status_code=r.status, headers=r.headers)


def _add_probes(app: FastAPI, plane: DataPlane) -> None:
    @app.get("/v2/health/live")
    async def live() -> JSONResponse:
        ok, reason = plane.liveness()
        doc: dict[str, Any] = {"live": ok}
        if reason is not None:
            doc["reason"] = reason
        return JSONResponse(doc, status_code=200 if ok else 503)

    @app.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        ok = plane.readiness()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


class CloseWhileShuttingDown:
    """After SIGTERM every response carries ``Connection: close``, so clients open fresh connections
    (to other replicas) instead of reusing one this pod is about to close: no reset connections."""

    def __init__(self, app: ASGIApp, plane: DataPlane) -> None:
        self.app = app
        self.plane = plane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start" and self.plane.shutting_down:
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_closing)


def build_app(plane: DataPlane) -> ASGIApp:
    """The inference port: health, server and model metadata, infer."""
    app = FastAPI(title="sluiceway-pod", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    limit = plane.config.server.max_body_bytes
    body_timeout = plane.config.server.body_timeout_seconds
    _add_probes(app, plane)

    @app.get("/v2")
    async def server_metadata() -> JSONResponse:
        return JSONResponse({"name": "sluiceway", "version": __version__, "extensions": ["binary_tensor_data"]})

    def _known(request: Request, name: str) -> None:
        """Authenticate first: nobody learns which model is served before presenting a key."""
        plane.tenants.authenticate(request.headers.get("authorization"))
        if name != plane.model_name:
            raise ModelNotFound(f"model {name!r} is not served here")

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, request: Request, version: str | None = None) -> Response:
        try:
            _known(request, name)
        except SluicewayError as e:
            return _reply(error_response(e))
        return JSONResponse(plane.metadata())

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, request: Request, version: str | None = None) -> Response:
        try:
            _known(request, name)
        except SluicewayError as e:
            return _reply(error_response(e))
        ok = plane.readiness()
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    @app.post("/v2/models/{name}/infer")
    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer(name: str, request: Request, version: str | None = None) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return _reply(plane.refuse(PayloadTooLarge(f"body of {declared} bytes exceeds {limit}")))
        headers = {k.lower(): v for k, v in request.headers.items()}
        admitted = plane.admit_headers(name, headers)
        if not isinstance(admitted, Admitted):  # refused on the headers: the body is never read
            return _reply(admitted)
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(body_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        return _reply(plane.refuse(PayloadTooLarge(f"body exceeds {limit} bytes")))
                    chunks.append(chunk)
        except ClientDisconnect:
            return _reply(plane.refuse(ClientGone("the client disconnected while sending the body")))
        except TimeoutError:
            return _reply(plane.refuse(BodyTimeout(f"the request body did not arrive within {body_timeout:g}s")))

        async def disconnected() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    return

        result = await plane.infer_body(admitted, b"".join(chunks), headers, disconnected)
        return _reply(result)

    # the infer route itself is served by the fast path (same order of work, no FastAPI per request)
    return CloseWhileShuttingDown(InferFastPath(app, plane), plane)


def build_admin_app(plane: DataPlane, registry: CollectorRegistry) -> FastAPI:
    """The metrics port: ``/metrics``, the health probes and ``/openapi.json``, nothing a tenant calls."""
    app = FastAPI(title="sluiceway-pod-admin", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    _add_probes(app, plane)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json")
    async def openapi() -> JSONResponse:
        """The inference port's API (for fuzzers and clients), once the model is loaded."""
        inputs = plane.runner.inputs if plane.runner is not None else []
        return JSONResponse(openapi_document(plane.model_name, inputs))

    return app
