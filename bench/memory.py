"""Benchmark (e): memory under sustained overload. RSS of each server's whole process tree, sampled
at 10 Hz while open-loop Poisson load at ``k`` x mu (default 4x) runs for ``--duration`` seconds
(default 60), every request with a 200 ms client deadline (the client gives up, as in
``bench.overload``).

Same stand-in (``synthetic:20``, one permit) and peers as ``bench.overload``: the pod, plain
FastAPI (no queue bound), the seed's "after" design (semaphore with a 30 s acquire timeout) and
LitServe when installed. A server without a queue bound keeps every abandoned request waiting, so
its memory grows with the backlog; the pod's bounded queue keeps it flat.

Per server: RSS at the start and end of the window, the least-squares slope (MB/s) over the window
after the warm-up, and the peak. Writes JSON + PNG (RSS over time per server) under
``bench/results/``.

    python -m bench.memory                          # 60 s per server
    python -m bench.memory --duration 20 --servers sluiceway,fastapi
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import machine_info, measure_mu, save_results, setup_client, table
from .loadgen import Stream, code_counts, fmt_codes, run_open_loop, run_sync
from .servers import RESULTS, STARTERS, ServerProc, litserve_available, load_average


def tree_rss(pgid: int) -> int:
    """Resident bytes of every process in the process group."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if os.getpgid(int(d.name)) != pgid:
                continue
            for line in (d / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
        except (OSError, ValueError):
            continue
    return total


class Sampler(threading.Thread):
    def __init__(self, srv: ServerProc, hz: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.srv, self.period = srv, 1.0 / hz
        self.samples: list[tuple[float, int]] = []
        self._halt = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self._halt.is_set():
            self.samples.append((time.monotonic() - self.t0, tree_rss(self.srv.proc.pid)))
            self._halt.wait(self.period)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


def slope_mb_s(samples: list[tuple[float, int]], after: float) -> float | None:
    pts = [(t, r) for t, r in samples if t >= after]
    if len(pts) < 3:
        return None
    t = np.array([p[0] for p in pts])
    r = np.array([p[1] for p in pts]) / 1e6
    return float(np.polyfit(t, r, 1)[0])


def plot(doc: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, v in doc["servers"].items():
        s = v["samples"]
        ax.plot([p[0] for p in s], [p[1] / 1e6 for p in s], label=f"{name} ({v['slope_mb_s']:+.2f} MB/s)")
    ax.set_xlabel("seconds (load starts at 0)")
    ax.set_ylabel("RSS of the process tree (MB)")
    ax.set_title(f"memory at {doc['args']['k']:g}x overload, 200 ms client deadline")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--k", type=float, default=4.0)
    p.add_argument("--servers", default=None)
    p.add_argument("--service-ms", type=float, default=20.0)
    p.add_argument("--deadline-ms", type=float, default=200.0)
    p.add_argument("--seed", type=int, default=20261201)
    ns = p.parse_args(argv)
    servers = ns.servers.split(",") if ns.servers else ["sluiceway", "fastapi", "seedafter"] + (
        ["litserve"] if litserve_available() else [])
    client = setup_client(None)
    meta = machine_info()
    mu = measure_mu(ns.service_ms, 3.0)["mu"]
    rate = ns.k * mu
    print(f"# memory benchmark {meta['started']}; load average {meta['load_average_start']}; mu {mu:.1f}/s, "
          f"offered {rate:.0f}/s for {ns.warmup:g}+{ns.duration:g} s per server; pinning {client['server_core']}/"
          f"{client['client_core']}", flush=True)
    log_dir = RESULTS / "logs"
    res: dict[str, Any] = {}
    for name in servers:
        kw: dict[str, Any] = {"service_ms": ns.service_ms}
        if name == "litserve":
            kw["timeout_s"] = 60.0  # its only bound; long, so its queue shows (it answers 504 after)
        srv = STARTERS[name](log_dir, **kw)
        sampler = Sampler(srv)
        try:
            sampler.start()
            stream = Stream("main", rate, {}, deadline_ms=ns.deadline_ms, timeout_s=ns.deadline_ms / 1000)
            r = run_sync(run_open_loop(srv.infer_url, [stream], duration=ns.duration, warmup=ns.warmup,
                                       seed=ns.seed, max_inflight=5000))
            time.sleep(0.5)
        finally:
            sampler.stop()
            srv.stop()
        s = sampler.samples
        slope = slope_mb_s(s, ns.warmup)
        rss = [x[1] for x in s]
        res[name] = {"slope_mb_s": slope, "rss_start_mb": rss[0] / 1e6, "rss_end_mb": rss[-1] / 1e6,
                     "rss_peak_mb": max(rss) / 1e6, "codes": code_counts(r.window()), "samples": s}
        print(f"  {name}: RSS {rss[0] / 1e6:.1f} -> {rss[-1] / 1e6:.1f} MB (peak {max(rss) / 1e6:.1f}), "
              f"slope {slope or 0:+.3f} MB/s; {fmt_codes(res[name]['codes'])}", flush=True)
    meta["load_average_end"] = load_average()
    print(f"\n## RSS at {ns.k:g}x mu over {ns.duration:g} s (after {ns.warmup:g} s warm-up)")
    print(table(["server", "start MB", "end MB", "peak MB", "slope MB/s"],
                [[n, f"{v['rss_start_mb']:.1f}", f"{v['rss_end_mb']:.1f}", f"{v['rss_peak_mb']:.1f}",
                  f"{v['slope_mb_s'] or 0:+.3f}"] for n, v in res.items()]))
    print(f"# load average at end {meta['load_average_end']}")
    doc = {"benchmark": "memory", "meta": meta, "args": vars(ns), "mu": mu, "servers": res}
    path = save_results("memory", doc)
    png = plot(doc, path.with_suffix(".png"))
    print(f"# results: {path}" + (f", plot: {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
