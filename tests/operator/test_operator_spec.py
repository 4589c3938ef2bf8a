"""The spec model: agrees with the CRD's defaults and rejects what the CRD's CEL rejects."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from operator_support import apply_defaults, case_names, crd_schema, load_case
from sluiceway_core.units import UnitError, parse_duration, parse_quantity, parse_rate
from sluiceway_operator.spec import SpecError, parse_spec


@pytest.mark.parametrize("name", case_names())
def test_model_defaults_equal_crd_defaults(name: str) -> None:
    """What the API server stores (CRD defaults applied) parses to the same model as the raw spec."""
    spec = load_case(name)["spec"]
    defaulted = apply_defaults(spec, crd_schema()["properties"]["spec"])
    assert defaulted != spec  # defaulting did something
    assert parse_spec(defaulted) == parse_spec(spec)


def test_every_schema_field_has_a_description() -> None:
    missing: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if path.count(".") > 0 and "description" not in node and not path.endswith("metadata"):
            missing.append(path)
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, f"{path}.{key}")
        if "items" in node and node["items"].get("properties"):
            walk(node["items"], f"{path}[]")

    walk(crd_schema(), "root")
    assert missing == []


def test_no_floats_in_spec_schema() -> None:
    found: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("type") == "number":
            found.append(path)
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, f"{path}.{key}")
        if "items" in node:
            walk(node["items"], f"{path}[]")

    walk(crd_schema()["properties"]["spec"], "spec")
    assert found == []


@pytest.mark.parametrize(
    ("text", "seconds"), [("500ms", 0.5), ("5s", 5.0), ("1m30s", 90.0), ("2h", 7200.0), ("0s", 0.0), ("1.5m", 90.0)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5 s", "-1s", "1d", "s", "1.s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(UnitError):
        parse_duration(text)


def test_units() -> None:
    assert parse_rate("30/m") == 0.5
    assert parse_rate("10/s") == 10.0
    assert parse_quantity("1Gi") == 1024**3
    assert parse_quantity("500M") == 500_000_000
    assert parse_quantity(7) == 7


BASE = {"model": {"image": "i", "format": "synthetic", "source": "synthetic:1"}}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, "minReplicas must be <="),
        ({"timeouts": {"queue": "10s", "request": "5s"}}, "timeouts.queue must be shorter"),
        ({"priorities": {"classes": ["a", "a"], "default": "a"}}, "must be unique"),
        ({"priorities": {"classes": ["a"], "default": "b"}}, "priorities.default"),
        ({"tenants": [{"name": "x", "keySecretRef": {"name": "s"}, "maxPriority": "vip"}]}, "maxPriority"),
        (
            {
                "tenants": [
                    {"name": "x", "keySecretRef": {"name": "s"}},
                    {"name": "x", "keySecretRef": {"name": "t"}},
                ]
            },
            "tenant names must be unique",
        ),
        ({"tenants": [{"name": "x"}]}, "only the anonymous tenant"),
        ({"queue": {"targetWait": "9s"}}, "targetWait"),
        ({"surprise": 1}, "spec.surprise"),
        # The release window must outlast the stabilisation window, else the policy ignores it.
        # (90s: the default stabilizationWindow since issue 21; equal is not longer)
        ({"autoscaling": {"scaleDown": {"releaseWindow": "90s"}}}, "releaseWindow must be 0s \\(off\\) or longer"),
        (
            {"autoscaling": {"scaleDown": {"stabilizationWindow": "30m", "releaseWindow": "20m"}}},
            "releaseWindow must be 0s \\(off\\) or longer than autoscaling.scaleDown.stabilizationWindow",
        ),
        ({"autoscaling": {"scaleDown": {"releaseWindow": "25h"}}}, "releaseWindow must be at most 24h"),
        (
            {"autoscaling": {"scaleDown": {"releaseWindow": "soon"}}},
            "scaleDown.releaseWindow: 'soon' is not a duration",
        ),
    ],
)
def test_cross_field_errors_name_the_field(patch: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec({**BASE, **patch})


@pytest.mark.parametrize(
    ("release", "seconds"), [(None, 1200.0), ("30m", 1800.0), ("1h", 3600.0), ("0s", None), ("0m", None)]
)
def test_release_window_default_and_off(release: str | None, seconds: float | None) -> None:
    """Default 20m (the policy's 1200 s); ``0s`` turns the release off."""
    down = {} if release is None else {"releaseWindow": release}
    spec = parse_spec({**BASE, "autoscaling": {"scaleDown": down}})
    assert spec.autoscaling.scale_down.release_window_seconds == seconds


# ------------------------------------------------------------------ what the API server would refuse


def _inputs(*tensors: dict[str, Any]) -> dict[str, Any]:
    return {"model": {**BASE["model"], "inputs": list(tensors)}}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"resources": {"memory": "-1Gi"}}, "non-negative quantity"),
        ({"resources": {"cpu": -2}}, "non-negative quantity"),
        ({"resources": {"cpu": "1.5.5"}}, "non-negative quantity"),
        ({"concurrency": {"memoryReserve": "lots"}}, "non-negative quantity"),
        ({"resources": {"gpuResourceName": "gpu"}}, "extended resource name"),
        ({"resources": {"gpuResourceName": "kubernetes.io/gpu"}}, "extended resource name"),
        ({"placement": {"nodeSelector": {"bad key": "x"}}}, "not a valid label key"),
        ({"placement": {"nodeSelector": {"example.com/" + "k" * 64: "x"}}}, "not a valid label key"),
        ({"placement": {"nodeSelector": {"gpu": "v" * 64}}}, "not a valid label value"),
        ({"placement": {"tolerations": [{"operator": "Exists", "key": "k", "value": "v"}]}}, "no value"),
        ({"placement": {"tolerations": [{"value": "v"}]}}, "without a key needs operator Exists"),
        ({"placement": {"tolerations": [{"key": "k", "tolerationSeconds": 5}]}}, "NoExecute"),
        ({"placement": {"tolerations": [{"key": "bad key", "operator": "Exists"}]}}, "label key"),
        ({"placement": {"priorityClassName": "High_Priority"}}, "not a valid object name"),
        ({"placement": {"runtimeClassName": "Nvidia"}}, "not a valid object name"),
        ({"serviceAccountName": "my sa"}, "not a valid object name"),
        ({"imagePullSecrets": ["reg cred"]}, "not a valid object name"),
        ({"tenants": [{"name": "t", "keySecretRef": {"name": "Bad/Name"}}]}, "not a valid object name"),
        ({"model": {**BASE["model"], "persistentVolumeClaim": {"claimName": "w_x"}}}, "object name"),
        ({"model": {**BASE["model"], "persistentVolumeClaim": {"claimName": "w", "mountPath": "/tmp"}}}, "hide"),
        ({"model": {**BASE["model"], "persistentVolumeClaim": {"claimName": "w", "mountPath": "/etc"}}}, "hide"),
        ({"model": {**BASE["model"], "persistentVolumeClaim": {"claimName": "w", "mountPath": "/"}}}, "absolute"),
        (
            {"model": {**BASE["model"], "persistentVolumeClaim": {"claimName": "w", "mountPath": "/a/../tmp"}}},
            "'..'",
        ),
        ({"model": {"image": "   ", "format": "synthetic", "source": "synthetic:1"}}, "model.image"),
        ({"model": {"image": "reg/img:1 ", "format": "synthetic", "source": "synthetic:1"}}, "model.image"),
        ({"model": {**BASE["model"], "fallback": {"source": "small-model"}}}, "not a model the pod can load"),
        ({"model": {"image": "i", "format": "torchscript", "source": "model.pt"}}, "does not match format"),
        ({"autoscaling": {"minReplicas": 0}}, "minReplicas 0 needs gateway.enabled: true"),
        ({"autoscaling": {"minReplicas": 0, "engine": "builtin"}, "gateway": {"enabled": True}}, "needs engine keda"),
        ({"autoscaling": {"minReplicas": 0, "engine": "none"}, "gateway": {"enabled": True}}, "needs engine keda"),
        ({"autoscaling": {"scaleToZeroAfter": "0s"}}, "scaleToZeroAfter must be within"),
        ({"autoscaling": {"scaleToZeroAfter": "soon"}}, "autoscaling.scaleToZeroAfter"),
        ({"gateway": {"startupEstimate": "2h"}}, "startupEstimate must be within"),
        ({"priorities": {"classes": ["a" * 33], "default": "a" * 33}}, "priorities.classes"),
        (
            {
                "placement": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In"}]}]
                            }
                        }
                    }
                }
            },
            "operator In needs values",
        ),
        ({"placement": {"affinity": {"nodeAfinity": {}}}}, "nodeAfinity: Extra inputs"),
        # Issue 13: the declared input contract and the adaptive permits (the CRD's CEL says the same).
        (_inputs({"name": "x", "shape": [-1, 3], "maxShape": [4]}), "must have the rank of shape"),
        (_inputs({"name": "x", "shape": [-1, 3], "maxShape": [4, 5]}), "must equal shape .* in every fixed dimension"),
        (_inputs({"name": "x", "shape": [-1, 3], "maxShape": [0, 3]}), "greater than or equal to 1"),
        (_inputs({"name": "x", "shape": [-1, 0]}), "-1 \\(any size\\) or >= 1"),
        (_inputs({"name": "x", "shape": [-2]}), "greater than or equal to -1"),
        (_inputs({"name": "x", "shape": [-1] * 9}), "at most 8 items"),
        (_inputs({"name": "x", "shape": []}), "at least 1 item"),
        (_inputs({"name": "x", "shape": [-1]}, {"name": "x", "shape": [-1]}), "model.inputs names must be unique"),
        (_inputs({"name": "x y", "shape": [-1]}), "model.inputs.0.name"),
        (_inputs({"name": "x", "shape": [-1], "datatype": "FP8"}), "model.inputs.0.datatype"),
        ({"concurrency": {"probeDuration": "11m"}}, "probeDuration must be at most 10m"),
        ({"concurrency": {"probeDuration": "soon"}}, "concurrency.probeDuration: 'soon' is not a duration"),
        ({"concurrency": {"adaptiveInterval": "0s"}}, "adaptiveInterval must be within \\(0, 1h\\]"),
        ({"concurrency": {"adaptiveInterval": "2h"}}, "adaptiveInterval must be within \\(0, 1h\\]"),
        ({"concurrency": {"probeSharePercent": 0}}, "concurrency.probeSharePercent"),
        ({"concurrency": {"probeSharePercent": 101}}, "concurrency.probeSharePercent"),
        (
            {"placement": {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}}}},
            "topologyKey",
        ),
        (
            {
                "placement": {
                    "affinity": {
                        "podAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {"weight": 101, "podAffinityTerm": {"topologyKey": "zone"}}
                            ]
                        }
                    }
                }
            },
            "weight",
        ),
    ],
)
def test_spec_refuses_what_the_api_server_or_the_pod_would(patch: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec({**BASE, **patch})


def _crd_accepts_string(schema: dict[str, Any], value: str) -> bool:
    import re

    if len(value) > schema.get("maxLength", 10**9) or len(value) < schema.get("minLength", 0):
        return False
    return re.search(schema["pattern"], value) is not None if "pattern" in schema else True


@pytest.mark.parametrize("length", [1, 2, 31, 32, 33, 63, 64])
def test_priority_class_name_limits_agree_with_the_pod(length: int) -> None:
    """The CRD accepts exactly the priority class names the pod's config accepts."""
    from sluiceway_core.config import ConfigError, build_config

    item = crd_schema()["properties"]["spec"]["properties"]["priorities"]["properties"]["classes"]["items"]
    name = "a" * length
    try:
        build_config({"priorities": {"classes": [name], "default": name}})
        pod_ok = True
    except ConfigError:
        pod_ok = False
    assert _crd_accepts_string(item, name) is pod_ok


@pytest.mark.parametrize("length", [1, 62, 63, 64])
def test_tenant_and_model_name_limits_agree_with_the_pod(length: int) -> None:
    from sluiceway_core.config import ConfigError, build_config

    spec = crd_schema()["properties"]["spec"]["properties"]
    tenant = spec["tenants"]["items"]["properties"]["name"]
    model = spec["model"]["properties"]["name"]
    for schema, layer in (
        (tenant, {"tenants": {"tenants": [{"name": "t" * length}]}}),
        (model, {"model": {"name": "m" * length}}),
    ):
        value = "t" * length if schema is tenant else "m" * length
        try:
            build_config(layer)
            pod_ok = True
        except ConfigError:
            pod_ok = False
        assert _crd_accepts_string(schema, value) is pod_ok, (schema, length)


def test_numeric_limits_agree_with_the_pod() -> None:
    """Every CRD integer that reaches the pod config has the pod's own bounds."""
    import annotated_types
    from sluiceway_core import config as pc

    spec = crd_schema()["properties"]["spec"]["properties"]
    pairs = [
        (spec["model"]["properties"]["warmupIterations"], pc.ModelConfig, "warmup_iterations"),
        (spec["model"]["properties"]["fallback"]["properties"]["permits"], pc.FallbackModelConfig, "permits"),
        (spec["concurrency"]["properties"]["cpuDefault"], pc.ConcurrencyConfig, "cpu_default"),
        (spec["concurrency"]["properties"]["maxPermits"], pc.ConcurrencyConfig, "max_permits"),
        (spec["batching"]["properties"]["maxAutoBatchSize"], pc.BatchingConfig, "max_auto_batch_size"),
        (spec["degradation"]["properties"]["cache"]["properties"]["maxEntries"], pc.CacheConfig, "max_entries"),
        (spec["access"]["properties"]["defaults"]["properties"]["weight"], pc.TenantLimits, "weight"),
    ]
    for schema, model, field in pairs:
        meta = model.model_fields[field].metadata
        ge = next((m.ge for m in meta if isinstance(m, annotated_types.Ge)), None)
        le = next((m.le for m in meta if isinstance(m, annotated_types.Le)), None)
        assert schema.get("minimum") == ge, (model.__name__, field)
        if le is not None:
            assert schema.get("maximum", 10**18) <= le, (model.__name__, field)


# ------------------------------------------------------------------ issue 13: shapes and adaptive permits

_DIM = st.sampled_from([-1, 1, 2, 3])


@settings(max_examples=300, deadline=None)
@given(
    shape=st.lists(_DIM, min_size=1, max_size=8),
    max_shape=st.lists(st.integers(min_value=-1, max_value=4), min_size=1, max_size=8),
)
def test_max_shape_rule_agrees_with_the_pod(shape: list[int], max_shape: list[int]) -> None:
    """The operator accepts exactly the (shape, maxShape) pairs the pod's config accepts."""
    from sluiceway_core.config import ConfigError, build_config

    tensor = {"name": "x", "shape": shape, "maxShape": max_shape}
    try:
        build_config({"model": {"inputs": [tensor]}})
        pod_ok = True
    except ConfigError:
        pod_ok = False
    try:
        parse_spec(_inputs(tensor))
        spec_ok = True
    except SpecError:
        spec_ok = False
    assert spec_ok is pod_ok


def test_concurrency_limits_agree_with_the_pod() -> None:
    """The CRD's bounds on the probe and the adaptive limit are the pod's bounds, in the CRD's units."""
    import annotated_types
    from sluiceway_core import config as pc

    c = crd_schema()["properties"]["spec"]["properties"]["concurrency"]["properties"]
    fields = pc.ConcurrencyConfig.model_fields

    def bound(field: str, kind: type) -> float:
        return next(getattr(m, kind.__name__.lower()) for m in fields[field].metadata if isinstance(m, kind))

    assert bound("probe_seconds", annotated_types.Le) == parse_duration("10m")
    assert "duration('10m')" in c["probeDuration"]["x-kubernetes-validations"][0]["rule"]
    assert bound("adaptive_interval_seconds", annotated_types.Le) == parse_duration("1h")
    assert bound("adaptive_interval_seconds", annotated_types.Gt) == 0
    assert "duration(self) > duration('0s')" in c["adaptiveInterval"]["x-kubernetes-validations"][0]["rule"]
    # probeSharePercent 1..100 is a share in (0, 1]
    assert (c["probeSharePercent"]["minimum"], c["probeSharePercent"]["maximum"]) == (1, 100)
    assert bound("probe_share", annotated_types.Gt) == 0 and bound("probe_share", annotated_types.Le) == 1
    for key, field in (("probeDuration", "probe_seconds"), ("adaptiveInterval", "adaptive_interval_seconds")):
        assert parse_duration(c[key]["default"]) == fields[field].default, key
    assert c["probeSharePercent"]["default"] / 100 == fields["probe_share"].default
    assert c["adaptive"]["default"] is fields["adaptive"].default


@pytest.mark.parametrize(
    "concurrency",
    [
        {"probeDuration": "10m", "adaptiveInterval": "1h", "probeSharePercent": 100},
        {"probeDuration": "0s", "adaptiveInterval": "1ms", "probeSharePercent": 1, "adaptive": False},
    ],
)
def test_concurrency_boundaries_reach_a_valid_pod_config(concurrency: dict[str, Any]) -> None:
    from sluiceway_operator.render import Owner, build_pod_config

    cfg = build_pod_config(Owner("x", "ns", "u"), parse_spec({**BASE, "concurrency": concurrency})).concurrency
    assert cfg.probe_seconds == parse_duration(concurrency["probeDuration"])
    assert cfg.adaptive_interval_seconds == parse_duration(concurrency["adaptiveInterval"])
    assert cfg.probe_share == concurrency["probeSharePercent"] / 100
    assert cfg.adaptive is concurrency.get("adaptive", True)


# -- spec.gateway.hold and spec.gateway.httpRoute (issues 20 and 19 §3) ------------------------------

GATEWAY = {**BASE, "gateway": {"enabled": True}}


@pytest.mark.parametrize(
    ("gateway", "spec_patch", "message"),
    [
        ({"hold": {"maxBytes": "512Mi"}}, {}, "gateway.hold.maxBytes must be less than gateway.resources.memory"),
        (
            {"hold": {"maxBytes": "17Gi"}, "resources": {"memory": "32Gi"}},
            {},
            "gateway.hold.maxBytes must be at most 16Gi",
        ),
        ({"hold": {"maxBytes": "lots"}}, {}, "spec.gateway.hold.maxBytes"),
        ({"hold": {"maxRequests": -1}}, {}, "spec.gateway.hold.maxRequests"),
        ({"hold": {"maxRequests": 1_000_001}}, {}, "spec.gateway.hold.maxRequests"),
        ({"hold": {"tenantSharePercent": 0}}, {}, "spec.gateway.hold.tenantSharePercent"),
        ({"hold": {"tenantSharePercent": 101}}, {}, "spec.gateway.hold.tenantSharePercent"),
        ({"hold": {"handoffQueuePerPod": 10_001}}, {}, "spec.gateway.hold.handoffQueuePerPod"),
        ({"hold": {"retryAfter": "0s"}}, {}, "gateway.hold.retryAfter must be within \\[1s, 1h\\]"),
        ({"hold": {"retryAfter": "2h"}}, {}, "gateway.hold.retryAfter must be within \\[1s, 1h\\]"),
        ({"hold": {"retryAfter": "soon"}}, {}, "gateway.hold.retryAfter: 'soon' is not a duration"),
        (
            {"hold": {"maxRequests": 0}},
            {"autoscaling": {"minReplicas": 0}},
            "autoscaling.minReplicas 0 needs gateway.hold.maxRequests and gateway.hold.maxBytes above 0",
        ),
        (
            {"hold": {"maxBytes": 0}},
            {"autoscaling": {"minReplicas": 0}},
            "autoscaling.minReplicas 0 needs gateway.hold.maxRequests and gateway.hold.maxBytes above 0",
        ),
        (
            {"enabled": False, "httpRoute": {"parentRefs": [{"name": "g"}]}},
            {},
            "gateway.httpRoute needs gateway.enabled",
        ),
        ({"httpRoute": {"hostnames": ["a.example"]}}, {}, "gateway.httpRoute.hostnames needs parentRefs"),
        ({"httpRoute": {"parentRefs": []}}, {}, "spec.gateway.httpRoute.parentRefs"),
        ({"httpRoute": {"parentRefs": [{"name": "Bad_Name"}]}}, {}, "spec.gateway.httpRoute.parentRefs.0.name"),
        ({"httpRoute": {"parentRefs": [{"name": "g", "port": 0}]}}, {}, "spec.gateway.httpRoute.parentRefs.0.port"),
        ({"httpRoute": {"parentRefs": [{"name": "g", "namespace": "a.b"}]}}, {}, "parentRefs.0.namespace"),
        ({"httpRoute": {"parentRefs": [{"name": "g"}], "hostnames": ["a..b"]}}, {}, "httpRoute.hostnames.0"),
        ({"httpRoute": {"parentRefs": [{"name": "g"}] * 33}}, {}, "spec.gateway.httpRoute.parentRefs"),
    ],
)
def test_gateway_hold_and_route_refusals_name_the_field(
    gateway: dict[str, Any], spec_patch: dict[str, Any], message: str
) -> None:
    spec = {**GATEWAY, **spec_patch, "gateway": {"enabled": True, **gateway}}
    if spec_patch.get("autoscaling", {}).get("minReplicas") == 0:
        spec["autoscaling"] = {"engine": "keda", "minReplicas": 0}
    with pytest.raises(SpecError, match=message):
        parse_spec(spec)


def test_gateway_hold_defaults_are_the_gateways() -> None:
    """The spec's hold defaults (the CRD's: test_model_defaults_equal_crd_defaults) are the gateway's
    own (``sluiceway_gateway.config.HoldConfig``)."""
    from sluiceway_gateway.config import HoldConfig

    hold = parse_spec(GATEWAY).gateway.hold
    gw = HoldConfig()
    assert hold.max_requests == gw.max_requests
    assert hold.max_bytes_value == gw.max_bytes
    assert hold.tenant_share_percent / 100 == gw.tenant_share
    assert hold.handoff_queue_per_pod == gw.handoff_queue_per_pod
    assert parse_duration(hold.retry_after) == gw.retry_after_seconds
    crd_hold = crd_schema()["properties"]["spec"]["properties"]["gateway"]["properties"]["hold"]["properties"]
    assert {k: v["default"] for k, v in crd_hold.items()} == {
        "maxRequests": 1024,
        "maxBytes": "64Mi",
        "tenantSharePercent": 50,
        "handoffQueuePerPod": 1,
        "retryAfter": "5s",
    }


def test_gateway_hold_and_route_accepted() -> None:
    spec = parse_spec(load_case("edgeroute")["spec"])
    assert spec.gateway.hold.max_bytes_value == 256 * 1024**2
    assert [p.name for p in spec.gateway.route_parents] == ["public", "shared-edge"]
    # a route is only rendered with the gateway on and parents listed
    assert parse_spec({**GATEWAY, "gateway": {"enabled": True, "httpRoute": {}}}).gateway.route_parents == []
    assert parse_spec({**BASE, "gateway": {"enabled": False, "httpRoute": {}}}).gateway.route_parents == []
    # the memory rule holds only with the gateway on (nothing is held otherwise)
    assert parse_spec({**BASE, "gateway": {"hold": {"maxBytes": "1Gi"}}}).gateway.hold.max_bytes_value == 1024**3
    # a fractional byte count rounds up (the CRD's quantity(...) > 0 agrees: not 0, holding stays on)
    assert parse_spec({**GATEWAY, "gateway": {"enabled": True, "hold": {"maxBytes": "500m"}}}).gateway.hold.enabled
