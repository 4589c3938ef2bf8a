"""Probes as the kubelet runs them: httpGet (2xx/3xx = success), tcpSocket (connect), exec (exit 0,
run inside the container's namespaces with nsenter). ``ProbeTracker`` applies initialDelaySeconds,
periodSeconds, timeoutSeconds, successThreshold and failureThreshold."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]


@dataclass(frozen=True)
class Result:
    ok: bool
    message: str


def resolve_port(port: int | str, named: Mapping[str, int]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    if port not in named:
        raise ValueError(f"no container port named {port!r}")
    return named[port]


def run_probe(probe: JSON, pod_ip: str, named: Mapping[str, int], pid: int | None) -> Result:
    timeout = float(probe.get("timeoutSeconds", 1))
    try:
        if "httpGet" in probe:
            hg = probe["httpGet"]
            port = resolve_port(hg["port"], named)
            host = hg.get("host") or pod_ip
            path = hg.get("path") or "/"
            conn: http.client.HTTPConnection
            if hg.get("scheme", "HTTP").upper() == "HTTPS":
                # the kubelet does not verify probe certificates either
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx)
            else:
                conn = http.client.HTTPConnection(host, port, timeout=timeout)
            try:
                headers = {h["name"]: h["value"] for h in hg.get("httpHeaders") or []}
                headers.setdefault("User-Agent", "kube-probe/sluiceway-sandbox")
                conn.request("GET", path, headers=headers)
                status = conn.getresponse().status
            finally:
                conn.close()
            ok = 200 <= status < 400
            return Result(ok, f"HTTP probe failed with statuscode: {status}" if not ok else "")
        if "tcpSocket" in probe:
            ts = probe["tcpSocket"]
            port = resolve_port(ts["port"], named)
            with socket.create_connection((ts.get("host") or pod_ip, port), timeout=timeout):
                return Result(True, "")
        if "exec" in probe:
            if pid is None:
                return Result(False, "container is not running")
            cmd = ["nsenter", "-t", str(pid), "-n", "-m", "--", *probe["exec"]["command"]]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
            return Result(out.returncode == 0, (out.stdout + out.stderr)[-500:] if out.returncode else "")
        return Result(False, f"unsupported probe handler {sorted(probe)}")
    except subprocess.TimeoutExpired:
        return Result(False, f"command timed out after {timeout}s")
    except (OSError, ValueError, http.client.HTTPException) as err:
        return Result(False, f"probe failed: {err}")


@dataclass
class ProbeTracker:
    """Counts consecutive results; ``due`` says when the next run is (monotonic seconds)."""

    probe: JSON
    started_at: float
    healthy: bool = False
    successes: int = 0
    failures: int = 0
    next_at: float = field(default=0.0)
    last_message: str = ""

    def __post_init__(self) -> None:
        self.next_at = self.started_at + float(self.probe.get("initialDelaySeconds", 0))

    @property
    def period(self) -> float:
        return float(self.probe.get("periodSeconds", 10))

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def record(self, result: Result, now: float) -> bool | None:
        """Fold one result in; returns the new verdict when it changes (True healthy/False failed)."""
        self.next_at = now + self.period
        self.last_message = result.message
        if result.ok:
            self.successes += 1
            self.failures = 0
            if not self.healthy and self.successes >= int(self.probe.get("successThreshold", 1)):
                self.healthy = True
                return True
        else:
            self.failures += 1
            self.successes = 0
            if self.failures >= int(self.probe.get("failureThreshold", 3)):
                self.healthy = False
                return False
        return None
