"""The autoscaling simulator: traces, the replica model, each controller, and a small comparison."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bench.scalesim.calibrate import admission_core_run, fluid_run, poisson_times
from bench.scalesim.compare import POLICIES, compare, main
from bench.scalesim.controllers import Hpa, HpaBehavior, Kpa, OursKeda, RayServe, default_spec, rendered_behavior
from bench.scalesim.grid import dominated_by
from bench.scalesim.grid import main as grid_main
from bench.scalesim.model import FluidQueue, PodPool, Record, ServiceModel, Startup
from bench.scalesim.observe import Prometheus
from bench.scalesim.sim import Scores, run
from bench.scalesim.traces import arrivals, make_trace, read_csv_trace

MODEL = ServiceModel()


# ------------------------------------------------------------------------------------ traces
def test_traces_have_their_shape() -> None:
    flash = make_trace("flash", 3600, 1000.0, 1)
    start = int(3600 * 0.4)
    assert flash.rate[start - 1] == pytest.approx(100.0)
    assert flash.rate[start + 60] == pytest.approx(1000.0)  # 10x within one minute
    ramp = make_trace("ramp", 1000, 500.0, 1)
    assert ramp.rate[0] == pytest.approx(50.0) and ramp.rate[-1] == pytest.approx(500.0)
    assert np.all(np.diff(ramp.rate) >= 0)
    onoff = make_trace("onoff", 2400, 300.0, 1)
    assert onoff.rate[0] == 300.0 and onoff.rate[300] == 30.0 and onoff.rate[1200] == 300.0
    day = make_trace("diurnal", 86400, 1000.0, 1)
    assert day.rate[:3600].mean() < 0.2 * day.rate[40000:46000].mean()


def test_arrivals_are_seeded() -> None:
    tr = make_trace("diurnal", 3600, 200.0, 3)
    assert np.array_equal(arrivals(tr, 5), arrivals(tr, 5))
    assert not np.array_equal(arrivals(tr, 5), arrivals(tr, 6))
    assert abs(arrivals(tr, 5).sum() / tr.rate.sum() - 1) < 0.01


def test_csv_replay(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    path.write_text("timestamp,tenant\n100.2,a\n100.9,b\n# comment\n102.5,a\n\n")
    tr = read_csv_trace(path)
    assert tr.rate.tolist() == [2.0, 0.0, 1.0]
    assert arrivals(tr, 1).tolist() == [2, 0, 1]
    bad = tmp_path / "bad.csv"
    bad.write_text("1.0\nlater\n")
    with pytest.raises(ValueError, match=r"bad\.csv:2"):
        read_csv_trace(bad)
    with pytest.raises(ValueError, match="unknown trace"):
        make_trace("weekly", 10, 1.0, 1)


# ------------------------------------------------------------------------------------ model
def test_fluid_queue_refuses_beyond_capacity_and_expires_past_the_deadline() -> None:
    q = FluidQueue(MODEL)
    steps = [q.step(2 * MODEL.replica_rate, 1) for _ in range(3)]  # 40/s offered, 20/s served
    assert [r.served for r in steps] == [MODEL.replica_rate] * 3
    assert [r.queue for r in steps] == [20, 40, 40]  # the queue fills to its bound (40) ...
    assert [r.refused for r in steps] == [0, 0, 20]  # ... then the excess is refused (429)
    # a queue bound above deadline * rate: the excess expires (503) instead
    long_queue = ServiceModel(target_wait=60.0, deadline=1.0)
    q = FluidQueue(long_queue)
    r = q.step(3 * long_queue.replica_rate, 1)
    assert r.expired == pytest.approx(long_queue.replica_rate)
    assert r.wait_p95 == pytest.approx(1.0)
    r = q.step(0.0, 0)
    assert r.served == 0 and r.refused == 0


def test_pod_pool_starts_with_delay_and_cancels_starting_pods_first() -> None:
    pool = PodPool(ServiceModel(startup=Startup(10, 10)), 2, np.random.default_rng(1))
    pool.set_target(5, 0)
    pool.tick(5)
    assert (pool.ready, pool.starting) == (2, 3)
    pool.set_target(3, 6)  # drops two of the starting pods, no ready one
    assert (pool.ready, pool.starting) == (2, 1)
    pool.tick(10)
    assert (pool.ready, pool.starting) == (3, 0)
    pool.set_target(1, 11)
    assert pool.ready == 1
    assert [d for _, d in pool.directions] == [1, -1, -1]


@pytest.mark.parametrize("rho", [0.5, 0.95, 1.2, 2.0])
def test_fluid_model_agrees_with_the_pods_admission_core(rho: float) -> None:
    """The fluid model against the pod's real AdmissionCore driven request by request."""
    rate = rho * MODEL.replica_rate
    times = poisson_times(rate, 300, seed=11)
    real = admission_core_run(MODEL, times, seed=12)
    fluid = fluid_run(MODEL, times, rate)
    assert real.offered == fluid.offered > 1000
    assert abs(real.refused_share - fluid.refused_share) <= 0.02, (real, fluid)
    assert abs(real.served / 300 - fluid.served / 300) <= 0.05 * MODEL.replica_rate


