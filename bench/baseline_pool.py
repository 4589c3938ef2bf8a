"""Thread-pool peers: a plain FastAPI server running a model in a thread pool, with or without the
seed's guard.

* ``--guard none``: the seed's *before* design: a ``ThreadPoolExecutor(threads)`` and nothing
  guarding device memory; every request that arrives is computed (the pool's own queue is
  unbounded).
* ``--guard semaphore``: the seed's *after* design (the FastAPI article's fix): an
  ``asyncio.Semaphore(threads)`` acquired with a ``--acquire-timeout`` (30 s) before the request
  enters a thread pool of the same size; a request that cannot acquire it in time gets 503.

The model is any pod model spec (``synthetic:<ms>``, ``demo``, ``module:factory``), loaded with the
pod's own :func:`sluiceway_pod.models.load_runner`, so the computation is identical to the pod's.
A device OOM (``DeviceOOMSignal``) is answered 500 with ``reason: oom`` and counted. ``GET /stats``
returns requests started, completed and failed with OOM.

Concurrency model: one uvicorn event loop; the model runs in the pool's worker threads.

    python -m bench.baseline_pool --port 8092 --spec synthetic:20 --threads 1 --guard semaphore
"""

from __future__ import annotations

import argparse
import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from sluiceway_pod.models import DTYPES, DeviceOOMSignal, load_runner, oip_datatype

from .peer_app import new_peer_app


def build_app(spec: str, threads: int, guard: str, acquire_timeout: float = 30.0, model_name: str = "demo",
              device: str | None = None) -> FastAPI:
    runner = load_runner(spec, device)
    pool = ThreadPoolExecutor(threads, thread_name_prefix="baseline")
    stats = {"started": 0, "completed": 0, "oom": 0, "refused": 0}
    app = new_peer_app(stats)
    sem: list[asyncio.Semaphore] = []  # created on the server's loop at the first request

    @app.post("/v2/models/{name}/infer")
    async def infer(name: str, request: Request) -> Response:
        if name != model_name:
            return JSONResponse({"error": f"unknown model {name!r}"}, status_code=404)
        doc = orjson.loads(await request.body())
        inputs: dict[str, Any] = {
            t["name"]: np.asarray(t["data"], dtype=DTYPES[t["datatype"]]).reshape(t["shape"]) for t in doc["inputs"]
        }
        loop = asyncio.get_running_loop()
        if guard == "semaphore":
            if not sem:
                sem.append(asyncio.Semaphore(threads))
            try:
                async with asyncio.timeout(acquire_timeout):
                    await sem[0].acquire()
            except TimeoutError:
                stats["refused"] += 1
                return JSONResponse({"error": "server busy", "reason": "acquire_timeout"}, status_code=503)
        try:
            stats["started"] += 1
            out = await loop.run_in_executor(pool, runner.predict, [inputs])
            stats["completed"] += 1
        except DeviceOOMSignal as e:
            stats["oom"] += 1
            return JSONResponse({"error": f"out of memory: {e}"[:200], "reason": "oom"}, status_code=500)
        finally:
            if guard == "semaphore":
                sem[0].release()
        outputs = [{"name": k, "datatype": oip_datatype(v), "shape": list(v.shape), "data": v.ravel().tolist()}
                   for k, v in out[0].items()]
        body = {"model_name": name, "model_version": "1", "outputs": outputs}
        return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")

    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.baseline_pool")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8092)
    p.add_argument("--spec", default="synthetic:20", help="a pod model spec")
    p.add_argument("--model-name", default="demo")
    p.add_argument("--device", default=None, help="cuda / cpu (default: the pod's choice)")
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--guard", choices=("none", "semaphore"), default="none")
    p.add_argument("--acquire-timeout", type=float, default=30.0)
    ns = p.parse_args(argv)
    app = build_app(ns.spec, ns.threads, ns.guard, ns.acquire_timeout, ns.model_name, ns.device)
    uvicorn.run(app, host=ns.host, port=ns.port, access_log=False, log_level="warning", lifespan="off")


if __name__ == "__main__":
    main()
