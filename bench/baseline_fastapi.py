"""The baseline: a plain FastAPI server with the same stand-in model and nothing else.

It speaks the same OIP v2 path and JSON as the pod, so the same load generator drives it, and it
computes with the very same stand-in (:class:`sluiceway_pod.models.SyntheticRunner`: sleep, then
spin to exactly the service time) under one permit. What it lacks is the point of the comparison:
no queue bound, no deadline handling, no tenants or priorities. Waiters on the semaphore *are* the
queue, and a request whose client has gone is still computed.

Concurrency model: one uvicorn event loop (uvloop and httptools when installed, as for the pod);
each request awaits an ``asyncio.Semaphore(1)`` and runs the stand-in in the loop's default thread
pool (``asyncio.to_thread``), so the loop never blocks. ``GET /stats`` returns how many requests
have started and finished computing.

    python -m bench.baseline_fastapi --port 8090 --service-ms 20
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np
import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from sluiceway_pod.models import SyntheticRunner, TensorSpec

from .peer_app import new_peer_app


def build_app(service_ms: float, permits: int = 1, model_name: str = "demo") -> FastAPI:
    runner = SyntheticRunner(service_ms, [TensorSpec("INPUT0", "FP32", (-1, -1))],
                             [TensorSpec("OUTPUT0", "FP32", (-1, -1))], "cpu")
    stats = {"started": 0, "completed": 0}
    app = new_peer_app(stats)
    sem: list[asyncio.Semaphore] = []  # created on the server's loop at the first request

    @app.post("/v2/models/{name}/infer")
    async def infer(name: str, request: Request) -> Response:
        if name != model_name:
            return JSONResponse({"error": f"unknown model {name!r}"}, status_code=404)
        doc = orjson.loads(await request.body())
        inp = doc["inputs"][0]
        x = np.asarray(inp["data"], dtype=np.float32).reshape(inp["shape"])
        if not sem:
            sem.append(asyncio.Semaphore(permits))
        async with sem[0]:
            stats["started"] += 1
            out = await asyncio.to_thread(runner.predict, [{"INPUT0": x}])
            stats["completed"] += 1
        y = out[0]["OUTPUT0"]
        body = {"model_name": name, "model_version": "1", "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": list(y.shape), "data": y.ravel().tolist()}]}
        return Response(orjson.dumps(body), media_type="application/json")

    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.baseline_fastapi")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8090)
    p.add_argument("--service-ms", type=float, default=20.0)
    p.add_argument("--permits", type=int, default=1)
    ns = p.parse_args(argv)
    uvicorn.run(build_app(ns.service_ms, ns.permits), host=ns.host, port=ns.port, access_log=False,
                log_level="warning", lifespan="off")


if __name__ == "__main__":
    main()
