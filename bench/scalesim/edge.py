"""The service's edge: a bounded hold queue in front of the pods (issue 20).

When no ready pod can take a request (the service is at zero, or every pod's queue is full) the edge
*holds* it instead of refusing it: our gateway's hold queue, Knative's activator, KEDA's HTTP
interceptor, Ray Serve's proxy and handles. Each is a :class:`HoldSpec` (its bound, its own time
limit, whether it refuses at once what it predicts it cannot answer in time); :class:`Edge` is the
fluid model of one, in front of :class:`~bench.scalesim.model.FluidQueue`.

The model, once per simulated second (:meth:`Edge.step`):

1. Held requests whose deadline (``ServiceModel.slo``, or the edge's own ``timeout`` if shorter) has
   come are answered then: 504 ``hold_timeout`` by our gateway, the client's own timeout with the
   peers (the client gives up; the request is dropped before it reaches a pod). Either way *refused*,
   never lost, never computed.
2. While anything is held or no pod is ready, the second's arrivals join the hold queue behind what
   is held (FIFO in cohorts of one second). Over the bound: refused at once (503 ``hold_full``).
   With ``predicts`` (ours): the edge predicts when a request would be answered (the ready pods'
   rate, and each starting pod's from the time left of its start-up estimate, draining what is held
   ahead of it) and refuses at once, with ``Retry-After``, the part of the cohort it predicts past
   the deadline.
3. With ready pods, held requests are handed off at the rate the pods take them: the pods first
   finish their own queue, then each second's spare completions take held requests oldest first
   (the hand-off never fills the pods' queues, so the pods refuse none of them). A held request is
   on time when its wait plus its service time is within the deadline.
4. With nothing held and a pod ready, arrivals go straight to the pods (``FluidQueue.step``); what
   the pods would refuse for a full queue (429) is held instead.

Concurrency model: none. An :class:`Edge` belongs to one :func:`bench.scalesim.sim.run` and is called
from its loop, once per simulated second, in order.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from .model import FluidQueue, PodPool, ServiceModel, StepResult

__all__ = ["ACTIVATOR", "EDGES", "GATEWAY", "INTERCEPTOR", "RAY_PROXY", "Edge", "EdgeStats", "HoldSpec"]


@dataclass(frozen=True)
class HoldSpec:
    """One edge's hold queue."""

    name: str
    #: requests held at most (None: unbounded)
    max_requests: float | None
    #: the edge's own limit on a held request's wait, seconds (None: only the client's deadline)
    timeout: float | None
    #: refuse at once the requests predicted to be answered past their deadline (ours)
    predicts: bool


#: Our gateway (``gateway/sluiceway_gateway/config.py`` ``HoldConfig``): ``hold.maxRequests`` 1024,
#: a held request keeps its deadline (504 ``hold_timeout`` at it), and (issue 20) the early 503 with
#: ``Retry-After`` from the start-up estimate.
GATEWAY = HoldSpec("gateway", 1024.0, None, True)
#: Knative's activator: breaker queue depth 10,000 (``pkg/activator/net/throttler.go``), request
#: timeout 300 s (``revision-timeout-seconds``).
ACTIVATOR = HoldSpec("activator", 10_000.0, 300.0, False)
#: KEDA's HTTP add-on interceptor: ``KEDA_HTTP_COLD_START_MAX_PENDING_REQUESTS`` 0 (unlimited),
#: ``KEDA_HTTP_READINESS_TIMEOUT`` 0 s and ``KEDA_HTTP_REQUEST_TIMEOUT`` 0 s (no deadline of its own).
INTERCEPTOR = HoldSpec("interceptor", None, None, False)
#: Ray Serve: ``max_queued_requests`` -1 (unlimited), ``request_timeout_s`` unset (no deadline).
RAY_PROXY = HoldSpec("ray-proxy", None, None, False)
EDGES = {e.name: e for e in (GATEWAY, ACTIVATOR, INTERCEPTOR, RAY_PROXY)}


@dataclass
class EdgeStats:
    """What the edge did over a run (request counts are fluid)."""

    held: float = 0.0  # requests that entered the hold queue
    answered: float = 0.0  # held requests handed off to a pod and answered
    on_time: float = 0.0  # ... of them within their deadline
    refused_early: float = 0.0  # refused at once: predicted past the deadline (503 + Retry-After)
    refused_full: float = 0.0  # refused at once: over the bound (503 hold_full)
    timed_out: float = 0.0  # held until the deadline, then 504 / given up by the client
    #: (seconds held, requests) of each handed-off piece, for the hold-time quantiles
    waits: list[tuple[float, float]] = field(default_factory=list)

    def hold_quantile(self, q: float) -> float:
        total = sum(n for _, n in self.waits)
        if total <= 0:
            return 0.0
        acc = 0.0
        for w, n in sorted(self.waits):
            acc += n
            if acc >= q * total:
                return w
        return max(w for w, _ in self.waits)