# ------------------------------------------------------------------------------------ controllers
def test_hpa_tolerance_and_legacy_stabilisation() -> None:
    hpa = Hpa(1, 100, None)
    assert hpa.within_tolerance(1.05) and not hpa.within_tolerance(1.2)
    assert hpa.apply(0, 10, 30) == 20  # legacy scale-up cap: max(2 * current, 4)
    assert hpa.apply(15, 20, 5) == 30  # a drop waits: highest recommendation in 5 minutes
    assert hpa.apply(400, 30, 5) == 5  # ... and happens once the window has passed


def test_hpa_behavior_rate_limits() -> None:
    b = HpaBehavior(up_window=0, up_pods=4, up_percent=None, down_window=0, down_pods=1, down_percent=None,
                    down_period=60, down_select="Min")
    hpa = Hpa(1, 100, b)
    assert hpa.apply(0, 10, 30) == 14  # 4 pods per 15 s
    assert hpa.apply(5, 14, 30) == 14  # same period: nothing more
    assert hpa.apply(16, 14, 30) == 18
    assert hpa.apply(100, 18, 2) == 17  # 1 pod per 60 s down
    assert hpa.apply(110, 17, 2) == 17


def _record_with(conc_per_pod: list[float], ready: int) -> Prometheus:
    rec = Record(len(conc_per_pod))
    for i, c in enumerate(conc_per_pod):
        rec.queue[i] = c * ready
        rec.ready[i] = ready
    return Prometheus(rec, MODEL)


def test_kpa_panics_on_a_burst_and_never_shrinks_in_panic() -> None:
    kpa = Kpa(container_concurrency=4, min_replicas=1, max_replicas=1000)
    pool = PodPool(MODEL, 10, np.random.default_rng(1))
    calm = _record_with([2.8] * 60, 10)  # exactly the 70 % target of 4
    assert kpa.decide(60, calm, pool) == 10
    burst = _record_with([2.8] * 54 + [12.0] * 6, 10)  # 6 s window: 4x the target -> panic
    want = kpa.decide(60, burst, pool)
    assert want is not None and want > 10
    pool.set_target(want, 60)
    calm_again = _record_with([2.8] * 60, 10)
    assert kpa.decide(62, calm_again, pool) == want  # in panic: no scale-down


def test_ray_serve_waits_its_upscale_delay() -> None:
    ray = RayServe(1, 100)
    pool = PodPool(MODEL, 4, np.random.default_rng(1))
    busy = _record_with([6.0] * 40, 4)  # 3x the target of 2 ongoing requests per replica
    answers = [ray.decide(t, busy, pool) for t in range(1, 32)]
    assert answers[:30] == [None] * 30
    assert answers[30] == 12


# ------------------------------------------------------------------------------------ runs
def test_small_comparison_is_consistent_and_the_oracle_keeps_the_slo() -> None:
    model = ServiceModel(startup=Startup(30, 90))
    trace = make_trace("flash", 3600, 10 * model.replica_rate * 0.8, 2)
    results, records = compare(trace, model, POLICIES, 20, 2)
    assert {r.policy for r in results} == set(POLICIES)
    by = {r.policy: r for r in results}
    for r in results:
        rec = records[r.policy]
        offered = rec.arrived.sum()
        assert rec.served.sum() + rec.refused.sum() + rec.expired.sum() + rec.queue[-1] == pytest.approx(offered)
        assert r.gpu_hours > 0 and 1 <= r.peak_replicas <= 20
    assert by["oracle"].slo_attainment > 0.999
    again, _ = compare(trace, model, ["ours-keda"], 20, 2)
    assert again[0] == by["ours-keda"]  # deterministic for a seed


