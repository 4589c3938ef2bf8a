"""Issue 10 item 6 at the tenant registry: anonymous access and priority ceilings by default."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from sluiceway_core.config import TenantsConfig, build_config
from sluiceway_pod.clock import ManualClock
from sluiceway_pod.errors import Unauthenticated
from sluiceway_pod.tenancy import TenantRegistry

CLASSES = ["critical", "standard", "batch"]


def registry(tmp_path: Path, **tenants: object) -> TenantRegistry:
    keys = tmp_path / "keys"
    keys.write_text(
        f"{hashlib.sha256(b'sk-listed').hexdigest()} listed\n{hashlib.sha256(b'sk-unlisted').hexdigest()} stranger\n"
    )
    cfg = TenantsConfig.model_validate({"keysFile": str(keys), "tenants": [{"name": "listed"}], **tenants})
    return TenantRegistry(cfg, CLASSES, ManualClock(), default_priority="standard")


def test_anonymous_access_is_off_when_tenants_have_keys(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    with pytest.raises(Unauthenticated):
        reg.authenticate(None)
    assert reg.authenticate("Bearer sk-listed").name == "listed"


def test_anonymous_access_can_be_turned_on_explicitly(tmp_path: Path) -> None:
    reg = registry(tmp_path, allowAnonymous=True)
    assert reg.authenticate(None).name == "anonymous"


def test_without_keys_anonymous_access_stays_on() -> None:
    assert build_config({}).tenants.anonymous_allowed
    assert not build_config({"tenants": {"keysFile": "/k"}}).tenants.anonymous_allowed
    assert build_config({"tenants": {"keysFile": "/k", "allowAnonymous": True}}).tenants.anonymous_allowed


def test_anonymous_and_unlisted_tenants_are_capped_at_the_default_class(tmp_path: Path) -> None:
    reg = registry(tmp_path, allowAnonymous=True)
    standard = CLASSES.index("standard")
    assert reg.authenticate(None).max_priority_rank == standard
    assert reg.authenticate("Bearer sk-unlisted").max_priority_rank == standard
    assert reg.authenticate("Bearer sk-listed").max_priority_rank == 0  # listed, no ceiling: every class


def test_an_explicit_default_ceiling_still_wins(tmp_path: Path) -> None:
    reg = registry(tmp_path, allowAnonymous=True, defaults={"maxPriority": "critical"})
    assert reg.authenticate(None).max_priority_rank == 0
    reg = registry(tmp_path, defaults={"maxPriority": "batch"})
    assert reg.authenticate("Bearer sk-unlisted").max_priority_rank == CLASSES.index("batch")
