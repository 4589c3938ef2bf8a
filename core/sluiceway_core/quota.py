"""Service-wide tenant quotas: the lease messages and the pure max-min fair division of a quota.

A tenant's ``rate``/``burst`` and ``maxConcurrent`` hold for a whole InferenceService. A central
coordinator (in the scaler process) hands every pod, per tenant, a *share* of the rate and of the
concurrency for a lease period; pods enforce their share locally with their token buckets and
concurrency caps, so no request waits on the network (Google's Doorman; CockroachDB's tenant cost
control). See docs/scheduling.md for the reasoning.

This module is pure: the JSON schema of a lease request and grant (with validation that raises
:class:`QuotaError`; every number is bounded at parse time), the max-min fair divisions (closed
form), the fallback share, and the coordinator's allocation state (:class:`Allocator`, which takes
the time as an argument and keeps the sum of every outstanding grant within the quota).

Trust: a lease request carries the operator's signed charter (``sluiceway_core.quota_charter``);
the coordinator verifies it and hands the allocator only what the signature covers
(:class:`LeaseTerms`: the service, its quotas, the most pods at once). The caller contributes its pod
name, its demand, what it holds now and whether it is joining, nothing else.

Concurrency model: the functions are pure. :class:`Allocator` is thread-safe: one short lock guards
the map of services, and each service has its own lock, so services are allocated in parallel and a
renewal's cost is bounded by that service's charter (tenants x ``maxPods``), never by a number a
caller sends.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LEASE_PATH",
    "MAX_COUNT",
    "MAX_RATE",
    "Allocator",
    "LeaseGrant",
    "LeaseRequest",
    "LeaseTerms",
    "QuotaBusy",
    "QuotaError",
    "QuotaForbidden",
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
#: Every rate on the wire (requests/s) is at most this; larger is refused at parse time.
MAX_RATE = 1e9
#: Every count on the wire (burst, maxConcurrent, queued, inflight, replicas) is at most this.
MAX_COUNT = 1_000_000_000


class QuotaError(ValueError):
    """A lease message that does not follow the schema (the coordinator answers 400 with it)."""


class QuotaForbidden(QuotaError):
    """The caller did not prove it may lease for the service (403); never echoes what it sent."""


class QuotaBusy(QuotaError):
    """A bound on the coordinator's state was reached (429): too many pods or services."""


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
class LeaseTerms:
    """What the coordinator took from the verified charter: the only source of the service name, the
    quotas and the pod bound. ``charter_id`` tells two charters of one service apart (a rollout)."""

    service: str
    quotas: Mapping[str, TenantQuota]
    max_pods: int
    charter_id: str = ""


