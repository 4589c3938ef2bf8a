"""Trigger metadata (the ScaledObject's ``triggers[].metadata``) -> a validated :class:`TriggerConfig`.

Pure: no I/O. Every problem raises :class:`~sluiceway_scaler.errors.InvalidMetadata` naming the key,
which the service returns as ``INVALID_ARGUMENT``.

Keys (all values are strings, as KEDA passes them):

=============================  ========  ====================================================
key                            default   meaning
=============================  ========  ====================================================
inferenceService               required  the InferenceService name (label ``inferenceservice``)
namespace                      ref's ns  the ScaledObject's own namespace; any other is refused
prometheusAddress              required  ``http(s)://host:port`` of Prometheus
targetQueueDepthPerReplica     --        queued requests one replica may hold
targetWaitP95                  --        target queue-wait p95: ``500ms``, ``2s``, ``1m`` or seconds
targetWaitP95Seconds           --        the same in seconds (what the operator renders)
minReplicas                    1         lower bound of the decision
maxReplicas                    100       upper bound of the decision
scaleDownWindowSeconds         90        window for slow scale-down (0..3600)
scaleDownMaxPods               --        at most this many pods removed per period
scaleDownMaxPercent            --        ... or this percent of the replicas (the larger applies)
scaleDownPeriodSeconds         60        the period of ``scaleDownMaxPods``/``scaleDownMaxPercent``
scaleDownReleaseWindowSeconds  1200      release a surplus this old at once (0: off; longer than
                                         ``scaleDownWindowSeconds``; at most 86400)
scaleUpMaxPods                 --        scale-up step limit in pods ...
scaleUpMaxPercent              --        ... or percent (the larger of the two applies)
targetUtilisationPercent       80        keep GPU permits at most this busy; 0 turns it off
rateWindow                     1m        PromQL range for ``rate()`` and the wait quantile
queryTimeout                   5s        timeout of each Prometheus query
podMetricsUrls                 --        comma-separated pod ``/metrics`` URLs for StreamIsActive
activationPollInterval         1s        how often StreamIsActive polls (pods or Prometheus)
crashLoopWindow                10m       a pod whose target went down twice within it is crash-
                                         looping, not starting (issue 20; PromQL duration)
=============================  ========  ====================================================

At least one of ``targetQueueDepthPerReplica`` and ``targetWaitP95`` is required.

KEDA's own keys are accepted too: ``scalerAddress`` (KEDA's alone) and the TLS keys ``caCert``,
``tlsClientCert``, ``tlsClientKey``, ``tlsCertFile``, ``enableTLS``, ``unsafeSsl``, which
:func:`sluiceway_scaler.access.check_transport` compares with the connection. The addresses
(``prometheusAddress``, ``podMetricsUrls``) must also be on the scaler's allow-list
(:class:`sluiceway_scaler.access.AllowList`); both checks need the server's context, so they are
not made here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlparse

from sluiceway_core.policy import ScaleDownPolicy, ScaleUpPolicy, ScalingSpec
from sluiceway_core.units import parse_seconds

from sluiceway_scaler.errors import InvalidMetadata, NamespaceNotAllowed

__all__ = ["KNOWN_KEYS", "TriggerConfig", "parse_metadata"]

KNOWN_KEYS = frozenset(
    {
        "inferenceService", "namespace", "prometheusAddress", "targetQueueDepthPerReplica",
        "targetWaitP95", "targetWaitP95Seconds", "minReplicas", "maxReplicas", "scaleDownWindowSeconds",
        "scaleDownMaxPods", "scaleDownMaxPercent", "scaleDownPeriodSeconds", "scaleDownReleaseWindowSeconds",
        "scaleUpMaxPods", "scaleUpMaxPercent", "rateWindow",
        "queryTimeout", "podMetricsUrls", "activationPollInterval", "targetUtilisationPercent",
        "crashLoopWindow",
        # KEDA's own keys for its connection to this scaler: scalerAddress is KEDA's alone; the TLS
        # keys are checked against the connection the call arrived on (sluiceway_scaler.access).
        "scalerAddress", "enableTLS", "caCert", "tlsClientCert", "tlsClientKey", "tlsCertFile", "unsafeSsl",
    }
)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PROM_RANGE = re.compile(r"^[1-9]\d*(ms|s|m|h)$")


@dataclass(frozen=True)
class TriggerConfig:
    inference_service: str
    namespace: str
    prometheus_address: str
    spec: ScalingSpec
    rate_window: str
    query_timeout: float
    pod_metrics_urls: tuple[str, ...]
    activation_poll_interval: float
    #: ``crashLoopWindow``: how far back the activation looks for a pod's target going down twice
    crash_window: str = "10m"

    @property
    def identity(self) -> tuple[object, ...]:
        """Everything that changes a decision: the scaler keys its state by this (plus the
        ScaledObject's namespace and name), so a trigger naming another address or spec never
        shares history with this one."""
        return (
            self.namespace, self.inference_service, self.prometheus_address, self.pod_metrics_urls,
            self.rate_window, self.spec,
        )

    @property
    def metric_name(self) -> str:
        """The metric this trigger announces; one per ScaledObject (KEDA adds its ``sN-`` prefix)."""
        return f"sluiceway-replicas-{self.namespace}-{self.inference_service}"[:200]


def _str(md: Mapping[str, str], key: str) -> str | None:
    v = md.get(key)
    if v is None:
        return None
    v = v.strip()
    return v or None


def _int(md: Mapping[str, str], key: str, default: int | None, lo: int, hi: int) -> int | None:
    v = _str(md, key)
    if v is None:
        return default
    try:
        n = int(v)
    except ValueError:
        raise InvalidMetadata(key, f"must be an integer, got {v!r}") from None
    if not lo <= n <= hi:
        raise InvalidMetadata(key, f"must be within {lo}..{hi}, got {n}")
    return n


def _float(md: Mapping[str, str], key: str, default: float | None, lo: float, hi: float) -> float | None:
    v = _str(md, key)
    if v is None:
        return default
    try:
        x = float(v)
    except ValueError:
        raise InvalidMetadata(key, f"must be a number, got {v!r}") from None
    if not lo <= x <= hi:  # also rejects NaN
        raise InvalidMetadata(key, f"must be within {lo:g}..{hi:g}, got {v}")
    return x


def _duration(md: Mapping[str, str], key: str, default: float | None, lo: float, hi: float) -> float | None:
    v = _str(md, key)
    if v is None:
        return default
    try:
        x = parse_seconds(v)
    except ValueError as e:
        raise InvalidMetadata(key, str(e)) from None
    if not lo <= x <= hi:
        raise InvalidMetadata(key, f"must be within {lo:g}s..{hi:g}s, got {v}")
    return x


def _url(key: str, v: str) -> str:
    u = urlparse(v)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise InvalidMetadata(key, f"must be an http(s) URL with a host, got {v!r}")
    try:
        u.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise InvalidMetadata(key, f"bad port in {v!r}") from None
    return v.rstrip("/")


def _release_window(md: Mapping[str, str], window: float | None) -> float | None:
    """``scaleDownReleaseWindowSeconds``: absent, the policy's default; 0, off (None). Set, it must
    be longer than the stabilisation window, which the policy would otherwise ignore silently."""
    key = "scaleDownReleaseWindowSeconds"
    default = ScaleDownPolicy().release_window
    release = _duration(md, key, default, 0, 86_400)
    if _str(md, key) is None or release is None:
        return release
    if release == 0:
        return None
    if window is not None and release <= window:
        raise InvalidMetadata(
            key, f"must be 0 (off) or longer than scaleDownWindowSeconds ({window:g}s), got {release:g}s"
        )
    return release


def _namespace(md: Mapping[str, str], ref_namespace: str) -> str:
    """The ScaledObject's namespace (KEDA passes ``ScaledObjectRef.namespace``). The ``namespace`` key
    may repeat it, never name another one (issue 18 item 11: a ScaledObject author must not read
    another team's scaling decision)."""
    own = ref_namespace.strip()
    named = _str(md, "namespace")
    if not own:
        raise InvalidMetadata("namespace", "the ScaledObjectRef carries no namespace (KEDA always sets it)")
    if not _DNS_LABEL.match(own):
        raise InvalidMetadata("namespace", f"the ScaledObjectRef's namespace must be a DNS-1123 label, got {own!r}")
    if named is not None and named != own:
        raise NamespaceNotAllowed(
            "namespace", f"names {named!r}, but the ScaledObject is in {own!r}: a trigger reads its own namespace only"
        )
    return own


def parse_metadata(metadata: Mapping[str, str], ref_namespace: str = "") -> TriggerConfig:
    """Validate the trigger metadata. Unknown keys are rejected so that typos do not pass silently."""
    unknown = sorted(set(metadata) - KNOWN_KEYS)
    if unknown:
        raise InvalidMetadata(unknown[0], f"unknown key (known: {', '.join(sorted(KNOWN_KEYS))})")

    name = _str(metadata, "inferenceService")
    if name is None:
        raise InvalidMetadata("inferenceService", "is required")
    if not _DNS_LABEL.match(name):
        raise InvalidMetadata("inferenceService", f"must be a DNS-1123 label, got {name!r}")
    namespace = _namespace(metadata, ref_namespace)

    address = _str(metadata, "prometheusAddress")
    if address is None:
        raise InvalidMetadata("prometheusAddress", "is required")
    address = _url("prometheusAddress", address)

    q_target = _float(metadata, "targetQueueDepthPerReplica", None, 1e-6, 1e6)
    w_target = _duration(metadata, "targetWaitP95", None, 0.001, 3600)
    w_seconds = _float(metadata, "targetWaitP95Seconds", None, 0.001, 3600)
    if w_target is not None and w_seconds is not None and abs(w_target - w_seconds) > 1e-9:
        raise InvalidMetadata("targetWaitP95Seconds", "disagrees with targetWaitP95; set one of them")
    w_target = w_target if w_target is not None else w_seconds
    if q_target is None and w_target is None:
        raise InvalidMetadata(
            "targetQueueDepthPerReplica", "set targetQueueDepthPerReplica and/or targetWaitP95"
        )

    lo = _int(metadata, "minReplicas", 1, 0, 10_000)
    hi = _int(metadata, "maxReplicas", 100, 1, 10_000)
    assert lo is not None and hi is not None
    if hi < lo:
        raise InvalidMetadata("maxReplicas", f"must be >= minReplicas ({lo}), got {hi}")

    # KEDA accepts stabilisation windows above 3600 s and then fails silently (kedacore/keda#4976).
    window = _duration(metadata, "scaleDownWindowSeconds", 90.0, 0, 3600)
    down_pods = _int(metadata, "scaleDownMaxPods", None, 1, 10_000)
    down_pct = _float(metadata, "scaleDownMaxPercent", None, 0.1, 100)
    period = _duration(metadata, "scaleDownPeriodSeconds", 60.0, 1, 1800)
    release = _release_window(metadata, window)
    up_pods = _int(metadata, "scaleUpMaxPods", None, 1, 10_000)
    up_pct = _float(metadata, "scaleUpMaxPercent", None, 1, 10_000)
    util_pct = _int(metadata, "targetUtilisationPercent", 80, 0, 100)
    assert window is not None and period is not None

    rate_window = _str(metadata, "rateWindow") or "1m"
    if not _PROM_RANGE.match(rate_window):
        raise InvalidMetadata("rateWindow", f"must be a PromQL duration like 30s or 1m, got {rate_window!r}")
    crash_window = _str(metadata, "crashLoopWindow") or "10m"
    if not _PROM_RANGE.match(crash_window):
        raise InvalidMetadata("crashLoopWindow", f"must be a PromQL duration like 10m, got {crash_window!r}")
    timeout = _duration(metadata, "queryTimeout", 5.0, 0.1, 60)
    poll = _duration(metadata, "activationPollInterval", 1.0, 0.05, 60)
    assert timeout is not None and poll is not None

    urls_raw = _str(metadata, "podMetricsUrls")
    parts = [u.strip() for u in urls_raw.split(",")] if urls_raw else []
    urls = tuple(_url("podMetricsUrls", u) for u in parts if u)

    spec = ScalingSpec(
        min_replicas=lo,
        max_replicas=hi,
        target_queue_per_replica=q_target,
        target_wait_p95=w_target,
        target_utilisation=util_pct / 100.0 if util_pct else None,
        scale_up=ScaleUpPolicy(max_pods=up_pods, max_percent=up_pct),
        scale_down=ScaleDownPolicy(
            stabilization_window=window,
            max_pods=down_pods,
            period=period,
            max_percent=down_pct,
            release_window=release,
        ),
    )
    return TriggerConfig(
        inference_service=name,
        namespace=namespace,
        prometheus_address=address,
        spec=spec,
        rate_window=rate_window,
        query_timeout=timeout,
        pod_metrics_urls=urls,
        activation_poll_interval=poll,
        crash_window=crash_window,
    )
