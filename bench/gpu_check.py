"""One GPU check of the pod, under 5 minutes on one GPU; prints one table.

    python -m bench.gpu_check                       # on a CUDA machine
    python -m bench.gpu_check --device cpu --quick  # the same checks on CPU, device memory simulated
    python -m bench.gpu_check --site /tmp/site      # extra wheels dir (fastapi, uvicorn, ...) for the pods

Dependencies are the pod's own (torch, numpy, fastapi, uvicorn, orjson, pydantic, pyyaml,
prometheus-client) plus aiohttp for the client. The pods run from this checkout
(``inference-pod/``, ``core/``, ``bench/`` on ``PYTHONPATH``), one at a time, each a subprocess on
loopback with a fresh port. The models are in :mod:`bench.gpu_models`.

Checks (each a row group of the table):

1. **oom**: a model holding ``total/14`` bytes of device memory per request for the whole request
   (20 host-synced steps), 160 requests from 48 clients (quick: 48 from 16): a 16-thread pool
   with no guard (:mod:`bench.baseline_pool`), the pod with ``permits: auto``, and the pod forced
   to 16 permits (two waves: the OOMs of the first shrink it, the second should be clean).
2. **shape**: a ``(-1, 3, -1, -1)`` image model sized without and with ``maxShape``; the same
   largest-size requests (binary tensors) against each; OOMs counted.
3. **correct**: a seeded CNN on the device with dynamic batching (up to 8) vs the same CNN on the
   CPU in this process: max relative error, batch mean.
4. **codec**: JSON vs binary tensor extension, closed loop, same pod: rps and ratio.
5. **sweep**: a device-bound GEMM model at permits 1, 2, 4, 8 (quick: 1, 2) and ``auto``: rps.

Results also go to ``bench/results/gpu-check-*.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


# ------------------------------------------------------------------------------------------ processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    metrics_port: int
    log: Path
    model: str = "m"
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v2/models/{self.model}/infer"

    def get(self, path: str, port: int | None = None) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{port or self.port}{path}", timeout=10) as r:
            return bytes(r.read())

    def metric(self, name: str) -> float:
        """Sum of the samples of ``name`` (the metrics port, else the inference port)."""
        for port in (self.metrics_port, self.port):
            try:
                text = self.get("/metrics", port).decode()
            except OSError:
                continue
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith(name + "{") or line.startswith(name + " "))
        return float("nan")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class Launcher:
    def __init__(self, device: str, site: str | None, log_dir: Path) -> None:
        self.device = device
        self.log_dir = log_dir
        paths = [str(REPO), str(REPO / "inference-pod"), str(REPO / "core")]
        if site:
            paths.append(site)
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]),
                    "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                    "GC_DEVICE": device}

    def _spawn(self, name: str, argv: list[str], env: dict[str, str], port: int, metrics_port: int,
               ready: str, timeout: float = 240.0) -> Proc:
        log = self.log_dir / f"{name}-{port}.log"
        with log.open("wb") as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env={**self.env, **env},
                                    cwd=str(REPO), stdin=subprocess.DEVNULL)
        p = Proc(name, proc, port, metrics_port, log)
        end = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
            for prt in (port, metrics_port):
                try:
                    p.get(ready, prt)
                    return p
                except OSError:
                    pass
            if time.monotonic() > end:
                p.stop()
                raise RuntimeError(f"{name} not ready in {timeout:.0f}s:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)

    def pod(self, name: str, config: dict[str, Any], env: dict[str, str] | None = None) -> Proc:
        import yaml

        port, mport = _free_port(), _free_port()
        config = {**config, "server": {**config.get("server", {}), "metricsPort": mport, "logLevel": "info"}}
        config["model"] = {"name": "m", **config["model"]}
        cfg = self.log_dir / f"{name}-{port}.yaml"
        cfg.write_text(yaml.safe_dump(config))
        argv = [sys.executable, "-m", "sluiceway_pod.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                "--config", str(cfg)]
        p = self._spawn(name, argv, env or {}, port, mport, "/v2/health/ready")
        p.info = json.loads(p.get("/v2/models/m")).get("parameters", {})
        return p

    def pool(self, name: str, spec: str, threads: int, guard: str, env: dict[str, str] | None = None) -> Proc:
        port = _free_port()
        argv = [sys.executable, "-m", "bench.baseline_pool", "--port", str(port), "--spec", spec, "--model-name",
                "m", "--threads", str(threads), "--guard", guard,
                "--device", "cpu" if self.device == "cpu" else "cuda"]
        return self._spawn(name, argv, env or {}, port, port, "/v2/health/ready")


# ------------------------------------------------------------------------------------------ client
def json_body(x: np.ndarray) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(x.shape),
                                   "data": x.ravel().tolist()}]}).encode()


def binary_body(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    raw = np.ascontiguousarray(x, dtype="<f4").tobytes()
    head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(x.shape),
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "parameters": {"binary_data_output": True}}).encode()
    return head + raw, {"Inference-Header-Content-Length": str(len(head)),
                        "Content-Type": "application/octet-stream"}


def decode_answer(data: bytes, headers: Any) -> np.ndarray:
    n = headers.get("Inference-Header-Content-Length")
    if n is None:
        out = json.loads(data)["outputs"][0]
        return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    head = json.loads(data[: int(n)])["outputs"][0]
    return np.frombuffer(data[int(n):], dtype="<f4").reshape(head["shape"])


async def closed_loop(url: str, bodies: list[tuple[bytes, dict[str, str]]], clients: int, *,
                      total: int | None = None, seconds: float | None = None,
                      keep: bool = False) -> dict[str, Any]:
    """``clients`` loops sending ``bodies`` round-robin until ``total`` requests or ``seconds``."""
    import aiohttp

    codes: dict[str, int] = {}
    answers: dict[int, np.ndarray] = {}
    sent = 0
    t0 = time.perf_counter()
    end = t0 + seconds if seconds is not None else None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:

        async def one() -> None:
            nonlocal sent
            while (total is None or sent < total) and (end is None or time.perf_counter() < end):
                i = sent
                sent += 1
                body, hdrs = bodies[i % len(bodies)]
                try:
                    async with s.post(url, data=body, headers=hdrs or {"Content-Type": "application/json"}) as r:
                        data = await r.read()
                        key = str(r.status)
                        if r.status != 200:
                            with contextlib.suppress(ValueError):
                                key += ":" + str(json.loads(data).get("reason", ""))
                        elif keep:
                            answers[i % len(bodies)] = decode_answer(data, r.headers)
                except aiohttp.ClientError as e:
                    key = type(e).__name__
                codes[key] = codes.get(key, 0) + 1

        await asyncio.gather(*(one() for _ in range(clients)))
    wall = time.perf_counter() - t0
    ok = codes.get("200", 0)
    return {"codes": dict(sorted(codes.items())), "ok": ok, "wall": wall, "rps": ok / wall, "answers": answers}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def oom_count(codes: dict[str, int]) -> int:
    return sum(v for k, v in codes.items() if "oom" in k.lower())


# ------------------------------------------------------------------------------------------ checks
@dataclass
class Plan:
    device: str
    quick: bool
    total: int  # device bytes (real or simulated)

    @property
    def reserve(self) -> int:
        return 1 << 30 if self.device == "cuda" else 0


def check_oom(launch: Launcher, plan: Plan, rows: list[list[str]], doc: dict[str, Any]) -> None:
    per_req = plan.total // 14
    env = {"GC_HUNGRY_BYTES": str(per_req), "GC_SIM_TOTAL": str(plan.total), "GC_STEPS": "20", "GC_STEP_MS": "5"}
    n, clients = (48, 16) if plan.quick else (160, 48)
    x = np.ones((1, 16), dtype=np.float32)
    bodies = [(json_body(x), {})]
    model = {"spec": "bench.gpu_models:hungry", "inputs": [{"name": "INPUT0", "shape": [-1, 16], "maxShape": [1, 16]}],
             "outputs": [{"name": "OUTPUT0", "shape": [-1, 16]}]}
    queue = {"maxDepth": 1000, "timeoutSeconds": 120, "execTimeoutSeconds": 120}
    out: dict[str, Any] = {"bytes_per_request": per_req}
    srv = launch.pool("pool16", "bench.gpu_models:hungry", 16, "none", env)
    try:
        r = run(closed_loop(srv.url, bodies, clients, total=n))
    finally:
        srv.stop()
    out["pool16"] = {k: v for k, v in r.items() if k != "answers"}
    rows.append(["oom", "16-thread pool, no guard", f"{r['ok']}/{n} ok, {oom_count(r['codes'])} OOM",
                 f"{r['rps']:.1f} rps", " ".join(f"{k}:{v}" for k, v in r["codes"].items())])
    for label, permits in (("pod permits=auto", "auto"), ("pod permits=16 (forced)", 16)):
        conc = {"permits": permits, "memoryReserveBytes": plan.reserve, "safetyFactor": 0.8, "probeSeconds": 1.0}
        pod = launch.pod("hungry", {"model": model, "concurrency": conc, "queue": queue}, env)
        try:
            waves = [run(closed_loop(pod.url, bodies, clients, total=n)) for _ in range(1 if permits == "auto" else 2)]
            ooms = pod.metric("sluiceway_oom_total")
            limit = pod.metric("sluiceway_concurrency_limit")
        finally:
            pod.stop()
        for i, w in enumerate(waves):
            tag = f"{label}{' wave ' + str(i + 1) if len(waves) > 1 else ''}"
            rows.append(["oom", tag, f"{w['ok']}/{n} ok, {oom_count(w['codes'])} failed OOM",
                         f"{w['rps']:.1f} rps", " ".join(f"{k}:{v}" for k, v in w["codes"].items())])
        rows.append(["oom", f"{label}: sizing", f"permits {pod.info.get('concurrency')} -> {limit:g} at end",
                     f"memory bound {pod.info.get('concurrency_memory_bound')}",
                     f"peak/request {pod.info.get('peak_memory_bytes_per_request')} B; OOMs caught {ooms:g}"])
        out[str(permits)] = {"waves": [{k: v for k, v in w.items() if k != "answers"} for w in waves],
                             "ooms_caught": ooms, "limit_end": limit, "info": pod.info}
    doc["oom"] = out


def check_shape(launch: Launcher, plan: Plan, rows: list[list[str]], doc: dict[str, Any]) -> None:
    side = 64 if plan.quick or plan.device == "cpu" else 1024
    channels = max(4, plan.total // (20 * side * side * 4))  # about total/20 per largest request
    env = {"GC_CHANNELS": str(channels), "GC_SIM_TOTAL": str(plan.total), "GC_STEPS": "10", "GC_STEP_MS": "5"}
    n, clients = (48, 32) if plan.quick else (96, 48)  # clients x total/20 > total: must not all run
    x = np.random.default_rng(1).random((1, 3, side, side), dtype=np.float32)
    bodies = [binary_body(x)]
    out: dict[str, Any] = {"side": side, "channels": channels}
    for label, max_shape in (("no maxShape (probe at 1x3x1x1)", None), (f"maxShape [1,3,{side},{side}]",
                                                                        [1, 3, side, side])):
        inp: dict[str, Any] = {"name": "INPUT0", "shape": [-1, 3, -1, -1]}
        if max_shape:
            inp["maxShape"] = max_shape
        model = {"spec": "bench.gpu_models:image", "inputs": [inp], "outputs": [{"name": "OUTPUT0", "shape": [-1, -1]}]}
        conc = {"permits": "auto", "memoryReserveBytes": plan.reserve, "safetyFactor": 0.8, "probeSeconds": 0}
        pod = launch.pod("image", {"model": model, "concurrency": conc, "server": {"maxBodyBytes": 64 << 20},
                                   "queue": {"maxDepth": 1000, "timeoutSeconds": 120}}, env)
        try:
            r = run(closed_loop(pod.url, bodies, clients, total=n))
            ooms = pod.metric("sluiceway_oom_total")
            limit = pod.metric("sluiceway_concurrency_limit")
        finally:
            pod.stop()
        rows.append(["shape", label, f"permits {pod.info.get('concurrency')} (bound "
                     f"{pod.info.get('concurrency_memory_bound')}) -> {limit:g}", f"{r['ok']}/{n} ok",
                     f"OOMs caught {ooms:g}; " + " ".join(f"{k}:{v}" for k, v in r["codes"].items())])
        out[label] = {"info": pod.info, "ooms_caught": ooms, "limit_end": limit,
                      **{k: v for k, v in r.items() if k != "answers"}}
    doc["shape"] = out


def check_correct_and_codec(launch: Launcher, plan: Plan, rows: list[list[str]], doc: dict[str, Any]) -> None:
    import torch

    from bench.gpu_models import build_cnn

    rng = np.random.default_rng(20261201)
    xs = [rng.standard_normal((1, 3, 96, 96), dtype=np.float32) for _ in range(64)]
    ref_net = build_cnn().eval()
    with torch.inference_mode():
        refs = [ref_net(torch.from_numpy(x)).numpy() for x in xs]
    model = {"spec": "bench.gpu_models:cnn", "inputs": [{"name": "INPUT0", "shape": [-1, 3, 96, 96]}],
             "outputs": [{"name": "OUTPUT0", "shape": [-1, 10]}]}
    cfg = {"model": model, "concurrency": {"permits": 2}, "batching": {"maxBatchSize": 8, "maxBatchWaitMs": 10},
           "queue": {"maxDepth": 1000, "timeoutSeconds": 60}}
    pod = launch.pod("cnn", cfg)
    try:
        r = run(closed_loop(pod.url, [(json_body(x), {}) for x in xs], 16, total=len(xs), keep=True))
        bsum, bcount = pod.metric("sluiceway_batch_size_sum"), pod.metric("sluiceway_batch_size_count")
        secs = 2.0 if plan.quick else 6.0
        j = run(closed_loop(pod.url, [(json_body(x), {}) for x in xs[:8]], 16, seconds=secs))
        b = run(closed_loop(pod.url, [binary_body(x) for x in xs[:8]], 16, seconds=secs))
        binary_ans = run(closed_loop(pod.url, [binary_body(x) for x in xs[:4]], 4, total=4, keep=True))["answers"]
    finally:
        pod.stop()
    errs = [float(np.max(np.abs(r["answers"][i] - refs[i]) / (np.abs(refs[i]) + 1e-3))) for i in r["answers"]]
    berr = max(float(np.max(np.abs(binary_ans[i] - refs[i]) / (np.abs(refs[i]) + 1e-3))) for i in binary_ans)
    mean_batch = bsum / bcount if bcount else float("nan")
    rows.append(["correct", f"cnn on {plan.device} vs CPU reference, batching <= 8",
                 f"{len(errs)}/{len(xs)} answered", f"max rel err {max(errs):.2e} (binary {berr:.2e})",
                 f"batch mean {mean_batch:.2f}"])
    rows.append(["codec", "JSON, 3x96x96 FP32, 16 clients", f"{j['rps']:.1f} rps", "", ""])
    rows.append(["codec", "binary tensor extension", f"{b['rps']:.1f} rps",
                 f"binary/JSON = {b['rps'] / j['rps']:.2f}x" if j["rps"] else "-", ""])
    doc["correct"] = {"answered": len(errs), "max_rel_err": max(errs), "binary_max_rel_err": berr,
                      "batch_mean": mean_batch, "codes": r["codes"]}
    doc["codec"] = {"json": {k: v for k, v in j.items() if k != "answers"},
                    "binary": {k: v for k, v in b.items() if k != "answers"}}


def check_sweep(launch: Launcher, plan: Plan, rows: list[list[str]], doc: dict[str, Any]) -> None:
    env = {"GC_GEMM_N": "256" if plan.device == "cpu" else "4096", "GC_GEMM_REPS": "4" if plan.device == "cpu" else "8"}
    model = {"spec": "bench.gpu_models:gemm", "inputs": [{"name": "INPUT0", "shape": [-1, 16]}],
             "outputs": [{"name": "OUTPUT0", "shape": [-1, 16]}]}
    levels: list[int | str] = [1, 2] if plan.quick else [1, 2, 4, 8]
    levels.append("auto")
    secs = 2.0 if plan.quick else 4.0
    body = [(json_body(np.ones((1, 16), dtype=np.float32)), {})]
    out = {}
    for k in levels:
        conc = {"permits": k, "memoryReserveBytes": plan.reserve, "probeSeconds": 2.0}
        pod = launch.pod("gemm", {"model": model, "concurrency": conc, "queue": {"maxDepth": 1000}}, env)
        try:
            r = run(closed_loop(pod.url, body, 16, seconds=secs))
            limit = pod.metric("sluiceway_concurrency_limit")
        finally:
            pod.stop()
        note = (f"chose {pod.info.get('concurrency')} (memory bound {pod.info.get('concurrency_memory_bound')}; "
                f"probe {pod.info.get('concurrency_probe')}) -> {limit:g}" if k == "auto" else "")
        rows.append(["sweep", f"gemm, permits={k}", f"{r['rps']:.1f} rps", note,
                     " ".join(f"{c}:{v}" for c, v in r["codes"].items())])
        out[str(k)] = {"rps": r["rps"], "codes": r["codes"], "info": pod.info}
    doc["sweep"] = out


def table(rows: list[list[str]]) -> str:
    headers = ["check", "setting", "result", "figure", "detail"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(headers, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


CHECKS = {"oom": check_oom, "shape": check_shape, "correct": check_correct_and_codec, "sweep": check_sweep}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="fewer requests and levels (the CPU test uses it)")
    p.add_argument("--site", help="a directory of extra packages for the pods' PYTHONPATH")
    p.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated subset of {list(CHECKS)}")
    p.add_argument("--sim-total", type=int, default=1 << 30, help="simulated device bytes (--device cpu)")
    p.add_argument("--json", help="where to write the results (default bench/results/gpu-check-*.json)")
    ns = p.parse_args(argv)
    if ns.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("CUDA is not available here: use --device cpu")
        total = int(torch.cuda.mem_get_info()[1])
        name = torch.cuda.get_device_name()
    else:
        total, name = ns.sim_total, "cpu (simulated device memory)"
    plan = Plan(ns.device, ns.quick, total)
    t0 = time.monotonic()
    rows: list[list[str]] = []
    doc: dict[str, Any] = {"device": name, "total_bytes": total, "quick": ns.quick,
                           "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        launch = Launcher(ns.device, ns.site, Path(tmp))
        for key in [k for k in ns.only.split(",") if k]:
            if key not in CHECKS:
                p.error(f"unknown check {key!r}")
            t = time.monotonic()
            try:
                CHECKS[key](launch, plan, rows, doc)
            except Exception as e:  # one failed check must not hide the others' figures
                last = str(e).strip().splitlines()[-1:] or [""]
                rows.append([key, "FAILED", f"{type(e).__name__}: {last[0]}"[:200], "", ""])
                doc.setdefault("errors", {})[key] = f"{type(e).__name__}: {e}"
            print(f"# {key} done in {time.monotonic() - t:.0f} s", flush=True)
    wall = time.monotonic() - t0
    doc["wall_seconds"] = wall
    print(f"\n# gpu_check on {name}, {total / 2**30:.1f} GiB, {'quick' if ns.quick else 'full'}; wall {wall:.0f} s")
    print(table(rows))
    path = Path(ns.json) if ns.json else RESULTS / f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**doc, "rows": rows}, indent=1, default=str))
    print(f"# results: {path}")
    return 1 if "errors" in doc else 0


if __name__ == "__main__":
    sys.exit(main())
