"""The hold queue: requests the gateway keeps while no ready pod can take them (none routable, or every
pod's ledger says its queue is full), bounded, ordered and each with its deadline.

* **Bounds**: at most ``maxRequests`` held and ``maxBytes`` of held requests (head + body); each tenant
  at most ``tenantShare`` of each bound (so one tenant cannot fill it). Over a bound, :meth:`HoldQueue.
  offer` raises at once: 503 ``hold_full`` / 429 ``hold_tenant_full``, both with ``Retry-After``.
* **Order**: the pod's dispatch order (:mod:`sluiceway_core.fairshare`): priority classes with aging,
  then WF2Q+ fair share between tenants by their weights within the winning class. At the gateway every
  request costs 1 (it does not know a request's device time), so the fair share is by request count.
* **Deadlines**: each held request keeps its own; :meth:`HoldQueue.next_deadline` and
  :meth:`HoldQueue.remove` let the gateway answer it when the deadline passes while it is held.

Also here, the hand-off arithmetic (:func:`room`), the ``Retry-After`` estimate
(:func:`retry_after_seconds`), the predicted time until a pod can serve a new held request
(:func:`predicted_ready_seconds`) and the cold start's estimate from the ones measured
(:func:`cold_start_estimate`), all pure.

Concurrency model: owned by the gateway's event loop; nothing here blocks, awaits or reads a clock
(``now`` is passed in). The awaiting and the timers are the gateway's (:mod:`~sluiceway_gateway.app`).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sluiceway_core.fairshare import Head, aged_band, pick, reentry_tag, uncredited

from .errors import HoldFull, HoldTenantFull
from .ledger import QUEUE_FULL_LEVEL, PodLoad, routable


@dataclass(eq=False)
class Held:
    """One held request. ``state``: ``held`` -> ``released`` (handed to a pod) | ``removed``."""

    id: int
    tenant: str
    weight: float
    rank: int
    nbytes: int
    enqueued: float
    deadline: float
    #: the gateway's waiter (an asyncio future); opaque here
    waiter: Any = None
    state: str = "held"


@dataclass
class _Tenant:
    by_class: list[deque[Held]]
    count: int = 0
    nbytes: int = 0
    vfinish: float = -math.inf
    credit_until: float = -math.inf
    weight: float = 1.0


@dataclass(frozen=True)
class HoldLimits:
    max_requests: int
    max_bytes: int
    tenant_share: float  # of each bound, in (0, 1]
    num_classes: int
    aging_seconds: float


class HoldQueue:
    def __init__(self, limits: HoldLimits) -> None:
        self.limits = limits
        self.count = 0
        self.nbytes = 0
        self._tenants: dict[str, _Tenant] = {}
        self._ids: Iterator[int] = itertools.count(1)
        self._vclock = 0.0
        self._served_since_idle = False

    def tenant_caps(self) -> tuple[int, int]:
        """(requests, bytes) one tenant may hold."""
        lim = self.limits
        return (max(1, math.floor(lim.max_requests * lim.tenant_share)),
                max(1, math.floor(lim.max_bytes * lim.tenant_share)))

    def held_by(self, tenant: str) -> tuple[int, int]:
        t = self._tenants.get(tenant)
        return (t.count, t.nbytes) if t is not None else (0, 0)

    def offer(self, tenant: str, weight: float, rank: int, nbytes: int, deadline: float, now: float,
              retry_after: float) -> Held:
        """Hold a request or raise why not (:class:`HoldFull`, :class:`HoldTenantFull`, with
        ``retry_after`` seconds)."""
        lim = self.limits
        if not 0 <= rank < lim.num_classes:
            raise ValueError("rank out of range")
        if self.count + 1 > lim.max_requests:
            raise HoldFull(f"the hold queue is full ({self.count} requests held)", retry_after=retry_after,
                           bound="full")
        if self.nbytes + nbytes > lim.max_bytes:
            raise HoldFull(f"the hold queue is full ({self.nbytes} bytes held, this request {nbytes})",
                           retry_after=retry_after, bound="bytes_full")
        cap_n, cap_b = self.tenant_caps()
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = _Tenant([deque() for _ in range(lim.num_classes)])
        if t.count + 1 > cap_n:
            raise HoldTenantFull(f"tenant {tenant!r} holds {t.count} requests, its share of the hold queue",
                                 retry_after=retry_after, bound="tenant_full")
        if t.nbytes + nbytes > cap_b:
            raise HoldTenantFull(f"tenant {tenant!r} holds {t.nbytes} bytes, its share of the hold queue",
                                 retry_after=retry_after, bound="tenant_bytes_full")
        if self.count == 0:
            self._served_since_idle = False
        t.weight = max(weight, 1e-9)
        start = reentry_tag(t.vfinish, t.count > 0, self._vclock, 1.0, t.weight,
                            t.vfinish > -math.inf or self._served_since_idle)
        if start < self._vclock and t.count == 0:
            t.credit_until = self._vclock
        t.vfinish = start
        h = Held(next(self._ids), tenant, t.weight, rank, nbytes, now, deadline)
        t.by_class[rank].append(h)
        t.count += 1
        t.nbytes += nbytes
        self.count += 1
        self.nbytes += nbytes
        return h

    def _take(self, h: Held, state: str) -> None:
        t = self._tenants[h.tenant]
        t.by_class[h.rank].remove(h)
        t.count -= 1
        t.nbytes -= h.nbytes
        self.count -= 1
        self.nbytes -= h.nbytes
        h.state = state

    def remove(self, h: Held) -> bool:
        """Withdraw a held request (deadline passed, shutdown); False if it is no longer held."""
        if h.state != "held":
            return False
        self._take(h, "removed")
        return True

    def pop(self, now: float) -> Held | None:
        """The next request to hand off, in the shared dispatch order; its tenant's tag and the
        virtual time advance as at the pod."""
        heads: list[Head] = []
        for name, t in self._tenants.items():
            if not t.count:
                continue
            for c, dq in enumerate(t.by_class):
                if dq:
                    h = dq[0]
                    heads.append(Head(name, c, aged_band(h.rank, h.enqueued, now, self.limits.aging_seconds),
                                      t.vfinish, 1.0, t.weight, h.enqueued, h.id))
        chosen = pick(heads, self._vclock)
        if chosen is None:
            return None
        t = self._tenants[chosen.head.tenant]
        busy = sum(x.weight for x in self._tenants.values() if x.count or x.vfinish > self._vclock) or 1.0
        start = t.vfinish
        t.vfinish = chosen.finish
        self._vclock = chosen.vnow + uncredited(start, 1.0, t.weight, t.credit_until) / busy
        self._served_since_idle = True
        h = t.by_class[chosen.head.cls][0]
        self._take(h, "released")
        return h

    def all_held(self) -> list[Held]:
        return [h for t in self._tenants.values() for dq in t.by_class for h in dq]


def room(pod: PodLoad, extra_queue: int, now: float, probe_after: float, full_since: float | None) -> int:
    """How many more requests the hand-off may have in flight to ``pod`` now: its device permits (from
    its ``sluiceway-permits`` header, 1 before it reports) plus ``extra_queue`` places in its queue,
    less what the gateway has in flight to it. A pod whose last word was "queue full" gets nothing,
    except one probe once nothing is in flight to it and ``probe_after`` seconds passed since then."""
    if not routable(pod):
        return 0
    if pod.degradation >= QUEUE_FULL_LEVEL:
        if pod.inflight == 0 and (full_since is None or now - full_since >= probe_after):
            return 1
        return 0
    return max(0, (pod.permits_limit or 1) + extra_queue - pod.inflight)


def handoff_rate(pods: Iterable[PodLoad], extra_queue: int) -> float:
    """Requests per second the given pods take off the hold queue: by Little's law, what each has in
    flight over its mean answer time (1 ms while unknown), counting at least its hand-off cap (permits,
    1 before it reports, plus ``extra_queue``: what the hand-off keeps in flight to it). A pod with
    more in flight than that (sent on the direct path before anything was held) answers as many in
    its answer time, which that load has stretched: the cap alone would predict it far too slow."""
    return sum(max((p.permits_limit or 1) + extra_queue, p.inflight) / max(p.ewma_ms / 1000.0, 0.001)
               for p in pods)


def start_left_seconds(elapsed: float, startup: float, overdue: bool) -> float:
    """Seconds left until a pod that has been starting for ``elapsed`` seconds is ready, predicted
    ``startup`` in all: ``startup - elapsed`` while that is positive. Past the prediction, 0 without
    ``overdue``; with it, the pod is taken to be late by as much again as it is late already
    (``elapsed - startup``): a start that overran its estimate says nothing of when it ends, and the
    longer it overran the later it is likely to end, so the estimate grows with the overrun instead
    of staying at "any moment now" (a pod that never becomes ready is given up on in the end)."""
    left = startup - elapsed
    if left >= 0:
        return left
    return -left if overdue else 0.0


@dataclass(frozen=True)
class ColdStart:
    """A cold start as the gateway sees it: from ``since``, the first request it held with no pod at
    all (none ready, none starting), to the first pod it can hand requests to; ``estimate``: its
    predicted length in all (:func:`cold_start_estimate`)."""

    since: float
    estimate: float


def cold_start_estimate(measured: Sequence[float], startup: float, overhead: float) -> float:
    """The predicted length of the next cold start: the median of the last ones the gateway measured
    (``measured``, oldest first, bounded by the caller): each covers everything the gateway waits
    for (the scaler's activation, the pod's creation and scheduling, its own start-up, the
    readiness probe's period, the EndpointSlice update), and one slow start among a few does not
    move the median; with none measured yet, ``startup`` (the pods' own measured start-up,
    ``hold.startupSeconds``, which counts from the pod's scheduling to its own ready phase) plus
    ``overhead`` (``hold.coldStartOverheadSeconds``: what comes before and after it)."""
    if not measured:
        return startup + overhead
    return float(statistics.median(measured))


def predicted_ready_seconds(now: float, pods: Iterable[PodLoad], starting_since: Iterable[float],
                            startup: float, held_ahead: int, extra_queue: int, overdue: bool = False,
                            observed_rate: float = 0.0, cold: ColdStart | None = None,
                            cold_estimate: float | None = None) -> float:
    """Seconds until a pod can serve a request held now: with a ready pod, the time to drain the
    ``held_ahead`` requests at the ready pods' rate (:func:`handoff_rate`, or the rate they were
    seen answering lately, ``observed_rate``, when that is higher: after a burst the mean answer time
    lags behind, still stretched by the queue the burst built, while the answers themselves show the
    pace); with none, during a cold start (``cold``) the time left of it (:func:`start_left_seconds`
    of its elapsed time against its estimate), else the time left for the soonest
    starting pod (:func:`start_left_seconds` of how long ago it was first seen starting), or, none
    starting, the whole ``cold_estimate`` (this request starts a cold start; ``startup`` without
    one), plus the drain at the starting pods' rate."""
    pods = list(pods)
    ready = [p for p in pods if routable(p)]
    if ready:
        return held_ahead / max(handoff_rate(ready, extra_queue), observed_rate)
    left = [start_left_seconds(now - since, startup, overdue) for since in starting_since]
    if cold is not None:
        wait = start_left_seconds(now - cold.since, cold.estimate, overdue)
    elif left:
        wait = min(left)
    else:
        wait = startup if cold_estimate is None else cold_estimate
    rate = handoff_rate(pods, extra_queue) if pods else 0.0
    return wait + (held_ahead / rate if rate > 0 else 0.0)


def retry_after_seconds(held: int, pods: Iterable[PodLoad], extra_queue: int, idle_default: float,
                        observed_rate: float = 0.0) -> float:
    """When a refused request may find room: the time for the ready pods to work off what is held at
    their hand-off rate (:func:`handoff_rate`), at least 1 s; ``idle_default``
    when no pod is ready (nothing is known about when one will be)."""
    ready = [p for p in pods if routable(p)]
    if not ready:
        return idle_default
    rate = max(handoff_rate(ready, extra_queue), observed_rate)
    if rate <= 0:
        return idle_default
    return max(1.0, held / rate)

