"""Each peer's formula pinned to its source's (``shared/reference/autoscaling-sim.md``), with its
documented defaults; KEDA's polling loop calling our scaler; what Prometheus really returns."""

from __future__ import annotations

import numpy as np
import pytest

from bench.scalesim.compare import PEERS, build_policies
from bench.scalesim.controllers import (
    HPA_SYNC,
    KEDA_POLLING,
    HpaUtilisation,
    KedaPrometheus,
    Kpa,
    OursKeda,
    RayServe,
    _signals,
    default_spec,
    rendered_behavior,
)
from bench.scalesim.model import PodPool, Record, ServiceModel, Startup, StepResult
from bench.scalesim.observe import Prometheus

MODEL = ServiceModel()


def _prom(
    seconds: int, *, queue: float = 0.0, in_service: float = 0.0, ready: int = 10, scraped: int | None = None,
    arrived: float = 0.0, busy: float = 0.0, query_failure: float = 0.0, scrape_failure: float = 0.0,
) -> Prometheus:
    rec = Record(seconds)
    rec.queue[:] = queue
    rec.in_service[:] = in_service
    rec.ready[:] = ready
    rec.scraped[:] = ready if scraped is None else scraped
    rec.arrived[:] = arrived
    rec.busy[:] = busy
    return Prometheus(rec, MODEL, scrape_failure=scrape_failure, query_failure=query_failure)


# ------------------------------------------------------------------------------------ Knative
def test_kpa_defaults_are_knatives() -> None:
    """config/core/configmaps/autoscaler.yaml: target 70 %, stable 60 s, panic 10 % of it (6 s),
    panic threshold 200 %, max scale up rate 1000, max scale down rate 2, burst capacity 200;
    decisions every 2 s (multiscaler.go)."""
    kpa = Kpa(container_concurrency=4, min_replicas=1, max_replicas=5000)
    assert (kpa.target_pct, kpa.stable, kpa.panic, kpa.panic_threshold) == (0.7, 60, 6, 2.0)
    assert (kpa.max_up_rate, kpa.max_down_rate, kpa.target_burst_capacity, kpa.interval) == (1000.0, 2.0, 200.0, 2)


def test_kpa_scales_the_total_concurrency_not_the_per_pod_average_times_the_ready_count() -> None:
    """autoscaler.go: DSPC = ceil(stable total / TV), TV = 0.7 x 4 = 2.8, clamped to
    [floor(ready / 2), ceil(1000 x ready)]. The old model multiplied a per-pod mean by the current
    ready count, which compounds while pods start."""
    kpa = Kpa(container_concurrency=4, min_replicas=1, max_replicas=5000)
    assert kpa.step(0, stable_total=28.0, panic_total=28.0, ready_pods=10) == 10
    assert kpa.step(2, stable_total=56.0, panic_total=28.0, ready_pods=40) == 20  # total / TV, whatever ready is
    assert kpa.step(4, stable_total=2.8, panic_total=2.8, ready_pods=10) == 5  # at most halving per tick
    assert Kpa(4, 1, 5000).step(0, stable_total=1e6, panic_total=1e6, ready_pods=1) == 1000  # 1000 x ready


def test_kpa_panics_at_twice_the_target_ratchets_and_ends_a_stable_window_later() -> None:
    kpa = Kpa(container_concurrency=4, min_replicas=1, max_replicas=5000)
    # DPPC = ceil(56 / 2.8) = 20 = 2.0 x 10 ready: panic; desired max(DSPC 10, DPPC 20)
    assert kpa.step(100, stable_total=28.0, panic_total=56.0, ready_pods=10) == 20
    # calm again: in panic the count never falls ...
    assert kpa.step(130, stable_total=28.0, panic_total=28.0, ready_pods=10) == 20
    assert kpa.step(160, stable_total=28.0, panic_total=28.0, ready_pods=10) == 20
    # ... until a stable window (60 s) has passed since the last trigger
    assert kpa.step(162, stable_total=28.0, panic_total=28.0, ready_pods=10) == 10


