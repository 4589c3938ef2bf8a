"""Tenants: who is calling (API key -> tenant) and their admission limits (token buckets).

Concurrency model: every object here is owned by the server's event loop and is called only from
it; nothing blocks and nothing awaits. Time comes from an injected :class:`~sluiceway_pod.clock.Clock`.

Service-wide quotas: with a quota coordinator (``quota.coordinatorUrl``) the buckets and concurrency
caps hold this pod's *share* of each tenant's quota, set by :meth:`TenantRegistry.apply_shares` from
a lease (:mod:`sluiceway_pod.quota_client`); before the first lease and when a lease runs out the
share is ``quota / replicas`` (:func:`sluiceway_core.quota.fallback_share`).

Hot reload (issue 22): :meth:`TenantRegistry.replace` swaps the keys and the limits in one
synchronous call on the loop (:mod:`sluiceway_pod.reload` reads and parses the files off the loop):
a request authenticated before the call keeps its :class:`Tenant` (its admission stands); the next
one is checked against the new keys and limits. Token buckets keep the tokens they hold (up to a new
burst), so a reload never refills a bucket.

Behind the gateway (:meth:`TenantRegistry.edge_tenant`): a request the gateway vouched for (its edge
token, checked by the data plane) names its tenant in a header; the name is checked
(:func:`sluiceway_core.edge.valid_tenant_name`: at most 63 characters) and a name this pod does not
list gets the defaults' limits and the ``other`` label, like an unlisted tenant of the keys file; past
:data:`MAX_EDGE_UNLISTED` such names they share one tenant, so header values cannot grow the pod's state.

Keys never leave this module: the key file holds salted hashes only (HMAC-SHA256 with the service's
salt, :mod:`sluiceway_core.keys`), a presented key is hashed once and compared against every stored
hash with :func:`hmac.compare_digest` (no early exit), only the tenant *name* is returned, and a
refusal says the same for every wrong key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sluiceway_core.config import TenantLimits, TenantsConfig
from sluiceway_core.edge import valid_tenant_name
from sluiceway_core.keys import KeyFile, parse_keys_text
from sluiceway_core.lease_client import LeasedShares
from sluiceway_core.quota import TenantQuota, TenantShare

from .clock import Clock
from .errors import InvalidInput, Unauthenticated

OTHER = "other"
#: at most this many tenants named by the gateway that this pod does not list (each holds a little
#: state); the ones past it share one tenant, :data:`EDGE_OVERFLOW`, with the defaults' limits
MAX_EDGE_UNLISTED = 256
#: not a valid tenant name (``_``), so no listed tenant can be it
EDGE_OVERFLOW = "_unlisted"


def parse_keys_file(text: str) -> KeyFile:
    """The keys file (:func:`sluiceway_core.keys.parse_keys_text`): an ``hmac-sha256 <salt>`` line
    and ``<hmac-hex> <tenant>`` lines (what the operator renders), or plain ``<sha256-hex> <tenant>``
    lines (hand-written); blank lines and ``#`` comments are ignored. Raises ValueError."""
    return parse_keys_text(text)


class KeyStore:
    """Presented key -> tenant name. One hash per lookup, compared against every entry with
    :func:`hmac.compare_digest` and no early exit (:meth:`sluiceway_core.keys.KeyFile.lookup`)."""

    def __init__(self, keys: KeyFile | None = None) -> None:
        self._file = keys if keys is not None else KeyFile(None, ())

    @classmethod
    def from_file(cls, path: str) -> KeyStore:
        return cls(parse_keys_file(Path(path).read_text(encoding="utf-8")))

    @property
    def file(self) -> KeyFile:
        return self._file

    def lookup(self, key: str) -> str | None:
        return self._file.lookup(key)


