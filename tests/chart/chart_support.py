"""Helpers of the chart tests: the real helm binary, rendering the chart, walking its objects."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sluiceway"
SAMPLES = ROOT / "samples"
IMAGES = ROOT / "images"
K8S_VERSION = "1.34.0"
MONITORING_API = "monitoring.coreos.com/v1"
KEDA_API = "keda.sh/v1alpha1"

#: Every optional feature on (used by the template, lint and install tests).
ALL_ON: dict[str, Any] = {
    "operator": {"namespaces": ["team-a", "team-b"], "prometheusUrl": "http://prometheus.monitoring.svc:9090"},
    "scaler": {
        "allowedPrometheusUrls": ["http://prometheus.monitoring.svc:9090", "https://thanos.example:10902"],
        "tls": {"enabled": True, "secretName": "sluiceway-scaler-tls", "kedaClientSecret": "sluiceway-keda-client"},
        "quota": {"enabled": True},
    },
    "image": {"digest": "sha256:" + "a" * 64},
    "imagePullSecrets": [{"name": "regcred"}],
    "monitoring": {
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus"}},
        "podMonitor": {"enabled": True},
        "serviceMonitor": {"enabled": True},
        "dashboard": {"enabled": True},
    },
    "networkPolicy": {"enabled": True},
    "prometheusAuth": [
        {
            "url": "https://thanos.example:10902",
            "bearerToken": {"secretName": "thanos-reader"},
            "headers": {"X-Scope-OrgID": "team-a"},
        }
    ],
}


def helm_binary() -> tuple[str | None, str]:
    """(path, why-not) of the helm built by tools/build-helm.sh (or $SLUICEWAY_HELM, or PATH)."""
    env = os.environ.get("SLUICEWAY_HELM")
    if env:
        return env, ""
    out = subprocess.run(
        ["bash", str(ROOT / "tools" / "build-helm.sh"), "--dir"], capture_output=True, text=True, check=False
    )
    candidate = Path(out.stdout.strip()) / "helm"
    if candidate.is_file():
        return str(candidate), ""
    found = shutil.which("helm")
    if found:
        return found, ""
    return None, f"helm not built in {out.stdout.strip() or '~/.cache/sluiceway'}: run tools/build-helm.sh"


def helm_env(home: Path) -> dict[str, str]:
    """An environment that keeps helm's config, cache and data out of the user's home."""
    return {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def write_values(path: Path, values: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(values))
    return path


def run_helm(helm: str, home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run helm. ``template`` and ``lint`` render for Kubernetes :data:`K8S_VERSION` unless the call
    names a version: offline, helm assumes v1.20.0, which the chart's kubeVersion refuses."""
    if args and args[0] in ("template", "lint") and "--kube-version" not in args:
        args = (*args, "--kube-version", K8S_VERSION)
    return subprocess.run(
        [helm, *args], capture_output=True, text=True, check=False, env=helm_env(home), timeout=timeout
    )


def template(helm: str, home: Path, values: dict[str, Any] | None = None, *extra: str) -> list[dict[str, Any]]:
    """``helm template`` the chart (release ``sw`` in ``sluiceway-system``): the objects it renders."""
    args = ["template", "sw", str(CHART), "--namespace", "sluiceway-system", *extra]
    if values:
        args += ["-f", str(write_values(home / "values-under-test.yaml", values))]
    out = run_helm(helm, home, *args)
    assert out.returncode == 0, out.stdout + out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    for d in docs:
        meta = d["metadata"]
        if d["kind"] == kind and meta["name"] == name and (namespace is None or meta.get("namespace") == namespace):
            return d
    raise AssertionError(f"no {kind} {namespace or '*'}/{name} in {[(d['kind'], d['metadata']['name']) for d in docs]}")


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]


def sample_documents() -> dict[str, list[dict[str, Any]]]:
    """Every file in samples/ -> its YAML documents."""
    return {p.name: [d for d in yaml.safe_load_all(p.read_text()) if d] for p in sorted(SAMPLES.glob("*.yaml"))}
