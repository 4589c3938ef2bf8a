"""Failing-first tests for the admission-core defects of issue 10 (items 2, 3 and 6).

Manual clock, no HTTP: each test drives :class:`AdmissionCore` through :class:`tests.scheduler.sim.Sim`
or directly, so a regression shows as a wrong decision, not as a timing flake.
"""

from __future__ import annotations

from typing import Any

from sluiceway_pod.admission import AdmissionCore
from sluiceway_pod.clock import ManualClock
from sluiceway_pod.errors import QueueFull

from .sim import Arrival, Sim, settings, tenant

# ---------------------------------------------------------------- item 2: wait prediction by class


def test_a_critical_request_behind_fifty_batch_ones_is_not_refused_as_unmeetable() -> None:
    """50 `batch` requests are queued; a `critical` one with a budget of a few service times runs
    next, so predicting its wait from the whole queue depth (51 service times) is wrong."""
    sim = Sim(
        settings(permits=1, max_depth=1000, aging_seconds=100.0, initial_service_time=0.01), service=lambda b: 0.01
    )
    one = tenant("x")
    arrivals = [Arrival(0.0, one, 2) for _ in range(51)]  # one runs, fifty wait
    arrivals.append(Arrival(0.001, one, 0, budget=0.05))
    sim.run(arrivals)
    critical = sim.records[-1]
    assert critical.refused is None, critical.refused
    assert critical.answers == [("ok", None)]
    assert sim.dispatch_order.index(critical) == 1  # right after the one that was running


def test_predicted_wait_counts_only_the_work_ahead_of_the_class_and_tenant() -> None:
    clock = ManualClock()
    core: AdmissionCore[int] = AdmissionCore(
        settings(permits=1, max_depth=1000, aging_seconds=100.0, initial_service_time=0.01), clock
    )
    a, b = tenant("a"), tenant("b")

    def noop(_r: Any, _e: Any) -> None:
        pass

    core.admit(a, 1, 0, noop)
    assert core.next_batch() is not None  # the permit is now busy
    for i in range(40):
        core.admit(a, 2, i, noop)  # 40 batch-class requests of tenant a
    for i in range(10):
        core.admit(a, 1, i, noop)  # 10 standard-class requests of tenant a
    # critical: nothing ahead of it but the running batch
    assert core.predicted_wait(0, b) == 0.01
    # standard, another tenant: fair queueing puts it near the front of a's ten, not behind the 40
    assert core.predicted_wait(1, b) <= 0.01 * 5
    # standard, tenant a itself: behind its own ten
    assert core.predicted_wait(1, a) >= 0.01 * 10
    # batch: behind everything
    assert core.predicted_wait(2, a) >= 0.01 * 50
    # the whole-queue view (for Retry-After and the degradation message) is unchanged
    assert core.predicted_wait() == 0.01 * 51


# ---------------------------------------------------------------- item 3: batch fill must not stall


def test_a_filling_batch_does_not_stall_other_batch_keys_with_idle_permits() -> None:
    sim = Sim(settings(permits=2, max_batch_size=8, max_batch_wait=1.0, queue_timeout=10.0), service=lambda b: 0.01)
    one = tenant("x")
    sim.run([Arrival(0.0, one, 1, key="small")] + [Arrival(0.001, one, 1, key="large") for _ in range(8)])
    small, *large = sim.records
    # the head's batch ("small") waits up to max_batch_wait to fill; the full "large" batch goes on
    # the idle permit at once
    assert all(r.dispatched_at == 0.001 for r in large), [r.dispatched_at for r in large]
    assert small.dispatched_at is not None and 0.9 < small.dispatched_at <= 1.0


def test_a_batch_is_filled_in_fair_queueing_order_not_arrival_order() -> None:
    """Heavy has five requests queued; two light tenants arrive later with one each. The next batch
    of three is what fair queueing would run next: both lights and heavy's oldest."""
    sim = Sim(settings(permits=1, max_batch_size=3, max_batch_wait=0.0, aging_seconds=100.0), service=lambda b: 0.1)
    heavy, l1, l2 = tenant("heavy"), tenant("l1"), tenant("l2")
    arrivals = [Arrival(0.0, heavy, 1, key="k") for _ in range(6)]  # 3 run at once, 3 wait
    arrivals += [Arrival(0.05, l1, 1, key="k"), Arrival(0.05, l2, 1, key="k")]
    sim.run(arrivals)
    second = sim.batches[1]
    assert {r.arrival.tenant.name for r in second} == {"heavy", "l1", "l2"}, [r.arrival.tenant.name for r in second]


# ---------------------------------------------------------------- item 6: displacement across ceilings


def test_a_request_never_displaces_work_of_a_tenant_with_a_higher_ceiling() -> None:
    vip = tenant("vip", max_priority_rank=0)  # may use every class
    anon = tenant("anonymous", max_priority_rank=1)  # capped at the default class
    sim = Sim(settings(permits=1, max_depth=3, aging_seconds=100.0), service=lambda b: 1.0)
    sim.run(
        [
            Arrival(0.0, vip, 2),  # runs
            *[Arrival(0.01 * i, vip, 2) for i in range(1, 4)],  # fill the queue with vip's batch work
            Arrival(0.1, anon, 1),  # standard, the anonymous ceiling
        ]
    )
    *vips, newcomer = sim.records
    assert isinstance(newcomer.refused, QueueFull), newcomer.refused
    assert all(r.answers == [("ok", None)] for r in vips)


def test_displacement_within_the_same_ceiling_still_works() -> None:
    a = tenant("a", max_priority_rank=1)
    b = tenant("b", max_priority_rank=1)
    sim = Sim(settings(permits=1, max_depth=2, aging_seconds=100.0), service=lambda b_: 1.0)
    sim.run([Arrival(0.0, a, 2), Arrival(0.01, a, 2), Arrival(0.02, a, 2), Arrival(0.1, b, 1)])
    _run, _first, second, newcomer = sim.records
    assert newcomer.refused is None
    assert second.answers[0][1] is not None and second.answers[0][1].reason == "displaced"


def test_a_full_queue_has_room_for_a_request_that_may_displace() -> None:
    """The degradation ladder asks the core whether a request would find a place: a critical request
    facing a queue full of batch work does (it displaces), another batch request does not."""
    clock = ManualClock()
    core: AdmissionCore[int] = AdmissionCore(settings(permits=1, max_depth=2, aging_seconds=100.0), clock)
    one = tenant("x")

    def noop(_r: Any, _e: Any) -> None:
        pass

    for i in range(2):
        core.admit(one, 2, i, noop)
    assert core.has_room(0, one)
    assert not core.has_room(2, one)
    assert not core.has_room(1, tenant("anonymous", max_priority_rank=1))  # x's ceiling is higher
