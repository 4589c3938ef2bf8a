"""The gRPC service through a real channel, for the cases that need no Prometheus."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from scaler_support import ROOT, Scaler, free_port, ref
from sluiceway_scaler import externalscaler_pb2 as pb
from sluiceway_scaler import externalscaler_pb2_grpc as pb_grpc

UNREACHABLE = f"http://127.0.0.1:{free_port()}"  # nothing listens there
GOOD = {"inferenceService": "demo", "prometheusAddress": UNREACHABLE, "targetQueueDepthPerReplica": "4"}


@pytest.fixture
def allowed_prometheus() -> tuple[str, ...]:
    return (UNREACHABLE,)


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({k: v for k, v in GOOD.items() if k != "inferenceService"}, "inferenceService"),
        (GOOD | {"prometheusAddress": "not a url"}, "prometheusAddress"),
        (GOOD | {"targetQueueDepthPerReplica": "-3"}, "targetQueueDepthPerReplica"),
        (GOOD | {"targetWaitP95": "fast"}, "targetWaitP95"),
        (GOOD | {"minReplicas": "4", "maxReplicas": "2"}, "maxReplicas"),
    ],
)
def test_bad_metadata_is_invalid_argument_on_every_rpc(
    scaler: Scaler, metadata: dict[str, str], field: str
) -> None:
    r = ref(**metadata)
    calls = [
        lambda: scaler.stub.IsActive(r, timeout=10),
        lambda: scaler.stub.GetMetricSpec(r, timeout=10),
        lambda: scaler.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=r, metricName="x"), timeout=10),
        lambda: next(iter(scaler.stub.StreamIsActive(r, timeout=10))),
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"scalerMetadata.{field}" in (e.value.details() or "")
    assert (
        scaler.metrics.registry.get_sample_value(
            "sluiceway_scaler_rpcs_total", {"method": "GetMetrics", "code": "INVALID_ARGUMENT"}
        )
        == 1.0
    )


def test_metric_spec_is_replicas_with_target_one(scaler: Scaler) -> None:
    resp = scaler.stub.GetMetricSpec(ref(**GOOD), timeout=10)
    assert len(resp.metricSpecs) == 1
    spec = resp.metricSpecs[0]
    assert spec.metricName == "sluiceway-replicas-team-a-demo"
    assert spec.targetSizeFloat == 1.0 and spec.targetSize == 1


def test_no_data_and_no_history_is_unavailable_for_keda_fallback(scaler: Scaler) -> None:
    req = pb.GetMetricsRequest(scaledObjectRef=ref(**GOOD), metricName="s0-sluiceway-replicas-team-a-demo")
    with pytest.raises(grpc.RpcError) as e:
        scaler.stub.GetMetrics(req, timeout=20)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "fallback" in (e.value.details() or "")
    reg = scaler.metrics.registry
    assert reg.get_sample_value("sluiceway_scaler_prometheus_queries_total", {"outcome": "error"}) == 1.0


def test_unknown_metric_name_is_not_found(scaler: Scaler) -> None:
    req = pb.GetMetricsRequest(scaledObjectRef=ref(**GOOD), metricName="s0-something-else")
    with pytest.raises(grpc.RpcError) as e:
        scaler.stub.GetMetrics(req, timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_is_active_unknown_never_deactivates(scaler: Scaler) -> None:
    # Prometheus unreachable and nothing known: active stays true, so KEDA never scales to zero on no data.
    assert scaler.stub.IsActive(ref(**GOOD), timeout=20).result is True


def test_stream_metric_spec_is_unimplemented_on_purpose(scaler: Scaler) -> None:
    # KEDA v2.21's proto has StreamMetricSpec; KEDA skips it when the scaler answers UNIMPLEMENTED.
    with grpc.insecure_channel(f"127.0.0.1:{scaler.port}") as ch:
        call = ch.unary_stream(
            "/externalscaler.ExternalScaler/StreamMetricSpec",
            request_serializer=pb.ScaledObjectRef.SerializeToString,
            response_deserializer=pb.GetMetricSpecResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as e:
            next(iter(call(ref(**GOOD), timeout=10)))
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_cli_serves_grpc_and_metrics(tmp_path: Path) -> None:
    metrics_port = free_port()
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'inference-pod'}{os.pathsep}{ROOT / 'operator'}")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sluiceway_scaler.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            str(metrics_port),
            "--allowed-prometheus",
            UNREACHABLE,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on 127.0.0.1:" in line, line
        port = int(line.rsplit(":", 1)[1])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.ExternalScalerStub(ch)
            assert stub.GetMetricSpec(ref(**GOOD), timeout=10).metricSpecs[0].targetSizeFloat == 1.0
        import urllib.request

        deadline = time.monotonic() + 10
        while True:
            try:
                body = (
                    urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2)
                    .read()
                    .decode()
                )
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert 'sluiceway_scaler_rpcs_total{code="OK",method="GetMetricSpec"} 1.0' in body
    finally:
        proc.terminate()
        assert proc.wait(15) == 0
