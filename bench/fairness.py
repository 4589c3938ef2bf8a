"""Benchmarks (f) tenant isolation and (g) priority with aging (issue 3), ours against plain FastAPI.

(f) Tenant isolation. Two tenants with API keys (the pod reads a keys file of sha256 hashes):
    *light* sends 0.2 mu, inside its quota; *heavy* sends 10x its own quota (``rate`` = 0.5 mu,
    so 5 mu). Measured: light's p99 latency with heavy flooding against light alone (target: at
    most one service time more), light's goodput (2xx within the SLO over light's offered rate),
    and what heavy got. The baseline has no tenants: its numbers show what the feature's absence
    costs.
(g) Priority. *high* (``critical``) sends 0.2 mu, *low* (``batch``) sends 3 mu, one tenant. Measured:
    high p99 (target about 2 S plus overhead) and how many high requests were refused, and the
    longest wait of an answered low request against the pod's aging bound
    ``K*A + (ceil(Q/N) + 1) * S`` (K classes, aging step A, queue bound Q, N permits, service S).
(h) Device-time shares (issue 11). A stand-in whose device time is proportional to the rows of the
    batch (``--ms-per-row``, default 10). *big* sends 4-row requests, *small* 1-row ones, at the same
    Poisson rate (0.6 of the device for small alone, 2.4 for big). Measured: each tenant's share of
    the device time of the answered (2xx) requests. Fair share by device time gives each half; a
    server that counts requests (or serves FIFO, as the baseline does) gives big about 4/5.
(i) Weighted device-time shares, N tenants (issue 11). The same stand-in; four tenants of weights
    1, 2, 3, 4 sending requests of 1, 4, 2 and 8 rows, each offering the same 0.6 of the device
    (Poisson), so every tenant offers more than its weighted share and stays backlogged. Measured, from
    the device log of the stand-in (one line per request it computed): each tenant's device share in
    the window against ``weight / sum(weights)``, and the largest deviation ``|S_i - w_i/W * S|`` at
    any completion in the window, in units of the largest request cost ``C_max`` (S counted from the
    window's start).

Every scenario gets a fresh server (pinned to core 0; the generator on core 1), a warm-up, then
the measured window. No deadline header is sent; the client times out after ``--timeout-f`` /
``--timeout-g`` seconds. JSON lands in ``bench/results/``.

    python -m bench.fairness                         # defaults: 3 s warm-up + 30 s per scenario
    python -m bench.fairness --duration 6 --warmup 1 # quick check
    python -m bench.fairness --only h                # device-time shares only
    python -m bench.fairness --only i                # weighted shares of N tenants only
"""

from __future__ import annotations

import argparse
import hashlib
import math
import secrets
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sluiceway_core.config import build_config

from .common import (
    fmt,
    machine_info,
    measure_mu,
    save_results,
    server_load,
    setup_client,
    table,
    window_probes,
)
from .loadgen import (
    PRIORITY_HEADER,
    Record,
    RunResult,
    Stream,
    code_counts,
    fmt_codes,
    ok,
    percentile,
    reason_counts,
    run_open_loop,
    run_sync,
)
from .servers import (
    CLIENT_CORE,
    RESULTS,
    SERVER_CORE,
    ServerProc,
    cores,
    load_average,
    start_fastapi,
    start_pod,
)


def stream_summary(records: Sequence[Record], duration: float, slo: float, service: float) -> dict[str, Any]:
    lat = [r.latency for r in records if ok(r) and r.latency is not None]
    good = [x for x in lat if x <= slo]
    n = len(records)
    return {
        "requests": n,
        "offered_rps": n / duration,
        "ok_rps": len(lat) / duration,
        "good_rps": len(good) / duration,
        "good_share": len(good) / n if n else None,
        "p50_ms": _ms(percentile(lat, 50)),
        "p99_ms": _ms(percentile(lat, 99)),
        "max_ms": _ms(max(lat) if lat else None),
        "max_wait_ms": _ms(max(lat) - service if lat else None),  # upper bound on queue wait
        "codes": code_counts(records),
        "reasons": reason_counts(records),
    }


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000


def write_keys(run_dir: Path, tenants: Sequence[str]) -> dict[str, str]:
    """Fresh random API keys; the file holds only their sha256 hashes."""
    keys = {t: secrets.token_urlsafe(24) for t in tenants}
    lines = [f"{hashlib.sha256(k.encode()).hexdigest()} {t}" for t, k in keys.items()]
    (run_dir / "keys.txt").write_text("\n".join(lines) + "\n")
    return keys


