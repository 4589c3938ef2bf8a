"""The simulated service: replicas of the inference pod, their start-up, and a fluid queue model.

Time advances in steps of one second. Each replica is an M/G/c queue with the pod's admission rules:
``permits`` requests run at once for ``service_time`` each, at most ``queue_per_replica`` wait (the
pod's bounded queue: the rest get 429), and a request that would wait longer than ``deadline`` is
answered 503 without being computed (the pod's queue timeout).

The model is a *fluid* approximation, fast enough for 1,000 replicas over 24 h: arrivals are spread
evenly over the ready replicas (as kube-proxy does on average); under load the backlog is a number,
not a list of requests; while the offered load is below capacity, the random part of queueing comes
from the closed forms in :mod:`sluiceway_core.queueing` (M/M/c/K blocking for 429s, the M/M/c wait
quantile for wait p95). ``tests/scalesim/test_calibration.py`` checks this model against the pod's
real :class:`~sluiceway_pod.admission.AdmissionCore`, driven request by request.

Pods: a replica asked for starts after a start-up delay drawn from :class:`Startup` (scheduling,
image pull, model load, warm-up); it holds a GPU from the moment it is asked for. Removing replicas
cancels pods still starting first, then drains ready ones (their queued work is finished by the
remaining capacity in this model).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np
from sluiceway_core.queueing import mmck_rejection, queue_bound, wait_quantile

__all__ = ["FluidQueue", "PodPool", "Record", "ServiceModel", "Startup", "StepResult"]


@dataclass(frozen=True)
class Startup:
    """Pod start-up delay in seconds: ``lo + (hi - lo) * Beta(2, 3)`` (a right-skewed bump)."""

    lo: float = 30.0
    hi: float = 180.0

    def sample(self, rng: np.random.Generator) -> float:
        return self.lo + (self.hi - self.lo) * float(rng.beta(2.0, 3.0))

    @property
    def mean(self) -> float:
        return self.lo + (self.hi - self.lo) * 0.4


@dataclass(frozen=True)
class ServiceModel:
    service_time: float = 0.2  # seconds per request on one permit
    permits: int = 4  # requests running at once per replica
    target_wait: float = 2.0  # queue.targetWait: the auto queue bound is permits * T / S
    deadline: float = 5.0  # timeouts.queue: waits beyond this are answered 503
    startup: Startup = field(default_factory=Startup)
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


class FluidQueue:
    """All replicas' queues as one fluid backlog (requests are balanced over ready replicas)."""

    def __init__(self, model: ServiceModel) -> None:
        self.model = model
        self.q = 0.0
        self._cache: dict[int, tuple[float, float]] = {}

    def _stochastic(self, rho: float) -> tuple[float, float]:
        """(429 share, wait p95) of one replica at utilisation ``rho`` < 1, from closed forms.

        Cached on rho rounded to 1/200: the closed forms cost O(queue bound) each."""
        key = min(199, int(rho * 200))
        hit = self._cache.get(key)
        if hit is None:
            m = self.model
            lam = (key + 0.5) / 200 * m.replica_rate
            qmax = m.queue_per_replica
            block = mmck_rejection(m.permits, m.permits + qmax, lam, m.service_time)
            w95 = min(wait_quantile(m.permits, lam, m.service_time, 0.95), qmax * m.service_time / m.permits)
            hit = (block, w95)
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
        if rho < 1.0 and self.q < 1e-9:
            block, w_random = self._stochastic(rho)
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
        return StepResult(arrived, refused, expired, served, q, backlog_wait + w_random, busy, busy)


class PodPool:
    """Replicas asked for, starting and ready; GPU-seconds held."""

    def __init__(self, model: ServiceModel, initial: int, rng: np.random.Generator) -> None:
        self.model = model
        self.rng = rng
        self.ready = initial
        self._starting: list[float] = []  # heap of ready times
        self.gpu_seconds = 0.0
        self.target = initial
        self.scale_events = 0
        self.directions: list[tuple[int, int]] = []  # (time, +1/-1) of each change of target

    @property
    def starting(self) -> int:
        return len(self._starting)

    @property
    def total(self) -> int:
        return self.ready + len(self._starting)

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
                heapq.heappush(self._starting, now + self.model.startup.sample(self.rng))
        elif n < have:
            drop = have - n
            if self._starting:
                # cancel the pods that would be ready last
                keep = sorted(self._starting)[: max(0, len(self._starting) - drop)]
                drop -= len(self._starting) - len(keep)
                self._starting = keep
                heapq.heapify(self._starting)
            self.ready -= drop

    def tick(self, now: int) -> None:
        while self._starting and self._starting[0] <= now:
            heapq.heappop(self._starting)
            self.ready += 1
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
    ready: np.ndarray = field(init=False)
    total: np.ndarray = field(init=False)
    target: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        for name in ("arrived", "refused", "expired", "served", "queue", "wait_p95", "busy", "in_service"):
            setattr(self, name, np.zeros(self.seconds))
        for name in ("ready", "total", "target"):
            setattr(self, name, np.zeros(self.seconds, dtype=np.int64))

    def put(self, t: int, r: StepResult, pool: PodPool) -> None:
        self.arrived[t] = r.arrived
        self.refused[t] = r.refused
        self.expired[t] = r.expired
        self.served[t] = r.served
        self.queue[t] = r.queue
        self.wait_p95[t] = r.wait_p95
        self.busy[t] = r.busy
        self.in_service[t] = r.in_service
        self.ready[t] = pool.ready
        self.total[t] = pool.total
        self.target[t] = pool.target


def ceil_div(a: float, b: float) -> int:
    return math.ceil(a / b - 1e-9) if a > 0 else 0
