"""The cold start's prediction (issue 20: ``Retry-After`` at zero within 20 % of the real ready time).

The gateway measures what it itself waits for, from the first request it held with no pod at all to
the first pod it can hand requests to, and predicts the next cold start from the latest ones
(:func:`~sluiceway_gateway.hold.cold_start_estimate`); before it has measured one, from
``hold.startupSeconds`` plus ``hold.coldStartOverheadSeconds``. Pure parts, and the real ``Gateway``
object with an injected clock and discovery fed by hand."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from sluiceway_gateway.app import COLD_HISTORY, Gateway
from sluiceway_gateway.config import GatewayConfig
from sluiceway_gateway.endpoints import Endpoint, StaticEndpoints
from sluiceway_gateway.hold import ColdStart, cold_start_estimate, predicted_ready_seconds
from sluiceway_gateway.ledger import PodLoad


def test_the_estimate_is_the_median_of_the_measured_ones_else_the_startup_plus_the_overhead() -> None:
    assert cold_start_estimate([], 22.0, 6.0) == 28.0
    assert cold_start_estimate([27.5], 22.0, 6.0) == 27.5
    assert cold_start_estimate([27.5, 29.0, 90.0], 22.0, 6.0) == 29.0  # one slow start does not move it
    assert cold_start_estimate([27.0, 29.0], 22.0, 6.0) == 28.0


def test_during_a_cold_start_the_prediction_is_what_is_left_of_it() -> None:
    cold = ColdStart(100.0, 28.0)
    starting = [PodLoad("a:1", ready=False)]
    assert predicted_ready_seconds(105.0, [], [], 22.0, 0, 1, overdue=True, cold=cold) == pytest.approx(23.0)
    # the pod seen starting 3 s in does not restart the clock: the cold start counts from its first request
    assert predicted_ready_seconds(110.0, starting, [103.0], 22.0, 0, 1, overdue=True, cold=cold) == \
        pytest.approx(18.0)
    # past the prediction, late by as much again
    assert predicted_ready_seconds(131.0, starting, [103.0], 22.0, 0, 1, overdue=True, cold=cold) == \
        pytest.approx(3.0)
    # without a cold start: a pod starting keeps its own time left; none starting: the cold estimate
    assert predicted_ready_seconds(110.0, starting, [103.0], 22.0, 0, 1, overdue=True) == pytest.approx(15.0)
    assert predicted_ready_seconds(110.0, [], [], 22.0, 0, 1, overdue=True, cold_estimate=28.0) == 28.0
    assert predicted_ready_seconds(110.0, [], [], 22.0, 0, 1, overdue=True) == 22.0


def _gateway(now: list[float], startup: float = 22.0) -> Gateway:
    config = GatewayConfig.model_validate({"endpoints": ["127.0.0.1:1"],
                                           "hold": {"startupSeconds": startup, "coldStartOverheadSeconds": 6}})
    gw = Gateway(config, StaticEndpoints([]), CollectorRegistry(), clock=lambda: now[0])
    gw.set_endpoints([])
    return gw


def _cold_start(gw: Gateway, now: list[float], begin: float, appears: float, ready: float) -> None:
    """One cold start: a request held at ``begin`` with no pod, the pod in the EndpointSlice (not ready)
    at ``appears``, ready at ``ready``, then scaled back to zero."""
    now[0] = begin
    gw._cold_began(now[0])
    now[0] = appears
    gw.set_endpoints([Endpoint("10.0.0.9:8080", "10.0.0.9", 8080, ready=False)])
    now[0] = ready
    gw.set_endpoints([Endpoint("10.0.0.9:8080", "10.0.0.9", 8080, ready=True)])
    now[0] = ready + 60
    gw.set_endpoints([])


def test_the_gateway_measures_its_cold_starts_and_predicts_the_next_from_them() -> None:
    now = [0.0]
    gw = _gateway(now)
    assert gw.predicted_ready(0.0) == 28.0  # nothing measured: 22 + 6
    _cold_start(gw, now, 100.0, 102.4, 129.5)
    assert list(gw._cold_measured) == [pytest.approx(29.5)]
    assert gw.metrics.cold_actual._value.get() == pytest.approx(29.5)
    assert gw.metrics.cold_predicted._value.get() == 28.0
    assert gw.predicted_ready(now[0]) == pytest.approx(29.5)  # the next one, from zero
    # during the next one: what is left of it, whether or not its pod is seen starting yet
    now[0] = 300.0
    gw._cold_began(now[0])
    now[0] = 302.0
    assert gw.predicted_ready(now[0], held_ahead=0) == pytest.approx(27.5)
    gw.set_endpoints([Endpoint("10.0.0.7:8080", "10.0.0.7", 8080, ready=False)])
    now[0] = 310.0
    assert gw.predicted_ready(now[0], held_ahead=0) == pytest.approx(19.5)
    now[0] = 327.0
    gw.set_endpoints([Endpoint("10.0.0.7:8080", "10.0.0.7", 8080, ready=True)])
    assert gw._cold is None and list(gw._cold_measured) == [pytest.approx(29.5), pytest.approx(27.0)]
    assert gw.predicted_ready(now[0], held_ahead=0) == 0.0  # a pod is ready


def test_the_history_is_bounded_and_a_request_held_while_a_pod_starts_is_no_cold_start() -> None:
    now = [0.0]
    gw = _gateway(now)
    for i in range(COLD_HISTORY + 3):
        _cold_start(gw, now, 1000.0 * i, 1000.0 * i + 2, 1000.0 * i + 20 + i)
    assert len(gw._cold_measured) == COLD_HISTORY
    assert gw._cold_measured[-1] == pytest.approx(20.0 + COLD_HISTORY + 2)
    now[0] = 50_000.0
    gw.set_endpoints([Endpoint("10.0.0.9:8080", "10.0.0.9", 8080, ready=False)])  # a pod already starting
    gw._cold_began(now[0])
    assert gw._cold is None
    now[0] = 50_005.0
    assert gw.predicted_ready(now[0], held_ahead=0) == pytest.approx(17.0)  # its own time left of 22 s
