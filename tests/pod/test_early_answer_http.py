"""Issue 13: the inference port's protocol answers an infer request refused on its headers itself
(sluiceway_pod.transport.InferenceProtocol), without uvicorn's ASGI cycle, and hands an admission
on to the ASGI path so the headers are decided once.

In-process: a started data plane behind the pod's own app and the pod's own uvicorn settings
(``build_inference_uvicorn_config``), served on loopback on the test's event loop; the client
speaks raw HTTP/1.1 over a socket, so pipelining and connection handling are visible. The ASGI app
counts the requests that reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Generator
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvicorn
from netports import free_port
from prometheus_client import CollectorRegistry
from sluiceway_core import metric_names as names
from sluiceway_core.config import build_config
from sluiceway_pod.app import build_app
from sluiceway_pod.data_plane import DataPlane
from sluiceway_pod.fastpath import InferFastPath
from sluiceway_pod.metrics import PodMetrics
from sluiceway_pod.server import build_inference_uvicorn_config

BODY = b'{"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"FP32","data":[1.5,1.5]}]}'
FREE, TWO = "k-free", "k-two"  # tenant "free" (no limit), tenant "two" (two tokens, then 429)


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class Served:
    def __init__(self, plane: DataPlane, registry: CollectorRegistry, port: int, asgi_paths: list[str]) -> None:
        self.plane = plane
        self.registry = registry
        self.port = port
        self.asgi_paths = asgi_paths  # the path of every request that reached the ASGI app

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, {"model": "demo", "priority": "standard", **labels}) or 0.0

    async def connect(self) -> Wire:
        return Wire(*await asyncio.open_connection("127.0.0.1", self.port))

    async def spend_two_tokens(self) -> None:
        """Tenant "two" spends its two tokens on a connection of its own (then it gets 429s)."""
        wire = await self.connect()
        try:
            for _ in range(2):
                await wire.send(post(TWO))
                assert (await wire.answer())[0] == 200
        finally:
            wire.close()


class Wire:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
        """One response: status, headers (lower-case names), body. EOFError if the server closed."""
        try:
            head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), timeout)
        except asyncio.IncompleteReadError as e:
            raise EOFError(e.partial) from None
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        body = await asyncio.wait_for(self.reader.readexactly(int(headers["content-length"])), timeout)
        return status, headers, body

    async def closed(self, timeout: float = 5.0) -> bool:
        return await asyncio.wait_for(self.reader.read(1), timeout) == b""

    def close(self) -> None:
        self.writer.close()


def post(key: str, *, http: str = "1.1", extra: str = "") -> bytes:
    return (
        f"POST /v2/models/demo/infer HTTP/{http}\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {key}\r\nContent-Length: {len(BODY)}\r\n{extra}\r\n"
    ).encode() + BODY


@contextlib.asynccontextmanager
async def serve(
    tmp_path: Path, model_ms: int = 0, keep_alive: float | None = None, header_timeout: float = 10.0
) -> AsyncIterator[Served]:
    keys = tmp_path / "keys"
    pairs = ((FREE, "free"), (TWO, "two"))
    keys.write_text("".join(f"{hashlib.sha256(k.encode()).hexdigest()} {t}\n" for k, t in pairs))
    port = free_port()
    cfg = build_config(
        {
            "model": {"spec": f"synthetic:{model_ms}", "warmupIterations": 1},
            "concurrency": {"permits": 1},
            "server": {
                "host": "127.0.0.1", "port": port, "logLevel": "warning", "headerTimeoutSeconds": header_timeout
            },
            "tenants": {
                "keysFile": str(keys),
                "allowAnonymous": False,
                "tenants": [{"name": "free"}, {"name": "two", "rate": 0.001, "burst": 2}],
            },
        }
    )
    registry = CollectorRegistry()
    plane = DataPlane(cfg, PodMetrics(registry, cfg.model.name))
    await plane.start()
    asgi_paths: list[str] = []

    class Counting(InferFastPath):
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                asgi_paths.append(scope["path"])
            await super().__call__(scope, receive, send)

    app = build_app(plane)
    app.__class__ = Counting  # the pod's own app, counted
    config = build_inference_uvicorn_config(app, cfg.server, plane)
    if keep_alive is not None:
        config.timeout_keep_alive = keep_alive  # type: ignore[assignment]
    server = _QuietServer(config)
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(200):
            if server.started:
                break
            await asyncio.sleep(0.05)
        assert server.started, "uvicorn did not start"
        yield Served(plane, registry, port, asgi_paths)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
        await plane.stop()


async def test_a_refusal_is_written_by_the_protocol_and_an_admission_is_decided_once(tmp_path: Path) -> None:
    async with serve(tmp_path) as s:
        wire = await s.connect()
        try:
            # tenant "two" has two tokens: were the headers decided twice (in the protocol and again
            # in the app), the second request would already be refused
            for _ in range(2):
                await wire.send(post(TWO))
                status, _, body = await wire.answer()
                assert status == 200, body
            assert len(s.asgi_paths) == 2
            for i in range(3):
                await wire.send(post(TWO))
                status, headers, body = await wire.answer()
                assert status == 429
                doc = orjson.loads(body)
                assert doc == {"error": "tenant 'two' is over its request rate", "reason": "rate_limited"}
                assert headers["content-type"] == "application/json"
                assert int(headers["retry-after"]) in range(1, 1001)  # a token every 1000 s
                assert "date" in headers and headers["server"] == "uvicorn"  # uvicorn's own headers too
                assert "connection" not in headers  # kept alive
                assert s.metric(names.REQUESTS, tenant="two", code="429") == i + 1
                assert s.metric(names.REJECTED, tenant="two", reason="rate_limited") == i + 1
            assert len(s.asgi_paths) == 2, "a refusal reached the ASGI app"
            # the connection still serves: an accepted request after the refusals
            await wire.send(post(FREE))
            status, _, body = await wire.answer()
            assert status == 200 and orjson.loads(body)["outputs"][0]["data"] == [1.5, 1.5]
            # a refusal the app makes (not on the headers) still goes through ASGI: a 401 for a bad key
            # is decided on the headers, a 404 for an unknown model too; GET on infer is the app's 405
            await wire.send(b"GET /v2/models/demo/infer HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await wire.answer())[0] == 405
            assert s.asgi_paths[-1] == "/v2/models/demo/infer" and len(s.asgi_paths) == 4
        finally:
            wire.close()
        assert s.metric(names.REQUESTS, tenant="two", code="200") == 2


async def test_pipelined_requests_are_answered_in_order(tmp_path: Path) -> None:
    async with serve(tmp_path, model_ms=50) as s:
        await s.spend_two_tokens()
        wire = await s.connect()
        try:
            # one write: accepted (in service for 50 ms), refused, accepted, refused, refused
            await wire.send(post(FREE) + post(TWO) + post(FREE) + post(TWO) + post(TWO))
            got = [(await wire.answer())[0] for _ in range(5)]
            assert got == [200, 429, 200, 429, 429]
        finally:
            wire.close()


async def test_a_request_pipelined_behind_an_answer_on_the_headers_is_not_cut_by_keep_alive(
    tmp_path: Path,
) -> None:
    """The answer on the headers completes a response inside the parser's callback; had it armed
    uvicorn's keep-alive timer (uvicorn cancels it once per read), a request that follows in the
    same read would be cut by that timer while in service."""
    async with serve(tmp_path, model_ms=2500, keep_alive=1.0) as s:
        wire = await s.connect()
        try:
            await s.spend_two_tokens()
            await wire.send(post(TWO) + post(FREE))  # refused on its headers, then 2.5 s in service
            assert (await wire.answer())[0] == 429
            status, _, body = await wire.answer(timeout=20)
            assert status == 200, body
        finally:
            wire.close()


@pytest.mark.parametrize(
    "how", ["http/1.0", "connection: close", "expect: 100-continue", "shutting down"]
)
async def test_an_answer_on_the_headers_closes_the_connection_when_it_must(tmp_path: Path, how: str) -> None:
    async with serve(tmp_path) as s:
        await s.spend_two_tokens()
        wire = await s.connect()
        try:
            if how == "http/1.0":
                req = post(TWO, http="1.0")
            elif how == "connection: close":
                req = post(TWO, extra="Connection: close\r\n")
            elif how == "expect: 100-continue":  # the announced body is never sent
                req = post(TWO, extra="Expect: 100-continue\r\n")[: -len(BODY)]
            else:
                s.plane.shutting_down = True  # SIGTERM seen: every answer carries Connection: close
                req = post(TWO)
            await wire.send(req)
            status, headers, _ = await wire.answer()
            assert status == 429
            assert headers["connection"] == "close"
            assert await wire.closed()
        finally:
            wire.close()
        assert len(s.asgi_paths) == 2


async def test_after_an_answer_on_the_headers_an_idle_connection_closes_at_the_header_deadline(
    tmp_path: Path,
) -> None:
    """No keep-alive timer per refusal: the header deadline bounds the unread body and the idle
    connection after an answer on the headers; a request that comes in time is served."""
    async with serve(tmp_path, header_timeout=1.5) as s:
        await s.spend_two_tokens()
        wire = await s.connect()
        try:
            await wire.send(post(TWO))
            assert (await wire.answer())[0] == 429
            await asyncio.sleep(0.5)
            await wire.send(post(FREE))  # within the deadline: served on the same connection
            assert (await wire.answer())[0] == 200
            await wire.send(post(TWO))
            assert (await wire.answer())[0] == 429
            t0 = asyncio.get_running_loop().time()
            assert await wire.closed(timeout=10)
            idle = asyncio.get_running_loop().time() - t0
        finally:
            wire.close()
        assert idle >= 1.0 and idle < 5.0, idle
