"""Open-loop load generator for OIP v2 inference servers on loopback.

Design (see docs/benchmarks.md):

* **Open loop.** Every request's send time is fixed before the run starts: Poisson arrivals (seeded
  exponential gaps) per :class:`Stream`, merged into one schedule. A timer (``loop.call_at``) starts
  each request at its time no matter how many are still outstanding, so a slow server cannot slow
  the offered load down (no coordinated omission).
* **Latency from the intended send time.** A record's latency runs from its *scheduled* send time to
  the last byte of the answer, so any lateness of the generator itself is charged to the request,
  never hidden. The generator's own lateness (*lag*) is recorded per request; lag over 1 ms is
  counted and reported, and a run with more than 0.1 % lagged requests is flagged invalid.
* **Client deadline.** A stream may carry a deadline: the request sends ``X-Sluiceway-Deadline-Ms``
  with the budget that remains at send time, and the client gives up at *scheduled time + timeout*.
* **Bounded.** At most ``max_requests`` per run and ``max_inflight`` outstanding (an arrival beyond
  that is a *client drop*, recorded, not sent), the schedule ends after ``warmup + duration``, and
  whatever is still running one timeout later is cancelled. Only loopback URLs are accepted.

Concurrency model: one asyncio event loop (uvloop when installed) in one thread, one
``aiohttp.ClientSession`` with an unbounded connector (the generator's own ``max_inflight`` is the
bound, so no request waits inside aiohttp for a connection). Each request is its own task; records
are appended from that loop only. Nothing here blocks the loop.

Command line (a quick single-point run)::

    python -m bench.loadgen --url http://127.0.0.1:8080/v2/models/demo/infer --rate 100 \\
        --duration 10 --deadline-ms 200
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

DEADLINE_HEADER = "X-Sluiceway-Deadline-Ms"
PRIORITY_HEADER = "X-Sluiceway-Priority"

#: The request every benchmark sends: one FP32 row of 4 values (the synthetic model echoes it).
DEFAULT_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}
).encode()

#: Client-side outcomes, stored in ``Record.status`` where no HTTP status exists.
CLIENT_TIMEOUT = 0
CONNECTION_ERROR = -1
CLIENT_DROP = -2
STATUS_NAMES = {CLIENT_TIMEOUT: "timeout", CONNECTION_ERROR: "conn_err", CLIENT_DROP: "drop"}

MAX_LAG_SHARE = 0.001  # more lagged requests than this makes the run invalid
LAG_THRESHOLD = 0.001  # seconds
EARLY_WAKE = 0.001  # arm each timer this much early, then yield until the exact time


class LoadgenError(ValueError):
    """A bad argument (non-loopback URL, unbounded run, bad rate)."""


def check_loopback(url: str) -> None:
    """Refuse any target that is not on this machine's loopback interface."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise LoadgenError(f"{url!r}: only http(s) URLs are supported")
    host = parts.hostname or ""
    if host == "localhost":
        return
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise LoadgenError(f"{url!r}: the host must be a loopback IP address or localhost") from None
    if not addr.is_loopback:
        raise LoadgenError(f"{url!r}: refusing a non-loopback target ({host}); load tests hit loopback only")


@dataclass(frozen=True)
class Stream:
    """One class of traffic: its Poisson rate, its headers and its client deadline."""

    name: str
    rate: float  # mean arrivals per second
    headers: Mapping[str, str] = field(default_factory=dict)
    deadline_ms: float | None = None  # sent as X-Sluiceway-Deadline-Ms (remaining budget at send)
    timeout_s: float = 1.0  # the client gives up at scheduled time + timeout_s


@dataclass(slots=True)
class Record:
    stream: str
    t: float  # scheduled send time, seconds since the run's start
    lag: float  # actual start - scheduled start (seconds)
    latency: float | None  # scheduled send -> last byte of the answer (None: dropped, never sent)
    status: int  # HTTP status, or CLIENT_TIMEOUT / CONNECTION_ERROR / CLIENT_DROP
    reason: str = ""  # the body's "reason" for a non-2xx answer, or the client-side cause
    retry_after: str | None = None
    degraded: str | None = None
    message: str = ""  # the body's error text (first 100 characters) for a non-2xx answer


