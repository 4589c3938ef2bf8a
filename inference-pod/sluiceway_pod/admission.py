"""The admission core: a synchronous state machine deciding who waits, who runs and who is refused.

Concurrency model
-----------------
:class:`AdmissionCore` is owned by exactly one asyncio event loop (the server's) and is only ever
called from that loop's thread; it never blocks, never awaits and never reads the wall clock: time
comes from an injected :class:`~sluiceway_pod.clock.Clock`. The asynchronous driver
(:mod:`sluiceway_pod.dispatcher`) calls :meth:`admit`, :meth:`expire`, :meth:`next_batch`,
:meth:`finish` and :meth:`cancel`; property tests call them directly with a manual clock.

Guarantees
----------
* Permits: at most ``limit`` batches run at once (``in_use <= limit``; after an OOM shrink the limit
  may briefly sit below ``in_use`` until running work finishes, and nothing new starts meanwhile).
* Bounded queue: at most ``max_depth`` queued tickets in total, and ``maxQueued`` per tenant.
* Every admitted ticket is resolved exactly once: with a result, or with one
  :class:`~sluiceway_pod.errors.SluicewayError` (queue timeout, deadline, drain, exec timeout...).
* Dispatch order (see docs/scheduling.md):

  1. Each queued ticket has an *aged band* ``class_rank - floor(age / aging_seconds)``.
  2. Find the smallest aged band among the oldest ticket of every (tenant, class); the winning
     class is the highest class (lowest rank) having a ticket at that band.
  3. Among all tenants with a queued ticket of the winning class (and under their
     ``maxConcurrent``), pick by WF2Q+ (Bennett & Zhang 1997: smallest eligible finish tag first)
     *by device time*. Each tenant has a start tag ``S`` (the finish tag of its last dispatched
     request); a tenant whose queue was empty re-enters at ``max(S, V - credit)``. Its oldest ticket
     of the class would finish at ``F = S + cost/weight``, where ``cost`` is the estimated device
     seconds of the request (rows x the tenant's EWMA of device seconds per row). Eligible are the
     tenants with ``S <= V'``, ``V' = max(V, smallest S of the candidates)``; of those the smallest
     ``F`` goes (oldest on ties). Dispatching it sets the tenant's ``S = F`` and the virtual time
     ``V = V' + cost / sum(w)`` over the tenants the fluid (GPS) reference still serves (queued or
     running work, or a finish tag ahead of ``V``); work served on burst credit does not advance
     ``V``. When the batch ends, ``S`` and ``V`` are corrected by the measured minus the estimated
     cost. Weights are shares of device time; with every tenant backlogged and one permit, each
     tenant's device time stays within one maximum request cost of ``weight / sum(weights)`` of the
     total (``N`` maximum costs with ``N`` permits).
  4. A batch whose head waits to fill (``max_batch_wait``) does not hold other batch keys back:
     they dispatch on the idle permits. A batch is filled in the same order as (1)-(3).

  The pure parts of (1)-(3) (aged bands, the WF2Q+ pick, re-entry tags, credited cost) live in
  :mod:`sluiceway_core.fairshare`, shared with the gateway's hold queue.

  Worst wait of the lowest class, one tenant: ``K*A + (ceil(Q/N) + 1) * S`` for K classes, aging
  step A, queue bound Q, N permits and a longest service time S. With several tenants the
  ``ceil(Q/N)`` term is scaled by ``sum(weights)/weight``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from sluiceway_core.fairshare import BURST_CREDIT, Head, aged_band, pick, reentry_tag, uncredited

from .clock import Clock
from .errors import (
    DeadlineExpired,
    DeadlineUnmeetable,
    Displaced,
    Draining,
    PriorityForbidden,
    QueueFull,
    QueueTimeout,
    RateLimited,
    SluicewayError,
    TenantQueueFull,
)
from .tenancy import Tenant

P = TypeVar("P")

__all__ = ["BURST_CREDIT", "AdmissionCore", "AdmissionSettings", "Answer", "Batch", "Ticket"]


class Answer(Protocol):
    """Where a ticket's single answer goes (an asyncio future in production)."""

    def __call__(self, result: Any, error: SluicewayError | None) -> None: ...


