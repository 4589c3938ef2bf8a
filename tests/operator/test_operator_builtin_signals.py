"""The builtin engine's signals (issue 21 on the operator's side): it reads the requests in the pods
(``Queries.requests_in_pods``: running + queued) into ``Signals.requests_in_pods`` as the scaler does,
and holds a shortage for its rate window plus a scrape plus one decision (``shortage_hold``).

A real HTTP server on loopback answers the Prometheus queries (each query string of
``Queries.build`` mapped to a value); the API server is the in-memory fake of
test_operator_reconcile_unit. The engine end to end with a real Prometheus and pod:
test_operator_prometheus.py."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sluiceway_core.signals import Queries
from sluiceway_operator.policy import Policy
from sluiceway_operator.reconcile import BUILTIN_RATE_WINDOW, Reconciler, builtin_scaling_spec
from sluiceway_operator.settings import OperatorConfig
from sluiceway_operator.spec import parse_spec
from test_operator_reconcile_unit import FakeKube

NS, NAME, UID = "n", "a", "u1"


def _answers(in_pods: float) -> dict[str, float]:
    q = Queries.build(NS, NAME, BUILTIN_RATE_WINDOW)
    # idle by every other measure: an empty queue, 10 % busy, one ready pod with one permit
    return {q.queue_depth: 0.0, q.utilisation: 0.1, q.concurrency: 1.0, q.pods_up: 1.0, q.requests_in_pods: in_pods}


@pytest.fixture()
def prometheus() -> Iterator[tuple[str, dict[str, float], list[str]]]:
    answers: dict[str, float] = {}
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("query", [""])[0]
            asked.append(query)
            result = [{"metric": {}, "value": [0, str(answers[query])]}] if query in answers else []
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
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answers, asked
    finally:
        server.shutdown()
        server.server_close()


def _body() -> dict[str, Any]:
    return {
        "metadata": {"name": NAME, "namespace": NS, "uid": UID, "generation": 1},
        "spec": {
            "model": {"image": "i:1", "format": "demo", "source": "demo"},
            "autoscaling": {"engine": "builtin", "minReplicas": 1, "maxReplicas": 20},
        },
    }


def _deployment(replicas: int) -> dict[str, Any]:
    return {
        "metadata": {"name": NAME, "namespace": NS, "ownerReferences": [{"uid": UID, "controller": True}]},
        "spec": {"replicas": replicas},
    }


def _decided(kube: FakeKube) -> list[int]:
    return [m["spec"]["replicas"] for kind, m in kube.applied_manifests if kind == "Deployment"]


def test_the_builtin_engine_scales_on_the_requests_in_the_pods(
    prometheus: tuple[str, dict[str, float], list[str]],
) -> None:
    """8 requests running or queued in one pod of one permit, at the 80 % utilisation target, ask
    for ceil(8 / 0.8) = 10 pods, though the queue-depth gauge reads 0 and utilisation 10 %."""
    url, answers, asked = prometheus
    kube = FakeKube()
    kube.objects[("Deployment", NAME)] = _deployment(1)
    rec = Reconciler(OperatorConfig(policy=Policy.open(), prometheus_url=url), kube)  # type: ignore[arg-type]
    answers.update(_answers(in_pods=8.0))
    outcome = rec.refresh_signals(_body())
    assert outcome is not None and outcome.prometheus_error is None, outcome
    assert Queries.build(NS, NAME, BUILTIN_RATE_WINDOW).requests_in_pods in asked
    print(f"\nin pods 8, queue 0, utilisation 0.1: {outcome.builtin_note}")
    assert (
        outcome.builtin_note is not None and "8 requests in the pods / (1 permits x 0.80) -> 10" in outcome.builtin_note
    )
    (decided,) = _decided(kube)  # 10, or less where the policy's scale-up step limits it
    assert 1 < decided <= 10, (decided, outcome.builtin_note)

    # none in the pods: nothing asks for more than the one pod
    idle = FakeKube()
    idle.objects[("Deployment", NAME)] = _deployment(1)
    rec = Reconciler(OperatorConfig(policy=Policy.open(), prometheus_url=url), idle)  # type: ignore[arg-type]
    answers.update(_answers(in_pods=0.0))
    rec.refresh_signals(_body())
    assert _decided(idle) == [], idle.applied_manifests


def test_shortage_hold_is_the_rate_window_a_scrape_and_a_decision() -> None:
    spec = parse_spec(_body()["spec"])
    assert BUILTIN_RATE_WINDOW == "2m"
    assert builtin_scaling_spec(spec, 15.0).shortage_hold == 120 + 15 + 15  # monitoring.interval 15s default
    slow_scrape = parse_spec({**_body()["spec"], "monitoring": {"interval": "30s"}})
    assert builtin_scaling_spec(slow_scrape, 2.0).shortage_hold == 120 + 30 + 2
