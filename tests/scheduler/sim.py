"""A discrete-event driver for :class:`AdmissionCore`: manual clock, no threads, no HTTP."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

from sluiceway_core.config import TenantLimits
from sluiceway_pod.admission import AdmissionCore, AdmissionSettings, Batch, Ticket
from sluiceway_pod.clock import ManualClock
from sluiceway_pod.errors import SluicewayError
from sluiceway_pod.tenancy import Tenant

_HAS_ROWS = "rows_of" in AdmissionCore.__init__.__code__.co_varnames


def tenant(
    name: str,
    weight: int = 1,
    max_concurrent: int | None = None,
    max_queued: int | None = None,
    max_priority_rank: int = 0,
) -> Tenant:
    return Tenant(name, name, None, None, max_concurrent, max_queued, weight, max_priority_rank)


@dataclass(frozen=True)
class Arrival:
    at: float
    tenant: Tenant
    rank: int
    key: Any = None
    budget: float | None = None
    rows: int = 1
    cost: float | None = None  # device seconds this request takes (the sim's cost_service sums them)


@dataclass
class Record:
    arrival: Arrival
    ticket: Ticket[Any] | None = None
    refused: SluicewayError | None = None
    answers: list[tuple[Any, SluicewayError | None]] = field(default_factory=list)
    dispatched_at: float | None = None


@dataclass
class Sim:
    settings: AdmissionSettings
    service: Any  # callable(batch) -> seconds
    clock: ManualClock = field(default_factory=ManualClock)
    records: list[Record] = field(default_factory=list)
    max_in_use: int = 0
    max_depth: int = 0
    dispatch_order: list[Record] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    batches: list[list[Record]] = field(default_factory=list)
    device: dict[str, float] = field(default_factory=dict)  # device seconds consumed per tenant
    spans: list[tuple[float, float, str, float]] = field(default_factory=list)  # (start, end, tenant, part)

    def __post_init__(self) -> None:
        self.core: AdmissionCore[Record] = AdmissionCore(
            self.settings, self.clock, **({"rows_of": lambda rec: rec.arrival.rows} if _HAS_ROWS else {})
        )

    def _check(self) -> None:
        c = self.core
        if c.in_use > c.limit:
            self.violations.append(f"in_use {c.in_use} > limit {c.limit}")
        if c.depth > self.settings.max_depth:
            self.violations.append(f"depth {c.depth} > {self.settings.max_depth}")
        for tq in c._tenants.values():
            mq = tq.tenant.max_queued
            if mq is not None and tq.queued > mq:
                self.violations.append(f"tenant {tq.tenant.name} queued {tq.queued} > {mq}")
            mc = tq.tenant.max_concurrent
            if mc is not None and tq.running > mc:
                self.violations.append(f"tenant {tq.tenant.name} running {tq.running} > {mc}")
        self.max_in_use = max(self.max_in_use, c.in_use)
        self.max_depth = max(self.max_depth, c.depth)

    def run(self, arrivals: list[Arrival], until: float | None = None) -> None:
        seq = itertools.count()
        events: list[tuple[float, int, str, Any]] = [(a.at, next(seq), "arrive", a) for a in arrivals]
        heapq.heapify(events)
        core = self.core
        while events or core.depth or core.in_use:
            wake = core.next_wakeup()
            nxt = events[0][0] if events else None
            if nxt is None and wake is None:
                break
            t = min(x for x in (nxt, wake) if x is not None)
            if until is not None and t > until:
                break
            if t > self.clock.now():
                self.clock.advance(t - self.clock.now())
            while events and events[0][0] <= self.clock.now():
                _, _, kind, obj = heapq.heappop(events)
                if kind == "arrive":
                    self._arrive(obj)
                else:
                    self._complete(obj)
            core.expire()
            self._check()
            while (batch := core.next_batch()) is not None:
                now = self.clock.now()
                self.batches.append([tk.payload for tk in batch.tickets])
                for tk in batch.tickets:
                    tk.payload.dispatched_at = now
                    self.dispatch_order.append(tk.payload)
                took = self.service(batch)
                total_rows = sum(tk.payload.arrival.rows for tk in batch.tickets)
                for tk in batch.tickets:
                    name = tk.payload.arrival.tenant.name
                    part = tk.payload.arrival.rows / total_rows
                    self.device[name] = self.device.get(name, 0.0) + took * part
                    self.spans.append((now, now + took, name, part))
                heapq.heappush(events, (now + took, next(seq), "complete", batch))
                self._check()

    def device_until(self, t: float) -> dict[str, float]:
        """Device seconds each tenant had used by time ``t`` (a batch running at ``t`` counts in part)."""
        out: dict[str, float] = {}
        for start, end, name, part in self.spans:
            if start < t:
                out[name] = out.get(name, 0.0) + (min(end, t) - start) * part
        return out

    def _arrive(self, a: Arrival) -> None:
        rec = Record(a)
        self.records.append(rec)

        def answer(result: Any, error: SluicewayError | None) -> None:
            rec.answers.append((result, error))

        try:
            rec.ticket = self.core.admit(
                a.tenant, a.rank, rec, answer, priority_label=str(a.rank), batch_key=a.key, client_budget=a.budget
            )
        except SluicewayError as e:
            rec.refused = e

    def _complete(self, batch: Batch[Record]) -> None:
        for tk in batch.tickets:
            tk.resolve(result="ok")
        self.core.finish(batch, self.clock.now() - batch.started)


def cost_service(batch: Batch[Record]) -> float:
    """Service time of a batch: the sum of its members' declared costs."""
    return sum(tk.payload.arrival.cost or 0.0 for tk in batch.tickets)


def settings(**kw: Any) -> AdmissionSettings:
    base: dict[str, Any] = dict(
        permits=1,
        max_depth=1000,
        queue_timeout=1e9,
        num_classes=3,
        aging_seconds=1.0,
        max_batch_size=1,
        max_batch_wait=0.0,
        initial_service_time=0.01,
    )
    base.update(kw)
    return AdmissionSettings(**base)


_ = TenantLimits  # re-exported for tests that build registries
