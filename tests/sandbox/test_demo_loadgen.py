"""The sandbox load generator: schedule math, EndpointSlice reading as kube-proxy does, a real run
against two real inference pods (uvicorn over HTTP on loopback) spread per request over ready
endpoints only, and keep-alive clients (the default) that each hold one connection."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from sluiceway_sandbox.loadgen import (
    CLIENT_TIMEOUT,
    NO_ENDPOINTS,
    Client,
    EndpointWatcher,
    KeepAlive,
    LoadgenError,
    Outcome,
    Phase,
    build_schedule,
    ready_endpoints,
    run_load,
    summarize,
)


def _slice(endpoints: list[tuple[str, bool | None, bool | None]], port: int = 8080,
           name: str = "http") -> dict[str, Any]:
    eps = []
    for addr, ready, terminating in endpoints:
        cond: dict[str, Any] = {}
        if ready is not None:
            cond["ready"] = ready
        if terminating is not None:
            cond["terminating"] = terminating
        eps.append({"addresses": [addr], "conditions": cond})
    return {"addressType": "IPv4", "ports": [{"name": name, "port": port, "protocol": "TCP"},
                                             {"name": "metrics", "port": 9091}], "endpoints": eps}


def test_ready_endpoints_follow_kube_proxy() -> None:
    slices = [
        _slice([("198.18.1.2", True, False), ("198.18.1.3", False, False), ("198.18.1.4", None, None)]),
        _slice([("198.18.1.5", True, True), ("198.18.1.2", True, None)]),
        {"addressType": "IPv6", "ports": [{"name": "http", "port": 8080}],
         "endpoints": [{"addresses": ["fd00::1"], "conditions": {"ready": True}}]},
    ]
    assert ready_endpoints(slices) == ["198.18.1.2:8080", "198.18.1.4:8080"]
    assert ready_endpoints(slices, "metrics") == ["198.18.1.2:9091", "198.18.1.4:9091"]  # ports by name
    assert ready_endpoints(slices, "grpc") == []
    assert ready_endpoints([_slice([("198.18.1.9", True, None)], 9091, "metrics")], "metrics") == ["198.18.1.9:9091"]


@pytest.mark.parametrize("addr", ["10.0.0.5", "8.8.8.8", "192.168.1.1", "not-an-ip"])
def test_endpoints_outside_the_sandbox_are_refused(addr: str) -> None:
    with pytest.raises(LoadgenError):
        ready_endpoints([_slice([(addr, True, None)])])


def test_schedule_is_poisson_per_phase_and_split_by_share() -> None:
    phases = [Phase("below", 20, 20), Phase("off", 10, 0), Phase("over", 10, 120)]
    clients = [Client("a", share=3), Client("b", share=1)]
    sched = build_schedule(phases, clients, seed=3)
    assert sched == sorted(sched)
    below = [t for t, _ in sched if t < 20]
    off = [t for t, _ in sched if 20 <= t < 30]
    over = [t for t, _ in sched if 30 <= t < 40]
    assert off == []
    # Poisson counts: mean 400 and 1200, sd 20 and 35; 5 sd margins.
    assert 300 < len(below) < 500
    assert 1025 < len(over) < 1375
    share = Counter(ci for _, ci in sched)
    assert 0.70 < share[0] / len(sched) < 0.80
    assert build_schedule(phases, clients, seed=3) == sched  # seeded


@pytest.mark.parametrize(
    ("phases", "clients", "match"),
    [
        ([Phase("p", 10, -1)], [Client("a")], "rate"),
        ([Phase("p", 0, 10)], [Client("a")], "seconds"),
        ([Phase("p", 10, float("inf"))], [Client("a")], "rate"),
        ([Phase("p", 10, 10)], [], "client"),
        ([Phase("p", 10, 10)], [Client("a", share=0)], "share"),
        ([Phase("p", 1000, 1000)], [Client("a")], "bound"),
    ],
)
def test_schedule_refuses_bad_or_unbounded_runs(phases: list[Phase], clients: list[Client], match: str) -> None:
    with pytest.raises(LoadgenError, match=match):
        build_schedule(phases, clients, max_requests=10_000)


def test_summary_counts_codes_reasons_and_unexpected_5xx() -> None:
    outs = [Outcome(0, "a", 200, latency=0.1), Outcome(0, "a", 200, latency=0.3),
            Outcome(0, "a", 429, "rate_limited"), Outcome(0, "b", 503, "queue_timeout"),
            Outcome(0, "b", 503, ""), Outcome(0, "b", 500, "internal"), Outcome(0, "b", CLIENT_TIMEOUT, "x"),
            Outcome(0, "b", NO_ENDPOINTS, "no_endpoints")]
    s = summarize(outs, 2.0)
    assert (s.sent, s.ok, s.offered_rate, s.goodput) == (8, 2, 4.0, 1.0)
    assert s.goodput_share == 0.25
    assert s.codes == {"200": 2, "429": 1, "500": 1, "503": 2, "no_endpoints": 1, "timeout": 1}
    assert s.reasons["429 rate_limited"] == 1 and s.reasons["503 -"] == 1
    assert s.unexpected_5xx == 1 and s.shed_without_reason == 1
    assert s.p95_latency == 0.3
    assert summarize([], 0).goodput == 0.0


class _Slices:
    """An EndpointSlice API stand-in for the watcher (the real API is exercised by the e2e test)."""

    def __init__(self, slices: list[dict[str, Any]]) -> None:
        self.slices = slices
        self.queries: list[dict[str, str] | None] = []

    def get(self, path: str, query: dict[str, str] | None = None) -> Any:
        assert path == "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices"
        self.queries.append(query)
        return {"items": self.slices}


@pytest.mark.slow
def test_run_spreads_over_ready_real_pods_only(pod_factory: Callable[..., Any]) -> None:
    pods = [pod_factory("--model", "synthetic:5", "--model-name", "lg") for _ in range(2)]
    ports = [p.port for p in pods]
    api = _Slices([
        {"addressType": "IPv4", "ports": [{"name": "http", "port": ports[0]}],
         "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]},
    ])
    clients = [Client("search", key=None, priority=None, share=1)]
    sched = build_schedule([Phase("p", 3, 20)], clients, seed=5)
    with EndpointWatcher(api, "ns", "svc", refresh=0.2) as watcher:
        assert api.queries[0] == {"labelSelector": "kubernetes.io/service-name=svc"}
        first = asyncio.run(run_load(sched, clients, "/v2/models/lg/infer", per_request=watcher.endpoints, timeout=5))
        assert first and {o.endpoint for o in first} == {f"127.0.0.1:{ports[0]}"}
        assert all(o.status == 200 for o in first), Counter((o.status, o.reason) for o in first)
        # The second pod's endpoint is ready too (another slice, as the controller may write).
        api.slices = [*api.slices, {"addressType": "IPv4", "ports": [{"name": "http", "port": ports[1]}],
                                    "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]}]
        watcher.poll()
        second = asyncio.run(run_load(sched, clients, "/v2/models/lg/infer", per_request=watcher.endpoints, timeout=5))
    per = Counter(o.endpoint for o in second)
    assert set(per) == {f"127.0.0.1:{p}" for p in ports}
    assert min(per.values()) > len(second) / 5, per  # random spread, roughly even
    assert all(o.status == 200 and o.latency is not None for o in second)


@pytest.mark.slow
def test_no_ready_endpoint_is_recorded_and_stop_ends_early() -> None:
    clients = [Client("a")]
    sched = build_schedule([Phase("p", 30, 10)], clients, seed=1)
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    out = asyncio.run(run_load(sched, clients, "/v2/models/x/infer", per_request=lambda: [], stop=stop))
    assert out and all(o.status == NO_ENDPOINTS for o in out)
    assert max(o.t for o in out) < 5  # stopped long before the 30 s schedule ended


def test_watcher_refuses_a_slice_outside_the_sandbox() -> None:
    api = _Slices([_slice([("198.18.1.2", True, None)])])
    watcher = EndpointWatcher(api, "ns", "svc")
    assert watcher.poll() == ["198.18.1.2:8080"]
    api.slices = [_slice([("10.1.2.3", True, None)])]
    with pytest.raises(LoadgenError):
        watcher.poll()
    assert watcher.endpoints() == [] and "10.1.2.3" in watcher.last_error


class _CountingProxy:
    """A TCP forwarder to one pod that counts the connections it accepts (a Service stand-in: the
    real ClusterIP path, kube-proxy's DNAT, is the sandbox tests')."""

    def __init__(self, port: int) -> None:
        self.port, self.accepted = port, 0
        self.server: asyncio.Server | None = None

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            w.close()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        ur, uw = await asyncio.open_connection("127.0.0.1", self.port)
        await asyncio.gather(self._pipe(r, uw), self._pipe(ur, w))

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@pytest.mark.slow
def test_keepalive_clients_each_hold_one_connection(pod_factory: Callable[..., Any]) -> None:
    pod = pod_factory("--model", "synthetic:5", "--model-name", "lg")
    clients = [Client("search", share=3), Client("reports", share=1)]
    sched = build_schedule([Phase("p", 3, 40)], clients, seed=3)
    proxy = _CountingProxy(pod.port)

    addr: list[str] = []

    async def main() -> list[Outcome]:
        service = await proxy.start()
        addr.append(service)
        try:
            return await run_load(sched, clients, "/v2/models/lg/infer", service=service,
                                  keepalive=KeepAlive(clients=3, connections=1), timeout=5)
        finally:
            assert proxy.server is not None
            proxy.server.close()

    out = asyncio.run(main())
    assert len(out) == len(sched) > 60 and all(o.status == 200 for o in out), Counter(o.status for o in out)
    assert {o.endpoint for o in out} == set(addr)  # the Service's address: the client does not see the pod
    # 2 tenants x 3 clients x 1 connection: every request rode one of at most 6 connections
    assert 2 <= proxy.accepted <= 6, proxy.accepted


def test_run_load_takes_a_service_or_endpoints_and_only_sandbox_addresses() -> None:
    clients = [Client("a")]
    sched = build_schedule([Phase("p", 1, 1)], clients, seed=1)
    for kw in ({}, {"service": "198.19.0.9:8080", "per_request": lambda: []}):
        with pytest.raises(LoadgenError, match="either service"):
            asyncio.run(run_load(sched, clients, "/v2/models/x/infer", **kw))  # type: ignore[arg-type]
    with pytest.raises(LoadgenError, match=r"only 198\.18\.0\.0/15"):
        asyncio.run(run_load(sched, clients, "/v2/models/x/infer", service="10.0.0.1:80"))
    with pytest.raises(LoadgenError):
        KeepAlive(clients=0)
