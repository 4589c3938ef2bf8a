"""Benchmark (d): dynamic batching gain against its ideal, ours vs LitServe, on a CPU torch model.

The model is a seeded MLP (``bench.batching:mlp``: 512 -> 4096 -> 4096 -> 512, one torch thread).
In one run:

1. the kernel alone, in this process on the server core: ``T(B)`` (the fastest of the calls made in
   one second: on a shared core the mean mostly measures the neighbours) for B = 1, 2, 4, 8, 16, 32,
   and the ideal gain ``G*(B) = B * T(1) / T(B)``;
2. each server, fresh and pinned to core 0, saturated by ``wrk -c 32`` on core 1 with one 512-value
   JSON row per request, once with batching off (max batch 1) and once with max batch ``B`` (8)
   and the same wait (5 ms): measured gain = rps(B) / rps(1), efficiency = measured / ideal.

Ours: the pod with one permit, ``maxBatchSize`` B, ``maxBatchWaitMs`` 5. LitServe: one worker,
``max_batch_size`` B, ``batch_timeout`` 0.005, the same model (:mod:`bench.batching_litserve`,
started by the driver). Writes JSON + PNG under ``bench/results/``.

    python -m bench.batching [--duration 8] [--batch 8]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .common import machine_info, save_results, table
from .overhead import wrk
from .servers import (
    RESULTS,
    SERVER_CORE,
    ServerProc,
    _env,
    _spawn,
    free_port,
    litserve_available,
    load_average,
    pin_self,
    pinning_possible,
    start_pod,
)

DIMS = (512, 4096, 4096, 512)


def mlp() -> Any:
    import torch

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(20261201)
    layers: list[Any] = []
    for a, b in itertools.pairwise(DIMS):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers[:-1])
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return net.eval()


def kernel_times(sizes: list[int], seconds: float = 1.0) -> dict[int, float]:
    import torch

    net = mlp()
    pinned = pinning_possible() and pin_self(SERVER_CORE)
    out: dict[int, float] = {}
    try:
        with torch.inference_mode():
            for b in sizes:
                x = torch.ones(b, DIMS[0])
                net(x)
                # the fastest call: on a shared core the mean mostly measures the neighbours
                calls: list[float] = []
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < seconds or len(calls) < 5:
                    c = time.perf_counter()
                    net(x)
                    calls.append(time.perf_counter() - c)
                out[b] = min(calls)
    finally:
        if pinned:
            from .servers import CLIENT_CORE

            pin_self(CLIENT_CORE)
    return out


def body() -> bytes:
    x = np.random.default_rng(3).random(DIMS[0], dtype=np.float32)
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, DIMS[0]], "datatype": "FP32",
                                   "data": [round(float(v), 4) for v in x]}]}).encode()


def start_lit(log_dir: Path, max_batch: int, wait: float) -> ServerProc:
    port = free_port()
    argv = [sys.executable, "-m", "bench.batching_litserve", "--port", str(port), "--max-batch", str(max_batch),
            "--wait", str(wait)]
    proc, log = _spawn("litserve-batch", argv, log_dir, SERVER_CORE if pinning_possible() else None, _env())
    srv = ServerProc("litserve", proc, port, "/v2/models/demo/infer", "/health", log)
    srv.wait_ready(timeout=120)
    return srv


def start_ours(log_dir: Path, tmp: Path, max_batch: int, wait_ms: float) -> ServerProc:
    cfg = {"model": {"spec": "bench.batching:mlp", "warmupIterations": 2,
                     "inputs": [{"name": "INPUT0", "shape": [-1, DIMS[0]]}],
                     "outputs": [{"name": "OUTPUT0", "shape": [-1, DIMS[-1]]}]},
           "concurrency": {"permits": 1}, "batching": {"maxBatchSize": max_batch, "maxBatchWaitMs": wait_ms},
           "queue": {"maxDepth": 512, "timeoutSeconds": 30}}
    path = tmp / f"batch-{max_batch}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return start_pod(log_dir, config_file=path)


def plot(doc: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    t = doc["kernel_ms"]
    bs = sorted(int(b) for b in t)
    axes[0].plot(bs, [b * t["1"] / t[str(b)] for b in bs], "o-", label="ideal B·T(1)/T(B)")
    axes[0].plot(bs, bs, ":", color="gray", label="B")
    axes[0].set_xlabel("batch size B")
    axes[0].set_ylabel("gain")
    axes[0].set_xscale("log", base=2)
    axes[0].legend()
    axes[0].set_title("kernel: ideal batching gain")
    names = list(doc["servers"])
    b = doc["args"]["batch"]
    ideal = doc["ideal_gain"]
    axes[1].bar(["ideal", *names], [ideal, *(doc["servers"][n]["gain"] or 0 for n in names)],
                color=["gray", "tab:blue", "tab:orange"][: 1 + len(names)])
    axes[1].set_title(f"measured gain rps(B={b})/rps(1) over HTTP")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.batching", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--wait-ms", type=float, default=5.0)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--servers", default=None, help="sluiceway[,litserve]")
    ns = p.parse_args(argv)
    servers = ns.servers.split(",") if ns.servers else ["sluiceway"] + (["litserve"] if litserve_available() else [])
    meta = machine_info()
    sizes = [1, 2, 4, 8, 16, 32]
    kt = kernel_times(sizes)
    ideal = ns.batch * kt[1] / kt[ns.batch]
    print(f"# batching benchmark {meta['started']}; load average {meta['load_average_start']}")
    print("# kernel T(B) ms: " + ", ".join(f"{b}: {kt[b] * 1000:.2f}" for b in sizes))
    print(f"# ideal gain G*({ns.batch}) = {ns.batch} * T(1) / T({ns.batch}) = {ideal:.2f}", flush=True)
    log_dir = RESULTS / "logs"
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for name in servers:
            rps: dict[int, float] = {}
            for b in (1, ns.batch):
                srv = start_ours(log_dir, tmp, b, ns.wait_ms) if name == "sluiceway" else start_lit(
                    log_dir, b, ns.wait_ms / 1000)
                try:
                    wrk(srv.infer_url, body(), ns.connections, 2.0, tmp)  # warm-up
                    r = wrk(srv.infer_url, body(), ns.connections, ns.duration, tmp)
                finally:
                    srv.stop()
                rps[b] = r["rps"]
                print(f"  {name} max batch {b}: {r['rps']:.1f} rps (p50 {r['p50_ms']} ms, non-2xx {r['non_2xx']})",
                      flush=True)
            gain = rps[ns.batch] / rps[1] if rps[1] else None
            res[name] = {"rps": rps, "gain": gain, "efficiency": gain / ideal if gain else None}
    meta["load_average_end"] = load_average()
    print(f"\n## batching gain at B={ns.batch}, wait {ns.wait_ms:g} ms; ideal {ideal:.2f}")
    print(table(["server", "rps B=1", f"rps B={ns.batch}", "gain", "efficiency (gain/ideal)"],
                [[n, f"{v['rps'][1]:.1f}", f"{v['rps'][ns.batch]:.1f}", f"{v['gain'] or 0:.2f}",
                  f"{v['efficiency'] or 0:.2f}"] for n, v in res.items()]))
    if "sluiceway" in res and "litserve" in res and res["litserve"]["gain"]:
        print(f"ratio of gains ours/litserve: {res['sluiceway']['gain'] / res['litserve']['gain']:.2f}")
    print(f"# load average at end {meta['load_average_end']}")
    doc = {"benchmark": "batching", "meta": meta, "args": vars(ns),
           "kernel_ms": {str(b): v * 1000 for b, v in kt.items()}, "ideal_gain": ideal, "servers": res}
    path = save_results("batching", doc)
    png = plot(doc, path.with_suffix(".png"))
    print(f"# results: {path}" + (f", plot: {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
