"""Scale to zero and the hold queue (issue 20): each policy that can scale to zero, with
``minReplicas`` 0 and 1, behind its own edge, on the on/off trace and the idle-heavy trace.

Usage: ``python -m bench.scalesim.zero [--traces onoff,idle] [--startups short,long]
[--deadlines 2,300] [--replicas N] [--hours H] [--idle-hours H] [--scale-to-zero-after S] [--seed S] [--plot DIR]``.

For each trace, start-up and deadline it prints one table: GPU-hours and the on-time share of every
policy at ``minReplicas`` 1 and 0, with what the edge did (held, refused at once, timed out, hold
time) and the cold starts. The policies, each with its own edge (``bench.scalesim.edge``):

- ``ours-keda``: our gateway's hold queue, the scaler's activation through ``StreamIsActive``, KEDA
  owning 1 -> N with our policy (its hold term reading the gateway's held count and arrival rate),
  ``scaleToZeroAfter`` (``OursZero``); ``ours-keda-hold10k`` the same with ``hold.maxRequests``
  10,000 (the activator's bound) in place of the default 1,024; ``ours-keda-counts-held`` the policy
  without the hold term, the scaler adding the gateway's held requests to the requests in the pods
  (the reading of issue 20 before the hold term);
- ``knative-kpa``: the activator; ``scale-to-zero-grace-period`` 30 s after the stable window reads 0;
- ``keda-http``: KEDA's HTTP add-on, the interceptor; ``scaledownPeriod`` 300 s; 80 % of a replica's
  permits per replica (the ``concurrency.targetValue`` default, 100, would add a replica per 100
  pending requests);
- ``ray-serve``: the proxy and handles; ``min_replicas: 0``, ``downscale_to_zero_delay_s`` unset
  (``downscale_delay_s``, 600 s).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from .compare import parse_startup
from .controllers import Controller, KedaHttp, Kpa, OursKeda, OursZero, RayServe, default_spec, rendered_behavior
from .edge import ACTIVATOR, GATEWAY, INTERCEPTOR, RAY_PROXY, HoldSpec
from .model import Record, ServiceModel
from .sim import Scores, run
from .traces import arrivals, make_trace

__all__ = ["ZERO_POLICIES", "build_zero_policy", "main", "run_zero", "zero_table"]

ZERO_POLICIES = ("ours-keda", "ours-keda-counts-held", "ours-keda-hold10k", "knative-kpa", "keda-http", "ray-serve")
#: ``spec.autoscaling.scaleToZeroAfter`` assumed here: KEDA's ``cooldownPeriod`` default (300 s);
#: the CRD field is issue 20's and has no default yet.
SCALE_TO_ZERO_AFTER = 300.0


def build_zero_policy(
    name: str, min_replicas: int, model: ServiceModel, max_replicas: int, scale_to_zero_after: float
) -> tuple[Controller, HoldSpec]:
    """The policy ``name`` with ``minReplicas`` 0 or 1 and its edge."""
    if min_replicas not in (0, 1):
        raise ValueError(f"min_replicas: 0 or 1, got {min_replicas}")
    makers: dict[str, Callable[[], tuple[Controller, HoldSpec]]] = {
        "ours-keda": lambda: _ours(min_replicas, max_replicas, scale_to_zero_after),
        # issue 20's scaler: the held requests count with the requests in the pods (the policy as it
        # is, without the rule that discounts what starting pods will absorb)
        "ours-keda-counts-held": lambda: (_ours(min_replicas, max_replicas, scale_to_zero_after, True)[0], GATEWAY),
        # the same with ``hold.maxRequests: 10000`` (the activator's bound) instead of the default 1024
        "ours-keda-hold10k": lambda: (
            _ours(min_replicas, max_replicas, scale_to_zero_after)[0],
            replace(GATEWAY, max_requests=10_000.0),
        ),
        "knative-kpa": lambda: (Kpa(model.permits, min_replicas, max_replicas), ACTIVATOR),
        "keda-http": lambda: (
            KedaHttp(float(math.floor(0.8 * model.permits)), min_replicas, max_replicas),
            INTERCEPTOR,
        ),
        "ray-serve": lambda: (RayServe(min_replicas, max_replicas), RAY_PROXY),
    }
    if name not in makers:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(makers)}")
    return makers[name]()


def _ours(
    min_replicas: int, max_replicas: int, after: float, count_held: bool = False
) -> tuple[Controller, HoldSpec]:
    spec = default_spec(max_replicas)  # the HPA's minReplicas is max(minReplicaCount, 1): KEDA's
    if count_held:  # the held requests as requests in the pods, not the hold term
        spec = replace(spec, hold_drain_seconds=None)
    keda = OursKeda(spec, rendered_behavior(spec, windows_add_up=True), count_held=count_held)
    if min_replicas == 1:
        return keda, GATEWAY
    return OursZero(keda, scale_to_zero_after=after), GATEWAY


def run_zero(
    trace_name: str, seconds: int, replicas: int, model: ServiceModel, seed: int, after: float,
    policies: Sequence[str] = ZERO_POLICIES, plot: Path | None = None,
) -> list[tuple[int, Scores]]:
    """Every policy at ``minReplicas`` 1 then 0 on one trace: [(min replicas, scores)]. ``plot``: a
    PNG of the replicas asked for over time at ``minReplicas`` 0, with the load."""
    peak = replicas * model.replica_rate * 0.8
    trace = make_trace(trace_name, seconds, peak, seed)
    arrived = arrivals(trace, seed)
    out: list[tuple[int, Scores]] = []
    records: dict[str, Record] = {}
    for name in policies:
        for lo in (1, 0):
            ctl, edge = build_zero_policy(name, lo, model, 2 * replicas, after)
            scores, rec = run(trace.name, trace.rate, arrived, ctl, model, seed=seed, edge=edge)
            out.append((lo, replace(scores, policy=name)))
            if lo == 0:
                records[name] = rec
    if plot is not None:
        _plot(trace.rate, records, model, plot)
    return out


def _plot(rate: np.ndarray, records: dict[str, Record], model: ServiceModel, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, zoom) = plt.subplots(2, 1, figsize=(11, 8))
    hours = np.arange(rate.shape[0]) / 3600.0
    busy = np.flatnonzero(rate > 1.0)
    lo = max(0, int(busy[0]) - 120) if busy.size else 0
    hi = min(rate.shape[0], lo + 1200)
    for a, sl in ((ax, slice(None)), (zoom, slice(lo, hi))):
        a.plot(hours[sl], rate[sl] / model.replica_rate, color="black", lw=1.0, label="load (replicas at 100 %)")
        for i, (name, rec) in enumerate(records.items()):
            colour = f"C{i}"
            a.plot(hours[sl], rec.total[sl], lw=0.8, color=colour, label=f"{name} (minReplicas 0)")
            if a is zoom:
                a.plot(hours[sl], rec.held[sl] / 1000.0, lw=0.7, ls=":", color=colour, label=f"{name}: held / 1000")
        a.set_xlabel("hours")
        a.set_ylabel("replicas asked for")
    ax.set_title(f"scalesim.zero: {path.stem}, start-up {model.startup.label()}, deadline {model.slo:g} s")
    zoom.set_title("the first burst (20 minutes)")
    ax.legend(fontsize=7, ncol=2)
    zoom.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def zero_table(rows: Sequence[tuple[int, Scores]]) -> str:
    head = (
        "| policy | min | GPU-hours | on time | late | refused | of which: predicted late / over the bound"
        " / timed out | held | hold p50 / p99 (s) | cold starts | at zero | peak |"
    )
    lines = [head, "|" + "---|" * 12]
    for lo, r in rows:
        lines.append(
            f"| {r.policy} | {lo} | {r.gpu_hours:.1f} | {100 * r.slo_attainment:.3f}% | "
            f"{100 * r.late_share:.3f}% | {100 * r.refused_share:.3f}% | {100 * r.refused_early:.3f}% / "
            f"{100 * r.refused_full:.3f}% / {100 * r.timed_out:.3f}% | {100 * r.held_share:.3f}% | "
            f"{r.hold_p50:.0f} / {r.hold_p99:.0f} | {r.cold_starts} | {100 * r.zero_share:.1f}% | "
            f"{r.peak_replicas} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scalesim.zero", description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", default="onoff,idle")
    ap.add_argument("--startups", default="short,long")
    ap.add_argument("--deadlines", default="2,300", help="each request's deadline (s), waits included")
    ap.add_argument("--replicas", type=int, default=10, help="replicas the peak needs at 80 %% utilisation")
    ap.add_argument("--hours", type=float, default=4.0, help="hours of the on/off trace")
    ap.add_argument("--idle-hours", type=float, default=24.0, help="hours of the idle trace")
    ap.add_argument("--scale-to-zero-after", type=float, default=SCALE_TO_ZERO_AFTER)
    ap.add_argument("--policies", default=",".join(ZERO_POLICIES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plot", default=None, help="directory for a PNG per table (minReplicas 0 over time)")
    args = ap.parse_args(argv)
    try:
        deadlines = [float(x) for x in args.deadlines.split(",") if x.strip()]
        if not deadlines or any(not (d > 0 and np.isfinite(d)) for d in deadlines):
            raise ValueError(f"--deadlines: positive seconds, got {args.deadlines!r}")
        if args.replicas < 1 or args.scale_to_zero_after < 0:
            raise ValueError("--replicas >= 1 and --scale-to-zero-after >= 0")
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        for p in policies:
            if p not in ZERO_POLICIES:
                raise ValueError(f"unknown policy {p!r}; known: {', '.join(ZERO_POLICIES)}")
        for trace in [x.strip() for x in args.traces.split(",") if x.strip()]:
            hours = args.idle_hours if trace == "idle" else args.hours
            for su in [x.strip() for x in args.startups.split(",") if x.strip()]:
                startup = parse_startup(su)
                for d in deadlines:
                    model = ServiceModel(startup=startup, slo=d)
                    started = time.perf_counter()
                    png = None
                    if args.plot:
                        Path(args.plot).mkdir(parents=True, exist_ok=True)
                        png = Path(args.plot) / f"zero-{trace}-{startup.label()}-{d:g}s.png"
                    rows = run_zero(
                        trace, int(hours * 3600), args.replicas, model, args.seed, args.scale_to_zero_after,
                        policies, png,
                    )
                    print(
                        f"\n**{trace}, {hours:g} h, start-up {startup.label()}, deadline {d:g} s**: "
                        f"{rows[0][1].requests} requests, {args.replicas} replicas at the peak, "
                        f"scaleToZeroAfter {args.scale_to_zero_after:g} s; {len(rows)} runs in "
                        f"{time.perf_counter() - started:.1f}s\n"
                    )
                    print(zero_table(rows))
    except (ValueError, OSError) as err:
        print(f"scalesim.zero: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
