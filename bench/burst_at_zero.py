"""Burst at zero: ``--requests`` (5,000) requests arriving at once at a real gateway while no pod exists,
the pod started as they arrive (what KEDA does, 0 -> 1), against the same burst with the pod already up
(``minReplicas: 1``), in one run (issue 20, "Benchmarks and the simulator").

* **Pod**: one real ``sluiceway-pod serve`` process (uvicorn, the pod CLI as the other benchmarks
  start it) with a real torch model, the pod's ``demo`` MLP (16 -> 64 -> 4, CPU), built by
  :func:`slow_model`, which first sleeps ``--load-seconds`` (20): a slow model load, as a large
  model's download and load are. The pod binds its port at once and answers ``503 not_ready`` while
  it loads, as in a cluster.
* **Gateway**: one real ``sluiceway-gateway`` process, static endpoint = the pod's address (known
  before the pod exists, as an EndpointSlice's not-ready endpoint is), ``hold.startupSeconds`` = the
  start-up the first arm measured (the pod's process start to ready: what the operator renders from
  the pods' reported start phases), ``hold.maxRequests`` ``--hold-max``.
* **Arms** (one run, this order): ``minReplicas: 1`` (the pod started first and waited for; its
  start-up is the calibration), then ``at zero`` (the gateway up, the address answering nothing;
  at t0 the pod process is started and the burst is fired in the same instant).
* **Burst**: every request on its own connection, all opened at t0 from one event loop (open
  loop: nothing waits for an answer before sending). Every ``--short-every``-th request (10th) carries
  ``X-Sluiceway-Deadline-Ms`` ``--short-deadline-ms`` (5 s, shorter than the start-up: it should get
  an early ``503 no_capacity_in_time`` at once with a ``Retry-After`` near the actual ready time),
  the others ``--deadline-ms`` (90 s). A request with no answer ``--grace`` seconds after its
  deadline, or whose connection breaks without an answer, is **lost**.

Printed per arm: answers by status and reason, lost, the time to answer of the 200s from t0 (p50,
p99, max: for the arm at zero that is the time held plus the time served), the gateway's
``sluiceway_gateway_hold_seconds`` count and the histogram bucket its p99 falls in, the early 503s
(how fast, and their ``Retry-After`` against the time from each 503 to the pod's actual ready time),
the pod's ready time after t0, the gateway's predicted-ready error, the load average at each arm's
start and end; then the ratios at zero / ``minReplicas: 1`` (p50 and p99 time to answer, share
answered 200) and the wall time. JSON and a PNG go to ``bench/results/burst_at_zero-*``; ``--plot``
also writes the PNG where the docs link it.

    python -m bench.burst_at_zero                      # 5,000 requests, 20 s load: about 90 s of wall time
    python -m bench.burst_at_zero --quick              # 200 requests, 1 s load (tests/perf)

Concurrency model: the driver's main thread starts and stops the processes (blocking calls) and
runs each burst on one event loop (uvloop when installed): one task per request, nothing blocking on
the loop; a daemon thread polls the pod's readiness every 20 ms to time its ready moment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from .common import fmt, machine_info, save_results, table
from .gateway_routing import HttpError, read_answer
from .loadgen import percentile, run_sync
from .servers import ServerProc, _env, _spawn, free_port, load_average

INFER_PATH = "/v2/models/demo/infer"
LOAD_ENV = "SLUICEWAY_BENCH_LOAD_SECONDS"
FAIL_ENV = "SLUICEWAY_BENCH_LOAD_FAIL"
BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                               "data": [float(i) / 16 for i in range(16)]}]}).encode()
MAX_REQUESTS = 20_000
ZERO, ONE = "at zero", "minReplicas: 1"

# Client-side outcomes in Rec.status (no HTTP status):
NO_ANSWER = 0  # nothing within deadline + grace
CONN_ERR = -1  # the connection failed or broke before an answer


def _import_models(box: dict[str, Any]) -> None:
    try:
        import sluiceway_pod.models as models

        box["models"] = models
    except BaseException as err:  # handed to the start thread, which raises it
        box["error"] = err


def slow_model() -> Any:
    """The pod's model factory (``--model bench.burst_at_zero:slow_model``): sleeps
    ``$SLUICEWAY_BENCH_LOAD_SECONDS`` (a slow load: the weights' download), then returns the pod's
    ``demo`` torch MLP as a ready runner (16 inputs -> 4 outputs, CPU); with
    ``$SLUICEWAY_BENCH_LOAD_FAIL=1`` the load fails after the sleep instead (the pod exits 3: a crash
    loop's start, for the gateway's fault tests). torch is imported in a thread during the sleep, as
    a server imports its framework while the weights download: the load takes the sleep, not the
    sleep plus an import whose time swings with the machine's load (imported after the sleep, the
    sandbox's 20 s load took 21 to 34 s on a shared 2-core machine). Runs on the pod's start thread."""
    box: dict[str, Any] = {}
    importer = threading.Thread(target=_import_models, args=(box,), daemon=True, name="slow-model-import")
    importer.start()
    time.sleep(float(os.environ.get(LOAD_ENV, "20")))
    if os.environ.get(FAIL_ENV) == "1":
        raise RuntimeError(f"the model's load failed (${FAIL_ENV}=1)")
    importer.join()
    if "error" in box:
        raise box["error"]
    m = box["models"]
    return m.TorchRunner(m.build_demo_module(), list(m.DEMO_INPUTS), list(m.DEMO_OUTPUTS), "cpu")


class BurstBenchError(ValueError):
    """A bad argument."""


@dataclass(frozen=True)
class Settings:
    requests: int = 5000
    load_seconds: float = 20.0
    deadline_ms: float = 90_000.0
    short_deadline_ms: float = 5000.0
    short_every: int = 10
    grace: float = 5.0
    hold_max: int = 8192
    handoff_queue: int = 4
    permits: int = 2
    pod_queue: int = 256


QUICK = Settings(requests=200, load_seconds=1.0, deadline_ms=30_000.0, short_deadline_ms=500.0, grace=3.0)


def deadline_ms_of(i: int, s: Settings) -> float:
    """Request ``i``'s deadline: short for every ``short_every``-th, else the long one."""
    return s.short_deadline_ms if s.short_every > 0 and i % s.short_every == 0 else s.deadline_ms


# ------------------------------------------------------------------------------------------------
# The burst.

@dataclass(slots=True)
class Rec:
    i: int
    deadline_ms: float
    latency: float | None  # t0 -> the answer's last byte
    status: int
    reason: str = ""
    retry_after: str | None = None


async def one(host: str, port: int, i: int, t0: float, s: Settings) -> Rec:
    dl = deadline_ms_of(i, s)
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(dl / 1000.0 + s.grace):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"POST %s HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                         b"x-sluiceway-deadline-ms: %d\r\ncontent-length: %d\r\n\r\n%s"
                         % (INFER_PATH.encode(), int(dl), len(BODY), BODY))
            status, headers, data = await read_answer(reader)
        reason = ""
        if status != 200:
            try:
                doc = json.loads(data)
                reason = str(doc.get("reason", "")) if isinstance(doc, dict) else ""
            except ValueError:
                pass
        ra = headers.get(b"retry-after")
        return Rec(i, dl, time.monotonic() - t0, status, reason, ra.decode() if ra is not None else None)
    except TimeoutError:
        return Rec(i, dl, None, NO_ANSWER, "no_answer")
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, HttpError, ValueError) as e:
        return Rec(i, dl, time.monotonic() - t0, CONN_ERR, type(e).__name__)
    finally:
        if writer is not None:
            writer.close()


