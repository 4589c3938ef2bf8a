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

Every scenario gets a fresh server (pinned to core 0; the generator on core 1), a warm-up, then
the measured window. No deadline header is sent; the client times out after ``--timeout-f`` /
``--timeout-g`` seconds. JSON lands in ``bench/results/``.

    python -m bench.fairness                         # defaults: 3 s warm-up + 30 s per scenario
    python -m bench.fairness --duration 6 --warmup 1 # quick check
"""

from __future__ import annotations

import argparse
import hashlib
import math
import secrets
import sys
import time
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
    p.add_argument("--only", choices=["f", "g"], help="run one of the two benchmarks")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--service-ms", type=float, default=20.0)
    p.add_argument("--mu-seconds", type=float, default=5.0)
    p.add_argument("--slo-ms", type=float, default=200.0, help="latency counted as good")
    p.add_argument("--heavy-quota", type=float, default=0.5, help="heavy tenant's rate quota, x mu")
    p.add_argument("--timeout-f", type=float, default=2.0, help="client timeout in (f), seconds")
    p.add_argument("--timeout-g", type=float, default=12.0, help="client timeout in (g), seconds")
    p.add_argument("--aging-seconds", type=float, default=1.0)
    p.add_argument("--queue-timeout", type=float, default=10.0, help="the pod's queue-wait budget in (g)")
    p.add_argument("--no-baseline", action="store_true", help="skip the plain FastAPI runs")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--max-inflight", type=int, default=4000)
    p.add_argument("--nice", type=int, default=0)
    ns = p.parse_args(argv)
    n_runs = (0 if ns.only == "g" else 2 + (0 if ns.no_baseline else 2)) + (
        0 if ns.only == "f" else 2 + (0 if ns.no_baseline else 1))
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

    if ns.only != "g":
        doc["isolation"] = isolation(ns, mu, service, slo, run_dir, log_dir)
    if ns.only != "f":
        doc["priority"] = priority(ns, mu, service, slo, run_dir, log_dir)

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


if __name__ == "__main__":
    sys.exit(main())
