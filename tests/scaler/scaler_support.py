"""Helpers for the scaler tests (fixtures are in conftest.py): sluiceway-pod processes, the Debian
prometheus binary scraping them every second on loopback, the scaler's gRPC server.

Everything binds 127.0.0.1 on free ports; load is bounded in clients and seconds.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from sluiceway_scaler import externalscaler_pb2 as pb
from sluiceway_scaler import externalscaler_pb2_grpc as pb_grpc
from sluiceway_scaler.metrics import ScalerMetrics
from sluiceway_scaler.service import ExternalScalerService

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = os.environ.get("SLUICEWAY_PROMETHEUS", "/usr/bin/prometheus")
RULES = ROOT / "operator" / "sluiceway_scaler" / "rules.yaml"
NAMESPACE, SERVICE = "team-a", "demo"
SCRAPE_INTERVAL = 1.0
INFER_BODY = b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[1.0]}]}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    path = os.pathsep.join(
        [str(ROOT / "inference-pod"), str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")]
    )
    return dict(os.environ, PYTHONPATH=path)


def wait_http(url: str, deadline_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready within {deadline_s}s")


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


def _pod_cli_missing() -> str | None:
    if not (ROOT / "inference-pod" / "sluiceway_pod" / "cli.py").exists():
        return "sluiceway-pod CLI (inference-pod/sluiceway_pod/cli.py) not present"
    return None


@dataclass
class Prometheus:
    """The Debian prometheus binary on loopback; ``stop()``/``start()`` keep port and storage."""

    port: int
    workdir: Path
    targets: list[str]
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.workdir / "prometheus.log"
        config = {
            "global": {
                "scrape_interval": f"{SCRAPE_INTERVAL:g}s",
                "evaluation_interval": "1s",
                "scrape_timeout": "900ms",
            },
            "rule_files": [str(RULES)] if RULES.exists() else [],
            "scrape_configs": [
                {
                    "job_name": "sluiceway-pods",
                    "metrics_path": "/metrics",
                    "static_configs": [
                        {
                            "targets": self.targets,
                            "labels": {"namespace": NAMESPACE, "inferenceservice": SERVICE},
                        }
                    ],
                }
            ],
        }
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(config))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={self.workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_http(f"{self.url}/-/ready", 60, self.proc)

    def wait_scraped(self, deadline_s: float = 60) -> None:
        """Until every target has been scraped once (Prometheus starts scraping a few seconds late)."""
        import json
        import urllib.parse

        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": "up == 1"})
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            with urllib.request.urlopen(url, timeout=5) as r:
                if len(json.load(r)["data"]["result"]) == len(self.targets):
                    return
            time.sleep(0.2)
        raise TimeoutError(f"targets {self.targets} not scraped within {deadline_s}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


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
