"""Item 13 over real gRPC channels: the address allow-list (nothing is fetched from an address that is
not allowed), TLS and mutual TLS with real certificates, and KEDA's TLS metadata keys."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from netports import free_port
from scaler_support import ROOT, Scaler, no_connection_seen, ref, start_scaler
from sluiceway_scaler import externalscaler_pb2 as pb
from sluiceway_scaler import externalscaler_pb2_grpc as pb_grpc
from sluiceway_scaler.service import TlsFiles
from tlscerts import CA, write


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening socket that must never see a connection."""
    s = socket.socket()
    s.bind(("127.0.0.1", free_port()))  # outside the ephemeral range: no client's local port
    s.listen(16)
    s.setblocking(False)
    try:
        yield s
    finally:
        s.close()


def all_rpcs(stub: pb_grpc.ExternalScalerStub, r: pb.ScaledObjectRef) -> list[grpc.RpcError]:
    calls = [
        lambda: stub.IsActive(r, timeout=10),
        lambda: stub.GetMetricSpec(r, timeout=10),
        lambda: stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=r, metricName="x"), timeout=10),
        lambda: next(iter(stub.StreamIsActive(r, timeout=10))),
    ]
    errors = []
    for call in calls:
        with pytest.raises(grpc.RpcError) as e:
            call()
        errors.append(e.value)
    return errors


def test_prometheus_address_not_allowed_is_refused_without_a_request(listener: socket.socket) -> None:
    addr = f"http://127.0.0.1:{listener.getsockname()[1]}"
    md = {"inferenceService": "demo", "prometheusAddress": addr, "targetQueueDepthPerReplica": "4"}
    for allowed in ((), ("http://prometheus.monitoring:9090",)):
        with start_scaler(prometheus=allowed) as s:
            for err in all_rpcs(s.stub, ref(**md)):
                assert err.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "scalerMetadata.prometheusAddress" in (err.details() or "")
                assert "--allowed-prometheus" in (err.details() or "")
            reg = s.metrics.registry
            assert reg.get_sample_value(
                "sluiceway_scaler_rpcs_total", {"method": "GetMetrics", "code": "PERMISSION_DENIED"}
            ) == 1.0
    assert no_connection_seen(listener)


def test_pod_metrics_url_not_allowed_is_refused_without_a_request(listener: socket.socket) -> None:
    prom = "http://prometheus.monitoring:9090"
    pod = f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
    md = {"inferenceService": "demo", "prometheusAddress": prom, "targetQueueDepthPerReplica": "4",
          "podMetricsUrls": pod}
    with start_scaler(prometheus=(prom,)) as s:
        for err in all_rpcs(s.stub, ref(**md)):
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "scalerMetadata.podMetricsUrls" in (err.details() or "")
    assert no_connection_seen(listener)


def test_allowed_address_is_read(listener: socket.socket) -> None:
    # The same listener, allowed: the scaler does connect (the control for the two tests above).
    addr = f"http://127.0.0.1:{listener.getsockname()[1]}"
    md = {"inferenceService": "demo", "prometheusAddress": addr, "targetQueueDepthPerReplica": "4",
          "queryTimeout": "200ms"}
    with start_scaler(prometheus=(addr + "/",)) as s:
        with pytest.raises(grpc.RpcError) as e:
            s.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(**md)), timeout=20)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE  # the listener never answers
    assert not no_connection_seen(listener)


# --- TLS ----------------------------------------------------------------------------------------

PROM = "http://prometheus.monitoring:9090"
MD = {"inferenceService": "demo", "prometheusAddress": PROM, "targetQueueDepthPerReplica": "4"}


@pytest.fixture(scope="module")
def pki() -> dict[str, bytes]:
    ca, other = CA(), CA("unrelated-ca")
    server = ca.issue("sluiceway-scaler", server=True)
    client = ca.issue("keda-operator", server=False)
    stranger = other.issue("keda-operator", server=False)
    return {
        "ca": ca.cert, "server_cert": server.cert, "server_key": server.key,
        "client_cert": client.cert, "client_key": client.key,
        "stranger_cert": stranger.cert, "stranger_key": stranger.key,
    }


def tls_files(tmp_path: Path, pki: dict[str, bytes], mutual: bool) -> TlsFiles:
    f = write(tmp_path, **{"tls.crt": pki["server_cert"], "tls.key": pki["server_key"], "ca.crt": pki["ca"]})
    return TlsFiles(cert=f["tls.crt"], key=f["tls.key"], ca=f["ca.crt"] if mutual else None)


def spec(s: Scaler, **extra: str) -> pb.GetMetricSpecResponse:
    return s.stub.GetMetricSpec(ref(**MD, **extra), timeout=10)


