"""Operator settings (flags > environment > defaults) and the kopf settings derived from them.

Environment variables: ``SLUICEWAY_NAMESPACES`` (comma-separated; empty = cluster-wide),
``SLUICEWAY_PROMETHEUS_URL``, ``SLUICEWAY_SCALER_ADDRESS``, ``SLUICEWAY_DRIFT_INTERVAL`` and
``SLUICEWAY_SIGNALS_INTERVAL`` (seconds),
``SLUICEWAY_LOG_FORMAT`` (``plain`` | ``full`` | ``json``), ``SLUICEWAY_SCALER_AUTHENTICATION`` (the
ClusterTriggerAuthentication KEDA uses for the scaler's mutual TLS), ``SLUICEWAY_LIVENESS`` (a URL such as
``http://0.0.0.0:8081/healthz``), ``SLUICEWAY_QUOTA_COORDINATOR_URL`` (the scaler's tenant-quota lease
coordinator; set: tenant quotas hold for the whole service) and ``SLUICEWAY_QUOTA_LEASE_SECONDS`` (its
lease period, as the scaler's ``--quota-lease-seconds``), ``SLUICEWAY_QUOTA_KEY_FILE`` (the key that
signs each service's quota charter; required with the coordinator URL), ``SLUICEWAY_ALLOWED_PROMETHEUS``
(comma-separated Prometheus base URLs a spec's ``autoscaling.prometheusAddress`` may name;
``SLUICEWAY_PROMETHEUS_URL`` is always allowed), ``SLUICEWAY_PROMETHEUS_TIMEOUT`` (seconds, the whole of
one query), ``SLUICEWAY_SERVICEMONITOR_LABELS`` (``k=v,k=v``: labels of every rendered ServiceMonitor,
such as the ``release`` label kube-prometheus-stack selects on; a spec's
``monitoring.serviceMonitorLabels`` adds to them), ``SLUICEWAY_PROMETHEUS_AUTH_FILE`` (the credentials
file of :mod:`sluiceway_core.promauth`, loaded once at start; a malformed one stops the operator),
``SLUICEWAY_POD_LOG_FORMAT`` / ``SLUICEWAY_POD_TRACING_ENDPOINT`` (the pods' defaults of
``spec.observability``), ``SLUICEWAY_GATEWAY_IMAGE`` (the image of the gateway pods an
InferenceService with ``spec.gateway.enabled`` gets) and the policy's ``SLUICEWAY_ALLOWED_*`` lists (:mod:`.policy`).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from sluiceway_core.promauth import PromAuth, load_prom_auth
from sluiceway_core.quota_charter import load_key
from sluiceway_core.urls import UrlAllowList

from .kube import TENANT_KEY_LABEL
from .policy import Policy, policy_from_env

__all__ = ["DOMAIN", "POD_LOG_FORMATS", "OperatorConfig", "apply_kopf_settings", "config_from_env", "parse_labels"]

#: kopf's ``kopf.zalando.org`` annotations, progress storage and finalizer are renamed to this.
DOMAIN = "sluiceway.io"


#: The pods' log formats (``server.logFormat`` of the pod config).
POD_LOG_FORMATS = ("plain", "json")
_HTTP_URL = re.compile(r"https?://[^\s/]+(/\S*)?")


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()
    prometheus_url: str | None = None
    scaler_address: str = "sluiceway-scaler.sluiceway-system.svc:9090"
    drift_interval: float = 60.0
    signals_interval: float = 15.0
    log_format: str = "plain"
    liveness: str | None = None
    #: ClusterTriggerAuthentication that gives KEDA the scaler's TLS client certificate (chart:
    #: ``scaler.tls.kedaClientSecret``); None when the scaler serves plaintext gRPC.
    scaler_authentication: str | None = None
    #: The quota coordinator's base URL (chart: ``scaler.quota.enabled``); None = every pod enforces
    #: the whole quota by itself.
    quota_coordinator_url: str | None = None
    #: The coordinator's lease period (chart: ``scaler.quota.leaseSeconds``).
    quota_lease_seconds: float = 3.0
    #: Signs each service's quota charter (``sluiceway_core.quota_charter``); required with
    #: ``quota_coordinator_url``. Never printed (``repr=False``).
    quota_key: bytes | None = field(default=None, repr=False)
    #: Prometheus base URLs a spec may name besides ``prometheus_url`` (always allowed).
    allowed_prometheus: tuple[str, ...] = ()
    #: The whole of one Prometheus query (connect, send, read), seconds.
    prometheus_timeout: float = 5.0
    #: What an InferenceService may ask of the cluster (:mod:`.policy`).
    policy: Policy = field(default_factory=Policy)
    #: Labels of every rendered ServiceMonitor (``SLUICEWAY_SERVICEMONITOR_LABELS``).
    service_monitor_labels: tuple[tuple[str, str], ...] = ()
    #: Credentials for the Prometheus servers it reads (``SLUICEWAY_PROMETHEUS_AUTH_FILE``); None =
    #: none. Only file paths inside; never printed (``repr=False``).
    prom_auth: PromAuth | None = field(default=None, repr=False)
    #: The pods' ``server.logFormat`` when a spec does not set ``observability.logFormat``.
    pod_log_format: str = "plain"
    #: The pods' OTLP/HTTP endpoint when a spec does not set ``observability.tracing.endpoint``
    #: (None: tracing off).
    pod_tracing_endpoint: str | None = None
    #: The image of every rendered gateway (``spec.gateway``): the ``sluiceway`` package with the
    #: ``gateway`` extra. The cluster admin's choice; a spec cannot name another.
    gateway_image: str = "ghcr.io/sluiceway/sluiceway:0.1.0"
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.quota_coordinator_url is not None and self.quota_key is None:
            raise ValueError(
                "SLUICEWAY_QUOTA_COORDINATOR_URL is set but no quota key is: set SLUICEWAY_QUOTA_KEY_FILE "
                "(the chart mounts it at /etc/sluiceway/quota-key/key)"
            )
        self.prometheus_allow_list  # noqa: B018 - raises ValueError for a malformed URL
        if self.pod_log_format not in POD_LOG_FORMATS:
            raise ValueError(
                f"SLUICEWAY_POD_LOG_FORMAT must be one of {', '.join(POD_LOG_FORMATS)}, not {self.pod_log_format!r}"
            )
        if not self.gateway_image or len(self.gateway_image) > 512 or any(c.isspace() for c in self.gateway_image):
            raise ValueError(
                f"SLUICEWAY_GATEWAY_IMAGE must be an image reference without whitespace, not {self.gateway_image!r}"
            )
        if self.pod_tracing_endpoint is not None and not _HTTP_URL.fullmatch(self.pod_tracing_endpoint):
            raise ValueError(
                f"SLUICEWAY_POD_TRACING_ENDPOINT must be an http(s) URL (OTLP/HTTP), not {self.pod_tracing_endpoint!r}"
            )

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    @property
    def prometheus_allow_list(self) -> UrlAllowList:
        """What the operator may query: ``allowed_prometheus`` plus ``prometheus_url``."""
        urls = [*self.allowed_prometheus, *([self.prometheus_url] if self.prometheus_url else [])]
        return UrlAllowList.build("SLUICEWAY_ALLOWED_PROMETHEUS/SLUICEWAY_PROMETHEUS_URL", urls)


_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")


def parse_labels(name: str, text: str) -> tuple[tuple[str, str], ...]:
    """``k=v,k=v`` (spaces around items ignored) as label pairs; ValueError naming ``name``."""
    out: dict[str, str] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not value or not _LABEL_KEY.fullmatch(key) or len(key) > 317 or not _LABEL_VALUE.fullmatch(value):
            raise ValueError(
                f"{name} must be comma-separated key=value label pairs (keys: an optional DNS prefix and '/', "
                f"then at most 63 alphanumerics, '-', '_', '.'; values: at most 63 of those), not {item!r}"
            )
        out[key] = value
    return tuple(out.items())


def config_from_env(environ: Mapping[str, str] | None = None) -> OperatorConfig:
    env = os.environ if environ is None else environ
    lease_text = env.get("SLUICEWAY_QUOTA_LEASE_SECONDS") or str(OperatorConfig.quota_lease_seconds)
    try:
        lease = float(lease_text)
    except ValueError:
        lease = -1.0
    if not 0.5 <= lease <= 60:  # the pod config's quota.leaseSeconds range
        raise ValueError(f"SLUICEWAY_QUOTA_LEASE_SECONDS must be seconds within 0.5..60, not {lease_text!r}")
    coordinator = env.get("SLUICEWAY_QUOTA_COORDINATOR_URL") or None
    if coordinator is not None and not _HTTP_URL.fullmatch(coordinator):
        raise ValueError(f"SLUICEWAY_QUOTA_COORDINATOR_URL must be an http(s) URL, not {coordinator!r}")
    namespaces = tuple(n.strip() for n in env.get("SLUICEWAY_NAMESPACES", "").split(",") if n.strip())
    key_file = env.get("SLUICEWAY_QUOTA_KEY_FILE") or None
    key = load_key(key_file) if key_file is not None else None  # ValueError names the path only
    allowed = tuple(u.strip() for u in env.get("SLUICEWAY_ALLOWED_PROMETHEUS", "").split(",") if u.strip())
    timeout = float(env.get("SLUICEWAY_PROMETHEUS_TIMEOUT") or OperatorConfig.prometheus_timeout)
    if not 0 < timeout <= 60:
        raise ValueError(f"SLUICEWAY_PROMETHEUS_TIMEOUT must be seconds within (0, 60], not {timeout}")
    auth_file = env.get("SLUICEWAY_PROMETHEUS_AUTH_FILE") or None
    prom_auth = load_prom_auth(auth_file) if auth_file is not None else None  # PromAuthError names the file
    return OperatorConfig(
        namespaces=namespaces,
        prometheus_url=env.get("SLUICEWAY_PROMETHEUS_URL") or None,
        scaler_address=env.get("SLUICEWAY_SCALER_ADDRESS") or OperatorConfig.scaler_address,
        drift_interval=float(env.get("SLUICEWAY_DRIFT_INTERVAL") or OperatorConfig.drift_interval),
        signals_interval=float(env.get("SLUICEWAY_SIGNALS_INTERVAL") or OperatorConfig.signals_interval),
        log_format=env.get("SLUICEWAY_LOG_FORMAT") or "plain",
        scaler_authentication=env.get("SLUICEWAY_SCALER_AUTHENTICATION") or None,
        liveness=env.get("SLUICEWAY_LIVENESS") or None,
        quota_coordinator_url=coordinator,
        quota_lease_seconds=lease,
        quota_key=key,
        allowed_prometheus=allowed,
        prometheus_timeout=timeout,
        policy=policy_from_env(env),
        service_monitor_labels=parse_labels(
            "SLUICEWAY_SERVICEMONITOR_LABELS", env.get("SLUICEWAY_SERVICEMONITOR_LABELS", "")
        ),
        prom_auth=prom_auth,
        pod_log_format=env.get("SLUICEWAY_POD_LOG_FORMAT") or OperatorConfig.pod_log_format,
        pod_tracing_endpoint=env.get("SLUICEWAY_POD_TRACING_ENDPOINT") or None,
        gateway_image=env.get("SLUICEWAY_GATEWAY_IMAGE") or OperatorConfig.gateway_image,
    )


def apply_kopf_settings(settings: kopf.OperatorSettings) -> None:
    """Rename kopf's storage to the sluiceway.io domain; standalone (one operator replica)."""
    settings.persistence.finalizer = f"{DOMAIN}/kopf-finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=DOMAIN)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=DOMAIN, key="last-handled-configuration"
    )
    settings.peering.standalone = True
    # The CRD is installed before the operator (chart crds/); no need to watch CRDs and namespaces,
    # which would need cluster-wide list/watch permissions.
    settings.scanning.disabled = True
    settings.posting.enabled = True
    settings.posting.level = logging.WARNING
    # Tenant-key Secrets (handlers.py): the API server sends only the labelled ones, so the operator
    # never receives a Secret that has not consented (RBAC cannot select by label).
    settings.watching.label_selectors["v1", "secrets"] = f"{TENANT_KEY_LABEL}=true"
    # Short watch timeouts: reconnects are cheap and repair lost watches quickly.
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
