"""The simulated service: replicas of the inference pod, their start-up, and a fluid queue model.

Time advances in steps of one second. Each replica is an M/G/c queue with the pod's admission rules:
``permits`` requests run at once for ``service_time`` each, at most ``queue_per_replica`` wait (the
pod's bounded queue: the rest get 429), and a request that would wait longer than ``deadline`` is
answered 503 without being computed (the pod's queue timeout).

The model is a *fluid* approximation, fast enough for 1,000 replicas over 24 h: arrivals are spread
evenly over the ready replicas (as kube-proxy does on average); under load the backlog is a number,
not a list of requests; while the offered load is below capacity, the random part of queueing comes
from the closed forms in :mod:`sluiceway_core.queueing` (M/M/c/K blocking for 429s, the M/M/c wait
quantile for wait p95).
``tests/scalesim/test_scalesim.py::test_fluid_model_agrees_with_the_pods_admission_core``
checks this model against the pod's
real :class:`~sluiceway_pod.admission.AdmissionCore`, driven request by request.

Pods: a replica asked for starts after a start-up delay drawn from :class:`Startup` in phases (a
new node for some, image pull, model load and warm-up, a long tail for a few); it holds a GPU from
the moment it is asked for, and Prometheus scrapes it from its container start (it warms up while
its gauges already count). A request is *on time* when it is answered within ``ServiceModel.slo``
seconds, queue wait included; *late* when answered after; *refused* when answered 429 or 503. Removing replicas
cancels pods still starting first, then drains ready ones (their queued work is finished by the
remaining capacity in this model).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np
from sluiceway_core.queueing import erlang_c, mmck_rejection, queue_bound, wait_quantile

__all__ = ["LONG", "SHORT", "STARTUPS", "FluidQueue", "PodPool", "Record", "ServiceModel", "Startup", "StepResult"]


def _beta_span(rng: np.random.Generator, span: tuple[float, float], n: int | None = None) -> np.ndarray:
    lo, hi = span
    return lo + (hi - lo) * rng.beta(2.0, 3.0, size=n)


@dataclass(frozen=True)
class Startup:
    """Pod start-up as phases (``shared/reference/autoscaling-sim.md`` §5), each ``lo + (hi - lo) *
    Beta(2, 3)`` seconds (a right-skewed bump):

    - ``node``: a new GPU node (provisioning, device plugin registering the GPU), for a share
      ``node_share`` of the pods; the others land on a warm node;
    - ``pull``: image pull and container start. From here the pod serves ``/metrics`` (it is
      scraped, ``up == 1``, its gauges count in Prometheus sums) although it is not Ready;
    - ``load``: weights, engine init, warm-up, readiness;
    - ``tail``: for a share ``tail_share`` of the pods, an outlier on top (compile or profiling
      runs of many minutes).

    ``Startup(lo, hi)`` is a single load phase (the pod is scraped only once ready), as before the
    phases were modelled."""

    lo: float = 30.0
    hi: float = 180.0
    name: str = ""
    node_share: float = 0.0
    node: tuple[float, float] = (0.0, 0.0)
    pull: tuple[float, float] = (0.0, 0.0)
    tail_share: float = 0.0
    tail: tuple[float, float] = (0.0, 0.0)
    #: False: the pod exports nothing until Ready (the single-phase model)
    scraped_while_warming: bool = False

    def sample_phases(self, rng: np.random.Generator) -> tuple[float, float]:
        """(seconds until the pod is scraped, seconds until it is Ready)."""
        node = float(_beta_span(rng, self.node)) if self.node_share > 0 and rng.random() < self.node_share else 0.0
        pull = float(_beta_span(rng, self.pull)) if self.pull[1] > 0 else 0.0
        load = float(_beta_span(rng, (self.lo, self.hi)))
        tail = float(_beta_span(rng, self.tail)) if self.tail_share > 0 and rng.random() < self.tail_share else 0.0
        ready = node + pull + load + tail
        return (node + pull if self.scraped_while_warming else ready), ready

    def sample(self, rng: np.random.Generator) -> float:
        return self.sample_phases(rng)[1]

    @property
    def mean(self) -> float:
        def m(span: tuple[float, float]) -> float:
            return span[0] + (span[1] - span[0]) * 0.4

        return self.node_share * m(self.node) + m(self.pull) + m((self.lo, self.hi)) + self.tail_share * m(self.tail)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the start-up time (seeded sample of 4,000 pods)."""
        rng = np.random.default_rng(12345)
        return float(np.quantile([self.sample(rng) for _ in range(4000)], q))

    def label(self) -> str:
        return self.name or f"{self.lo:g}-{self.hi:g}s"


