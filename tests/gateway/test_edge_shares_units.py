"""Unit: the gateway's edge admission as a lease participant (:class:`ShareHolder`): a leased share
sets each tenant's bucket, a share of rate 0 refuses without dividing by zero, the lease running out
falls back to ``quota / replicas``, and the bucket's decisions are counted for the next report."""

from __future__ import annotations

import hashlib

from sluiceway_core.config import PrioritiesConfig, TenantsConfig
from sluiceway_core.keys import parse_keys_text
from sluiceway_core.quota import TenantShare
from sluiceway_gateway.admission import EdgeAdmission
from sluiceway_gateway.errors import RateLimited

KEY = "sk-team-0123456789"


def admission(now: list[float]) -> EdgeAdmission:
    cfg = TenantsConfig.model_validate({"allowAnonymous": False, "keysFile": "/nonexistent/keys.txt",
                                        "tenants": [{"name": "team", "rate": 10, "burst": 8}]})
    keys = parse_keys_text(f"{hashlib.sha256(KEY.encode()).hexdigest()} team\n")
    return EdgeAdmission(cfg, PrioritiesConfig(), lambda: now[0], keys)


def take(adm: EdgeAdmission) -> float:
    try:
        adm.release(adm.admit({"authorization": f"Bearer {KEY}"}))
        return 0.0
    except RateLimited as e:
        return e.retry_after or 0.0


def test_a_leased_share_sets_the_bucket_and_rate_zero_refuses_cleanly() -> None:
    now = [0.0]
    adm = admission(now)
    assert adm.share("team") is None  # no coordinator: the whole quota here
    adm.apply_shares({"team": TenantShare(0.0, 0, None, 0.0)}, 2)  # the other replica holds it all
    assert take(adm) == 1.0  # refused, asked to come back after a renewal (was: ZeroDivisionError)
    adm.apply_shares({"team": TenantShare(4.0, 3, None, 0.4)}, 2)
    now[0] += 1.0  # 4 tokens earned, at most the new burst of 3
    assert [take(adm) for _ in range(4)][:3] == [0.0, 0.0, 0.0]
    assert adm.take_counts() == {"team": (3, 2)} and adm.refused_names() == []
    adm.apply_shares(None, 2)  # the lease ran out: quota / 2
    share = adm.share("team")
    assert share is not None and share.rate == 5.0 and share.burst == 4
    assert adm.tenant_load() == {}
