"""Service-wide tenant quotas: the lease messages and the pure max-min fair division of a quota.

A tenant's ``rate``/``burst`` and ``maxConcurrent`` hold for a whole InferenceService. A central
coordinator (in the scaler process) hands every pod, per tenant, a *share* of the rate and of the
concurrency for a lease period; pods enforce their share locally with their token buckets and
concurrency caps, so no request waits on the network (Google's Doorman; CockroachDB's tenant cost
control). See docs/scheduling.md for the reasoning.

This module is pure: the JSON schema of a lease request and grant (with validation that raises
:class:`QuotaError`), the max-min fair division from reported demand, the fallback share, and the
coordinator's allocation state (:class:`Allocator`, which takes the time as an argument and keeps
the sum of every outstanding grant within the quota).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LEASE_PATH",
    "Allocator",
    "LeaseGrant",
    "LeaseRequest",
    "QuotaError",
    "TenantDemand",
    "TenantQuota",
    "TenantShare",
    "fallback_share",
    "max_min_fair",
    "max_min_fair_int",
]

LEASE_PATH = "/v1/lease"
MAX_TENANTS = 1000  # per request: bounds the coordinator's work and memory per message
MAX_NAME = 253


class QuotaError(ValueError):
    """A lease message that does not follow the schema (the coordinator answers 400 with it)."""


# ------------------------------------------------------------------------------------------ schema
@dataclass(frozen=True)
class TenantQuota:
    """A tenant's service-wide quota, as configured (``None``: unlimited)."""

    rate: float | None = None
    burst: int | None = None
    max_concurrent: int | None = None

    @property
    def bucket(self) -> int | None:
        """The burst in force: as configured, else ``ceil(rate)`` (at least 1)."""
        if self.rate is None:
            return None
        return self.burst if self.burst is not None else max(1, math.ceil(self.rate))

    def to_json(self) -> dict[str, Any]:
        return {"rate": self.rate, "burst": self.burst, "maxConcurrent": self.max_concurrent}

    @classmethod
    def from_json(cls, doc: Any) -> TenantQuota:
        d = _obj(doc, "quota")
        return cls(
            _num(d.get("rate"), "rate", positive=True),
            _int(d.get("burst"), "burst", minimum=1),
            _int(d.get("maxConcurrent"), "maxConcurrent", minimum=1),
        )


@dataclass(frozen=True)
class TenantDemand:
    """What one pod saw of one tenant since its previous report."""

    offered_rate: float = 0.0  # admitted + refused by the rate limit, per second
    admitted_rate: float = 0.0
    queued: int = 0
    inflight: int = 0

    @property
    def concurrency(self) -> int:
        """Concurrency this pod could use for the tenant right now."""
        return self.queued + self.inflight

    def to_json(self) -> dict[str, Any]:
        return {
            "offeredRate": self.offered_rate,
            "admittedRate": self.admitted_rate,
            "queued": self.queued,
            "inflight": self.inflight,
        }

    @classmethod
    def from_json(cls, doc: Any) -> TenantDemand:
        d = _obj(doc, "demand")
        return cls(
            _num(d.get("offeredRate", 0.0), "offeredRate") or 0.0,
            _num(d.get("admittedRate", 0.0), "admittedRate") or 0.0,
            _int(d.get("queued", 0), "queued", minimum=0) or 0,
            _int(d.get("inflight", 0), "inflight", minimum=0) or 0,
        )


@dataclass(frozen=True)
class LeaseRequest:
    """A pod's renewal: who it is, the quotas it is configured with, and its demand per tenant."""

    service: str  # "<namespace>/<name>"
    pod: str
    quotas: Mapping[str, TenantQuota]
    demand: Mapping[str, TenantDemand] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "pod": self.pod,
            "quotas": {t: q.to_json() for t, q in self.quotas.items()},
            "demand": {t: d.to_json() for t, d in self.demand.items()},
        }

    @classmethod
    def from_json(cls, doc: Any) -> LeaseRequest:
        d = _obj(doc, "lease request")
        service, pod = _name(d.get("service"), "service"), _name(d.get("pod"), "pod")
        if "/" not in service:
            raise QuotaError("service must be '<namespace>/<name>'")
        quotas = _obj(d.get("quotas", {}), "quotas")
        demand = _obj(d.get("demand", {}), "demand")
        if len(quotas) > MAX_TENANTS or len(demand) > MAX_TENANTS:
            raise QuotaError(f"at most {MAX_TENANTS} tenants per lease request")
        return cls(
            service,
            pod,
            {_name(t, "tenant"): TenantQuota.from_json(q) for t, q in quotas.items()},
            {_name(t, "tenant"): TenantDemand.from_json(x) for t, x in demand.items()},
        )


