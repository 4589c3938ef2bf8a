"""Fuzz tests (Hypothesis) of the quota coordinator's wire format (issue 18): any JSON value, any
mutation of a valid request and any bytes either parse or raise QuotaError (never another
exception), and the real HTTP server answers every body with a 2xx/4xx within a bounded time, never
a 5xx or a dropped connection."""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from sluiceway_core.quota import LeaseGrant, LeaseRequest, QuotaError, TenantQuota
from sluiceway_core.quota_charter import QuotaCharter, sign_charter
from sluiceway_scaler.quota_server import QuotaCoordinator, serve_quota

KEY = b"fuzz-quota-key-0123456789abcdef-0123456789"
CHARTER = QuotaCharter("ns/demo", {"t": TenantQuota(30.0, 30, 4), "u": TenantQuota(None, None, 2)}, 8)
SIG = sign_charter(KEY, CHARTER)

numbers = st.one_of(
    st.integers(-(10**20), 10**20),
    st.integers(min_value=10**300, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
)
json_values = st.recursive(
    st.one_of(numbers, st.text(max_size=20)),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=30,
)
keys = st.sampled_from(
    ["pod", "charter", "signature", "demand", "held", "joining", "offeredRate", "admittedRate", "queued",
     "inflight", "rate", "burst", "maxConcurrent", "fraction", "t", "u", "service", "quotas", "maxPods"]
)
mutated = st.recursive(
    json_values,
    lambda children: st.dictionaries(keys, children, max_size=6),
    max_leaves=40,
)


def valid_request(pod: str = "pod-a") -> dict[str, Any]:
    return {
        "pod": pod,
        "charter": CHARTER.to_json(),
        "signature": SIG,
        "demand": {"t": {"offeredRate": 40.0, "admittedRate": 30.0, "queued": 2, "inflight": 1}},
        "held": {},
        "joining": False,
    }


@hsettings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=st.one_of(json_values, mutated))
def test_parsing_any_json_raises_nothing_but_quota_error(doc: Any) -> None:
    for parse in (LeaseRequest.from_json, LeaseGrant.from_json, QuotaCharter.from_json):
        with contextlib.suppress(QuotaError):
            parse(doc)


@hsettings(max_examples=300, deadline=None)
@given(path=st.lists(st.sampled_from(["demand", "t", "held", "charter", "quotas"]), max_size=3), value=json_values)
def test_a_valid_request_with_one_field_replaced_parses_or_is_a_quota_error(path: list[str], value: Any) -> None:
    doc = valid_request()
    node: Any = doc
    for k in path:
        if isinstance(node, dict) and isinstance(node.get(k), dict):
            node = node[k]
    if isinstance(node, dict):
        node["x" if not node else sorted(node)[0]] = value
    with contextlib.suppress(QuotaError):
        LeaseRequest.from_json(doc)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, int]]:
    coord = QuotaCoordinator(3.0, key=KEY)
    srv, port, thread = serve_quota(coord, "127.0.0.1", 0)
    yield "127.0.0.1", port
    srv.shutdown()
    srv.server_close()
    thread.join(10)


def _post(where: tuple[str, int], body: bytes) -> int:
    conn = http.client.HTTPConnection(*where, timeout=10)
    try:
        conn.request("POST", "/v1/lease", body=body, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


bodies = st.one_of(
    st.binary(min_size=1, max_size=2000),
    st.one_of(json_values, mutated).map(lambda d: json.dumps(d).encode()),
    st.builds(
        lambda n, c: (c * n).encode(), st.integers(1, 60_000), st.sampled_from(["[", '{"a":', "9", "-", '"'])
    ),
    st.fixed_dictionaries({}).map(lambda _d: json.dumps(valid_request()).encode()),
    st.tuples(st.sampled_from(["offeredRate", "queued", "inflight"]), numbers).map(
        lambda kv: json.dumps({**valid_request(), "demand": {"t": {kv[0]: kv[1]}}}).encode()
    ),
)


@hsettings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_the_coordinator_answers_every_body_without_a_5xx_in_bounded_time(
    server: tuple[str, int], body: bytes
) -> None:
    t0 = time.monotonic()
    status = _post(server, body)
    assert status in (200, 400, 403, 413, 429), (status, body[:100])
    assert time.monotonic() - t0 < 5.0  # bounded, well under the client's 10 s timeout


def test_the_coordinator_still_grants_after_the_fuzzing(server: tuple[str, int]) -> None:
    assert _post(server, json.dumps(valid_request("after")).encode()) == 200
