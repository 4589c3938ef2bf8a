"""Direct reads of the pods' own ``/metrics`` for fast activation (StreamIsActive / IsActive).

Through Prometheus the first queued request becomes visible only after the next scrape plus the
scaler's next query (up to two scrape intervals). With ``podMetricsUrls`` in the trigger metadata
the scaler reads the pods directly instead, so ``true`` is pushed within one activation poll
interval of the first request. Blocking I/O (urllib, one GET per URL with a timeout); called from a
gRPC worker thread. A pod that cannot be read is skipped; if none can be read the result is
``None`` (unknown), which never deactivates the service.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from sluiceway_scaler.metrics import ScalerMetrics

__all__ = ["PodActivity", "poll_pods"]


@dataclass(frozen=True)
class PodActivity:
    queue_depth: float
    in_use: float
    enqueued: float
    pods_read: int

    def active_since(self, previous: PodActivity | None) -> bool:
        """Anything queued or running now, or any request enqueued since ``previous``."""
        if self.queue_depth > 0 or self.in_use > 0:
            return True
        return previous is not None and self.enqueued > previous.enqueued


def _read(url: str, timeout: float) -> tuple[float, float, float]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode("utf-8", "replace")
    depth = in_use = enqueued = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "sluiceway_queue_depth":
                depth += s.value
            elif s.name == "sluiceway_concurrency_in_use":
                in_use += s.value
            elif s.name == "sluiceway_enqueued_total":
                enqueued += s.value
    return depth, in_use, enqueued


def poll_pods(
    urls: tuple[str, ...], timeout: float, metrics: ScalerMetrics | None = None
) -> PodActivity | None:
    depth = in_use = enqueued = 0.0
    n = 0
    for url in urls:
        try:
            d, u, e = _read(url, timeout)
        except (OSError, ValueError):
            if metrics is not None:
                metrics.pod_polls.labels("error").inc()
            continue
        if metrics is not None:
            metrics.pod_polls.labels("ok").inc()
        depth, in_use, enqueued, n = depth + d, in_use + u, enqueued + e, n + 1
    if n == 0:
        return None
    return PodActivity(depth, in_use, enqueued, n)
