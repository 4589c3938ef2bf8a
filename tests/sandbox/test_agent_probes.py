"""Probes against real listeners on loopback, thresholds, and the grace period -> SIGKILL."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from netports import free_port
from sluiceway_sandbox.agent.probes import ProbeTracker, Result, run_probe
from sluiceway_sandbox.agent.runtime import terminate


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = 200 if self.path == "/ok" else 503
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield int(srv.server_address[1])
    srv.shutdown()


def test_http_probe_success_failure_and_named_port(server: int) -> None:
    assert run_probe({"httpGet": {"path": "/ok", "port": "http"}}, "127.0.0.1", {"http": server}, None).ok
    bad = run_probe({"httpGet": {"path": "/bad", "port": server}}, "127.0.0.1", {}, None)
    assert not bad.ok and "503" in bad.message
    missing = run_probe({"httpGet": {"path": "/ok", "port": "nope"}}, "127.0.0.1", {}, None)
    assert not missing.ok and "nope" in missing.message


def test_tcp_probe(server: int) -> None:
    assert run_probe({"tcpSocket": {"port": server}}, "127.0.0.1", {}, None).ok
    with socket.socket() as s:  # bound, never listening, held through the probe: nobody else takes it
        s.bind(("127.0.0.1", free_port()))
        closed = s.getsockname()[1]
        assert not run_probe({"tcpSocket": {"port": closed}}, "127.0.0.1", {}, None).ok


@pytest.mark.skipif(os.geteuid() != 0, reason="exec probes enter the container's namespaces with nsenter (root)")
def test_exec_probe_runs_in_the_target_process_namespaces() -> None:
    pid = os.getpid()
    assert run_probe({"exec": {"command": ["true"]}}, "127.0.0.1", {}, pid).ok
    res = run_probe({"exec": {"command": ["sh", "-c", "echo nope; exit 3"]}}, "127.0.0.1", {}, pid)
    assert not res.ok and "nope" in res.message


def test_tracker_thresholds_and_initial_delay() -> None:
    probe = {"periodSeconds": 1, "failureThreshold": 2, "successThreshold": 2, "initialDelaySeconds": 5}
    t = ProbeTracker(probe, 100.0)
    assert not t.due(104.0) and t.due(105.0)
    assert t.record(Result(True, ""), 105.0) is None  # one success < successThreshold
    assert t.record(Result(True, ""), 106.0) is True
    assert t.record(Result(False, "x"), 107.0) is None
    assert t.record(Result(False, "x"), 108.0) is False and not t.healthy
    assert t.next_at == 109.0


def _spawn(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready"  # handlers installed
    return proc


def test_sigterm_then_exit_within_grace() -> None:
    proc = _spawn(
        "import signal,sys,time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    code = terminate(proc, None, grace=60)
    assert code == 7  # it handled SIGTERM itself: no SIGKILL needed


def test_grace_period_expires_then_sigkill() -> None:
    proc = _spawn(
        "import signal,time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    t0 = time.monotonic()
    code = terminate(proc, None, grace=1.0)
    assert code == -9  # killed
    assert time.monotonic() - t0 >= 1.0  # not before the grace period
