"""The HTTP adapter: FastAPI routes for the Open Inference Protocol v2 and ``/metrics``.

Only translation happens here: bytes and headers go to :class:`~sluiceway_pod.data_plane.DataPlane`
and its :class:`~sluiceway_pod.data_plane.Response` comes back. Status codes are decided once, in
:mod:`sluiceway_pod.errors`. Runs on the uvicorn event loop that also owns the data plane.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import ClientDisconnect

from . import __version__
from .data_plane import DataPlane, error_response
from .errors import ClientGone, ModelNotFound, PayloadTooLarge


def _reply(r: Any) -> Response:
    return Response(content=r.body, status_code=r.status, headers=r.headers)


def build_app(plane: DataPlane, registry: CollectorRegistry) -> FastAPI:
    app = FastAPI(title="sluiceway-pod", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    limit = plane.config.server.max_body_bytes

    @app.get("/v2/health/live")
    async def live() -> JSONResponse:
        return JSONResponse({"live": True})

    @app.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        return JSONResponse({"ready": plane.ready}, status_code=200 if plane.ready else 503)

    @app.get("/v2")
    async def server_metadata() -> JSONResponse:
        return JSONResponse({"name": "sluiceway", "version": __version__, "extensions": ["binary_tensor_data"]})

    def _known(name: str) -> None:
        if name != plane.model_name:
            raise ModelNotFound(f"model {name!r} is not served here")

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None) -> Response:
        try:
            _known(name)
        except ModelNotFound as e:
            return _reply(error_response(e))
        return JSONResponse(plane.metadata())

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None) -> Response:
        try:
            _known(name)
        except ModelNotFound as e:
            return _reply(error_response(e))
        return JSONResponse({"name": name, "ready": plane.ready}, status_code=200 if plane.ready else 503)

    @app.post("/v2/models/{name}/infer")
    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer(name: str, request: Request, version: str | None = None) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return _reply(plane.refuse(PayloadTooLarge(f"body of {declared} bytes exceeds {limit}")))
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    return _reply(plane.refuse(PayloadTooLarge(f"body exceeds {limit} bytes")))
                chunks.append(chunk)
        except ClientDisconnect:
            return _reply(plane.refuse(ClientGone("the client disconnected while sending the body")))

        async def disconnected() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    return

        headers = {k.lower(): v for k, v in request.headers.items()}
        result = await plane.infer(name, b"".join(chunks), headers, disconnected)
        return _reply(result)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
