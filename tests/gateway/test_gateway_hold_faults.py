"""The hold queue under faults, with real processes on loopback (issue 20, "Tests with real parts"):
a real ``sluiceway-gateway`` in front of real ``sluiceway-pod`` processes whose model is a real torch
MLP behind a slow load (``bench.burst_at_zero:slow_model``: it sleeps, then builds the pod's ``demo``
module), or a load that never ends, or one that fails (the pod exits 3; the test restarts it, as the
kubelet does in a crash loop).

What the older hold tests already cover is not repeated here (``test_gateway_hold.py``: SIGTERM
with nothing but held requests, SIGTERM with a pod that comes within the grace; ``test_gateway_predict.py``:
the early 503 when a pod is predicted too late, a held request whose client left). Here:

* SIGTERM while requests are both held and in flight at a slow pod, the grace shorter than the work:
  every connection gets exactly one answer (200, or a refusal with a reason), the gateway exits 0,
  and a gateway started again in its place serves;
* a pod slower than ``hold.startupSeconds``: held requests whose deadline the pod can still meet are
  answered 200; those it cannot are refused with a reason before their deadline;
* a pod that never becomes ready (a load that never ends; a crash loop): held requests are refused
  with a reason before their deadline;
* a burst at a ready pod larger than the pod's connection limit: the pod's HTTP server refuses the
  excess (``503 Service Unavailable``, before any work) and the gateway holds them: all 200;
* beyond the hold bound while a pod starts: the refusal's ``Retry-After`` is the predicted ready time.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from gwtools import ROOT, GatewayProcess
from netports import free_port

pytestmark = pytest.mark.slow

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                               "data": [0.5] * 16}]}).encode()
SLOW = "bench.burst_at_zero:slow_model"


def slow_env(load_seconds: float, fail: bool = False) -> dict[str, str]:
    env = {"SLUICEWAY_BENCH_LOAD_SECONDS": f"{load_seconds:g}", "PYTHONPATH": str(ROOT)}
    if fail:
        env["SLUICEWAY_BENCH_LOAD_FAIL"] = "1"
    return env


def wait_metric(gw: GatewayProcess, name: str, value: float, timeout: float = 20.0, **labels: str) -> None:
    end = time.monotonic() + timeout
    while (got := gw.metric(name, **labels)) != value:
        assert time.monotonic() < end, f"{name}{labels} = {got}, expected {value}"
        time.sleep(0.05)


class Raw:
    """Requests on raw sockets, one thread each, all read to the connection's close, so a test sees
    every byte a connection got: ``answers`` holds (deadline_ms, sent, closed, bytes)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.answers: list[tuple[int, float, float, bytes]] = []
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def send(self, n: int, deadline_ms: int) -> None:
        def run() -> None:
            got = b""
            with socket.create_connection(("127.0.0.1", self.port), timeout=60) as s:
                sent = time.monotonic()
                s.sendall(b"POST /v2/models/demo/infer HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                          b"x-sluiceway-deadline-ms: %d\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
                          % (deadline_ms, len(BODY), BODY))
                try:
                    while chunk := s.recv(65536):
                        got += chunk
                except OSError:
                    pass
            with self._lock:
                self.answers.append((deadline_ms, sent, time.monotonic(), got))

        for _ in range(n):
            t = threading.Thread(target=run)
            t.start()
            self.threads.append(t)

    def join(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "a client hung"


def parse(raw: bytes) -> tuple[int, str, str | None]:
    """(status, reason, retry-after) of the one answer in ``raw``; asserts there is exactly one."""
    assert raw.count(b"HTTP/1.1 ") == 1, raw[:300]
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in lines[1:])}
    reason = ""
    if status != 200:
        try:
            reason = json.loads(body)["reason"]
        except (ValueError, KeyError, TypeError):
            reason = "?" + body[:60].decode(errors="replace")
    ra = headers.get(b"retry-after")
    return status, reason, ra.decode() if ra is not None else None


