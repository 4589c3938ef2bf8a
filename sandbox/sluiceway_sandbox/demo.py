"""``sluiceway demo``: the whole loop on one machine, watched live.

Brings the sandbox up (unless it is already), applies ``samples/sandbox-demo.yaml`` (a synthetic
model with a known capacity, three tenants with keys, three priority classes, KEDA autoscaling 1..4;
the sandbox comes up with the chart's quota coordinator on, so the tenants' quotas hold service-wide),
waits for its first ready endpoint, then drives an open-loop ramp: about half, once and three times
one replica's capacity, then nothing.

How the load reaches the pods (``clients``): ``per-request`` (the default, chosen on purpose) sends
each request to a random ready endpoint, the spread a per-request balancer gives; the demo's story
(new replicas take load as they become ready) holds only with such a balancer, and the sandbox has
none yet (the gateway, issue 19, is not deployed in it). ``keepalive`` sends through the Service's
ClusterIP over keep-alive connections, as real clients do: kube-proxy picks a pod per connection,
so the replicas KEDA adds get load only from connections opened after they are ready -- under the
3x overload, those that clients reopen after a request timed out (docs/sandbox.md). Every second it
shows offered rate, goodput, answers by code and reason, queue depth and wait p95 (from Prometheus),
desired and ready replicas. It ends with a report in numbers and a PNG plot, and tears the sandbox
down unless ``keep``.

Pure: :class:`Ramp`, :func:`build_report`, :func:`render_table`. I/O: :func:`run_demo` and the
small readers (:class:`PromReader`, :func:`read_replicas`).
"""

from __future__ import annotations

import argparse
import base64
import bisect
import dataclasses
import json
import math
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sluiceway_core.signals import Queries

from .layout import Layout
from .loadgen import (
    Client,
    EndpointWatcher,
    KeepAlive,
    Outcome,
    Phase,
    build_schedule,
    phase_at,
    run_load_in_thread,
    service_address,
    status_name,
    summarize,
)

__all__ = [
    "DemoReport",
    "Ramp",
    "Sample",
    "build_report",
    "main",
    "render_table",
    "run_demo",
    "write_plot",
]

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "sandbox-demo.yaml"
#: the sample's tenants: who sends what (priority class, share of arrivals)
DEFAULT_TRAFFIC = (("search-key", "interactive", 3.0), ("reports-key", "batch", 1.0),
                   ("alerts-key", "critical", 0.2))
#: chart values the demo (and the end-to-end test) bring the sandbox up with: the scaler's quota
#: coordinator on, so the sample's tenant quotas hold for the whole service (docs/scheduling.md)
QUOTA_VALUES = (("scaler.quota.enabled", "true"),)
#: how the demo's load reaches the pods (module docstring): per request until the sandbox has a
#: per-request balancer in front of the pods; ``keepalive`` is what clients through a Service see
CLIENT_MODES = ("per-request", "keepalive")
DEFAULT_CLIENTS = "per-request"


@dataclass(frozen=True)
class Ramp:
    """The load ramp, in multiples of one replica's capacity (requests/s)."""

    capacity: float = 40.0  # samples/sandbox-demo.yaml: 2 permits / 50 ms
    below: float = 30.0  # seconds at 0.5x
    at: float = 30.0  # seconds at 1x
    over: float = 60.0  # seconds at 3x
    # seconds of silence: replicas fall once the scaler's 1 m rate window has emptied and the
    # sample's 75 s scale-down window has passed (samples/sandbox-demo.yaml), so about 135 s
    off: float = 160.0
    over_factor: float = 3.0

    def phases(self) -> list[Phase]:
        return [
            Phase("below", self.below, 0.5 * self.capacity),
            Phase("at", self.at, self.capacity),
            Phase("over", self.over, self.over_factor * self.capacity),
            Phase("off", self.off, 0.0),
        ]

    @property
    def seconds(self) -> float:
        return self.below + self.at + self.over + self.off

    @property
    def overload_start(self) -> float:
        return self.below + self.at

    @classmethod
    def short(cls) -> Ramp:
        """A quicker ramp (3.5 minutes)."""
        return cls(below=10.0, at=10.0, over=40.0, off=150.0)