def test_kpa_reads_the_collectors_window_averages_of_total_concurrency() -> None:
    prom = _prom(120, queue=20.0, in_service=8.0)
    kpa = Kpa(4, 1, 5000)
    assert kpa.decide(120, prom, PodPool(MODEL, 10, np.random.default_rng(1))) == 10  # 28 / 2.8


# ------------------------------------------------------------------------------------ KEDA
def test_keda_triggers_are_average_value_on_the_legacy_hpa() -> None:
    """A Prometheus trigger with metricType AverageValue: the HPA asks ceil(value / threshold) unless
    value / (threshold x status.replicas) is within 10 %; behaviour nil: scale-up capped at
    max(2 x current, 4) per sync, scale-down held 5 minutes."""
    pool = PodPool(MODEL, 10, np.random.default_rng(1))
    conc = KedaPrometheus("concurrency", 3.2, 1, 1000)
    assert conc.interval == HPA_SYNC == 15 and KEDA_POLLING == 30
    assert conc.decide(30, _prom(40, queue=60.0, in_service=40.0), pool) == 20  # ceil(100 / 3.2) = 32, cap 20
    steady = KedaPrometheus("concurrency", 3.2, 1, 1000)
    assert steady.decide(30, _prom(40, queue=0.0, in_service=33.0), pool) == 10  # 33 / 32: within 10 %
    rate = KedaPrometheus("rate", 16.0, 1, 1000)
    assert rate.rate_window == 60
    assert rate.decide(75, _prom(80, arrived=320.0), pool) == 20  # 320/s / 16 per replica
    assert rate.decide(90, _prom(95, arrived=16.0), pool) == 20  # the drop waits 5 minutes
    assert rate.decide(400, _prom(405, arrived=16.0), pool) == 1
    with pytest.raises(ValueError, match="unknown KEDA query"):
        KedaPrometheus("p95", 1.0, 1, 10)


def test_a_failed_query_leaves_the_keda_peers_and_ours_where_they_are() -> None:
    pool = PodPool(MODEL, 10, np.random.default_rng(1))
    down = _prom(40, queue=500.0, in_service=40.0, query_failure=1.0)
    assert KedaPrometheus("concurrency", 3.2, 1, 1000).decide(31, down, pool) is None
    ours = OursKeda(default_spec(1000), rendered_behavior(default_spec(1000), windows_add_up=True))
    assert ours.decide(31, down, pool) == 10
    assert ours._history.entries[-1].recommendation == 10  # held: the policy records current


def test_kedas_polling_loop_calls_our_scaler_between_the_hpas_syncs() -> None:
    """KEDA polls every 30 s (pollingInterval) on top of the HPA's 15 s reads; the scaler answers
    both and records both; only the HPA's read changes the Deployment.

    Ours' HPA syncs on the same simulated seconds as the peers' HPAs: ``sim.run`` calls a
    controller with ``interval = HPA_SYNC`` as ``decide(t + 1)`` for ``t % 15 == 0``, i.e. with 1,
    16, 31, 46, each reading the scrape of its own second. Before issue 21's fix ours synced at 15,
    30, 45, 60 and read the scrape of 14 s earlier (``Prometheus.scrape_at(15) == 0``)."""
    pool = PodPool(MODEL, 10, np.random.default_rng(1))
    prom = _prom(200, queue=0.0, in_service=20.0, arrived=100.0, busy=20.0)
    spec = default_spec(1000)
    ours = OursKeda(spec, rendered_behavior(spec, windows_add_up=True))
    answers = {t: ours.decide(t, prom, pool) for t in range(1, 61)}
    peer_syncs = [t + 1 for t in range(60) if t % KedaPrometheus("rate", 16.0, 1, 1000).interval == 0]
    assert [t for t, a in answers.items() if a is not None] == peer_syncs == [1, 16, 31, 46]
    assert [prom.scrape_at(t) for t in peer_syncs] == [0, 15, 30, 45]  # the scrape of its own second
    assert [e.at for e in ours._history.entries] == [1.0, 8.0, 16.0, 31.0, 38.0, 46.0]


