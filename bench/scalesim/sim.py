"""One simulated run (a trace, a controller, a service model) and its scores.

The loop, once per simulated second ``t``: pods whose start-up ended become ready; the second's
arrivals go through the fluid queue (:class:`~bench.scalesim.model.FluidQueue`); the result is
recorded (what Prometheus will scrape); every ``controller.interval`` seconds the controller
decides and the pod pool follows (pods start with a delay, removals are immediate).

Scores: a request is *on time* when answered within the deadline (``ServiceModel.slo``), its
queue wait included; *late* when answered after it; *refused* when answered 429 or 503. The three
shares are reported separately; ``slo_attainment`` is the on-time share.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from .controllers import Controller
from .edge import Edge, HoldSpec, cold_start_estimate
from .model import FluidQueue, PodPool, Record, ServiceModel, ceil_div
from .observe import Prometheus

__all__ = ["Scores", "initial_replicas", "run"]

#: Two scale events in opposite directions within this many seconds count as one flap.
FLAP_WINDOW = 600


@dataclass(frozen=True)
class Scores:
    policy: str
    trace: str
    requests: int
    slo_attainment: float  # on time: answered 200 within the deadline (``ServiceModel.slo``), waits included / offered
    late_share: float  # answered 200 after the deadline / offered
    refused_share: float  # 429 + 503 / offered
    goodput: float  # answered 200 per second
    wait_p95: float  # over all admitted requests (s)
    gpu_hours: float
    scale_events: int
    flaps: int
    peak_replicas: int
    # with an edge (``run(edge=...)``), shares of the offered requests, and the hold times
    held_share: float = 0.0  # entered the hold queue
    refused_early: float = 0.0  # refused at once, predicted past the deadline (503 + Retry-After)
    refused_full: float = 0.0  # refused at once, over the hold bound
    timed_out: float = 0.0  # held until the deadline, then refused (504 / the client gave up)
    hold_p50: float = 0.0  # seconds held, over the held requests handed off to a pod
    hold_p99: float = 0.0
    cold_starts: int = 0  # scale-ups from zero
    zero_share: float = 0.0  # of the trace's seconds with no pod asked for

    def row(self) -> dict[str, object]:
        return asdict(self)


def initial_replicas(rate0: float, model: ServiceModel, utilisation: float = 0.7) -> int:
    return max(1, ceil_div(rate0, model.replica_rate * utilisation))


def _weighted_p95(values: np.ndarray, weights: np.ndarray) -> float:
    total = float(weights.sum())
    if total <= 0:
        return 0.0
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    idx = int(np.searchsorted(cum, 0.95 * total))
    return float(values[order][min(idx, len(order) - 1)])


def _flaps(directions: list[tuple[int, int]]) -> int:
    flaps = 0
    for (t0, d0), (t1, d1) in itertools.pairwise(directions):
        if d0 != d1 and t1 - t0 <= FLAP_WINDOW:
            flaps += 1
    return flaps


def run(
    trace_name: str,
    rate: np.ndarray,
    arrived: np.ndarray,
    controller: Controller,
    model: ServiceModel,
    *,
    seed: int,
    scrape_interval: int = 15,
    rate_window: int = 120,
    scrape_failure: float = 0.01,
    query_failure: float = 0.002,
    edge: HoldSpec | None = None,
) -> tuple[Scores, Record]:
    """One run. ``edge``: a hold queue in front of the pods (``bench.scalesim.edge``); without one a
    request no pod can take is refused, as before issue 20."""
    seconds = int(arrived.shape[0])
    rng = np.random.default_rng(seed + 1000)  # start-up delays: same stream for every policy
    pool = PodPool(model, initial_replicas(float(rate[0]), model), rng)
    queue = FluidQueue(model)
    hold = None if edge is None else Edge(edge, model, queue, cold_start_estimate(model))
    rec = Record(seconds)
    prom = Prometheus(rec, model, scrape_interval, rate_window, scrape_failure, query_failure, seed)
    interval = max(1, controller.interval)
    cold_starts = zero_seconds = 0
    for t in range(seconds):
        pool.tick(t)
        if hold is None:
            r = queue.step(float(arrived[t]), pool.ready, float(rate[t]))
        else:
            r = hold.step(t, float(arrived[t]), pool, float(rate[t]))
        rec.put(t, r, pool)
        zero_seconds += pool.target == 0
        if t % interval == 0:
            want = controller.decide(t + 1, prom, pool)
            if want is not None:
                cold_starts += pool.target == 0 and want > 0
                pool.set_target(want, t)
    offered = float(rec.arrived.sum())
    served = float(rec.served.sum())
    lost = float(rec.refused.sum() + rec.expired.sum())
    late = float(rec.late.sum())
    admitted = rec.arrived - rec.refused
    scores = Scores(
        policy=controller.name,
        trace=trace_name,
        requests=int(offered),
        slo_attainment=(served - late) / offered if offered else 1.0,
        late_share=late / offered if offered else 0.0,
        refused_share=lost / offered if offered else 0.0,
        goodput=served / seconds,
        wait_p95=_weighted_p95(rec.wait_p95, admitted),
        gpu_hours=pool.gpu_seconds / 3600.0,
        scale_events=pool.scale_events,
        flaps=_flaps(pool.directions),
        peak_replicas=int(rec.total.max()),
    )
    if hold is not None:
        st = hold.stats
        scores = replace(
            scores,
            held_share=st.held / offered if offered else 0.0,
            refused_early=st.refused_early / offered if offered else 0.0,
            refused_full=st.refused_full / offered if offered else 0.0,
            timed_out=st.timed_out / offered if offered else 0.0,
            hold_p50=st.hold_quantile(0.5),
            hold_p99=st.hold_quantile(0.99),
            cold_starts=cold_starts,
            zero_share=zero_seconds / seconds if seconds else 0.0,
        )
    return scores, rec


def fmt_pct(x: float) -> str:
    return f"{100 * x:.2f}%" if not math.isnan(x) else "n/a"