@dataclass
class RunResult:
    records: list[Record]
    warmup: float
    duration: float
    seed: int
    lagged: int  # requests started more than 1 ms late
    max_lag: float
    probes: dict[str, Any]
    wall_seconds: float

    @property
    def lag_share(self) -> float:
        return self.lagged / len(self.records) if self.records else 0.0

    @property
    def valid(self) -> bool:
        """False when the generator itself lagged too often to trust the latencies."""
        return self.lag_share <= MAX_LAG_SHARE

    def window(self) -> list[Record]:
        """Records scheduled inside the measured window (after the warm-up)."""
        lo, hi = self.warmup, self.warmup + self.duration
        return [r for r in self.records if lo <= r.t < hi]

    def to_json(self) -> dict[str, Any]:
        return {
            "warmup": self.warmup, "duration": self.duration, "seed": self.seed, "lagged": self.lagged,
            "lag_share": self.lag_share, "max_lag": self.max_lag, "valid": self.valid,
            "probes": self.probes, "wall_seconds": self.wall_seconds, "requests": len(self.records),
        }


def poisson_schedule(streams: Sequence[Stream], horizon: float, seed: int) -> list[tuple[float, int]]:
    """Merged arrival times ``(t, stream index)`` in ``[0, horizon)``, sorted. Each stream draws from
    its own generator seeded from ``seed`` and its index, so adding a stream leaves the others alone."""
    out: list[tuple[float, int]] = []
    for i, s in enumerate(streams):
        if not (s.rate > 0 and math.isfinite(s.rate)):
            raise LoadgenError(f"stream {s.name!r}: rate must be a positive number, got {s.rate!r}")
        rng = random.Random(seed * 1_000_003 + i)
        t = rng.expovariate(s.rate)
        while t < horizon:
            out.append((t, i))
            t += rng.expovariate(s.rate)
    out.sort()
    return out


def _reason(body: bytes) -> tuple[str, str]:
    """``(reason, message)`` from an error body: the pod's ``{"error", "reason"}``, FastAPI's
    ``{"detail"}``; empty strings when there is neither."""
    try:
        doc = json.loads(body)
    except ValueError:
        return "", ""
    if not isinstance(doc, dict):
        return "", ""
    reason = doc.get("reason")
    message = doc.get("error", doc.get("detail", ""))
    return (reason if isinstance(reason, str) else ""), (message if isinstance(message, str) else "")[:100]


