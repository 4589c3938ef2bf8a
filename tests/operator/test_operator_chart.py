"""The chart: its CRD copy is byte-for-byte the source, its RBAC rules are well formed, and (when a
helm binary is available) ``helm lint`` and ``helm template`` pass and render valid manifests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sluiceway"


def test_chart_crds_are_byte_identical_copies() -> None:
    sources = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    copies = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert sources and sources == copies
    for name in sources:
        assert (CHART / "crds" / name).read_bytes() == (ROOT / "crds" / name).read_bytes(), (
            f"charts/sluiceway/crds/{name} differs from crds/{name}: cp crds/*.yaml charts/sluiceway/crds/"
        )


def test_chart_prometheus_rules_are_a_byte_identical_copy() -> None:
    source = ROOT / "operator" / "sluiceway_scaler" / "rules.yaml"
    copy = CHART / "files" / "scaler-rules.yaml"
    assert copy.read_bytes() == source.read_bytes(), (
        "charts/sluiceway/files/scaler-rules.yaml differs: cp operator/sluiceway_scaler/rules.yaml "
        "charts/sluiceway/files/scaler-rules.yaml"
    )


def test_operator_rules_are_least_privilege() -> None:
    rules = yaml.safe_load((CHART / "files" / "operator-rules.yaml").read_text())
    verbs = {v for r in rules for v in r["verbs"]}
    resources = {res for r in rules for res in r["resources"]}
    assert "*" not in verbs and "*" not in resources
    assert "escalate" not in verbs and "bind" not in verbs
    secrets = [r for r in rules if "secrets" in r["resources"]]
    assert all("list" not in r["verbs"] and "watch" not in r["verbs"] for r in secrets)


def _helm() -> str | None:
    env = os.environ.get("SLUICEWAY_HELM")
    if env:
        return env
    script = ROOT / "tools" / "build-helm.sh"
    if script.exists():
        out = subprocess.run(["bash", str(script), "--dir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip()) / "helm"
        if candidate.is_file():
            return str(candidate)
    return shutil.which("helm")


@pytest.fixture(scope="module")
def helm() -> str:
    h = _helm()
    if h is None:
        pytest.skip("helm not built: run tools/build-helm.sh")
    return h


def test_helm_lint(helm: str) -> None:
    out = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_helm_template_renders_valid_manifests(helm: str) -> None:
    out = subprocess.run(
        [helm, "template", "sw", str(CHART), "--namespace", "sluiceway-system", "--include-crds"],
        capture_output=True,
        text=True,
        check=True,
    )
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("CustomResourceDefinition") == 1
    for kind in ("ClusterRole", "ClusterRoleBinding", "ServiceAccount", "Deployment", "Service"):
        assert kind in kinds
    for d in docs:
        kubernetes_validate.validate(d, "1.34.0", strict=True)
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert role["rules"] == yaml.safe_load((CHART / "files" / "operator-rules.yaml").read_text())
    scaler_svc = next(
        d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "sluiceway-scaler"
    )
    assert scaler_svc["spec"]["ports"][0]["port"] == 9090
