"""Helpers for the scaler tests (fixtures are in conftest.py): sluiceway-pod processes, the Debian
prometheus binary scraping them every second on loopback, the scaler's gRPC server.

Everything binds 127.0.0.1 on free ports; load is bounded in clients and seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from netports import free_port as free_port  # re-exported
from prometheus_client import CollectorRegistry
from promtools import PROMETHEUS as PROMETHEUS  # re-exported for conftest.py
from promtools import PrometheusProcess
from promtools import wait_http as wait_http
from sluiceway_scaler import externalscaler_pb2 as pb
from sluiceway_scaler import externalscaler_pb2_grpc as pb_grpc
from sluiceway_scaler.access import AllowList
from sluiceway_scaler.metrics import ScalerMetrics
from sluiceway_scaler.service import ExternalScalerService, TlsFiles, serve

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "operator" / "sluiceway_scaler" / "rules.yaml"
NAMESPACE, SERVICE = "team-a", "demo"
INFER_BODY = b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[1.0]}]}'



@dataclass
class Pod:
    port: int
    proc: subprocess.Popen[bytes]
    metrics_port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """``/metrics`` lives on the pod's separate metrics port (``server.metricsPort``)."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def infer_url(self) -> str:
        return f"{self.base}/v2/models/demo/infer"


@dataclass
class Prometheus(PrometheusProcess):
    """The Debian prometheus binary on loopback (tests/promtools.py), with the scaler tests' labels
    and the shipped rules; ``stop()``/``start()`` keep port and storage."""

    labels: dict[str, str] = field(default_factory=lambda: {"namespace": NAMESPACE, "inferenceservice": SERVICE})
    rule_files: list[Path] = field(default_factory=lambda: [RULES] if RULES.exists() else [])


@dataclass
class Scaler:
    service: ExternalScalerService
    metrics: ScalerMetrics
    stub: pb_grpc.ExternalScalerStub
    port: int


def ref(**metadata: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="demo-so", namespace=NAMESPACE, scalerMetadata=metadata)


class FakeClock:
    """An injected monotonic clock that only moves when a test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@contextlib.contextmanager
def start_scaler(
    prometheus: tuple[str, ...] = (),
    pod_metrics: tuple[str, ...] = (),
    clock: Callable[[], float] = time.monotonic,
    tls: TlsFiles | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> Iterator[Scaler]:
    """The scaler's real gRPC server on loopback (plain or TLS), called through a real channel."""
    metrics = ScalerMetrics(CollectorRegistry())
    allowed = AllowList.build(prometheus=prometheus, pod_metrics=pod_metrics)
    service = ExternalScalerService(metrics, clock=clock, allowed=allowed)
    server, port = serve(service, "127.0.0.1", 0, workers=16, tls=tls)
    if credentials is None:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    else:
        channel = grpc.secure_channel(f"localhost:{port}", credentials)
    try:
        yield Scaler(service, metrics, pb_grpc.ExternalScalerStub(channel), port)
    finally:
        service.stop()
        channel.close()
        server.stop(2).wait()


def no_connection_seen(sock: socket.socket) -> bool:
    """True when nobody connected to the listening, non-blocking ``sock``."""
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


class Load:
    """Closed-loop HTTP load on loopback in a background thread: ``clients`` loops for ``seconds``."""

    def __init__(self, url: str, clients: int, seconds: float) -> None:
        self.url, self.clients, self.seconds = url, clients, seconds
        self.ok = 0
        self.errors = 0
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        import aiohttp

        deadline = time.monotonic() + self.seconds
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def one() -> None:
                while time.monotonic() < deadline:
                    try:
                        async with session.post(
                            self.url, data=INFER_BODY, headers={"content-type": "application/json"}
                        ) as r:
                            await r.read()
                            if r.status == 200:
                                self.ok += 1
                            else:
                                self.errors += 1
                    except (TimeoutError, aiohttp.ClientError):
                        self.errors += 1

            await asyncio.gather(*(one() for _ in range(self.clients)))

    def start(self) -> Load:
        self.thread.start()
        return self

    def join(self) -> None:
        self.thread.join(self.seconds + 60)


def wait_for(pred: Callable[[], bool], seconds: float, what: str) -> float:
    """Poll ``pred`` every 0.2 s until true; fail naming ``what`` after ``seconds``. Returns the wait."""
    start = time.monotonic()
    while not pred():
        assert time.monotonic() - start < seconds, f"not within {seconds}s: {what}"
        time.sleep(0.2)
    return time.monotonic() - start
