"""``sluiceway demo``: the whole loop on one machine, watched live.

Brings the sandbox up (unless it is already), applies ``samples/sandbox-demo.yaml`` (a synthetic
model with a known capacity, three tenants with keys, three priority classes, KEDA autoscaling 1..4;
the sandbox comes up with the chart's quota coordinator on, so the tenants' quotas hold service-wide),
waits for its first ready endpoint, then drives an open-loop ramp: about half, once and three times
one replica's capacity, then nothing.

How the load reaches the pods (``clients``):

* ``gateway`` (the default): the demo turns the gateway on in the document it applies
  (:func:`with_gateway`, one override: ``spec.gateway`` = :data:`GATEWAY_SPEC`; the sample file stays
  as the end-to-end test applies it), waits until ``status.endpoint`` names the gateway's Service and
  a request through it is answered, and sends the load from K keep-alive clients per tenant
  (:class:`~.loadgen.KeepAlive`) to that Service's ClusterIP, through the real kube-proxy, as real
  clients call a Service. The gateway routes each request to a pod, so replicas KEDA adds take load
  as soon as the gateway sees them ready (docs/gateway.md).
* ``keepalive``: the same clients through the pods' own Service: kube-proxy picks a pod per
  connection, so added replicas get load only from connections opened after they are ready (under
  the 3x overload, those clients reopen after a request timed out; docs/sandbox.md).
* ``per-request``: each request to a random ready endpoint of the pods' Service, the spread a
  per-request balancer gives, with no gateway.

Every second it shows offered rate, goodput, answers by code and reason, queue depth and wait p95
(from Prometheus), desired and ready replicas, the share of requests each pod served in the last
5 s (each pod's own ``sluiceway_requests_total``, read from its metrics port), and, with the gateway,
what the edge did (requests held now and handed off after a hold, refusals by reason: the gateway's
own ``sluiceway_gateway_*`` series, read from its metrics port). It ends with a report in numbers
(including the desired count's dips during the steady 3x phase, issue 21) and a PNG plot, and tears
the sandbox down unless ``keep``.

Pure: :class:`Ramp`, :func:`build_report`, :func:`render_table`, :func:`with_gateway`,
:func:`desired_dips`, :func:`served_shares`, :func:`parse_exposition`, :func:`edge_from_metrics`.
I/O: :func:`run_demo` and the small readers (:class:`PromReader`, :class:`MetricsProbe`,
:func:`read_replicas`). Concurrency: the load runs on its own event loop in a thread
(:func:`~.loadgen.run_load_in_thread`); everything else here runs on the calling thread, which
samples once a second and only reads the outcomes list the load thread appends to.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import copy
import dataclasses
import itertools
import json
import math
import re
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sluiceway_core import metric_names as mn
from sluiceway_core.signals import Queries

from .layout import Layout
from .loadgen import (
    DEFAULT_BODY,
    Client,
    EndpointWatcher,
    KeepAlive,
    LoadgenError,
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
    "GATEWAY_SPEC",
    "DemoReport",
    "Dips",
    "EdgeReading",
    "MetricsProbe",
    "Ramp",
    "Sample",
    "build_report",
    "desired_dips",
    "edge_from_metrics",
    "edge_lost",
    "main",
    "parse_exposition",
    "render_table",
    "run_demo",
    "served_shares",
    "with_gateway",
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
#: how the demo's load reaches the pods (module docstring): keep-alive clients through the gateway's
#: Service by default; through the pods' Service, or per request to a random ready pod, on request
CLIENT_MODES = ("gateway", "keepalive", "per-request")
DEFAULT_CLIENTS = "gateway"
#: the one change the demo makes to the sample's InferenceService in ``gateway`` mode (the sample
#: file itself is what the end-to-end test applies, without a gateway): one gateway replica, so the
#: tenants' rate/burst hold at the edge for the whole service (docs/gateway.md), routing leastWait
GATEWAY_SPEC: Mapping[str, Any] = {"enabled": True, "replicas": 1, "routing": "leastWait"}
#: keep-alive clients per tenant (one connection each) in the ``gateway`` and ``keepalive`` modes:
#: the 3x phase offers about 86 requests/s of ``search``; 16 connections carry that at up to about
#: 190 ms per answer before requests wait for a free connection of their client
KEEPALIVE_CLIENTS = 16
#: the gateway's ``refused_total`` reason for a connection closed at its header deadline: with the
#: demo's clients (whole requests at once) always an idle keep-alive connection, never a request
#: refused, so the report lists it apart (gateway/sluiceway_gateway/server.py, ``_header_late``)
IDLE_CLOSE = "header_timeout"
#: seconds from the moment the peak count of pods is ready in the 3x phase to the start of the
#: window over which the report splits what each pod served (the balancer's discovery settles)
SHARE_SETTLE = 10.0


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
    #: each ready pod's own count of the requests it answered (``sluiceway_requests_total``),
    #: cumulative, by pod address (``ip``); empty when none could be read
    served: dict[str, float] = field(default_factory=dict)
    #: the gateway's own counters at this second (``gateway`` mode; None without a gateway)
    edge: EdgeReading | None = None


@dataclass(frozen=True)
class EdgeReading:
    """What the gateway did, from its ``sluiceway_gateway_*`` series (summed over its replicas)."""

    held: float = 0.0  # requests in the hold queue now
    handed_off: float = 0.0  # requests handed to a pod after a hold (cumulative)
    hold_outcomes: dict[str, float] = field(default_factory=dict)  # held requests by outcome (cumulative)
    refused: dict[str, float] = field(default_factory=dict)  # answered with an error at the edge, by reason
    routed: dict[str, float] = field(default_factory=dict)  # attempts sent to each pod (``ip:port``)


@dataclass(frozen=True)
class Dips:
    """The desired replica count during one phase: how often it went down, and its range."""

    phase: str
    dips: int
    low: int | None
    high: int | None
    at: tuple[tuple[float, int, int], ...] = ()  # (t, from, to) for each dip
    start: float | None = None  # first and last sample of the phase
    end: float | None = None

    def line(self) -> str:
        if self.low is None:
            return f"desired replicas in the '{self.phase}' phase: no reading"
        where = "; ".join(f"t={t:.0f} s {a}->{b}" for t, a, b in self.at)
        return (f"steady overload ('{self.phase}' phase, t={self.start:.0f}..{self.end:.0f} s): desired "
                f"went down {self.dips} time(s){f' ({where})' if where else ''}; desired min {self.low}, "
                f"max {self.high}")


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
    clients: str = ""  # how the load reached the service, in words
    over_dips: Dips | None = None  # the desired count during the 3x phase (issue 21, item 5)
    #: each pod's share of what the pods served in the 3x phase, from ``SHARE_SETTLE`` s after the
    #: phase's peak count of pods was ready to the phase's end (``share_window``); pods by address
    pod_shares: dict[str, float] = field(default_factory=dict)
    share_window: tuple[float, float] | None = None
    edge: EdgeReading | None = None  # the gateway's counters at the end (``gateway`` mode)
    peak_held: float | None = None  # most requests the gateway held at once (1 s samples)
    #: seconds since the ramp began of each span in which the gateway's metrics port stopped
    #: answering after it had answered ((first, last) unanswered sample): the gateway down or hung
    edge_lost: tuple[tuple[float, float], ...] = ()

    def lines(self) -> list[str]:
        def sec(x: float | None) -> str:
            return "-" if x is None else f"{x:.1f} s"

        return [
            *([f"load: {self.clients}"] if self.clients else []),
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
            *([self.over_dips.line()] if self.over_dips else []),
            self._shares_line(),
            *self._edge_lines(),
            *([f"plot: {self.plot}"] if self.plot else []),
        ]

    def _shares_line(self) -> str:
        if not self.pod_shares or self.share_window is None:
            return "served per pod in the 3x phase: -"
        a, b = self.share_window
        even = 1 / len(self.pod_shares)
        parts = " ".join(f"{pod} {share:.1%}" for pod, share in sorted(self.pod_shares.items()))
        return (f"served per pod in the 3x phase, t={a:.0f}..{b:.0f} s ({len(self.pod_shares)} pods, "
                f"even {even:.1%}): {parts}")

    def _edge_lines(self) -> list[str]:
        if self.edge is None:
            return []
        e = self.edge
        held = "-" if self.peak_held is None else f"{self.peak_held:.0f}"
        outcomes = " ".join(f"{k}:{v:.0f}" for k, v in sorted(e.hold_outcomes.items()) if v) or "-"
        lost = "; ".join(f"t={a:.0f}..{b:.0f} s" for a, b in self.edge_lost)
        return [*([f"edge (gateway): its metrics port did not answer at {lost} (the gateway down or hung)"]
                  if lost else []),
                f"edge (gateway): held at most {held} at once; held requests by outcome: {outcomes}",
                f"edge (gateway): refused at the edge by reason: {_refusals(e)}; connections closed at the "
                f"header deadline (idle keep-alive or slow headers, no request answered): "
                f"{e.refused.get(IDLE_CLOSE, 0.0):.0f}"]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------------
# Pure.


def _refusals(edge: EdgeReading) -> str:
    """The gateway's refusals of requests by reason, without the connections it closed idle."""
    return " ".join(f"{k}:{v:.0f}" for k, v in sorted(edge.refused.items()) if v and k != IDLE_CLOSE) or "-"


