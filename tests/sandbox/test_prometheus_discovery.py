"""The sandbox's Prometheus (built from its Go module) against a real API server: it discovers pods
through kubernetes_sd_configs with its own ServiceAccount token (TokenRequest, least RBAC), keeps
only Running inference pods on their port named ``metrics``, and labels the series with namespace,
inferenceservice and pod, so that the scaler's PromQL (sluiceway_core.signals) reads them."""

from __future__ import annotations

import json
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sluiceway_core.signals import Queries
from sluiceway_sandbox.prometheus import (
    PrometheusError,
    prometheus_bin_dir,
    prometheus_config,
    prometheus_manifests,
    start_prometheus,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "operator"))
from kubetools import ADMIN_TOKEN, ControlPlane, control_plane  # noqa: E402
from netports import free_port as _free_port  # noqa: E402

__all__ = ["control_plane"]

pytestmark = [pytest.mark.apiserver, pytest.mark.prometheus, pytest.mark.slow]



def _call(cp: ControlPlane, method: str, path: str, body: Any = None,
          ctype: str = "application/json") -> Any:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    req = urllib.request.Request(
        f"{cp.server}{path}", data=json.dumps(body).encode() if body is not None else None, method=method,
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": ctype},
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        raise AssertionError(f"{method} {path}: {err.code} {err.read()[:500]!r}") from None


_PLURAL = {"Namespace": "namespaces", "ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles",
           "ClusterRoleBinding": "clusterrolebindings"}


def _apply(cp: ControlPlane, obj: dict[str, Any]) -> None:
    group, _, version = obj["apiVersion"].rpartition("/")
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    ns = obj["metadata"].get("namespace")
    _call(cp, "POST", f"{base}/namespaces/{ns}/{_PLURAL[obj['kind']]}" if ns else f"{base}/{_PLURAL[obj['kind']]}",
          obj)


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'# TYPE sluiceway_queue_depth gauge\nsluiceway_queue_depth{model="m"} 3\n'
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[int]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield int(srv.server_address[1])
    srv.shutdown()


def _pod(cp: ControlPlane, ns: str, name: str, labels: dict[str, str], ports: list[tuple[str, int]],
         phase: str) -> None:
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "ghcr.io/sluiceway/sluiceway-pod:0",
                                 "ports": [{"name": n, "containerPort": p} for n, p in ports]}]},
    }
    _call(cp, "POST", f"/api/v1/namespaces/{ns}/pods", pod)
    # No kubelet here: set the status a kubelet would report (loopback is fine in a Pod's status).
    status = {"status": {"phase": phase, "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}
    _call(cp, "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", status, "application/merge-patch+json")


def _query(url: str, q: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': q})}", timeout=5) as r:
        return list(json.loads(r.read())["data"]["result"])


def test_pods_discovered_with_serviceaccount_and_relabeled(
    control_plane: ControlPlane, metrics_server: int, tmp_path: Path
) -> None:
    try:
        bindir = prometheus_bin_dir(build=False)
    except PrometheusError as err:
        pytest.skip(f"prometheus not built (tools/build-prometheus.sh): {err}")
    cp = control_plane
    for obj in prometheus_manifests():
        _apply(cp, obj)
    token = _call(cp, "POST", "/api/v1/namespaces/monitoring/serviceaccounts/prometheus/token",
                  {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"expirationSeconds": 3600}})["status"]["token"]
    token_file = tmp_path / "token"
    token_file.write_text(token)
    _call(cp, "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}})
    infer = {"app.kubernetes.io/name": "sluiceway-pod", "sluiceway.io/inferenceservice": "svc1"}
    _pod(cp, "demo", "svc1-a", infer, [("http", 1), ("metrics", metrics_server)], "Running")
    _pod(cp, "demo", "svc1-pending", infer, [("http", 1), ("metrics", metrics_server)], "Pending")
    _pod(cp, "demo", "other", {"app.kubernetes.io/name": "other"}, [("metrics", metrics_server)], "Running")
    _pod(cp, "demo", "svc1-noport", infer, [("http", metrics_server)], "Running")

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    ca = cp.workdir / "pki" / "apiserver.crt"  # the API server's self-signed chain (kubetools)
    cfg = prometheus_config(cp.server, ca, token_file, "1s")
    log = tmp_path / "prometheus.log"
    proc = start_prometheus(cfg, tmp_path / "prom", f"127.0.0.1:{port}", log, binary=bindir / "prometheus")
    try:
        q = Queries.build("demo", "svc1", "30s").queue_depth
        deadline = time.monotonic() + 120
        got: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                got = _query(url, q)
            except OSError:
                got = []
            if got and got[0]["value"][1] == "3":
                break
            time.sleep(1)
        assert got and got[0]["value"][1] == "3", f"{got}\n{log.read_text()[-3000:]}"
        series = _query(url, 'up{job="sluiceway-pods"}')
        assert [s["metric"] for s in series] == [{
            "__name__": "up", "instance": f"127.0.0.1:{metrics_server}", "job": "sluiceway-pods",
            "namespace": "demo", "inferenceservice": "svc1", "pod": "svc1-a",
        }], series
        depth = _query(url, "sluiceway_queue_depth")
        assert {s["metric"]["pod"] for s in depth} == {"svc1-a"}
        assert "forbidden" not in log.read_text().lower()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