async def burst(host: str, port: int, t0: float, s: Settings) -> list[Rec]:
    """All ``s.requests`` at once, each on its own connection; one record each."""
    tasks = [asyncio.create_task(one(host, port, i, t0, s)) for i in range(s.requests)]
    return list(await asyncio.gather(*tasks))


# ------------------------------------------------------------------------------------------------
# Processes.

def spawn_pod(log_dir: Path, port: int, mport: int, s: Settings) -> ServerProc:
    env = _env()
    env.setdefault("SLUICEWAY_SERVER__LOG_LEVEL", "warning")
    env[LOAD_ENV] = f"{s.load_seconds:g}"
    argv = [sys.executable, "-m", "sluiceway_pod.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--metrics-port", str(mport), "--model", "bench.burst_at_zero:slow_model", "--concurrency",
            str(s.permits), "--max-queue", str(s.pod_queue)]
    proc, log = _spawn("sluiceway-pod", argv, log_dir, None, env)
    return ServerProc("sluiceway-pod", proc, port, INFER_PATH, "/v2/health/ready", log, metrics_port=mport)


def start_gateway(log_dir: Path, pod_port: int, startup: float, s: Settings) -> ServerProc:
    port, mport = free_port(), free_port()
    cfg = {"listen": {"host": "127.0.0.1", "port": port, "metricsPort": mport},
           "endpoints": [f"127.0.0.1:{pod_port}"], "pollAfterMs": 100,
           "hold": {"maxRequests": s.hold_max, "maxBytes": 1 << 30, "handoffQueuePerPod": s.handoff_queue,
                    "startupSeconds": round(startup, 3)},
           "limits": {"maxConnections": 4 * s.requests + 64, "requestTimeoutSeconds": s.deadline_ms / 1000 + 10}}
    path = log_dir / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    argv = [sys.executable, "-m", "sluiceway_gateway.cli", "serve", "--config", str(path), "--log-level", "warning"]
    proc, log = _spawn("gateway", argv, log_dir, None, _env())
    gw = ServerProc("gateway", proc, port, INFER_PATH, "/v2/health/ready", log, metrics_port=mport)
    gw.wait_ready()
    return gw


