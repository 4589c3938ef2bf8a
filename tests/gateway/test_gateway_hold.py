"""The hold queue over real HTTP: a real gateway process, real ``sluiceway-pod`` processes started
while requests are held (docs/gateway.md, "The hold queue")."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from gwtools import GatewayProcess
from netports import free_port

pytestmark = pytest.mark.slow

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                               "data": [1.0, 2.0, 3.0, 4.0]}]}).encode()


class Clients:
    """Requests sent at once, one thread and one connection each; ``results``: (sent, answered,
    status, reason, retry-after)."""

    def __init__(self, gw: GatewayProcess) -> None:
        self.gw = gw
        self.results: list[tuple[float, float, int, str, str | None]] = []
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def send(self, n: int, deadline_ms: int, key: str | None = None) -> None:
        headers = {"X-Sluiceway-Deadline-Ms": str(deadline_ms)}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"

        def one() -> None:
            client = httpx.Client(timeout=deadline_ms / 1000 + 30)  # built before the clock starts
            sent = time.monotonic()
            try:
                r = client.post(self.gw.infer_url(), content=BODY, headers=headers)
                status, reason = r.status_code, (r.json().get("reason", "") if r.status_code != 200 else "")
                ra = r.headers.get("retry-after")
            except httpx.HTTPError as err:
                status, reason, ra = -1, type(err).__name__, None
            finally:
                client.close()
            with self._lock:
                self.results.append((sent, time.monotonic(), status, reason, ra))

        for _ in range(n):
            t = threading.Thread(target=one)
            t.start()
            self.threads.append(t)

    def join(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "a client hung"


def wait_metric(gw: GatewayProcess, name: str, value: float, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while (got := gw.metric(name)) != value:
        assert time.monotonic() < end, f"{name} = {got}, expected {value}"
        time.sleep(0.05)


def one(gw: GatewayProcess, deadline_ms: int = 5000, key: str | None = None) -> tuple[httpx.Response, float]:
    headers = {"X-Sluiceway-Deadline-Ms": str(deadline_ms)}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    with httpx.Client(timeout=30) as client:  # built before the clock starts
        t0 = time.monotonic()
        r = client.post(gw.infer_url(), content=BODY, headers=headers)
        return r, time.monotonic() - t0


def test_requests_held_at_zero_are_answered_when_the_pod_starts_at_its_rate(
    pod_factory: Any, gateway_factory: Any
) -> None:
    """No pod at first: N requests are held (none answered, none refused); a pod starts (1 permit,
    a queue of 1): all N are answered 200, and the hand-off never had more than permits + queue room
    in flight to it: the pod refused none for a full queue, and its own gauges never showed more."""
    port = free_port()
    gw = gateway_factory({"endpoints": [f"127.0.0.1:{port}"]})  # hold defaults: handoffQueuePerPod 1
    n = 16
    clients = Clients(gw)
    clients.send(n, 60_000)
    wait_metric(gw, "sluiceway_gateway_held_requests", n)
    assert clients.results == []  # held: nothing answered, nothing refused
    started = time.monotonic()
    pod = pod_factory("--model", "synthetic:100", "--concurrency", "1", "--max-queue", "1", "--port", str(port),
                      wait_ready=False)
    pod.port = port  # the gateway knew this address before the pod existed
    most = 0.0
    end = time.monotonic() + 90
    while len(clients.results) < n and time.monotonic() < end:
        try:
            load = pod.metric("sluiceway_concurrency_in_use") + pod.metric("sluiceway_queue_depth")
            most = max(most, load)
        except httpx.HTTPError:
            pass  # the pod's metrics port is not up yet
        time.sleep(0.02)
    clients.join(30)
    codes = Counter((s, r) for _, _, s, r, _ in clients.results)
    spans = sorted(t1 - started for _, t1, _, _, _ in clients.results)
    print("answers:", dict(codes), f"first {spans[0]:.2f}s last {spans[-1]:.2f}s after the pod was started",
          "pod in flight at most:", most, "pod queue_full refusals:",
          pod.metric("sluiceway_rejected_total", reason="queue_full"))
    assert codes == Counter({(200, ""): n}), codes
    assert pod.metric("sluiceway_requests_total", code="200") == n
    assert pod.metric("sluiceway_rejected_total", reason="queue_full") == 0  # never more than its room
    assert gw.metric("sluiceway_gateway_retries_total") == 0
    assert most <= 2, most  # 1 permit + 1 queue place
    assert gw.metric("sluiceway_gateway_held_requests") == 0
    assert gw.metric("sluiceway_gateway_hold_seconds_count", outcome="handed_off") == n


def test_bound_refuses_fast_with_retry_after_and_held_deadlines_are_kept(gateway_factory: Any) -> None:
    gw = gateway_factory({"endpoints": [f"127.0.0.1:{free_port()}"],  # nothing listens there
                          "hold": {"maxRequests": 4, "retryAfterSeconds": 7}})
    clients = Clients(gw)
    clients.send(4, 2500)
    wait_metric(gw, "sluiceway_gateway_held_requests", 4)
    refused = [one(gw, 2500) for _ in range(3)]
    for r, took in refused:
        assert (r.status_code, r.json()["reason"], r.headers.get("retry-after")) == (503, "hold_full", "7"), r.text
        assert took < 1.5, took  # at once: held, it would wait its 2.5 s deadline
    clients.join(20)
    late = [t1 - t0 for t0, t1, _, _, _ in clients.results]
    print("refused in:", [round(t, 3) for _, t in refused], "held answered after (deadline 2.5 s):",
          [round(x, 3) for x in late])
    assert {(s, r) for _, _, s, r, _ in clients.results} == {(504, "hold_timeout")}
    assert all(2.5 - 0.05 <= x <= 2.5 + 0.75 for x in late), late  # at its deadline, not later
    assert gw.metric("sluiceway_gateway_hold_refused_total", reason="full") == 3
    assert gw.metric("sluiceway_gateway_hold_seconds_count", outcome="expired") == 4


def test_a_tenant_cannot_take_more_than_its_share_of_the_hold_queue(gateway_factory: Any, tmp_path: Any) -> None:
    import hashlib

    keys = tmp_path / "keys"
    keys.write_text("".join(f"{hashlib.sha256(k.encode()).hexdigest()} {k[2:]}\n" for k in ("k-a", "k-b", "k-c")))
    gw = gateway_factory({
        "endpoints": [f"127.0.0.1:{free_port()}"],
        "tenants": {"keysFile": str(keys), "allowAnonymous": False,
                    "tenants": [{"name": "a"}, {"name": "b"}, {"name": "c"}]},
        "hold": {"maxRequests": 6, "tenantShare": 0.5},
    })
    clients = Clients(gw)
    clients.send(3, 3000, key="k-a")
    wait_metric(gw, "sluiceway_gateway_held_requests", 3)
    r, took = one(gw, 3000, key="k-a")  # a's fourth: over its share of 3, while half the queue is free
    assert (r.status_code, r.json()["reason"]) == (429, "hold_tenant_full") and "retry-after" in r.headers, r.text
    assert took < 1.5, took  # at once: held, it would wait its 3 s deadline
    clients.send(3, 3000, key="k-b")  # b still finds its share
    wait_metric(gw, "sluiceway_gateway_held_requests", 6)
    r2, _ = one(gw, 3000, key="k-c")  # the whole bound is taken
    assert (r2.status_code, r2.json()["reason"]) == (503, "hold_full"), r2.text
    clients.join(20)
    assert Counter(s for _, _, s, _, _ in clients.results) == Counter({504: 6})
    assert gw.metric("sluiceway_gateway_hold_refused_total", reason="tenant_full") == 1


def _raw_request(port: int, out: list[bytes]) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"POST /v2/models/demo/infer HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                  b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY))
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except OSError:
            pass
        out.append(got)


def test_shutdown_while_holding_answers_each_held_request_once(gateway_factory: Any) -> None:
    gw = gateway_factory({"endpoints": [f"127.0.0.1:{free_port()}"]}, args=("--drain-seconds", "1"))
    answers: list[bytes] = []
    threads = [threading.Thread(target=_raw_request, args=(gw.port, answers)) for _ in range(5)]
    for t in threads:
        t.start()
    wait_metric(gw, "sluiceway_gateway_held_requests", 5)
    t0 = time.monotonic()
    gw.proc.send_signal(signal.SIGTERM)
    rc = gw.proc.wait(20)
    for t in threads:
        t.join(20)
    took = time.monotonic() - t0
    print("exit", rc, f"after {took:.2f}s;", "answers:", [a.split(b"\r\n", 1)[0] for a in answers])
    assert rc == 0 and len(answers) == 5
    for a in answers:
        assert a.count(b"HTTP/1.1 ") == 1, a  # exactly one answer on the connection, then it closed
        assert a.startswith(b"HTTP/1.1 503 ") and b'"reason": "gateway_draining"' in a, a
    assert took < 10, took


def test_shutdown_drains_held_requests_to_a_pod_that_comes_within_the_grace(
    pod_factory: Any, gateway_factory: Any
) -> None:
    """SIGTERM while requests are held and no pod is ready: the gateway takes no new request but still
    hands what it holds to a pod that becomes ready within its grace, then exits 0."""
    port = free_port()
    gw = gateway_factory({"endpoints": [f"127.0.0.1:{port}"]}, args=("--drain-seconds", "60"))
    clients = Clients(gw)
    clients.send(3, 60_000)
    wait_metric(gw, "sluiceway_gateway_held_requests", 3)
    gw.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    with pytest.raises(httpx.HTTPError):  # it stopped accepting
        httpx.post(gw.infer_url(), content=BODY, timeout=5)
    pod = pod_factory("--model", "synthetic:50", "--concurrency", "2", "--port", str(port), wait_ready=False)
    pod.port = port
    clients.join(90)
    assert gw.proc.wait(30) == 0
    assert Counter(s for _, _, s, _, _ in clients.results) == Counter({200: 3}), clients.results


@pytest.mark.parametrize("hold", [True, False], ids=["hold", "no-hold"])
def test_every_pod_full_requests_are_held_not_refused(pod_factory: Any, gateway_factory: Any, hold: bool) -> None:
    """One pod, 1 permit and a queue of 1, and 8 requests at once: the pod refuses what does not fit
    (429 ``queue_full``); the gateway holds those and hands them back as the pod's answers show room,
    so every request is answered 200. Without the hold queue (``maxRequests: 0``, the gateway of
    issue 19) the same load gets refusals: the test sees the difference."""
    pod = pod_factory("--model", "synthetic:400", "--concurrency", "1", "--max-queue", "1")  # 8 need 3.2 s
    gw = gateway_factory({"endpoints": [f"127.0.0.1:{pod.port}"], "hold": {"maxRequests": 1024 if hold else 0}})
    clients = Clients(gw)
    clients.send(8, 30_000)
    clients.join(60)
    codes = Counter((s, r) for _, _, s, r, _ in clients.results)
    print("hold" if hold else "no hold", "answers:", dict(codes), "pod queue_full refusals:",
          pod.metric("sluiceway_rejected_total", reason="queue_full"))
    if hold:
        assert codes == Counter({(200, ""): 8}), codes
        assert gw.metric("sluiceway_gateway_hold_seconds_count", outcome="handed_off") >= 1
    else:
        assert codes[(200, "")] < 8, codes
