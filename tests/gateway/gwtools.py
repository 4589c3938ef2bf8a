"""Start a real ``sluiceway-gateway`` process on loopback in front of real pods."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from netports import free_port
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class GatewayProcess:
    proc: subprocess.Popen[bytes]
    port: int
    metrics_port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def infer_url(self, model: str = "demo") -> str:
        return f"{self.url}/v2/models/{model}/infer"

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text
        total = 0.0
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start_gateway(tmp: Path, config: dict[str, Any], timeout: float = 30, args: tuple[str, ...] = ()) -> GatewayProcess:
    port, mport = free_port(), free_port()
    cfg = {**config, "listen": {"host": "127.0.0.1", "port": port, "metricsPort": mport}}
    path = tmp / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = tmp / f"gateway-{port}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "sluiceway_gateway.cli", "serve", "--config", str(path), *args],
                                stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    gw = GatewayProcess(proc, port, mport, log)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {proc.returncode}:\n{gw.logs()}")
        try:
            if httpx.get(f"{gw.url}/v2/health/ready", timeout=2).status_code == 200:
                return gw
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            gw.stop(5)
            raise RuntimeError(f"gateway not ready within {timeout}s:\n{gw.logs()}")
        time.sleep(0.05)