def metrics_text(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """``(labels, value)`` of every sample of ``name`` in a Prometheus text page."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == name:
                out.append((dict(smp.labels), float(smp.value)))
    return out


def metric(text: str, name: str, **labels: str) -> float:
    return sum(v for lab, v in samples(text, name) if all(lab.get(k) == x for k, x in labels.items()))


def wait_metric(url: str, name: str, value: float, timeout: float, **labels: str) -> None:
    end = time.monotonic() + timeout
    while metric(metrics_text(url), name, **labels) != value:
        if time.monotonic() > end:
            raise RuntimeError(f"{name}{labels} did not reach {value} within {timeout:g}s")
        time.sleep(0.05)


def bucket_p(text: str, name: str, q: float, **labels: str) -> str:
    """The histogram bucket (``lo-hi`` seconds) its ``q`` quantile falls in."""
    buckets = sorted(((float(lab["le"]), v) for lab, v in samples(text, name + "_bucket")
                      if all(lab.get(k) == x for k, x in labels.items())), key=lambda b: b[0])
    if not buckets or buckets[-1][1] <= 0:
        return "-"
    want = q * buckets[-1][1]
    lo: float | None = None
    for le, count in buckets:
        if count >= want:
            return f"<= {le:g}" if lo is None else f"{lo:g} to {le:g}"
        lo = le
    return "-"


class ReadyWatch:
    """Polls a pod's readiness every 20 ms on a daemon thread; ``ready_at``: the monotonic time of
    the first 200."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ready_at: float | None = None
        self.stopped = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stopped and self.ready_at is None:
            try:
                with urllib.request.urlopen(self.url, timeout=1) as r:
                    if r.status == 200:
                        self.ready_at = time.monotonic()
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.02)


# ------------------------------------------------------------------------------------------------
# The arms.

