"""The pod's lease client against a hostile coordinator, a real coordinator killed mid-lease, and an
event loop whose default executor is saturated (issue 18 item 4 and the CI flake).

Each hostile answer used to raise out of ``renew_once`` (``BadStatusLine``, ``LineTooLong``,
``OverflowError`` from a 400-digit number, ``RecursionError`` from deep JSON): the renewal task
died silently and the pod kept its last share for ever; at start-up the same error failed the pod.
Now every failure is a failed renewal, logged once per kind, and the task goes on checking expiry.

Real sockets on loopback, a real clock; a renewal every half second (lease 1.5 s). Bounded: ~4 s a case.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sluiceway_core.config import QuotaConfig, TenantsConfig
from sluiceway_core.quota import TenantQuota
from sluiceway_pod.clock import MonotonicClock
from sluiceway_pod.quota_client import QuotaClient
from sluiceway_pod.tenancy import TenantRegistry
from sluiceway_scaler.quota_server import QuotaCoordinator, serve_quota

from .leases import KEY, quota_section, write_key

LEASE = 1.5
TEAM = {"team": TenantQuota(30.0, 9, 3)}


def registry() -> TenantRegistry:
    cfg = TenantsConfig.model_validate(
        {"allowAnonymous": True, "tenants": [{"name": "team", "rate": 30, "burst": 9, "maxConcurrent": 3}]}
    )
    return TenantRegistry(cfg, ["critical", "standard", "batch"], MonotonicClock(), default_priority="standard")


def make_client(url: str, tmp_path: Path, pod: str = "pod-a") -> tuple[QuotaClient, TenantRegistry]:
    reg = registry()
    cfg = QuotaConfig.model_validate(quota_section(url, "ns/demo", TEAM, tmp_path, lease=LEASE, assumed=3))
    return QuotaClient(cfg, reg, lambda: {}, MonotonicClock(), pod=pod), reg


def _hostile(behaviour: Callable[[socket.socket], None]) -> Iterator[str]:
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=_answer, args=(conn, behaviour), daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(5)
    srv.close()


def _answer(conn: socket.socket, behaviour: Callable[[socket.socket], None]) -> None:
    try:
        conn.settimeout(2)
        got = b""
        while b"\r\n\r\n" not in got:
            got += conn.recv(65536) or b"\r\n\r\n"
        head, _, body = got.partition(b"\r\n\r\n")
        sizes = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")]
        length = sizes[0] if sizes else 0
        while len(body) < length:
            body += conn.recv(65536) or b" " * length  # read the whole request: no reset on close
        behaviour(conn)
    except OSError:
        pass
    finally:
        conn.close()


def _ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body


def _trickle(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
    for _ in range(40):
        conn.sendall(b" ")
        time.sleep(0.3)


HOSTILE: dict[str, tuple[Callable[[socket.socket], None], str]] = {
    "bad status line (killed mid-write)": (lambda c: c.sendall(b"HTTP/1.1 2"), "BadStatusLine"),
    "no status line": (lambda c: c.sendall(b"hello\r\n\r\n"), "BadStatusLine"),
    "header line too long": (
        lambda c: c.sendall(b"HTTP/1.1 200 OK\r\nx: " + b"a" * 70000 + b"\r\n\r\n"),
        "LineTooLong",
    ),
    "400-digit number": (
        lambda c: c.sendall(
            _ok(b'{"service":"ns/demo","pod":"pod-a","leaseSeconds":' + b"9" * 400 + b',"replicas":1,"shares":{}}')
        ),
        "QuotaError",
    ),
    "deeply nested JSON": (lambda c: c.sendall(_ok(b"[" * 200_000)), "RecursionError"),
    "trickled answer": (_trickle, "TimeoutError"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_the_renewal_task_survives_a_hostile_coordinator(
    case: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    behaviour, kind = HOSTILE[case]
    hostile = _hostile(behaviour)
    url = next(hostile)
    client, reg = make_client(url, tmp_path)

    async def scenario() -> None:
        await client.start()  # the first renewal fails: never an exception (no "model failed to load")
        assert client._task is not None
        await asyncio.sleep(2.0)
        assert not client._task.done(), client._task  # still renewing
        await client.stop()

    try:
        with caplog.at_level(logging.WARNING, logger="sluiceway.quota"):
            asyncio.run(scenario())
    finally:
        next(hostile, None)
    assert client.failures >= 3, client.failures
    assert client.fallback  # never leased: the fallback share holds
    share = reg.share("team")
    assert share is not None and share.rate == pytest.approx(10.0)  # quota / assumedReplicas (3)
    lines = [r.getMessage() for r in caplog.records if "cannot renew" in r.getMessage()]
    assert sum(f"({kind})" in line for line in lines) == 1, lines  # logged once per kind of failure
    assert len(lines) == len({line.split("(")[1].split(")")[0] for line in lines}), lines


@pytest.fixture
def coordinator_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    key = write_key(tmp_path / "quota-key")
    cmd = [sys.executable, "-m", "sluiceway_scaler.quota_server", "--lease-seconds", str(LEASE), "--key-file", str(key)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"the coordinator did not start: {line}")
    yield proc, "http://" + line.rsplit(" ", 1)[1].strip()
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


@pytest.mark.timeout(60)
def test_a_real_coordinator_killed_mid_lease_leaves_the_pod_on_the_fallback_share(
    tmp_path: Path, coordinator_process: tuple[subprocess.Popen[bytes], str], caplog: pytest.LogCaptureFixture
) -> None:
    proc, url = coordinator_process
    client, reg = make_client(url, tmp_path)

    async def scenario() -> None:
        await client.start()
        deadline = time.monotonic() + 10
        while client.fallback and time.monotonic() < deadline:  # noqa: ASYNC110 (a fresh coordinator)
            await asyncio.sleep(0.1)
        assert not client.fallback, "no lease from the real coordinator"
        proc.kill()  # SIGKILL, whatever it was writing
        await asyncio.sleep(LEASE + 1.0)
        assert client._task is not None and not client._task.done()
        assert client.fallback  # the lease ran out: quota / replicas
        await client.stop()

    with caplog.at_level(logging.WARNING, logger="sluiceway.quota"):
        asyncio.run(scenario())
    assert client.failures >= 2
    assert any("falling back to quota / 1 replicas" in r.getMessage() for r in caplog.records)
    share = reg.share("team")
    assert share is not None and share.rate == pytest.approx(30.0)


@pytest.mark.timeout(60)
def test_a_renewal_does_not_queue_behind_request_work_on_the_default_executor(tmp_path: Path) -> None:
    """The CI flake's first half: the pod decodes and encodes requests on the loop's default
    executor, and the renewal used to POST from it too (``asyncio.to_thread``). Under load the POST
    queued behind request work past its deadline: a joining pod missed its lease and, on the
    fallback share, reported ready. Here the default executor is busy for 3 s; the renewal must
    still come back within its deadline (a third of a lease)."""
    coord = QuotaCoordinator(LEASE, key=KEY)
    coord.allocator.started = float("-inf")  # not about a fresh coordinator
    server, port, thread = serve_quota(coord, "127.0.0.1", 0)
    client, _reg = make_client(f"http://127.0.0.1:{port}", tmp_path)

    async def scenario() -> bool:
        loop = asyncio.get_running_loop()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
        loop.set_default_executor(pool)
        busy = [loop.run_in_executor(None, time.sleep, 3.0) for _ in range(4)]  # request work, queued
        ok = await client.renew_once()
        await asyncio.gather(*busy)
        await client.stop()
        return ok

    try:
        assert asyncio.run(scenario()), client.failures
        assert not client.fallback
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
