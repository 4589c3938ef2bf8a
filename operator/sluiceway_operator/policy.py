"""What an InferenceService's author may ask of the cluster: the operator's policy. Pure.

Whoever may ``create inferenceservices`` in a namespace gets a Deployment written with the operator's
rights. Without a policy that is ``create deployments`` with any image, ServiceAccount (a cloud
workload identity is keyed on it), toleration, node selector, PriorityClass and runtime class, and
a ScaledObject that makes KEDA dial any ``host:port``. :func:`check_policy` refuses every field
value the cluster's operator settings do not allow; the reconciler reports the refusal as
``ConfigValid=False`` (reason :data:`POLICY_REASON` or :data:`PROMETHEUS_REASON`) and writes nothing.

Settings (environment variables of the operator; chart values ``operator.policy.*``): comma-separated
lists, ``*`` allows anything. See :data:`DEFAULTS` for what an unset variable means (the chart's
secure defaults) and docs/operator.md for the trust model.

Concurrency: pure functions over frozen values; safe from any thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .spec import InferenceServiceSpec

__all__ = [
    "DEFAULTS",
    "ENV_VARS",
    "POLICY_REASON",
    "PROMETHEUS_REASON",
    "Policy",
    "check_policy",
    "image_allowed",
    "policy_from_env",
]

#: ConfigValid=False reason for a field the policy refuses.
POLICY_REASON = "NotAllowedByPolicy"
#: ConfigValid=False reason for ``spec.autoscaling.prometheusAddress`` off the allow-list.
PROMETHEUS_REASON = "PrometheusAddressNotAllowed"

#: Policy field -> its environment variable (chart value ``operator.policy.<camelCase>``).
ENV_VARS = {
    "image_registries": "SLUICEWAY_ALLOWED_IMAGE_REGISTRIES",
    "service_accounts": "SLUICEWAY_ALLOWED_SERVICE_ACCOUNTS",
    "priority_classes": "SLUICEWAY_ALLOWED_PRIORITY_CLASSES",
    "toleration_keys": "SLUICEWAY_ALLOWED_TOLERATION_KEYS",
    "runtime_classes": "SLUICEWAY_ALLOWED_RUNTIME_CLASSES",
    "node_selector_keys": "SLUICEWAY_ALLOWED_NODE_SELECTOR_KEYS",
}

#: Well-known GPU and topology node labels an InferenceService may select on by default.
DEFAULT_NODE_SELECTOR_KEYS = (
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.count",
    "cloud.google.com/gke-accelerator",
    "karpenter.k8s.aws/instance-gpu-name",
)

#: What an unset variable means: the chart's secure defaults. Images: the project's pod image
#: repository only; ServiceAccounts: ``default`` only; no PriorityClass or runtime class; tolerations
#: of the ``nvidia.com/gpu`` taint only; node selectors on :data:`DEFAULT_NODE_SELECTOR_KEYS`.
DEFAULTS: Mapping[str, tuple[str, ...]] = {
    "image_registries": ("ghcr.io/sluiceway/sluiceway-pod",),
    "service_accounts": ("default",),
    "priority_classes": (),
    "toleration_keys": ("nvidia.com/gpu",),
    "runtime_classes": (),
    "node_selector_keys": DEFAULT_NODE_SELECTOR_KEYS,
}


@dataclass(frozen=True)
class Policy:
    """Allowed values per field; ``("*",)`` allows anything, ``()`` nothing."""

    image_registries: tuple[str, ...] = DEFAULTS["image_registries"]
    service_accounts: tuple[str, ...] = DEFAULTS["service_accounts"]
    priority_classes: tuple[str, ...] = DEFAULTS["priority_classes"]
    toleration_keys: tuple[str, ...] = DEFAULTS["toleration_keys"]
    runtime_classes: tuple[str, ...] = DEFAULTS["runtime_classes"]
    node_selector_keys: tuple[str, ...] = DEFAULTS["node_selector_keys"]

    @classmethod
    def open(cls) -> Policy:
        """Everything allowed (tests, single-tenant clusters)."""
        return cls(*(("*",) for _ in ENV_VARS))


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def policy_from_env(env: Mapping[str, str]) -> Policy:
    """The policy from the ``SLUICEWAY_ALLOWED_*`` variables; unset = :data:`DEFAULTS`, set to an
    empty string = nothing allowed."""
    values = {f: (_split(env[var]) if var in env else DEFAULTS[f]) for f, var in ENV_VARS.items()}
    return Policy(**values)


def _repository(image: str) -> str:
    """``registry/path/name`` of an image reference, without ``:tag`` or ``@digest``."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def image_allowed(image: str, prefixes: tuple[str, ...]) -> bool:
    """An entry ending in ``/`` allows every repository under it (``ghcr.io/sluiceway/``); any other
    entry allows exactly that repository, any tag or digest (``ghcr.io/sluiceway/sluiceway-pod``)."""
    if "*" in prefixes:
        return True
    repo = _repository(image)
    return any(repo.startswith(p) if p.endswith("/") else repo == p for p in prefixes)


