"""The operator against a real control plane (etcd + kube-apiserver + kube-controller-manager).

The operator runs for real (``python -m sluiceway_operator.cli run``) in a subprocess, authenticated
as a ServiceAccount bound to the chart's least-privilege ClusterRole, with a 2-second drift timer.
A stand-in ``scaledobjects.keda.sh`` CRD (schema-less) is installed so the operator's KEDA path runs;
no KEDA controller exists, so ScaledObjects never report Ready.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubetools import (
    KEDA_STANDIN_CRD,
    Admin,
    ControlPlane,
    establish_crd,
    operator_kubeconfig,
    run_operator,
    wait_for,
)
from operator_support import case_names, load_case, load_crd
from sluiceway_core.keys import hash_key, parse_keys_text
from sluiceway_operator.kube import ApiError, Kube
from sluiceway_operator.render import Environment, Owner, build_pod_config, build_scaled_object
from sluiceway_operator.spec import parse_spec

pytestmark = [pytest.mark.apiserver, pytest.mark.slow, pytest.mark.timeout(600)]

NS = "sluiceway-e2e"
OP_NS = "sluiceway-system"
GVP = "/apis/sluiceway.io/v1alpha1/namespaces/{ns}/inferenceservices"


@pytest.fixture(scope="module")
def admin(control_plane: ControlPlane) -> Admin:
    a = Admin(Kube(control_plane.client()))
    establish_crd(a, load_crd())
    establish_crd(a, KEDA_STANDIN_CRD)
    for ns in (NS, OP_NS):
        if a.get(f"/api/v1/namespaces/{ns}") is None:
            a.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    return a


@pytest.fixture(scope="module")
def operator_process(control_plane: ControlPlane, admin: Admin) -> Iterator[Path]:
    kubeconfig = operator_kubeconfig(control_plane, admin, OP_NS)
    with run_operator(
        kubeconfig, control_plane.workdir / "operator.log", NS, "--drift-interval", "2", "--signals-interval", "2"
    ) as log:
        yield log


def _isvc(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {
            "image": "registry.example/sluiceway-pod:test",
            "format": "synthetic",
            "source": "synthetic:10",
        }
    }
    base.update(spec)
    return {
        "apiVersion": "sluiceway.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": NS},
        "spec": base,
    }


def _path(name: str = "") -> str:
    p = GVP.format(ns=NS)
    return f"{p}/{name}" if name else p


def _cond(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return c
    return None


def _secret(admin: Admin, name: str, value: str, labelled: bool = True) -> None:
    labels = {"sluiceway.io/tenant-key": "true"} if labelled else {}
    admin.create(
        f"/api/v1/namespaces/{NS}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "labels": labels},
            "data": {"key": base64.b64encode(value.encode()).decode()},
        },
    )


# ------------------------------------------------------------------------------------------------ CRD


def test_crd_accepted_with_defaults(admin: Admin) -> None:
    created = admin.create(_path(), _isvc("defaults-only"), dry_run=True)
    spec = created["spec"]
    assert spec["autoscaling"]["engine"] == "keda"
    assert spec["timeouts"] == {"queue": "5s", "request": "35s", "drain": "30s"}
    assert spec["priorities"]["classes"] == ["critical", "standard", "batch"]
    assert spec["concurrency"]["permits"] == "auto"
    assert spec["autoscaling"]["scaleDown"]["releaseWindow"] == "20m"
    crd = admin.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/inferenceservices.sluiceway.io")
    assert crd["spec"]["names"]["shortNames"] == ["infsvc"]
    assert crd["spec"]["names"]["categories"] == ["sluiceway"]


def _model(**model: Any) -> dict[str, Any]:
    return {"model": {"image": "registry.example/p:1", **model}, "resources": {"gpus": 0}}


def _inputs(*tensors: dict[str, Any]) -> dict[str, Any]:
    return {"model": {"image": "i", "format": "demo", "source": "demo", "inputs": list(tensors)}}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
            "autoscaling.minReplicas must be <= autoscaling.maxReplicas",
        ),
        (
            {"timeouts": {"queue": "10s", "request": "5s"}},
            "timeouts.queue must be shorter than timeouts.request",
        ),
        (
            {"priorities": {"classes": ["a", "b", "a"], "default": "a"}},
            "priorities.classes names must be unique",
        ),
        (
            {"priorities": {"classes": ["a"], "default": "z"}},
            "priorities.default must be one of priorities.classes",
        ),
        (
            {
                "tenants": [
                    {"name": "t", "keySecretRef": {"name": "s"}},
                    {"name": "t", "keySecretRef": {"name": "u"}},
                ]
            },
            "tenant names must be unique",
        ),
        (
            {"tenants": [{"name": "t", "keySecretRef": {"name": "s"}, "maxPriority": "vip"}]},
            "every tenant's maxPriority must be one of priorities.classes",
        ),
        ({"tenants": [{"name": "t"}]}, "a tenant without keySecretRef can only be the anonymous tenant"),
        (
            {"access": {"allowAnonymous": False}},
            "access.allowAnonymous is false but no tenant has a keySecretRef",
        ),
        ({"concurrency": {"permits": 0}}, "concurrency.permits must be 'auto' or an integer within 1..1024"),
        ({"queue": {"maxDepth": "lots"}}, "queue.maxDepth must be 'auto' or an integer"),
        (
            {"model": {"image": "i", "format": "synthetic", "source": "model.pt"}},
            "format synthetic needs source",
        ),
        (
            {"autoscaling": {"scaleDown": {"stabilizationWindow": "2h"}}},
            "stabilization windows must be at most 1h",
        ),
        # Issue 14: a release window the policy would ignore is refused, not silently dropped.
        # (90s: the default stabilizationWindow since issue 21; equal is not longer)
        (
            {"autoscaling": {"scaleDown": {"releaseWindow": "90s"}}},
            "scaleDown.releaseWindow must be 0s (off) or longer than scaleDown.stabilizationWindow",
        ),
        (
            {"autoscaling": {"scaleDown": {"stabilizationWindow": "30m", "releaseWindow": "30m"}}},
            "scaleDown.releaseWindow must be 0s (off) or longer than scaleDown.stabilizationWindow",
        ),
        ({"autoscaling": {"scaleDown": {"releaseWindow": "25h"}}}, "scaleDown.releaseWindow must be at most 24h"),
        ({"autoscaling": {"scaleDown": {"releaseWindow": "20 min"}}}, "spec.autoscaling.scaleDown.releaseWindow"),
        ({"timeouts": {"queue": "1.5s"}}, "spec.timeouts.queue"),  # schema pattern: no floats
        ({"autoscaling": {"engine": "hpa"}}, "Unsupported value"),
        # Scale to zero (issue 20): only with the gateway, which holds requests while no pod exists,
        # and only with the engine whose scaler wakes the service from them.
        ({"autoscaling": {"minReplicas": 0}}, "autoscaling.minReplicas 0 needs gateway.enabled: true"),
        (
            {"autoscaling": {"minReplicas": 0, "engine": "builtin"}, "gateway": {"enabled": True}},
            "autoscaling.minReplicas 0 needs engine keda",
        ),
        (
            {"autoscaling": {"minReplicas": 0, "engine": "prometheus"}, "gateway": {"enabled": True}},
            "autoscaling.minReplicas 0 needs engine keda",
        ),
        ({"autoscaling": {"scaleToZeroAfter": "0s"}}, "autoscaling.scaleToZeroAfter must be within [1s, 24h]"),
        ({"autoscaling": {"scaleToZeroAfter": "25h"}}, "autoscaling.scaleToZeroAfter must be within [1s, 24h]"),
        ({"autoscaling": {"scaleToZeroAfter": "5 min"}}, "spec.autoscaling.scaleToZeroAfter"),
        ({"gateway": {"startupEstimate": "2h"}}, "gateway.startupEstimate must be within [1s, 1h]"),
        # What the Deployment's own validation (or the pod) would refuse, refused up front.
        ({"model": {"image": "   ", "format": "demo", "source": "demo"}}, "spec.model.image"),
        ({"resources": {"memory": "-1Gi"}}, "spec.resources.memory"),
        ({"resources": {"cpu": -1}}, "a quantity must not be negative"),
        ({"resources": {"gpuResourceName": "kubernetes.io/gpu"}}, "outside the kubernetes.io domain"),
        (
            {
                "degradation": {"enabled": True},
                "model": {"image": "i", "format": "demo", "source": "demo", "fallback": {"source": "tiny"}},
            },
            "model.fallback.source must be",
        ),
        ({"priorities": {"classes": ["a" * 33], "default": "a" * 33}}, "spec.priorities.classes[0]"),
        ({"placement": {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}}, "must have no value"),
        ({"placement": {"tolerations": [{"key": "k", "tolerationSeconds": 5}]}}, "needs effect NoExecute"),
        ({"placement": {"tolerations": [{"value": "v"}]}}, "without a key needs operator Exists"),
        ({"placement": {"nodeSelector": {"gpu": "has space"}}}, "spec.placement.nodeSelector.gpu"),
        ({"serviceAccountName": "Not_A_Name"}, "spec.serviceAccountName"),
        ({"placement": {"nodeSelector": {"bad key": "x"}}}, "nodeSelector keys must be label keys"),
        ({"placement": {"nodeSelector": {"example.com/" + "k" * 64: "x"}}}, "nodeSelector keys must be label keys"),
        ({"imagePullSecrets": ["a b"]}, "spec.imagePullSecrets[0]"),
        (
            {
                "model": {
                    "image": "i",
                    "format": "demo",
                    "source": "demo",
                    "persistentVolumeClaim": {"claimName": "w", "mountPath": "/etc/sluiceway"},
                }
            },
            "must not hide a path the pod needs",
        ),
        (
            {
                "model": {
                    "image": "i",
                    "format": "demo",
                    "source": "demo",
                    "persistentVolumeClaim": {"claimName": "w", "mountPath": "/a/../tmp"},
                }
            },
            "'.' or '..' segments",
        ),
        # Issue 13: the declared input contract and the adaptive permits.
        (_inputs({"name": "x", "shape": [-1, 3], "maxShape": [4]}), "maxShape must have the rank of shape"),
        (
            _inputs({"name": "x", "shape": [-1, 3], "maxShape": [4, 5]}),
            "maxShape must equal shape in every fixed dimension (only -1 dimensions may vary)",
        ),
        (_inputs({"name": "x", "shape": [-1, 3], "maxShape": [0, 3]}), "spec.model.inputs[0].maxShape[0]"),
        (_inputs({"name": "x", "shape": [-1, 0]}), "shape dimensions must be -1 (any size) or >= 1"),
        (_inputs({"name": "x", "shape": [-1] * 9}), "spec.model.inputs[0].shape"),
        (_inputs({"name": "x", "shape": [-1]}, {"name": "x", "shape": [2]}), "model.inputs names must be unique"),
        (_inputs({"name": "x", "maxShape": [4]}), "spec.model.inputs[0].shape: Required value"),
        ({"concurrency": {"probeDuration": "11m"}}, "concurrency.probeDuration must be at most 10m"),
        ({"concurrency": {"probeDuration": "1.5s"}}, "spec.concurrency.probeDuration"),
        ({"concurrency": {"adaptiveInterval": "0s"}}, "concurrency.adaptiveInterval must be within (0, 1h]"),
        ({"concurrency": {"adaptiveInterval": "2h"}}, "concurrency.adaptiveInterval must be within (0, 1h]"),
        ({"concurrency": {"probeSharePercent": 0}}, "spec.concurrency.probeSharePercent"),
        ({"concurrency": {"probeSharePercent": 101}}, "spec.concurrency.probeSharePercent"),
        # issue 18: one model grammar for the CRD and the pod (the pod refuses these at start)
        (
            {
                "model": {
                    "image": "registry.example/p:1",
                    "format": "demo",
                    "source": "demo",
                    "fallback": {"source": "synthetic:fast"},
                }
            },
            "model.fallback.source must be",
        ),
        (
            {"model": {"image": "registry.example/p:1", "format": "python", "source": "synthetic:fast"}},
            "format python needs source",
        ),
        (
            {"model": {"image": "registry.example/p:1", "format": "synthetic", "source": "synthetic:1e3"}},
            "format synthetic needs source",
        ),
        # issue 18: one quantity grammar (parse_quantity refuses a fractional exponent)
        ({"concurrency": {"memoryReserve": "1e1.5"}}, "spec.concurrency.memoryReserve"),
        ({"concurrency": {"memoryReserve": "-1"}}, "spec.concurrency.memoryReserve"),
        # issue 21: a scale-down window shorter than the scaler's rate window plus a scrape flaps
        ({"autoscaling": {"engine": "keda", "scaleDown": {"stabilizationWindow": "20s"}}}, "rate window (1m)"),
        (
            {
                "autoscaling": {"engine": "keda", "scaleDown": {"stabilizationWindow": "70s"}},
                "monitoring": {"interval": "15s"},
            },
            "rate window (1m)",
        ),
        # issue 23: ServiceMonitor labels are label pairs
        ({"monitoring": {"serviceMonitorLabels": {"bad key": "x"}}}, "serviceMonitorLabels keys must be label keys"),
        ({"monitoring": {"serviceMonitorLabels": {"release": "bad value"}}}, "spec.monitoring.serviceMonitorLabels"),
        # issue 23 §3: the pods' observability, bounded
        ({"observability": {"logFormat": "xml"}}, "spec.observability.logFormat"),
        ({"observability": {"accessLog": {"enabled": True, "samplePercent": 101}}}, "spec.observability.accessLog"),
        ({"observability": {"accessLog": {"samplePercent": 10}}}, "accessLog.samplePercent needs accessLog.enabled"),
        ({"observability": {"tracing": {"endpoint": "otel:4318"}}}, "spec.observability.tracing.endpoint"),
        ({"observability": {"tracing": {"samplePercent": -1}}}, "spec.observability.tracing.samplePercent"),
        ({"observability": {"tracing": {"serviceName": "Not_A_Label"}}}, "spec.observability.tracing.serviceName"),
        (
            {"observability": {"tracing": {"enabled": False, "endpoint": "http://otel:4318/v1/traces"}}},
            "tracing.enabled: false turns tracing off",
        ),
        # issue 22: one device per pod until multi-device runners exist
        ({"resources": {"gpus": 2}}, "resources.gpus must be 0 or 1: a pod runs its model on one device"),
        # issue 22 §1/§2: model.storageUri and the formats
        (_model(format="onnx"), "set exactly one of model.source (the short form) and model.storageUri"),
        (
            _model(format="onnx", source="/m.onnx", storageUri="s3://models/m.onnx"),
            "set exactly one of model.source (the short form) and model.storageUri",
        ),
        (_model(format="onnx", storageUri="https://user:pw@h.example/m.onnx"), "spec.model.storageUri"),
        (_model(format="onnx", storageUri="https://h.example/m.onnx?X-Amz-Signature=a"), "spec.model.storageUri"),
        (_model(format="onnx", storageUri="s3://models/../m.onnx"), "storageUri must not contain '.' or '..'"),
        (_model(format="onnx", storageUri="ftp://h.example/m.onnx"), "spec.model.storageUri"),
        (
            _model(format="safetensors", storageUri="s3://models/m.safetensors"),
            "format safetensors with a storageUri needs model.factory",
        ),
        (_model(format="safetensors", source="/m.safetensors"), "format safetensors needs source"),
        (_model(format="onnx", source="m.onnx"), "formats torchscript, pt2 and onnx need an absolute"),
        (_model(format="onnx", storageUri="https://h.example/m.onnx", s3={}), "model.s3 is only used with an s3://"),
        (_model(format="onnx", storageUri="pvc://w/m.onnx", sha256="0" * 64), "model.sha256 is only used"),
        (_model(format="onnx", source="/m.onnx", factory="a:b"), "model.factory is only used with format safetensors"),
        (_model(format="demo", storageUri="s3://models/m.onnx"), "format demo needs source 'demo'"),
        (
            _model(format="onnx", storageUri="pvc://w/m.onnx", persistentVolumeClaim={"claimName": "w"}),
            "model.storageUri and model.persistentVolumeClaim exclude each other",
        ),
        (_model(format="onnx", storageUri="s3://models/m/", storageSizeLimit=0), "storageSizeLimit must be positive"),
        (
            _model(format="onnx", storageUri="s3://models/m/", s3={"credentialsSecret": "Not_A_Name"}),
            "spec.model.s3.credentialsSecret",
        ),
        # issue 22 §3: spec.pod and spec.rollout
        (
            {"pod": {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}},
            "a pod volume is exactly one of configMap, secret, emptyDir, persistentVolumeClaim, projected or",
        ),
        (
            {"pod": {"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]}},
            "a projected volume must not hold a serviceAccountToken",
        ),
        ({"pod": {"volumes": [{"name": "keys", "emptyDir": {}}]}}, "are the operator's"),
        ({"pod": {"volumes": [{"name": "edge", "emptyDir": {}}]}}, "are the operator's"),
        (
            {"pod": {"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/tmp"}]}},
            "mountPath must not hide a path the pod needs",
        ),
        ({"pod": {"volumeMounts": [{"name": "v", "mountPath": "/data"}]}}, "every pod.volumeMounts name must be"),
        ({"pod": {"env": [{"name": "SLUICEWAY_LOG_LEVEL", "value": "debug"}]}}, "pod.env must not set HOME, POD_NAME"),
        ({"pod": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}}, "pod.env names must be unique"),
        ({"pod": {"labels": {"sluiceway.io/inferenceservice": "x"}}}, "pod.labels must not set app.kubernetes.io/*"),
        ({"pod": {"annotations": {"sluiceway.io/config-hash": "x"}}}, "pod.annotations must not set sluiceway.io/*"),
        ({"pod": {"shmSize": "-1Gi"}}, "spec.pod.shmSize"),
        ({"pod": {"securityContext": {"platformAssignsIds": True, "fsGroup": 5}}}, "platformAssignsIds leaves the ids"),
        ({"pod": {"securityContext": {"runAsUser": 0}}}, "spec.pod.securityContext.runAsUser"),
        ({"rollout": {"maxSurge": 0}}, "rollout.maxSurge and rollout.maxUnavailable must not both be 0"),
        ({"rollout": {"maxSurge": "0%", "maxUnavailable": "0"}}, "must not both be 0"),
        ({"rollout": {"maxUnavailable": "lots"}}, "spec.rollout.maxUnavailable"),
    ],
)
def test_cel_and_schema_reject_bad_specs(admin: Admin, spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiError) as info:
        admin.create(_path(), _isvc("bad", **spec), dry_run=True)
    assert info.value.status == 422
    assert message in str(info.value)


@pytest.mark.parametrize(
    "spec",
    [
        {"concurrency": {"memoryReserve": "1e9"}},
        {"concurrency": {"memoryReserve": "+1Gi"}},
        {"concurrency": {"memoryReserve": "1e-3"}},
        {
            "model": {
                "image": "registry.example/p:1",
                "format": "demo",
                "source": "demo",
                "fallback": {"source": "synthetic:2.5"},
            },
            "degradation": {"enabled": True},
        },
        {"model": {"image": "registry.example/p:1", "format": "synthetic", "source": "synthetic:20"}},
        {"model": {"image": "registry.example/p:1", "format": "python", "source": "synthetics:make"}},
        {"autoscaling": {"engine": "keda", "scaleDown": {"stabilizationWindow": "75s"}}},
        {"autoscaling": {"engine": "builtin", "scaleDown": {"stabilizationWindow": "20s"}}},
        {"monitoring": {"serviceMonitorLabels": {"release": "kube-prometheus-stack", "example.com/team": "ml"}}},
        {"autoscaling": {"pollingInterval": "2s"}},
        {
            "observability": {
                "logFormat": "json",
                "accessLog": {"enabled": True, "samplePercent": 0},
                "tracing": {"endpoint": "https://otel.example/v1/traces", "samplePercent": 100, "serviceName": "a"},
            }
        },
        {"observability": {"tracing": {"enabled": False}}},
    ],
)
def test_the_crd_the_operator_and_the_pod_accept_the_same(admin: Admin, spec: dict[str, Any]) -> None:
    """What the API server accepts, the operator renders and the pod's config model loads
    (before the fix memoryReserve 1e9/+1Gi raised UnitError while rendering)."""
    stored = admin.create(_path(), _isvc("same", **spec), dry_run=True)["spec"]
    cfg = build_pod_config(Owner("same", NS, "u"), parse_spec(stored))
    assert cfg.model.spec == stored["model"]["source"]
    if "fallback" in stored["model"]:
        assert cfg.degradation.fallback is not None
        assert cfg.degradation.fallback.spec == stored["model"]["fallback"]["source"]


@pytest.mark.parametrize(
    ("model", "want"),
    [
        (_model(format="onnx", storageUri="s3://models/v1/", s3={"endpoint": "http://minio:9000"}), "/mnt/models"),
        (_model(format="pt2", storageUri="https://h.example/m.pt2", sha256="a" * 64), "/mnt/models"),
        (_model(format="torchscript", storageUri="pvc://weights/resnet/model.pt"), "/mnt/models/resnet/model.pt"),
        (
            _model(format="safetensors", storageUri="s3://models/m.safetensors", factory="pkg.nets:build"),
            "pkg.nets:build@/mnt/models/m.safetensors",
        ),
        (_model(format="safetensors", source="pkg.nets:build@/w/m.safetensors"), "pkg.nets:build@/w/m.safetensors"),
        (_model(format="onnx", source="/models/m.onnx"), "/models/m.onnx"),
        ({"resources": {"gpus": 1}}, "synthetic:10"),
    ],
)
def test_storage_uris_and_formats_the_crd_accepts_render(admin: Admin, model: dict[str, Any], want: str) -> None:
    """What the API server accepts (defaults applied: storageSizeLimit 10Gi, s3.pathStyle true) the
    operator's model takes and renders into a pod config the pod's model loads."""
    stored = admin.create(_path(), _isvc("stored", **model), dry_run=True)["spec"]
    if "storageUri" in stored["model"]:
        assert stored["model"]["storageSizeLimit"] == "10Gi"
    cfg = build_pod_config(Owner("stored", NS, "u"), parse_spec(stored))
    assert cfg.model.spec == want


@pytest.mark.parametrize("release", ["0s", "91s", "5m", "24h"])  # longer than the default 90s window
def test_release_window_off_or_longer_than_the_window_is_accepted(admin: Admin, release: str) -> None:
    created = admin.create(
        _path(), _isvc("release", autoscaling={"scaleDown": {"releaseWindow": release}}), dry_run=True
    )
    assert created["spec"]["autoscaling"]["scaleDown"]["releaseWindow"] == release


def test_scale_to_zero_is_accepted_with_the_gateway_and_rendered(admin: Admin) -> None:
    """Issue 20: minReplicas 0 with the gateway and engine keda passes the CRD; the stored spec (its
    defaults applied: scaleToZeroAfter 5m) renders a ScaledObject the API server's model of it takes,
    with KEDA's minReplicaCount 0 and cooldownPeriod from scaleToZeroAfter. Before, the CRD refused
    every minReplicas 0 ("must be at least 1")."""
    stored = admin.create(
        _path(), _isvc("zero", autoscaling={"minReplicas": 0}, gateway={"enabled": True}), dry_run=True
    )["spec"]
    assert stored["autoscaling"]["scaleToZeroAfter"] == "5m"
    spec = parse_spec(stored)
    so = build_scaled_object(Owner("zero", NS, "u"), spec, Environment(keda=True, prometheus_url="http://p:9090"))
    assert so["spec"]["minReplicaCount"] == 0 and so["spec"]["cooldownPeriod"] == 300
    assert so["spec"]["triggers"][0]["metadata"]["minReplicas"] == "0"
    custom = admin.create(
        _path(),
        _isvc(
            "zero",
            autoscaling={"minReplicas": 0, "scaleToZeroAfter": "90s"},
            gateway={"enabled": True, "startupEstimate": "45s"},
        ),
        dry_run=True,
    )["spec"]
    assert custom["autoscaling"]["scaleToZeroAfter"] == "90s" and custom["gateway"]["startupEstimate"] == "45s"
    spec = parse_spec(custom)
    so = build_scaled_object(Owner("zero", NS, "u"), spec, Environment(keda=True, prometheus_url="http://p:9090"))
    assert so["spec"]["cooldownPeriod"] == 90


@pytest.mark.parametrize("case", case_names())
def test_every_example_case_passes_the_crd(admin: Admin, case: str) -> None:
    """The stricter schema still accepts every example (nodeSelector, tolerations, PVC, ...)."""
    cr = load_case(case)
    spec = cr["spec"]
    admin.create(_path(), _isvc("case-" + case, **{k: v for k, v in spec.items()}), dry_run=True)


def test_declared_shapes_and_adaptive_defaults_are_stored(admin: Admin) -> None:
    """A valid maxShape is accepted as written; the probe and adaptive settings get their defaults."""
    tensor = {"name": "image", "shape": [-1, 3, -1, -1], "maxShape": [4, 3, 512, 512]}
    created = admin.create(_path(), _isvc("shapes-ok", **_inputs(tensor)), dry_run=True)
    assert created["spec"]["model"]["inputs"] == [{**tensor, "datatype": "FP32"}]
    c = created["spec"]["concurrency"]
    assert (c["probeDuration"], c["probeSharePercent"], c["adaptive"], c["adaptiveInterval"]) == ("2s", 95, True, "1s")


def test_allow_anonymous_has_no_default(admin: Admin) -> None:
    """Unset allowAnonymous stays unset (the pod turns anonymous access off when tenants have
    keys); keyed tenants without it are accepted, and false still needs a keyed tenant."""
    keyed = {"tenants": [{"name": "t", "keySecretRef": {"name": "s"}}]}
    created = admin.create(_path(), _isvc("anon-unset", **keyed), dry_run=True)
    assert "allowAnonymous" not in created["spec"]["access"]
    created = admin.create(_path(), _isvc("anon-off", access={"allowAnonymous": False}, **keyed), dry_run=True)
    assert created["spec"]["access"]["allowAnonymous"] is False
    assert "allowAnonymous" not in admin.create(_path(), _isvc("anon-bare"), dry_run=True)["spec"]["access"]


def test_name_must_be_a_dns_label(admin: Admin) -> None:
    with pytest.raises(ApiError, match=r"metadata\.name must be a DNS-1035 label"):
        admin.create(_path(), _isvc("9lives"), dry_run=True)


# ------------------------------------------------------------------------------------------- operator


def _children(admin: Admin, name: str) -> dict[str, Any]:
    return {
        "ConfigMap": admin.get(f"/api/v1/namespaces/{NS}/configmaps/{name}-config"),
        "Secret": admin.get(f"/api/v1/namespaces/{NS}/secrets/{name}-keys"),
        "Deployment": admin.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{name}"),
        "Service": admin.get(f"/api/v1/namespaces/{NS}/services/{name}"),
        "PodDisruptionBudget": admin.get(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/{name}"),
        "ScaledObject": admin.get(f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects/{name}"),
    }


def _pods(admin: Admin, name: str) -> list[dict[str, Any]]:
    sel = f"sluiceway.io/inferenceservice={name}"
    return admin.call("GET", f"/api/v1/namespaces/{NS}/pods", query=[("labelSelector", sel)])["items"]


def _replicasets(admin: Admin, name: str) -> list[dict[str, Any]]:
    sel = f"sluiceway.io/inferenceservice={name}"
    return admin.call("GET", f"/apis/apps/v1/namespaces/{NS}/replicasets", query=[("labelSelector", sel)])["items"]


def _hash(admin: Admin, name: str) -> str:
    dep = admin.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{name}")
    return str(dep["spec"]["template"]["metadata"]["annotations"]["sluiceway.io/config-hash"])


def test_lifecycle(admin: Admin, operator_process: Path) -> None:
    """Create -> children with owner refs -> ReplicaSet and Pods -> spec change rolls -> drift repaired
    -> status -> delete -> garbage collected."""
    _secret(admin, "alpha-key", "alpha-secret-value\n")
    spec = {
        "replicas": 2,
        "autoscaling": {"engine": "none"},
        "tenants": [{"name": "alpha", "keySecretRef": {"name": "alpha-key"}, "rate": "10/s"}],
    }
    cr = admin.create(_path(), _isvc("lifecycle", **spec))
    uid = cr["metadata"]["uid"]

    children = wait_for(
        lambda: (c := _children(admin, "lifecycle")) and all(c[k] for k in c if k != "ScaledObject") and c,
        60,
        what="children",
    )
    # the replica count is applied after every child (its own field manager): wait for that apply too
    dep_path = f"/apis/apps/v1/namespaces/{NS}/deployments/lifecycle"

    def replicas_applied() -> bool:
        return "sluiceway-operator-replicas" in {m["manager"] for m in admin.get(dep_path)["metadata"]["managedFields"]}

    wait_for(replicas_applied, 30, what="the replica count applied")
    children = _children(admin, "lifecycle")
    for kind, obj in children.items():
        if kind == "ScaledObject":
            assert obj is None  # engine none
            continue
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["uid"], ref["kind"], ref["controller"]) == (uid, "InferenceService", True), kind
        managers = {m["manager"] for m in obj["metadata"]["managedFields"] if m["operation"] == "Apply"}
        # spec.replicas has its own manager (engine none), so switching engines never drops it.
        want = {"sluiceway-operator", "sluiceway-operator-replicas"} if kind == "Deployment" else {"sluiceway-operator"}
        assert managers == want, kind
    keys = base64.b64decode(children["Secret"]["data"]["keys.txt"]).decode()
    parsed = parse_keys_text(keys)  # salted: HMAC-SHA256 with the service's random salt
    assert parsed.salt is not None and len(parsed.salt) == 32
    assert keys == f"hmac-sha256 {parsed.salt.hex()}\n{hash_key('alpha-secret-value', parsed.salt)} alpha\n"
    assert parsed.lookup("alpha-secret-value") == "alpha" and parsed.lookup("alpha-secret-valu") is None
    assert "alpha-secret-value" not in str(children)
    cfg = yaml.safe_load(children["ConfigMap"]["data"]["config.yaml"])
    assert cfg["tenants"]["tenants"][0] == {"name": "alpha", "rate": 10.0, "weight": 1}

    # The Deployment controller and ReplicaSet controller are real: 2 Pods (Pending, no kubelet).
    wait_for(lambda: len(_pods(admin, "lifecycle")) == 2, 60, what="2 pods")
    assert all(p["status"].get("phase") == "Pending" for p in _pods(admin, "lifecycle"))

    # Status.
    def status_ok() -> dict[str, Any] | None:
        obj = admin.get(_path("lifecycle"))
        return obj if obj.get("status", {}).get("observedGeneration") == 1 else None

    obj = wait_for(status_ok, 30, what="status of generation 1")
    st = obj["status"]
    assert _cond(obj, "ConfigValid")["status"] == "True"
    assert _cond(obj, "AutoscalingReady")["reason"] == "AutoscalingDisabled"
    assert _cond(obj, "Available")["status"] in ("False", "Unknown")  # pods never become ready
    assert _cond(obj, "Ready")["status"] != "True"
    assert st["endpoint"] == f"http://lifecycle.{NS}.svc:8080"
    assert st["concurrency"] == "auto"
    assert st["configHash"] == _hash(admin, "lifecycle")
    wait_for(lambda: admin.get(_path("lifecycle"))["status"].get("replicas") == 2, 30, what="status.replicas")
    # No finalizer (GC does the cleanup) and no kopf.zalando.org leftovers.
    meta = admin.get(_path("lifecycle"))["metadata"]
    assert not meta.get("finalizers")
    assert not [k for k in meta.get("annotations", {}) if "kopf.zalando.org" in k]
    assert "sluiceway.io/last-handled-configuration" in meta.get("annotations", {})

    # Spec change -> new config -> new hash -> new ReplicaSet (a rollout).
    old_hash = _hash(admin, "lifecycle")
    admin.call(
        "PATCH",
        _path("lifecycle"),
        body=[{"op": "replace", "path": "/spec/timeouts", "value": {"queue": "3s"}}],
    )
    wait_for(lambda: _hash(admin, "lifecycle") != old_hash, 30, what="config hash change")
    cm = admin.get(f"/api/v1/namespaces/{NS}/configmaps/lifecycle-config")
    assert yaml.safe_load(cm["data"]["config.yaml"])["queue"]["timeoutSeconds"] == 3.0
    wait_for(lambda: len(_replicasets(admin, "lifecycle")) == 2, 60, what="second ReplicaSet")
    wait_for(lambda: admin.get(_path("lifecycle"))["status"].get("observedGeneration") == 2, 30, what="gen 2")

    # Drift: a deleted Service comes back; an edited ConfigMap is put back.
    svc_uid = children["Service"]["metadata"]["uid"]
    admin.call("DELETE", f"/api/v1/namespaces/{NS}/services/lifecycle")
    wait_for(
        lambda: (s := admin.get(f"/api/v1/namespaces/{NS}/services/lifecycle")) and s["metadata"]["uid"] != svc_uid,
        30,
        what="Service recreated",
    )
    cm_path = f"/api/v1/namespaces/{NS}/configmaps/lifecycle-config"
    good = admin.get(cm_path)["data"]["config.yaml"]
    admin.call("PATCH", cm_path, body=[{"op": "replace", "path": "/data/config.yaml", "value": "tampered: true\n"}])
    wait_for(lambda: admin.get(cm_path)["data"]["config.yaml"] == good, 30, what="ConfigMap repaired")

    # Deletion: the garbage collector removes every child and the pods.
    admin.call("DELETE", _path("lifecycle"))
    wait_for(lambda: not any(_children(admin, "lifecycle").values()), 60, what="children garbage-collected")
    wait_for(lambda: not _pods(admin, "lifecycle"), 60, what="pods garbage-collected")


def test_missing_secret_gives_config_invalid_and_leaves_children(admin: Admin, operator_process: Path) -> None:
    admin.create(_path(), _isvc("keyed", autoscaling={"engine": "none"}))
    wait_for(lambda: _children(admin, "keyed")["Deployment"], 60, what="Deployment")
    wait_for(lambda: admin.get(_path("keyed")).get("status", {}).get("configHash"), 30, what="configHash")
    before = _hash(admin, "keyed")
    cm_before = admin.get(f"/api/v1/namespaces/{NS}/configmaps/keyed-config")["data"]

    tenants = [{"name": "beta", "keySecretRef": {"name": "beta-key"}}]
    admin.call("PATCH", _path("keyed"), body=[{"op": "add", "path": "/spec/tenants", "value": tenants}])

    def invalid() -> dict[str, Any] | None:
        obj = admin.get(_path("keyed"))
        c = _cond(obj, "ConfigValid")
        return obj if c and c["status"] == "False" and obj["status"].get("observedGeneration") == 2 else None

    obj = wait_for(invalid, 30, what="ConfigValid=False")
    c = _cond(obj, "ConfigValid")
    assert c["reason"] == "TenantKeyUnavailable"
    missing_message = c["message"]
    assert 'labelled sluiceway.io/tenant-key: "true"' in missing_message
    assert "does not exist" not in missing_message  # generic: no oracle for which Secrets exist
    assert _cond(obj, "Ready")["status"] == "False"

    # the operator writes the status first, then posts the Event: wait for it (bounded)
    def warned() -> bool:
        events = admin.call(
            "GET", f"/api/v1/namespaces/{NS}/events", query=[("fieldSelector", "involvedObject.name=keyed")]
        )["items"]
        return any(e["reason"] == "TenantKeyUnavailable" and e["type"] == "Warning" for e in events)

    wait_for(warned, 10, what="a Warning Event TenantKeyUnavailable")
    # Existing children untouched, across several drift-timer ticks.
    time.sleep(5)
    assert _hash(admin, "keyed") == before
    assert admin.get(f"/api/v1/namespaces/{NS}/configmaps/keyed-config")["data"] == cm_before

    # A Secret of that name without the opt-in label is not read: the same condition, word for word.
    _secret(admin, "beta-key", "beta-value", labelled=False)
    time.sleep(5)  # several drift ticks
    c = _cond(admin.get(_path("keyed")), "ConfigValid")
    assert (c["status"], c["reason"], c["message"]) == ("False", "TenantKeyUnavailable", missing_message)
    assert _hash(admin, "keyed") == before

    # Labelled -> the timer picks it up -> valid, rolled out with the key hash.
    admin.call(
        "PATCH",
        f"/api/v1/namespaces/{NS}/secrets/beta-key",
        body=[{"op": "add", "path": "/metadata/labels", "value": {"sluiceway.io/tenant-key": "true"}}],
    )
    wait_for(lambda: _cond(admin.get(_path("keyed")), "ConfigValid")["status"] == "True", 30, what="valid again")
    wait_for(lambda: _hash(admin, "keyed") != before, 30, what="rollout with key")
    admin.call("DELETE", _path("keyed"))


def test_keda_engine_creates_scaled_object_without_owning_replicas(admin: Admin, operator_process: Path) -> None:
    admin.create(_path(), _isvc("scaled", autoscaling={"engine": "keda", "minReplicas": 1, "maxReplicas": 3}))
    so = wait_for(lambda: _children(admin, "scaled")["ScaledObject"], 60, what="ScaledObject")
    assert so["spec"]["scaleTargetRef"]["name"] == "scaled"
    assert so["spec"]["fallback"]["behavior"] == "currentReplicasIfHigher"
    dep = wait_for(lambda: _children(admin, "scaled")["Deployment"], 30, what="Deployment")
    owned = [m for m in dep["metadata"]["managedFields"] if m["manager"] == "sluiceway-operator"]
    assert owned and all("f:replicas" not in str(m.get("fieldsV1", {}).get("f:spec", {})) for m in owned)
    # Someone else (the HPA) scales: the operator's next applies leave it alone.
    admin.call(
        "PATCH",
        f"/apis/apps/v1/namespaces/{NS}/deployments/scaled/scale",
        body=[{"op": "replace", "path": "/spec/replicas", "value": 3}],
    )
    time.sleep(5)  # two drift ticks
    assert _children(admin, "scaled")["Deployment"]["spec"]["replicas"] == 3
    obj = admin.get(_path("scaled"))
    assert _cond(obj, "AutoscalingReady")["reason"] == "ScaledObjectPending"

    # Switching the engine off prunes the ScaledObject.
    admin.call(
        "PATCH",
        _path("scaled"),
        body=[{"op": "replace", "path": "/spec/autoscaling/engine", "value": "none"}],
    )
    wait_for(lambda: _children(admin, "scaled")["ScaledObject"] is None, 30, what="ScaledObject pruned")
    admin.call("DELETE", _path("scaled"))


def test_builtin_engine_without_prometheus_reports_it(admin: Admin, operator_process: Path) -> None:
    admin.create(_path(), _isvc("builtin", autoscaling={"engine": "builtin", "minReplicas": 2, "maxReplicas": 4}))

    def reported() -> dict[str, Any] | None:
        c = _cond(admin.get(_path("builtin")), "AutoscalingReady")
        return c if c and c["reason"] == "PrometheusNotConfigured" else None

    c = wait_for(reported, 30, what="AutoscalingReady=False")
    assert c["status"] == "False"
    # Signals missing: the policy holds; the Deployment starts at minReplicas.
    dep = _children(admin, "builtin")["Deployment"]
    assert dep["spec"]["replicas"] == 2
    admin.call("DELETE", _path("builtin"))


# ---------------------------------------------------------------------------------------- gateway


def _gateway_children(admin: Admin, name: str) -> dict[str, Any]:
    gw = f"{name}-gateway"
    return {
        "ServiceAccount": admin.get(f"/api/v1/namespaces/{NS}/serviceaccounts/{gw}"),
        "Role": admin.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles/{gw}"),
        "RoleBinding": admin.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings/{gw}"),
        "ConfigMap": admin.get(f"/api/v1/namespaces/{NS}/configmaps/{gw}"),
        "Deployment": admin.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{gw}"),
        "Service": admin.get(f"/api/v1/namespaces/{NS}/services/{gw}"),
        "PodDisruptionBudget": admin.get(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/{gw}"),
    }


def test_gateway_children_applied_and_its_role_reads_only_endpoint_slices(
    control_plane: ControlPlane, admin: Admin, operator_process: Path
) -> None:
    """Issue 19 §3: the operator (under the chart's rules) creates the gateway's children with
    server-side apply, its ServiceAccount's token can read EndpointSlices in the namespace and
    nothing else, status.endpoint is the gateway's Service, and turning it off prunes them all."""
    from kubetools import write_kubeconfig

    admin.create(_path(), _isvc("edge", autoscaling={"engine": "none"}, gateway={"enabled": True, "replicas": 2}))
    cr = admin.get(_path("edge"))
    uid = cr["metadata"]["uid"]
    children = wait_for(
        lambda: (c := _gateway_children(admin, "edge")) and all(c.values()) and c, 60, what="gateway children"
    )
    for kind, obj in children.items():
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["uid"], ref["controller"]) == (uid, True), kind
        managers = {m["manager"] for m in obj["metadata"]["managedFields"] if m["operation"] == "Apply"}
        assert managers == {"sluiceway-operator"}, kind
    assert children["Role"]["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}
    ]
    assert children["Deployment"]["spec"]["replicas"] == 2
    assert children["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"] == "edge-gateway"
    assert _children(admin, "edge")["Service"] is not None  # the pods' Service stays
    wait_for(
        lambda: admin.get(_path("edge")).get("status", {}).get("endpoint") == f"http://edge-gateway.{NS}.svc:8080",
        30,
        what="status.endpoint on the gateway",
    )

    # The gateway's own token: EndpointSlice reads in its namespace, nothing else.
    token = admin.create(
        f"/api/v1/namespaces/{NS}/serviceaccounts/edge-gateway/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}},
    )["status"]["token"]
    kubeconfig = control_plane.workdir / "gateway.kubeconfig"
    write_kubeconfig(kubeconfig, control_plane.server, token)
    gateway = Admin(Kube(control_plane.client(kubeconfig)))
    slices = gateway.call(
        "GET",
        f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices",
        query=[("labelSelector", "kubernetes.io/service-name=edge")],
    )
    assert slices["kind"] == "EndpointSliceList"
    denied = {
        "secrets": f"/api/v1/namespaces/{NS}/secrets",
        "pods": f"/api/v1/namespaces/{NS}/pods",
        "configmaps": f"/api/v1/namespaces/{NS}/configmaps",
        "endpointslices elsewhere": f"/apis/discovery.k8s.io/v1/namespaces/{OP_NS}/endpointslices",
        "endpointslices cluster-wide": "/apis/discovery.k8s.io/v1/endpointslices",
    }
    for what, path in denied.items():
        with pytest.raises(ApiError) as info:
            gateway.call("GET", path)
        assert info.value.status == 403, what
    review = admin.create(
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{NS}:edge-gateway",
                "resourceAttributes": {
                    "namespace": NS,
                    "verb": "delete",
                    "group": "discovery.k8s.io",
                    "resource": "endpointslices",
                },
            },
        },
    )
    assert review["status"]["allowed"] is False

    # The edge token (no quota key here: generated once and kept in <name>-edge), mounted in both.
    secret_path = f"/api/v1/namespaces/{NS}/secrets/edge-edge"
    secret = wait_for(lambda: admin.get(secret_path), 30, what="the edge Secret")
    (ref,) = secret["metadata"]["ownerReferences"]
    assert ref["uid"] == uid
    edge_token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(edge_token) == 64
    for dep in (children["Deployment"], admin.get(f"/apis/apps/v1/namespaces/{NS}/deployments/edge")):
        pod = dep["spec"]["template"]["spec"]
        assert {"name": "edge", "mountPath": "/etc/sluiceway/edge", "readOnly": True} in pod["containers"][0][
            "volumeMounts"
        ]
    # The NetworkPolicy and the gateway's metrics Service, applied by the operator under the chart's rules.
    policy_path = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/edge"
    policy = wait_for(lambda: admin.get(policy_path), 30, what="the NetworkPolicy")
    assert policy["spec"]["ingress"][0]["from"] == [
        {
            "podSelector": {
                "matchLabels": {"app.kubernetes.io/name": "sluiceway-gateway", "sluiceway.io/inferenceservice": "edge"}
            }
        }
    ]
    metrics_path = f"/api/v1/namespaces/{NS}/services/edge-gateway-metrics"
    assert (
        wait_for(lambda: admin.get(metrics_path), 30, what="the gateway's metrics Service")["spec"]["clusterIP"]
        == "None"
    )
    # Kept across reconciles (the drift timer runs every 2 s; a spec change reconciles at once).
    admin.call("PATCH", _path("edge"), body=[{"op": "replace", "path": "/spec/gateway/replicas", "value": 1}])
    wait_for(lambda: _gateway_children(admin, "edge")["Deployment"]["spec"]["replicas"] == 1, 30, what="replicas 1")
    time.sleep(3)
    assert base64.b64decode(admin.get(secret_path)["data"]["token"]).decode() == edge_token
    # Nowhere else: not in the status, the Events, the ConfigMaps or the operator's log.
    assert edge_token not in str(admin.get(_path("edge")))
    assert edge_token not in str(admin.get(f"/api/v1/namespaces/{NS}/events"))
    assert edge_token not in str(admin.get(f"/api/v1/namespaces/{NS}/configmaps"))
    assert edge_token not in operator_process.read_text()
    # networkPolicy: false prunes the policy alone.
    admin.call("PATCH", _path("edge"), body=[{"op": "add", "path": "/spec/gateway/networkPolicy", "value": False}])
    wait_for(lambda: admin.get(policy_path) is None, 30, what="NetworkPolicy pruned")

    # Off: every gateway child is pruned, the endpoint goes back to the pods' Service.
    admin.call("PATCH", _path("edge"), body=[{"op": "replace", "path": "/spec/gateway/enabled", "value": False}])
    wait_for(lambda: not any(_gateway_children(admin, "edge").values()), 30, what="gateway children pruned")
    wait_for(lambda: admin.get(metrics_path) is None, 30, what="the gateway's metrics Service pruned")
    # The operator may not delete Secrets: the token is removed from <name>-edge, nothing mounts it.
    wait_for(lambda: not (admin.get(secret_path) or {}).get("data"), 30, what="edge token removed")
    pods_dep = admin.get(f"/apis/apps/v1/namespaces/{NS}/deployments/edge")
    assert all(v["name"] != "edge" for v in pods_dep["spec"]["template"]["spec"]["volumes"])
    wait_for(
        lambda: admin.get(_path("edge")).get("status", {}).get("endpoint") == f"http://edge.{NS}.svc:8080",
        30,
        what="status.endpoint on the pods' Service",
    )
    admin.call("DELETE", _path("edge"))


