"""The operator reacting to what it watches, on a real control plane (etcd + kube-apiserver +
kube-controller-manager), under the chart's rules, with a drift tick of an hour so that nothing
here can come from the drift repair:

* a rotated tenant-key Secret reaches the ``<name>-keys`` Secret (the pods' and the gateway's key
  file) within seconds, through the label-selected Secret watch, without a rollout;
* a key Secret that gains its consent label later is picked up as promptly;
* a pod that crash-loops or cannot be scheduled (its status written as the kubelet and the
  scheduler write it) turns ``PodsHealthy`` and ``Ready`` False with the reason and the container's
  scrubbed termination message.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubetools import Admin, ControlPlane, establish_crd, operator_kubeconfig, run_operator, wait_for
from operator_support import load_crd
from sluiceway_core.keys import parse_keys_text
from sluiceway_operator.kube import Kube

pytestmark = [pytest.mark.apiserver, pytest.mark.slow, pytest.mark.timeout(300)]

NS = "sluiceway-watch"
OP_NS = "sluiceway-system"
GVP = f"/apis/sluiceway.io/v1alpha1/namespaces/{NS}/inferenceservices"
#: The drift tick of this module's operator: longer than any test here.
DRIFT = "3600"
#: "Within a few seconds": the debounce (1 s) plus a spec pass, with room for 2 shared cores.
PROMPT = 10.0


@pytest.fixture(scope="module")
def admin(control_plane: ControlPlane) -> Admin:
    a = Admin(Kube(control_plane.client()))
    establish_crd(a, load_crd())
    for ns in (NS, OP_NS):
        if a.get(f"/api/v1/namespaces/{ns}") is None:
            a.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    return a


@pytest.fixture(scope="module")
def operator_log(control_plane: ControlPlane, admin: Admin) -> Iterator[Path]:
    kubeconfig = operator_kubeconfig(control_plane, admin, OP_NS)
    log = control_plane.workdir / "operator-watch.log"
    with run_operator(kubeconfig, log, NS, "--drift-interval", DRIFT, "--signals-interval", "1") as path:
        yield path


def _isvc(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"image": "registry.example/sluiceway-pod:test", "format": "synthetic", "source": "synthetic:10"},
        "autoscaling": {"engine": "none"},
    }
    base.update(spec)
    return {
        "apiVersion": "sluiceway.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": NS},
        "spec": base,
    }


def _secret(admin: Admin, name: str, value: str, labelled: bool = True) -> None:
    admin.create(
        f"/api/v1/namespaces/{NS}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "labels": {"sluiceway.io/tenant-key": "true"} if labelled else {}},
            "data": {"key": base64.b64encode(value.encode()).decode()},
        },
    )


def _cond(admin: Admin, name: str, ctype: str) -> dict[str, Any] | None:
    obj = admin.get(f"{GVP}/{name}") or {}
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


def _template_hash(admin: Admin, deployment: str) -> str:
    dep = admin.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{deployment}")
    return str(dep["spec"]["template"]["metadata"]["annotations"]["sluiceway.io/config-hash"])


def _replicasets(admin: Admin, name: str) -> list[str]:
    sel = f"sluiceway.io/inferenceservice={name}"
    items = admin.call("GET", f"/apis/apps/v1/namespaces/{NS}/replicasets", query=[("labelSelector", sel)])["items"]
    return sorted(rs["metadata"]["name"] for rs in items)


def _keys(admin: Admin, name: str) -> str:
    secret = admin.get(f"/api/v1/namespaces/{NS}/secrets/{name}-keys") or {}
    return base64.b64decode((secret.get("data") or {}).get("keys.txt", "")).decode()


# ------------------------------------------------------------------------------ tenant-key watch


def test_a_rotated_key_reaches_the_key_file_within_seconds_without_a_rollout(admin: Admin, operator_log: Path) -> None:
    """With the drift tick at an hour, only the Secret watch can carry the rotation: the new key's
    hash is in ``<name>-keys`` (mounted by the pods and by the gateway, which reload it in place)
    within :data:`PROMPT` seconds, the old one is gone, and neither Deployment's template changes
    (same hashes, same ReplicaSets, with the real controller-manager)."""
    name = "rotor"
    _secret(admin, "rotor-key", "rotor-first-key-value")
    spec = {
        "tenants": [{"name": "acme", "keySecretRef": {"name": "rotor-key"}, "rate": "10/s"}],
        "gateway": {"enabled": True},
    }
    admin.create(GVP, _isvc(name, **spec))
    wait_for(lambda: len(_replicasets(admin, name)) == 2, 60, what="the pods' and the gateway's ReplicaSets")
    assert parse_keys_text(_keys(admin, name)).lookup("rotor-first-key-value") == "acme"
    hashes = (_template_hash(admin, name), _template_hash(admin, f"{name}-gateway"))
    replicasets = _replicasets(admin, name)

    for n, value in enumerate(("rotor-second-key-value", "rotor-third-key-value")):
        start = time.monotonic()
        admin.call(
            "PATCH",
            f"/api/v1/namespaces/{NS}/secrets/rotor-key",
            body=[{"op": "replace", "path": "/data/key", "value": base64.b64encode(value.encode()).decode()}],
        )
        wait_for(lambda v=value: parse_keys_text(_keys(admin, name)).lookup(v) == "acme", PROMPT, what=value)
        elapsed = time.monotonic() - start
        keys = parse_keys_text(_keys(admin, name))
        assert keys.lookup("rotor-first-key-value") is None
        print(f"\nrotation {n + 1}: the new key's hash in {name}-keys after {elapsed:.2f}s (drift tick {DRIFT}s)")
    time.sleep(3)  # the controller-manager: a rollout would show by now
    assert (_template_hash(admin, name), _template_hash(admin, f"{name}-gateway")) == hashes
    assert _replicasets(admin, name) == replicasets
    admin.call("DELETE", f"{GVP}/{name}")
    text = operator_log.read_text(errors="replace")
    assert "rotor-second-key-value" not in text and "rotor-third-key-value" not in text


def test_a_key_secret_that_gains_its_label_later_is_picked_up_within_seconds(admin: Admin, operator_log: Path) -> None:
    """An unlabelled key Secret is not the operator's to read (``TenantKeyUnavailable``, nothing
    rendered); once its owner labels it, the watch (which selects by that label) sees it ADDED and
    the service is rendered within :data:`PROMPT` seconds; removing the label again (the watch then
    reports the Secret DELETED) gives ``TenantKeyUnavailable`` as promptly. A Secret that never gets
    the label reaches the operator by no watch (the API server filters)."""
    name = "consent"
    _secret(admin, "consent-key", "consent-key-value", labelled=False)
    admin.create(GVP, _isvc(name, tenants=[{"name": "late", "keySecretRef": {"name": "consent-key"}}]))
    cond = wait_for(lambda: _cond(admin, name, "ConfigValid"), 30, what="ConfigValid")
    assert (cond["status"], cond["reason"]) == ("False", "TenantKeyUnavailable")
    start = time.monotonic()
    admin.call(
        "PATCH",
        f"/api/v1/namespaces/{NS}/secrets/consent-key",
        body=[{"op": "add", "path": "/metadata/labels", "value": {"sluiceway.io/tenant-key": "true"}}],
    )
    wait_for(lambda: (_cond(admin, name, "ConfigValid") or {}).get("status") == "True", PROMPT, what="ConfigValid")
    print(f"\nlabelled: ConfigValid True after {time.monotonic() - start:.2f}s (drift tick {DRIFT}s)")
    assert parse_keys_text(_keys(admin, name)).lookup("consent-key-value") == "late"
    # consent withdrawn: the watch's DELETED (the Secret no longer matches its selector) re-applies
    start = time.monotonic()
    admin.call(
        "PATCH", f"/api/v1/namespaces/{NS}/secrets/consent-key", body=[{"op": "remove", "path": "/metadata/labels"}]
    )
    cond = wait_for(
        lambda: (c := _cond(admin, name, "ConfigValid")) is not None and c["status"] == "False" and c,
        PROMPT,
        what="ConfigValid False once the label is removed",
    )
    assert cond["reason"] == "TenantKeyUnavailable"
    print(f"unlabelled: ConfigValid False/TenantKeyUnavailable after {time.monotonic() - start:.2f}s")
    admin.call("DELETE", f"{GVP}/{name}")


# ------------------------------------------------------------------------------ why a pod cannot start


def _now_minus(seconds: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_an_unschedulable_then_crash_looping_pod_says_why_in_ready(admin: Admin, operator_log: Path) -> None:
    """Issue 20: the Deployment's pod, with its status written as the scheduler writes it
    (``PodScheduled`` False/``Unschedulable`` for two minutes) and then, once bound to a node, as
    the kubelet writes a crash loop (``CrashLoopBackOff`` waiting, ``lastState.terminated`` exit 1
    with the log's tail as its message): ``PodsHealthy`` and ``Ready`` carry the reason and the
    last line of the message, without the credential in the log; a recovered pod turns it True."""
    name = "crashy"
    admin.create(GVP, _isvc(name))
    pod = wait_for(
        lambda: (
            admin.call(
                "GET",
                f"/api/v1/namespaces/{NS}/pods",
                query=[("labelSelector", f"sluiceway.io/inferenceservice={name}")],
            )["items"]
            or [None]
        )[0],
        60,
        what="the Deployment's pod (the controller-manager)",
    )
    pod_name = pod["metadata"]["name"]
    pod_path = f"/api/v1/namespaces/{NS}/pods/{pod_name}"
    start = time.monotonic()
    scheduler = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available.",
        "lastTransitionTime": _now_minus(120),
    }
    admin.call(
        "PATCH",
        pod_path + "/status",
        body=[
            {"op": "add", "path": "/status/conditions", "value": [scheduler]},
            {"op": "replace", "path": "/status/phase", "value": "Pending"},
        ],
    )

    def ready(reason: str) -> dict[str, Any] | None:
        c = _cond(admin, name, "Ready")
        return c if c is not None and c["status"] == "False" and c["reason"] == reason else None

    cond = wait_for(lambda: ready("Unschedulable"), 30, what="Ready False/Unschedulable")
    print(f"\nunschedulable after {time.monotonic() - start:.2f}s: {cond['message']}")
    assert cond["message"].startswith(f"PodsHealthy: pod {pod_name} cannot be scheduled for ")
    assert "Insufficient nvidia.com/gpu" in cond["message"]

    # the scheduler binds it (a Node of its own), the kubelet starts it and it crash-loops
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-watch"}}
    if admin.get("/api/v1/nodes/gpu-node-watch") is None:
        admin.create("/api/v1/nodes", node)
    admin.create(
        pod_path + "/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod_name},
            "target": {"kind": "Node", "name": "gpu-node-watch"},
        },
    )
    tail = (
        "INFO sluiceway-pod serve: loading model synthetic:10\n"
        "DEBUG fetching https://user:hunter2@store.example/m.pt?X-Amz-Signature=s3cr3t\n"
        "Traceback (most recent call last):\n"
        "RuntimeError: CUDA error: out of memory; token=tok-live-0123\n"
    )
    container = {
        "name": "sluiceway-pod",
        "image": "registry.example/sluiceway-pod:test",
        "imageID": "",
        "ready": False,
        "started": False,
        "restartCount": 5,
        "state": {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off 2m40s restarting failed container=sluiceway-pod pod={pod_name}_{NS}(x)",
            }
        },
        "lastState": {
            "terminated": {
                "exitCode": 1,
                "reason": "Error",
                "message": tail,
                "startedAt": _now_minus(20),
                "finishedAt": _now_minus(15),
                "containerID": "containerd://0123",
            }
        },
    }
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now_minus(60)}
    start = time.monotonic()
    admin.call(
        "PATCH",
        pod_path + "/status",
        body=[
            {"op": "replace", "path": "/status/conditions", "value": [scheduled]},
            {"op": "replace", "path": "/status/phase", "value": "Running"},
            {"op": "add", "path": "/status/containerStatuses", "value": [container]},
        ],
    )
    cond = wait_for(lambda: ready("CrashLoopBackOff"), 30, what="Ready False/CrashLoopBackOff")
    print(f"crash loop after {time.monotonic() - start:.2f}s: {cond['message']}")
    assert cond["message"] == (
        f"PodsHealthy: pod {pod_name} container sluiceway-pod: CrashLoopBackOff, 5 restarts, last exit 1 (Error): "
        "RuntimeError: CUDA error: out of memory; token=<redacted>"
    )
    health = _cond(admin, name, "PodsHealthy")
    assert health is not None and health["status"] == "False" and health["reason"] == "CrashLoopBackOff"
    obj = admin.get(f"{GVP}/{name}")
    assert "phase" not in obj["status"] and health["observedGeneration"] == obj["metadata"]["generation"]
    text = str(obj["status"]) + operator_log.read_text(errors="replace")
    for secret in ("hunter2", "s3cr3t", "tok-live-0123"):
        assert secret not in text, secret

    # the kubelet reports it running and ready: PodsHealthy True
    container |= {
        "ready": True,
        "started": True,
        "restartCount": 6,
        "state": {"running": {"startedAt": _now_minus(3)}},
    }
    admin.call(
        "PATCH",
        pod_path + "/status",
        body=[{"op": "replace", "path": "/status/containerStatuses", "value": [container]}],
    )
    wait_for(lambda: (_cond(admin, name, "PodsHealthy") or {}).get("status") == "True", 30, what="PodsHealthy True")
    admin.call("DELETE", f"{GVP}/{name}")
    admin.call("DELETE", "/api/v1/nodes/gpu-node-watch")
