"""Tenant admission at the edge: API key -> tenant, token buckets, priority ceilings and a cap on each
tenant's outstanding requests, decided on the request's headers before any pod is chosen.

One gateway replica sees every request of the service, so a tenant's ``rate``/``burst`` hold for the
whole service exactly, however the tenant spreads its connections. Keys use the pod's file format
(:func:`sluiceway_core.keys.parse_keys_text`: the salted ``hmac-sha256 <salt>`` form the operator
renders, or legacy plain SHA-256 lines; lookups compare every entry in constant time) and the pod's rules
(docs/scheduling.md): anonymous access as :attr:`TenantsConfig.anonymous_allowed` says, listed tenants
without ``maxPriority`` may use every class, anonymous and unlisted ones at most the default class.

Outstanding cap: a tenant's requests in flight through the gateway are bounded by
``maxConcurrent + maxQueued`` when either is set (the pods' own per-tenant caps still apply behind);
over it the gateway answers 429 ``tenant_queue_full``. A refused request takes no token.

Reload (:meth:`EdgeAdmission.replace`, :mod:`~sluiceway_gateway.reload`): keys and tenant limits are
swapped in place; each tenant's bucket keeps its tokens.

Several gateway replicas (``quota`` in the gateway's config): each replica leases its part of every
tenant's ``rate``/``burst`` from the quota coordinator, as the pods do
(:class:`sluiceway_core.lease_client.QuotaClient`, driven through this class's
:class:`~sluiceway_core.lease_client.ShareHolder` methods: :meth:`take_counts`, :meth:`share`,
:meth:`apply_shares`...), so the replicas' buckets sum to the tenant's quota whatever way kube-proxy
spread the clients' connections over them (docs/gateway.md has the bound). Without a lease in force a
replica enforces ``quota / replicas`` (the fallback share).

Concurrency model: owned by the gateway's event loop; nothing blocks or awaits. Time comes from the
injected ``clock``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sluiceway_core.config import PrioritiesConfig, TenantLimits, TenantsConfig
from sluiceway_core.keys import KeyFile, parse_keys_text
from sluiceway_core.lease_client import LeasedShares
from sluiceway_core.quota import TenantQuota, TenantShare

from .errors import BadRequest, PriorityForbidden, RateLimited, TenantQueueFull, Unauthenticated

Clock = Callable[[], float]
PRIORITY_HEADER = "x-sluiceway-priority"


class TokenBucket:
    """``rate`` tokens/s, at most ``burst`` stored, starts full."""

    def __init__(self, rate: float, burst: int, clock: Clock) -> None:
        self.rate, self.burst = rate, float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._t = clock()

    def retune(self, rate: float, burst: int) -> None:
        """New limits; the tokens earned so far at the old rate stay (at most the new burst)."""
        now = self._clock()
        self._tokens = min(float(burst), self._tokens + max(0.0, now - self._t) * self.rate)
        self._t = now
        self.rate, self.burst = rate, float(burst)

    def try_take(self) -> float:
        """0.0 when a token was taken, else the seconds until one is available."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + max(0.0, now - self._t) * self.rate)
        self._t = now
        if self._tokens >= 1.0 - 1e-9:
            self._tokens = max(0.0, self._tokens - 1.0)
            return 0.0
        if self.rate <= 0:
            return 1.0  # no share of the quota on this replica right now: ask again after a renewal
        return (1.0 - self._tokens) / self.rate


@dataclass
class EdgeTenant:
    name: str
    max_rank: int
    weight: int
    outstanding_cap: int | None
    bucket: TokenBucket | None
    outstanding: int = 0


@dataclass(frozen=True)
class Ticket:
    """An admitted request; :meth:`EdgeAdmission.release` it exactly once when answered."""

    tenant: EdgeTenant
    rank: int  # its priority class (0 = highest)


