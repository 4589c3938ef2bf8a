"""Benchmark (b)+(c): goodput and rejection latency under overload, ours against plain FastAPI.

The pod serves ``synthetic:20`` with one permit and ``--max-queue auto``; the baseline is plain
FastAPI with the same stand-in and one permit (no queue bound, no deadline handling); ``seedafter``
is the seed's own "after" design (FastAPI + ``asyncio.Semaphore(1)`` acquired with a 30 s timeout
+ a thread pool of the same size, :mod:`bench.baseline_pool`); LitServe with the same stand-in joins
when it is installed. Each server, fresh for every point and pinned to core
0, gets open-loop Poisson load at ``k * mu`` (k = 1, 2, 4 by default) from the generator on core 1,
every request carrying a 200 ms client deadline (``X-Sluiceway-Deadline-Ms`` plus a client
timeout at scheduled send + 200 ms). ``mu`` is measured in the same run: the stand-in alone, timed
on core 0.

Per server and k it prints (all over the measured window):

* ``offered/s``; ``G/mu``: 2xx answered within the deadline, per second, over mu;
* ``late2xx``: 2xx that arrived after the deadline (rare: the client gives up at the deadline, which
  shows as ``timeout`` in the codes); ``ok p99 ms``: p99 latency of the 2xx;
* ``rej p50/p99 ms``: latency of 429/503/504 answers refused at admission; ``expired``: requests the
  pod admitted, then dropped from its queue when their deadline could no longer be met (its 503
  reason is ``deadline_expired`` or ``queue_timeout``), counted apart because they wait by design;
* ``wasted``: ``1 - good / computed``, *computed* being the requests the server started computing
  (work whose answer came late or went to a client that had left); ``busy``: computed/s over mu;
* ``srv cpu`` / ``srv runq``: the server's CPU use and its time runnable but waiting for a CPU
  (``/proc/*/schedstat``), as shares of the window: how much other work on its core held it back;
* ``lag>1ms``: share of requests the generator sent more than 1 ms late (their latency still counts
  from the scheduled time); ``codes``: answers by status, ``timeout`` = the client gave up.

Then ratios ours/peer per k (the median over repetitions). JSON lands in ``bench/results/``.

    python -m bench.overload                      # defaults: 3 s warm-up + 20 s per point
    python -m bench.overload --duration 5 --warmup 1 --servers sluiceway,fastapi   # quick check
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import (
    fmt,
    machine_info,
    measure_mu,
    median,
    save_results,
    server_load,
    setup_client,
    table,
    window_probes,
)
from .loadgen import (
    RunResult,
    Stream,
    code_counts,
    fmt_codes,
    ok,
    percentile,
    reason_counts,
    records_json,
    run_open_loop,
    run_sync,
)
from .servers import RESULTS, STARTERS, ServerProc, litserve_available, load_average

REJECT_CODES = (429, 503, 504)
QUEUED_REASONS = frozenset({"deadline_expired", "queue_timeout"})  # the pod's reasons for "dropped after waiting"


def summarize(res: RunResult, mu: float, deadline: float) -> dict[str, Any]:
    win = res.window()
    d = res.duration
    good = [r for r in win if ok(r) and r.latency is not None and r.latency <= deadline]
    late = [r for r in win if ok(r) and r.latency is not None and r.latency > deadline]
    rejections = [r for r in win if r.status in REJECT_CODES and r.latency is not None]
    # Refused at admission (answered at once) vs dropped after waiting in the queue, told apart by
    # the pod's reason ("deadline" = refused at once, "deadline_expired" = dropped while queued).
    rej = [r.latency for r in rejections if r.reason not in QUEUED_REASONS and r.latency is not None]
    expired = [r.latency for r in rejections if r.reason in QUEUED_REASONS and r.latency is not None]
    lat_ok = [r.latency for r in good if r.latency is not None]
    c0, c1 = res.probes.get("computed_start"), res.probes.get("computed_end")
    computed = (c1 - c0) if isinstance(c0, float) and isinstance(c1, float) else None
    wasted = max(0.0, computed - len(good)) / computed if computed else None
    return {
        "requests": len(win),
        "offered_rps": len(win) / d,
        "good": len(good),
        "goodput_rps": len(good) / d,
        "goodput_over_mu": len(good) / d / mu,
        "late_2xx": len(late),
        "ok_p50_ms": _ms(percentile(lat_ok, 50)),
        "ok_p99_ms": _ms(percentile(lat_ok, 99)),
        "ok_quantiles_ms": [_ms(percentile(lat_ok, q)) for q in range(1, 100)] if lat_ok else [],
        "rejected": len(rej),
        "reject_p50_ms": _ms(percentile(rej, 50)),
        "reject_p99_ms": _ms(percentile(rej, 99)),
        "expired_in_queue": len(expired),
        "expired_p50_ms": _ms(percentile(expired, 50)),
        "codes": code_counts(win),
        "reasons": reason_counts(win),
        "computed": computed,
        "wasted_share": wasted,
        "busy": computed / d / mu if computed is not None else None,
        "client_lag_over_1ms": res.lagged,
        "client_lag_share": res.lag_share,
        "client_max_lag_ms": res.max_lag * 1000,
        "client_valid": res.valid,
        **server_load(res),
    }


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000


def run_point(server: str, k: float, mu: float, ns: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    kind = server.split("-")[0]  # "sluiceway-aa" is a second pod: the A/A noise floor
    kwargs: dict[str, Any] = {"service_ms": ns.service_ms}
    if kind == "litserve":
        kwargs["timeout_s"] = ns.deadline_ms / 1000.0
    if not ns.pin:
        kwargs["core"] = None
    srv: ServerProc = STARTERS[kind](log_dir, **kwargs)
    try:
        stream = Stream("main", k * mu, {}, deadline_ms=ns.deadline_ms, timeout_s=ns.deadline_ms / 1000.0)
        probes = window_probes(srv, ns.warmup, ns.duration, computed=True)
        res: RunResult = run_sync(run_open_loop(
            srv.infer_url, [stream], duration=ns.duration, warmup=ns.warmup, seed=ns.seed, probes=probes,
            max_inflight=ns.max_inflight))
    finally:
        rc = srv.stop()
    summary = summarize(res, mu, ns.deadline_ms / 1000.0)
    point: dict[str, Any] = {"server": server, "k": k, "rate": k * mu, "summary": summary,
                             "run": res.to_json(), "server_exit": rc, "server_params": srv.metadata,
                             "log": str(srv.log_path)}
    if ns.records:
        point["records"] = records_json(res.records)
    return point


def point_row(p: dict[str, Any]) -> list[str]:
    s = p["summary"]
    return [p["server"], f"{p['k']:g}", fmt(s["offered_rps"], ".1f"), fmt(s["goodput_over_mu"], ".3f"),
            str(s["late_2xx"]), fmt(s["ok_p99_ms"], ".1f"), fmt(s["reject_p50_ms"], ".2f"),
            fmt(s["reject_p99_ms"], ".2f"), str(s["expired_in_queue"]), fmt(s["wasted_share"], ".3f"),
            fmt(s["busy"], ".2f"),
            _pct(s["server_cpu"]), _pct(s["server_runq_wait"]), f"{s['client_lag_share']:.2%}",
            fmt_codes(s["codes"])]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


HEADERS = ["server", "k", "offered/s", "G/mu", "late2xx", "ok p99 ms", "rej p50 ms", "rej p99 ms", "expired",
           "wasted", "busy", "srv cpu", "srv runq", "lag>1ms", "codes"]


def ratios(points: Sequence[dict[str, Any]], ours: str, peers: Sequence[str], ks: Sequence[float],
           reps: int) -> list[dict[str, Any]]:
    """Per k and peer: the median over repetitions of ours/peer (goodput/mu, reject p99, wasted)."""
    out = []
    for k in ks:
        for peer in peers:
            g: list[float] = []
            r: list[float] = []
            for rep in range(reps):
                a = _find(points, ours, k, rep)
                b = _find(points, peer, k, rep)
                if a is None or b is None:
                    continue
                sa, sb = a["summary"], b["summary"]
                if sb["goodput_over_mu"]:
                    g.append(sa["goodput_over_mu"] / sb["goodput_over_mu"])
                if sa["reject_p99_ms"] is not None and sb["reject_p99_ms"]:
                    r.append(sa["reject_p99_ms"] / sb["reject_p99_ms"])
            out.append({"k": k, "peer": peer, "goodput_ratio": median(g), "reject_p99_ratio": median(r),
                        "goodput_peer": median(_goodputs(points, peer, k, reps)),
                        "goodput_ours": median(_goodputs(points, ours, k, reps)), "n": len(g)})
    return out


def _goodputs(points: Sequence[dict[str, Any]], server: str, k: float, reps: int) -> list[float]:
    found = (_find(points, server, k, rep) for rep in range(reps))
    return [p["summary"]["goodput_over_mu"] for p in found if p is not None]


def _find(points: Sequence[dict[str, Any]], server: str, k: float, rep: int) -> dict[str, Any] | None:
    for p in points:
        if p["server"] == server and p["k"] == k and p["rep"] == rep:
            return p
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__.split("\n\n")[0])
    p.add_argument("--ks", default="1,2,4", help="load multiples of mu (comma-separated)")
    p.add_argument("--servers", default=None,
                   help="comma-separated: sluiceway, fastapi, seedafter, litserve, sluiceway-aa (A/A); "
                        "default sluiceway,fastapi,seedafter plus litserve when installed")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of load before the window")
    p.add_argument("--deadline-ms", type=float, default=200.0)
    p.add_argument("--service-ms", type=float, default=20.0)
    p.add_argument("--mu-seconds", type=float, default=5.0, help="how long to time the stand-in alone")
    p.add_argument("--reps", type=int, default=1, help="repetitions (servers alternate within each k)")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--max-inflight", type=int, default=2000)
    p.add_argument("--nice", type=int, default=0, help="renice generator and servers (negative = favour)")
    p.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin server/client to cores")
    p.add_argument("--records", action="store_true", help="also store every request record in the JSON")
    ns = p.parse_args(argv)
    ks = [float(x) for x in ns.ks.split(",") if x]
    servers = ns.servers.split(",") if ns.servers else ["sluiceway", "fastapi", "seedafter"] + (
        ["litserve"] if litserve_available() else [])
    unknown = [s for s in servers if s.split("-")[0] not in STARTERS]
    if unknown or len(set(servers)) != len(servers):
        p.error(f"bad --servers {ns.servers!r}: names must be unique, from {sorted(STARTERS)} "
                "(+ '-aa' suffix)")
    if "litserve" in servers and not litserve_available():
        p.error("litserve is not installed (pip install litserve)")
    budget = len(ks) * len(servers) * ns.reps * (ns.warmup + ns.duration)
    if budget > 3600:
        p.error(f"the run would take over {budget:.0f} s of load; the bound is 3600 s")

    client = setup_client(ns.nice)
    if not ns.pin:
        client.update(client_core=None, server_core=None)
    meta = machine_info()
    mu_info = measure_mu(ns.service_ms, ns.mu_seconds)
    mu = mu_info["mu"]
    print(f"# overload benchmark  {meta['started']}")
    print(f"# machine: {meta['cpus']} cpus, python {meta['python']}, client loop {meta['client_loop']}, "
          f"load average {meta['load_average_start']}")
    print(f"# pinning: server core {client['server_core']}, generator core {client['client_core']}"
          f"{'' if client['pinning_possible'] else ' (not possible here)'}; nice {client['nice']}")
    print(f"# stand-in {ns.service_ms:g} ms, one permit: mu measured {mu:.2f}/s (nominal "
          f"{mu_info['nominal_mu']:.1f}, mean service {mu_info['mean_service_ms']:.3f} ms, max "
          f"{mu_info['max_service_ms']:.3f} ms over {mu_info['samples']} calls)")
    print(f"# deadline {ns.deadline_ms:g} ms; per point {ns.warmup:g} s warm-up + {ns.duration:g} s window; "
          f"seed {ns.seed}; servers {', '.join(servers)}; reps {ns.reps}", flush=True)

    log_dir = RESULTS / "logs"
    points: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for rep in range(ns.reps):
        for k in ks:
            order = servers if rep % 2 == 0 else list(reversed(servers))  # ABAB... then BABA...
            for server in order:
                pt = run_point(server, k, mu, ns, log_dir)
                pt["rep"] = rep
                points.append(pt)
                print("  " + " | ".join(point_row(pt)), flush=True)
    wall = time.monotonic() - t0

    print()
    for rep in range(ns.reps):
        rows = [point_row(pt) for k in ks for pt in points if pt["k"] == k and pt["rep"] == rep]
        print(f"## results (rep {rep + 1}/{ns.reps}); G/mu = 2xx within {ns.deadline_ms:g} ms per s / mu; "
              "rej = 429/503/504 refused at admission; expired = dropped from the queue")
        print(table(HEADERS, rows))
        print()
    ours = "sluiceway"
    peers = [s for s in servers if s != ours]
    rat = ratios(points, ours, peers, ks, ns.reps) if ours in servers else []
    if rat:
        print(f"## ratios {ours}/peer (median over {ns.reps} rep(s))")
        print(table(["k", "peer", "G/mu ours", "G/mu peer", "goodput ratio", "rej p99 ratio"],
                    [[f"{r['k']:g}", r["peer"], fmt(r["goodput_ours"], ".3f"), fmt(r["goodput_peer"], ".3f"),
                      fmt(r["goodput_ratio"], ".2f") if r["goodput_ratio"] is not None else "inf (peer 0)",
                      fmt(r["reject_p99_ratio"], ".2f")] for r in rat]))
    invalid = [pt for pt in points if not pt["summary"]["client_valid"]]
    if invalid:
        print(f"\nWARNING: {len(invalid)} point(s) had > 0.1% of requests sent more than 1 ms late "
              "(generator lag; latencies still count from the scheduled time)")
    meta["load_average_end"] = load_average()
    print(f"# load average at end {meta['load_average_end']}; wall {wall:.0f} s")
    doc = {"benchmark": "overload", "meta": meta, "client": client, "mu": mu_info, "args": vars(ns),
           "servers": servers, "ks": ks, "points": points, "ratios": rat, "wall_seconds": wall}
    path = save_results("overload", doc)
    png = plot(doc, path.with_suffix(".png"))
    print(f"# results: {path}" + (f", plot: {png}" if png else ""))
    return 0


def plot(doc: dict[str, Any], path: Path) -> Path | None:
    """Goodput/mu vs offered load per server, and the CDF of 2xx latency at the lowest k (at the
    highest, the peers answer nothing within the deadline)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    kmax, kmin = max(doc["ks"]), min(doc["ks"])
    for server in doc["servers"]:
        pts = sorted((pt["k"], pt["summary"]["goodput_over_mu"]) for pt in doc["points"]
                     if pt["server"] == server and pt["rep"] == 0)
        axes[0].plot([k for k, _ in pts], [g for _, g in pts], "o-", label=server)
        top = [pt for pt in doc["points"] if pt["server"] == server and pt["k"] == kmin and pt["rep"] == 0]
        qs = top[0]["summary"].get("ok_quantiles_ms") if top else None
        if qs:
            axes[1].plot(qs, [q / 100 for q in range(1, 100)], label=server)
    axes[0].plot([min(doc["ks"]), kmax], [1, 1], ":", color="gray", label="ideal min(k,1)")
    axes[0].set_xlabel("offered load k (x mu)")
    axes[0].set_ylabel("goodput / mu (2xx within the deadline)")
    axes[0].set_title("goodput vs offered load")
    axes[1].set_xlabel("latency of 2xx answers (ms)")
    axes[1].set_ylabel("CDF")
    axes[1].set_title(f"2xx latency CDF at k = {kmin:g}")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