@dataclass(frozen=True)
class TenantShare:
    """This pod's part of one tenant's quota. ``fraction`` is of the rate (or of the concurrency
    when the tenant has no rate quota)."""

    rate: float | None
    burst: int | None
    max_concurrent: int | None
    fraction: float

    def to_json(self) -> dict[str, Any]:
        return {"rate": self.rate, "burst": self.burst, "maxConcurrent": self.max_concurrent,
                "fraction": self.fraction}

    @classmethod
    def from_json(cls, doc: Any) -> TenantShare:
        d = _obj(doc, "share")
        return cls(
            _num(d.get("rate"), "rate"),
            _int(d.get("burst"), "burst", minimum=0),
            _int(d.get("maxConcurrent"), "maxConcurrent", minimum=0),
            _num(d.get("fraction", 0.0), "fraction") or 0.0,
        )


@dataclass(frozen=True)
class LeaseGrant:
    """The coordinator's answer: shares valid for ``lease_seconds`` from when the pod *sent* its
    request, and how many pods hold leases for the service (the fallback divides by it)."""

    service: str
    pod: str
    lease_seconds: float
    replicas: int
    shares: Mapping[str, TenantShare]
    #: False while a tenant's share here is held back by other pods' unexpired leases: below half
    #: its fair target rate or half its even part of the burst, or no concurrency slot where its
    #: target has one (a pod that just joined, before the others have renewed). A pod that is not
    #: serving yet waits for a settled grant before it reports ready. Absent from a grant: true.
    settled: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "pod": self.pod,
            "leaseSeconds": self.lease_seconds,
            "replicas": self.replicas,
            "shares": {t: s.to_json() for t, s in self.shares.items()},
            "settled": self.settled,
        }

    @classmethod
    def from_json(cls, doc: Any) -> LeaseGrant:
        d = _obj(doc, "lease grant")
        lease = _num(d.get("leaseSeconds"), "leaseSeconds", positive=True)
        replicas = _int(d.get("replicas"), "replicas", minimum=1)
        if lease is None or replicas is None:
            raise QuotaError("leaseSeconds and replicas are required")
        shares = _obj(d.get("shares", {}), "shares")
        settled = d.get("settled", True)
        if not isinstance(settled, bool):
            raise QuotaError("settled must be true or false")
        return cls(
            _name(d.get("service"), "service"),
            _name(d.get("pod"), "pod"),
            lease,
            replicas,
            {_name(t, "tenant"): TenantShare.from_json(s) for t, s in shares.items()},
            settled,
        )


