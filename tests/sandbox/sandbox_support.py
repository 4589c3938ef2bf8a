"""Helpers shared by the sandbox tests that bring the whole sandbox up (test_e2e.py,
test_keepalive_spread.py): what is missing for it, the CLI as a user runs it, bounded waits, pods."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sluiceway_sandbox import netns
from sluiceway_sandbox.kubeclient import Kube
from sluiceway_sandbox.layout import Layout

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "sandbox-demo.yaml"


def missing() -> str:
    if os.geteuid() != 0:
        return "the sandbox needs root (network namespaces, iptables)"
    tools = netns.missing_tools()
    if tools:
        return f"missing commands: {', '.join(tools)} (apt-get install iproute2 iptables)"
    for script, what in (
        ("build-kube.sh", "kube-apiserver/kube-controller-manager/kube-scheduler/etcd"),
        ("build-kube-proxy.sh", "kube-proxy"),
        ("build-helm.sh", "helm"),
        ("build-keda.sh", "keda-operator/keda-adapter"),
        ("build-prometheus.sh", "prometheus (with Kubernetes service discovery)"),
    ):
        path = ROOT / "tools" / script
        if not path.exists():
            return f"tools/{script} missing"
        out = subprocess.run(["bash", str(path), "--dir"], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            return f"{what} not built in {out.stdout.strip()}: run tools/{script} (scripts/setup.sh does)"
    if not SAMPLE.exists():
        return f"{SAMPLE} missing"
    return ""


def wait_for(check: Callable[[], Any], timeout: float, what: str, detail: Callable[[], str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as err:  # an API hiccup while the box is loaded: keep polling
            last = err
        else:
            if last:
                return last
        time.sleep(1.0)
    extra = f"\n{detail()}" if detail else ""
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}{extra}")


def cli(layout: Layout, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluiceway_cli.main", "sandbox", "--state-dir", str(layout.state_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def pods(kube: Kube, ns: str, selector: str = "") -> list[dict[str, Any]]:
    q = {"labelSelector": selector} if selector else None
    return list(kube.get(f"/api/v1/namespaces/{ns}/pods", q)["items"])


def is_ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds) and not pod["metadata"].get(
        "deletionTimestamp"
    )


def summary(kube: Kube, ns: str) -> str:
    lines = []
    for p in pods(kube, ns):
        st = p.get("status") or {}
        cs = [
            (c["name"], c.get("ready"), {k: (v or {}).get("reason", "") for k, v in (c.get("state") or {}).items()},
             ((c.get("state") or {}).get("waiting") or {}).get("message", "")[:300])
            for c in st.get("containerStatuses") or []
        ]
        lines.append(f"{p['metadata']['name']} {st.get('phase')} ready={is_ready(p)} {cs}")
    return "\n".join(lines) or "no pods"
