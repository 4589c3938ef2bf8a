"""The pod's lease of the service-wide tenant quotas: :class:`~sluiceway_core.lease_client.QuotaClient`
(the protocol, shared with the gateway) wired to the pod's tenant registry, admission core and metrics.
"""

from __future__ import annotations

from typing import Any

from sluiceway_core.config import QuotaConfig
from sluiceway_core.lease_client import (
    MIN_EARLY_RENEWAL,
    ROUTING_GRACE,
    LeaseRefused,
    QuotaClient,
    http_post,
    pod_name,
)

from .admission import AdmissionCore
from .clock import Clock
from .metrics import PodMetrics
from .tenancy import OTHER, TenantRegistry

__all__ = [
    "MIN_EARLY_RENEWAL",
    "ROUTING_GRACE",
    "LeaseRefused",
    "QuotaClient",
    "http_post",
    "pod_name",
    "start_quota_client",
]


def start_quota_client(
    cfg: QuotaConfig, registry: TenantRegistry, core: AdmissionCore[Any], clock: Clock, metrics: PodMetrics
) -> QuotaClient:
    """The client of one pod, wired to its admission core and its metrics (call ``start`` next)."""

    def exported(client: QuotaClient) -> None:
        metrics.quota_fallback.labels(metrics.model).set(1 if client.serving_on_fallback() else 0)
        for name in registry.quotas():
            share = registry.share(name)
            label = registry.tenant(name).label
            if share is not None and label != OTHER:  # 'other' would mix several tenants
                metrics.quota_share.labels(metrics.model, label).set(share.fraction)

    client = QuotaClient(
        cfg, registry, core.tenant_load, clock, pod=pod_name(), on_change=exported, leaving=lambda: core.draining
    )
    metrics.quota_lease_age.labels(metrics.model).set_function(client.lease_age)
    return client
