"""Fast unit tests of the gateway -> pod trust: the edge token file and the tenants the gateway names."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from sluiceway_core.config import TenantsConfig
from sluiceway_core.edge import EdgeToken, valid_tenant_name
from sluiceway_pod.clock import ManualClock
from sluiceway_pod.errors import InvalidInput
from sluiceway_pod.tenancy import EDGE_OVERFLOW, MAX_EDGE_UNLISTED, OTHER, TenantRegistry


def test_edge_token_is_reread_when_the_file_changes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "sluiceway.edge")
    clock = ManualClock(100.0)
    path = tmp_path / "token"
    path.write_text("a" * 32 + "\n")
    edge = EdgeToken(str(path), clock.now, period=2.0)
    assert edge.matches("a" * 32) and not edge.matches("a" * 31) and not edge.matches("b" * 32)
    new = tmp_path / "token.new"  # the kubelet's way: a new file swapped in
    new.write_text("c" * 40)
    os.replace(new, path)
    clock.advance(1.0)
    assert edge.matches("a" * 32)  # not checked again before the period
    clock.advance(1.5)
    assert edge.matches("c" * 40) and not edge.matches("a" * 32)
    path.write_text("short")
    clock.advance(3)
    assert not edge.matches("short") and not edge.matches("c" * 40)  # unusable: nothing is trusted
    path.unlink()
    clock.advance(3)
    assert edge.value is None
    path.write_text("d" * 20 + " x" * 10)  # inner spaces would break the header line
    clock.advance(3)
    assert edge.value is None
    text = caplog.text
    assert "a" * 32 not in text and "c" * 40 not in text and "shorter than" in text and "cannot be read" in text


def test_tenant_names_from_the_gateway_are_checked_and_bounded() -> None:
    assert valid_tenant_name("team-a") and valid_tenant_name("A.b_c") and not valid_tenant_name("x" * 64)
    assert not valid_tenant_name("") and not valid_tenant_name("a b") and not valid_tenant_name("-a")
    config = TenantsConfig.model_validate({"tenants": [{"name": "listed", "rate": 1, "burst": 1}],
                                           "defaults": {"maxConcurrent": 3}})
    reg = TenantRegistry(config, ["critical", "standard"], ManualClock(), default_priority="standard")
    assert reg.edge_tenant("listed").label == "listed"
    with pytest.raises(InvalidInput):
        reg.edge_tenant("bad name")
    names = {reg.edge_tenant(f"t{i}").name for i in range(MAX_EDGE_UNLISTED + 50)}
    assert len(names) == MAX_EDGE_UNLISTED + 1 and EDGE_OVERFLOW in names
    t = reg.edge_tenant("another")
    assert t.name == EDGE_OVERFLOW and t.label == OTHER and t.max_concurrent == 3
    assert reg.edge_tenant("t0").name == "t0"  # already known: stays itself
    assert reg.edge_tenant("listed").name == "listed"  # listed ones are never folded
