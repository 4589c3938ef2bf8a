"""A grid over the policy's scaling parameters on every trace, scored against the peers.

Usage: ``python -m bench.scalesim.grid [--replicas 1000]
[--traces diurnal,flash,ramp,onoff,stairs,bursty] [--startup short|long|LO,HI]
[--engines keda,builtin] [--rate-window 60,120] [--release none,1200]
[--down-percent 2] [--seed 1] [--json FILE]``.

Every trace is simulated once per fair peer (``compare.PEERS``: ``keda-concurrency``, ``keda-rate``,
``hpa-utilisation``, ``knative-kpa``, ``ray-serve``) and once for the ``oracle``; then once per
candidate. A candidate is *dominated* on a trace when a peer answers at least as large a share on
time at no more GPU-hours (the oracle is not a peer: it knows the future). The diurnal goal is
>= 99.5 % on time at <= 1.15x the oracle's GPU-hours. The last lines name the candidates that
meet both on every trace, cheapest first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .compare import PEERS, build_policies, parse_startup
from .controllers import Controller, OursBuiltin, OursKeda, default_spec, rendered_behavior
from .model import ServiceModel
from .sim import Scores, run
from .traces import TRACES, arrivals, make_trace

__all__ = ["Candidate", "dominated_by", "main"]

DIURNAL_SLO, DIURNAL_COST = 0.995, 1.15


@dataclass(frozen=True)
class Candidate:
    engine: str  # keda or builtin
    rate_window: int  # seconds
    release_window: float | None  # seconds, None: off
    down_percent: float

    def label(self) -> str:
        rel = "off" if self.release_window is None else f"{self.release_window:g}"
        return f"{self.engine} window={self.rate_window} release={rel} down={self.down_percent:g}%"

    def controller(self, max_replicas: int) -> Controller:
        base = default_spec(max_replicas)
        spec = replace(
            base,
            scale_down=replace(base.scale_down, max_percent=self.down_percent, release_window=self.release_window),
        )
        if self.engine == "keda":
            behavior = rendered_behavior(spec, windows_add_up=True)
            return OursKeda(spec, behavior, rate_window=self.rate_window, name=self.label())
        return OursBuiltin(spec, rate_window=self.rate_window, name=self.label())


def dominated_by(ours: Scores, peers: Sequence[Scores]) -> list[str]:
    """Peers with an on-time share at least ours at GPU-hours no more than ours."""
    return [p.policy for p in peers if p.slo_attainment >= ours.slo_attainment and p.gpu_hours <= ours.gpu_hours]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _releases(text: str) -> list[float | None]:
    return [None if x.strip() in ("none", "off") else float(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scalesim.grid", description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=1000, help="replicas the peak needs at 80 %% utilisation")
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--hours", type=float, default=4.0, help="hours of every trace but diurnal")
    ap.add_argument("--diurnal-hours", type=float, default=24.0)
    ap.add_argument("--engines", default="keda,builtin", help="keda (scaler behind the HPA) and/or builtin")
    ap.add_argument("--rate-window", default="60,120", help="rate windows in seconds (scaler: rateWindow)")
    ap.add_argument("--release", default="none,1200", help="release windows in seconds, or none")
    ap.add_argument("--down-percent", default="2", help="scale-down percent per 60 s")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--startup", default="short", help="short, long, or a single phase LO,HI in seconds")
    ap.add_argument("--json", default="", help="write every score here")
    args = ap.parse_args(argv)
    try:
        model = ServiceModel(startup=parse_startup(args.startup))
        candidates = [
            Candidate(e, rw, rel, float(dp))
            for e, rw, rel, dp in itertools.product(
                [e.strip() for e in args.engines.split(",") if e.strip()],
                _ints(args.rate_window),
                _releases(args.release),
                args.down_percent.split(","),
            )
        ]
        if any(c.engine not in ("keda", "builtin") for c in candidates):
            raise ValueError("engines are keda and builtin")
        traces = [t.strip() for t in args.traces.split(",") if t.strip()]
    except ValueError as err:
        print(f"grid: {err}", file=sys.stderr)
        return 2
    peak = args.replicas * model.replica_rate * 0.8
    max_replicas = 2 * args.replicas
    started = time.perf_counter()
    scores: dict[str, dict[str, Scores]] = {}  # trace -> policy -> scores
    verdict: dict[Candidate, list[str]] = {c: [] for c in candidates}
    for name in traces:
        hours = args.diurnal_hours if name == "diurnal" else args.hours
        trace = make_trace(name, int(hours * 3600), peak, args.seed)
        arrived = arrivals(trace, args.seed)
        row: dict[str, Scores] = {}
        for ctl in build_policies([*PEERS, "oracle"], model, trace.rate, max_replicas):
            row[ctl.name] = run(trace.name, trace.rate, arrived, ctl, model, seed=args.seed)[0]
        for c in candidates:
            row[c.label()] = run(trace.name, trace.rate, arrived, c.controller(max_replicas), model, seed=args.seed)[0]
        scores[name] = row
        oracle = row["oracle"].gpu_hours
        peers = [row[p] for p in PEERS]
        print(f"\n{name} ({hours:g} h): peers " + ", ".join(
            f"{p.policy} {100 * p.slo_attainment:.3f}% @ {p.gpu_hours:.1f}" for p in peers
        ) + f"; oracle {oracle:.1f}")
        print("| candidate | on time | GPU-hours | x oracle | flaps | dominated by |")
        print("|---|---|---|---|---|---|")
        for c in candidates:
            s = row[c.label()]
            dom = dominated_by(s, peers)
            verdict[c].extend(f"{name}: {d}" for d in dom)
            if name == "diurnal" and not (s.slo_attainment >= DIURNAL_SLO and s.gpu_hours <= DIURNAL_COST * oracle):
                verdict[c].append("diurnal goal")
            print(
                f"| {c.label()} | {100 * s.slo_attainment:.3f}% | {s.gpu_hours:.1f} | {s.gpu_hours / oracle:.3f} | "
                f"{s.flaps} | {', '.join(dom) or '-'} |"
            )
    print(f"\n{len(candidates)} candidates x {len(traces)} traces in {time.perf_counter() - started:.1f}s")
    ok = [c for c in candidates if not verdict[c]]
    total = {c: sum(scores[t][c.label()].gpu_hours / scores[t]["oracle"].gpu_hours for t in traces) for c in candidates}
    print("undominated on every trace" + (" and the diurnal goal met:" if "diurnal" in traces else ":"))
    for c in sorted(ok, key=lambda c: total[c]):
        print(f"  {c.label()}  (sum of x oracle over the traces {total[c]:.3f})")
    if not ok:
        print("  none")
    for c in candidates:
        if verdict[c]:
            print(f"  not: {c.label()}: {'; '.join(verdict[c])}")
    if args.json:
        out = {t: {p: asdict(s) for p, s in row.items()} for t, row in scores.items()}
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
