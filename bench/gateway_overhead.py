"""What the gateway adds: open-loop load on the no-op model, gateway + pod against the pod direct.

Each point runs the same Poisson schedule (:mod:`bench.loadgen`, latency from the intended send
time) at ``--rate`` for ``--duration`` seconds after a warm-up, against:

* ``direct``: one pod (``synthetic:0``, the no-op model);
* ``gateway``: the same pod behind ``sluiceway-gateway`` (static endpoint, ``leastWait``), with the
  gateway's event loop as ``--loops`` says (``uvloop`` and/or ``asyncio``).

Printed per point: answers, p50 and p99 latency, and CPU microseconds per answered request of the pod
and of the gateway, read from ``/proc/<pid>/task/*/schedstat`` at the window's edges (the CPU the
processes used, not wall time). Then the added p50/p99 (gateway point minus the direct point) and
the gateway's CPU per request as a multiple of the pod's, against the goals (added p50 <= 1 ms,
gateway CPU <= 0.5x the pod's). The pod is pinned to core 0, the gateway to the same core as the
generator (1) when pinning is possible; the run-queue wait column says how much other work held each
server back (a loaded machine shows here), and each point's load average (1/5/15 min) at its start
and end. JSON and a PNG (p50/p99 and CPU per request per point) go to
``bench/results/gateway_overhead-*``; ``--plot`` also writes the PNG where the docs link it.

    python -m bench.gateway_overhead                       # 300/s, 8 s, uvloop and asyncio
    python -m bench.gateway_overhead --rate 200 --duration 3 --loops uvloop
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from .common import fmt, machine_info, save_results, server_load, table, window_probes
from .loadgen import Stream, code_counts, ok, percentile, run_open_loop, run_sync
from .servers import CLIENT_CORE, ServerProc, _env, _spawn, free_port, load_average, pinning_possible, start_pod

GOAL_ADDED_P50_MS = 1.0
GOAL_CPU_RATIO = 0.5


def start_gateway(log_dir: Path, pod: ServerProc, loop: str, core: int | None) -> ServerProc:
    port, mport = free_port(), free_port()
    cfg = {"listen": {"host": "127.0.0.1", "port": port, "metricsPort": mport},
           "endpoints": [f"127.0.0.1:{pod.port}"], "routing": "leastWait"}
    path = log_dir / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    argv = [sys.executable, "-m", "sluiceway_gateway.cli", "serve", "--config", str(path), "--loop", loop,
            "--log-level", "warning"]
    proc, log = _spawn(f"gateway-{loop}", argv, log_dir, core, _env())
    srv = ServerProc(f"gateway-{loop}", proc, port, "/v2/models/demo/infer", "/v2/health/ready", log,
                     metrics_port=mport)
    srv.wait_ready()
    return srv


def measure(url: str, servers: dict[str, ServerProc], rate: float, duration: float, warmup: float,
            seed: int) -> dict[str, Any]:
    probes: dict[str, Any] = {}
    for name, srv in servers.items():
        for k, v in window_probes(srv, warmup, duration).items():
            probes[f"{name}:{k}"] = v
    la0 = load_average()
    res = run_sync(run_open_loop(url, [Stream("s", rate, timeout_s=5.0)], duration=duration, warmup=warmup,
                                 seed=seed, probes=probes))
    window = res.window()
    lat = [r.latency for r in window if ok(r) and r.latency is not None]
    answered = len(lat)
    out: dict[str, Any] = {"requests": len(window), "ok": answered, "codes": code_counts(window),
                           "p50_ms": _ms(percentile(lat, 50)), "p99_ms": _ms(percentile(lat, 99)),
                           "valid": res.valid, "lag_share": res.lag_share, "load_average": [la0, load_average()]}
    for name in servers:
        sub = type(res)(res.records, res.warmup, res.duration, res.seed, res.lagged, res.max_lag,
                        {"cpu_start": res.probes.get(f"{name}:cpu_start"),
                         "cpu_end": res.probes.get(f"{name}:cpu_end")}, res.wall_seconds)
        load = server_load(sub)
        cpu = load["server_cpu"]
        out[f"{name}_cpu_us_per_req"] = cpu * duration / answered * 1e6 if cpu is not None and answered else None
        out[f"{name}_runq_wait_share"] = load["server_runq_wait"]
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=300.0, help="offered requests per second (Poisson)")
    p.add_argument("--duration", type=float, default=8.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--loops", default="uvloop,asyncio", help="the gateway's event loops to measure, comma-separated")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--plot", type=Path, help="also write the PNG here (e.g. docs/img/perf/gateway-overhead.png)")
    ns = p.parse_args(argv)
    loops = [x for x in ns.loops.split(",") if x]
    if not loops or any(x not in ("uvloop", "asyncio") for x in loops):
        p.error("--loops takes uvloop and/or asyncio")
    pinned = pinning_possible()
    print(f"# gateway overhead: no-op model, open loop {ns.rate:g}/s, {ns.duration:g} s per point "
          f"(+{ns.warmup:g} s warm-up); load average {load_average()}; pinning {'on' if pinned else 'off'}")
    doc: dict[str, Any] = {"machine": machine_info(), "rate": ns.rate, "duration": ns.duration, "points": {}}
    with tempfile.TemporaryDirectory(prefix="gw-overhead-") as tmp:
        log_dir = Path(tmp)
        pod = start_pod(log_dir, service_ms=0.0, extra=["--concurrency", "4", "--max-queue", "1024"])
        gateways: list[ServerProc] = []
        try:
            doc["points"]["direct"] = measure(pod.infer_url, {"pod": pod}, ns.rate, ns.duration, ns.warmup, ns.seed)
            for loop in loops:
                gw = start_gateway(log_dir, pod, loop, CLIENT_CORE if pinned else None)
                gateways.append(gw)
                time.sleep(0.5)
                doc["points"][f"gateway-{loop}"] = measure(gw.infer_url, {"pod": pod, "gateway": gw}, ns.rate,
                                                           ns.duration, ns.warmup, ns.seed)
                gw.stop()
        finally:
            for gw in gateways:
                gw.stop()
            pod.stop()
    pts = doc["points"]
    d = pts["direct"]
    rows = []
    for name, pt in pts.items():
        rows.append([name, str(pt["ok"]), str(pt["requests"]), fmt(pt["p50_ms"]), fmt(pt["p99_ms"]),
                     fmt(pt.get("pod_cpu_us_per_req"), ".0f"), fmt(pt.get("gateway_cpu_us_per_req"), ".0f"),
                     fmt(pt.get("pod_runq_wait_share"), ".2f"), " -> ".join(pt["load_average"]),
                     "" if pt["valid"] else "generator lagged"])
    print(table(["point", "ok", "sent", "p50 ms", "p99 ms", "pod CPU us/req", "gateway CPU us/req",
                 "pod runq wait", "load average start -> end", "note"], rows))
    summary = {}
    for name, pt in pts.items():
        if name == "direct":
            continue
        added50 = pt["p50_ms"] - d["p50_ms"] if pt["p50_ms"] is not None and d["p50_ms"] is not None else None
        added99 = pt["p99_ms"] - d["p99_ms"] if pt["p99_ms"] is not None and d["p99_ms"] is not None else None
        g, pd = pt.get("gateway_cpu_us_per_req"), d.get("pod_cpu_us_per_req")
        ratio = g / pd if g is not None and pd else None
        summary[name] = {"added_p50_ms": added50, "added_p99_ms": added99, "gateway_cpu_over_pod": ratio}
        print(f"{name}: added p50 {fmt(added50)} ms (goal <= {GOAL_ADDED_P50_MS:g}: "
              f"{'met' if added50 is not None and added50 <= GOAL_ADDED_P50_MS else 'NOT met'}), "
              f"added p99 {fmt(added99)} ms, gateway CPU {fmt(ratio)}x the pod's "
              f"(goal <= {GOAL_CPU_RATIO:g}: {'met' if ratio is not None and ratio <= GOAL_CPU_RATIO else 'NOT met'})")
    doc["summary"] = summary
    doc["load_average_end"] = load_average()
    print(f"# load average at end {doc['load_average_end']}")
    saved = save_results("gateway_overhead", doc)
    print(f"results: {saved}")
    png = plot(doc, saved.with_suffix(".png"))
    if png is None:
        print("plot: matplotlib is not installed; no PNG")
    else:
        print(f"plot: {png}")
        if ns.plot is not None:
            ns.plot.parent.mkdir(parents=True, exist_ok=True)
            ns.plot.write_bytes(png.read_bytes())
            print(f"plot: {ns.plot}")
    return 0


def plot(doc: dict[str, Any], path: Path) -> Path | None:
    """Two panels per point: p50 and p99 latency; the pod's and the gateway's CPU per request."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    pts: dict[str, Any] = doc["points"]
    names = list(pts)
    x = list(range(len(names)))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    ax = axes[0]
    ax.bar([i - 0.2 for i in x], [pts[n]["p50_ms"] or 0 for n in names], 0.4, label="p50", color="tab:blue")
    ax.bar([i + 0.2 for i in x], [pts[n]["p99_ms"] or 0 for n in names], 0.4, label="p99", color="tab:red")
    ax.set_ylabel("ms (from the scheduled send)")
    ax.set_title("latency, no-op model")
    ax = axes[1]
    ax.bar([i - 0.2 for i in x], [pts[n].get("pod_cpu_us_per_req") or 0 for n in names], 0.4, label="pod",
           color="tab:gray")
    ax.bar([i + 0.2 for i in x], [pts[n].get("gateway_cpu_us_per_req") or 0 for n in names], 0.4,
           label="gateway", color="tab:green")
    ax.set_ylabel("CPU us per answered request")
    ax.set_title("CPU per request")
    for a in axes:
        a.set_xticks(x, names)
        a.legend()
        a.grid(alpha=0.3)
    fig.suptitle(f"gateway overhead: open loop {doc['rate']:g}/s, {doc['duration']:g} s per point; load average "
                 f"{doc['machine']['load_average_start']} at start, {doc['load_average_end']} at end", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
