"""Prometheus: a small blocking query client. The PromQL itself is :mod:`sluiceway_core.signals`.

:func:`query_scalar` and :func:`query_vector` do blocking HTTP with a timeout; the kopf handlers run it in kopf's thread
pool (they are sync handlers), never on the event loop.
"""

from __future__ import annotations

import json
import math
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["PrometheusError", "query_scalar", "query_vector"]


class PrometheusError(RuntimeError):
    """Prometheus could not be queried or answered something unusable."""


def _instant(base_url: str, promql: str, timeout: float) -> list[dict[str, Any]]:
    url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            payload = json.loads(resp.read())
    except (OSError, ValueError) as err:
        raise PrometheusError(f"query to {base_url} failed: {err}") from err
    if payload.get("status") != "success":
        raise PrometheusError(f"query to {base_url} failed: {payload.get('error', payload)}")
    result: list[dict[str, Any]] = payload["data"]["result"]
    return result


def query_scalar(base_url: str, promql: str, timeout: float = 5.0) -> float | None:
    """Run an instant query. ``None`` when the result is empty, NaN or infinite; raises PrometheusError."""
    result = _instant(base_url, promql, timeout)
    if not result:
        return None
    value = float(result[0]["value"][1])
    return value if math.isfinite(value) else None  # NaN (nothing observed) and Inf (x/0) alike


def query_vector(base_url: str, promql: str, label: str, timeout: float = 5.0) -> dict[str, float]:
    """Run an instant query that answers one series per value of ``label`` (``sum by (label)``):
    ``{label value: value}``, leaving out series without the label and NaN/infinite values.
    Raises PrometheusError."""
    out: dict[str, float] = {}
    for series in _instant(base_url, promql, timeout):
        key = (series.get("metric") or {}).get(label)
        value = float(series["value"][1])
        if key is not None and math.isfinite(value):
            out[str(key)] = value
    return out