#: Warm node, cached image: 30-180 s to Ready; the pod is scraped from its container start.
SHORT = Startup(25.0, 165.0, name="short", pull=(5.0, 15.0), scraped_while_warming=True)
#: GPU pods as reported (autoscaling-sim.md §5): half need a new node (80-180 s: Karpenter's
#: 80-100 s plus ~90 s until the device plugin registers the GPU), image pull 30-240 s (10-30 GB,
#: "1-10 min"), weights + engine init + warm-up 60-240 s, and 5 % with a 5-15 min compile or
#: profiling outlier: 2-10 minutes with a long tail.
LONG = Startup(
    60.0, 240.0, name="long", node_share=0.5, node=(80.0, 180.0), pull=(30.0, 240.0),
    tail_share=0.05, tail=(300.0, 900.0), scraped_while_warming=True,
)
STARTUPS = {"short": SHORT, "long": LONG}


@dataclass(frozen=True)
class ServiceModel:
    service_time: float = 0.2  # seconds per request on one permit
    permits: int = 4  # requests running at once per replica
    target_wait: float = 2.0  # queue.targetWait: the auto queue bound is permits * T / S
    deadline: float = 5.0  # timeouts.queue: waits beyond this are answered 503
    #: the request's deadline, answer included: answered later than this is "late", not on time
    slo: float = 2.0
    startup: Startup = SHORT
    gpus_per_replica: int = 1

    @property
    def queue_per_replica(self) -> int:
        return queue_bound(self.permits, self.target_wait, self.service_time)

    @property
    def replica_rate(self) -> float:
        """Requests per second one busy replica completes."""
        return self.permits / self.service_time


@dataclass
class StepResult:
    arrived: float
    refused: float  # 429: queue full
    expired: float  # 503: would wait beyond the deadline
    served: float
    queue: float  # waiting at the end of the step
    wait_p95: float  # estimated p95 queue wait of the requests admitted in this step
    busy: float  # permit-seconds used in this step
    in_service: float  # mean requests running (Little: served * S)
    late: float = 0.0  # of ``served``: answered after the request's deadline (``ServiceModel.slo``)
    held: float = 0.0  # held at the edge at the end of the step (``bench.scalesim.edge``)


