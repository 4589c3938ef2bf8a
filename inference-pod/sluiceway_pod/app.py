"""The HTTP adapters: the inference app (Open Inference Protocol v2) and the admin app (``/metrics``).

Only translation happens here: bytes and headers go to :class:`~sluiceway_pod.data_plane.DataPlane`
and its :class:`~sluiceway_pod.data_plane.Response` comes back. Status codes are decided once, in
:mod:`sluiceway_pod.errors`. Both apps run on the uvicorn event loop that also owns the data plane.

Two ports (as Triton does): the inference port (``server.port``, container port ``http``) serves the
protocol and the health probes; the metrics port (``server.metricsPort``, container port ``metrics``,
not exposed to tenants by the Service) serves ``/metrics`` and the health probes again, outside the
inference port's connection limit.

The infer request itself (``POST /v2/models/{name}[/versions/{v}]/infer``) never reaches FastAPI:
:class:`~sluiceway_pod.fastpath.InferFastPath` answers it on raw ASGI (its order of work: the
declared ``Content-Length`` (413), then everything the headers decide, then the body within
``server.bodyTimeoutSeconds`` (408)); every other request goes on to the FastAPI app built here.
Served by the pod, an infer request refused on its headers does not reach ASGI either: the transport
(:class:`~sluiceway_pod.transport.InferenceProtocol`) asks the fast path for the decision when the
headers are complete and writes the refusal itself.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import __version__
from .data_plane import DataPlane, error_response
from .errors import ModelNotFound, SluicewayError
from .fastpath import InferFastPath
from .logs import request_id
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
    (to other replicas) instead of reusing one this pod is about to close: no reset connections.
    Every response carries the request's ``X-Request-Id`` (the client's, when acceptable, or a new
    one: :mod:`sluiceway_pod.logs`)."""

    def __init__(self, app: ASGIApp, plane: DataPlane) -> None:
        self.app = app
        self.plane = plane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        rid: bytes | None = None
        for k, v in scope["headers"]:
            if k == b"x-request-id":
                rid = v
        rid = request_id(rid.decode("latin-1") if rid is not None else None).encode("ascii")

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [(b"x-request-id", rid)]
                if self.plane.shutting_down:
                    extra.append((b"connection", b"close"))
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_closing)


def build_app(plane: DataPlane) -> InferFastPath:
    """The inference port: health, server and model metadata, infer."""
    app = FastAPI(title="sluiceway-pod", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
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

    # POST .../infer is answered by the fast path (sluiceway_pod.fastpath), before FastAPI; it adds
    # ``Connection: close`` itself while shutting down, so only FastAPI's answers need the wrapper
    return InferFastPath(CloseWhileShuttingDown(app, plane), plane)


def build_admin_app(plane: DataPlane, registry: CollectorRegistry) -> FastAPI:
    """The metrics port: ``/metrics``, the health probes, ``/openapi.json`` and ``/debug/start`` (the
    start phases), nothing a tenant calls."""
    app = FastAPI(title="sluiceway-pod-admin", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    _add_probes(app, plane)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/debug/start")
    async def start_phases() -> JSONResponse:
        """How long each phase of this pod's start took (:mod:`sluiceway_pod.startphases`)."""
        return JSONResponse(plane.phases.document())

    @app.get("/openapi.json")
    async def openapi() -> JSONResponse:
        """The inference port's API (for fuzzers and clients), once the model is loaded."""
        inputs = plane.runner.inputs if plane.runner is not None else []
        return JSONResponse(openapi_document(plane.model_name, inputs))

    return app