def write_config(run_dir: Path, name: str, tree: dict[str, Any]) -> Path:
    cfg = build_config(tree)  # validates against the pod's own contract (raises ConfigError)
    path = run_dir / f"{name}.yaml"
    path.write_text(cfg.to_yaml())
    return path


def run_scenario(
    srv: ServerProc, streams: Sequence[Stream], ns: argparse.Namespace, slo: float, service: float
) -> dict[str, Any]:
    try:
        res: RunResult = run_sync(run_open_loop(
            srv.infer_url, streams, duration=ns.duration, warmup=ns.warmup, seed=ns.seed,
            max_inflight=ns.max_inflight, probes=window_probes(srv, ns.warmup, ns.duration)))
    finally:
        rc = srv.stop()
    win = res.window()
    per = {s.name: stream_summary([r for r in win if r.stream == s.name], ns.duration, slo, service)
           for s in streams}
    return {"server": srv.name, "streams": per, "run": res.to_json(), "server_exit": rc, **server_load(res),
            "server_params": srv.metadata, "log": str(srv.log_path)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["f", "g", "h", "i"], help="run one of the benchmarks")
    p.add_argument("--ms-per-row", type=float, default=10.0, help="(h): device time per row of the stand-in")
    p.add_argument("--serve-baseline", type=int, metavar="PORT", help=argparse.SUPPRESS)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--service-ms", type=float, default=20.0)
    p.add_argument("--mu-seconds", type=float, default=5.0)
    p.add_argument("--slo-ms", type=float, default=200.0, help="latency counted as good")
    p.add_argument("--heavy-quota", type=float, default=0.5, help="heavy tenant's rate quota, x mu")
    p.add_argument("--timeout-f", type=float, default=2.0, help="client timeout in (f), seconds")
    p.add_argument("--timeout-g", type=float, default=12.0, help="client timeout in (g), seconds")
    p.add_argument("--timeout-i", type=float, default=10.0, help="client timeout in (i), seconds")
    p.add_argument("--aging-seconds", type=float, default=1.0)
    p.add_argument("--queue-timeout", type=float, default=10.0, help="the pod's queue-wait budget in (g)")
    p.add_argument("--no-baseline", action="store_true", help="skip the plain FastAPI runs")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--max-inflight", type=int, default=4000)
    p.add_argument("--nice", type=int, default=0)
    ns = p.parse_args(argv)
    if ns.serve_baseline is not None:  # the (h) baseline's server process (see start_sized_fastapi)
        serve_sized_fastapi(ns.serve_baseline, ns.ms_per_row)
        return 0
    n_runs = (2 + (0 if ns.no_baseline else 2) if ns.only in (None, "f") else 0) + (
        2 + (0 if ns.no_baseline else 1) if ns.only in (None, "g") else 0) + (
        1 + (0 if ns.no_baseline else 1) if ns.only in (None, "h") else 0) + (
        1 + (0 if ns.no_baseline else 1) if ns.only in (None, "i") else 0)
    if n_runs * (ns.warmup + ns.duration) > 3600:
        p.error("the run would take over an hour of load; shorten --duration")

    client = setup_client(ns.nice)
    meta = machine_info()
    mu_info = measure_mu(ns.service_ms, ns.mu_seconds)
    mu = mu_info["mu"]
    service = 1.0 / mu
    slo = ns.slo_ms / 1000.0
    print(f"# fairness benchmarks  {meta['started']}")
    print(f"# machine: {meta['cpus']} cpus, python {meta['python']}, client loop {meta['client_loop']}, "
          f"load average {meta['load_average_start']}")
    print(f"# pinning: server core {client['server_core']}, generator core {client['client_core']}; "
          f"nice {client['nice']}")
    print(f"# stand-in {ns.service_ms:g} ms, one permit: mu measured {mu:.2f}/s; SLO {ns.slo_ms:g} ms; "
          f"{ns.warmup:g} s warm-up + {ns.duration:g} s window per scenario; seed {ns.seed}", flush=True)

    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = RESULTS / f"fairness-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir = RESULTS / "logs"
    doc: dict[str, Any] = {"benchmark": "fairness", "meta": meta, "client": client, "mu": mu_info,
                           "args": vars(ns)}
    t0 = time.monotonic()

    if ns.only in (None, "f"):
        doc["isolation"] = isolation(ns, mu, service, slo, run_dir, log_dir)
    if ns.only in (None, "g"):
        doc["priority"] = priority(ns, mu, service, slo, run_dir, log_dir)
    if ns.only in (None, "h"):
        doc["device_time"] = device_time(ns, run_dir, log_dir)
    if ns.only in (None, "i"):
        doc["weighted_shares"] = weighted_shares(ns, run_dir, log_dir)

    meta["load_average_end"] = load_average()
    doc["wall_seconds"] = time.monotonic() - t0
    print(f"# load average at end {meta['load_average_end']}; wall {doc['wall_seconds']:.0f} s")
    path = save_results("fairness", doc)
    print(f"# results: {path}")
    return 0


