"""The gateway -> pod trust: a per-service edge token and the headers that carry the edge's decision.

The operator renders one random token per service (the Secret ``<name>-edge``, key ``token``),
mounted in the gateway and in the pods at :data:`DEFAULT_TOKEN_FILE` and named in both configs by
``edge.tokenFile``. The gateway, after admitting a request, removes any client-sent
:data:`EDGE_HEADERS` and sends its own: the token, the tenant's name and the admitted priority class.
A pod whose token equals the presented one takes the tenant and the class from those headers (see
docs/pod.md, "Behind the gateway").

The start signal: with the token the gateway also sends :data:`START_SIGNAL_HEADER` (``1``); a pod
that trusts the token then writes an HTTP/1.1 informational answer (``103`` carrying
:data:`STARTED_HEADER`) on that connection when the request starts executing on a permit, before
its final answer. A request the pod refused or answered before that gets none. So when the pod's
connection dies before the final answer, the gateway knows whether the pod had started the request
(502 ``upstream_lost``) or had only queued it (sent once more, to another pod). A client's own
:data:`START_SIGNAL_HEADER` is removed by the gateway with the other edge headers and ignored by a
pod without the token.

:class:`EdgeToken` holds the token read from its file and reads it again when it changed (checked at
most every ``period`` seconds: a stat, and a read of at most :data:`MAX_TOKEN_BYTES` bytes when the
file's identity, size or mtime moved; the kubelet's symlink swap of a mounted Secret changes all
three), so a rotated Secret applies without a restart, like the keys file. The token is never
logged, exported or put in an error message: a refusal says only that it does not match.

Concurrency model: an :class:`EdgeToken` is owned by one event loop (the pod's or the gateway's) and
called only from it; a check does at most one ``stat`` and one small read (a mounted file), bounded.
Time comes from the injected clock.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
from collections.abc import Callable

__all__ = [
    "DEFAULT_TOKEN_FILE",
    "EDGE_HEADERS",
    "EDGE_PRIORITY_HEADER",
    "EDGE_TENANT_HEADER",
    "EDGE_TOKEN_HEADER",
    "MAX_TOKEN_BYTES",
    "STARTED_HEADER",
    "STARTED_INFORMATIONAL",
    "START_SIGNAL_HEADER",
    "EdgeToken",
    "valid_tenant_name",
]

log = logging.getLogger("sluiceway.edge")

DEFAULT_TOKEN_FILE = "/etc/sluiceway/edge/token"
EDGE_TOKEN_HEADER = "x-sluiceway-edge-token"
EDGE_TENANT_HEADER = "x-sluiceway-tenant"
EDGE_PRIORITY_HEADER = "x-sluiceway-edge-priority"
#: the gateway asks the pod for a start signal (honoured only with the edge token)
START_SIGNAL_HEADER = "x-sluiceway-start-signal"
#: the header of the informational answer a pod writes when the request starts executing
STARTED_HEADER = "x-sluiceway-started"
#: that informational answer, as written on the wire (HTTP/1.1 only)
STARTED_INFORMATIONAL = b"HTTP/1.1 103 Early Hints\r\n" + STARTED_HEADER.encode() + b": 1\r\n\r\n"
#: what the gateway removes from every client request before forwarding it
EDGE_HEADERS = frozenset({EDGE_TOKEN_HEADER, EDGE_TENANT_HEADER, EDGE_PRIORITY_HEADER, START_SIGNAL_HEADER})
MAX_TOKEN_BYTES = 4096
#: the shortest token accepted: a shorter file is treated as no token (nothing is trusted)
MIN_TOKEN_BYTES = 16
#: a tenant name in :data:`EDGE_TENANT_HEADER`: at most 63 characters of a DNS label's alphabet
#: (upper case, ``.`` and ``_`` also allowed, for hand-written keys files)
_TENANT = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


def valid_tenant_name(name: str) -> bool:
    return _TENANT.fullmatch(name) is not None


class EdgeToken:
    """The edge token of one service, from ``path``; :meth:`matches` compares in constant time."""

    def __init__(self, path: str, clock: Callable[[], float], period: float = 2.0) -> None:
        self.path = path
        self._clock = clock
        self.period = period
        self._token: bytes | None = None
        self._stamp: tuple[int, int, int, int] | None = None
        self._checked = -1e18
        self._problem: str | None = None  # the last reason logged (each distinct one once)
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> None:
        """Read the file again if ``period`` passed since the last check and it changed."""
        now = self._clock()
        if not force and now - self._checked < self.period:
            return
        self._checked = now
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)
            if stamp == self._stamp and not force:
                return
            with open(self.path, "rb") as fh:
                data = fh.read(MAX_TOKEN_BYTES + 1)
        except OSError as err:
            self._set(None, None, f"{self.path}: cannot be read ({err.strerror or type(err).__name__}); "
                                  "no gateway is trusted until it can")
            return
        token = data.strip()
        if len(data) > MAX_TOKEN_BYTES:
            self._set(None, stamp, f"{self.path}: larger than {MAX_TOKEN_BYTES} bytes; no gateway is trusted")
        elif len(token) < MIN_TOKEN_BYTES:
            self._set(None, stamp, f"{self.path}: shorter than {MIN_TOKEN_BYTES} bytes; no gateway is trusted")
        elif not all(0x21 <= c <= 0x7E for c in token):  # it goes into a header line as it is
            self._set(None, stamp, f"{self.path}: not printable ASCII without spaces; no gateway is trusted")
        else:
            self._set(token, stamp, None)

    def _set(self, token: bytes | None, stamp: tuple[int, int, int, int] | None, problem: str | None) -> None:
        changed = token != self._token
        self._token, self._stamp = token, stamp
        if problem is not None and problem != self._problem:
            log.error("edge token: %s", problem)
        elif problem is None and changed:
            log.info("edge token read from %s", self.path)
        self._problem = problem

    @property
    def value(self) -> bytes | None:
        """The token in force (None: the file is missing or unusable), after a due refresh."""
        self.refresh()
        return self._token

    def matches(self, presented: str) -> bool:
        """Whether ``presented`` is the token (:func:`hmac.compare_digest`; False without a token)."""
        token = self.value
        if token is None:
            return False
        return hmac.compare_digest(presented.strip().encode("utf-8", "replace"), token)
