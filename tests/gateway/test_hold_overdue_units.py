"""The predicted ready time once a starting pod overruns ``hold.startupSeconds`` (pure; the real-process
tests are in ``test_gateway_hold_faults.py``)."""

from __future__ import annotations

import pytest
from sluiceway_gateway.hold import predicted_ready_seconds, retry_after_seconds, start_left_seconds
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


def test_the_drain_rate_of_a_ready_pod_counts_what_it_has_in_flight() -> None:
    """Little's law: a pod answering in 1 s on average while 100 requests are in flight to it works
    off 100 a second, not its hand-off cap (2 permits + 1) over 1 s. The burst benchmark's pod, with
    a thousand requests sent before the hold queue took over, was predicted at 2-3 a second and the
    gateway refused long-deadline requests with Retry-After 927 s while the pod drained them in 6 s."""
    busy = PodLoad("r", ewma_ms=1000.0, permits_limit=2, inflight=100)
    assert predicted_ready_seconds(0.0, [busy], [], 20.0, 200, 1) == pytest.approx(2.0)
    idle = PodLoad("i", ewma_ms=1000.0, permits_limit=2)
    assert predicted_ready_seconds(0.0, [idle], [], 20.0, 30, 1) == pytest.approx(10.0)  # its cap: 3 a second


def test_the_drain_rate_seen_in_answers_wins_over_a_lagging_answer_time() -> None:
    """After a burst the mean answer time still holds the seconds its first requests queued at the
    pod, though the pod now answers hundreds a second: the rate its answers show is used when higher
    (the burst benchmark's ready pod had 10 long-deadline requests refused early, Retry-After up to 152 s,
    while it drained everything held in under 7 s)."""
    lagging = PodLoad("r", ewma_ms=5000.0, permits_limit=2)  # cap 3 over 5 s: 0.6 a second
    assert predicted_ready_seconds(0.0, [lagging], [], 20.0, 600, 1) == pytest.approx(1000.0)
    assert predicted_ready_seconds(0.0, [lagging], [], 20.0, 600, 1, observed_rate=600.0) == pytest.approx(1.0)
    assert retry_after_seconds(600, [lagging], 1, 5.0, observed_rate=300.0) == pytest.approx(2.0)
    assert retry_after_seconds(600, [PodLoad("d", down=True)], 1, 5.0, observed_rate=300.0) == 5.0  # none ready
