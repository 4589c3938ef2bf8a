"""A pod SIGKILLed mid-load behind the gateway (issue 19): the requests it had only queued are sent to
another pod, the one it was running gets 502 ``upstream_lost``; the pods' start signal (``103``)
never reaches the gateway's client.

Real ``sluiceway-gateway`` and ``sluiceway-pod`` processes over loopback. The gateway and the pods
mount one edge token file; the gateway admits the clients (their API keys), so every request it
forwards carries the token and asks for the start signal.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import socket
import statistics
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httptools
import httpx
import pytest
from gwtools import GatewayProcess
from podtools import PodProcess

pytestmark = pytest.mark.slow

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                               "data": [1.0, 2.0, 3.0, 4.0]}]}).encode()
KEY = "k-client"
RETRIES = "sluiceway_gateway_retries_total"


def _setup(tmp: Path) -> tuple[str, str, str]:
    """(token, token file, keys file): one edge token, one client key (tenant ``free``), written once
    per test directory (the gateway and the pods mount the same files)."""
    token_file, keys = tmp / "edge-token", tmp / "keys"
    if not token_file.exists():
        token_file.write_text(secrets.token_hex(32) + "\n")
        keys.write_text(f"{hashlib.sha256(KEY.encode()).hexdigest()} free\n")
    return token_file.read_text().strip(), str(token_file), str(keys)


def _pod(pod_factory: Any, tmp: Path, model: str, permits: int) -> PodProcess:
    _, token_file, keys = _setup(tmp)
    return pod_factory(config={
        "model": {"spec": model},
        "concurrency": {"permits": permits, "adaptive": False},
        "tenants": {"keysFile": keys, "allowAnonymous": False, "tenants": [{"name": "free"}]},
        "edge": {"tokenFile": token_file},
    })


def _gateway(gateway_factory: Any, tmp: Path, pods: list[PodProcess], **extra: Any) -> GatewayProcess:
    _, token_file, keys = _setup(tmp)
    return gateway_factory({
        "endpoints": [f"127.0.0.1:{p.port}" for p in pods],
        "tenants": {"keysFile": keys, "allowAnonymous": False, "tenants": [{"name": "free"}]},
        "edge": {"tokenFile": token_file},
        **extra,
    })


def _raw_exchange(port: int, headers: dict[str, str]) -> tuple[list[int], bytes]:
    """One infer POST on a fresh connection, read off the socket: the status of every message that
    came before the connection's final answer completed, and the raw bytes."""
    statuses: list[int] = []
    done = threading.Event()

    class Collector:
        def on_headers_complete(self) -> None:
            statuses.append(parser.get_status_code())

        def on_message_complete(self) -> None:
            if statuses and statuses[-1] >= 200:
                done.set()

    parser = httptools.HttpResponseParser(Collector())
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    raw = (f"POST /v2/models/demo/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{head}"
           f"content-length: {len(BODY)}\r\n\r\n").encode() + BODY
    seen = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(raw)
        while not done.is_set():
            data = s.recv(65536)
            if not data:
                break
            seen += data
            parser.feed_data(data)
    assert done.is_set(), f"no final answer: {bytes(seen)!r}"
    return statuses, bytes(seen)


