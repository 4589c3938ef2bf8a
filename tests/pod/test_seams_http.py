"""Issue 18, items 6 and 7 (and the load headers of issue 19), over real HTTP against real pods.

Item 6: a connection whose request ran past the header deadline never outlives the header deadline
once it is idle (or once a pipelined request's headers stall). Item 7: bodies in flight are bounded by
``server.maxInflightBodyBytes`` and every request gets exactly one answer.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

pytestmark = pytest.mark.slow

_SMALL = b'{"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"FP32","data":[1.5,1.5]}]}'


def _post(body: bytes, extra: str = "") -> bytes:
    return (
        "POST /v2/models/demo/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"{extra}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _read_answer(s: socket.socket) -> tuple[int, dict[str, str], bytes, bytes]:
    """One answer (status, headers, body) and whatever bytes followed it."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise EOFError(buf)
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    n = int(headers["content-length"])
    while len(rest) < n:
        chunk = s.recv(65536)
        if not chunk:
            raise EOFError(rest)
        rest += chunk
    return int(lines[0].split()[1]), headers, rest[:n], rest[n:]


def _closed_within(s: socket.socket, seconds: float, trickle: bytes | None = None) -> float | None:
    """Seconds until the server closes ``s`` (None if still open after ``seconds``); sends
    ``trickle`` every 0.5 s meanwhile, when given."""
    t0 = time.monotonic()
    s.settimeout(0.5)
    while time.monotonic() - t0 < seconds:
        try:
            if trickle is not None:
                s.sendall(trickle)
            if s.recv(1) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


# --- item 6 -----------------------------------------------------------------------------------------
def test_an_idle_connection_is_closed_at_the_header_deadline_after_a_request_longer_than_it(
    pod_factory: Any,
) -> None:
    """The request runs 3 s against a 1.5 s header deadline; the connection then goes idle and is
    closed at the header deadline (not after uvicorn's 30 s keep-alive)."""
    pod = pod_factory("--model", "synthetic:3000", config={"server": {"headerTimeoutSeconds": 1.5}})
    s = socket.create_connection(("127.0.0.1", pod.port))
    try:
        s.settimeout(30)
        s.sendall(_post(_SMALL))
        status, _, _, _ = _read_answer(s)
        assert status == 200
        closed = _closed_within(s, 12.0)
    finally:
        s.close()
    print(f"idle connection closed {closed}s after a 3 s request (header deadline 1.5 s)")
    assert closed is not None and closed < 1.5 + 2.0, closed


def test_a_pipelined_request_whose_headers_stall_during_a_long_request_is_cut(pod_factory: Any) -> None:
    """The next request's first bytes arrive while the 3 s request is in service and its headers never
    complete (a header line every 0.5 s): its header deadline passed during the service, so the
    connection is closed when the service ends (before the fix: no timer at all, open for ever)."""
    pod = pod_factory("--model", "synthetic:3000", config={"server": {"headerTimeoutSeconds": 1.5}})
    s = socket.create_connection(("127.0.0.1", pod.port))
    try:
        s.settimeout(30)
        s.sendall(_post(_SMALL) + b"POST /v2/models/demo/infer HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        status, _, _, _ = _read_answer(s)
        answered = time.monotonic() - t0
        assert status == 200
        closed = _closed_within(s, 12.0, trickle=b"X-a: b\r\n")
    finally:
        s.close()
    print(f"answered after {answered:.2f}s; the stalled pipelined request's connection closed {closed}s later")
    assert closed is not None and closed < 2.0, closed