class Edge:
    """A hold queue in front of the pods' :class:`FluidQueue` (module docstring)."""

    def __init__(self, spec: HoldSpec, model: ServiceModel, queue: FluidQueue, estimate: float) -> None:
        self.spec = spec
        self.model = model
        self.queue = queue
        #: the start-up estimate the prediction uses (seconds from a pod being asked for to Ready)
        self.estimate = estimate
        self._cohorts: deque[list[float]] = deque()  # [arrival second, requests]
        self.held = 0.0
        self.stats = EdgeStats()

    @property
    def limit(self) -> float:
        """How long a request may be held: its deadline, or the edge's own timeout if shorter."""
        t = self.spec.timeout
        return self.model.slo if t is None else min(self.model.slo, t)

    def _expire(self, t: int) -> float:
        out = 0.0
        limit = self.limit
        while self._cohorts and t - self._cohorts[0][0] >= limit:
            out += self._cohorts.popleft()[1]
        self.held -= out
        self.held = max(0.0, self.held)
        self.stats.timed_out += out
        return out

    def capacity_within(self, t: int, pool: PodPool, horizon: float) -> float:
        """Requests the pods are predicted to complete in the next ``horizon`` seconds: the ready
        pods all along, each starting pod from its predicted Ready (asked + estimate; at once when
        overdue); at zero with no pod asked for yet, the one the activation asks for now."""
        if horizon <= 0:
            return 0.0
        rate = self.model.replica_rate
        total = pool.ready * rate * horizon
        asked = pool.asked_times() or ([] if pool.ready else [float(t)])
        for a in asked:
            ready_in = max(0.0, self.estimate - (t - a))
            total += rate * max(0.0, horizon - ready_in)
        return total

    def _admit(self, t: int, n: float, pool: PodPool) -> float:
        """Hold ``n`` requests arriving at ``t``; returns how many were refused at once."""
        if n <= 0:
            return 0.0
        refused = 0.0
        if self.spec.predicts:
            m = self.model
            fits = max(0.0, self.capacity_within(t, pool, m.slo - m.service_time) - self.held)
            early = max(0.0, n - fits)
            self.stats.refused_early += early
            refused += early
            n -= early
        if self.spec.max_requests is not None:
            full = max(0.0, n - max(0.0, self.spec.max_requests - self.held))
            self.stats.refused_full += full
            refused += full
            n -= full
        if n > 0:
            self._cohorts.append([float(t), n])
            self.held += n
            self.stats.held += n
        return refused

    def _hand_off(self, t: int, room: float) -> tuple[float, float]:
        """Up to ``room`` held requests to the pods, oldest first: (handed off, of them late)."""
        m = self.model
        sent = late = 0.0
        while self._cohorts and room - sent > 1e-12:
            cohort = self._cohorts[0]
            take = min(cohort[1], room - sent)
            wait = t - cohort[0]
            sent += take
            if wait + m.service_time > m.slo:
                late += take
            self.stats.waits.append((wait, take))
            cohort[1] -= take
            if cohort[1] <= 1e-12:
                self._cohorts.popleft()
        self.held = max(0.0, self.held - sent)
        self.stats.answered += sent
        self.stats.on_time += sent - late
        return sent, late

    def step(self, t: int, arrived: float, pool: PodPool, mean_rate: float) -> StepResult:
        """One second at the edge and the pods (module docstring, steps 1-4)."""
        m = self.model
        timed_out = self._expire(t)
        ready = pool.ready
        if ready > 0 and self.held <= 0:
            r = self.queue.step(arrived, ready, mean_rate)
            full = r.refused  # what the pods would answer 429: held instead
            r.refused = self._admit(t, full, pool)
            r.expired += timed_out
            r.arrived = arrived
            r.held = self.held
            return r
        refused = self._admit(t, arrived, pool)
        if ready <= 0:
            return StepResult(arrived, refused, timed_out, 0.0, self.queue.q, 0.0, 0.0, 0.0, 0.0, self.held)
        cap = ready * m.replica_rate
        from_queue = min(self.queue.q, cap)
        self.queue.q -= from_queue
        # the pods' own queue waited about its backlog's time
        q_late = from_queue if from_queue > 0 and from_queue / cap + m.service_time > m.slo else 0.0
        sent, late = self._hand_off(t, cap - from_queue)
        served = from_queue + sent
        busy = served * m.service_time
        wait = self.queue.q / cap
        return StepResult(arrived, refused, timed_out, served, self.queue.q, wait, busy, busy, late + q_late, self.held)


def cold_start_estimate(model: ServiceModel) -> float:
    """The start-up estimate our gateway predicts with: the median of the pods' reported start-ups
    (issue 20: per InferenceService, from the pods' phase reports)."""
    return math.ceil(model.startup.quantile(0.5))
