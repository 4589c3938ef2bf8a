"""What the README's quick start and ``samples/`` show is accepted by the CRD and rendered by the
operator into children the API server admits (issue 10 item 16).

Without the control-plane binaries the pure part still runs: the CRD's defaults applied as the API
server does, the operator's model, ``render()`` and strict ``kubernetes-validate`` of the children.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubetools import KEDA_STANDIN_CRD, Admin, ControlPlane, establish_crd
from operator_support import TEST_EDGE_TOKEN, TEST_SALT, apply_defaults, crd_schema, load_crd
from sluiceway_core.keys import hash_key
from sluiceway_operator.kube import Kube
from sluiceway_operator.render import Environment, Owner, render
from sluiceway_operator.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
ENV = Environment(keda=True, service_monitor=False, prometheus_url="http://prometheus.monitoring.svc:9090")


def _readme_files() -> list[Path]:
    """Files the README's quick start applies (``kubectl apply -f <file>``), plus inline YAML."""
    text = (ROOT / "README.md").read_text()
    return [ROOT / f for f in re.findall(r"kubectl apply -f (\S+\.ya?ml)", text)]


def _inline_readme_docs() -> list[dict[str, Any]]:
    text = (ROOT / "README.md").read_text()
    docs: list[dict[str, Any]] = []
    for block in re.findall(r"```ya?ml\n(.*?)```", text, re.S):
        docs += [d for d in yaml.safe_load_all(block) if isinstance(d, dict)]
    return docs


def _isvcs() -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    files = _readme_files() + sorted((ROOT / "samples").glob("*.yaml"))
    for path in dict.fromkeys(files):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "InferenceService":
                found.append((str(path.relative_to(ROOT)), doc))
    found += [("README.md", d) for d in _inline_readme_docs() if d.get("kind") == "InferenceService"]
    return found


def test_readme_quick_start_names_an_inference_service() -> None:
    """The quick start applies at least one file, and it holds an InferenceService."""
    files = _readme_files()
    assert files or _inline_readme_docs(), "README quick start applies nothing"
    for f in files:
        assert f.is_file(), f"README applies {f}, which does not exist"
    assert any(src != "README.md" and Path(ROOT / src) in files for src, _ in _isvcs()) or _inline_readme_docs()


def _render(doc: dict[str, Any]) -> Any:
    spec = parse_spec(apply_defaults(doc["spec"], crd_schema()["properties"]["spec"]))
    hashes = {t.name: hash_key(f"key-of-{t.name}", TEST_SALT) for t in spec.keyed_tenants}
    meta = doc["metadata"]
    owner = Owner(meta["name"], meta.get("namespace", "default"), "uid")
    return render(owner, spec, hashes, ENV, salt=TEST_SALT, edge_token=TEST_EDGE_TOKEN)


@pytest.mark.parametrize(("source", "doc"), _isvcs(), ids=lambda v: v if isinstance(v, str) else "")
def test_documented_services_render_valid_children(source: str, doc: dict[str, Any]) -> None:
    rendered = _render(doc)
    for m in rendered.manifests:
        if m["apiVersion"].startswith(("keda.sh", "monitoring.coreos.com")):
            continue
        kubernetes_validate.validate(m, "1.34.0", strict=True)


@pytest.mark.apiserver
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("source", "doc"), _isvcs(), ids=lambda v: v if isinstance(v, str) else "")
def test_documented_services_pass_the_crd_and_the_api_server(
    control_plane: ControlPlane, source: str, doc: dict[str, Any]
) -> None:
    admin = Admin(Kube(control_plane.client()))
    establish_crd(admin, load_crd())
    establish_crd(admin, KEDA_STANDIN_CRD)
    ns = doc["metadata"].get("namespace", "default")
    if admin.get(f"/api/v1/namespaces/{ns}") is None:
        admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    stored = admin.create(f"/apis/sluiceway.io/v1alpha1/namespaces/{ns}/inferenceservices", doc, dry_run=True)
    spec = parse_spec(stored["spec"])
    assert spec == parse_spec(apply_defaults(doc["spec"], crd_schema()["properties"]["spec"]))
    for m in _render(doc).manifests:
        admin.kube.apply(m, dry_run=True)
