"""Issue 20 in the sandbox: scale to zero with the real KEDA, the operator-rendered gateway and the
real kube-proxy.

One sandbox for the module (``sluiceway sandbox up`` with KEDA and Prometheus, the operator's drift
loop every 5 s so that a measured ``status.startup`` reaches the gateway's ConfigMap within
seconds). InferenceService ``cold`` (namespace ``sluiceway-s2z``): the gateway on, engine keda,
``minReplicas: 0``, ``maxReplicas: 1``, ``scaleToZeroAfter: 10s`` (KEDA's ``cooldownPeriod``; KEDA
takes any whole number of seconds, the CRD at least 1 s; KEDA checks it once per
``pollingInterval``, 1 s here), and the slow torch model of ``bench/burst_at_zero.py``
(``bench.burst_at_zero:slow_model``: the pod's demo MLP after a 20 s sleep in its load, in the real
``sluiceway-pod`` process; ``PYTHONPATH`` in ``spec.pod.env`` makes the checkout's ``bench`` importable).
Two tenants with keys: ``first`` and ``flood``.

* ``test_a_burst_at_zero_is_held_and_answered_once_the_pod_is_ready``: at zero pods, 200 requests of
  ``first`` arrive at once, each on its own keep-alive connection (opened before) to the gateway
  Service's ClusterIP (kube-proxy). Every one is answered 200 once the pod is ready (none lost, none
  502), and the Deployment never went back to 0 while any was unanswered. Printed: KEDA's 0 -> 1
  (the Deployment's ``spec.replicas``, polled every 0.25 s), the pod's readiness, the first 200.
* ``test_a_pod_that_fails_to_start_gets_held_requests_refused_with_a_reason``: InferenceService
  ``crashy``: the same, with ``sluiceway_sandbox.testmodels:crash_at_load`` (the pod loads for 4 s,
  answering 503, then its process exits with the load's error; the agent restarts it with back-off)
  and ``gateway.startupEstimate: 8s``. Not from zero: the pod created with the Deployment crash-loops
  and the scaler, which never deactivates while a pod is starting, keeps it. 20 requests with a 30 s
  deadline: each is answered 503 ``no_capacity_in_time`` before its deadline, saying why (the pod
  past its predicted start-up, a failed start seen).
* ``test_a_pod_that_fails_to_start_is_named_in_the_conditions``: ``PodsHealthy`` and ``Ready`` False,
  ``CrashLoopBackOff``, naming the pod and its exit code.
* ``test_the_condition_carries_the_model_load_error``: the condition's message carries the load's
  error, which the pod writes to its termination message (``--termination-log``).
* ``test_the_service_returns_to_zero_after_scale_to_zero_after``: after the burst's last answer, the
  Deployment goes to 0 replicas, the pod object goes and its process ends, with nothing held or in
  flight at the gateway; the times from the last answer are printed. Watched from the burst's end
  in a thread (:class:`ZeroWatch`) while the three failing-start tests run (the return to zero is the
  module's longest wait: ``scaleToZeroAfter`` plus the scaler's rate window); ``crashy`` is deleted
  first, so that nothing loads during the next burst.
* ``test_beyond_the_hold_bound_requests_are_refused_at_once_with_the_predicted_ready_time``: the
  second cold start. The gateway measured the first one itself (from the first request it held with
  no pod at all to the pod routable) and predicts the next one from it; the pods' ``status.startup``
  also reaches the gateway's ``hold.startupSeconds`` (rounded up, reloaded in place). The CRD
  exposes no ``hold`` field (``maxRequests`` stays the gateway's default 1024, ``tenantShare`` 0.5),
  so the bound the spec reaches is a tenant's share: 512 requests. 512 of ``flood`` arrive at once
  (all answered 200, as above); once the gateway holds them, 100 more of ``flood`` (one after
  another, on fresh keep-alive connections) are each refused 429 ``hold_tenant_full`` at once, at
  least 95 of them in under 50 ms and every one in under 250 ms as the client times them (write to
  answer), each with a ``Retry-After`` within 20 % of the time from its refusal to the pod's
  readiness (its endpoint ready in the EndpointSlice, polled every 0.25 s): the issue's promise.

Needs root, the sandbox's Go binaries (KEDA and Prometheus included) and torch. Every wait has a
deadline and fails with the last state seen; each test at most 240 s (pytest-timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sandbox_support import ROOT, cli, is_ready, missing, pods, summary, wait_for
from sluiceway_sandbox import netns
from sluiceway_sandbox.kubeclient import Kube
from sluiceway_sandbox.layout import POD_IMAGE, Layout, layout_for
from sluiceway_sandbox.loadgen import EndpointWatcher, service_address
from sluiceway_sandbox.testmodels import CRASH_MESSAGE, LOAD_SECONDS_ENV

NS = "sluiceway-s2z"
COLD, CRASHY = "cold", "crashy"
API = "/apis/sluiceway.io/v1alpha1"
DRIFT_SECONDS = 5
SCALE_TO_ZERO_AFTER = 10  # seconds (autoscaling.scaleToZeroAfter = KEDA's cooldownPeriod)
LOAD_SECONDS = 20.0  # bench.burst_at_zero.slow_model's default load
#: gateway.startupEstimate: a cold start from zero here, as a user would estimate it (KEDA's activation,
#: the pod's scheduling and process start, the 20 s load, warm-up, the readiness probe); the first run
#: with 25s printed the pod ready 32.8 s after the burst
ESTIMATE = "30s"
FIRST, FLOOD, OVER = 200, 512, 100  # the burst, the flood tenant's share of the hold, beyond it
SECOND = 20  # the second cold start's burst (the hold-bound test predicts the third from two measured)
HOLD_MAX, TENANT_SHARE = 1024, 0.5  # the gateway's defaults (the CRD has no hold field)
REFUSE_FAST = 0.050  # seconds: a refusal beyond the bound
FAST_SHARE = 0.95  # of the refusals within REFUSE_FAST, as the client times them
REFUSE_SLOWEST = 0.250  # seconds: every refusal (held, one would take the pod's start-up)
#: timeouts.request: the held requests' deadline (plus 5 s at the gateway). A pod past its predicted
#: start-up is taken to be late by as much again, so the gateway refuses what it holds once the start
#: has taken about (deadline + start-up) / 2: with 60 s, a run on a loaded machine whose pod took 46 s
#: instead of 25 had all 200 refused 503 no_capacity_in_time; 120 s tolerates three times the start-up
REQUEST_SECONDS = 120
CRASH_REQUESTS, CRASH_DEADLINE_MS = 20, 30_000
KEYS = {"first": "s2z-first-7a1c0e93b5d24f68", "flood": "s2z-flood-2b9e4d71c0a3f586"}
BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                               "data": [float(i) / 16 for i in range(16)]}]}).encode()
CONN_ERR = -1  # a connection that failed or broke before an answer

pytestmark = [pytest.mark.slow, pytest.mark.sandbox, pytest.mark.timeout(240)]

#: what the first test measured, for the second (the module's tests run in order)
RUN: dict[str, Any] = {}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Layout]:
    why = missing()
    if why:
        pytest.skip(why)
    try:
        import torch  # noqa: F401  (the slow model is a torch MLP)
    except ImportError:
        pytest.skip("needs torch (pip install -e .[pod]) for the slow model")
    layout = layout_for(tmp_path_factory.mktemp("sandbox"))
    if layout.bridge in netns.list_links(layout.bridge):
        pytest.fail(f"bridge {layout.bridge} exists: another sandbox is up (sluiceway sandbox down first)")
    t0 = time.monotonic()
    try:
        out = cli(layout, "up", "--no-build", "--timeout", "150",
                  "--set", f"operator.driftInterval={DRIFT_SECONDS}", timeout=300)
        assert out.returncode == 0, f"sandbox up failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        print(f"\nsandbox up in {time.monotonic() - t0:.1f} s")
        yield layout
    finally:
        down = cli(layout, "down", timeout=180)
        assert down.returncode == 0, down.stderr


# --- the objects -------------------------------------------------------------------------------------


def objects(name: str, source: str, estimate: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """The namespace, the tenants' key Secrets and one InferenceService at zero with the gateway."""
    secrets = [
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": f"{t}-key", "namespace": NS, "labels": {"sluiceway.io/tenant-key": "true"}},
         "type": "Opaque", "stringData": {"key": key}}
        for t, key in KEYS.items()
    ]
    isvc = {
        "apiVersion": "sluiceway.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "model": {"image": f"{POD_IMAGE}:0.1.0", "format": "python", "source": source, "warmupIterations": 1},
            "resources": {"gpus": 0, "cpu": "500m", "memory": "512Mi"},
            "concurrency": {"permits": 4},
            "timeouts": {"queue": "5s", "request": f"{REQUEST_SECONDS}s", "drain": "5s"},
            "access": {"allowAnonymous": False},
            "tenants": [{"name": t, "keySecretRef": {"name": f"{t}-key"}, "rate": "10000/s", "burst": 10000}
                        for t in KEYS],
            "pod": {"env": [{"name": k, "value": v} for k, v in env.items()]},
            "autoscaling": {"engine": "keda", "minReplicas": 0, "maxReplicas": 1,
                            "scaleToZeroAfter": f"{SCALE_TO_ZERO_AFTER}s", "pollingInterval": "1s"},
            "gateway": {"enabled": True, "replicas": 1, "startupEstimate": estimate},
        },
    }
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}, *secrets, isvc]


