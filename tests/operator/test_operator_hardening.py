"""Operator hardening against a real control plane: one Event per problem, replica hand-over on an
engine switch, no adoption of foreign objects, refused children reported without partial children,
and faults (kube-apiserver restarted, the operator killed mid-reconcile).

Like ``test_operator_apiserver.py``: etcd + kube-apiserver (RBAC) + kube-controller-manager, the
operator as a real subprocess under the chart's least-privilege rules, a stand-in KEDA CRD.
"""

from __future__ import annotations

import base64
import contextlib
import signal
import subprocess
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
    operator_command,
    operator_env,
    operator_kubeconfig,
    run_operator,
    stop_process,
    wait_for,
)
from operator_support import load_crd
from sluiceway_operator.kube import FIELD_MANAGER, REPLICAS_MANAGER, ApiError, Kube
from sluiceway_operator.render import Owner, build_deployment
from sluiceway_operator.spec import parse_spec

pytestmark = [pytest.mark.apiserver, pytest.mark.slow, pytest.mark.timeout(600)]

NS = "sluiceway-hard"
FAULT_NS = "sluiceway-fault"
OP_NS = "sluiceway-system"
GVP = "/apis/sluiceway.io/v1alpha1/namespaces/{ns}/inferenceservices"
CHILD_PATHS = {
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "Service": "/api/v1/namespaces/{ns}/services",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "ScaledObject": "/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects",
}


@pytest.fixture(scope="module")
def admin(control_plane: ControlPlane) -> Admin:
    a = Admin(Kube(control_plane.client()))
    establish_crd(a, load_crd())
    establish_crd(a, KEDA_STANDIN_CRD)
    for ns in (NS, FAULT_NS, OP_NS):
        if a.get(f"/api/v1/namespaces/{ns}") is None:
            a.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    return a


@pytest.fixture(scope="module")
def kubeconfig(control_plane: ControlPlane, admin: Admin) -> Path:
    return operator_kubeconfig(control_plane, admin, OP_NS)


@pytest.fixture
def operator_process(control_plane: ControlPlane, kubeconfig: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    # One operator per test, its log checked for RBAC denials when the test ends. Module-scoped, it
    # also lived through the API-server restart of the fault tests below, and a restarted API server
    # answers 403 until its RBAC caches have synced: a denial the fault causes, not the chart's RBAC.
    log = control_plane.workdir / f"operator-{request.node.name}.log"
    with run_operator(kubeconfig, log, NS, "--drift-interval", "1", "--signals-interval", "1") as path:
        yield path


@contextlib.contextmanager
def _operator(kubeconfig: Path, log: Path, namespace: str) -> Iterator[subprocess.Popen[bytes]]:
    """An operator process the test may kill (fault tests); stopped on exit whatever happened."""
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            operator_command(namespace, "--drift-interval", "1", "--signals-interval", "1"),
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=operator_env(kubeconfig),
        )
        try:
            yield proc
        finally:
            stop_process(proc)


def _isvc(name: str, ns: str = NS, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"image": "registry.example/sluiceway-pod:test", "format": "synthetic", "source": "synthetic:10"}
    }
    base.update(spec)
    return {
        "apiVersion": "sluiceway.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": ns},
        "spec": base,
    }


def _path(name: str = "", ns: str = NS) -> str:
    p = GVP.format(ns=ns)
    return f"{p}/{name}" if name else p


