"""The hold queue's pure parts: bounds, tenant shares, the shared dispatch order, hand-off room and
Retry-After (fast unit tests; the real-process tests are in ``test_gateway_hold.py``)."""

from __future__ import annotations

import pytest
from sluiceway_core.fairshare import Head, pick
from sluiceway_gateway.errors import HoldFull, HoldTenantFull, http_status
from sluiceway_gateway.hold import HoldLimits, HoldQueue, predicted_ready_seconds, retry_after_seconds, room
from sluiceway_gateway.ledger import PodLoad


def _q(n: int = 100, nbytes: int = 10_000, share: float = 1.0, aging: float = 1.0) -> HoldQueue:
    return HoldQueue(HoldLimits(n, nbytes, share, 3, aging))


def test_bounds_by_count_and_bytes_refuse_with_retry_after() -> None:
    q = _q(n=3, nbytes=250)
    for _ in range(2):
        q.offer("", 1, 1, 100, 10.0, 0.0, 7.0)
    with pytest.raises(HoldFull) as bytes_full:
        q.offer("", 1, 1, 100, 10.0, 0.0, 7.0)  # 300 bytes > 250
    assert bytes_full.value.bound == "bytes_full" and bytes_full.value.retry_after_header() == "7"
    q.offer("", 1, 1, 10, 10.0, 0.0, 7.0)
    with pytest.raises(HoldFull) as full:
        q.offer("", 1, 1, 1, 10.0, 0.0, 7.0)
    assert full.value.bound == "full" and http_status(full.value) == 503
    assert (q.count, q.nbytes) == (3, 210)


def test_a_tenant_cannot_fill_the_hold_queue() -> None:
    q = _q(n=10, nbytes=10_000, share=0.5)
    for _ in range(5):
        q.offer("a", 1, 1, 10, 10.0, 0.0, 1.0)
    with pytest.raises(HoldTenantFull) as err:
        q.offer("a", 1, 1, 10, 10.0, 0.0, 1.0)
    assert err.value.bound == "tenant_full" and http_status(err.value) == 429
    for _ in range(5):
        q.offer("b", 1, 1, 10, 10.0, 0.0, 1.0)  # the other tenant still finds its share
    assert q.held_by("a") == (5, 50) and q.held_by("b") == (5, 50)


def test_order_fair_share_by_weight_then_priority() -> None:
    q = _q()
    for i in range(6):
        q.offer("heavy", 2, 1, 1, 100.0, 0.0 + i * 1e-3, 1.0)
    for i in range(3):
        q.offer("light", 1, 1, 1, 100.0, 0.01 + i * 1e-3, 1.0)
    order = [q.pop(0.06) for _ in range(9)]
    names = [h.tenant for h in order if h is not None]
    # weight 2 : 1 while both are backlogged: among the first six, four heavy and two light
    assert names[:6].count("heavy") == 4 and names.count("light") == 3, names
    assert q.pop(0.1) is None and q.count == 0
    for i in range(3):
        q.offer("heavy", 2, 1, 1, 100.0, 1.0 + i * 1e-3, 1.0)
    top = q.offer("light", 1, 0, 1, 100.0, 1.05, 1.0)  # critical: first, though it came last
    assert q.pop(1.06) is top


def test_aging_lifts_an_old_low_class_request() -> None:
    q = _q(aging=1.0)
    old = q.offer("", 1, 2, 1, 100.0, 0.0, 1.0)  # batch class, held 2.5 s
    q.offer("", 1, 1, 1, 100.0, 2.4, 1.0)  # standard, just arrived
    assert q.pop(2.5) is old  # aged band 2 - 2 = 0 beats band 1


def test_pick_is_the_pods_order() -> None:
    """The shared function itself: the smallest aged band, then the smallest eligible finish tag."""
    a = Head("a", 1, 1, 0.0, 1.0, 1.0, 0.0, 1)
    b = Head("b", 1, 1, 0.5, 1.0, 4.0, 0.0, 2)  # finish 0.75 < 1.0, eligible (start <= V' = 0.5)
    c = Head("c", 2, 0, 9.0, 1.0, 1.0, 5.0, 3)  # aged to band 0: its class wins
    assert pick([a, b], 0.5) is not None and pick([a, b], 0.5).head is b  # type: ignore[union-attr]
    assert pick([a, b, c], 0.0).head is c  # type: ignore[union-attr]
    assert pick([], 0.0) is None


def test_remove_and_withdrawn_state() -> None:
    q = _q()
    h = q.offer("", 1, 1, 5, 1.0, 0.0, 1.0)
    assert q.remove(h) and not q.remove(h) and (q.count, q.nbytes) == (0, 0)
    assert q.pop(0.0) is None


def test_room_is_permits_plus_queue_allowance_less_in_flight() -> None:
    p = PodLoad("p", permits_limit=2, inflight=1)
    assert room(p, 1, 0.0, 0.1, None) == 2
    p.inflight = 3
    assert room(p, 1, 0.0, 0.1, None) == 0
    unknown = PodLoad("u")
    assert room(unknown, 1, 0.0, 0.1, None) == 2  # 1 permit until it reports
    full = PodLoad("f", permits_limit=4, degradation=2)
    assert room(full, 1, 0.05, 0.1, 0.0) == 0  # said full 50 ms ago: nothing yet
    assert room(full, 1, 0.2, 0.1, 0.0) == 1  # one probe once nothing is in flight to it
    full.inflight = 1
    assert room(full, 1, 0.2, 0.1, 0.0) == 0
    assert room(PodLoad("d", down=True), 1, 0.0, 0.1, None) == 0


def test_retry_after_from_the_hand_off_rate() -> None:
    assert retry_after_seconds(10, [], 1, 5.0) == 5.0  # no ready pod: the configured value
    p = PodLoad("p", permits_limit=1, ewma_ms=500.0)  # 2 in flight per 0.5 s: 4/s
    assert retry_after_seconds(40, [p], 1, 5.0) == pytest.approx(10.0)
    assert retry_after_seconds(1, [p], 1, 5.0) == 1.0


def test_predicted_ready_time_soonest_starting_pod_then_the_drain() -> None:
    starting = [PodLoad("a", down=True), PodLoad("b", down=True)]
    # none starting: the whole estimate; starting ones: the soonest one's time left, never below 0
    assert predicted_ready_seconds(100.0, [], [], 20.0, 0, 1) == 20.0
    assert predicted_ready_seconds(100.0, starting, [95.0, 90.0], 20.0, 0, 1) == 10.0
    assert predicted_ready_seconds(100.0, starting, [50.0], 20.0, 0, 1) == 0.0
    # what is held ahead drains at the pods' rate: (1 permit + 1 queue) / 0.5 s = 4/s each, 8/s for two
    for p in starting:
        p.ewma_ms = 500.0
    assert predicted_ready_seconds(100.0, starting, [95.0], 20.0, 8, 1) == pytest.approx(15.0 + 1.0)
    # a ready pod: no start-up to wait for, only the drain at the ready pods' rate
    ready = PodLoad("r", ewma_ms=250.0, permits_limit=3)
    assert predicted_ready_seconds(100.0, [ready, *starting], [95.0], 20.0, 8, 1) == pytest.approx(0.5)