def run_arm(arm: str, s: Settings, log_dir: Path, startup: float | None) -> dict[str, Any]:
    """One arm; ``startup`` is the gateway's ``hold.startupSeconds`` (None: the ``minReplicas: 1``
    arm, which measures it)."""
    port, mport = free_port(), free_port()
    pod: ServerProc | None = None
    gw: ServerProc | None = None
    out: dict[str, Any] = {"arm": arm, "load_average": [load_average()]}
    try:
        if arm == ONE:
            started = time.monotonic()
            pod = spawn_pod(log_dir, port, mport, s)
            pod.wait_ready(timeout=s.load_seconds + 120)
            startup = time.monotonic() - started
            out["pod_start_seconds"] = startup
            gw = start_gateway(log_dir, port, startup, s)
            wait_metric(gw.metrics_url, "sluiceway_gateway_endpoints", 1, 30, state="routable")
            t0 = time.monotonic()
            ready_at: float | None = t0  # ready before the burst
        else:
            assert startup is not None
            gw = start_gateway(log_dir, port, startup, s)
            wait_metric(gw.metrics_url, "sluiceway_gateway_endpoints", 1, 30, state="down")  # seen starting
            t0 = time.monotonic()
            pod = spawn_pod(log_dir, port, mport, s)  # 0 -> 1 as the burst arrives
            watch = ReadyWatch(pod.base + "/v2/health/ready")
            ready_at = None
        out["startup_seconds_configured"] = startup
        recs = run_sync(burst("127.0.0.1", gw.port, t0, s))
        out["burst_seconds"] = time.monotonic() - t0
        if arm == ZERO:
            watch.stopped = True
            ready_at = watch.ready_at
        out["ready_after_t0"] = None if ready_at is None else ready_at - t0
        text = metrics_text(gw.metrics_url)
        out["gateway"] = {
            "handed_off": metric(text, "sluiceway_gateway_hold_seconds_count", outcome="handed_off"),
            "hold_p99_bucket": bucket_p(text, "sluiceway_gateway_hold_seconds", 0.99, outcome="handed_off"),
            "hold_sum": metric(text, "sluiceway_gateway_hold_seconds_sum", outcome="handed_off"),
            "early_refused": metric(text, "sluiceway_gateway_hold_early_refused_total"),
            # a histogram with negative buckets has no _sum: the bucket its median falls in
            "prediction_error_count": metric(text, "sluiceway_gateway_ready_prediction_error_seconds_count"),
            "prediction_error_bucket": bucket_p(text, "sluiceway_gateway_ready_prediction_error_seconds", 0.5),
            "retries": metric(text, "sluiceway_gateway_retries_total"),
        }
        ptext = metrics_text(pod.metrics_url)
        out["pod"] = {"served_200": metric(ptext, "sluiceway_requests_total", code="200"),
                      "rejected": metric(ptext, "sluiceway_rejected_total")}
        out.update(summarize(recs, out["ready_after_t0"]))
        out["load_average"].append(load_average())
        return out
    finally:
        if gw is not None:
            gw.stop()
        if pod is not None:
            pod.stop()


