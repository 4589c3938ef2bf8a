"""``python -m bench.gateway_routing``: the routing benchmark's parts behave as documented.

Behaviour only, never speed: the plan is the same for every arm of a seed; in the kube-proxy arm
each client connection stays on the pod it was given when it opened (every answer on it comes from
that pod's process); through the gateway one client connection reaches several pods; every planned
request gets exactly one record; bad arguments exit 2 with the reason.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from bench.gateway_routing import (
    DROP,
    TIMEOUT,
    Rec,
    RoutingBenchError,
    Target,
    build_plan,
    connections_per_pod,
    kube_proxy_picker,
    main,
    parse_sizes,
    run_arm,
    size_stats,
    start_gateway,
    start_pods,
    summarize,
)
from bench.loadgen import run_sync


def test_sizes_parse_and_normalise() -> None:
    sizes = parse_sizes("10:0.6, 30:0.3,120:0.1")
    assert [ms for ms, _ in sizes] == [10.0, 30.0, 120.0]
    assert sum(p for _, p in sizes) == pytest.approx(1.0)
    st = size_stats(sizes)
    assert st["mean_ms"] == pytest.approx(27.0)
    assert st["scv"] == pytest.approx(1770 / 729 - 1)
    assert parse_sizes("5") == [(5.0, 1.0)]
    for bad in ("", "x:1", "10:0", "10:-1", "-5:1", "nan:1", "10:inf", "20000:1"):
        with pytest.raises(RoutingBenchError):
            parse_sizes(bad)


def test_plan_is_seeded_and_the_same_for_every_arm() -> None:
    sizes = parse_sizes("10:0.5,100:0.5")
    a = build_plan(50.0, 10.0, sizes, 8, seed=3)
    assert a == build_plan(50.0, 10.0, sizes, 8, seed=3)
    assert a != build_plan(50.0, 10.0, sizes, 8, seed=4)
    assert 350 < len(a) < 650  # Poisson, 500 expected
    assert all(0 <= x.t < 10.0 for x in a) and [x.t for x in a] == sorted(x.t for x in a)
    assert {x.size_ms for x in a} == {10.0, 100.0} and {x.client for x in a} == set(range(8))
    with pytest.raises(RoutingBenchError):
        build_plan(1000.0, 1000.0, sizes, 8, seed=1)  # over the request bound
    pick, again = kube_proxy_picker(4, 7), kube_proxy_picker(4, 7)
    picks = [pick() for _ in range(200)]
    assert picks == [again() for _ in range(200)] and set(picks) == {0, 1, 2, 3}
    assert connections_per_pod([[0, 2], [2], [3]], 4) == [1, 0, 2, 1]


def test_summary_counts_each_outcome() -> None:
    recs = [Rec(1.0, 10.0, 0, 0.020, 200, "", 11), Rec(1.1, 10.0, 0, 0.040, 200, "", 12),
            Rec(1.2, 10.0, 1, 1.500, 200, "", 12),  # answered after the 1 s deadline: not goodput
            Rec(1.3, 10.0, 1, 0.003, 429, "queue_full"), Rec(1.4, 10.0, 1, 1.0, TIMEOUT, "client_timeout"),
            Rec(1.5, 10.0, 1, None, DROP, "client_queue_full"),
            Rec(0.5, 10.0, 0, 0.010, 200, "", 11)]  # warm-up: not counted
    s = summarize(recs, warmup=1.0, duration=2.0, deadline_s=1.0, pids=[11, 12])
    assert (s["requests"], s["ok"], s["good"], s["goodput"]) == (6, 3, 2, 1.0)
    assert s["refused"] == {"429 queue_full": 1} and s["refused_total"] == 1
    assert s["client"] == {"client_drop": 1, "timeout": 1}
    assert s["pod_share"] == pytest.approx([1 / 3, 2 / 3])
    assert s["p50_ms"] == pytest.approx(40.0) and s["p99_ms"] == pytest.approx(1500.0)
    assert s["wait_p99_ms"] == pytest.approx(1490.0)


@pytest.mark.parametrize("argv", [["--sizes", "10:x"], ["--arms", "leastWait,roundRobin"],
                                  ["--arms", "random,random"], ["--load", "0"], ["--clients", "0"]])
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_kube_proxy_pins_connections_and_the_gateway_routes_requests(tmp_path: Path) -> None:
    """Two real pods: the loopback kube-proxy model keeps every answer of a connection on one pod;
    the gateway spreads one connection's requests over both pods; one record per planned request."""
    plan = build_plan(40.0, 2.0, parse_sizes("5"), 4, seed=5)
    assert len(plan) > 40
    pods = start_pods(tmp_path, 2, 64, core=None)
    try:
        pids = [p.proc.pid for p in pods]
        targets = [("127.0.0.1", p.port) for p in pods]
        pick = kube_proxy_picker(2, 5)

        def kube(_client: int) -> Target:
            def target() -> tuple[str, int, int]:
                i = pick()
                return targets[i][0], targets[i][1], i
            return target

        recs, pinned, _ = run_sync(run_arm(plan, 4, kube, 5.0, 256))
        assert sorted((r.t, r.client) for r in recs) == sorted((a.t, a.client) for a in plan)
        ok = [r for r in recs if r.status == 200]
        assert len(ok) == len(plan), {r.status for r in recs}
        for r in ok:
            assert r.pod == pids[pinned[r.client][r.conn]], (r, pinned)
        assert all(len(p) == 1 for p in pinned)  # nothing timed out: one connection per client

        gw = start_gateway(tmp_path, pods, "leastWait", 5, core=None)
        try:
            def via_gateway(_client: int) -> Target:
                return lambda: ("127.0.0.1", gw.port, -1)

            recs, pinned, _ = run_sync(run_arm(plan, 4, via_gateway, 5.0, 256))
        finally:
            gw.stop()
        assert sorted((r.t, r.client) for r in recs) == sorted((a.t, a.client) for a in plan)
        assert all(r.status == 200 for r in recs), {(r.status, r.reason) for r in recs}
        pods_per_conn: dict[tuple[int, int], set[int | None]] = defaultdict(set)
        for r in recs:
            pods_per_conn[(r.client, r.conn)].add(r.pod)
        assert all(len(p) == 1 for p in pinned)
        assert set().union(*pods_per_conn.values()) == set(pids)
        assert any(len(v) == 2 for v in pods_per_conn.values()), pods_per_conn
    finally:
        for p in pods:
            p.stop()