def with_gateway(docs: Sequence[Mapping[str, Any]], gateway: Mapping[str, Any] = GATEWAY_SPEC) -> list[dict[str, Any]]:
    """The sample's documents with ``spec.gateway`` set on its InferenceService (a deep copy)."""
    out = [copy.deepcopy(dict(d)) for d in docs]
    isvcs = [d for d in out if d.get("kind") == "InferenceService"]
    if len(isvcs) != 1:
        raise ValueError(f"the sample must hold exactly one InferenceService, found {len(isvcs)}")
    isvcs[0].setdefault("spec", {})["gateway"] = dict(gateway)
    return out


def gateway_service(endpoint: str, namespace: str) -> str | None:
    """The Service named by ``status.endpoint`` when it is a gateway's (``http://<name>-gateway.<ns>.svc:<port>``),
    else None (the pods' own Service, or no endpoint yet)."""
    host = urllib.parse.urlsplit(endpoint).hostname or ""
    svc, _, rest = host.partition(".")
    return svc if svc.endswith("-gateway") and rest.startswith(f"{namespace}.") else None


def desired_dips(samples: Sequence[Sample], phase: str = "over") -> Dips:
    """How often the desired count went down between consecutive readings in ``phase`` (a dip),
    and its min/max there. Seconds with no reading (None) are skipped, not counted as a change."""
    during = [(s.t, s.desired) for s in samples if s.phase == phase]
    values = [(t, d) for t, d in during if d is not None]
    at = tuple((t, a, b) for (_, a), (t, b) in itertools.pairwise(values) if b < a)
    return Dips(phase, len(at), min((d for _, d in values), default=None), max((d for _, d in values), default=None),
                at, during[0][0] if during else None, during[-1][0] if during else None)


