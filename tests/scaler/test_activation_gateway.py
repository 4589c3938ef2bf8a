"""Activation from the gateway's hold queue (issue 20), with real parts: a real ``sluiceway-gateway``
process with no ready pod behind it (it holds requests), a real ``sluiceway-pod`` that serves and is
then stopped (the service scaled to zero), the Debian prometheus scraping both every second (the
gateway as its own target with ``component="gateway"``, as docs/autoscaling.md asks of the scrape
config), and the scaler's real gRPC server.

Before the fix the scaler read only the pods: once the last pod was gone its signals were empty,
"unknown never deactivates" repeated the last answer, ``false``, and a service at zero never woke
whatever the gateway held or refused."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from netports import free_port
from podtools import start_pod
from scaler_support import NAMESPACE, PROMETHEUS, SERVICE, Prometheus, ref, start_scaler, wait_for
from sluiceway_core.policy import Signals
from sluiceway_core.signals import Queries
from sluiceway_core.urls import UrlAllowList
from sluiceway_scaler.prom import PrometheusSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from gwtools import GatewayProcess, start_gateway

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}).encode()


def send(gw: GatewayProcess, n: int, deadline_ms: int) -> list[threading.Thread]:
    def one() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(gw.infer_url(), content=BODY, timeout=deadline_ms / 1000 + 20,
                       headers={"X-Sluiceway-Deadline-Ms": str(deadline_ms)})

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[tuple[Any, GatewayProcess, Prometheus, Any]]:
    """An idle pod and a gateway (whose one endpoint is a port nothing listens on: it holds
    everything), both scraped, the gateway labelled as its scrape job labels it."""
    if not Path(PROMETHEUS).exists():
        pytest.skip("prometheus binary not found: apt-get install -y prometheus")
    pod = start_pod(tmp_path, "--model", "synthetic:10", "--concurrency", "1")
    gw = start_gateway(tmp_path, {"endpoints": [f"127.0.0.1:{free_port()}"], "hold": {"maxRequests": 2}})
    prom = Prometheus(free_port(), tmp_path, [f"127.0.0.1:{pod.metrics_port}"])
    # a second job for the gateway: the same InferenceService labels plus component="gateway"
    cfg = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    cfg["scrape_configs"].append({
        "job_name": "sluiceway-gateway", "metrics_path": "/metrics",
        "static_configs": [{"targets": [f"127.0.0.1:{gw.metrics_port}"],
                            "labels": {"namespace": NAMESPACE, "inferenceservice": SERVICE, "component": "gateway"}}],
    })
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    prom.start()
    try:
        wait_for(lambda: len(prom.query("up == 1")) == 2, 60, "both targets scraped")
        yield pod, gw, prom, tmp_path
    finally:
        prom.stop()
        gw.stop(10)
        pod.terminate(10)


def test_a_service_at_zero_wakes_when_the_gateway_holds_or_refuses_for_want_of_a_pod(
    parts: tuple[Any, GatewayProcess, Prometheus, Any],
) -> None:
    pod, gw, prom, _ = parts
    md = {"inferenceService": SERVICE, "prometheusAddress": prom.url, "targetQueueDepthPerReplica": "2",
          "minReplicas": "0", "maxReplicas": "10", "rateWindow": "15s", "queryTimeout": "2s",
          "activationPollInterval": "200ms"}
    source = PrometheusSource(allow=UrlAllowList((prom.url,)))
    queries = Queries.build(NAMESPACE, SERVICE, "15s")

    def signals() -> Signals:
        return source.read_signals(prom.url, queries, 2.0)[0]

    with start_scaler((prom.url,)) as s:
        # the gateway's target is not a pod: one pod up
        assert source.scalar(prom.url, queries.pods_up, 2.0) == 1.0
        # idle pod, nothing held: inactive (a stream opened now says so first)
        wait_for(lambda: signals().arrival_rate == 0.0, 30, "the pod reads idle")
        assert s.stub.IsActive(ref(**md), timeout=20).result is False
        stream = s.stub.StreamIsActive(ref(**md), timeout=60)
        assert next(stream).result is False

        # scaled to zero: the pod is gone and Prometheus sees no pod series
        pod.terminate(10)
        wait_for(lambda: not signals().ok, 30, "no pod series")
        assert s.stub.IsActive(ref(**md), timeout=20).result is False  # unknown: the last answer

        # two requests held (deadline 3 s), a third refused at once at the bound
        t0 = time.monotonic()
        threads = send(gw, 2, 3000)
        wait_for(lambda: gw.metric("sluiceway_gateway_held_requests") == 2, 20, "2 held")
        send(gw, 1, 3000)
        wait_for(lambda: gw.metric("sluiceway_gateway_hold_refused_total", reason="full") == 1, 20, "1 refused")
        pushed = next(stream).result  # the stream pushes the change
        took = time.monotonic() - t0
        got = signals()
        print(f"pushed {pushed} {took:.2f}s after the first request was held; signals at zero: "
              f"ok={got.ok} held={got.held} refused_no_pod={got.refused_no_pod} ready={got.ready_replicas}")
        assert pushed is True
        assert s.stub.IsActive(ref(**md), timeout=20).result is True
        assert got.held == 2 and got.ok and got.ready_replicas == 0  # the hold term can size at zero

        # the held requests time out (504 at 3 s): nothing held, yet the refusals keep it active
        for t in threads:
            t.join(30)
        wait_for(lambda: (x := signals()).held == 0 and (x.refused_no_pod or 0) > 0, 20, "held 0, refusals seen")
        assert s.stub.IsActive(ref(**md), timeout=20).result is True
        stream.cancel()
