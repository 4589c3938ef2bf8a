"""The gateway's one error taxonomy and its one map to HTTP.

Every way the gateway itself answers a request with an error is a :class:`GatewayError` with a stable
``reason`` (the ``reason`` label of ``sluiceway_gateway_refused_total``); :func:`http_status` is the
only place that decides status codes, :func:`error_body` the only place that encodes the body: the
pod's shape, ``{"error": message, "reason": reason}``, so clients see one format whoever answered.
"""

from __future__ import annotations

import json
import math


class GatewayError(Exception):
    reason: str = "internal"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    def retry_after_header(self) -> str | None:
        if self.retry_after is None:
            return None
        return str(max(1, math.ceil(self.retry_after)))


class BadRequest(GatewayError):
    reason = "invalid_input"


class Unauthenticated(GatewayError):
    reason = "unauthenticated"


class PriorityForbidden(GatewayError):
    reason = "priority_forbidden"


class NotFound(GatewayError):
    reason = "not_found"


class BodyTimeout(GatewayError):
    reason = "body_timeout"


class PayloadTooLarge(GatewayError):
    reason = "payload_too_large"


class HeadersTooLarge(GatewayError):
    reason = "headers_too_large"


class RateLimited(GatewayError):
    reason = "rate_limited"


class TenantQueueFull(GatewayError):
    reason = "tenant_queue_full"


class TooManyConnections(GatewayError):
    reason = "too_many_connections"


class NoReadyPods(GatewayError):
    """No endpoint is ready (none discovered, all draining, not ready or unreachable)."""

    reason = "no_ready_pods"


class UpstreamLost(GatewayError):
    """The pod's connection failed after the request was sent. ``unstarted``: the gateway asked the
    pod for the start signal and none came (the pod had only queued the request), so the request may
    be sent once more to another pod; otherwise it may have run, and it is not retried."""

    reason = "upstream_lost"

    def __init__(self, message: str, *, unstarted: bool = False) -> None:
        super().__init__(message)
        self.unstarted = unstarted


class DeadlineExceeded(GatewayError):
    reason = "deadline"


class ShuttingDown(GatewayError):
    reason = "gateway_draining"


class _HoldBound(GatewayError):
    def __init__(self, message: str, *, retry_after: float | None = None, bound: str = "full") -> None:
        super().__init__(message, retry_after=retry_after)
        #: which bound refused it (the ``reason`` label of ``sluiceway_gateway_hold_refused_total``)
        self.bound = bound


class HoldFull(_HoldBound):
    """No pod can take the request and the hold queue is at its count or byte bound."""

    reason = "hold_full"


class HoldTenantFull(_HoldBound):
    """The tenant already holds its share of the hold queue."""

    reason = "hold_tenant_full"


class HoldExpired(GatewayError):
    """The request's deadline passed while it was held (no pod could take it in time)."""

    reason = "hold_timeout"


class NoCapacityInTime(GatewayError):
    """No pod can take the request and the predicted time until one can (a pod starting, then the
    requests held ahead of it) is past the request's deadline: refused at once, ``Retry-After`` the
    prediction, instead of held until it times out."""

    reason = "no_capacity_in_time"


class ClientGone(GatewayError):
    """The client closed its connection while its request was held: dropped, never sent to a pod."""

    reason = "client_closed"


_HTTP: dict[type[GatewayError], int] = {
    BadRequest: 400,
    Unauthenticated: 401,
    PriorityForbidden: 403,
    NotFound: 404,
    BodyTimeout: 408,
    PayloadTooLarge: 413,
    HeadersTooLarge: 431,
    RateLimited: 429,
    TenantQueueFull: 429,
    TooManyConnections: 503,
    NoReadyPods: 503,
    UpstreamLost: 502,
    DeadlineExceeded: 504,
    ShuttingDown: 503,
    HoldFull: 503,
    HoldTenantFull: 429,
    HoldExpired: 504,
    NoCapacityInTime: 503,
    ClientGone: 499,  # nginx's "client closed request": logged and counted, never seen by the client
}


def http_status(err: GatewayError) -> int:
    for cls in type(err).__mro__:
        if cls in _HTTP:
            return _HTTP[cls]
    return 500


def error_body(err: GatewayError) -> bytes:
    return json.dumps({"error": err.message, "reason": err.reason}).encode()
