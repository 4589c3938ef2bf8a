"""Fixtures with real parts for the scaler tests: a sluiceway-pod process (synthetic model), the Debian
prometheus binary scraping it every second on loopback, and the scaler's gRPC server with a real
client channel. Helpers live in scaler_support.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry
from scaler_support import PROMETHEUS, Pod, Prometheus, Scaler, _env, _pod_cli_missing, free_port, wait_http
from sluiceway_scaler import externalscaler_pb2_grpc as pb_grpc
from sluiceway_scaler.metrics import ScalerMetrics
from sluiceway_scaler.service import ExternalScalerService, serve


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """One real sluiceway-pod: synthetic 50 ms model, one permit, so a few clients build a queue."""
    missing = _pod_cli_missing()
    if missing:
        pytest.skip(missing)
    port = free_port()
    log = (tmp_path_factory.mktemp("pod") / "pod.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sluiceway_pod.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            "synthetic:50",
            "--concurrency",
            "1",
            "--max-queue",
            "500",
            "--queue-timeout",
            "60",
        ],
        env=_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/health/ready", 120, proc)
        yield Pod(port, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def prometheus(pod: Pod, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    if not Path(PROMETHEUS).exists() or shutil.which(PROMETHEUS) is None:
        pytest.skip(f"prometheus binary not found at {PROMETHEUS}: apt-get install -y prometheus")
    prom = Prometheus(free_port(), tmp_path_factory.mktemp("prometheus"), [f"127.0.0.1:{pod.port}"])
    prom.start()
    prom.wait_scraped()
    try:
        yield prom
    finally:
        prom.stop()


@pytest.fixture
def scaler() -> Iterator[Scaler]:
    """The scaler's real gRPC server on loopback, called through a real channel."""
    registry = CollectorRegistry()
    metrics = ScalerMetrics(registry)
    service = ExternalScalerService(metrics)
    server, port = serve(service, "127.0.0.1", 0, workers=16)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Scaler(service, metrics, pb_grpc.ExternalScalerStub(channel), port)
    finally:
        service.stop()
        channel.close()
        server.stop(2).wait()
