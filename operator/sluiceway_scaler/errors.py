"""The scaler's one error taxonomy and its one map to gRPC status codes.

Every failure the scaler reports to KEDA is a :class:`ScalerError` subclass with a stable ``reason``
(also the ``reason`` label of ``sluiceway_scaler_errors_total``). :func:`grpc_code` is the only place
that decides status codes; :mod:`sluiceway_scaler.service` aborts the RPC with it.
"""

from __future__ import annotations

import grpc


class ScalerError(Exception):
    reason: str = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidMetadata(ScalerError):
    """A trigger metadata key is missing or malformed. ``field`` names the key."""

    reason = "invalid_metadata"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"scalerMetadata.{field}: {message}")
        self.field = field


class AddressNotAllowed(InvalidMetadata):
    """The trigger names a Prometheus or pod address that the scaler's allow-list does not hold.

    Raised before any request is made, so a caller cannot use the scaler to reach other addresses.
    """

    reason = "address_not_allowed"


class NamespaceNotAllowed(InvalidMetadata):
    """The trigger's ``namespace`` key names a namespace other than the ScaledObject's own (issue 18
    item 11): a ScaledObject author may read only their own namespace's scaling decision."""

    reason = "namespace_not_allowed"


class Overloaded(ScalerError):
    """A bounded resource is full: open streams (``--workers``) or trigger state (``--max-triggers``).
    The message names the flag that raises the bound."""

    reason = "overloaded"


class UnknownMetric(ScalerError):
    """GetMetrics asked for a metric name this scaler never announced."""

    reason = "unknown_metric"


class NoDecisionYet(ScalerError):
    """No data and no earlier decision to hold: let KEDA's ``fallback`` decide (never shrinks)."""

    reason = "no_data"


class SourceUnavailable(ScalerError):
    """Prometheus (or the pods) could not be read. Raised by :mod:`sluiceway_scaler.prom`."""

    reason = "source_unavailable"


class SourceGarbage(SourceUnavailable):
    """Prometheus answered, but not with a usable number (wrong JSON shape, non-numeric, +-Inf)."""

    reason = "garbage"


_CODES: dict[type[ScalerError], grpc.StatusCode] = {
    InvalidMetadata: grpc.StatusCode.INVALID_ARGUMENT,
    AddressNotAllowed: grpc.StatusCode.PERMISSION_DENIED,
    NamespaceNotAllowed: grpc.StatusCode.PERMISSION_DENIED,
    Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    UnknownMetric: grpc.StatusCode.NOT_FOUND,
    NoDecisionYet: grpc.StatusCode.UNAVAILABLE,
    SourceUnavailable: grpc.StatusCode.UNAVAILABLE,
}


def grpc_code(exc: BaseException) -> grpc.StatusCode:
    """The status code for any exception; unknown ones are INTERNAL."""
    for cls in type(exc).__mro__:
        code = _CODES.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def reason_of(exc: BaseException) -> str:
    return exc.reason if isinstance(exc, ScalerError) else "internal"
