"""The sandbox's load generator: open-loop Poisson traffic to an InferenceService, sent the way real
clients send it.

* **Keep-alive clients through the Service (the default).** :class:`KeepAlive`: K clients per
  tenant, each with its own keep-alive connection(s) to the Service's ClusterIP:port, as every OIP
  client (tritonclient, KServe's SDK, httpx, ``requests.Session``) calls a Service. kube-proxy picks a
  pod when a connection opens, so each client's requests all land on the pod its connection reached;
  a client opens a new connection only when one is closed (by the pod, or by a client timeout).
  Pods added later get nothing from connections already open (issue 19). Pointed at the gateway's
  Service instead (``sluiceway demo``'s default), the same clients reach every pod: the gateway
  routes each request.
* **Per request (an explicit option).** ``per_request=``: every request goes straight to a random
  ready, non-terminating endpoint from :class:`EndpointWatcher` (the Service's EndpointSlices, re-read
  every ``refresh`` seconds) -- the spread a per-request balancer gives, which kube-proxy does not.
  No ready endpoint: the request is recorded as ``no_endpoints``.

* **Open loop.** Every send time is drawn before the run (seeded Poisson arrivals per phase of the
  ramp); a timer fires each request at its time however many are outstanding, so a slow service
  cannot slow the offered load down. Latency runs from the *scheduled* send time.
* **Per-request identity.** Each arrival belongs to a :class:`Client` (a tenant's API key and the
  priority class it asks for), drawn by the clients' shares.
* **Bounded.** At most ``max_requests`` per run and ``max_inflight`` outstanding (beyond: a recorded
  client drop, not sent); each request gives up after ``timeout``; the run ends one timeout after
  the last phase. Only sandbox addresses (pods and Services, 198.18.0.0/15) or loopback are ever
  contacted.

Concurrency: :func:`run_load` runs on one asyncio event loop (one task per request, one aiohttp
session per keep-alive client); :class:`EndpointWatcher` is one thread that swaps a list under a lock.
Pure parts (:func:`build_schedule`, :func:`ready_endpoints`, :func:`summarize`) are separate from
the I/O (:class:`EndpointWatcher`, :func:`service_address`, :func:`run_load`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import math
import random
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

__all__ = [
    "CLIENT_DROP",
    "CLIENT_TIMEOUT",
    "CONNECTION_ERROR",
    "NO_ENDPOINTS",
    "Client",
    "EndpointWatcher",
    "KeepAlive",
    "LoadgenError",
    "Outcome",
    "Phase",
    "Summary",
    "build_schedule",
    "ready_endpoints",
    "run_load",
    "service_address",
    "summarize",
]

DEADLINE_HEADER = "X-Sluiceway-Deadline-Ms"
PRIORITY_HEADER = "X-Sluiceway-Priority"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
#: one FP32 row of 4 values (the synthetic model echoes it)
DEFAULT_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}
).encode()

#: client-side outcomes, in ``Outcome.status`` where no HTTP status exists
CLIENT_TIMEOUT = 0
CONNECTION_ERROR = -1
CLIENT_DROP = -2
NO_ENDPOINTS = -3
STATUS_NAMES = {CLIENT_TIMEOUT: "timeout", CONNECTION_ERROR: "conn_err", CLIENT_DROP: "drop",
                NO_ENDPOINTS: "no_endpoints"}

SANDBOX_NETWORK = ipaddress.ip_network("198.18.0.0/15")


class LoadgenError(ValueError):
    """A bad argument: an unbounded or empty run, a bad rate or share, a non-sandbox address."""


@dataclass(frozen=True)
class Client:
    """One caller: a tenant's API key, the priority class it asks for, its share of arrivals."""

    name: str
    key: str | None = None
    priority: str | None = None
    share: float = 1.0

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = f"Bearer {self.key}"
        if self.priority:
            h[PRIORITY_HEADER] = self.priority
        return h


@dataclass(frozen=True)
class KeepAlive:
    """How keep-alive clients connect: ``clients`` per tenant (:class:`Client`), each holding up to
    ``connections`` keep-alive connections (HTTP/1.1, no pipelining: a request waits for a free
    connection of its client). A tenant's arrivals go to its clients in turn."""

    clients: int = 8
    connections: int = 1

    def __post_init__(self) -> None:
        if not (1 <= self.clients <= 256 and 1 <= self.connections <= 64):
            raise LoadgenError(f"keep-alive clients must be 1..256 with 1..64 connections each, got {self}")


