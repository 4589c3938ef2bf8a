"""Issue 13: a refusal (429) is decided on the headers and costs little. In-process, on a started
data plane behind the real ASGI app (no HTTP; tests/pod/test_transport_http.py covers the wire):
the refusal never asks for the body, sends exactly one answer (the OIP error JSON with Retry-After),
is counted in ``sluiceway_requests_total`` and ``sluiceway_rejected_total``, and raises no exception
on its way once the answer is cached."""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sluiceway_core import metric_names as names
from sluiceway_core.config import build_config
from sluiceway_pod.app import build_app
from sluiceway_pod.data_plane import DataPlane
from sluiceway_pod.metrics import PodMetrics

from bench.overhead import FLOOR_BODY, _inproc_worker

BODY = b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[1.0,2.0,3.0,4.0]}]}'


def _scope(extra: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    headers = [(b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]
    return {
        "type": "http",
        "method": "POST",
        "path": "/v2/models/demo/infer",
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "headers": headers + (extra or []),
    }


class Exchange:
    """One request's receive/send pair. ``body_read`` tells whether the app asked for the body."""

    def __init__(self, *, allow_body: bool = True, stay: bool = False) -> None:
        self.allow_body = allow_body
        self.stay = stay  # after the body, the client stays connected (no http.disconnect)
        self.body_read = False
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if not self.allow_body:
            raise AssertionError("a refusal must not ask for the body")
        if self.body_read:
            if self.stay:
                await asyncio.sleep(3600)
            return {"type": "http.disconnect"}
        self.body_read = True
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])


@pytest.fixture
async def limited() -> Iterator[tuple[Any, PodMetrics, CollectorRegistry]]:
    """The pod's app on a started data plane whose anonymous tenant has one token (then 429s)."""
    cfg = build_config(
        {
            "model": {"spec": "synthetic:0", "warmupIterations": 1},
            "concurrency": {"permits": 1},
            "tenants": {"defaults": {"rate": 0.001, "burst": 1}},
        }
    )
    registry = CollectorRegistry()
    metrics = PodMetrics(registry, cfg.model.name)
    plane = DataPlane(cfg, metrics)
    await plane.start()
    try:
        yield build_app(plane), metrics, registry
    finally:
        await plane.stop()


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    labels = {"model": "demo", "tenant": "anonymous", "priority": "standard", **labels}
    return registry.get_sample_value(name, labels) or 0.0


async def test_a_refusal_never_reads_the_body_and_answers_once(limited: Any) -> None:
    app, _, registry = limited
    first = Exchange()
    await app(_scope(), first.receive, first.send)
    assert first.status == 200 and first.body_read  # the one token
    for i in range(3):
        ex = Exchange(allow_body=False)
        await app(_scope(), ex.receive, ex.send)
        assert [m["type"] for m in ex.sent] == ["http.response.start", "http.response.body"], ex.sent
        assert ex.status == 429
        doc = orjson.loads(ex.sent[1]["body"])
        assert doc == {"error": "tenant 'anonymous' is over its request rate", "reason": "rate_limited"}
        h = ex.headers
        assert h[b"content-type"] == b"application/json"
        assert int(h[b"content-length"]) == len(ex.sent[1]["body"])
        assert int(h[b"retry-after"]) in range(1, math.ceil(1 / 0.001) + 1)  # a token every 1000 s
        assert b"connection" not in h  # kept alive: the transport drops the unread body (see fastpath)
        assert _value(registry, names.REQUESTS, code="429") == i + 1
        assert _value(registry, names.REJECTED, reason="rate_limited") == i + 1
    assert _value(registry, names.REQUESTS, code="200") == 1


async def test_a_refusal_with_expect_100_continue_closes_the_connection(limited: Any) -> None:
    app, _, _ = limited
    first = Exchange()
    await app(_scope(), first.receive, first.send)
    ex = Exchange(allow_body=False)
    await app(_scope([(b"expect", b"100-continue")]), ex.receive, ex.send)
    assert ex.status == 429 and ex.headers[b"connection"] == b"close"
    again = Exchange(allow_body=False)  # the cached answer is not changed by that
    await app(_scope(), again.receive, again.send)
    assert again.status == 429 and b"connection" not in again.headers


@contextlib.contextmanager
def _exceptions_in_sluiceway() -> Iterator[list[str]]:
    """The exceptions raised in Sluiceway's own frames while the block runs, as ``function: Type``
    (StopIteration is how a finished coroutine hands its result to the awaiting frame: not counted)."""
    raised: list[str] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "exception" and "sluiceway" in frame.f_code.co_filename and arg[0] is not StopIteration:
            raised.append(f"{frame.f_code.co_name}: {arg[0].__name__}")
        return tracer

    sys.settrace(tracer)
    try:
        yield raised
    finally:
        sys.settrace(None)


async def test_the_cached_refusal_raises_no_exception(limited: Any) -> None:
    """Once the rate-limit answer is cached, a refusal runs without raising anything (an exception
    costs an object and a traceback per request)."""
    app, _, _ = limited
    plane = app.plane
    for _ in range(2):  # the token, then the first refusal (builds the cached answer)
        ex = Exchange()
        await app(_scope(), ex.receive, ex.send)
    ex = Exchange(allow_body=False)
    with _exceptions_in_sluiceway() as raised:
        await app(_scope(), ex.receive, ex.send)
    assert ex.status == 429
    assert raised == [], raised
    again = plane.admit_headers("demo", {})  # the same answer object: built once, reused
    assert again is plane.admit_headers("demo", {}) and getattr(again, "status", None) == 429


