"""Issue 18 item 8: what an InferenceService's author may ask of the cluster. Each refusal is
ConfigValid=False (reason NotAllowedByPolicy) naming the field and the setting, and nothing is
written. Before the fix every one of these specs rendered and applied (ConfigValid=True).

The real Reconciler against the in-memory fake API server of test_operator_reconcile_unit; the
settings come from the environment as the chart renders them."""

from __future__ import annotations

from typing import Any

import pytest
from sluiceway_operator.policy import DEFAULTS, Policy, check_policy, image_allowed, policy_from_env
from sluiceway_operator.reconcile import Reconciler
from sluiceway_operator.settings import OperatorConfig, config_from_env
from sluiceway_operator.spec import parse_spec
from test_operator_reconcile_unit import FakeKube

IMAGE = "ghcr.io/sluiceway/sluiceway-pod:0.1.0"
SCALER = "sluiceway-scaler.sluiceway-system.svc:9090"


def _body(**spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"model": {"image": IMAGE, "format": "demo", "source": "demo"}, **spec}
    return {"metadata": {"name": "a", "namespace": "n", "uid": "u1", "generation": 1}, "spec": s}


REFUSED = [
    ({"model": {"image": "evil.example/miner:1", "format": "demo", "source": "demo"}}, "spec.model.image", "IMAGE_REG"),
    (
        {"model": {"image": "ghcr.io/sluiceway/sluiceway-pod-evil:1", "format": "demo", "source": "demo"}},
        "spec.model.image",
        "IMAGE_REG",
    ),
    ({"serviceAccountName": "cloud-admin"}, "spec.serviceAccountName", "SERVICE_ACCOUNTS"),
    ({"placement": {"priorityClassName": "system-node-critical"}}, "priorityClassName", "PRIORITY_CLASSES"),
    ({"placement": {"runtimeClassName": "privileged"}}, "runtimeClassName", "RUNTIME_CLASSES"),
    ({"placement": {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}}, "nodeSelector", "NODE_SELECTOR"),
    ({"placement": {"tolerations": [{"operator": "Exists"}]}}, "tolerates every taint", "TOLERATION_KEYS"),
    (
        {"placement": {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}},
        "tolerations[0].key",
        "TOLERATION_KEYS",
    ),
    ({"autoscaling": {"scalerAddress": "169.254.169.254:80"}}, "spec.autoscaling.scalerAddress", "SCALER_ADDRESS"),
]


@pytest.mark.parametrize(("spec", "field", "setting"), REFUSED)
def test_the_default_policy_refuses_and_writes_nothing(spec: dict[str, Any], field: str, setting: str) -> None:
    kube = FakeKube()
    rec = Reconciler(config_from_env({}), kube)  # type: ignore[arg-type]
    outcome = rec.apply_children(_body(**spec))
    assert outcome.config_error is not None, "allowed"
    reason, message = outcome.config_error
    print(f"{reason}: {message}")
    assert reason == "NotAllowedByPolicy"
    assert field in message and f"SLUICEWAY_{setting}" in message.replace("ALLOWED_", "")
    assert kube.applied == [] and kube.events == ["NotAllowedByPolicy"]
    valid = next(c for c in kube.status["conditions"] if c["type"] == "ConfigValid")
    assert (valid["status"], valid["reason"]) == ("False", "NotAllowedByPolicy")


ALLOWED_BY_DEFAULT = [
    {},
    {"serviceAccountName": "default"},
    {"placement": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}},
    {"placement": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}},
    {"autoscaling": {"scalerAddress": SCALER}},
    {"model": {"image": "ghcr.io/sluiceway/sluiceway-pod@sha256:" + "0" * 64, "format": "demo", "source": "demo"}},
]


@pytest.mark.parametrize("spec", ALLOWED_BY_DEFAULT)
def test_the_default_policy_allows_the_ordinary(spec: dict[str, Any]) -> None:
    kube = FakeKube()
    outcome = Reconciler(config_from_env({}), kube).apply_children(_body(**spec))  # type: ignore[arg-type]
    assert outcome.config_error is None
    assert ("Deployment", False) in kube.applied


def test_settings_widen_the_policy() -> None:
    env = {
        "SLUICEWAY_ALLOWED_IMAGE_REGISTRIES": "registry.example/, ghcr.io/sluiceway/",
        "SLUICEWAY_ALLOWED_SERVICE_ACCOUNTS": "resnet",
        "SLUICEWAY_ALLOWED_PRIORITY_CLASSES": "inference",
        "SLUICEWAY_ALLOWED_TOLERATION_KEYS": "*",
        "SLUICEWAY_ALLOWED_RUNTIME_CLASSES": "nvidia",
        "SLUICEWAY_ALLOWED_NODE_SELECTOR_KEYS": "pool",
    }
    policy = policy_from_env(env)
    spec = parse_spec(
        _body(
            model={"image": "registry.example/x/y:1", "format": "demo", "source": "demo"},
            serviceAccountName="resnet",
            placement={
                "priorityClassName": "inference",
                "runtimeClassName": "nvidia",
                "nodeSelector": {"pool": "gpu"},
                "tolerations": [{"operator": "Exists"}],
            },
        )["spec"]
    )
    assert check_policy(spec, policy, SCALER) == []
    assert check_policy(spec, Policy(), SCALER) != []
    # An empty variable allows nothing; an unset one is the default.
    assert policy_from_env({"SLUICEWAY_ALLOWED_SERVICE_ACCOUNTS": ""}).service_accounts == ()
    assert policy_from_env({}).toleration_keys == DEFAULTS["toleration_keys"]


def test_image_prefixes() -> None:
    assert image_allowed("ghcr.io/sluiceway/sluiceway-pod:1", ("ghcr.io/sluiceway/sluiceway-pod",))
    assert not image_allowed("ghcr.io/sluiceway/sluiceway-pod-x:1", ("ghcr.io/sluiceway/sluiceway-pod",))
    assert not image_allowed("ghcr.io/sluiceway/sluiceway-pod/x:1", ("ghcr.io/sluiceway/sluiceway-pod",))
    assert image_allowed("ghcr.io/sluiceway/anything:1", ("ghcr.io/sluiceway/",))
    assert not image_allowed("ghcr.io/sluicewayx/a:1", ("ghcr.io/sluiceway/",))
    assert image_allowed("localhost:5000/a", ("localhost:5000/a",))
    assert not image_allowed("anything", ())
    assert image_allowed("anything", ("*",))


def test_the_operator_config_defaults_are_the_secure_ones() -> None:
    assert OperatorConfig().policy == policy_from_env({}) == Policy()
    assert Policy().priority_classes == () and Policy().runtime_classes == ()
    assert Policy().service_accounts == ("default",)