def isolation(ns: argparse.Namespace, mu: float, service: float, slo: float, run_dir: Path,
              log_dir: Path) -> dict[str, Any]:
    keys = write_keys(run_dir, ["light", "heavy"])
    light_rate, heavy_quota = 0.2 * mu, ns.heavy_quota * mu
    cfg = write_config(run_dir, "isolation", {
        "model": {"spec": f"synthetic:{ns.service_ms:g}"},
        "server": {"logLevel": "warning"},
        "concurrency": {"permits": 1},
        "queue": {"maxDepth": "auto"},
        "tenants": {
            "keysFile": str(run_dir / "keys.txt"),
            "allowAnonymous": False,
            "tenants": [
                {"name": "light", "rate": round(2 * light_rate, 3), "burst": 10, "weight": 1},
                {"name": "heavy", "rate": round(heavy_quota, 3), "burst": 5, "weight": 1},
            ],
        },
    })
    light = Stream("light", light_rate, {"Authorization": f"Bearer {keys['light']}"}, timeout_s=ns.timeout_f)
    heavy = Stream("heavy", 10 * heavy_quota, {"Authorization": f"Bearer {keys['heavy']}"},
                   timeout_s=ns.timeout_f)
    core = SERVER_CORE if client_pinned() else None
    plan: list[tuple[str, str, list[Stream]]] = [("sluiceway", "alone", [light]),
                                                 ("sluiceway", "with heavy", [light, heavy])]
    if not ns.no_baseline:
        plan += [("fastapi", "alone", [light]), ("fastapi", "with heavy", [light, heavy])]
    runs = run_plan(plan, ns, slo, service, log_dir, cfg, core, ("light", "heavy"))

    print(f"\n## (f) tenant isolation: light {light_rate:.1f}/s (quota {2 * light_rate:.1f}/s), heavy "
          f"{10 * heavy_quota:.1f}/s = 10x its quota of {heavy_quota:.1f}/s; "
          f"good = 2xx within {ns.slo_ms:g} ms")
    rows = []
    for r in runs:
        lt, hv = r["streams"]["light"], r["streams"].get("heavy")
        rows.append([r["server"], r["scenario"], fmt(lt["offered_rps"], ".1f"), fmt(lt["p50_ms"], ".1f"),
                     fmt(lt["p99_ms"], ".1f"), fmt(lt["max_ms"], ".1f"), fmt(lt["good_share"], ".3f"),
                     fmt_codes(lt["codes"]), fmt(hv["offered_rps"], ".1f") if hv else "-",
                     fmt(hv["ok_rps"], ".1f") if hv else "-", fmt_codes(hv["codes"]) if hv else "-",
                     *_load_cols(r)])
    print(table(["server", "light", "offered/s", "p50 ms", "p99 ms", "max ms", "good share", "light codes",
                 "heavy offered/s", "heavy 2xx/s", "heavy codes", *LOAD_HEADERS], rows))
    verdicts = {}
    for server in dict.fromkeys(r["server"] for r in runs):
        alone = next(r for r in runs if r["server"] == server and r["scenario"] == "alone")
        withh = next(r for r in runs if r["server"] == server and r["scenario"] == "with heavy")
        a, w = alone["streams"]["light"]["p99_ms"], withh["streams"]["light"]["p99_ms"]
        ratio = w / a if a and w is not None else None
        delta = w - a if a is not None and w is not None else None
        verdicts[server] = {"p99_alone_ms": a, "p99_with_heavy_ms": w, "ratio": ratio, "delta_ms": delta,
                            "within_one_service_time": delta is not None and delta <= service * 1000}
        print(f"{server}: light p99 with heavy / alone = {fmt(w, '.1f')} / {fmt(a, '.1f')} ms = "
              f"{fmt(ratio, '.2f')}x (+{fmt(delta, '.1f')} ms; one service time = {service * 1000:.1f} ms)"
              if w is not None else f"{server}: light got no 2xx answers with heavy flooding")
    print()
    return {"config": str(cfg), "runs": runs, "verdicts": verdicts}


