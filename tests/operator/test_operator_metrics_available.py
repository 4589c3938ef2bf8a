"""Issue 23: the ``MetricsAvailable`` condition, over a real Prometheus scraping a real pod.

A ``sluiceway-pod`` process (synthetic model) on loopback, the Debian/Go-built Prometheus scraping
its metrics port with the static labels a ServiceMonitor's relabeling gives (``namespace``,
``inferenceservice``), and the real :class:`Reconciler` with an injected clock (the 2 minutes are
the clock's; Prometheus and the pod are real). The API server is the in-memory fake of
test_operator_reconcile_unit, holding a Deployment with one ready pod (no kubelet here).

First Prometheus scrapes the pod under another service's name: no series for ours. Within 2
minutes the condition is Unknown (SeriesPending); after them it is False (NoMetricsSeries, "is it
scraped?") with exactly one Warning Event however many ticks follow. Then Prometheus is reloaded
(SIGHUP) with our name, as fixing the ServiceMonitor's labels does: True and one Normal Event.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from podtools import PodProcess, free_port, start_pod
from promtools import PrometheusProcess, prometheus_missing
from sluiceway_operator.policy import Policy
from sluiceway_operator.reconcile import Reconciler
from sluiceway_operator.settings import OperatorConfig
from test_operator_reconcile_unit import FakeKube

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.timeout(300),
    pytest.mark.skipif(prometheus_missing() is not None, reason=prometheus_missing() or ""),
]

NS, NAME = "shop", "ranker"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodProcess]:
    p = start_pod(tmp_path_factory.mktemp("pod"), "--model", "synthetic:5")
    try:
        yield p
    finally:
        p.terminate(30)


@pytest.fixture(scope="module")
def prometheus(pod: PodProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProcess]:
    prom = PrometheusProcess(
        free_port(),
        tmp_path_factory.mktemp("prometheus"),
        [f"127.0.0.1:{pod.metrics_port}"],
        labels={"namespace": NS, "inferenceservice": "someone-else"},  # not selected for ours
    )
    prom.start()
    try:
        prom.wait_scraped()
        yield prom
    finally:
        prom.stop()


def _body() -> dict[str, Any]:
    return {
        "metadata": {"name": NAME, "namespace": NS, "uid": "u-ranker", "generation": 1},
        "spec": {"model": {"image": "i:1", "format": "demo", "source": "demo"}},
        "status": {},
    }


def _cond(kube: FakeKube) -> dict[str, Any]:
    return next(c for c in kube.status["conditions"] if c["type"] == "MetricsAvailable")


def _relabel(prom: PrometheusProcess, name: str) -> None:
    path = Path(prom.workdir) / "prometheus.yml"
    config = yaml.safe_load(path.read_text())
    config["scrape_configs"][0]["static_configs"][0]["labels"]["inferenceservice"] = name
    path.write_text(yaml.safe_dump(config))
    assert prom.proc is not None
    prom.proc.send_signal(signal.SIGHUP)  # Prometheus reloads its configuration


def test_metrics_available_follows_the_series(prometheus: PrometheusProcess) -> None:
    kube = FakeKube()
    clock = Clock()
    config = OperatorConfig(prometheus_url=prometheus.url, policy=Policy.open(), prometheus_timeout=10)
    rec = Reconciler(config, kube, clock=clock)  # type: ignore[arg-type]
    body = _body()
    rec.apply_children(body)
    kube.objects[("Deployment", NAME)] = {
        "metadata": {"name": NAME, "namespace": NS, "ownerReferences": [{"uid": "u-ranker", "controller": True}]},
        "spec": {"replicas": 1},
        "status": {"replicas": 1, "readyReplicas": 1},
    }
    rec.refresh_signals(body)
    first = _cond(kube)
    print("t=0:", first)
    assert (first["status"], first["reason"]) == ("Unknown", "SeriesPending")
    clock.now += 119
    rec.refresh_signals(body)
    assert _cond(kube)["status"] == "Unknown"
    clock.now += 2
    for _ in range(3):
        rec.refresh_signals(body)
        clock.now += 15
    missing = _cond(kube)
    print("t=121 s:", missing)
    assert (missing["status"], missing["reason"]) == ("False", "NoMetricsSeries")
    assert "no series for this InferenceService in Prometheus for 2 minutes: is it scraped?" in missing["message"]
    assert kube.events.count("NoMetricsSeries") == 1
    assert "MetricsAvailable" not in _ready_message(kube)  # Ready does not depend on it

    _relabel(prometheus, NAME)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        rec.refresh_signals(body)
        if _cond(kube)["status"] == "True":
            break
        time.sleep(0.5)
    found = _cond(kube)
    print("after the relabel:", found, "events:", kube.events)
    assert (found["status"], found["reason"]) == ("True", "MetricsSeriesFound")
    for _ in range(3):
        rec.refresh_signals(body)
    assert kube.events.count("MetricsSeriesFound") == 1
    assert kube.events.count("NoMetricsSeries") == 1


def _ready_message(kube: FakeKube) -> str:
    return str(next(c for c in kube.status["conditions"] if c["type"] == "Ready")["message"])


def test_no_ready_pods_never_turns_false(prometheus: PrometheusProcess) -> None:
    """No ready pod, nothing to scrape: the condition waits (Unknown), however long."""
    kube = FakeKube()
    clock = Clock()
    config = OperatorConfig(prometheus_url=prometheus.url, policy=Policy.open(), prometheus_timeout=10)
    rec = Reconciler(config, kube, clock=clock)  # type: ignore[arg-type]
    body = dict(_body(), metadata={"name": "idle", "namespace": NS, "uid": "u-idle", "generation": 1})
    rec.apply_children(body)
    for _ in range(3):
        rec.refresh_signals(body)
        clock.now += 200
    cond = _cond(kube)
    assert (cond["status"], cond["reason"]) == ("Unknown", "NoReadyPods")
    assert kube.events == []
