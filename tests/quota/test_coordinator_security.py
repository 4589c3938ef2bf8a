"""The quota coordinator over real HTTP on loopback, attacked (issue 18 items 2 and 3): an
unsigned or forged charter is 403 and its signature never echoed, the service and the quotas come
only from the signed charter, hostile numbers and nesting are 400, and the server's threads are
bounded (one connection too many: 503, and service resumes)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from sluiceway_core.quota import LEASE_PATH, LeaseRequest, TenantDemand, TenantQuota
from sluiceway_core.quota_charter import QuotaCharter
from sluiceway_scaler.quota_server import QuotaCoordinator, serve_quota

from .leases import KEY, signed

Q = {"t": TenantQuota(30.0, 30, 4)}


def _serve(key: bytes | None, max_threads: int = 32, deadline: float = 10.0) -> Iterator[str]:
    coord = QuotaCoordinator(3.0, key=key)
    coord.allocator.started = float("-inf")  # not about a fresh coordinator's first lease period
    server, port, thread = serve_quota(coord, "127.0.0.1", 0, max_threads=max_threads, request_deadline=deadline)
    yield f"http://127.0.0.1:{port}"
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture
def url() -> Iterator[str]:
    yield from _serve(KEY)


def post(url: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        url + LEASE_PATH, data=data, method="POST", headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def lease(pod: str, demand: float, charter: tuple[dict[str, Any], str]) -> dict[str, Any]:
    return LeaseRequest(pod, charter[0], charter[1], {"t": TenantDemand(demand)}).to_json()


def test_a_forged_or_unsigned_lease_is_refused_and_cannot_starve_the_real_pods(url: str) -> None:
    good = signed(Q)
    code, grant = post(url, lease("real-1", 20.0, good))
    assert code == 200 and grant["shares"]["t"]["rate"] == pytest.approx(30.0)
    # the attack: claim a huge quota and demand for the service
    forged_quotas = {"t": TenantQuota(1e9, None, None)}
    forged = QuotaCharter("ns/demo", forged_quotas, 100).to_json()
    for doc, sig in ((forged, good[1]), (good[0], "0" * 64), (good[0], ""), (good[0], good[1].upper()[:63] + "x")):
        code, err = post(url, lease("evil", 1e9, (doc, sig)))
        assert code == 403, (code, err)
        assert good[1] not in json.dumps(err) and (not sig or sig not in json.dumps(err))
    # another service's valid charter cannot speak for this one: the service comes from the charter
    other = signed(Q, service="ns/other")
    code, grant = post(url, lease("evil", 1e9, other))
    assert code == 200 and grant["service"] == "ns/other"
    # a free-form quota in the request is ignored (not part of the schema the coordinator trusts)
    doc = {**lease("real-1", 20.0, good), "quotas": {"t": {"rate": 1e9}}, "service": "ns/other"}
    code, grant = post(url, doc)
    assert code == 200 and grant["service"] == "ns/demo" and grant["shares"]["t"]["rate"] == pytest.approx(30.0)
    assert grant["replicas"] == 1  # the forged attempts left no pods behind


def test_without_a_key_every_lease_is_refused() -> None:
    gen = _serve(None)
    url = next(gen)
    try:
        code, err = post(url, lease("p", 1.0, signed(Q)))
        assert code == 403 and "no quota key" in err["error"]
    finally:
        next(gen, None)


@pytest.mark.parametrize(
    "body",
    [
        b'{"pod":"p","charter":{},"signature":"' + b"0" * 64 + b'","demand":{"t":{"queued":' + b"9" * 400 + b"}}}",
        b'{"pod":"p","signature":"x","charter":{"service":"ns/demo","maxPods":1,"quotas":{"t":{"maxConcurrent":'
        + b"9" * 400
        + b"}}}}",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 40_000 + b"1" + b"}" * 40_000,
        b'{"pod":"p","charter":{"service":"ns/demo","maxPods":1,"quotas":{"t":{"rate":1e400}}},"signature":"x"}',
        b"\xff\xfe",
    ],
    ids=["400-digit queued", "400-digit maxConcurrent", "deep list", "deep object", "1e400", "not utf-8"],
)
def test_hostile_numbers_and_nesting_are_400(url: str, body: bytes) -> None:
    t0 = time.monotonic()
    code, err = post(url, body)
    assert code == 400 and err["error"], (code, err)
    assert time.monotonic() - t0 < 5


def test_a_charter_beyond_the_bounds_is_400_even_when_signed(url: str) -> None:
    charter = {"service": "ns/demo", "maxPods": 1, "quotas": {"t": {"maxConcurrent": 10**12}}}
    code, err = post(url, {"pod": "p", "charter": charter, "signature": "0" * 64})
    assert code == 400 and "maxConcurrent" in err["error"]


def test_bad_content_length_is_refused(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    for length in (b"-1", b"1e3", b"99999999999999999999", b"\xd9\xa3"):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"POST " + LEASE_PATH.encode() + b" HTTP/1.0\r\ncontent-length: " + length + b"\r\n\r\n")
            status = s.recv(100).split(b" ")[1]
            assert status in (b"411", b"413", b"400"), (length, status)


def test_the_server_threads_are_bounded_and_a_connection_beyond_is_503() -> None:
    gen = _serve(KEY, max_threads=4)
    url = next(gen)
    host, port = url.removeprefix("http://").split(":")
    idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(4)]  # each holds a thread
    try:
        time.sleep(0.3)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.0 503"), "a fifth connection got a thread"
    finally:
        for s in idle:
            s.close()
    time.sleep(0.3)
    code, _grant = post(url, lease("p", 1.0, signed(Q)))
    assert code == 200  # the threads came back
    next(gen, None)


def test_clients_trickling_bytes_cannot_hold_the_threads_past_the_deadline() -> None:
    """Four clients send a byte every 0.3 s (each read is within the handler's timeout): the reaper
    cuts them at the connection deadline (1 s here), and a real renewal gets through."""
    gen = _serve(KEY, max_threads=4, deadline=1.0)
    url = next(gen)
    host, port = url.removeprefix("http://").split(":")
    slow = [socket.create_connection((host, int(port)), timeout=5) for _ in range(4)]
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 2.5:
            for s in slow:
                with contextlib.suppress(OSError):
                    s.sendall(b"P")
            time.sleep(0.3)
        code, _grant = post(url, lease("p", 1.0, signed(Q)))
        assert code == 200, code
    finally:
        for s in slow:
            s.close()
        next(gen, None)
