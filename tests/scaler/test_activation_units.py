"""Activation from the gateway's hold queue (issue 20), fast: a Prometheus stand-in and a stand-in
gateway ``/metrics`` (the real processes are in test_activation_gateway.py). Each failed before the
fix: with no pod series the scaler's answer was "unknown", which repeats the last answer (``false``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fakeprom import FakePrometheus
from scaler_support import FakeClock, ref, start_scaler
from sluiceway_scaler.podpoll import poll_pods
from sluiceway_scaler.service import SIGNAL_TTL

#: the pods still starting (``Queries.starting_pods``: ``count((up{...} == 1) unless ...)``; the
#: stand-in answers the first key found in a query, so this one comes first); what Prometheus makes
#: of it is tested with real Prometheus (test_activation_starting.py, test_activation_crash_loop.py)
#: and promtool (test_starting_query.py)
STARTING = "count((up{"
#: one pod up, idle and ready since its start (its ``ready`` start phase, which a loading pod lacks)
IDLE_POD = {STARTING: 0.0, "sluiceway_queue_depth": 0.0, "up{": 1.0, "sluiceway_enqueued_total": 0.0,
            "sluiceway_start_phase_seconds": 1.0}


def md(prom: FakePrometheus, **extra: str) -> dict[str, str]:
    return {"inferenceService": "demo", "prometheusAddress": prom.url, "targetQueueDepthPerReplica": "4",
            "minReplicas": "0", "activationPollInterval": "100ms", "queryTimeout": "500ms", **extra}


def test_the_stream_pushes_true_when_the_gateway_holds_at_zero() -> None:
    prom = FakePrometheus(dict(IDLE_POD))
    try:
        with start_scaler(prometheus=(prom.url,)) as s:
            stream = s.stub.StreamIsActive(ref(**md(prom)), timeout=8)
            assert next(stream).result is False
            prom.values = {"sluiceway_gateway_held_requests": 0.0}  # scaled to zero: no pod series
            assert s.stub.IsActive(ref(**md(prom)), timeout=5).result is False  # unknown: the last answer
            prom.values = {"sluiceway_gateway_held_requests": 2.0}
            assert next(stream).result is True
            stream.cancel()
    finally:
        prom.close()


def test_requests_refused_for_want_of_a_pod_activate_with_nothing_held() -> None:
    """Deadlines shorter than the start-up: the gateway holds nothing and refuses at once; the
    refusals in the rate window activate the service."""
    prom = FakePrometheus({"sluiceway_gateway_held_requests": 0.0})
    try:
        with start_scaler(prometheus=(prom.url,)) as s:
            s.stub.IsActive(ref(**md(prom)), timeout=5)
            prom.values["sluiceway_gateway_hold_refused_total"] = 3.0
            assert s.stub.IsActive(ref(**md(prom, rateWindow="2m")), timeout=5).result is True
            assert any("sluiceway_gateway_hold_refused_total" in q and "no_ready_pods|hold_timeout" in q
                       for q in prom.queries)
    finally:
        prom.close()


def test_the_held_count_makes_get_metrics_ask_for_pods_at_zero() -> None:
    prom = FakePrometheus({"sluiceway_gateway_held_requests": 40.0})
    try:
        with start_scaler(prometheus=(prom.url,)) as s:
            from sluiceway_scaler import externalscaler_pb2 as pb

            req = pb.GetMetricsRequest(scaledObjectRef=ref(**md(prom, maxReplicas="100")),
                                       metricName="sluiceway-replicas-team-a-demo")
            value = s.stub.GetMetrics(req, timeout=5).metricValues[0].metricValueFloat
            assert value == 50.0  # 40 held, permits unknown (1 a pod), 80 %: ceil(40 / 0.8)
    finally:
        prom.close()


class _Text:
    body = b""


@pytest.fixture
def gateway_metrics() -> Iterator[tuple[str, type[_Text]]]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(_Text.body)))
            self.end_headers()
            self.wfile.write(_Text.body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", _Text
    finally:
        server.shutdown()
        server.server_close()


def _gateway(held: float, full: float, no_pod: float, other: float) -> bytes:
    return (
        "# TYPE sluiceway_gateway_held_requests gauge\n"
        f"sluiceway_gateway_held_requests {held}\n"
        "# TYPE sluiceway_gateway_hold_refused_total counter\n"
        f'sluiceway_gateway_hold_refused_total{{reason="full"}} {full}\n'
        "# TYPE sluiceway_gateway_refused_total counter\n"
        f'sluiceway_gateway_refused_total{{reason="no_ready_pods"}} {no_pod}\n'
        f'sluiceway_gateway_refused_total{{reason="invalid_input"}} {other}\n'
    ).encode()


def test_a_gateway_metrics_url_in_pod_metrics_urls_activates_on_held_and_refused(
    gateway_metrics: tuple[str, type[_Text]],
) -> None:
    url, text = gateway_metrics
    text.body = _gateway(0, 0, 0, 0)
    idle = poll_pods((url,), 2.0)
    assert idle is not None and not idle.active_since(None)
    text.body = _gateway(2, 0, 0, 0)
    held = poll_pods((url,), 2.0)
    assert held is not None and held.active_since(idle)
    text.body = _gateway(0, 0, 0, 5)  # a client's mistake is no demand for a pod
    assert not poll_pods((url,), 2.0).active_since(idle)  # type: ignore[union-attr]
    for body in (_gateway(0, 1, 0, 0), _gateway(0, 0, 1, 0)):
        text.body = body
        assert poll_pods((url,), 2.0).active_since(idle)  # type: ignore[union-attr]


def test_back_from_zero_the_hold_term_sizes_with_the_last_cost_and_permits_seen() -> None:
    """The pods reported 4 permits and 0.2 s a request; at zero they report nothing, and 40 held
    need ceil(40 / 60 x 0.2 / (4 x 0.8)) = 1 pod, not ceil(40 / 0.8) = 50 (1 permit, cost unknown)."""
    from sluiceway_scaler import externalscaler_pb2 as pb

    # first match wins: utilisation (seconds over permits) 0, cost (seconds over answers) 0.2
    prom = FakePrometheus({"/ sum(sluiceway_concurrency_limit": 0.0, **IDLE_POD, "sluiceway_concurrency_limit": 4.0,
                           "sluiceway_inference_seconds_sum": 0.2})
    try:
        with start_scaler(prometheus=(prom.url,)) as s:
            req = pb.GetMetricsRequest(scaledObjectRef=ref(**md(prom, maxReplicas="100")),
                                       metricName="sluiceway-replicas-team-a-demo")
            # an idle pod reporting 4 permits and 0.2 s a request (a new trigger starts at the pods up)
            assert s.stub.GetMetrics(req, timeout=5).metricValues[0].metricValueFloat == 1.0
            # the edge rate's query names both gateway series: its answers' rate reads 0
            prom.values = {"sluiceway_gateway_answers_total": 0.0, "sluiceway_gateway_held_requests": 40.0}
            time.sleep(1.1)  # past the scaler's 1 s signal cache
            assert s.stub.GetMetrics(req, timeout=5).metricValues[0].metricValueFloat == 1.0
    finally:
        prom.close()


# --- issue 20: never deactivate while a request is in a pod or a pod is still starting ---------------
# Each failed before the change: the first answer was ``false`` (queue 0, no arrival in the rate
# window, nothing held), which lets KEDA scale to zero after its cooldownPeriod.


def test_a_request_running_in_a_pod_keeps_the_service_active_with_no_queue_and_no_arrivals() -> None:
    """A long inference admitted before the rate window: queue 0, arrivals 0, nothing held, but one
    request runs (``sluiceway_concurrency_in_use``, read as ``Queries.requests_in_pods``)."""
    prom = FakePrometheus({"sluiceway_concurrency_in_use": 1.0, **IDLE_POD})
    clock = FakeClock()
    try:
        with start_scaler(prometheus=(prom.url,), clock=clock) as s:
            assert s.stub.IsActive(ref(**md(prom)), timeout=5).result is True
            assert any("sluiceway_concurrency_in_use" in q for q in prom.queries)
            prom.values["sluiceway_concurrency_in_use"] = 0.0
            clock.advance(SIGNAL_TTL)
            assert s.stub.IsActive(ref(**md(prom)), timeout=5).result is False  # the control: idle
    finally:
        prom.close()


def test_a_pod_still_loading_keeps_the_service_active_and_a_draining_one_does_not() -> None:
    """One pod up (scraped: its metrics port answers while the model loads) without its ``ready``
    start phase: it is starting. A pod that was ready exports that phase and keeps it while it
    drains, so the pod going away at scale-down does not wake the service again."""
    loading = {k: v for k, v in IDLE_POD.items() if k != "sluiceway_start_phase_seconds"} | {STARTING: 1.0}
    prom = FakePrometheus(loading)
    try:
        with start_scaler(prometheus=(prom.url,)) as s:
            stream = s.stub.StreamIsActive(ref(**md(prom)), timeout=8)
            assert next(stream).result is True
            assert any(q.startswith(STARTING) and 'phase="ready"' in q for q in prom.queries)
            # ready (and later draining): not starting
            prom.values |= {STARTING: 0.0, "sluiceway_start_phase_seconds": 1.0}
            assert next(stream).result is False
            stream.cancel()
    finally:
        prom.close()


def test_an_unreadable_busy_reading_never_deactivates() -> None:
    prom = FakePrometheus({"sluiceway_concurrency_in_use": 1.0, **IDLE_POD})
    clock = FakeClock()
    try:
        with start_scaler(prometheus=(prom.url,), clock=clock) as s:
            assert s.stub.IsActive(ref(**md(prom)), timeout=5).result is True
            prom.values["sluiceway_concurrency_in_use"] = float("nan")  # garbage: unknown
            clock.advance(SIGNAL_TTL)
            assert s.stub.IsActive(ref(**md(prom)), timeout=5).result is True
    finally:
        prom.close()


def _pod(ready: float, phase_ready: bool, in_use: float = 0.0) -> bytes:
    text = (
        "# TYPE sluiceway_ready gauge\n"
        f'sluiceway_ready{{model="m"}} {ready}\n'
        "# TYPE sluiceway_concurrency_in_use gauge\n"
        f'sluiceway_concurrency_in_use{{model="m"}} {in_use}\n'
        "# TYPE sluiceway_queue_depth gauge\n"
        'sluiceway_queue_depth{model="m"} 0\n'
        "# TYPE sluiceway_start_phase_seconds gauge\n"
        'sluiceway_start_phase_seconds{model="m",phase="loaded"} 3.5\n'
    )
    if phase_ready:
        text += 'sluiceway_start_phase_seconds{model="m",phase="ready"} 0.1\n'
    return text.encode()


def test_the_pod_poll_sees_a_pod_still_loading_but_not_a_draining_or_a_gateway_one(
    gateway_metrics: tuple[str, type[_Text]],
) -> None:
    url, text = gateway_metrics
    text.body = _pod(0, phase_ready=False)  # loading: its metrics port answers, not ready yet
    loading = poll_pods((url,), 2.0)
    assert loading is not None and loading.starting == 1 and loading.active_since(None)
    text.body = _pod(1, phase_ready=True)  # ready and idle
    assert not poll_pods((url,), 2.0).active_since(loading)  # type: ignore[union-attr]
    text.body = _pod(0, phase_ready=True)  # draining (ready before): not starting
    assert not poll_pods((url,), 2.0).active_since(loading)  # type: ignore[union-attr]
    text.body = _gateway(0, 0, 0, 0)  # a gateway exports no sluiceway_ready: never "starting"
    assert not poll_pods((url,), 2.0).active_since(loading)  # type: ignore[union-attr]


def test_a_pod_poll_showing_only_a_loading_pod_asks_prometheus_about_a_crash_loop(
    gateway_metrics: tuple[str, type[_Text]],
) -> None:
    """``podMetricsUrls``: a pod's own ``/metrics`` while it loads (``sluiceway_ready 0``, no
    ``ready`` start phase) cannot tell a first load from a crash loop. Prometheus can
    (``Queries.starting_pods``): starting -> active; crash-looping (not starting) -> not active.
    Before the fix the pod poll alone answered, ``true`` for ever."""
    url, text = gateway_metrics
    text.body = (
        b"# TYPE sluiceway_ready gauge\nsluiceway_ready 0\n"
        b"# TYPE sluiceway_queue_depth gauge\nsluiceway_queue_depth 0\n"
    )
    loading = poll_pods((url,), 2.0)
    assert loading is not None and loading.starting == 1 and loading.only_starting(None)
    prom = FakePrometheus(IDLE_POD | {STARTING: 1.0})
    clock = FakeClock()
    try:
        with start_scaler(prometheus=(prom.url,), pod_metrics=(url,), clock=clock) as s:
            m = md(prom, podMetricsUrls=url)
            assert s.stub.IsActive(ref(**m), timeout=5).result is True  # a first load
            assert any(q.startswith(STARTING) for q in prom.queries)
            prom.values[STARTING] = 0.0  # Prometheus: crash-looping (or loading past its bound)
            clock.advance(SIGNAL_TTL)
            assert s.stub.IsActive(ref(**m), timeout=5).result is False
            prom.mode = "http500"  # Prometheus unreadable: the pods' word stands
            clock.advance(SIGNAL_TTL)
            assert s.stub.IsActive(ref(**m), timeout=5).result is True
    finally:
        prom.close()
