"""Property-based tests of the admission core (hypothesis, manual clock, no HTTP)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from sluiceway_pod.clock import ManualClock
from sluiceway_pod.errors import QueueFull, QueueTimeout, TenantQueueFull
from sluiceway_pod.tenancy import TokenBucket

from .sim import Arrival, Sim, settings, tenant

TENANTS = [tenant("a", 1, max_queued=8, max_concurrent=2), tenant("b", 3), tenant("c", 2, max_queued=3)]

arrival_lists = st.lists(
    st.tuples(
        st.floats(0, 5, allow_nan=False),  # arrival time
        st.integers(0, 2),  # tenant index
        st.integers(0, 2),  # class rank
        st.sampled_from(["s", "m", "l"]),  # batch key
        st.one_of(st.none(), st.floats(0.001, 3)),  # client budget
    ),
    max_size=80,
)


@hsettings(max_examples=150, deadline=None)
@given(
    arrivals=arrival_lists,
    permits=st.integers(1, 4),
    depth=st.integers(1, 30),
    timeout=st.floats(0.05, 5),
    batch=st.integers(1, 6),
    batch_wait=st.floats(0, 0.05),
    services=st.lists(st.floats(0.001, 0.3), min_size=1, max_size=10),
)
def test_permits_bounds_and_exactly_one_answer(arrivals, permits, depth, timeout, batch, batch_wait, services):
    it = iter(services * 100000)
    sim = Sim(
        settings(
            permits=permits, max_depth=depth, queue_timeout=timeout, max_batch_size=batch, max_batch_wait=batch_wait
        ),
        service=lambda b: next(it),
    )
    sim.run([Arrival(t, TENANTS[i], r, k, bud) for t, i, r, k, bud in arrivals])
    assert sim.violations == []
    assert sim.max_in_use <= permits
    for rec in sim.records:
        if rec.refused is not None:
            assert rec.answers == [] and isinstance(rec.refused, QueueFull | TenantQueueFull | Exception)
        else:
            assert len(rec.answers) == 1, rec  # exactly one answer for every admitted request
    assert sim.core.depth == 0 and sim.core.in_use == 0
    # a batch only ever mixes requests with the same batch key, and never exceeds the batch size
    for members in sim.batches:
        assert 0 < len(members) <= batch
        assert len({m.arrival.key for m in members}) == 1
    for rec in sim.records:
        if rec.ticket is not None and rec.answers[0][1] is None:
            assert rec.dispatched_at is not None


@hsettings(max_examples=150, deadline=None)
@given(
    arrivals=st.lists(st.tuples(st.floats(0, 20, allow_nan=False), st.integers(0, 3)), min_size=1, max_size=120),
    permits=st.integers(1, 3),
    aging=st.floats(0.05, 2),
    service_max=st.floats(0.01, 0.5),
    services=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=10),
)
def test_aging_bounds_the_wait_of_the_lowest_class(arrivals, permits, aging, service_max, services):
    classes = 4
    depth = 40
    it = iter(services * 100000)
    sim = Sim(
        settings(permits=permits, max_depth=depth, num_classes=classes, aging_seconds=aging),
        service=lambda b: next(it) * service_max,
    )
    one = tenant("solo")
    sim.run([Arrival(t, one, r) for t, r in arrivals])
    assert sim.violations == []
    bound = classes * aging + (math.ceil(depth / permits) + 1) * service_max
    for rec in sim.records:
        if rec.ticket is not None:
            assert rec.dispatched_at is not None  # nothing expires with an infinite queue timeout
            if rec.arrival.rank == classes - 1:
                assert rec.dispatched_at - rec.arrival.at <= bound + 1e-9


@hsettings(max_examples=100, deadline=None)
@given(weights=st.lists(st.integers(1, 5), min_size=2, max_size=4), total=st.integers(20, 200))
def test_backlogged_tenants_get_weighted_shares(weights, total):
    tenants = [tenant(f"t{i}", w) for i, w in enumerate(weights)]
    sim = Sim(settings(permits=1, max_depth=10_000, num_classes=1), service=lambda b: 0.01)
    # every tenant is backlogged from t=0 with more work than will be dispatched
    arrivals = [Arrival(0.0, t, 0) for t in tenants for _ in range(total)]
    sim.run(arrivals, until=0.01 * total - 1e-9)
    dispatched = sim.dispatch_order[:total]
    s = sum(weights)
    for t, w in zip(tenants, weights, strict=True):
        got = sum(1 for r in dispatched if r.arrival.tenant is t)
        assert abs(got - total * w / s) <= 2, (weights, total, t.name, got)  # tolerance: 2 requests


@hsettings(max_examples=60, deadline=None)
@given(
    light_slots=st.lists(st.integers(0, 12), min_size=1, max_size=8),
    service=st.floats(0.005, 0.1),
    heavy_weight=st.integers(1, 4),
)
def test_a_flooding_tenant_adds_at_most_one_service_time_to_a_light_one(light_slots, service, heavy_weight):
    """The light tenant stays within its fair share: at most one request per (sum of weights + 1) service
    times. The heavy one offers 10x the capacity. Light's wait is then at most the remaining service time
    of the request in progress, i.e. one service time."""
    heavy, light = tenant("heavy", heavy_weight, max_queued=50), tenant("light", 1)
    sim = Sim(settings(permits=1, max_depth=10_000, num_classes=3), service=lambda b: service)
    spacing = (heavy_weight + 2) * service
    times = sorted({slot * spacing + service / 3 for slot in light_slots})
    horizon = times[-1] + 2 * service
    heavy_arrivals = [Arrival(i * service / 10, heavy, 1) for i in range(int(horizon / service * 10))]
    sim.run(heavy_arrivals + [Arrival(t, light, 1) for t in times], until=horizon)
    lights = [rec for rec in sim.records if rec.arrival.tenant is light]
    assert len(lights) == len(times)
    for rec in lights:
        assert rec.ticket is not None and rec.dispatched_at is not None
        assert rec.dispatched_at - rec.arrival.at <= service + 1e-9


@hsettings(max_examples=200, deadline=None)
@given(rate=st.floats(0.5, 50), burst=st.integers(1, 20), gaps=st.lists(st.floats(0, 0.5), min_size=1, max_size=200))
def test_token_bucket_conforms(rate, burst, gaps):
    clock = ManualClock()
    bucket = TokenBucket(rate, burst, clock)
    admitted: list[float] = []
    for g in gaps:
        clock.advance(g)
        wait = bucket.try_take()
        if wait == 0.0:
            admitted.append(clock.now())
        else:
            assert wait > 0
            # the advertised wait is right: after it a token is there
            probe = TokenBucket(rate, burst, clock)
            probe._tokens, probe._t = bucket._tokens, bucket._t
            clock.advance(wait)
            assert probe.try_take() == 0.0
            clock._t -= wait  # undo the probe's time travel
    # in every window, admissions <= burst + rate * window
    for i in range(len(admitted)):
        for j in range(i, len(admitted)):
            assert j - i + 1 <= burst + rate * (admitted[j] - admitted[i]) + 1e-6


def test_expired_requests_are_answered_with_the_right_reason():
    sim = Sim(settings(permits=1, queue_timeout=0.5), service=lambda b: 1.0)
    one = tenant("x")
    sim.run([Arrival(0.0, one, 1), Arrival(0.0, one, 1), Arrival(0.1, one, 1, budget=0.2)])
    first, second, third = sim.records
    assert first.answers == [("ok", None)]
    assert isinstance(second.answers[0][1], QueueTimeout)
    assert third.answers[0][1] is not None and third.answers[0][1].reason == "deadline_expired"


def test_a_full_queue_lets_higher_priority_displace_the_youngest_lowest():
    sim = Sim(settings(permits=1, max_depth=3, aging_seconds=100.0), service=lambda b: 1.0)
    one = tenant("x")
    # t=0: one runs, three 'batch' (rank 2) fill the queue; t=0.1: a 'critical' (rank 0) arrives
    sim.run(
        [
            Arrival(0.0, one, 2),
            *[Arrival(0.01 * i, one, 2) for i in range(1, 4)],
            Arrival(0.1, one, 0),
            Arrival(0.2, one, 2),
        ]
    )
    _running, b1, b2, b3, critical, late_batch = sim.records
    assert critical.refused is None and critical.ticket is not None
    assert b3.answers and b3.answers[0][1] is not None and b3.answers[0][1].reason == "displaced"
    assert b1.answers == [("ok", None)] and b2.answers == [("ok", None)]  # older ones keep their place
    assert isinstance(late_batch.refused, QueueFull)  # an equal class cannot displace
    assert sim.dispatch_order.index(critical) < sim.dispatch_order.index(b1)  # and it goes first
    assert all(len(r.answers) == 1 for r in sim.records if r.ticket is not None)


@hsettings(max_examples=60, deadline=None)
@given(bursts=st.lists(st.integers(1, 4), min_size=1, max_size=6), service=st.floats(0.005, 0.1))
def test_a_short_burst_after_idle_is_not_interleaved_with_a_backlogged_tenant(bursts, service):
    """Up to BURST_CREDIT + 1 requests sent at once by a tenant that was idle run back to back: the
    k-th of the burst waits at most k service times (the running request, then its own)."""
    heavy, light = tenant("heavy", 1, max_queued=50), tenant("light", 1)
    sim = Sim(settings(permits=1, max_depth=10_000, num_classes=3), service=lambda b: service)
    gap = 30 * service  # long enough for the light tenant to fall behind the virtual time again
    start = 10 * service + service / 3  # the heavy tenant has been served for a while
    light_arrivals = [Arrival(start + i * gap, light, 1) for i, k in enumerate(bursts) for _ in range(k)]
    horizon = start + len(bursts) * gap
    heavy_arrivals = [Arrival(i * service / 10, heavy, 1) for i in range(int(horizon / service * 10))]
    sim.run(heavy_arrivals + light_arrivals, until=horizon)
    lights = [r for r in sim.records if r.arrival.tenant is light]
    for i, k in enumerate(bursts):
        burst = lights[sum(bursts[:i]) : sum(bursts[:i]) + k]
        for pos, rec in enumerate(burst, 1):
            assert rec.dispatched_at is not None
            assert rec.dispatched_at - rec.arrival.at <= pos * service + 1e-9


def test_a_filling_batch_is_never_held_past_a_member_deadline():
    sim = Sim(settings(permits=1, queue_timeout=0.5, max_batch_size=8, max_batch_wait=10.0), service=lambda b: 0.01)
    sim.run([Arrival(0.0, tenant("x"), 1)])
    (only,) = sim.records
    assert only.answers == [("ok", None)]  # dispatched when its deadline came, not expired
    assert only.dispatched_at is not None and only.dispatched_at < 0.5