def summarize(recs: Sequence[Rec], ready_after: float | None) -> dict[str, Any]:
    """Counts and figures of one burst (pure)."""
    codes = Counter(f"{r.status} {r.reason}".strip() if r.status > 0 else r.reason for r in recs)
    lost = [r for r in recs if r.status <= 0]
    ok = sorted(r.latency for r in recs if r.status == 200 and r.latency is not None)
    early = [r for r in recs if r.status == 503 and r.reason == "no_capacity_in_time"]
    early_lat = [r.latency for r in early if r.latency is not None]
    # Retry-After is counted from the 503: compare with the time from that 503 to the pod's ready
    errs = []
    for r in early:
        if r.retry_after is None or r.latency is None or ready_after is None:
            continue
        actual = ready_after - r.latency
        if actual > 0:
            errs.append((float(r.retry_after) - actual) / actual)
    by_deadline: dict[str, Counter[str]] = {}
    for r in recs:
        by_deadline.setdefault(f"{r.deadline_ms:g} ms", Counter())[
            f"{r.status} {r.reason}".strip() if r.status > 0 else r.reason] += 1
    return {
        "requests": len(recs), "codes": dict(sorted(codes.items())), "lost": len(lost),
        "codes_by_deadline": {k: dict(sorted(v.items())) for k, v in sorted(by_deadline.items())},
        "ok": len(ok), "ok_share": len(ok) / len(recs) if recs else 0.0,
        "p50_s": percentile(ok, 50), "p99_s": percentile(ok, 99), "max_s": ok[-1] if ok else None,
        "early_503": len(early), "early_503_p99_ms": _ms(percentile(early_lat, 99)),
        "retry_after_values": dict(sorted(Counter(r.retry_after for r in early if r.retry_after).items())),
        "retry_after_error_median": _median(errs), "retry_after_error_max_abs": max((abs(e) for e in errs),
                                                                                    default=None),
        "answer_times_s": [round(x, 4) for x in ok],
    }


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000.0


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def report(doc: dict[str, Any]) -> str:
    arms: dict[str, Any] = doc["arms"]
    rows = []
    for name in (ONE, ZERO):
        a = arms.get(name)
        if a is None:
            continue
        g = a["gateway"]
        rows.append([name, str(a["requests"]), str(a["ok"]), str(a["lost"]), str(a["early_503"]),
                     fmt(a["p50_s"]), fmt(a["p99_s"]), fmt(a["max_s"]), f"{g['handed_off']:.0f}",
                     g["hold_p99_bucket"], fmt(a["ready_after_t0"]), fmt(a["burst_seconds"], ".1f"),
                     " -> ".join(a["load_average"])])
    lines = [table(["arm", "sent", "200", "lost", "early 503", "p50 s", "p99 s", "max s", "held", "hold p99 bucket s",
                    "pod ready s", "burst s", "load average start -> end"], rows)]
    for name in (ONE, ZERO):
        a = arms.get(name)
        if a is None:
            continue
        lines.append(f"{name}: answers {a['codes']}; by deadline: {a['codes_by_deadline']}")
        if a["early_503"]:
            lines.append(f"{name}: early 503 no_capacity_in_time: {a['early_503']}, p99 "
                         f"{fmt(a['early_503_p99_ms'], '.1f')} ms after t0, Retry-After {a['retry_after_values']} "
                         f"vs the pod ready "
                         f"{fmt(a['ready_after_t0'])} s after t0: error median "
                         f"{fmt(_pct(a['retry_after_error_median']), '+.0f')} %, max |error| "
                         f"{fmt(_pct(a['retry_after_error_max_abs']), '.0f')} %")
        g = a["gateway"]
        if g["prediction_error_count"]:
            lines.append(f"{name}: the gateway's predicted-ready error (actual - startupSeconds, from when it "
                         f"first saw the address starting) in the bucket {g['prediction_error_bucket']} s")
    one, zero = arms.get(ONE), arms.get(ZERO)
    if one is not None and zero is not None:
        lines.append(f"ratio at zero / minReplicas 1: p50 {fmt(ratio(zero['p50_s'], one['p50_s']))}x, p99 "
                     f"{fmt(ratio(zero['p99_s'], one['p99_s']))}x, answered 200 "
                     f"{fmt(ratio(zero['ok_share'], one['ok_share']))}x,"
                     f" lost {zero['lost']} vs {one['lost']}")
    return "\n".join(lines)


def _pct(x: float | None) -> float | None:
    return None if x is None else x * 100.0


def run_benchmark(s: Settings, log_dir: Path, say: Any = print) -> dict[str, Any]:
    doc: dict[str, Any] = {"machine": machine_info(), "settings": asdict(s), "arms": {}}
    wall0 = time.monotonic()
    one_arm = run_arm(ONE, s, log_dir, None)
    doc["arms"][ONE] = one_arm
    doc["arms"][ZERO] = run_arm(ZERO, s, log_dir, one_arm["pod_start_seconds"])
    doc["wall_seconds"] = time.monotonic() - wall0
    doc["load_average_end"] = load_average()
    say(report(doc))
    say(f"# wall time {doc['wall_seconds']:.1f} s; load average at end {doc['load_average_end']}")
    return doc


# ------------------------------------------------------------------------------------------------
# The plot.

