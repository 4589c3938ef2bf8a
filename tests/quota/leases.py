"""Helpers of the quota tests: charters signed with a test key, and renewals of the pure allocator."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sluiceway_core.quota import Allocator, LeaseGrant, LeaseRequest, LeaseTerms, TenantDemand, TenantQuota, TenantShare
from sluiceway_core.quota_charter import QuotaCharter, sign_charter

KEY = b"test-quota-key-0123456789abcdef-0123456789"  # >= 32 bytes, as the chart's


def terms(quotas: Mapping[str, TenantQuota], service: str = "ns/svc", max_pods: int = 100) -> LeaseTerms:
    charter = QuotaCharter(service, dict(quotas), max_pods)
    return LeaseTerms(service, charter.quotas, max_pods, charter.digest())


def renew(
    alloc: Allocator,
    pod: str,
    quotas: Mapping[str, TenantQuota],
    demand: Mapping[str, TenantDemand],
    now: float,
    *,
    held: Mapping[str, TenantShare] | None = None,
    joining: bool = False,
    max_pods: int = 100,
    service: str = "ns/svc",
) -> LeaseGrant:
    req = LeaseRequest(pod, {}, "", demand, held or {}, joining)
    return alloc.renew(terms(quotas, service, max_pods), req, now)


def charter_doc(quotas: Mapping[str, TenantQuota], service: str = "ns/demo", max_pods: int = 100) -> dict[str, Any]:
    return QuotaCharter(service, dict(quotas), max_pods).to_json()


def signed(
    quotas: Mapping[str, TenantQuota], service: str = "ns/demo", max_pods: int = 100, key: bytes = KEY
) -> tuple[dict[str, Any], str]:
    charter = QuotaCharter(service, dict(quotas), max_pods)
    return charter.to_json(), sign_charter(key, charter)


def write_key(path: Path, key: bytes = KEY) -> Path:
    path.write_bytes(key)
    return path


def quota_section(
    url: str, service: str, quotas: Mapping[str, TenantQuota], token_dir: Path, *, lease: float, assumed: int,
    max_pods: int = 100,
) -> dict[str, Any]:
    """A pod config's ``quota`` section as the operator renders it: the charter and a token file."""
    doc, sig = signed(quotas, service, max_pods)
    token = token_dir / "quota-token"
    token.write_text(sig)
    return {
        "coordinatorUrl": url,
        "service": service,
        "leaseSeconds": lease,
        "assumedReplicas": assumed,
        "charter": json.loads(json.dumps(doc)),
        "tokenFile": str(token),
    }
