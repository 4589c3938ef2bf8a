"""The predicted ready time once a starting pod overruns ``hold.startupSeconds`` (pure; the real-process
tests are in ``test_gateway_hold_faults.py``)."""

from __future__ import annotations

import pytest
from sluiceway_gateway.hold import predicted_ready_seconds, start_left_seconds
from sluiceway_gateway.ledger import PodLoad


def test_time_left_counts_down_then_grows_with_the_overrun() -> None:
    assert start_left_seconds(5.0, 20.0, overdue=True) == 15.0
    assert start_left_seconds(20.0, 20.0, overdue=True) == 0.0
    # past the prediction: late by as much again as it is late already
    assert start_left_seconds(26.0, 20.0, overdue=True) == 6.0
    assert start_left_seconds(60.0, 20.0, overdue=True) == 40.0
    # without overdue (the default): "any moment now", as before
    assert start_left_seconds(26.0, 20.0, overdue=False) == 0.0


def test_an_overdue_pod_pushes_the_prediction_out() -> None:
    starting = [PodLoad("a", down=True)]
    assert predicted_ready_seconds(100.0, starting, [70.0], 20.0, 0, 1) == 0.0  # unchanged default
    assert predicted_ready_seconds(100.0, starting, [70.0], 20.0, 0, 1, overdue=True) == pytest.approx(10.0)
    # the soonest of several starting pods decides: one on time, one overdue
    two = [PodLoad("a", down=True), PodLoad("b", down=True)]
    assert predicted_ready_seconds(100.0, two, [70.0, 95.0], 20.0, 0, 1, overdue=True) == pytest.approx(10.0)
    assert predicted_ready_seconds(100.0, two, [70.0, 88.0], 20.0, 0, 1, overdue=True) == pytest.approx(8.0)
    # a ready pod: the start-up does not count at all
    ready = PodLoad("r", ewma_ms=250.0, permits_limit=3)
    assert predicted_ready_seconds(100.0, [ready, *starting], [10.0], 20.0, 8, 1, overdue=True) == pytest.approx(0.5)
