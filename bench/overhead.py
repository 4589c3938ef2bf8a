"""Benchmark (a): the data plane's own cost. No-op model, closed loop, ours vs plain FastAPI vs LitServe.

Every server is a fresh process pinned to core 0; ``wrk`` (Debian's 4.1.0, one thread) is pinned
to core 1. Per server it measures, in one run:

* ``rps`` at ``-c 32`` and ``p50``/``p99`` from wrk's latency distribution, and ``c=1 p50``;
* ``cpu us/req``: the server's CPU time (all threads and processes, ``/proc/*/schedstat``) during
  the ``-c 32`` run divided by the requests wrk completed, the cost that caps a core's rps.

For the pod it also measures, on the same pod type:

* ``json 100k`` / ``binary 100k``: a 100,000-element FP32 tensor echoed back (``synthetic:0``),
  once as OIP JSON, once with the binary tensor extension (request and response);
* ``429`` (:func:`refusal_points`; alone with ``--refusal-only``): on one pod process with two
  tenants, ``free`` (no limit) and ``limited`` (one token, then 429), the same small OIP JSON body
  accepted and refused, and the same refusal bytes from a bare ASGI app served by the pod's own
  uvicorn settings (``floor``, :func:`serve_floor`) and from a bare asyncio protocol with no uvicorn
  (``floor_raw``, :func:`serve_raw_floor`): CPU per request under wrk (c=32) and open loop
  (Poisson at ``--rate``, :mod:`bench.loadgen`, CPU read from ``/proc`` at the window's edges),
  alternating order per repetition; per repetition also ``mixed`` (:func:`marginal_refusal`):
  accepted traffic alone, then with refusals on top (``--mixed ACCEPTED,REFUSED`` rates), the
  refusals' marginal CPU against the accepted request's; then a 100k JSON body accepted and refused.

The no-op points repeat ``--reps`` times (3) in alternating order (ABC, CBA, ...); the table shows
the median of each figure and the ratios are medians of the per-repetition ratios (the machine is
shared: single runs of the same command differed by 1.4x in the pod/FastAPI ratio). It prints the
table and the ratios (ours/FastAPI rps, binary/JSON rps, 429 CPU / accepted CPU, floor 429 CPU /
accepted CPU), writes JSON and PNGs (no-op; 429) under ``bench/results/``.

``--in-process N`` measures the same no-op request without HTTP or wrk: each app (the pod's ASGI
app on a started :class:`~sluiceway_pod.data_plane.DataPlane`, and the plain FastAPI app) is called
``N`` times in a fresh process pinned to core 0, by 32 and by 1 concurrent callers, and the process
CPU time (all threads) per request is printed; likewise the refusal through the pod's app
(``sluiceway-429``) and the bare floor app (``floor-429``: the harness's own cost). No sockets
and no client share the core, so it is steadier than the wrk points on a loaded machine; to compare
two trees, run it with ``PYTHONPATH`` pointing at the other tree's ``inference-pod`` and ``core``
folders.

    python -m bench.overhead                  # 8 s per point, 3 repetitions of the no-op points
    python -m bench.overhead --duration 4 --reps 1 --servers sluiceway,fastapi
    python -m bench.overhead --in-process 10000 --reps 3
    python -m bench.overhead --refusal-only --duration 4 --reps 3
"""

from __future__ import annotations

import argparse
import hashlib
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
    SERVER_CORE,
    ServerProc,
    _env,
    _spawn,
    cores,
    free_port,
    litserve_available,
    load_average,
    pin_self,
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
local auth = os.getenv("WRK_AUTH")
if auth and auth ~= "" then wrk.headers["Authorization"] = auth end
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
        hdr_len: int | None = None, auth: str | None = None) -> dict[str, Any]:
    body_file = tmp / f"body-{len(body)}-{hdr_len}.bin"
    body_file.write_bytes(body)
    lua = tmp / "post.lua"
    lua.write_text(LUA)
    env = {**os.environ, "WRK_BODY": str(body_file), "WRK_CTYPE": ctype, "WRK_HDR_LEN": str(hdr_len or ""),
           "WRK_AUTH": auth or ""}
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


# ---------------------------------------------------------------------------------------------
# Refusals: accepted and refused requests on one pod process (two tenants), and the bare-uvicorn floor.