class EdgeAdmission:
    def __init__(self, config: TenantsConfig, priorities: PrioritiesConfig, clock: Clock,
                 keys: KeyFile | None = None) -> None:
        self._config = config
        self._classes = list(priorities.classes)
        self._default = priorities.default
        self._clock = clock
        if keys is None:
            keys = parse_keys_text(Path(config.keys_file).read_text(encoding="utf-8")) \
                if config.keys_file else KeyFile(None, ())
        self._keys = keys
        self._listed = {t.name: t for t in config.tenants}
        self._tenants: dict[str, EdgeTenant] = {}
        #: service-wide quotas split between replicas (no coordinator: this replica holds them whole)
        self.leased = LeasedShares()
        self._counts: dict[str, list[int]] = {}  # tenant -> [admitted, refused] by its bucket since the last report

    def _limits(self, name: str) -> TenantLimits:
        return self._listed.get(name) or self._config.defaults

    def _terms(self, name: str) -> tuple[int, int, int | None, tuple[float, int] | None]:
        """(priority ceiling rank, weight, outstanding cap, (rate, burst)) of a tenant."""
        lim = self._limits(name)
        if lim.max_priority:
            rank = self._classes.index(lim.max_priority)
        elif name in self._listed and name != self._config.anonymous_tenant:
            rank = 0
        else:
            rank = self._classes.index(self._default)
        cap = None
        if lim.max_queued is not None or lim.max_concurrent is not None:
            cap = (lim.max_queued or 0) + (lim.max_concurrent or 0)
        rate = None
        if lim.rate is not None:
            rate = (lim.rate, lim.burst if lim.burst is not None else max(1, math.ceil(lim.rate)))
            share = self.share(name)
            if share is not None and share.rate is not None and share.burst is not None:
                rate = (share.rate, share.burst)  # this replica's part of the service-wide quota
        return rank, lim.weight, cap, rate

    def tenant(self, name: str) -> EdgeTenant:
        t = self._tenants.get(name)
        if t is None:
            rank, weight, cap, rate = self._terms(name)
            bucket = TokenBucket(rate[0], rate[1], self._clock) if rate is not None else None
            t = self._tenants[name] = EdgeTenant(name, rank, weight, cap, bucket)
        return t

    def current(self) -> tuple[TenantsConfig, KeyFile]:
        return self._config, self._keys

    def replace(self, config: TenantsConfig, keys: KeyFile) -> None:
        """Swap in new tenants and keys (a reload): every known tenant's record is updated in place, so
        its token bucket keeps its tokens and its outstanding count stays with the tickets already
        issued. Raises ValueError (nothing changed) when a ``maxPriority`` names no priority class."""
        for t in config.tenants:
            if t.max_priority is not None and t.max_priority not in self._classes:
                raise ValueError(f"tenant {t.name}: maxPriority {t.max_priority!r} is not a priority class")
        self._config, self._keys = config, keys
        self._listed = {t.name: t for t in config.tenants}
        for name, et in self._tenants.items():
            et.max_rank, et.weight, et.outstanding_cap, rate = self._terms(name)
            if rate is None:
                et.bucket = None
            elif et.bucket is None:
                et.bucket = TokenBucket(rate[0], rate[1], self._clock)
            else:
                et.bucket.retune(*rate)

    # ------------------------------------------------------------- the quota split between replicas
    def quota(self, name: str) -> TenantQuota:
        """The tenant's configured rate and burst (service-wide); the edge leases no concurrency."""
        lim = self._limits(name)
        return TenantQuota(lim.rate, lim.burst, None)

    def share(self, name: str) -> TenantShare | None:
        """This replica's share of the tenant's quota in force (None: it holds the whole quota)."""
        return self.leased.share(name, self.quota(name))

    def apply_shares(self, shares: Mapping[str, TenantShare] | None, replicas: int) -> None:
        """A new lease (``shares``), or ``None``: the lease ran out, fall back to quota / replicas.
        Each bucket keeps the tokens it earned, at most its new burst."""
        self.leased.set(shares, replicas)
        for name, et in self._tenants.items():
            rate = self._terms(name)[3]
            if rate is not None and et.bucket is not None:
                et.bucket.retune(*rate)

    def take_counts(self) -> dict[str, tuple[int, int]]:
        """(admitted, refused) by each tenant's bucket since the previous call."""
        out = {n: (c[0], c[1]) for n, c in self._counts.items()}
        self._counts.clear()
        return out

    def refused_names(self) -> list[str]:
        return [n for n, c in self._counts.items() if c[1]]

    def tenant_load(self) -> dict[str, tuple[int, int]]:
        """(queued, running) per tenant with requests outstanding here (the lease's demand): the
        gateway counts them all as running (held or at a pod)."""
        return {n: (0, t.outstanding) for n, t in self._tenants.items() if t.outstanding}

    def authenticate(self, authorization: str | None) -> EdgeTenant:
        if not authorization:
            if self._config.anonymous_allowed:
                return self.tenant(self._config.anonymous_tenant)
            raise Unauthenticated("missing Authorization: Bearer <api key>")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthenticated("Authorization must be 'Bearer <api key>'")
        name = self._keys.lookup(key.strip())
        if name is None:
            raise Unauthenticated("unknown API key")
        return self.tenant(name)

    def admit(self, headers: dict[str, str]) -> Ticket:
        """Decide one request on its (lower-case) headers; raises a :class:`GatewayError` subclass."""
        tenant = self.authenticate(headers.get("authorization"))
        prio = (headers.get(PRIORITY_HEADER) or self._default).strip().lower()
        try:
            rank = self._classes.index(prio)
        except ValueError:
            raise BadRequest(f"unknown priority {prio!r}; X-Sluiceway-Priority must be one of {self._classes}") \
                from None
        if rank < tenant.max_rank:
            raise PriorityForbidden(f"tenant {tenant.name!r} may not use priority {prio!r}")
        if tenant.outstanding_cap is not None and tenant.outstanding >= tenant.outstanding_cap:
            raise TenantQueueFull(f"tenant {tenant.name!r} has {tenant.outstanding} requests outstanding",
                                  retry_after=1.0)
        if tenant.bucket is not None:
            wait = tenant.bucket.try_take()
            counts = self._counts.setdefault(tenant.name, [0, 0])
            counts[0 if wait == 0.0 else 1] += 1
            if wait > 0:
                raise RateLimited(f"tenant {tenant.name!r} is over its rate", retry_after=wait)
        tenant.outstanding += 1
        return Ticket(tenant, rank)

    @staticmethod
    def release(ticket: Ticket) -> None:
        ticket.tenant.outstanding -= 1