@dataclass(frozen=True)
class Phase:
    """``seconds`` of Poisson arrivals at ``rate`` per second in total (0: silence)."""

    name: str
    seconds: float
    rate: float


@dataclass(slots=True)
class Outcome:
    t: float  # scheduled send time, seconds since the run's start
    client: str
    status: int  # HTTP status, or CLIENT_TIMEOUT / CONNECTION_ERROR / CLIENT_DROP / NO_ENDPOINTS
    reason: str = ""  # the body's "reason" for a non-2xx answer, or the client-side cause
    latency: float | None = None  # scheduled send -> last byte (None: never sent)
    endpoint: str = ""  # "ip:port" the request went to: the pod (per request) or the Service (keep-alive)


# ------------------------------------------------------------------------------------------------
# Pure.


def check_address(host: str) -> None:
    """Refuse anything but a sandbox pod address or loopback."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise LoadgenError(f"endpoint {host!r} is not an IP address") from None
    if not (addr.is_loopback or addr in SANDBOX_NETWORK):
        raise LoadgenError(f"refusing endpoint {host}: only 198.18.0.0/15 (the sandbox) and loopback")


def ready_endpoints(slices: Sequence[Mapping[str, Any]], port_name: str = "http") -> list[str]:
    """``ip:port`` of every ready, non-terminating endpoint of the port named ``port_name``, as
    kube-proxy reads EndpointSlices (``ready`` unset counts as ready). Sorted, without duplicates."""
    out: set[str] = set()
    for s in slices:
        if s.get("addressType", "IPv4") != "IPv4":
            continue
        ports = [p.get("port") for p in s.get("ports") or [] if p.get("name", "") == port_name]
        if not ports or not isinstance(ports[0], int):
            continue
        for ep in s.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            if cond.get("ready") is False or cond.get("terminating") is True:
                continue
            for addr in ep.get("addresses") or []:
                check_address(addr)
                out.add(f"{addr}:{ports[0]}")
    return sorted(out)


def build_schedule(phases: Sequence[Phase], clients: Sequence[Client], seed: int = 1,
                   max_requests: int = 100_000) -> list[tuple[float, int]]:
    """Arrival times ``(t, client index)`` over the phases, sorted: Poisson at each phase's rate,
    each arrival's client drawn by share. Raises :class:`LoadgenError` when the run would exceed
    ``max_requests`` (expected count) or a rate or share is not a finite non-negative number."""
    if not clients:
        raise LoadgenError("at least one client is required")
    shares = [c.share for c in clients]
    if any(not (math.isfinite(s) and s >= 0) for s in shares) or sum(shares) <= 0:
        raise LoadgenError(f"client shares must be non-negative and not all zero, got {shares}")
    expected = 0.0
    for p in phases:
        if not (math.isfinite(p.rate) and p.rate >= 0 and math.isfinite(p.seconds) and p.seconds > 0):
            raise LoadgenError(f"phase {p.name!r}: rate must be >= 0 and seconds > 0, got {p.rate}, {p.seconds}")
        expected += p.rate * p.seconds
    if expected > max_requests:
        raise LoadgenError(f"about {expected:.0f} requests planned; the bound is {max_requests}")
    rng = random.Random(seed)
    out: list[tuple[float, int]] = []
    start = 0.0
    idx = list(range(len(clients)))
    for p in phases:
        end = start + p.seconds
        if p.rate > 0:
            t = start + rng.expovariate(p.rate)
            while t < end:
                out.append((t, rng.choices(idx, weights=shares)[0]))
                t += rng.expovariate(p.rate)
        start = end
    return out[:max_requests]


def phase_at(phases: Sequence[Phase], t: float) -> Phase | None:
    start = 0.0
    for p in phases:
        if start <= t < start + p.seconds:
            return p
        start += p.seconds
    return None


def status_name(status: int) -> str:
    return STATUS_NAMES.get(status, str(status))


@dataclass(frozen=True)
class Summary:
    """Counts over a set of outcomes (``seconds``: the span they cover, for rates)."""

    seconds: float
    sent: int
    ok: int
    codes: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)  # "code reason" -> count, non-2xx only
    p95_latency: float | None = None

    @property
    def offered_rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0

    @property
    def goodput(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    @property
    def goodput_share(self) -> float:
        return self.ok / self.sent if self.sent else 0.0

    @property
    def unexpected_5xx(self) -> int:
        """5xx answers other than 503/504 (those two are the shedding answers, with a reason)."""
        return sum(n for c, n in self.codes.items() if c.isdigit() and 500 <= int(c) < 600
                   and c not in ("503", "504"))

    @property
    def shed_without_reason(self) -> int:
        """503/504 answers whose body named no reason (must be 0)."""
        return sum(n for k, n in self.reasons.items() if k in ("503 -", "504 -"))


def summarize(outcomes: Sequence[Outcome], seconds: float) -> Summary:
    codes = Counter(status_name(o.status) for o in outcomes)
    reasons = Counter(f"{status_name(o.status)} {o.reason or '-'}" for o in outcomes
                      if not 200 <= o.status < 300)
    lat = sorted(o.latency for o in outcomes if 200 <= o.status < 300 and o.latency is not None)
    p95 = lat[max(0, math.ceil(0.95 * len(lat)) - 1)] if lat else None
    return Summary(seconds, len(outcomes), sum(1 for o in outcomes if 200 <= o.status < 300),
                   dict(sorted(codes.items())), dict(sorted(reasons.items())), p95)


# ------------------------------------------------------------------------------------------------
# I/O.


class SliceSource(Protocol):
    """What :class:`EndpointWatcher` needs of a Kubernetes client (``Kube.get``)."""

    def get(self, path: str, query: dict[str, str] | None = None) -> Any: ...


class EndpointWatcher:
    """Keeps the ready endpoints of one Service fresh from the EndpointSlice API (a thread)."""

    def __init__(self, kube: SliceSource, namespace: str, service: str, *, port_name: str = "http",
                 refresh: float = 1.0) -> None:
        self.kube, self.namespace, self.service = kube, namespace, service
        self.port_name, self.refresh = port_name, refresh
        self._lock = threading.Lock()
        self._endpoints: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error = ""

    def poll(self) -> list[str]:
        """Read the slices now; on an API error keep the last list and remember the error."""
        try:
            doc = self.kube.get(
                f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices",
                {"labelSelector": f"{SERVICE_NAME_LABEL}={self.service}"},
            )
            eps = ready_endpoints(doc.get("items") or [], self.port_name)
        except LoadgenError as err:  # an address outside the sandbox: send nowhere, say why
            self.last_error = str(err)
            with self._lock:
                self._endpoints = []
            raise
        except Exception as err:  # an API hiccup must not stop the load; keep the last list
            self.last_error = f"{type(err).__name__}: {err}"
            return self.endpoints()
        with self._lock:
            self._endpoints = eps
        return eps

    def endpoints(self) -> list[str]:
        with self._lock:
            return list(self._endpoints)

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh):
            with contextlib.suppress(LoadgenError):  # recorded in last_error; endpoints emptied
                self.poll()

    def __enter__(self) -> EndpointWatcher:
        self.poll()
        self._thread = threading.Thread(target=self._loop, name="endpoint-watcher", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.refresh + 30)


def service_address(kube: SliceSource, namespace: str, service: str, port_name: str = "http") -> str:
    """``clusterIP:port`` of the Service's port named ``port_name`` (a sandbox address, checked)."""
    spec = kube.get(f"/api/v1/namespaces/{namespace}/services/{service}").get("spec") or {}
    ip = spec.get("clusterIP") or ""
    if ip in ("", "None"):
        raise LoadgenError(f"Service {namespace}/{service} has no ClusterIP (headless?)")
    check_address(ip)
    ports = [p["port"] for p in spec.get("ports") or [] if (p.get("name") or "") == port_name]
    if not ports:
        raise LoadgenError(f"Service {namespace}/{service} has no port named {port_name!r}")
    return f"{ip}:{ports[0]}"