@dataclass(frozen=True)
class Sample:
    """One second of the run, as the display shows it."""

    t: float  # seconds since the ramp began
    phase: str
    offered: float  # requests/s scheduled in the last second
    goodput: float  # 2xx answers/s completed in the last second
    answers: dict[str, int]  # by code, cumulative
    queue_depth: float | None
    wait_p95: float | None  # seconds
    desired: int | None
    ready: int | None


@dataclass(frozen=True)
class DemoReport:
    sent: int
    ok: int
    goodput_share: float
    codes: dict[str, int]
    reasons: dict[str, int]
    unexpected_5xx: int  # 5xx other than 503/504: must be 0
    shed_without_reason: int  # 503/504 with no reason in the body: must be 0
    peak_desired: int
    peak_ready: int
    overload_to_second_ready: float | None  # seconds from the 3x phase's start to ready >= 2
    ready_at_overload: int | None  # ready replicas when the 3x phase began (>= 2: nothing to time)
    first_ready_endpoint: float | None  # seconds from applying the sample to a ready endpoint
    replicas_after_off: int | None  # ready replicas at the end of the silent phase
    off_to_min_desired: float | None  # seconds from the load stopping to desired back at the minimum
    samples: list[Sample] = field(default_factory=list)
    plot: str = ""

    def lines(self) -> list[str]:
        def sec(x: float | None) -> str:
            return "-" if x is None else f"{x:.1f} s"

        return [
            f"requests sent {self.sent}, 2xx {self.ok} (goodput share {self.goodput_share:.1%})",
            f"answers by code: {' '.join(f'{k}:{v}' for k, v in self.codes.items()) or '-'}",
            f"non-2xx by code and reason: {' '.join(f'{k}:{v}' for k, v in self.reasons.items()) or '-'}",
            f"5xx other than 503/504: {self.unexpected_5xx}; 503/504 without a reason: {self.shed_without_reason}",
            f"peak replicas: desired {self.peak_desired}, ready {self.peak_ready}",
            f"sample applied -> first ready endpoint: {sec(self.first_ready_endpoint)}",
            f"overload (3x capacity) -> second ready pod: {sec(self.overload_to_second_ready)}"
            + (f" (already {self.ready_at_overload} ready when the overload began)"
               if (self.ready_at_overload or 0) >= 2 else ""),
            f"load stopped -> desired back at the minimum: {sec(self.off_to_min_desired)}",
            f"ready replicas at the end: {self.replicas_after_off if self.replicas_after_off is not None else '-'}",
            *([f"plot: {self.plot}"] if self.plot else []),
        ]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------------
# Pure.


def build_report(samples: Sequence[Sample], outcomes: Sequence[Outcome], ramp: Ramp,
                 first_ready_endpoint: float | None = None, min_replicas: int = 1) -> DemoReport:
    s = summarize(outcomes, ramp.seconds)
    before = [x for x in samples if x.t < ramp.overload_start]
    at_overload = before[-1].ready if before else None
    second = None
    if at_overload is not None and at_overload < 2:
        second = next((x.t - ramp.overload_start for x in samples
                       if x.t >= ramp.overload_start and (x.ready or 0) >= 2), None)
    off_start = ramp.overload_start + ramp.over
    scaled_out = any((x.desired or 0) > min_replicas for x in samples if x.t < off_start)
    back = next((x.t - off_start for x in samples if x.t >= off_start and x.desired == min_replicas), None)
    return DemoReport(
        off_to_min_desired=back if scaled_out else None,
        sent=s.sent, ok=s.ok, goodput_share=s.goodput_share, codes=s.codes, reasons=s.reasons,
        unexpected_5xx=s.unexpected_5xx, shed_without_reason=s.shed_without_reason,
        peak_desired=max((x.desired or 0 for x in samples), default=0),
        peak_ready=max((x.ready or 0 for x in samples), default=0),
        overload_to_second_ready=second, ready_at_overload=at_overload, first_ready_endpoint=first_ready_endpoint,
        replicas_after_off=samples[-1].ready if samples else None, samples=list(samples),
    )