@dataclass(frozen=True)
class LeaseRequest:
    """A pod's renewal: the operator's charter and its signature (opaque here: the coordinator
    verifies them), who the pod is, its demand per tenant, the shares of the lease it holds now
    (``held``: only while that lease is valid) and whether it is still joining (not serving yet)."""

    pod: str
    charter: Mapping[str, Any]
    signature: str
    demand: Mapping[str, TenantDemand] = field(default_factory=dict)
    held: Mapping[str, TenantShare] = field(default_factory=dict)
    joining: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "charter": dict(self.charter),
            "signature": self.signature,
            "demand": {t: d.to_json() for t, d in self.demand.items()},
            "held": {t: s.to_json() for t, s in self.held.items()},
            "joining": self.joining,
        }

    @classmethod
    def from_json(cls, doc: Any) -> LeaseRequest:
        d = _obj(doc, "lease request")
        pod = _name(d.get("pod"), "pod")
        charter = _obj(d.get("charter"), "charter")
        signature = d.get("signature")
        if not isinstance(signature, str) or len(signature) > 128:
            raise QuotaForbidden("the charter's signature is missing or malformed")
        demand = _obj(d.get("demand", {}), "demand")
        held = _obj(d.get("held", {}), "held")
        if len(demand) > MAX_TENANTS or len(held) > MAX_TENANTS:
            raise QuotaError(f"at most {MAX_TENANTS} tenants per lease request")
        joining = d.get("joining", False)
        if not isinstance(joining, bool):
            raise QuotaError("joining must be true or false")
        return cls(
            pod,
            charter,
            signature,
            {_name(t, "tenant"): TenantDemand.from_json(x) for t, x in demand.items()},
            {_name(t, "tenant"): TenantShare.from_json(x) for t, x in held.items()},
            joining,
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
    request, and how many pods hold leases for the service (the fallback divides by it). A tenant
    without a share here stays on the pod's fallback share (a fresh coordinator's first lease period)."""

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
        if lease > 3600:
            raise QuotaError("leaseSeconds must be at most 3600")
        shares = _obj(d.get("shares", {}), "shares")
        if len(shares) > MAX_TENANTS:
            raise QuotaError(f"at most {MAX_TENANTS} tenants per lease grant")
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
    """A number within 0..MAX_RATE. Integers are compared before any float conversion, so a
    400-digit integer is a QuotaError, never an OverflowError."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise QuotaError(f"{what} must be a number within 0..{MAX_RATE:g}")
    if isinstance(v, float) and not math.isfinite(v):
        raise QuotaError(f"{what} must be a number within 0..{MAX_RATE:g}")
    if not 0 <= v <= MAX_RATE:
        raise QuotaError(f"{what} must be a number within 0..{MAX_RATE:g}")
    if positive and v == 0:
        raise QuotaError(f"{what} must be > 0")
    return float(v)


def _int(v: Any, what: str, *, minimum: int) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= MAX_COUNT:
        raise QuotaError(f"{what} must be an integer within {minimum}..{MAX_COUNT}")
    return v


# ------------------------------------------------------------------------------------ the division
def max_min_fair(capacity: float, demands: Mapping[str, float]) -> dict[str, float]:
    """Divide ``capacity`` max-min fairly by demand (water-filling): nobody gets more than it asks
    while another that asks more gets less, and what nobody asks for is spread evenly over all, so
    every claimant can grow a little before the next renewal. The parts always sum to ``capacity``
    (when there is at least one claimant). O(n log n)."""
    if not demands:
        return {}
    left = capacity
    alloc = dict.fromkeys(demands, 0.0)
    order = sorted(demands, key=lambda k: (demands[k], k))
    for i, smallest in enumerate(order):
        level = left / (len(order) - i)
        if demands[smallest] > level:
            for k in order[i:]:
                alloc[k] += level
            return alloc
        alloc[smallest] = demands[smallest]
        left -= demands[smallest]
    spread = left / len(alloc)
    return {k: v + spread for k, v in alloc.items()}


