"""The gateway as a process in front of real ``sluiceway-pod`` processes, over loopback HTTP.

Clients keep their connections alive (httpx clients, tritonclient, raw sockets), as real OIP clients do.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from gwtools import GatewayProcess
from podtools import PodProcess

pytestmark = pytest.mark.slow

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                               "data": [1.0, 2.0, 3.0, 4.0]}]}).encode()


def served(pod: PodProcess) -> float:
    return pod.metric("sluiceway_requests_total", code="200")


def endpoints(*pods: PodProcess) -> list[str]:
    return [f"127.0.0.1:{p.port}" for p in pods]


def test_oip_json_binary_metadata_and_health_pass_through(pod_factory: Any, gateway_factory: Any) -> None:
    import tritonclient.http as tc

    pods = [pod_factory("--model", "synthetic:0") for _ in range(2)]
    gw: GatewayProcess = gateway_factory({"endpoints": endpoints(*pods)})
    direct = httpx.Client(base_url=pods[0].url, timeout=10)
    via = httpx.Client(base_url=gw.url, timeout=10)
    for path in ("/v2", "/v2/models/demo", "/v2/models/demo/ready", "/v2/models/nope"):
        a, b = direct.get(path), via.get(path)
        # the model's "parameters" hold each pod's own measurements (service time): either pod may answer
        da, db = ({k: v for k, v in r.json().items() if k != "parameters"} for r in (a, b))
        assert (a.status_code, da) == (b.status_code, db), path
    assert via.get("/v2/health/live").status_code == 200
    assert via.get("/v2/health/ready").status_code == 200
    a, b = direct.post("/v2/models/demo/infer", content=BODY), via.post("/v2/models/demo/infer", content=BODY)
    assert (a.status_code, a.json()) == (b.status_code, b.json()) == (200, a.json())
    bad = via.post("/v2/models/demo/infer", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["reason"] == "invalid_input"  # the pod's own answer
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    client = tc.InferenceServerClient(url=f"127.0.0.1:{gw.port}")
    for binary in (False, True):
        inp = tc.InferInput("INPUT0", [3, 4], "FP32")
        inp.set_data_from_numpy(rows, binary_data=binary)
        out = client.infer("demo", [inp], outputs=[tc.InferRequestedOutput("OUTPUT0", binary_data=binary)])
        np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), rows)
    # a large answer (over the gateway's whole-read size) streams through unchanged
    big = np.arange(64 * 1024, dtype=np.float32).reshape(1, -1)
    inp = tc.InferInput("INPUT0", list(big.shape), "FP32")
    inp.set_data_from_numpy(big, binary_data=True)
    out = client.infer("demo", [inp], outputs=[tc.InferRequestedOutput("OUTPUT0", binary_data=True)])
    np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), big)


def test_keep_alive_clients_are_spread_over_the_pods(pod_factory: Any, gateway_factory: Any) -> None:
    """Four keep-alive clients through a connection-level balancer would pin to at most four pods
    each for good; through the gateway every request is placed, so all three pods share the load."""
    pods = [pod_factory("--model", "synthetic:20", "--concurrency", "1") for _ in range(3)]
    gw = gateway_factory({"endpoints": endpoints(*pods), "routing": "leastWait", "seed": 1})
    before = [served(p) for p in pods]
    codes: Counter[int] = Counter()

    def client() -> None:
        with httpx.Client(timeout=30) as c:  # one connection, kept alive
            for _ in range(25):
                codes[c.post(gw.infer_url(), content=BODY).status_code] += 1

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    shares = [served(p) - b for p, b in zip(pods, before, strict=True)]
    print("requests per pod:", shares, "codes:", dict(codes))
    assert codes == Counter({200: 100})
    assert all(s >= 15 for s in shares), shares


def test_queue_full_refusal_is_retried_on_another_pod(pod_factory: Any, gateway_factory: Any) -> None:
    small = pod_factory("--model", "synthetic:300", "--concurrency", "1", "--max-queue", "1")
    roomy = pod_factory("--model", "synthetic:300", "--concurrency", "16", "--max-queue", "64")
    gw = gateway_factory({"endpoints": endpoints(small, roomy), "routing": "random", "seed": 4})
    codes: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        with httpx.Client(timeout=30) as c:
            r = c.post(gw.infer_url(), content=BODY)
        with lock:
            codes.append(r.status_code)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    refused = small.metric("sluiceway_rejected_total", reason="queue_full")
    retried = gw.metric("sluiceway_gateway_retries_total", reason="queue_full")
    print("codes:", Counter(codes), "small pod refused:", refused, "gateway retried:", retried)
    assert codes == [200] * 12
    assert refused >= 1 and retried == refused


def test_pod_sigkilled_mid_load(pod_factory: Any, gateway_factory: Any) -> None:
    """Every request gets exactly one answer, none hangs: the ones the dead pod held get 502
    ``upstream_lost``, later ones go to the survivor (its connect failures retried)."""
    victim = pod_factory("--model", "synthetic:50", "--concurrency", "4")
    survivor = pod_factory("--model", "synthetic:50", "--concurrency", "4")
    gw = gateway_factory({"endpoints": endpoints(victim, survivor), "routing": "random", "seed": 1})
    results: list[tuple[float, int, str]] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + 4.0
    kill_at = time.monotonic() + 1.5

    def client() -> None:
        with httpx.Client(timeout=20) as c:
            while time.monotonic() < stop_at:
                t0 = time.monotonic()
                r = c.post(gw.infer_url(), content=BODY)
                reason = r.json().get("reason", "") if r.status_code != 200 else ""
                with lock:
                    results.append((t0, r.status_code, reason))

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(max(0.0, kill_at - time.monotonic()))
    victim.proc.kill()
    killed = time.monotonic()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a client hung"
    by = Counter((code, reason) for _, code, reason in results)
    late = Counter(code for t0, code, _ in results if t0 > killed + 0.5)
    print("answers:", dict(by), "after the kill settled:", dict(late))
    assert set(by) <= {(200, ""), (502, "upstream_lost")}, by
    assert by[(502, "upstream_lost")] <= 8  # at most what was in flight on the victim
    assert late and set(late) == {200}


def _keys(tmp: Path) -> str:
    keys = tmp / "keys"
    keys.write_text(f"{hashlib.sha256(b'k-limited').hexdigest()} limited\n"
                    f"{hashlib.sha256(b'k-free').hexdigest()} free\n")
    return str(keys)


def _tenant_config(tmp: Path, **extra: Any) -> dict[str, Any]:
    """The gateway's tenants: ``limited`` at 10/s, burst 5; ``free`` without limits."""
    return {"tenants": {"keysFile": _keys(tmp), "allowAnonymous": False,
                        "tenants": [{"name": "limited", "rate": 10, "burst": 5}, {"name": "free"}]}, **extra}


