"""KEDA's objects for the sandbox: built from KEDA v2.21.0's own module files, certificates that
verify, and (against a real API server) CRDs + RBAC + Deployments + APIService accepted, KEDA's
ServiceAccount allowed what KEDA does, and the operator's rendered ScaledObjects accepted by KEDA's
real CRD schema."""

from __future__ import annotations

import base64
import datetime as dt
import json
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from sluiceway_sandbox import keda
from sluiceway_sandbox.layout import KEDA_ADAPTER_IMAGE, KEDA_OPERATOR_IMAGE, layout_for

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "operator"))
from kubetools import ADMIN_TOKEN, ControlPlane, control_plane, wait_for  # noqa: E402

__all__ = ["control_plane"]


@pytest.fixture(scope="module")
def module_dir() -> Path:
    try:
        return keda.keda_module_dir()
    except keda.KedaError as err:
        pytest.skip(f"KEDA's module directory is not available (go mod download): {err}")


@pytest.fixture(scope="module")
def manifests(module_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    layout = layout_for(tmp_path_factory.mktemp("sandbox-state"))
    return keda.keda_manifests(layout, module_dir=module_dir)


def _by(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_upstream_files_are_taken_unchanged(module_dir: Path, manifests: list[dict[str, Any]]) -> None:
    crd_names = {o["metadata"]["name"] for o in manifests if o["kind"] == "CustomResourceDefinition"}
    assert {"scaledobjects.keda.sh", "scaledjobs.keda.sh", "triggerauthentications.keda.sh",
            "clustertriggerauthentications.keda.sh"} <= crd_names
    for rel in keda.UPSTREAM_RBAC:
        for doc in yaml.safe_load_all((module_dir / rel).read_text()):
            if doc:
                assert doc in manifests, f"{rel}: {doc['kind']} {doc['metadata']['name']} changed or missing"


def test_apply_order(manifests: list[dict[str, Any]]) -> None:
    kinds = [o["kind"] for o in manifests]
    assert kinds[0] == "Namespace" and manifests[0]["metadata"]["name"] == "keda"
    assert kinds[-1] == "APIService"
    assert max(i for i, k in enumerate(kinds) if k == "CustomResourceDefinition") < kinds.index("Deployment")
    assert kinds.index("ServiceAccount") < kinds.index("ClusterRoleBinding")
    assert kinds.index("Secret") < kinds.index("Deployment")


def test_deployments_run_keda_images_under_its_account(manifests: list[dict[str, Any]]) -> None:
    op = _by(manifests, "Deployment", "keda-operator")["spec"]["template"]["spec"]
    ad = _by(manifests, "Deployment", "keda-metrics-apiserver")["spec"]["template"]["spec"]
    for spec, image in ((op, KEDA_OPERATOR_IMAGE), (ad, KEDA_ADAPTER_IMAGE)):
        assert spec["serviceAccountName"] == "keda-operator"
        (c,) = spec["containers"]
        assert c["image"].rpartition(":")[0] == image
        env = {e["name"]: e for e in c["env"]}
        assert env["WATCH_NAMESPACE"]["value"] == ""
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        assert env["KEDA_CLUSTER_OBJECT_NAMESPACE"]["value"] == "keda"
        assert {"name": "certificates", "mountPath": "/certs", "readOnly": True} in c["volumeMounts"]
        assert {"name": "certificates", "secret": {"secretName": "kedaorg-certs", "defaultMode": 0o444}} \
            in spec["volumes"]
        assert "readinessProbe" in c
    op_args = op["containers"][0]["args"]
    assert "--leader-elect=false" in op_args and "--enable-cert-rotation=false" in op_args
    assert "--cert-dir=/certs" in op_args
    ad_args = ad["containers"][0]["args"]
    assert "--metrics-service-address=keda-operator.keda.svc.cluster.local:9666" in ad_args
    assert "--cert-dir=/certs" in ad_args and "--client-ca-file=/certs/ca.crt" in ad_args


def test_apiservice_verifies_the_adapter(manifests: list[dict[str, Any]]) -> None:
    api = _by(manifests, "APIService", "v1beta1.external.metrics.k8s.io")["spec"]
    assert api["service"] == {"name": "keda-metrics-apiserver", "namespace": "keda", "port": 443}
    assert "insecureSkipTLSVerify" not in api
    secret = _by(manifests, "Secret", "kedaorg-certs")["data"]
    assert api["caBundle"] == secret["ca.crt"]
    svc = _by(manifests, "Service", "keda-metrics-apiserver")["spec"]
    assert {"name": "https", "port": 443, "targetPort": 6443, "protocol": "TCP"} in svc["ports"]
    assert svc["selector"] == {"app": "keda-metrics-apiserver"}


def test_certificates_verify_and_name_every_service(manifests: list[dict[str, Any]]) -> None:
    data = {k: base64.b64decode(v) for k, v in _by(manifests, "Secret", "kedaorg-certs")["data"].items()}
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    leaf = x509.load_pem_x509_certificate(data["tls.crt"])
    leaf.verify_directly_issued_by(ca)
    now = dt.datetime.now(dt.UTC)
    assert leaf.not_valid_before_utc <= now < leaf.not_valid_after_utc
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = set(sans.get_values_for_type(x509.DNSName))
    assert {"keda-operator.keda.svc.cluster.local", "keda-metrics-apiserver.keda.svc", "localhost"} <= dns
    usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {u.dotted_string for u in usages} == {"1.3.6.1.5.5.7.3.1", "1.3.6.1.5.5.7.3.2"}  # server+client
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(data["tls.key"], password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key().public_numbers() == leaf.public_key().public_numbers()  # type: ignore[union-attr]


def test_certificates_are_reused(module_dir: Path, tmp_path: Path) -> None:
    layout = layout_for(tmp_path)
    first = keda.ensure_keda_certs(layout)
    assert keda.ensure_keda_certs(layout) == first


def test_missing_upstream_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(keda.KedaError, match="no CustomResourceDefinitions"):
        keda.read_upstream(tmp_path)


def test_binaries_map_both_images() -> None:
    try:
        found = keda.keda_binaries(build=False)
    except keda.KedaError as err:
        pytest.skip(f"KEDA not built (tools/build-keda.sh): {err}")
    assert set(found) == {KEDA_OPERATOR_IMAGE, KEDA_ADAPTER_IMAGE}
    assert found[KEDA_OPERATOR_IMAGE].name == "keda-operator"
    assert found[KEDA_ADAPTER_IMAGE].name == "keda-adapter"


# ------------------------------------------------------------------------------------------------
# Against a real API server (tests/operator/kubetools.py: etcd + kube-apiserver + controllers, RBAC).

_PLURAL = {
    "Namespace": "namespaces", "ServiceAccount": "serviceaccounts", "Secret": "secrets", "Service": "services",
    "Deployment": "deployments", "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles", "RoleBinding": "rolebindings", "CustomResourceDefinition": "customresourcedefinitions",
    "APIService": "apiservices", "ScaledObject": "scaledobjects",
}


def _ctx() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _call(cp: ControlPlane, method: str, path: str, body: Any = None, query: str = "") -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"{cp.server}{path}{query}", data=data, method=method,
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, context=_ctx(), timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def _collection(obj: dict[str, Any]) -> str:
    group, _, version = obj["apiVersion"].rpartition("/")
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    ns = obj["metadata"].get("namespace")
    return f"{base}/namespaces/{ns}/{_PLURAL[obj['kind']]}" if ns else f"{base}/{_PLURAL[obj['kind']]}"


def _create(cp: ControlPlane, obj: dict[str, Any], dry_run: bool = False) -> tuple[int, Any]:
    return _call(cp, "POST", _collection(obj), obj, "?dryRun=All" if dry_run else "")


@pytest.mark.apiserver
@pytest.mark.slow
def test_keda_objects_accepted_and_rbac_sufficient(control_plane: ControlPlane,
                                                   manifests: list[dict[str, Any]]) -> None:
    cp = control_plane
    for obj in manifests:
        status, body = _create(cp, obj)
        assert status in (201, 409), f"{obj['kind']} {obj['metadata']['name']}: {status} {body}"
        if obj["kind"] == "CustomResourceDefinition":
            name = obj["metadata"]["name"]

            def established(name: str = name) -> bool:
                _, got = _call(cp, "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conds = (got or {}).get("status", {}).get("conditions") or []
                return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

            wait_for(established, 60, what=f"CRD {name} established")
    _, api = _call(cp, "GET", "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.external.metrics.k8s.io")
    assert api["spec"]["caBundle"] and not api["spec"].get("insecureSkipTLSVerify")

    # What KEDA's operator and adapter do, as its ServiceAccount (SubjectAccessReview, real RBAC).
    user = "system:serviceaccount:keda:keda-operator"
    checks = [
        ("keda.sh", "scaledobjects", "watch", ""), ("keda.sh", "scaledobjects", "update", "demo"),
        ("keda.sh", "scaledobjects", "patch", "demo"),
        ("autoscaling", "horizontalpodautoscalers", "create", "demo"),
        ("apps", "deployments", "get", "demo"), ("", "secrets", "list", ""), ("", "events", "create", "demo"),
        ("coordination.k8s.io", "leases", "create", "keda"),
        ("authentication.k8s.io", "tokenreviews", "create", ""),
        ("authorization.k8s.io", "subjectaccessreviews", "create", ""),
    ]
    for group, resource, verb, ns in checks:
        sar = {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": ["system:serviceaccounts", "system:serviceaccounts:keda"],
                     "resourceAttributes": {"group": group, "resource": resource, "verb": verb, "namespace": ns}},
        }
        status, body = _call(cp, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", sar)
        assert status == 201, body
        assert body["status"].get("allowed") is True, f"{verb} {group}/{resource} in {ns!r}: {body['status']}"
    # ... and the HPA controller may read external metrics (KEDA's own binding).
    sar = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
           "spec": {"user": "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
                    "resourceAttributes": {"group": "external.metrics.k8s.io", "resource": "s0-x",
                                           "verb": "list", "namespace": "demo"}}}
    _, body = _call(cp, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", sar)
    assert body["status"].get("allowed") is True, body["status"]
    # A verb KEDA was never given stays denied (the checks above can fail).
    deny = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "resourceAttributes": {"group": "", "resource": "secrets", "verb": "delete",
                                                          "namespace": "demo"}}}
    _, body = _call(cp, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", deny)
    assert body["status"].get("allowed") is not True

    # The operator's rendered ScaledObjects (its golden files) pass KEDA's real CRD schema.
    status, body = _create(cp, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}})
    assert status in (201, 409), body
    scaled = [d for f in sorted((ROOT / "tests" / "operator" / "golden").glob("*.yaml"))
              for d in yaml.safe_load_all(f.read_text()) if d and d.get("kind") == "ScaledObject"]
    assert scaled, "no ScaledObject in tests/operator/golden"
    for so in scaled:
        so = {**so, "metadata": {"name": so["metadata"]["name"], "namespace": "demo"}}
        status, body = _create(cp, so, dry_run=True)
        assert status == 201, f"ScaledObject {so['metadata']['name']}: {status} {body}"
    bad = {**scaled[0], "metadata": {"name": "bad", "namespace": "demo"},
           "spec": {**scaled[0]["spec"], "minReplicaCount": "one"}}
    status, body = _create(cp, bad, dry_run=True)
    assert status == 422, body
