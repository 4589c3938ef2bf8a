"""Issue 22: the CRD's ``spec.model.storageUri`` accepts ``oci://`` references (what ``sluiceway-pod
fetch`` takes: ``oci://host[:port]/repository:tag``, ``…@sha256:<hex>``, ``oci+http://`` for a
registry without TLS) and refuses malformed ones, checked by a real kube-apiserver (dry-run creates).
The same cases go through the fetcher's own parser, so the CRD and the pod agree.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubetools import Admin, ControlPlane, establish_crd
from operator_support import load_crd
from sluiceway_operator.kube import ApiError, Kube
from sluiceway_pod.fetch import FetchError, parse_oci

pytestmark = [pytest.mark.apiserver, pytest.mark.slow, pytest.mark.timeout(300)]

NS = "sluiceway-oci"
DIGEST = "sha256:" + "0123456789abcdef" * 4

ACCEPTED = [
    "oci://registry.example/models/scorer:v1",
    "oci://registry.example:5000/team/models/scorer:1.0.3-rc_1",
    f"oci://registry.example/models/scorer@{DIGEST}",
    "oci+http://127.0.0.1:5000/my-models/a__b.c:latest",
]
REFUSED = [
    "oci://registry.example/models/scorer",  # neither tag nor digest
    "oci://registry.example/Models/scorer:v1",  # repositories are lowercase
    "oci://registry.example/models/scorer@sha256:abc",  # a short digest
    "oci://user:pw@registry.example/models/scorer:v1",  # credentials in the URI
    "oci://registry.example/models/../scorer:v1",
    "oci://registry.example/models/scorer:v1?x=1",
    "oci+https://registry.example/models/scorer:v1",
]


@pytest.fixture(scope="module")
def admin(control_plane: ControlPlane) -> Admin:
    a = Admin(Kube(control_plane.client()))
    establish_crd(a, load_crd())
    if a.get(f"/api/v1/namespaces/{NS}") is None:
        a.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    return a


def _isvc(uri: str, **model: Any) -> dict[str, Any]:
    return {
        "apiVersion": "sluiceway.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "oci", "namespace": NS},
        "spec": {
            "model": {"image": "registry.example/p:1", "format": "onnx", "storageUri": uri, **model},
            "resources": {"gpus": 0},
        },
    }


PATH = f"/apis/sluiceway.io/v1alpha1/namespaces/{NS}/inferenceservices"


@pytest.mark.parametrize("uri", ACCEPTED)
def test_the_crd_and_the_fetcher_accept_an_oci_reference(admin: Admin, uri: str) -> None:
    stored = admin.create(PATH, _isvc(uri), dry_run=True)
    assert stored["spec"]["model"]["storageUri"] == uri
    parse_oci(uri)


@pytest.mark.parametrize("uri", REFUSED)
def test_the_crd_and_the_fetcher_refuse_a_malformed_oci_reference(admin: Admin, uri: str) -> None:
    with pytest.raises(ApiError) as info:
        admin.create(PATH, _isvc(uri), dry_run=True)
    assert info.value.status == 422
    assert "spec.model.storageUri" in str(info.value)
    if uri.startswith(("oci://", "oci+http://")):
        with pytest.raises(FetchError) as refused:
            parse_oci(uri)
        assert refused.value.reason == "bad-request"


def test_the_registry_credentials_secret_goes_with_an_oci_uri_only(admin: Admin) -> None:
    oci = {"credentialsSecret": "registry-pull"}
    stored = admin.create(PATH, _isvc(ACCEPTED[0], oci=oci), dry_run=True)
    assert stored["spec"]["model"]["oci"] == oci
    for uri in ("s3://models/m.onnx", "https://h.example/m.onnx"):
        with pytest.raises(ApiError) as info:
            admin.create(PATH, _isvc(uri, oci=oci), dry_run=True)
        assert info.value.status == 422
        assert "model.oci is only used with an oci:// storageUri" in str(info.value)
    with pytest.raises(ApiError) as info:
        admin.create(PATH, _isvc(ACCEPTED[0], oci={"credentialsSecret": "Not_A_Name"}), dry_run=True)
    assert "spec.model.oci.credentialsSecret" in str(info.value)


@pytest.mark.parametrize("uri", ACCEPTED + REFUSED)
def test_the_operators_spec_model_agrees_with_the_crd(uri: str) -> None:
    """The operator parses the spec with its own model (a spec the CRD let through must parse, one it
    refused must not): the same cases, without an API server."""
    from sluiceway_operator.spec import SpecError, parse_spec

    if uri in ACCEPTED:
        assert parse_spec(_isvc(uri)["spec"]).model.fetched
    else:
        with pytest.raises(SpecError):
            parse_spec(_isvc(uri)["spec"])


def test_the_storage_initializer_fetches_an_oci_model_with_the_registry_secret_as_env_only() -> None:
    """An ``oci://`` model gets the storage initializer (``sluiceway-pod fetch --uri oci://...``) and
    the registry credentials only as ``secretKeyRef`` environment variables (never an argument);
    ``model.oci`` without an oci:// storageUri is refused."""
    from sluiceway_operator.render import OCI_CREDENTIAL_KEYS, build_storage_initializer
    from sluiceway_operator.spec import SpecError, parse_spec

    spec = parse_spec(_isvc(ACCEPTED[2], oci={"credentialsSecret": "registry-pull"})["spec"])
    init = build_storage_initializer(spec)
    assert init is not None and init["command"][:4] == ["sluiceway-pod", "fetch", "--uri", ACCEPTED[2]]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in init["env"] if "valueFrom" in e}
    assert refs == {k: {"name": "registry-pull", "key": k} for k in OCI_CREDENTIAL_KEYS}
    assert not any("registry-pull" in a for a in init["command"])
    with pytest.raises(SpecError, match=r"model\.oci is only used with an oci:// storageUri"):
        parse_spec(_isvc("s3://models/m.onnx", oci={"credentialsSecret": "registry-pull"})["spec"])
