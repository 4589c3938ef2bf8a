"""Prometheus down, slow, or returning garbage: the scaler holds its last answer and never scales down
(issue 10, faults). Small local HTTP servers inject the faults; the clock is injected so that each
outage lasts longer than the scale-down window without the test waiting for it."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from fakeprom import FakePrometheus
from scaler_support import FakeClock, Scaler, ref, start_scaler
from sluiceway_scaler import externalscaler_pb2 as pb

WINDOW = 60.0


def md(address: str) -> dict[str, str]:
    return {"inferenceService": "demo", "prometheusAddress": address, "targetQueueDepthPerReplica": "4",
            "minReplicas": "1", "maxReplicas": "20", "scaleDownWindowSeconds": f"{WINDOW:g}",
            "queryTimeout": "500ms"}


def get(s: Scaler, metadata: dict[str, str]) -> int:
    req = pb.GetMetricsRequest(scaledObjectRef=ref(**metadata), metricName="s0-sluiceway-replicas-team-a-demo")
    (v,) = s.stub.GetMetrics(req, timeout=20).metricValues
    return int(v.metricValueFloat)


@pytest.mark.parametrize("mode", ["down", "slow", "trickle", "http500", "notjson", "shape", "huge", "nan", "inf"])
def test_prometheus_fault_holds_and_never_scales_down(mode: str) -> None:
    prom = FakePrometheus({"sluiceway_queue_depth": 20, "up{": 1, "sluiceway_enqueued_total": 5})
    clock = FakeClock()
    try:
        with start_scaler(prometheus=(prom.url,), clock=clock) as s:
            m = md(prom.url)
            took: list[float] = []
            assert get(s, m) == 5  # ceil(20 / 4)
            # The data would now say 1 replica: a fault must not let it through.
            prom.values["sluiceway_queue_depth"] = 0
            if mode == "down":
                prom.close()
            else:
                prom.mode = mode
                prom.delay = 3.0  # slow: well beyond queryTimeout 500ms
            seen = []
            for _ in range(6):  # 6 x 30 s: three windows of outage
                clock.advance(WINDOW / 2)
                started = time.monotonic()
                seen.append(get(s, m))
                took.append(time.monotonic() - started)
                assert s.stub.IsActive(ref(**m), timeout=20).result is True
            assert seen == [5] * 6, seen
            # Bounded by the query deadline (500ms), not by the server: generous slack for a loaded box.
            assert max(took) < 10, took
            held = sum(
                s.metrics.registry.get_sample_value("sluiceway_scaler_held_total", {"reason": r}) or 0
                for r in ("source_unavailable", "garbage", "nan", "empty")
            )
            assert held >= 6
            if mode == "down":
                return
            # Back to good data: it falls only a full window after the last held decision.
            prom.mode = "ok"
            clock.advance(WINDOW / 2)
            assert get(s, m) == 5
            clock.advance(WINDOW)
            assert get(s, m) == 1
    finally:
        if mode != "down":
            prom.close()


def test_garbage_with_no_history_is_unavailable_not_internal() -> None:
    prom = FakePrometheus()
    prom.mode = "shape"
    clock = FakeClock()
    try:
        with start_scaler(prometheus=(prom.url,), clock=clock) as s:
            for _ in range(6):  # every wrong shape in the cycle
                with pytest.raises(grpc.RpcError) as e:
                    get(s, md(prom.url))
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value.details()
                clock.advance(30)  # past the signal cache: the next call reads again
    finally:
        prom.close()


class PodMetrics:
    """A pod's /metrics stand-in whose body a test sets."""

    def __init__(self) -> None:
        self.body = b""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/plain; version=0.0.4")
                self.send_header("content-length", str(len(owner.body)))
                self.end_headers()
                self.wfile.write(owner.body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def pod_text(depth: str, in_use: str = "0", enqueued: str = "7") -> bytes:
    return (
        f'sluiceway_queue_depth{{model="demo"}} {depth}\n'
        f'sluiceway_concurrency_in_use{{model="demo"}} {in_use}\n'
        f'sluiceway_enqueued_total{{model="demo"}} {enqueued}\n'
    ).encode()


def test_pod_metrics_garbage_never_deactivates() -> None:
    pod = PodMetrics()
    prom = "http://prometheus.monitoring:9090"
    m = md(prom) | {"podMetricsUrls": pod.url}
    try:
        with start_scaler(prometheus=(prom,), pod_metrics=(pod.url,)) as s:
            pod.body = pod_text("3")
            assert s.stub.IsActive(ref(**m), timeout=20).result is True
            for garbage in (pod_text("NaN"), pod_text("0", in_use="-Inf"), pod_text("0", enqueued="NaN"),
                            b"<html>502</html>", b"\x00\xff"):
                pod.body = garbage
                assert s.stub.IsActive(ref(**m), timeout=20).result is True, garbage
            pod.body = pod_text("0")  # idle, nothing enqueued since the last good read: the control
            assert s.stub.IsActive(ref(**m), timeout=20).result is False
            assert (s.metrics.registry.get_sample_value("sluiceway_scaler_pod_polls_total", {"outcome": "error"})
                    == 5.0)
    finally:
        pod.close()
