"""The gateway's start-up estimate (``hold.startupSeconds``) reloads in place (issue 20): the operator
renders the pods' measured start-up there and keeps it out of the gateway's config hash, so a new
measurement must reach a running gateway without a restart. In-process, with the real ``Gateway``
object and its own prediction; before the change a new ``hold.startupSeconds`` was a
``restart_required`` change and the running gateway kept predicting with the old one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry
from sluiceway_gateway.app import Gateway
from sluiceway_gateway.config import HoldConfig, with_startup_seconds
from sluiceway_gateway.endpoints import StaticEndpoints
from sluiceway_gateway.reload import TenantReloader, read_tenant_files

#: no cold start measured yet: the prediction from zero is the start-up plus this (hold.coldStartOverheadSeconds)
OVERHEAD = HoldConfig().cold_start_overhead_seconds


def _write(path: Path, startup: float | None, routing: str = "leastWait") -> None:
    hold = {} if startup is None else {"hold": {"startupSeconds": startup}}
    path.write_text(yaml.safe_dump({"endpoints": ["127.0.0.1:1"], "routing": routing, **hold}))


def test_a_new_startup_estimate_reloads_into_the_running_gateway_without_tenants(tmp_path: Path) -> None:
    conf = tmp_path / "gateway.yaml"
    _write(conf, 40)
    running = read_tenant_files(str(conf), {}).config
    gw = Gateway(running, StaticEndpoints([]), CollectorRegistry(), clock=lambda: 0.0)
    assert gw.predicted_ready(0.0) == 40.0 + OVERHEAD  # no pod starting: the whole cold start's estimate
    results: list[str] = []

    def apply_startup(seconds: float | None) -> None:
        gw.config = with_startup_seconds(gw.config, seconds)

    r = TenantReloader(str(conf), {}, running, None, None, apply_startup=apply_startup,
                       clock=lambda: 0.0, period=1.0, result=results.append)

    async def polls() -> list[str]:
        out = [await r.poll()]
        _write(conf, 8)  # the operator rendered a measured start-up
        out.append(await r.poll())
        predicted = gw.predicted_ready(0.0)
        out.append(await r.poll())  # nothing new
        _write(conf, None)  # the measurement and the estimate gone: no prediction
        out.append(await r.poll())
        assert gw.predicted_ready(0.0) is None
        _write(conf, 12, routing="random")  # a restart setting changed with it: that part waits
        out.append(await r.poll())
        return [*out, str(predicted)]

    out = asyncio.run(polls())
    assert out == ["unchanged", "applied", "unchanged", "applied", "applied", str(8.0 + OVERHEAD)]
    assert results == ["applied", "applied", "restart_required", "applied"]
    assert gw.config.hold.startup_seconds == 12.0 and gw.config.routing == "leastWait"
    assert r.applied == 3


def test_a_startup_estimate_change_alone_is_not_a_restart_setting(tmp_path: Path) -> None:
    from sluiceway_gateway.reload import outside_tenants

    conf = tmp_path / "gateway.yaml"
    _write(conf, 40)
    a = read_tenant_files(str(conf), {}).config
    _write(conf, 7)
    assert outside_tenants(a, read_tenant_files(str(conf), {}).config) == []
    conf.write_text(yaml.safe_dump({"endpoints": ["127.0.0.1:1"], "hold": {"startupSeconds": 7, "maxRequests": 5}}))
    assert outside_tenants(a, read_tenant_files(str(conf), {}).config) == ["hold"]