def _largest(ok_at: Any, lo: int, hi: int) -> int:
    """The largest ``x`` in ``lo..hi`` with ``ok_at(x)`` (monotone: true then false; true at lo)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok_at(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def max_min_fair_int(capacity: int, demands: Mapping[str, int]) -> dict[str, int]:
    """Integer max-min fair division of ``capacity`` units (concurrency slots), in closed form: the
    same answer as handing out one unit at a time to the claimant with the smallest allocation that
    still wants more (name order on ties), then round-robin to all once nobody wants more. Finds the
    water level by bisection: O(n log capacity) whatever the capacity. Sums to ``capacity``."""
    if not demands:
        return {}
    names = sorted(demands)
    want = [max(0, demands[k]) for k in names]
    capacity = max(0, capacity)
    if sum(want) >= capacity:
        # largest level L with sum(min(d, L)) <= capacity; the rest, one each, to the first
        # claimants (name order) that want more than L
        level = _largest(lambda x: sum(min(d, x) for d in want) <= capacity, 0, max(want))
        base = [min(d, level) for d in want]
        extra = [i for i, d in enumerate(want) if d > level]
    else:
        # everyone gets its demand; the rest fills upwards from the smallest allocations
        level = _largest(lambda x: sum(max(d, x) for d in want) <= capacity, 0, capacity)
        base = [max(d, level) for d in want]
        extra = [i for i, b in enumerate(base) if b == level]
    for i in extra[: capacity - sum(base)]:
        base[i] += 1
    return dict(zip(names, base, strict=True))


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
    joining: bool
    charter_id: str
    quotas: Mapping[str, TenantQuota]
    rate: dict[str, float] = field(default_factory=dict)  # outstanding grants per tenant
    burst: dict[str, int] = field(default_factory=dict)
    slots: dict[str, int] = field(default_factory=dict)


@dataclass
class _Service:
    lock: threading.Lock = field(default_factory=threading.Lock)
    pods: dict[str, _PodLease] = field(default_factory=dict)
    dead: bool = False  # swept: a renewal that finds it dead looks the service up again


def _min(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


class Allocator:
    """The coordinator's state: live pods per service and what each currently holds.

    Safe by construction (Doorman's rule): a pod's new grant is the smaller of its max-min fair
    target and what the other pods' *outstanding* leases leave of the quota, so the sum of all
    leases in force never exceeds the quota, even while demand moves. A pod whose target rose gets
    the difference once the others have renewed (each renews every third of a lease). Pods that
    stop renewing are dropped when their lease expires, and the rest get their share at the next
    renewal.

    - **Bounded state:** at most ``LeaseTerms.max_pods`` pods per service (the charter's: the
      Deployment's most pods at once) and ``max_services`` services; a new pod beyond is refused
      (:class:`QuotaBusy`), so a flood of pod names neither grows memory nor dilutes the real pods.
    - **Rollout:** pods may hold two charters of one service at once (old and new ReplicaSet). Each
      tenant's grants are then bounded by the *smallest* quota among the charters of the live pods,
      so the leases never sum above what either charter allows.
    - **Joining pods** (not serving yet) count with at least the mean demand of the serving pods:
      routing will spread the traffic over them too, so the others give back a fair part before
      the new pod reports ready (its grant is not settled until they have).
    - **Restart:** the state is in memory. During the first lease period after ``started`` (every
      lease of a previous coordinator is still possibly in force) a pod gets at most what it
      reports holding from a lease still valid (``LeaseRequest.held``), and a tenant it holds
      nothing of gets no share (the pod stays on its fallback share). So the leases in force never
      sum above the quota across a restart either; afterwards allocation is as usual.

    Thread-safe (see the module docstring): one lock for the map of services, one per service.
    """

    def __init__(
        self,
        lease_seconds: float,
        *,
        started: float = float("-inf"),
        max_services: int = 10_000,
        max_pods: int = 10_000,
    ) -> None:
        if lease_seconds <= 0:
            raise ValueError("lease_seconds must be > 0")
        self.lease_seconds = lease_seconds
        self.started = started
        self.max_services = max_services
        self.max_pods = max_pods
        self._services: dict[str, _Service] = {}
        self._lock = threading.Lock()
        self._next_sweep = started

    def pods(self, service: str, now: float) -> list[str]:
        with self._lock:
            svc = self._services.get(service)
        if svc is None:
            return []
        with svc.lock:
            return sorted(self._live(svc, now))

    @staticmethod
    def _live(svc: _Service, now: float) -> dict[str, _PodLease]:
        for name in [p for p, lease in svc.pods.items() if lease.expires <= now]:
            del svc.pods[name]
        return svc.pods

    def _service(self, name: str, now: float) -> _Service:
        with self._lock:
            if now >= self._next_sweep:  # at most once a lease period: O(services)
                self._next_sweep = now + self.lease_seconds
                for key, old in list(self._services.items()):
                    if key != name and old.lock.acquire(blocking=False):
                        try:
                            if not self._live(old, now):
                                old.dead = True
                                del self._services[key]
                        finally:
                            old.lock.release()
            svc = self._services.get(name)
            if svc is None:
                if len(self._services) >= self.max_services:
                    raise QuotaBusy("too many services hold leases")
                svc = self._services[name] = _Service()
            return svc

    def renew(self, terms: LeaseTerms, req: LeaseRequest, now: float) -> LeaseGrant:
        while True:
            svc = self._service(terms.service, now)
            with svc.lock:
                if not svc.dead:
                    return self._renew(svc, terms, req, now)

    def _renew(self, svc: _Service, terms: LeaseTerms, req: LeaseRequest, now: float) -> LeaseGrant:
        pods = self._live(svc, now)
        mine = pods.get(req.pod)
        if mine is None:
            if len(pods) >= min(terms.max_pods, self.max_pods):
                raise QuotaBusy(f"{len(pods)} pods hold leases for this service: the charter allows {terms.max_pods}")
            mine = pods[req.pod] = _PodLease(req.demand, now, req.joining, terms.charter_id, terms.quotas)
        mine.demand, mine.expires, mine.joining = req.demand, now + self.lease_seconds, req.joining
        mine.charter_id, mine.quotas = terms.charter_id, terms.quotas
        others = [lease for name, lease in pods.items() if name != req.pod]
        charters = {o.charter_id: o.quotas for o in others if o.charter_id != terms.charter_id}
        serving = [lease for lease in pods.values() if not lease.joining]
        fresh = now < self.started + self.lease_seconds
        shares: dict[str, TenantShare] = {}
        settled = True

        def want(tenant: str, of: Any) -> dict[str, float]:
            got = {p: float(of(lease.demand.get(tenant, TenantDemand()))) for p, lease in pods.items()}
            if serving and len(serving) < len(pods):
                mean = sum(float(of(s.demand.get(tenant, TenantDemand()))) for s in serving) / len(serving)
                for p, lease in pods.items():
                    if lease.joining:
                        got[p] = max(got[p], mean)
            return got

        for tenant, own in terms.quotas.items():
            q = own
            if charters:  # a rollout: the smallest quota of every charter in force
                theirs = [c.get(tenant) for c in charters.values()]
                q = TenantQuota(
                    None if own.rate is None else _min([own.rate, *(t.rate for t in theirs if t is not None)]),
                    None if own.rate is None else _min([own.bucket, *(t.bucket for t in theirs if t is not None)]),
                    None if own.max_concurrent is None
                    else _min([own.max_concurrent, *(t.max_concurrent for t in theirs if t is not None)]),
                )
            held = req.held.get(tenant) if fresh else None
            if fresh and held is None:
                mine.rate.pop(tenant, None)
                mine.burst.pop(tenant, None)
                mine.slots.pop(tenant, None)
                settled = False
                continue  # nothing new during a fresh coordinator's first lease period
            rate: float | None = None
            burst: int | None = None
            slots: int | None = None
            fraction = 0.0
            if q.rate is not None:
                target = max_min_fair(q.rate, want(tenant, lambda d: d.offered_rate))[req.pod]
                others_rate = sum(o.rate.get(tenant, 0.0) for o in others)
                rate = max(0.0, min(target, q.rate - others_rate))
                if held is not None:
                    rate = min(rate, held.rate or 0.0)
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
                if held is not None:
                    burst = min(burst, held.burst or 0)
                mine.burst[tenant] = burst
                settled = settled and rate >= 0.5 * target and (rate <= 0 or burst >= max(1, target_b // 2))
            if q.max_concurrent is not None:
                target_n = max_min_fair_int(
                    q.max_concurrent, {p: math.ceil(v) for p, v in want(tenant, lambda d: d.concurrency).items()}
                )[req.pod]
                held_n = sum(o.slots.get(tenant, 0) for o in others)
                slots = max(0, min(target_n, q.max_concurrent - held_n))
                if held is not None:
                    slots = min(slots, held.max_concurrent or 0)
                settled = settled and (slots > 0 or target_n == 0)
                mine.slots[tenant] = slots
                if q.rate is None:
                    fraction = slots / q.max_concurrent
            shares[tenant] = TenantShare(rate, burst, slots, fraction)
        for gone in set(mine.rate) - set(shares):
            del mine.rate[gone]
        for gone in set(mine.burst) - set(shares):
            del mine.burst[gone]
        for gone in set(mine.slots) - set(shares):
            del mine.slots[gone]
        return LeaseGrant(terms.service, req.pod, self.lease_seconds, len(pods), shares, settled)
