"""Discovery through the API server: the EndpointSlices of one Service (list, then watch).

Plain HTTP(S) with aiohttp; every call has a deadline and every answer a size cap: a list answer at
most :data:`MAX_LIST_BYTES`, one watch event line at most :data:`MAX_EVENT_BYTES` (a longer one drops
the watch and relists). A watch ends after ``timeoutSeconds`` (the server closes it) and resumes from
the last ``resourceVersion`` (the end of the stream is a line without its newline: aiohttp's
``readuntil`` does not raise there); ``410 Gone`` or any error relists after a backoff (0.5 s doubling to
10 s). The current endpoint set is reported after the list and after every event.

:func:`endpoints_from_slices` is the pure part: an endpoint is ready when its ``conditions.ready`` is
not false and it is not ``terminating`` (Kubernetes' reading of a missing ``ready``); one neither ready
nor terminating is starting.

Concurrency model: :meth:`EndpointSliceWatch.run` is one task on the gateway's event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from .config import KubeWatchConfig
from .endpoints import Endpoint, OnChange

log = logging.getLogger("sluiceway.gateway.kube")

MAX_LIST_BYTES = 8 * 1024 * 1024
MAX_EVENT_BYTES = 1024 * 1024
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
WATCH_SECONDS = 240
CALL_TIMEOUT = 10.0


def endpoints_from_slices(slices: Mapping[str, Mapping[str, Any]], port_name: str | None) -> list[Endpoint]:
    """Every address of every slice, on the named port (or the slice's first port)."""
    out: dict[str, Endpoint] = {}
    for sl in slices.values():
        ports = sl.get("ports") or []
        port = None
        for p in ports:
            if not isinstance(p, Mapping):
                continue
            if port_name is None or p.get("name") == port_name:
                port = p.get("port")
                break
        if not isinstance(port, int) or not 0 < port < 65536:
            continue
        for ep in sl.get("endpoints") or []:
            if not isinstance(ep, Mapping):
                continue
            cond = ep.get("conditions") or {}
            terminating = cond.get("terminating") is True
            ready = cond.get("ready") is not False and not terminating
            for addr in ep.get("addresses") or []:
                if not isinstance(addr, str) or not addr:
                    continue
                key = f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
                prev = out.get(key)
                ready = ready or (prev is not None and prev.ready)
                out[key] = Endpoint(key, addr, port, ready, terminating and not ready)
    return sorted(out.values(), key=lambda e: e.key)


class EndpointSliceWatch:
    def __init__(self, config: KubeWatchConfig, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.config = config
        server = config.api_server
        if server is None:
            host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ValueError("watch.apiServer is unset and KUBERNETES_SERVICE_HOST is not in the environment")
            server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        self.server = server
        self.token_file = config.token_file or (str(SA_DIR / "token") if config.api_server is None else None)
        ca = config.ca_file or (str(SA_DIR / "ca.crt") if config.api_server is None else None)
        self.ssl: ssl.SSLContext | bool = True
        if server.startswith("https://"):
            if config.insecure_skip_tls_verify:
                self.ssl = False
            elif ca:
                self.ssl = ssl.create_default_context(cafile=ca)
        self.slices: dict[str, dict[str, Any]] = {}
        self.path = (f"/apis/discovery.k8s.io/v1/namespaces/{config.namespace}/endpointslices")
        self.selector = f"kubernetes.io/service-name={config.service}"

    def _headers(self) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if self.token_file:
            token = Path(self.token_file).read_text(encoding="utf-8").strip()  # re-read: tokens rotate
            h["Authorization"] = f"Bearer {token}"
        return h

    async def run(self, on_change: OnChange) -> None:
        backoff = 0.5
        async with aiohttp.ClientSession(read_bufsize=MAX_EVENT_BYTES) as session:
            while True:
                try:
                    rv = await self._list(session)
                    on_change(endpoints_from_slices(self.slices, self.config.port_name))
                    backoff = 0.5
                    while True:
                        rv = await self._watch(session, rv, on_change)
                except (aiohttp.ClientError, TimeoutError, ValueError, OSError, _Relist) as err:
                    log.warning("endpointslice watch: %s; relisting in %.1fs", err, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(10.0, backoff * 2)

    async def _list(self, session: aiohttp.ClientSession) -> str:
        url = f"{self.server}{self.path}"
        timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT)
        async with session.get(url, params={"labelSelector": self.selector}, headers=self._headers(),
                               ssl=self.ssl, timeout=timeout) as r:
            if r.status != 200:
                raise ValueError(f"list endpointslices: HTTP {r.status}")
            if (r.content_length or 0) > MAX_LIST_BYTES:
                raise ValueError("list answer over the size cap")
            parts: list[bytes] = []
            size = 0
            while True:  # read(n) returns what has arrived: read to the end, within the cap
                chunk = await r.content.read(MAX_LIST_BYTES + 1 - size)
                if not chunk:
                    break
                parts.append(chunk)
                size += len(chunk)
                if size > MAX_LIST_BYTES:
                    raise ValueError("list answer over the size cap")
        doc = json.loads(b"".join(parts))
        self.slices = {i["metadata"]["name"]: i for i in doc.get("items") or [] if isinstance(i, dict)}
        return str(doc.get("metadata", {}).get("resourceVersion", ""))

    async def _watch(self, session: aiohttp.ClientSession, rv: str, on_change: OnChange) -> str:
        url = f"{self.server}{self.path}"
        params = {"labelSelector": self.selector, "watch": "1", "resourceVersion": rv,
                  "timeoutSeconds": str(WATCH_SECONDS), "allowWatchBookmarks": "true"}
        timeout = aiohttp.ClientTimeout(total=WATCH_SECONDS + CALL_TIMEOUT, sock_connect=CALL_TIMEOUT)
        async with session.get(url, params=params, headers=self._headers(), ssl=self.ssl, timeout=timeout) as r:
            if r.status == 410:
                raise _Relist("resourceVersion too old")
            if r.status != 200:
                raise ValueError(f"watch endpointslices: HTTP {r.status}")
            while True:
                try:
                    line = await r.content.readuntil(b"\n")
                except asyncio.IncompleteReadError:
                    return rv  # the server ended the watch: resume
                except ValueError:
                    raise _Relist("watch event over the size cap") from None
                if not line.endswith(b"\n"):
                    # aiohttp's readuntil returns what is left (b"" or a cut line) at the end of the
                    # stream instead of raising, and returns it again at once on every call: the
                    # server ended the watch, resume from the last whole event (looping here would
                    # spin without awaiting and block the whole event loop)
                    return rv
                if len(line) > MAX_EVENT_BYTES:
                    raise _Relist("watch event over the size cap")
                if not line.strip():
                    continue
                ev = json.loads(line)
                kind, obj = ev.get("type"), ev.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Relist("resourceVersion too old")
                    raise ValueError(f"watch error: {obj.get('message')}")
                meta = obj.get("metadata") or {}
                rv = str(meta.get("resourceVersion", rv))
                if kind == "BOOKMARK":
                    continue
                name = meta.get("name")
                if not isinstance(name, str):
                    continue
                if kind == "DELETED":
                    self.slices.pop(name, None)
                elif kind in ("ADDED", "MODIFIED"):
                    self.slices[name] = obj
                on_change(endpoints_from_slices(self.slices, self.config.port_name))


class _Relist(Exception):
    pass
