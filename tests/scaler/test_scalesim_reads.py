"""One truth (issue 21): the simulator's ``ours-keda`` reads exactly the signals the KEDA scaler
reads. The scaler's side is ``PrometheusSource.read_signals`` over HTTP against a Prometheus
stand-in that answers every query of ``Queries.build`` with a number (so every signal it reads is
set); the simulator's side is ``OursKeda`` asking the policy, with a record where every series is
non-zero and the gateway holds requests. The sets of ``Signals`` fields set must be the same, but
for the ones only one side can have:

- ``refused_no_pod``: read by the scaler for its activation only (``service.py``); the policy does
  not read it (``Signals``' docstring) and the simulator's activation reads the edge directly
  (``OursZero``);
- ``offered_trend``: the simulator's predictive variant only (``ours-keda-predictive``, not the
  product).

Before this test, the simulator's ``ours-keda`` read the requests in the pods (their window average
and the instant sample) while the scaler read neither (commit 1c7e383): this test fails on that.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import pytest
from fakeprom import FakePrometheus
from sluiceway_core.policy import Signals
from sluiceway_core.signals import Queries
from sluiceway_core.urls import UrlAllowList
from sluiceway_scaler.prom import PrometheusSource

import bench.scalesim.controllers as controllers
from bench.scalesim.compare import build_policies
from bench.scalesim.model import Record, ServiceModel
from bench.scalesim.observe import Prometheus

ONE_SIDED = {"refused_no_pod", "offered_trend"}
NOT_SIGNALS = {"ok", "detail"}


def _set(s: Signals) -> set[str]:
    return {f.name for f in fields(s) if f.name not in NOT_SIGNALS and getattr(s, f.name) is not None}


def _scaler_reads() -> tuple[set[str], list[str]]:
    q = Queries.build("team-a", "demo", "1m")
    queries = {f.name: getattr(q, f.name) for f in fields(q) if getattr(q, f.name)}
    # longest first: the stand-in answers the first key that is a substring of the query, and a
    # query's own text is the longest key contained in it
    fake = FakePrometheus({text: 3.0 for text in sorted(queries.values(), key=len, reverse=True)})
    try:
        src = PrometheusSource(allow=UrlAllowList.build("test", [fake.url]))
        signals, _ = src.read_signals(fake.url, q, 5.0)
        asked = list(fake.queries)
    finally:
        fake.close()
    assert signals.ok, signals.detail
    names = [name for name, text in queries.items() if text in asked]
    return _set(signals), names


def _simulator_reads(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    model = ServiceModel()
    rec = Record(200)
    for name in ("arrived", "served", "queue", "wait_p95", "busy", "in_service", "held"):
        getattr(rec, name)[:] = 3.0
    for name in ("ready", "scraped", "total", "target"):
        getattr(rec, name)[:] = 3
    rec.startup[:] = 20.0
    prom = Prometheus(rec, model, scrape_failure=0.0, query_failure=0.0)
    seen: list[Signals] = []
    real = controllers.desired_replicas

    def spy(signals: Signals, *args: Any, **kwargs: Any) -> Any:
        seen.append(signals)
        return real(signals, *args, **kwargs)

    monkeypatch.setattr(controllers, "desired_replicas", spy)
    [ours] = build_policies(["ours-keda"], model, np.zeros(200), 20)
    assert ours.name == "ours-keda"
    pool = type("Pool", (), {"target": 3, "total": 3, "starting": 0})()
    for t in range(61, 123):
        ours.decide(t, prom, pool)  # type: ignore[arg-type]
    assert seen, "the HPA never synced"
    assert all(s.ok for s in seen)
    return set().union(*(_set(s) for s in seen))


def test_the_simulators_ours_keda_reads_what_the_scaler_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    scaler, asked = _scaler_reads()
    sim = _simulator_reads(monkeypatch)
    print("scaler reads:", sorted(scaler))
    print("simulator's ours-keda reads:", sorted(sim))
    print("queries the scaler sent:", asked)
    assert scaler - ONE_SIDED == sim - ONE_SIDED
    # the term that flapped the sandbox e2e is in neither (docs/autoscaling.md)
    assert "requests_in_pods" not in scaler and "requests_in_pods_now" not in scaler
    assert "requests_in_pods_avg" not in asked and "requests_in_pods" not in asked
