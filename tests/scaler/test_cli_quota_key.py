"""``sluiceway-scaler serve --quota-key-file``: the coordinator gets the key the chart mounts; a
missing or short key file stops start-up with a message naming the path, never the content."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scaler_support import ROOT

PROM = "http://prometheus.monitoring:9090"


def _cli(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'core'}{os.pathsep}{ROOT / 'operator'}")
    return subprocess.Popen(
        [sys.executable, "-m", "sluiceway_scaler.cli", "serve", "--host", "127.0.0.1", "--port", "0",
         "--metrics-port", "-1", "--allowed-prometheus", PROM, "--quota-port", "0", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_bad_quota_key_file_stops_start_up(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("tooshort-SECRETISH")
    for path, message in ((tmp_path / "missing", "cannot read the quota key file"), (short, "fewer than 32")):
        proc = _cli("--quota-key-file", str(path))
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 2, out
        assert message in out and str(path) in out
        assert "SECRETISH" not in out


def _start_up(*args: str) -> str:
    """Everything the CLI prints until it has started, then stops it."""
    proc = _cli(*args)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        while not lines or "gRPC over" not in lines[-1]:
            lines.append(proc.stdout.readline())
            assert lines[-1] and len(lines) < 20, lines
    finally:
        proc.terminate()
        lines.append(proc.communicate(timeout=15)[0])
    out = "".join(lines)
    assert "quota coordinator listening on 127.0.0.1:" in out, out
    return out


def test_quota_key_file_reaches_the_coordinator(tmp_path: Path) -> None:
    assert "no quota key" in _start_up()  # without the flag the coordinator says it refuses leases
    key = tmp_path / "key"
    key.write_bytes(os.urandom(16).hex().encode() * 2 + b"\n")  # 64 bytes, as the chart writes it
    out = _start_up("--quota-key-file", str(key))
    assert "no quota key" not in out, out
    assert key.read_text().strip() not in out
