"""Logs, request ids, the access log, traces, tritonclient's ``priority=``/``timeout=`` and the body
budget gauge at the pod, over real HTTP with real pods (issue 23 section 3)."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from podtools import PodProcess, infer_body
from sluiceway_core.config import AccessLogConfig
from sluiceway_pod.logs import AccessLog, build_access_log, request_id

KEY = "sk-ann-observability-secret-42"
HEX16 = re.compile(r"[0-9a-f]{16}")


def keys_file(tmp_path: Path) -> str:
    path = tmp_path / "keys"
    path.write_text(f"{hashlib.sha256(KEY.encode()).hexdigest()} ann\n")
    return str(path)


def lines(pod: PodProcess) -> list[str]:
    return [ln for ln in pod.logs().splitlines() if ln.strip()]


def access_lines(pod: PodProcess, rid: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for ln in lines(pod):
            try:
                doc = json.loads(ln)
            except ValueError:
                continue
            if doc.get("logger") == "sluiceway.access" and doc.get("requestId") == rid:
                found.append(doc)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


# ---------------------------------------------------------------------------- fast unit tests


def test_request_id_is_kept_when_acceptable_else_made() -> None:
    assert request_id("abc-123.x:y/z+=@_") == "abc-123.x:y/z+=@_"
    for bad in (None, "", "a b", "a\r\nx-evil: 1", "é", "x" * 129):
        made = request_id(bad)
        assert HEX16.fullmatch(made), (bad, made)
    assert request_id(None) != request_id(None)


def test_access_log_is_off_by_default_and_sampled_when_on() -> None:
    assert build_access_log(AccessLogConfig()) is None
    assert build_access_log(AccessLogConfig(enabled=True, sample_rate=0.0)) is None
    draws = iter([0.1, 0.3, 0.24, 0.9])
    log = AccessLog(0.25, rand=lambda: next(draws))
    assert [log.sampled() for _ in range(4)] == [True, False, True, False]
    assert all(AccessLog(1.0).sampled() for _ in range(100))


# ---------------------------------------------------------------------------- over HTTP


def test_json_logs_access_log_and_request_ids(pod_factory: Any, tmp_path: Path) -> None:
    config = {
        "model": {"spec": "synthetic:20", "name": "demo", "warmupIterations": 1},
        "concurrency": {"permits": 1},
        "server": {"logFormat": "json", "accessLog": {"enabled": True, "sampleRate": 1.0}},
        "tenants": {"keysFile": keys_file(tmp_path), "allowAnonymous": False, "tenants": [{"name": "ann"}]},
    }
    pod: PodProcess = pod_factory(config=config)
    auth = {"Authorization": f"Bearer {KEY}"}
    body = json.dumps(infer_body()).encode()
    with httpx.Client(timeout=30) as c:
        ok = c.post(pod.infer_url, content=body, headers={**auth, "X-Request-Id": "req-abc.123"})
        assert ok.status_code == 200 and ok.headers["x-request-id"] == "req-abc.123"
        assert "sluiceway-queue-depth" in ok.headers
        long = c.post(pod.infer_url, content=body, headers={**auth, "X-Request-Id": "x" * 200})
        assert long.status_code == 200 and HEX16.fullmatch(long.headers["x-request-id"])
        spaced = c.post(pod.infer_url, content=body, headers={**auth, "X-Request-Id": "has space"})
        assert HEX16.fullmatch(spaced.headers["x-request-id"])
        made = c.post(pod.infer_url, content=body, headers=auth)
        assert HEX16.fullmatch(made.headers["x-request-id"])
        health = c.get(f"{pod.url}/v2/health/ready", headers={"X-Request-Id": "probe-1"})
        assert health.headers["x-request-id"] == "probe-1"
    # a fresh connection: the 401 is written pre-encoded by the transport on the headers
    with httpx.Client(timeout=30) as c:
        refused = c.post(
            pod.infer_url, content=body, headers={"Authorization": "Bearer sk-wrong", "X-Request-Id": "refused-1"}
        )
        assert refused.status_code == 401 and refused.headers["x-request-id"] == "refused-1"

    [line] = access_lines(pod, "req-abc.123")
    assert line["tenant"] == "ann" and line["model"] == "demo" and line["status"] == 200
    assert line["reason"] is None and line["bytesIn"] == len(body) and line["bytesOut"] == len(ok.content)
    assert line["queueWaitMs"] >= 0 and line["execMs"] >= 15  # the synthetic model holds 20 ms
    assert line["level"] == "INFO" and line["message"].startswith("access ")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])
    [denied] = access_lines(pod, "refused-1")
    assert denied["status"] == 401 and denied["reason"] == "unauthenticated"
    assert denied["queueWaitMs"] is None and denied["execMs"] is None
    assert access_lines(pod, long.headers["x-request-id"])  # the made id is the logged one
    text = pod.logs()
    assert KEY not in text and "sk-wrong" not in text and '"data"' not in text  # no key, no body
    for ln in lines(pod):  # every line is one JSON object
        doc = json.loads(ln)
        assert {"time", "level", "logger", "message"} <= doc.keys(), ln


def test_plain_logs_by_default_and_no_access_log(pod_factory: Any) -> None:
    pod: PodProcess = pod_factory("--model", "synthetic:1", "--model-name", "demo")
    r = httpx.post(pod.infer_url, json=infer_body(), headers={"X-Request-Id": "plain-1"}, timeout=30)
    assert r.status_code == 200 and r.headers["x-request-id"] == "plain-1"
    time.sleep(0.5)
    text = pod.logs()
    assert "sluiceway.access" not in text and "plain-1" not in text
    assert re.search(r"^\S+ \S+ INFO sluiceway\.service: model demo ready", text, re.M), text


def test_log_format_flag(pod_factory: Any) -> None:
    pod: PodProcess = pod_factory("--model", "synthetic:1", "--model-name", "demo", "--log-format", "json")
    ready = [json.loads(ln) for ln in lines(pod) if '"sluiceway.service"' in ln]
    assert any(d["message"].startswith("model demo ready") for d in ready), pod.logs()


# ---------------------------------------------------------------------------- tracing


class _Receiver(http.server.BaseHTTPRequestHandler):
    """A minimal OTLP/HTTP (protobuf) traces receiver."""

    spans: list[Any] = []

    def do_POST(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        raw = self.rfile.read(int(self.headers["content-length"]))
        if self.headers.get("content-encoding") == "gzip":
            raw = gzip.decompress(raw)
        req = ExportTraceServiceRequest()
        req.ParseFromString(raw)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                type(self).spans.extend(ss.spans)
        out = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def otlp_receiver() -> Iterator[tuple[str, list[Any]]]:
    pytest.importorskip("opentelemetry.proto", reason="needs the opentelemetry-proto package")
    pytest.importorskip("opentelemetry.sdk", reason="needs the opentelemetry-sdk package")
    pytest.importorskip(
        "opentelemetry.exporter.otlp.proto.http", reason="needs the opentelemetry-exporter-otlp-proto-http package"
    )
    spans: list[Any] = []
    handler = type("Receiver", (_Receiver,), {"spans": spans})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1/traces", spans
    srv.shutdown()


def test_spans_arrive_with_the_callers_parent(pod_factory: Any, otlp_receiver: tuple[str, list[Any]]) -> None:
    endpoint, spans = otlp_receiver
    config = {
        "model": {"spec": "synthetic:30", "name": "demo", "warmupIterations": 1},
        "concurrency": {"permits": 1},
        "tracing": {"endpoint": endpoint, "sampleRatio": 1.0},
    }
    pod: PodProcess = pod_factory(config=config)
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    traceparent = f"00-{trace_id}-{parent_id}-01"
    with httpx.Client(timeout=30) as c:
        r = c.post(pod.infer_url, json=infer_body(), headers={"traceparent": traceparent, "X-Request-Id": "traced-1"})
        assert r.status_code == 200
        untraced = c.post(pod.infer_url, json=infer_body())  # no traceparent: a root span of its own
        assert untraced.status_code == 200
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(spans) < 6:
        time.sleep(0.2)
    by_trace = [s for s in spans if s.trace_id.hex() == trace_id]
    names = sorted(s.name for s in by_trace)
    assert names == ["execution", "infer", "queue-wait"], (names, len(spans))
    [root] = [s for s in by_trace if s.name == "infer"]
    assert root.parent_span_id.hex() == parent_id
    attrs = {a.key: a.value for a in root.attributes}
    assert attrs["sluiceway.request_id"].string_value == "traced-1"
    assert attrs["http.response.status_code"].int_value == 200
    for child in by_trace:
        if child.name != "infer":
            assert child.parent_span_id == root.span_id, child.name
            assert root.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano
    [execution] = [s for s in by_trace if s.name == "execution"]
    assert execution.end_time_unix_nano - execution.start_time_unix_nano >= 25_000_000  # the model's 30 ms
    others = [s for s in spans if s.trace_id.hex() != trace_id and s.name == "infer"]
    assert len(others) == 1 and not others[0].parent_span_id  # a root: no caller's trace


# ---------------------------------------------------------------------------- tritonclient


def test_tritonclient_priority_and_timeout_are_honoured(pod_factory: Any) -> None:
    tc = pytest.importorskip("tritonclient.http", reason="needs the tritonclient[http] package")
    config = {
        "model": {"spec": "synthetic:600", "name": "demo", "warmupIterations": 1},
        "concurrency": {"permits": 1},
        "queue": {"maxDepth": 8, "timeoutSeconds": 30},
    }
    pod: PodProcess = pod_factory(config=config)
    client = tc.InferenceServerClient(url=f"127.0.0.1:{pod.port}", concurrency=2)
    rows = np.ones((1, 4), dtype=np.float32)
    inp = tc.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(rows, binary_data=False)
    # Triton's levels map onto the classes in order: 3 is the third ("batch"), 9 is past the last
    client.infer("demo", [inp], priority=3)
    client.infer("demo", [inp], priority=9)
    assert pod.metric("sluiceway_requests_total", priority="batch", code="200", tenant="anonymous") == 2.0
    # 1 is the first class ("critical"), above the anonymous tenant's ceiling: 403, as the header would get
    with pytest.raises(tc.InferenceServerException) as denied:
        client.infer("demo", [inp], priority=1)
    assert "[403]" in str(denied.value) and "critical" in str(denied.value)
    # the permit busy for 600 ms: a 50 ms timeout (microseconds) cannot be met, answered at once
    busy = client.async_infer("demo", [inp])
    time.sleep(0.1)
    t0 = time.monotonic()
    with pytest.raises(tc.InferenceServerException) as e:
        client.infer("demo", [inp], timeout=50_000)
    took = time.monotonic() - t0
    assert "deadline" in str(e.value) and took < 0.4, (str(e.value), took)
    busy.get_result()
    client.close()


# ---------------------------------------------------------------------------- body budget gauge


def test_inflight_body_bytes_gauge(pod_factory: Any) -> None:
    pod: PodProcess = pod_factory("--model", "synthetic:1", "--model-name", "demo")
    assert pod.metric("sluiceway_inflight_body_bytes") == 0.0
    s = socket.create_connection(("127.0.0.1", pod.port))
    head = (
        "POST /v2/models/demo/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        "content-length: 10000\r\n\r\n"
    )
    s.sendall(head.encode() + b'{"inputs": ')  # the rest never comes
    deadline = time.monotonic() + 10
    while pod.metric("sluiceway_inflight_body_bytes") != 10000.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pod.metric("sluiceway_inflight_body_bytes") == 10000.0
    s.close()
    deadline = time.monotonic() + 10
    while pod.metric("sluiceway_inflight_body_bytes") != 0.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pod.metric("sluiceway_inflight_body_bytes") == 0.0