def priority(ns: argparse.Namespace, mu: float, service: float, slo: float, run_dir: Path,
             log_dir: Path) -> dict[str, Any]:
    cfg = write_config(run_dir, "priority", {
        "model": {"spec": f"synthetic:{ns.service_ms:g}"},
        "server": {"logLevel": "warning"},
        "concurrency": {"permits": 1},
        "queue": {"maxDepth": "auto", "timeoutSeconds": ns.queue_timeout},
        "priorities": {"classes": ["critical", "standard", "batch"], "default": "standard",
                       "agingSeconds": ns.aging_seconds},
        # anonymous callers are capped at the default class unless the defaults allow more
        "tenants": {"defaults": {"maxPriority": "critical"}},
    })
    high = Stream("high", 0.2 * mu, {PRIORITY_HEADER: "critical"}, timeout_s=ns.timeout_g)
    low = Stream("low", 3 * mu, {PRIORITY_HEADER: "batch"}, timeout_s=ns.timeout_g)
    core = SERVER_CORE if client_pinned() else None
    plan: list[tuple[str, str, list[Stream]]] = [("sluiceway", "high alone", [high]),
                                                 ("sluiceway", "high + low", [high, low])]
    if not ns.no_baseline:
        plan.append(("fastapi", "high + low", [high, low]))
    runs = run_plan(plan, ns, slo, service, log_dir, cfg, core, ("high", "low"))

    pod_params: dict[str, Any] = next((r["server_params"] for r in runs if r["server"] == "sluiceway"), {})
    q = int(pod_params.get("max_queue", 0) or 0)
    n = int(pod_params.get("concurrency", 1) or 1)
    s_pod = float(pod_params.get("service_time_seconds", service) or service)
    k = 3
    bound = k * ns.aging_seconds + (math.ceil(q / n) + 1) * s_pod if q else None
    print(f"\n## (g) priority: high (critical) {0.2 * mu:.1f}/s, low (batch) {3 * mu:.1f}/s, aging step "
          f"{ns.aging_seconds:g} s; pod queue bound Q={q}, permits N={n}, S={s_pod * 1000:.1f} ms")
    rows = []
    for r in runs:
        hi, lo = r["streams"]["high"], r["streams"].get("low")
        rows.append([r["server"], r["scenario"], fmt(hi["offered_rps"], ".1f"), fmt(hi["p50_ms"], ".1f"),
                     fmt(hi["p99_ms"], ".1f"), fmt(hi["good_share"], ".3f"), fmt_codes(hi["codes"]),
                     fmt(lo["offered_rps"], ".1f") if lo else "-", fmt(lo["ok_rps"], ".1f") if lo else "-",
                     fmt(lo["p99_ms"], ".0f") if lo else "-", fmt(lo["max_wait_ms"], ".0f") if lo else "-",
                     fmt_codes(lo["codes"]) if lo else "-", *_load_cols(r)])
    print(table(["server", "scenario", "high/s", "high p50", "high p99", "high good", "high codes", "low/s",
                 "low 2xx/s", "low p99", "low max wait", "low codes", *LOAD_HEADERS], rows))
    mixed = next(r for r in runs if r["server"] == "sluiceway" and r["scenario"] == "high + low")
    lo = mixed["streams"]["low"]
    hi = mixed["streams"]["high"]
    target = 2 * s_pod * 1000
    print(f"sluiceway: high p99 {fmt(hi['p99_ms'], '.1f')} ms (target ~2S = {target:.0f} ms + overhead); "
          f"low max wait {fmt(lo['max_wait_ms'], '.0f')} ms vs aging bound "
          f"K*A + (ceil(Q/N)+1)*S = {fmt(bound * 1000 if bound else None, '.0f')} ms; "
          f"low timeouts {lo['codes'].get('timeout', 0)}")
    print()
    return {"config": str(cfg), "runs": runs, "aging_bound_s": bound, "queue_bound": q}


LOAD_HEADERS = ["srv cpu", "srv runq", "lag>1ms"]


