"""Blocking HTTP GET with a hard deadline over the whole exchange, and a cap on the answer's size.

The one HTTP GET of every component that reads another system by URL: the scaler (Prometheus through
:mod:`sluiceway_core.promclient`, pod ``/metrics``) and the operator (Prometheus, through the same
client). A per-read socket timeout is not enough: a
server that trickles one byte at a time keeps every read short and the whole answer long (a
Prometheus stand-in sending one byte every 0.2 s held a ``requests`` query with a 0.5 s timeout for
52 s). Here a timer shuts the socket down when ``timeout`` has passed since the call began, which
ends any blocked read at once. One connection per call, closed afterwards: no pools, so nothing
accumulates per address. No proxy from the environment and no redirects are followed.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = ["FetchError", "FetchTimeout", "http_get"]


class FetchError(Exception):
    """The exchange failed: connection refused or reset, malformed HTTP, answer too large."""


class FetchTimeout(FetchError):
    """No complete answer within the deadline."""


def http_get(
    url: str,
    timeout: float,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
    *,
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[int, bytes]:
    """``(status, body)`` of one GET. Raises :class:`FetchTimeout` after ``timeout`` seconds in all,
    :class:`FetchError` for any other failure or a body longer than ``max_bytes``. ``headers`` are
    sent as given (after the defaults, which they may override); their values never appear in an
    error. ``ssl_context`` (https only): a CA other than the system's, a client certificate; default
    the system's trust store.

    Concurrency: blocking; safe to call from any number of threads (nothing is shared between calls).
    """
    u = urlsplit(url)
    host = u.hostname or ""
    conn: http.client.HTTPConnection
    if u.scheme == "https":
        conn = http.client.HTTPSConnection(
            host, u.port, timeout=timeout, context=ssl_context or ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(host, u.port, timeout=timeout)
    target = (u.path or "/") + (f"?{u.query}" if u.query else "")
    expired = threading.Event()
    # The connected socket, kept here: when an answer closes the connection (HTTP/1.0, or
    # `Connection: close`) http.client hands the socket to the response and sets conn.sock to None,
    # and the deadline must still be able to cut it.
    held: list[socket.socket] = []

    def cut() -> None:
        expired.set()
        for sock in [*held, conn.sock]:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(timeout, cut)
    timer.daemon = True
    timer.start()
    resp: http.client.HTTPResponse | None = None
    try:
        conn.connect()
        if conn.sock is not None:
            held.append(conn.sock)
        if expired.is_set():
            raise TimeoutError("deadline passed while connecting")
        sent = {"Accept": "application/json, text/plain", "User-Agent": "sluiceway"}
        sent.update(headers or {})
        conn.request("GET", target, headers=sent)
        resp = conn.getresponse()
        body = resp.read(max_bytes + 1)
        if len(body) > max_bytes:
            raise FetchError(f"answer from {u.scheme}://{u.netloc} is larger than {max_bytes} bytes")
        if expired.is_set():
            raise TimeoutError("deadline passed while reading")
        return resp.status, body
    except (OSError, http.client.HTTPException, ValueError) as e:
        if expired.is_set() or isinstance(e, TimeoutError):
            raise FetchTimeout(f"no complete answer from {u.scheme}://{u.netloc} within {timeout:g}s") from e
        # An HTTPException's text can be what the server sent (BadStatusLine): name the kind only.
        what = f"{type(e).__name__}: {e}" if isinstance(e, OSError) else type(e).__name__
        raise FetchError(f"{u.scheme}://{u.netloc}: {what}") from e
    finally:
        timer.cancel()
        if resp is not None:
            resp.close()
        conn.close()