def test_plots_are_written(tmp_path: Path) -> None:
    """Both gateway benchmarks draw their PNG from the JSON they save (the docs link the copies)."""
    pytest.importorskip("matplotlib", reason="matplotlib draws the benchmark plots")
    from bench import gateway_overhead, gateway_routing

    arm = {"latencies_ms": [10.0, 20.0, 300.0], "p50_ms": 20.0, "p99_ms": 300.0, "goodput": 50.0, "refused_total": 1}
    doc = {"settings": {"arms": ["kube-proxy", "leastWait"], "pods": 4, "clients": 32, "load": 0.8,
                        "sizes": parse_sizes("10:0.6,30:0.3,120:0.1")},
           "rate": 110.0, "machine": {"load_average_start": "1.00 1.00 1.00"},
           "reps": [{"arms": {"kube-proxy": arm, "leastWait": {**arm, "p99_ms": 100.0}}}]}
    png = gateway_routing.plot(doc, tmp_path / "routing.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    point = {"p50_ms": 2.0, "p99_ms": 9.0, "pod_cpu_us_per_req": 900.0}
    odoc = {"points": {"direct": point, "gateway-uvloop": {**point, "gateway_cpu_us_per_req": 450.0}},
            "rate": 200.0, "duration": 5.0, "machine": {"load_average_start": "1.00 1.00 1.00"},
            "load_average_end": "1.10 1.00 1.00"}
    png = gateway_overhead.plot(odoc, tmp_path / "overhead.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
