"""Issue 18 items 10 and 11 over the real gRPC server on loopback: open streams cannot starve the
unary calls, the per-trigger state is bounded whatever names callers send, and a trigger may read
only the ScaledObject's own namespace."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client import CollectorRegistry
from scaler_support import NAMESPACE, no_connection_seen, ref, start_scaler
from sluiceway_scaler import externalscaler_pb2 as pb
from sluiceway_scaler import externalscaler_pb2_grpc as pb_grpc
from sluiceway_scaler.access import AllowList
from sluiceway_scaler.metrics import ScalerMetrics
from sluiceway_scaler.service import ExternalScalerService, serve


@pytest.fixture
def dead_prometheus() -> Iterator[str]:
    """An address that refuses connections at once (bound, never listening)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{s.getsockname()[1]}"
    finally:
        s.close()


def md(address: str, **extra: str) -> dict[str, str]:
    return {"inferenceService": "demo", "prometheusAddress": address, "targetQueueDepthPerReplica": "4",
            "activationPollInterval": "200ms", "queryTimeout": "500ms", **extra}


def test_another_namespace_is_refused_without_a_request() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    addr = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        with start_scaler(prometheus=(addr,)) as s:
            r = ref(**md(addr, namespace="team-b"))
            calls = [
                lambda: s.stub.IsActive(r, timeout=10),
                lambda: s.stub.GetMetricSpec(r, timeout=10),
                lambda: s.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=r, metricName="x"), timeout=10),
                lambda: next(iter(s.stub.StreamIsActive(r, timeout=10))),
            ]
            for call in calls:
                with pytest.raises(grpc.RpcError) as e:
                    call()
                assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value.details()
                assert "scalerMetadata.namespace" in (e.value.details() or "")
                assert "team-b" in (e.value.details() or "") and NAMESPACE in (e.value.details() or "")
            # the ScaledObject's own namespace, spelled out, is accepted
            spec = s.stub.GetMetricSpec(ref(**md(addr, namespace=NAMESPACE)), timeout=10)
            assert spec.metricSpecs[0].metricName == f"sluiceway-replicas-{NAMESPACE}-demo"
        assert no_connection_seen(listener)
    finally:
        listener.close()


def test_open_streams_cannot_starve_get_metrics(dead_prometheus: str) -> None:
    """64 open StreamIsActive streams (one per worker thread before the fix) and a GetMetrics that
    must still answer within 5 s; streams past the cap are refused with RESOURCE_EXHAUSTED."""
    metrics = ScalerMetrics(CollectorRegistry())
    service = ExternalScalerService(metrics, allowed=AllowList.build([dead_prometheus]))
    server, port = serve(service, "127.0.0.1", 0, workers=64)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.ExternalScalerStub(channel)
    streams = []
    try:
        opened = refused = 0
        for i in range(64):
            stream = stub.StreamIsActive(ref(**md(dead_prometheus, inferenceService=f"svc{i}")), timeout=30)
            streams.append(stream)
            try:
                assert next(stream).result is True  # unknown never deactivates
                opened += 1
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
                assert "--workers" in (e.details() or "")
                refused += 1
        started = time.monotonic()
        req = pb.GetMetricsRequest(scaledObjectRef=ref(**md(dead_prometheus)), metricName="")
        with pytest.raises(grpc.RpcError) as err:
            stub.GetMetrics(req, timeout=5)
        took = time.monotonic() - started
        print(f"streams open {opened}, refused {refused}; GetMetrics answered "
              f"{err.value.code().name} in {took:.2f}s")
        # no data and no history: UNAVAILABLE (KEDA's fallback), not a starved DEADLINE_EXCEEDED
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        assert opened >= 32 and opened + refused == 64
        assert metrics.registry.get_sample_value("sluiceway_scaler_active_streams") == opened
    finally:
        for stream in streams:
            stream.cancel()
        service.stop()
        channel.close()
        server.stop(2).wait()


def test_state_is_bounded_whatever_names_callers_send(dead_prometheus: str) -> None:
    metrics = ScalerMetrics(CollectorRegistry())
    service = ExternalScalerService(metrics, allowed=AllowList.build([dead_prometheus]), max_entries=32)
    server, port = serve(service, "127.0.0.1", 0, workers=8)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.ExternalScalerStub(channel)
    try:
        # one ScaledObject, many specs: it keeps a few identities (the newest), never one per call
        for i in range(20):
            stub.IsActive(ref(**md(dead_prometheus, targetQueueDepthPerReplica=str(i + 1))), timeout=10)
        per_object = service.tracked()
        # many ScaledObject names: beyond the cap, new names are refused with a clear status
        codes: dict[str, int] = {}
        message = ""
        for i in range(200):
            r = pb.ScaledObjectRef(name=f"so-{i}", namespace=NAMESPACE, scalerMetadata=md(dead_prometheus))
            try:
                stub.IsActive(r, timeout=10)
                codes["OK"] = codes.get("OK", 0) + 1
            except grpc.RpcError as e:
                codes[e.code().name] = codes.get(e.code().name, 0) + 1
                message = e.details() or ""
        print(f"entries of one ScaledObject after 20 specs: {per_object}; after 200 names: "
              f"{service.tracked()} entries, answers {codes}")
        assert per_object <= 4
        assert service.tracked() <= 32
        assert set(codes) == {"OK", "RESOURCE_EXHAUSTED"}
        assert "--max-triggers" in message
        assert metrics.registry.get_sample_value("sluiceway_scaler_tracked_scaledobjects") <= 32
    finally:
        service.stop()
        channel.close()
        server.stop(2).wait()


class _Leaky:
    """A 'Prometheus' whose answers carry a secret: HTTP 500, not JSON, and a non-numeric sample."""

    SECRET = "AKIA-SECRET-7f3e"

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        owner = self
        self.mode = "http500"

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                secret = owner.SECRET
                if owner.mode == "http500":
                    status, body = 500, f"internal: {secret}".encode()
                elif owner.mode == "notjson":
                    status, body = 200, f"<html>{secret}</html>".encode()
                else:
                    doc = ('{"status":"success","data":{"resultType":"vector","result":'
                           f'[{{"metric":{{}},"value":[1,"{secret}"]}}]}}}}')
                    status, body = 200, doc.encode()
                self.send_response(status)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        import threading

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("mode", ["http500", "notjson", "sample"])
def test_no_answer_bytes_in_errors_or_logs(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    leaky = _Leaky()
    leaky.mode = mode
    try:
        with start_scaler(prometheus=(leaky.url,)) as s:
            req = pb.GetMetricsRequest(scaledObjectRef=ref(**md(leaky.url)), metricName="")
            with pytest.raises(grpc.RpcError) as e:
                s.stub.GetMetrics(req, timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "prometheus" in (e.value.details() or "").lower()
            assert _Leaky.SECRET not in (e.value.details() or "")
        assert caplog.records, "the failure is logged"
        assert not [r.getMessage() for r in caplog.records if _Leaky.SECRET in r.getMessage()]
    finally:
        leaky.close()
