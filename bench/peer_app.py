"""What every FastAPI peer in the benchmarks shares: the app, its health routes and ``GET /stats``.

The peers (``baseline_fastapi``, ``baseline_pool``) differ only in how ``/v2/models/{name}/infer``
computes; the routes a load generator and the benchmark harness poll are the same for all of them.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse


def new_peer_app(stats: dict[str, int]) -> FastAPI:
    """A FastAPI app with ready/live health answers and ``GET /stats`` returning ``stats`` live."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/v2/health/ready")
    @app.get("/v2/health/live")
    async def ready() -> JSONResponse:
        return JSONResponse({"ready": True})

    @app.get("/stats")
    async def get_stats() -> JSONResponse:
        return JSONResponse(stats)

    return app