class TokenBucket:
    """Classic token bucket: ``rate`` tokens/s, at most ``burst`` stored, starts full. A leased share
    may set ``rate`` to 0 (the quota is held by other pods): then nothing passes until it grows."""

    def __init__(self, rate: float, burst: int, clock: Clock) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._t = clock.now()

    def _refill(self) -> None:
        now = self._clock.now()
        self._tokens = min(self.burst, self._tokens + (now - self._t) * self.rate)
        self._t = now

    def try_take(self) -> float:
        """Take one token. Returns 0.0 on success, else the seconds until a token is available."""
        self._refill()
        if self._tokens >= 1.0 - 1e-9:  # tolerate float rounding of refills
            self._tokens = max(0.0, self._tokens - 1.0)
            return 0.0
        if self.rate <= 0 or self.burst < 1:
            return 1.0  # no share of the quota on this pod right now: ask again after a renewal
        return (1.0 - self._tokens) / self.rate

    def set(self, rate: float, burst: int) -> None:
        """Change rate and capacity (a new lease): tokens earned so far stay, up to the new burst."""
        self._refill()
        self.rate, self.burst = rate, float(burst)
        self._tokens = min(self._tokens, self.burst)

    @property
    def tokens(self) -> float:
        self._refill()
        return self._tokens


@dataclass(frozen=True)
class Tenant:
    """Resolved limits of one tenant. ``label`` is the bounded metrics label value."""

    name: str
    label: str
    rate: float | None
    burst: int | None
    max_concurrent: int | None
    max_queued: int | None
    weight: int
    max_priority_rank: int  # 0 = may use the highest class


