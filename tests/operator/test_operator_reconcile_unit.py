"""The Reconciler against an in-memory fake of :class:`Kube` (an extra unit test; the real thing is
tested against kube-apiserver in test_operator_hardening.py): Event de-duplication across ticks and
across an operator restart, and nothing applied when one dry run is refused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluiceway_operator.kube import ApiError, SecretProblem
from sluiceway_operator.reconcile import Reconciler
from sluiceway_operator.settings import OperatorConfig


class FakeKube:
    def __init__(self, refuse_kind: str | None = None) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.applied: list[tuple[str, bool]] = []
        self.events: list[str] = []
        self.status: dict[str, Any] = {}
        self.refuse_kind = refuse_kind

    def crd_exists(self, name: str) -> bool:
        return False

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((kind, name))

    def apply(self, manifest: Mapping[str, Any], *, dry_run: bool = False, manager: str = "") -> dict[str, Any]:
        if manifest["kind"] == self.refuse_kind:
            raise ApiError("PATCH x: 422 Unprocessable Entity: denied by policy", 422)
        self.applied.append((manifest["kind"], dry_run))
        return dict(manifest)

    def hand_over_replicas(self, deployment: Mapping[str, Any]) -> bool:
        return False

    def delete_owned(self, *args: Any) -> bool:
        return False

    def read_secret_value(self, namespace: str, name: str, key: str) -> str | SecretProblem:
        return SecretProblem("SecretNotFound", f"Secret {namespace}/{name} does not exist")

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
    rec = Reconciler(OperatorConfig(), kube)  # type: ignore[arg-type]
    for _ in range(5):
        rec.apply_children(_body(**TENANT))
    assert kube.events == ["SecretNotFound"]
    assert kube.applied == []  # nothing written while the config is invalid
    # A new operator process sees the condition already reported: no second Event.
    restarted = Reconciler(OperatorConfig(), kube)  # type: ignore[arg-type]
    restarted.apply_children(_body(status=kube.status, **TENANT))
    assert kube.events == ["SecretNotFound"]


def test_a_refused_dry_run_applies_nothing() -> None:
    kube = FakeKube(refuse_kind="Deployment")
    rec = Reconciler(OperatorConfig(), kube)  # type: ignore[arg-type]
    outcome = rec.apply_children(_body())
    assert outcome.config_error is not None and outcome.config_error[0] == "ChildRejected"
    assert "denied by policy" in outcome.config_error[1]
    assert all(dry for _, dry in kube.applied)  # only the dry runs before the refusal
    assert kube.events == ["ChildRejected"]
