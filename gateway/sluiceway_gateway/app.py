"""The gateway itself: discovery -> ledger -> admission -> routing -> a pooled pod connection -> the answer.

One request's path (:meth:`Gateway.handle`):

1. ``/v2/health/live`` and ``/v2/health/ready`` are answered here (ready: at least one pod may take a
   request). Every other path is forwarded to a pod as the pod has it (``/v2``, model metadata and
   readiness, infer, anything else: the pod answers its own 404s).
2. Infer requests (``POST /v2/models/<m>[/versions/<v>]/infer``) pass :class:`EdgeAdmission` first
   when tenants are configured (401/403/429 here; no pod sees them).
3. :func:`~sluiceway_gateway.routing.choose` picks a pod from the ledger; its in-flight count rises.
4. The request goes out on a pooled keep-alive connection with the client's headers (less hop-by-hop
   ones) and the buffered body; the answer's status and headers come back, the load headers are read
   into the ledger and removed, and the body is streamed to the client.
5. A pod that refused before doing any work (429 ``queue_full``/``displaced``, 503 ``not_ready``/
   ``draining``) is excluded and the request is sent once more, to another pod, if its deadline
   allows; a pod that could not be connected to (nothing sent) is marked down and the request tries
   the next pod. A connection lost after sending gets 502 ``upstream_lost`` (the pod may have run it:
   never resent), a deadline passed waiting gets 504 ``deadline``.

The deadline is the client's ``X-Sluiceway-Deadline-Ms`` (forwarded to the pod reduced by the time
spent here) or ``limits.requestTimeoutSeconds``.

Ledger upkeep: a background task polls (``GET /v2/health/ready``) every pod not heard from for
``pollAfterMs`` with nothing in flight, which also finds dead pods and revives recovered ones.

Concurrency model: everything runs on one asyncio event loop (uvloop when installed); per client
connection one request at a time (:mod:`~sluiceway_gateway.server`); the ledger, admission and pool
are owned by the loop and never touched from another thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from .admission import EdgeAdmission, Ticket
from .config import GatewayConfig
from .endpoints import Endpoint, EndpointSource
from .errors import DeadlineExceeded, GatewayError, NoReadyPods, ShuttingDown, UpstreamLost
from .ledger import LOAD_HEADERS, PodLoad, apply_headers, observe_latency, routable, stale
from .metrics import GatewayMetrics
from .routing import choose, refusal_reason, retryable
from .server import Request, Responder
from .upstream import ConnectFailed, Lost, Pool, UpstreamConn, UpstreamResponse

log = logging.getLogger("sluiceway.gateway")

INFER = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")
DEADLINE_HEADER = "x-sluiceway-deadline-ms"
_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade",
    b"content-length", b"expect", b"host",
})
_DROP_BACK = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length",
                        *(h.encode() for h in LOAD_HEADERS)})
MAX_CONNECT_TRIES = 3


class Gateway:
    def __init__(self, config: GatewayConfig, source: EndpointSource, registry: CollectorRegistry, *,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None) -> None:
        self.config = config
        self.source = source
        self.clock = clock
        self.rng = rng or random.Random(config.seed)
        self.metrics = GatewayMetrics(registry)
        lim = config.limits
        self.pool = Pool(lim.connect_timeout_seconds, lim.idle_seconds, lim.max_idle_per_pod, clock)
        self.pods: dict[str, PodLoad] = {}
        self.addresses: dict[str, Endpoint] = {}
        self.admission = (EdgeAdmission(config.tenants, config.priorities, clock)
                          if config.tenants is not None else None)
        self.closing = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._polling: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    # ---------------------------------------------------------------- discovery and ledger upkeep
    def set_endpoints(self, endpoints: list[Endpoint]) -> None:
        seen = set()
        for ep in endpoints:
            seen.add(ep.key)
            self.addresses[ep.key] = ep
            pod = self.pods.get(ep.key)
            if pod is None:
                pod = self.pods[ep.key] = PodLoad(ep.key, heard_at=-1e9)
            pod.ready = ep.ready
        for key in [k for k in self.pods if k not in seen]:
            del self.pods[key]
            del self.addresses[key]
            self.pool.forget(key)
        self._gauge_endpoints()

    def _gauge_endpoints(self) -> None:
        counts = {"routable": 0, "draining": 0, "not_ready": 0, "down": 0}
        for p in self.pods.values():
            state = ("down" if p.down else "not_ready" if not p.ready else "draining" if p.draining
                     else "routable")
            counts[state] += 1
        for state, n in counts.items():
            self.metrics.endpoints.labels(state).set(n)

    async def run_background(self) -> None:
        """Discovery and the poller; runs until cancelled."""
        self._spawn(self.source.run(self.set_endpoints))
        period = self.config.poll_after_ms / 2000.0
        after = self.config.poll_after_ms / 1000.0
        while True:
            await asyncio.sleep(period)
            now = self.clock()
            for pod in list(self.pods.values()):
                if pod.key not in self._polling and stale(pod, now, after):
                    self._polling.add(pod.key)
                    self._spawn(self._poll(pod))
            self._gauge_endpoints()

    def _spawn(self, coro: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _poll(self, pod: PodLoad) -> None:
        ep = self.addresses.get(pod.key)
        result = "error"
        try:
            if ep is None:
                return
            conn = await self.pool.acquire(pod.key, ep.host, ep.port)
            try:
                head = conn.send(b"GET /v2/health/ready HTTP/1.1\r\nhost: %s\r\ncontent-length: 0\r\n\r\n"
                                 % pod.key.encode())
                resp = await asyncio.wait_for(head, 1.0)
                body = await asyncio.wait_for(resp.read_all(65536), 1.0)
            finally:
                self.pool.release(conn)
            apply_headers(pod, _str_headers(resp), self.clock())
            if resp.status == 200:
                pod.draining = False
                result = "ready"
            else:
                reason = refusal_reason(body)
                pod.draining = reason == "draining"
                pod.down = not pod.draining
                result = reason if reason in ("draining", "not_ready") else "error"
        except (ConnectFailed, Lost, TimeoutError):
            pod.down = True
            pod.heard_at = self.clock()
            result = "unreachable"
        finally:
            self._polling.discard(pod.key)
            self.metrics.polls.labels(result).inc()

    # ---------------------------------------------------------------- requests
    async def handle(self, req: Request, out: Responder) -> None:
        path = req.path
        if path == "/v2/health/live":
            out.send(200, [(b"content-type", b"application/json")], b'{"live": true}')
            return
        if path == "/v2/health/ready":
            ok = not self.closing and any(routable(p) for p in self.pods.values())
            out.send(200 if ok else 503, [(b"content-type", b"application/json")],
                     b'{"ready": true}' if ok else b'{"ready": false}')
            return
        ticket: Ticket | None = None
        try:
            if self.closing:
                raise ShuttingDown("the gateway is shutting down")
            if self.admission is not None and req.method == "POST" and INFER.match(path):
                ticket = self.admission.admit(req.headers)
            await self._forward(req, out)
        except GatewayError as err:
            self.metrics.refused.labels(self.metrics.reason(err.reason)).inc()
            if out.started:  # the answer began: it cannot be replaced, only cut short
                out.keep_alive = False
            else:
                out.send_error(err)
        finally:
            if ticket is not None:
                EdgeAdmission.release(ticket)
            self.metrics.answered(out.status)

    def _deadline(self, req: Request) -> float:
        raw = req.headers.get(DEADLINE_HEADER)
        budget = self.config.limits.request_timeout_seconds
        if raw is not None:
            try:
                ms = float(raw)
            except ValueError:
                ms = -1.0
            if ms > 0 and ms == ms:
                budget = min(budget, ms / 1000.0)
        return self.clock() + budget

    def _request_bytes(self, req: Request, host: str, deadline: float) -> bytes:
        target = req.path.encode("latin-1") + (b"?" + req.query if req.query else b"")
        parts = [b"%s %s HTTP/1.1\r\nhost: %s\r\n" % (req.method.encode("ascii"), target, host.encode())]
        for k, v in req.raw_headers:
            lk = k.lower()
            if lk in _HOP:
                continue
            if lk == b"x-sluiceway-deadline-ms":
                v = b"%d" % max(1, int((deadline - self.clock()) * 1000))
            parts.append(b"%s: %s\r\n" % (k, v))
        parts.append(b"content-length: %d\r\n\r\n" % len(req.body))
        head = b"".join(parts)
        return head + bytes(req.body) if req.body else head

    async def _forward(self, req: Request, out: Responder) -> None:
        deadline = self._deadline(req)
        exclude: set[str] = set()
        refused_once = False
        connect_tries = 0
        m = self.metrics
        while True:
            t0 = time.perf_counter()
            pod = choose(list(self.pods.values()), self.config.routing, self.rng, exclude)
            m.decision.observe(time.perf_counter() - t0)
            if pod is None:
                raise NoReadyPods("no pod is ready to take the request")
            ep = self.addresses[pod.key]
            series = m.pod(pod.key)
            pod.inflight += 1
            self.in_flight += 1
            self._idle.clear()
            m.in_flight.inc()
            series.in_flight.inc()
            series.routed.inc()
            conn: UpstreamConn | None = None
            started = self.clock()
            try:
                remaining = deadline - started
                if remaining <= 0:
                    raise DeadlineExceeded("the request's deadline passed at the gateway")
                conn = self.pool.idle(pod.key)
                try:
                    if conn is None:
                        conn = await asyncio.wait_for(self.pool.connect(pod.key, ep.host, ep.port), remaining)
                except (ConnectFailed, TimeoutError):
                    pod.down = True
                    pod.heard_at = self.clock()
                    self.pool.forget(pod.key)
                    exclude.add(pod.key)
                    connect_tries += 1
                    if connect_tries >= MAX_CONNECT_TRIES or self.clock() >= deadline:
                        raise NoReadyPods("no pod could be reached") from None
                    m.retries.labels("connect_failed").inc()
                    continue
                try:
                    resp = await self._answer_head(conn, req, ep, deadline)
                except UpstreamLost:
                    pod.down = True  # no new request until a poll finds it again
                    pod.heard_at = self.clock()
                    raise
                now = self.clock()
                apply_headers(pod, _str_headers(resp), now)
                if resp.status in (429, 503):
                    body = await self._read_body(resp, deadline)
                    reason = refusal_reason(body)
                    if reason == "draining":
                        pod.draining = True
                    if retryable(resp.status, reason) and not refused_once and now < deadline:
                        refused_once = True
                        exclude.add(pod.key)
                        m.retries.labels(m.reason(reason or "other")).inc()
                        continue
                    if out.head_only:
                        out.start(resp.status, _back_headers(resp), 0)
                    else:
                        out.send(resp.status, _back_headers(resp), body)
                    return
                observe_latency(pod, (now - started) * 1000.0)
                await self._stream(resp, out, deadline)
                return
            finally:
                pod.inflight -= 1
                self.in_flight -= 1
                if not self.in_flight:
                    self._idle.set()
                m.in_flight.dec()
                series.in_flight.dec()
                if conn is not None:
                    self.pool.release(conn)

    async def _answer_head(self, conn: UpstreamConn, req: Request, ep: Endpoint, deadline: float) -> UpstreamResponse:
        head = conn.send(self._request_bytes(req, ep.key, deadline), head_request=req.method == "HEAD")
        try:
            return await _until(head, deadline - self.clock())
        except TimeoutError:
            conn.close()
            raise DeadlineExceeded("no answer from the pod within the request's deadline") from None
        except Lost as err:
            raise UpstreamLost(f"the pod's connection failed after the request was sent ({err})") from None

    async def _read_body(self, resp: UpstreamResponse, deadline: float) -> bytes:
        body = resp.complete_body()
        if body is not None:
            return body
        try:
            return await asyncio.wait_for(resp.read_all(self.config.limits.max_response_buffer_bytes),
                                          max(0.0, deadline - self.clock()))
        except TimeoutError:
            raise DeadlineExceeded("the pod's answer did not complete within the deadline") from None
        except Lost as err:
            raise UpstreamLost(f"the pod's answer broke off ({err})") from None

    async def _stream(self, resp: UpstreamResponse, out: Responder, deadline: float) -> None:
        length = None
        for k, v in resp.headers:
            if k == b"content-length":
                try:
                    length = int(v)
                except ValueError:
                    length = None
        if out.head_only:  # the pod's headers, its content-length included, and no body
            out.start(resp.status, _back_headers(resp), length or 0, declared=True)
            return
        if length is not None and length <= 65536:
            out.send(resp.status, _back_headers(resp), await self._read_body(resp, deadline))
            return
        out.start(resp.status, _back_headers(resp), length)
        try:
            async for chunk in resp.chunks():
                await out.write(chunk)
        except Lost:
            out.keep_alive = False  # the client sees a short answer and a closed connection
            return
        out.end()

    async def drain(self, seconds: float) -> None:
        self.closing = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), seconds)


async def _until(fut: asyncio.Future[UpstreamResponse], seconds: float) -> UpstreamResponse:
    """``await fut`` with a timeout, as one timer on the loop (``asyncio.wait_for`` costs a task and
    more per call in Python 3.11): on time-out the future is cancelled and TimeoutError raised."""
    if fut.done():
        return fut.result()
    fired = False

    def expire() -> None:
        nonlocal fired
        fired = True
        fut.cancel()

    timer = asyncio.get_running_loop().call_later(max(0.0, seconds), expire)
    try:
        return await fut
    except asyncio.CancelledError:
        if not fired:
            raise  # the caller was cancelled, not timed out
        raise TimeoutError from None
    finally:
        timer.cancel()


def _str_headers(resp: UpstreamResponse) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in resp.headers}


def _back_headers(resp: UpstreamResponse) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in resp.headers if k not in _DROP_BACK]
