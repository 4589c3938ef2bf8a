"""The data plane: one model, its admission core and the degradation ladder, with no HTTP in sight.

Concurrency model
-----------------
A :class:`DataPlane` is created and used on one asyncio event loop (the server's). ``start`` loads
and warms the model in a worker thread (liveness keeps answering), then builds the admission core
and its :class:`~sluiceway_pod.dispatcher.Dispatcher`. ``infer`` is a coroutine per request: it
authenticates, decodes, consults the ladder, admits, and awaits exactly one answer, racing the
client's disconnect. The HTTP layer (:mod:`sluiceway_pod.app`) only adapts bytes and headers.

Cheap refusals first: :meth:`DataPlane.admit_headers` decides everything the headers allow (API key,
model name, readiness, priority, deadline header, token bucket, queue room) *before* the transport
reads the body, so a refused request costs no body decoding; :meth:`DataPlane.infer_body` then decodes
(in a worker thread for large bodies, so the loop keeps answering probes) and admits. The token
bucket's and the full queue's 429s are built once per tenant, priority, ``Retry-After`` (and depth)
and reused (no exception raised).

Behind the gateway: a request whose ``X-Sluiceway-Edge-Token`` equals ``edge.tokenFile``'s token
(:class:`sluiceway_core.edge.EdgeToken`, constant-time) is the gateway's: its tenant is
``X-Sluiceway-Tenant`` and its class ``X-Sluiceway-Edge-Priority``, no API key is checked and the
tenant's rate/burst is not applied (the gateway holds the quota); the class ceiling, fair share, aging,
``maxConcurrent`` and the queue bounds still are. A wrong token is 401; a request without one is
checked as ever (API key, rate and all), whatever tenant header it carries. Only such a request
gets the start signal the gateway asks for (``X-Sluiceway-Start-Signal``, see
:mod:`sluiceway_core.edge`): :meth:`DataPlane.infer_body`'s ``on_start``.

Drain (SIGTERM): readiness turns false at once; admission stays open ``server.drainDelaySeconds``
(while endpoints are being removed; requests admitted then must fit the remaining budget), then
closes; queued, running and fallback work finishes within ``server.drainSeconds``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from sluiceway_core.config import PodConfig, TenantsConfig
from sluiceway_core.edge import EDGE_PRIORITY_HEADER, EDGE_TENANT_HEADER, EDGE_TOKEN_HEADER, EdgeToken
from sluiceway_core.keys import KeyFile

from .adaptive import AdaptiveLimit, build_adaptive
from .admission import AdmissionCore, AdmissionSettings, rate_limited
from .clock import Clock, MonotonicClock
from .degradation import FallbackSlots, ResponseCache
from .dispatcher import Dispatcher
from .errors import (
    BodyBudgetSpent,
    ClientGone,
    DeadlineUnmeetable,
    Draining,
    InvalidInput,
    ModelError,
    ModelNotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    QueueFull,
    SluicewayError,
    Unauthenticated,
    http_status,
    new_error_id,
)
from .logs import build_access_log
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
    max_request_bytes,
)
from .quota_client import QuotaClient, start_quota_client
from .runtime import Sizing, allocated_bytes, measure, release_cache
from .sizing import memory_probe_for
from .startphases import StartPhases, model_dir, read_fetch_record
from .tenancy import OTHER, Tenant, TenantRegistry
from .tracing import build_tracer

log = logging.getLogger("sluiceway.service")

PRIORITY_HEADER = "x-sluiceway-priority"
DEADLINE_HEADER = "x-sluiceway-deadline-ms"
DEGRADED_HEADER = "x-sluiceway-degraded"


@dataclass
class Response:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    #: the headers as the transport sends them (with ``content-length``), filled in by the
    #: transport on first send: an answer reused for many requests (a cached refusal) is encoded once
    encoded: list[tuple[bytes, bytes]] | None = field(default=None, repr=False, compare=False)
    #: the same, as the bytes after the status line (headers, ``content-length``, blank line, body),
    #: filled in by :class:`~sluiceway_pod.transport.InferenceProtocol` when it answers on the headers
    wire: bytes | None = field(default=None, repr=False, compare=False)
    #: for the access log and the trace: the error reason of a refusal, and whose request it was
    #: (the tenant's label) when the answer was decided knowing it
    reason: str | None = field(default=None, compare=False)
    tenant: str | None = field(default=None, compare=False)


#: The load headers on every answer to an infer request that reached the ASGI path (issue 19's
#: gateway routes by them; docs/pod.md): names pre-encoded, values formatted per answer.
QUEUE_DEPTH_HEADER = b"sluiceway-queue-depth"
PERMITS_HEADER = b"sluiceway-permits"
PREDICTED_WAIT_HEADER = b"sluiceway-predicted-wait-ms"
DRAINING_HEADER = b"sluiceway-draining"
DEGRADATION_HEADER = b"sluiceway-degradation"
_FLAG = (b"0", b"1")
_LEVEL = (b"0", b"1", b"2")


def degradation_level(depth: int, max_depth: int, wait: float, threshold: float | None) -> int:
    """0: full service; 1: the degradation ladder is engaged (``threshold`` set, i.e. degradation
    enabled, and the predicted wait over it: new requests go to the fallback model, the cache or 429
    ``overloaded``); 2: the queue is full (a new request gets in only by displacing a lower class, or
    down the ladder)."""
    if depth >= max_depth:
        return 2
    if threshold is not None and wait > threshold:
        return 1
    return 0


#: Bodies above this size are decoded in a worker thread (the loop keeps serving probes meanwhile).
DECODE_OFF_LOOP_BYTES = 256 * 1024


def error_response(err: SluicewayError) -> Response:
    headers = {"content-type": "application/json"}
    ra = err.retry_after_header()
    if ra is not None:
        headers["retry-after"] = ra
    doc: dict[str, Any] = {"error": err.message, "reason": err.reason}
    if err.error_id is not None:
        doc["errorId"] = err.error_id
    return Response(http_status(err), orjson.dumps(doc), headers, reason=err.reason)


@dataclass(slots=True)
class Admitted:
    """What the headers alone decided, before the body was read: who calls, at which priority,
    within which time budget (the client's deadline, capped by the drain budget while draining).
    ``held`` is what this request holds of the pod's :class:`BodyBudget` (set by the transport)."""

    tenant: Tenant
    rank: int
    priority: str
    budget: float | None
    held: int = 0
    #: when the request entered the queue, was dispatched to a permit and was answered (the core's
    #: clock; 0.0: never), for the access log and the trace
    enqueued: float = 0.0
    dispatched: float = 0.0
    finished: float = 0.0
    #: the gateway vouched for the request (its edge token): tenant and class are the gateway's
    edge: bool = False


class BodyBudget:
    """The bytes of request bodies in flight on the pod, all connections together, bounded by
    ``server.maxInflightBodyBytes`` (issue 18, item 7). A request reserves its declared
    ``Content-Length`` when its headers are admitted (a chunked body: as it arrives) and gives it back
    once, when its body is decoded into tensors that do not share its bytes, else when it is
    answered (refused, client gone, error, or served: :meth:`release` is idempotent).

    Concurrency model: used on the event loop only; every call is synchronous, so a check and the
    reservation that follows it in the same callback cannot interleave with another request's."""

    __slots__ = ("held", "limit", "peak")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0  # the most ever held (tests and the metric read it)

    def fits(self, n: int) -> bool:
        return self.held + n <= self.limit

    def take(self, adm: Admitted, n: int) -> bool:
        """Reserve ``n`` more bytes for ``adm``; False (nothing reserved) when they do not fit."""
        held = self.held + n
        if held > self.limit:
            return False
        self.held = held
        if held > self.peak:
            self.peak = held
        adm.held += n
        return True

    def release(self, adm: Admitted) -> None:
        """Give back what ``adm`` holds (a second call gives back nothing)."""
        self.held -= adm.held
        adm.held = 0


class DataPlane:
    def __init__(
        self,
        config: PodConfig,
        metrics: PodMetrics,
        *,
        clock: Clock | None = None,
        runner_factory: Callable[[PodConfig], Runner] | None = None,
        started: tuple[float, float] | None = None,
    ) -> None:
        """``started``: (monotonic, wall-clock) seconds when the process started, the origin of the
        ``loaded`` start phase (default: now)."""
        self.config = config
        self.metrics = metrics
        self.clock = clock or MonotonicClock()
        phase_gauge = metrics.start_phase
        self.phases = StartPhases(
            self.clock,
            started=started,
            fetch=read_fetch_record(model_dir(config.model.spec)),
            on_phase=lambda phase, seconds: phase_gauge.labels(config.model.name, phase).set(seconds),
        )
        self._runner_factory = runner_factory or (lambda c: load_runner(c.model))
        self.tenants = TenantRegistry(
            config.tenants, list(config.priorities.classes), self.clock, default_priority=config.priorities.default
        )
        metrics.declare(sorted(self.tenants.known_labels), config.priorities.classes)
        #: the gateway's edge token (None: no gateway is trusted, every request shows its API key)
        self.edge = EdgeToken(config.edge.token_file, self.clock.now) if config.edge is not None else None
        self.quota: QuotaClient | None = None
        self.runner: Runner | None = None
        self.sizing: Sizing | None = None
        self.core: AdmissionCore[Tensors] | None = None
        self.dispatcher: Dispatcher[Tensors] | None = None
        self.adaptive: AdaptiveLimit | None = None  # permits: auto on a device with a memory probe
        self.ready = False
        self.loaded = False  # the model is loaded and the dispatcher runs
        self.shutting_down = False  # SIGTERM seen (readiness false; admission may still be open)
        self.draining = False  # admission closed
        self._drain_end: float | None = None
        self._fallback_inflight = 0
        self._fallback_idle = asyncio.Event()
        self._fallback_idle.set()
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
        self._refusals: dict[tuple[Any, ...], tuple[Response, Any, Any]] = {}
        self.bodies = BodyBudget(config.server.max_inflight_body_bytes)
        metrics.track_body_budget(lambda: float(self.bodies.held))
        self.access = build_access_log(config.server.access_log)  # None when off
        self.tracer = build_tracer(config.tracing, self.clock.now, config.model.name)  # None when off
        #: the largest body accepted: ``server.maxBodyBytes``, or less when every input's ``maxShape``
        #: bounds the request (:func:`~sluiceway_pod.protocol.max_request_bytes`; set at start)
        self.body_limit = config.server.max_body_bytes
        self.body_limit_why = "server.maxBodyBytes"
        if config.server.max_inflight_body_bytes < self.body_limit:  # could never fit: 413, not 429
            self.body_limit, self.body_limit_why = config.server.max_inflight_body_bytes, "server.maxInflightBodyBytes"

    # ------------------------------------------------------------------ lifecycle
    @property
    def model_name(self) -> str:
        return self.config.model.name

    async def start(self) -> None:
        """Load, warm up, size, then turn ready. Raises on a model that cannot load."""
        runner = await asyncio.to_thread(self._runner_factory, self.config)
        self.phases.mark("loaded")
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
        self.phases.mark("warmed")
        self.runner, self.sizing = runner, sizing
        by_shape = max_request_bytes(runner.inputs)
        if by_shape is not None and by_shape < self.body_limit:
            self.body_limit, self.body_limit_why = by_shape, "what the inputs' maxShape allows"
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
        self.core = AdmissionCore(
            settings,
            self.clock,
            observer=obs,
            take_token=self.tenants.take_token,
            rows_of=lambda inputs: max((int(a.shape[0]) for a in inputs.values() if a.ndim), default=1),
            concurrency_cap=self.tenants.concurrency_cap,
        )
        self.adaptive = build_adaptive(sizing, self.config, memory_probe_for(runner))
        self.dispatcher = Dispatcher(
            self.core,
            self.adaptive.wrap(runner.predict) if self.adaptive is not None else runner.predict,
            exec_timeout=self.config.queue.exec_timeout_seconds,
            clock=self.clock,
            on_oom=self._on_oom,
            release_device_cache=release_cache,
            max_threads=max(sizing.permits, self.config.concurrency.max_permits)
            if self.config.concurrency.permits == "auto"
            else sizing.permits,
            stuck_grace=self.config.queue.stuck_grace_seconds,
            on_stuck=lambda n: self.metrics.stuck.labels(self.model_name).set(n),
        )
        self.dispatcher.start()
        if self.config.quota is not None and self.config.quota.coordinator_url:
            self.quota = start_quota_client(self.config.quota, self.tenants, self.core, self.clock, self.metrics)
            await self.quota.start()
        bound_gauge = self.metrics.memory_bound.labels(self.model_name)
        if self.adaptive is not None:
            self.adaptive.attach(self.core, self.dispatcher.wake, asyncio.get_running_loop())
            self.adaptive.listen(lambda d: bound_gauge.set(d.memory_bound))
        elif sizing.memory_bound is not None:
            bound_gauge.set(sizing.memory_bound)
        if runner.device.startswith("cuda"):
            self.metrics.track_gpu_memory(lambda: float(allocated_bytes()))
        self.ready = True
        self.loaded = True
        self.metrics.ready.labels(self.model_name).set(1)
        self.phases.mark("ready")
        log.info(
            "start phases (seconds): %s", " ".join(f"{p}={s:.3f}" for p, s in self.phases.seconds().items())
        )
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

    def apply_tenants(self, tenants: TenantsConfig, keys: KeyFile) -> None:
        """Swap in reloaded tenants and keys (:mod:`sluiceway_pod.reload`), in one synchronous call
        on the loop. Raises ValueError (nothing changed) when they do not fit this pod."""
        new_labels = self.tenants.replace(tenants, keys)
        if new_labels:
            self.metrics.declare(new_labels, self.config.priorities.classes)

    def _on_oom(self) -> None:
        """On the loop, after the core dropped a permit for a device OOM."""
        self.metrics.oom.labels(self.model_name).inc()
        if self.adaptive is not None:
            self.adaptive.oom()

    # ------------------------------------------------------------------ probes
    def liveness(self) -> tuple[bool, str | None]:
        """False (with the reason) when every permit is stuck in the model: restart the pod."""
        if self.dispatcher is not None and self.dispatcher.wedged:
            return False, (
                f"all {self.dispatcher.stuck} permits are stuck in the model for longer than the execution "
                f"budget plus {self.config.queue.stuck_grace_seconds:g}s"
            )
        return True, None

    def readiness(self) -> bool:
        """Loaded, not draining, live, and holding its share of the tenants' quotas
        (:meth:`~sluiceway_core.lease_client.QuotaClient.ready_to_serve`)."""
        return self.ready and (self.quota is None or self.quota.ready_to_serve()) and self.liveness()[0]

    # ------------------------------------------------------------------ drain
    async def drain(self) -> bool:
        """SIGTERM: not ready at once; keep admitting for ``drainDelaySeconds`` (within the budget)
        while the endpoints go, then refuse new work and finish queued, running and fallback work
        within ``drainSeconds``. Returns True when everything finished in time."""
        sc = self.config.server
        self.shutting_down = True
        self.ready = False
        self.metrics.ready.labels(self.model_name).set(0)
        self._drain_end = self.clock.now() + sc.drain_delay_seconds + sc.drain_seconds
        if sc.drain_delay_seconds > 0 and self.loaded:
            log.info("not ready; still admitting for %.1fs while endpoints are removed", sc.drain_delay_seconds)
            await asyncio.sleep(sc.drain_delay_seconds)
        self.draining = True
        if self.dispatcher is None:
            return True
        complete = await self.dispatcher.drain(max(0.0, self._drain_end - self.clock.now()))
        try:
            async with asyncio.timeout(max(0.0, self._drain_end - self.clock.now())):
                await self._fallback_idle.wait()
        except TimeoutError:
            log.warning("drain budget exhausted with %d fallback calls running", self._fallback_inflight)
            return False
        return complete

    async def stop(self) -> None:
        if self.quota is not None:
            await self.quota.stop()
        if self.dispatcher is not None:
            await self.dispatcher.stop()
        if self._fallback_pool is not None:
            self._fallback_pool.shutdown(wait=False)
        if self.tracer is not None:
            await asyncio.to_thread(self.tracer.shutdown)

    # ------------------------------------------------------------------ metadata
    def metadata(self) -> dict[str, Any]:
        runner = self.runner
        doc: dict[str, Any] = {
            "name": self.model_name,
            "versions": [self.config.model.version],
            # the runner's format, as Triton's metadata names it (onnxruntime_onnx, pytorch_export...)
            "platform": getattr(runner, "platform", None) or "sluiceway",
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
                "concurrency_memory_bound": self.adaptive.memory_bound
                if self.adaptive is not None
                else self.sizing.memory_bound,
                "concurrency_probe": {str(k): round(v, 3) for k, v in self.sizing.probe_rates.items()}
                if self.sizing.probe_rates
                else None,
            }
        return doc

    # ------------------------------------------------------------------ load headers
    def load_headers(self) -> list[tuple[bytes, bytes]] | None:
        """This pod's load, as the five ``sluiceway-*`` response headers, or None before the model is
        loaded. Cheap: a few attribute reads, the core's whole-queue wait prediction and five small
        byte strings."""
        core = self.core
        if core is None:
            return None
        wait = core.predicted_wait()
        deg = self.config.degradation
        level = degradation_level(
            core.depth, core.settings.max_depth, wait, deg.wait_threshold_seconds if deg.enabled else None
        )
        return [
            (QUEUE_DEPTH_HEADER, b"%d" % core.depth),
            (PERMITS_HEADER, b"%d/%d" % (core.in_use, core.limit)),
            (PREDICTED_WAIT_HEADER, b"%d" % math.ceil(wait * 1000.0)),
            (DRAINING_HEADER, _FLAG[self.shutting_down]),
            (DEGRADATION_HEADER, _LEVEL[level]),
        ]

    # ------------------------------------------------------------------ inference
    def refuse(self, err: SluicewayError) -> Response:
        """An answer decided by the transport before the data plane saw the request (413, 499)."""
        self.metrics.child(self.metrics.rejected, OTHER, self.config.priorities.default, err.reason).inc()
        resp = error_response(err)
        resp.tenant = OTHER
        self.metrics.answered(OTHER, self.config.priorities.default, resp.status)
        return resp

    def _refused(self, err: SluicewayError, tenant: Tenant | None, priority: str, *, counted: bool = False) -> Response:
        if not counted:
            self.metrics.child(self.metrics.rejected, tenant.label if tenant else OTHER, priority, err.reason).inc()
        resp = error_response(err)
        resp.tenant = tenant.label if tenant else OTHER
        self.metrics.answered(resp.tenant, priority, resp.status)
        return resp

    def _cached_refusal(
        self, key: tuple[Any, ...], make: Callable[[], SluicewayError], tenant: Tenant, priority: str
    ) -> Response:
        """The 429s of overload (token bucket, full queue): the answer and its two counters are built
        once per ``key`` (everything the answer shows: tenant, priority, ``Retry-After``, queue
        depth) and reused, so a refusal costs a look-up and two increments: no exception object,
        no encoding. At most 4096 answers are kept (tenants x classes x seconds x depths)."""
        hit = self._refusals.get(key)
        if hit is None:
            err = make()
            m = self.metrics
            resp = error_response(err)
            resp.tenant = tenant.label
            hit = (
                resp,
                m.child(m.rejected, tenant.label, priority, err.reason),
                m.child(m.requests, tenant.label, priority, str(http_status(err))),
            )
            if len(self._refusals) < 4096:
                self._refusals[key] = hit
        resp, rejected, answered = hit
        rejected.inc()
        answered.inc()
        return resp

    def body_budget_spent(self) -> Response:
        """429 ``body_budget``: the bodies in flight would exceed ``server.maxInflightBodyBytes``.
        Built once and reused (counted under the default priority and ``other``: the headers have
        not been authenticated yet)."""
        tenant_label, priority = OTHER, self.config.priorities.default
        hit = self._refusals.get(("body_budget",))
        if hit is None:
            err = BodyBudgetSpent(
                f"the pod's budget for request bodies in flight ({self.bodies.limit} bytes) is spent", retry_after=1
            )
            m = self.metrics
            resp = error_response(err)
            resp.tenant = tenant_label
            hit = (
                resp,
                m.child(m.rejected, tenant_label, priority, err.reason),
                m.child(m.requests, tenant_label, priority, str(http_status(err))),
            )
            self._refusals[("body_budget",)] = hit
        resp, rejected, answered = hit
        rejected.inc()
        answered.inc()
        return resp

    def _rate_limited(self, tenant: Tenant, priority: str, wait: float) -> Response:
        return self._cached_refusal(
            ("rate_limited", tenant.name, priority, max(1, math.ceil(wait))),
            lambda: rate_limited(tenant, wait),
            tenant,
            priority,
        )

    def _queue_full(self, tenant: Tenant, priority: str, core: AdmissionCore[Tensors]) -> Response:
        depth, wait = core.depth, core.retry_after()
        return self._cached_refusal(
            ("queue_full", tenant.name, priority, depth, max(1, math.ceil(wait))),
            lambda: QueueFull(f"queue full ({depth} waiting)", retry_after=wait),
            tenant,
            priority,
        )

    def admit_headers(self, model_name: str, headers: Mapping[str, str]) -> Admitted | Response:
        """Everything the headers decide, before the body is read: API key (401 before anything names
        a model), model name (404), readiness and drain (503), priority and deadline headers (400),
        priority ceiling (403), token bucket (429, the token is taken here) and queue room (429).
        Returns the refusal (counted and answered) or what was admitted so far."""
        priority = self.config.priorities.default
        tenant: Tenant | None = None
        try:
            tenant, edge = self._identify(headers)
            if model_name != self.model_name:
                raise ModelNotFound(f"model {model_name!r} is not served here")
            if self.draining:
                raise Draining("the server is shutting down; retry on another replica")
            if not self.loaded or self.core is None or self.dispatcher is None or self.runner is None:
                raise NotReady("the model is still loading")
            rank = self.tenants.priority_rank(headers.get(EDGE_PRIORITY_HEADER if edge else PRIORITY_HEADER), priority)
            priority = self.config.priorities.classes[rank]
            budget = _parse_deadline(headers.get(DEADLINE_HEADER))
            if budget is not None and budget <= 0:
                raise DeadlineUnmeetable("the client deadline has already passed")
        except SluicewayError as e:
            return self._refused(e, tenant, priority)
        if self._drain_end is not None:  # shutting down: whatever is admitted must finish in the budget
            left = self._drain_end - self.clock.now()
            budget = left if budget is None else min(budget, left)
        core = self.core
        try:
            core.precheck(tenant, rank, priority, check_rate=False)  # counts its own refusals
        except SluicewayError as e:
            return self._refused(e, tenant, priority, counted=True)
        # the core's one rate check, without raising, so that the 429 comes from the cache
        wait = 0.0 if edge else core.rate_wait(tenant)  # behind the gateway: its bucket decided
        if wait > 0:
            return self._rate_limited(tenant, priority, wait)
        if not self.config.degradation.enabled and not core.has_room(rank, tenant):  # no room, nobody to displace
            return self._queue_full(tenant, priority, core)
        return Admitted(tenant, rank, priority, budget, edge=edge)

    def _identify(self, headers: Mapping[str, str]) -> tuple[Tenant, bool]:
        """(tenant, whether the gateway vouched for it). Raises :class:`Unauthenticated` (no key, a
        wrong key, or an edge token that is not this service's) or :class:`InvalidInput`."""
        token = headers.get(EDGE_TOKEN_HEADER)
        if token is None:
            return self.tenants.authenticate(headers.get("authorization")), False
        if self.edge is None or not self.edge.matches(token):
            raise Unauthenticated(
                "X-Sluiceway-Edge-Token does not match this service's edge token"
                + ("" if self.edge is not None else " (this pod trusts no gateway)")
                + "; a client calls with its API key and without the edge headers"
            )
        name = headers.get(EDGE_TENANT_HEADER)
        if not name:
            raise InvalidInput("a request with the edge token must name its tenant in X-Sluiceway-Tenant")
        return self.tenants.edge_tenant(name.strip()), True

    async def infer(
        self,
        model_name: str,
        body: bytes,
        headers: Mapping[str, str],
        disconnected: Callable[[], Awaitable[Any]] | None = None,
    ) -> Response:
        """Answer one infer request whose body is already read. ``headers`` keys are lower-case."""
        adm = self.admit_headers(model_name, headers)
        if isinstance(adm, Response):
            return adm
        return await self.infer_body(adm, body, headers, disconnected)

    async def infer_body(
        self,
        adm: Admitted,
        body: bytes | list[bytes],
        headers: Mapping[str, str],
        disconnected: Callable[[], Awaitable[Any]] | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> Response:
        """Decode, admit and await the answer of a request :meth:`admit_headers` let through.
        ``on_start`` (the start signal, for a request the gateway vouched for) is called on the loop
        when the request starts executing: its batch dispatched to a permit, or the fallback model
        called; never for one refused or answered before (a cache hit included).

        ``body`` may come boxed (a one-element list the caller keeps no other reference to): a JSON
        body is then freed, and its share of the :class:`BodyBudget` given back, as soon as it is
        decoded; a body with binary tensors (whose arrays share its bytes) holds its share until
        the answer. Whatever ``adm`` still holds is given back here, on every path."""
        try:
            resp = await self._infer(adm, body, headers, disconnected, on_start)
        finally:
            self.bodies.release(adm)
        self.metrics.answered(adm.tenant.label, adm.priority, resp.status)
        return resp

    async def _infer(
        self,
        adm: Admitted,
        boxed: bytes | list[bytes],
        headers: Mapping[str, str],
        disconnected: Callable[[], Awaitable[Any]] | None,
        on_start: Callable[[], None] | None = None,
    ) -> Response:
        assert self.core is not None and self.dispatcher is not None and self.runner is not None
        tenant, rank, priority, budget = adm.tenant, adm.rank, adm.priority, adm.budget
        body = boxed.pop() if isinstance(boxed, list) else boxed
        header_length = headers.get(HEADER_LEN)
        try:
            if len(body) > self.body_limit:
                raise PayloadTooLarge(f"body of {len(body)} bytes exceeds {self.body_limit} ({self.body_limit_why})")
            if len(body) > DECODE_OFF_LOOP_BYTES:
                req = await asyncio.to_thread(decode_request, body, header_length, self.runner.inputs)
            else:
                req = decode_request(body, header_length, self.runner.inputs)
            check_outputs(req, self.runner.outputs)
            if req.parameters:
                rank, priority, budget = self._request_parameters(req, adm, headers)
        except SluicewayError as e:
            self.metrics.child(self.metrics.rejected, tenant.label, priority, e.reason).inc()
            return error_response(e)
        finally:
            if header_length is None:  # JSON only: the tensors are copies, the body goes now
                del body
                self.bodies.release(adm)

        core, disp = self.core, self.dispatcher
        try:
            deg = self.config.degradation
            if deg.enabled and (
                core.predicted_wait(rank, tenant) > deg.wait_threshold_seconds or not core.has_room(rank, tenant)
            ):
                core.precheck(tenant, rank, priority, check_rate=False)
                return await self._degrade(req, tenant, priority, on_start)
            ticket, fut = disp.submit(
                tenant,
                rank,
                req.inputs,
                priority_label=priority,
                batch_key=batch_key(req.inputs),
                client_budget=budget,
                check_rate=False,  # the token was taken in admit_headers
                on_start=on_start,
            )
        except SluicewayError as e:  # refused at admission (already counted by the core)
            return error_response(e)

        adm.enqueued = ticket.enqueued
        try:
            outputs = await self._await_answer(ticket, fut, disconnected)
        except SluicewayError as e:
            return error_response(e)
        finally:
            adm.dispatched, adm.finished = ticket.dispatched, self.clock.now()
        if self.cache is not None:
            self.cache.put(content_hash(self.model_name, req.inputs), outputs)
        return await self._ok_async(req, outputs)

    def _request_parameters(
        self, req: InferRequest, adm: Admitted, headers: Mapping[str, str]
    ) -> tuple[int, str, float | None]:
        """tritonclient's ``priority=`` and ``timeout=`` (the request's ``parameters``): Triton's
        priority levels (1 highest; 0 the default) map onto the classes in order (level ``k`` is
        the ``k``-th class, levels past the last class are the last class; 0 is the default class);
        ``X-Sluiceway-Priority``, when sent, wins. ``timeout`` (microseconds; 0 = none) caps the
        request's deadline, like ``X-Sluiceway-Deadline-Ms``. The class ceiling (403) is checked at
        admission. Updates ``adm`` (its rank and class label) and returns (rank, class, budget)."""
        params = req.parameters
        rank, priority, budget = adm.rank, adm.priority, adm.budget
        level = params.get("priority")
        if level is not None:
            if not isinstance(level, int) or isinstance(level, bool) or level < 0:
                raise InvalidInput(f"parameters.priority must be an integer >= 0, got {level!r}")
            if level > 0 and PRIORITY_HEADER not in headers and not adm.edge:  # the gateway's class stands
                classes = self.config.priorities.classes
                rank = min(level, len(classes)) - 1
                priority = classes[rank]
                adm.rank, adm.priority = rank, priority
        timeout = params.get("timeout")
        if timeout is not None:
            if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0:
                raise InvalidInput(f"parameters.timeout must be an integer (microseconds) >= 0, got {timeout!r}")
            if timeout > 0:
                budget = timeout / 1e6 if budget is None else min(budget, timeout / 1e6)
        return rank, priority, budget

    async def _await_answer(
        self, ticket: Any, fut: asyncio.Future[Any], disconnected: Callable[[], Awaitable[Any]] | None
    ) -> Tensors:
        """The ticket's one answer. While it is queued, a watcher withdraws it if the client goes
        away (the answer is then that 499). The watcher reports through a done-callback rather than
        an ``asyncio.wait`` race: one task per queued request, no waiter futures."""
        dispatcher = self.dispatcher
        assert dispatcher is not None
        if disconnected is None or ticket.state != "queued":
            # dispatched at once (or answered): a disconnect could withdraw nothing, so no watcher
            return await fut  # type: ignore[no-any-return]

        def gone(w: asyncio.Future[Any]) -> None:
            if not w.cancelled() and w.exception() is None:  # still queued: withdraw, fut gets the 499
                dispatcher.withdraw(ticket, ClientGone("the client disconnected while queued"))

        watcher = asyncio.ensure_future(disconnected())
        watcher.add_done_callback(gone)
        try:
            return await fut  # type: ignore[no-any-return]  # running when the client left: goes nowhere
        finally:
            watcher.cancel()

    async def _ok_async(self, req: InferRequest, outputs: Tensors, degraded: str | None = None) -> Response:
        """Large answers are encoded in a worker thread (the loop keeps serving probes)."""
        if sum(getattr(a, "nbytes", 0) for a in outputs.values()) * 4 > DECODE_OFF_LOOP_BYTES:
            return await asyncio.to_thread(self._ok, req, outputs, degraded)
        return self._ok(req, outputs, degraded)

    def _ok(self, req: InferRequest, outputs: Tensors, degraded: str | None = None) -> Response:
        try:
            body, hdrs = encode_response(self.model_name, self.config.model.version, req, outputs)
        except (KeyError, TypeError, ValueError):
            eid = new_error_id()
            log.exception("the model's output cannot be encoded (error id %s)", eid)
            return error_response(ModelError(f"the model's output cannot be encoded; error id {eid}", error_id=eid))
        if degraded:
            hdrs[DEGRADED_HEADER] = degraded
        return Response(200, body, hdrs)

    async def _degrade(
        self, req: InferRequest, tenant: Tenant, priority: str, on_start: Callable[[], None] | None = None
    ) -> Response:
        """The ladder: fallback model, then the response cache, then 429. ``on_start`` is called when
        the fallback model is called (work starts), not for a cache hit or the 429."""
        assert self.core is not None
        if self.fallback is not None and self._fallback_slots is not None and self._fallback_slots.try_take():
            self._fallback_inflight += 1  # the drain waits for fallback calls too
            self._fallback_idle.clear()
            try:
                loop = asyncio.get_running_loop()
                if on_start is not None:
                    on_start()
                out = await loop.run_in_executor(self._fallback_pool, self.fallback.predict, [req.inputs])
            except Exception:
                log.exception("fallback model failed")
            else:
                self.metrics.degraded.labels(self.model_name, "fallback-model").inc()
                return self._ok(req, out[0], "fallback-model")
            finally:
                self._fallback_inflight -= 1
                if self._fallback_inflight == 0:
                    self._fallback_idle.set()
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
        self.metrics.child(self.metrics.rejected, tenant.label, priority, err.reason).inc()
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
