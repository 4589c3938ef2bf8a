"""The pod's scheduler alone, in simulated time: benchmarks (f) and (g) without HTTP or CPU noise.

The HTTP benchmarks (:mod:`bench.fairness`) measure the whole pod on a real, shared machine; their
tails mix the scheduling policy with event-loop and CPU effects. This driver runs the pod's own
:class:`~sluiceway_pod.admission.AdmissionCore` and :class:`~sluiceway_pod.tenancy.TenantRegistry`
(token buckets, fair share, priorities with aging, queue bound) against a
:class:`~sluiceway_pod.clock.ManualClock`, with seeded Poisson arrivals and an exact service time,
so every number is the policy's and is reproducible from the seed. A FIFO reference (every stream
as one tenant and one class, same queue bound) shows what the policy adds.

Concurrency model: none, a single-threaded discrete-event loop: the next event (arrival, end of a
service, or the core's next deadline) moves the clock; after each one the core expires what is due
and dispatches while a permit is free.

(h) Device-time shares: 4-row against 1-row requests at the same rate, each tenant alone wanting
    more than half the device; the pod's split of device time against FIFO's.

    python -m bench.sched_sim                 # 120 s of simulated time per scenario, < 10 s wall
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sluiceway_core.config import TenantsConfig
from sluiceway_pod.admission import AdmissionCore, AdmissionSettings, Batch
from sluiceway_pod.clock import ManualClock
from sluiceway_pod.errors import SluicewayError
from sluiceway_pod.tenancy import TenantRegistry, TokenBucket

from .common import fmt, save_results, table
from .loadgen import percentile

CLASSES = ["critical", "standard", "batch"]


@dataclass(frozen=True)
class SimStream:
    name: str
    rate: float
    tenant: str
    priority: str = "standard"
    prelimit: tuple[float, int] | None = None  # a token bucket (rate, burst) applied before the pod
    rows: int = 1  # rows per request: with ``per_row`` its device time is rows x per_row


@dataclass
class Outcome:
    waits: list[float] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    offered: int = 0
    device: float = 0.0  # device seconds of its dispatched requests


def simulate(
    streams: list[SimStream],
    tenants: dict[str, Any],
    *,
    service: float,
    horizon: float,
    seed: int,
    max_depth: int,
    queue_timeout: float = 5.0,
    aging: float = 1.0,
    per_row: float | None = None,
) -> dict[str, Outcome]:
    """Run the pod's admission core for ``horizon`` simulated seconds; one :class:`Outcome` per stream."""
    clock = ManualClock()
    registry = TenantRegistry(TenantsConfig.model_validate(tenants), CLASSES, clock, default_priority="standard")
    core: AdmissionCore[str] = AdmissionCore(
        AdmissionSettings(permits=1, max_depth=max_depth, queue_timeout=queue_timeout,
                          num_classes=len(CLASSES), aging_seconds=aging, initial_service_time=service),
        clock, take_token=registry.take_token, rows_of=lambda name: rows[name])
    rows = {s.name: s.rows for s in streams}
    out = {s.name: Outcome() for s in streams}
    arrivals: list[tuple[float, int]] = []
    for i, s in enumerate(streams):
        rng = random.Random(seed * 7919 + i)
        t = rng.expovariate(s.rate)
        while t < horizon:
            arrivals.append((t, i))
            t += rng.expovariate(s.rate)
    heapq.heapify(arrivals)
    running: list[tuple[float, int, Batch[str], float]] = []  # (end time, id, batch, device seconds)
    enq: dict[int, float] = {}
    pre = {i: TokenBucket(s.prelimit[0], s.prelimit[1], clock) for i, s in enumerate(streams) if s.prelimit}

    def refused(name: str) -> Any:
        def answer(_result: Any, error: SluicewayError | None) -> None:
            if error is not None:
                out[name].refused[error.reason] += 1
        return answer

    while arrivals or running or core.depth:
        t_arr = arrivals[0][0] if arrivals else math.inf
        t_end = running[0][0] if running else math.inf
        t_exp = core.next_wakeup() or math.inf
        now = min(t_arr, t_end, t_exp)
        if now == math.inf:
            break
        clock.advance(max(0.0, now - clock.now()))
        if t_end == now:
            _, _, done, took = heapq.heappop(running)
            core.finish(done, took)
        elif t_arr == now:
            _, i = heapq.heappop(arrivals)
            s = streams[i]
            out[s.name].offered += 1
            if i in pre and pre[i].try_take() > 0:
                out[s.name].refused["rate_limited"] += 1
                continue
            try:
                ticket = core.admit(registry.tenant(s.tenant), CLASSES.index(s.priority), s.name,
                                    refused(s.name), priority_label=s.priority)
                enq[ticket.id] = ticket.enqueued
            except SluicewayError as e:
                out[s.name].refused[e.reason] += 1
        core.expire()
        while (started := core.next_batch()) is not None:
            took = service if per_row is None else per_row * sum(rows[tk.payload] for tk in started.tickets)
            for tk in started.tickets:
                out[tk.payload].waits.append(clock.now() - enq.pop(tk.id))
                out[tk.payload].device += took * rows[tk.payload] / sum(rows[x.payload] for x in started.tickets)
            heapq.heappush(running, (clock.now() + took, id(started), started, took))
    return out


