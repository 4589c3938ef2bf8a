"""``sluiceway plan``: the capacity planner on the command line (single-threaded, one-shot).

The arrival rate, service time and concurrency may be given, or read from Prometheus for a running
InferenceService (``--prometheus URL --inference-service NAME --namespace NS``); given values win.
Exit codes: 0 planned, 2 bad input or data that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict

from sluiceway_core.promauth import load_prom_auth
from sluiceway_core.units import parse_seconds
from sluiceway_core.urls import UrlAllowList

from sluiceway_scaler.errors import SourceUnavailable
from sluiceway_scaler.planner import Plan, plan
from sluiceway_scaler.prom import PrometheusSource, Queries


def _duration(text: str) -> float:
    try:
        return parse_seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sluiceway", description="Sluiceway tools")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("plan", help="size replicas, concurrency and queue bound with M/M/c (Erlang C)")
    s.add_argument("--target-wait-p95", type=_duration, required=True, help="e.g. 500ms, 2s")
    s.add_argument("--arrival-rate", type=float, help="requests per second")
    s.add_argument("--service-time", type=_duration, help="per request, e.g. 50ms")
    s.add_argument("--concurrency", type=int, help="GPU permits per replica (default 1, or read)")
    s.add_argument("--replicas", type=int, help="fix the replica count and size the concurrency instead")
    s.add_argument("--prometheus", help="Prometheus URL to read rate, service time and concurrency from")
    s.add_argument("--inference-service", help="InferenceService name (with --prometheus)")
    s.add_argument("--namespace", default="default", help="its namespace (default: default)")
    s.add_argument("--window", default="5m", help="PromQL rate window for the reads (default 5m)")
    s.add_argument("--prometheus-auth-file", metavar="FILE",
                   help="credentials for --prometheus (the scaler's format: sluiceway_core.promauth)")
    s.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def _fmt_s(x: float) -> str:
    if math.isinf(x):
        return "inf"
    return f"{x * 1000:.1f}ms" if x < 1 else f"{x:.2f}s"


def render(p: Plan, source: str) -> str:
    lines = [
        f"sluiceway plan ({source})",
        f"  arrival rate {p.arrival_rate:g}/s, service time {_fmt_s(p.service_time)}, "
        f"target wait p95 {_fmt_s(p.target_wait_p95)}",
        f"  servers needed (M/M/c)    {p.servers_needed}",
        f"  replicas                  {p.replicas}",
        f"  concurrency per replica   {p.concurrency}",
        f"  queue bound per replica   {p.queue_bound}   (N*T/S = {p.concurrency} x "
        f"{p.target_wait_p95:g} / {p.service_time:g})",
        "",
        f"  {'load':>5}  {'rate/s':>8}  {'util':>6}  {'P(wait)':>7}  {'mean wait':>9}  {'wait p95':>9}"
        f"  {'rejected':>9}  target",
    ]
    for pt in p.points:
        load = f"{(pt.load_factor - 1) * 100:+.0f}%"
        lines.append(
            f"  {load:>5}  {pt.arrival_rate:8.2f}  {pt.utilisation:6.1%}  {pt.wait_probability:7.3f}  "
            f"{_fmt_s(pt.mean_wait):>9}  {_fmt_s(pt.wait_p95):>9}  {pt.rejection_share:9.3%}  "
            f"{'met' if pt.meets_target else 'MISSED'}"
        )
    return "\n".join(lines)


def run_plan(args: argparse.Namespace) -> int:
    rate, service, conc = args.arrival_rate, args.service_time, args.concurrency
    source = "given"
    if args.prometheus:
        if not args.inference_service:
            print("error: --inference-service is required with --prometheus", file=sys.stderr)
            return 2
        try:
            queries = Queries.build(args.namespace, args.inference_service, args.window)
            # the operator names this address on the command line: it is the whole allow-list
            allow = UrlAllowList.build("--prometheus", [args.prometheus])
            auth = load_prom_auth(args.prometheus_auth_file) if args.prometheus_auth_file else None
            source_ = PrometheusSource(allow=allow, auth=auth)
            stats = source_.read_stats(args.prometheus.rstrip("/"), queries, 10.0)
        except (SourceUnavailable, ValueError) as e:  # PromAuthError is a ValueError
            print(f"error: {e}", file=sys.stderr)
            return 2
        rate = rate if rate is not None else stats.arrival_rate
        service = service if service is not None else stats.service_time
        if conc is None and args.replicas is None:
            conc = stats.concurrency
        where = f"{args.namespace}/{args.inference_service}"
        source = f"read from {args.prometheus} for {where} over {args.window}"
    missing = [n for n, v in (("--arrival-rate", rate), ("--service-time", service)) if v is None]
    if missing:
        where = " (Prometheus had no data for it)" if args.prometheus else ""
        print(f"error: {' and '.join(missing)} required{where}", file=sys.stderr)
        return 2
    try:
        result = plan(args.target_wait_p95, rate, service, concurrency=conc, replicas=args.replicas)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(asdict(result), indent=2, default=str))
    else:
        print(render(result, source))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "plan":
        return run_plan(args)
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
