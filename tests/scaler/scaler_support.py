"""Helpers for the scaler tests (fixtures are in conftest.py): sluiceway-pod processes, the Debian
prometheus binary scraping them every second on loopback, the scaler's gRPC server.

Everything binds 127.0.0.1 on free ports; load is bounded in clients and seconds.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from promtools import PROMETHEUS as PROMETHEUS  # re-exported for conftest.py
from promtools import PrometheusProcess
from promtools import wait_http as wait_http
from sluiceway_scaler import externalscaler_pb2 as pb
from sluiceway_scaler import externalscaler_pb2_grpc as pb_grpc
from sluiceway_scaler.metrics import ScalerMetrics
from sluiceway_scaler.service import ExternalScalerService

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "operator" / "sluiceway_scaler" / "rules.yaml"
NAMESPACE, SERVICE = "team-a", "demo"
INFER_BODY = b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[1.0]}]}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Pod:
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base}/metrics"

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
