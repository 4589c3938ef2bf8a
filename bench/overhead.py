"""Benchmark (a): the data plane's own cost. No-op model, closed loop, ours vs plain FastAPI vs LitServe.

Every server is a fresh process pinned to core 0; ``wrk`` (Debian's 4.1.0, one thread) is pinned
to core 1. Per server it measures, in one run:

* ``rps`` at ``-c 32`` and ``p50``/``p99`` from wrk's latency distribution, and ``c=1 p50``;
* ``cpu us/req``: the server's CPU time (all threads and processes, ``/proc/*/schedstat``) during
  the ``-c 32`` run divided by the requests wrk completed, the cost that caps a core's rps.

For the pod it also measures, on the same pod type:

* ``json 100k`` / ``binary 100k``: a 100,000-element FP32 tensor echoed back (``synthetic:0``),
  once as OIP JSON, once with the binary tensor extension (request and response);
* ``429``: every request refused by the tenant rate limit (``tenants.defaults.rate`` tiny), small
  body and 100k JSON body: CPU per refusal vs per accepted request.

The no-op points repeat ``--reps`` times (3) in alternating order (ABC, CBA, ...); the table shows
the median of each figure and the ratios are medians of the per-repetition ratios (the machine is
shared: single runs of the same command differed by 1.4x in the pod/FastAPI ratio). It prints the
table and the ratios (ours/FastAPI rps, binary/JSON rps, 429 CPU / accepted CPU), writes JSON and a
PNG under ``bench/results/``.

``--in-process N`` measures the same no-op request without HTTP or wrk: each app (the pod's ASGI
app on a started :class:`~sluiceway_pod.data_plane.DataPlane`, and the plain FastAPI app) is called
``N`` times in a fresh process pinned to core 0, by 32 and by 1 concurrent callers, and the process
CPU time (all threads) per request is printed. No sockets and no client share the core, so it is
steadier than the wrk points on a loaded machine; to compare two trees, run it with ``PYTHONPATH``
pointing at the other tree's ``inference-pod`` and ``core`` folders.

    python -m bench.overhead                  # 8 s per point, 3 repetitions of the no-op points
    python -m bench.overhead --duration 4 --reps 1 --servers sluiceway,fastapi
    python -m bench.overhead --in-process 10000 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .common import machine_info, save_results, table
from .servers import (
    CLIENT_CORE,
    RESULTS,
    ServerProc,
    litserve_available,
    load_average,
    pinning_possible,
    start_fastapi,
    start_litserve,
    start_pod,
)

LUA = """
wrk.method = "POST"
local f = io.open(os.getenv("WRK_BODY"), "rb")
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = os.getenv("WRK_CTYPE") or "application/json"
local hl = os.getenv("WRK_HDR_LEN")
if hl and hl ~= "" then wrk.headers["Inference-Header-Content-Length"] = hl end
"""


def small_body() -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                                   "data": [1.0, 2.0, 3.0, 4.0]}]}).encode()


def big_json(n: int) -> bytes:
    x = np.random.default_rng(1).random(n, dtype=np.float32)
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, n], "datatype": "FP32",
                                   "data": x.tolist()}]}).encode()


def big_binary(n: int) -> tuple[bytes, int]:
    raw = np.random.default_rng(1).random(n, dtype=np.float32).astype("<f4").tobytes()
    head = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, n], "datatype": "FP32",
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + raw, len(head)


def _ms(raw: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", raw)
    if not m:
        return float("nan")
    v, unit = float(m.group(1)), m.group(2)
    return v / 1000 if unit == "us" else v * 1000 if unit == "s" else v


def wrk(url: str, body: bytes, conns: int, seconds: float, tmp: Path, *, ctype: str = "application/json",
        hdr_len: int | None = None) -> dict[str, Any]:
    body_file = tmp / f"body-{len(body)}-{hdr_len}.bin"
    body_file.write_bytes(body)
    lua = tmp / "post.lua"
    lua.write_text(LUA)
    env = {**os.environ, "WRK_BODY": str(body_file), "WRK_CTYPE": ctype, "WRK_HDR_LEN": str(hdr_len or "")}
    argv = ["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "--latency", "-s", str(lua), url]
    if pinning_possible():
        argv = ["taskset", "-c", str(CLIENT_CORE), *argv]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=seconds + 60).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    lat = {q: _ms(v) for q, v in re.findall(r"^\s+(50|90|99)%\s+(\S+)", out, re.M)}
    return {"rps": float(rps.group(1)) if rps else 0.0, "requests": int(total.group(1)) if total else 0,
            "non_2xx": int(non2xx.group(1)) if non2xx else 0, "p50_ms": lat.get("50"), "p99_ms": lat.get("99"),
            "raw": out}


def measure(srv: ServerProc, body: bytes, conns: int, seconds: float, tmp: Path, **kw: Any) -> dict[str, Any]:
    wrk(srv.infer_url, body, conns, min(1.0, seconds), tmp, **kw)  # warm-up
    c0 = srv.cpu_stats()
    r = wrk(srv.infer_url, body, conns, seconds, tmp, **kw)
    c1 = srv.cpu_stats()
    cpu = c1["cpu_s"] - c0["cpu_s"]
    r["cpu_s"] = cpu
    r["cpu_us_per_req"] = cpu / r["requests"] * 1e6 if r["requests"] else None
    r["runq_share"] = (c1["runq_wait_s"] - c0["runq_wait_s"]) / seconds
    return r


def _median(xs: list[Any]) -> Any:
    vals = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(vals) if vals else None


def pod_config(tmp: Path, name: str, extra: dict[str, Any]) -> Path:
    cfg = {"model": {"spec": "synthetic:0", "warmupIterations": 1},
           "concurrency": {"permits": 2}, "queue": {"maxDepth": 256}, **extra}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def plot(doc: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    pts = doc["noop"]
    names = list(pts)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].bar(names, [pts[n]["rps"] for n in names], color="tab:blue")
    axes[0].set_title("no-op rps, c=32 (higher is better)")
    axes[1].bar(names, [pts[n]["cpu_us_per_req"] or 0 for n in names], color="tab:orange")
    axes[1].set_title("server CPU µs per request")
    axes[2].bar(names, [pts[n]["c1_p50_ms"] or 0 for n in names], color="tab:green")
    axes[2].set_title("c=1 p50 latency (ms)")
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"overhead {doc['meta']['started']} (load avg {doc['meta']['load_average_start']})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _inproc_worker(which: str, n: int, conc: int) -> dict[str, float]:
    """In this process: call the app ``n`` times by ``conc`` concurrent callers (after 1000 warm-up
    calls); returns CPU and wall microseconds per request."""
    import asyncio
    import time

    import uvloop

    body = small_body()
    scope = {"type": "http", "method": "POST", "path": "/v2/models/demo/infer", "query_string": b"",
             "root_path": "", "scheme": "http", "server": ("127.0.0.1", 80),
             "headers": [(b"host", b"x"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}

    async def drive(app: Any, total: int) -> None:
        async def one() -> None:
            msgs = [{"type": "http.request", "body": body, "more_body": False}]
            gone = asyncio.Event()

            async def receive() -> dict[str, Any]:
                if msgs:
                    return msgs.pop()
                await gone.wait()
                return {"type": "http.disconnect"}

            out: list[dict[str, Any]] = []

            async def send(m: dict[str, Any]) -> None:
                out.append(m)

            await app(dict(scope), receive, send)
            gone.set()
            if out[0]["status"] != 200:
                raise RuntimeError(f"status {out[0]['status']}: {out}")

        async def caller(k: int) -> None:
            for _ in range(k):
                await one()

        await asyncio.gather(*(caller(total // conc) for _ in range(conc)))

    async def run() -> dict[str, float]:
        if which == "sluiceway":
            from prometheus_client import CollectorRegistry
            from sluiceway_core.config import build_config
            from sluiceway_pod.app import build_app
            from sluiceway_pod.data_plane import DataPlane
            from sluiceway_pod.metrics import PodMetrics

            cfg = build_config({"model": {"spec": "synthetic:0", "warmupIterations": 1},
                                "concurrency": {"permits": 2}, "queue": {"maxDepth": 256}})
            plane = DataPlane(cfg, PodMetrics(CollectorRegistry(), cfg.model.name))
            await plane.start()
            app: Any = build_app(plane)
        else:
            from .baseline_fastapi import build_app as build_fastapi

            app = build_fastapi(0.0)
        await drive(app, 1000)
        c0, t0 = time.process_time(), time.perf_counter()
        await drive(app, n)
        done = n // conc * conc
        return {"cpu_us": (time.process_time() - c0) / done * 1e6, "wall_us": (time.perf_counter() - t0) / done * 1e6}

    return uvloop.run(run())


def in_process(n: int, reps: int) -> int:
    """The ``--in-process`` table: per repetition, each app in a fresh pinned process, order alternating."""
    servers = ["sluiceway", "fastapi"]
    meta = machine_info()
    print(f"# in-process overhead {meta['started']}; load average {meta['load_average_start']}; core 0; "
          f"{n} requests per point", flush=True)
    got: dict[tuple[str, int], list[dict[str, float]]] = {}
    for rep in range(reps):
        for name in servers if rep % 2 == 0 else list(reversed(servers)):
            for conc in (32, 1):
                cmd = [sys.executable, "-m", "bench.overhead", "--in-process-worker", name, str(n), str(conc)]
                if pinning_possible():
                    cmd = ["taskset", "-c", "0", *cmd]
                env = dict(os.environ, OMP_NUM_THREADS="1", SLUICEWAY_SERVER__LOG_LEVEL="warning")
                out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True, timeout=600).stdout
                r = json.loads(out.strip().splitlines()[-1])
                got.setdefault((name, conc), []).append(r)
                print(f"  rep {rep + 1} {name} c={conc}: cpu {r['cpu_us']:.1f} us/req, wall {r['wall_us']:.1f} us/req",
                      flush=True)
    rows = [[name, str(conc), f"{_median([r['cpu_us'] for r in rs]):.1f}", f"{_median([r['wall_us'] for r in rs]):.1f}"]
            for (name, conc), rs in got.items()]
    print(f"\n## no-op through the ASGI app in-process (no HTTP), median of {reps} repetition(s)")
    print(table(["app", "callers", "cpu us/req", "wall us/req"], rows))
    for conc in (32, 1):
        ours, peer = got[("sluiceway", conc)], got[("fastapi", conc)]
        ratio = _median([a["cpu_us"] / b["cpu_us"] for a, b in zip(ours, peer, strict=True)])
        print(f"  cpu/req ours/fastapi, {conc} caller(s): {ratio:.2f}")
    print(f"# load average at end {load_average()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--in-process-worker"]:
        print(json.dumps(_inproc_worker(argv[1], int(argv[2]), int(argv[3]))), flush=True)
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--servers", default=None, help="sluiceway,fastapi[,litserve]")
    p.add_argument("--elements", type=int, default=100_000, help="tensor size of the codec comparison")
    p.add_argument("--skip-pod-extras", action="store_true", help="no codec / 429 points")
    p.add_argument("--reps", type=int, default=3, help="no-op repetitions, order alternating; ratios are medians")
    p.add_argument("--in-process", type=int, metavar="N", default=0,
                   help="instead: N no-op calls per point through the ASGI apps in-process (no HTTP, no wrk)")
    ns = p.parse_args(argv)
    if ns.in_process:
        return in_process(ns.in_process, ns.reps)
    if shutil.which("wrk") is None:
        p.error("wrk is not installed (apt-get install wrk)")
    servers = ns.servers.split(",") if ns.servers else ["sluiceway", "fastapi"] + (
        ["litserve"] if litserve_available() else [])
    meta = machine_info()
    log_dir = RESULTS / "logs"
    doc: dict[str, Any] = {"benchmark": "overhead", "meta": meta, "args": vars(ns), "noop": {}, "pod": {}}
    d, c = ns.duration, ns.connections
    print(f"# overhead benchmark {meta['started']}; load average {meta['load_average_start']}; "
          f"server core 0, wrk core {CLIENT_CORE}; {d:g} s per point, c={c}", flush=True)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        reps: list[dict[str, dict[str, Any]]] = []
        for rep in range(ns.reps):
            order = servers if rep % 2 == 0 else list(reversed(servers))  # ABC, CBA, ABC, ...
            reps.append({})
            for name in order:
                if name == "sluiceway":
                    srv = start_pod(log_dir, config_file=pod_config(tmp, "noop", {}))
                elif name == "fastapi":
                    srv = start_fastapi(log_dir, service_ms=0.0)
                else:
                    srv = start_litserve(log_dir, service_ms=0.0, timeout_s=30.0)
                try:
                    r = measure(srv, small_body(), c, d, tmp)
                    r1 = wrk(srv.infer_url, small_body(), 1, min(d, 4.0), tmp)
                finally:
                    srv.stop()
                r["c1_p50_ms"], r["c1_rps"] = r1["p50_ms"], r1["rps"]
                reps[-1][name] = {k: v for k, v in r.items() if k != "raw"}
                print(f"  rep {rep + 1} {name}: {r['rps']:.0f} rps, cpu {r['cpu_us_per_req'] or 0:.0f} us/req, "
                      f"c=1 p50 {r1['p50_ms']} ms, non-2xx {r['non_2xx']}", flush=True)
        doc["noop_reps"] = reps
        for name in servers:  # the median over repetitions of every figure
            doc["noop"][name] = {k: _median([rp[name][k] for rp in reps]) for k in reps[0][name]}
        if "sluiceway" in servers and not ns.skip_pod_extras:
            n = ns.elements
            srv = start_pod(log_dir, config_file=pod_config(tmp, "codec", {}))
            try:
                bj = big_json(n)
                doc["pod"]["json_big"] = measure(srv, bj, 4, d, tmp)
                bb, hl = big_binary(n)
                doc["pod"]["binary_big"] = measure(srv, bb, 4, d, tmp, ctype="application/octet-stream",
                                                   hdr_len=hl)
            finally:
                srv.stop()
            srv = start_pod(log_dir, config_file=pod_config(tmp, "refuse", {
                "tenants": {"defaults": {"rate": 0.001, "burst": 1}}}))
            try:
                doc["pod"]["refuse_small"] = measure(srv, small_body(), c, d, tmp)
                doc["pod"]["refuse_big"] = measure(srv, big_json(n), 4, d, tmp)
            finally:
                srv.stop()
            for v in doc["pod"].values():
                v.pop("raw", None)
    meta["load_average_end"] = load_average()
    rows = [[n, f"{v['rps']:.0f}", f"{v['p50_ms']}", f"{v['p99_ms']}", f"{v['c1_p50_ms']}",
             f"{v['cpu_us_per_req'] or 0:.0f}", f"{v['runq_share']:.0%}", str(v["non_2xx"])]
            for n, v in doc["noop"].items()]
    print(f"\n## no-op, closed loop (wrk -t1), server pinned to core 0; median of {ns.reps} repetition(s)")
    print(table(["server", f"rps c={c}", "p50 ms", "p99 ms", "c=1 p50 ms", "cpu us/req", "srv runq", "non-2xx"],
                rows))
    ratios: dict[str, float | None] = {}
    noop = doc["noop"]
    if "sluiceway" in noop:
        for peer in [s for s in noop if s != "sluiceway"]:  # median over repetitions of the per-rep ratio
            ratios[f"rps ours/{peer}"] = _median([rp["sluiceway"]["rps"] / rp[peer]["rps"]
                                                  for rp in doc["noop_reps"] if rp[peer]["rps"]])
            ratios[f"cpu/req ours/{peer}"] = _median([
                (rp["sluiceway"]["cpu_us_per_req"] or 0) / rp[peer]["cpu_us_per_req"]
                for rp in doc["noop_reps"] if rp[peer]["cpu_us_per_req"]])
    pod = doc["pod"]
    if pod:
        print(f"\n## pod: {ns.elements}-element FP32 tensor echoed, c=4; and refusals (429, tenant rate limit)")
        prow = [[k, f"{v['rps']:.0f}", f"{v['cpu_us_per_req'] or 0:.0f}", f"{v['p50_ms']}", str(v["non_2xx"])]
                for k, v in pod.items()]
        print(table(["point", "rps", "cpu us/req", "p50 ms", "non-2xx"], prow))
        ratios["binary/json rps (100k)"] = pod["binary_big"]["rps"] / pod["json_big"]["rps"]
        acc = noop.get("sluiceway", {}).get("cpu_us_per_req")
        if acc:
            ratios["429 cpu / accepted cpu (small body)"] = (pod["refuse_small"]["cpu_us_per_req"] or 0) / acc
        if pod["json_big"]["cpu_us_per_req"]:
            ratios["429 cpu / accepted cpu (100k JSON body)"] = (
                (pod["refuse_big"]["cpu_us_per_req"] or 0) / pod["json_big"]["cpu_us_per_req"])
    print("\n## ratios (one run; the no-op ones are medians of the per-repetition ratios)")
    for k, v in ratios.items():
        print(f"  {k}: {'-' if v is None else f'{v:.2f}'}")
    doc["ratios"] = ratios
    print(f"# load average at end {meta['load_average_end']}")
    path = save_results("overhead", doc)
    png = plot(doc, path.with_suffix(".png"))
    print(f"# results: {path}" + (f", plot: {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
