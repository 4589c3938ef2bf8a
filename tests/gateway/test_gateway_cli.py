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