@pytest.mark.parametrize("which", ["sluiceway-429", "floor-429"])
def test_in_process_refusal_harness_answers_every_call_429(which: str) -> None:
    """``python -m bench.overhead --in-process``: the refusal rows raise on any answer but 429."""
    r = _inproc_worker(which, 64, 8)
    assert r["cpu_us"] > 0


def test_the_floor_sends_the_pods_refusal_bytes() -> None:
    """The bare-uvicorn floor of the 429 benchmark answers with the pod's own refusal body."""
    doc = orjson.loads(FLOOR_BODY)
    assert doc == {"error": "tenant 'limited' is over its request rate", "reason": "rate_limited"}


@pytest.mark.parametrize("raw", [False, True], ids=["uvicorn-floor", "raw-floor"])
def test_the_floor_sends_the_same_answer_as_the_pod_over_http(tmp_path: Any, raw: bool) -> None:
    """The 429 benchmark's peers (bare ASGI 429 through the pod's uvicorn settings; a bare asyncio
    protocol) put the same status, body and header names on the wire as the pod's own rate-limit
    refusal."""
    import httpx

    from bench.overhead import LIMITED_KEY, start_floor, tenant_pod_config
    from bench.servers import start_pod

    pod = start_pod(tmp_path / "logs", config_file=tenant_pod_config(tmp_path), core=None)
    try:
        floor = start_floor(tmp_path / "logs", raw=raw)
        try:
            with httpx.Client(timeout=10) as c:
                auth = {"Authorization": f"Bearer {LIMITED_KEY}"}
                assert c.post(pod.infer_url, content=BODY, headers=auth).status_code == 200  # the one token
                ours = c.post(pod.infer_url, content=BODY, headers=auth)
                bare = c.post(floor.infer_url, content=BODY)
        finally:
            floor.stop()
    finally:
        pod.stop()
    assert ours.status_code == bare.status_code == 429
    assert ours.content == bare.content == FLOOR_BODY
    assert sorted(ours.headers) == sorted(bare.headers), (ours.headers, bare.headers)


async def test_the_full_queue_refusal_is_cached_per_depth_and_raises_nothing() -> None:
    """The other overload 429 (no room in the queue) is also answered from the cache: the answer
    names the queue depth it saw, and is counted like any refusal."""
    cfg = build_config(
        {
            "model": {"spec": "synthetic:1000", "warmupIterations": 1},
            "concurrency": {"permits": 1},
            "queue": {"maxDepth": 1, "timeoutSeconds": 30},
        }
    )
    registry = CollectorRegistry()
    plane = DataPlane(cfg, PodMetrics(registry, cfg.model.name))
    await plane.start()
    app = build_app(plane)
    held = [Exchange(stay=True) for _ in range(2)]  # one runs (1 s), one waits: the queue (depth 1) is full
    tasks = [asyncio.ensure_future(app(_scope(), ex.receive, ex.send)) for ex in held]
    try:
        await asyncio.sleep(0.2)
        assert plane.core is not None and plane.core.depth == 1
        raised: list[str] = []
        for i in range(2):
            ex = Exchange(allow_body=False)
            with _exceptions_in_sluiceway() as seen:
                await app(_scope(), ex.receive, ex.send)
            if i == 1:  # the first refusal builds the cached answer; the second is served from it
                raised = seen
            assert ex.status == 429
            assert orjson.loads(ex.sent[1]["body"]) == {"error": "queue full (1 waiting)", "reason": "queue_full"}
            assert int(ex.headers[b"retry-after"]) >= 1
            assert _value(registry, names.REJECTED, reason="queue_full") == i + 1
            assert _value(registry, names.REQUESTS, code="429") == i + 1
        assert raised == [], raised
        again = plane.admit_headers("demo", {})  # the same answer object: built once, reused
        assert again is plane.admit_headers("demo", {}) and getattr(again, "status", None) == 429
        assert _value(registry, names.REJECTED, reason="queue_full") == 4
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert [ex.status for ex in held] == [200, 200]
    finally:
        for t in tasks:
            t.cancel()
        await plane.stop()


def test_the_mixed_point_refuses_only_the_limited_stream_and_prices_it(tmp_path: Any) -> None:
    """``bench.overhead``'s mixed point: accepted traffic alone, then with refusals on top, on one
    pod. Every accepted-stream request gets 200 and every refused-stream request 429, so the extra
    CPU of the second window is the refusals' own."""
    from bench.overhead import FREE_KEY, LIMITED_KEY, marginal_refusal, small_body, tenant_pod_config
    from bench.servers import start_pod

    pod = start_pod(tmp_path / "logs", config_file=tenant_pod_config(tmp_path), core=None)
    try:
        import httpx

        with httpx.Client(timeout=10) as c:  # the limited tenant's one token
            auth = {"Authorization": f"Bearer {LIMITED_KEY}"}
            assert c.post(pod.infer_url, content=small_body(), headers=auth).status_code == 200
        m = marginal_refusal(pod, f"Bearer {FREE_KEY}", f"Bearer {LIMITED_KEY}", 40.0, 80.0, 1.5)
    finally:
        pod.stop()
    assert set(m["base"]["by_stream"]["accepted"]) == {"200"}
    assert set(m["mixed"]["by_stream"]["accepted"]) == {"200"}
    assert set(m["mixed"]["by_stream"]["refused"]) == {"429"}
    assert m["mixed"]["by_stream"]["refused"]["429"] > 60  # about 80/s for 1.5 s
    assert m["accepted_cpu_us_per_req"] > 0 and m["refused_marginal_cpu_us_per_req"] is not None