def _allowed(value: str, allowed: tuple[str, ...]) -> bool:
    return "*" in allowed or value in allowed


def _refusal(field: str, value: str, setting: str, allowed: tuple[str, ...]) -> str:
    shown = ", ".join(allowed) if allowed else "nothing"
    return f"{field} {value!r} is not allowed by the operator's policy (allowed: {shown}); change {setting}"


def check_policy(spec: InferenceServiceSpec, policy: Policy, scaler_address: str) -> list[str]:
    """Every refusal, each naming the field and the setting that would allow it ([] = allowed)."""
    out: list[str] = []
    v = ENV_VARS
    if not image_allowed(spec.model.image, policy.image_registries):
        out.append(_refusal("spec.model.image", spec.model.image, v["image_registries"], policy.image_registries))
    sa = spec.service_account_name
    if sa is not None and not _allowed(sa, policy.service_accounts):
        out.append(_refusal("spec.serviceAccountName", sa, v["service_accounts"], policy.service_accounts))
    p = spec.placement
    if p is not None:
        if p.priority_class_name is not None and not _allowed(p.priority_class_name, policy.priority_classes):
            out.append(
                _refusal(
                    "spec.placement.priorityClassName",
                    p.priority_class_name,
                    v["priority_classes"],
                    policy.priority_classes,
                )
            )
        if p.runtime_class_name is not None and not _allowed(p.runtime_class_name, policy.runtime_classes):
            out.append(
                _refusal(
                    "spec.placement.runtimeClassName",
                    p.runtime_class_name,
                    v["runtime_classes"],
                    policy.runtime_classes,
                )
            )
        for key in sorted(p.node_selector or {}):
            if not _allowed(key, policy.node_selector_keys):
                out.append(
                    _refusal("spec.placement.nodeSelector key", key, v["node_selector_keys"], policy.node_selector_keys)
                )
        for i, t in enumerate(p.tolerations or []):
            if not t.key:  # operator Exists with no key tolerates every taint
                if "*" not in policy.toleration_keys:
                    out.append(
                        f"spec.placement.tolerations[{i}]: a toleration without a key tolerates every taint and "
                        f"is allowed only when {v['toleration_keys']} is '*'"
                    )
            elif not _allowed(t.key, policy.toleration_keys):
                out.append(
                    _refusal(
                        f"spec.placement.tolerations[{i}].key", t.key, v["toleration_keys"], policy.toleration_keys
                    )
                )
    addr = spec.autoscaling.scaler_address
    if addr and addr != scaler_address:
        out.append(
            f"spec.autoscaling.scalerAddress {addr!r} is not allowed: it must be empty or the operator's "
            f"scaler ({scaler_address}, SLUICEWAY_SCALER_ADDRESS)"
        )
    return out
