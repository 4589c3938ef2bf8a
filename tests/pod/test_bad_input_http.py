# ruff: noqa: E501  (a table of literal request bodies)
"""Issue 10, bad input over real HTTP: oversized bodies, deep JSON, wrong dtypes, NaN/Inf, claimed
shapes larger than the data, binary headers that lie about lengths. Every one is a 4xx with a
message, and the event loop stays responsive (a probe and a valid request still answer at once)."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import httpx
import pytest
from podtools import infer_body

pytestmark = pytest.mark.slow


def _binary(header: dict[str, Any] | bytes, payload: bytes, header_len: str | None = None) -> tuple[bytes, dict[str, str]]:
    import json

    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return raw + payload, {
        "Inference-Header-Content-Length": header_len if header_len is not None else str(len(raw)),
        "Content-Type": "application/octet-stream",
    }


def _tensor(shape: list[int], size: int | None = None, datatype: str = "FP32") -> dict[str, Any]:
    t: dict[str, Any] = {"name": "INPUT0", "shape": shape, "datatype": datatype}
    if size is not None:
        t["parameters"] = {"binary_data_size": size}
    return {"inputs": [t]}


VALID = httpx.Request("POST", "/", json=infer_body()).content
WRONG_DTYPE = httpx.Request("POST", "/", json={"inputs": [{**_tensor([1, 2], datatype="INT32")["inputs"][0], "data": [1, 2]}]}).content

CASES: list[tuple[str, bytes, dict[str, str], int]] = [
    ("not json", b"{nope", {}, 400),
    ("deep json", b"[" * 100_000 + b"]" * 100_000, {}, 400),
    ("deep object", b'{"inputs":' + b'{"a":' * 5000 + b"1" + b"}" * 5001, {}, 400),
    ("top level list", b"[]", {}, 400),
    ("no inputs", b"{}", {}, 400),
    ("wrong dtype", WRONG_DTYPE, {}, 400),
    ("strings for numbers", b'{"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"FP32","data":["a","b"]}]}', {}, 400),
    ("nested lists of objects", b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[{}]}]}', {}, 400),
    ("NaN literal", b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[NaN]}]}', {}, 400),
    ("Infinity literal", b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[Infinity]}]}', {}, 400),
    ("overflow to inf", b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[1e400]}]}', {}, 400),
    ("fp32 overflow", b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[1e39]}]}', {}, 400),
    ("shape larger than data", b'{"inputs":[{"name":"INPUT0","shape":[1,1000000],"datatype":"FP32","data":[1]}]}', {}, 400),
    ("huge shape", b'{"inputs":[{"name":"INPUT0","shape":[4294967296,4294967296],"datatype":"FP32","data":[1]}]}', {}, 400),
    ("negative dim", b'{"inputs":[{"name":"INPUT0","shape":[1,-1],"datatype":"FP32","data":[1]}]}', {}, 400),
    ("float dim", b'{"inputs":[{"name":"INPUT0","shape":[1,1.5],"datatype":"FP32","data":[1]}]}', {}, 400),
    ("wrong rank", b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":[1]}]}', {}, 400),
    ("bad deadline", VALID, {"X-Sluiceway-Deadline-Ms": "soon"}, 400),
    ("nan deadline", VALID, {"X-Sluiceway-Deadline-Ms": "nan"}, 400),
    ("unknown priority", VALID, {"X-Sluiceway-Priority": "urgent"}, 400),
    ("binary: header length past the body", *_binary(_tensor([1, 2], 8), struct.pack("<2f", 1, 2), "100000"), 400),
    ("binary: header length zero", *_binary(_tensor([1, 2], 8), struct.pack("<2f", 1, 2), "0"), 400),
    ("binary: header length negative", *_binary(_tensor([1, 2], 8), struct.pack("<2f", 1, 2), "-5"), 400),
    ("binary: header length not a number", *_binary(_tensor([1, 2], 8), struct.pack("<2f", 1, 2), "ten"), 400),
    ("binary: header length mid-json", *_binary(_tensor([1, 2], 8), struct.pack("<2f", 1, 2), "10"), 400),
    ("binary: size larger than the data", *_binary(_tensor([1, 2], 8), struct.pack("<1f", 1)), 400),
    ("binary: size disagrees with shape", *_binary(_tensor([1, 4], 8), struct.pack("<2f", 1, 2)), 400),
    ("binary: claimed shape larger than data", *_binary(_tensor([1, 1 << 30], 4 << 30), struct.pack("<2f", 1, 2)), 400),
    ("binary: trailing bytes", *_binary(_tensor([1, 2], 8), struct.pack("<3f", 1, 2, 3)), 400),
    ("binary: NaN", *_binary(_tensor([1, 2], 8), struct.pack("<2f", float("nan"), 1)), 400),
    ("binary: Inf", *_binary(_tensor([1, 2], 8), struct.pack("<2f", float("inf"), 1)), 400),
    ("binary: negative size", *_binary(_tensor([1, 2], -8), struct.pack("<2f", 1, 2)), 400),
]


def test_every_bad_input_is_a_4xx_with_a_message_and_the_loop_stays_responsive(pod_factory: Any) -> None:
    pod = pod_factory("--model", "synthetic:1", "--concurrency", "2")
    with httpx.Client(timeout=30) as c:
        for what, body, headers, want in CASES:
            r = c.post(pod.infer_url, content=body, headers={"Content-Type": "application/json", **headers})
            assert r.status_code == want, (what, r.status_code, r.text[:300])
            assert r.json()["error"].strip(), what
            t0 = time.monotonic()
            assert c.get(f"{pod.url}/v2/health/live").status_code == 200, what
            assert time.monotonic() - t0 < 2.0, what
        assert c.post(pod.infer_url, json=infer_body()).status_code == 200
    assert pod.metric("sluiceway_rejected_total", reason="invalid_input") == len(CASES)
    assert pod.metric("sluiceway_queue_depth") == 0 and pod.metric("sluiceway_concurrency_in_use") == 0


def test_oversized_bodies_are_413_declared_or_chunked(pod_factory: Any) -> None:
    pod = pod_factory("--model", "synthetic:1", config={"server": {"maxBodyBytes": 65536}})
    big = b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[' + b"1," * 40000 + b"1]}]}"
    r = httpx.post(pod.infer_url, content=big, timeout=30)
    assert r.status_code == 413 and r.json()["reason"] == "payload_too_large" and r.json()["error"]

    def chunks() -> Any:
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    r = httpx.post(pod.infer_url, content=chunks(), timeout=30)  # no Content-Length: counted while read
    assert r.status_code == 413 and r.json()["error"]
    # a Content-Length that lies (claims small, sends more): the server reads only what was declared
    s = socket.create_connection(("127.0.0.1", pod.port))
    s.settimeout(10)
    s.sendall(b"POST /v2/models/demo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n" + big[:5000])
    reply = s.recv(65536)
    s.close()
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert httpx.get(f"{pod.url}/v2/health/live", timeout=5).status_code == 200
    assert httpx.post(pod.infer_url, json=infer_body(), timeout=30).status_code == 200


def test_declared_max_shape_bounds_the_variable_dimensions(pod_factory: Any) -> None:
    spec = {"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1], "maxShape": [4, 8]}
    pod = pod_factory("--model", "synthetic:1", config={"model": {"inputs": [spec]}})
    with httpx.Client(timeout=30) as c:
        assert c.post(pod.infer_url, json=infer_body(rows=4, cols=8)).status_code == 200
        for rows, cols in ((1, 9), (5, 1)):
            r = c.post(pod.infer_url, json=infer_body(rows=rows, cols=cols))
            assert r.status_code == 400 and "maxShape" in r.json()["error"], r.text
        # a binary body claiming a huge shape is refused on the shape, before its size is looked at
        body, headers = _binary(_tensor([1, 1 << 20], 4 << 20), b"")
        r = c.post(pod.infer_url, content=body, headers=headers)
        assert r.status_code == 400 and "maxShape" in r.json()["error"], r.text
