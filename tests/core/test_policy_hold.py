"""The policy's hold term (issue 20): the pods that drain the requests the gateway holds, sized now,
counting the pods already starting, exempt from the scale-up step, and not recorded, so that once
the gateway holds nothing the scale-down window and the shortage hold do not keep them. Each test
failed before the term existed (``Signals`` had no ``held``: TypeError)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sluiceway_core.policy import (
    ScaleDownPolicy,
    ScaleHistory,
    ScaleUpPolicy,
    ScalingSpec,
    Signals,
    desired_replicas,
)

SPEC = ScalingSpec(
    min_replicas=0,
    max_replicas=20,
    target_queue_per_replica=8,
    target_wait_p95=2.0,
    target_utilisation=0.8,
    hold_drain_seconds=60.0,
    scale_up=ScaleUpPolicy(max_pods=4, max_percent=100),
    scale_down=ScaleDownPolicy(stabilization_window=300, max_pods=None, period=60, max_percent=None),
)


def at_zero(held: float, cost: float | None = None, ready: int = 0, in_pods: float = 0.0) -> Signals:
    return Signals(queue_depth=0, held=held, permits=4, request_cost=cost, ready_replicas=ready,
                   requests_in_pods=in_pods)


def test_held_requests_ask_for_the_pods_that_drain_them_at_zero() -> None:
    # cost unknown (nothing served in the window): a permit each, 100 / (4 x 0.8) = 32 -> max 20
    d = desired_replicas(at_zero(100), SPEC, 0, ScaleHistory(), 0.0)
    assert (d.replicas, d.hold) == (20, 32)  # the term, then bounded by max_replicas
    assert "hold 100 held at the gateway" in d.reason and "a permit each" in d.reason
    # cost 0.2 s: one pod drains 4 x 0.8 x 60 / 0.2 = 960 in 60 s; 3000 held -> 4 pods
    d = desired_replicas(at_zero(3000, cost=0.2), SPEC, 0, ScaleHistory(), 0.0)
    assert (d.replicas, d.hold) == (4, 4)
    assert "0.2s each" in d.reason
    # a request longer than the drain time holds a permit for all of it
    assert desired_replicas(at_zero(10, cost=600.0), SPEC, 0, ScaleHistory(), 0.0).replicas == 4


def test_pods_already_starting_count_toward_the_hold_term() -> None:
    """4 pods asked for are still loading (0 ready): 3500 held still need 4, so the poll during the
    start-up asks for no more (an increment would ask again on every poll)."""
    d = desired_replicas(at_zero(3500, cost=0.2), SPEC, 4, ScaleHistory(), 0.0)
    assert d.replicas == 4
    d = desired_replicas(at_zero(5000, cost=0.2), SPEC, 4, d.history, 1.0)
    assert d.replicas == 6  # the held requests outgrew what 4 pods drain: 5000 / 960 -> 6


def test_the_hold_term_is_exempt_from_the_scale_up_step() -> None:
    # one pod serves and 9600 are held: 10 pods now, not the step's 1 + 4
    d = desired_replicas(at_zero(9600, cost=0.2, ready=1), SPEC, 1, ScaleHistory(), 0.0)
    assert d.replicas == 10
    # while pods start (ready 1 of 2), likewise not the step from the ready pod
    d = desired_replicas(at_zero(9600, cost=0.2, ready=1), SPEC, 2, ScaleHistory(), 0.0)
    assert d.replicas == 10


def test_the_hold_term_is_not_kept_once_the_held_requests_are_drained() -> None:
    """20 pods for a held burst; 10 s later the gateway holds nothing and 3 requests are in the
    pods: the window holds what the other terms recorded (1 pod), not the hold term's 20."""
    d = desired_replicas(at_zero(6400), SPEC, 0, ScaleHistory(), 0.0)
    assert d.replicas == 20
    d = desired_replicas(at_zero(0, cost=0.2, ready=20, in_pods=3), SPEC, 20, d.history, 10.0)
    assert d.replicas == 1 and d.hold is None
    # the same count raised by the requests in the pods (a shortage term) is held by the window
    e = desired_replicas(at_zero(0, ready=20, in_pods=64), SPEC, 20, ScaleHistory(), 0.0)
    assert e.replicas == 20
    e = desired_replicas(at_zero(0, cost=0.2, ready=20, in_pods=3), SPEC, 20, e.history, 10.0)
    assert e.replicas == 20


def test_no_held_count_decides_as_before() -> None:
    base = Signals(queue_depth=16, permits=4, ready_replicas=2, requests_in_pods=8, request_cost=0.2)
    for held in (None, 0.0):
        a = desired_replicas(replace(base, held=held), SPEC, 2, ScaleHistory(), 0.0)
        b = desired_replicas(base, SPEC, 2, ScaleHistory(), 0.0)
        assert (a.replicas, a.reason, a.hold) == (b.replicas, b.reason, None)
    # the term off: the held count is ignored
    off = replace(SPEC, hold_drain_seconds=None)
    assert desired_replicas(at_zero(100), off, 0, ScaleHistory(), 0.0).replicas == 0


def test_missing_data_still_holds_whatever_is_held() -> None:
    d = desired_replicas(Signals(queue_depth=None, held=100, ok=False, detail="empty"), SPEC, 3, ScaleHistory(), 0.0)
    assert d.held and d.replicas == 3


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_hold_drain_seconds_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="hold_drain_seconds"):
        replace(SPEC, hold_drain_seconds=bad)


def test_permits_unknown_at_zero_count_one_a_pod() -> None:
    d = desired_replicas(replace(at_zero(2), permits=None), SPEC, 0, ScaleHistory(), 0.0)
    assert d.replicas == 3  # 2 / (1 x 0.8)


def test_the_hold_term_serves_the_flow_still_arriving_while_it_drains() -> None:
    """100/s keep arriving at the gateway while 960 are held: (960 / 60 + 100) x 0.2 / 3.2 = 7.25
    -> 8 pods; without the flow 1 (the demand term needs a serving pod and is silent at zero)."""
    d = desired_replicas(replace(at_zero(960, cost=0.2), edge_rate=100.0), SPEC, 0, ScaleHistory(), 0.0)
    assert d.replicas == 8 and "100/s arriving" in d.reason
    assert desired_replicas(at_zero(960, cost=0.2), SPEC, 0, ScaleHistory(), 0.0).replicas == 1
