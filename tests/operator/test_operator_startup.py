"""``status.startup`` (issue 22 §1, "cold start in phases"): the Pod's scheduled phase and the pod's
own ``sluiceway_start_phase_seconds{phase}``, for the newest ready pod of the current revision.

Pure functions first; then the real :class:`Reconciler` reading a real HTTP server on loopback that
answers as Prometheus does (the API server is the in-memory fake of test_operator_reconcile_unit),
and the status it writes checked against the CRD's status schema (every field declared, so the API
server's pruning keeps it)."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from operator_support import load_crd
from sluiceway_operator.policy import Policy
from sluiceway_operator.reconcile import Reconciler
from sluiceway_operator.settings import OperatorConfig
from sluiceway_operator.status import build_startup, newest_ready_pod, scheduled_seconds
from test_operator_reconcile_unit import FakeKube

NS, NAME, UID = "n", "a", "u1"
HASH = "0123456789abcdef"
IMAGE = "i:1"


def _pod(
    name: str,
    ready_at: str | None,
    *,
    config_hash: str = HASH,
    image: str = IMAGE,
    init: bool = False,
    deleting: bool = False,
) -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-03T10:00:00Z"}]
    if ready_at is not None:
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": ready_at})
    status: dict[str, Any] = {
        "conditions": conditions,
        "containerStatuses": [{"state": {"running": {"startedAt": "2026-12-03T10:00:40Z"}}}],
    }
    if init:
        status["initContainerStatuses"] = [
            {"state": {"terminated": {"startedAt": "2026-12-03T10:00:12Z", "finishedAt": "2026-12-03T10:00:39Z"}}}
        ]
    meta: dict[str, Any] = {
        "name": name,
        "annotations": {"sluiceway.io/config-hash": config_hash},
        "ownerReferences": [{"kind": "ReplicaSet", "name": f"{NAME}-5d8f", "controller": True}],
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T11:00:00Z"
    return {"metadata": meta, "spec": {"containers": [{"image": image}]}, "status": status}


DEPLOYMENT: dict[str, Any] = {
    "metadata": {"name": NAME, "namespace": NS, "ownerReferences": [{"uid": UID, "controller": True}]},
    "spec": {
        "replicas": 3,
        "template": {
            "metadata": {"annotations": {"sluiceway.io/config-hash": HASH}},
            "spec": {"containers": [{"image": IMAGE}]},
        },
    },
    "status": {"replicas": 3, "readyReplicas": 2},
}


def test_newest_ready_pod_of_the_current_revision() -> None:
    pods = [
        _pod("old-rev", "2026-12-03T10:09:00Z", config_hash="feedfacefeedface"),
        _pod("old-image", "2026-12-03T10:08:00Z", image="i:0"),
        _pod("first", "2026-12-03T10:01:00Z"),
        _pod("second", "2026-12-03T10:02:00Z"),
        _pod("not-ready", None),
        _pod("going", "2026-12-03T10:07:00Z", deleting=True),
    ]
    pod = newest_ready_pod(pods, DEPLOYMENT)
    assert pod is not None and pod["metadata"]["name"] == "second"
    assert newest_ready_pod([_pod("not-ready", None)], DEPLOYMENT) is None


def test_scheduled_runs_to_the_first_containers_start() -> None:
    assert scheduled_seconds(_pod("p", None)) == 40.0  # no initializer: the serving container
    assert scheduled_seconds(_pod("p", None, init=True)) == 12.0  # the storage initializer's start
    unscheduled = _pod("p", None)
    unscheduled["status"]["conditions"] = []
    assert scheduled_seconds(unscheduled) is None


def test_build_startup_waits_for_ready_and_leaves_out_what_the_pod_skipped() -> None:
    pod = _pod("p", "2026-12-03T10:01:00Z")
    assert build_startup(pod, {"loaded": 3.0}, HASH, "T") is None  # not ready yet
    st = build_startup(pod, {"loaded": 3.0, "warmed": 1.5, "ready": 0.25}, HASH, "2026-12-03T10:05:00Z")
    assert st == {
        "pod": "p",
        "phases": {"scheduled": 40.0, "loaded": 3.0, "warmed": 1.5, "ready": 0.25},
        "totalSeconds": 44.75,
        "measuredAt": "2026-12-03T10:05:00Z",
        "readyAt": "2026-12-03T10:01:00Z",
        "revision": HASH,
    }


@pytest.fixture()
def prometheus() -> Iterator[tuple[str, list[str]]]:
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("query", [""])[0]
            asked.append(query)
            result: list[dict[str, Any]] = []
            if query.startswith("max by (phase) (sluiceway_start_phase_seconds{") and 'pod="second"' in query:
                phases = {"fetched": 27.0, "loaded": 4.0, "warmed": 2.0, "ready": 0.5}
                result = [{"metric": {"phase": k}, "value": [0, str(v)]} for k, v in phases.items()]
            elif query.startswith("sum(sluiceway_queue_depth"):
                result = [{"metric": {}, "value": [0, "0"]}]
            body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


class PodsKube(FakeKube):
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        super().__init__()
        self.pods = pods

    def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        return self.pods


def _schema_check(value: Any, schema: dict[str, Any], path: str = "startup") -> None:
    """The CRD's structural schema for status.startup: every field declared, types and bounds kept."""
    kind = schema.get("type")
    if kind == "object":
        assert isinstance(value, dict), path
        for k, v in value.items():
            assert k in schema["properties"], f"{path}.{k} is not in the CRD's status schema"
            _schema_check(v, schema["properties"][k], f"{path}.{k}")
    elif kind == "number":
        assert isinstance(value, int | float) and value >= schema.get("minimum", float("-inf")), path
    elif kind == "string":
        assert isinstance(value, str), path


def test_the_reconciler_reports_the_newest_ready_pods_phases_once(prometheus: tuple[str, list[str]]) -> None:
    url, asked = prometheus
    pods = [_pod("first", "2026-12-03T10:01:00Z", init=True), _pod("second", "2026-12-03T10:02:00Z", init=True)]
    kube = PodsKube(pods)
    kube.objects[("Deployment", NAME)] = DEPLOYMENT
    rec = Reconciler(OperatorConfig(policy=Policy.open(), prometheus_url=url), kube)  # type: ignore[arg-type]
    body = {
        "metadata": {"name": NAME, "namespace": NS, "uid": UID, "generation": 1},
        "spec": {"model": {"image": IMAGE, "format": "demo", "source": "demo"}, "autoscaling": {"engine": "none"}},
    }
    rec.apply_children(body)
    rec.refresh_signals(body)
    startup = kube.status["startup"]
    print(f"\nstatus.startup {startup}")
    assert startup["pod"] == "second" and startup["revision"] == HASH
    assert startup["phases"] == {"scheduled": 12.0, "fetched": 27.0, "loaded": 4.0, "warmed": 2.0, "ready": 0.5}
    assert startup["totalSeconds"] == 45.5
    crd = load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    _schema_check(startup, crd["properties"]["status"]["properties"]["startup"])
    phase_queries = [q for q in asked if "sluiceway_start_phase_seconds" in q]
    assert phase_queries == [
        'max by (phase) (sluiceway_start_phase_seconds{namespace="n",inferenceservice="a",pod="second"})'
    ]
    rec.refresh_signals(body)  # measured: not asked again for the same pod
    assert len([q for q in asked if "sluiceway_start_phase_seconds" in q]) == 1
    assert kube.status["startup"] == startup