def test_cli_writes_json_and_png(tmp_path: Path) -> None:
    log = tmp_path / "trace.csv"
    rng = np.random.default_rng(3)
    stamps = np.sort(rng.uniform(0, 1800, 20000))
    log.write_text("\n".join(f"{s:.3f}" for s in stamps))
    out = tmp_path / "out"
    assert main(["--trace", f"csv:{log}", "--policies", "ours-keda,oracle", "--out", str(out)]) == 0
    rows = json.loads((out / "csv_trace.csv-short.json").read_text())
    assert [r["policy"] for r in rows] == ["ours-keda", "oracle"]
    assert (out / "csv_trace.csv-short.png").stat().st_size > 1000
    assert main(["--trace", "weekly", "--out", str(out)]) == 2


def test_release_window_ends_the_flash_tail_and_needs_the_hpa_to_let_it() -> None:
    """After a flash crowd the fleet shrank at 2 % per minute for hours. With the release window
    the tail ends 20 min after the last high recommendation, at the same SLO; an HPA that repeats
    the 2 % pace holds it back."""
    model = ServiceModel(startup=Startup(30, 180))
    trace = make_trace("flash", 3 * 3600, 200 * model.replica_rate * 0.8, 1)
    arrived = arrivals(trace, 1)
    spec = default_spec(400)
    paced = replace(spec, scale_down=replace(spec.scale_down, release_window=None))
    released, rec = run("flash", trace.rate, arrived, OursKeda(spec, rendered_behavior(spec, windows_add_up=True)),
                        model, seed=1)
    slow, _ = run("flash", trace.rate, arrived, OursKeda(paced, rendered_behavior(paced, windows_add_up=True)),
                  model, seed=1)
    held, _ = run("flash", trace.rate, arrived,
                  OursKeda(spec, rendered_behavior(spec, windows_add_up=True, scaler_paces=False)), model, seed=1)
    assert released.gpu_hours < 0.85 * slow.gpu_hours
    assert released.slo_attainment == pytest.approx(slow.slo_attainment, abs=0.002)
    assert held.gpu_hours > 0.85 * slow.gpu_hours
    end = int(3 * 3600 * 0.4) + 60 + 600 + 600  # the crowd has decayed
    assert rec.total[end + 1200 + 600] <= 1.2 * trace.rate[-1] / (model.replica_rate * 0.8)


def test_grid_scores_candidates_against_the_peers(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--replicas", "20", "--traces", "flash", "--hours", "1", "--engines", "keda", "--rate-window", "60",
            "--release", "none,1200"]
    assert grid_main(argv) == 0
    out = capsys.readouterr().out
    assert "keda window=60 release=off down=2%" in out and "keda window=60 release=1200 down=2%" in out
    assert "undominated on every trace" in out
    assert grid_main(["--engines", "hpa"]) == 2
    with pytest.raises(SystemExit):
        grid_main(["--help"])
    ours = Scores("ours", "t", 1, 0.95, 0.0, 0.05, 1.0, 1.0, 100.0, 1, 0, 1)
    better = Scores("peer", "t", 1, 0.96, 0.0, 0.04, 1.0, 1.0, 100.0, 1, 0, 1)
    worse = Scores("cheap", "t", 1, 0.90, 0.0, 0.10, 1.0, 1.0, 50.0, 1, 0, 1)
    assert dominated_by(ours, [better, worse]) == ["peer"]


def test_simulated_defaults_and_hpa_behaviour_are_what_the_operator_renders() -> None:
    """The simulator's ``ours-keda`` must be the product: the CRD defaults as the operator turns them
    into the policy, and the HPA behaviour it renders for engine keda (window and pace left to the
    scaler). A change on either side that the other does not follow fails here."""
    import yaml
    from sluiceway_operator.reconcile import builtin_scaling_spec
    from sluiceway_operator.render import scale_down_hpa_policies, scale_down_windows
    from sluiceway_operator.spec import parse_spec

    case = Path(__file__).resolve().parents[1] / "operator" / "cases" / "minimal.yaml"
    spec = parse_spec(yaml.safe_load(case.read_text())["spec"])
    assert spec.autoscaling.engine == "keda"
    product = builtin_scaling_spec(spec)
    simulated = default_spec(product.max_replicas)
    assert simulated.scale_down == product.scale_down
    assert simulated.scale_up == product.scale_up
    assert (simulated.target_queue_per_replica, simulated.target_wait_p95, simulated.target_utilisation) == (
        product.target_queue_per_replica, product.target_wait_p95, product.target_utilisation)

    hpa = rendered_behavior(simulated, windows_add_up=True)
    hpa_window, _ = scale_down_windows(spec)
    assert hpa.down_window == hpa_window
    (policy,) = scale_down_hpa_policies(spec)
    assert (hpa.down_percent, hpa.down_period, hpa.down_pods) == (policy["value"], policy["periodSeconds"], None)
    assert policy["type"] == "Percent"
