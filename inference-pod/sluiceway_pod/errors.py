"""The pod's one error taxonomy and its one map to HTTP.

Every way a request can fail is a subclass of :class:`SluicewayError` carrying a stable
``reason`` (also the ``reason`` label of ``sluiceway_rejected_total``). :func:`http_status` is the
only place that decides status codes; the HTTP layer turns any :class:`SluicewayError` into
``{"error": message, "reason": reason}`` with that status and the optional ``Retry-After`` header.

Server faults never carry the model's own exception text to the client: they are logged with a
short ``error_id`` and the client gets only that id (``"errorId"`` in the body), see :func:`new_error_id`.
"""

from __future__ import annotations

import math
import secrets


class SluicewayError(Exception):
    reason: str = "internal"

    def __init__(self, message: str, *, retry_after: float | None = None, error_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.error_id = error_id

    def retry_after_header(self) -> str | None:
        if self.retry_after is None:
            return None
        return str(max(1, math.ceil(self.retry_after)))


# --- client mistakes -------------------------------------------------------------------------
class InvalidInput(SluicewayError):
    """Malformed body, wrong tensor shape or dtype, bad header value."""

    reason = "invalid_input"


class PayloadTooLarge(SluicewayError):
    reason = "payload_too_large"


class BodyTimeout(SluicewayError):
    """The request body did not arrive within ``server.bodyTimeoutSeconds``."""

    reason = "body_timeout"


class ModelNotFound(SluicewayError):
    reason = "model_not_found"


class Unauthenticated(SluicewayError):
    reason = "unauthenticated"


class PriorityForbidden(SluicewayError):
    """The tenant asked for a priority class above its ``maxPriority``."""

    reason = "priority_forbidden"


# --- admission rejections (load shedding) ----------------------------------------------------
class QueueFull(SluicewayError):
    reason = "queue_full"


class TenantQueueFull(SluicewayError):
    reason = "tenant_queue_full"


class RateLimited(SluicewayError):
    reason = "rate_limited"


class Overloaded(SluicewayError):
    """Predicted wait over the degradation threshold and no degraded answer was possible."""

    reason = "overloaded"


class BodyBudgetSpent(SluicewayError):
    """The pod's budget for request bodies in flight (``server.maxInflightBodyBytes``) is spent."""

    reason = "body_budget"


class QueueTimeout(SluicewayError):
    reason = "queue_timeout"


class DeadlineUnmeetable(SluicewayError):
    """The client's ``X-Sluiceway-Deadline-Ms`` budget ran out (or will, by prediction) in the queue."""

    reason = "deadline"


class DeadlineExpired(SluicewayError):
    """The client's deadline passed (minus the expected service time) while the request was queued."""

    reason = "deadline_expired"


class Displaced(SluicewayError):
    """The queue was full and a higher-priority request took this (lower-priority, queued) one's place."""

    reason = "displaced"


class Draining(SluicewayError):
    reason = "draining"


class NotReady(SluicewayError):
    reason = "not_ready"


class ExecTimeout(SluicewayError):
    reason = "exec_timeout"


# --- server faults ---------------------------------------------------------------------------
class ModelError(SluicewayError):
    """The model raised while computing (after the OOM retry, if any)."""

    reason = "model_error"


class DeviceOutOfMemory(SluicewayError):
    """The device ran out of memory twice for the same work (after shrinking permits and one retry)."""

    reason = "oom"


class ClientGone(SluicewayError):
    """The client disconnected while its request was queued; nobody reads the answer."""

    reason = "client_disconnected"


_HTTP: dict[type[SluicewayError], int] = {
    InvalidInput: 400,
    Unauthenticated: 401,
    PriorityForbidden: 403,
    ModelNotFound: 404,
    PayloadTooLarge: 413,
    BodyTimeout: 408,
    QueueFull: 429,
    TenantQueueFull: 429,
    RateLimited: 429,
    Overloaded: 429,
    BodyBudgetSpent: 429,
    QueueTimeout: 503,
    DeadlineUnmeetable: 503,
    DeadlineExpired: 503,
    Displaced: 429,
    Draining: 503,
    NotReady: 503,
    ExecTimeout: 504,
    ModelError: 500,
    DeviceOutOfMemory: 503,
    ClientGone: 499,
}


def new_error_id() -> str:
    """A short random id that ties a client's 500 to the pod's log line (never the exception text)."""
    return secrets.token_hex(6)


def http_status(err: SluicewayError) -> int:
    for cls in type(err).__mro__:
        if cls in _HTTP:
            return _HTTP[cls]
    return 500