def plot(doc: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    arms: dict[str, Any] = doc["arms"]
    colors = {ONE: "tab:blue", ZERO: "tab:red"}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    ax = axes[0]
    for name in (ONE, ZERO):
        a = arms.get(name)
        if a is None or not a["answer_times_s"]:
            continue
        xs = a["answer_times_s"]
        ax.step(xs, [i + 1 for i in range(len(xs))], where="post", color=colors[name], label=f"{name}: 200s")
        if name == ZERO and a["ready_after_t0"] is not None:
            ax.axvline(a["ready_after_t0"], color=colors[name], ls="--", lw=0.8, label="pod ready (at zero)")
    ax.axhline(doc["settings"]["requests"], color="gray", lw=0.6, ls=":")
    ax.set_xlabel("seconds after the burst (t0)")
    ax.set_ylabel("requests answered 200")
    ax.set_title("answers over time")
    ax.legend(loc="lower right", fontsize=8)
    ax = axes[1]
    names = [n for n in (ONE, ZERO) if n in arms]
    keys = sorted({k for n in names for k in arms[n]["codes"]})
    width = 0.8 / max(1, len(names))
    for j, n in enumerate(names):
        ax.bar([i + j * width for i in range(len(keys))], [arms[n]["codes"].get(k, 0) for k in keys], width,
               color=colors[n], label=n)
    ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(keys))], keys, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("requests")
    ax.set_title("outcomes (lost: no answer)")
    ax.legend(fontsize=8)
    for a in axes:
        a.grid(alpha=0.3)
    st = doc["settings"]
    fig.suptitle(f"burst at zero: {st['requests']} requests at once, model load {st['load_seconds']:g} s; load average "
                 f"{doc['machine']['load_average_start']} at start, {doc.get('load_average_end', '?')} at end",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------
# Command line.

def parse_args(argv: list[str] | None) -> tuple[Settings, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m bench.burst_at_zero", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Settings()
    p.add_argument("--quick", action="store_true", help="a smoke run: 200 requests, 1 s load (defaults below "
                   "change to QUICK's unless given)")
    p.add_argument("--requests", type=int)
    p.add_argument("--load-seconds", type=float, help=f"the model's load sleep (default {d.load_seconds:g})")
    p.add_argument("--deadline-ms", type=float)
    p.add_argument("--short-deadline-ms", type=float)
    p.add_argument("--short-every", type=int, help="every n-th request carries the short deadline; 0: none")
    p.add_argument("--hold-max", type=int, help="the gateway's hold.maxRequests")
    p.add_argument("--handoff-queue", type=int, help="the gateway's hold.handoffQueuePerPod")
    p.add_argument("--plot", type=Path, help="also write the PNG here (e.g. docs/img/perf/burst-at-zero.png)")
    ns = p.parse_args(argv)
    base = QUICK if ns.quick else d
    given = {"requests": ns.requests, "load_seconds": ns.load_seconds, "deadline_ms": ns.deadline_ms,
             "short_deadline_ms": ns.short_deadline_ms, "short_every": ns.short_every, "hold_max": ns.hold_max,
             "handoff_queue": ns.handoff_queue}
    s = Settings(**{**asdict(base), **{k: v for k, v in given.items() if v is not None}})
    try:
        if not 1 <= s.requests <= MAX_REQUESTS:
            raise BurstBenchError(f"--requests within [1, {MAX_REQUESTS}]")
        if not (0 <= s.load_seconds <= 600 and math.isfinite(s.load_seconds)):
            raise BurstBenchError("--load-seconds within [0, 600]")
        if not (1 <= s.short_deadline_ms <= 600_000 and 1 <= s.deadline_ms <= 600_000):
            raise BurstBenchError("--deadline-ms and --short-deadline-ms within [1, 600000]")
        if not (0 <= s.short_every <= MAX_REQUESTS and 0 <= s.hold_max <= 1_000_000 and 0 <= s.handoff_queue <= 1024):
            raise BurstBenchError("--short-every, --hold-max or --handoff-queue out of range")
    except BurstBenchError as e:
        p.error(str(e))
    return s, ns


def main(argv: list[str] | None = None) -> int:
    s, ns = parse_args(argv)
    print(f"# burst at zero: {s.requests} requests at once, each on its own connection; model load "
          f"{s.load_seconds:g} s (a real torch MLP after the sleep), pod {s.permits} permits queue {s.pod_queue}; "
          f"deadline {s.deadline_ms:g} ms, every {s.short_every}th {s.short_deadline_ms:g} ms; hold.maxRequests "
          f"{s.hold_max}, handoffQueuePerPod {s.handoff_queue}; load average {load_average()}")
    with tempfile.TemporaryDirectory(prefix="burst-zero-") as tmp:
        doc = run_benchmark(s, Path(tmp), print)
    saved = save_results("burst_at_zero", doc)
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


if __name__ == "__main__":
    sys.exit(main())