def _load_cols(r: dict[str, Any]) -> list[str]:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.0%}"

    return [pct(r["server_cpu"]), pct(r["server_runq_wait"]), f"{r['run']['lag_share']:.2%}"]


def client_pinned() -> bool:
    return cores() == {CLIENT_CORE}



def run_plan(plan: list[tuple[str, str, list[Stream]]], ns: Any, slo: float, service: float, log_dir: Any,
             cfg: Any, core: Any, names: tuple[str, str]) -> list[dict[str, Any]]:
    """Run each (server, scenario, streams) on a fresh server process; print one line per run."""
    runs: list[dict[str, Any]] = []
    first, second = names
    for server, scenario, streams in plan:
        srv = (start_pod(log_dir, config_file=cfg, core=core) if server == "sluiceway"
               else start_fastapi(log_dir, service_ms=ns.service_ms, core=core))
        r = run_scenario(srv, streams, ns, slo, service)
        r["scenario"] = scenario
        runs.append(r)
        print(f"  {server} {scenario}: {first} {_brief(r['streams'][first])}"
              + (f" | {second} {_brief(r['streams'][second])}" if second in r["streams"] else ""), flush=True)
    return runs


def _brief(s: dict[str, Any]) -> str:
    return (f"{s['offered_rps']:.1f}/s p99 {fmt(s['p99_ms'], '.1f')} ms good {fmt(s['good_share'], '.3f')} "
            f"[{fmt_codes(s['codes'])}]")


# ---------------------------------------------------------------------------------------- (h)
class SizedRunner:
    """A stand-in whose device time is ``ms`` per row of the batch (sleep, then spin the last half
    millisecond, as :class:`~sluiceway_pod.models.SyntheticRunner`); echoes INPUT0. When
    ``SLUICEWAY_BENCH_DEVICE_FILE`` is set it keeps there (JSON) the device seconds it has spent on
    requests of each row count: the server-side measure of who got the device. When
    ``SLUICEWAY_BENCH_DEVICE_LOG`` is set it appends there one line per request it computed:
    ``<time.monotonic() at the end> <rows> <device seconds>`` (the monotonic clock is the machine's,
    so the load generator can cut the log at its window)."""

    def __init__(self, ms: float, inputs: list[Any], outputs: list[Any], device: str) -> None:
        import os
        import threading

        self.per_row = ms / 1000.0
        self.inputs, self.outputs, self.device = inputs, outputs, device
        self.file = os.environ.get("SLUICEWAY_BENCH_DEVICE_FILE")
        self.log = os.environ.get("SLUICEWAY_BENCH_DEVICE_LOG")
        self.spent: dict[int, float] = {}
        self._lock = threading.Lock()

    def predict(self, requests: Sequence[Any]) -> list[Any]:
        rows = [int(r["INPUT0"].shape[0]) for r in requests]
        seconds = self.per_row * sum(rows)
        end = time.monotonic() + seconds
        # the bookkeeping is done first, inside the request's device time, so the server that times
        # the call does not charge its file writes to the request
        if self.log:
            with self._lock, open(self.log, "a") as f:
                f.write("".join(f"{end:.6f} {n} {self.per_row * n:.6f}\n" for n in rows))
        if self.file:
            import json
            import os

            with self._lock:
                for n in rows:
                    self.spent[n] = self.spent.get(n, 0.0) + self.per_row * n
                tmp = self.file + ".tmp"
                Path(tmp).write_text(json.dumps(self.spent))
                os.replace(tmp, self.file)
        time.sleep(max(0.0, end - time.monotonic() - 0.0005))
        while time.monotonic() < end:
            pass
        return [{"OUTPUT0": r["INPUT0"].copy()} for r in requests]


def read_spent(path: Path) -> dict[int, float]:
    import json

    try:
        return {int(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        return {}


def sized_runner() -> SizedRunner:
    """``model.spec: bench.fairness:sized_runner`` (ms per row from ``SLUICEWAY_BENCH_MS_PER_ROW``)."""
    import os

    from sluiceway_pod.models import TensorSpec

    return SizedRunner(float(os.environ.get("SLUICEWAY_BENCH_MS_PER_ROW", "10")),
                       [TensorSpec("INPUT0", "FP32", (-1, -1))], [TensorSpec("OUTPUT0", "FP32", (-1, -1))], "cpu")


def serve_sized_fastapi(port: int, ms_per_row: float) -> None:
    """The plain FastAPI baseline (:mod:`bench.baseline_fastapi`, one permit, FIFO on its semaphore)
    computing with :class:`SizedRunner` instead of the fixed-time stand-in."""
    import uvicorn

    from . import baseline_fastapi

    baseline_fastapi.SyntheticRunner = SizedRunner  # type: ignore[misc,assignment]
    uvicorn.run(baseline_fastapi.build_app(ms_per_row), host="127.0.0.1", port=port, access_log=False,
                log_level="warning", lifespan="off")


def body_rows(rows: int) -> bytes:
    import json

    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [rows, 4], "datatype": "FP32",
                                   "data": [1.0] * (4 * rows)}]}).encode()