def test_tls_server_serves_tls_only(tmp_path: Path, pki: dict[str, bytes]) -> None:
    creds = grpc.ssl_channel_credentials(root_certificates=pki["ca"])
    with start_scaler(prometheus=(PROM,), tls=tls_files(tmp_path, pki, mutual=False), credentials=creds) as s:
        assert spec(s).metricSpecs[0].targetSizeFloat == 1.0
        # KEDA's keys that this connection honours are accepted ...
        assert spec(s, caCert="/keda/ca.crt", enableTLS="true", unsafeSsl="false").metricSpecs
        # ... and those it does not are refused, never ignored.
        for key, value in (("unsafeSsl", "true"), ("tlsClientCert", "/keda/tls.crt")):
            with pytest.raises(grpc.RpcError) as e:
                spec(s, **{key: value})
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"scalerMetadata.{key}" in (e.value.details() or "")
        with grpc.insecure_channel(f"127.0.0.1:{s.port}") as plain:
            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.ExternalScalerStub(plain).GetMetricSpec(ref(**MD), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_needs_a_client_certificate_from_the_ca(tmp_path: Path, pki: dict[str, bytes]) -> None:
    good = grpc.ssl_channel_credentials(pki["ca"], pki["client_key"], pki["client_cert"])
    with start_scaler(prometheus=(PROM,), tls=tls_files(tmp_path, pki, mutual=True), credentials=good) as s:
        keda_keys = {"caCert": "/keda/ca.crt", "tlsClientCert": "/keda/tls.crt", "tlsClientKey": "/keda/tls.key"}
        assert spec(s, **keda_keys).metricSpecs[0].metricName == "sluiceway-replicas-team-a-demo"
        for creds in (
            grpc.ssl_channel_credentials(pki["ca"]),  # no client certificate
            grpc.ssl_channel_credentials(pki["ca"], pki["stranger_key"], pki["stranger_cert"]),  # wrong CA
        ):
            with grpc.secure_channel(f"localhost:{s.port}", creds) as ch:
                with pytest.raises(grpc.RpcError) as e:
                    pb_grpc.ExternalScalerStub(ch).GetMetricSpec(ref(**MD), timeout=5)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_plaintext_server_refuses_tls_keys() -> None:
    with start_scaler(prometheus=(PROM,)) as s:
        for key, value in (("caCert", "/keda/ca.crt"), ("enableTLS", "true")):
            with pytest.raises(grpc.RpcError) as e:
                spec(s, **{key: value})
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "--tls-cert" in (e.value.details() or "")


def _cli(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'core'}{os.pathsep}{ROOT / 'operator'}")
    return subprocess.Popen(
        [sys.executable, "-m", "sluiceway_scaler.cli", "serve", "--host", "127.0.0.1", "--port", "0",
         "--metrics-port", "-1", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_cli_mutual_tls(tmp_path: Path, pki: dict[str, bytes]) -> None:
    f = tls_files(tmp_path, pki, mutual=True)
    assert f.ca is not None
    proc = _cli("--tls-cert", str(f.cert), "--tls-key", str(f.key), "--tls-ca", str(f.ca),
                "--allowed-prometheus", PROM)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "listening on 127.0.0.1:" in first, first
        port = int(first.rsplit(":", 1)[1])
        later = [proc.stdout.readline() for _ in range(1)]
        while "gRPC over" not in later[-1] and later[-1] and len(later) < 20:
            later.append(proc.stdout.readline())
        assert "gRPC over mutual TLS" in later[-1], later
        creds = grpc.ssl_channel_credentials(pki["ca"], pki["client_key"], pki["client_cert"])
        with grpc.secure_channel(f"localhost:{port}", creds) as ch:
            assert pb_grpc.ExternalScalerStub(ch).GetMetricSpec(ref(**MD), timeout=10).metricSpecs
    finally:
        proc.terminate()
        assert proc.wait(15) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tls-cert", "/nonexistent/tls.crt", "--tls-key", "/nonexistent/tls.key"],
         "No such file or directory: '/nonexistent/tls."),
        (["--tls-cert", __file__], "--tls-cert and --tls-key"),
        (["--tls-ca", __file__], "--tls-ca needs --tls-cert and --tls-key"),
        (["--allowed-prometheus", "prometheus:9090"], "--allowed-prometheus"),
        (["--allowed-pod-metrics", "ftp://x/metrics"], "--allowed-pod-metrics"),
    ],
)
def test_cli_refuses_bad_security_flags(args: list[str], message: str) -> None:
    proc = _cli(*args)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert message in out