def _cond(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return c
    return None


def _get(admin: Admin, kind: str, name: str, ns: str = NS) -> dict[str, Any] | None:
    child = f"{name}-config" if kind == "ConfigMap" else f"{name}-keys" if kind == "Secret" else name
    result: dict[str, Any] | None = admin.get(CHILD_PATHS[kind].format(ns=ns) + f"/{child}")
    return result


def _labelled(admin: Admin, kind: str, name: str, ns: str = NS) -> list[dict[str, Any]]:
    sel = [("labelSelector", f"sluiceway.io/inferenceservice={name}")]
    items: list[dict[str, Any]] = admin.call("GET", CHILD_PATHS[kind].format(ns=ns), query=sel)["items"]
    return items


def _warnings(admin: Admin, name: str, uid: str, ns: str = NS) -> list[dict[str, Any]]:
    items = admin.call(
        "GET", f"/api/v1/namespaces/{ns}/events", query=[("fieldSelector", f"involvedObject.name={name}")]
    )["items"]
    return [e for e in items if e["type"] == "Warning" and e["involvedObject"].get("uid") == uid]


def _condition_is(admin: Admin, name: str, ctype: str, status: str, ns: str = NS) -> Any:
    def check() -> dict[str, Any] | None:
        obj = admin.get(_path(name, ns))
        c = _cond(obj, ctype)
        gen = (obj or {}).get("metadata", {}).get("generation")
        ok = c and c["status"] == status and (obj or {}).get("status", {}).get("observedGeneration") == gen
        return obj if ok else None

    return wait_for(check, 40, what=f"{name} {ctype}={status}")


def _exactly_as_desired(admin: Admin, name: str, uid: str, ns: str, kinds: tuple[str, ...]) -> None:
    """The desired objects of each child kind (one, and for Services also ``<name>-metrics``), each
    controlled by this InferenceService; none left over."""
    for kind in kinds:
        items = _labelled(admin, kind, name, ns)
        names = sorted(i["metadata"]["name"] for i in items)
        if kind == "Service":
            assert names == [name, f"{name}-metrics"], (kind, names)
        else:
            assert len(items) == 1, (kind, names)
        for item in items:
            refs = item["metadata"].get("ownerReferences") or []
            assert [(r["uid"], r.get("controller")) for r in refs] == [(uid, True)], kind


CORE_KINDS = ("ConfigMap", "Secret", "Deployment", "Service", "PodDisruptionBudget")


# ---------------------------------------------------------------------------------------- events


def test_one_warning_event_per_problem(admin: Admin, operator_process: Path) -> None:
    """A config error posts exactly one Warning Event, however many times it is reconciled."""
    spec = {"autoscaling": {"engine": "none"}, "tenants": [{"name": "gamma", "keySecretRef": {"name": "gamma-key"}}]}
    uid = admin.create(_path(), _isvc("oneevent", **spec))["metadata"]["uid"]
    obj = _condition_is(admin, "oneevent", "ConfigValid", "False")
    assert _cond(obj, "ConfigValid")["reason"] == "TenantKeyUnavailable"
    time.sleep(6)  # six drift ticks and as many signals ticks
    warnings = _warnings(admin, "oneevent", uid)
    assert [(e["reason"], e.get("count", 1)) for e in warnings] == [("TenantKeyUnavailable", 1)], warnings
    admin.call("DELETE", _path("oneevent"))


# ----------------------------------------------------------------------------- replicas hand-over


def test_engine_switch_keeps_the_replica_count(admin: Admin, operator_process: Path) -> None:
    """none -> keda must not drop the Deployment to 1 replica (issue 10 item 10)."""
    admin.create(_path(), _isvc("switch", replicas=3, autoscaling={"engine": "none"}))
    wait_for(lambda: ((_get(admin, "Deployment", "switch") or {}).get("spec") or {}).get("replicas") == 3, 40)
    admin.call("PATCH", _path("switch"), body=[{"op": "replace", "path": "/spec/autoscaling/engine", "value": "keda"}])
    wait_for(lambda: _get(admin, "ScaledObject", "switch"), 40, what="ScaledObject")
    for _ in range(6):  # several drift ticks: the count stays
        time.sleep(1)
        assert _get(admin, "Deployment", "switch")["spec"]["replicas"] == 3
    # The HPA scales; the operator leaves it alone. Back to none: the operator takes it again.
    admin.call(
        "PATCH",
        f"/apis/apps/v1/namespaces/{NS}/deployments/switch/scale",
        body=[{"op": "replace", "path": "/spec/replicas", "value": 4}],
    )
    time.sleep(3)
    assert _get(admin, "Deployment", "switch")["spec"]["replicas"] == 4
    admin.call(
        "PATCH",
        _path("switch"),
        body=[
            {"op": "replace", "path": "/spec/autoscaling/engine", "value": "none"},
            {"op": "replace", "path": "/spec/replicas", "value": 2},
        ],
    )
    wait_for(lambda: _get(admin, "Deployment", "switch")["spec"]["replicas"] == 2, 40, what="replicas 2")
    admin.call("DELETE", _path("switch"))


def test_replicas_hand_over_from_the_single_manager(admin: Admin) -> None:
    """A Deployment whose replicas the Deployment's own manager owns (the operator before the split)
    keeps its count when the operator applies it without replicas, after :meth:`hand_over_replicas`;
    without the hand-over, the same apply drops it to 1 (the defect)."""
    kube = admin.kube
    spec = parse_spec(_isvc("x")["spec"])

    def old_style(name: str) -> dict[str, Any]:
        dep = build_deployment(Owner(name, NS, "00000000-0000-0000-0000-000000000000"), spec, "h")
        dep["metadata"].pop("ownerReferences")
        dep["spec"]["replicas"] = 3
        kube.apply(dep)  # under FIELD_MANAGER, replicas included
        return dep

    for name, hand_over in (("handover-no", False), ("handover-yes", True)):
        dep = old_style(name)
        current = admin.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{name}")
        assert current["spec"]["replicas"] == 3
        if hand_over:
            assert kube.hand_over_replicas(current) is True
        del dep["spec"]["replicas"]
        kube.apply(dep)
        after = admin.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{name}")
        assert after["spec"]["replicas"] == (3 if hand_over else 1), name
        if hand_over:
            managers = {
                m["manager"]
                for m in after["metadata"]["managedFields"]
                if "f:replicas" in m.get("fieldsV1", {}).get("f:spec", {})
            }
            assert managers == {REPLICAS_MANAGER}
            assert kube.hand_over_replicas(after) is False  # already done: a no-op
        admin.call("DELETE", f"/apis/apps/v1/namespaces/{NS}/deployments/{name}")
    assert FIELD_MANAGER != REPLICAS_MANAGER


# --------------------------------------------------------------------------------- name conflicts


def test_refuses_to_adopt_an_object_it_does_not_control(admin: Admin, operator_process: Path) -> None:
    """A Secret named like a child is not taken over: NameConflict, nothing applied at all."""
    admin.create(
        f"/api/v1/namespaces/{NS}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "clash-keys"},
            "data": {"keys.txt": base64.b64encode(b"someone else's\n").decode()},
        },
    )
    uid = admin.create(_path(), _isvc("clash", autoscaling={"engine": "none"}))["metadata"]["uid"]
    obj = _condition_is(admin, "clash", "ConfigValid", "False")
    c = _cond(obj, "ConfigValid")
    assert c["reason"] == "NameConflict"
    assert f"Secret {NS}/clash-keys" in c["message"]
    time.sleep(3)
    secret = _get(admin, "Secret", "clash")
    assert base64.b64decode(secret["data"]["keys.txt"]) == b"someone else's\n"
    assert not secret["metadata"].get("ownerReferences")
    for kind in ("ConfigMap", "Deployment", "Service", "PodDisruptionBudget"):
        assert _get(admin, kind, "clash") is None, kind  # no partial children
    assert [e["reason"] for e in _warnings(admin, "clash", uid)] == ["NameConflict"]
    # The foreign object goes away: the next drift tick creates the children.
    admin.call("DELETE", f"/api/v1/namespaces/{NS}/secrets/clash-keys")
    _condition_is(admin, "clash", "ConfigValid", "True")
    wait_for(lambda: all(_get(admin, k, "clash") for k in CORE_KINDS), 40, what="children")
    _exactly_as_desired(admin, "clash", uid, NS, CORE_KINDS)
    admin.call("DELETE", _path("clash"))


