"""The simulator's hold queue and scale to zero (issue 20): behaviour, not speed. Bounded: seconds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bench.scalesim.controllers import KedaHttp, Kpa, OursKeda, OursZero, RayServe, default_spec, rendered_behavior
from bench.scalesim.edge import ACTIVATOR, GATEWAY, INTERCEPTOR, RAY_PROXY, Edge
from bench.scalesim.model import FluidQueue, PodPool, Record, ServiceModel, Startup
from bench.scalesim.observe import Prometheus
from bench.scalesim.sim import Scores, run
from bench.scalesim.traces import arrivals, make_trace
from bench.scalesim.zero import ZERO_POLICIES, build_zero_policy, main, run_zero

FIXED_20S = Startup(20.0, 20.0)  # every pod Ready 20 s after it is asked for


def _ours_zero(after: float = 60.0) -> OursZero:
    spec = default_spec(8)
    return OursZero(OursKeda(spec, rendered_behavior(spec, windows_add_up=True)), scale_to_zero_after=after)


def _burst_at_zero(slo: float, seconds: int = 600, at: int = 200) -> tuple[np.ndarray, Scores, Record]:
    """10 requests a second for 10 s at ``at``, nothing else; the service is at zero by then."""
    rate = np.zeros(seconds)
    rate[at : at + 10] = 10.0
    model = ServiceModel(startup=FIXED_20S, slo=slo)
    scores, rec = run("burst", rate, rate.astype(np.int64), _ours_zero(), model, seed=1, edge=GATEWAY)
    assert rec.total[at] == 0 and rec.ready[at] == 0, "the burst must find the service at zero"
    return rate, scores, rec


def test_requests_held_at_zero_are_answered_on_time_when_the_start_up_fits_their_deadline() -> None:
    rate, scores, rec = _burst_at_zero(slo=60.0)
    offered = float(rate.sum())
    assert scores.requests == 100
    assert float(rec.served.sum()) == pytest.approx(offered)
    assert scores.slo_attainment == pytest.approx(1.0)  # every one answered within 60 s, waits included
    assert scores.refused_share == 0.0 and scores.held_share == pytest.approx(1.0)
    assert scores.cold_starts == 1
    assert 20 <= scores.hold_p99 <= 31  # the start-up, plus the wait behind the earlier ones
    print(f"\nheld at zero, 20 s start-up, 60 s deadline: {scores}")


def test_requests_held_at_zero_are_refused_at_once_when_the_start_up_does_not_fit_not_lost() -> None:
    rate, scores, rec = _burst_at_zero(slo=10.0)
    offered = float(rate.sum())
    assert float(rec.served.sum()) == 0.0
    assert scores.refused_early == pytest.approx(1.0)  # 503 + Retry-After at once, none left to time out
    assert scores.timed_out == 0.0 and scores.slo_attainment == 0.0
    assert float(rec.refused.sum() + rec.expired.sum()) == pytest.approx(offered)  # one answer each
    # the refused requests still wake the service: a deadline shorter than the start-up must not
    # keep it at zero for ever
    assert scores.cold_starts == 1
    print(f"\nheld at zero, 20 s start-up, 10 s deadline: {scores}")


def test_a_pod_slower_than_the_estimate_times_out_what_is_held_at_the_deadline() -> None:
    """The gateway predicted 20 s; the pod takes 50 s: held requests are refused at their 30 s
    deadline (504), not held past it, not lost."""
    rate = np.zeros(400)
    rate[200:205] = 4.0
    slow = ServiceModel(startup=Startup(50.0, 50.0), slo=30.0)
    edge = Edge(GATEWAY, slow, FluidQueue(slow), estimate=20.0)
    pool = PodPool(slow, 0, np.random.default_rng(1))
    pool.set_target(1, 199)
    answered = refused = 0.0
    for t in range(200, 300):
        pool.tick(t)
        r = edge.step(t, float(rate[t]), pool, float(rate[t]))
        answered += r.served
        refused += r.refused + r.expired
    assert edge.stats.held == pytest.approx(20.0) and edge.stats.refused_early == 0.0
    assert refused == pytest.approx(20.0) and answered == 0.0
    assert edge.stats.timed_out == pytest.approx(20.0) and edge.held == 0.0


def test_nothing_is_scaled_to_zero_while_a_request_is_held_or_in_flight_or_a_pod_loads() -> None:
    # a request held through a 600 s start-up, ten times scaleToZeroAfter
    rate = np.zeros(1200)
    rate[100] = 1.0
    model = ServiceModel(startup=Startup(600.0, 600.0), slo=1000.0)
    scores, rec = run("lone", rate, rate.astype(np.int64), _ours_zero(after=60.0), model, seed=1, edge=GATEWAY)
    assert rec.total[100] == 0
    assert np.all(rec.total[102:702] >= 1), "scaled to zero while a request was held and its pod loaded"
    assert scores.slo_attainment == pytest.approx(1.0)
    # and on the idle trace, every scale-down to zero happened with nothing held, in a pod or loading
    model = ServiceModel(startup=Startup(25.0, 165.0, pull=(5.0, 15.0), scraped_while_warming=True))
    trace = make_trace("idle", 3 * 3600, 4 * model.replica_rate * 0.8, 1)
    _, rec = run("idle", trace.rate, arrivals(trace, 1), _ours_zero(after=300.0), model, seed=1, edge=GATEWAY)
    downs = [t for t in range(len(rec.target) - 1) if rec.target[t] > 0 and rec.target[t + 1] == 0]
    assert len(downs) >= 2
    for t in downs:
        assert rec.held[t] == 0 and rec.queue[t] + rec.in_service[t] == 0, t
        assert rec.total[t] == rec.ready[t], f"scaled to zero at {t} while a pod was loading"


def test_min_replicas_zero_costs_fewer_gpu_hours_than_one_on_the_idle_trace() -> None:
    model = ServiceModel()
    rows = run_zero("idle", 4 * 3600, 4, model, 1, 300.0, ("ours-keda", "knative-kpa", "keda-http", "ray-serve"))
    by = {(r.policy, lo): r for lo, r in rows}
    for name in ("ours-keda", "knative-kpa", "keda-http", "ray-serve"):
        zero, one = by[(name, 0)], by[(name, 1)]
        print(f"\n{name}: min 1 {one.gpu_hours:.2f} GPU-h {one.slo_attainment:.4f}; "
              f"min 0 {zero.gpu_hours:.2f} GPU-h {zero.slo_attainment:.4f}, {zero.cold_starts} cold starts")
        assert zero.gpu_hours < one.gpu_hours, name
        assert zero.cold_starts >= 1 and zero.zero_share > 0.3 and one.zero_share == 0.0, name


def test_every_request_gets_one_answer_behind_every_edge() -> None:
    """Offered = answered + refused + timed out + still held or queued at the end, for every policy."""
    model = ServiceModel(slo=60.0)
    trace = make_trace("idle", 2 * 3600, 4 * model.replica_rate * 0.8, 2)
    arrived = arrivals(trace, 2)
    for name in ZERO_POLICIES:
        for lo in (0, 1):
            ctl, edge = build_zero_policy(name, lo, model, 8, 300.0)
            _, rec = run("idle", trace.rate, arrived, ctl, model, seed=2, edge=edge)
            accounted = rec.served.sum() + rec.refused.sum() + rec.expired.sum() + rec.held[-1] + rec.queue[-1]
            assert accounted == pytest.approx(float(arrived.sum()), rel=1e-9), (name, lo)


def test_peer_scale_to_zero_defaults_are_their_documented_ones() -> None:
    assert Kpa(4, 0, 10).scale_to_zero_grace == 30.0 and Kpa(4, 0, 10).stable == 60
    assert KedaHttp(3.0, 0, 10).scaledown_period == 300.0
    ray = RayServe(0, 10)
    assert (ray.downscale_delay, ray.upscale_delay, ray.target_ongoing) == (600, 30, 2.0)
    assert GATEWAY.max_requests == 1024 and GATEWAY.predicts
    assert ACTIVATOR.max_requests == 10_000 and ACTIVATOR.timeout == 300.0
    assert INTERCEPTOR.max_requests is None and INTERCEPTOR.timeout is None
    assert RAY_PROXY.max_requests is None


def _prom_with(rec: Record, model: ServiceModel) -> Prometheus:
    return Prometheus(rec, model, scrape_failure=0.0, query_failure=0.0)


def test_the_kpa_waits_the_grace_period_before_zero_and_ray_wakes_at_once() -> None:
    model = ServiceModel()
    rec = Record(400)
    pool = PodPool(model, 1, np.random.default_rng(1))
    prom = _prom_with(rec, model)
    kpa = Kpa(model.permits, 0, 10)
    # nothing in the stable window: the KPA wants 0, holds 1 for the grace period, then 0
    wants = {t: kpa.decide(t, prom, pool) for t in range(100, 140, 2)}
    assert wants[100] == 1 and wants[128] == 1 and wants[130] == 0
    # at zero, one request held at Ray's handle scales to 1 at once (no upscale delay)
    pool.set_target(0, 140)
    rec.held[149] = 1.0
    ray = RayServe(0, 10)
    assert ray.decide(149, prom, pool) is None
    assert ray.decide(150, prom, pool) == 1


def test_cli_prints_the_tables(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--traces", "idle", "--startups", "short", "--deadlines", "60", "--idle-hours", "1",
                 "--replicas", "2", "--policies", "ours-keda,knative-kpa", "--plot", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| ours-keda | 0 |" in out and "| knative-kpa | 1 |" in out
    assert (tmp_path / "zero-idle-short-60s.png").stat().st_size > 10_000
    assert main(["--deadlines", "0"]) == 2
    assert main(["--policies", "hpa"]) == 2


def test_the_gateways_prediction_counts_the_pods_starting_beside_a_ready_one() -> None:
    """1 pod ready, 4 starting (estimate 20 s), 60 s deadline: the pods answer 1,196 + 3,264
    requests in time, so 3,000 arriving at once are all held, none refused as predicted late."""
    model = ServiceModel(startup=FIXED_20S, slo=60.0)
    pool = PodPool(model, 1, np.random.default_rng(1))
    pool.set_target(5, 0)
    edge = Edge(replace(GATEWAY, max_requests=10_000.0), model, FluidQueue(model), estimate=20.0)
    assert edge._admit(1, 3000.0, pool) == 0.0
    assert edge.held == pytest.approx(3000.0)
    # and what the five cannot answer in time is refused at once
    assert edge._admit(1, 2000.0, pool) == pytest.approx(5000.0 - 4460.0)


def test_ours_asks_for_the_held_burst_while_the_first_pod_still_loads_and_not_for_long_after() -> None:
    """Issue 20's hold term, in the simulator through the same policy: 100 requests a second for
    120 s reach the service at zero (120 s start-up, 300 s deadline). Before it, ours stayed at 1
    pod for the whole first start-up (the scaler read only the pods, and a loading pod reports no
    load); now it asks for the pods the held requests and the arrivals need while the first one
    loads. Once drained nothing keeps the surge past ``scaleToZeroAfter``: the drain itself reads as
    load (busy pods) for the scale-down window, so the count stays until the service goes to zero
    300 s after the last held request was handed off."""
    seconds, at = 1800, 200
    rate = np.zeros(seconds)
    rate[at : at + 120] = 100.0
    model = ServiceModel(startup=Startup(120.0, 120.0), slo=300.0)
    spec = default_spec(20)
    ctl = OursZero(OursKeda(spec, rendered_behavior(spec, windows_add_up=True)), scale_to_zero_after=300.0)
    edge = replace(GATEWAY, max_requests=100_000.0)
    scores, rec = run("burst", rate, rate.astype(np.int64), ctl, model, seed=1, edge=edge)
    first_ready = at + int(np.flatnonzero(rec.ready[at:] > 0)[0])
    asked = int(rec.target[at:first_ready].max())
    zero = int(np.flatnonzero(rec.target[first_ready:] == 0)[0]) + first_ready - at
    print(f"\nfirst pod ready {first_ready - at} s after the burst; asked for at most {asked} before it; "
          f"on time {scores.slo_attainment:.3f}; peak {int(rec.target.max())}; zero again {zero} s after it began")
    assert asked >= 8  # 100/s x 0.2 s / (4 x 0.8) = 6.25 for the arrivals alone, more for the held
    assert scores.slo_attainment > 0.9
    drained = at + int(np.flatnonzero(rec.held[at:] == 0)[0])
    assert int(rec.target[drained + 300 + 30]) == 0  # scaleToZeroAfter past the drain (and KEDA's poll)
