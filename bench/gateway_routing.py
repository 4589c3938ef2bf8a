"""Per-request routing against per-connection routing: 4 pods, uneven request sizes, 80 % load,
keep-alive clients (issue 19 section 5).

One run, the same seeded plan for every arm:

* **Pods**: ``--pods`` (4) real ``sluiceway-pod serve`` processes (uvicorn, the pod CLI as the other
  benchmarks start it), one permit each, ``--max-queue 64``, model ``bench.sized_model:factory``:
  each request's service time is the first value of its input, slept by the pod.
* **Sizes**: ``--sizes`` (``10:0.6,30:0.3,120:0.1``: 60 % of requests take 10 ms, 30 % 30 ms, 10 %
  120 ms; mean 27 ms, squared coefficient of variation 1.43), drawn per request from a seeded RNG.
* **Capacity first**: closed loop, ``--capacity-conns`` (4) connections per pod straight to the
  pods for ``--capacity-seconds``, the same size mix; capacity = 200 answers per second. The open
  loop then offers ``--load`` (0.8) x that capacity (``--rate`` overrides).
* **Clients**: ``--clients`` (K = 32) keep-alive clients, each ONE persistent HTTP/1.1 connection,
  one request at a time on it (no pipelining: a request that arrives while the client's previous
  one is out waits in the client, and that wait counts in its latency). Arrivals are Poisson at the
  offered rate, each given to a client picked at random (so each client is a Poisson stream of
  rate/K); latency runs from the *scheduled* arrival time (open loop: no coordinated omission).
  Every request carries ``X-Sluiceway-Deadline-Ms`` (``--deadline-ms``, 1000) with the budget left
  when it is sent; the client gives up at its deadline, closes that connection and opens a new one
  for its next request (a request whose deadline passed while it waited in the client is not sent).
* **Arms** (the order alternates per repetition):

  - ``kube-proxy``: no gateway; each client connection goes straight to a pod picked at random when
    the connection opens, and stays there until it closes. That is what a Service's iptables rules
    do (kube-proxy's iptables mode "chooses a backend at random", per connection: the NAT decision
    is made for a connection's first packet and conntrack keeps the connection on it). This is a
    loopback *model* of kube-proxy, not kube-proxy itself;
  - ``leastWait``, ``powerOfTwo``, ``random``: every client connection goes to one
    ``sluiceway-gateway`` (static endpoints: the pods, ``routing`` as named, a fresh gateway per
    arm), which routes each request.

Printed per arm: answers, p50 and p99 latency of the 200 answers, p99 of their *wait* (latency less
the request's own service time), goodput (200 within the deadline, per second), refusals (non-200
answers by status and reason), client time-outs, the share of the 200s each pod served (from the
pid in the answer), the gateway's retries; then each arm's ratios against ``kube-proxy`` and the
issue's goal (p99 at least 50 % below kube-proxy alone). The machine's load average before and
after. JSON and a PNG go to ``bench/results/gateway_routing-*``; ``--plot`` also writes the PNG
where the docs link it.

    python -m bench.gateway_routing                         # 4 pods, K=32, 80 %, 20 s per arm
    python -m bench.gateway_routing --duration 8 --arms kube-proxy,leastWait

Concurrency model: the driver's main thread starts and stops the processes (blocking calls); each
phase's load runs on one event loop (uvloop when installed) in that thread: one task per client
connection, timers that hand each arrival to its client at its scheduled time, nothing blocking on
the loop. Each client's pending requests sit in a bounded deque (``--client-queue``; past it the
arrival is recorded as a client drop, never sent).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .common import fmt, machine_info, save_results, table
from .loadgen import DEADLINE_HEADER, Stream, percentile, poisson_schedule, run_sync
from .servers import (
    CLIENT_CORE,
    SERVER_CORE,
    ServerProc,
    _env,
    _spawn,
    free_port,
    load_average,
    pinning_possible,
)

KUBE_PROXY = "kube-proxy"
GATEWAY_ARMS = ("leastWait", "powerOfTwo", "random")
ARMS = (KUBE_PROXY, *GATEWAY_ARMS)
DEFAULT_SIZES = "10:0.6,30:0.3,120:0.1"
GOAL_P99_RATIO = 0.5  # issue 19 section 5: p99 >= 50 % below kube-proxy alone
INFER_PATH = "/v2/models/demo/infer"
MAX_REQUESTS = 200_000

# Client-side outcomes in Rec.status (no HTTP status):
TIMEOUT = 0  # gave up at the deadline (the request was sent)
EXPIRED = -1  # the deadline passed while the request waited in its client: never sent
CONN_ERR = -2  # the connection failed or broke
DROP = -3  # the client's own queue was full: never sent
STATUS_NAMES = {TIMEOUT: "timeout", EXPIRED: "expired_in_client", CONN_ERR: "conn_err", DROP: "client_drop"}


class RoutingBenchError(ValueError):
    """A bad argument (sizes, arms, load)."""


# ------------------------------------------------------------------------------------------------
# The plan: pure functions of the arguments and the seed.

def parse_sizes(raw: str) -> list[tuple[float, float]]:
    """``"10:0.6,30:0.3,120:0.1"`` -> ``[(10.0, 0.6), ...]`` (ms, probability); the weights are
    normalised. Raises :class:`RoutingBenchError` on anything else."""
    out: list[tuple[float, float]] = []
    for part in raw.split(","):
        ms_s, sep, w_s = part.strip().partition(":")
        try:
            ms, w = float(ms_s), float(w_s if sep else "1")
        except ValueError:
            raise RoutingBenchError(f"--sizes: {part.strip()!r} is not <ms>:<weight>") from None
        if not (math.isfinite(ms) and 0 <= ms <= 10_000 and math.isfinite(w) and w > 0):
            raise RoutingBenchError(f"--sizes: {part.strip()!r}: ms within [0, 10000], weight > 0")
        out.append((ms, w))
    total = sum(w for _, w in out)
    return [(ms, w / total) for ms, w in out]


def size_stats(sizes: Sequence[tuple[float, float]]) -> dict[str, float]:
    mean = sum(ms * p for ms, p in sizes)
    second = sum(ms * ms * p for ms, p in sizes)
    return {"mean_ms": mean, "scv": (second / (mean * mean) - 1.0) if mean > 0 else 0.0}


@dataclass(frozen=True)
class Arrival:
    t: float  # scheduled time, seconds from the phase's start
    size_ms: float
    client: int


def build_plan(rate: float, horizon: float, sizes: Sequence[tuple[float, float]], clients: int,
               seed: int) -> list[Arrival]:
    """Poisson arrivals at ``rate`` over ``[0, horizon)``, each with a size and a client, from
    three generators seeded from ``seed`` (the same plan for every arm of a repetition)."""
    if clients < 1:
        raise RoutingBenchError("at least one client")
    if rate * horizon > MAX_REQUESTS:
        raise RoutingBenchError(f"about {rate * horizon:.0f} requests planned; the bound is {MAX_REQUESTS}")
    times = [t for t, _ in poisson_schedule([Stream("all", rate)], horizon, seed)]
    rs, rc = random.Random(seed * 7919 + 1), random.Random(seed * 7919 + 2)
    values = [ms for ms, _ in sizes]
    weights = [p for _, p in sizes]
    return [Arrival(t, rs.choices(values, weights)[0], rc.randrange(clients)) for t in times]


def kube_proxy_picker(pods: int, seed: int) -> Callable[[], int]:
    """A Service's per-connection choice: a pod index uniformly at random for every new connection,
    from its own seeded generator."""
    rng = random.Random(seed * 7919 + 3)
    return lambda: rng.randrange(pods)


def infer_body(size_ms: float) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32",
                                   "data": [size_ms]}]}).encode()


# ------------------------------------------------------------------------------------------------
# A keep-alive HTTP/1.1 client: one connection, one request at a time.

@dataclass(slots=True)
class Rec:
    t: float
    size_ms: float
    client: int
    latency: float | None  # scheduled arrival -> last byte of the answer (None: never sent)
    status: int
    reason: str = ""
    pod: int | None = None  # the pid that served a 200
    conn: int = -1  # the client's connection number (kube-proxy: which pod it was pinned to is in pinned)


class HttpError(Exception):
    pass


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes], bytes]:
    """One HTTP/1.1 answer: status, lower-case headers, body (content-length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise HttpError(f"bad status line {lines[0][:60]!r}")
    status = int(parts[1])
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(b":")
            headers[k.strip().lower()] = v.strip()
    if b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        chunks = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(chunks)
    else:
        body = b""
    return status, headers, body


def answer_fields(status: int, body: bytes) -> tuple[str, int | None]:
    """``(reason, pid)``: the error body's ``reason`` for a non-200, the serving pod's pid for a 200."""
    try:
        doc = json.loads(body)
    except ValueError:
        return "", None
    if not isinstance(doc, dict):
        return "", None
    if status != 200:
        r = doc.get("reason")
        return (r if isinstance(r, str) else ""), None
    try:
        return "", int(doc["outputs"][0]["data"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return "", None


class Client:
    """One keep-alive client. ``target()`` names the address of each connection it opens."""

    def __init__(self, idx: int, target: Callable[[], tuple[str, int, int]], deadline_s: float,
                 mono0: float, records: list[Rec], max_pending: int) -> None:
        self.idx = idx
        self.target = target
        self.deadline_s = deadline_s
        self.mono0 = mono0
        self.records = records
        self.pending: deque[Arrival] = deque()
        self.max_pending = max_pending
        self.wake = asyncio.Event()
        self.closed = False
        self.conns = 0
        self.pinned: list[int] = []  # the target index of each connection opened
        self._rw: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._conn_no = -1

    def push(self, a: Arrival) -> None:
        if len(self.pending) >= self.max_pending:
            self.records.append(Rec(a.t, a.size_ms, self.idx, None, DROP, "client_queue_full"))
            return
        self.pending.append(a)
        self.wake.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()

    def _drop_conn(self) -> None:
        if self._rw is not None:
            self._rw[1].close()
        self._rw = None

    async def run(self) -> None:
        try:
            while True:
                while not self.pending:
                    if self.closed:
                        return
                    self.wake.clear()
                    await self.wake.wait()
                await self._one(self.pending.popleft())
        finally:
            self._drop_conn()

    async def _one(self, a: Arrival) -> None:
        sched = self.mono0 + a.t
        left = sched + self.deadline_s - time.monotonic()
        if left <= 0:
            self.records.append(Rec(a.t, a.size_ms, self.idx, None, EXPIRED, "expired_in_client"))
            return
        status, reason, pid = TIMEOUT, "client_timeout", None
        try:
            async with asyncio.timeout(left):
                if self._rw is None:
                    host, port, which = self.target()
                    self._rw = await asyncio.open_connection(host, port)
                    self.conns += 1
                    self._conn_no += 1
                    self.pinned.append(which)
                reader, writer = self._rw
                body = infer_body(a.size_ms)
                remaining_ms = max(1.0, (sched + self.deadline_s - time.monotonic()) * 1000.0)
                writer.write(b"POST %s HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                             b"%s: %.1f\r\ncontent-length: %d\r\n\r\n%s"
                             % (INFER_PATH.encode(), DEADLINE_HEADER.encode(), remaining_ms, len(body), body))
                status, headers, data = await read_answer(reader)
                reason, pid = answer_fields(status, data)
                if headers.get(b"connection", b"").lower() == b"close":
                    self._drop_conn()
        except TimeoutError:
            self._drop_conn()  # the answer may still come: this connection is unusable
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, HttpError, ValueError) as e:
            self._drop_conn()
            status, reason = CONN_ERR, type(e).__name__
        self.records.append(Rec(a.t, a.size_ms, self.idx, time.monotonic() - sched, status, reason, pid,
                                self._conn_no))


Target = Callable[[], tuple[str, int, int]]  # (host, port, pod index or -1) for each new connection


async def run_arm(plan: Sequence[Arrival], clients: int, target_for: Callable[[int], Target],
                  deadline_s: float, max_pending: int) -> tuple[list[Rec], list[list[int]], dict[str, float]]:
    """Play ``plan`` open loop through ``clients`` keep-alive clients; returns the records, each
    client's connection targets and the generator's lag figures."""
    loop = asyncio.get_running_loop()
    records: list[Rec] = []
    t0 = loop.time() + 0.3
    mono0 = time.monotonic() + (t0 - loop.time())
    cl = [Client(i, target_for(i), deadline_s, mono0, records, max_pending) for i in range(clients)]
    tasks = [loop.create_task(c.run()) for c in cl]
    lags: list[float] = []

    def arrive(a: Arrival) -> None:
        lags.append(time.monotonic() - (mono0 + a.t))
        cl[a.client].push(a)

    handles = [loop.call_at(t0 + a.t, arrive, a) for a in plan]
    horizon = plan[-1].t if plan else 0.0
    try:
        await asyncio.sleep(max(0.0, t0 + horizon - loop.time()) + 0.05)
        for c in cl:
            c.close()
        done, _ = await asyncio.wait(tasks, timeout=deadline_s + 5.0)
        del done
    finally:
        for h in handles:
            h.cancel()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    lag = {"lag_p99_ms": (percentile(lags, 99) or 0.0) * 1000.0, "lag_max_ms": max(lags, default=0.0) * 1000.0}
    return records, [c.pinned for c in cl], lag


async def closed_loop(targets: Sequence[tuple[str, int]], per_target: int, warmup: float, seconds: float,
                      sizes: Sequence[tuple[float, float]], seed: int) -> dict[str, Any]:
    """Capacity: ``per_target`` connections to each target, each sending the next request as soon as
    the last is answered, for ``warmup + seconds``; 200 answers per second within the window."""
    rng = random.Random(seed * 7919 + 4)
    values, weights = [ms for ms, _ in sizes], [p for _, p in sizes]
    loop = asyncio.get_running_loop()
    start = loop.time()
    lo, hi = start + warmup, start + warmup + seconds
    counts: Counter[str] = Counter()
    service_ms: list[float] = []

    async def worker(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while loop.time() < hi:
                ms = rng.choices(values, weights)[0]
                body = infer_body(ms)
                writer.write(b"POST %s HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (INFER_PATH.encode(), len(body), body))
                status, _, _ = await read_answer(reader)
                now = loop.time()
                if lo <= now < hi:
                    counts["ok" if status == 200 else str(status)] += 1
                    if status == 200:
                        service_ms.append(ms)
        finally:
            writer.close()

    await asyncio.wait_for(asyncio.gather(*(worker(h, p) for h, p in targets for _ in range(per_target))),
                           warmup + seconds + 30.0)
    ok = counts["ok"]
    return {"rate": ok / seconds, "answers": dict(counts),
            "mean_service_ms": statistics.fmean(service_ms) if service_ms else None}


# ------------------------------------------------------------------------------------------------
# Summaries (pure).

def summarize(recs: Sequence[Rec], warmup: float, duration: float, deadline_s: float,
              pids: Sequence[int]) -> dict[str, Any]:
    win = [r for r in recs if warmup <= r.t < warmup + duration]
    ok = [r for r in win if r.status == 200 and r.latency is not None]
    lat = [r.latency for r in ok if r.latency is not None]
    wait = [r.latency - r.size_ms / 1000.0 for r in ok if r.latency is not None]
    good = [r for r in ok if r.latency is not None and r.latency <= deadline_s]
    refused = Counter(f"{r.status} {r.reason}".strip() for r in win if r.status >= 100 and r.status != 200)
    client = Counter(STATUS_NAMES[r.status] for r in win if r.status in STATUS_NAMES)
    served = Counter(r.pod for r in ok)
    share = [served.get(p, 0) / len(ok) if ok else 0.0 for p in pids]
    return {
        "requests": len(win), "ok": len(ok), "good": len(good), "goodput": len(good) / duration,
        "p50_ms": _ms(percentile(lat, 50)), "p99_ms": _ms(percentile(lat, 99)),
        "p999_ms": _ms(percentile(lat, 99.9)), "wait_p99_ms": _ms(percentile(wait, 99)),
        "refused": dict(sorted(refused.items())), "refused_total": sum(refused.values()),
        "client": dict(sorted(client.items())), "pod_share": share,
        "unknown_pod": sum(1 for r in ok if r.pod not in pids),
        "latencies_ms": [round(x * 1000.0, 2) for x in lat],
    }


def _ms(s: float | None) -> float | None:
    return None if s is None else s * 1000.0


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def connections_per_pod(pinned: Sequence[Sequence[int]], pods: int) -> list[int]:
    """How many client connections each pod received (kube-proxy arm)."""
    c = Counter(i for conns in pinned for i in conns)
    return [c.get(i, 0) for i in range(pods)]


# ------------------------------------------------------------------------------------------------
# Processes.

def start_pods(log_dir: Path, n: int, max_queue: int, core: int | None) -> list[ServerProc]:
    """``n`` pods started together, then waited for (the pod CLI, as :func:`bench.servers.start_pod`
    runs it, with the sized model)."""
    pods: list[ServerProc] = []
    env = _env()
    env.setdefault("SLUICEWAY_SERVER__LOG_LEVEL", "warning")
    try:
        for i in range(n):
            port, mport = free_port(), free_port()
            argv = [sys.executable, "-m", "sluiceway_pod.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                    "--metrics-port", str(mport), "--model", "bench.sized_model:factory", "--concurrency", "1",
                    "--max-queue", str(max_queue)]
            proc, log = _spawn(f"sluiceway-pod{i}", argv, log_dir, core, env)
            pods.append(ServerProc(f"sluiceway-pod{i}", proc, port, INFER_PATH, "/v2/health/ready", log,
                                   metrics_port=mport))
        for p in pods:
            p.wait_ready()
    except BaseException:
        for p in pods:
            p.stop()
        raise
    return pods


def start_gateway(log_dir: Path, pods: Sequence[ServerProc], routing: str, seed: int,
                  core: int | None) -> ServerProc:
    port, mport = free_port(), free_port()
    cfg = {"listen": {"host": "127.0.0.1", "port": port, "metricsPort": mport},
           "endpoints": [f"127.0.0.1:{p.port}" for p in pods], "routing": routing, "seed": seed}
    path = log_dir / f"gateway-{routing}-{port}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    argv = [sys.executable, "-m", "sluiceway_gateway.cli", "serve", "--config", str(path), "--log-level", "warning"]
    proc, log = _spawn(f"gateway-{routing}", argv, log_dir, core, _env())
    gw = ServerProc(f"gateway-{routing}", proc, port, INFER_PATH, "/v2/health/ready", log, metrics_port=mport)
    gw.wait_ready()
    return gw


def metric_sum(url: str, name: str) -> float | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


# ------------------------------------------------------------------------------------------------
# The run.

@dataclass
class Settings:
    pods: int = 4
    clients: int = 32
    load: float = 0.8
    rate: float | None = None
    duration: float = 20.0
    warmup: float = 2.0
    deadline_ms: float = 1000.0
    sizes: list[tuple[float, float]] = field(default_factory=lambda: parse_sizes(DEFAULT_SIZES))
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    reps: int = 1
    seed: int = 1
    capacity_seconds: float = 4.0
    capacity_conns: int = 4
    max_queue: int = 64
    client_queue: int = 256
    settle: float = 2.0


def run_benchmark(s: Settings, log_dir: Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    pinned = pinning_possible()
    pod_core = SERVER_CORE if pinned else None
    gw_core = CLIENT_CORE if pinned else None
    doc: dict[str, Any] = {"machine": machine_info(), "settings": {**asdict(s)}, "reps": []}
    pods = start_pods(log_dir, s.pods, s.max_queue, pod_core)
    try:
        pids = [p.proc.pid for p in pods]
        targets = [("127.0.0.1", p.port) for p in pods]
        if s.rate is None:
            cap = run_sync(closed_loop(targets, s.capacity_conns, 0.5, s.capacity_seconds, s.sizes, s.seed))
            rate = s.load * cap["rate"]
            say(f"# capacity (closed loop, {s.capacity_conns} connections per pod, {s.capacity_seconds:g} s): "
                f"{cap['rate']:.1f}/s (ideal {s.pods} x 1000/{size_stats(s.sizes)['mean_ms']:.1f} ms = "
                f"{s.pods * 1000.0 / size_stats(s.sizes)['mean_ms']:.1f}/s); offered {s.load:g} x = {rate:.1f}/s")
            doc["capacity"] = cap
            time.sleep(s.settle)
        else:
            rate = s.rate
            say(f"# offered {rate:.1f}/s (--rate; capacity not measured)")
        doc["rate"] = rate
        for rep in range(s.reps):
            seed = s.seed + rep
            plan = build_plan(rate, s.warmup + s.duration, s.sizes, s.clients, seed)
            arms = s.arms if rep % 2 == 0 else list(reversed(s.arms))
            rep_doc: dict[str, Any] = {"seed": seed, "order": arms, "arms": {}}
            for arm in arms:
                rep_doc["arms"][arm] = one_arm(arm, s, plan, pods, pids, targets, log_dir, seed, gw_core)
                time.sleep(s.settle)
            doc["reps"].append(rep_doc)
            say(report(rep_doc, s, rep))
        if s.reps > 1:
            doc["medians"] = medians(doc["reps"], s.arms)
            say(medians_report(doc["medians"], s.reps))
    finally:
        for p in pods:
            p.stop()
    doc["load_average_end"] = load_average()
    return doc


def medians(reps: Sequence[dict[str, Any]], arms: Sequence[str]) -> dict[str, dict[str, float | None]]:
    """Per gateway arm, the median over repetitions of its ratios against kube-proxy (each ratio
    within one repetition, so like is compared with like)."""
    out: dict[str, dict[str, float | None]] = {}
    for name in arms:
        if name == KUBE_PROXY:
            continue
        cols: dict[str, list[float]] = {"p50": [], "p99": [], "goodput": []}
        for rep in reps:
            a, kp = rep["arms"].get(name), rep["arms"].get(KUBE_PROXY)
            if a is None or kp is None:
                continue
            for key, field_ in (("p50", "p50_ms"), ("p99", "p99_ms"), ("goodput", "goodput")):
                r = ratio(a[field_], kp[field_])
                if r is not None:
                    cols[key].append(r)
        out[name] = {k: (statistics.median(v) if v else None) for k, v in cols.items()}
    return out


def medians_report(med: dict[str, dict[str, float | None]], reps: int) -> str:
    lines = [f"## ratios against kube-proxy, median over {reps} repetitions"]
    for name, m in med.items():
        met = m["p99"] is not None and m["p99"] <= GOAL_P99_RATIO
        lines.append(f"{name} / kube-proxy: p50 {fmt(m['p50'])}x, p99 {fmt(m['p99'])}x (goal <= "
                     f"{GOAL_P99_RATIO:g}: {'met' if met else 'NOT met'}), goodput {fmt(m['goodput'])}x")
    return "\n".join(lines)


def one_arm(arm: str, s: Settings, plan: Sequence[Arrival], pods: Sequence[ServerProc], pids: Sequence[int],
            targets: Sequence[tuple[str, int]], log_dir: Path, seed: int, gw_core: int | None) -> dict[str, Any]:
    gw: ServerProc | None = None
    try:
        if arm == KUBE_PROXY:
            pick = kube_proxy_picker(len(pods), seed)

            def target_for(_client: int) -> Callable[[], tuple[str, int, int]]:
                def target() -> tuple[str, int, int]:
                    i = pick()
                    return targets[i][0], targets[i][1], i
                return target
        else:
            gw = start_gateway(log_dir, pods, arm, seed, gw_core)
            addr = ("127.0.0.1", gw.port)

            def target_for(_client: int) -> Callable[[], tuple[str, int, int]]:
                return lambda: (addr[0], addr[1], -1)
        cpu0 = gw.cpu_stats() if gw is not None else None
        la0 = load_average()
        recs, pinned, lag = run_sync(run_arm(plan, s.clients, target_for, s.deadline_ms / 1000.0, s.client_queue))
        out = summarize(recs, s.warmup, s.duration, s.deadline_ms / 1000.0, pids)
        out.update(lag)
        out["load_average"] = [la0, load_average()]
        out["connections"] = sum(len(p) for p in pinned)
        if arm == KUBE_PROXY:
            out["connections_per_pod"] = connections_per_pod(pinned, len(pods))
        if gw is not None:
            out["gateway_retries"] = metric_sum(gw.metrics_url, "sluiceway_gateway_retries_total")
            if cpu0 is not None:
                cpu = gw.cpu_stats()["cpu_s"] - cpu0["cpu_s"]
                sent = sum(1 for r in recs if r.latency is not None)
                out["gateway_cpu_us_per_req"] = cpu / sent * 1e6 if sent else None
        return out
    finally:
        if gw is not None:
            gw.stop()


def report(rep: dict[str, Any], s: Settings, idx: int) -> str:
    arms: dict[str, Any] = rep["arms"]
    lines = [f"## repetition {idx + 1}/{s.reps} (seed {rep['seed']}, order {', '.join(rep['order'])}); "
             f"{s.duration:g} s per arm after {s.warmup:g} s warm-up; deadline {s.deadline_ms:g} ms; K={s.clients}"]
    rows = []
    for name in s.arms:
        a = arms.get(name)
        if a is None:
            continue
        share = "/".join(f"{x * 100:.0f}" for x in a["pod_share"])
        refused = " ".join(f"{k}:{v}" for k, v in a["refused"].items()) or "-"
        client = " ".join(f"{k}:{v}" for k, v in a["client"].items()) or "-"
        rows.append([name, str(a["requests"]), str(a["ok"]), fmt(a["goodput"], ".1f"), fmt(a["p50_ms"], ".1f"),
                     fmt(a["p99_ms"], ".1f"), fmt(a["wait_p99_ms"], ".1f"), refused, client, share,
                     fmt(a.get("gateway_retries"), ".0f"), fmt(a.get("gateway_cpu_us_per_req"), ".0f"),
                     fmt(a["lag_p99_ms"], ".1f")])
    lines.append(table(["arm", "sent", "200", "goodput/s", "p50 ms", "p99 ms", "wait p99 ms", "refused",
                        "client", "pod share %", "retries", "gw CPU us/req", "lag p99 ms"], rows))
    kp = arms.get(KUBE_PROXY)
    if kp is not None and "connections_per_pod" in kp:
        lines.append(f"kube-proxy: client connections per pod {kp['connections_per_pod']} "
                     f"({kp['connections']} connections opened by {s.clients} clients)")
    if kp is not None:
        for name in s.arms:
            a = arms.get(name)
            if a is None or name == KUBE_PROXY:
                continue
            r99 = ratio(a["p99_ms"], kp["p99_ms"])
            met = r99 is not None and r99 <= GOAL_P99_RATIO
            lines.append(f"{name} / kube-proxy: p50 {fmt(ratio(a['p50_ms'], kp['p50_ms']))}x, p99 "
                         f"{fmt(r99)}x (goal <= {GOAL_P99_RATIO:g}: {'met' if met else 'NOT met'}), goodput "
                         f"{fmt(ratio(a['goodput'], kp['goodput']))}x, refused {a['refused_total']} vs "
                         f"{kp['refused_total']}")
    loads = [f"{name} {a['load_average'][0]} -> {a['load_average'][1]}" for name, a in arms.items()]
    lines.append("load average (1/5/15 min) per arm, start -> end: " + "; ".join(loads))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# The plot.

def plot(doc: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rep = doc["reps"][0]
    arms: dict[str, Any] = rep["arms"]
    names = [n for n in doc["settings"]["arms"] if n in arms]
    colors = {KUBE_PROXY: "tab:red", "leastWait": "tab:blue", "powerOfTwo": "tab:green", "random": "tab:orange"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for n in names:
        lat = sorted(arms[n]["latencies_ms"])
        if not lat:
            continue
        ccdf = [1.0 - i / len(lat) for i in range(len(lat))]
        ax.step(lat, ccdf, where="post", label=n, color=colors.get(n))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(bottom=1e-3)
    ax.axhline(0.01, color="gray", lw=0.6, ls=":")
    ax.set_xlabel("latency of 200 answers, ms (from the scheduled arrival)")
    ax.set_ylabel("share of answers slower (1 - CDF)")
    ax.set_title("latency tail")
    ax.legend()
    ax = axes[1]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [arms[n]["p50_ms"] or 0 for n in names], 0.4, label="p50", color="tab:gray")
    ax.bar([i + 0.2 for i in x], [arms[n]["p99_ms"] or 0 for n in names], 0.4, label="p99",
           color=[colors.get(n, "tab:blue") for n in names])
    ax.set_xticks(list(x), names)
    ax.set_ylabel("ms")
    ax.set_title("p50 and p99 latency")
    ax.legend()
    ax = axes[2]
    ax.bar(list(x), [arms[n]["goodput"] for n in names], color=[colors.get(n, "tab:blue") for n in names])
    ax.axhline(doc["rate"], color="gray", ls="--", lw=0.8, label=f"offered {doc['rate']:.0f}/s")
    for i, n in enumerate(names):
        ax.text(i, arms[n]["goodput"], f"refused {arms[n]['refused_total']}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), names)
    ax.set_ylabel("200 within deadline per s")
    ax.set_title("goodput")
    ax.legend(loc="lower right")
    s = doc["settings"]
    sizes = ", ".join(f"{ms:g} ms {p * 100:.0f} %" for ms, p in s["sizes"])
    fig.suptitle(f"repetition 1: {s['pods']} pods, K={s['clients']} keep-alive clients, {s['load']:g} x capacity "
                 f"({doc['rate']:.0f}/s), sizes {sizes}; load average {doc['machine']['load_average_start']} at "
                 f"start, {doc.get('load_average_end', '?')} at end", fontsize=9)
    for a in axes:
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------
# Command line.

def parse_args(argv: list[str] | None) -> tuple[Settings, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m bench.gateway_routing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=4)
    p.add_argument("--clients", type=int, default=32, help="K keep-alive clients, one connection each")
    p.add_argument("--load", type=float, default=0.8, help="offered load as a share of the measured capacity")
    p.add_argument("--rate", type=float, help="offered requests per second (skips the capacity measurement)")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per arm")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--deadline-ms", type=float, default=1000.0)
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="service times, <ms>:<share>,...")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--reps", type=int, default=1, help="repetitions (seed + rep; the order alternates)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--capacity-seconds", type=float, default=4.0)
    p.add_argument("--capacity-conns", type=int, default=4, help="closed-loop connections per pod")
    p.add_argument("--max-queue", type=int, default=64, help="each pod's queue bound")
    p.add_argument("--client-queue", type=int, default=256, help="requests waiting in one client, then dropped")
    p.add_argument("--settle", type=float, default=2.0, help="seconds between arms (the pods' queues empty)")
    p.add_argument("--plot", type=Path, help="also write the PNG here (e.g. docs/img/perf/gateway-routing.png)")
    ns = p.parse_args(argv)
    try:
        sizes = parse_sizes(ns.sizes)
        arms = [a.strip() for a in ns.arms.split(",") if a.strip()]
        bad = [a for a in arms if a not in ARMS]
        if bad or not arms or len(set(arms)) != len(arms):
            raise RoutingBenchError(f"--arms: {ns.arms!r}; each of {', '.join(ARMS)} at most once")
        if not (1 <= ns.pods <= 16 and 1 <= ns.clients <= 1024 and 1 <= ns.reps <= 20):
            raise RoutingBenchError("--pods within [1, 16], --clients within [1, 1024], --reps within [1, 20]")
        if not (0 < ns.load <= 2) or (ns.rate is not None and not (0 < ns.rate <= 5000)):
            raise RoutingBenchError("--load within (0, 2], --rate within (0, 5000]")
        if not (0 < ns.duration <= 600 and 0 <= ns.warmup <= 60 and 1 <= ns.deadline_ms <= 60_000):
            raise RoutingBenchError("--duration within (0, 600], --warmup within [0, 60], "
                                    "--deadline-ms within [1, 60000]")
        if not (0 < ns.capacity_seconds <= 60 and 1 <= ns.capacity_conns <= 64 and 1 <= ns.max_queue <= 100_000
                and 1 <= ns.client_queue <= 100_000 and 0 <= ns.settle <= 60):
            raise RoutingBenchError("--capacity-seconds, --capacity-conns, --max-queue, --client-queue or "
                                    "--settle out of range")
    except RoutingBenchError as e:
        p.error(str(e))
    s = Settings(ns.pods, ns.clients, ns.load, ns.rate, ns.duration, ns.warmup, ns.deadline_ms, sizes, arms,
                 ns.reps, ns.seed, ns.capacity_seconds, ns.capacity_conns, ns.max_queue, ns.client_queue, ns.settle)
    return s, ns


def main(argv: list[str] | None = None) -> int:
    s, ns = parse_args(argv)
    st = size_stats(s.sizes)
    sizes = ", ".join(f"{ms:g} ms {p * 100:.0f} %" for ms, p in s.sizes)
    print(f"# gateway routing: {s.pods} pods (one permit, queue {s.max_queue}), K={s.clients} keep-alive clients, "
          f"sizes {sizes} (mean {st['mean_ms']:.1f} ms, SCV {st['scv']:.2f}), deadline {s.deadline_ms:g} ms; "
          f"arms {', '.join(s.arms)}; load average {load_average()}; pinning {'on' if pinning_possible() else 'off'}")
    with tempfile.TemporaryDirectory(prefix="gw-routing-") as tmp:
        doc = run_benchmark(s, Path(tmp), print)
    print(f"# load average at end {doc['load_average_end']}")
    saved = save_results("gateway_routing", doc)
    print(f"results: {saved}")
    png = plot(doc, saved.with_suffix(".png"))
    if png is not None:
        print(f"plot: {png}")
        if ns.plot is not None:
            ns.plot.parent.mkdir(parents=True, exist_ok=True)
            ns.plot.write_bytes(png.read_bytes())
            print(f"plot: {ns.plot}")
    else:
        print("plot: matplotlib is not installed; no PNG")
    return 0


if __name__ == "__main__":
    sys.exit(main())