def device_time(ns: argparse.Namespace, hz: float, seed: int, q: int) -> dict[str, Any]:
    """(h) Unequal request sizes: *big* sends 4-row requests, *small* 1-row ones, at the same request
    rate; each alone wants more than half the device. Fair share by device time gives each half of
    the device; counting requests (or FIFO) gives *big* 4/5 of it."""
    per_row = ns.service_ms / 1000.0 / 2  # 10 ms a row by default: big 40 ms, small 10 ms
    rate = 0.6 / per_row  # small alone: 0.6 of the device; big: 2.4
    tenants = {"tenants": [{"name": "big", "maxQueued": q // 2}, {"name": "small", "maxQueued": q // 2}]}
    big, small = SimStream("big", rate, "big", rows=4), SimStream("small", rate, "small", rows=1)
    res = {
        "pod (device-time fair share)": simulate([big, small], tenants, service=per_row, horizon=hz, seed=seed,
                                                 max_depth=q, per_row=per_row),
        "FIFO reference (one tenant)": simulate(
            [SimStream("big", rate, "shared", rows=4), SimStream("small", rate, "shared", rows=1)],
            {"tenants": [{"name": "shared"}]}, service=per_row, horizon=hz, seed=seed, max_depth=q,
            per_row=per_row),
    }
    print(f"\n## (h) device-time shares: big sends 4-row requests, small 1-row ones, each {rate:g}/s "
          f"({per_row * 1000:g} ms a row: big offers {rate * 4 * per_row:.1f}, small {rate * per_row:.1f} of the "
          f"device), equal weights, one permit, queue bound {q} ({q // 2} per tenant in the pod)")
    rows_out = []
    doc: dict[str, Any] = {}
    for name, r in res.items():
        total = sum(o.device for o in r.values())
        for sn, o in r.items():
            rows_out.append([name, sn, f"{o.offered / hz:.1f}", str(len(o.waits)), f"{o.device:.2f}",
                             f"{o.device / total:.3f}" if total else "-"])
        doc[name] = {sn: {**summary(o), "device_s": o.device, "device_share": o.device / total if total else None}
                     for sn, o in r.items()}
    print(table(["scheduler", "tenant", "offered/s", "served", "device s", "device share"], rows_out))
    return doc


def row(scenario: str, name: str, o: Outcome, service: float, horizon: float) -> list[str]:
    w = o.waits
    p99 = percentile(w, 99)
    return [scenario, name, f"{o.offered / horizon:.1f}", str(len(w)),
            " ".join(f"{k}:{v}" for k, v in sorted(o.refused.items())) or "-",
            fmt(_ms(percentile(w, 50)), ".1f"), fmt(_ms(percentile(w, 99)), ".1f"),
            fmt(_ms(max(w) if w else None), ".1f"),
            fmt(_ms(p99 + service if p99 is not None else None), ".1f")]


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000


def summary(o: Outcome) -> dict[str, Any]:
    w = o.waits
    return {"offered": o.offered, "served": len(w), "refused": dict(o.refused),
            "wait_p50_ms": _ms(percentile(w, 50)), "wait_p99_ms": _ms(percentile(w, 99)),
            "wait_max_ms": _ms(max(w) if w else None)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sched_sim", description=__doc__.split("\n\n")[0])
    p.add_argument("--service-ms", type=float, default=20.0)
    p.add_argument("--horizon", type=float, default=120.0, help="simulated seconds per scenario")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--heavy-quota", type=float, default=0.5, help="x mu")
    p.add_argument("--target-wait", type=float, default=2.0, help="queue bound = target wait / S (auto)")
    p.add_argument("--aging-seconds", type=float, default=1.0)
    ns = p.parse_args(argv)
    s = ns.service_ms / 1000.0
    mu = 1.0 / s
    q = max(1, math.floor(ns.target_wait / s))
    hz, seed = ns.horizon, ns.seed
    heavy_q = ns.heavy_quota * mu
    light_cfg = {"name": "light", "rate": 0.4 * mu, "burst": 10}
    heavy_cfg = {"name": "heavy", "rate": heavy_q, "burst": 5}
    light = SimStream("light", 0.2 * mu, "light")
    heavy = SimStream("heavy", 10 * heavy_q, "heavy")
    doc: dict[str, Any] = {"benchmark": "sched_sim", "args": vars(ns), "queue_bound": q, "isolation": {},
                           "priority": {}}
    print(f"# pod scheduler alone (simulated time): S = {ns.service_ms:g} ms, one permit, queue bound {q}, "
          f"{hz:g} s per scenario, seed {seed}")

    both = {"tenants": [light_cfg, heavy_cfg]}
    weighted = {"tenants": [{**light_cfg, "weight": 3}, heavy_cfg]}
    iso = {
        "light alone": simulate([light], both, service=s, horizon=hz, seed=seed, max_depth=q),
        "with heavy (pod)": simulate([light, heavy], both, service=s, horizon=hz, seed=seed, max_depth=q),
        "with heavy, light weight 3": simulate([light, heavy], weighted, service=s, horizon=hz, seed=seed,
                                               max_depth=q),
    }
    # FIFO reference: heavy still limited by the same bucket, but both share one tenant: arrival order.
    fifo_h = SimStream("heavy", 10 * heavy_q, "shared", prelimit=(heavy_q, 5))
    fifo = simulate([SimStream("light", 0.2 * mu, "shared"), fifo_h], {"tenants": [{"name": "shared"}]},
                    service=s, horizon=hz, seed=seed, max_depth=q)
    rows = [row(name, sn, o, s, hz) for name, res in iso.items() for sn, o in res.items()]
    print(f"\n## (f) isolation: light {0.2 * mu:g}/s (quota {0.4 * mu:g}/s), heavy {10 * heavy_q:g}/s "
          f"= 10x its quota {heavy_q:g}/s (burst 5); waits are queue waits")
    hdr = ["scenario", "stream", "offered/s", "served", "refused", "wait p50", "wait p99", "wait max",
           "p99+S"]
    print(table(hdr, rows))
    lw = {n: percentile(r["light"].waits, 99) for n, r in iso.items()}
    print(f"light p99 wait: alone {fmt(_ms(lw['light alone']), '.1f')} ms, with heavy "
          f"{fmt(_ms(lw['with heavy (pod)']), '.1f')} ms (target: + at most S = {ns.service_ms:g} ms); "
          f"FIFO reference (no fair share) {fmt(_ms(percentile(fifo['light'].waits, 99)), '.1f')} ms; "
          f"light weight 3: {fmt(_ms(lw['with heavy, light weight 3']), '.1f')} ms")
    doc["isolation"] = {n: {k: summary(o) for k, o in r.items()} for n, r in iso.items()}
    doc["isolation"]["fifo reference"] = {k: summary(o) for k, o in fifo.items()}

    high = SimStream("high", 0.2 * mu, "anonymous", "critical")
    low = SimStream("low", 3 * mu, "anonymous", "batch")
    anon: dict[str, Any] = {"tenants": [], "defaults": {"maxPriority": "critical"}}  # anonymous may use critical
    pri = {
        "high alone": simulate([high], anon, service=s, horizon=hz, seed=seed, max_depth=q, queue_timeout=10,
                               aging=ns.aging_seconds),
        "high + low (pod)": simulate([high, low], anon, service=s, horizon=hz, seed=seed, max_depth=q,
                                     queue_timeout=10, aging=ns.aging_seconds),
        "same class (FIFO ref.)": simulate([SimStream("high", 0.2 * mu, "anonymous", "batch"), low], anon,
                                           service=s, horizon=hz, seed=seed, max_depth=q, queue_timeout=10,
                                           aging=ns.aging_seconds),
    }
    bound = len(CLASSES) * ns.aging_seconds + (math.ceil(q / 1) + 1) * s
    print(f"\n## (g) priority: high (critical) {0.2 * mu:g}/s, low (batch) {3 * mu:g}/s, aging step "
          f"{ns.aging_seconds:g} s, queue timeout 10 s")
    print(table(hdr, [row(name, sn, o, s, hz) for name, res in pri.items() for sn, o in res.items()]))
    mixed = pri["high + low (pod)"]
    hi_ref = mixed["high"]
    n_ref = sum(hi_ref.refused.values())
    print(f"high refused while low fills the shared queue: {n_ref} of {hi_ref.offered} "
          f"({n_ref / max(1, hi_ref.offered):.1%}); low max wait "
          f"{fmt(_ms(max(mixed['low'].waits) if mixed['low'].waits else None), '.0f')} ms vs aging bound "
          f"K*A + (ceil(Q/N)+1)*S = {bound * 1000:.0f} ms")
    doc["priority"] = {n: {k: summary(o) for k, o in r.items()} for n, r in pri.items()}
    doc["aging_bound_s"] = bound
    doc["device_time"] = device_time(ns, hz, seed, q)
    print(f"# results: {save_results('sched-sim', doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
