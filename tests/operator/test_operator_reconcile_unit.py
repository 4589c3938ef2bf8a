"""The Reconciler against an in-memory fake of :class:`Kube` (an extra unit test; the real thing is
tested against kube-apiserver in test_operator_hardening.py): Event de-duplication across ticks and
across an operator restart, and nothing applied when one dry run is refused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluiceway_operator.kube import ApiError, SecretProblem
from sluiceway_operator.policy import Policy
from sluiceway_operator.reconcile import Reconciler
from sluiceway_operator.settings import OperatorConfig

#: The policy allows the tests' images (the policy itself: test_operator_policy.py).
OPEN = OperatorConfig(policy=Policy.open())


class FakeKube:
    def __init__(self, refuse_kind: str | None = None) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.applied: list[tuple[str, bool]] = []
        self.applied_manifests: list[tuple[str, dict[str, Any]]] = []
        self.events: list[str] = []
        self.status: dict[str, Any] = {}
        self.refuse_kind = refuse_kind

    def crd_exists(self, name: str) -> bool:
        return False

    def crd_serves(self, name: str, version: str) -> bool:
        return False

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((kind, name))

    def apply(self, manifest: Mapping[str, Any], *, dry_run: bool = False, manager: str = "") -> dict[str, Any]:
        if manifest["kind"] == self.refuse_kind:
            raise ApiError("PATCH x: 422 Unprocessable Entity: denied by policy", 422)
        self.applied.append((manifest["kind"], dry_run))
        if not dry_run:
            self.applied_manifests.append((manifest["kind"], dict(manifest)))
        return dict(manifest)

    def hand_over_replicas(self, deployment: Mapping[str, Any]) -> bool:
        return False

    def delete_owned(self, *args: Any) -> bool:
        return False

    def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        return []

    def read_secret_value(self, namespace: str, name: str, key: str) -> str | SecretProblem:
        return SecretProblem("TenantKeyUnavailable", f"keySecretRef {name}/{key} cannot be used")

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.status = dict(status)

    def post_event(self, owner: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        self.events.append(reason)


def _body(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    s = {"model": {"image": "i:1", "format": "demo", "source": "demo"}, **spec}
    return {
        "metadata": {"name": "a", "namespace": "n", "uid": "u1", "generation": 1},
        "spec": s,
        "status": status or {},
    }


TENANT = {"tenants": [{"name": "t", "keySecretRef": {"name": "missing"}}]}


def test_one_event_per_problem_across_ticks_and_restarts() -> None:
    kube = FakeKube()
    rec = Reconciler(OPEN, kube)  # type: ignore[arg-type]
    for _ in range(5):
        rec.apply_children(_body(**TENANT))
    assert kube.events == ["TenantKeyUnavailable"]
    assert kube.applied == []  # nothing written while the config is invalid
    # A new operator process sees the condition already reported: no second Event.
    restarted = Reconciler(OPEN, kube)  # type: ignore[arg-type]
    restarted.apply_children(_body(status=kube.status, **TENANT))
    assert kube.events == ["TenantKeyUnavailable"]


def test_a_refused_dry_run_applies_nothing() -> None:
    kube = FakeKube(refuse_kind="Deployment")
    rec = Reconciler(OPEN, kube)  # type: ignore[arg-type]
    outcome = rec.apply_children(_body())
    assert outcome.config_error is not None and outcome.config_error[0] == "ChildRejected"
    assert "denied by policy" in outcome.config_error[1]
    assert all(dry for _, dry in kube.applied)  # only the dry runs before the refusal
    assert kube.events == ["ChildRejected"]


def test_builtin_engine_policy_carries_the_release_window() -> None:
    """The builtin engine's policy gets ``scaleDown.releaseWindow`` (default 20m, ``0s`` off), and
    with it releases a surplus that outlasted the window instead of pacing it out at 2 % a minute."""
    from sluiceway_core.policy import HistoryEntry, ScaleHistory, Signals, desired_replicas
    from sluiceway_operator.reconcile import builtin_scaling_spec
    from sluiceway_operator.spec import parse_spec

    def scaling(**down: str) -> Any:
        spec = _body(autoscaling={"engine": "builtin", "maxReplicas": 100, "scaleDown": down})["spec"]
        return builtin_scaling_spec(parse_spec(spec))

    assert scaling().scale_down.release_window == 1200
    assert scaling(releaseWindow="30m").scale_down.release_window == 1800
    assert scaling(releaseWindow="0s").scale_down.release_window is None
    default = scaling().scale_down
    assert (default.stabilization_window, default.max_pods, default.max_percent, default.period) == (90, 1, 2, 60)

    # 21 minutes in which every recommendation was 2 while 50 replicas run: released to 2 at once.
    history = ScaleHistory(tuple(HistoryEntry(float(t), 2, 50) for t in range(0, 1261, 15)))
    quiet = Signals(queue_depth=0.0, utilisation=0.0)
    released = desired_replicas(quiet, scaling(), 50, history, 1275.0)
    assert released.replicas == 2, released.reason
    # Off: the pace holds (at most max(1 pod, 2 %) per minute below the highest recent count).
    paced = desired_replicas(quiet, scaling(releaseWindow="0s"), 50, history, 1275.0)
    assert paced.replicas == 49, paced.reason


def test_edge_token_without_a_quota_key_is_generated_once_and_kept() -> None:
    """No quota key: the gateway's token is random (256 bits) the first time and the one in this
    object's own ``<name>-edge`` Secret afterwards; a Secret it does not control, or one holding no
    usable token, is not trusted."""
    import base64

    def token_of(kube: FakeKube) -> str:
        (secret,) = [m for kind, m in kube.applied_manifests if kind == "Secret" and m["metadata"]["name"] == "a-edge"]
        return base64.b64decode(secret["data"]["token"]).decode()

    body = _body(gateway={"enabled": True})
    first = FakeKube()
    Reconciler(OPEN, first).apply_children(body)  # type: ignore[arg-type]
    token = token_of(first)
    assert len(token) == 64 and int(token, 16) >= 0
    again = FakeKube()
    kept = {"token": base64.b64encode(token.encode()).decode()}
    again.objects[("Secret", "a-edge")] = {
        "metadata": {"name": "a-edge", "ownerReferences": [{"uid": "u1", "controller": True}]},
        "data": kept,
    }
    Reconciler(OPEN, again).apply_children(body)  # type: ignore[arg-type]
    assert token_of(again) == token
    for data, refs in (
        ({"token": base64.b64encode(b"short").decode()}, [{"uid": "u1", "controller": True}]),
        (kept, []),
    ):
        other = FakeKube()
        other.objects[("Secret", "a-edge")] = {"metadata": {"name": "a-edge", "ownerReferences": refs}, "data": data}
        outcome = Reconciler(OPEN, other).apply_children(body)  # type: ignore[arg-type]
        if refs:  # ours but unusable: a fresh one
            assert token_of(other) not in (token, "short")
        else:  # not ours: never adopted
            assert outcome.config_error is not None and outcome.config_error[0] == "NameConflict"
