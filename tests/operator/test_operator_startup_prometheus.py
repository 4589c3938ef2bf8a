"""``status.startup`` end to end with every part real but the kubelet: a ``sluiceway-pod`` process on
loopback exporting ``sluiceway_start_phase_seconds{phase}``; the Debian Prometheus scraping it with the
labels a ServiceMonitor gives an inference pod (``namespace``, ``inferenceservice``, ``pod``); the
control plane of ``conftest.py`` (etcd + kube-apiserver + kube-controller-manager: the Deployment and
ReplicaSet controllers create the real Pods, which stay unscheduled); the operator as a subprocess under
the chart's rules with ``--prometheus-url``.

No kubelet runs, so the test writes what the kubelet would into one Pod's status (PodScheduled,
Ready, the container's start) through the status subresource, and that Pod's name is the ``pod``
label of the scraped process. The operator must pick that Pod (the newest ready one of the current
revision), read its phases from Prometheus and write them into the InferenceService's status.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubetools import ROOT, Admin, ControlPlane, establish_crd, operator_kubeconfig, run_operator, wait_for
from operator_support import load_crd
from podtools import PodProcess, free_port, start_pod
from promtools import PrometheusProcess, prometheus_missing
from sluiceway_operator.kube import Kube

_POD_CLI = ROOT / "inference-pod" / "sluiceway_pod" / "cli.py"

pytestmark = [
    pytest.mark.apiserver,
    pytest.mark.prometheus,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(prometheus_missing() is not None, reason=prometheus_missing() or ""),
    pytest.mark.skipif(not _POD_CLI.exists(), reason=f"sluiceway-pod CLI ({_POD_CLI}) not present"),
]

NS = "sluiceway-startup"
OP_NS = "sluiceway-system"
NAME = "cold"
IS_PATH = f"/apis/sluiceway.io/v1alpha1/namespaces/{NS}/inferenceservices"


@pytest.fixture(scope="module")
def admin(control_plane: ControlPlane) -> Admin:
    a = Admin(Kube(control_plane.client()))
    establish_crd(a, load_crd())
    for ns in (NS, OP_NS):
        if a.get(f"/api/v1/namespaces/{ns}") is None:
            a.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    return a


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodProcess]:
    p = start_pod(tmp_path_factory.mktemp("pod"), "--model", "synthetic:5")
    try:
        yield p
    finally:
        p.terminate(30)


def _controlled_pods(admin: Admin) -> list[dict[str, Any]]:
    pods = admin.get(f"/api/v1/namespaces/{NS}/pods") or {}
    return [p for p in pods.get("items") or [] if p["metadata"]["name"].startswith(f"{NAME}-")]


def test_status_startup_from_the_pod_and_prometheus(
    control_plane: ControlPlane,
    admin: Admin,
    pod: PodProcess,
    tmp_path: Any,
) -> None:
    admin.create(
        IS_PATH,
        {
            "apiVersion": "sluiceway.io/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": NAME, "namespace": NS},
            "spec": {
                "model": {
                    "image": "registry.example/sluiceway-pod:test",
                    "format": "synthetic",
                    "source": "synthetic:5",
                },
                "replicas": 1,
                "autoscaling": {"engine": "none"},
            },
        },
    )
    try:
        kubeconfig = operator_kubeconfig(control_plane, admin, OP_NS)
        # The Deployment comes from a first operator run without Prometheus; its ReplicaSet's Pod
        # from kube-controller-manager.
        with run_operator(kubeconfig, tmp_path / "operator-1.log", NS, "--drift-interval", "1"):
            (k8s_pod,) = wait_for(lambda: _controlled_pods(admin) or None, 60, what="the Deployment's Pod")
        name = k8s_pod["metadata"]["name"]
        # What the kubelet would write: scheduled at :00, the container started at :07, ready at :09.
        admin.call(
            "PATCH",
            f"/api/v1/namespaces/{NS}/pods/{name}/status",
            body=[
                {
                    "op": "replace",
                    "path": "/status",
                    "value": {
                        "phase": "Running",
                        "conditions": [
                            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-03T10:00:00Z"},
                            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-03T10:00:09Z"},
                        ],
                        "containerStatuses": [
                            {
                                "name": "sluiceway-pod",
                                "image": "registry.example/sluiceway-pod:test",
                                "imageID": "",
                                "ready": True,
                                "restartCount": 0,
                                "state": {"running": {"startedAt": "2026-12-03T10:00:07Z"}},
                            }
                        ],
                    },
                }
            ],
        )
        prom = PrometheusProcess(
            free_port(),
            tmp_path,
            [f"127.0.0.1:{pod.metrics_port}"],
            labels={"namespace": NS, "inferenceservice": NAME, "pod": name},
        )
        prom.start()
        try:
            prom.wait_scraped()
            series = prom.query("sluiceway_start_phase_seconds")
            pod_phases = {s["metric"]["phase"]: float(s["value"][1]) for s in series}
            print(f"\nthe pod's own phases in Prometheus: {pod_phases}")
            assert {"loaded", "warmed", "ready"} <= set(pod_phases), pod_phases
            with run_operator(
                kubeconfig,
                tmp_path / "operator-2.log",
                NS,
                "--prometheus-url",
                prom.url,
                "--drift-interval",
                "1",
                "--signals-interval",
                "1",
            ):
                startup = wait_for(
                    lambda: (admin.get(f"{IS_PATH}/{NAME}") or {}).get("status", {}).get("startup"),
                    60,
                    what="status.startup",
                )
        finally:
            prom.stop()
        print(f"status.startup {startup}")
        assert startup["pod"] == name
        dep = admin.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}")
        assert startup["revision"] == dep["spec"]["template"]["metadata"]["annotations"]["sluiceway.io/config-hash"]
        assert startup["readyAt"] == "2026-12-03T10:00:09Z"
        phases = startup["phases"]
        assert phases["scheduled"] == 7.0
        assert "fetched" not in phases  # no storage initializer
        for phase in ("loaded", "warmed", "ready"):
            assert phases[phase] == pytest.approx(pod_phases[phase], abs=1e-3), phase
        assert startup["totalSeconds"] == pytest.approx(sum(phases.values()), abs=1e-2)
    finally:
        admin.call("DELETE", f"{IS_PATH}/{NAME}")
