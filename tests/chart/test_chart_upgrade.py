"""Upgrades and old clusters, through the real helm (issue 23 §2).

- ``kubeVersion``: the chart refuses clusters older than the features it and its operator use
  (``lifecycle.preStop.sleep`` in the pods the operator renders: on by default from Kubernetes 1.30;
  CEL ``fieldPath``/``reason`` in the CRD: 1.28), with helm's message naming the constraint.
- ``helm upgrade --reuse-values`` from the previous chart version (the chart as of commit d9f0207):
  Helm 3 then renders the NEW templates with the OLD chart's default values (plus the user's own),
  so no template may dereference a key the old values.yaml lacks and the schema may not require one.
  Rendered here exactly that way (the new chart with d9f0207's values.yaml, through the real helm),
  and the result must carry the new chart's defaults, not empty flags or an empty policy.

The real-API-server half (helm install, then the CRD upgrade with ``kubectl apply --server-side
--force-conflicts``) is in test_chart_apiserver.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import CHART, ROOT, find, helm_binary, run_helm, template

PREVIOUS = "d9f0207"  # the chart version before issue 18's values (operator.policy, scaler.workers, ...)
MINIMUM = "1.30.0"


@pytest.fixture(scope="module")
def helm() -> str:
    path, why = helm_binary()
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-upgrade")


def _previous_values() -> str:
    out = subprocess.run(
        ["git", "show", f"{PREVIOUS}:charts/sluiceway/values.yaml"], cwd=ROOT, capture_output=True, text=True
    )
    if out.returncode != 0:
        pytest.skip(f"commit {PREVIOUS} is not in this checkout: {out.stderr.strip()}")
    return out.stdout


@pytest.mark.parametrize("version", ["1.29.9", "1.28.0", "1.27.3"])
def test_older_clusters_are_refused_with_the_constraint(helm: str, home: Path, version: str) -> None:
    out = run_helm(helm, home, "template", "sw", str(CHART), "--kube-version", version)
    assert out.returncode != 0, f"the chart rendered for Kubernetes {version}"
    assert "kubeVersion" in out.stderr and ">=1.30" in out.stderr, out.stderr


@pytest.mark.parametrize("version", [MINIMUM, "1.30.14-eks-1a2b3c", "1.34.4", "1.35.0"])
def test_supported_clusters_render(helm: str, home: Path, version: str) -> None:
    out = run_helm(helm, home, "template", "sw", str(CHART), "--kube-version", version)
    assert out.returncode == 0, out.stderr


def test_chart_yaml_states_the_minimum() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={MINIMUM}-0"


def _reuse_values_render(helm: str, home: Path, tmp_path: Path, user: dict[str, Any] | None) -> list[dict[str, Any]]:
    """What ``helm upgrade --reuse-values`` renders after an install of the previous chart: the new
    chart's templates and schema over the previous chart's values.yaml coalesced with the user's."""
    chart = tmp_path / "sluiceway"
    shutil.copytree(CHART, chart)
    (chart / "values.yaml").write_text(_previous_values())
    args = ["template", "sw", str(chart), "--namespace", "sluiceway-system"]
    if user:
        path = tmp_path / "user.yaml"
        path.write_text(yaml.safe_dump(user))
        args += ["-f", str(path)]
    out = run_helm(helm, home, *args)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _env(docs: list[dict[str, Any]], deployment: str) -> dict[str, str]:
    container = find(docs, "Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _args(docs: list[dict[str, Any]], deployment: str) -> list[str]:
    args = find(docs, "Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]["args"]
    return [str(a) for a in args]


@pytest.mark.parametrize(
    "user",
    [
        None,
        {"operator": {"prometheusUrl": "http://prometheus.monitoring.svc:9090"}},
        {"scaler": {"tls": {"enabled": True, "secretName": "mine", "kedaClientSecret": "keda-mine"}}},
        {"scaler": {"tls": {"enabled": True}}},
        {
            "operator": {"namespaces": ["team-a"]},
            "scaler": {"quota": {"enabled": True}},
            "networkPolicy": {"enabled": True},
        },
    ],
    ids=["defaults", "prometheus", "own-tls", "generated-tls", "quota-netpol"],
)
def test_reuse_values_upgrade_from_the_previous_chart_renders_the_new_defaults(
    helm: str, home: Path, tmp_path: Path, user: dict[str, Any] | None
) -> None:
    docs = _reuse_values_render(helm, home, tmp_path, user)
    new = template(helm, home, user)
    # the scaler's new flags get the new chart's defaults, never an empty argument
    old_args, new_args = _args(docs, "sluiceway-scaler"), _args(new, "sluiceway-scaler")
    for flag in ("--workers", "--max-triggers"):
        assert old_args[old_args.index(flag) + 1] == new_args[new_args.index(flag) + 1], (flag, old_args)
    assert "" not in old_args, old_args
    # the operator's policy: the new chart's (secure) defaults, not empty lists (= refuse everything)
    old_env, new_env = _env(docs, "sluiceway-operator"), _env(new, "sluiceway-operator")
    for name in new_env:
        if name.startswith("SLUICEWAY_ALLOWED_") and name != "SLUICEWAY_ALLOWED_PROMETHEUS":
            assert old_env.get(name) == new_env[name], (name, old_env.get(name), new_env[name])