@dataclass(eq=False)
class Ticket(Generic[P]):
    id: int
    tenant: Tenant
    rank: int
    priority_label: str
    enqueued: float
    deadline: float
    deadline_reason: type[SluicewayError]
    batch_key: Hashable
    payload: P
    answer: Answer
    state: str = "queued"  # queued -> running -> done | queued -> done
    rows: int = 1  # rows (dim 0) of the request: its device cost scales with them
    cost: float = 0.0  # estimated device seconds, charged to its tenant when dispatched
    dispatched: float = 0.0  # when it was dispatched to a permit (0.0: not yet, or never)
    #: called once, on the loop, when its batch starts executing (the pod's start signal to the
    #: gateway: :mod:`sluiceway_pod.transport`); set by the dispatcher, never by the core
    on_start: Callable[[], None] | None = None

    def resolve(self, result: Any = None, error: SluicewayError | None = None) -> bool:
        """Answer once. Returns False (and does nothing) if already answered."""
        if self.state == "done":
            return False
        self.state = "done"
        self.answer(result, error)
        return True


@dataclass(eq=False)
class Batch(Generic[P]):
    tickets: list[Ticket[P]]
    key: Hashable
    started: float


@dataclass(frozen=True)
class AdmissionSettings:
    permits: int
    max_depth: int
    queue_timeout: float
    num_classes: int
    aging_seconds: float
    max_batch_size: int = 1
    max_batch_wait: float = 0.0
    initial_service_time: float = 0.01


class Observer(Protocol):
    """Hooks for metrics. Called synchronously from the owning loop."""

    def enqueued(self, t: Ticket[Any]) -> None: ...
    def dequeued(self, t: Ticket[Any], waited: float) -> None: ...
    def rejected(self, reason: str, tenant: Tenant, priority: str) -> None: ...
    def permits(self, limit: int, in_use: int) -> None: ...
    def batch(self, size: int) -> None: ...
    def served(self, seconds: float) -> None: ...


class NullObserver:
    def enqueued(self, t: Ticket[Any]) -> None:
        pass

    def dequeued(self, t: Ticket[Any], waited: float) -> None:
        pass

    def rejected(self, reason: str, tenant: Tenant, priority: str) -> None:
        pass

    def permits(self, limit: int, in_use: int) -> None:
        pass

    def batch(self, size: int) -> None:
        pass

    def served(self, seconds: float) -> None:
        pass


@dataclass
class _TenantQueue:
    tenant: Tenant
    by_class: list[deque[Ticket[Any]]]
    queued: int = 0
    running: int = 0
    #: WF2Q+ finish tag of its last dispatched request = start tag of its next one (-inf: never served)
    vfinish: float = -math.inf
    credit_until: float = -math.inf  # V when it last re-entered below V on burst credit
    per_row: _ServiceEstimate | None = None  # the tenant's EWMA of device seconds per row


@dataclass
class _ServiceEstimate:
    """EWMA of the service time of one batch (seconds)."""

    value: float
    alpha: float = 0.2
    samples: int = 0

    def observe(self, seconds: float) -> None:
        self.samples += 1
        self.value = seconds if self.samples == 1 else self.alpha * seconds + (1 - self.alpha) * self.value


def rate_limited(tenant: Tenant, wait: float) -> RateLimited:
    """The refusal of a tenant over its request rate (``Retry-After``: ``wait`` seconds)."""
    return RateLimited(f"tenant {tenant.name!r} is over its request rate", retry_after=wait)


