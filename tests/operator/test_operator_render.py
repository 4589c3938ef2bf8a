"""Golden-file tests of the pure builders: InferenceService -> manifests, no cluster.

Regenerate the golden files after an intended change with ``SLUICEWAY_REGEN_GOLDEN=1``; the diff
then shows up in review.
"""

from __future__ import annotations

import os
from typing import Any

import kubernetes_validate
import pytest
import yaml
from operator_support import GOLDEN, TEST_KEYS, case_names, load_case
from sluiceway_core.config import PodConfig
from sluiceway_core.keys import hash_key
from sluiceway_operator.render import CONFIG_HASH_ANNOTATION, Environment, Owner, render
from sluiceway_operator.spec import SpecError, parse_spec

K8S_VERSION = "1.34.0"
ENV = Environment(
    scaler_address="sluiceway-scaler.sluiceway-system.svc:9090",
    prometheus_url=None,
    keda=True,
    service_monitor=True,
)


def _render_case(name: str, env: Environment = ENV, replicas: int | None = 2) -> Any:
    cr = load_case(name)
    spec = parse_spec(cr["spec"])
    owner = Owner(cr["metadata"]["name"], cr["metadata"]["namespace"], f"uid-{name}")
    hashes = {t.name: hash_key(TEST_KEYS[t.name]) for t in spec.keyed_tenants}
    return render(owner, spec, hashes, env, replicas=replicas)


