"""Run every policy on the same trace and arrivals, print a table, write JSON and a PNG.

Usage: ``python -m bench.scalesim --trace diurnal|flash|ramp|onoff|csv:PATH [--replicas N]
[--hours H] [--seed S] [--out DIR] [--policies a,b,...] [--startup LO,HI]``.

``--replicas`` sizes the peak load: the busiest second offers what ``N`` replicas complete at 80 %
utilisation, so the oracle needs about ``0.94 * N`` replicas at the peak. Every policy may use up
to ``2 * N``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from .controllers import (
    Controller,
    HpaUtilisation,
    KedaPrometheus,
    KedaPrometheusQueue,
    Kpa,
    Oracle,
    OursBuiltin,
    OursGateway,
    OursKeda,
    RayServe,
    default_spec,
    rendered_behavior,
    spec_at_029d718,
)
from .model import STARTUPS, Record, ServiceModel, Startup
from .sim import Scores, run
from .traces import Trace, arrivals, make_trace

__all__ = ["EXTRA", "PEERS", "POLICIES", "build_policies", "compare", "main", "parse_startup"]

#: The fair peers: each configured as its own documentation and source describe it.
PEERS = ("keda-concurrency", "keda-rate", "hpa-utilisation", "knative-kpa", "ray-serve")
#: The default table: ours (both engines, and the policy before issue 21), the fair peers, the oracle.
POLICIES = ("ours-keda", "ours-builtin", "ours-gateway", "ours-keda-before", *PEERS, "oracle")
#: Also runnable: variants of ours and the queue-only KEDA trigger.
EXTRA = (
    "ours-keda-held",
    "ours-keda-avg",
    "ours-keda-029d718",
    "ours-keda-hpa-paced",
    "ours-keda-predictive",
    "ours-keda-podpoll",
    "ours-keda-burst",
    "ours-keda-deadband",
    "ours-keda-window300",
    "ours-keda-3540e51",
    "keda-queue",
)


def build_policies(
    names: Sequence[str], model: ServiceModel, rate: np.ndarray, max_replicas: int
) -> list[Controller]:
    spec = default_spec(max_replicas)
    # issue 21's rules off: no sustained demand, no requests-in-pods term, no burst headroom, every
    # term held by the whole window, the pace and release whatever the load
    before = replace(spec, sustained_demand=False, burst_utilisation=None, shortage_hold=None, recur_memory=None)
    old = replace(
        spec_at_029d718(max_replicas), sustained_demand=False, burst_utilisation=None, shortage_hold=None,
        recur_memory=None,
    )
    # the revision before the shortage hold and the recurrence rule (every term held by the window)
    held = replace(spec, shortage_hold=None, recur_memory=None)
    per_replica = 0.8  # every KEDA peer's threshold: 80 % of what one replica carries
    predictive = replace(spec, predict_seconds=model.startup.mean)
    window300 = replace(spec, scale_down=replace(spec.scale_down, stabilization_window=300.0))
    at_3540e51 = replace(window300, burst_utilisation=0.7)
    makers: dict[str, Callable[[], Controller]] = {
        "ours-keda": lambda: OursKeda(spec, rendered_behavior(spec, windows_add_up=True)),
        # the policy before this simulator (no ready/demand terms cannot be replayed; the
        # defaults and the HPA rendering can): 1 pod per 60 s down, the HPA repeating the window
        "ours-keda-029d718": lambda: OursKeda(
            old, rendered_behavior(old, windows_add_up=False, up_tolerance=None), name="ours-keda-029d718"
        ),
        # the HPA repeating the spec's scale-down pace: the scaler's release is held back by it
        "ours-keda-hpa-paced": lambda: OursKeda(
            spec, rendered_behavior(spec, windows_add_up=True, scaler_paces=False), name="ours-keda-hpa-paced"
        ),
        "ours-keda-held": lambda: OursKeda(held, rendered_behavior(held, windows_add_up=True), name="ours-keda-held"),
        "ours-keda-before": lambda: OursKeda(
            before, rendered_behavior(before, windows_add_up=True), name="ours-keda-before"
        ),
        # not the product: the scaler reading the requests in the pods as an instant sample (what
        # the builtin engine reads), and as their window average with the instant sample beyond its
        # noise (the tables of commit b21afae); the scaler reads neither (it flapped the sandbox e2e)
        "ours-keda-instant": lambda: OursKeda(
            spec, rendered_behavior(spec, windows_add_up=True), in_pods_term=True, averaged=False,
            name="ours-keda-instant",
        ),
        "ours-keda-avg": lambda: OursKeda(
            spec, rendered_behavior(spec, windows_add_up=True), in_pods_term=True, name="ours-keda-avg"
        ),
        # the start-up rule on (ScalingSpec.count_starting, off by default): pods still starting
        # count as capacity arriving at their predicted ready time
        "ours-keda-startup": lambda: OursKeda(
            replace(spec, count_starting=True), rendered_behavior(spec, windows_add_up=True), name="ours-keda-startup"
        ),
        # issue 21's last revision, one default at a time back to what it was at commit 3540e51:
        # burst headroom on (0.7), the HPA's 10 % scale-up dead band, the 300 s scale-down window;
        # and all three (the policy and rendering of 3540e51)
        "ours-keda-burst": lambda: OursKeda(
            replace(spec, burst_utilisation=0.7), rendered_behavior(spec, windows_add_up=True), name="ours-keda-burst"
        ),
        "ours-keda-deadband": lambda: OursKeda(
            spec, rendered_behavior(spec, windows_add_up=True, up_tolerance=None), name="ours-keda-deadband"
        ),
        "ours-keda-window300": lambda: OursKeda(
            window300, rendered_behavior(window300, windows_add_up=True), name="ours-keda-window300"
        ),
        "ours-keda-3540e51": lambda: OursKeda(
            at_3540e51, rendered_behavior(at_3540e51, windows_add_up=True, up_tolerance=None), name="ours-keda-3540e51"
        ),
        "ours-builtin": lambda: OursBuiltin(spec),
        # needs the gateway (issues 19/20) deployed: its exact counts, the builtin engine every 2 s
        "ours-gateway": lambda: OursGateway(spec),
        # not the product yet: the scaler reads the requests in the pods from the pods themselves
        # (podMetricsUrls) and the HPA leaves the scale-up pace to the scaler (docs/scalesim.md)
        "ours-keda-podpoll": lambda: OursKeda(
            spec, replace(rendered_behavior(spec, windows_add_up=True), up_pods=None, up_percent=1000.0),
            pod_polls=True, name="ours-keda-podpoll",
        ),
        "ours-keda-predictive": lambda: OursKeda(
            predictive, rendered_behavior(spec, windows_add_up=True), predictive=True, name="ours-keda-predictive"
        ),
        "keda-queue": lambda: KedaPrometheusQueue(8.0, 1, max_replicas),
        "keda-concurrency": lambda: KedaPrometheus("concurrency", per_replica * model.permits, 1, max_replicas),
        "keda-rate": lambda: KedaPrometheus("rate", per_replica * model.replica_rate, 1, max_replicas),
        "hpa-utilisation": lambda: HpaUtilisation(0.8, 1, max_replicas),
        "knative-kpa": lambda: Kpa(model.permits, 1, max_replicas),
        "ray-serve": lambda: RayServe(1, max_replicas),
        "oracle": lambda: Oracle(rate, model, 1, max_replicas),
    }
    unknown = [n for n in names if n not in makers]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; known: {', '.join(makers)}")
    return [makers[n]() for n in names]


def parse_startup(text: str) -> Startup:
    """``short``, ``long`` or ``LO,HI`` (one load phase, scraped only once ready)."""
    if text in STARTUPS:
        return STARTUPS[text]
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--startup: short, long or LO,HI, got {text!r}") from None
    if not 0 <= lo <= hi:
        raise ValueError(f"--startup: need 0 <= LO <= HI, got {text!r}")
    return Startup(lo, hi)


def compare(
    trace: Trace, model: ServiceModel, names: Sequence[str], max_replicas: int, seed: int
) -> tuple[list[Scores], dict[str, Record]]:
    arrived = arrivals(trace, seed)
    results: list[Scores] = []
    records: dict[str, Record] = {}
    for ctl in build_policies(names, model, trace.rate, max_replicas):
        scores, rec = run(trace.name, trace.rate, arrived, ctl, model, seed=seed)
        results.append(scores)
        records[ctl.name] = rec
    return results, records


def table(results: Sequence[Scores]) -> str:
    oracle = next((r for r in results if r.policy == "oracle"), None)
    head = (
        "| policy | on time | late | refused | wait p95 (s) | GPU-hours | x oracle | scale events | flaps | peak |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in results:
        ratio = f"{r.gpu_hours / oracle.gpu_hours:.3f}" if oracle and oracle.gpu_hours else "n/a"
        lines.append(
            f"| {r.policy} | {100 * r.slo_attainment:.3f}% | {100 * r.late_share:.3f}% | "
            f"{100 * r.refused_share:.3f}% | {r.wait_p95:.3f} | "
            f"{r.gpu_hours:.1f} | {ratio} | {r.scale_events} | {r.flaps} | {r.peak_replicas} |"
        )
    return "\n".join(lines)


def plot(trace: Trace, records: dict[str, Record], model: ServiceModel, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5))
    hours = np.arange(trace.seconds) / 3600.0
    step = max(1, trace.seconds // 2000)
    need = trace.rate / model.replica_rate
    ax.plot(hours[::step], need[::step], color="black", lw=1.2, label="load (replicas at 100 %)")
    for name, rec in records.items():
        ax.plot(hours[::step], rec.total[::step], lw=0.9, label=name)
    ax.set_xlabel("hours")
    ax.set_ylabel("replicas")
    ax.set_title(f"scalesim: {trace.name}, start-up {model.startup.label()}, SLO {model.slo:g} s")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scalesim", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="diurnal", help="diurnal, flash, ramp, onoff or csv:PATH")
    ap.add_argument("--replicas", type=int, default=100, help="replicas the peak needs at 80 %% utilisation")
    ap.add_argument("--hours", type=float, default=24.0, help="simulated hours (ignored for csv)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="bench/results/scalesim", help="directory for JSON and PNG")
    ap.add_argument("--policies", default=",".join(POLICIES), help=f"also: {', '.join(EXTRA)}")
    ap.add_argument("--startup", default="short", help="short, long, or a single phase LO,HI in seconds")
    ap.add_argument("--service-time", type=float, default=0.2)
    ap.add_argument("--permits", type=int, default=4)
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    try:
        model = ServiceModel(service_time=args.service_time, permits=args.permits, startup=parse_startup(args.startup))
        peak = args.replicas * model.replica_rate * 0.8
        trace = make_trace(args.trace, int(args.hours * 3600), peak, args.seed)
        names = [n.strip() for n in args.policies.split(",") if n.strip()]
        started = time.perf_counter()
        results, records = compare(trace, model, names, 2 * args.replicas, args.seed)
        elapsed = time.perf_counter() - started
    except (ValueError, OSError) as err:
        print(f"scalesim: {err}", file=sys.stderr)
        return 2
    print(
        f"trace {trace.name}: {trace.seconds} s, peak {trace.rate.max():.0f} req/s, "
        f"{int(sum(r.requests for r in results[:1]))} requests; replica = {model.permits} permits x "
        f"{model.service_time}s, queue {model.queue_per_replica}, deadline {model.deadline}s, "
        f"SLO {model.slo:g}s, start-up {model.startup.label()} (mean {model.startup.mean:.0f}s); "
        f"{len(results)} policies in {elapsed:.1f}s"
    )
    print(table(results))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = trace.name.replace(":", "_") + (f"-{model.startup.name}" if model.startup.name else "")
    (out / f"{stem}.json").write_text(json.dumps([r.row() for r in results], indent=2))
    if not args.no_plot:
        plot(trace, records, model, out / f"{stem}.png")
        print(f"wrote {out / (stem + '.json')} and {out / (stem + '.png')}")
    return 0
