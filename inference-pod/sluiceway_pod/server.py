"""Process lifecycle: uvicorn on one event loop, warm-up in the background, drain on SIGTERM.

Concurrency model: everything runs on the main thread's asyncio loop (uvicorn's), plus the
device worker threads owned by the dispatcher. Signals are handled on the loop
(``loop.add_signal_handler``): the first SIGTERM/SIGINT turns readiness off and refuses new
requests with 503 while queued and running ones finish (at most ``server.drainSeconds``); then
uvicorn closes its sockets and the process exits 0. A second SIGINT forces an immediate exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Generator

import uvicorn
from prometheus_client import CollectorRegistry, disable_created_metrics
from sluiceway_core.config import PodConfig

from .app import build_app
from .data_plane import DataPlane
from .metrics import PodMetrics

log = logging.getLogger("sluiceway.server")


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, plane: DataPlane) -> None:
        super().__init__(config)
        self.plane = plane
        self.exit_code = 0
        self.drain_complete = True
        self._drain_task: asyncio.Task[None] | None = None
        self._start_task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            yield
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        if self._drain_task is not None:
            if sig == signal.SIGINT:
                self.force_exit = True
                self.should_exit = True
            return
        log.info("received %s: draining", signal.Signals(sig).name)
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        if self._start_task is not None and not self._start_task.done():
            self._start_task.cancel()
        complete = await self.plane.drain()
        self.drain_complete = complete
        log.info("drain %s", "complete" if complete else "budget exhausted; remaining requests answered 503/504")
        self.should_exit = True

    async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        await super().startup(sockets=sockets)
        self._start_task = asyncio.get_running_loop().create_task(self._start_model())

    async def _start_model(self) -> None:
        try:
            await self.plane.start()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the model failed to load; exiting")
            self.exit_code = 3
            self.should_exit = True

    async def shutdown(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        await super().shutdown(sockets=sockets)
        await self.plane.stop()


def run(config: PodConfig) -> int:
    """Serve until drained. Returns the process exit code."""
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry()
    metrics = PodMetrics(registry, config.model.name)
    plane = DataPlane(config, metrics)
    app = build_app(plane, registry)
    uv = uvicorn.Config(
        app,
        host=config.server.host,
        port=config.server.port,
        log_level=config.server.log_level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=30,
    )
    server = _Server(uv, plane)
    server.run()
    if not server.drain_complete:
        # Every request was answered, but a device thread may still be stuck in the model; the
        # interpreter would join it at exit and hang until SIGKILL. Leave now, with our exit code.
        logging.shutdown()
        os._exit(server.exit_code)
    return server.exit_code
