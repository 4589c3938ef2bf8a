"""Keeps this pod's lease of the service-wide tenant quotas (issue 11).

Concurrency model
-----------------
One :class:`QuotaClient` belongs to the server's event loop. Its background task renews the lease
every third of a lease period: it builds the report on the loop (demand per tenant: the token
buckets' admitted and refused counts since the last report, and the admission core's queued and
running counts), POSTs it from a worker thread (``asyncio.to_thread``, bounded by a timeout), and
applies the grant on the loop (:meth:`TenantRegistry.apply_shares`). Requests never wait on it:
they are admitted by the local token buckets and caps, which hold this pod's share.

Joining: until a grant comes back *settled* (no tenant's share here held back by the other pods'
unexpired leases) the client renews every ``MIN_EARLY_RENEWAL`` and the pod does not report ready
(:meth:`QuotaClient.ready_to_serve`; at most one lease period).

Failure: a lease is valid ``leaseSeconds`` from when the request was *sent* (so the pod's view ends
before the coordinator's). When it runs out without a renewal, the pod falls back to
``quota / replicas`` with the replica count of its last lease (``quota.assumedReplicas`` before the
first one), logs one warning and sets ``sluiceway_quota_fallback`` to 1. Traffic never stops and a
quota is never multiplied by the replica count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from sluiceway_core.config import QuotaConfig
from sluiceway_core.quota import LEASE_PATH, LeaseGrant, LeaseRequest, QuotaError, TenantDemand

from .admission import AdmissionCore
from .clock import Clock
from .metrics import PodMetrics
from .tenancy import OTHER, TenantRegistry

log = logging.getLogger("sluiceway.quota")

#: POST ``body`` to ``url`` within ``timeout`` seconds and return the response body (blocking).
Post = Callable[[str, bytes, float], bytes]
MAX_GRANT_BYTES = 1 << 20
MIN_EARLY_RENEWAL = 0.25  # seconds between renewals asked for by a tenant with no share here


def http_post(url: str, body: bytes, timeout: float) -> bytes:
    req = urllib.request.Request(url, data=body, method="POST", headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read(MAX_GRANT_BYTES)  # type: ignore[no-any-return]


def pod_name(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("POD_NAME") or socket.gethostname()


class QuotaClient:
    def __init__(
        self,
        cfg: QuotaConfig,
        registry: TenantRegistry,
        load: Callable[[], Mapping[str, tuple[int, int]]],
        clock: Clock,
        *,
        pod: str,
        on_change: Callable[[QuotaClient], None] | None = None,
        post: Post | None = None,
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
        self.interval = cfg.lease_seconds / 3
        self.started = clock.now()
        self.last_renewal: float | None = None
        self.valid_until: float | None = None
        self.fallback = True  # until the first lease
        self.replicas = cfg.assumed_replicas
        self.failures = 0
        self.settled = False  # a settled grant seen (LeaseGrant.settled): see ready_to_serve
        self._last_report = self.started
        self._task: asyncio.Task[None] | None = None
        registry.apply_shares(None, self.replicas)

    # ------------------------------------------------------------------ state
    def ready_to_serve(self) -> bool:
        """Whether the pod may report ready as far as quotas go: once a grant was settled (no
        tenant's share here held back by the other pods' leases), or on the fallback share (no
        coordinator: traffic never waits on it), or one lease period after the client started (a
        share that stays held back must not keep the pod out of service). A pod that joins gets what
        the others' unexpired leases leave, possibly nothing; reporting ready before they have
        renewed would refuse tenants that are under their quota here."""
        return self.settled or self.fallback or self.clock.now() - self.started >= self.cfg.lease_seconds

    def lease_age(self) -> float:
        """Seconds since the last lease was granted (since start when there was none)."""
        return self.clock.now() - (self.last_renewal if self.last_renewal is not None else self.started)

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
        return LeaseRequest(self.service, self.pod, self.registry.quotas(), demand)

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
    async def renew_once(self) -> bool:
        sent = self.clock.now()
        body = json.dumps(self.build_request().to_json()).encode()
        try:
            async with asyncio.timeout(self.interval):
                raw = await asyncio.to_thread(self._post, self.url, body, self.interval)
            grant = LeaseGrant.from_json(json.loads(raw))
            if grant.pod != self.pod or grant.service != self.service:
                raise QuotaError(f"the coordinator answered for {grant.service}/{grant.pod}")
        except (OSError, ValueError, TimeoutError) as e:  # QuotaError and JSON errors are ValueErrors
            self.failures += 1
            if self.failures == 1:
                log.warning("cannot renew the quota lease at %s: %s", self.url, e)
            return False
        if self.failures or self.fallback:
            log.info(
                "quota lease from %s: %d replicas, %d tenants (after %d failed renewals)",
                self.url, grant.replicas, len(grant.shares), self.failures,
            )
        self.failures = 0
        self.valid_until = sent + grant.lease_seconds
        self.last_renewal = sent
        self.replicas = grant.replicas
        self.fallback = False
        self.settled = self.settled or grant.settled
        self.registry.apply_shares(grant.shares, grant.replicas)
        self._on_change(self)
        return True

    def check_expiry(self) -> None:
        if self.fallback or self.valid_until is None or self.clock.now() < self.valid_until:
            return
        self.fallback = True
        self.registry.apply_shares(None, self.replicas)
        log.warning(
            "quota lease expired (no renewal from %s for %.1fs): falling back to quota / %d replicas",
            self.url, self.lease_age(), self.replicas,
        )
        self._on_change(self)

    async def run(self) -> None:
        while True:
            await self.renew_once()
            self.check_expiry()
            due = self.clock.now() + self.interval
            early = self.clock.now() + MIN_EARLY_RENEWAL
            while (now := self.clock.now()) < due:
                await asyncio.sleep(min(MIN_EARLY_RENEWAL, due - now))
                self.check_expiry()
                if self.clock.now() >= early and (self.starved() or not self.settled):
                    break

    async def start(self) -> None:
        """One renewal now (bounded: the pod starts with the fallback share if it fails), then the
        background task."""
        self._on_change(self)
        await self.renew_once()
        self._task = asyncio.create_task(self.run(), name="sluiceway-quota-lease")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def start_quota_client(
    cfg: QuotaConfig, registry: TenantRegistry, core: AdmissionCore[Any], clock: Clock, metrics: PodMetrics
) -> QuotaClient:
    """The client of one pod, wired to its admission core and its metrics (call ``start`` next)."""

    def exported(client: QuotaClient) -> None:
        metrics.quota_fallback.labels(metrics.model).set(1 if client.fallback else 0)
        for name in registry.quotas():
            share = registry.share(name)
            label = registry.tenant(name).label
            if share is not None and label != OTHER:  # 'other' would mix several tenants
                metrics.quota_share.labels(metrics.model, label).set(share.fraction)

    client = QuotaClient(cfg, registry, core.tenant_load, clock, pod=pod_name(), on_change=exported)
    metrics.quota_lease_age.labels(metrics.model).set_function(client.lease_age)
    return client
