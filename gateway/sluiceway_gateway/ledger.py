"""The per-pod load ledger: what each pod last said about its load, plus what the gateway has in flight.

Every pod answer may carry its state in response headers (docs/gateway.md):

=============================  ==============================================
``sluiceway-queue-depth``      requests waiting in the pod's queue
``sluiceway-permits``          ``<in use>/<limit>`` device permits
``sluiceway-predicted-wait-ms``  the pod's own queue-wait prediction
``sluiceway-draining``         ``1`` once the pod drains (no new requests)
``sluiceway-degradation``      the pod's degradation level (0 = none)
=============================  ==============================================

Headers are optional: without them the ledger still counts the gateway's in-flight requests per pod
and an EWMA of each pod's answer time, which is what :func:`predicted_wait_ms` falls back on.

Concurrency model: owned by the gateway's event loop; nothing here blocks or awaits. Time is passed in
(``now``), never read here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

QUEUE_DEPTH = "sluiceway-queue-depth"
PERMITS = "sluiceway-permits"
PREDICTED_WAIT = "sluiceway-predicted-wait-ms"
DRAINING = "sluiceway-draining"
DEGRADATION = "sluiceway-degradation"
LOAD_HEADERS = (QUEUE_DEPTH, PERMITS, PREDICTED_WAIT, DRAINING, DEGRADATION)

_MAX_REPORTED = 1e9
#: ``sluiceway-degradation: 2``: the pod's queue is full
QUEUE_FULL_LEVEL = 2
FULL_PENALTY_MS = 1e7


@dataclass
class PodLoad:
    """One pod's entry. ``reported_*`` are ``None`` until the pod sends that header."""

    key: str
    inflight: int = 0
    queue_depth: int | None = None
    permits_in_use: int | None = None
    permits_limit: int | None = None
    reported_wait_ms: float | None = None
    reported_at: float = 0.0
    inflight_at_report: int = 0
    draining: bool = False
    degradation: int = 0
    heard_at: float = 0.0
    #: unreachable until a poll or an answer says otherwise (connect failed, connection lost)
    down: bool = False
    #: discovery says ready (an EndpointSlice endpoint ready and not terminating)
    ready: bool = True
    ewma_ms: float = field(default=0.0)
    answers: int = 0

    def heard(self, now: float) -> None:
        self.heard_at = now
        self.down = False


def _num(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        v = float(text.strip())
    except ValueError:
        return None
    if v != v or v < 0 or v > _MAX_REPORTED:  # NaN, negative or absurd: ignored
        return None
    return v


def apply_headers(pod: PodLoad, headers: Mapping[str, str], now: float, answered: int = 0) -> bool:
    """Read the load headers (lower-case names) of one answer into ``pod``; returns whether any was
    present. Malformed values are ignored, never raised. ``answered``: how many of ``pod.inflight``
    this answer is for (1 for a forwarded request's answer, 0 for a poll): the pod's report already
    left that request out, so it is not counted as sent since the report."""
    seen = False
    depth = _num(headers.get(QUEUE_DEPTH))
    if depth is not None:
        pod.queue_depth, seen = int(depth), True
    permits = headers.get(PERMITS)
    if permits is not None:
        used, _, limit = permits.partition("/")
        u, lim = _num(used), _num(limit)
        if u is not None and lim is not None and lim >= 1:
            pod.permits_in_use, pod.permits_limit, seen = int(u), int(lim), True
    wait = _num(headers.get(PREDICTED_WAIT))
    if wait is not None:
        pod.reported_wait_ms, seen = wait, True
    drain = headers.get(DRAINING)
    if drain is not None and drain.strip() in ("0", "1"):
        pod.draining, seen = drain.strip() == "1", True
    level = _num(headers.get(DEGRADATION))
    if level is not None:
        pod.degradation, seen = int(level), True
    if seen:
        pod.reported_at = now
        pod.inflight_at_report = max(0, pod.inflight - answered)
    pod.heard(now)
    return seen


def observe_latency(pod: PodLoad, ms: float, alpha: float = 0.2) -> None:
    """Fold one answer time into the pod's EWMA (the first answer sets it)."""
    pod.ewma_ms = ms if pod.answers == 0 else pod.ewma_ms + alpha * (ms - pod.ewma_ms)
    pod.answers += 1


def predicted_wait_ms(pod: PodLoad) -> float:
    """Expected wait of one more request on ``pod``: the pod's last reported wait plus what the gateway
    sent it since, each costing the pod's mean answer time divided over its permits; without a report,
    the gateway's own in-flight count on the same terms; a pod whose last report said its queue is full
    (degradation level 2) ranks behind every pod that did not. Pure."""
    if pod.degradation >= QUEUE_FULL_LEVEL:
        # the pod said its queue is full: it would refuse (429 queue_full) until an answer says otherwise
        return FULL_PENALTY_MS + _plain_wait(pod)
    return _plain_wait(pod)


def _plain_wait(pod: PodLoad) -> float:
    permits = max(1, pod.permits_limit or 1)
    per_request = max(pod.ewma_ms, 0.01) / permits
    if pod.reported_wait_ms is not None:
        since = max(0, pod.inflight - pod.inflight_at_report)
        return pod.reported_wait_ms + since * per_request
    queued = pod.queue_depth or 0
    return (queued + pod.inflight) * per_request


def routable(pod: PodLoad) -> bool:
    return pod.ready and not pod.draining and not pod.down


def stale(pod: PodLoad, now: float, after_s: float) -> bool:
    """Not heard from within ``after_s`` and nothing in flight that will report: poll it."""
    return now - pod.heard_at >= after_s and pod.inflight == 0
