"""The dispatch order shared by the pod's queue and the gateway's hold queue: priority classes with
aging, then WF2Q+ fair share between tenants within the winning class (docs/scheduling.md).

These are the pure parts of the order, with no queue of their own: the pod's
``sluiceway_pod.admission.AdmissionCore`` (cost: estimated device seconds) and the gateway's
``sluiceway_gateway.hold.HoldQueue`` (cost: one request) keep their queues, tags and virtual time and
ask :func:`pick` which head goes next.

1. Each queued request has an *aged band* ``class_rank - floor(age / aging_seconds)``
   (:func:`aged_band`); the winning class is the one of the smallest aged band among the oldest
   request of every (tenant, class), the highest class (lowest rank) on ties.
2. Among the tenants with a head of that class, WF2Q+ (Bennett & Zhang 1997): eligible are the tenants
   whose start tag ``S <= V'``, ``V' = max(V, smallest S of the candidates)``; of those the smallest
   finish tag ``F = S + cost / weight`` goes, the oldest (then lowest id) on ties.
3. A tenant whose queue was empty re-enters at :func:`reentry_tag` (its finish tag, or the virtual
   time less a burst credit of :data:`BURST_CREDIT` + 1 requests); the virtual time advances by
   :func:`uncredited` of the cost over the backlogged weight.

Concurrency model: pure functions and frozen values; no I/O, no clock (``now`` is passed in).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Fair-queueing credit, in requests, that a tenant re-entering after its queue ran empty gets: its
#: start tag may lag the virtual time by up to ``(BURST_CREDIT + 1) * cost / weight`` (never more:
#: idle time banks nothing beyond that), so the finish tags of a burst of up to ``BURST_CREDIT + 1``
#: requests are all at or before the virtual time: a light tenant's short burst is served in
#: arrival order instead of being interleaved with a backlogged tenant's work.
BURST_CREDIT = 3.0


def aged_band(rank: int, enqueued: float, now: float, aging_seconds: float) -> int:
    """The class a request waiting since ``enqueued`` competes in at ``now``: one class higher per
    ``aging_seconds`` waited (lower is served first)."""
    return rank - math.floor((now - enqueued) / aging_seconds)


def reentry_tag(finish: float, has_queued: bool, vclock: float, cost: float, weight: float,
                credit: bool) -> float:
    """The start tag of a tenant's next request: its finish tag ``finish`` while it has queued work;
    when its queue is empty, ``max(finish, V - (BURST_CREDIT + 1) * cost / weight)`` when ``credit``
    (the caller grants credit to a tenant served before, or once anything was served since its queue
    was last idle), else ``max(finish, V)``."""
    if has_queued:
        return finish
    lag = (BURST_CREDIT + 1) * cost / weight if credit else 0.0
    return max(finish, vclock - lag)


def uncredited(start: float, cost: float, weight: float, credit_until: float) -> float:
    """The part of a request's cost that the virtual time advances by: all of it, except the part of
    its tag interval ``[start, start + cost/weight]`` that lies below the virtual time at which its
    tenant re-entered on burst credit (``credit_until``). That part is served on virtual time that
    has already passed; counting it would push the virtual time ahead of every backlogged tenant, a
    little more at each re-entry, and their credit would grow without bound."""
    credited = max(0.0, min(start + cost / weight, credit_until) - start) * weight
    return max(0.0, cost - credited)


@dataclass(frozen=True, slots=True)
class Head:
    """The first request of one (tenant, class) queue that may go now."""

    tenant: str
    cls: int
    band: int  # :func:`aged_band` of the request
    start: float  # the tenant's start tag
    cost: float  # the request's estimated cost (device seconds at the pod, 1 at the gateway)
    weight: float  # the tenant's weight (> 0)
    enqueued: float
    id: int


@dataclass(frozen=True, slots=True)
class Pick:
    head: Head
    finish: float  # the tenant's new finish tag, ``start + cost / weight``
    vnow: float  # ``V' = max(V, smallest start tag of the winning class's candidates)``


def pick(heads: Sequence[Head], vclock: float) -> Pick | None:
    """The head that goes next (see the module docstring), or ``None`` when there is none. The
    caller advances its tenant's tag to :attr:`Pick.finish` and its virtual time to
    ``Pick.vnow + uncredited(...) / busy weight``."""
    if not heads:
        return None
    cls = min((h.band, h.cls) for h in heads)[1]
    cands = [h for h in heads if h.cls == cls]
    vnow = max(vclock, min(h.start for h in cands))
    best: tuple[float, float, int] | None = None
    best_head: Head | None = None
    for h in cands:
        if h.start > vnow:
            continue
        order = (h.start + h.cost / h.weight, h.enqueued, h.id)
        if best is None or order < best:
            best, best_head = order, h
    assert best is not None and best_head is not None  # the smallest start tag is always eligible
    return Pick(best_head, best[0], vnow)
