"""Fair share by device time (issue 11): WF2Q+ tags advance by a request's cost, and every backlogged
tenant's device time stays within one maximum request cost of ``weight / sum(weights)`` of the total.

Simulated time (manual clock), hypothesis-generated tenants: every request declares the device
seconds it takes (``Arrival.cost``); the simulated device runs each batch for the sum of its
members' costs, and the core only learns costs by measuring them (``finish``), as in production.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from sluiceway_pod.admission import BURST_CREDIT, AdmissionCore
from sluiceway_pod.clock import ManualClock

from .sim import Arrival, Sim, cost_service, settings, tenant

#: the simulated device's time per row; also the core's prior per-row estimate (``initial_service_time``),
#: so every request's estimated cost (rows x per-row EWMA) equals its real cost from the first one on
PER_ROW = 0.001


def run_backlogged_rows(
    specs: list[tuple[int, list[int]]], horizon: float, permits: int = 1
) -> tuple[Sim, list[tuple[float, dict[str, float]]], float]:
    """Tenant ``i`` has weight ``specs[i][0]`` and sends requests of ``specs[i][1]`` rows in turn (cost
    = rows x PER_ROW), all queued at t=0, more than it can get by ``horizon``. Returns the sim, the
    device seconds of every tenant *completed* at every completion up to ``horizon``, and the largest
    request cost."""
    tenants = [tenant(f"t{i}", w) for i, (w, _) in enumerate(specs)]
    total_w = sum(w for w, _ in specs)
    c_max = max(r for _, rows in specs for r in rows) * PER_ROW
    sim = Sim(
        settings(permits=permits, max_depth=1_000_000, num_classes=1, initial_service_time=PER_ROW),
        service=cost_service,
    )
    arrivals = []
    for t, (w, rows) in zip(tenants, specs, strict=True):
        # enough for its share, plus slack: no tenant runs dry before the horizon (checked below)
        n = int((permits * horizon * w / total_w + (2 + permits) * c_max) / (min(rows) * PER_ROW)) + 2
        arrivals += [Arrival(0.0, t, 0, rows=rows[k % len(rows)], cost=rows[k % len(rows)] * PER_ROW) for k in range(n)]
    sim.run(arrivals, until=horizon)
    for tq in sim.core._tenants.values():
        assert tq.queued > 0, f"tenant {tq.tenant.name} ran dry: the test no longer has every tenant backlogged"
    done: dict[str, float] = {}
    samples: list[tuple[float, dict[str, float]]] = []
    spans = sorted((end, name, (end - start) * part) for start, end, name, part in sim.spans if end <= horizon)
    for end, name, seconds in spans:
        done[name] = done.get(name, 0.0) + seconds
        samples.append((end, dict(done)))
    return sim, samples, c_max


@hsettings(max_examples=300, deadline=None)
@given(
    specs=st.lists(
        st.tuples(st.integers(1, 8), st.lists(st.integers(1, 64), min_size=1, max_size=3)), min_size=2, max_size=6
    ),
    horizon=st.floats(0.5, 2.0),
)
def test_backlogged_tenants_stay_within_one_maximum_request_cost_of_their_share(
    specs: list[tuple[int, list[int]]], horizon: float
) -> None:
    """Issue 11: with every tenant backlogged, each tenant's device time stays within one maximum
    request cost of ``weight / sum(weights)`` of the total, for 2-6 tenants, weights 1-8 and request
    sizes 1-64 rows (cost = rows x 1 ms), checked at every completion (one permit).

    Steady costs: every row takes PER_ROW, which is also the core's prior, so the estimated cost of
    every request equals its measured cost and no EWMA warm-up error enters; the 1e-9 is float
    rounding only."""
    _sim, samples, c_max = run_backlogged_rows(specs, horizon)
    total_w = sum(w for w, _ in specs)
    worst = 0.0
    for at, done in samples:
        total = sum(done.values())
        for i, (w, _) in enumerate(specs):
            dev = done.get(f"t{i}", 0.0) - total * w / total_w
            worst = max(worst, abs(dev))
            assert abs(dev) <= c_max + 1e-9, (
                f"t={at:.4f}: tenant t{i} (weight {w}) has {done.get(f't{i}', 0.0):.4f} s of {total:.4f} s, "
                f"share {total * w / total_w:.4f} s, off by {dev / c_max:+.3f} x C_max = {c_max:.3f} s; specs={specs}"
            )
    assert samples  # the device did work


@hsettings(max_examples=100, deadline=None)
@given(
    specs=st.lists(
        st.tuples(st.integers(1, 8), st.lists(st.integers(1, 64), min_size=1, max_size=3)), min_size=2, max_size=6
    ),
    horizon=st.floats(0.5, 1.5),
    permits=st.integers(2, 4),
)
def test_with_several_permits_the_bound_is_one_maximum_cost_per_permit(
    specs: list[tuple[int, list[int]]], horizon: float, permits: int
) -> None:
    """With N permits up to N requests run at once and the completed device time of a tenant can be
    behind or ahead by what is in flight: the bound becomes ``N x C_max`` (same steady costs)."""
    _sim, samples, c_max = run_backlogged_rows(specs, horizon, permits)
    total_w = sum(w for w, _ in specs)
    for at, done in samples:
        total = sum(done.values())
        for i, (w, _) in enumerate(specs):
            dev = done.get(f"t{i}", 0.0) - total * w / total_w
            assert abs(dev) <= permits * c_max + 1e-9, (at, i, dev / c_max, specs)


@hsettings(max_examples=100, deadline=None)
@given(
    specs=st.lists(
        st.tuples(st.integers(1, 8), st.lists(st.integers(1, 64), min_size=1, max_size=3)), min_size=1, max_size=5
    ),
    returner=st.tuples(st.integers(1, 8), st.integers(1, 64)),
    away=st.floats(0.2, 1.0),
    after=st.floats(0.3, 1.0),
)
def test_an_idle_tenant_banks_no_credit_beyond_its_burst(
    specs: list[tuple[int, list[int]]], returner: tuple[int, int], away: float, after: float
) -> None:
    """Burst after idle: a tenant that sent one request, stayed away while the others were served,
    then floods, gets ahead of its share (counted from its return) by at most its burst credit,
    ``(BURST_CREDIT + 1)`` of its own requests, plus one maximum request cost: idle time banks nothing."""
    w_r, rows_r = returner
    back = tenant("back", w_r)
    tenants = [tenant(f"t{i}", w) for i, (w, _) in enumerate(specs)]
    total_w = sum(w for w, _ in specs) + w_r
    c_max = max([r for _, rows in specs for r in rows] + [rows_r]) * PER_ROW
    horizon = away + after
    sim = Sim(
        settings(permits=1, max_depth=1_000_000, num_classes=1, initial_service_time=PER_ROW), service=cost_service
    )
    arrivals = [Arrival(0.0, back, 0, rows=rows_r, cost=rows_r * PER_ROW)]
    arrivals += [
        Arrival(away, back, 0, rows=rows_r, cost=rows_r * PER_ROW) for _ in range(int(after / (rows_r * PER_ROW)) + 2)
    ]
    for t, (_, rows) in zip(tenants, specs, strict=True):
        n = int((horizon + 3 * c_max) / (min(rows) * PER_ROW)) + 2
        arrivals += [Arrival(0.0, t, 0, rows=rows[k % len(rows)], cost=rows[k % len(rows)] * PER_ROW) for k in range(n)]
    sim.run(arrivals, until=horizon)
    assert all(tq.queued > 0 for tq in sim.core._tenants.values())  # everyone still backlogged
    base = sim.device_until(away)
    allowed = (BURST_CREDIT + 1) * rows_r * PER_ROW + c_max
    for end in sorted({e for _, e, _, _ in sim.spans if away < e <= horizon}):
        now = sim.device_until(end)
        total = sum(now.values()) - sum(base.values())
        lead = now.get("back", 0.0) - base.get("back", 0.0) - total * w_r / total_w
        assert lead <= allowed + 1e-9, (end, lead / c_max, specs, returner)


COSTS = [0.001, 0.004, 0.016, 0.064]


def run_backlogged(specs: list[tuple[int, float]], horizon: float) -> dict[str, float]:
    """Tenants of (weight, cost per request), all backlogged from t=0; the core starts from its default
    prior (10 ms a row) and learns each tenant's cost by measuring it. Device seconds by ``horizon``."""
    tenants = [tenant(f"t{i}", w) for i, (w, _) in enumerate(specs)]
    sim = Sim(settings(permits=1, max_depth=100_000, num_classes=1), service=cost_service)
    arrivals = [
        Arrival(0.0, t, 0, cost=c)
        for t, (_, c) in zip(tenants, specs, strict=True)
        for _ in range(int(horizon / c) + 2)
    ]
    sim.run(arrivals, until=horizon)
    return sim.device_until(horizon)


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
