"""The scaler end to end: real sluiceway-pod -> real Prometheus (1 s scrapes) -> scaler -> real gRPC client.

Assertions are about behaviour (order of events, values), not about speed; the observed latencies are
printed (``pytest -s``) and quoted in docs/autoscaling.md.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable

import grpc
import pytest
from scaler_support import INFER_BODY, NAMESPACE, SERVICE, Load, Pod, Prometheus, Scaler, ref
from sluiceway_core.policy import Signals
from sluiceway_core.urls import UrlAllowList
from sluiceway_scaler import externalscaler_pb2 as pb
from sluiceway_scaler.prom import PrometheusSource, Queries

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

WINDOW = 5.0  # scale-down stabilisation in these tests (300 s in production)


@pytest.fixture
def allowed_prometheus(prometheus: Prometheus) -> tuple[str, ...]:
    return (prometheus.url,)


@pytest.fixture
def allowed_pod_metrics(pod: Pod) -> tuple[str, ...]:
    return (pod.metrics_url,)


def metadata(prom: Prometheus, **extra: str) -> dict[str, str]:
    return {
        "inferenceService": SERVICE,
        "prometheusAddress": prom.url,
        "targetQueueDepthPerReplica": "2",
        "minReplicas": "1",
        "maxReplicas": "10",
        "scaleDownWindowSeconds": f"{WINDOW:g}",
        "rateWindow": "5s",
        "queryTimeout": "2s",
        **extra,
    }


def get_metric(scaler: Scaler, md: dict[str, str]) -> float:
    req = pb.GetMetricsRequest(scaledObjectRef=ref(**md), metricName="s0-sluiceway-replicas-team-a-demo")
    resp = scaler.stub.GetMetrics(req, timeout=10)
    (value,) = resp.metricValues
    assert value.metricValue == int(value.metricValueFloat)
    return float(value.metricValueFloat)


def wait_for(pred: Callable[[], bool], seconds: float, what: str, every: float = 0.2) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            if pred():
                return time.monotonic() - start
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
        time.sleep(every)
    raise AssertionError(f"timed out after {seconds}s waiting for {what}")


def prom_depth(prom: Prometheus) -> float | None:
    q = Queries.build(NAMESPACE, SERVICE, "5s")
    return PrometheusSource(allow=UrlAllowList.build("test", [prom.url])).scalar(prom.url, q.queue_depth, 2.0)


def pod_idle(pod: Pod) -> bool:
    text = urllib.request.urlopen(pod.metrics_url, timeout=2).read().decode()
    busy = [
        ln
        for ln in text.splitlines()
        if ln.startswith(("sluiceway_queue_depth{", "sluiceway_concurrency_in_use{"))
        and not ln.endswith(" 0.0")
    ]
    return not busy


def one_request(pod: Pod) -> None:
    req = urllib.request.Request(pod.infer_url, data=INFER_BODY, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def test_stream_is_active_fires_on_first_request_via_pod_poll(
    pod: Pod, prometheus: Prometheus, scaler: Scaler
) -> None:
    wait_for(lambda: pod_idle(pod), 30, "an idle pod")
    md = metadata(prometheus, podMetricsUrls=pod.metrics_url, activationPollInterval="200ms")
    stream = scaler.stub.StreamIsActive(ref(**md), timeout=60)
    try:
        assert next(stream).result is False  # idle: the first message says inactive
        sent = time.monotonic()
        threading.Thread(target=one_request, args=(pod,), daemon=True).start()
        assert next(stream).result is True
        print(
            f"\nStreamIsActive (pod poll 200ms): true {time.monotonic() - sent:.3f}s after the first request"
        )
    finally:
        stream.cancel()


def test_stream_is_active_via_prometheus(pod: Pod, prometheus: Prometheus, scaler: Scaler) -> None:
    md = metadata(prometheus, activationPollInterval="250ms")
    # Let earlier traffic leave the 5 s rate window, so the stream starts inactive.
    wait_for(lambda: scaler.stub.IsActive(ref(**md), timeout=10).result is False, 30, "IsActive false")
    stream = scaler.stub.StreamIsActive(ref(**md), timeout=60)
    try:
        assert next(stream).result is False
        sent = time.monotonic()
        threading.Thread(target=one_request, args=(pod,), daemon=True).start()
        assert next(stream).result is True
        print(f"\nStreamIsActive (Prometheus, 1s scrapes): true {time.monotonic() - sent:.3f}s later")
    finally:
        stream.cancel()


def test_load_step_scales_up_fast_and_down_only_after_window(
    pod: Pod, prometheus: Prometheus, scaler: Scaler
) -> None:
    # The backlog and wait terms only: with the utilisation target off there is no demand term,
    # whose answer (what the offered rate needs) may fall while the load still runs, and then the
    # window would start before the load stops (tests/core/test_policy_terms.py covers that term).
    md = metadata(prometheus, targetUtilisationPercent="0")
    wait_for(lambda: get_metric(scaler, md) == 1.0, 30, "GetMetrics = 1 at idle")

    load = Load(pod.infer_url, clients=12, seconds=6).start()
    started = time.monotonic()
    rise = wait_for(lambda: get_metric(scaler, md) >= 3, 6, "GetMetrics to rise under load")
    print(f"\nload step -> GetMetrics >= 3 after {rise:.2f}s (scrape interval 1s)")

    # The signals behind it are real: backlog, wait p95 and both rates from Prometheus.
    def read() -> tuple[Signals, int | None]:
        source = PrometheusSource(allow=UrlAllowList.build("test", [prometheus.url]))
        return source.read_signals(prometheus.url, Queries.build(NAMESPACE, SERVICE, "5s"), 2)

    # rate() needs two scrapes of a series inside its window: give the histogram a few seconds
    wait_for(lambda: read()[0].wait_p95 is not None, 5, "a wait p95 under load")
    signals, pods_up = read()
    assert signals.ok and (signals.queue_depth or 0) > 0
    assert signals.wait_p95 is not None and signals.wait_p95 > 0
    assert (signals.arrival_rate or 0) > 0 and (signals.completion_rate or 0) > 0
    assert pods_up == 1

    # KEDA asks on every polling interval; the scaler only remembers what it was asked. Ask through
    # the whole load, as KEDA would, so the highest answer is recent when the load stops (asking only
    # at the end, after a busy machine stretched the load, saw a drained queue and a stale peak).
    during = []
    while load.thread.is_alive():
        during.append(get_metric(scaler, md))
        time.sleep(0.5)
    load.join()
    stopped = time.monotonic()
    assert load.ok > 0
    peak = get_metric(scaler, md)
    assert peak >= 3, f"answers during the load: {during}, at its end: {peak:g}"
    print(f"peak {peak:g} replicas after {stopped - started:.1f}s of load ({load.ok} requests ok)")

    # Inside the window: Prometheus already shows an empty queue, but the answer holds.
    wait_for(lambda: prom_depth(prometheus) == 0, WINDOW - 1, "Prometheus to show the queue drained")
    held = []
    while time.monotonic() < stopped + WINDOW - 0.5:
        held.append(get_metric(scaler, md))
        time.sleep(0.2)
    assert held and min(held) >= 3, f"fell inside the stabilisation window: {held}"

    # After the window: down to minReplicas.
    fall = wait_for(lambda: get_metric(scaler, md) == 1.0, WINDOW + 15, "GetMetrics to fall after the window")
    print(
        f"fell to 1 at {time.monotonic() - stopped:.2f}s after the load stopped (window {WINDOW:g}s); "
        f"values inside the window: min {min(held):g}, max {max(held):g}; waited {fall:.2f}s after the window"
    )
    reg = scaler.metrics.registry
    assert (reg.get_sample_value("sluiceway_scaler_decisions_total", {"direction": "up"}) or 0) >= 1
    assert (reg.get_sample_value("sluiceway_scaler_decisions_total", {"direction": "down"}) or 0) >= 1


def test_the_scaler_reads_the_window_averaged_requests_in_the_pods_and_the_start_up(
    pod: Pod, prometheus: Prometheus
) -> None:
    """The real Prometheus evaluates the new queries (issue 21, 22 §1): under a steady load of 4
    closed-loop clients on the one-permit pod, the window average of the requests in the pods
    (``Queries.requests_in_pods_avg``, a subquery) reads about 4 in the scaler's signals, next to
    the instant sample; the pod has been ready once (``Queries.pods_ready``) and its measured
    start-up is a positive number of seconds (``Queries.startup_seconds``)."""
    queries = Queries.build(NAMESPACE, SERVICE, "5s")
    src = PrometheusSource(allow=UrlAllowList.build("test", [prometheus.url]))
    load = Load(pod.infer_url, 4, 9.0).start()
    try:
        time.sleep(7.0)  # the 5 s window filled with scrapes of the loaded pod
        signals, _ = src.read_signals(prometheus.url, queries, 2.0)
        average = src.scalar(prometheus.url, queries.requests_in_pods_avg, 2.0)
        instant = src.scalar(prometheus.url, queries.requests_in_pods, 2.0)
    finally:
        load.join()
    print(
        f"\nwindow average {average}, instant {instant}, "
        f"pods ready once {signals.pods_ready}, start-up {signals.startup_seconds}s"
    )
    assert signals.ok, signals.detail
    assert average is not None and 2.0 <= average <= 4.0
    assert instant is not None and 0.0 <= instant <= 4.0
    assert signals.pods_ready == 1
    assert signals.startup_seconds is not None and signals.startup_seconds > 0


def test_prometheus_stopped_holds_the_value(pod: Pod, prometheus: Prometheus, scaler: Scaler) -> None:
    md = metadata(prometheus)
    wait_for(lambda: get_metric(scaler, md) == 1.0, 30, "GetMetrics = 1 at idle")
    load = Load(pod.infer_url, clients=12, seconds=4).start()
    wait_for(lambda: get_metric(scaler, md) >= 3, 4, "GetMetrics to rise under load")
    load.join()
    high = get_metric(scaler, md)

    prometheus.stop()
    time.sleep(1.5)  # past the scaler's signal cache (1 s): every value below is read with Prometheus down
    try:
        values = []
        end = time.monotonic() + WINDOW + 3  # longer than the window: without data it must not fall
        while time.monotonic() < end:
            values.append(get_metric(scaler, md))
            last_held = time.monotonic()
            time.sleep(0.3)
        assert set(values) == {high}, values
        reg = scaler.metrics.registry
        assert (
            reg.get_sample_value("sluiceway_scaler_held_total", {"reason": "source_unavailable"}) or 0
        ) >= len(values)
        assert (
            reg.get_sample_value("sluiceway_scaler_prometheus_queries_total", {"outcome": "error"}) or 0
        ) >= 1
    finally:
        prometheus.start()
        prometheus.wait_scraped()

    # Back with data: held decisions count as recommendations, so it falls only a window after the
    # last one (the outage restarts the stabilisation window).
    wait_for(
        lambda: get_metric(scaler, md) == 1.0, WINDOW + 20, "GetMetrics to fall after Prometheus is back"
    )
    assert time.monotonic() - last_held >= WINDOW - 0.5


def test_shipped_rules_evaluate_in_a_real_prometheus(prometheus: Prometheus) -> None:
    import json

    def healthy() -> bool:
        body = json.load(urllib.request.urlopen(f"{prometheus.url}/api/v1/rules", timeout=5))
        rules = [r for g in body["data"]["groups"] for r in g["rules"]]
        names = {g["name"] for g in body["data"]["groups"]}
        assert names == {"sluiceway.recording", "sluiceway.alerts"}
        assert len(rules) == 11
        return all(r["health"] == "ok" for r in rules) and all(
            r.get("lastEvaluation", "0001").startswith("20") for r in rules
        )

    wait_for(healthy, 40, "all shipped rules evaluated with health ok", every=1.0)


def test_planner_reads_a_running_service_from_prometheus(pod: Pod, prometheus: Prometheus) -> None:
    import json
    import os
    import subprocess
    import sys

    from scaler_support import ROOT

    load = Load(pod.infer_url, clients=4, seconds=4).start()
    load.join()
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'inference-pod'}{os.pathsep}{ROOT / 'operator'}")
    base = [sys.executable, "-m", "sluiceway_scaler.plan_cli", "plan", "--target-wait-p95", "200ms"]
    where = ["--prometheus", prometheus.url, "--inference-service", SERVICE, "--namespace", NAMESPACE]

    def plan(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, *where, "--window", "30s", *extra],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )

    # Arrival rate and concurrency read from Prometheus, service time given.
    r = plan("--service-time", "50ms", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["concurrency"] == 1  # sluiceway_concurrency_limit of the pod
    assert got["arrival_rate"] > 0
    assert got["replicas"] == got["servers_needed"] >= 1
    text = plan("--service-time", "50ms")
    assert text.returncode == 0, text.stderr
    print("\n" + text.stdout)

    # Everything read from Prometheus, the service time too (the pod observes sluiceway_inference_seconds).
    r = plan("--json")
    assert r.returncode == 0, r.stderr
    assert 0.045 <= json.loads(r.stdout)["service_time"] <= 0.1  # the synthetic model holds 50 ms
    text = plan()
    assert text.returncode == 0, text.stderr
    print("\n" + text.stdout)