def served_shares(samples: Sequence[Sample], start: float, end: float) -> dict[str, float]:
    """Each pod's share of what the pods served between the first sample at or after ``start`` and
    the last one before ``end`` (``Sample.served``): pods read at both ends only; empty when there
    is no such pair or nothing was served."""
    inside = [s for s in samples if start <= s.t < end and s.served]
    if len(inside) < 2:
        return {}
    a, b = inside[0].served, inside[-1].served
    grew = {pod: max(0.0, b[pod] - a[pod]) for pod in b if pod in a}
    total = sum(grew.values())
    return {pod: v / total for pod, v in grew.items()} if total > 0 else {}


def recent_shares(before: Mapping[str, float], now: Mapping[str, float]) -> dict[str, float]:
    """Each pod's share of what the pods listed ``now`` served since ``before`` (a pod new since
    then counts from 0: its counter started when it did)."""
    grew = {pod: max(0.0, v - before.get(pod, 0.0)) for pod, v in now.items()}
    total = sum(grew.values())
    return {pod: v / total for pod, v in grew.items()} if total > 0 else {}


_SERIES = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line of a Prometheus text exposition; comments, blank
    and malformed lines are skipped."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SERIES.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        yield m.group(1), dict(_LABEL.findall(m.group(2) or "")), value


def served_from_metrics(text: str) -> float:
    """A pod's count of the inference requests it answered (every code): ``sluiceway_requests_total``."""
    return sum(v for name, _, v in parse_exposition(text) if name == mn.REQUESTS)