def test_sigterm_while_holding_and_in_flight_answers_every_request_once_then_a_new_gateway_serves(
    pod_factory: Any, gateway_factory: Any
) -> None:
    """A pod with 1 permit and a queue of 1 taking 0.4 s a request; 10 requests at once: 2 reach the
    pod, 8 are held (the pod refused them for a full queue). SIGTERM with a 2 s grace (less than the
    4 s of work): the gateway
    hands held requests to the pod as it has room, and when the grace ends answers what is still
    held 503 ``gateway_draining`` and what is still at the pod with a reason too: every connection
    gets exactly one answer and none is left without one; it exits 0. A gateway started again for the
    same pod serves at once."""
    pod = pod_factory("--model", "synthetic:400", "--concurrency", "1", "--max-queue", "1")
    gw = gateway_factory({"endpoints": [f"127.0.0.1:{pod.port}"]}, args=("--drain-seconds", "2"))
    raw = Raw(gw.port)
    raw.send(10, 30_000)
    end = time.monotonic() + 20
    while gw.metric("sluiceway_gateway_held_requests") < 7:
        assert time.monotonic() < end, "the requests were not held"
        time.sleep(0.02)
    t0 = time.monotonic()
    gw.proc.send_signal(signal.SIGTERM)
    rc = gw.proc.wait(20)
    raw.join(20)
    took = time.monotonic() - t0
    answers = [parse(a) for _, _, _, a in raw.answers if a]
    codes = Counter((s, r) for s, r, _ in answers)
    print(f"exit {rc} after {took:.2f}s; answers {dict(codes)}; connections without an answer: "
          f"{sum(1 for *_, a in raw.answers if not a)}")
    assert rc == 0 and len(raw.answers) == 10
    assert all(a for *_, a in raw.answers), "a connection closed without an answer"
    assert codes[(200, "")] >= 2, codes  # what the pod had when SIGTERM came finished
    assert set(codes) <= {(200, ""), (503, "gateway_draining"), (502, "upstream_lost")}, codes
    assert took < 12, took
    again = gateway_factory({"endpoints": [f"127.0.0.1:{pod.port}"]})
    r = httpx.post(again.infer_url(), content=BODY, timeout=30)
    assert r.status_code == 200, r.text


def test_a_pod_slower_than_predicted_held_requests_each_get_one_answer_by_their_deadline(
    pod_factory: Any, gateway_factory: Any
) -> None:
    """``hold.startupSeconds`` 1 while the pod takes its 3 s load plus its start: requests held with a
    60 s deadline are answered 200 when it is ready; those with a 2.5 s deadline, which the late pod
    cannot meet, are refused with a reason before their deadline (not left to time out in the queue)."""
    port = free_port()
    gw = gateway_factory({"endpoints": [f"127.0.0.1:{port}"], "pollAfterMs": 100, "hold": {"startupSeconds": 1}})
    wait_metric(gw, "sluiceway_gateway_endpoints", 1, state="down")  # seen starting
    pod = pod_factory("--model", SLOW, "--concurrency", "1", "--max-queue", "8", "--port", str(port),
                      env=slow_env(3), wait_ready=False)
    pod.port = port
    raw = Raw(gw.port)
    raw.send(4, 60_000)
    raw.send(4, 2500)
    raw.join(90)
    rows = [(dl, closed - sent, *parse(a)) for dl, sent, closed, a in raw.answers]
    print("answers (deadline ms, after s, status, reason):", sorted((dl, round(t, 2), s, r) for dl, t, s, r, _ in rows))
    assert len(rows) == 8
    for dl, took, status, reason, _ in rows:
        if dl == 60_000:
            assert status == 200, (dl, took, status, reason)
        else:
            assert status in (503, 504) and reason in ("no_capacity_in_time", "hold_timeout"), (status, reason)
            assert took < dl / 1000.0, f"answered {took:.3f}s after it was sent; its deadline was {dl} ms"
    assert pod.metric("sluiceway_requests_total", code="200") == 4


class CrashLoop:
    """Starts a pod whose load fails (it exits 3) on ``port`` again each time it exits, after a
    short back-off, as the kubelet restarts a crash-looping container; until :meth:`stop`."""

    def __init__(self, tmp: Path, port: int) -> None:
        from podtools import start_pod

        self.starts = 0
        self.codes: list[int] = []
        self._stop = threading.Event()
        self._procs: list[Any] = []

        def run() -> None:
            while not self._stop.is_set():
                pod = start_pod(tmp, "--model", SLOW, "--port", str(port), env=slow_env(1, fail=True),
                                wait_ready=False)
                self._procs.append(pod)
                self.starts += 1
                while pod.proc.poll() is None and not self._stop.is_set():
                    time.sleep(0.05)
                if pod.proc.poll() is not None:
                    self.codes.append(pod.proc.returncode)
                self._stop.wait(0.3)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for p in self._procs:
            if p.proc.poll() is None:
                p.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.proc.wait(10)


