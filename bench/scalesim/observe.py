"""The metric pipeline as the controllers see it: Prometheus scrapes and rate windows.

Prometheus scrapes every ``scrape_interval`` seconds; an instant query at time ``t`` sees the last
scrape at or before ``t - 1`` (the step in progress is not yet exported). Range functions
(``rate(...[window])``, ``histogram_quantile``) cover ``window`` seconds ending at that scrape.
Every range function takes the window of the query that it models (default ``rate_window``).

What the queries really return: a pod is scraped from its container start, so while it warms up it
counts in ``sum(up == 1)`` and its permits in the utilisation's denominator (``Record.scraped``).
Each pod's scrape fails with probability ``scrape_failure`` (its ``up`` reads 0, its gauges keep the
last sample, as an instant query looks back 5 minutes), and a whole query fails with probability
``query_failure`` (Prometheus unreachable or timing out: the reader gets no data). Failures are
drawn per scrape from ``seed``, the same for every policy.

Knative's and Ray Serve's own metric paths (the autoscaler scrapes the queue-proxies every second;
replicas push every ``metrics_interval``) do not go through Prometheus:
:meth:`Prometheus.total_concurrency` reads the record directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .model import Record, ServiceModel

__all__ = ["Prometheus"]


@dataclass
class Prometheus:
    rec: Record
    model: ServiceModel
    scrape_interval: int = 15
    rate_window: int = 120
    scrape_failure: float = 0.01
    query_failure: float = 0.002
    seed: int = 0

    def __post_init__(self) -> None:
        n = self.rec.seconds // max(1, self.scrape_interval) + 2
        rng = np.random.default_rng(self.seed + 77)
        self._query_failed = rng.random(n) < self.query_failure
        self._scrape_u = rng.random(n)  # one uniform per scrape: the share of pods missed

    def failed(self, t: int) -> bool:
        """Whether the queries evaluated at ``t`` fail."""
        s = self.scrape_at(t)
        return s >= 0 and bool(self._query_failed[s // self.scrape_interval])

    def scrape_at(self, t: int) -> int:
        """Index of the last scraped second visible at time ``t`` (-1: nothing yet)."""
        if t <= 0:
            return -1
        return ((t - 1) // self.scrape_interval) * self.scrape_interval

    def _window(self, t: int, window: int | None = None) -> slice | None:
        s = self.scrape_at(t)
        if s < 0 or self.failed(t):
            return None
        w = window or self.rate_window
        return slice(max(0, s - w + 1), s + 1)

    def queue_depth(self, t: int) -> float | None:
        s = self.scrape_at(t)
        return None if s < 0 or self.failed(t) else float(self.rec.queue[s])

    def ready(self, t: int) -> int | None:
        """Pods scraped and up (``sum(up == 1)``) at the last scrape: warming pods count, pods whose
        scrape failed do not."""
        s = self.scrape_at(t)
        if s < 0 or self.failed(t):
            return None
        n = int(self.rec.scraped[s])
        # Binomial(n, p) by inversion of one seeded uniform: the same draw for every policy
        cdf = np.cumsum(_binom_pmf(n, self.scrape_failure))
        missed = int(np.searchsorted(cdf, self._scrape_u[s // self.scrape_interval]))
        return max(0, n - min(n, missed))

    def concurrency(self, t: int) -> float | None:
        """Requests in the pods, running and queued, summed (``sum(sluiceway_queue_depth) +
        sum(sluiceway_inflight)``-style instant query at the last scrape)."""
        s = self.scrape_at(t)
        return None if s < 0 or self.failed(t) else float(self.rec.queue[s] + self.rec.in_service[s])

    def pods_ready(self, t: int) -> int | None:
        """Pods that have reported their ``ready`` start phase at the last scrape
        (``Queries.pods_ready``): the ready pods (draining ones are not modelled)."""
        s = self.scrape_at(t)
        return None if s < 0 or self.failed(t) else int(self.rec.ready[s])

    def startup(self, t: int) -> float | None:
        """The pods' measured start-up at the last scrape (``Queries.startup_seconds``: the median
        of the ready pods' own starts); None before any pod reported one."""
        s = self.scrape_at(t)
        if s < 0 or self.failed(t):
            return None
        v = float(self.rec.startup[s])
        return None if math.isnan(v) else v

    def concurrency_avg(self, t: int, window: int, step: int) -> float | None:
        """The same sum averaged over ``window`` seconds, as the scaler reads it
        (``Queries.requests_in_pods_avg``: ``avg_over_time((sum + sum)[window:step])``): the sum
        evaluated at every multiple of ``step`` within ``[t - window, t]`` (Prometheus 2's closed
        range; the points are aligned to absolute time), each point seeing the last scrape visible
        then, and averaged. None when the query fails or nothing is scraped yet."""
        if self.scrape_at(t) < 0 or self.failed(t):
            return None
        step = max(1, step)
        first = -(-(t - window) // step) * step
        values = [
            float(self.rec.queue[s] + self.rec.in_service[s])
            for s in (self.scrape_at(p) for p in range(max(first, 0), t + 1, step))
            if s >= 0
        ]
        return sum(values) / len(values) if values else None

    def concurrency_live(self, t: int) -> float | None:
        """The same sum read from the pods' own ``/metrics`` at ``t`` (the scaler's pod polls,
        ``podMetricsUrls``): no scrape lag; a pod that cannot be read is skipped."""
        if t <= 0:
            return None
        s = t - 1
        share = 1.0 - self.scrape_failure
        return float(self.rec.queue[s] + self.rec.in_service[s]) * share

    def gateway_in_pods(self, t: int) -> float | None:
        """Requests in the pods, running and queued, as the gateway (issue 19/20) counts them: it
        forwards every request and sees every answer, so the count is exact and current (the last
        whole second), with no scrape and no scrape failures."""
        if t <= 0:
            return None
        return float(self.rec.queue[t - 1] + self.rec.in_service[t - 1])

    def gateway_offered(self, t: int, window: int) -> float | None:
        """Requests offered per second over the last ``window`` whole seconds, counted by the gateway
        (every request passes it, answered or refused)."""
        if t <= 0:
            return None
        return float(self.rec.arrived[max(0, t - window) : t].mean())

    def total_concurrency(self, t: int, window: int) -> float | None:
        """Mean over the last ``window`` seconds of the requests in all pods (running + queued) and
        those held at the edge (0 without one): Knative's collector (1-s scrapes of every pod scaled
        to the revision's total, the activator's buffered requests included) and Ray Serve's ongoing
        requests (the handles' queued ones included). No Prometheus lag."""
        if t <= 0:
            return None
        lo = max(0, t - window)
        return float((self.rec.queue[lo:t] + self.rec.in_service[lo:t] + self.rec.held[lo:t]).mean())

    def held(self, t: int) -> float | None:
        """Requests held at the edge at the last scrape (our gateway's
        ``sluiceway_gateway_held_requests``; 0 without an edge)."""
        s = self.scrape_at(t)
        return None if s < 0 or self.failed(t) else float(self.rec.held[s])

    def edge_pending(self, t: int) -> float | None:
        """Requests held at the edge plus those in the pods at the last whole second, as the edge
        counts them (our gateway, KEDA's interceptor): exact and current."""
        if t <= 0:
            return None
        s = t - 1
        return float(self.rec.held[s] + self.rec.queue[s] + self.rec.in_service[s])

    def wait_p95(self, t: int, window: int | None = None) -> float | None:
        """95th percentile queue wait over the window (None: nothing was admitted)."""
        w = self._window(t, window)
        if w is None:
            return None
        weights = self.rec.arrived[w] - self.rec.refused[w]
        total = float(weights.sum())
        if total <= 0:
            return None
        values = self.rec.wait_p95[w]
        order = np.argsort(values)
        cum = np.cumsum(weights[order])
        idx = int(np.searchsorted(cum, 0.95 * total))
        return float(values[order][min(idx, len(order) - 1)])

    def utilisation(self, t: int, window: int | None = None) -> float | None:
        w = self._window(t, window)
        if w is None:
            return None
        capacity = float((self.rec.scraped[w] * self.model.permits).sum())  # warming pods' permits count
        return None if capacity <= 0 else float(self.rec.busy[w].sum()) / capacity

    def admitted_rate(self, t: int, window: int | None = None) -> float | None:
        w = self._window(t, window)
        if w is None:
            return None
        return float((self.rec.arrived[w] - self.rec.refused[w]).mean())

    def completed_rate(self, t: int, window: int | None = None) -> float | None:
        w = self._window(t, window)
        return None if w is None else float(self.rec.served[w].mean())

    def request_cost(self, t: int, window: int | None = None) -> float | None:
        """Device seconds per answered request over the window (``rate(inference_seconds_sum)`` over
        ``rate(requests_total{code="200"})``)."""
        w = self._window(t, window)
        if w is None:
            return None
        served = float(self.rec.served[w].sum())
        return None if served <= 0 else float(self.rec.busy[w].sum()) / served

    def offered_rate(self, t: int, window: int | None = None) -> float | None:
        w = self._window(t, window)
        return None if w is None else float(self.rec.arrived[w].mean())

    def offered_trend(self, t: int, span: int = 300, window: int = 60) -> float | None:
        """Slope (requests/s per second) of the offered rate over ``span`` seconds, like PromQL
        ``deriv(sum(rate(sluiceway_requests_total[1m]))[5m:15s])``."""
        s = self.scrape_at(t)
        if s < span:
            return None
        points = list(range(s - span + self.scrape_interval, s + 1, self.scrape_interval))
        rates = [float(self.rec.arrived[max(0, p - window + 1) : p + 1].mean()) for p in points]
        if len(points) < 3:
            return None
        x = np.asarray(points, dtype=float)
        return float(np.polyfit(x, np.asarray(rates), 1)[0])


def _binom_pmf(n: int, p: float) -> np.ndarray:
    """Binomial(n, p) probabilities of 0..min(n, 20) misses (enough for p of a few percent)."""
    k = np.arange(min(n, 20) + 1)
    from math import comb

    return np.array([comb(n, int(i)) * p**i * (1 - p) ** (n - i) for i in k])
