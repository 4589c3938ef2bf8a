"""The pure parts of service-wide quotas: max-min division, the lease schema, the allocator."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from sluiceway_core.quota import (
    Allocator,
    LeaseGrant,
    LeaseRequest,
    QuotaError,
    TenantDemand,
    TenantQuota,
    TenantShare,
    fallback_share,
    max_min_fair,
    max_min_fair_int,
)

from .leases import renew, signed, terms

demand_maps = st.dictionaries(st.sampled_from(list("abcdef")), st.floats(0, 100), min_size=1)


@hsettings(max_examples=300, deadline=None)
@given(capacity=st.floats(0.1, 200), demands=demand_maps)
def test_max_min_fair_division(capacity: float, demands: dict[str, float]) -> None:
    alloc = max_min_fair(capacity, demands)
    assert set(alloc) == set(demands)
    assert math.isclose(sum(alloc.values()), capacity, rel_tol=1e-9, abs_tol=1e-9)
    if sum(demands.values()) <= capacity:
        assert all(alloc[k] >= demands[k] - 1e-9 for k in demands)  # everyone satisfied
    else:
        short = [k for k in demands if alloc[k] < demands[k] - 1e-9]
        # max-min: whoever is short gets at least as much as anyone else
        for k in short:
            assert all(alloc[k] >= alloc[o] - 1e-9 for o in demands)
        assert all(alloc[k] <= demands[k] + 1e-9 for k in demands)  # no leftover to spread


def test_max_min_fair_example_seventy_twenty_ten() -> None:
    alloc = max_min_fair(20.0, {"a": 42.0, "b": 12.0, "c": 6.0})  # 3x a quota of 20, routed 70/20/10
    assert alloc == pytest.approx({"a": 7.0, "b": 7.0, "c": 6.0})


@hsettings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(0, 40), demands=st.dictionaries(st.sampled_from(list("abcde")), st.integers(0, 20), min_size=1)
)
def test_max_min_fair_int_division(capacity: int, demands: dict[str, int]) -> None:
    alloc = max_min_fair_int(capacity, demands)
    assert sum(alloc.values()) == capacity
    if sum(demands.values()) >= capacity:
        assert all(alloc[k] <= demands[k] for k in demands)
        short = [k for k in demands if alloc[k] < demands[k]]
        for k in short:
            assert all(alloc[k] >= alloc[o] - 1 for o in demands)


@hsettings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 3), st.floats(0, 50), st.integers(0, 8), st.floats(0, 2.5)), min_size=1, max_size=60
    ),
    rate=st.floats(1, 100),
    slots=st.integers(1, 10),
)
def test_outstanding_leases_never_exceed_the_quota(
    steps: list[tuple[int, float, int, float]], rate: float, slots: int
) -> None:
    """Any order of renewals with any demand: the leases in force sum to at most the quota."""
    alloc = Allocator(lease_seconds=2.0)
    quota = {"t": TenantQuota(rate, 10, slots)}
    held: dict[str, tuple[float, float, int, int]] = {}  # pod -> (expires, rate, slots, burst)
    now = 0.0
    for pod_i, offered, queued, dt in steps:
        now += dt
        pod = f"p{pod_i}"
        grant = renew(alloc, pod, quota, {"t": TenantDemand(offered, 0, queued, 0)}, now)
        share = grant.shares["t"]
        assert share.rate is not None and share.max_concurrent is not None and share.burst is not None
        held[pod] = (now + grant.lease_seconds, share.rate, share.max_concurrent, share.burst)
        live = [v for v in held.values() if v[0] > now]
        assert sum(v[1] for v in live) <= rate + 1e-9
        assert sum(v[2] for v in live) <= slots
        assert sum(v[3] for v in live) <= 10  # the burst too (10 >= the 4 pods here: no one-each case)
        assert grant.replicas == len(live)


def test_shares_converge_to_max_min_after_everyone_renews() -> None:
    alloc = Allocator(lease_seconds=3.0)
    quota = {"t": TenantQuota(20.0, 10, 2)}
    offered = {"a": 42.0, "b": 12.0, "c": 6.0}
    grants = {}
    for rnd in range(3):
        for pod, off in offered.items():
            grants[pod] = renew(alloc, pod, quota, {"t": TenantDemand(off, 0, 3, 1)}, rnd * 1.0)
    rates = {p: g.shares["t"].rate for p, g in grants.items()}
    assert rates == pytest.approx({"a": 7.0, "b": 7.0, "c": 6.0})
    assert sum(g.shares["t"].max_concurrent or 0 for g in grants.values()) == 2
    assert all(g.replicas == 3 for g in grants.values())


def test_a_pod_that_stops_renewing_is_dropped_and_its_share_redistributed() -> None:
    alloc = Allocator(lease_seconds=2.0)
    quota = {"t": TenantQuota(30.0)}
    for pod in "abc":
        renew(alloc, pod, quota, {"t": TenantDemand(100.0)}, 0.0)
    g = renew(alloc, "a", quota, {"t": TenantDemand(100.0)}, 2.5)  # b, c expired
    assert g.replicas == 1 and g.shares["t"].rate == pytest.approx(30.0)
    assert alloc.pods("ns/svc", 2.5) == ["a"]


def test_fallback_divides_by_the_replicas_and_never_stops_traffic() -> None:
    s = fallback_share(TenantQuota(20.0, 9, 2), 3)
    assert s.rate == pytest.approx(20 / 3) and s.burst == 3 and s.max_concurrent == 1
    assert fallback_share(TenantQuota(None, None, None), 4).rate is None


def test_lease_messages_round_trip_and_reject_bad_input() -> None:
    doc, sig = signed({"t": TenantQuota(5.0, 2, 1)})
    req = LeaseRequest("pod-1", doc, sig, {"t": TenantDemand(1.5, 1.0, 2, 1)}, {"t": TenantShare(1.0, 1, 1, 0.2)}, True)
    assert LeaseRequest.from_json(req.to_json()) == req
    grant = Allocator(2.0).renew(terms({"t": TenantQuota(5.0, 2, 1)}), req, 0.0)
    assert LeaseGrant.from_json(grant.to_json()) == grant
    ok = {"pod": "p", "charter": doc, "signature": sig}
    bad = [
        [],
        {**ok, "pod": ""},
        {**ok, "charter": []},
        {**ok, "signature": 7},
        {**ok, "demand": {"t": {"offeredRate": -1}}},
        {**ok, "demand": {"t": {"offeredRate": float("nan")}}},
        {**ok, "demand": {"t": {"offeredRate": 10**400}}},  # no OverflowError
        {**ok, "demand": {"t": {"queued": 1.5}}},
        {**ok, "demand": {"t": {"queued": 10**400}}},
        {**ok, "held": {"t": {"rate": 1e300}}},
        {**ok, "joining": "yes"},
        {**ok, "demand": {f"t{i}": {} for i in range(1001)}},
    ]
    for bad_doc in bad:
        with pytest.raises(QuotaError):
            LeaseRequest.from_json(bad_doc)
    for q in ({"rate": 10**400}, {"maxConcurrent": 10**400}, {"burst": 10**10}, {"rate": 1e10}):
        with pytest.raises(QuotaError):
            TenantQuota.from_json(q)


def test_a_pod_that_joins_while_the_others_hold_the_quota_is_not_settled_until_they_renew() -> None:
    """A joining pod gets what the others' unexpired leases leave, here nothing: its grant says so
    (``settled`` false), and turns settled once the others have renewed and given part back."""
    alloc = Allocator(lease_seconds=3.0)
    quota = {"t": TenantQuota(20.0, 40, 8)}
    light = {"t": TenantDemand(1.5, 1.5, 0, 1)}  # well under the quota: the rest is spread evenly
    assert renew(alloc, "a", quota, light, 0.0).settled  # alone: all of it
    assert not renew(alloc, "b", quota, light, 0.1).settled  # a holds it all
    assert renew(alloc, "a", quota, light, 0.3).settled  # a gives half back
    assert renew(alloc, "b", quota, light, 0.4).settled  # a and b: 10/s each
    joined = renew(alloc, "c", quota, {}, 0.6)
    assert joined.shares["t"].rate < 1.0 and not joined.settled
    for pod in "ab":
        assert renew(alloc, pod, quota, light, 1.0).settled
    again = renew(alloc, "c", quota, {}, 1.1)
    assert again.settled and again.shares["t"].rate >= 4.0 and (again.shares["t"].max_concurrent or 0) >= 1


def test_a_grant_without_settled_reads_as_settled_and_a_bad_one_is_refused() -> None:
    doc = LeaseGrant("ns/svc", "p", 3.0, 1, {}, settled=False).to_json()
    assert doc["settled"] is False and LeaseGrant.from_json(doc).settled is False
    del doc["settled"]  # a coordinator from before the field
    assert LeaseGrant.from_json(doc).settled is True
    with pytest.raises(QuotaError):
        LeaseGrant.from_json({**doc, "settled": "yes"})


def test_the_burst_is_split_evenly_whatever_the_recent_demand() -> None:
    """A tenant well under its quota, routed at random: a pod that saw little of it lately still
    holds an even part of the burst, so a clump that lands there passes (the sandbox refused the
    fifth of five requests within 0.4 s on a pod holding 0.16 of a 40-request burst)."""
    alloc = Allocator(lease_seconds=3.0)
    quota = {"t": TenantQuota(20.0, 40)}
    offered = {"a": 4.0, "b": 1.0, "c": 1.0, "d": 0.0}
    grants = {}
    for rnd in range(3):
        for pod, off in offered.items():
            grants[pod] = renew(alloc, pod, quota, {"t": TenantDemand(off, off)}, rnd * 1.0)
    assert {p: g.shares["t"].burst for p, g in grants.items()} == {"a": 10, "b": 10, "c": 10, "d": 10}
    rates = {p: g.shares["t"].rate or 0.0 for p, g in grants.items()}
    assert rates["a"] > rates["d"] > 0  # the rate still follows demand
    assert all(g.settled for g in grants.values())
