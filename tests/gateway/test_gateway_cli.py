"""The gateway's command line: plain help, a bad config named and refused with exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluiceway_gateway.cli", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_help_is_plain() -> None:
    for args in (["--help"], ["serve", "--help"]):
        out = run(*args)
        assert out.returncode == 0 and "usage: sluiceway-gateway" in out.stdout
        assert "\x1b[" not in out.stdout
    assert "--watch-namespace" in run("serve", "--help").stdout


def test_bad_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "g.yaml"
    cfg.write_text("endpoints: ['127.0.0.1:1']\nlimits: {maxBodyBytes: 10}\n")
    out = run("serve", "--config", str(cfg))
    assert out.returncode == 2 and "limits.maxBodyBytes" in out.stderr
    out = run("serve", "--watch-namespace", "demo")
    assert out.returncode == 2 and "--service" in out.stderr
    out = run("serve", "--config", str(tmp_path / "missing.yaml"))
    assert out.returncode == 2 and "missing.yaml" in out.stderr


def test_json_logs_are_one_object_per_line(tmp_path: Path) -> None:
    """``--log-format json``: the start-up line (and every other) is one JSON object with the fields of
    the pod's and the scaler's JSON logs (sluiceway_core.logformat)."""
    import json
    import os
    import time

    import yaml
    from netports import free_port

    cfg = tmp_path / "g.yaml"
    cfg.write_text(yaml.safe_dump({"endpoints": ["127.0.0.1:1"],
                                   "listen": {"host": "127.0.0.1", "port": free_port(), "metricsPort": free_port()}}))
    log = tmp_path / "gateway.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "sluiceway_gateway.cli", "serve", "--config", str(cfg),
                                 "--log-format", "json"], stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 30
        while "listening" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(20)
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    print(lines[:3])
    docs = [json.loads(ln) for ln in lines]  # every line parses
    start = next(d for d in docs if "listening" in d["message"])
    assert {"time", "level", "logger", "message"} <= set(start), start
    assert start["logger"] == "sluiceway.gateway" and start["level"] == "INFO", start