class FluidQueue:
    """All replicas' queues as one fluid backlog (requests are balanced over ready replicas)."""

    def __init__(self, model: ServiceModel) -> None:
        self.model = model
        self.q = 0.0
        self._cache: dict[int, tuple[float, float, float]] = {}

    def _stochastic(self, rho: float) -> tuple[float, float, float]:
        """(429 share, wait p95, late share) of one replica at utilisation ``rho`` < 1, from closed
        forms. Late: P(W > slo - S) = C * exp(-(c mu - lambda)(slo - S)) in M/M/c.

        Cached on rho rounded to 1/200: the closed forms cost O(queue bound) each."""
        key = min(199, int(rho * 200))
        hit = self._cache.get(key)
        if hit is None:
            m = self.model
            lam = (key + 0.5) / 200 * m.replica_rate
            qmax = m.queue_per_replica
            block = mmck_rejection(m.permits, m.permits + qmax, lam, m.service_time)
            w95 = min(wait_quantile(m.permits, lam, m.service_time, 0.95), qmax * m.service_time / m.permits)
            budget = m.slo - m.service_time
            if budget <= 0:
                late = 1.0
            elif budget >= qmax * m.service_time / m.permits:
                late = 0.0  # no admitted request can wait that long
            else:
                c = erlang_c(m.permits, lam * m.service_time)
                late = min(1.0, c * math.exp(-(m.permits / m.service_time - lam) * budget))
            hit = (block, w95, late)
            self._cache[key] = hit
        return hit

    def step(self, arrived: float, ready: int, mean_rate: float | None = None) -> StepResult:
        """One second: ``arrived`` requests (a Poisson draw of ``mean_rate``) reach ``ready`` replicas.

        The closed forms use ``mean_rate``: they already hold the randomness of Poisson arrivals, so
        feeding them the drawn count would count that randomness twice."""
        m = self.model
        if ready <= 0:
            refused = arrived  # no pod: nothing can take the request (no activator in this product)
            return StepResult(arrived, refused, 0.0, 0.0, self.q, 0.0, 0.0, 0.0)
        cap = ready * m.replica_rate  # requests this step (1 s)
        rho = (arrived if mean_rate is None else mean_rate) / cap
        refused = 0.0
        w_random = 0.0
        late_share = 0.0
        q_before = self.q
        if rho < 1.0 and self.q < 1e-9:
            block, w_random, late_share = self._stochastic(rho)
            refused = arrived * block
        total = self.q + arrived - refused
        served = min(total, cap)
        q = total - served
        qmax = ready * m.queue_per_replica
        if q > qmax:
            refused += q - qmax
            q = qmax
        backlog_wait = q / cap
        expired = 0.0
        if backlog_wait > m.deadline:
            expired = q - m.deadline * cap
            q = m.deadline * cap
            backlog_wait = m.deadline
        self.q = q
        busy = served * m.service_time
        if q_before >= 1e-9 or q >= 1e-9:
            # a backlog: the requests answered now waited about the mean of the backlog's waits
            waited = (q_before + q) / 2 / cap
            late_share = 1.0 if waited + m.service_time > m.slo else late_share
        late = served * late_share
        return StepResult(arrived, refused, expired, served, q, backlog_wait + w_random, busy, busy, late)


class PodPool:
    """Replicas asked for, starting and ready; GPU-seconds held.

    A starting pod is *warming* once it serves ``/metrics`` (``Startup`` phases): Prometheus scrapes
    it (``up == 1``, its permits count in sums) although it takes no traffic yet."""

    def __init__(self, model: ServiceModel, initial: int, rng: np.random.Generator) -> None:
        self.model = model
        self.rng = rng
        self.ready = initial
        self._pods: dict[int, tuple[float, float]] = {}  # starting pod -> (scraped at, ready at)
        self._asked: dict[int, float] = {}  # starting pod -> when it was asked for
        self._by_ready: list[tuple[float, int]] = []  # heap; lazily cleaned of cancelled pods
        self._by_scraped: list[tuple[float, int]] = []
        self._warm: set[int] = set()
        self._ids = 0
        #: each ready pod's own start (what ``sluiceway_start_phase_seconds`` sums to: from its
        #: process start to ready; the node and the image pull come before it), oldest first;
        #: ``initial`` pods have reported none
        self._own: dict[int, float] = {}  # starting pod -> its own start
        self.own_starts: list[float] = []
        self.own_version = 0  # bumped whenever ``own_starts`` changes
        self.gpu_seconds = 0.0
        self.target = initial
        self.scale_events = 0
        self.directions: list[tuple[int, int]] = []  # (time, +1/-1) of each change of target

    @property
    def starting(self) -> int:
        return len(self._pods)

    @property
    def warming(self) -> int:
        """Starting pods that Prometheus already scrapes."""
        return len(self._warm)

    @property
    def scraped(self) -> int:
        return self.ready + len(self._warm)

    @property
    def total(self) -> int:
        return self.ready + len(self._pods)

    def asked_times(self) -> list[float]:
        """When each starting pod was asked for."""
        return list(self._asked.values())

    def set_target(self, n: int, now: int) -> None:
        n = max(0, n)
        if n == self.target:
            return
        self.scale_events += 1
        self.directions.append((now, 1 if n > self.target else -1))
        self.target = n
        have = self.total
        if n > have:
            for _ in range(n - have):
                scraped, ready = self.model.startup.sample_phases(self.rng)
                self._ids += 1
                self._pods[self._ids] = (now + scraped, now + ready)
                self._own[self._ids] = ready - scraped if scraped < ready else ready
                self._asked[self._ids] = now
                heapq.heappush(self._by_ready, (now + ready, self._ids))
                heapq.heappush(self._by_scraped, (now + scraped, self._ids))
        elif n < have:
            drop = have - n
            if self._pods:
                # cancel the pods that would be ready last
                last = sorted(self._pods, key=lambda i: self._pods[i][1], reverse=True)[:drop]
                for i in last:
                    del self._pods[i]
                    self._asked.pop(i, None)
                    self._own.pop(i, None)
                    self._warm.discard(i)
                drop -= len(last)
            self.ready -= drop
            # ready pods removed: those whose starts are oldest (the Deployment keeps no order we model)
            del self.own_starts[: max(0, len(self.own_starts) - self.ready)]
            self.own_version += 1

    def tick(self, now: int) -> None:
        while self._by_scraped and self._by_scraped[0][0] <= now:
            _, i = heapq.heappop(self._by_scraped)
            if i in self._pods:
                self._warm.add(i)
        while self._by_ready and self._by_ready[0][0] <= now:
            _, i = heapq.heappop(self._by_ready)
            if self._pods.pop(i, None) is not None:
                self._asked.pop(i, None)
                self._warm.discard(i)
                self.ready += 1
                self.own_starts.append(self._own.pop(i))
                self.own_version += 1
        self.gpu_seconds += self.total * self.model.gpus_per_replica