@pytest.mark.parametrize("name", case_names())
def test_golden(name: str) -> None:
    rendered = _render_case(name)
    text = yaml.safe_dump_all(rendered.manifests, sort_keys=True)
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("SLUICEWAY_REGEN_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with SLUICEWAY_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{name}: rendering changed; SLUICEWAY_REGEN_GOLDEN=1 to accept"


@pytest.mark.parametrize("name", case_names())
def test_core_manifests_validate_strict(name: str) -> None:
    """Every core manifest passes kubernetes-validate in strict mode (no unknown fields)."""
    checked = 0
    for manifest in _render_case(name).manifests:
        if manifest["apiVersion"] in ("keda.sh/v1alpha1", "monitoring.coreos.com/v1"):
            continue  # CRDs unknown to kubernetes-validate; checked by shape below
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        checked += 1
    assert checked == 5


def test_crd_validates_strict() -> None:
    from operator_support import load_crd

    kubernetes_validate.validate(load_crd(), K8S_VERSION, strict=True)


def test_invalid_manifest_is_caught_by_validator() -> None:
    """The validator is not a no-op: a typo in a rendered field fails strict validation."""
    dep = next(m for m in _render_case("minimal").manifests if m["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolicee"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


def _by_kind(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["kind"]: m for m in manifests}


def test_every_child_is_owned_and_labelled() -> None:
    for m in _render_case("full").manifests:
        (ref,) = m["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": "sluiceway.io/v1alpha1",
            "kind": "InferenceService",
            "name": "resnet",
            "uid": "uid-full",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert m["metadata"]["labels"]["sluiceway.io/inferenceservice"] == "resnet"
        assert m["metadata"]["namespace"] == "vision"


def test_configmap_round_trips_through_pod_config() -> None:
    rendered = _render_case("full")
    cm = _by_kind(rendered.manifests)["ConfigMap"]
    cfg = PodConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
    assert cfg == rendered.pod_config
    assert cfg.queue.timeout_seconds == 2.0
    assert cfg.queue.exec_timeout_seconds == 10.0  # request 12s - queue 2s
    assert cfg.queue.max_depth == "auto"
    assert cfg.concurrency.safety_factor == 0.7
    assert cfg.concurrency.memory_reserve_bytes == 2 * 1024**3
    assert cfg.tenants.defaults.rate == 0.5  # 30/m
    assert cfg.tenants.keys_file == "/var/run/secrets/sluiceway/keys.txt"
    assert [t.name for t in cfg.tenants.tenants] == ["search", "reports"]
    assert cfg.degradation.fallback is not None and cfg.degradation.fallback.spec == "synthetic:5"
    assert cfg.model.name == "resnet50"


def test_keys_secret_has_hashes_never_keys() -> None:
    import base64

    secret = _by_kind(_render_case("full").manifests)["Secret"]
    text = base64.b64decode(secret["data"]["keys.txt"]).decode()
    assert text == f"{hash_key(TEST_KEYS['reports'])} reports\n{hash_key(TEST_KEYS['search'])} search\n"
    for key in TEST_KEYS.values():
        assert key not in yaml.safe_dump(secret)


def test_deployment_is_hardened_and_probed() -> None:
    dep = _by_kind(_render_case("full").manifests)["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["sluiceway-pod", "serve", "--config", "/etc/sluiceway/config.yaml"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "tmp", "emptyDir": {}} in pod["volumes"]
    assert pod["terminationGracePeriodSeconds"] >= 45  # drain 45s
    assert len(dep["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]) == 16


@pytest.mark.parametrize(
    ("name", "owns_replicas"), [("minimal", False), ("promtriggers", False), ("fixed", True)]
)
def test_operator_owns_replicas_only_without_autoscaler(name: str, owns_replicas: bool) -> None:
    dep = _by_kind(_render_case(name).manifests)["Deployment"]
    assert ("replicas" in dep["spec"]) is owns_replicas


def test_builtin_engine_owns_replicas_within_bounds() -> None:
    assert _by_kind(_render_case("builtin", replicas=2).manifests)["Deployment"]["spec"]["replicas"] == 2
    assert _by_kind(_render_case("builtin", replicas=9).manifests)["Deployment"]["spec"]["replicas"] == 3
    assert _by_kind(_render_case("builtin", replicas=None).manifests)["Deployment"]["spec"]["replicas"] == 1


def test_config_change_changes_hash_and_nothing_else_does() -> None:
    cr = load_case("minimal")
    owner = Owner("tiny", "ml", "u")
    base = render(owner, parse_spec(cr["spec"]), {}, ENV)
    same = render(owner, parse_spec(cr["spec"]), {}, ENV)
    assert base.config_hash == same.config_hash
    changed_spec = dict(cr["spec"], timeouts={"queue": "3s"})
    changed = render(owner, parse_spec(changed_spec), {}, ENV)
    assert changed.config_hash != base.config_hash
    rotated = render(owner, parse_spec(cr["spec"]), {"x": hash_key("k")}, ENV)
    assert rotated.config_hash != base.config_hash


def test_scaled_object_is_fast_up_slow_down_with_fallback() -> None:
    so = _by_kind(_render_case("full").manifests)["ScaledObject"]["spec"]
    behavior = so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 600
    assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 2, "periodSeconds": 120}]
    assert so["fallback"]["behavior"] == "currentReplicasIfHigher"
    (trigger,) = so["triggers"]
    assert trigger["type"] == "external"
    assert trigger["metadata"]["scalerAddress"] == "sluiceway-scaler.sluiceway-system.svc:9090"
    assert trigger["metadata"]["targetWaitP95Seconds"] == "0.75"
    assert all(isinstance(v, str) for v in trigger["metadata"].values())
    assert (so["minReplicaCount"], so["maxReplicaCount"]) == (2, 10)


def test_prometheus_engine_triggers() -> None:
    so = _by_kind(_render_case("promtriggers").manifests)["ScaledObject"]["spec"]
    depth, wait = so["triggers"]
    assert (depth["metricType"], depth["metadata"]["threshold"]) == ("AverageValue", "8")
    assert 'inferenceservice="bert"' in depth["metadata"]["query"]
    assert (wait["metricType"], wait["metadata"]["threshold"]) == ("Value", "1.5")
    assert "histogram_quantile(0.95" in wait["metadata"]["query"]


def test_optional_children_follow_cluster_capabilities() -> None:
    bare = Environment(keda=False, service_monitor=False)
    kinds = [m["kind"] for m in _render_case("minimal", env=bare).manifests]
    assert kinds == ["ConfigMap", "Secret", "Deployment", "Service", "PodDisruptionBudget"]
    fixed = _render_case("fixed")
    assert ("keda.sh/v1alpha1", "ScaledObject") in fixed.absent
    assert ("monitoring.coreos.com/v1", "ServiceMonitor") in fixed.absent


def test_prometheus_engine_without_address_is_a_spec_error() -> None:
    cr = load_case("promtriggers")
    spec = dict(cr["spec"], autoscaling={"engine": "prometheus"})
    with pytest.raises(SpecError, match="prometheusAddress"):
        render(Owner("bert", "nlp", "u"), parse_spec(spec), {}, ENV)
