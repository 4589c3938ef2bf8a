"""The Node object and its Lease, as the kubelet keeps them."""

from __future__ import annotations

import datetime as dt
import logging
import os
import platform
from collections.abc import Mapping
from typing import Any

from ..kubeclient import Kube, KubeError
from ..layout import Layout

log = logging.getLogger("sluiceway.sandbox.agent")
JSON = dict[str, Any]
LEASE_SECONDS = 40


def _micro(now: dt.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def memory_bytes() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def capacity(cpu: int, gpus: int, max_pods: int = 110) -> dict[str, str]:
    out = {
        "cpu": str(cpu),
        "memory": f"{memory_bytes() // 1024}Ki",
        "pods": str(max_pods),
        "ephemeral-storage": "100Gi",
    }
    if gpus:
        out["nvidia.com/gpu"] = str(gpus)
    return out


def build_node(layout: Layout, cap: Mapping[str, str], version: str) -> JSON:
    name = layout.node_name
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": {"x86_64": "amd64", "aarch64": "arm64"}.get(
                    platform.machine(), platform.machine()
                ),
                "node.kubernetes.io/instance-type": "sluiceway-sandbox",
            },
        },
        "spec": {},
        "status": {
            "capacity": dict(cap),
            "allocatable": dict(cap),
            "addresses": [{"type": "InternalIP", "address": layout.bridge_ip}, {"type": "Hostname", "address": name}],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "sluiceway sandbox agent is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                },
                {
                    "type": "MemoryPressure",
                    "status": "False",
                    "reason": "KubeletHasSufficientMemory",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                },
                {
                    "type": "DiskPressure",
                    "status": "False",
                    "reason": "KubeletHasNoDiskPressure",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                },
                {
                    "type": "PIDPressure",
                    "status": "False",
                    "reason": "KubeletHasSufficientPID",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                },
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": platform.release(),
                "osImage": "sluiceway sandbox",
                "containerRuntimeVersion": "sandbox://processes",
                "kubeletVersion": version,
                "kubeProxyVersion": version,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def register(kube: Kube, node: JSON) -> None:
    name = node["metadata"]["name"]
    try:
        kube.create("/api/v1/nodes", node)
    except KubeError as err:
        if err.status != 409:
            raise
    kube.request(
        "PATCH", f"/api/v1/nodes/{name}/status", {"status": node["status"]}, content_type="application/merge-patch+json"
    )


def renew_lease(kube: Kube, layout: Layout) -> None:
    name = layout.node_name
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
    now = _micro(dt.datetime.now(dt.UTC))
    spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now}
    try:
        kube.merge_patch(path, {"spec": spec})
    except KubeError as err:
        if err.status != 404:
            raise
        node = kube.get(f"/api/v1/nodes/{name}")
        kube.create(
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": name,
                    "namespace": "kube-node-lease",
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
                    ],
                },
                "spec": spec,
            },
        )


def cpu_default() -> int:
    return max(os.cpu_count() or 1, 1)
