"""A real Prometheus for tests: the Debian ``prometheus`` binary on loopback, scraping given targets.

Shared by the scaler tests (``tests/scaler/scaler_support.py``) and the operator's builtin-engine test
(``tests/operator/test_operator_prometheus.py``). Each target group carries static labels (the
``namespace`` / ``inferenceservice`` convention that a ServiceMonitor's relabeling produces in a
cluster). ``stop()`` then ``start()`` keeps the port and the TSDB, so a test can take Prometheus away
and bring it back.

Set ``SLUICEWAY_PROMETHEUS`` to use a binary other than ``/usr/bin/prometheus``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PROMETHEUS = os.environ.get("SLUICEWAY_PROMETHEUS", "/usr/bin/prometheus")
SCRAPE_INTERVAL = 1.0


def prometheus_missing() -> str | None:
    """Why the Prometheus binary cannot be used (a skip reason naming it), or None."""
    if not Path(PROMETHEUS).exists() or shutil.which(PROMETHEUS) is None:
        return f"prometheus binary not found at {PROMETHEUS}: apt-get install -y prometheus"
    return None


def wait_http(url: str, deadline_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Until ``url`` answers 200; raises if ``proc`` exits first or after ``deadline_s``."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready within {deadline_s}s")


@dataclass
class PrometheusProcess:
    """One Prometheus process; the config is written at construction, the process runs between
    ``start()`` and ``stop()``."""

    port: int
    workdir: Path
    targets: list[str]
    labels: dict[str, str] = field(default_factory=dict)
    rule_files: list[Path] = field(default_factory=list)
    scrape_interval: float = SCRAPE_INTERVAL
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.workdir / "prometheus.log"
        config = {
            "global": {
                "scrape_interval": f"{self.scrape_interval:g}s",
                "evaluation_interval": "1s",
                "scrape_timeout": f"{round(self.scrape_interval * 900)}ms",
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": "sluiceway-pods",
                    "metrics_path": "/metrics",
                    "static_configs": [{"targets": self.targets, "labels": dict(self.labels)}],
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

    def query(self, promql: str, timeout: float = 5.0) -> list[dict[str, Any]]:
        """An instant query's ``data.result``."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_scraped(self, deadline_s: float = 60) -> None:
        """Until every target has been scraped once (Prometheus starts scraping a few seconds late)."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if len(self.query("up == 1")) == len(self.targets):
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
