"""Who may make the scaler fetch what, and over which transport. Pure: no I/O.

**Allow-list.** A trigger names the addresses the scaler reads (``prometheusAddress``,
``podMetricsUrls``). Without a check anyone who can reach the gRPC port could make the scaler fetch
any URL (SSRF) and feed its decisions. :class:`AllowList` holds the base URLs given by
``--allowed-prometheus`` and ``--allowed-pod-metrics``; a trigger's address must equal one of them
after :func:`normalise_url` (scheme and host lower-cased, default port made explicit, trailing ``/``
dropped). Anything else is refused with ``PERMISSION_DENIED`` before any request is made. With no
flag nothing is allowed, loopback included: the default is secure, and the chart always passes its
Prometheus.

**TLS metadata.** KEDA reads ``caCert``, ``tlsClientCert``/``tlsClientKey`` (and the deprecated
``tlsCertFile``), ``enableTLS`` and ``unsafeSsl`` from the trigger to build *its* side of the gRPC
connection, and passes the whole metadata on to the scaler. :func:`check_transport` compares them
with the connection the call actually arrived on, so that none of them is silently ignored: a TLS
key on a plaintext connection, a client certificate the scaler did not verify (no ``--tls-ca``), or
``unsafeSsl: "true"`` (KEDA would not verify the scaler) are refused with ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sluiceway_core.urls import normalise_all, normalise_url

from sluiceway_scaler.errors import AddressNotAllowed, InvalidMetadata
from sluiceway_scaler.metadata import TriggerConfig

__all__ = ["AllowList", "Transport", "check_transport", "normalise_url"]


@dataclass(frozen=True)
class AllowList:
    """Normalised base URLs the scaler may read. Empty sets allow nothing."""

    prometheus: frozenset[str] = frozenset()
    pod_metrics: frozenset[str] = frozenset()

    @classmethod
    def build(cls, prometheus: Iterable[str] = (), pod_metrics: Iterable[str] = ()) -> AllowList:
        """From the CLI flags' values. Raises ValueError naming the flag for a malformed URL."""
        return cls(
            normalise_all("--allowed-prometheus", prometheus),
            normalise_all("--allowed-pod-metrics", pod_metrics),
        )

    def check(self, cfg: TriggerConfig) -> None:
        """Raise :class:`AddressNotAllowed` unless every address ``cfg`` would read is allowed."""
        _check("prometheusAddress", [cfg.prometheus_address], self.prometheus, "--allowed-prometheus")
        _check("podMetricsUrls", list(cfg.pod_metrics_urls), self.pod_metrics, "--allowed-pod-metrics")


def _check(key: str, urls: Sequence[str], allowed: frozenset[str], flag: str) -> None:
    for url in urls:
        try:
            normal = normalise_url(url)
        except ValueError as e:
            raise InvalidMetadata(key, str(e)) from None
        if normal in allowed:
            continue
        if allowed:
            which = f"it allows only {', '.join(sorted(allowed))}"
        else:
            which = "it allows none"
        raise AddressNotAllowed(key, f"{url} is not on this scaler's allow-list ({which}; set {flag} URL)")


@dataclass(frozen=True)
class Transport:
    """How the current call reached the server: TLS or not, and whether a verified client certificate
    came with it (only when the server runs with ``--tls-ca``)."""

    tls: bool
    client_cert: bool

    @classmethod
    def from_auth_context(cls, auth: Mapping[str, Any]) -> Transport:
        """From ``ServicerContext.auth_context()`` (property name -> list of bytes values)."""
        tls = b"ssl" in list(auth.get("transport_security_type") or ())
        return cls(tls=tls, client_cert=tls and bool(auth.get("x509_pem_cert")))


def _bool(md: Mapping[str, str], key: str) -> bool | None:
    v = md.get(key)
    if v is None or not v.strip():
        return None
    low = v.strip().lower()
    if low not in ("true", "false"):
        raise InvalidMetadata(key, f"must be true or false, got {v!r}")
    return low == "true"


def _set(md: Mapping[str, str], key: str) -> bool:
    return bool((md.get(key) or "").strip())


_NO_TLS = "this call arrived without TLS; start sluiceway-scaler with --tls-cert and --tls-key"
_NO_MTLS = "this scaler did not verify a client certificate; start sluiceway-scaler with --tls-ca for mutual TLS"


def check_transport(md: Mapping[str, str], transport: Transport) -> None:
    """Refuse KEDA TLS keys that the connection does not honour (see the module docstring)."""
    if _bool(md, "unsafeSsl"):
        raise InvalidMetadata(
            "unsafeSsl", "true is refused: KEDA would not verify the scaler's certificate; give caCert instead"
        )
    enable = _bool(md, "enableTLS")
    if enable and not transport.tls:
        raise InvalidMetadata("enableTLS", f"is true but {_NO_TLS}")
    if _set(md, "caCert") and not transport.tls:
        raise InvalidMetadata("caCert", f"is set but {_NO_TLS}")
    for key in ("tlsClientCert", "tlsCertFile"):
        if _set(md, key) and not transport.client_cert:
            raise InvalidMetadata(key, f"is set but {_NO_TLS if not transport.tls else _NO_MTLS}")
    if _set(md, "tlsClientKey"):
        if not (_set(md, "tlsClientCert") or _set(md, "tlsCertFile")):
            raise InvalidMetadata("tlsClientKey", "is set without tlsClientCert")
        if not transport.client_cert:
            raise InvalidMetadata("tlsClientKey", f"is set but {_NO_TLS if not transport.tls else _NO_MTLS}")
