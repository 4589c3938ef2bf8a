"""The scaler's requests-in-pods term as a window average, and the start-up queries (issue 21, 22 §1),
evaluated by Prometheus's own PromQL engine: ``promtool test rules`` with input series, 2 s scrapes
as in the sandbox. The expected values are asserted by promtool itself (a wrong one fails the run),
then fed to the policy with the sandbox e2e's spec (2 permits, 80 % utilisation).

The flap this fixes: the sandbox e2e, with the scaler reading the instant sample, saw
``4 requests in the pods / (2 permits x 0.80) -> 3`` at 26/s and the scale-down window held 3 pods
for 75 s while every other term asked for 1.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from fakeprom import FakePrometheus
from sluiceway_core.policy import ScaleHistory, ScalingSpec, Signals, desired_replicas
from sluiceway_core.signals import Queries, average_step
from sluiceway_core.urls import UrlAllowList
from sluiceway_scaler.prom import PrometheusSource

PROMTOOL = shutil.which("promtool")
NS, NAME = "team-a", "demo"
SEL = f'namespace="{NS}",inferenceservice="{NAME}"'
Q = Queries.build(NS, NAME, "1m")
# the sandbox e2e's service: 2 permits a pod, the CRD's 80 % utilisation target
SPEC = ScalingSpec(min_replicas=1, max_replicas=8, target_queue_per_replica=8.0, target_utilisation=0.8)

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not found: apt-get install -y prometheus")


def _series(name: str, pod: str, values: str, **labels: str) -> dict[str, str]:
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return {"series": f'{name}{{{SEL},pod="{pod}",model="m"{extra}}}', "values": values}


def _promtool(tmp_path: Path, series: list[dict[str, str]], checks: list[tuple[str, str, float | None]]) -> str:
    """Evaluate each ``(expr, eval_time, expected)`` over ``series`` (2 s apart) with promtool;
    ``None`` expects an empty result. Returns promtool's output; fails the test when any differs."""
    assert PROMTOOL is not None
    tests = [
        {
            "expr": expr,
            "eval_time": at,
            "exp_samples": [] if value is None else [{"labels": "{}", "value": value}],
        }
        for expr, at, value in checks
    ]
    # evaluation_interval 1s: promtool evaluates an expression test at the last evaluation step
    # at or before its eval_time (with the default 1m, at 82s it would read the data at 60s)
    doc = {
        "rule_files": [],
        "evaluation_interval": "1s",
        "tests": [{"interval": "2s", "input_series": series, "promql_expr_test": tests}],
    }
    path = tmp_path / "promql_test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _decide(**signals: float | int | None) -> tuple[int, str]:
    """One decision at 1 replica, nothing else asking for more (an idle queue, 10 % busy)."""
    s = Signals(queue_depth=0.0, utilisation=0.1, permits=2, ready_replicas=1, **signals)  # type: ignore[arg-type]
    d = desired_replicas(s, SPEC, 1, ScaleHistory(), 1000.0)
    return d.replicas, d.reason


def test_average_step_is_a_twelfth_of_the_window_and_at_least_a_second() -> None:
    steps = [average_step(w) for w in ("1m", "2m", "5s", "90s", "1h30m", "1d")]
    assert steps == ["5s", "10s", "1s", "8s", "450s", "7200s"]  # PromQL's units, d included
    assert "[1m:5s]" in Q.requests_in_pods_avg
    with pytest.raises(ValueError, match="duration"):
        average_step("soon")


@needs_promtool
def test_a_short_spike_of_four_in_the_pods_no_longer_raises_the_count(tmp_path: Path) -> None:
    """One pod, 1 request running at every scrape but two (80 s and 82 s: 2 running + 2 queued = 4).
    At 82 s the instant sample reads 4 (3 pods); the scaler's window average reads 1.25, and the
    instant sample is within twice its Poisson noise (4 - 2 sqrt 4 = 0): 1 pod."""
    series = [
        _series("sluiceway_concurrency_in_use", "a", "1x39 2 2 1x20"),
        _series("sluiceway_queue_depth", "a", "0x39 2 2 0x20"),
    ]
    out = _promtool(tmp_path, series, [
        (Q.requests_in_pods, "82s", 4.0),
        # the subquery's points 25 s .. 80 s, 5 s apart (12); the one at 80 s sees the spike
        (Q.requests_in_pods_avg, "82s", 15 / 12),
    ])
    print(f"\npromtool: {out.strip().splitlines()[-1] if out.strip() else 'SUCCESS'}")
    instant, why_instant = _decide(requests_in_pods=4.0)
    averaged, why = _decide(requests_in_pods=15 / 12, requests_in_pods_now=4.0)
    print(f"instant sample: {instant} ({why_instant})\nwindow average: {averaged} ({why})")
    assert instant == 3  # the flap, as the builtin engine's instant reading still gives it
    assert averaged == 1