def _obj(v: Any, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise QuotaError(f"{what} must be a JSON object")
    return v


def _name(v: Any, what: str) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= MAX_NAME or any(c.isspace() for c in v):
        raise QuotaError(f"{what} must be a non-empty string without spaces, at most {MAX_NAME} characters")
    return v


def _num(v: Any, what: str, *, positive: bool = False) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise QuotaError(f"{what} must be a finite number >= 0")
    if positive and v == 0:
        raise QuotaError(f"{what} must be > 0")
    return float(v)


def _int(v: Any, what: str, *, minimum: int) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise QuotaError(f"{what} must be an integer >= {minimum}")
    return v


# ------------------------------------------------------------------------------------ the division
def max_min_fair(capacity: float, demands: Mapping[str, float]) -> dict[str, float]:
    """Divide ``capacity`` max-min fairly by demand (water-filling): nobody gets more than it asks
    while another that asks more gets less, and what nobody asks for is spread evenly over all, so
    every claimant can grow a little before the next renewal. The parts always sum to ``capacity``
    (when there is at least one claimant)."""
    if not demands:
        return {}
    left = capacity
    alloc = dict.fromkeys(demands, 0.0)
    unsatisfied = sorted(demands, key=lambda k: (demands[k], k))
    while unsatisfied:
        level = left / len(unsatisfied)
        smallest = unsatisfied[0]
        if demands[smallest] > level:
            for k in unsatisfied:
                alloc[k] += level
            return alloc
        alloc[smallest] = demands[smallest]
        left -= demands[smallest]
        unsatisfied.pop(0)
    spread = left / len(alloc)
    return {k: v + spread for k, v in alloc.items()}


def max_min_fair_int(capacity: int, demands: Mapping[str, int]) -> dict[str, int]:
    """Integer max-min fair division of ``capacity`` units (concurrency slots): one unit at a time to
    the claimant with the smallest allocation that still wants more (name order on ties); units no
    one wants go round-robin to all. Sums to ``capacity``."""
    alloc = dict.fromkeys(demands, 0)
    if not alloc:
        return alloc
    names = sorted(alloc)
    for _ in range(capacity):
        wanting = [k for k in names if alloc[k] < demands[k]]
        pick = min(wanting or names, key=lambda k: (alloc[k], k))
        alloc[pick] += 1
    return alloc


def fallback_share(q: TenantQuota, replicas: int) -> TenantShare:
    """A pod that cannot renew: ``quota / replicas`` (at least one concurrency slot, so traffic never
    stops; the sum over pods then exceeds ``maxConcurrent`` only when it is below the replica count)."""
    n = max(1, replicas)
    rate = None if q.rate is None else q.rate / n
    bucket = q.bucket
    burst = None if bucket is None else max(1, bucket // n)
    conc = None if q.max_concurrent is None else max(1, q.max_concurrent // n)
    return TenantShare(rate, burst, conc, 1.0 / n)


# ------------------------------------------------------------------------------- the coordinator
@dataclass
class _PodLease:
    demand: Mapping[str, TenantDemand]
    expires: float
    rate: dict[str, float] = field(default_factory=dict)  # outstanding grants per tenant
    burst: dict[str, int] = field(default_factory=dict)
    slots: dict[str, int] = field(default_factory=dict)


class Allocator:
    """The coordinator's state: live pods per service and what each currently holds.

    Safe by construction (Doorman's rule): a pod's new grant is the smaller of its max-min fair
    target and what the other pods' *outstanding* leases leave of the quota, so the sum of all
    leases in force never exceeds the quota, even while demand moves. A pod whose target rose gets
    the difference once the others have renewed (each renews every third of a lease). Pods that
    stop renewing are dropped when their lease expires, and the rest get their share at the next
    renewal. Not thread-safe: the server serialises calls.
    """

    def __init__(self, lease_seconds: float, *, max_services: int = 10_000, max_pods: int = 1000) -> None:
        if lease_seconds <= 0:
            raise ValueError("lease_seconds must be > 0")
        self.lease_seconds = lease_seconds
        self.max_services = max_services
        self.max_pods = max_pods
        self._services: dict[str, dict[str, _PodLease]] = {}

    def pods(self, service: str, now: float) -> list[str]:
        return sorted(self._live(service, now))

    def _live(self, service: str, now: float) -> dict[str, _PodLease]:
        pods = self._services.get(service, {})
        for name in [p for p, lease in pods.items() if lease.expires <= now]:
            del pods[name]
        return pods

    def renew(self, req: LeaseRequest, now: float) -> LeaseGrant:
        for svc in [s for s in self._services if s != req.service]:
            if not self._live(svc, now):
                del self._services[svc]
        if req.service not in self._services and len(self._services) >= self.max_services:
            raise QuotaError("too many services hold leases")
        pods = self._services.setdefault(req.service, {})
        self._live(req.service, now)
        mine = pods.get(req.pod)
        if mine is None:
            if len(pods) >= self.max_pods:
                raise QuotaError("too many pods hold leases for this service")
            mine = pods[req.pod] = _PodLease(req.demand, now + self.lease_seconds)
        mine.demand, mine.expires = req.demand, now + self.lease_seconds
        others = [lease for name, lease in pods.items() if name != req.pod]
        shares: dict[str, TenantShare] = {}
        settled = True
        for tenant, q in req.quotas.items():
            rate: float | None = None
            burst: int | None = None
            slots: int | None = None
            fraction = 0.0
            if q.rate is not None:
                want = {p: lease.demand.get(tenant, TenantDemand()).offered_rate for p, lease in pods.items()}
                target = max_min_fair(q.rate, want)[req.pod]
                held = sum(o.rate.get(tenant, 0.0) for o in others)
                rate = max(0.0, min(target, q.rate - held))
                mine.rate[tenant] = rate
                fraction = rate / q.rate
                # The burst is split evenly over the pods, not by demand: routing spreads requests
                # at random, so the next clump may land on any pod, and one that saw little traffic
                # lately must still absorb one. Bounded by what the others hold, like the rate.
                bucket = q.bucket or 1
                target_b = bucket // len(pods)
                if rate <= 0:
                    burst = 0
                elif target_b == 0:
                    burst = 1  # a burst smaller than the pod count: one each, or nothing would pass
                else:
                    burst = max(0, min(target_b, bucket - sum(o.burst.get(tenant, 0) for o in others)))
                mine.burst[tenant] = burst
                settled = settled and rate >= 0.5 * target and (rate <= 0 or burst >= max(1, target_b // 2))
            if q.max_concurrent is not None:
                want_n = {p: lease.demand.get(tenant, TenantDemand()).concurrency for p, lease in pods.items()}
                target_n = max_min_fair_int(q.max_concurrent, want_n)[req.pod]
                held_n = sum(o.slots.get(tenant, 0) for o in others)
                slots = max(0, min(target_n, q.max_concurrent - held_n))
                settled = settled and (slots > 0 or target_n == 0)
                mine.slots[tenant] = slots
                if q.rate is None:
                    fraction = slots / q.max_concurrent
            shares[tenant] = TenantShare(rate, burst, slots, fraction)
        for gone in set(mine.rate) - set(req.quotas):
            del mine.rate[gone]
        for gone in set(mine.burst) - set(req.quotas):
            del mine.burst[gone]
        for gone in set(mine.slots) - set(req.quotas):
            del mine.slots[gone]
        return LeaseGrant(req.service, req.pod, self.lease_seconds, len(pods), shares, settled)
