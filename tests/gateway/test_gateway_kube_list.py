"""The EndpointSlice list is read to its end however the answer arrives (a real HTTP server on
loopback that sends it in pieces). The sandbox found it: one ``read(n)`` returned what had arrived,
and the gateway logged ``Expecting ':' delimiter`` twice at start before a list came in whole."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web
from sluiceway_gateway.config import KubeWatchConfig
from sluiceway_gateway.kube import MAX_LIST_BYTES, EndpointSliceWatch

SLICE = {
    "metadata": {"name": "svc-abc", "labels": {"kubernetes.io/service-name": "svc"}},
    "addressType": "IPv4",
    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    "endpoints": [{"addresses": [f"10.0.0.{i}"], "conditions": {"ready": True}} for i in range(1, 40)],
}


async def _serve(body: bytes, pieces: int) -> tuple[web.AppRunner, int]:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        step = max(1, len(body) // pieces)
        for i in range(0, len(body), step):
            await resp.write(body[i:i + step])
            await asyncio.sleep(0.05)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


def _list(body: bytes, pieces: int) -> tuple[str, dict[str, object]]:
    async def main() -> tuple[str, dict[str, object]]:
        runner, port = await _serve(body, pieces)
        try:
            watch = EndpointSliceWatch(KubeWatchConfig(namespace="ns", service="svc", port_name="http",
                                                       api_server=f"http://127.0.0.1:{port}"), environ={})
            async with aiohttp.ClientSession() as session:
                rv = await watch._list(session)
            return rv, dict(watch.slices)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def test_a_list_that_arrives_in_pieces_is_read_whole() -> None:
    body = json.dumps({"metadata": {"resourceVersion": "42"}, "items": [SLICE]}).encode()
    rv, slices = _list(body, pieces=5)
    assert rv == "42" and list(slices) == ["svc-abc"]


def test_a_list_over_the_cap_is_refused_even_without_a_length() -> None:
    body = b'{"items": [], "pad": "' + b"x" * (MAX_LIST_BYTES + 10) + b'"}'
    try:
        _list(body, pieces=3)
    except ValueError as e:
        assert "size cap" in str(e)
    else:
        raise AssertionError("a list over the cap was accepted")
