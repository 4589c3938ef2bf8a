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
     ``maxConcurrent``), pick by start-time fair queueing: each ticket got the tag
     ``max(tenant's previous finish tag, virtual time)`` at admission (finish = start + 1/weight),
     and the virtual time is the tag of the latest dispatch. The smallest tag goes (oldest on ties):
     well-behaved tenants are served in arrival order, a flooding tenant's tags run ahead.

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

#: Fair-queueing credit, in requests, that a tenant below its share may bank: its start tags may lag
#: the virtual time by up to ``BURST_CREDIT / weight``, so a light tenant's short burst is served
#: in arrival order instead of being interleaved with a backlogged tenant's work.
BURST_CREDIT = 3.0



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
    vstart: float = 0.0  # start-time fair queueing tag, set at admission

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
    last_finish: float = 0.0  # SFQ finish tag of the tenant's last admitted request


@dataclass
class _ServiceEstimate:
    """EWMA of the service time of one batch (seconds)."""

    value: float
    alpha: float = 0.2
    samples: int = 0

    def observe(self, seconds: float) -> None:
        self.samples += 1
        self.value = seconds if self.samples == 1 else self.alpha * seconds + (1 - self.alpha) * self.value


class AdmissionCore(Generic[P]):
    def __init__(
        self,
        settings: AdmissionSettings,
        clock: Clock,
        *,
        observer: Observer | None = None,
        take_token: Callable[[Tenant], float] | None = None,
    ) -> None:
        if settings.permits < 1 or settings.max_depth < 1 or settings.num_classes < 1:
            raise ValueError("permits, max_depth and num_classes must be >= 1")
        self.settings = settings
        self.clock = clock
        self.obs: Observer = observer or NullObserver()
        self._take_token = take_token or (lambda _t: 0.0)
        self.limit = settings.permits
        self.in_use = 0
        self.depth = 0
        self.draining = False
        self.service = _ServiceEstimate(settings.initial_service_time)
        self._tenants: dict[str, _TenantQueue] = {}
        self._ids = itertools.count(1)
        self._vclock = 0.0  # SFQ virtual time: the start tag of the latest dispatched request
        self._deferred_until: float | None = None  # a batch is filling until then
        # (deadline, id, ticket) of queued tickets; entries of tickets that left the queue are
        # dropped lazily, and the heap is rebuilt when they outnumber the live ones.
        self._deadlines: list[tuple[float, int, Ticket[P]]] = []
        self.obs.permits(self.limit, self.in_use)

    # ------------------------------------------------------------------ predictions
    def predicted_wait(self) -> float:
        """Expected queue wait of a request arriving now (seconds)."""
        if self.depth == 0 and self.in_use < self.limit:
            return 0.0
        per_round = self.limit * max(1, self.settings.max_batch_size)
        return math.ceil((self.depth + 1) / per_round) * self.service.value

    def answer_cost(self) -> float:
        """Time a dispatched request still needs to be answered: the service time plus a margin
        (a quarter of it, plus 2 ms for the reply), so deadline work is never started too late."""
        return self.service.value * 1.25 + 0.002

    def _displaceable(self, rank: int, now: float) -> Ticket[Any] | None:
        """The queued ticket a new request of class ``rank`` may push out of a full queue: the one
        with the worst aged band, if that band is strictly worse than ``rank`` (youngest on ties).
        Aged requests are protected: a request whose band has risen to ``rank`` stays."""
        best: Ticket[Any] | None = None
        best_key: tuple[int, float] | None = None
        for tq in self._tenants.values():
            for dq in tq.by_class:
                if dq:
                    t = dq[-1]  # the youngest of its class has the worst band of its class
                    key = (self._band(t, now), t.enqueued)
                    if best_key is None or key > best_key:
                        best, best_key = t, key
        if best is None or best_key is None or best_key[0] <= rank:
            return None
        return best

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
            wait = self._take_token(tenant)
            if wait > 0:
                raise self._reject(
                    RateLimited(f"tenant {tenant.name!r} is over its request rate", retry_after=wait),
                    tenant,
                    priority_label,
                )

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
        predicted = self.predicted_wait()
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
            victim = self._displaceable(rank, now)
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
        # start-time fair queueing: tag = max(tenant's last finish tag, virtual time now)
        t.vstart = max(tq.last_finish, self._vclock - BURST_CREDIT / tenant.weight)
        tq.last_finish = t.vstart + 1.0 / tenant.weight
        tq.by_class[rank].append(t)
        tq.queued += 1
        self.depth += 1
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
                    self.obs.dequeued(t, now - t.enqueued)
                    err = make_error()
                    self.obs.rejected(err.reason, t.tenant, t.priority_label)
                    t.resolve(error=err)
                    n += 1
        return n

    # ------------------------------------------------------------------ dispatch
    def _band(self, t: Ticket[Any], now: float) -> int:
        return t.rank - math.floor((now - t.enqueued) / self.settings.aging_seconds)

    def _eligible(self, tq: _TenantQueue) -> bool:
        cap = tq.tenant.max_concurrent
        return tq.queued > 0 and (cap is None or tq.running < cap)

    def _pick_head(self, now: float) -> tuple[_TenantQueue, int] | None:
        best_band: int | None = None
        best_class = 0
        eligible = [tq for tq in self._tenants.values() if self._eligible(tq)]
        if not eligible:
            return None
        for tq in eligible:
            for c, dq in enumerate(tq.by_class):
                if dq:
                    b = self._band(dq[0], now)
                    if best_band is None or b < best_band or (b == best_band and c < best_class):
                        best_band, best_class = b, c
        candidates = [tq for tq in eligible if tq.by_class[best_class]]
        tq = min(
            candidates,
            key=lambda q: (q.by_class[best_class][0].vstart, q.by_class[best_class][0].enqueued),
        )
        return tq, best_class

    def _charge(self, t: Ticket[Any]) -> None:
        self._vclock = max(self._vclock, t.vstart)

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
        """Take a permit and the next batch to run, or None (no permit, nothing eligible, or a
        batch still filling within ``max_batch_wait``)."""
        self._deferred_until = None
        if self.in_use >= self.limit or self.depth == 0:
            return None
        now = self.clock.now()
        picked = self._pick_head(now)
        if picked is None:
            return None
        tq, cls = picked
        head = tq.by_class[cls][0]
        members = [head]
        cap = self.settings.max_batch_size
        if cap > 1:
            members = self._fill(head, cap, now)
            # never hold a batch so long that a member's queue deadline passes first
            latest = min(m.deadline for m in members) - self.service.value
            fill_until = min(head.enqueued + self.settings.max_batch_wait, latest)
            if len(members) < cap and now < fill_until and not self.draining:
                self._deferred_until = fill_until  # let the batch fill a little longer
                return None
        for t in members:
            self._remove(t)
            mtq = self._tenants[t.tenant.name]
            mtq.running += 1
            self._charge(t)
            t.state = "running"
            self.obs.dequeued(t, now - t.enqueued)
        self.in_use += 1
        self.obs.permits(self.limit, self.in_use)
        self.obs.batch(len(members))
        return Batch(members, head.batch_key, now)

    def _fill(self, head: Ticket[P], cap: int, now: float) -> list[Ticket[P]]:
        """The head plus compatible queued tickets in (aged band, arrival) order, respecting caps."""
        running = {name: tq.running for name, tq in self._tenants.items()}
        running[head.tenant.name] += 1
        pool = [
            t
            for tq in self._tenants.values()
            for dq in tq.by_class
            for t in dq
            if t is not head and t.batch_key == head.batch_key
        ]
        pool.sort(key=lambda t: (self._band(t, now), t.enqueued))
        members = [head]
        for t in pool:
            if len(members) >= cap:
                break
            mc = t.tenant.max_concurrent
            if mc is not None and running[t.tenant.name] >= mc:
                continue
            running[t.tenant.name] += 1
            members.append(t)
        return members

    def finish(self, batch: Batch[P], service_seconds: float | None) -> None:
        """Release the batch's permit (call when the device work has really ended)."""
        self.in_use -= 1
        for t in batch.tickets:
            self._tenants[t.tenant.name].running -= 1
        if service_seconds is not None:
            self.service.observe(service_seconds)
            self.obs.served(service_seconds)
        self.obs.permits(self.limit, self.in_use)

    def shrink(self) -> int:
        """After a device OOM: one permit fewer, never below 1. Returns the new limit."""
        self.limit = max(1, self.limit - 1)
        self.obs.permits(self.limit, self.in_use)
        return self.limit

    @property
    def idle(self) -> bool:
        return self.depth == 0 and self.in_use == 0
