"""Keeps one participant's lease of the service-wide tenant quotas (issue 11): a pod's, or a gateway
replica's (issue 19: the replicas split a tenant's quota between them the same way). The participant
is a :class:`ShareHolder` (the pod's ``TenantRegistry``, the gateway's edge admission); "the pod"
below stands for either.

Concurrency model
-----------------
One :class:`QuotaClient` belongs to the server's event loop. Its background task renews the lease
every third of a lease period: it builds the report on the loop (demand per tenant: the token
buckets' admitted and refused counts since the last report, and the admission core's queued and
running counts; the shares of the lease it holds; whether it is still joining), POSTs it from the
client's *own* worker thread (never the loop's default executor, which request decoding and encoding
share: under load a renewal queued behind them timed out, and a joining pod missed its lease), with
a total deadline, and applies the grant on the loop (:meth:`ShareHolder.apply_shares`). Requests
never wait on it: they are admitted by the local token buckets and caps, which hold this pod's share.

Every renewal sends the operator's charter (``quota.charter``) and its signature (read from
``quota.tokenFile``, the pod's Secret); the coordinator takes the quotas only from them.

Joining: until a grant comes back *settled* (no tenant's share here held back by the other pods'
unexpired leases) the client renews every ``MIN_EARLY_RENEWAL``, tells the coordinator it is joining
(so the serving pods give back a fair part of the quota before traffic reaches this pod) and the pod
does not report ready (:meth:`QuotaClient.ready_to_serve`; at most one lease period, also when the
coordinator cannot be reached). Once ready it still says it is joining until its first request
arrives (at most ``ROUTING_GRACE``): the Service routes to it only after the kubelet's probe and the
endpoints, and a pod that asked for its own (zero) demand in between met its first requests holding
nothing.

Failure: a lease is valid ``leaseSeconds`` from when the request was *sent* (so the pod's view ends
before the coordinator's). Any exception of a renewal (network, HTTP framing, JSON, schema, even a
RecursionError) counts as a failed renewal, is logged once per kind until a renewal succeeds, and
never ends the task; expiry is checked whatever happened. When the lease runs out without a renewal,
the pod falls back to ``quota / replicas`` with the replica count of its last lease
(``quota.assumedReplicas`` before the first one), logs one warning and sets
``sluiceway_quota_fallback`` to 1. Traffic never stops and a quota is never multiplied by the
replica count. From then (and from the start) until the first *settled* grant, each burst granted is
at least the fallback burst (:meth:`QuotaClient._floored`): a pod whose lease lapsed at the
coordinator too finds its part taken by the others and would otherwise come back with less than it
enforced without the coordinator.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.client
import json
import logging
import os
import socket
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Protocol

from .config import QuotaConfig
from .quota import (
    LEASE_PATH,
    LeaseGrant,
    LeaseRequest,
    QuotaError,
    TenantDemand,
    TenantQuota,
    TenantShare,
    fallback_share,
)


class LeasedShares:
    """A participant's shares of the lease in force, and the replica count its fallback share divides
    by (None: no coordinator, the participant holds the whole quota): the part of
    :class:`ShareHolder` the pod's registry and the gateway's admission have in common. Not
    thread-safe: owned by the participant's event loop, like the holder."""

    def __init__(self) -> None:
        self.replicas: int | None = None
        self._shares: dict[str, TenantShare] = {}

    def share(self, name: str, quota: TenantQuota) -> TenantShare | None:
        """The tenant's share in force: the lease's, else ``quota / replicas`` (the fallback), else
        None (no coordinator)."""
        got = self._shares.get(name)
        if got is not None:
            return got
        if self.replicas is None:
            return None
        return fallback_share(quota, self.replicas)

    def set(self, shares: Mapping[str, TenantShare] | None, replicas: int) -> None:
        """A new lease, or None: the lease ran out (the fallback share until the next one)."""
        self.replicas = max(1, replicas)
        self._shares = dict(shares) if shares is not None else {}


class Clock(Protocol):
    def now(self) -> float: ...