def _fmt(x: float | None, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
    return "-" if x is None or math.isnan(x) else f"{x * scale:.{digits}f}{unit}"


def render_table(sample: Sample, capacity: float, reasons: dict[str, int]) -> list[tuple[str, str]]:
    """The live display's rows (label, value) for one sample."""
    return [
        ("time", f"{sample.t:5.0f} s   phase {sample.phase}"),
        ("offered", f"{sample.offered:6.1f} req/s  ({sample.offered / capacity:.1f}x one replica)"),
        ("goodput", f"{sample.goodput:6.1f} req/s (2xx)"),
        ("answers", " ".join(f"{k}:{v}" for k, v in sample.answers.items()) or "-"),
        ("non-2xx reasons", " ".join(f"{k}:{v}" for k, v in reasons.items()) or "-"),
        ("queue depth", _fmt(sample.queue_depth, "", 1.0, 1) + "  (Prometheus, all pods)"),
        ("wait p95", _fmt(sample.wait_p95, " ms", 1000.0, 0) + "  (Prometheus, 30 s window)"),
        ("replicas", f"desired {sample.desired if sample.desired is not None else '-'}  "
                     f"ready {sample.ready if sample.ready is not None else '-'}"),
    ]


# ------------------------------------------------------------------------------------------------
# I/O.


class PromReader:
    """Instant queries against the sandbox Prometheus (None when there is no number)."""

    def __init__(self, url: str, namespace: str, name: str, window: str = "30s", timeout: float = 2.0) -> None:
        self.url = url.rstrip("/")
        self.queries = Queries.build(namespace, name, window)
        self.timeout = timeout

    def scalar(self, query: str) -> float | None:
        q = urllib.parse.urlencode({"query": query})
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=self.timeout) as resp:
                doc = json.loads(resp.read())
        except (OSError, ValueError):
            return None
        result = (doc.get("data") or {}).get("result") or []
        if not result:
            return None
        try:
            v = float(result[0]["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            return None
        return None if math.isnan(v) else v

    def read(self) -> tuple[float | None, float | None]:
        return self.scalar(self.queries.queue_depth), self.scalar(self.queries.wait_p95)


def read_replicas(kube: Any, namespace: str, name: str) -> tuple[int | None, int | None]:
    """(desired, ready) of the InferenceService's Deployment."""
    try:
        dep = kube.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
    except Exception:
        return None, None
    return int((dep.get("spec") or {}).get("replicas") or 0), int((dep.get("status") or {}).get("readyReplicas") or 0)


def _secret_key(kube: Any, namespace: str, name: str, key: str = "key") -> str:
    sec = kube.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
    return base64.b64decode(sec["data"][key]).decode()


def _isvc_ready(kube: Any, namespace: str, name: str) -> bool:
    obj = kube.get_or_none(f"/apis/sluiceway.io/v1alpha1/namespaces/{namespace}/inferenceservices/{name}")
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def write_plot(report: DemoReport, ramp: Ramp, path: Path) -> Path:
    """offered/goodput, replicas and queue signals over time (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [s.t for s in report.samples]
    fig, (a1, a2, a3) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    a1.plot(xs, [s.offered for s in report.samples], label="offered req/s")
    a1.plot(xs, [s.goodput for s in report.samples], label="goodput (2xx) req/s")
    a1.axhline(ramp.capacity, color="grey", linestyle=":", label="one replica's capacity")
    a1.set_ylabel("requests/s")
    a1.legend(loc="upper right", fontsize=8)
    def nan(v: int | None) -> float:
        return float("nan") if v is None else float(v)

    a2.step(xs, [nan(s.desired) for s in report.samples], where="post", label="desired")
    a2.step(xs, [nan(s.ready) for s in report.samples], where="post", label="ready", linestyle="--")
    a2.set_ylabel("replicas")
    a2.legend(loc="upper right", fontsize=8)
    a3.plot(xs, [s.queue_depth if s.queue_depth is not None else float("nan") for s in report.samples],
            label="queue depth")
    a3.set_ylabel("queue depth")
    a3b = a3.twinx()
    a3b.plot(xs, [1000 * s.wait_p95 if s.wait_p95 is not None else float("nan") for s in report.samples],
             color="tab:red", label="wait p95 (ms)")
    a3b.set_ylabel("wait p95 ms")
    a3.set_xlabel("seconds since the ramp began")
    start = 0.0
    for p in ramp.phases():
        for ax in (a1, a2, a3):
            ax.axvline(start, color="lightgrey", linewidth=0.8)
        a1.text(start + 1, a1.get_ylim()[1] * 0.92, p.name, fontsize=8)
        start += p.seconds
    fig.suptitle("sluiceway demo: open-loop ramp through KEDA + HPA")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _load_sample(sample: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(sample.read_text()) if d]
    (isvc,) = [d for d in docs if d.get("kind") == "InferenceService"]
    return docs, isvc


def run_demo(
    layout: Layout,
    *,
    ramp: Ramp | None = None,
    keep: bool = False,
    up: bool = True,
    build: bool = True,
    out_dir: Path | None = None,
    sample: Path = SAMPLE,
    live: bool = True,
    seed: int = 1,
    ready_timeout: float = 240.0,
    settle_timeout: float = 180.0,
    clients_mode: str = DEFAULT_CLIENTS,
    progress: Callable[[str], None] = print,
) -> DemoReport:
    """Run the demo (module docstring). ``up=False``: the sandbox is already up (the e2e test) and
    stays up (only the sample's InferenceService is deleted at the end unless ``keep``);
    ``keep``: leave the sandbox and the InferenceService running; ``live=False``: one line per
    5 s instead of the rich display. Returns the report (also printed and written as JSON)."""
    from . import lifecycle
    from .kubeclient import Kube

    ramp = ramp or Ramp()
    if clients_mode not in CLIENT_MODES:
        raise ValueError(f"clients_mode must be one of {CLIENT_MODES}, got {clients_mode!r}")
    out_dir = (out_dir or Path.cwd()).resolve()
    if up:
        lifecycle.up(layout, lifecycle.UpOptions(build=build, chart_values=QUOTA_VALUES), progress)
    try:
        kube = Kube.as_identity(layout, "admin")
        docs, isvc = _load_sample(sample)
        ns, name = isvc["metadata"]["namespace"], isvc["metadata"]["name"]
        model = isvc["spec"]["model"].get("name") or name
        progress(f"demo: applying {sample.name} ({ns}/{name})")
        t_apply = time.monotonic()
        lifecycle.apply_all(kube, docs)
        watcher = EndpointWatcher(kube, ns, name)
        lifecycle.wait_until(watcher.poll, ready_timeout, f"a ready endpoint of {ns}/{name}")
        first_ready = time.monotonic() - t_apply
        progress(f"demo: first ready endpoint {first_ready:.1f} s after apply: {watcher.endpoints()}")
        lifecycle.wait_until(lambda: _isvc_ready(kube, ns, name), ready_timeout, f"{ns}/{name} Ready")
        minimum = int((isvc["spec"].get("autoscaling") or {}).get("minReplicas", 1))
        _settle(kube, ns, name, minimum, settle_timeout, progress)
        clients = [Client(sec.removesuffix("-key"), _secret_key(kube, ns, sec), prio, share)
                   for sec, prio, share in DEFAULT_TRAFFIC]
        phases = ramp.phases()
        schedule = build_schedule(phases, clients, seed=seed)
        prom = PromReader(layout.prometheus_url, ns, name)
        samples: list[Sample] = []
        path = f"/v2/models/{model}/infer"
        with watcher:
            if clients_mode == "keepalive":
                service = service_address(kube, ns, name)
                progress(f"demo: keep-alive clients ({KeepAlive().clients} per tenant) through the Service {service}")
                thread, outcomes, stop = run_load_in_thread(schedule, clients, path, service=service, seed=seed)
            else:
                progress("demo: each request to a random ready endpoint (per-request spread, as a "
                         "per-request balancer gives; clients through the Service: --clients keepalive)")
                thread, outcomes, stop = run_load_in_thread(schedule, clients, path,
                                                            per_request=watcher.endpoints, seed=seed)
            t0 = time.monotonic()
            try:
                samples = _observe(ramp, schedule, outcomes, prom, kube, ns, name, t0, live, progress)
            finally:
                stop.set()
                thread.join(timeout=30)
        report = build_report(samples, list(outcomes), ramp, first_ready, minimum)
        plot = write_plot(report, ramp, out_dir / "sluiceway-demo.png")
        report = dataclasses.replace(report, plot=str(plot))
        (out_dir / "sluiceway-demo.json").write_text(json.dumps(report.to_json(), indent=1, default=str))
        progress("demo report:")
        for line in report.lines():
            progress(f"  {line}")
        return report
    finally:
        if keep:
            progress(f"demo: left running. KUBECONFIG={layout.kubeconfig}")
        elif up:
            progress("demo: tearing the sandbox down (use --keep to leave it running)")
            lifecycle.down(layout, progress)
        else:  # the sandbox was up before the demo: leave it, remove only the sample's service
            _delete_sample(layout, sample, progress)


def _settle(kube: Any, ns: str, name: str, replicas: int, timeout: float,
            progress: Callable[[str], None]) -> None:
    """Wait (bounded) until the Deployment is back at its minimum, so the ramp starts from there
    (a sandbox kept from an earlier run may still be scaled out)."""
    deadline = time.monotonic() + timeout
    got = read_replicas(kube, ns, name)
    if got != (replicas, replicas):
        progress(f"demo: waiting up to {timeout:.0f} s for {ns}/{name} to settle at {replicas} replica(s) "
                 f"(desired/ready now {got[0]}/{got[1]})")
    while got != (replicas, replicas) and time.monotonic() < deadline:
        time.sleep(2)
        got = read_replicas(kube, ns, name)
    if got != (replicas, replicas):
        progress(f"demo: still at desired/ready {got[0]}/{got[1]}; starting the ramp anyway")


def _delete_sample(layout: Layout, sample: Path, progress: Callable[[str], None]) -> None:
    from .kubeclient import Kube

    _, isvc = _load_sample(sample)
    try:
        Kube.as_identity(layout, "admin").delete_object(isvc)
        progress(f"demo: deleted {isvc['metadata']['namespace']}/{isvc['metadata']['name']}")
    except Exception as err:  # best effort on the way out; say what was left
        progress(f"demo: could not delete the sample InferenceService: {err}")


def _observe(ramp: Ramp, schedule: Sequence[tuple[float, int]], outcomes: list[Outcome], prom: PromReader,
             kube: Any, ns: str, name: str, t0: float, live: bool,
             progress: Callable[[str], None]) -> list[Sample]:
    """Sample once a second until the ramp ends; show it live."""
    samples: list[Sample] = []
    seen = 0
    answers: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    times = [t for t, _ in schedule]

    def tick() -> Sample:
        nonlocal seen
        now = time.monotonic() - t0
        new = outcomes[seen:len(outcomes)]
        seen += len(new)
        for o in new:
            answers[status_name(o.status)] += 1
            if not 200 <= o.status < 300:
                reasons[f"{status_name(o.status)} {o.reason or '-'}"] += 1
        offered = bisect.bisect_left(times, now) - bisect.bisect_left(times, now - 1.0)
        depth, p95 = prom.read()
        desired, ready = read_replicas(kube, ns, name)
        phase = phase_at(ramp.phases(), now)
        return Sample(now, phase.name if phase else "end", float(offered),
                      float(sum(1 for o in new if 200 <= o.status < 300)), dict(sorted(answers.items())),
                      depth, p95, desired, ready)

    def table(s: Sample) -> Any:
        from rich.table import Table

        tbl = Table(title="sluiceway demo (Ctrl-C stops)", show_header=False)
        for label, value in render_table(s, ramp.capacity, dict(sorted(reasons.items()))):
            tbl.add_row(label, value)
        return tbl

    next_at = 1.0
    if live:
        from rich.live import Live

        with Live(refresh_per_second=2, transient=False) as view:
            while next_at <= ramp.seconds:
                time.sleep(max(0.0, t0 + next_at - time.monotonic()))
                samples.append(tick())
                view.update(table(samples[-1]))
                next_at += 1.0
    else:
        while next_at <= ramp.seconds:
            time.sleep(max(0.0, t0 + next_at - time.monotonic()))
            samples.append(tick())
            s = samples[-1]
            if int(s.t) % 5 == 0:
                progress(" | ".join(f"{k} {v}" for k, v in render_table(s, ramp.capacity, dict(reasons))[:3])
                         + f" | replicas {s.desired}/{s.ready} | depth {_fmt(s.queue_depth)}")
            next_at += 1.0
    return samples


def parser(prog: str = "sluiceway demo") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Bring the sandbox up, apply samples/sandbox-demo.yaml, run an open-loop ramp "
        "(0.5x, 1x, 3x one replica's capacity, then off) with a live display, print a report, write "
        "a PNG, and tear everything down (unless --keep).",
    )
    p.add_argument("--keep", action="store_true", help="leave the sandbox and the sample running")
    p.add_argument("--state-dir", help="sandbox state directory (default $SLUICEWAY_SANDBOX_DIR or "
                   "~/.cache/sluiceway/sandbox)")
    p.add_argument("--out-dir", type=Path, default=Path.cwd(), help="where sluiceway-demo.png/.json go")
    p.add_argument("--short", action="store_true", help="a 3.5 minute ramp instead of 4.7 minutes")
    for phase, default in (("below", Ramp.below), ("at", Ramp.at), ("over", Ramp.over), ("off", Ramp.off)):
        p.add_argument(f"--{phase}", type=float, help=f"seconds of the '{phase}' phase (default {default:g})")
    p.add_argument("--no-live", action="store_true", help="plain progress lines instead of the live display")
    p.add_argument("--no-build", action="store_true", help="fail instead of building missing Go binaries")
    p.add_argument("--already-up", action="store_true", help="use the running sandbox (do not run `up`)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--clients", choices=CLIENT_MODES, default=DEFAULT_CLIENTS,
                   help="per-request (default): each request to a random ready pod, as a per-request "
                   "balancer spreads it; keepalive: keep-alive clients through the Service's ClusterIP, "
                   "as real clients call it (kube-proxy picks a pod per connection: added replicas get "
                   "only the connections opened after they are ready)")
    return p


def main(argv: list[str] | None = None, prog: str = "sluiceway demo") -> int:
    """Exit 0 when the run answered no 5xx other than 503/504 and every 503/504 named a reason."""
    ns = parser(prog).parse_args(argv)
    from .layout import layout_for

    base = Ramp.short() if ns.short else Ramp()
    changes = {k: getattr(ns, k) for k in ("below", "at", "over", "off") if getattr(ns, k) is not None}
    if any(v <= 0 or v > 3600 for v in changes.values()):
        print("sluiceway demo: phase durations must be within (0, 3600] seconds", file=sys.stderr)
        return 2
    ramp = dataclasses.replace(base, **changes)
    try:
        report = run_demo(layout_for(ns.state_dir), ramp=ramp, keep=ns.keep, up=not ns.already_up,
                          build=not ns.no_build, out_dir=ns.out_dir, live=not ns.no_live, seed=ns.seed,
                          clients_mode=ns.clients)
    except KeyboardInterrupt:
        print("sluiceway demo: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # the message names the step (SandboxError, KubeError, KedaError, ...)
        print(f"sluiceway demo: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0 if report.unexpected_5xx == 0 and report.shed_without_reason == 0 else 1