def _reason(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return ""
    reason = doc.get("reason") if isinstance(doc, dict) else None
    return reason if isinstance(reason, str) else ""


async def run_load(
    schedule: Sequence[tuple[float, int]],
    clients: Sequence[Client],
    path: str,
    *,
    service: str = "",
    keepalive: KeepAlive = KeepAlive(),
    per_request: Callable[[], Sequence[str]] | None = None,
    outcomes: list[Outcome] | None = None,
    timeout: float = 5.0,
    max_inflight: int = 1000,
    body: bytes = DEFAULT_BODY,
    seed: int = 1,
    stop: threading.Event | None = None,
    on_start: Callable[[float], None] | None = None,
) -> list[Outcome]:
    """Send ``schedule`` (from :func:`build_schedule`) to ``path``: by default through keep-alive
    clients (``keepalive``) connected to ``service`` (``clusterIP:port``, :func:`service_address`);
    with ``per_request`` (and no ``service``), each request to a random one of the endpoints that
    ``per_request()`` returns at its send. Outcomes are appended to ``outcomes`` as they complete
    (another thread may read it for a live display). ``stop`` ends the run early. ``on_start`` is
    called once with the run's time zero on ``time.monotonic()``'s scale (the event loop's clock),
    from which every ``Outcome.t`` counts, so a caller can line outcomes up with its own clock."""
    if not path.startswith("/"):
        raise LoadgenError(f"path must start with '/', got {path!r}")
    if bool(service) == (per_request is not None):
        raise LoadgenError("give either service= (keep-alive clients) or per_request= (endpoints), not both")
    if service:
        check_address(service.rpartition(":")[0])
    if not 0 < timeout <= 600:
        raise LoadgenError(f"timeout must be within (0, 600] s, got {timeout}")
    out: list[Outcome] = [] if outcomes is None else outcomes
    rng = random.Random(seed + 7919)
    headers = [c.headers() for c in clients]
    loop = asyncio.get_running_loop()
    inflight = 0
    tasks: set[asyncio.Task[None]] = set()

    turn = [0] * len(clients)  # the next keep-alive client of each tenant

    def pick(ci: int) -> tuple[aiohttp.ClientSession, str] | None:
        if per_request is None:
            k = turn[ci]
            turn[ci] = (k + 1) % keepalive.clients
            return keep[ci][k], service
        eps = per_request()
        if not eps:
            return None
        ep = eps[rng.randrange(len(eps))]
        check_address(ep.rpartition(":")[0])
        return shared, ep

    async def one(t_rel: float, ci: int, t0: float) -> None:
        nonlocal inflight
        name = clients[ci].name
        chosen = pick(ci)
        if chosen is None:
            out.append(Outcome(t_rel, name, NO_ENDPOINTS, "no_endpoints"))
            return
        if inflight >= max_inflight:
            out.append(Outcome(t_rel, name, CLIENT_DROP, "max_inflight"))
            return
        session, ep = chosen
        status, reason = CLIENT_TIMEOUT, "client_timeout"
        inflight += 1
        try:
            async with asyncio.timeout_at(t0 + t_rel + timeout):
                async with session.post(f"http://{ep}{path}", data=body, headers=headers[ci]) as resp:
                    data = await resp.read()
                    status = resp.status
            reason = "" if 200 <= status < 300 else _reason(data)
        except TimeoutError:
            pass
        except (aiohttp.ClientError, OSError) as err:
            status, reason = CONNECTION_ERROR, type(err).__name__
        finally:
            inflight -= 1
        out.append(Outcome(t_rel, name, status, reason, loop.time() - (t0 + t_rel), ep))

    def spawn(t_rel: float, ci: int, t0: float) -> None:
        task = loop.create_task(one(t_rel, ci, t0))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def session(limit: int) -> aiohttp.ClientSession:
        # keep-alive: an idle connection stays open (the pod closes it after its own idle timeout)
        conn = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, keepalive_timeout=3600.0)
        return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None))

    async with contextlib.AsyncExitStack() as stack:
        shared = await stack.enter_async_context(session(0))  # per request: any connection, no bound
        keep = [[await stack.enter_async_context(session(keepalive.connections)) for _ in range(keepalive.clients)]
                for _ in clients] if per_request is None else []
        t0 = loop.time() + 0.2
        if on_start is not None:
            on_start(t0)
        handles = [loop.call_at(t0 + t, spawn, t, ci, t0) for t, ci in schedule]
        horizon = schedule[-1][0] if schedule else 0.0
        try:
            while loop.time() < t0 + horizon:
                if stop is not None and stop.is_set():
                    break
                await asyncio.sleep(min(0.25, max(0.0, t0 + horizon - loop.time())))
            end = loop.time() + timeout + 1.0
            while tasks and loop.time() < end and not (stop is not None and stop.is_set()):
                await asyncio.wait(set(tasks), timeout=min(0.25, max(0.0, end - loop.time())))
        finally:
            for h in handles:
                h.cancel()
            for task in list(tasks):
                task.cancel()
            for task in list(tasks):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
    return out


def run_load_in_thread(*args: Any, **kw: Any) -> tuple[threading.Thread, list[Outcome], threading.Event]:
    """Start :func:`run_load` on its own event loop in a thread; returns (thread, the outcomes list
    it fills, a stop event)."""
    outcomes: list[Outcome] = kw.pop("outcomes", None) or []
    stop: threading.Event = kw.pop("stop", None) or threading.Event()

    def target() -> None:
        asyncio.run(run_load(*args, outcomes=outcomes, stop=stop, **kw))

    th = threading.Thread(target=target, name="sandbox-loadgen", daemon=True)
    th.start()
    return th, outcomes, stop

