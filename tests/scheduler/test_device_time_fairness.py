"""Fair share by device time (issue 11): start-time fair queueing tags advance by a request's cost.

Simulated time (manual clock), hypothesis-generated tenants: every request declares the device
seconds it takes (``Arrival.cost``); the simulated device runs each batch for the sum of its
members' costs, and the core only learns costs by measuring them (``finish``), as in production.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from sluiceway_pod.admission import AdmissionCore
from sluiceway_pod.clock import ManualClock

from .sim import Arrival, Sim, cost_service, settings, tenant


def sfq_bound(i: int, specs: list[tuple[int, float]]) -> float:
    """How far tenant ``i``'s device time may be from ``total * w_i / W`` with every tenant backlogged:
    start-time fair queueing keeps any two tenants within ``c_i/w_i + c_j/w_j`` of each other in
    normalised service (Goyal, Vin & Cheng 1996, theorem 1); summed over the others, weighted:
    ``(1/W) * sum_{j != i} (w_j c_i + w_i c_j)``. For two tenants of equal weight that is
    ``(c_i + c_j)/2``, within one maximum request cost."""
    w_i, c_i = specs[i]
    total_w = sum(w for w, _ in specs)
    return sum(w_j * c_i + w_i * c_j for j, (w_j, c_j) in enumerate(specs) if j != i) / total_w


def run_backlogged(specs: list[tuple[int, float]], horizon: float) -> dict[str, float]:
    tenants = [tenant(f"t{i}", w) for i, (w, _) in enumerate(specs)]
    sim = Sim(settings(permits=1, max_depth=100_000, num_classes=1), service=cost_service)
    arrivals = [
        Arrival(0.0, t, 0, cost=c)
        for t, (_, c) in zip(tenants, specs, strict=True)
        for _ in range(int(horizon / c) + 2)
    ]
    sim.run(arrivals, until=horizon)
    return sim.device_until(horizon)


COSTS = [0.001, 0.004, 0.016, 0.064]


@hsettings(max_examples=150, deadline=None)
@given(
    specs=st.lists(st.tuples(st.integers(1, 5), st.sampled_from(COSTS)), min_size=2, max_size=4),
    horizon=st.floats(2.0, 6.0),
)
def test_backlogged_tenants_share_device_time_by_weight(specs: list[tuple[int, float]], horizon: float) -> None:
    """Every tenant backlogged: each one's device time stays within the SFQ bound of
    ``weight / sum(weights)`` of the total, whatever the request sizes."""
    device = run_backlogged(specs, horizon)
    total = sum(device.values())
    weights = sum(w for w, _ in specs)
    for i, (w, _) in enumerate(specs):
        got = device.get(f"t{i}", 0.0)
        assert abs(got - total * w / weights) <= sfq_bound(i, specs) + 1e-9, (specs, i, got, total * w / weights)


@hsettings(max_examples=200, deadline=None)
@given(costs=st.tuples(st.sampled_from(COSTS), st.sampled_from(COSTS)), horizon=st.floats(2.0, 6.0))
def test_two_backlogged_tenants_are_within_one_maximum_request_cost(costs: tuple[float, float], horizon: float) -> None:
    specs = [(1, costs[0]), (1, costs[1])]
    device = run_backlogged(specs, horizon)
    total = sum(device.values())
    for i in range(2):
        assert abs(device.get(f"t{i}", 0.0) - total / 2) <= max(costs) + 1e-9, (costs, device)


def test_request_count_fairness_would_give_the_large_tenant_most_of_the_device() -> None:
    """The reference point: a tenant whose requests are 64x larger gets half the device, not 64/65."""
    big, small = tenant("big"), tenant("small")
    sim = Sim(settings(permits=1, max_depth=100_000, num_classes=1), service=cost_service)
    arrivals = [Arrival(0.0, big, 0, cost=0.064) for _ in range(200)]
    arrivals += [Arrival(0.0, small, 0, cost=0.001) for _ in range(10_000)]
    sim.run(arrivals, until=6.4)
    share = sim.device["big"] / (sim.device["big"] + sim.device["small"])
    assert 0.48 <= share <= 0.52, share
    served_small = sum(1 for r in sim.dispatch_order if r.arrival.tenant is small)
    served_big = sum(1 for r in sim.dispatch_order if r.arrival.tenant is big)
    assert served_small > 50 * served_big  # ~64x as many small requests for the same device time


@hsettings(max_examples=60, deadline=None)
@given(
    big_cost=st.sampled_from([0.016, 0.032, 0.064, 0.128]),
    small_cost=st.sampled_from([0.001, 0.002, 0.004]),
    slots=st.lists(st.integers(0, 30), min_size=1, max_size=10, unique=True),
)
def test_a_large_request_tenant_cannot_starve_a_small_request_tenant(
    big_cost: float, small_cost: float, slots: list[int]
) -> None:
    """The small tenant stays well inside its half of the device (one request per 4 big costs); the big
    one is backlogged. Each small request waits at most the big request in progress: one big cost."""
    big, small = tenant("big", max_queued=50), tenant("small")
    sim = Sim(settings(permits=1, max_depth=100_000, num_classes=1, aging_seconds=1e6), service=cost_service)
    times = sorted(s * 4 * big_cost + big_cost / 3 for s in slots)
    horizon = times[-1] + 2 * big_cost
    arrivals = [Arrival(i * big_cost / 4, big, 0, cost=big_cost) for i in range(int(horizon / big_cost * 4))]
    arrivals += [Arrival(t, small, 0, cost=small_cost) for t in times]
    sim.run(arrivals, until=horizon)
    smalls = [r for r in sim.records if r.arrival.tenant is small]
    for rec in smalls:
        assert rec.dispatched_at is not None
        assert rec.dispatched_at - rec.arrival.at <= big_cost + 1e-9


def test_batched_requests_are_charged_by_rows() -> None:
    """Batched models: a batch's measured time is split among its members by rows, so a tenant
    sending 8-row requests is charged 8x per request, and its requests' tags advance 8x as fast."""
    clock = ManualClock()
    core: AdmissionCore[int] = AdmissionCore(
        settings(permits=1, num_classes=1, max_batch_size=2, initial_service_time=0.01), clock, rows_of=lambda p: p
    )
    wide, narrow = tenant("wide"), tenant("narrow")

    def noop(_r: object, _e: object) -> None:
        pass

    core.admit(wide, 0, 8, noop, batch_key="k")
    core.admit(narrow, 0, 1, noop, batch_key="k")
    batch = core.next_batch()
    assert batch is not None and len(batch.tickets) == 2
    clock.advance(0.09)
    core.finish(batch, 0.09)  # 9 rows in 0.09 s: 0.01 s per row
    tq = core._tenants
    assert tq["wide"].per_row is not None and abs(tq["wide"].per_row.value - 0.01) < 1e-12
    # charged: wide 8 x 0.01, narrow 1 x 0.01 (finish tags in device seconds per weight)
    assert abs((tq["wide"].vfinish - tq["narrow"].vfinish) - 0.07) < 1e-9