class AdmissionCore(Generic[P]):
    def __init__(
        self,
        settings: AdmissionSettings,
        clock: Clock,
        *,
        observer: Observer | None = None,
        take_token: Callable[[Tenant], float] | None = None,
        rows_of: Callable[[P], int] | None = None,
        concurrency_cap: Callable[[Tenant], int | None] | None = None,
    ) -> None:
        if settings.permits < 1 or settings.max_depth < 1 or settings.num_classes < 1:
            raise ValueError("permits, max_depth and num_classes must be >= 1")
        self.settings = settings
        self.clock = clock
        self.obs: Observer = observer or NullObserver()
        self._take_token = take_token or (lambda _t: 0.0)
        self._rows_of: Callable[[P], int] = rows_of or (lambda _p: 1)
        #: the tenant's concurrency cap in force (its ``maxConcurrent``, or its leased share of it)
        self._cap: Callable[[Tenant], int | None] = concurrency_cap or (lambda t: t.max_concurrent)
        self.limit = settings.permits
        self.in_use = 0
        self.depth = 0
        self.draining = False
        self.service = _ServiceEstimate(settings.initial_service_time)
        self.per_row = _ServiceEstimate(settings.initial_service_time)  # all tenants: the prior
        self._class_depth = [0] * settings.num_classes
        self._tenants: dict[str, _TenantQueue] = {}
        self._ids = itertools.count(1)
        self._vclock = 0.0  # WF2Q+ system virtual time (device seconds per unit of backlogged weight)
        self._served_since_idle = False  # whether anything was dispatched since the core was last idle
        self._deferred_until: float | None = None  # the earliest time a filling batch must go
        # (deadline, id, ticket) of queued tickets; entries of tickets that left the queue are
        # dropped lazily, and the heap is rebuilt when they outnumber the live ones.
        self._deadlines: list[tuple[float, int, Ticket[P]]] = []
        self.obs.permits(self.limit, self.in_use)

    # ------------------------------------------------------------------ predictions
    def predicted_wait(self, rank: int | None = None, tenant: Tenant | None = None) -> float:
        """Expected queue wait of a request arriving now (seconds).

        With ``rank`` (and ``tenant``): from the work ahead of *this* request only: every queued
        request of a higher class, its tenant's own queued requests of its class, and of the other
        tenants' requests of its class those whose fair-queueing tags come before its own. Without:
        from the whole queue (the time to work off the backlog, for Retry-After)."""
        ahead = self.depth if rank is None else self._work_ahead(rank, tenant)
        if ahead == 0 and self.in_use < self.limit:
            return 0.0
        per_round = self.limit * max(1, self.settings.max_batch_size)
        return math.ceil((ahead + 1) / per_round) * self.service.value

    def _work_ahead(self, rank: int, tenant: Tenant | None) -> int:
        ahead = sum(self._class_depth[:rank])
        mine = self._tenants.get(tenant.name) if tenant is not None else None
        if tenant is None:
            return ahead + self._class_depth[rank]
        own_cost = self._estimate(mine, 1)
        own_n = len(mine.by_class[rank]) if mine is not None else 0
        start = self._reentry_tag(mine, own_cost, tenant.weight)
        my_finish = start + (own_n + 1) * own_cost / tenant.weight
        ahead += own_n
        for tq in self._tenants.values():
            dq = tq.by_class[rank]
            if tq is mine or not dq:
                continue
            step = self._estimate(tq, dq[0].rows) / tq.tenant.weight
            if step <= 0:
                ahead += len(dq)
            elif my_finish >= tq.vfinish + step:  # its k-th request finishes at vfinish + k * step
                ahead += min(len(dq), math.floor((my_finish - tq.vfinish) / step))
        return ahead

    def _reentry_tag(self, tq: _TenantQueue | None, cost: float, weight: int) -> float:
        """The start tag of a tenant's next request: its finish tag while it has queued work; when
        its queue is empty, ``max(finish tag, V - (BURST_CREDIT + 1) * cost / weight)``: a tenant that
        had nothing queued while others were served may lag the virtual time by its burst credit,
        and keeps that lag across idle periods of the core. A tenant never served yet gets credit
        only once something was dispatched since the core was last idle: tenants that arrive
        together at an idle core with no history all start at ``V``, on equal terms."""
        finish = tq.vfinish if tq is not None else -math.inf
        known = finish > -math.inf
        return reentry_tag(finish, tq is not None and tq.queued > 0, self._vclock, cost, weight,
                           known or self._served_since_idle)

    def answer_cost(self) -> float:
        """Time a dispatched request still needs to be answered: the service time plus a margin
        (a quarter of it, plus 2 ms for the reply), so deadline work is never started too late."""
        return self.service.value * 1.25 + 0.002

    def _displaceable(self, rank: int, tenant: Tenant, now: float) -> Ticket[Any] | None:
        """The queued ticket a new request of class ``rank`` may push out of a full queue: the one
        with the worst aged band, if that band is strictly worse than ``rank`` (youngest on ties).
        Aged requests are protected: a request whose band has risen to ``rank`` stays. Work of a
        tenant with a higher priority ceiling than the newcomer's is never displaced."""
        best: Ticket[Any] | None = None
        best_key: tuple[int, float] | None = None
        for tq in self._tenants.values():
            if tq.tenant.max_priority_rank < tenant.max_priority_rank:
                continue
            for dq in tq.by_class:
                if dq:
                    t = dq[-1]  # the youngest of its class has the worst band of its class
                    key = (self._band(t, now), t.enqueued)
                    if best_key is None or key > best_key:
                        best, best_key = t, key
        if best is None or best_key is None or best_key[0] <= rank:
            return None
        return best

    def has_room(self, rank: int, tenant: Tenant) -> bool:
        """Whether a request of class ``rank`` would find a place in the queue now: room, or a
        queued request it may displace."""
        return self.depth < self.settings.max_depth or self._displaceable(rank, tenant, self.clock.now()) is not None

    def retry_after(self) -> float:
        """Time to work off the current backlog: depth * S / permits (at least one service time)."""
        per_round = self.limit * max(1, self.settings.max_batch_size)
        return max(self.service.value, self.depth * self.service.value / per_round)

    # ------------------------------------------------------------------ admission
    def _tq(self, tenant: Tenant) -> _TenantQueue:
        tq = self._tenants.get(tenant.name)
        if tq is None:
            tq = _TenantQueue(tenant, [deque() for _ in range(self.settings.num_classes)])
            self._tenants[tenant.name] = tq
        elif tq.tenant is not tenant:
            tq.tenant = tenant  # the tenant's limits were reloaded: its next requests follow them
        return tq

    def _reject(self, err: SluicewayError, tenant: Tenant, priority: str) -> SluicewayError:
        self.obs.rejected(err.reason, tenant, priority)
        return err

    def precheck(self, tenant: Tenant, rank: int, priority_label: str, *, check_rate: bool = True) -> None:
        """The checks that do not depend on the queue: draining, priority ceiling, token bucket."""
        if not 0 <= rank < self.settings.num_classes:
            raise ValueError("rank out of range")
        if self.draining:
            raise self._reject(
                Draining("the server is shutting down; retry on another replica"), tenant, priority_label
            )
        if rank < tenant.max_priority_rank:
            raise self._reject(
                PriorityForbidden(f"tenant {tenant.name!r} may not use priority {priority_label!r}"),
                tenant,
                priority_label,
            )
        if check_rate:
            wait = self.rate_wait(tenant)
            if wait > 0:
                raise self._reject(rate_limited(tenant, wait), tenant, priority_label)

    def rate_wait(self, tenant: Tenant) -> float:
        """The tenant's token bucket: takes a token and returns 0.0, or returns the seconds until
        the next one (nothing taken). The one rate check: :meth:`precheck` raises on it, the data
        plane answers it from its cache of refusals without raising."""
        return self._take_token(tenant)

    def admit(
        self,
        tenant: Tenant,
        rank: int,
        payload: P,
        answer: Answer,
        *,
        priority_label: str = "",
        batch_key: Hashable = None,
        client_budget: float | None = None,
        check_rate: bool = True,
    ) -> Ticket[P]:
        """Queue a request or raise the reason it is refused. Never blocks."""
        self.precheck(tenant, rank, priority_label, check_rate=check_rate)
        now = self.clock.now()
        predicted = self.predicted_wait(rank, tenant)
        cost = self.answer_cost()
        if client_budget is not None and predicted + cost > client_budget:
            raise self._reject(
                DeadlineUnmeetable(
                    f"predicted wait {predicted:.3f}s plus service {cost:.3f}s exceeds the "
                    f"client deadline {client_budget:.3f}s"
                ),
                tenant,
                priority_label,
            )
        if self.depth == 0 and self.in_use == 0:
            self._served_since_idle = False
        tq = self._tq(tenant)
        if tenant.max_queued is not None and tq.queued >= tenant.max_queued:
            raise self._reject(
                TenantQueueFull(
                    f"tenant {tenant.name!r} already has {tq.queued} requests queued", retry_after=self.retry_after()
                ),
                tenant,
                priority_label,
            )
        if self.depth >= self.settings.max_depth:
            victim = self._displaceable(rank, tenant, now)
            if victim is None:
                raise self._reject(
                    QueueFull(f"queue full ({self.depth} waiting)", retry_after=self.retry_after()),
                    tenant,
                    priority_label,
                )
            self._remove(victim)
            self.obs.dequeued(victim, now - victim.enqueued)
            displaced = Displaced(
                "the queue is full and a higher-priority request took this one's place",
                retry_after=self.retry_after(),
            )
            self.obs.rejected(displaced.reason, victim.tenant, victim.priority_label)
            victim.resolve(error=displaced)
        deadline = now + self.settings.queue_timeout
        reason: type[SluicewayError] = QueueTimeout
        if client_budget is not None:
            client_deadline = now + client_budget - cost
            if client_deadline < deadline:
                deadline, reason = client_deadline, DeadlineExpired
        t: Ticket[P] = Ticket(
            next(self._ids), tenant, rank, priority_label, now, deadline, reason, batch_key, payload, answer
        )
        t.rows = max(1, int(self._rows_of(payload)))
        # WF2Q+: a tenant whose queue was empty re-enters at the virtual time (less the burst credit)
        start = self._reentry_tag(tq, self._estimate(tq, t.rows), tenant.weight)
        if start < self._vclock and tq.queued == 0:
            tq.credit_until = self._vclock
        tq.vfinish = start
        tq.by_class[rank].append(t)
        tq.queued += 1
        self.depth += 1
        self._class_depth[rank] += 1
        heapq.heappush(self._deadlines, (deadline, t.id, t))
        if len(self._deadlines) > 2 * self.depth + 64:
            self._deadlines = [e for e in self._deadlines if e[2].state == "queued"]
            heapq.heapify(self._deadlines)
        self.obs.enqueued(t)
        return t

    # ------------------------------------------------------------------ removal
    def _remove(self, t: Ticket[Any]) -> None:
        tq = self._tenants[t.tenant.name]
        tq.by_class[t.rank].remove(t)
        tq.queued -= 1
        self.depth -= 1
        self._class_depth[t.rank] -= 1

    def cancel(self, t: Ticket[Any], error: SluicewayError) -> bool:
        """Withdraw a queued ticket (client gone). Running tickets are not touched."""
        if t.state != "queued":
            return False
        self._remove(t)
        self.obs.dequeued(t, self.clock.now() - t.enqueued)
        self.obs.rejected(error.reason, t.tenant, t.priority_label)
        t.resolve(error=error)
        return True

    def expire(self) -> list[Ticket[P]]:
        """Answer every queued ticket whose queue-wait deadline has passed."""
        now = self.clock.now()
        out: list[Ticket[P]] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, _, t = heapq.heappop(heap)
            if t.state == "queued":
                out.append(t)
        for t in out:
            self._remove(t)
            waited = now - t.enqueued
            self.obs.dequeued(t, waited)
            cls = t.deadline_reason
            msg = (
                f"waited {waited:.3f}s in the queue (budget {self.settings.queue_timeout:.3f}s)"
                if cls is QueueTimeout
                else f"client deadline reached after {waited:.3f}s in the queue"
            )
            err = cls(msg)
            self.obs.rejected(err.reason, t.tenant, t.priority_label)
            t.resolve(error=err)
        return out

    def reject_all_queued(self, make_error: Callable[[], SluicewayError]) -> int:
        n = 0
        now = self.clock.now()
        for tq in self._tenants.values():
            for dq in tq.by_class:
                while dq:
                    t = dq.popleft()
                    tq.queued -= 1
                    self.depth -= 1
                    self._class_depth[t.rank] -= 1
                    self.obs.dequeued(t, now - t.enqueued)
                    err = make_error()
                    self.obs.rejected(err.reason, t.tenant, t.priority_label)
                    t.resolve(error=err)
                    n += 1
        return n

    # ------------------------------------------------------------------ dispatch
    def _band(self, t: Ticket[Any], now: float) -> int:
        return aged_band(t.rank, t.enqueued, now, self.settings.aging_seconds)

    def _estimate(self, tq: _TenantQueue | None, rows: int) -> float:
        """Estimated device seconds of a request of ``rows`` rows of this tenant."""
        est = tq.per_row if tq is not None and tq.per_row is not None else self.per_row
        return max(est.value, 1e-9) * rows

    def _busy_weight(self) -> float:
        """Sum of the weights of the backlogged tenants as the fluid (GPS) reference sees them: those
        with queued or running work, and those whose finish tag the virtual time has not reached
        yet (served ahead of the fluid schedule, which is still serving them)."""
        v = self._vclock
        busy = sum(tq.tenant.weight for tq in self._tenants.values() if tq.queued or tq.running or tq.vfinish > v)
        return float(busy) or 1.0

    def _select(self, now: float, accept: Callable[[Ticket[Any]], bool], n: int) -> list[Ticket[P]]:
        """Up to ``n`` queued tickets that ``accept`` takes, in dispatch order (see the module
        docstring), as if each were dispatched in turn: tenants' finish tags and concurrency caps
        advance along, and so does the virtual time. Looks only at the first accepted ticket of every
        (tenant, class) queue at each step: no sort of the queue (O(tenants x classes) per pick)."""
        heads: dict[tuple[str, int], tuple[Ticket[P], Any]] = {}
        vfinish: dict[str, float] = {}
        room: dict[str, int | None] = {}
        for name, tq in self._tenants.items():
            if tq.queued == 0:
                continue
            cap = self._cap(tq.tenant)
            room[name] = None if cap is None else cap - tq.running
            if room[name] is not None and room[name] <= 0:  # type: ignore[operator]
                continue
            vfinish[name] = tq.vfinish
            for c, dq in enumerate(tq.by_class):
                if dq:
                    it = (t for t in dq if accept(t))
                    first = next(it, None)
                    if first is not None:
                        heads[(name, c)] = (first, it)
        out: list[Ticket[P]] = []
        vclock = self._vclock
        busy = self._busy_weight()
        while heads and len(out) < n:
            # aging picks the class, WF2Q+ the tenant within it (sluiceway_core.fairshare.pick)
            cand_heads = []
            for (name, c), (t, _) in heads.items():
                tq = self._tenants[name]
                cand_heads.append(Head(name, c, self._band(t, now), vfinish[name], self._estimate(tq, t.rows),
                                       tq.tenant.weight, t.enqueued, t.id))
            chosen = pick(cand_heads, vclock)
            assert chosen is not None
            best_key = (chosen.head.tenant, chosen.head.cls)
            t, it = heads[best_key]
            out.append(t)
            name = best_key[0]
            tq = self._tenants[name]
            start = vfinish[name]
            vfinish[name] = chosen.finish
            vclock = chosen.vnow + self._uncredited(tq, start, chosen.head.cost) / busy
            left = room[name]
            if left is not None:
                room[name] = left - 1
                if left - 1 <= 0:
                    for c in range(self.settings.num_classes):
                        heads.pop((name, c), None)
                    continue
            following = next(it, None)
            if following is None:
                del heads[best_key]
            else:
                heads[best_key] = (following, it)
        return out

    @staticmethod
    def _uncredited(tq: _TenantQueue, start: float, cost: float) -> float:
        """The part of a request's cost that the virtual time advances by: all of it, except the part
        of its tag interval ``[start, start + cost/weight]`` that lies below the virtual time at
        which its tenant re-entered on burst credit. That part is served on virtual time that has
        already passed; counting it would push the virtual time ahead of every backlogged tenant,
        a little more at each re-entry, and their credit would grow without bound."""
        return uncredited(start, cost, tq.tenant.weight, tq.credit_until)

    def _charge(self, t: Ticket[Any], busy: float) -> None:
        """Dispatching ``t`` (chosen by :meth:`_select`, so eligible): its tenant's tag advances by
        its estimated cost over its weight, the virtual time by that cost over the backlogged weight
        ``busy`` (from at least the tenant's start tag: WF2Q+'s ``max(V, min S)``)."""
        tq = self._tenants[t.tenant.name]
        start = tq.vfinish
        t.cost = self._estimate(tq, t.rows)
        tq.vfinish = start + t.cost / t.tenant.weight
        self._vclock = max(self._vclock, start) + self._uncredited(tq, start, t.cost) / busy

    def next_wakeup(self) -> float | None:
        """The earliest time at which :meth:`expire` or a deferred batch has work to do."""
        heap = self._deadlines
        while heap and heap[0][2].state != "queued":  # drop entries of dispatched/answered tickets
            heapq.heappop(heap)
        times = [heap[0][0]] if heap else []
        if self._deferred_until is not None and self.in_use < self.limit:
            times.append(self._deferred_until)
        return min(times) if times else None

    def next_batch(self) -> Batch[P] | None:
        """Take a permit and the next batch to run, or None (no permit, nothing eligible, or every
        eligible batch still filling within ``max_batch_wait``). A batch that is filling holds back
        only its own batch key: other keys go on the idle permits meanwhile."""
        self._deferred_until = None
        if self.in_use >= self.limit or self.depth == 0:
            return None
        now = self.clock.now()
        cap = self.settings.max_batch_size
        filling: set[Hashable] = set()
        while True:
            first = self._select(now, lambda t: t.batch_key not in filling, 1)
            if not first:
                return None
            head = first[0]
            members = first
            if cap > 1:
                key = head.batch_key

                def same_key(t: Ticket[Any], key: Hashable = key) -> bool:
                    return t.batch_key == key

                members = self._select(now, same_key, cap)
                # never hold a batch so long that a member's queue deadline passes first
                latest = min(m.deadline for m in members) - self.service.value
                fill_until = min(head.enqueued + self.settings.max_batch_wait, latest)
                if len(members) < cap and now < fill_until and not self.draining:
                    # let the batch fill a little longer; meanwhile look at the other keys
                    if self._deferred_until is None or fill_until < self._deferred_until:
                        self._deferred_until = fill_until
                    filling.add(key)
                    continue
            break
        busy = self._busy_weight()  # the members' tenants are backlogged before and after
        for t in members:
            self._remove(t)
            mtq = self._tenants[t.tenant.name]
            mtq.running += 1
            self._charge(t, busy)
            t.state = "running"
            t.dispatched = now
            self.obs.dequeued(t, now - t.enqueued)
        self.in_use += 1
        self._served_since_idle = True
        self.obs.permits(self.limit, self.in_use)
        self.obs.batch(len(members))
        return Batch(members, head.batch_key, now)

    def finish(self, batch: Batch[P], service_seconds: float | None) -> None:
        """Release the batch's permit (call when the device work has really ended)."""
        self.in_use -= 1
        busy = self._busy_weight()  # the batch's tenants still count: the device served them until now
        for t in batch.tickets:
            self._tenants[t.tenant.name].running -= 1
        if service_seconds is not None:
            self.service.observe(service_seconds)
            self.obs.served(service_seconds)
            # charge each tenant what its requests really took: the batch time split by rows
            per_row = service_seconds / sum(t.rows for t in batch.tickets)
            self.per_row.observe(per_row)
            for t in batch.tickets:
                tq = self._tenants[t.tenant.name]
                if tq.per_row is None:
                    tq.per_row = _ServiceEstimate(per_row)
                tq.per_row.observe(per_row)
                tq.vfinish += (per_row * t.rows - t.cost) / t.tenant.weight
                self._vclock += (per_row * t.rows - t.cost) / busy
        self.obs.permits(self.limit, self.in_use)

    def shrink(self) -> int:
        """After a device OOM: one permit fewer, never below 1. Returns the new limit."""
        self.limit = max(1, self.limit - 1)
        self.obs.permits(self.limit, self.in_use)
        return self.limit

    def tenant_load(self) -> dict[str, tuple[int, int]]:
        """(queued, running) per tenant with either: the demand a quota lease reports."""
        return {n: (tq.queued, tq.running) for n, tq in self._tenants.items() if tq.queued or tq.running}

    @property
    def idle(self) -> bool:
        return self.depth == 0 and self.in_use == 0