# ------------------------------------------------------------------------------------ Ray, HPA
def test_ray_serve_formula_and_defaults() -> None:
    """autoscaling_policy.py: e = total / (target x running); desired = ceil(running x (1 + (e - 1)
    x f)); one less when that equals running but ceil(running x e) is lower. Defaults: target 2,
    look-back 30 s, metrics every 10 s, upscale delay 30 s, downscale delay 600 s, factors 1."""
    ray = RayServe(1, 100)
    assert (ray.target_ongoing, ray.look_back, ray.metrics_interval) == (2.0, 30, 10)
    assert (ray.upscale_delay, ray.downscale_delay, ray.upscaling_factor, ray.downscaling_factor) == (30, 600, 1.0, 1.0)
    assert ray.desired(24.0, 4) == 12
    assert ray.desired(5.0, 4) == 3
    slow = RayServe(1, 100, downscaling_factor=0.5)
    assert slow.desired(7.0, 4) == 4  # 4 x (1 - 0.125 x 0.5) = 3.75 -> 4; ceil(3.5) = 4 is not lower
    assert slow.desired(6.0, 4) == 3  # 3.5 -> 4 == running, ceil(4 x 0.75) = 3 is lower: one less


def test_hpa_utilisation_counts_warming_pods_that_export_zero() -> None:
    """The HPA's readiness filter is CPU-only: a warming pod that exports a 0 utilisation counts in
    the mean and in the pod count (calcPlainMetricReplicas)."""
    pool = PodPool(MODEL, 10, np.random.default_rng(1))
    busy = 10 * MODEL.permits * 0.96  # 10 ready pods at 96 %
    hpa = HpaUtilisation(0.8, 1, 1000)
    assert hpa.decide(75, _prom(80, busy=busy, ready=10, scraped=10), pool) == 12  # 0.96 / 0.8 x 10
    warming = HpaUtilisation(0.8, 1, 1000)
    assert warming.decide(75, _prom(80, busy=busy, ready=10, scraped=20), pool) == 12  # 0.48 / 0.8 x 20
    assert warming.decide(90, _prom(95, busy=busy * 0.75, ready=10, scraped=20), pool) == 12  # 0.36/0.8x20=9: held


def test_the_fair_peers_are_the_documented_ones() -> None:
    ctls = build_policies(PEERS, MODEL, np.ones(10), 100)
    assert [c.name for c in ctls] == ["keda-concurrency", "keda-rate", "hpa-utilisation", "knative-kpa", "ray-serve"]
    conc, rate = ctls[0], ctls[1]
    assert isinstance(conc, KedaPrometheus) and conc.threshold == pytest.approx(0.8 * MODEL.permits)
    assert isinstance(rate, KedaPrometheus) and rate.threshold == pytest.approx(0.8 * MODEL.replica_rate)


# ------------------------------------------------------------------------------------ Prometheus
def test_warming_pods_count_in_pods_up_and_in_the_utilisations_denominator() -> None:
    pool = PodPool(ServiceModel(startup=Startup(10, 10, pull=(5, 5), scraped_while_warming=True)), 2,
                   np.random.default_rng(1))
    pool.set_target(5, 0)
    pool.tick(4)
    assert (pool.ready, pool.warming, pool.scraped) == (2, 0, 2)
    pool.tick(6)
    assert (pool.ready, pool.warming, pool.scraped) == (2, 3, 5)  # serving /metrics, not Ready
    pool.set_target(4, 7)  # cancels a warming pod
    assert (pool.warming, pool.total) == (2, 4)
    pool.tick(16)
    assert (pool.ready, pool.warming, pool.scraped) == (4, 0, 4)
    prom = _prom(80, busy=2 * MODEL.permits, ready=2, scraped=4)
    assert prom.ready(60) == 4 and prom.utilisation(60) == pytest.approx(0.5)


