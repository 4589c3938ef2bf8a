"""Capacity planning with M/M/c (Erlang C) and the N*T/S queue bound. Pure, no I/O.

Given an arrival rate, a measured service time and a target queue-wait p95:

* **servers** (GPU permits over the whole fleet) = the smallest ``c`` whose M/M/c wait p95 meets the
  target (:func:`sluiceway_core.queueing.min_servers_for_wait`);
* **replicas** = ``ceil(servers / concurrency)`` for a given concurrency per replica, or
  **concurrency** = ``ceil(servers / replicas)`` for a given replica count;
* **queue bound per replica** = N*T/S with N = concurrency per replica (what ``--max-queue auto``
  gives the pod).

Then, for 80 %, 100 % and 120 % of the arrival rate, with the fleet held fixed: the utilisation,
the probability of waiting (Erlang C), the mean and p95 wait (M/M/c, unbounded queue: an upper
estimate, since a bounded queue rejects instead of waiting longer) and the rejected share (M/M/c/K
with K = servers + replicas x queue bound: one pooled queue, which is optimistic when the load
balancer spreads requests unevenly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluiceway_core.queueing import min_servers_for_wait, mmc_metrics, mmck_rejection, queue_bound

__all__ = ["LOAD_FACTORS", "LoadPoint", "Plan", "plan"]

LOAD_FACTORS = (0.8, 1.0, 1.2)


@dataclass(frozen=True)
class LoadPoint:
    load_factor: float
    arrival_rate: float
    utilisation: float
    wait_probability: float
    mean_wait: float
    wait_p95: float
    rejection_share: float
    meets_target: bool


@dataclass(frozen=True)
class Plan:
    arrival_rate: float
    service_time: float
    target_wait_p95: float
    servers_needed: int
    replicas: int
    concurrency: int
    queue_bound: int
    points: tuple[LoadPoint, ...]

    @property
    def nominal(self) -> LoadPoint:
        return next(p for p in self.points if p.load_factor == 1.0)


def evaluate(
    servers: int, capacity: int, arrival_rate: float, service_time: float, target: float, factor: float
) -> LoadPoint:
    rate = arrival_rate * factor
    m = mmc_metrics(servers, rate, service_time)
    return LoadPoint(
        load_factor=factor,
        arrival_rate=rate,
        utilisation=m.utilisation,
        wait_probability=m.wait_probability,
        mean_wait=m.mean_wait,
        wait_p95=m.wait_p95,
        rejection_share=mmck_rejection(servers, capacity, rate, service_time),
        meets_target=m.wait_p95 <= target,
    )


def plan(
    target_wait_p95: float,
    arrival_rate: float,
    service_time: float,
    *,
    concurrency: int | None = None,
    replicas: int | None = None,
    max_servers: int = 10_000,
) -> Plan:
    """Size a fleet. With neither ``concurrency`` nor ``replicas``, concurrency is 1 per replica.

    With both, nothing is sized: the given fleet is evaluated (``meets_target`` tells whether it
    is enough). Raises ValueError on bad input or when no fleet up to ``max_servers`` is enough.
    """
    if not target_wait_p95 > 0 or not service_time > 0 or not arrival_rate >= 0:
        raise ValueError("target wait p95 > 0, service time > 0 and arrival rate >= 0 are required")
    if concurrency is not None and concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if replicas is not None and replicas < 1:
        raise ValueError("replicas must be >= 1")
    needed = min_servers_for_wait(arrival_rate, service_time, target_wait_p95, max_servers=max_servers)
    if replicas is None:
        conc = concurrency or 1
        reps = math.ceil(needed / conc)
    elif concurrency is None:
        reps = replicas
        conc = math.ceil(needed / reps)
    else:
        reps, conc = replicas, concurrency
    servers = reps * conc
    bound = queue_bound(conc, target_wait_p95, service_time)
    capacity = servers + reps * bound
    points = tuple(
        evaluate(servers, capacity, arrival_rate, service_time, target_wait_p95, f) for f in LOAD_FACTORS
    )
    return Plan(
        arrival_rate=arrival_rate,
        service_time=service_time,
        target_wait_p95=target_wait_p95,
        servers_needed=needed,
        replicas=reps,
        concurrency=conc,
        queue_bound=bound,
        points=points,
    )
