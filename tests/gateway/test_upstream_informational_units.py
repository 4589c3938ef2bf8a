"""The gateway's pod client and informational answers (issue 19), on a fake transport: 1xx skipped,
the start signal recorded, a lost connection told apart by it. The real-process tests are in
test_start_signal_gateway_http.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sluiceway_gateway.upstream import Lost, UpstreamConn

FINAL = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
STARTED = b"HTTP/1.1 103 Early Hints\r\nx-sluiceway-started: 1\r\n\r\n"


class _Transport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def _conn(loop: asyncio.AbstractEventLoop) -> UpstreamConn:
    conn = UpstreamConn("pod", loop)
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    return conn


def test_informational_answers_are_skipped_and_the_start_signal_recorded() -> None:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        conn = _conn(loop)
        head = conn.send(b"POST / HTTP/1.1\r\n\r\n", start_signal=True)
        assert conn.unstarted
        conn.data_received(b"HTTP/1.1 100 Continue\r\n\r\n")  # any 1xx is skipped; this one is no signal
        assert not head.done() and conn.unstarted
        conn.data_received(STARTED[:20])
        conn.data_received(STARTED[20:] + FINAL)  # the signal and the answer in one read
        resp = await head
        assert resp.status == 200 and not any(k == b"x-sluiceway-started" for k, _ in resp.headers)
        assert conn.started and not conn.unstarted
        assert resp.complete_body() == b"ok" and conn.reusable
        # the next request on the same connection starts afresh
        head2 = conn.send(b"POST / HTTP/1.1\r\n\r\n", start_signal=True)
        assert conn.unstarted
        conn.data_received(FINAL)
        assert (await head2).status == 200

    asyncio.run(main())


@pytest.mark.parametrize(("signal", "asked", "unstarted"), [(False, True, True), (True, True, False),
                                                            (False, False, False)])
def test_a_lost_connection_says_whether_the_pod_had_started(signal: bool, asked: bool, unstarted: bool) -> None:
    async def main() -> None:
        conn = _conn(asyncio.get_running_loop())
        head = conn.send(b"POST / HTTP/1.1\r\n\r\n", start_signal=asked)
        if signal:
            conn.data_received(STARTED)
        conn.connection_lost(None)
        with pytest.raises(Lost):
            await head
        assert conn.unstarted is unstarted

    asyncio.run(main())