async def sized_load(url: str, streams: Sequence[tuple[str, float, int, dict[str, str]]], ns: argparse.Namespace,
                     spent_file: Path, *, timeout_s: float | None = None,
                     bounds: list[float] | None = None) -> tuple[dict[str, Counter[int]], dict[int, float]]:
    """Open-loop Poisson arrivals per (name, rate, rows, headers); returns status counts per stream
    of the requests sent inside the measured window (after ``--warmup``; timeouts count as 0), and
    the device seconds the server spent per row count inside the window. ``bounds``, if given, gets
    the window's start and end on ``time.monotonic()``."""
    import asyncio
    import random

    import aiohttp

    out: dict[str, Counter[int]] = {name: Counter() for name, *_ in streams}
    timeout = aiohttp.ClientTimeout(total=ns.timeout_f if timeout_s is None else timeout_s)
    conn = aiohttp.TCPConnector(limit=ns.max_inflight)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        start = time.monotonic()
        end = ns.warmup + ns.duration
        if bounds is not None:
            bounds[:] = [start + ns.warmup, start + end]

        async def one(name: str, at: float, body: bytes, headers: dict[str, str]) -> None:
            try:
                async with session.post(url, data=body, headers={"content-type": "application/json", **headers}) as r:
                    await r.read()
                    code = r.status
            except (TimeoutError, aiohttp.ClientError):
                code = 0
            if at >= ns.warmup:
                out[name][code] += 1

        async def stream(i: int, name: str, rate: float, rows: int, headers: dict[str, str]) -> None:
            rng = random.Random(ns.seed * 7919 + i)
            body = body_rows(rows)
            tasks = []
            at = rng.expovariate(rate)
            while at < end:
                delay = start + at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(name, at, body, headers)))
                at += rng.expovariate(rate)
            await asyncio.gather(*tasks)

        spent: list[dict[int, float]] = []

        async def snapshots() -> None:
            for at in (ns.warmup, end):
                await asyncio.sleep(max(0.0, start + at - time.monotonic()))
                spent.append(read_spent(spent_file))

        await asyncio.gather(snapshots(), *(stream(i, *s) for i, s in enumerate(streams)))
    window = {n: spent[1].get(n, 0.0) - spent[0].get(n, 0.0) for n in spent[1]}
    return out, window


def _start_sized(server: str, log_dir: Path, cfg: Path, core: int | None, ms_per_row: float) -> ServerProc:
    """The pod (config ``cfg``) or the plain FastAPI baseline serving the sized stand-in, ready."""
    from .servers import _env, _spawn, free_port

    if server == "sluiceway":
        return start_pod(log_dir, config_file=cfg, core=core)
    port = free_port()
    argv = [sys.executable, "-m", "bench.fairness", "--serve-baseline", str(port), "--ms-per-row", f"{ms_per_row:g}"]
    proc, log = _spawn("fastapi-sized", argv, log_dir, core, _env())
    srv = ServerProc("fastapi", proc, port, "/v2/models/demo/infer", "/v2/health/ready", log)
    srv.wait_ready()
    return srv