class TenantRegistry:
    """Authentication plus per-tenant limits and buckets."""

    def __init__(
        self, config: TenantsConfig, priority_classes: list[str], clock: Clock, *, default_priority: str
    ) -> None:
        self._config = config
        self._classes = priority_classes
        #: anonymous and unlisted tenants without an explicit ``maxPriority`` are capped here
        self._default_rank = priority_classes.index(default_priority)
        self._clock = clock
        self._keys = KeyStore.from_file(config.keys_file) if config.keys_file else KeyStore()
        self._listed = {t.name: t for t in config.tenants}
        self._tenants: dict[str, Tenant] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self.known_labels = frozenset([*self._listed, config.anonymous_tenant, OTHER])
        #: service-wide quotas: this pod's shares and the fallback divisor (no coordinator: per pod)
        self.leased = LeasedShares()
        self._counts: dict[str, list[int]] = {}  # tenant -> [admitted, refused] since the last report

    def _limits(self, name: str) -> TenantLimits:
        listed = self._listed.get(name)
        if listed is not None:
            return listed
        return self._config.defaults

    def tenant(self, name: str) -> Tenant:
        t = self._tenants.get(name)
        if t is None:
            lim = self._limits(name)
            listed = name in self._listed or name == self._config.anonymous_tenant
            if lim.max_priority:
                rank = self._classes.index(lim.max_priority)
            elif name in self._listed and name != self._config.anonymous_tenant:
                rank = 0  # a listed keyed tenant without a ceiling may use every class
            else:
                rank = self._default_rank  # anonymous and unlisted: at most the default class
            t = Tenant(
                name=name,
                label=name if listed else OTHER,
                rate=lim.rate,
                burst=lim.burst,
                max_concurrent=lim.max_concurrent,
                max_queued=lim.max_queued,
                weight=lim.weight,
                max_priority_rank=rank,
            )
            self._tenants[name] = t
            if lim.rate is not None and name not in self._buckets:
                burst = lim.burst if lim.burst is not None else max(1, math.ceil(lim.rate))
                self._buckets[name] = TokenBucket(lim.rate, burst, self._clock)
                share = self.share(name)
                if share is not None and share.rate is not None and share.burst is not None:
                    self._buckets[name].set(share.rate, share.burst)
        return t

    def state(self) -> tuple[TenantsConfig, KeyFile]:
        """The tenants configuration and keys in force (what a reload compares against)."""
        return self._config, self._keys.file

    def replace(self, config: TenantsConfig, keys: KeyFile) -> list[str]:
        """Swap in new keys and limits (a reload). Returns the metric labels that are new.

        Every step is synchronous, so no request sees half of it. Resolved tenants are dropped and
        resolved again on their next request; a bucket of a tenant that still has a rate keeps its
        tokens (:meth:`TokenBucket.set`: the new rate and burst, at most the new burst held), a
        bucket of a tenant that no longer has one goes. Raises ValueError (nothing changed) when a
        tenant's ``maxPriority`` names a class this pod does not have (classes need a restart)."""
        for t in config.tenants:
            if t.max_priority and t.max_priority not in self._classes:
                raise ValueError(f"tenant {t.name!r}: maxPriority {t.max_priority!r} is not a priority class here")
        top = config.defaults.max_priority
        if top and top not in self._classes:
            raise ValueError(f"tenants.defaults: maxPriority {top!r} is not a priority class here")
        self._config = config
        self._keys = KeyStore(keys)
        self._listed = {t.name: t for t in config.tenants}
        self._tenants = {}
        for name in list(self._buckets):
            lim = self._limits(name)
            if lim.rate is None:
                del self._buckets[name]
                continue
            self._buckets[name].set(lim.rate, lim.burst if lim.burst is not None else max(1, math.ceil(lim.rate)))
            share = self.share(name)
            if share is not None and share.rate is not None and share.burst is not None:
                self._buckets[name].set(share.rate, share.burst)
        labels = frozenset([*self._listed, config.anonymous_tenant])
        new = sorted(labels - self.known_labels)
        self.known_labels = self.known_labels | labels  # labels stay: their series were exported
        return new

    # ---------------------------------------------------------------- service-wide quotas
    def quota(self, name: str) -> TenantQuota:
        lim = self._limits(name)
        return TenantQuota(lim.rate, lim.burst, lim.max_concurrent)

    def quotas(self) -> dict[str, TenantQuota]:
        """The configured quota of every tenant this pod knows (listed, anonymous, seen)."""
        names = set(self._listed) | set(self._tenants)
        if self._config.anonymous_allowed:
            names.add(self._config.anonymous_tenant)
        out = {n: self.quota(n) for n in sorted(names)}
        return {n: q for n, q in out.items() if q.rate is not None or q.max_concurrent is not None}

    def share(self, name: str) -> TenantShare | None:
        """This pod's share of the tenant's quota in force (None: quotas hold per pod)."""
        return self.leased.share(name, self.quota(name))

    def apply_shares(self, shares: Mapping[str, TenantShare] | None, replicas: int) -> None:
        """A new lease (``shares``), or ``None``: the lease ran out, fall back to quota / replicas."""
        self.leased.set(shares, replicas)
        for name, bucket in self._buckets.items():
            share = self.share(name)
            if share is not None and share.rate is not None and share.burst is not None:
                bucket.set(share.rate, share.burst)

    def concurrency_cap(self, tenant: Tenant) -> int | None:
        """The tenant's concurrency cap on this pod: its leased share of ``maxConcurrent``."""
        share = self.share(tenant.name)
        if share is None or tenant.max_concurrent is None:
            return tenant.max_concurrent
        return share.max_concurrent

    def refused_names(self) -> list[str]:
        """Tenants whose bucket refused a request since the last :meth:`take_counts`."""
        return [n for n, c in self._counts.items() if c[1]]

    def take_counts(self) -> dict[str, tuple[int, int]]:
        """(admitted, refused) by the token bucket per tenant since the previous call."""
        out = {n: (c[0], c[1]) for n, c in self._counts.items()}
        self._counts.clear()
        return out

    def authenticate(self, authorization: str | None) -> Tenant:
        """``Authorization: Bearer <key>`` -> tenant. Raises :class:`Unauthenticated`."""
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

    def edge_tenant(self, name: str) -> Tenant:
        """The tenant the gateway named (its token already checked). Raises :class:`InvalidInput` for a
        name that is not a tenant name; an unlisted name past :data:`MAX_EDGE_UNLISTED` of them is the
        shared :data:`EDGE_OVERFLOW` tenant."""
        if not valid_tenant_name(name):
            raise InvalidInput("X-Sluiceway-Tenant must be a tenant name (1-63 letters, digits, '.', '_', '-')")
        if name not in self._tenants and name not in self._listed and name != self._config.anonymous_tenant:
            unlisted = sum(1 for n in self._tenants if n not in self._listed and n != self._config.anonymous_tenant)
            if unlisted >= MAX_EDGE_UNLISTED:
                name = EDGE_OVERFLOW
        return self.tenant(name)

    def take_token(self, tenant: Tenant) -> float:
        """0.0 if admitted by the tenant's bucket, else seconds until the next token."""
        bucket = self._buckets.get(tenant.name)
        wait = 0.0 if bucket is None else bucket.try_take()
        counts = self._counts.setdefault(tenant.name, [0, 0])
        counts[0 if wait == 0.0 else 1] += 1
        return wait

    def priority_rank(self, header: str | None, default: str) -> int:
        name = (header or default).strip().lower()
        try:
            return self._classes.index(name)
        except ValueError:
            raise InvalidInput(
                f"unknown priority {name!r}; X-Sluiceway-Priority must be one of {self._classes}"
            ) from None
