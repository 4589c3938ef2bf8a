"""Calibration: the fluid replica model against the pod's real admission core, request by request.

:func:`admission_core_run` drives one :class:`~sluiceway_pod.admission.AdmissionCore` (the code
the pod runs) with Poisson arrivals and exponential service times on a manual clock, and counts
what the pod would answer. :func:`fluid_run` runs the simulator's :class:`FluidQueue` for the
same replica and load.
``tests/scalesim/test_scalesim.py::test_fluid_model_agrees_with_the_pods_admission_core``
checks that they agree.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
from sluiceway_pod.admission import AdmissionCore, AdmissionSettings, Batch
from sluiceway_pod.clock import ManualClock
from sluiceway_pod.errors import SluicewayError
from sluiceway_pod.tenancy import Tenant

from .model import FluidQueue, ServiceModel

__all__ = ["Outcome", "admission_core_run", "fluid_run", "poisson_times"]


@dataclass(frozen=True)
class Outcome:
    offered: int
    served: int
    refused: int  # 429 (queue full)
    expired: int  # 503 (queue timeout)

    @property
    def served_share(self) -> float:
        return self.served / self.offered if self.offered else 1.0

    @property
    def refused_share(self) -> float:
        return (self.refused + self.expired) / self.offered if self.offered else 0.0


def poisson_times(rate: float, seconds: float, seed: int) -> list[float]:
    """Arrival instants of a Poisson process of ``rate`` per second over ``seconds``."""
    rng = np.random.default_rng(seed)
    times: list[float] = []
    t = 0.0
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t >= seconds:
            return times
        times.append(t)


def admission_core_run(model: ServiceModel, times: list[float], seed: int) -> Outcome:
    """One replica fed the arrival instants ``times``, exponential service times (seeded)."""
    rng = np.random.default_rng(seed)
    clock = ManualClock()
    settings = AdmissionSettings(
        permits=model.permits,
        max_depth=model.queue_per_replica,
        queue_timeout=model.deadline,
        num_classes=1,
        aging_seconds=1.0,
        initial_service_time=model.service_time,
    )
    core: AdmissionCore[int] = AdmissionCore(settings, clock)
    anyone = Tenant("t", "t", None, None, None, None, 1, 0)
    seq = itertools.count()
    events: list[tuple[float, int, str, Any]] = [(t, next(seq), "arrive", None) for t in times]
    heapq.heapify(events)
    offered = served = refused = expired = 0
    answers: dict[int, SluicewayError | None] = {}

    def answer_for(i: int) -> Any:
        def answer(result: Any, error: SluicewayError | None) -> None:
            answers[i] = error

        return answer

    while events or core.depth or core.in_use:
        wake = core.next_wakeup()
        nxt = events[0][0] if events else None
        if nxt is None and wake is None:
            break
        when = min(x for x in (nxt, wake) if x is not None)
        if when > clock.now():
            clock.advance(when - clock.now())
        while events and events[0][0] <= clock.now():
            _, i, kind, obj = heapq.heappop(events)
            if kind == "arrive":
                offered += 1
                try:
                    core.admit(anyone, 0, i, answer_for(i))
                except SluicewayError:
                    refused += 1
            else:
                batch: Batch[int] = obj
                for tk in batch.tickets:
                    tk.resolve(result="ok")
                core.finish(batch, clock.now() - batch.started)
        core.expire()
        while (started := core.next_batch()) is not None:
            duration = float(rng.exponential(model.service_time))
            heapq.heappush(events, (clock.now() + duration, next(seq), "done", started))
    for err in answers.values():
        if err is None:
            served += 1
        else:
            expired += 1
    return Outcome(offered, served, refused, expired)


def fluid_run(model: ServiceModel, times: list[float], rate: float) -> Outcome:
    """The simulator's model of the same replica, fed the same arrivals counted per second."""
    seconds = int(max(times)) + 1 if times else 0
    counts = np.bincount(np.asarray(times, dtype=float).astype(int), minlength=seconds)
    queue = FluidQueue(model)
    offered = served = refused = expired = 0.0
    for arrived in counts.astype(float):
        r = queue.step(float(arrived), 1, rate)
        offered += arrived
        served += r.served
        refused += r.refused
        expired += r.expired
    return Outcome(round(offered), round(served), round(refused), round(expired))
