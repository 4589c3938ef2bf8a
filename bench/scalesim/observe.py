"""The metric pipeline as the controllers see it: Prometheus scrapes and rate windows.

Prometheus scrapes every ``scrape_interval`` seconds; an instant query at time ``t`` sees the last
scrape at or before ``t - 1`` (the step in progress is not yet exported). Range functions
(``rate(...[window])``, ``histogram_quantile``) cover ``window`` seconds ending at that scrape.
Only ready pods are scraped (a starting pod exports nothing yet). Every range function takes the
window of the query that it models (default ``rate_window``).
"""

from __future__ import annotations

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

    def scrape_at(self, t: int) -> int:
        """Index of the last scraped second visible at time ``t`` (-1: nothing yet)."""
        if t <= 0:
            return -1
        return ((t - 1) // self.scrape_interval) * self.scrape_interval

    def _window(self, t: int, window: int | None = None) -> slice | None:
        s = self.scrape_at(t)
        if s < 0:
            return None
        w = window or self.rate_window
        return slice(max(0, s - w + 1), s + 1)

    def queue_depth(self, t: int) -> float | None:
        s = self.scrape_at(t)
        return None if s < 0 else float(self.rec.queue[s])

    def ready(self, t: int) -> int | None:
        """Pods scraped and up (``sum(up == 1)``) at the last scrape."""
        s = self.scrape_at(t)
        return None if s < 0 else int(self.rec.ready[s])

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
        capacity = float((self.rec.ready[w] * self.model.permits).sum())
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

    def concurrency_per_pod(self, t: int, window: int) -> float | None:
        """Mean requests in the pod (running + queued) per ready pod over the last ``window`` seconds
        (Knative's queue-proxy and Ray Serve's ongoing requests). Sampled every second, no scrape lag."""
        if t <= 0:
            return None
        lo = max(0, t - window)
        ready = self.rec.ready[lo:t].astype(float)
        conc = self.rec.queue[lo:t] + self.rec.in_service[lo:t]
        mask = ready > 0
        if not mask.any():
            return None
        return float((conc[mask] / ready[mask]).mean())