def edge_from_metrics(texts: Sequence[str]) -> EdgeReading:
    """The gateway replicas' ``/metrics`` texts summed into one :class:`EdgeReading` (``refused``:
    every error the gateway answered itself, its hold queue's bounds included; pod refusals it
    passed on are not in it)."""
    held = 0.0
    outcomes: dict[str, float] = {}
    refused: dict[str, float] = {}
    routed: dict[str, float] = {}
    for text in texts:
        for name, labels, v in parse_exposition(text):
            if name == mn.GATEWAY_HELD:
                held += v
            elif name == "sluiceway_gateway_hold_seconds_count":
                key = labels.get("outcome", "")
                outcomes[key] = outcomes.get(key, 0.0) + v
            elif name == mn.GATEWAY_REFUSED:
                key = labels.get("reason", "")
                refused[key] = refused.get(key, 0.0) + v
            elif name == "sluiceway_gateway_routed_total":
                key = labels.get("pod", "")
                routed[key] = routed.get(key, 0.0) + v
    return EdgeReading(held, outcomes.get("handed_off", 0.0), outcomes, refused, routed)


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
        over_dips=desired_dips(samples, "over"), edge=next((x.edge for x in reversed(samples) if x.edge), None),
        peak_held=max((x.edge.held for x in samples if x.edge), default=None),
        edge_lost=edge_lost(samples),
        **_share_window(samples, ramp),
    )


def edge_lost(samples: Sequence[Sample]) -> tuple[tuple[float, float], ...]:
    """Spans (first, last sample's t) in which the gateway gave no reading after it had given one."""
    spans: list[tuple[float, float]] = []
    seen = False
    start: float | None = None
    last = 0.0
    for x in samples:
        if x.edge is not None:
            if start is not None:
                spans.append((start, last))
                start = None
            seen = True
        elif seen:
            start = x.t if start is None else start
            last = x.t
    if start is not None:
        spans.append((start, last))
    return tuple(spans)


def _share_window(samples: Sequence[Sample], ramp: Ramp) -> dict[str, Any]:
    """The 3x phase from ``SHARE_SETTLE`` s after its peak count of pods was first ready, to its end."""
    over = [x for x in samples if x.phase == "over"]
    peak = max((x.ready or 0 for x in over), default=0)
    first = next((x.t for x in over if (x.ready or 0) == peak), None)
    if peak < 2 or first is None:
        return {"pod_shares": {}, "share_window": None}
    window = (first + SHARE_SETTLE, ramp.overload_start + ramp.over)
    shares = served_shares(samples, *window)
    return {"pod_shares": shares, "share_window": window if shares else None}


def _fmt(x: float | None, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
    return "-" if x is None or math.isnan(x) else f"{x * scale:.{digits}f}{unit}"


def render_table(sample: Sample, capacity: float, reasons: dict[str, int],
                 served_before: Mapping[str, float] | None = None) -> list[tuple[str, str]]:
    """The live display's rows (label, value) for one sample; ``served_before``: the pods' counts a
    few seconds earlier, for the share each pod served since."""
    shares = recent_shares(served_before or {}, sample.served) if served_before is not None else {}
    edge = sample.edge
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
        ("served per pod", " ".join(f"{pod} {v:.0%}" for pod, v in sorted(shares.items())) or "-"),
        ("edge (gateway)", "-" if edge is None else
         f"held {edge.held:.0f} now, {edge.handed_off:.0f} handed off after a hold; refused: {_refusals(edge)}"),
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


class MetricsProbe:
    """Reads each ready pod's and each gateway replica's own ``/metrics`` on their metrics ports,
    found through the headless ``<name>-metrics`` and ``<name>-gateway-metrics`` Services'
    EndpointSlices (sandbox addresses only, checked by :func:`~.loadgen.ready_endpoints`). Called
    from the sampling thread only; each read is bounded by ``timeout``."""

    def __init__(self, kube: Any, namespace: str, name: str, *, gateway: bool, timeout: float = 1.0) -> None:
        self.pods = EndpointWatcher(kube, namespace, f"{name}-metrics", port_name="metrics")
        self.gateway = (EndpointWatcher(kube, namespace, f"{name}-gateway-metrics", port_name="metrics")
                        if gateway else None)
        self.timeout = timeout
        self._last: dict[str, float] = {}  # pod ip -> its last count read (a failed read keeps it)

    def _text(self, endpoint: str) -> str | None:
        try:
            with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=self.timeout) as resp:
                return str(resp.read().decode("utf-8", "replace"))
        except (OSError, ValueError):
            return None

    @staticmethod
    def _endpoints(watcher: EndpointWatcher) -> list[str]:
        try:
            return watcher.poll()
        except LoadgenError:  # an address outside the sandbox: read nothing
            return []

    def __call__(self) -> tuple[dict[str, float], EdgeReading | None]:
        served: dict[str, float] = {}
        for ep in self._endpoints(self.pods):
            ip = ep.rpartition(":")[0]
            text = self._text(ep)
            if text is not None:
                self._last[ip] = served_from_metrics(text)
            if ip in self._last:
                served[ip] = self._last[ip]
        edge = None
        if self.gateway is not None:
            texts = [t for t in map(self._text, self._endpoints(self.gateway)) if t is not None]
            edge = edge_from_metrics(texts) if texts else None
        return served, edge


