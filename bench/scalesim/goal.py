"""Issue 21's goal, checked in one command: every trace at both start-up settings, ours against the
fair peers.

Usage: ``python -m bench.scalesim.goal [--replicas 1000] [--hours 4] [--diurnal-hours 24]
[--traces diurnal,flash,ramp,onoff,stairs,bursty] [--startups short,long]
[--ours ours-keda,ours-builtin] [--seed 1] [--json FILE]``.

For every trace and start-up setting it runs the fair peers (``compare.PEERS``), the oracle and
each of ``--ours`` on the same arrivals, and prints one row per (trace, start-up, ours): on time,
GPU-hours, x oracle and the peers that dominate it (a peer dominates when it answers at least
ours' share on time at no more GPU-hours; ``grid.dominated_by``), or ``none``. On diurnal the row
also says whether the goal holds (>= 99.5 % on time at <= 1.15x the oracle's GPU-hours). The last
line counts the rows dominated; the exit status is 0 either way (a bench, not a gate: the test in
``tests/scalesim`` pins the result).

Single-threaded; each run is independent and seeded, so the table is the same on every machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from .compare import PEERS, build_policies, parse_startup
from .grid import DIURNAL_COST, DIURNAL_SLO, dominated_by
from .model import ServiceModel
from .sim import Scores, run
from .traces import TRACES, arrivals, make_trace

__all__ = ["Row", "goal_rows", "main"]


@dataclass(frozen=True)
class Row:
    trace: str
    startup: str
    scores: Scores
    oracle_gpu_hours: float
    dominated_by: tuple[str, ...]
    #: diurnal only: whether >= 99.5 % on time at <= 1.15x the oracle (None elsewhere)
    diurnal_goal: bool | None

    def line(self) -> str:
        s = self.scores
        goal = "" if self.diurnal_goal is None else (" | met" if self.diurnal_goal else " | NOT met")
        return (
            f"| {self.trace} | {self.startup} | {s.policy} | {100 * s.slo_attainment:.3f}% | {s.gpu_hours:.1f} | "
            f"{s.gpu_hours / self.oracle_gpu_hours:.3f} | {', '.join(self.dominated_by) or 'none'}{goal} |"
        )


def goal_rows(
    traces: Sequence[str],
    startups: Sequence[str],
    ours: Sequence[str],
    *,
    replicas: int = 1000,
    hours: float = 4.0,
    diurnal_hours: float = 24.0,
    seed: int = 1,
) -> list[Row]:
    """Run every (trace, start-up) and return one row per policy in ``ours``."""
    rows: list[Row] = []
    for startup in startups:
        model = ServiceModel(startup=parse_startup(startup))
        peak = replicas * model.replica_rate * 0.8
        for name in traces:
            h = diurnal_hours if name == "diurnal" else hours
            trace = make_trace(name, int(h * 3600), peak, seed)
            arrived = arrivals(trace, seed)
            scores = {
                ctl.name: run(trace.name, trace.rate, arrived, ctl, model, seed=seed)[0]
                for ctl in build_policies([*PEERS, "oracle", *ours], model, trace.rate, 2 * replicas)
            }
            oracle = scores["oracle"].gpu_hours
            peers = [scores[p] for p in PEERS]
            for o in ours:
                s = scores[o]
                goal = None
                if name == "diurnal":
                    goal = s.slo_attainment >= DIURNAL_SLO and s.gpu_hours <= DIURNAL_COST * oracle
                rows.append(Row(name, startup, s, oracle, tuple(dominated_by(s, peers)), goal))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scalesim.goal", description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=1000, help="replicas the peak needs at 80 %% utilisation")
    ap.add_argument("--hours", type=float, default=4.0, help="hours of every trace but diurnal")
    ap.add_argument("--diurnal-hours", type=float, default=24.0)
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--startups", default="short,long")
    ap.add_argument("--ours", default="ours-keda,ours-builtin", help="our policies to score (compare's names)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="", help="write every row here")
    args = ap.parse_args(argv)
    split = [[x.strip() for x in v.split(",") if x.strip()] for v in (args.traces, args.startups, args.ours)]
    started = time.perf_counter()
    try:
        rows = goal_rows(
            *split, replicas=args.replicas, hours=args.hours, diurnal_hours=args.diurnal_hours, seed=args.seed
        )
    except ValueError as err:
        print(f"goal: {err}", file=sys.stderr)
        return 2
    print("| trace | start-up | policy | on time | GPU-hours | x oracle | dominated by |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(r.line())
    bad = [r for r in rows if r.dominated_by or r.diurnal_goal is False]
    print(f"{len(rows)} rows in {time.perf_counter() - started:.1f}s; dominated or goal not met: {len(bad)}")
    for r in bad:
        print(f"  {r.trace} {r.startup} {r.scores.policy}: {', '.join(r.dominated_by) or 'diurnal goal not met'}")
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(r), "scores": asdict(r.scores)} for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
