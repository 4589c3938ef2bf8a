"""Fixtures with real parts for the scaler tests: a sluiceway-pod process (synthetic model), the Debian
prometheus binary scraping it every second on loopback, and the scaler's gRPC server with a real
client channel. Helpers live in scaler_support.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from podtools import start_pod
from scaler_support import PROMETHEUS, Pod, Prometheus, Scaler, free_port, start_scaler


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    """One real sluiceway-pod: synthetic 50 ms model, one permit, so a few clients build a queue."""
    p = start_pod(tmp_path_factory.mktemp("pod"), "--model", "synthetic:50", "--concurrency", "1",
                  "--max-queue", "500", "--queue-timeout", "60")
    try:
        yield Pod(p.port, p.proc, p.metrics_port)
    finally:
        p.terminate(10)


@pytest.fixture(scope="module")
def prometheus(pod: Pod, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    if not Path(PROMETHEUS).exists() or shutil.which(PROMETHEUS) is None:
        pytest.skip(f"prometheus binary not found at {PROMETHEUS}: apt-get install -y prometheus")
    prom = Prometheus(free_port(), tmp_path_factory.mktemp("prometheus"), [f"127.0.0.1:{pod.metrics_port}"])
    prom.start()
    prom.wait_scraped()
    try:
        yield prom
    finally:
        prom.stop()


@pytest.fixture
def allowed_prometheus() -> tuple[str, ...]:
    """The scaler's ``--allowed-prometheus`` list; test modules override this fixture."""
    return ()


@pytest.fixture
def allowed_pod_metrics() -> tuple[str, ...]:
    """The scaler's ``--allowed-pod-metrics`` list; test modules override this fixture."""
    return ()


@pytest.fixture
def scaler(allowed_prometheus: tuple[str, ...], allowed_pod_metrics: tuple[str, ...]) -> Iterator[Scaler]:
    """The scaler's real gRPC server on loopback, called through a real channel."""
    with start_scaler(allowed_prometheus, allowed_pod_metrics) as s:
        yield s