@pytest.mark.parametrize("fault", ["never_ready", "crash_loop"])
def test_a_pod_that_never_becomes_ready_held_requests_are_refused_with_a_reason_before_their_deadline(
    pod_factory: Any, gateway_factory: Any, tmp_path: Path, fault: str
) -> None:
    """``hold.startupSeconds`` 1; the pod never becomes ready: its load never ends (it answers 503
    ``not_ready`` all along), or it fails and the pod exits, again and again (a crash loop). Requests
    held with a 6 s deadline are each refused once, with a reason, before that deadline."""
    port = free_port()
    gw = gateway_factory({"endpoints": [f"127.0.0.1:{port}"], "pollAfterMs": 100, "hold": {"startupSeconds": 1}})
    wait_metric(gw, "sluiceway_gateway_endpoints", 1, state="down")
    loop: CrashLoop | None = None
    if fault == "never_ready":
        pod = pod_factory("--model", SLOW, "--port", str(port), env=slow_env(3600), wait_ready=False)
    else:
        loop = CrashLoop(tmp_path, port)
        end = time.monotonic() + 60
        while not (loop.codes and loop.starts >= 2):  # the first start failed and the next began
            assert time.monotonic() < end, "the pod's start did not fail"
            time.sleep(0.05)
    try:
        raw = Raw(gw.port)
        raw.send(5, 6000)
        raw.join(30)
    finally:
        if loop is not None:
            loop.stop()
    rows = [(closed - sent, *parse(a), a) for _, sent, closed, a in raw.answers]
    print(fault, "answers (after s, status, reason, retry-after):",
          sorted((round(t, 2), s, r, ra) for t, s, r, ra, _ in rows),
          f"pod starts {loop.starts} exits {loop.codes}" if loop is not None else "", "first body:",
          rows[0][-1].partition(b"\r\n\r\n")[2][:400] if rows else b"")
    assert len(rows) == 5
    for took, status, reason, _, _ in rows:
        assert status in (503, 504) and reason in ("no_capacity_in_time", "hold_timeout"), (status, reason)
        assert took < 6.0 - 0.25, f"answered {took:.3f}s after it was sent; its deadline was 6 s"
    if fault == "never_ready":
        assert pod.proc.poll() is None  # it was loading all along
    else:
        assert loop is not None and loop.starts >= 2 and set(loop.codes) == {3}, (loop.starts, loop.codes)
        assert all(b"failed start" in a for *_, a in rows), rows[0][-1]  # the refusal says why


def test_a_burst_over_the_pods_connection_limit_is_held_not_refused(pod_factory: Any, gateway_factory: Any) -> None:
    """A ready pod whose HTTP server takes at most 6 connections (``server.maxConnections``) and 24
    requests at once through the gateway: the pod's server refuses the excess ``503 Service
    Unavailable`` before its app sees them; the gateway holds those until the pod has room, so every
    request is answered 200."""
    pod = pod_factory("--model", "synthetic:100", "--concurrency", "1", "--max-queue", "64",
                      config={"server": {"maxConnections": 6}})
    gw = gateway_factory({"endpoints": [f"127.0.0.1:{pod.port}"]})
    raw = Raw(gw.port)
    raw.send(24, 60_000)
    raw.join(60)
    codes = Counter((s, r) for s, r, _ in (parse(a) for *_, a in raw.answers))
    print("answers:", dict(codes), "gateway retries:", gw.metric("sluiceway_gateway_retries_total"))
    assert codes == Counter({(200, ""): 24}), codes


def test_over_the_hold_bound_while_a_pod_starts_retry_after_is_the_predicted_ready_time(
    gateway_factory: Any
) -> None:
    """A pod predicted in 8 s (``hold.startupSeconds``), the hold bound at 2: the third request is
    refused 503 ``hold_full`` at once with a ``Retry-After`` of the predicted ready time (not the
    idle default of 1 s: nothing will have room sooner)."""
    gw = gateway_factory({"endpoints": [f"127.0.0.1:{free_port()}"], "pollAfterMs": 100,
                          "hold": {"startupSeconds": 8, "maxRequests": 2, "retryAfterSeconds": 1}})
    wait_metric(gw, "sluiceway_gateway_endpoints", 1, state="down")
    raw = Raw(gw.port)
    raw.send(2, 10_000)
    wait_metric(gw, "sluiceway_gateway_held_requests", 2)
    with httpx.Client(timeout=10) as c:
        r = c.post(gw.infer_url(), content=BODY, headers={"X-Sluiceway-Deadline-Ms": "10000"})
    print("over the bound:", r.status_code, r.json().get("reason"), "retry-after", r.headers.get("retry-after"))
    assert (r.status_code, r.json()["reason"]) == (503, "hold_full"), r.text
    assert 5 <= int(r.headers["retry-after"]) <= 9, r.headers
    raw.join(30)
