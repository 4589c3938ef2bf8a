"""The data plane: one model, its admission core and the degradation ladder, with no HTTP in sight.

Concurrency model
-----------------
A :class:`DataPlane` is created and used on one asyncio event loop (the server's). ``start`` loads
and warms the model in a worker thread (liveness keeps answering), then builds the admission core
and its :class:`~sluiceway_pod.dispatcher.Dispatcher`. ``infer`` is a coroutine per request: it
authenticates, decodes, consults the ladder, admits, and awaits exactly one answer, racing the
client's disconnect. The HTTP layer (:mod:`sluiceway_pod.app`) only adapts bytes and headers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from sluiceway_core.config import PodConfig

from .admission import AdmissionCore, AdmissionSettings
from .clock import Clock, MonotonicClock
from .degradation import FallbackSlots, ResponseCache
from .dispatcher import Dispatcher
from .errors import (
    ClientGone,
    DeadlineUnmeetable,
    Draining,
    InvalidInput,
    ModelError,
    ModelNotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    SluicewayError,
    http_status,
)
from .metrics import PodMetrics
from .models import Runner, Tensors, load_runner
from .protocol import (
    HEADER_LEN,
    InferRequest,
    batch_key,
    check_outputs,
    content_hash,
    decode_request,
    encode_response,
)
from .runtime import Sizing, allocated_bytes, measure, release_cache
from .tenancy import OTHER, Tenant, TenantRegistry

log = logging.getLogger("sluiceway.service")

PRIORITY_HEADER = "x-sluiceway-priority"
DEADLINE_HEADER = "x-sluiceway-deadline-ms"
DEGRADED_HEADER = "x-sluiceway-degraded"


@dataclass
class Response:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def error_response(err: SluicewayError) -> Response:
    headers = {"content-type": "application/json"}
    ra = err.retry_after_header()
    if ra is not None:
        headers["retry-after"] = ra
    return Response(http_status(err), orjson.dumps({"error": err.message, "reason": err.reason}), headers)


class DataPlane:
    def __init__(
        self,
        config: PodConfig,
        metrics: PodMetrics,
        *,
        clock: Clock | None = None,
        runner_factory: Callable[[PodConfig], Runner] | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.clock = clock or MonotonicClock()
        self._runner_factory = runner_factory or (lambda c: load_runner(c.model))
        self.tenants = TenantRegistry(config.tenants, list(config.priorities.classes), self.clock)
        metrics.declare(sorted(self.tenants.known_labels), config.priorities.classes)
        self.runner: Runner | None = None
        self.sizing: Sizing | None = None
        self.core: AdmissionCore[Tensors] | None = None
        self.dispatcher: Dispatcher[Tensors] | None = None
        self.ready = False
        self.draining = False
        deg = config.degradation
        self.cache: ResponseCache[Tensors] | None = (
            ResponseCache(deg.cache.max_entries, deg.cache.ttl_seconds, self.clock)
            if deg.enabled and deg.cache.enabled
            else None
        )
        self.fallback: Runner | None = None
        self._fallback_slots: FallbackSlots | None = None
        self._fallback_pool: ThreadPoolExecutor | None = None
        self.start_error: str | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def model_name(self) -> str:
        return self.config.model.name

    async def start(self) -> None:
        """Load, warm up, size, then turn ready. Raises on a model that cannot load."""
        runner = await asyncio.to_thread(self._runner_factory, self.config)
        sizing = await asyncio.to_thread(measure, runner, self.config)
        fb = self.config.degradation.fallback if self.config.degradation.enabled else None
        if fb is not None:
            fallback = await asyncio.to_thread(load_runner, fb.spec, runner.device)
            if [s.name for s in fallback.inputs] != [s.name for s in runner.inputs]:
                raise ValueError("the fallback model must take the same inputs as the primary model")
            if [s.name for s in fallback.outputs] != [s.name for s in runner.outputs]:
                raise ValueError("the fallback model must produce the same outputs as the primary model")
            await asyncio.to_thread(measure, fallback, self.config)
            self.fallback = fallback
            self._fallback_slots = FallbackSlots(fb.permits)
            self._fallback_pool = ThreadPoolExecutor(fb.permits, thread_name_prefix="sluiceway-fallback")
        self.runner, self.sizing = runner, sizing
        settings = AdmissionSettings(
            permits=sizing.permits,
            max_depth=sizing.max_depth,
            queue_timeout=self.config.queue.timeout_seconds,
            num_classes=len(self.config.priorities.classes),
            aging_seconds=self.config.priorities.aging_seconds,
            max_batch_size=sizing.max_batch_size,
            max_batch_wait=self.config.batching.max_batch_wait_ms / 1000.0,
            initial_service_time=sizing.service_time,
        )
        obs = self.metrics.observer()
        self.core = AdmissionCore(settings, self.clock, observer=obs, take_token=self.tenants.take_token)
        self.dispatcher = Dispatcher(
            self.core,
            runner.predict,
            exec_timeout=self.config.queue.exec_timeout_seconds,
            clock=self.clock,
            on_oom=lambda: self.metrics.oom.labels(self.model_name).inc(),
            release_device_cache=release_cache,
            max_threads=max(sizing.permits, self.config.concurrency.max_permits)
            if self.config.concurrency.permits == "auto"
            else sizing.permits,
        )
        self.dispatcher.start()
        if runner.device.startswith("cuda"):
            self.metrics.track_gpu_memory(lambda: float(allocated_bytes()))
        self.ready = True
        self.metrics.ready.labels(self.model_name).set(1)
        log.info(
            "model %s ready on %s: permits=%d batch=%d max_queue=%d service=%.4fs peak/request=%s",
            self.model_name,
            sizing.device,
            sizing.permits,
            sizing.max_batch_size,
            sizing.max_depth,
            sizing.service_time,
            sizing.peak_bytes_per_request,
        )

    async def drain(self) -> bool:
        """SIGTERM: not ready, refuse new work, finish what was admitted (within the budget)."""
        self.draining = True
        self.ready = False
        self.metrics.ready.labels(self.model_name).set(0)
        if self.dispatcher is None:
            return True
        return await self.dispatcher.drain(self.config.server.drain_seconds)

    async def stop(self) -> None:
        if self.dispatcher is not None:
            await self.dispatcher.stop()
        if self._fallback_pool is not None:
            self._fallback_pool.shutdown(wait=False)

    # ------------------------------------------------------------------ metadata
    def metadata(self) -> dict[str, Any]:
        runner = self.runner
        doc: dict[str, Any] = {
            "name": self.model_name,
            "versions": [self.config.model.version],
            "platform": "pytorch_torchscript" if self.config.model.spec.endswith(".pt") else "sluiceway",
        }
        if runner is not None:
            doc["inputs"] = [s.to_json() for s in runner.inputs]
            doc["outputs"] = [s.to_json() for s in runner.outputs]
        if self.sizing is not None and self.core is not None:
            doc["parameters"] = {
                "device": self.sizing.device,
                "concurrency": self.core.limit,
                "max_batch_size": self.sizing.max_batch_size,
                "max_queue": self.core.settings.max_depth,
                "service_time_seconds": round(self.sizing.service_time, 6),
                "peak_memory_bytes_per_request": self.sizing.peak_bytes_per_request,
            }
        return doc

    # ------------------------------------------------------------------ inference
    def refuse(self, err: SluicewayError) -> Response:
        """An answer decided by the transport before the data plane saw the request (413, 499)."""
        self.metrics.rejected.labels(self.model_name, OTHER, self.config.priorities.default, err.reason).inc()
        resp = error_response(err)
        self.metrics.answered(OTHER, self.config.priorities.default, resp.status)
        return resp

    async def infer(
        self,
        model_name: str,
        body: bytes,
        headers: Mapping[str, str],
        disconnected: Callable[[], Awaitable[Any]] | None = None,
    ) -> Response:
        """Answer one infer request. ``headers`` keys are lower-case."""
        tenant: Tenant | None = None
        priority = self.config.priorities.default
        try:
            resp, tenant, priority = await self._infer(model_name, body, headers, disconnected)
        except SluicewayError as err:  # refused before the tenant was known
            self.metrics.rejected.labels(self.model_name, OTHER, priority, err.reason).inc()
            resp = error_response(err)
        label = tenant.label if tenant else OTHER
        self.metrics.answered(label, priority, resp.status)
        return resp

    async def _infer(
        self,
        model_name: str,
        body: bytes,
        headers: Mapping[str, str],
        disconnected: Callable[[], Awaitable[Any]] | None,
    ) -> tuple[Response, Tenant | None, str]:
        priority = self.config.priorities.default
        if model_name != self.model_name:
            raise ModelNotFound(f"model {model_name!r} is not served here (this pod serves {self.model_name!r})")
        if self.draining:
            raise Draining("the server is shutting down; retry on another replica")
        if not self.ready or self.core is None or self.dispatcher is None or self.runner is None:
            raise NotReady("the model is still loading")
        if len(body) > self.config.server.max_body_bytes:
            raise PayloadTooLarge(f"body of {len(body)} bytes exceeds {self.config.server.max_body_bytes}")
        tenant = self.tenants.authenticate(headers.get("authorization"))
        try:
            rank = self.tenants.priority_rank(headers.get(PRIORITY_HEADER), priority)
        except InvalidInput as e:
            self.metrics.rejected.labels(self.model_name, tenant.label, priority, e.reason).inc()
            return error_response(e), tenant, priority
        priority = self.config.priorities.classes[rank]
        try:
            budget = _parse_deadline(headers.get(DEADLINE_HEADER))
            req = decode_request(body, headers.get(HEADER_LEN), self.runner.inputs)
            check_outputs(req, self.runner.outputs)
            if budget is not None and budget <= 0:
                raise DeadlineUnmeetable("the client deadline has already passed")
        except SluicewayError as e:
            self.metrics.rejected.labels(self.model_name, tenant.label, priority, e.reason).inc()
            return error_response(e), tenant, priority

        core, disp = self.core, self.dispatcher
        try:
            deg = self.config.degradation
            if deg.enabled and (
                core.predicted_wait() > deg.wait_threshold_seconds or core.depth >= core.settings.max_depth
            ):
                core.precheck(tenant, rank, priority)
                return await self._degrade(req, tenant, priority), tenant, priority
            ticket, fut = disp.submit(
                tenant,
                rank,
                req.inputs,
                priority_label=priority,
                batch_key=batch_key(req.inputs),
                client_budget=budget,
            )
        except SluicewayError as e:  # refused at admission (already counted by the core)
            return error_response(e), tenant, priority

        try:
            outputs = await self._await_answer(ticket, fut, disconnected)
        except SluicewayError as e:
            return error_response(e), tenant, priority
        if self.cache is not None:
            self.cache.put(content_hash(self.model_name, req.inputs), outputs)
        return self._ok(req, outputs), tenant, priority

    async def _await_answer(
        self, ticket: Any, fut: asyncio.Future[Any], disconnected: Callable[[], Awaitable[Any]] | None
    ) -> Tensors:
        assert self.dispatcher is not None
        if disconnected is None:
            return await fut  # type: ignore[no-any-return]
        watcher = asyncio.ensure_future(disconnected())
        try:
            done, _ = await asyncio.wait({fut, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not watcher.done():
                watcher.cancel()
        if fut in done:
            return fut.result()  # type: ignore[no-any-return]
        if self.dispatcher.withdraw(ticket, ClientGone("the client disconnected while queued")):
            raise ClientGone("the client disconnected while queued")
        return await fut  # type: ignore[no-any-return]  # already running: the answer goes nowhere

    def _ok(self, req: InferRequest, outputs: Tensors, degraded: str | None = None) -> Response:
        try:
            body, hdrs = encode_response(self.model_name, self.config.model.version, req, outputs)
        except (KeyError, TypeError, ValueError) as e:
            return error_response(ModelError(f"the model's output cannot be encoded: {type(e).__name__}: {e}"))
        if degraded:
            hdrs[DEGRADED_HEADER] = degraded
        return Response(200, body, hdrs)

    async def _degrade(self, req: InferRequest, tenant: Tenant, priority: str) -> Response:
        """The ladder: fallback model, then the response cache, then 429."""
        assert self.core is not None
        if self.fallback is not None and self._fallback_slots is not None and self._fallback_slots.try_take():
            try:
                loop = asyncio.get_running_loop()
                out = await loop.run_in_executor(self._fallback_pool, self.fallback.predict, [req.inputs])
            except Exception:
                log.exception("fallback model failed")
            else:
                self.metrics.degraded.labels(self.model_name, "fallback-model").inc()
                return self._ok(req, out[0], "fallback-model")
            finally:
                self._fallback_slots.give_back()
        if self.cache is not None:
            hit = self.cache.get(content_hash(self.model_name, req.inputs))
            if hit is not None:
                self.metrics.degraded.labels(self.model_name, "cache").inc()
                return self._ok(req, hit, "cache")
        err = Overloaded(
            f"predicted queue wait {self.core.predicted_wait():.3f}s is over the degradation threshold and "
            "no degraded answer is available",
            retry_after=self.core.retry_after(),
        )
        self.metrics.rejected.labels(self.model_name, tenant.label, priority, err.reason).inc()
        return error_response(err)


def _parse_deadline(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        raise InvalidInput(f"{DEADLINE_HEADER} must be a number of milliseconds, got {raw!r}") from None
    if not np.isfinite(ms):
        raise InvalidInput(f"{DEADLINE_HEADER} must be finite")
    return ms / 1000.0
