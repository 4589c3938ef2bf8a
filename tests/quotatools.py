"""The quota coordinator in a real ``sluiceway-scaler serve --quota-port --quota-key-file`` process,
for the tests of the pods' and the gateway replicas' leases."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from netports import free_port


@contextlib.contextmanager
def coordinator_process(tmp: Path, key: bytes, lease: float) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Starts it on a free loopback port with ``key`` as its quota key and ``lease`` seconds leases;
    yields (the process, its base URL) once ``/healthz`` answers (60 s at most); kills it after."""
    port = free_port()
    key_file = tmp / "quota-key"
    key_file.write_bytes(key)
    log_path = tmp / "scaler.log"
    cmd = [
        sys.executable, "-m", "sluiceway_scaler.cli", "serve", "--host", "127.0.0.1", "--port", "0",
        "--metrics-port", "-1", "--quota-port", str(port), "--quota-lease-seconds", str(lease),
        "--quota-key-file", str(key_file),
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the coordinator did not start:\n" + log_path.read_text())
                time.sleep(0.1)
            yield proc, url
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