class ShareHolder(Protocol):
    """What a lease client drives: the participant's per-tenant limits (the pod's
    ``TenantRegistry``, the gateway's edge admission)."""

    def take_counts(self) -> dict[str, tuple[int, int]]:
        """(admitted, refused) by the rate check per tenant since the previous call."""
        ...

    def refused_names(self) -> list[str]:
        """Tenants refused by the rate check since the previous :meth:`take_counts`."""
        ...

    def share(self, name: str) -> TenantShare | None:
        """The share in force of a tenant (None: quotas hold locally)."""
        ...

    def quota(self, name: str) -> TenantQuota:
        """The tenant's configured (service-wide) quota."""
        ...

    def apply_shares(self, shares: Mapping[str, TenantShare] | None, replicas: int) -> None:
        """A new lease, or None: the lease ran out, fall back to quota / replicas."""
        ...

log = logging.getLogger("sluiceway.quota")

#: POST ``body`` to ``url`` within ``timeout`` seconds and return the response body (blocking).
Post = Callable[[str, bytes, float], bytes]
MAX_GRANT_BYTES = 1 << 20
MAX_TOKEN_BYTES = 1024
MIN_EARLY_RENEWAL = 0.25  # seconds between renewals asked for by a tenant with no share here
#: After it reports ready, a pod still counts as joining until its first request arrives (the
#: kubelet's probe period, then the endpoints and the proxies), at most this long.
ROUTING_GRACE = 10.0


class LeaseRefused(QuotaError):
    """The coordinator answered with an error status (the body is not echoed)."""