def test_a_pod_sigkilled_with_a_queue_its_queued_requests_go_to_the_other_pod(
    pod_factory: Any, gateway_factory: Any, tmp_path: Path
) -> None:
    """The victim: one permit, 500 ms a request; the survivor: fast. Requests go out until the
    victim has at least three queued behind the one it runs; then it is SIGKILLed. The one it was
    running gets 502 ``upstream_lost``; every queued one is answered 200 by the survivor."""
    victim = _pod(pod_factory, tmp_path, "synthetic:500", 1)
    survivor = _pod(pod_factory, tmp_path, "synthetic:20", 8)
    gw = _gateway(gateway_factory, tmp_path, [victim, survivor], routing="random", seed=3)
    results: list[tuple[int, str]] = []
    lock = threading.Lock()

    def client() -> None:
        r = httpx.post(gw.infer_url(), content=BODY, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        reason = r.json().get("reason", "") if r.status_code != 200 else ""
        with lock:
            results.append((r.status_code, reason))

    threads: list[threading.Thread] = []
    depth = 0.0
    end = time.monotonic() + 15
    while time.monotonic() < end and len(threads) < 40:
        t = threading.Thread(target=client)
        t.start()
        threads.append(t)
        time.sleep(0.02)
        depth = victim.metric("sluiceway_queue_depth")
        if depth >= 3 and victim.metric("sluiceway_concurrency_in_use") >= 1:
            break
    assert depth >= 3, f"the victim never had 3 queued ({len(threads)} requests sent)"
    victim.proc.kill()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a client hung"
    by = Counter(results)
    lost_unstarted = gw.metric(RETRIES, reason="pod_lost_unstarted")
    print(f"sent {len(threads)}; victim queue depth at the kill >= {depth:g}; answers: {dict(by)}; "
          f"retries pod_lost_unstarted: {lost_unstarted:g}")
    assert len(results) == len(threads)  # exactly one answer each
    assert set(by) <= {(200, ""), (502, "upstream_lost")}, by
    assert by[(502, "upstream_lost")] <= 1  # only what the one permit was running
    # the queued ones (at least depth - 1 still queued if one more started before the kill) were
    # resent and answered by the survivor
    assert lost_unstarted >= depth - 1
    assert by[(200, "")] == len(threads) - by[(502, "upstream_lost")]


def test_the_start_signal_never_reaches_the_gateways_client(
    pod_factory: Any, gateway_factory: Any, tmp_path: Path
) -> None:
    """The pod writes a 103 for the gateway's request (shown directly, with the token); the client
    of the gateway reads one answer, the final one. Then the signal's cost at the pod, once: the
    no-op model, the same edge request with and without the ask (printed, not asserted)."""
    token, _, _ = _setup(tmp_path)
    pod = _pod(pod_factory, tmp_path, "synthetic:0", 2)
    gw = _gateway(gateway_factory, tmp_path, [pod])
    edge = {"x-sluiceway-edge-token": token, "x-sluiceway-tenant": "free", "x-sluiceway-start-signal": "1"}
    direct, _ = _raw_exchange(pod.port, edge)
    print("the pod, asked with the edge token:", direct)
    assert direct == [103, 200]
    for ask in (False, True):  # a client's own ask is removed at the gateway: no difference
        headers = {"authorization": f"Bearer {KEY}", **({"x-sluiceway-start-signal": "1"} if ask else {})}
        statuses, raw = _raw_exchange(gw.port, headers)
        print("the gateway's client (own ask:", ask, "):", statuses)
        assert statuses == [200]
        assert raw.count(b"HTTP/1.1 ") == 1 and b"x-sluiceway-started" not in raw.lower()
    with httpx.Client(timeout=10) as c:
        codes = Counter(c.post(gw.infer_url(), content=BODY, headers={"Authorization": f"Bearer {KEY}"}).status_code
                        for _ in range(50))
    assert codes == Counter({200: 50})

    # the cost of the signal at the pod: one keep-alive connection, alternating with and without the ask
    def timed(sock: socket.socket, headers: dict[str, str]) -> float:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        raw = (f"POST /v2/models/demo/infer HTTP/1.1\r\nhost: x\r\n{head}"
               f"content-length: {len(BODY)}\r\n\r\n").encode() + BODY
        done = [False]

        class P:
            def on_message_complete(self) -> None:
                if parser.get_status_code() >= 200:
                    done[0] = True

        parser = httptools.HttpResponseParser(P())
        t0 = time.perf_counter()
        sock.sendall(raw)
        while not done[0]:
            data = sock.recv(65536)
            assert data
            parser.feed_data(data)
        return (time.perf_counter() - t0) * 1e6

    with_ask: list[float] = []
    without: list[float] = []
    no_ask = {k: v for k, v in edge.items() if k != "x-sluiceway-start-signal"}
    with socket.create_connection(("127.0.0.1", pod.port), timeout=10) as s:
        for i in range(600):
            (with_ask if i % 2 else without).append(timed(s, edge if i % 2 else no_ask))
    print(f"pod round trip, no-op model, 300 each: median {statistics.median(without):.0f} us without the ask, "
          f"{statistics.median(with_ask):.0f} us with it (p90 {statistics.quantiles(without, n=10)[-1]:.0f} / "
          f"{statistics.quantiles(with_ask, n=10)[-1]:.0f} us)")