def device_time(ns: argparse.Namespace, run_dir: Path, log_dir: Path) -> dict[str, Any]:
    import asyncio
    import os

    from .servers import SERVER_CORE as CORE

    per_row = ns.ms_per_row / 1000.0
    rate = 0.6 / per_row
    keys = write_keys(run_dir, ["big", "small"])
    cfg = write_config(run_dir, "device-time", {
        "model": {"spec": "bench.fairness:sized_runner", "warmupIterations": 1},
        "server": {"logLevel": "warning"},
        "concurrency": {"permits": 1},
        "queue": {"maxDepth": 40, "timeoutSeconds": 10},
        "tenants": {
            "keysFile": str(run_dir / "keys.txt"),
            "tenants": [{"name": "big", "maxQueued": 20}, {"name": "small", "maxQueued": 20}],
        },
    })
    streams = [("big", rate, 4, {"Authorization": f"Bearer {keys['big']}"}),
               ("small", rate, 1, {"Authorization": f"Bearer {keys['small']}"})]
    core = CORE if client_pinned() else None
    os.environ["SLUICEWAY_BENCH_MS_PER_ROW"] = f"{ns.ms_per_row:g}"  # inherited by the pod (servers._env)
    runs: dict[str, Any] = {}
    plan = ["sluiceway"] + ([] if ns.no_baseline else ["fastapi"])
    for server in plan:
        spent_file = run_dir / f"device-{server}.json"
        os.environ["SLUICEWAY_BENCH_DEVICE_FILE"] = str(spent_file)
        srv = _start_sized(server, log_dir, cfg, core, ns.ms_per_row)
        try:
            counts, spent = asyncio.run(sized_load(srv.infer_url, streams, ns, spent_file))
        finally:
            rc = srv.stop()
        dev = {name: spent.get(rows, 0.0) for name, _, rows, _ in streams}  # server-side device seconds
        total = sum(dev.values())
        runs[server] = {"codes": {k: dict(v) for k, v in counts.items()}, "device_s": dev,
                        "device_share": {k: (v / total if total else None) for k, v in dev.items()},
                        "server_exit": rc, "log": str(srv.log_path)}
        print(f"  {server}: " + "; ".join(
            f"{k} {counts[k][200]} ok, device {dev[k]:.2f} s" for k in dev), flush=True)
    print(f"\n## (h) device-time shares: big 4-row requests, small 1-row, each {rate:g}/s Poisson, "
          f"{ns.ms_per_row:g} ms a row (big offers {rate * 4 * per_row:.1f}, small {rate * per_row:.1f} of the "
          f"device), one permit, equal weights; device seconds the server spent on each tenant's requests in "
          f"the {ns.duration:g} s window (answered or not: the baseline computes requests whose client gave up)")
    rows_out = []
    for server, r in runs.items():
        for name, _, rows, _ in streams:
            c = r["codes"][name]
            rows_out.append([server, name, str(rows), str(c.get(200, 0)), fmt(r["device_s"][name], ".2f"),
                             fmt(r["device_share"][name], ".3f"), fmt_codes({str(k): v for k, v in c.items()})])
    print(table(["server", "tenant", "rows", "2xx", "device s", "device share", "codes"], rows_out))
    print()
    return {"config": str(cfg), "ms_per_row": ns.ms_per_row, "rate": rate, "runs": runs}


# ---------------------------------------------------------------------------------------- (i)
#: (i): (tenant, weight, rows per request): unequal weights, unequal sizes, not in the same order
WEIGHTED_TENANTS = [("w1", 1, 1), ("w2", 2, 4), ("w3", 3, 2), ("w4", 4, 8)]


