"""Prometheus readings of the operator, through the one client of every component
(:func:`sluiceway_core.promclient.instant_query`). The PromQL itself is :mod:`sluiceway_core.signals`.

Every query is checked against the operator's allow-list before any connection (a spec's
``autoscaling.prometheusAddress`` is written by the object's author), has a total deadline (a server
that trickles bytes cannot hold a loop worker past it) and a size cap, and fails with
:class:`~sluiceway_core.promclient.PromError`, whose message never contains what the server sent, so
nothing read from an arbitrary server reaches a status, an Event or a log line. Credentials come
from the operator's ``SLUICEWAY_PROMETHEUS_AUTH_FILE`` (``auth=``); an entry applies only to an
address the allow-list admits, and no secret appears in an error.

Concurrency: blocking and stateless; the tickers' worker threads call it, never the event loop.
"""

from __future__ import annotations

import math

from sluiceway_core.promauth import PromAuth
from sluiceway_core.promclient import PromError, PromGarbage, instant_query
from sluiceway_core.urls import UrlAllowList

__all__ = ["MAX_ANSWER_BYTES", "PrometheusError", "query_scalar", "query_vector"]

#: The operator's cap on one answer: its queries answer a handful of series (the operator runs in
#: 256 MiB with four loop workers).
MAX_ANSWER_BYTES = 1 << 20

#: Every failure of a query (the shared client's error taxonomy).
PrometheusError = PromError


def _value(sample: dict[str, object], where: str) -> float:
    raw = sample["value"]
    assert isinstance(raw, list)  # instant_query checked the shape
    try:
        return float(raw[1])
    except (TypeError, ValueError):
        raise PromGarbage(f"Prometheus at {where}: a sample value is not a number") from None


def query_scalar(
    address: str, promql: str, *, allow: UrlAllowList, timeout: float = 5.0, auth: PromAuth | None = None
) -> float | None:
    """One instant query's first value; ``None`` when empty, NaN or infinite. Raises PromError.
    ``auth``: the operator's credentials file (its entry for ``address``, if any, is used)."""
    result = instant_query(address, promql, allow=allow, timeout=timeout, max_bytes=MAX_ANSWER_BYTES, auth=auth)
    if not result:
        return None
    value = _value(result[0], address)
    return value if math.isfinite(value) else None  # NaN (nothing observed) and Inf (x/0) alike


def query_vector(
    address: str,
    promql: str,
    label: str,
    *,
    allow: UrlAllowList,
    timeout: float = 5.0,
    auth: PromAuth | None = None,
) -> dict[str, float]:
    """One series per value of ``label`` (``sum by (label)``): ``{label value: value}``, leaving out
    series without the label and NaN/infinite values. Raises PromError."""
    out: dict[str, float] = {}
    series_list = instant_query(address, promql, allow=allow, timeout=timeout, max_bytes=MAX_ANSWER_BYTES, auth=auth)
    for series in series_list:
        metric = series.get("metric")
        key = metric.get(label) if isinstance(metric, dict) else None
        value = _value(series, address)
        if isinstance(key, str) and math.isfinite(value):
            out[key] = value
    return out