class _Runner:
    def __init__(
        self,
        url: str,
        streams: Sequence[Stream],
        schedule: list[tuple[float, int]],
        body: bytes,
        max_inflight: int,
    ) -> None:
        self.url = url
        self.streams = streams
        self.schedule = schedule
        self.body = body
        self.max_inflight = max_inflight
        self.records: list[Record] = []
        self.inflight = 0
        self.lagged = 0
        self.max_lag = 0.0
        self.tasks: set[asyncio.Task[None]] = set()
        self.t0 = 0.0  # the run's start on the loop's clock (timers)
        self.mono0 = 0.0  # the same instant on time.monotonic() (measurements)
        base = {"Content-Type": "application/json"}
        self.headers = [{**base, **s.headers} for s in streams]
        self.session: aiohttp.ClientSession | None = None

    def spawn(self, idx: int) -> None:
        task = asyncio.get_running_loop().create_task(self.one(idx))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def one(self, idx: int) -> None:
        t_rel, si = self.schedule[idx]
        stream = self.streams[si]
        sched = self.mono0 + t_rel  # measured on time.monotonic(): uvloop's loop.time() has 1 ms steps
        # The timer was armed EARLY_WAKE early (event-loop timers are only millisecond-precise):
        # yield to the loop until the scheduled time, then send.
        while time.monotonic() < sched:  # noqa: ASYNC110 - a deliberate sub-millisecond wait
            await asyncio.sleep(0)
        lag = time.monotonic() - sched
        if lag > LAG_THRESHOLD:
            self.lagged += 1
        self.max_lag = max(self.max_lag, lag)
        if self.inflight >= self.max_inflight:
            self.records.append(Record(stream.name, t_rel, lag, None, CLIENT_DROP, "max_inflight"))
            return
        headers = self.headers[si]
        if stream.deadline_ms is not None:
            headers = {**headers, DEADLINE_HEADER: f"{max(0.0, stream.deadline_ms - lag * 1000.0):.3f}"}
        assert self.session is not None
        self.inflight += 1
        status, reason, ra, deg, msg = CLIENT_TIMEOUT, "client_timeout", None, None, ""
        try:
            async with asyncio.timeout_at(self.t0 + t_rel + stream.timeout_s):
                async with self.session.post(self.url, data=self.body, headers=headers) as resp:
                    data = await resp.read()
                    status = resp.status
                    ra = resp.headers.get("Retry-After")
                    deg = resp.headers.get("X-Sluiceway-Degraded")
            reason, msg = ("", "") if 200 <= status < 300 else _reason(data)
        except TimeoutError:
            pass
        except (aiohttp.ClientError, OSError) as e:
            status, reason = CONNECTION_ERROR, type(e).__name__
        finally:
            self.inflight -= 1
        latency = time.monotonic() - sched
        self.records.append(Record(stream.name, t_rel, lag, latency, status, reason, ra, deg, msg))


async def run_open_loop(
    url: str,
    streams: Sequence[Stream],
    *,
    duration: float,
    warmup: float = 0.0,
    seed: int = 1,
    body: bytes = DEFAULT_BODY,
    max_requests: int = 200_000,
    max_inflight: int = 2_000,
    probes: Mapping[str, tuple[float, Callable[[], Awaitable[Any]]]] | None = None,
) -> RunResult:
    """Drive ``url`` with the merged Poisson streams for ``warmup + duration`` seconds.

    ``probes`` maps a name to ``(offset seconds, coroutine function)``: each runs once at that
    offset (e.g. to read a server's counters at the window's edges); its result lands in
    ``RunResult.probes[name]``.
    """
    check_loopback(url)
    horizon = warmup + duration
    if not (0 < duration <= 3600 and 0 <= warmup <= 600):
        raise LoadgenError("duration must be within (0, 3600] s and warmup within [0, 600] s")
    if not streams:
        raise LoadgenError("at least one stream is required")
    expected = sum(s.rate for s in streams) * horizon
    if expected > max_requests:
        raise LoadgenError(f"about {expected:.0f} requests planned; the bound is {max_requests}")
    schedule = poisson_schedule(streams, horizon, seed)[:max_requests]
    runner = _Runner(url, streams, schedule, body, max_inflight)
    loop = asyncio.get_running_loop()
    probe_results: dict[str, Any] = {}
    probe_tasks: list[asyncio.Task[None]] = []

    async def run_probe(name: str, at: float, fn: Callable[[], Awaitable[Any]]) -> None:
        await asyncio.sleep(max(0.0, runner.t0 + at - loop.time()))
        try:
            probe_results[name] = await fn()
        except Exception as e:
            probe_results[name] = {"error": f"{type(e).__name__}: {e}"}

    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=None)
    wall0 = time.perf_counter()
    no_timeout = aiohttp.ClientTimeout(total=None)  # each request has its own (asyncio.timeout_at)
    async with aiohttp.ClientSession(connector=connector, timeout=no_timeout) as session:
        runner.session = session
        runner.t0 = loop.time() + 0.2  # time to arm every timer before the first send
        runner.mono0 = time.monotonic() + (runner.t0 - loop.time())
        handles = [loop.call_at(runner.t0 + t - EARLY_WAKE, runner.spawn, i)
                   for i, (t, _) in enumerate(schedule)]
        for name, (at, fn) in (probes or {}).items():
            probe_tasks.append(loop.create_task(run_probe(name, at, fn)))
        try:
            await asyncio.sleep(max(0.0, runner.t0 + horizon - loop.time()))
            # Everything is scheduled; wait for the stragglers, one client timeout at most.
            grace = max(s.timeout_s for s in streams) + 1.0
            end = loop.time() + grace
            while runner.tasks and loop.time() < end:
                await asyncio.wait(set(runner.tasks), timeout=max(0.0, end - loop.time()))
            if probe_tasks:
                await asyncio.wait(probe_tasks, timeout=max(1.0, end - loop.time()))
        finally:
            for h in handles:
                h.cancel()
            for task in list(runner.tasks) + probe_tasks:
                task.cancel()
            for task in list(runner.tasks) + probe_tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
    runner.records.sort(key=lambda r: r.t)
    return RunResult(runner.records, warmup, duration, seed, runner.lagged, runner.max_lag, probe_results,
                     time.perf_counter() - wall0)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_sync(coro: Awaitable[Any]) -> Any:
    loop = new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


