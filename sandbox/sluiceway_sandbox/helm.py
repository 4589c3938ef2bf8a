"""Helm: the real ``helm`` built by ``tools/build-helm.sh`` installs ``charts/sluiceway``."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from .layout import Layout

RELEASE = "sluiceway"
NAMESPACE = "sluiceway-system"


def helm_binary(root: Path, build: bool, progress: Callable[[str], None] | None = None) -> Path:
    script = root / "tools" / "build-helm.sh"
    out = subprocess.run(["bash", str(script), "--dir"], capture_output=True, text=True, check=False)
    if out.returncode == 0:
        return Path(out.stdout.strip()) / "helm"
    if not build:
        raise FileNotFoundError(f"helm not built in {out.stdout.strip()}: run tools/build-helm.sh")
    if progress:
        progress("building helm (first run only, a few minutes)")
    res = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=True)
    return Path(res.stdout.strip().splitlines()[-1]) / "helm"


def build_install(
    helm: Path,
    layout: Layout,
    chart: Path,
    values: Mapping[str, str],
    release: str = RELEASE,
    namespace: str = NAMESPACE,
) -> list[str]:
    argv = [
        str(helm),
        "upgrade",
        "--install",
        release,
        str(chart),
        "--namespace",
        namespace,
        "--create-namespace",
        "--kubeconfig",
        str(layout.kubeconfig),
    ]
    for k, v in values.items():
        argv += ["--set", f"{k}={v}"]
    return argv


def install(helm: Path, layout: Layout, chart: Path, values: Mapping[str, str]) -> str:
    argv = build_install(helm, layout, chart, values)
    env = {
        "HOME": str(layout.state_dir / "helm-home"),
        "PATH": "/usr/bin:/bin",
        "HELM_CACHE_HOME": str(layout.state_dir / "helm-home" / "cache"),
        "HELM_CONFIG_HOME": str(layout.state_dir / "helm-home" / "config"),
        "HELM_DATA_HOME": str(layout.state_dir / "helm-home" / "data"),
    }
    out = subprocess.run(argv, capture_output=True, text=True, check=False, env=env, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"helm install failed ({out.returncode}): {out.stderr.strip()}\n{out.stdout[-2000:]}")
    return out.stdout
