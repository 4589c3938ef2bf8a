"""Ports for the servers the tests start as child processes.

``bind(port 0)`` would hand out a port from the kernel's ephemeral range, the range that outgoing
connections take their local ports from: between the check here and the child's own bind, any of
the suite's client connections may take the port and the child exits with EADDRINUSE. So ports come
from outside that range, at random (two test processes on one machine rarely meet), are checked free
by a bind, and are never handed out twice by one process.

Single-threaded use from the test process; a lock keeps it safe if a fixture calls it from a thread.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

_ISSUED: set[int] = set()
_LOCK = threading.Lock()


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _candidates() -> range:
    lo, hi = _ephemeral_range()
    if lo - 10000 >= 1024:
        return range(lo - 10000, lo)
    return range(hi + 1, 65536)


def _bindable(port: int, host: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` (loopback unless told) that is free now, outside the ephemeral range,
    new to this process."""
    pool = _candidates()
    with _LOCK:
        for _ in range(2000):
            port = random.choice(pool)
            if port not in _ISSUED and _bindable(port, host):
                _ISSUED.add(port)
                return port
    raise RuntimeError(f"no free port on {host} in {pool.start}-{pool.stop - 1}")
