"""The only module that talks to Prometheus (through prometheus-api-client's ``PrometheusConnect``).

Blocking I/O (``requests`` underneath), one HTTP request per query, each with a timeout and no
retries: the caller (a gRPC worker thread, or the planner CLI) decides what to do with a failure.
A :class:`PrometheusSource` holds one ``PrometheusConnect`` per address; it is safe to share between
threads as long as each query is independent (``requests.Session`` is used read-only here).

Every series is selected by the labels the scrape config sets on an InferenceService's pods:
``namespace="<ns>", inferenceservice="<name>"``.

Failure semantics for the scaler: an error, an empty result or NaN for the queue depth gives
``Signals(ok=False)`` (the policy holds). A NaN wait p95 means no request waited inside the rate
window (the histogram has no new observations); it is reported as ``wait_p95=None`` with ``ok=True``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from sluiceway_core.policy import Signals
from sluiceway_core.signals import Queries
from urllib3.util.retry import Retry

from sluiceway_scaler.errors import SourceUnavailable
from sluiceway_scaler.metrics import ScalerMetrics

__all__ = ["PrometheusSource", "Queries", "ServiceStats"]

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ServiceStats:
    """What the planner reads about a running InferenceService."""

    arrival_rate: float | None
    service_time: float | None
    concurrency: int | None
    pods: int | None


class PrometheusSource:
    def __init__(self, metrics: ScalerMetrics | None = None) -> None:
        self._metrics = metrics
        self._clients: dict[str, PrometheusConnect] = {}
        self._lock = threading.Lock()

    def _client(self, address: str, timeout: float) -> PrometheusConnect:
        key = f"{address}|{timeout}"
        with self._lock:
            c = self._clients.get(key)
            if c is None:
                c = PrometheusConnect(
                    url=address, disable_ssl=False, retry=Retry(total=0), timeout=timeout
                )
                self._clients[key] = c
            return c

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.prometheus_queries.labels(outcome).inc()

    def scalar(self, address: str, query: str, timeout: float) -> float | None:
        """One instant query that returns at most one element. ``None`` for an empty result.

        Raises :class:`SourceUnavailable` on connection errors, timeouts, non-200 answers and
        results with more than one element.
        """
        client = self._client(address, timeout)
        try:
            result: Any = client.custom_query(query, timeout=timeout)
        except (requests.RequestException, PrometheusApiClientException, ValueError) as e:
            self._count("error")
            raise SourceUnavailable(f"prometheus at {address}: {type(e).__name__}: {e}") from e
        if not result:
            self._count("empty")
            return None
        if len(result) != 1:
            self._count("error")
            raise SourceUnavailable(f"query returned {len(result)} series, expected one: {query}")
        value = float(result[0]["value"][1])
        self._count("nan" if math.isnan(value) else "ok")
        return value

    def read_signals(self, address: str, queries: Queries, timeout: float) -> tuple[Signals, int | None]:
        """The policy's signals and the number of pods up. Never raises: failures give ``ok=False``."""
        started = time.perf_counter()
        try:
            depth = self.scalar(address, queries.queue_depth, timeout)
            if depth is None:
                why = "empty: no pod of this InferenceService is scraped"
                return Signals(None, ok=False, detail=why), None
            if math.isnan(depth):
                return Signals(None, ok=False, detail="nan: queue depth is NaN"), None
            wait = self.scalar(address, queries.wait_p95, timeout)
            arrival = self.scalar(address, queries.arrival_rate, timeout)
            completion = self.scalar(address, queries.completion_rate, timeout)
            pods = self.scalar(address, queries.pods_up, timeout)
            utilisation = self.scalar(address, queries.utilisation, timeout)
        except SourceUnavailable as e:
            log.warning("prometheus read failed: %s", e.message)
            return Signals(None, ok=False, detail=f"source_unavailable: {e.message}"), None
        finally:
            if self._metrics is not None:
                self._metrics.query_seconds.observe(time.perf_counter() - started)
        return (
            Signals(
                queue_depth=depth,
                wait_p95=_finite(wait),
                arrival_rate=_finite(arrival),
                completion_rate=_finite(completion),
                utilisation=_finite(utilisation),
            ),
            int(pods) if pods is not None and math.isfinite(pods) else None,
        )

    def read_stats(self, address: str, queries: Queries, timeout: float) -> ServiceStats:
        """For the planner. Raises :class:`SourceUnavailable` when Prometheus cannot be read."""
        arrival = _finite(self.scalar(address, queries.arrival_rate, timeout))
        service = _finite(self.scalar(address, queries.service_time, timeout))
        conc = _finite(self.scalar(address, queries.concurrency, timeout))
        pods = _finite(self.scalar(address, queries.pods_up, timeout))
        return ServiceStats(
            arrival_rate=arrival,
            service_time=service,
            concurrency=int(conc) if conc is not None else None,
            pods=int(pods) if pods is not None else None,
        )


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None
