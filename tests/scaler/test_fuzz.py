"""Fuzz tests (Hypothesis) of the scaler's wire formats (issue 18): trigger metadata parsing, and the
real gRPC service with arbitrary metadata maps, refs and metric names. Whatever arrives, the answer
is one of the documented status codes, never UNKNOWN or INTERNAL."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from sluiceway_scaler import externalscaler_pb2 as pb
from sluiceway_scaler import externalscaler_pb2_grpc as pb_grpc
from sluiceway_scaler.access import AllowList
from sluiceway_scaler.errors import InvalidMetadata
from sluiceway_scaler.metadata import KNOWN_KEYS, parse_metadata
from sluiceway_scaler.metrics import ScalerMetrics
from sluiceway_scaler.service import ExternalScalerService, serve

#: Every code the scaler documents (errors.py); UNKNOWN and INTERNAL are bugs.
DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}

# Values near the grammar: numbers of every spelling, durations, URLs, booleans, and noise.
_VALUES = st.one_of(
    st.text(max_size=40),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "0", "1", "1e400", "-0", "nan", "inf", "1_000", "٣", "1.5", "0x10", "true",
                     "false", "TRUE", "500ms", "1m", "2h", "-1s", "1e9s", "5", "http://", "https://h:99999",
                     "http://127.0.0.1:1", "http://[::1", "ftp://x", "a,b", "team-a", "team-b", "demo",
                     "x" * 300]),
)
_KEYS = st.one_of(st.sampled_from(sorted(KNOWN_KEYS)), st.text(max_size=12))
_METADATA = st.dictionaries(_KEYS, _VALUES, max_size=12)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(md=_METADATA, ns=st.one_of(st.just("team-a"), st.text(max_size=70)))
def test_parse_metadata_raises_only_invalid_metadata(md: dict[str, str], ns: str) -> None:
    try:
        cfg = parse_metadata(md, ns)
    except InvalidMetadata as e:
        assert e.message.startswith(f"scalerMetadata.{e.field}:")
        return
    assert cfg.namespace == ns.strip()
    assert cfg.spec.min_replicas <= cfg.spec.max_replicas


def _base(address: str) -> dict[str, str]:
    return {"inferenceService": "demo", "prometheusAddress": address, "targetQueueDepthPerReplica": "4",
            "queryTimeout": "100ms"}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[pb_grpc.ExternalScalerStub, str]]:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: Prometheus refuses at once
    address = f"http://127.0.0.1:{dead.getsockname()[1]}"
    service = ExternalScalerService(ScalerMetrics(CollectorRegistry()), allowed=AllowList.build([address]),
                                    max_entries=64)
    server, port = serve(service, "127.0.0.1", 0, workers=8)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield pb_grpc.ExternalScalerStub(channel), address
    finally:
        service.stop()
        channel.close()
        server.stop(1).wait()
        dead.close()


def _code(call: object) -> grpc.StatusCode:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as e:
        return e.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(
    extra=_METADATA,
    keep_base=st.booleans(),
    name=st.text(max_size=30),
    namespace=st.one_of(st.just("team-a"), st.text(max_size=30)),
    metric=st.one_of(st.just(""), st.just("s0-sluiceway-replicas-team-a-demo"), st.text(max_size=30)),
)
def test_grpc_answers_only_documented_codes(
    served: tuple[pb_grpc.ExternalScalerStub, str],
    extra: dict[str, str],
    keep_base: bool,
    name: str,
    namespace: str,
    metric: str,
) -> None:
    stub, address = served
    md = (_base(address) if keep_base else {}) | extra
    r = pb.ScaledObjectRef(name=name, namespace=namespace, scalerMetadata=md)
    codes = [
        _code(lambda: stub.IsActive(r, timeout=10)),
        _code(lambda: stub.GetMetricSpec(r, timeout=10)),
        _code(lambda: stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=r, metricName=metric), timeout=10)),
    ]
    assert set(codes) <= DOCUMENTED, (md, codes)
