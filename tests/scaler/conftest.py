"""Fixtures with real parts for the scaler tests: a sluiceway-pod process (synthetic model), the Debian
prometheus binary scraping it every second on loopback, and the scaler's gRPC server with a real
client channel. Helpers live in scaler_support.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from podtools import start_pod
from prometheus_client import CollectorRegistry
from scaler_support import PROMETHEUS, Pod, Prometheus, Scaler, free_port
from sluiceway_scaler import externalscaler_pb2_grpc as pb_grpc
from sluiceway_scaler.metrics import ScalerMetrics
from sluiceway_scaler.service import ExternalScalerService, serve


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """One real sluiceway-pod: synthetic 50 ms model, one permit, so a few clients build a queue."""
    p = start_pod(tmp_path_factory.mktemp("pod"), "--model", "synthetic:50", "--concurrency", "1",
                  "--max-queue", "500", "--queue-timeout", "60")
    try:
        yield Pod(p.port, p.proc)
    finally:
        p.terminate(10)


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