def read_device_log(path: Path, start: float, end: float) -> list[tuple[float, int, float]]:
    """(end time, rows, device seconds) of the requests the stand-in finished within [start, end]."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and start <= float(parts[0]) <= end:
            out.append((float(parts[0]), int(parts[1]), float(parts[2])))
    out.sort()
    return out


def share_deviation(events: Sequence[tuple[float, int, float]], weights: dict[int, int],
                    c_max: float) -> tuple[float, dict[int, float]]:
    """The largest ``|S_i - w_i/W * S| / c_max`` over the completions in ``events`` (tenants keyed
    by their row count), and the worst signed deviation of each tenant (in units of ``c_max``)."""
    total_w = sum(weights.values())
    done = dict.fromkeys(weights, 0.0)
    total = 0.0
    worst: dict[int, float] = dict.fromkeys(weights, 0.0)
    for _, rows, seconds in events:
        if rows not in done:
            continue
        done[rows] += seconds
        total += seconds
        for r, w in weights.items():
            dev = (done[r] - total * w / total_w) / c_max
            if abs(dev) > abs(worst[r]):
                worst[r] = dev
    return max((abs(v) for v in worst.values()), default=0.0), worst


def weighted_shares(ns: argparse.Namespace, run_dir: Path, log_dir: Path) -> dict[str, Any]:
    import asyncio
    import os

    from .servers import SERVER_CORE as CORE

    per_row = ns.ms_per_row / 1000.0
    offered = 0.6  # of the device, per tenant
    names = [n for n, _, _ in WEIGHTED_TENANTS]
    keys = write_keys(run_dir, names)
    cfg = write_config(run_dir, "weighted-shares", {
        "model": {"spec": "bench.fairness:sized_runner", "warmupIterations": 1},
        "server": {"logLevel": "warning"},
        "concurrency": {"permits": 1},
        "queue": {"maxDepth": 40, "timeoutSeconds": ns.timeout_i},
        "tenants": {
            "keysFile": str(run_dir / "keys.txt"),
            "tenants": [{"name": n, "weight": w, "maxQueued": 8, "rate": 1000, "burst": 1000}
                        for n, w, _ in WEIGHTED_TENANTS],
        },
    })
    streams = [(n, offered / (rows * per_row), rows, {"Authorization": f"Bearer {keys[n]}"})
               for n, _, rows in WEIGHTED_TENANTS]
    weights = {rows: w for _, w, rows in WEIGHTED_TENANTS}
    total_w = sum(weights.values())
    c_max = max(weights) * per_row
    core = CORE if client_pinned() else None
    os.environ["SLUICEWAY_BENCH_MS_PER_ROW"] = f"{ns.ms_per_row:g}"
    runs: dict[str, Any] = {}
    plan = ["sluiceway"] + ([] if ns.no_baseline else ["fastapi"])
    for server in plan:
        spent_file = run_dir / f"weighted-{server}.json"
        device_log = run_dir / f"weighted-{server}.log"
        os.environ["SLUICEWAY_BENCH_DEVICE_FILE"] = str(spent_file)
        os.environ["SLUICEWAY_BENCH_DEVICE_LOG"] = str(device_log)
        try:
            srv = _start_sized(server, log_dir, cfg, core, ns.ms_per_row)
        finally:
            del os.environ["SLUICEWAY_BENCH_DEVICE_LOG"]
        window: list[float] = []
        try:
            counts, _ = asyncio.run(sized_load(srv.infer_url, streams, ns, spent_file, timeout_s=ns.timeout_i,
                                               bounds=window))
        finally:
            rc = srv.stop()
        events = read_device_log(device_log, *window)
        dev = {n: sum(sec for _, r, sec in events if r == rows) for n, _, rows in WEIGHTED_TENANTS}
        total = sum(dev.values())
        worst, per = share_deviation(events, weights, c_max)
        runs[server] = {"codes": {k: dict(v) for k, v in counts.items()}, "device_s": dev,
                        "device_share": {k: (v / total if total else None) for k, v in dev.items()},
                        "completions": len(events), "max_deviation_c_max": worst,
                        "worst_deviation_c_max": {n: per[rows] for n, _, rows in WEIGHTED_TENANTS},
                        "server_exit": rc, "log": str(srv.log_path)}
        print(f"  {server}: {len(events)} completions in the window, max |S_i - w_i/W S| = {worst:.2f} x C_max",
              flush=True)
    print(f"\n## (i) weighted device-time shares: {len(WEIGHTED_TENANTS)} tenants, weights "
          f"{'/'.join(str(w) for _, w, _ in WEIGHTED_TENANTS)}, rows {'/'.join(str(r) for *_, r in WEIGHTED_TENANTS)} "
          f"at {ns.ms_per_row:g} ms a row (C_max = {c_max * 1000:g} ms), each offering {offered:g} of the device "
          f"(Poisson), one permit; device seconds the stand-in spent in the {ns.duration:g} s window")
    rows_out = []
    for server, r in runs.items():
        for n, w, rows in WEIGHTED_TENANTS:
            c = r["codes"][n]
            rows_out.append([server, n, str(w), str(rows), f"{w / total_w:.3f}", fmt(r["device_share"][n], ".3f"),
                             fmt(r["worst_deviation_c_max"][n], "+.2f"), str(c.get(200, 0)),
                             fmt_codes({str(k): v for k, v in c.items()})])
    print(table(["server", "tenant", "weight", "rows", "w/W", "device share", "worst dev / C_max", "2xx", "codes"],
                rows_out))
    for server, r in runs.items():
        print(f"{server}: max deviation from weight/sum(weights) at any completion = "
              f"{r['max_deviation_c_max']:.2f} x C_max over {r['completions']} completions")
    print()
    return {"config": str(cfg), "ms_per_row": ns.ms_per_row, "offered_per_tenant": offered,
            "c_max_s": c_max, "tenants": WEIGHTED_TENANTS, "runs": runs}


if __name__ == "__main__":
    sys.exit(main())