#: The pod's refusal for the rate-limited tenant, byte for byte: the floor sends the same answer.
FLOOR_BODY = b'{"error":"tenant \'limited\' is over its request rate","reason":"rate_limited"}'
#: The pod puts an ``x-request-id`` (16 hex digits) on every answer; the floor sends one of that size.
FLOOR_HEADERS = [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                 (b"x-request-id", b"0123456789abcdef"), (b"content-length", str(len(FLOOR_BODY)).encode())]
_READY_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"14")]


async def floor_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A bare ASGI app that answers every request 429 (the pod's rate-limit refusal, same bytes)
    without reading the body: what uvicorn alone costs per refusal. ``GET /v2/health/ready`` is 200."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/v2/health/ready":
        await send({"type": "http.response.start", "status": 200, "headers": _READY_HEADERS})
        await send({"type": "http.response.body", "body": b'{"ready":true}'})
        return
    await send({"type": "http.response.start", "status": 429, "headers": FLOOR_HEADERS})
    await send({"type": "http.response.body", "body": FLOOR_BODY})


def serve_floor(port: int) -> int:
    """``--floor-server PORT``: :func:`floor_app` through the pod's own uvicorn settings
    (:func:`sluiceway_pod.server.build_inference_uvicorn_config`: httptools with the header deadline,
    uvloop, connection limit, no access log, no proxy-headers middleware)."""
    import uvicorn
    from sluiceway_core.config import build_config
    from sluiceway_pod.server import build_inference_uvicorn_config

    sc = build_config({"server": {"host": "127.0.0.1", "port": port, "logLevel": "warning"}}).server
    uvicorn.Server(build_inference_uvicorn_config(floor_app, sc)).run()
    return 0


def _wire_answer(status_line: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    return status_line + b"".join(b"%s: %s\r\n" % kv for kv in headers) + b"\r\n" + body


def serve_raw_floor(port: int) -> int:
    """``--raw-floor-server PORT``: no uvicorn and no ASGI, the least a Python server can do per
    request: an ``asyncio.Protocol`` on uvloop (as the pod runs) that parses with httptools (as the
    pod's uvicorn does) and writes the pod's refusal bytes when a request's headers are complete,
    leaving the body to the parser. What the event loop and the kernel cost per request."""
    import asyncio
    from email.utils import formatdate

    import httptools
    import uvloop

    # the header names uvicorn puts on the pod's answers (the date is fixed at start: a floor)
    defaults = [(b"date", formatdate(usegmt=True).encode()), (b"server", b"uvicorn")]
    refusal = _wire_answer(b"HTTP/1.1 429 Too Many Requests\r\n", defaults + FLOOR_HEADERS, FLOOR_BODY)
    ready = _wire_answer(b"HTTP/1.1 200 OK\r\n", _READY_HEADERS, b'{"ready":true}')

    class Raw(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.url = b""

        def data_received(self, data: bytes) -> None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.transport.close()

        def on_message_begin(self) -> None:
            self.url = b""

        def on_url(self, url: bytes) -> None:
            self.url += url

        def on_headers_complete(self) -> None:
            self.transport.write(ready if self.url == b"/v2/health/ready" else refusal)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Raw, "127.0.0.1", port, backlog=2048)
        async with server:
            await server.serve_forever()

    uvloop.run(main())
    return 0


def start_floor(log_dir: Path, *, raw: bool = False) -> ServerProc:
    """The floor servers: the bare ASGI app through the pod's uvicorn settings, or (``raw``) the
    bare protocol (:func:`serve_raw_floor`)."""
    port = free_port()
    name = "floor429raw" if raw else "floor429"
    argv = [sys.executable, "-m", "bench.overhead", "--raw-floor-server" if raw else "--floor-server", str(port)]
    proc, log = _spawn(name, argv, log_dir, SERVER_CORE, _env())
    srv = ServerProc(name, proc, port, "/v2/models/demo/infer", "/v2/health/ready", log)
    srv.wait_ready()
    return srv


FREE_KEY, LIMITED_KEY = "k-free", "k-limited"


def tenant_pod_config(tmp: Path) -> Path:
    """The no-op pod with two tenants: ``free`` (no limit) and ``limited`` (one token, then 429)."""
    keys = tmp / "keys"
    keys.write_text(f"{hashlib.sha256(FREE_KEY.encode()).hexdigest()} free\n"
                    f"{hashlib.sha256(LIMITED_KEY.encode()).hexdigest()} limited\n")
    return pod_config(tmp, "tenants", {"tenants": {
        "keysFile": str(keys), "allowAnonymous": False,
        "tenants": [{"name": "free"}, {"name": "limited", "rate": 0.001, "burst": 1}]}})


def open_loop_cpu(srv: ServerProc, auth: str | None, rate: float, seconds: float) -> dict[str, Any]:
    """Server CPU per request at a fixed offered rate (Poisson, open loop, :mod:`bench.loadgen`),
    read from ``/proc`` at the edges of the measured window; the generator runs on the client core."""
    return open_loop_streams(srv, {"s": (auth, rate)}, seconds)


def open_loop_streams(srv: ServerProc, streams: dict[str, tuple[str | None, float]], seconds: float) -> dict[str, Any]:
    """:func:`open_loop_cpu` for several merged Poisson streams (name: ``(Authorization, rate)``);
    answers are counted per stream too (``by_stream``)."""
    from .loadgen import Stream, run_open_loop, run_sync

    stats: dict[str, dict[str, float]] = {}

    async def edge(name: str) -> dict[str, float]:
        stats[name] = srv.cpu_stats()
        return stats[name]

    warm = 1.0
    plan = [Stream(n, rate, headers={"Authorization": auth} if auth else {}, timeout_s=5.0)
            for n, (auth, rate) in streams.items()]
    probes = {"c0": (warm, lambda: edge("c0")), "c1": (warm + seconds, lambda: edge("c1"))}
    pinned = pinning_possible() and pin_self(CLIENT_CORE)
    try:
        res = run_sync(run_open_loop(srv.infer_url, plan, duration=seconds, warmup=warm, body=small_body(),
                                     probes=probes))
    finally:
        if pinned:
            os.sched_setaffinity(0, cores())
    window = res.window()
    answered = [r for r in window if r.status > 0]
    cpu = stats["c1"]["cpu_s"] - stats["c0"]["cpu_s"] if "c0" in stats and "c1" in stats else float("nan")
    codes: dict[str, int] = {}
    by_stream: dict[str, dict[str, int]] = {n: {} for n in streams}
    for r in answered:
        codes[str(r.status)] = codes.get(str(r.status), 0) + 1
        by_stream[r.stream][str(r.status)] = by_stream[r.stream].get(str(r.status), 0) + 1
    return {"requests": len(answered), "codes": codes, "by_stream": by_stream, "cpu_s": cpu,
            "cpu_us_per_req": cpu / len(answered) * 1e6 if answered else None, "lag_share": res.lag_share}


def marginal_refusal(pod: ServerProc, free: str, limited: str, accepted_rate: float, refused_rate: float,
                     seconds: float) -> dict[str, Any]:
    """A refusal's CPU while the pod is serving: accepted traffic alone at ``accepted_rate`` (open
    loop), then the same plus refused traffic at ``refused_rate``; the refusals' cost is the CPU
    the second window used beyond the first, per refused answer. The accepted request's cost is the
    first window's CPU per answer. This is the case refusals exist for (an overloaded service turning
    excess away while it serves), with the loop busy rather than waking for each request."""
    base = open_loop_streams(pod, {"accepted": (free, accepted_rate)}, seconds)
    mixed = open_loop_streams(pod, {"accepted": (free, accepted_rate), "refused": (limited, refused_rate)}, seconds)
    n_acc = base["by_stream"]["accepted"].get("200", 0)
    n_ref = mixed["by_stream"]["refused"].get("429", 0)
    acc_us = base["cpu_s"] / n_acc * 1e6 if n_acc else None
    # the accepted stream's share of the second window, scaled by the answers it got there
    n_acc2 = mixed["by_stream"]["accepted"].get("200", 0)
    extra = mixed["cpu_s"] - (base["cpu_s"] * n_acc2 / n_acc if n_acc else float("nan"))
    ref_us = extra / n_ref * 1e6 if n_ref else None
    return {"base": base, "mixed": mixed, "accepted_cpu_us_per_req": acc_us, "refused_marginal_cpu_us_per_req": ref_us,
            "ratio": ref_us / acc_us if acc_us and ref_us else None}


def refusal_points(tmp: Path, log_dir: Path, d: float, conns: int, reps: int, rate: float,
                   n_big: int, mixed_rates: tuple[float, float] = (600.0, 1200.0)) -> dict[str, Any]:
    """Per repetition, on one pod process and the floor server, in alternating order: the same small
    OIP JSON body accepted (tenant ``free``), refused 429 (tenant ``limited``) and refused by the
    bare-uvicorn floor, under wrk (closed loop, c=``conns``) and at ``rate``/s open loop; then the
    100k JSON body accepted and refused."""
    pod = start_pod(log_dir, config_file=tenant_pod_config(tmp))
    floor = start_floor(log_dir)
    raw = start_floor(log_dir, raw=True)
    free, limited = f"Bearer {FREE_KEY}", f"Bearer {LIMITED_KEY}"
    out: dict[str, Any] = {"reps": []}
    try:
        # the limited tenant's one token goes here, outside any measurement
        wrk(pod.infer_url, small_body(), 1, 0.5, tmp, auth=limited)
        points = [("accepted", pod, free), ("refused", pod, limited), ("floor", floor, None),
                  ("floor_raw", raw, None)]
        for rep in range(reps):
            order = points if rep % 2 == 0 else list(reversed(points))
            got: dict[str, Any] = {}
            for name, srv, auth in order:
                r = measure(srv, small_body(), conns, d, tmp, auth=auth)
                r.pop("raw", None)
                r["open_loop"] = open_loop_cpu(srv, auth, rate, d)
                got[name] = r
                print(f"  rep {rep + 1} {name}: wrk {r['rps']:.0f} rps, cpu {r['cpu_us_per_req'] or 0:.1f} us/req, "
                      f"non-2xx {r['non_2xx']}/{r['requests']}; open loop {rate:g}/s: "
                      f"cpu {r['open_loop']['cpu_us_per_req'] or 0:.1f} us/req, codes {r['open_loop']['codes']}",
                      flush=True)
            m = got["mixed"] = marginal_refusal(pod, free, limited, mixed_rates[0], mixed_rates[1], d)
            print(f"  rep {rep + 1} mixed: accepted {mixed_rates[0]:g}/s alone {m['accepted_cpu_us_per_req'] or 0:.1f} "
                  f"us/req {m['base']['by_stream']}; + refused {mixed_rates[1]:g}/s: "
                  f"{m['refused_marginal_cpu_us_per_req'] or 0:.1f} us per refusal {m['mixed']['by_stream']}; "
                  f"client lag share {m['mixed']['lag_share']:.1%}", flush=True)
            out["reps"].append(got)
        bj = big_json(n_big)
        out["accepted_big"] = {k: v for k, v in measure(pod, bj, 4, d, tmp, auth=free).items() if k != "raw"}
        out["refused_big"] = {k: v for k, v in measure(pod, bj, 4, d, tmp, auth=limited).items() if k != "raw"}
    finally:
        pod.stop()
        floor.stop()
        raw.stop()
    return out


def refusal_ratios(ref: dict[str, Any]) -> dict[str, float | None]:
    """Medians over repetitions of the per-repetition ratios (CPU per request)."""
    def ratio(a: str, b: str, open_loop: bool) -> float | None:
        vals = []
        for rp in ref["reps"]:
            x, y = (rp[a]["open_loop"], rp[b]["open_loop"]) if open_loop else (rp[a], rp[b])
            if x["cpu_us_per_req"] and y["cpu_us_per_req"]:
                vals.append(x["cpu_us_per_req"] / y["cpu_us_per_req"])
        return _median(vals)

    out = {
        "429 cpu / accepted cpu (small body, one pod, wrk)": ratio("refused", "accepted", False),
        "floor 429 cpu / accepted cpu (bare uvicorn, wrk)": ratio("floor", "accepted", False),
        "raw floor 429 cpu / accepted cpu (asyncio + httptools, wrk)": ratio("floor_raw", "accepted", False),
        "429 cpu / floor 429 cpu (wrk)": ratio("refused", "floor", False),
        "429 cpu / raw floor 429 cpu (wrk)": ratio("refused", "floor_raw", False),
        "429 cpu / accepted cpu (small body, one pod, open loop)": ratio("refused", "accepted", True),
        "floor 429 cpu / accepted cpu (bare uvicorn, open loop)": ratio("floor", "accepted", True),
        "raw floor 429 cpu / accepted cpu (asyncio + httptools, open loop)": ratio("floor_raw", "accepted", True),
        "429 cpu / raw floor 429 cpu (open loop)": ratio("refused", "floor_raw", True),
    }
    out["429 marginal cpu / accepted cpu (open loop, refusals on top of accepted traffic)"] = _median(
        [rp["mixed"]["ratio"] for rp in ref["reps"] if "mixed" in rp and rp["mixed"]["ratio"]])
    acc, ref_big = ref["accepted_big"]["cpu_us_per_req"], ref["refused_big"]["cpu_us_per_req"]
    out["429 cpu / accepted cpu (100k JSON body)"] = ref_big / acc if acc and ref_big else None
    return out


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(doc: dict[str, Any], path: Path) -> Path | None:
    plt = _pyplot()
    if plt is None:
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


def _one_body(body: bytes) -> Any:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def _discard(message: Any) -> None:
    return None


def plot_refusal(doc: dict[str, Any], path: Path) -> Path | None:
    """CPU per request of the 429 section: accepted / refused / floor, wrk and open loop (medians)."""
    plt = _pyplot()
    if plt is None:
        return None
    ref = doc["refusal"]
    names = [n for n in ("accepted", "refused", "floor", "floor_raw") if n in ref["reps"][0]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    panels = ((axes[0], None, f"wrk, c={doc['args']['connections']}"),
              (axes[1], "open_loop", f"open loop {doc['args']['rate']:g}/s"))
    for ax, sub, title in panels:
        vals = [_median([(rp[n][sub] if sub else rp[n])["cpu_us_per_req"] for rp in ref["reps"]]) or 0 for n in names]
        bars = ax.bar(names, vals, color=["tab:blue", "tab:red", "tab:gray", "silver"][: len(names)])
        ax.bar_label(bars, labels=[f"{v:.0f}" for v in vals])
        ax.axhline(vals[0] / 10, color="k", ls="--", lw=1, label="accepted / 10")
        ax.set_title(f"server CPU µs per request, {title}")
        ax.legend(loc="upper right")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("429 vs accepted, one pod; floor = bare uvicorn, floor_raw = bare asyncio\n"
                 f"({doc['meta']['started']}, load avg {doc['meta']['load_average_start']})")
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
            if out[0]["status"] != expect:
                raise RuntimeError(f"status {out[0]['status']}: {out}")

        async def caller(k: int) -> None:
            for _ in range(k):
                await one()

        await asyncio.gather(*(caller(total // conc) for _ in range(conc)))

    expect = 429 if which.endswith("-429") else 200

    async def run() -> dict[str, float]:
        if which in ("sluiceway", "sluiceway-429"):
            from prometheus_client import CollectorRegistry
            from sluiceway_core.config import build_config
            from sluiceway_pod.app import build_app
            from sluiceway_pod.data_plane import DataPlane
            from sluiceway_pod.metrics import PodMetrics

            raw: dict[str, Any] = {"model": {"spec": "synthetic:0", "warmupIterations": 1},
                                   "concurrency": {"permits": 2}, "queue": {"maxDepth": 256}}
            if which == "sluiceway-429":  # the anonymous tenant's one token goes to the first call
                raw["tenants"] = {"defaults": {"rate": 0.001, "burst": 1}}
            cfg = build_config(raw)
            plane = DataPlane(cfg, PodMetrics(CollectorRegistry(), cfg.model.name))
            await plane.start()
            app: Any = build_app(plane)
            if which == "sluiceway-429":
                await app(dict(scope), _one_body(body), _discard)
        elif which == "floor-429":
            app = floor_app
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
    servers = ["sluiceway", "fastapi", "sluiceway-429", "floor-429"]
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
        refused = got[("sluiceway-429", conc)]
        ratio = _median([a["cpu_us"] / b["cpu_us"] for a, b in zip(refused, ours, strict=True)])
        print(f"  cpu/req 429/accepted (the pod's ASGI app alone, no HTTP), {conc} caller(s): {ratio:.2f}")
    print(f"# load average at end {load_average()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--in-process-worker"]:
        print(json.dumps(_inproc_worker(argv[1], int(argv[2]), int(argv[3]))), flush=True)
        return 0
    if argv[:1] == ["--floor-server"]:
        return serve_floor(int(argv[1]))
    if argv[:1] == ["--raw-floor-server"]:
        return serve_raw_floor(int(argv[1]))
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--servers", default=None, help="sluiceway,fastapi[,litserve]")
    p.add_argument("--elements", type=int, default=100_000, help="tensor size of the codec comparison")
    p.add_argument("--skip-pod-extras", action="store_true", help="no codec / 429 points")
    p.add_argument("--refusal-only", action="store_true",
                   help="only the 429 section (accepted vs refused on one pod, and the bare-uvicorn floor)")
    p.add_argument("--rate", type=float, default=500.0, help="offered rate of the open-loop 429 points (1/s)")
    p.add_argument("--mixed", default="600,1200", metavar="ACCEPTED,REFUSED",
                   help="rates (1/s) of the 429 section's mixed point: accepted alone, then refusals on top")
    p.add_argument("--reps", type=int, default=3, help="no-op repetitions, order alternating; ratios are medians")
    p.add_argument("--in-process", type=int, metavar="N", default=0,
                   help="instead: N no-op calls per point through the ASGI apps in-process (no HTTP, no wrk)")
    ns = p.parse_args(argv)
    if ns.in_process:
        return in_process(ns.in_process, ns.reps)
    if shutil.which("wrk") is None:
        p.error("wrk is not installed (apt-get install wrk)")
    servers = [] if ns.refusal_only else ns.servers.split(",") if ns.servers else ["sluiceway", "fastapi"] + (
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
            for v in doc["pod"].values():
                v.pop("raw", None)
        if ns.refusal_only or ("sluiceway" in servers and not ns.skip_pod_extras):
            print(f"# 429 section: one pod (tenants free / limited), the bare-uvicorn and bare-asyncio floors; "
                  f"wrk c={c}, open loop {ns.rate:g}/s; load average {load_average()}", flush=True)
            mixed = tuple(float(x) for x in ns.mixed.split(","))
            doc["refusal"] = refusal_points(tmp, log_dir, d, c, ns.reps, ns.rate, ns.elements,
                                            (mixed[0], mixed[1]))
    meta["load_average_end"] = load_average()
    rows = [[n, f"{v['rps']:.0f}", f"{v['p50_ms']}", f"{v['p99_ms']}", f"{v['c1_p50_ms']}",
             f"{v['cpu_us_per_req'] or 0:.0f}", f"{v['runq_share']:.0%}", str(v["non_2xx"])]
            for n, v in doc["noop"].items()]
    if rows:
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
        print(f"\n## pod: {ns.elements}-element FP32 tensor echoed, c=4")
        prow = [[k, f"{v['rps']:.0f}", f"{v['cpu_us_per_req'] or 0:.0f}", f"{v['p50_ms']}", str(v["non_2xx"])]
                for k, v in pod.items()]
        print(table(["point", "rps", "cpu us/req", "p50 ms", "non-2xx"], prow))
        ratios["binary/json rps (100k)"] = pod["binary_big"]["rps"] / pod["json_big"]["rps"]
    ref = doc.get("refusal")
    if ref:
        print(f"\n## 429: small OIP JSON body; accepted / refused on one pod, floor = bare ASGI 429 through the "
              f"same uvicorn, floor_raw = bare asyncio protocol + httptools; median of {ns.reps} repetition(s)")
        rrow = []
        for name in ("accepted", "refused", "floor", "floor_raw"):
            def med(key: str, sub: str | None = None, name: str = name) -> Any:
                return _median([(rp[name][sub] if sub else rp[name])[key] for rp in ref["reps"]])
            rrow.append([name, f"{med('rps'):.0f}", f"{med('cpu_us_per_req'):.1f}", f"{med('runq_share'):.0%}",
                         f"{med('cpu_us_per_req', 'open_loop'):.1f}", f"{med('requests', 'open_loop'):.0f}"])
        for name in ("accepted_big", "refused_big"):
            v = ref[name]
            rrow.append([name, f"{v['rps']:.0f}", f"{v['cpu_us_per_req'] or 0:.1f}", f"{v['runq_share']:.0%}", "-",
                         "-"])
        print(table(["point", f"wrk rps c={c}", "cpu us/req", "srv runq", f"open {ns.rate:g}/s cpu us/req",
                     "open requests"], rrow))
        ratios.update(refusal_ratios(ref))
    print("\n## ratios (one run; the no-op ones are medians of the per-repetition ratios)")
    for k, v in ratios.items():
        print(f"  {k}: {'-' if v is None else f'{v:.2f}'}")
    doc["ratios"] = ratios
    print(f"# load average at end {meta['load_average_end']}")
    path = save_results("overhead", doc)
    png = plot(doc, path.with_suffix(".png")) if doc["noop"] else None
    png429 = plot_refusal(doc, path.with_name(path.stem + "-429.png")) if doc.get("refusal") else None
    print(f"# results: {path}" + (f", plot: {png}" if png else "") + (f", 429 plot: {png429}" if png429 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
