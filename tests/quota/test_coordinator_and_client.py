"""The quota coordinator over real HTTP on loopback, and the pod's lease client against it.

The client is driven step by step (``renew_once`` / ``check_expiry``) with a manual clock, so the
lease timing is exact; the HTTP calls are real.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sluiceway_core.config import QuotaConfig, TenantsConfig
from sluiceway_core.quota import LEASE_PATH, LeaseRequest, TenantDemand, TenantQuota
from sluiceway_pod.clock import ManualClock
from sluiceway_pod.quota_client import ROUTING_GRACE, QuotaClient
from sluiceway_pod.tenancy import TenantRegistry
from sluiceway_scaler.quota_server import QuotaCoordinator, serve_quota

from .leases import KEY, quota_section, signed

TEAM = {"team": TenantQuota(30.0, 9, 3)}  # the charter of registry() below
TOKENS = Path(tempfile.mkdtemp(prefix="sluiceway-quota-test-"))


@pytest.fixture
def coordinator() -> Iterator[tuple[str, ManualClock]]:
    clock = ManualClock(1000.0)
    coord = QuotaCoordinator(3.0, clock=clock.now, key=KEY)
    coord.allocator.started = float("-inf")  # these tests are not about a fresh coordinator's first lease period
    server, port, thread = serve_quota(coord, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{port}", clock
    server.shutdown()
    server.server_close()
    thread.join(10)


def post(url: str, body: bytes, content_type: str = "application/json") -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"content-type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_coordinator_grants_and_rejects_bad_requests(coordinator: tuple[str, ManualClock]) -> None:
    url, _ = coordinator
    doc, sig = signed({"team": TenantQuota(20.0, 10, 2)})
    req = LeaseRequest("pod-a", doc, sig, {"team": TenantDemand(40.0, 20.0, 3, 1)})
    code, grant = post(url + LEASE_PATH, json.dumps(req.to_json()).encode())
    assert code == 200 and grant["replicas"] == 1 and grant["shares"]["team"]["rate"] == 20.0
    assert grant["shares"]["team"]["maxConcurrent"] == 2 and grant["leaseSeconds"] == 3.0
    assert grant["service"] == "ns/demo"
    code, err = post(url + LEASE_PATH, b"{not json")
    assert code == 400 and err["error"]
    no_ns = {"pod": "p", "charter": {"service": "demo"}, "signature": sig}
    code, err = post(url + LEASE_PATH, json.dumps(no_ns).encode())
    assert code == 400 and "namespace" in err["error"]
    code, err = post(url + LEASE_PATH, b"x" * (256 * 1024 + 1))
    assert code == 413
    code, err = post(url + "/v1/other", b"{}")
    assert code == 404


def registry(clock: ManualClock) -> TenantRegistry:
    cfg = TenantsConfig.model_validate(
        {"allowAnonymous": True, "tenants": [{"name": "team", "rate": 30, "burst": 9, "maxConcurrent": 3}]}
    )
    return TenantRegistry(cfg, ["critical", "standard", "batch"], clock, default_priority="standard")


def client(
    url: str, reg: TenantRegistry, clock: ManualClock, pod: str, load: dict[str, tuple[int, int]]
) -> QuotaClient:
    cfg = QuotaConfig.model_validate(quota_section(url, "ns/demo", TEAM, TOKENS, lease=3.0, assumed=2))
    return QuotaClient(cfg, reg, lambda: load, clock, pod=pod)


def test_pods_lease_shares_that_sum_to_the_quota_and_fall_back_when_the_lease_runs_out(
    coordinator: tuple[str, ManualClock], caplog: pytest.LogCaptureFixture
) -> None:
    url, coord_clock = coordinator
    clock = ManualClock()
    regs = {p: registry(clock) for p in "abc"}
    loads: dict[str, dict[str, tuple[int, int]]] = {p: {} for p in "abc"}
    clients = {p: client(url, regs[p], clock, f"pod-{p}", loads[p]) for p in "abc"}
    team = regs["a"].tenant("team")
    # before any lease: quota / assumedReplicas (2)
    share = regs["a"].share("team")
    assert share is not None and share.rate == 15.0 and regs["a"].concurrency_cap(team) == 1

    async def scenario() -> None:
        # pod a sees 42/s offered, b 12/s, c 6/s (3x a quota of 20 routed 70/20/10; here the quota is 30)
        for _round in range(3):
            for p, offered in (("a", 63), ("b", 18), ("c", 9)):
                t = regs[p].tenant("team")
                for _ in range(offered):
                    regs[p].take_token(t)
                clock.advance(0.33)
                coord_clock.advance(0.33)
                assert await clients[p].renew_once()
        rates = {p: regs[p].share("team").rate for p in "abc"}  # type: ignore[union-attr]
        assert sum(rates.values()) <= 30.0 + 1e-9
        assert rates["c"] < rates["a"] and rates["a"] == pytest.approx(rates["b"])
        assert all(not c.fallback and c.replicas == 3 for c in clients.values())
        # the buckets follow the shares
        assert regs["a"]._buckets["team"].rate == rates["a"]
        # the coordinator goes away: after the lease period each pod falls back to quota / 3
        clients["a"].url = "http://127.0.0.1:1" + LEASE_PATH  # nothing listens there
        assert not await clients["a"].renew_once()
        clock.advance(2.0)
        clients["a"].check_expiry()
        assert not clients["a"].fallback  # the lease (3 s from when it was sent) still holds
        clock.advance(1.5)
        with caplog.at_level(logging.WARNING, logger="sluiceway.quota"):
            clients["a"].check_expiry()
        assert clients["a"].fallback
        fb = regs["a"].share("team")
        assert fb is not None and fb.rate == pytest.approx(10.0) and fb.max_concurrent == 1
        assert "falling back to quota / 3 replicas" in caplog.text

    asyncio.run(scenario())


def test_a_tenant_queued_on_a_pod_without_a_slot_asks_for_an_early_renewal(
    coordinator: tuple[str, ManualClock],
) -> None:
    url, _coord_clock = coordinator
    clock = ManualClock()
    regs = {p: registry(clock) for p in "ab"}
    loads: dict[str, dict[str, tuple[int, int]]] = {"a": {"team": (5, 0)}, "b": {}}
    clients = {p: client(url, regs[p], clock, f"pod-{p}", loads[p]) for p in "ab"}
    clock.advance(3.0)  # both pods have served for a while: neither is joining

    async def scenario() -> None:
        for p in "ab":
            assert await clients[p].renew_once()
        # b has had no request for ROUTING_GRACE since it reported ready: it no longer counts as
        # joining (with a's demand) either
        clock.advance(ROUTING_GRACE)
        for p in "ab":
            assert await clients[p].renew_once()
        # a has all the demand: the three slots go a's way, b holds none yet
        assert await clients["a"].renew_once()
        caps = {p: regs[p].concurrency_cap(regs[p].tenant("team")) for p in "ab"}
        assert caps == {"a": 3, "b": 0}
        assert not clients["b"].starved()  # nothing queued on b
        loads["a"].clear()
        loads["b"]["team"] = (2, 0)  # now work waits on b, which holds no slot: renew early
        assert clients["b"].starved()
        # a gives slots back as it renews (no demand there); b takes them when it renews after a:
        # the leases in force never sum to more than 3 on the way
        for _ in range(2):
            assert await clients["a"].renew_once()
            assert await clients["b"].renew_once()
            caps = {p: regs[p].concurrency_cap(regs[p].tenant("team")) for p in "ab"}
            assert sum(c or 0 for c in caps.values()) <= 3
        assert caps == {"a": 1, "b": 2}
        assert not clients["b"].starved()

    asyncio.run(scenario())


def test_a_joining_pod_reports_ready_only_once_it_holds_its_share(coordinator: tuple[str, ManualClock]) -> None:
    """Pods a and b hold the whole quota; c joins and gets nothing until they renew: it is not
    ready to serve meanwhile (its tenants would be refused under their quota), and is once its grant
    is settled. A share that stays held back keeps it out for at most one lease period."""
    url, coord_clock = coordinator
    clock = ManualClock()
    regs = {p: registry(clock) for p in "abc"}
    loads: dict[str, dict[str, tuple[int, int]]] = {p: {} for p in "abc"}
    clients = {p: client(url, regs[p], clock, f"pod-{p}", loads[p]) for p in "abc"}

    async def scenario() -> None:
        for p in "abab":
            assert await clients[p].renew_once()  # b first gets what a leaves, then half
        assert clients["b"].settled  # a and b now hold all of it, half each
        assert not clients["c"].ready_to_serve()  # no lease yet: joining (at most one lease period)
        assert await clients["c"].renew_once()
        assert not clients["c"].settled and not clients["c"].ready_to_serve()
        coord_clock.advance(0.4)
        for p in "ab":
            assert await clients[p].renew_once()  # they give back what c's fair share needs
        assert await clients["c"].renew_once()
        assert clients["c"].settled and clients["c"].ready_to_serve()
        assert (regs["c"].share("team").rate or 0) >= 5.0  # type: ignore[union-attr]

    asyncio.run(scenario())
    late = client(url, registry(clock), clock, "pod-d", {})

    async def held_back() -> None:
        assert await late.renew_once()  # a, b and c hold everything: d gets nothing, not settled
        assert not late.settled and not late.ready_to_serve()
        clock.advance(3.0)  # one lease period since d's client started
        assert late.ready_to_serve()

    asyncio.run(held_back())


def test_a_ready_pod_counts_as_joining_until_its_first_request_or_the_routing_grace() -> None:
    """Unit (no coordinator): what the client tells the coordinator in ``joining``. Ready but not
    routed to yet (the probe and endpoints lag): still joining; a request arrived: serving; no
    request within ROUTING_GRACE: serving (its own demand); draining: never joining."""
    clock = ManualClock()
    load: dict[str, tuple[int, int]] = {}
    draining = [False]

    def make() -> QuotaClient:
        cfg = QuotaConfig.model_validate(
            quota_section("http://127.0.0.1:9/", "ns/demo", TEAM, TOKENS, lease=3.0, assumed=2)
        )
        return QuotaClient(cfg, registry(clock), lambda: load, clock, pod="p", leaving=lambda: draining[0])

    c = make()
    assert c.build_request().joining  # no settled lease, within one lease period: joining
    clock.advance(3.0)  # ready_to_serve (one lease period)
    assert c.ready_to_serve() and c.build_request().joining  # ready, no request yet
    clock.advance(ROUTING_GRACE / 2)
    assert c.build_request().joining
    load["team"] = (1, 0)  # a request waits here: the Service routes to this pod
    assert not c.build_request().joining
    load.clear()
    assert not c.build_request().joining  # once routed, it stays serving
    idle = make()
    clock.advance(3.0)
    assert idle.build_request().joining
    clock.advance(ROUTING_GRACE)
    assert not idle.build_request().joining  # never routed to: counts with its own demand
    draining[0] = True
    assert not make().build_request().joining  # a draining pod gives its share back
