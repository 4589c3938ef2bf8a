"""The gateway's reload, pure and in-process: buckets keep their tokens across a reload, the tenants
section reloads and the rest of the file asks for a restart, bad files keep what is in force (fast unit
tests; the real-process test is ``test_gateway_reload.py``)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path

import pytest
import yaml
from sluiceway_core.config import PrioritiesConfig, TenantsConfig
from sluiceway_core.keys import KeyFile, parse_keys_text
from sluiceway_gateway.admission import EdgeAdmission
from sluiceway_gateway.errors import RateLimited, Unauthenticated
from sluiceway_gateway.reload import TenantReloader, read_tenant_files


def _h(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_a_reload_keeps_each_buckets_tokens_and_swaps_keys() -> None:
    clock = [0.0]
    keys = parse_keys_text(f"{_h('k1')} a\n")
    cfg = TenantsConfig.model_validate({"tenants": [{"name": "a", "rate": 0.1, "burst": 2}]})
    adm = EdgeAdmission(cfg, PrioritiesConfig(), lambda: clock[0], keys=keys)
    h = {"authorization": "Bearer k1"}
    for _ in range(2):
        adm.admit(h)
    with pytest.raises(RateLimited):
        adm.admit(h)
    # same limits, a second key: the bucket stays empty (a restart would refill it to the burst)
    adm.replace(cfg, parse_keys_text(f"{_h('k1')} a\n{_h('k2')} a\n"))
    with pytest.raises(RateLimited):
        adm.admit({"authorization": "Bearer k2"})
    # a higher rate applies from now on; the key dropped is refused
    adm.replace(TenantsConfig.model_validate({"tenants": [{"name": "a", "rate": 10, "burst": 2}]}),
                parse_keys_text(f"{_h('k2')} a\n"))
    clock[0] = 0.1
    adm.admit({"authorization": "Bearer k2"})
    with pytest.raises(Unauthenticated):
        adm.admit(h)
    with pytest.raises(ValueError, match="maxPriority"):
        adm.replace(TenantsConfig.model_validate({"tenants": [{"name": "a", "maxPriority": "nope"}]}), keys)


def _write(path: Path, doc: dict[str, object]) -> None:
    path.write_text(yaml.safe_dump(doc))


def test_the_tenants_section_reloads_the_rest_asks_for_a_restart_bad_files_keep_the_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"{_h('k1')} a\n")
    conf = tmp_path / "gw.yaml"
    base: dict[str, object] = {"endpoints": ["127.0.0.1:1"],
                               "tenants": {"keysFile": str(keys), "tenants": [{"name": "a"}]}}
    _write(conf, base)
    running = read_tenant_files(str(conf), {}).config
    assert running.tenants is not None
    state: list[tuple[TenantsConfig, KeyFile]] = [(running.tenants, parse_keys_text(keys.read_text()))]
    results: list[str] = []
    failing: list[bool] = []
    r = TenantReloader(str(conf), {}, running, lambda: state[-1], lambda t, k: state.append((t, k)),
                       clock=lambda: 0.0, period=1.0, result=results.append, failing=failing.append, limit=4096)

    async def polls() -> list[str]:
        out = [await r.poll()]
        _write(conf, {**base, "tenants": {"keysFile": str(keys), "tenants": [{"name": "a", "rate": 5}]}})
        out.append(await r.poll())
        _write(conf, {**base, "routing": "random",
                      "tenants": {"keysFile": str(keys), "tenants": [{"name": "a", "rate": 5}]}})
        out.append(await r.poll())
        keys.write_text("secret-line-without-a-tenant\n")
        out += [await r.poll(), await r.poll()]
        keys.write_text("x" * 5000)
        out.append(await r.poll())
        keys.write_text(f"{_h('k1')} a\n{_h('k2')} a\n")
        out.append(await r.poll())
        return out

    with caplog.at_level(logging.INFO, logger="sluiceway.gateway.reload"):
        got = asyncio.run(polls())
    assert got == ["unchanged", "applied", "unchanged", "rejected", "rejected", "rejected", "applied"]
    assert results == ["applied", "restart_required", "rejected", "rejected", "applied"]
    assert failing[-1] is False and True in failing
    assert state[1][0].tenants[0].rate == 5 and len(state[-1][1].entries) == 2
    assert "secret-line" not in caplog.text and "larger than 4096 bytes" in caplog.text
    assert caplog.text.count("line 1") == 1  # logged once per distinct content, by line number