def _tenant_pod(pod_factory: Any, tmp: Path) -> PodProcess:
    """A no-op pod that knows the same keys (the one Secret both would mount) and sets no limits: the
    quota is the gateway's to hold."""
    return pod_factory(config={"model": {"spec": "synthetic:0"}, "tenants": {
        "keysFile": _keys(tmp), "allowAnonymous": False, "tenants": [{"name": "limited"}, {"name": "free"}]}})


def test_tenant_rate_holds_service_wide_across_connections(
    pod_factory: Any, gateway_factory: Any, tmp_path: Path
) -> None:
    pods = [_tenant_pod(pod_factory, tmp_path) for _ in range(2)]
    gw = gateway_factory({"endpoints": endpoints(*pods), **_tenant_config(tmp_path)})
    got: Counter[tuple[str, int]] = Counter()
    retry_after: set[str] = set()
    times: list[tuple[float, float, str, int]] = []  # (sent, answered, key, status)
    lock = threading.Lock()
    t_start = time.monotonic()
    end = t_start + 2.0

    def client(key: str, fresh: bool) -> None:
        c = httpx.Client(timeout=10)
        while time.monotonic() < end:
            if fresh:  # a new connection per request: no pinning to hide behind
                c.close()
                c = httpx.Client(timeout=10)
            sent = time.monotonic()
            r = c.post(gw.infer_url(), content=BODY, headers={"Authorization": f"Bearer {key}"})
            with lock:
                times.append((sent, time.monotonic(), key, r.status_code))
                got[(key, r.status_code)] += 1
                if r.status_code == 429:
                    assert r.json()["reason"] == "rate_limited"
                    retry_after.add(r.headers["retry-after"])
            if key == "k-free":
                time.sleep(0.05)
        c.close()

    threads = [threading.Thread(target=client, args=("k-limited", i % 2 == 0)) for i in range(6)]
    threads.append(threading.Thread(target=client, args=("k-free", True)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    limited = [x for x in times if x[2] == "k-limited"]
    first_sent = min(x[0] for x in limited)
    last_answer = max(x[1] for x in limited)
    span = last_answer - first_sent  # the gateway's bucket saw the tenant's requests within this span
    print("answers:", dict(got), f"span {span:.2f}s", "retry-after:", retry_after)
    admitted = got[("k-limited", 200)]
    assert admitted <= 5 + 10 * span + 1, admitted  # burst + rate x time, one gateway for the service
    # and no more refused than the bucket must. The first refusal was decided (bucket empty) before its
    # answer came, the last one (bucket empty again) after it was sent; in between the bucket refilled
    # at 10/s and, under six clients' pressure, never sat full (a full bucket drops its refill: before
    # the first refusal it may have, while the clients were still opening connections, so the burst
    # is left out). CI once failed a bound that counted the burst from the first answer: 22 admitted.
    first_refused_answer = min(x[1] for x in limited if x[3] == 429)
    last_refused_sent = max(x[0] for x in limited if x[3] == 429)
    assert admitted >= 10 * (last_refused_sent - first_refused_answer) - 1, admitted
    assert got[("k-limited", 429)] > 0 and retry_after <= {"1"}
    assert got[("k-free", 200)] > 0 and got[("k-free", 429)] == 0  # under its (unlimited) quota: never refused


def _raw(gw: GatewayProcess, data: bytes, wait: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", gw.port), timeout=wait) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
        return out


def test_hostile_clients(pod_factory: Any, gateway_factory: Any, tmp_path: Path) -> None:
    pod = _tenant_pod(pod_factory, tmp_path)
    gw = gateway_factory({"endpoints": endpoints(pod), "limits": {
        "headerTimeoutSeconds": 1, "bodyTimeoutSeconds": 1, "maxConnections": 16}, **_tenant_config(tmp_path)})
    auth = b"authorization: Bearer k-free\r\n"
    # slowloris: headers never finish -> closed at the header deadline (no answer owed: no request)
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(b"POST /v2/models/demo/infer HTTP/1.1\r\nhost: x\r\n")
        assert s.recv(100) == b""
    assert 0.8 < time.monotonic() - t0 < 5
    # an idle keep-alive connection is closed at the header deadline too
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n")
        first = b""
        while not first.endswith(b'{"live": true}'):
            first += s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        assert s.recv(100) == b"" and time.monotonic() - t0 < 5
    # body deadline: 408
    out = _raw(gw, b"POST /v2/models/demo/infer HTTP/1.1\r\nhost: x\r\n" + auth + b"content-length: 100\r\n\r\n{")
    assert out.startswith(b"HTTP/1.1 408") and b"body_timeout" in out
    # 17 MiB declared: 413 at once, nothing read
    out = _raw(gw, b"POST /v2/models/demo/infer HTTP/1.1\r\nhost: x\r\n" + auth
               + b"content-length: %d\r\n\r\n" % (17 * 1024 * 1024))
    assert out.startswith(b"HTTP/1.1 413")
    # a chunked body growing past the limit: 413
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(b"POST /v2/models/demo/infer HTTP/1.1\r\nhost: x\r\n" + auth + b"transfer-encoding: chunked\r\n\r\n")
        chunk = b"x" * (1024 * 1024)
        try:
            for _ in range(17):
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass
        assert s.recv(100).startswith(b"HTTP/1.1 413")
    # header flood: 431
    flood = b"".join(b"x-h%d: v\r\n" % i for i in range(500))
    assert _raw(gw, b"GET /v2 HTTP/1.1\r\nhost: x\r\n" + flood + b"\r\n").startswith(b"HTTP/1.1 431")
    assert _raw(gw, b"GET /v2 HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 100_000 + b"\r\n\r\n").startswith(
        b"HTTP/1.1 431")
    # malformed: 400
    assert _raw(gw, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400")
    # bad key: 401, and the pod never sees it
    before = pod.metric("sluiceway_requests_total")
    out = _raw(gw, b"POST /v2/models/demo/infer HTTP/1.1\r\nhost: x\r\nauthorization: Bearer nope\r\n"
               b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(BODY), BODY))
    assert out.startswith(b"HTTP/1.1 401") and b"unauthenticated" in out
    assert pod.metric("sluiceway_requests_total") == before
    # pipelining: answers in order
    infer = (b"POST /v2/models/demo/infer HTTP/1.1\r\nhost: x\r\n" + auth
             + b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY))
    out = _raw(gw, b"GET /v2/models/demo HTTP/1.1\r\nhost: x\r\n" + auth + b"\r\n" + infer
               + b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    i_meta, i_infer, i_live = out.find(b'"platform"'), out.find(b'"outputs":[{"name":"OUTPUT0"'), out.find(b'"live"')
    assert out.count(b"HTTP/1.1 200") == 3 and 0 < i_meta < i_infer < i_live, out[:400]
    # max connections: the 17th connection gets 503 and is closed
    held = [socket.create_connection(("127.0.0.1", gw.port), timeout=10) for _ in range(16)]
    try:
        time.sleep(0.2)
        out = _raw(gw, b"GET /v2 HTTP/1.1\r\nhost: x\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 503") and b"too_many_connections" in out
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    assert httpx.get(f"{gw.url}/v2/health/live", timeout=5).status_code == 200
    assert gw.metric("sluiceway_gateway_refused_total", reason="payload_too_large") == 2


def test_a_draining_pod_gets_no_new_request(pod_factory: Any, gateway_factory: Any) -> None:
    """SIGTERM one pod under load: it finishes what it holds, and whatever reaches it afterwards (a 503
    ``draining`` refusal, before any work) is sent to the other pod: every client answer is a 200."""
    draining = pod_factory("--model", "synthetic:100", "--concurrency", "2")
    other = pod_factory("--model", "synthetic:100", "--concurrency", "8")
    gw = gateway_factory({"endpoints": endpoints(draining, other), "routing": "random", "seed": 2})
    codes: Counter[int] = Counter()
    lock = threading.Lock()
    stop_at = time.monotonic() + 3.0

    def client() -> None:
        with httpx.Client(timeout=20) as c:
            while time.monotonic() < stop_at:
                r = c.post(gw.infer_url(), content=BODY)
                with lock:
                    codes[r.status_code] += 1

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    draining.proc.send_signal(15)
    for t in threads:
        t.join(30)
    retried = gw.metric("sluiceway_gateway_retries_total")
    print("codes:", dict(codes), "retries:", retried, "pod exit:", draining.proc.wait(30))
    assert set(codes) == {200}, codes


def test_gateway_sigterm_finishes_requests_in_flight(pod_factory: Any, gateway_factory: Any) -> None:
    pod = pod_factory("--model", "synthetic:3000", "--concurrency", "4")  # long enough for all four to overlap
    gw = gateway_factory({"endpoints": endpoints(pod)})
    results: list[int] = []

    def one() -> None:
        try:
            results.append(httpx.post(gw.infer_url(), content=BODY, timeout=20).status_code)
        except httpx.HTTPError as err:
            results.append(-1)
            print("client error:", err)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    end = time.monotonic() + 10
    while gw.metric("sluiceway_gateway_in_flight") < 4:  # all four sent to the pod
        assert time.monotonic() < end
        time.sleep(0.02)
    gw.proc.send_signal(15)
    for t in threads:
        t.join(30)
    assert gw.proc.wait(20) == 0
    assert results == [200] * 4


def test_head_requests_are_answered_without_a_body(pod_factory: Any, gateway_factory: Any) -> None:
    """The pod answers HEAD with a ``content-length`` and no body: the gateway must not wait for that
    body (it did, until the request's deadline), nor write one."""
    pod = pod_factory("--model", "synthetic:0")
    gw = gateway_factory({"endpoints": endpoints(pod), "limits": {"requestTimeoutSeconds": 30}})
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(b"HEAD /v2 HTTP/1.1\r\nhost: x\r\n\r\nHEAD /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n"
                  b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    direct = httpx.head(f"{pod.url}/v2", timeout=5)
    assert time.monotonic() - t0 < 5, "waited for a body that never comes"
    heads = out.split(b"HTTP/1.1 ")[1:]
    assert len(heads) == 3, out
    assert heads[0].startswith(b"%d" % direct.status_code) and heads[0].endswith(b"\r\n\r\n"), heads[0]
    assert heads[1].startswith(b"200") and heads[1].endswith(b"\r\n\r\n"), heads[1]  # no body after HEAD
    assert heads[2].startswith(b"200") and heads[2].endswith(b'{"live": true}')


def test_expect_100_continue_never_lands_inside_an_earlier_answer(pod_factory: Any, gateway_factory: Any) -> None:
    pod = pod_factory("--model", "synthetic:300")
    gw = gateway_factory({"endpoints": endpoints(pod)})
    infer = b"POST /v2/models/demo/infer HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY)
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(infer + b"POST /v2/models/demo/infer HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
                  b"content-length: %d\r\nconnection: close\r\n\r\n" % len(BODY))
        time.sleep(0.1)
        s.sendall(BODY)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert out.startswith(b"HTTP/1.1 200"), out[:200]  # the first answer first, whole
    assert out.count(b'"outputs"') == 2


def test_pipelined_request_completed_during_a_long_answer_is_answered(pod_factory: Any,
                                                                      gateway_factory: Any) -> None:
    """B's header deadline passes while A is in service, then B's headers complete before A's answer:
    B was parsed, so it is owed an answer (as at the pod); only headers still incomplete close."""
    pod = pod_factory("--model", "synthetic:1500")
    gw = gateway_factory({"endpoints": endpoints(pod), "limits": {"headerTimeoutSeconds": 1}})
    infer = b"POST /v2/models/demo/infer HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY)
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(infer + b"GET /v2/health/live HTTP/1.1\r\n")
        time.sleep(1.2)
        s.sendall(b"host: x\r\nconnection: close\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert out.startswith(b"HTTP/1.1 200") and out.endswith(b'{"live": true}'), out[-200:]
    # B never completes: A is answered, then the late connection is closed (no answer owed)
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(infer + b"GET /v2/health/live HTTP/1.1\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert out.startswith(b"HTTP/1.1 200") and out.count(b"HTTP/1.1") == 1 and b'"outputs"' in out


def test_a_client_that_stops_reading_is_disconnected(pod_factory: Any, gateway_factory: Any) -> None:
    pod = pod_factory("--model", "synthetic:0")
    gw = gateway_factory({"endpoints": endpoints(pod), "limits": {"bodyTimeoutSeconds": 1}})
    n = 1_500_000
    big = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, n], "datatype": "FP32",
                                  "data": [1.0] * n}]}).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect(("127.0.0.1", gw.port))
    try:
        s.sendall(b"POST /v2/models/demo/infer HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(big), big))
        end = time.monotonic() + 30
        while gw.metric("sluiceway_gateway_refused_total", reason="slow_reader") < 1:
            assert time.monotonic() < end, "the slow reader was never disconnected"
            time.sleep(0.2)
    finally:
        s.close()
    assert httpx.post(gw.infer_url(), content=BODY, timeout=10).status_code == 200
