"""Prometheus: the PromQL for one InferenceService, and a small blocking query client.

The query builders are pure and shared by the renderer (KEDA ``prometheus`` triggers) and the
operator's status and built-in autoscaling engine. Series of one service carry the labels
``namespace`` and ``inferenceservice`` (set by the ServiceMonitor relabeling).

:func:`query_scalar` does blocking HTTP with a timeout; the kopf handlers run it in kopf's thread
pool (they are sync handlers), never on the event loop.
"""

from __future__ import annotations

import json
import math
import urllib.parse
import urllib.request

__all__ = ["PrometheusError", "query_scalar", "queue_depth_query", "wait_p95_query"]


class PrometheusError(RuntimeError):
    """Prometheus could not be queried or answered something unusable."""


def _selector(namespace: str, name: str) -> str:
    return f'namespace="{namespace}",inferenceservice="{name}"'


def queue_depth_query(namespace: str, name: str) -> str:
    """Requests waiting over all pods of the service."""
    return f"sum(sluiceway_queue_depth{{{_selector(namespace, name)}}})"


def wait_p95_query(namespace: str, name: str, window: str = "2m") -> str:
    """95th percentile queue wait in seconds over ``window`` (NaN when nothing waited)."""
    return (
        "histogram_quantile(0.95, sum by (le) "
        f"(rate(sluiceway_queue_wait_seconds_bucket{{{_selector(namespace, name)}}}[{window}])))"
    )


def concurrency_query(namespace: str, name: str) -> str:
    """GPU permits in force per pod (the smallest over pods)."""
    return f"min(sluiceway_concurrency_limit{{{_selector(namespace, name)}}})"


def utilisation_query(namespace: str, name: str, window: str = "2m") -> str:
    """Busy share of the GPU permits: device-seconds per second over the permits in force."""
    sel = _selector(namespace, name)
    return (
        f"sum(rate(sluiceway_inference_seconds_sum{{{sel}}}[{window}])) / sum(sluiceway_concurrency_limit{{{sel}}})"
    )


def query_scalar(base_url: str, promql: str, timeout: float = 5.0) -> float | None:
    """Run an instant query. ``None`` when the result is empty or NaN; raises PrometheusError."""
    url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            payload = json.loads(resp.read())
    except (OSError, ValueError) as err:
        raise PrometheusError(f"query to {base_url} failed: {err}") from err
    if payload.get("status") != "success":
        raise PrometheusError(f"query to {base_url} failed: {payload.get('error', payload)}")
    result = payload["data"]["result"]
    if not result:
        return None
    value = float(result[0]["value"][1])
    return None if math.isnan(value) else value
