"""Helpers to start real ``sluiceway-pod`` processes on loopback and read their metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from netports import free_port
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]



@dataclass
class PodProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    metrics_port: int = 0
    model: str = "demo"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def infer_url(self) -> str:
        return f"{self.url}/v2/models/{self.model}/infer"

    @property
    def admin_url(self) -> str:
        """The separate metrics port (``server.metricsPort``): ``/metrics`` and the health probes."""
        return f"http://127.0.0.1:{self.metrics_port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.admin_url}/metrics"

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        if "client" not in self.extra:
            self.extra["client"] = httpx.Client(timeout=10)
        text = self.extra["client"].get(self.metrics_url).text
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        """Sum of all samples of ``name`` whose labels include ``labels``."""
        total = 0.0
        for (n, lbls), v in self.metrics().items():
            if n == name and all(dict(lbls).get(k) == val for k, val in labels.items()):
                total += v
        return total

    async def until(self, name: str, predicate: Any, timeout: float = 30.0, **labels: str) -> float:
        """Poll a metric without blocking the event loop until ``predicate(value)`` holds."""
        import asyncio

        end = time.monotonic() + timeout
        while True:
            value = await asyncio.to_thread(self.metric, name, **labels)
            if predicate(value):
                return value
            if time.monotonic() > end:
                raise AssertionError(f"{name}{labels} stayed at {value} for {timeout}s")
            await asyncio.sleep(0.01)

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def terminate(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start_pod(
    tmp: Path,
    *args: str,
    config: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    wait_ready: bool = True,
    timeout: float = 120,
) -> PodProcess:
    port = free_port()
    metrics_port = free_port()
    cmd = [sys.executable, "-m", "sluiceway_pod.cli", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    model = "demo"
    if "--model-name" in args:
        model = args[list(args).index("--model-name") + 1]
    if config is not None:
        cfg_path = tmp / f"pod-{port}.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        cmd += ["--config", str(cfg_path)]
        model = config.get("model", {}).get("name", model)
    log = tmp / f"pod-{port}.log"
    full_env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "SLUICEWAY_SERVER__METRICS_PORT": str(metrics_port),
        **(env or {}),
    }
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), full_env.get("PYTHONPATH", "")])
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=full_env, cwd=tmp)
    pod = PodProcess(proc, port, log, metrics_port, model)
    if wait_ready:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"pod exited with {proc.returncode}:\n{pod.logs()}")
            try:
                if httpx.get(f"{pod.url}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pod.terminate(5)
                raise RuntimeError(f"pod not ready within {timeout}s:\n{pod.logs()}")
            time.sleep(0.1)
    return pod


def infer_body(rows: int = 1, cols: int = 4, value: float = 1.0, name: str = "INPUT0") -> dict[str, Any]:
    return {"inputs": [{"name": name, "shape": [rows, cols], "datatype": "FP32", "data": [value] * (rows * cols)}]}