# ------------------------------------------------------------------------------------------------
# Statistics.

def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]


def code_counts(records: Sequence[Record]) -> dict[str, int]:
    c = Counter(STATUS_NAMES.get(r.status, str(r.status)) for r in records)
    return dict(sorted(c.items()))


def reason_counts(records: Sequence[Record]) -> dict[str, int]:
    c = Counter(r.reason for r in records if r.reason)
    return dict(sorted(c.items()))


def ok(r: Record) -> bool:
    return 200 <= r.status < 300


def fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def fmt_codes(codes: Mapping[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in codes.items()) or "-"


def records_json(records: Sequence[Record]) -> list[dict[str, Any]]:
    return [asdict(r) for r in records]


# ------------------------------------------------------------------------------------------------
# Command line.

def _parse_header(raw: str) -> tuple[str, str]:
    name, sep, value = raw.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"header must be 'Name: value', got {raw!r}")
    return name.strip(), value.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loadgen", description="One open-loop Poisson run.")
    p.add_argument("--url", required=True, help="loopback infer URL")
    p.add_argument("--rate", type=float, required=True, help="mean requests per second")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--deadline-ms", type=float, help="send X-Sluiceway-Deadline-Ms and time out there")
    p.add_argument("--timeout", type=float, default=1.0, help="client timeout (s) without --deadline-ms")
    p.add_argument("--header", action="append", type=_parse_header, default=[], help="'Name: value'")
    p.add_argument("--max-requests", type=int, default=200_000)
    ns = p.parse_args(argv)
    timeout = ns.deadline_ms / 1000.0 if ns.deadline_ms is not None else ns.timeout
    stream = Stream("main", ns.rate, dict(ns.header), ns.deadline_ms, timeout)
    try:
        res: RunResult = run_sync(run_open_loop(ns.url, [stream], duration=ns.duration, warmup=ns.warmup,
                                                seed=ns.seed, max_requests=ns.max_requests))
    except LoadgenError as e:
        print(f"loadgen: {e}", file=sys.stderr)
        return 2
    win = res.window()
    good = [r for r in win if ok(r) and (ns.deadline_ms is None or (r.latency is not None
                                          and r.latency <= ns.deadline_ms / 1000.0))]
    lat = [r.latency for r in win if ok(r) and r.latency is not None]
    print(f"requests {len(win)} in {ns.duration:.1f}s (offered {len(win) / ns.duration:.1f}/s), "
          f"good {len(good) / ns.duration:.1f}/s")
    print(f"2xx latency ms p50 {fmt_ms(percentile(lat, 50))} p99 {fmt_ms(percentile(lat, 99))}")
    print(f"codes {fmt_codes(code_counts(win))}  reasons {reason_counts(win)}")
    print(f"client lag > 1 ms: {res.lagged} ({res.lag_share:.3%}), max {res.max_lag * 1000:.2f} ms"
          f"{'' if res.valid else '  INVALID RUN (generator lag)'}")
    return 0 if res.valid else 1


if __name__ == "__main__":
    sys.exit(main())