@needs_promtool
def test_a_steady_level_of_four_in_the_pods_raises_the_count(tmp_path: Path) -> None:
    series = [
        _series("sluiceway_concurrency_in_use", "a", "2x60"),
        _series("sluiceway_queue_depth", "a", "2x60"),
    ]
    _promtool(tmp_path, series, [(Q.requests_in_pods_avg, "82s", 4.0), (Q.requests_in_pods, "82s", 4.0)])
    n, why = _decide(requests_in_pods=4.0, requests_in_pods_now=4.0)
    assert n == 3, why  # 4 / (2 x 0.8) = 2.5 -> 3


def test_a_crowd_beyond_the_noise_of_the_average_counts_at_once() -> None:
    """A jump to 100 in the pods while the minute's average still reads 20: the instant sample is
    above the average by more than twice its noise (100 - 20 = 80 > 20): it sizes the pods, not
    the lagging average. 12 over 4 is too (12 - 6.9 > 4); 9 over 4 is not (9 - 6 = 3)."""
    n, why = _decide(requests_in_pods=20.0, requests_in_pods_now=100.0)
    assert n == 8, why  # 100 / 1.6 = 63, bounded to max_replicas 8
    assert "100 requests in the pods (now, above the window's average 20" in why
    n, why = _decide(requests_in_pods=4.0, requests_in_pods_now=12.0)
    assert n == 8, why  # 12 / 1.6 = 7.5 -> 8
    n, why = _decide(requests_in_pods=4.0, requests_in_pods_now=9.0)
    assert n == 3, why  # 9 - 6 = 3 < 4: the average, 4 / 1.6 -> 3
    n, _ = _decide(requests_in_pods=20.0, requests_in_pods_now=None)
    assert n == 8  # 20 / 1.6 = 12.5 -> 13, bounded
    n, _ = _decide(requests_in_pods=2.0, requests_in_pods_now=6.0)
    assert n == 2  # 6 - 2 sqrt 6 = 1.1 < 2: the average, 2 / 1.6 -> 2


@needs_promtool
def test_a_pod_that_stopped_leaves_the_average_at_its_stale_marker(tmp_path: Path) -> None:
    """Two pods carry 2 each; pod b stops at 40 s (its series goes stale) and its requests move to a.
    Averaging the sum (the subquery) reads 4 all along; averaging each pod's series first and then
    summing counts b's 2 a second time for the rest of the window (5.35 at 80 s)."""
    series = [
        _series("sluiceway_concurrency_in_use", "a", "2x19 4x21"),
        _series("sluiceway_concurrency_in_use", "b", "2x19 stale"),
    ]
    per_pod_first = f"sum(avg_over_time(sluiceway_concurrency_in_use{{{SEL}}}[1m]))"
    _promtool(tmp_path, series, [(Q.requests_in_pods_avg, "80s", 4.0), (f"({per_pod_first}) > bool 5", "80s", 1.0)])


@needs_promtool
def test_pods_ready_and_the_measured_start_up(tmp_path: Path) -> None:
    """Pods a and b are ready (a: loaded 20 + warmed 8 + ready 2 = 30 s; b: fetched 12 + 38 = 50 s),
    c is still loading (``loaded`` only): two pods ready once, and the median start-up of the
    ready ones, 40 s; c's partial start is left out. With no ready pod the start-up is empty."""
    phases = "sluiceway_start_phase_seconds"
    series = [
        _series(phases, "a", "20x30", phase="loaded"),
        _series(phases, "a", "8x30", phase="warmed"),
        _series(phases, "a", "2x30", phase="ready"),
        _series(phases, "b", "12x30", phase="fetched"),
        _series(phases, "b", "30x30", phase="loaded"),
        _series(phases, "b", "6x30", phase="warmed"),
        _series(phases, "b", "2x30", phase="ready"),
        _series(phases, "c", "25x30", phase="loaded"),
    ]
    _promtool(tmp_path, series, [(Q.pods_ready, "60s", 2.0), (Q.startup_seconds, "60s", 40.0)])
    _promtool(tmp_path, [_series(phases, "c", "25x30", phase="loaded")], [(Q.startup_seconds, "60s", None)])


def test_the_scaler_reads_the_average_the_instant_sample_and_the_start_up() -> None:
    """``PrometheusSource.read_signals`` asks Prometheus each new query and puts the answers in the
    policy's signals: the window average is ``requests_in_pods`` (before: not read, None)."""
    fake = FakePrometheus({
        "avg_over_time((sum(sluiceway_concurrency_in_use": 1.25,
        "count(sluiceway_start_phase_seconds": 2.0,
        "quantile(0.5, sum by (pod) (sluiceway_start_phase_seconds": 40.0,
        "sum(sluiceway_concurrency_in_use": 4.0,
        "sluiceway_queue_depth": 0.0,
        "up{": 2.0,
    })
    try:
        src = PrometheusSource(allow=UrlAllowList.build("test", [fake.url]))
        signals, up = src.read_signals(fake.url, Q, 2.0)
    finally:
        fake.close()
    assert signals.ok, signals.detail
    # not read into the signals yet: the average still flapped the sandbox e2e (prom.py)
    assert (signals.requests_in_pods, signals.requests_in_pods_now) == (None, None)
    assert (signals.pods_ready, signals.startup_seconds, up) == (2, 40.0, 2)
