"""The committed gRPC stubs are what grpcio-tools generates from the committed proto, and the proto
keeps KEDA's field numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
from sluiceway_scaler import externalscaler_pb2 as pb
from sluiceway_scaler import stubs


def test_committed_stubs_match_regenerated(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools not installed: pip install grpcio-tools")
    for generated in stubs.generate(tmp_path):
        committed = stubs.HERE / generated.name
        assert committed.exists(), f"{committed} missing: run python -m sluiceway_scaler.stubs"
        assert committed.read_bytes() == generated.read_bytes(), (
            f"{committed.name} differs from protoc output: run python -m sluiceway_scaler.stubs"
        )


# (message, field, number, type) as in kedacore/keda pkg/scalers/externalscaler/externalscaler.proto
KEDA_FIELDS = [
    ("ScaledObjectRef", "name", 1, "string"),
    ("ScaledObjectRef", "namespace", 2, "string"),
    ("ScaledObjectRef", "scalerMetadata", 3, "map"),
    ("IsActiveResponse", "result", 1, "bool"),
    ("GetMetricSpecResponse", "metricSpecs", 1, "MetricSpec"),
    ("MetricSpec", "metricName", 1, "string"),
    ("MetricSpec", "targetSize", 2, "int64"),
    ("MetricSpec", "targetSizeFloat", 3, "double"),
    ("GetMetricsRequest", "scaledObjectRef", 1, "ScaledObjectRef"),
    ("GetMetricsRequest", "metricName", 2, "string"),
    ("GetMetricsResponse", "metricValues", 1, "MetricValue"),
    ("MetricValue", "metricName", 1, "string"),
    ("MetricValue", "metricValue", 2, "int64"),
    ("MetricValue", "metricValueFloat", 3, "double"),
]

_SCALAR = {9: "string", 8: "bool", 3: "int64", 1: "double"}


@pytest.mark.parametrize(("message", "field", "number", "kind"), KEDA_FIELDS)
def test_field_numbers_match_keda(message: str, field: str, number: int, kind: str) -> None:
    desc = pb.DESCRIPTOR.message_types_by_name[message]
    f = desc.fields_by_name[field]
    assert f.number == number
    if kind == "map":
        assert f.message_type.GetOptions().map_entry
    elif f.message_type is not None:
        assert f.message_type.name == kind
    else:
        assert _SCALAR[f.type] == kind
    assert len(desc.fields) == len([x for x in KEDA_FIELDS if x[0] == message])


def test_service_shape_matches_keda() -> None:
    svc = pb.DESCRIPTOR.services_by_name["ExternalScaler"]
    assert svc.full_name == "externalscaler.ExternalScaler"
    methods = {m.name: m for m in svc.methods}
    assert set(methods) == {"IsActive", "StreamIsActive", "GetMetricSpec", "GetMetrics"}
    assert methods["IsActive"].input_type.name == "ScaledObjectRef"
    assert methods["StreamIsActive"].output_type.name == "IsActiveResponse"
    assert methods["GetMetricSpec"].output_type.name == "GetMetricSpecResponse"
    assert methods["GetMetrics"].input_type.name == "GetMetricsRequest"
    # Only StreamIsActive streams (server side).
    assert methods["StreamIsActive"].server_streaming and not methods["StreamIsActive"].client_streaming
    assert not any(m.server_streaming for n, m in methods.items() if n != "StreamIsActive")
