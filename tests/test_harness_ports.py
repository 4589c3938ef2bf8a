"""The test harness's port picker: ports handed to child servers must not collide.

A port from ``bind(port 0)`` comes from the kernel's ephemeral range, the same range outgoing
connections draw their local ports from. Between the moment the picker closes its socket and the
moment a child server binds the port, any client connection (the suite makes thousands) may take
it, and the child dies with EADDRINUSE (CI run of stop 15: ``test_run_spreads_over_ready_real_pods_only``,
``[Errno 98] ... ('127.0.0.1', 42445): address already in use``).
"""

from __future__ import annotations

import socket
from pathlib import Path

import netports
from netports import free_port


def _ephemeral_range() -> tuple[int, int]:
    lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(lo), int(hi)


def test_ports_are_outside_the_ephemeral_range() -> None:
    lo, hi = _ephemeral_range()
    for _ in range(50):
        port = free_port()
        assert not lo <= port <= hi, f"{port} is in the ephemeral range {lo}-{hi}"


def test_no_port_is_handed_out_twice_in_one_run() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)


def test_a_port_taken_by_a_listener_is_never_handed_out() -> None:
    pool = netports._candidates()
    taken: list[socket.socket] = []
    try:
        for port in range(pool.start, pool.start + len(pool) // 2):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            s.listen(1)
            taken.append(s)
        held = {s.getsockname()[1] for s in taken}
        assert len(held) > len(pool) // 4
        for _ in range(300):
            assert free_port() not in held
    finally:
        for s in taken:
            s.close()
