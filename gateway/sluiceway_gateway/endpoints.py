"""Where the pods are: an :class:`EndpointSource` reports the full endpoint set on every change.

:class:`StaticEndpoints` is a fixed list (tests, benchmarks); :class:`~sluiceway_gateway.kube.
EndpointSliceWatch` follows a Service's EndpointSlices through the API server. An endpoint that is
not ready or is terminating is reported with ``ready=False`` and gets no new request; one not ready and
not terminating is a pod starting (the gateway predicts when it can serve, docs/gateway.md).

Concurrency model: ``run`` is one task on the gateway's event loop; ``on_change`` is called on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Endpoint:
    key: str  # stable identity, host:port
    host: str
    port: int
    ready: bool = True
    #: discovery says the pod is going away (an EndpointSlice endpoint ``terminating``): never "starting"
    terminating: bool = False


OnChange = Callable[[list[Endpoint]], None]


class EndpointSource(Protocol):
    async def run(self, on_change: OnChange) -> None: ...


def parse_address(addr: str) -> Endpoint:
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    p = int(port)
    if not host or not 0 < p < 65536:
        raise ValueError(f"bad endpoint address {addr!r}")
    return Endpoint(f"{host}:{p}", host, p)


class StaticEndpoints:
    def __init__(self, addresses: list[str]) -> None:
        self.endpoints = [parse_address(a) for a in addresses]

    async def run(self, on_change: OnChange) -> None:
        on_change(list(self.endpoints))
        await asyncio.Event().wait()