# ------------------------------------------------------------------------------- refused children


def test_invalid_affinity_is_config_invalid_before_any_apply(admin: Admin, operator_process: Path) -> None:
    """An affinity the Deployment's validation would refuse (operator In with no values) is caught
    by the operator's model: ConfigValid=False/InvalidSpec, one Event, no children."""
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In"}]}]
            }
        }
    }
    uid = admin.create(_path(), _isvc("badaffinity", placement={"affinity": affinity}))["metadata"]["uid"]
    obj = _condition_is(admin, "badaffinity", "ConfigValid", "False")
    c = _cond(obj, "ConfigValid")
    assert c["reason"] == "InvalidSpec" and "operator In needs values" in c["message"], c
    time.sleep(3)
    for kind in CORE_KINDS:
        assert _get(admin, kind, "badaffinity") is None, kind
    assert [e["reason"] for e in _warnings(admin, "badaffinity", uid)] == ["InvalidSpec"]
    admin.call("DELETE", _path("badaffinity"))


def _deny_forbidden_images(admin: Admin) -> None:
    """A cluster policy the operator cannot know about: a ValidatingAdmissionPolicy (CEL) in NS
    that refuses Deployments whose image names 'forbidden'."""
    vap = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
    admin.create(
        vap,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "no-forbidden-images"},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["deployments"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "!object.spec.template.spec.containers.exists(c, c.image.contains('forbidden'))",
                        "message": "images named 'forbidden' are not allowed in this namespace",
                        "reason": "Invalid",
                    }
                ],
            },
        },
    )
    admin.create(
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "no-forbidden-images"},
            "spec": {
                "policyName": "no-forbidden-images",
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}}},
            },
        },
    )
    probe = build_deployment(Owner("probe", NS, "u"), parse_spec(_isvc("x")["spec"]), "h")
    probe["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.example/forbidden:1"
    probe["metadata"].pop("ownerReferences")

    def denied() -> bool:
        try:
            admin.kube.apply(probe, dry_run=True)
        except ApiError as err:
            return "not allowed in this namespace" in str(err)
        return False

    wait_for(denied, 30, what="the admission policy in force")


def test_refused_child_is_reported_and_nothing_is_applied(admin: Admin, operator_process: Path) -> None:
    """A child the API server refuses for a reason the operator cannot see (here a cluster
    admission policy): ConfigValid=False/ChildRejected with the API server's message, one Event,
    and no children at all (every child is dry-run before any is written)."""
    _deny_forbidden_images(admin)
    model = {"image": "registry.example/forbidden:1", "format": "synthetic", "source": "synthetic:10"}
    uid = admin.create(_path(), _isvc("refused", model=model))["metadata"]["uid"]
    obj = _condition_is(admin, "refused", "ConfigValid", "False")
    c = _cond(obj, "ConfigValid")
    assert c["reason"] == "ChildRejected"
    assert f"Deployment {NS}/refused refused by the API server" in c["message"], c["message"]
    assert "images named 'forbidden' are not allowed in this namespace" in c["message"], c["message"]
    assert _cond(obj, "Ready")["status"] == "False"
    time.sleep(3)
    for kind in CORE_KINDS:
        assert _get(admin, kind, "refused") is None, kind  # not even the ConfigMap and Secret
    assert [e["reason"] for e in _warnings(admin, "refused", uid)] == ["ChildRejected"]
    admin.call(
        "PATCH",
        _path("refused"),
        body=[{"op": "replace", "path": "/spec/model/image", "value": "registry.example/allowed:1"}],
    )
    _condition_is(admin, "refused", "ConfigValid", "True")
    wait_for(lambda: all(_get(admin, k, "refused") for k in CORE_KINDS), 40, what="children")
    admin.call("DELETE", _path("refused"))


# ------------------------------------------------------------------------------------------ faults


def _converged(admin: Admin, name: str, uid: str, ns: str, queue_timeout: float) -> None:
    def check() -> bool:
        obj = admin.get(_path(name, ns))
        if (obj.get("status") or {}).get("observedGeneration") != obj["metadata"]["generation"]:
            return False
        cm = _get(admin, "ConfigMap", name, ns)
        if not cm or yaml.safe_load(cm["data"]["config.yaml"])["queue"]["timeoutSeconds"] != queue_timeout:
            return False
        return all(_get(admin, k, name, ns) for k in CORE_KINDS)

    wait_for(check, 60, what=f"{name} converged")
    _exactly_as_desired(admin, name, uid, ns, CORE_KINDS)
    dep = _get(admin, "Deployment", name, ns)
    cm = _get(admin, "ConfigMap", name, ns)
    obj = admin.get(_path(name, ns))
    assert obj["status"]["configHash"] == dep["spec"]["template"]["metadata"]["annotations"]["sluiceway.io/config-hash"]
    assert yaml.safe_load(cm["data"]["config.yaml"])["model"]["spec"] == "synthetic:10"
    assert not obj["metadata"].get("finalizers")


def test_kube_apiserver_restart_while_the_operator_runs(
    admin: Admin, control_plane: ControlPlane, kubeconfig: Path
) -> None:
    log = control_plane.workdir / "operator-restart.log"
    with _operator(kubeconfig, log, FAULT_NS) as proc:
        uid = admin.create(_path("restart", FAULT_NS), _isvc("restart", FAULT_NS, autoscaling={"engine": "none"}))[
            "metadata"
        ]["uid"]
        _converged(admin, "restart", uid, FAULT_NS, 5.0)
        control_plane.stop_apiserver()
        try:
            time.sleep(8)  # several ticks and a broken watch while the API server is gone
        finally:
            control_plane.start_apiserver()
        assert proc.poll() is None, log.read_text()[-3000:]
        # Changes made after the restart reach the children; a deleted child comes back.
        admin.call(
            "PATCH",
            _path("restart", FAULT_NS),
            body=[{"op": "replace", "path": "/spec/timeouts", "value": {"queue": "3s"}}],
        )
        admin.call("DELETE", f"/api/v1/namespaces/{FAULT_NS}/services/restart")
        _converged(admin, "restart", uid, FAULT_NS, 3.0)
        assert proc.poll() is None
    admin.call("DELETE", _path("restart", FAULT_NS))


@pytest.mark.parametrize("kill_after", [0.0, 0.4, 1.2])
def test_operator_killed_mid_reconcile_and_restarted(
    admin: Admin, control_plane: ControlPlane, kubeconfig: Path, kill_after: float
) -> None:
    """SIGKILL the operator while it creates the children, change the spec while it is down, start
    a new one: the children end exactly as desired, none duplicated or orphaned."""
    name = f"killed{int(kill_after * 10)}"
    log = control_plane.workdir / f"operator-{name}.log"
    admin.create(
        f"/api/v1/namespaces/{FAULT_NS}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{name}-tenant", "labels": {"sluiceway.io/tenant-key": "true"}},
            "data": {"key": base64.b64encode(b"tenant-key").decode()},
        },
    )
    spec = {
        "replicas": 2,
        "autoscaling": {"engine": "none"},
        "tenants": [{"name": "delta", "keySecretRef": {"name": f"{name}-tenant"}}],
    }
    with _operator(kubeconfig, log, FAULT_NS) as first:
        time.sleep(2)  # the operator is up and watching
        uid = admin.create(_path(name, FAULT_NS), _isvc(name, FAULT_NS, **spec))["metadata"]["uid"]
        if kill_after:
            wait_for(
                lambda: _labelled(admin, "ConfigMap", name, FAULT_NS) or _labelled(admin, "Secret", name, FAULT_NS), 30
            )
            time.sleep(kill_after)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    admin.call(
        "PATCH", _path(name, FAULT_NS), body=[{"op": "replace", "path": "/spec/timeouts", "value": {"queue": "3s"}}]
    )
    with _operator(kubeconfig, log, FAULT_NS) as second:
        _converged(admin, name, uid, FAULT_NS, 3.0)
        assert _get(admin, "Deployment", name, FAULT_NS)["spec"]["replicas"] == 2
        # Pods never become ready here (no kubelet), so a rollout stalls at its surge pod: at most
        # replicas + maxSurge pods, all from this Deployment's ReplicaSets.
        # (After the API-server restart test the controller-manager's informers take ~20 s to
        # reconnect, hence the wide bound.)
        wait_for(lambda: 2 <= len(_labelled_pods(admin, name)) <= 3, 120, interval=1, what="2 pods")
        assert second.poll() is None
    admin.call("DELETE", _path(name, FAULT_NS))


def _labelled_pods(admin: Admin, name: str) -> list[dict[str, Any]]:
    sel = [("labelSelector", f"sluiceway.io/inferenceservice={name}")]
    pods: list[dict[str, Any]] = admin.call("GET", f"/api/v1/namespaces/{FAULT_NS}/pods", query=sel)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]
