"""Queueing maths shared by the pod (``--max-queue auto``), the planner and the operator's hints.

Pure functions, no I/O, no clock. Times are in seconds, rates per second.

* :func:`queue_bound` is the N*T/S rule: with N servers, a service time S and a tolerable wait T,
  a queue longer than N*T/S holds requests that will wait longer than T anyway.
* :func:`erlang_c` and :func:`mmc_metrics` are the M/M/c model (Poisson arrivals, exponential
  service, c servers): the probability that an arrival waits, the mean and a quantile of the wait.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def queue_bound(servers: int, target_wait: float, service_time: float, *, lo: int = 1, hi: int = 10_000) -> int:
    """N*T/S, rounded down and clamped to ``[lo, hi]``."""
    if servers < 1 or target_wait <= 0 or service_time <= 0:
        raise ValueError("servers >= 1, target_wait > 0 and service_time > 0 are required")
    return max(lo, min(hi, math.floor(servers * target_wait / service_time)))


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability that an arrival must wait in M/M/c with ``offered_load`` = lambda/mu Erlangs.

    Returns 1.0 when the system is unstable (offered_load >= servers). Computed with the stable
    Erlang-B recursion, so it works for hundreds of servers.
    """
    if servers < 1:
        raise ValueError("servers must be >= 1")
    if offered_load <= 0:
        return 0.0
    if offered_load >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = offered_load * b / (k + offered_load * b)
    rho = offered_load / servers
    return b / (1 - rho + rho * b)


@dataclass(frozen=True)
class MMcMetrics:
    servers: int
    arrival_rate: float
    service_time: float
    utilisation: float
    wait_probability: float
    mean_wait: float
    wait_p95: float
    stable: bool


def wait_quantile(servers: int, arrival_rate: float, service_time: float, q: float) -> float:
    """The q-quantile of the queue wait in M/M/c (``inf`` when unstable).

    P(W > t) = C * exp(-(c*mu - lambda) * t), so t_q = ln(C / (1-q)) / (c*mu - lambda), or 0 when
    C <= 1-q.
    """
    mu = 1.0 / service_time
    load = arrival_rate * service_time
    if load >= servers:
        return math.inf
    c = erlang_c(servers, load)
    if c <= 1 - q:
        return 0.0
    return math.log(c / (1 - q)) / (servers * mu - arrival_rate)


def mmc_metrics(servers: int, arrival_rate: float, service_time: float) -> MMcMetrics:
    if service_time <= 0 or arrival_rate < 0:
        raise ValueError("service_time > 0 and arrival_rate >= 0 are required")
    load = arrival_rate * service_time
    rho = load / servers
    stable = load < servers
    c = erlang_c(servers, load)
    if stable:
        mean_wait = c / (servers / service_time - arrival_rate) if arrival_rate > 0 else 0.0
    else:
        mean_wait = math.inf
    return MMcMetrics(
        servers=servers,
        arrival_rate=arrival_rate,
        service_time=service_time,
        utilisation=rho,
        wait_probability=c,
        mean_wait=mean_wait,
        wait_p95=wait_quantile(servers, arrival_rate, service_time, 0.95),
        stable=stable,
    )


def mmck_rejection(servers: int, capacity: int, arrival_rate: float, service_time: float) -> float:
    """Blocking probability of M/M/c/K (K = servers + queue bound): the share rejected as queue-full."""
    if capacity < servers:
        raise ValueError("capacity must be >= servers")
    a = arrival_rate * service_time
    if a == 0:
        return 0.0
    # p_n proportional to a^n/n! for n <= c, a^c/c! * (a/c)^(n-c) above; use logs for stability.
    logs = []
    for n in range(capacity + 1):
        if n <= servers:
            logs.append(n * math.log(a) - math.lgamma(n + 1))
        else:
            logs.append(servers * math.log(a) - math.lgamma(servers + 1) + (n - servers) * math.log(a / servers))
    m = max(logs)
    total = sum(math.exp(x - m) for x in logs)
    return math.exp(logs[-1] - m) / total


def min_servers_for_wait(
    arrival_rate: float, service_time: float, target_p95: float, *, max_servers: int = 10_000
) -> int:
    """Smallest c whose M/M/c wait p95 is within ``target_p95``."""
    c = max(1, math.floor(arrival_rate * service_time) + 1)
    while c <= max_servers:
        if wait_quantile(c, arrival_rate, service_time, 0.95) <= target_p95:
            return c
        c += 1
    raise ValueError("no server count up to max_servers meets the target")