# ------------------------------------------------------------------------------ model from storage


def test_model_from_s3_credentials_consent_and_fetch_failure_in_status(admin: Admin, operator_process: Path) -> None:
    """Issue 22 §1: the store's credentials Secret must opt in (label) before the operator names it
    in a pod; the storage initializer gets the keys only as secretKeyRef variables; a failed fetch
    (the pod's init-container state, written here as the kubelet would) becomes ModelFetched=False
    with the fetch's reason, and no credential reaches the status, an Event or the ConfigMap."""
    secret_key = "s3-secret-value-never-printed"
    admin.create(
        f"/api/v1/namespaces/{NS}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "store-creds"},
            "data": {
                "AWS_ACCESS_KEY_ID": base64.b64encode(b"AKIDSTORE").decode(),
                "AWS_SECRET_ACCESS_KEY": base64.b64encode(secret_key.encode()).decode(),
            },
        },
    )
    model = {
        "image": "registry.example/sluiceway-pod:test",
        "format": "onnx",
        "storageUri": "s3://models/scorer/v3/",
        "s3": {"endpoint": "http://minio.storage.svc:9000", "credentialsSecret": "store-creds"},
        "storageSizeLimit": "1Gi",
    }
    admin.create(_path(), _isvc("fetched", model=model, resources={"gpus": 0}, autoscaling={"engine": "none"}))

    def config_valid(status: str) -> Any:
        c = _cond(admin.get(_path("fetched")), "ConfigValid")
        return c if c and c["status"] == status else None

    c = wait_for(lambda: config_valid("False"), 30, what="ConfigValid=False (unlabelled credentials)")
    assert c["reason"] == "ModelCredentialsUnavailable" and 'sluiceway.io/model-credentials: "true"' in c["message"]
    assert _children(admin, "fetched")["Deployment"] is None  # nothing written
    admin.call(
        "PATCH",
        f"/api/v1/namespaces/{NS}/secrets/store-creds",
        body=[{"op": "add", "path": "/metadata/labels", "value": {"sluiceway.io/model-credentials": "true"}}],
    )
    wait_for(lambda: config_valid("True"), 30, what="ConfigValid=True once labelled")
    dep = wait_for(lambda: _children(admin, "fetched")["Deployment"], 30, what="Deployment")
    (init,) = dep["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][:4] == ["sluiceway-pod", "fetch", "--uri", "s3://models/scorer/v3/"]
    assert {e["name"] for e in init["env"] if "valueFrom" in e} == {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    }

    # The kubelet's part: the initializer ran and failed with the fetch's termination message.
    (pod,) = wait_for(lambda: _pods(admin, "fetched") or None, 60, what="the pod")
    line = "sluiceway-pod fetch: failed (access-denied): s3://models/scorer/v3/: AccessDenied: Access Denied."
    admin.call(
        "PATCH",
        f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/status",
        body=[
            {
                "op": "add",
                "path": "/status/initContainerStatuses",
                "value": [
                    {
                        "name": "storage-initializer",
                        "image": init["image"],
                        "imageID": "",
                        "ready": False,
                        "restartCount": 1,
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {
                            "terminated": {
                                "exitCode": 11,
                                "reason": "Error",
                                "message": f"fetch: listing s3://models/scorer/v3/\n{line}\n",
                                "startedAt": "2026-01-01T00:00:00Z",
                                "finishedAt": "2026-01-01T00:00:01Z",
                            }
                        },
                    }
                ],
            }
        ],
    )

    def fetch_failed() -> Any:
        obj = admin.get(_path("fetched"))
        c = _cond(obj, "ModelFetched")
        return obj if c and c["status"] == "False" else None

    obj = wait_for(fetch_failed, 30, what="ModelFetched=False")
    c = _cond(obj, "ModelFetched")
    assert c["reason"] == "ModelFetchFailed"
    assert c["message"] == (
        f"pod {pod['metadata']['name']}: storage initializer failed (access-denied), exit 11: {line}"
    )
    assert _cond(obj, "Ready")["reason"] == "ModelFetchFailed"
    events = admin.call(
        "GET", f"/api/v1/namespaces/{NS}/events", query=[("fieldSelector", "involvedObject.name=fetched")]
    )["items"]
    cm = admin.get(f"/api/v1/namespaces/{NS}/configmaps/fetched-config")
    for text in (str(obj["status"]), str(events), str(cm), str(dep)):
        assert secret_key not in text and "AKIDSTORE" not in text
    admin.call("DELETE", _path("fetched"))


# ------------------------------------------------------------------------------------ spec.pod


def test_pod_template_secrets_need_consent_and_the_children_pass_the_api_server(
    admin: Admin, operator_process: Path
) -> None:
    """Issue 22 §3: a Secret spec.pod hands to the pods must opt in (label), else ConfigValid=False
    (PodSecretUnavailable) and nothing is written; labelled, the operator applies a Deployment with
    every addition, which the API server admits (its own validation of env, volumes, spread)."""
    cr = load_case("podtemplate")
    admin.create(
        f"/api/v1/namespaces/{NS}/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ranker-features"}, "stringData": {"token": "t"}},
    )
    admin.create(_path(), {**_isvc("ranker"), "spec": cr["spec"]})

    def config_valid(status: str) -> Any:
        c = _cond(admin.get(_path("ranker")), "ConfigValid")
        return c if c and c["status"] == status else None

    c = wait_for(lambda: config_valid("False"), 30, what="ConfigValid=False (unlabelled Secret)")
    assert c["reason"] == "PodSecretUnavailable" and "ranker-features" in c["message"]
    assert _children(admin, "ranker")["Deployment"] is None
    admin.call(
        "PATCH",
        f"/api/v1/namespaces/{NS}/secrets/ranker-features",
        body=[{"op": "add", "path": "/metadata/labels", "value": {"sluiceway.io/pod-secret": "true"}}],
    )
    wait_for(lambda: config_valid("True"), 30, what="ConfigValid=True once labelled")
    dep = wait_for(lambda: _children(admin, "ranker")["Deployment"], 30, what="Deployment")
    tpl = dep["spec"]["template"]
    assert tpl["metadata"]["labels"]["team"] == "search"
    assert "runAsUser" not in tpl["spec"]["securityContext"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in tpl["spec"]["volumes"]
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    wait_for(lambda: len(_pods(admin, "ranker")) == 4, 60, what="4 pods from the ReplicaSet")
    admin.call("DELETE", _path("ranker"))


# ----------------------------------------------------------------------- key rotation, no restart


def test_a_measured_start_up_reaches_the_gateway_config_without_a_rollout(admin: Admin, operator_process: Path) -> None:
    """Issue 20: with the gateway, ``status.startup.totalSeconds`` (written here as the signals path
    writes it after measuring a pod's start) becomes the gateway's ``hold.startupSeconds`` in its
    ConfigMap, replacing ``gateway.startupEstimate``, on the operator's next spec pass; neither the
    gateway's Deployment nor the pods' changes template (same hashes, the same two ReplicaSets, with
    the real controller-manager): the gateway reloads the value in place."""
    name = "coldstart"
    gateway = {"enabled": True, "startupEstimate": "40s"}
    admin.create(_path(), _isvc(name, autoscaling={"minReplicas": 0, "maxReplicas": 2}, gateway=gateway))
    cm_path = f"/api/v1/namespaces/{NS}/configmaps/{name}-gateway"

    def startup() -> Any:
        cm = admin.get(cm_path)
        return cm and (yaml.safe_load(cm["data"]["gateway.yaml"]).get("hold") or {}).get("startupSeconds")

    def gateway_hash() -> str:
        dep = admin.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{name}-gateway")
        return str(dep["spec"]["template"]["metadata"]["annotations"]["sluiceway.io/config-hash"])

    assert wait_for(startup, 60, what="the gateway's ConfigMap") == 40.0
    wait_for(lambda: len(_replicasets(admin, name)) == 2, 60, what="the pods' and the gateway's ReplicaSets")
    replicasets = sorted(rs["metadata"]["name"] for rs in _replicasets(admin, name))
    hashes = (_hash(admin, name), gateway_hash())
    wait_for(lambda: (admin.get(_path(name)).get("status") or {}).get("conditions"), 30, what="a status")
    measured = {"pod": f"{name}-6d4f8b7c9-x2x2x", "totalSeconds": 7.593, "phases": {"scheduled": 7.0, "loaded": 0.593}}
    admin.call("PATCH", _path(name) + "/status", body=[{"op": "add", "path": "/status/startup", "value": measured}])
    assert wait_for(lambda: startup() == 8.0, 30, what="the measured start-up in the ConfigMap")
    time.sleep(5)  # drift ticks (2 s) and the controller-manager: a rollout would show by now
    assert (_hash(admin, name), gateway_hash()) == hashes
    assert sorted(rs["metadata"]["name"] for rs in _replicasets(admin, name)) == replicasets
    print(f"\nstartupSeconds 40 (estimate) -> {startup()} (measured 7.593 s); ReplicaSets unchanged: {replicasets}")
    admin.call("DELETE", _path(name))


def test_key_rotation_and_rate_change_update_in_place_without_a_rollout(admin: Admin, operator_process: Path) -> None:
    """Issue 22 §3: a rotated tenant key reaches the pods' key file (the <name>-keys Secret) and a
    changed rate their ConfigMap, while the pod template's hash and ReplicaSet stay (no GPU pod
    restarts; the pods reload both files); a restart setting still rolls them."""
    _secret(admin, "gamma-key", "gamma-first-key-value")
    spec = {
        "autoscaling": {"engine": "none"},
        "tenants": [{"name": "gamma", "keySecretRef": {"name": "gamma-key"}, "rate": "10/s"}],
    }
    admin.create(_path(), _isvc("rotate", **spec))
    keys_path = f"/api/v1/namespaces/{NS}/secrets/rotate-keys"
    cm_path = f"/api/v1/namespaces/{NS}/configmaps/rotate-config"
    wait_for(lambda: len(_replicasets(admin, "rotate")) == 1, 60, what="the first ReplicaSet")
    before, keys_before = _hash(admin, "rotate"), admin.get(keys_path)["data"]["keys.txt"]
    salt = parse_keys_text(base64.b64decode(keys_before).decode()).salt
    assert salt is not None

    admin.call(
        "PATCH",
        f"/api/v1/namespaces/{NS}/secrets/gamma-key",
        body=[{"op": "replace", "path": "/data/key", "value": base64.b64encode(b"gamma-second-key").decode()}],
    )
    wait_for(lambda: admin.get(keys_path)["data"]["keys.txt"] != keys_before, 30, what="the key file rotated")
    text = base64.b64decode(admin.get(keys_path)["data"]["keys.txt"]).decode()
    assert parse_keys_text(text).lookup("gamma-second-key") == "gamma"
    assert parse_keys_text(text).lookup("gamma-first-key-value") is None

    admin.call("PATCH", _path("rotate"), body=[{"op": "replace", "path": "/spec/tenants/0/rate", "value": "20/s"}])
    wait_for(
        lambda: yaml.safe_load(admin.get(cm_path)["data"]["config.yaml"])["tenants"]["tenants"][0]["rate"] == 20.0,
        30,
        what="the ConfigMap's new rate",
    )
    time.sleep(3)  # drift ticks
    assert _hash(admin, "rotate") == before
    assert len(_replicasets(admin, "rotate")) == 1  # no rollout

    admin.call("PATCH", _path("rotate"), body=[{"op": "replace", "path": "/spec/timeouts", "value": {"queue": "3s"}}])
    wait_for(lambda: _hash(admin, "rotate") != before, 30, what="a restart setting rolls the pods")
    wait_for(lambda: len(_replicasets(admin, "rotate")) == 2, 60, what="the second ReplicaSet")
    admin.call("DELETE", _path("rotate"))
