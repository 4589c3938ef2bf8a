"""The gateway itself: discovery -> ledger -> admission -> routing -> a pooled pod connection -> the answer.

One request's path (:meth:`Gateway.handle`):

1. ``/v2/health/live`` and ``/v2/health/ready`` are answered here (ready: at least one pod may take a
   request). Every other path is forwarded to a pod as the pod has it (``/v2``, model metadata and
   readiness, infer, anything else: the pod answers its own 404s).
2. Infer requests (``POST /v2/models/<m>[/versions/<v>]/infer``) pass :class:`EdgeAdmission` first
   when tenants are configured (401/403/429 here; no pod sees them).
3. :func:`~sluiceway_gateway.routing.choose` picks a pod from the ledger; its in-flight count rises.
   When no pod may take it (none routable, every pod's queue full, or requests already held) it is
   held in the :class:`~sluiceway_gateway.hold.HoldQueue` until the hand-off (:meth:`Gateway._pump`)
   reserves it on a pod with room, its deadline passes (504 ``hold_timeout``) or the gateway shuts
   down (503 ``gateway_draining``); over the hold bounds it is refused at once with ``Retry-After``,
   and so it is (503 ``no_capacity_in_time``) when the predicted time until a pod can serve it (a pod
   starting, ``hold.startupSeconds``) is past its deadline. A held request whose client closed its
   connection leaves the hold queue then and never reaches a pod.
4. The request goes out on a pooled keep-alive connection with the client's headers (less hop-by-hop
   ones) and the buffered body; the answer's status and headers come back, the load headers are read
   into the ledger and removed, and the body is streamed to the client.
5. A pod that refused before doing any work (429 ``queue_full``/``displaced``, 503 ``not_ready``/
   ``draining``) is excluded and the request is sent once more, to another pod, if its deadline
   allows; a pod that could not be connected to (nothing sent) is marked down and the request tries
   the next pod. A connection lost after sending gets 502 ``upstream_lost`` (the pod may have run it:
   never resent), a deadline passed waiting gets 504 ``deadline``; except a request sent with the
   edge token, which asks the pod for its start signal (a ``103`` when the request starts
   executing: :mod:`sluiceway_core.edge`): lost before that signal came, the pod had only queued it,
   so it is sent once more to another pod within its deadline (``retries`` reason
   ``pod_lost_unstarted``); lost after it, 502 ``upstream_lost`` as above.

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
from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry
from sluiceway_core.edge import (
    EDGE_HEADERS,
    EDGE_PRIORITY_HEADER,
    EDGE_TENANT_HEADER,
    EDGE_TOKEN_HEADER,
    START_SIGNAL_HEADER,
    EdgeToken,
)

from .admission import EdgeAdmission, Ticket
from .config import GatewayConfig
from .endpoints import Endpoint, EndpointSource
from .errors import (
    ClientGone,
    DeadlineExceeded,
    GatewayError,
    HoldExpired,
    HoldFull,
    HoldTenantFull,
    NoCapacityInTime,
    NoReadyPods,
    ShuttingDown,
    UpstreamLost,
)
from .hold import (
    ColdStart,
    Held,
    HoldLimits,
    HoldQueue,
    cold_start_estimate,
    predicted_ready_seconds,
    retry_after_seconds,
    room,
    start_left_seconds,
)
from .ledger import LOAD_HEADERS, QUEUE_FULL_LEVEL, PodLoad, apply_headers, observe_latency, routable, stale
from .metrics import RETRY_POD_LOST_UNSTARTED, GatewayMetrics
from .routing import choose, refusal_reason, retryable
from .server import Request, Responder
from .upstream import ConnectFailed, Lost, Pool, UpstreamConn, UpstreamResponse

log = logging.getLogger("sluiceway.gateway")

INFER = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")
DEADLINE_HEADER = "x-sluiceway-deadline-ms"
PRIORITY_HEADER = "x-sluiceway-priority"
_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade",
    b"content-length", b"expect", b"host",
})
_DROP_BACK = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length",
                        *(h.encode() for h in LOAD_HEADERS)})
MAX_CONNECT_TRIES = 3
#: the body of the pod's HTTP server's own 503 when its connection limit (``server.maxConnections``,
#: uvicorn's ``limit_concurrency``) is reached: the pod's app never saw the request (no work done)
POD_CONNECTION_LIMIT_BODY = b"Service Unavailable"
CONNECTION_LIMIT = "connection_limit"
#: the window of answers the observed drain rate counts, and at most this many answers per pod in it
ANSWER_WINDOW = 1.0
ANSWER_WINDOW_MAX = 8192
#: the cold starts the prediction of the next one is made from (the latest ones measured)
COLD_HISTORY = 5
#: client-sent edge headers: never forwarded (only the gateway may vouch for a request)
_EDGE_IN = frozenset(h.encode() for h in EDGE_HEADERS)
#: the start signal's ask, sent with the edge token only
_SIGNAL_ASK = START_SIGNAL_HEADER.encode() + b": 1"


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
        #: the edge token sent with each admitted request (docs/gateway.md, "Trust between gateway and pods")
        self.edge = EdgeToken(config.edge.token_file, clock) if config.edge is not None else None
        self.closing = False
        hc = config.hold
        self.hold: HoldQueue | None = None
        if hc.enabled:
            share = hc.tenant_share if config.tenants is not None else 1.0  # one tenant without tenants
            self.hold = HoldQueue(HoldLimits(hc.max_requests, hc.max_bytes, share,
                                             len(config.priorities.classes), config.priorities.aging_seconds))
        #: when each pod last said its queue is full (the hand-off probes it after ``pollAfterMs``)
        self._full_since: dict[str, float] = {}
        #: pods starting (not routable, not terminating, not yet routable since): when first seen so
        self._starting: dict[str, float] = {}
        #: each pod's last poll result, and the starts seen failing (while starting, a poll that the
        #: pod answered 503, loading, then one that found nothing listening: its process ended)
        self._last_poll: dict[str, str] = {}
        self._start_failures: dict[str, int] = {}
        #: when each pod's latest answers came (the last ``ANSWER_WINDOW`` seconds, bounded): the
        #: drain rate the ready-time prediction sees (:meth:`observed_rate`)
        self._answered_at: dict[str, deque[float]] = {}
        #: the cold start in progress (the first request held with no pod at all, until a pod is
        #: routable) and the lengths of the latest ones measured
        self._cold: ColdStart | None = None
        self._cold_measured: deque[float] = deque(maxlen=COLD_HISTORY)
        #: each pod's routability as last logged (transitions are logged with their cause)
        self._routable_logged: dict[str, bool] = {}
        #: callbacks that cut a request waiting for its pod's answer (the shutdown grace ended)
        self._cuts: set[Callable[[], None]] = set()
        self._held_waiting = 0  # handlers awaiting a hand-off (held, or woken and not yet resumed)
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
                log.info("discovery: pod %s added (%s)", ep.key,
                         "ready" if ep.ready else "terminating" if ep.terminating else "starting")
            elif pod.ready != ep.ready:
                log.info("discovery: pod %s %s", ep.key,
                         "ready" if ep.ready else "terminating" if ep.terminating else "not ready")
            pod.ready = ep.ready
        for key in [k for k in self.pods if k not in seen]:
            del self.pods[key]
            del self.addresses[key]
            self.pool.forget(key)
            self._full_since.pop(key, None)
            self._starting.pop(key, None)
            self._last_poll.pop(key, None)
            self._answered_at.pop(key, None)
            self._start_failures.pop(key, None)
            self._routable_logged.pop(key, None)
            log.info("discovery: pod %s removed", key)
        self._gauge_endpoints()
        self._pump()

    def _track_starting(self) -> None:
        """Note the pods that start (first seen not routable and not terminating) and, when one
        becomes routable, how far its time to ready was from ``hold.startupSeconds``."""
        now = self.clock()
        startup = self.config.hold.startup_seconds
        for p in self.pods.values():
            ep = self.addresses.get(p.key)
            if routable(p) != self._routable_logged.get(p.key, False):
                self._routable_logged[p.key] = routable(p)
                log.info("pod %s %s (discovery ready %s, down %s, draining %s, last poll %s)", p.key,
                         "routable" if routable(p) else "not routable", p.ready, p.down, p.draining,
                         self._last_poll.get(p.key))
            if routable(p):
                self._cold_ended(now, p.key)
                self._start_failures.pop(p.key, None)
                since = self._starting.pop(p.key, None)
                if since is not None and startup is not None:
                    self.metrics.ready_prediction_error.observe((now - since) - startup)
            elif ep is not None and ep.terminating:
                self._starting.pop(p.key, None)
            elif p.key not in self._starting and not p.draining:
                self._starting[p.key] = now

    def cold_estimate(self) -> float | None:
        """The predicted length of the next cold start (:func:`~sluiceway_gateway.hold.
        cold_start_estimate`); ``None`` without ``hold.startupSeconds``."""
        hc = self.config.hold
        if hc.startup_seconds is None:
            return None
        return cold_start_estimate(list(self._cold_measured), hc.startup_seconds, hc.cold_start_overhead_seconds)

    def _cold_began(self, now: float) -> None:
        """A request is held with no pod at all (none routable, none starting): a cold start begins."""
        if self._cold is not None or any(routable(p) for p in self.pods.values()) or self._starting:
            return
        estimate = self.cold_estimate()
        if estimate is None:
            return
        self._cold = ColdStart(now, estimate)
        self.metrics.cold_predicted.set(estimate)
        log.info("cold start: a request held with no pod; a pod predicted ready in %.1fs (%s)", estimate,
                 f"median of the last {len(self._cold_measured)} measured" if self._cold_measured
                 else "hold.startupSeconds + hold.coldStartOverheadSeconds")

    def _cold_ended(self, now: float, key: str) -> None:
        cold = self._cold
        if cold is None:
            return
        self._cold = None
        took = now - cold.since
        self._cold_measured.append(took)
        self.metrics.cold_actual.set(took)
        self.metrics.cold_error.observe(took - cold.estimate)
        log.info("cold start: pod %s routable %.2fs after the first request held (predicted %.1fs)", key, took,
                 cold.estimate)

    def predicted_ready(self, now: float, held_ahead: int | None = None) -> float | None:
        """Seconds until a pod can serve a request held now, behind ``held_ahead`` requests (default:
        all those held) (:func:`~sluiceway_gateway.hold.predicted_ready_seconds`; a pod past its
        predicted start-up is taken to be late by as much again); ``None`` without
        ``hold.startupSeconds``."""
        startup = self.config.hold.startup_seconds
        if startup is None or self.hold is None:
            return None
        self._track_starting()
        pods = [p for p in self.pods.values() if routable(p) or p.key in self._starting]
        return predicted_ready_seconds(now, pods, self._starting.values(), startup,
                                       self.hold.count if held_ahead is None else held_ahead,
                                       self.config.hold.handoff_queue_per_pod, overdue=True,
                                       observed_rate=self.observed_rate(now), cold=self._cold,
                                       cold_estimate=self.cold_estimate())

    def observed_rate(self, now: float) -> float:
        """Answers per second the routable pods gave over the last ``ANSWER_WINDOW`` seconds."""
        total = 0
        for key, times in self._answered_at.items():
            while times and times[0] < now - ANSWER_WINDOW:
                times.popleft()
            pod = self.pods.get(key)
            if pod is not None and routable(pod):
                total += len(times)
        return total / ANSWER_WINDOW

    def _why_late(self, now: float) -> str:
        """What the prediction rests on, for a refusal's message: the soonest starting pod's overrun of
        ``hold.startupSeconds`` and the failed starts seen."""
        startup = self.config.hold.startup_seconds
        cold = self._cold
        if startup is None or (not self._starting and cold is None):
            return ""
        if cold is not None:
            over = (now - cold.since) - cold.estimate
            late = (f"; the cold start is {over:.1f}s past its prediction ({cold.estimate:.1f}s)" if over > 0 else "")
            if any(self._start_failures.values()):
                late += "; a failed start seen (a starting pod's process ended while it loaded)"
            return late
        key, since = min(self._starting.items(), key=lambda kv: start_left_seconds(now - kv[1], startup, True))
        over = (now - since) - startup
        parts = []
        if over > 0:
            parts.append(f"the starting pod {key} is {over:.1f}s past its predicted start-up "
                         f"(hold.startupSeconds {startup:g}s)")
        if any(self._start_failures.values()):
            parts.append("a failed start seen (a starting pod's process ended while it loaded)")
        return ("; " + "; ".join(parts)) if parts else ""

    def _refuse_late_held(self) -> None:
        """With ``hold.startupSeconds`` and no pod ready: each held request whose deadline is before the
        predicted ready time (a starting pod late, or failing, pushes it out) leaves the hold queue
        now, answered 503 ``no_capacity_in_time`` with ``Retry-After``, instead of at its deadline."""
        hold = self.hold
        if hold is None or not hold.count or self.closing or any(routable(p) for p in self.pods.values()):
            return
        now = self.clock()
        wait = self.predicted_ready(now, held_ahead=0)
        if wait is None:
            return
        why = None
        for h in hold.all_held():
            if now + wait > h.deadline and not h.waiter.done() and hold.remove(h):
                if why is None:
                    why = self._why_late(now)
                self.metrics.hold_seconds.labels("no_capacity_in_time").observe(max(0.0, now - h.enqueued))
                self.metrics.early_refused.inc()
                h.waiter.set_exception(NoCapacityInTime(
                    f"no pod can take the request within its deadline: one is predicted in {wait:.1f}s"
                    f"{why} (held {now - h.enqueued:.3f}s)", retry_after=wait))
        self._hold_gauges()

    def _gauge_endpoints(self) -> None:
        self._track_starting()
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
            self._pump()  # a full pod's probe comes due with time
            self._refuse_late_held()  # a late or failing start pushes the predicted ready time out

    def _spawn(self, coro: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _poll(self, pod: PodLoad) -> None:
        ep = self.addresses.get(pod.key)
        result = "error"
        began = self.clock()
        detail = ""
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
            detail = f"HTTP {resp.status}"
            if resp.status == 200:
                pod.draining = False
                result = "ready"
            else:
                reason = refusal_reason(body)
                pod.draining = reason == "draining"
                pod.down = not pod.draining
                result = reason if reason in ("draining", "not_ready") else "error"
        except (ConnectFailed, Lost, TimeoutError) as err:
            pod.down = True
            pod.heard_at = self.clock()
            result = "unreachable"
            detail = f"{type(err).__name__} {err}"
        finally:
            self._polling.discard(pod.key)
            self.metrics.polls.labels(result).inc()
            if pod.key in self.pods:
                # it answered while starting (503: loading), now nothing listens: its process ended
                if (result == "unreachable" and pod.key in self._starting
                        and self._last_poll.get(pod.key) in ("not_ready", "error")):
                    self._start_failures[pod.key] = self._start_failures.get(pod.key, 0) + 1
                if self._last_poll.get(pod.key) != result:
                    log.info("poll: pod %s %s -> %s (%s, %.3fs)", pod.key, self._last_poll.get(pod.key), result,
                             detail, self.clock() - began)
                self._last_poll[pod.key] = result
            self._track_starting()
            self._pump()

    # ---------------------------------------------------------------- requests
    async def handle(self, req: Request, out: Responder) -> None:
        path = req.path
        if path == "/v2/health/live":
            out.send(200, [(b"content-type", b"application/json")], b'{"live": true}')
            return
        if path == "/v2/health/ready":
            # with a hold queue the gateway takes requests while no pod is ready (it holds them)
            ok = not self.closing and (self.hold is not None or any(routable(p) for p in self.pods.values()))
            out.send(200 if ok else 503, [(b"content-type", b"application/json")],
                     b'{"ready": true}' if ok else b'{"ready": false}')
            return
        ticket: Ticket | None = None
        try:
            if self.closing:
                raise ShuttingDown("the gateway is shutting down")
            if self.admission is not None and req.method == "POST" and INFER.match(path):
                ticket = self.admission.admit(req.headers)
            await self._forward(req, out, ticket)
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

    def _request_bytes(self, req: Request, host: str, deadline: float, ticket: Ticket | None = None,
                       token: bytes | None = None) -> bytes:
        """The request as sent to a pod: the client's headers less hop-by-hop and edge ones, the
        deadline reduced by the time spent here, and, for a request admitted here with an edge token
        in force (``token``), the token, the tenant, the admitted class and the start signal's ask."""
        target = req.path.encode("latin-1") + (b"?" + req.query if req.query else b"")
        parts = [b"%s %s HTTP/1.1\r\nhost: %s\r\n" % (req.method.encode("ascii"), target, host.encode())]
        if ticket is not None and token is not None:
            parts.append(b"%s: %s\r\n%s: %s\r\n%s: %s\r\n%s\r\n" % (
                EDGE_TOKEN_HEADER.encode(), token, EDGE_TENANT_HEADER.encode(), ticket.tenant.name.encode(),
                EDGE_PRIORITY_HEADER.encode(), self.config.priorities.classes[ticket.rank].encode(), _SIGNAL_ASK))
        for k, v in req.raw_headers:
            lk = k.lower()
            if lk in _HOP or lk in _EDGE_IN:
                continue
            if lk == b"x-sluiceway-deadline-ms":
                v = b"%d" % max(1, int((deadline - self.clock()) * 1000))
            parts.append(b"%s: %s\r\n" % (k, v))
        parts.append(b"content-length: %d\r\n\r\n" % len(req.body))
        head = b"".join(parts)
        return head + bytes(req.body) if req.body else head

    # ---------------------------------------------------------------- hold queue and hand-off
    def _mark_full(self, pod: PodLoad) -> None:
        pod.degradation = max(pod.degradation, QUEUE_FULL_LEVEL)
        self._full_since[pod.key] = self.clock()

    def _heard(self, pod: PodLoad, resp: UpstreamResponse, now: float) -> None:
        """The answer to one forwarded request, still counted in ``pod.inflight``."""
        apply_headers(pod, _str_headers(resp), now, answered=1)
        times = self._answered_at.get(pod.key)
        if times is None:
            times = self._answered_at[pod.key] = deque(maxlen=ANSWER_WINDOW_MAX)
        times.append(now)
        if pod.degradation < QUEUE_FULL_LEVEL:
            self._full_since.pop(pod.key, None)
        elif pod.key not in self._full_since:
            self._full_since[pod.key] = now

    def _choose(self, exclude: set[str]) -> PodLoad | None:
        """The pod for a request on the direct path, or ``None``: no pod may take it now (none
        routable; with a hold queue also: every routable pod full, or requests already held, which go
        first)."""
        if self.hold is not None:
            if self.hold.count:
                return None
            full = {p.key for p in self.pods.values() if p.degradation >= QUEUE_FULL_LEVEL}
            exclude = exclude | full if full else exclude
        return choose(list(self.pods.values()), self.config.routing, self.rng, exclude)

    def _reserve(self, pod: PodLoad) -> None:
        pod.inflight += 1
        self.in_flight += 1
        self._idle.clear()
        self.metrics.in_flight.inc()
        self.metrics.pod(pod.key).in_flight.inc()

    def _unreserve(self, pod: PodLoad) -> None:
        pod.inflight -= 1
        self.in_flight -= 1
        if not self.in_flight:
            self._idle.set()
        self.metrics.in_flight.dec()
        self.metrics.pod(pod.key).in_flight.dec()

    def _hold_gauges(self) -> None:
        if self.hold is not None:
            self.metrics.held.set(self.hold.count)
            self.metrics.held_bytes.set(self.hold.nbytes)

    def _pump(self) -> None:
        """Hand held requests to pods with room (:func:`~sluiceway_gateway.hold.room`), in the hold
        queue's order, each reserved on its pod before its handler resumes; the rest stay held."""
        hold = self.hold
        if hold is None or not hold.count:
            return
        now = self.clock()
        probe_after = self.config.poll_after_ms / 1000.0
        extra = self.config.hold.handoff_queue_per_pod
        rooms = {p.key: room(p, extra, now, probe_after, self._full_since.get(p.key)) for p in self.pods.values()}
        while hold.count:
            key = max(rooms, key=lambda k: rooms[k], default=None)  # the most room first: spread
            if key is None or rooms[key] <= 0:
                break
            h = hold.pop(now)
            if h is None:
                break
            if h.waiter.done():  # its handler was cancelled and has not withdrawn it yet
                continue
            rooms[key] -= 1
            pod = self.pods[key]
            self._reserve(pod)
            self.metrics.hold_seconds.labels("handed_off").observe(max(0.0, now - h.enqueued))
            h.waiter.set_result(key)
        self._hold_gauges()

    def _expire_held(self, h: Held) -> None:
        if self.hold is not None and not h.waiter.done() and self.hold.remove(h):
            waited = self.clock() - h.enqueued
            self.metrics.hold_seconds.labels("expired").observe(max(0.0, waited))
            self._hold_gauges()
            h.waiter.set_exception(HoldExpired(
                f"no pod could take the request within its deadline (held {waited:.3f}s)"))

    def _client_gone(self, h: Held) -> None:
        """The client of a held request closed its connection: the request leaves the hold queue and
        never reaches a pod."""
        if self.hold is not None and not h.waiter.done() and self.hold.remove(h):
            self.metrics.hold_seconds.labels("client_closed").observe(max(0.0, self.clock() - h.enqueued))
            self._hold_gauges()
            h.waiter.set_exception(ClientGone("the client closed its connection while the request was held"))

    def _hold_identity(self, req: Request, ticket: Ticket | None) -> tuple[str, int, int]:
        if ticket is not None:
            return ticket.tenant.name, ticket.tenant.weight, ticket.rank
        pri = self.config.priorities
        raw = (req.headers.get(PRIORITY_HEADER) or pri.default).strip().lower()
        classes = list(pri.classes)
        return "", 1, classes.index(raw) if raw in classes else classes.index(pri.default)

    async def _held(self, req: Request, ticket: Ticket | None, deadline: float, out: Responder) -> PodLoad:
        """Hold the request until a pod has room for it (returns that pod, already reserved) or raise:
        the bound is full or a pod is predicted too late (at once, with ``Retry-After``), its deadline
        passed while held, its client closed the connection, or the gateway shut down before a pod
        could take it."""
        hold = self.hold
        assert hold is not None
        now = self.clock()
        if deadline <= now:
            raise DeadlineExceeded("the request's deadline passed at the gateway")
        tenant, weight, rank = self._hold_identity(req, ticket)
        nbytes = len(req.body) + sum(len(k) + len(v) + 4 for k, v in req.raw_headers) + len(req.path) + 16
        extra = self.config.hold.handoff_queue_per_pod
        predicted = self.predicted_ready(now)
        if predicted is not None and now + predicted > deadline:
            self.metrics.early_refused.inc()
            raise NoCapacityInTime(
                f"no pod can take the request within its deadline: one is predicted in {predicted:.1f}s"
                f"{self._why_late(now)}", retry_after=predicted)
        if predicted is not None and not any(routable(p) for p in self.pods.values()):
            retry_after = predicted  # no room comes before a pod does: when one is predicted
        else:
            retry_after = retry_after_seconds(hold.count, self.pods.values(), extra,
                                              self.config.hold.retry_after_seconds, self.observed_rate(now))
        try:
            h = hold.offer(tenant, weight, rank, nbytes, deadline, now, retry_after)
        except (HoldFull, HoldTenantFull) as err:
            self.metrics.hold_refused.labels(err.bound).inc()
            raise
        self._cold_began(now)
        loop = asyncio.get_running_loop()
        h.waiter = fut = loop.create_future()
        timer = loop.call_later(max(0.0, deadline - now), self._expire_held, h)
        unwatch = out.on_client_gone(lambda: self._client_gone(h))
        self._held_waiting += 1
        self._hold_gauges()
        self._pump()  # a pod may have room already (requests held ahead of this one go first)
        try:
            key: str = await fut
        except asyncio.CancelledError:
            if hold.remove(h):
                self.metrics.hold_seconds.labels("cancelled").observe(max(0.0, self.clock() - h.enqueued))
                self._hold_gauges()
            elif fut.done() and not fut.cancelled() and fut.exception() is None and fut.result() in self.pods:
                self._unreserve(self.pods[fut.result()])
                self._pump()
            raise
        finally:
            timer.cancel()
            unwatch()
            self._held_waiting -= 1
        pod = self.pods.get(key)
        if pod is None:  # removed by discovery between the hand-off and now: its reservation went with it
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()
            self.metrics.in_flight.dec()
            self.metrics.pod(key).in_flight.dec()
            return await self._held(req, ticket, deadline, out)
        return pod

    async def _forward(self, req: Request, out: Responder, ticket: Ticket | None = None) -> None:
        deadline = self._deadline(req)
        exclude: set[str] = set()
        refused_once = False
        lost_once = False
        connect_tries = 0
        m = self.metrics
        while True:
            t0 = time.perf_counter()
            pod = self._choose(exclude)
            m.decision.observe(time.perf_counter() - t0)
            if pod is None:
                if self.hold is None or self.closing:
                    raise NoReadyPods("no pod is ready to take the request")
                pod = await self._held(req, ticket, deadline, out)  # reserved on its pod by the hand-off
                exclude.clear()
            else:
                self._reserve(pod)
            ep = self.addresses[pod.key]
            series = m.pod(pod.key)
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
                    # with a hold queue the request waits for a pod that answers (the poll revives it)
                    if (self.hold is None and connect_tries >= MAX_CONNECT_TRIES) or self.clock() >= deadline:
                        raise NoReadyPods("no pod could be reached") from None
                    m.retries.labels("connect_failed").inc()
                    continue
                try:
                    resp = await self._answer_head(conn, req, ep, deadline, ticket)
                except UpstreamLost as err:
                    pod.down = True  # no new request until a poll finds it again
                    pod.heard_at = self.clock()
                    if err.unstarted and not lost_once and not self.closing and self.clock() < deadline:
                        # the pod had only queued it (no start signal came): once more, elsewhere
                        lost_once = True
                        exclude.add(pod.key)
                        m.retries.labels(RETRY_POD_LOST_UNSTARTED).inc()
                        continue
                    raise
                now = self.clock()
                self._heard(pod, resp, now)
                if resp.status in (429, 503):
                    body = await self._read_body(resp, deadline)
                    reason = refusal_reason(body)
                    before_work = retryable(resp.status, reason)
                    if reason is None and resp.status == 503 and body.strip() == POD_CONNECTION_LIMIT_BODY:
                        # the pod's server is at its connection limit: refused before its app ran,
                        # so the pod is full for now, like a full queue
                        reason, before_work = CONNECTION_LIMIT, True
                    if reason == "draining":
                        pod.draining = True
                    elif reason in ("queue_full", "displaced", CONNECTION_LIMIT):
                        self._mark_full(pod)
                    if before_work and now < deadline:
                        if not refused_once:
                            refused_once = True
                            exclude.add(pod.key)
                            m.retries.labels(m.reason(reason or "other")).inc()
                            continue
                        if self.hold is not None and not self.closing and pod.key in self._full_since:
                            # refused again for a full queue, before any work: the pod is now out of
                            # the direct path (full), so the request is held until a pod has room
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
                self._unreserve(pod)
                if conn is not None:
                    self.pool.release(conn)
                self._pump()

    async def _answer_head(self, conn: UpstreamConn, req: Request, ep: Endpoint, deadline: float,
                           ticket: Ticket | None) -> UpstreamResponse:
        token = self.edge.value if ticket is not None and self.edge is not None else None
        head = conn.send(self._request_bytes(req, ep.key, deadline, ticket, token),
                         head_request=req.method == "HEAD", start_signal=token is not None)
        cut = False

        def on_cut() -> None:
            nonlocal cut
            cut = True
            head.cancel()

        self._cuts.add(on_cut)
        try:
            return await _until(head, deadline - self.clock())
        except TimeoutError:
            conn.close()
            raise DeadlineExceeded("no answer from the pod within the request's deadline") from None
        except Lost as err:
            started = "" if not conn.signalled else (
                "; the pod had not started it" if conn.unstarted else "; the pod had started it")
            raise UpstreamLost(f"the pod's connection failed after the request was sent ({err}){started}",
                               unstarted=conn.unstarted) from None
        except asyncio.CancelledError:
            if not cut:
                raise
            conn.close()
            raise UpstreamLost("the gateway shut down (its drain grace ended) before the pod answered; the pod "
                               "may have run the request") from None
        finally:
            self._cuts.discard(on_cut)

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
        """Shutdown: no new request; what is held is still handed to pods with room and what is in
        flight finishes, within ``seconds``; then each request still held is answered 503
        ``gateway_draining`` (exactly once: it leaves the hold queue before its answer is set)."""
        self.closing = True
        end = self.clock() + seconds
        while (self.in_flight or (self.hold is not None and self.hold.count)) and self.clock() < end:
            self._pump()
            await asyncio.sleep(0.01)
        if self.hold is not None:
            now = self.clock()
            for h in self.hold.all_held():
                if not h.waiter.done() and self.hold.remove(h):
                    self.metrics.hold_seconds.labels("shutdown").observe(max(0.0, now - h.enqueued))
                    h.waiter.set_exception(ShuttingDown(
                        "the gateway shut down before a pod could take the request"))
            self._hold_gauges()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), max(0.0, end - self.clock()))
        # the grace is over: requests still waiting for their pod's answer are answered now (502
        # upstream_lost: the pod may have run them), never left to a closed connection
        for cut in list(self._cuts):
            cut()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), 1.0)
        # let the handlers of the requests just answered write their answers
        for _ in range(100):
            if not self._held_waiting:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)


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
