"""Process lifecycle: two uvicorn servers on one event loop, warm-up in the background, drain on SIGTERM.

Concurrency model: everything runs on the main thread's asyncio loop, plus the device worker threads
owned by the dispatcher. The inference server (``server.port``) and the admin server
(``server.metricsPort``: ``/metrics`` and the probes) share the loop, so a wedged loop fails the
probes on both. Signals are handled on the loop (``loop.add_signal_handler``).

Transport bounds (issue 10, item 7): at most ``server.maxConnections`` open connections on the
inference port (uvicorn's ``limit_concurrency``: 503 beyond it; the admin port is not counted); the
request line and headers must arrive within ``server.headerTimeoutSeconds`` of the request's first
byte (or of the connection) and the body within ``server.bodyTimeoutSeconds`` (408), else the
connection is closed, so slowloris clients cannot pin connections. The protocol
(:mod:`sluiceway_pod.transport`) also answers infer requests refused on their headers itself.

Drain: the first SIGTERM/SIGINT turns readiness off; admission stays open ``server.drainDelaySeconds``
(the endpoints are being removed meanwhile; the operator may render a preStop sleep instead), then
new requests get 503 while queued, running and fallback work finishes (at most
``server.drainSeconds``); responses carry ``Connection: close`` from the signal on. Then uvicorn
closes its sockets and the process exits 0. A second SIGINT forces an immediate exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Generator
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry, disable_created_metrics
from sluiceway_core.config import PodConfig, ServerConfig
from starlette.types import ASGIApp

from .app import build_admin_app, build_app
from .data_plane import DataPlane
from .fastpath import InferFastPath
from .metrics import PodMetrics
from .reload import DEFAULT_PERIOD, Source, TenantReloader
from .transport import inference_protocol

log = logging.getLogger("sluiceway.server")


class _AdminServer(uvicorn.Server):
    """The metrics port. Signals belong to the inference server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class _Server(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        plane: DataPlane,
        admin: uvicorn.Server,
        reloader: TenantReloader | None = None,
        termination_log: str | None = None,
    ) -> None:
        super().__init__(config)
        self.termination_log = termination_log
        self.plane = plane
        self.admin = admin
        self.reloader = reloader
        self.exit_code = 0
        self.drain_complete = True
        self._drain_task: asyncio.Task[None] | None = None
        self._start_task: asyncio.Task[None] | None = None
        self._admin_task: asyncio.Task[None] | None = None

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
        self._admin_task = asyncio.get_running_loop().create_task(self.admin._serve())
        self._start_task = asyncio.get_running_loop().create_task(self._start_model())
        if self.reloader is not None:
            self.reloader.start()

    async def _start_model(self) -> None:
        try:
            await self.plane.start()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("the model failed to load; exiting")
            write_termination_message(self.termination_log, f"the model failed to load: {type(e).__name__}: {e}")
            self.exit_code = 3
            self.should_exit = True

    async def shutdown(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        await super().shutdown(sockets=sockets)
        if self.reloader is not None:
            await self.reloader.stop()
        await self.plane.stop()
        self.admin.should_exit = True
        if self._admin_task is not None:
            await self._admin_task


#: The kubelet reads at most 4096 bytes of a termination message; the operator shows its last line.
MAX_TERMINATION_MESSAGE = 1024


def write_termination_message(path: str | None, line: str) -> None:
    """Why the container ends, for its ``terminationMessagePath`` (the operator's ``PodsHealthy``
    condition shows it, scrubbed): one line, at most :data:`MAX_TERMINATION_MESSAGE` characters.
    Best effort: a path that cannot be written is logged, never raised."""
    if not path:
        return
    text = " ".join(line.split())[:MAX_TERMINATION_MESSAGE]
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as err:
        log.warning("cannot write the termination message to %s: %s", path, err)


def _common(sc: ServerConfig) -> dict[str, Any]:
    # no access log and no proxy-headers middleware (uvicorn's default wraps every request in it;
    # nothing here reads the client address): per-request work on the hot path
    # log_config None: uvicorn's loggers go to the root handler (sluiceway_pod.logs: plain or JSON)
    return {
        "host": sc.host,
        "log_level": sc.log_level,
        "log_config": None,
        "access_log": False,
        "lifespan": "off",
        "proxy_headers": False,
    }


def build_inference_uvicorn_config(app: ASGIApp, sc: ServerConfig, plane: DataPlane | None = None) -> uvicorn.Config:
    """The inference port's uvicorn settings (also used by ``bench.overhead`` for its bare-uvicorn
    floors). With ``plane`` (and ``app`` an :class:`InferFastPath`), infer requests refused on their
    headers are answered by the protocol itself (:mod:`sluiceway_pod.transport`)."""
    decide = app.before_body if isinstance(app, InferFastPath) else None
    closing = (lambda: plane.shutting_down) if plane is not None else None
    return uvicorn.Config(
        app,
        port=sc.port,
        http=inference_protocol(sc.header_timeout_seconds, decide, closing, plane.access if plane else None),
        limit_concurrency=sc.max_connections,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=30,
        **_common(sc),
    )


def build_reloader(plane: DataPlane, source: Source, period: float) -> TenantReloader:
    """The tenant reloader of ``plane`` (:mod:`sluiceway_pod.reload`), counting into its metrics."""
    m, model = plane.metrics, plane.model_name
    return TenantReloader(
        source,
        plane.config,
        plane.tenants.state,
        plane.apply_tenants,
        clock=plane.clock,
        period=period,
        result=lambda r: m.config_reload.labels(model, r).inc(),
        failing=lambda f: m.config_reload_failing.labels(model).set(1 if f else 0),
    )


def run(
    config: PodConfig,
    reload_source: Source | None = None,
    reload_seconds: float = DEFAULT_PERIOD,
    started: tuple[float, float] | None = None,
    termination_log: str | None = None,
) -> int:
    """Serve until drained. Returns the process exit code. With ``reload_source`` (where the
    configuration was read from) and ``reload_seconds`` > 0, the tenants section and the keys file
    are reloaded when they change (:mod:`sluiceway_pod.reload`). ``started``: (monotonic,
    wall-clock) when the process started, for the start phases (:mod:`sluiceway_pod.startphases`).
    ``termination_log``: where a model that fails to load says why (:func:`write_termination_message`)."""
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry()
    metrics = PodMetrics(registry, config.model.name)
    plane = DataPlane(config, metrics, started=started)
    sc = config.server
    common = _common(sc)
    uv = build_inference_uvicorn_config(build_app(plane), sc, plane)
    admin = _AdminServer(
        uvicorn.Config(build_admin_app(plane, registry), port=sc.metrics_port, timeout_keep_alive=30, **common)
    )
    reloader = build_reloader(plane, reload_source, reload_seconds) if reload_source and reload_seconds > 0 else None
    server = _Server(uv, plane, admin, reloader, termination_log)
    server.run()
    if not server.drain_complete:
        # Every request was answered, but a device thread may still be stuck in the model; the
        # interpreter would join it at exit and hang until SIGKILL. Leave now, with our exit code.
        logging.shutdown()
        os._exit(server.exit_code)
    return server.exit_code