@dataclass
class Record:
    """Per-second history of one run (what Prometheus and the controllers can look at)."""

    seconds: int
    arrived: np.ndarray = field(init=False)
    refused: np.ndarray = field(init=False)
    expired: np.ndarray = field(init=False)
    served: np.ndarray = field(init=False)
    queue: np.ndarray = field(init=False)
    wait_p95: np.ndarray = field(init=False)
    busy: np.ndarray = field(init=False)
    in_service: np.ndarray = field(init=False)
    late: np.ndarray = field(init=False)
    ready: np.ndarray = field(init=False)
    scraped: np.ndarray = field(init=False)  # ready + warming pods (served /metrics)
    total: np.ndarray = field(init=False)
    target: np.ndarray = field(init=False)
    held: np.ndarray = field(init=False)  # held at the edge (0 without one)
    #: the median own start of the ready pods that reported one (``Queries.startup_seconds``; NaN: none)
    startup: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        for name in (
            "arrived", "refused", "expired", "served", "queue", "wait_p95", "busy", "in_service", "late", "held",
        ):
            setattr(self, name, np.zeros(self.seconds))
        for name in ("ready", "scraped", "total", "target"):
            setattr(self, name, np.zeros(self.seconds, dtype=np.int64))
        self.startup = np.full(self.seconds, np.nan)
        self._starts_seen = -1
        self._median = math.nan

    def put(self, t: int, r: StepResult, pool: PodPool) -> None:
        self.arrived[t] = r.arrived
        self.refused[t] = r.refused
        self.expired[t] = r.expired
        self.served[t] = r.served
        self.queue[t] = r.queue
        self.wait_p95[t] = r.wait_p95
        self.busy[t] = r.busy
        self.in_service[t] = r.in_service
        self.late[t] = r.late
        self.held[t] = r.held
        self.ready[t] = pool.ready
        self.scraped[t] = pool.scraped
        self.total[t] = pool.total
        self.target[t] = pool.target
        if pool.own_version != self._starts_seen:
            self._starts_seen = pool.own_version
            starts = pool.own_starts
            self._median = float(np.median(starts)) if starts else math.nan
        self.startup[t] = self._median


def ceil_div(a: float, b: float) -> int:
    return math.ceil(a / b - 1e-9) if a > 0 else 0
