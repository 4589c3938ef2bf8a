"""Issue 18 item 1: the operator reads Prometheus only through the shared client, with an allow-list,
a total deadline and a size cap, and never echoes what a server answered.

Real HTTP servers on loopback (a hostile one per test) and the real :class:`Reconciler`; the API
server is the in-memory fake of test_operator_reconcile_unit (the seam under test is HTTP)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sluiceway_core.urls import UrlAllowList
from sluiceway_operator.policy import Policy
from sluiceway_operator.prom import PrometheusError, query_scalar, query_vector
from sluiceway_operator.reconcile import Reconciler
from sluiceway_operator.settings import OperatorConfig
from test_operator_reconcile_unit import FakeKube

SECRET = "AKIAEXAMPLE-credentials-aws_secret_access_key=wJalrXUtnFEMI"


class Hostile(BaseHTTPRequestHandler):
    mode = "creds"
    requests: list[str] = []
    sent: list[int] = []

    def do_GET(self) -> None:
        self.requests.append(self.path)
        if self.mode == "creds":
            body = f'{{"Code":"Success","Type":"AWS-HMAC","SecretAccessKey":"{SECRET}"}}'.encode()
            self._send(200, body)
        elif self.mode == "creds-error":
            self._send(200, json.dumps({"status": "error", "error": SECRET}).encode())
        elif self.mode == "creds-500":
            self._send(500, SECRET.encode())
        elif self.mode == "trickle":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            try:
                for _ in range(100):  # one byte every 0.2 s: each read is short, the answer endless
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                return
        elif self.mode == "slow":  # a valid, empty answer, each just inside one query's timeout
            time.sleep(0.4)
            self._send(200, b'{"status":"success","data":{"resultType":"vector","result":[]}}')
        elif self.mode == "huge":
            self.send_response(200)
            self.send_header("Content-Length", str(256 << 20))
            self.end_headers()
            chunk = b'{"status":"success","data":' + b" " * (64 << 10)
            total = 0
            try:
                while total < 256 << 20:
                    self.wfile.write(chunk)
                    total += len(chunk)
            except OSError:
                pass
            self.sent.append(total)

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def hostile() -> Iterator[tuple[str, type[Hostile]]]:
    handler = type("H", (Hostile,), {"requests": [], "sent": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def _body(**autoscaling: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "a", "namespace": "n", "uid": "u1", "generation": 1},
        "spec": {
            "model": {"image": "i:1", "format": "demo", "source": "demo"},
            "autoscaling": {"engine": "builtin", **autoscaling},
        },
    }


def _everything(kube: FakeKube, outcome: Any) -> str:
    return json.dumps(kube.status) + json.dumps(kube.events) + repr(outcome)


@pytest.mark.parametrize("mode", ["creds", "creds-error", "creds-500"])
def test_a_hostile_answer_never_reaches_status_events_or_logs(
    hostile: tuple[str, type[Hostile]], mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    url, handler = hostile
    handler.mode = mode
    kube = FakeKube()
    rec = Reconciler(OperatorConfig(prometheus_url=url, policy=Policy.open()), kube)  # type: ignore[arg-type]
    body = _body()
    with caplog.at_level(logging.DEBUG):
        rec.apply_children(body)
        outcome = rec.refresh_signals(body)
    assert handler.requests, "the operator's own Prometheus is queried"
    assert outcome is not None and outcome.prometheus_error is not None
    print(f"{mode}: status message: {outcome.prometheus_error}")
    seen = _everything(kube, outcome) + caplog.text
    assert "credentials" not in seen and "AKIA" not in seen and "wJalr" not in seen


def test_a_spec_address_off_the_list_is_refused_and_never_fetched(hostile: tuple[str, type[Hostile]]) -> None:
    url, handler = hostile
    kube = FakeKube()
    config = OperatorConfig(prometheus_url="http://prometheus.monitoring.svc:9090", policy=Policy.open())
    rec = Reconciler(config, kube)  # type: ignore[arg-type]
    body = _body(prometheusAddress=f"{url}/latest/meta-data/iam/security-credentials/role?x=")
    outcome = rec.apply_children(body)
    assert outcome.config_error is not None and outcome.config_error[0] == "PrometheusAddressNotAllowed"
    assert "SLUICEWAY_ALLOWED_PROMETHEUS" in outcome.config_error[1]
    assert kube.events == ["PrometheusAddressNotAllowed"]
    assert kube.applied == []
    signals = rec.refresh_signals(body)
    assert signals is not None and signals.prometheus_error is not None
    assert handler.requests == []  # no connection was ever made
    # Allowed by the operator's setting, the same address is read.
    allowed = OperatorConfig(allowed_prometheus=(url,), policy=Policy.open())
    ok = Reconciler(allowed, FakeKube()).apply_children(_body(prometheusAddress=url))  # type: ignore[arg-type]
    assert ok.config_error is None


@pytest.mark.parametrize("protocol", ["HTTP/1.1", "HTTP/1.0"])
def test_a_trickling_server_holds_a_worker_no_longer_than_the_deadline(
    hostile: tuple[str, type[Hostile]], protocol: str
) -> None:
    url, handler = hostile
    handler.mode = "trickle"
    handler.protocol_version = protocol
    kube = FakeKube()
    config = OperatorConfig(prometheus_url=url, prometheus_timeout=1.0, policy=Policy.open())
    rec = Reconciler(config, kube)  # type: ignore[arg-type]
    body = _body()
    rec.apply_children(body)
    t0 = time.monotonic()
    outcome = rec.refresh_signals(body)
    elapsed = time.monotonic() - t0
    print(f"trickling Prometheus: the signals path returned after {elapsed:.2f} s (deadline 1 s)")
    assert outcome is not None and outcome.prometheus_error is not None
    assert "no complete answer" in outcome.prometheus_error
    assert elapsed < 3.0  # one query's deadline (1 s) and slack for a loaded machine; not 20 s


def test_one_deadline_for_the_whole_signals_pass(hostile: tuple[str, type[Hostile]]) -> None:
    """Nine queries each answered inside their own timeout (0.4 s of 1 s) would hold the worker
    3.6 s; one deadline for the pass ends it at 1 s."""
    url, handler = hostile
    handler.mode = "slow"
    handler.protocol_version = "HTTP/1.1"
    config = OperatorConfig(prometheus_url=url, prometheus_timeout=1.0, policy=Policy.open())
    rec = Reconciler(config, FakeKube())  # type: ignore[arg-type]
    body = _body()
    rec.apply_children(body)
    t0 = time.monotonic()
    outcome = rec.refresh_signals(body)
    elapsed = time.monotonic() - t0
    print(f"slow Prometheus: {len(handler.requests)} queries, the pass returned after {elapsed:.2f} s (deadline 1 s)")
    assert outcome is not None and outcome.prometheus_error is not None
    assert elapsed < 2.0


@pytest.mark.parametrize("protocol", ["HTTP/1.1", "HTTP/1.0"])
def test_a_huge_answer_is_capped(hostile: tuple[str, type[Hostile]], protocol: str) -> None:
    url, handler = hostile
    handler.mode = "huge"
    # HTTP/1.0 too: the answer then owns the socket, and httpget must still close it.
    handler.protocol_version = protocol
    allow = UrlAllowList.build("test", [url])
    with pytest.raises(PrometheusError) as err:
        query_scalar(url, "up", allow=allow, timeout=20)
    deadline = time.monotonic() + 10
    while not handler.sent and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"huge answer: {err.value}; the server got {handler.sent[0] >> 20} MiB out of 256 MiB")
    assert handler.sent[0] < 64 << 20  # the client stopped reading near the 1 MiB cap


# ------------------------------------------------------------------ fuzz: the client's wire format


class Fuzz(BaseHTTPRequestHandler):
    status = 200
    body = b""

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Fuzz)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


MARK = "ZQXJ"  # in every generated body: the message must never contain it

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8).map(lambda t: MARK + t),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
_sample = st.fixed_dictionaries(
    {
        "metric": st.dictionaries(st.sampled_from(["tenant", MARK]), st.text(max_size=5).map(lambda t: MARK + t)),
        "value": st.lists(_json, min_size=0, max_size=3),
    }
)
_answer = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["success", "error", MARK]),
        "data": st.fixed_dictionaries(
            {"resultType": st.sampled_from(["vector", "matrix", MARK]), "result": st.lists(_sample, max_size=3) | _json}
        )
        | _json,
    }
).map(lambda d: json.dumps(d).encode())
_bodies = (
    _answer | _json.map(lambda j: json.dumps(j).encode()) | st.binary(max_size=200).map(lambda b: MARK.encode() + b)
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=st.sampled_from([200, 200, 200, 204, 301, 400, 404, 500, 503]), body=_bodies, vector=st.booleans())
def test_fuzz_any_answer_is_a_value_or_a_prom_error_without_its_text(
    fuzz_server: str, status: int, body: bytes, vector: bool
) -> None:
    Fuzz.status, Fuzz.body = status, body
    allow = UrlAllowList.build("test", [fuzz_server])
    try:
        if vector:
            out: Any = query_vector(fuzz_server, "q", "tenant", allow=allow, timeout=5)
            assert all(isinstance(v, float) for v in out.values())
        else:
            out = query_scalar(fuzz_server, "q", allow=allow, timeout=5)
            assert out is None or isinstance(out, float)
    except PrometheusError as err:
        assert MARK not in str(err)
