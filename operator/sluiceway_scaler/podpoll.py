"""Direct reads of the pods' own ``/metrics`` for fast activation (StreamIsActive / IsActive).

Through Prometheus the first queued request becomes visible only after the next scrape plus the
scaler's next query (up to two scrape intervals). With ``podMetricsUrls`` in the trigger metadata
the scaler reads the pods directly instead, so ``true`` is pushed within one activation poll
interval of the first request. Blocking I/O (:func:`sluiceway_core.httpget.http_get`: one GET per
URL, a hard deadline, answers capped at 8 MiB); called from a gRPC worker thread. A pod that cannot
be read, or whose numbers are not finite and non-negative, is skipped; if none can be read the
result is ``None`` (unknown), which never deactivates the service.

A URL may also be a gateway's ``/metrics`` (issue 20): its held requests count as queued, and its
refusals for want of a pod (the hold queue's bounds and ``metric_names.GATEWAY_WANT_OF_POD_REASONS``) as
requests enqueued, so the first request held or refused at zero activates within one poll. The
trigger's Prometheus signals are consulted as well when no URL shows activity
(:meth:`sluiceway_scaler.service.ExternalScalerService.activity`), and when the only activity is a
pod still loading (:meth:`PodActivity.only_starting`: Prometheus tells a crash loop or a load past
its bound from a start, issue 20).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from sluiceway_core import metric_names as m
from sluiceway_core.httpget import FetchError, http_get

from sluiceway_scaler.metrics import ScalerMetrics

__all__ = ["PodActivity", "poll_pods"]


@dataclass(frozen=True)
class PodActivity:
    queue_depth: float
    in_use: float
    enqueued: float
    pods_read: int
    #: pods that answered and have not been ready yet (loading: a pod's ``sluiceway_ready`` exists from
    #: its start, its ``sluiceway_start_phase_seconds{phase="ready"}`` only once it was ready, so a
    #: draining pod, ready before, does not count)
    starting: int = 0

    def active_since(self, previous: PodActivity | None) -> bool:
        """Anything queued or running now, a pod still starting, or any request enqueued since
        ``previous``."""
        if self.queue_depth > 0 or self.in_use > 0 or self.starting > 0:
            return True
        return previous is not None and self.enqueued > previous.enqueued

    def only_starting(self, previous: PodActivity | None) -> bool:
        """Active only because a pod has not been ready yet: nothing queued, running or enqueued
        since ``previous``. A pod's own ``/metrics`` cannot tell a first load from a crash loop (each
        restart loads again) or a load that never ends; the scaler asks Prometheus, which keeps the
        pod's history (``Queries.starting_pods``)."""
        return (
            self.starting > 0
            and self.queue_depth <= 0
            and self.in_use <= 0
            and not (previous is not None and self.enqueued > previous.enqueued)
        )


_MAX_BYTES = 8 << 20
_QUEUED = (m.QUEUE_DEPTH, m.GATEWAY_HELD)
_ENQUEUED = (m.ENQUEUED, m.GATEWAY_HOLD_REFUSED)
_WANTED = (*_QUEUED, m.CONCURRENCY_IN_USE, *_ENQUEUED, m.GATEWAY_REFUSED)


def _read(url: str, timeout: float) -> tuple[float, float, float, bool]:
    """``(queued, in use, enqueued, starting)``. Raises FetchError, or ValueError for an answer that
    is not usable exposition text. Starting: a pod's answer (it has ``sluiceway_ready``; a gateway's
    has not) without the ``ready`` start phase."""
    status, body = http_get(url, timeout, _MAX_BYTES)
    if status != 200:
        raise ValueError(f"HTTP {status}")
    sums = dict.fromkeys(_WANTED, 0.0)
    pod = was_ready = False
    for fam in text_string_to_metric_families(body.decode("utf-8", "replace")):
        for s in fam.samples:
            name = s.name
            if name == m.READY:
                pod = True
            elif name == m.START_PHASE_SECONDS and s.labels.get("phase") == "ready":
                was_ready = True
            if name == m.GATEWAY_REFUSED and s.labels.get("reason") not in m.GATEWAY_WANT_OF_POD_REASONS:
                continue
            if name in sums:
                if not (math.isfinite(s.value) and s.value >= 0):
                    raise ValueError(f"{name} is {s.value}")
                sums[name] += s.value
    queued = sum(sums[n] for n in _QUEUED)
    enqueued = sum(sums[n] for n in _ENQUEUED) + sums[m.GATEWAY_REFUSED]
    return queued, sums[m.CONCURRENCY_IN_USE], enqueued, pod and not was_ready


def poll_pods(
    urls: tuple[str, ...], timeout: float, metrics: ScalerMetrics | None = None
) -> PodActivity | None:
    depth = in_use = enqueued = 0.0
    n = starting = 0
    for url in urls:
        try:
            d, u, e, loading = _read(url, timeout)
        except (FetchError, ValueError, TypeError, IndexError):
            if metrics is not None:
                metrics.pod_polls.labels("error").inc()
            continue
        if metrics is not None:
            metrics.pod_polls.labels("ok").inc()
        depth, in_use, enqueued, n = depth + d, in_use + u, enqueued + e, n + 1
        starting += int(loading)
    if n == 0:
        return None
    return PodActivity(depth, in_use, enqueued, n, starting)