def _wait_gateway(kube: Any, ns: str, name: str, key: str, path: str, timeout: float,
                  progress: Callable[[str], None]) -> tuple[str, str]:
    """Wait (bounded) until ``status.endpoint`` names the gateway's Service, it has a ready endpoint,
    and one request through its ClusterIP is answered 2xx; returns (``clusterIP:port``, the endpoint)."""
    from . import lifecycle

    isvc = f"/apis/sluiceway.io/v1alpha1/namespaces/{ns}/inferenceservices/{name}"

    def endpoint() -> str:
        got = str((kube.get(isvc).get("status") or {}).get("endpoint") or "")
        return got if gateway_service(got, ns) else ""

    url = lifecycle.wait_until(endpoint, timeout, f"status.endpoint of {ns}/{name} naming its gateway's Service")
    svc = gateway_service(url, ns) or ""
    lifecycle.wait_until(EndpointWatcher(kube, ns, svc).poll, timeout, f"a ready endpoint of Service {ns}/{svc}")
    service = service_address(kube, ns, svc)

    def answered() -> bool:
        req = urllib.request.Request(f"http://{service}{path}", data=DEFAULT_BODY, headers={
            "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            return bool(200 <= resp.status < 300)

    lifecycle.wait_until(answered, timeout, f"a request answered 2xx through the gateway Service {service}")
    progress(f"demo: the gateway answers at {url} (Service {svc}, ClusterIP {service})")
    return service, url


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
    keepalive_clients: int = KEEPALIVE_CLIENTS,
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
    keepalive = KeepAlive(clients=keepalive_clients)  # LoadgenError (a ValueError) when out of bounds
    out_dir = (out_dir or Path.cwd()).resolve()
    if up:
        lifecycle.up(layout, lifecycle.UpOptions(build=build, chart_values=QUOTA_VALUES), progress)
    try:
        kube = Kube.as_identity(layout, "admin")
        docs, isvc = _load_sample(sample)
        if clients_mode == "gateway":
            docs = with_gateway(docs)
            (isvc,) = [d for d in docs if d.get("kind") == "InferenceService"]
        ns, name = isvc["metadata"]["namespace"], isvc["metadata"]["name"]
        model = isvc["spec"]["model"].get("name") or name
        progress(f"demo: applying {sample.name} ({ns}/{name})"
                 + (f" with spec.gateway = {dict(GATEWAY_SPEC)}" if clients_mode == "gateway" else ""))
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
        probe = MetricsProbe(kube, ns, name, gateway=clients_mode == "gateway")
        with watcher:
            if clients_mode == "gateway":
                service, url = _wait_gateway(kube, ns, name, clients[0].key or "", path, ready_timeout, progress)
                how = (f"{keepalive.clients} keep-alive clients per tenant, one connection each, through the "
                       f"gateway's Service {service} (status.endpoint {url}; kube-proxy, then the gateway "
                       f"routes each request)")
                thread, outcomes, stop = run_load_in_thread(schedule, clients, path, service=service,
                                                            keepalive=keepalive, seed=seed)
            elif clients_mode == "keepalive":
                service = service_address(kube, ns, name)
                how = (f"{keepalive.clients} keep-alive clients per tenant, one connection each, through the "
                       f"pods' Service {service} (kube-proxy picks a pod per connection; no gateway)")
                thread, outcomes, stop = run_load_in_thread(schedule, clients, path, service=service,
                                                            keepalive=keepalive, seed=seed)
            else:
                how = "each request to a random ready pod (per-request spread; no gateway, no Service)"
                thread, outcomes, stop = run_load_in_thread(schedule, clients, path,
                                                            per_request=watcher.endpoints, seed=seed)
            progress(f"demo: load: {how}")
            t0 = time.monotonic()
            try:
                samples = _observe(ramp, schedule, outcomes, prom, kube, ns, name, t0, live, progress, probe=probe)
            finally:
                stop.set()
                thread.join(timeout=30)
        report = build_report(samples, list(outcomes), ramp, first_ready, minimum)
        plot = write_plot(report, ramp, out_dir / "sluiceway-demo.png")
        report = dataclasses.replace(report, plot=str(plot), clients=f"{clients_mode}: {how}")
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
             progress: Callable[[str], None],
             probe: Callable[[], tuple[dict[str, float], EdgeReading | None]] | None = None) -> list[Sample]:
    """Sample once a second until the ramp ends; show it live. ``probe``: the pods' served counts
    and the gateway's reading (:class:`MetricsProbe`); None reads neither."""
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
        served, edge = probe() if probe is not None else ({}, None)
        phase = phase_at(ramp.phases(), now)
        return Sample(now, phase.name if phase else "end", float(offered),
                      float(sum(1 for o in new if 200 <= o.status < 300)), dict(sorted(answers.items())),
                      depth, p95, desired, ready, served, edge)

    def before() -> dict[str, float] | None:
        """The pods' served counts about 5 s before the latest sample (None: no reading yet)."""
        return samples[max(0, len(samples) - 6)].served if len(samples) > 1 else None

    def table(s: Sample) -> Any:
        from rich.table import Table

        tbl = Table(title="sluiceway demo (Ctrl-C stops)", show_header=False)
        for label, value in render_table(s, ramp.capacity, dict(sorted(reasons.items())), before()):
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
                rows = dict(render_table(s, ramp.capacity, dict(reasons), before()))
                progress(" | ".join(f"{k} {v}" for k, v in render_table(s, ramp.capacity, dict(reasons))[:3])
                         + f" | replicas {s.desired}/{s.ready} | depth {_fmt(s.queue_depth)}"
                         + f" | per pod (5 s) {rows['served per pod']}"
                         + (f" | edge {rows['edge (gateway)']}" if s.edge is not None else ""))
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
                   help="gateway (the default): the demo turns on spec.gateway and keep-alive clients call "
                   "the gateway's Service ClusterIP (status.endpoint) through kube-proxy; the gateway routes "
                   "each request to a pod, new replicas included. keepalive: the same clients through the "
                   "pods' own Service (kube-proxy picks a pod per connection: added replicas get only the "
                   "connections opened after they are ready). per-request: each request to a random ready "
                   "pod, no gateway")
    p.add_argument("--keepalive-clients", type=int, default=KEEPALIVE_CLIENTS, metavar="K",
                   help=f"keep-alive clients per tenant, one connection each (gateway and keepalive modes; "
                   f"default {KEEPALIVE_CLIENTS}, 1..256)")
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
    if not 1 <= ns.keepalive_clients <= 256:
        print("sluiceway demo: --keepalive-clients must be within 1..256", file=sys.stderr)
        return 2
    try:
        report = run_demo(layout_for(ns.state_dir), ramp=ramp, keep=ns.keep, up=not ns.already_up,
                          build=not ns.no_build, out_dir=ns.out_dir, live=not ns.no_live, seed=ns.seed,
                          clients_mode=ns.clients, keepalive_clients=ns.keepalive_clients)
    except KeyboardInterrupt:
        print("sluiceway demo: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # the message names the step (SandboxError, KubeError, KedaError, ...)
        print(f"sluiceway demo: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0 if report.unexpected_5xx == 0 and report.shed_without_reason == 0 else 1