def test_scrape_failures_drop_pods_from_up_at_the_configured_rate() -> None:
    prom = _prom(15 * 4000, ready=100, scrape_failure=0.01)
    missed = [100 - (prom.ready(15 * k + 1) or 0) for k in range(1, 3999)]
    assert 0.7 < float(np.mean(missed)) < 1.3  # Binomial(100, 1 %): one pod a scrape on average
    assert _prom(100, ready=100).ready(31) == 100
    failing = _prom(15 * 1000, ready=10, query_failure=0.05)
    lost = sum(failing.queue_depth(15 * k + 1) is None for k in range(1, 999))
    assert 25 < lost < 80


# ------------------------------------------------------------------------------ ours-gateway
def test_gateway_counts_are_exact_and_current_where_prometheus_lags_and_misses_pods() -> None:
    """The gateway (issues 19/20) forwards every request: its requests-in-the-pods count is the
    last whole second's, with no scrape lag and no failed scrapes; its offered rate covers its own
    short window. Prometheus' instant query sees the last 15 s scrape."""
    rec = Record(100)
    rec.queue[:50] = 0.0
    rec.queue[50:] = 400.0  # a crowd from second 50
    rec.in_service[:] = 40.0
    rec.arrived[:50] = 100.0
    rec.arrived[50:] = 1000.0
    prom = Prometheus(rec, MODEL, scrape_failure=0.5)
    assert prom.gateway_in_pods(52) == 440.0  # second 51
    assert prom.concurrency(52) == 40.0  # the scrape at 45
    assert prom.gateway_offered(55, 10) == pytest.approx((5 * 100 + 5 * 1000) / 10)
    assert prom.gateway_in_pods(0) is None and prom.gateway_offered(0, 10) is None


def test_ours_gateway_decides_every_two_seconds_on_the_gateways_counts() -> None:
    """``ours-gateway``: the builtin engine on a 2 s tick (the KPA's), the policy fed the gateway's
    counts: 440 requests in 10 pods ask for 440 / 3.2 = 138 pods; the spec's step (100 %) allows 20
    at the first tick after the crowd and, with those pods starting, the measured load at the next
    (2 s later). The Prometheus reading (40 in the pods at the last scrape) asks for nothing more."""
    [gw] = build_policies(["ours-gateway"], MODEL, np.zeros(100), 2000)
    assert gw.name == "ours-gateway" and gw.interval == 2
    rec = Record(100)
    rec.queue[50:] = 400.0
    rec.in_service[:] = 40.0
    rec.arrived[:] = 200.0
    rec.served[:] = 200.0
    rec.busy[:] = 40.0
    rec.ready[:] = 10
    rec.scraped[:] = 10
    prom = Prometheus(rec, MODEL, scrape_failure=0.0, query_failure=0.0)
    pool = PodPool(MODEL, 10, np.random.default_rng(0))
    assert gw.decide(52, prom, pool) == 20
    assert gw.decide(54, prom, pool) == 138
    [builtin] = build_policies(["ours-builtin"], MODEL, np.zeros(100), 2000)
    assert builtin.decide(52, prom, pool) == 13  # demand 200 x 0.2 / 3.2 = 12.5; the in-pods read 40 / 3.2


# ------------------------------------------------------------------- what the KEDA scaler reads
def test_the_scalers_window_average_of_the_requests_in_the_pods_is_prometheus_subquery() -> None:
    """``Queries.requests_in_pods_avg`` (``avg_over_time((sum + sum)[1m:5s])``) as Prometheus 2
    evaluates it: the points at every multiple of 5 s within the closed range [t - 60, t], each
    seeing the last scrape visible then, averaged. One 15 s scrape of 40 among scrapes of 4 moves
    it by its share of the points, not to 40; the instant query reads 40."""
    rec = Record(200)
    rec.queue[:] = 0.0
    rec.in_service[:] = 4.0
    rec.in_service[90] = 40.0  # caught by the scrape at 90 only
    prom = Prometheus(rec, MODEL, scrape_failure=0.0, query_failure=0.0)
    assert prom.concurrency(101) == 40.0
    # at 101: points 45, 50, ..., 100 (12); those at 95 and 100 see the scrape at 90
    assert prom.concurrency_avg(101, 60, 5) == pytest.approx((10 * 4 + 2 * 40) / 12)
    # at 100: points 40 .. 100 (13, the range closed at both ends); 95 and 100 see the scrape at 90
    assert prom.concurrency_avg(100, 60, 5) == pytest.approx((11 * 4 + 2 * 40) / 13)
    assert prom.concurrency_avg(0, 60, 5) is None