def http_post(url: str, body: bytes, timeout: float) -> bytes:
    """POST with a *total* deadline (a server that trickles bytes cannot hold the renewal thread
    longer) and a size cap on the answer. Raises OSError, http.client errors, or :class:`LeaseRefused`."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise QuotaError("the coordinator URL must be http(s)://host[:port]/...")
    deadline = time.monotonic() + timeout
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", parts.path or "/", body=body, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        chunks: list[bytes] = []
        size = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no complete answer within {timeout:.2f}s")
            if conn.sock is not None:
                conn.sock.settimeout(left)
            chunk = resp.read1(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_GRANT_BYTES:
                raise QuotaError(f"the coordinator's answer exceeds {MAX_GRANT_BYTES} bytes")
            chunks.append(chunk)
        if resp.status != 200:
            raise LeaseRefused(f"the coordinator answered {resp.status}")
        return b"".join(chunks)
    finally:
        conn.close()


def pod_name(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("POD_NAME") or socket.gethostname()


class QuotaClient:
    def __init__(
        self,
        cfg: QuotaConfig,
        registry: ShareHolder,
        load: Callable[[], Mapping[str, tuple[int, int]]],
        clock: Clock,
        *,
        pod: str,
        on_change: Callable[[QuotaClient], None] | None = None,
        post: Post | None = None,
        leaving: Callable[[], bool] = lambda: False,
    ) -> None:
        if cfg.coordinator_url is None or cfg.service is None:
            raise ValueError("quota.coordinatorUrl and quota.service are required")
        self.cfg = cfg
        self.url = cfg.coordinator_url.rstrip("/") + LEASE_PATH
        self.service = cfg.service
        self.pod = pod
        self.registry = registry
        self._load = load
        self.clock = clock
        self._on_change = on_change or (lambda _c: None)
        self._post = post or http_post
        self._leaving = leaving  # the pod drains (SIGTERM): it no longer counts as joining
        self.interval = cfg.lease_seconds / 3
        self.started = clock.now()
        self.last_renewal: float | None = None
        self.valid_until: float | None = None
        self.fallback = True  # until the first lease
        self.replicas = cfg.assumed_replicas
        self.failures = 0
        self.settled = False  # a settled grant seen (LeaseGrant.settled): see ready_to_serve
        #: on the fallback share (or not started) and no settled grant since: the bursts granted are
        #: floored at the fallback burst (:meth:`_floored`)
        self._from_fallback = True
        self._shares: Mapping[str, TenantShare] = {}  # of the lease in force (valid_until)
        self._logged: set[str] = set()  # kinds of failure logged since the last good renewal
        self._startup_announced = False
        self._ready_at: float | None = None  # when ready_to_serve first held
        self._routed = False  # a request arrived since (the Service routes to this pod)
        self._last_report = self.started
        self._task: asyncio.Task[None] | None = None
        # one thread of its own: a renewal never queues behind request work on the default executor
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sluiceway-quota")
        self._inflight: concurrent.futures.Future[bytes] | None = None
        registry.apply_shares(None, self.replicas)

    # ------------------------------------------------------------------ state
    def ready_to_serve(self) -> bool:
        """Whether the pod may report ready as far as quotas go: once a grant was settled (no
        tenant's share here held back by the other pods' leases), or one lease period after the
        client started (a share that stays held back, or a coordinator that cannot be reached, must
        not keep the pod out of service: it then serves on what it holds or on the fallback share).
        A pod that joins gets what the others' unexpired leases leave, possibly nothing; reporting
        ready before they have renewed would refuse tenants that are under their quota here, and
        reporting ready on the fallback share after one failed first renewal would serve a fraction
        of the quota while the coordinator is up."""
        return self.settled or self.clock.now() - self.started >= self.cfg.lease_seconds

    def serving_on_fallback(self) -> bool:
        """The pod serves (or may) on the fallback share: what ``sluiceway_quota_fallback`` shows.
        A pod still joining is not serving yet, so it does not count."""
        return self.fallback and self.ready_to_serve()

    def lease_age(self) -> float:
        """Seconds since the last lease was granted (since start when there was none)."""
        return self.clock.now() - (self.last_renewal if self.last_renewal is not None else self.started)

    def _signature(self) -> str:
        if self.cfg.token_file is None or self.cfg.charter is None:
            raise QuotaError("quota.charter and quota.tokenFile are required to lease (rendered by the operator)")
        try:
            with open(self.cfg.token_file, "rb") as f:
                raw = f.read(MAX_TOKEN_BYTES + 1)
        except OSError as e:
            raise QuotaError(f"cannot read quota.tokenFile {self.cfg.token_file}: {e.strerror}") from None
        if len(raw) > MAX_TOKEN_BYTES:
            raise QuotaError(f"quota.tokenFile {self.cfg.token_file} is larger than {MAX_TOKEN_BYTES} bytes")
        return raw.decode("ascii", "replace").strip()

    def build_request(self) -> LeaseRequest:
        now = self.clock.now()
        dt = max(1e-3, now - self._last_report)
        self._last_report = now
        counts = self.registry.take_counts()
        load = self._load()
        demand = {}
        for name in sorted(set(counts) | set(load)):
            admitted, refused = counts.get(name, (0, 0))
            queued, running = load.get(name, (0, 0))
            demand[name] = TenantDemand((admitted + refused) / dt, admitted / dt, queued, running)
        valid = not self.fallback and self.valid_until is not None and now < self.valid_until
        held = dict(self._shares) if valid else {}
        joining = self._joining(now, demand)
        return LeaseRequest(self.pod, self.cfg.charter or {}, self._signature(), demand, held, joining)

    def _joining(self, now: float, demand: Mapping[str, TenantDemand]) -> bool:
        """Joining until ready, and after that until the first request arrives (at most
        ``ROUTING_GRACE``): between reporting ready and being routed to, the pod has no demand of
        its own; asking for it would hand its share back to the serving pods, and it would meet its
        first requests holding nothing."""
        if self._leaving():
            return False  # draining: no traffic is coming, its share goes back to the serving pods
        if not self.ready_to_serve():
            return True
        if self._ready_at is None:
            self._ready_at = now
        self._routed = self._routed or any(d.offered_rate > 0 or d.concurrency > 0 for d in demand.values())
        return not self._routed and now - self._ready_at < ROUTING_GRACE

    def starved(self) -> bool:
        """A tenant has work queued here but no concurrency share on this pod, or was refused here
        with no rate share: renew early (other pods may have given theirs back)."""
        for name, (queued, _running) in self._load().items():
            share = self.registry.share(name)
            if queued and share is not None and share.max_concurrent == 0:
                return True
        for name in self.registry.refused_names():
            share = self.registry.share(name)
            if share is not None and share.rate == 0:
                return True
        return False

    # ------------------------------------------------------------------ renewal
    def _failed(self, e: BaseException) -> bool:
        self.failures += 1
        kind = type(e).__name__
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("cannot renew the quota lease at %s (%s): %s", self.url, kind, str(e)[:200])
        return False

    async def renew_once(self) -> bool:
        """One renewal; True when a grant was applied. Never raises (but CancelledError)."""
        sent = self.clock.now()
        try:
            if self._inflight is not None and not self._inflight.done():
                raise TimeoutError("the previous renewal is still in flight")
            body = json.dumps(self.build_request().to_json()).encode()
            loop = asyncio.get_running_loop()
            self._inflight = self._pool.submit(self._post, self.url, body, self.interval)
            async with asyncio.timeout(self.interval + 0.1):
                raw = await asyncio.wrap_future(self._inflight, loop=loop)
            grant = LeaseGrant.from_json(json.loads(raw))
            if grant.pod != self.pod or grant.service != self.service:
                raise QuotaError(f"the coordinator answered for {grant.service}/{grant.pod}")
        except asyncio.CancelledError:
            raise
        except Exception as e:  # any failure is a failed renewal: the task must survive it
            return self._failed(e)
        if self.failures or self.fallback:
            log.info(
                "quota lease from %s: %d replicas, %d tenants (after %d failed renewals)",
                self.url, grant.replicas, len(grant.shares), self.failures,
            )
        self.failures = 0
        self._logged.clear()
        self.valid_until = sent + grant.lease_seconds
        self.last_renewal = sent
        self.replicas = grant.replicas
        self.fallback = False
        self.settled = self.settled or grant.settled
        self._from_fallback = self._from_fallback and not grant.settled
        shares = self._floored(grant) if self._from_fallback else dict(grant.shares)
        self._shares = shares
        self.registry.apply_shares(shares, grant.replicas)
        self._on_change(self)
        return True

    def _floored(self, grant: LeaseGrant) -> dict[str, TenantShare]:
        """The grant with each burst at least the fallback burst (``burst // replicas``, the grant's
        pod count): what a pod enforces from starting, or from leaving the fallback share, until its
        first settled grant. A pod whose lease lapsed at the coordinator too (renewals that failed)
        comes back to find its part taken by the others, and one that reported ready unsettled
        holds what the others' unexpired leases leave: down to a burst of 1, less than it enforced
        while the coordinator could not be reached, so a tenant far under its quota was refused
        (tests/quota/test_scale_up_sim.py). The rate and the concurrency stay as granted: a tenant
        over its quota gains at most these bursts, once, service-wide, the others give back within
        one renewal, and until then the bursts in force may exceed the tenant's burst by at most
        them, as they do while a pod is on the fallback share."""
        out = dict(grant.shares)
        for name, share in grant.shares.items():
            floor = fallback_share(self.registry.quota(name), grant.replicas).burst
            if share.burst is not None and floor is not None and share.burst < floor:
                out[name] = TenantShare(share.rate, floor, share.max_concurrent, share.fraction)
        return out

    def check_expiry(self) -> None:
        now = self.clock.now()
        if self.fallback:
            if self.valid_until is None and not self._startup_announced and self.ready_to_serve():
                self._startup_announced = True
                log.warning(
                    "no quota lease from %s within %.1fs of starting: serving on quota / %d replicas",
                    self.url, now - self.started, self.replicas,
                )
                self._on_change(self)
            return
        if self.valid_until is None or now < self.valid_until:
            return
        self.fallback = True
        self._from_fallback = True
        self._shares = {}
        self.registry.apply_shares(None, self.replicas)
        log.warning(
            "quota lease expired (no renewal from %s for %.1fs): falling back to quota / %d replicas",
            self.url, self.lease_age(), self.replicas,
        )
        self._on_change(self)

    async def run(self) -> None:
        while True:
            await self.renew_once()
            self._check()
            due = self.clock.now() + self.interval
            early = self.clock.now() + MIN_EARLY_RENEWAL
            while (now := self.clock.now()) < due:
                await asyncio.sleep(min(MIN_EARLY_RENEWAL, due - now))
                self._check()
                try:
                    if self.clock.now() >= early and (not self.settled or self.starved()):
                        break
                except Exception as e:  # starved() reads the registry: never let it end the task
                    self._failed(e)
                    break

    def _check(self) -> None:
        try:
            self.check_expiry()
        except Exception as e:
            self._failed(e)

    async def start(self) -> None:
        """One renewal now (bounded; on failure the pod keeps the fallback share and retries: a failed
        first renewal never fails the pod), then the background task."""
        with contextlib.suppress(Exception):
            self._on_change(self)
        await self.renew_once()
        self._task = asyncio.create_task(self.run(), name="sluiceway-quota-lease")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pool.shutdown(wait=False, cancel_futures=True)
