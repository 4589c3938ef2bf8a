"""The real keda-operator (built by tools/build-keda.sh) against a real API server, authenticated as
ServiceAccount keda/keda-operator with only KEDA's own RBAC, using the arguments and certificates
that keda.py puts into its Deployment: it becomes ready, reconciles a ScaledObject into an HPA,
logs no RBAC denial, and its gRPC metrics service speaks mutual TLS with the sandbox's KEDA
certificate under the name the adapter dials."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sluiceway_sandbox import keda
from sluiceway_sandbox.layout import KEDA_OPERATOR_IMAGE, layout_for

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "operator"))
from kubetools import ADMIN_TOKEN, ControlPlane, control_plane, stop_process, write_kubeconfig  # noqa: E402
from netports import free_port as _free_port  # noqa: E402

__all__ = ["control_plane"]

pytestmark = [pytest.mark.apiserver, pytest.mark.slow]



def _call(cp: ControlPlane, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    req = urllib.request.Request(
        f"{cp.server}{path}", data=json.dumps(body).encode() if body is not None else None, method=method,
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


_PLURAL = {"Namespace": "namespaces", "ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles",
           "ClusterRoleBinding": "clusterrolebindings", "Role": "roles", "RoleBinding": "rolebindings",
           "CustomResourceDefinition": "customresourcedefinitions", "Deployment": "deployments",
           "ScaledObject": "scaledobjects"}


def _create(cp: ControlPlane, obj: dict[str, Any]) -> None:
    group, _, version = obj["apiVersion"].rpartition("/")
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    ns = obj["metadata"].get("namespace")
    path = f"{base}/namespaces/{ns}/{_PLURAL[obj['kind']]}" if ns else f"{base}/{_PLURAL[obj['kind']]}"
    status, body = _call(cp, "POST", path, obj)
    assert status in (201, 409), f"{obj['kind']} {obj['metadata']['name']}: {status} {body}"


def _wait(check: Any, timeout: float, what: str, detail: Any = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(1)
    pytest.fail(f"timed out after {timeout}s waiting for {what}: last={last!r}\n{detail()}")


def test_keda_operator_runs_under_its_own_rbac(control_plane: ControlPlane, tmp_path: Path) -> None:
    try:
        binary = keda.keda_binaries(build=False)[KEDA_OPERATOR_IMAGE]
        module_dir = keda.keda_module_dir()
    except keda.KedaError as err:
        pytest.skip(f"KEDA not built (tools/build-keda.sh) or its module missing: {err}")
    cp = control_plane
    layout = layout_for(tmp_path / "state")
    objs = keda.keda_manifests(layout, module_dir=module_dir)
    for obj in objs:
        if obj["kind"] in _PLURAL and obj["kind"] != "Deployment":
            _create(cp, obj)
    for crd in (o["metadata"]["name"] for o in objs if o["kind"] == "CustomResourceDefinition"):
        def established(crd: str = crd) -> bool:
            _, got = _call(cp, "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
            return any(c["type"] == "Established" and c["status"] == "True"
                       for c in (got or {}).get("status", {}).get("conditions") or [])
        _wait(established, 60, f"CRD {crd}")

    # The Secret's files, as the Deployment mounts them at /certs.
    secret = next(o for o in objs if o["kind"] == "Secret")
    certs = tmp_path / "certs"
    certs.mkdir()
    for name, b64 in secret["data"].items():
        (certs / name).write_bytes(base64.b64decode(b64))
    status, tok = _call(cp, "POST", "/api/v1/namespaces/keda/serviceaccounts/keda-operator/token",
                        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}})
    assert status == 201, tok
    kubeconfig = tmp_path / "keda.kubeconfig"
    write_kubeconfig(kubeconfig, cp.server, tok["status"]["token"])

    grpc, metrics, health = _free_port(), _free_port(), _free_port()
    args = keda.operator_args(str(certs), "127.0.0.1", grpc_port=grpc, metrics_port=metrics, health_port=health)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "WATCH_NAMESPACE": "", "POD_NAMESPACE": "keda",
           "KEDA_CLUSTER_OBJECT_NAMESPACE": "keda"}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    log = tmp_path / "keda-operator.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(binary), *args], stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        def ready() -> bool:
            assert proc.poll() is None, log.read_text()[-4000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        _wait(ready, 120, "keda-operator /readyz", lambda: log.read_text()[-3000:])

        # A ScaledObject with KEDA's built-in cron trigger (nothing external): KEDA makes the HPA.
        _create(cp, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "keda-run"}})
        labels = {"app": "web"}
        meta = {"name": "web", "namespace": "keda-run"}
        _create(cp, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                     "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                              "template": {"metadata": {"labels": labels},
                                           "spec": {"containers": [{"name": "c", "image": "example.invalid/x"}]}}}})
        _create(cp, {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
                     "metadata": {"name": "web", "namespace": "keda-run"},
                     "spec": {"scaleTargetRef": {"name": "web"}, "minReplicaCount": 1, "maxReplicaCount": 3,
                              "triggers": [{"type": "cron", "metadata": {
                                  "timezone": "UTC", "start": "0 * * * *", "end": "59 * * * *",
                                  "desiredReplicas": "2"}}]}})

        def hpa() -> Any:
            path = "/apis/autoscaling/v2/namespaces/keda-run/horizontalpodautoscalers/keda-hpa-web"
            status, body = _call(cp, "GET", path)
            return body if status == 200 else None

        got = _wait(hpa, 90, "HPA keda-hpa-web made by KEDA", lambda: log.read_text()[-3000:])
        assert got["spec"]["scaleTargetRef"]["name"] == "web"
        assert got["spec"]["metrics"][0]["type"] == "External"

        def so_ready() -> Any:
            _, so = _call(cp, "GET", "/apis/keda.sh/v1alpha1/namespaces/keda-run/scaledobjects/web")
            conds = (so or {}).get("status", {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

        _wait(so_ready, 60, "ScaledObject Ready", lambda: log.read_text()[-3000:])

        # The gRPC metrics service: mutual TLS, server name as the adapter dials it.
        ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        ctx.load_cert_chain(str(certs / "tls.crt"), str(certs / "tls.key"))
        ctx.set_alpn_protocols(["h2"])
        with socket.create_connection(("127.0.0.1", grpc), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="keda-operator.keda.svc.cluster.local") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
            assert tls.selected_alpn_protocol() == "h2"
        with socket.create_connection(("127.0.0.1", grpc), timeout=10) as raw, \
                pytest.raises(ssl.SSLCertVerificationError):
            ctx.wrap_socket(raw, server_hostname="somebody-else.example")
    finally:
        stop_process(proc)
    text = log.read_text(errors="replace")
    assert "forbidden" not in text.lower(), [ln for ln in text.splitlines() if "orbidden" in ln][:5]