def test_ours_keda_reads_the_start_up_and_not_the_requests_in_the_pods() -> None:
    """``ours-keda`` reads what ``sluiceway_scaler.prom`` reads (``tests/scaler/test_scalesim_reads.py``
    pins the whole set): the pods ready and the median own start-up of the ready pods (the pod's
    phases from its process start: the node and the image pull are not in them), and not the
    requests in the pods (the scaler does not read them). ``ours-keda-avg`` (not the product) reads
    their window average into ``requests_in_pods`` and the instant sample into
    ``requests_in_pods_now``."""
    model = ServiceModel(startup=Startup(20, 20, pull=(10, 10), scraped_while_warming=True))
    pool = PodPool(model, 1, np.random.default_rng(1))
    rec = Record(120)
    pool.set_target(3, 0)
    for t in range(120):
        pool.tick(t)
        rec.put(t, _step(), pool)
    assert pool.own_starts == [20.0, 20.0]  # 30 s from asked to ready, 20 of them the pod's own
    prom = Prometheus(rec, model, scrape_failure=0.0, query_failure=0.0)
    s = _signals(61, prom, False, 60, averaged=True)
    assert (s.pods_ready, s.startup_seconds) == (3, 20.0)
    assert s.requests_in_pods == s.requests_in_pods_now == 0.0
    before = _signals(61, prom, False, 60)
    assert (before.pods_ready, before.startup_seconds, before.requests_in_pods_now) == (None, None, None)
    shipped = _signals(61, prom, False, 60, averaged=True, in_pods_term=False, scaler_reads=True)
    assert (shipped.pods_ready, shipped.startup_seconds) == (3, 20.0)
    assert (shipped.requests_in_pods, shipped.requests_in_pods_now) == (None, None)
    assert not OursKeda(default_spec(10), rendered_behavior(default_spec(10), windows_add_up=True)).in_pods_term
    [avg] = build_policies(["ours-keda-avg"], model, np.zeros(120), 20)
    assert isinstance(avg, OursKeda) and avg.in_pods_term and avg.averaged


def _step() -> StepResult:
    """An idle second."""
    return StepResult(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def test_ours_hpa_has_the_rendered_scale_up_tolerance_and_the_peers_hpas_keep_ten_percent() -> None:
    """The operator renders ``behavior.scaleUp.tolerance: "0"`` into KEDA's HPA (engine keda); the
    simulator's ours-keda uses the same, the peers' HPAs the controller manager's default
    (``--horizontal-pod-autoscaler-tolerance``, 0.1) both ways."""
    from sluiceway_operator.render import HPA_SCALE_UP_TOLERANCE

    from bench.scalesim.controllers import SCALE_UP_TOLERANCE, Hpa

    assert float(HPA_SCALE_UP_TOLERANCE) == SCALE_UP_TOLERANCE
    ours = Hpa(1, 100, rendered_behavior(default_spec(100), windows_add_up=True))
    peer = Hpa(1, 100, rendered_behavior(default_spec(100), windows_add_up=True, up_tolerance=None))
    assert not ours.within_tolerance(1.05) and ours.within_tolerance(1.0)
    assert peer.within_tolerance(1.05) and not peer.within_tolerance(1.11)
    # scale-down keeps the 10 % either way
    assert ours.within_tolerance(0.95) and not ours.within_tolerance(0.89)