def pod_selector(name: str) -> str:
    return f"app.kubernetes.io/name=sluiceway-pod,sluiceway.io/inferenceservice={name}"


def gateway_selector(name: str) -> str:
    return f"app.kubernetes.io/name=sluiceway-gateway,sluiceway.io/inferenceservice={name}"


def deployment(kube: Kube, name: str) -> dict[str, Any]:
    return dict(kube.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{name}"))


def replicas(kube: Kube, name: str) -> tuple[int, int]:
    d = deployment(kube, name)
    return int((d.get("spec") or {}).get("replicas") or 0), int((d.get("status") or {}).get("replicas") or 0)


def container_pids(pod: dict[str, Any]) -> list[int]:
    return [int(cs["containerID"].removeprefix("sandbox://"))
            for cs in (pod.get("status") or {}).get("containerStatuses") or []
            if str(cs.get("containerID", "")).startswith("sandbox://")]


def pod_process_alive(pid: int) -> bool:
    try:
        return b"sluiceway-pod" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def gateway_metrics(ip: str) -> dict[str, float]:
    """The gateway's unlabelled gauges and the sums of its labelled series, by name (metrics port)."""
    with urllib.request.urlopen(f"http://{ip}:9091/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("sluiceway_gateway_"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def state(kube: Kube, name: str) -> str:
    """The last state, for a failure: the InferenceService's status, the Deployment, the pods."""
    isvc = kube.get_or_none(f"{API}/namespaces/{NS}/inferenceservices/{name}") or {}
    dep = kube.get_or_none(f"/apis/apps/v1/namespaces/{NS}/deployments/{name}") or {}
    so = kube.get_or_none(f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects/{name}") or {}
    return (f"status: {json.dumps(isvc.get('status'))[:2000]}\n"
            f"deployment replicas: {(dep.get('spec') or {}).get('replicas')} "
            f"status {json.dumps(dep.get('status'))[:600]}\n"
            f"scaledobject status: {json.dumps(so.get('status'))[:800]}\n{summary(kube, NS)}")


@dataclass
class Gateway:
    service: str  # clusterIP:port of <name>-gateway
    ip: str  # the gateway pod's IP (its metrics port)


def bring_up(kube: Kube, name: str, source: str, estimate: str, env: dict[str, str], at_zero: bool = True) -> Gateway:
    """Apply the objects; wait for the gateway (pod Ready, its Service's endpoint ready, ready through
    the Service) and, with ``at_zero``, for the InferenceService's Deployment at zero with no pod (it is
    created with 1 replica; KEDA takes it to 0 while the scaler answers inactive)."""
    for d in objects(name, source, estimate, env):
        kube.apply(d)
    gw_name = f"{name}-gateway"
    (gw_pod,) = wait_for(lambda: [p for p in pods(kube, NS, gateway_selector(name)) if is_ready(p)], 120,
                         f"a Ready pod of Deployment {gw_name}", lambda: state(kube, name))
    wait_for(EndpointWatcher(kube, NS, gw_name).poll, 60, f"a ready endpoint of Service {gw_name}",
             lambda: state(kube, name))
    service = service_address(kube, NS, gw_name)

    def gateway_ready() -> bool:
        with urllib.request.urlopen(f"http://{service}/v2/health/ready", timeout=5) as resp:
            return bool(resp.status == 200)

    wait_for(gateway_ready, 30, f"the gateway ready through {service}")
    if at_zero:
        wait_for(lambda: replicas(kube, name) == (0, 0) and not pods(kube, NS, pod_selector(name)), 150,
                 f"Deployment {name} at 0 replicas with no pod", lambda: state(kube, name))
    return Gateway(service, gw_pod["status"]["podIP"])


def hold_startup_seconds(kube: Kube, name: str) -> Any:
    """``hold.startupSeconds`` in the gateway's ConfigMap (what the operator rendered)."""
    import yaml

    cm = kube.get(f"/api/v1/namespaces/{NS}/configmaps/{name}-gateway")
    doc = yaml.safe_load(next(iter((cm.get("data") or {}).values())))
    return ((doc or {}).get("hold") or {}).get("startupSeconds")


# --- a raw HTTP/1.1 keep-alive client ----------------------------------------------------------------


@dataclass
class Answer:
    status: int
    sent: float  # time.monotonic() when the request was written
    done: float  # when its answer was read
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def reason(self) -> str:
        try:
            doc = json.loads(self.body)
        except ValueError:
            return ""
        return str(doc.get("reason", "")) if isinstance(doc, dict) else ""

    @property
    def message(self) -> str:
        try:
            doc = json.loads(self.body)
        except ValueError:
            return self.body[:200].decode(errors="replace")
        return str(doc.get("error", "")) if isinstance(doc, dict) else ""


class Conn:
    """One keep-alive connection; one request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, service: str) -> Conn:
        host, port = service.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, host)

    def close(self) -> None:
        self.writer.close()

    async def post(self, path: str, headers: dict[str, str], body: bytes, timeout: float) -> Answer:
        head = [f"POST {path} HTTP/1.1", f"host: {self.host}", "content-type: application/json",
                f"content-length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
        sent = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
                await self.writer.drain()
                raw = await self.reader.readuntil(b"\r\n\r\n")
                lines = raw.decode("latin-1").split("\r\n")
                status = int(lines[0].split(" ", 2)[1])
                hd: dict[str, str] = {}
                for ln in lines[1:]:
                    if ":" in ln:
                        k, v = ln.split(":", 1)
                        hd[k.strip().lower()] = v.strip()
                if "content-length" in hd:
                    data = await self.reader.readexactly(int(hd["content-length"]))
                elif hd.get("transfer-encoding", "").lower() == "chunked":
                    parts = []
                    while True:
                        size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                        parts.append(await self.reader.readexactly(size + 2))
                        if size == 0:
                            break
                    data = b"".join(p[:-2] for p in parts)
                else:
                    data = await self.reader.read()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, TimeoutError) as err:
            return Answer(CONN_ERR, sent, time.monotonic(), body=type(err).__name__.encode())
        return Answer(status, sent, time.monotonic(), hd, data)


def auth(tenant: str, **extra: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}", **extra}


# --- a timeline of the Deployment, the pods and the endpoints ----------------------------------------


@dataclass
class Sample:
    t: float
    spec: int
    status: int
    ready_endpoints: int
    pods: int
    pids: list[int]


class Timeline:
    """Polls the Deployment's replicas, the pods' PIDs and the ready endpoints of the pods' Service
    every 0.25 s in a daemon thread; API errors are skipped (the next poll retries)."""

    def __init__(self, kube: Kube, name: str) -> None:
        self.kube, self.name = kube, name
        self.samples: list[Sample] = []
        self.pids: set[int] = set()
        self._stop = threading.Event()
        self._watcher = EndpointWatcher(kube, NS, name)
        self._thread = threading.Thread(target=self._run, daemon=True, name="s2z-timeline")

    def __enter__(self) -> Timeline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            with contextlib.suppress(Exception):
                spec, status = replicas(self.kube, self.name)
                listed = pods(self.kube, NS, pod_selector(self.name))
                pids = [pid for p in listed for pid in container_pids(p)]
                self.pids.update(pids)
                self.samples.append(Sample(t, spec, status, len(self._watcher.poll()), len(listed), pids))
            self._stop.wait(max(0.0, t + 0.25 - time.monotonic()))

    def first(self, pred: Any, after: float = 0.0) -> float | None:
        return next((s.t for s in list(self.samples) if s.t >= after and pred(s)), None)


# --- the tests ---------------------------------------------------------------------------------------


@dataclass
class Burst:
    """What one burst at zero measured (``time.monotonic()``; ``t0``: the requests written)."""

    t0: float
    answers: list[Answer]  # the burst's, in order
    over: list[Answer]  # beyond the hold bound
    held: float  # the gateway's held gauge once the burst was in
    samples: list[Sample]
    pids: set[int]
    t_active: float | None  # Deployment spec.replicas >= 1
    t_pod: float | None  # the pod object listed
    t_pid: float | None  # its process started
    t_ready: float | None  # its endpoint ready

    def rel(self, t: float | None) -> str:
        return f"{t - self.t0:.2f} s" if t is not None else "never"

    @property
    def t_last(self) -> float:
        return max(a.done for a in self.answers)

    def codes(self, answers: list[Answer]) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in answers:
            out[f"{a.status} {a.reason}".strip()] = out.get(f"{a.status} {a.reason}".strip(), 0) + 1
        return out


def burst(kube: Kube, gw: Gateway, name: str, tenants: list[tuple[str, int]], over: int) -> Burst:
    """At zero: ``tenants``' requests at once, each on its own keep-alive connection opened before
    (through kube-proxy to the gateway Service); once the gateway holds them all, ``over`` more of the
    last tenant, one after another (10 fresh keep-alive connections at a time); then every answer, with
    a timeline of the service."""
    path = f"/v2/models/{name}/infer"
    deadline = REQUEST_SECONDS + 5.0  # the gateway's requestTimeoutSeconds: timeouts.request + 5 s
    who = [t for t, n in tenants for _ in range(n)]

    async def scenario() -> tuple[list[Answer], list[Answer], float, float]:
        conns = await asyncio.gather(*(Conn.open(gw.service) for _ in who))
        try:
            t0 = time.monotonic()
            tasks = [asyncio.create_task(c.post(path, auth(t), BODY, deadline + 10))
                     for t, c in zip(who, conns, strict=True)]
            held = 0.0
            end = time.monotonic() + 20
            while time.monotonic() < end:  # every request of the burst is held at the gateway
                held = (await asyncio.to_thread(gateway_metrics, gw.ip)).get("sluiceway_gateway_held_requests", 0.0)
                if held >= len(who):
                    break
                await asyncio.sleep(0.1)
            beyond: list[Answer] = []
            for _wave in range(over // 10):  # one at a time: the client's own loop adds the least
                wave = await asyncio.gather(*(Conn.open(gw.service) for _ in range(10)))
                for c in wave:
                    beyond.append(await c.post(path, auth(who[-1]), BODY, 10))
                    c.close()
            return list(await asyncio.gather(*tasks)), beyond, t0, held
        finally:
            for c in conns:
                c.close()

    with Timeline(kube, name) as timeline:
        answers, beyond, t0, held = asyncio.run(scenario())
        time.sleep(0.5)
    return Burst(t0, answers, beyond, held, list(timeline.samples), set(timeline.pids),
                 timeline.first(lambda s: s.spec >= 1, t0), timeline.first(lambda s: s.pods >= 1, t0),
                 timeline.first(lambda s: bool(s.pids), t0), timeline.first(lambda s: s.ready_endpoints >= 1, t0))


def gateway_diagnostics(layout: Layout, ip: str, name: str) -> str:
    """The gateway's poll results and endpoint states (metrics port) and its log's last lines."""
    with urllib.request.urlopen(f"http://{ip}:9091/metrics", timeout=10) as resp:
        text = resp.read().decode()
    series = [ln for ln in text.splitlines()
              if ln.startswith(("sluiceway_gateway_polls_total{", "sluiceway_gateway_endpoints{"))]
    logs = sorted((layout.logs_dir / "pods").glob(f"{NS}_{name}-gateway-*/*.log"))
    tail = logs[-1].read_text(errors="replace").splitlines()[-12:] if logs else ["(no log)"]
    return "  gateway: " + "; ".join(series) + "\n  gateway log:\n    " + "\n    ".join(tail)


def check_burst(kube: Kube, name: str, b: Burst) -> None:
    """Print the burst's figures; assert every request answered 200 (none lost, none 502) and the
    Deployment never back at 0 from KEDA's activation until the last answer."""
    ok = [a for a in b.answers if a.status == 200]
    t_first_200 = min((a.done for a in ok), default=None)
    print(f"burst at zero: {len(b.answers)} requests at once on keep-alive connections through kube-proxy; "
          f"held at the gateway {b.held:g}; KEDA 0 -> 1 (Deployment spec.replicas) {b.rel(b.t_active)} after the "
          f"first request (pod listed {b.rel(b.t_pod)}, process started {b.rel(b.t_pid)}), pod endpoint ready "
          f"{b.rel(b.t_ready)}, first 200 {b.rel(t_first_200)}, last answer {b.rel(b.t_last)}; "
          f"answers {b.codes(b.answers)}")
    gw: Gateway | None = RUN.get("gateway")
    if gw is not None and "layout" in RUN:
        print(gateway_diagnostics(RUN["layout"], gw.ip, name))
    detail = state(kube, name)
    assert all(a.status == 200 for a in b.answers), (b.codes(b.answers), detail)
    assert b.t_active is not None and b.t_ready is not None, (b.samples[-5:], detail)
    t_active = b.t_active
    during = [s for s in b.samples if t_active <= s.t <= b.t_last]
    assert all(s.spec >= 1 for s in during), [(round(s.t - b.t0, 2), s.spec) for s in during]


class ZeroWatch:
    """After the burst's last answer, in a daemon thread (every 0.25 s, API errors skipped): when the
    Deployment's ``spec.replicas`` reaches 0 (and what the gateway held and had in flight then), when
    the pod object is gone, when its processes ended. Started at the end of the burst test, so that
    the failing-start tests run while the service goes back to zero (the wait is the longest of the
    module); :meth:`result` waits for it."""

    def __init__(self, kube: Kube, gw_ip: str, pids: set[int], deadline: float) -> None:
        self.kube, self.gw_ip, self.pids, self.deadline = kube, gw_ip, pids, deadline
        self.times: dict[str, float] = {}
        self.idle: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, daemon=True, name="s2z-zero-watch")
        self._thread.start()

    def _run(self) -> None:
        while len(self.times) < 3 and time.monotonic() < self.deadline:
            now = time.monotonic()
            with contextlib.suppress(Exception):
                spec, status = replicas(self.kube, COLD)
                if "spec 0" not in self.times and spec == 0:
                    self.times["spec 0"] = now
                    self.idle = gateway_metrics(self.gw_ip)  # what the gateway held and had in flight then
                if "pod gone" not in self.times and status == 0 and not pods(self.kube, NS, pod_selector(COLD)):
                    self.times["pod gone"] = now
            if "process gone" not in self.times and self.pids and not any(pod_process_alive(p) for p in self.pids):
                self.times["process gone"] = now
            time.sleep(0.25)

    def result(self) -> tuple[dict[str, float], dict[str, float]]:
        self._thread.join(timeout=max(0.0, self.deadline - time.monotonic()) + 5)
        return dict(self.times), dict(self.idle)


def test_a_burst_at_zero_is_held_and_answered_once_the_pod_is_ready(sandbox: Layout) -> None:
    kube = Kube.as_identity(sandbox, "admin")
    gw = bring_up(kube, COLD, "bench.burst_at_zero:slow_model", ESTIMATE, {"PYTHONPATH": str(ROOT)})
    RUN["gateway"], RUN["layout"] = gw, sandbox
    startup = (kube.get(f"{API}/namespaces/{NS}/inferenceservices/{COLD}").get("status") or {}).get("startup")
    print(f"\nstatus.startup before the burst: {json.dumps(startup)}; the gateway's hold.startupSeconds: "
          f"{hold_startup_seconds(kube, COLD)}")
    b = burst(kube, gw, COLD, [("first", FIRST)], 0)
    RUN["t_last"], RUN["pids"] = b.t_last, b.pids
    RUN["zero"] = ZeroWatch(kube, gw.ip, b.pids, b.t_last + SCALE_TO_ZERO_AFTER + 150)
    check_burst(kube, COLD, b)
    assert len(b.answers) == FIRST


def test_a_pod_that_fails_to_start_gets_held_requests_refused_with_a_reason(sandbox: Layout) -> None:
    kube = Kube.as_identity(sandbox, "admin")
    # not at zero first: the crash-looping pod created with the Deployment keeps the scaler active
    gw = bring_up(kube, CRASHY, "sluiceway_sandbox.testmodels:crash_at_load", "8s", {LOAD_SECONDS_ENV: "4"},
                  at_zero=False)
    path = f"/v2/models/{CRASHY}/infer"

    async def scenario() -> tuple[list[Answer], float]:
        conns = await asyncio.gather(*(Conn.open(gw.service) for _ in range(CRASH_REQUESTS)))
        try:
            t0 = time.monotonic()
            headers = auth("first", **{"x-sluiceway-deadline-ms": str(CRASH_DEADLINE_MS)})
            answers = await asyncio.gather(*(c.post(path, headers, BODY, CRASH_DEADLINE_MS / 1000 + 10)
                                             for c in conns))
            return list(answers), t0
        finally:
            for c in conns:
                c.close()

    answers, t0 = asyncio.run(scenario())
    crashed = [p for p in pods(kube, NS, pod_selector(CRASHY))]
    statuses = [cs for p in crashed for cs in (p.get("status") or {}).get("containerStatuses") or []]
    restarts = [cs.get("restartCount", 0) for cs in statuses]
    last = [((cs.get("lastState") or {}).get("terminated") or {}).get("message", "")[-200:] for cs in statuses]
    codes: dict[str, int] = {}
    for a in answers:
        codes[f"{a.status} {a.reason}"] = codes.get(f"{a.status} {a.reason}", 0) + 1
    times = sorted(a.done - t0 for a in answers)
    print(f"\nfailing start: {CRASH_REQUESTS} requests with a {CRASH_DEADLINE_MS / 1000:g} s deadline: {codes}, "
          f"answered "
          f"{times[0]:.1f} .. {times[-1]:.1f} s after sending; Retry-After "
          f"{sorted({a.headers.get('retry-after') for a in answers}, key=str)}; the pod's restarts {restarts}, "
          f"last termination {last}")
    print(f"  message: {answers[0].message}")
    detail = state(kube, CRASHY)
    assert all(a.status == 503 and a.reason == "no_capacity_in_time" for a in answers), (codes, detail)
    assert all(a.done - a.sent < CRASH_DEADLINE_MS / 1000 - 1.0 for a in answers), (times, detail)
    assert all("failed start" in a.message or "past its predicted start-up" in a.message for a in answers), \
        answers[0].message
    assert any("failed start" in a.message for a in answers), [a.message for a in answers]
    assert all("retry-after" in a.headers for a in answers)


def crashy_conditions(kube: Kube) -> list[dict[str, Any]]:
    return list((kube.get(f"{API}/namespaces/{NS}/inferenceservices/{CRASHY}").get("status") or {})
                .get("conditions") or [])


def test_a_pod_that_fails_to_start_is_named_in_the_conditions(sandbox: Layout) -> None:
    """``PodsHealthy`` (and so ``Ready``) False with reason ``CrashLoopBackOff``, naming the pod, its
    restarts and its exit code."""
    kube = Kube.as_identity(sandbox, "admin")
    if kube.get_or_none(f"{API}/namespaces/{NS}/inferenceservices/{CRASHY}") is None:
        pytest.skip("the failing-start test did not create its InferenceService")

    def healthy() -> dict[str, Any] | None:
        return next((c for c in crashy_conditions(kube) if c.get("type") == "PodsHealthy"
                     and c.get("status") == "False" and c.get("reason") == "CrashLoopBackOff"), None)

    cond = wait_for(healthy, 3 * DRIFT_SECONDS + 10, "PodsHealthy=False/CrashLoopBackOff",
                    lambda: json.dumps(crashy_conditions(kube), indent=1))
    ready = next(c for c in crashy_conditions(kube) if c.get("type") == "Ready")
    print(f"\nPodsHealthy: {cond.get('message')}\nReady: {ready.get('status')} {ready.get('reason')}")
    assert f"pod {CRASHY}-" in cond["message"] and "last exit 3" in cond["message"], cond
    assert ready.get("status") == "False" and ready.get("reason") == "CrashLoopBackOff", ready


def test_the_condition_carries_the_model_load_error(sandbox: Layout) -> None:
    kube = Kube.as_identity(sandbox, "admin")
    if kube.get_or_none(f"{API}/namespaces/{NS}/inferenceservices/{CRASHY}") is None:
        pytest.skip("the failing-start test did not create its InferenceService")
    try:
        wait_for(lambda: any(CRASH_MESSAGE in str(c.get("message")) for c in crashy_conditions(kube)),
                 3 * DRIFT_SECONDS + 10, "a condition with the model's load error",
                 lambda: json.dumps(crashy_conditions(kube), indent=1))
    finally:
        print("\nconditions: " + json.dumps([(c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
                                              for c in crashy_conditions(kube)]))


def test_the_service_returns_to_zero_after_scale_to_zero_after(sandbox: Layout) -> None:
    kube = Kube.as_identity(sandbox, "admin")
    t_last = RUN.get("t_last")
    if t_last is None:
        pytest.skip("the burst test did not run to its last answer")
    pids: set[int] = RUN["pids"]
    # the failing-start tests ran meanwhile: their service goes, so that it loads nothing during the next burst
    with contextlib.suppress(Exception):
        kube.delete(f"{API}/namespaces/{NS}/inferenceservices/{CRASHY}")
    times, idle = RUN["zero"].result()
    assert len(times) == 3, f"not back to zero: {times}\n{state(kube, COLD)}"
    print(f"\nback to zero (scaleToZeroAfter {SCALE_TO_ZERO_AFTER}s): after the last answer, Deployment "
          f"spec.replicas 0 in {times['spec 0'] - t_last:.1f} s, "
          f"pod object gone in {times['pod gone'] - t_last:.1f} s, "
          f"pod process {sorted(pids)} gone in {times['process gone'] - t_last:.1f} s; the gateway then held "
          f"{idle.get('sluiceway_gateway_held_requests')} and had {idle.get('sluiceway_gateway_in_flight')} in flight")
    assert pids, "the burst test saw no pod process"
    assert idle.get("sluiceway_gateway_held_requests") == 0 and idle.get("sluiceway_gateway_in_flight") == 0, idle
    assert times["spec 0"] - t_last >= SCALE_TO_ZERO_AFTER, times
    assert replicas(kube, COLD) == (0, 0), state(kube, COLD)


def reloads_applied(ip: str) -> float:
    with urllib.request.urlopen(f"http://{ip}:9091/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith('sluiceway_gateway_config_reload_total{result="applied"}'))


def test_beyond_the_hold_bound_requests_are_refused_at_once_with_the_predicted_ready_time(sandbox: Layout) -> None:
    """The third cold start, predicted from the two before: the gateway measured them (its first
    request held with no pod to the pod routable) and predicts the next one from their median; the
    pods' own ``status.startup`` also reaches the gateway (``hold.startupSeconds``, rounded up,
    reloaded). Two measured cold starts, not one: the first cold start of a fresh service can run
    long (a CI run measured 33.02 s, then 27.05 s for the next, +23 % from one sample)."""
    kube = Kube.as_identity(sandbox, "admin")
    gw: Gateway | None = RUN.get("gateway")
    if gw is None or replicas(kube, COLD) != (0, 0):
        pytest.skip("needs the service of the burst test back at zero")
    isvc = f"{API}/namespaces/{NS}/inferenceservices/{COLD}"
    total = wait_for(lambda: ((kube.get(isvc).get("status") or {}).get("startup") or {}).get("totalSeconds"), 30,
                     "status.startup measured", lambda: state(kube, COLD))
    startup = (kube.get(isvc).get("status") or {}).get("startup")
    want = float(math.ceil(total))
    wait_for(lambda: hold_startup_seconds(kube, COLD) == want, 3 * DRIFT_SECONDS + 10,
             f"hold.startupSeconds {want:g} in the gateway's ConfigMap", lambda: str(hold_startup_seconds(kube, COLD)))
    if want != float(ESTIMATE.removesuffix("s")):
        wait_for(lambda: reloads_applied(gw.ip) >= 1, 30, "the gateway reloading hold.startupSeconds")
    print(f"\nstatus.startup measured by the first cold start: {json.dumps(startup)}; the gateway's "
          f"hold.startupSeconds {want:g} (reloads applied: {reloads_applied(gw.ip):g})")
    # the second cold start: a small burst, then back to zero
    second = burst(kube, gw, COLD, [("first", SECOND)], 0)
    check_burst(kube, COLD, second)
    wait_for(lambda: replicas(kube, COLD) == (0, 0) and not pods(kube, NS, pod_selector(COLD)),
             SCALE_TO_ZERO_AFTER + 150, f"Deployment {COLD} back at 0 replicas with no pod", lambda: state(kube, COLD))
    cold = gateway_metrics(gw.ip)
    b = burst(kube, gw, COLD, [("flood", FLOOD)], OVER)
    check_burst(kube, COLD, b)
    after = gateway_metrics(gw.ip)
    print(f"the gateway's cold starts: the one before measured "
          f"{cold.get('sluiceway_gateway_cold_start_actual_seconds', float('nan')):.2f} s (predicted "
          f"{cold.get('sluiceway_gateway_cold_start_predicted_seconds', float('nan')):.2f} s); this one predicted "
          f"{after.get('sluiceway_gateway_cold_start_predicted_seconds', float('nan')):.2f} s, measured "
          f"{after.get('sluiceway_gateway_cold_start_actual_seconds', float('nan')):.2f} s")
    lat = sorted(a.done - a.sent for a in b.over)
    assert b.t_ready is not None
    t_ready = b.t_ready
    errors = [(float(a.headers["retry-after"]) - (t_ready - a.done)) / (t_ready - a.done)
              for a in b.over if "retry-after" in a.headers]
    print(f"beyond the hold bound ({OVER} more of flood once it held its share, {TENANT_SHARE} x {HOLD_MAX} = "
          f"{int(TENANT_SHARE * HOLD_MAX)}): {b.codes(b.over)}, answered in {lat[0] * 1000:.1f} .. "
          f"{lat[-1] * 1000:.1f} ms (median {lat[len(lat) // 2] * 1000:.1f} ms); Retry-After "
          f"{sorted({a.headers.get('retry-after') for a in b.over}, key=str)} s; the pod ready "
          f"{t_ready - max(a.done for a in b.over):.1f} .. {t_ready - min(a.done for a in b.over):.1f} s after them: "
          f"relative error {min(errors, default=float('nan')):+.1%} .. {max(errors, default=float('nan')):+.1%}")
    assert len(b.answers) == FLOOD
    assert all(a.status == 429 and a.reason == "hold_tenant_full" for a in b.over), b.codes(b.over)
    # the client's time from its write to the answer, on a 2-core machine shared with other jobs: a
    # scheduling stall of the client or the gateway lands on whichever request is in flight (a run with
    # 10 in flight at a time saw 5 of 100 at 73.7 ms); a held request would take the ~30 s start-up
    fast = sum(1 for x in lat if x < REFUSE_FAST)
    assert fast >= FAST_SHARE * OVER and lat[-1] < REFUSE_SLOWEST, (fast, lat[-10:])
    # the issue's promise: Retry-After within 20 % of the actual ready time (the pod's endpoint ready)
    assert len(errors) == OVER and all(abs(e) <= 0.20 for e in errors), sorted(errors)
