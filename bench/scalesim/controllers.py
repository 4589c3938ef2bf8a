"""The control loops compared: ours (KEDA path and builtin path) and the autoscalers people run.

Each controller has an ``interval`` (seconds between its decisions) and ``decide(t, prom, pool)``
returning the Deployment's new ``spec.replicas`` (or ``None``: leave it). Defaults and formulas
follow ``shared/reference/autoscaling-sim.md`` (read from the projects' source):

- :class:`Hpa`: the Kubernetes HPA's replica calculation, tolerance 0.1, sync 15 s, and either the
  legacy path (``behavior`` nil: 5-minute scale-down stabilisation, scale-up cap
  ``max(2 * current, 4)``) or the ``behavior`` path (stabilisation windows, rate policies with
  ``selectPolicy``).
- :class:`OursKeda`: Sluiceway's scaler (:func:`sluiceway_core.policy.desired_replicas`) answering
  the HPA's reads through KEDA (External metric, AverageValue target 1), with the HPA behaviour the
  operator renders; KEDA's 30 s polling loop calls the scaler too.
- :class:`OursBuiltin`: the same policy applied by the operator's timer straight to the Deployment.
- :class:`KedaPrometheus`: KEDA's Prometheus trigger (AverageValue, legacy HPA) on the requests in
  the pods (``concurrency``), the offered rate (``rate``), or the queue alone (``queue``), each
  against 80 % of what one replica carries.
- :class:`HpaUtilisation`: HPA on GPU utilisation (a Pods metric, target 80 %).
- :class:`Kpa`: Knative's KPA on the revision's total concurrency (stable 60 s / panic 6 s at 200 %,
  tick 2 s, target 70 % of the container concurrency, scale rates 1000 up / 2 down).
- :class:`RayServe`: Ray Serve's defaults (target ongoing requests 2, look-back 30 s, upscale delay
  30 s, downscale delay 600 s).
- :class:`Oracle`: knows the future arrival rate and the 95th percentile start-up; provisions for
  the busiest second ahead at 85 % utilisation.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
from sluiceway_core.policy import (
    ScaleDownPolicy,
    ScaleHistory,
    ScaleUpPolicy,
    ScalingSpec,
    Signals,
    desired_replicas,
)
from sluiceway_core.signals import average_step
from sluiceway_core.units import parse_duration

from .model import PodPool, ServiceModel, ceil_div
from .observe import Prometheus

__all__ = [
    "Controller",
    "Hpa",
    "HpaBehavior",
    "HpaUtilisation",
    "KedaHttp",
    "KedaPrometheus",
    "KedaPrometheusQueue",
    "Kpa",
    "Oracle",
    "OursBuiltin",
    "OursGateway",
    "OursKeda",
    "OursZero",
    "RayServe",
    "default_spec",
    "spec_at_029d718",
]


#: KEDA ScaledObject ``pollingInterval`` default (keda ``withtriggers_types.go``) and the HPA's sync
#: period (kube-controller-manager ``--horizontal-pod-autoscaler-sync-period``).
KEDA_POLLING = 30
HPA_SYNC = 15


class Controller(Protocol):
    name: str
    interval: int

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None: ...


# --------------------------------------------------------------------------------------- HPA
@dataclass(frozen=True)
class HpaBehavior:
    """``spec.behavior`` of an HPA; ``None`` fields mean "no such policy"."""

    up_window: float = 0.0
    up_pods: int | None = 4
    up_percent: float | None = 100.0
    up_period: float = 15.0
    up_select: str = "Max"
    down_window: float = 300.0
    down_pods: int | None = None
    down_percent: float | None = 100.0
    down_period: float = 15.0
    down_select: str = "Max"
    #: ``scaleUp.tolerance`` (Kubernetes 1.33+, HPAConfigurableTolerance): None is the HPA's
    #: ``--horizontal-pod-autoscaler-tolerance``, 0.1, both ways
    up_tolerance: float | None = None


@dataclass
class Hpa:
    """One HorizontalPodAutoscaler's stabilisation and rate limits (not its metric formula)."""

    min_replicas: int
    max_replicas: int
    behavior: HpaBehavior | None = None  # None: the legacy path
    tolerance: float = 0.1
    _recs: deque[tuple[float, int]] = field(default_factory=deque)
    _events: deque[tuple[float, int]] = field(default_factory=deque)  # (time, replica change)

    def within_tolerance(self, ratio: float) -> bool:
        b = self.behavior
        up = self.tolerance if b is None or b.up_tolerance is None else b.up_tolerance
        return (1 - self.tolerance) <= ratio <= (1 + up)

    def _record(self, t: float, rec: int, keep: float) -> None:
        self._recs.append((t, rec))
        while self._recs and self._recs[0][0] < t - keep:
            self._recs.popleft()

    def apply(self, t: float, current: int, raw: int) -> int:
        """From the metric's raw proposal to the new ``spec.replicas``."""
        b = self.behavior
        if b is None:
            self._record(t, raw, 300.0)
            stabilised = max(r for _, r in self._recs)
            cap = max(2 * current, 4)
            desired = min(stabilised, cap)
        else:
            self._record(t, raw, max(b.up_window, b.down_window))
            up_rec = min([raw] + [r for tt, r in self._recs if tt > t - b.up_window]) if b.up_window else raw
            down_rec = max([raw] + [r for tt, r in self._recs if tt > t - b.down_window]) if b.down_window else raw
            desired = current
            if desired < up_rec:
                desired = up_rec
            if desired > down_rec:
                desired = down_rec
            desired = self._rate_limit(t, current, desired, b)
        desired = min(self.max_replicas, max(self.min_replicas, desired))
        if desired != current:
            self._events.append((t, desired - current))
        while self._events and self._events[0][0] < t - 3600:
            self._events.popleft()
        return desired

    def _rate_limit(self, t: float, current: int, desired: int, b: HpaBehavior) -> int:
        if desired > current:
            added = sum(d for tt, d in self._events if d > 0 and tt > t - b.up_period)
            start = current - added
            limits = []
            if b.up_pods is not None:
                limits.append(start + b.up_pods)
            if b.up_percent is not None:
                limits.append(math.ceil(start * (1 + b.up_percent / 100)))
            if limits:
                cap = max(limits) if b.up_select == "Max" else min(limits)
                desired = min(desired, max(cap, current))
        elif desired < current:
            removed = -sum(d for tt, d in self._events if d < 0 and tt > t - b.down_period)
            start = current + removed
            floors = []
            if b.down_pods is not None:
                floors.append(start - b.down_pods)
            if b.down_percent is not None:
                floors.append(math.floor(start * (1 - b.down_percent / 100)))
            if floors:
                floor = min(floors) if b.down_select == "Max" else max(floors)
                desired = max(desired, min(floor, current))
        return desired


# --------------------------------------------------------------------------------------- ours
def default_spec(max_replicas: int, **over: object) -> ScalingSpec:
    """The CRD's autoscaling defaults as the scaler's ScalingSpec (targetQueueDepthPerReplica 8,
    targetWaitP95 2s, utilisation 80 %, scale up 4 pods or 100 % per 15 s, scale down window 90 s,
    at most max(1 pod, 2 %) per 60 s, released after 20 min of surplus — the percent and the
    release window chosen with this simulator, docs/scalesim.md)."""
    spec = ScalingSpec(
        min_replicas=1,
        max_replicas=max_replicas,
        target_queue_per_replica=8.0,
        target_wait_p95=2.0,
        target_utilisation=0.8,
        scale_up=ScaleUpPolicy(max_pods=4, max_percent=100.0),
        scale_down=ScaleDownPolicy(
            stabilization_window=90.0, max_pods=1, period=60.0, max_percent=2.0, release_window=1200.0
        ),
    )
    return replace(spec, **over)  # type: ignore[arg-type]


def spec_at_029d718(max_replicas: int) -> ScalingSpec:
    """The defaults before the simulator: scale down at most 1 pod per 60 s whatever the size."""
    base = default_spec(max_replicas)
    return replace(base, scale_down=replace(base.scale_down, max_percent=None, release_window=None))


def _signals(
    t: int,
    prom: Prometheus,
    predictive: bool,
    window: int,
    pod_polls: bool = False,
    count_held: bool = False,
    averaged: bool = False,
    *,
    in_pods_term: bool = True,
    scaler_reads: bool = False,
) -> Signals:
    """The reads of ``sluiceway_core.signals.Queries`` over a ``window``-second rate window.
    ``count_held``: the requests held at the gateway count with the requests in the pods (issue 20:
    the demand term counts held requests). ``averaged``: the requests in the pods averaged over the
    window (``Queries.requests_in_pods_avg``) instead of the instant sum (``Queries.requests_in_pods``,
    the builtin engine's). ``in_pods_term=False``: the requests in the pods are not read at all (the
    KEDA scaler as it ships, ``sluiceway_scaler.prom.PrometheusSource.read_signals``; pinned by
    ``tests/scaler/test_scalesim_reads.py``). ``scaler_reads``: the pods ready once and their measured
    start-up are read, as the KEDA scaler does (``Queries.pods_ready``, ``Queries.startup_seconds``)."""
    q = prom.queue_depth(t)
    if q is None:
        return Signals(queue_depth=None, ok=False, detail="no scrape yet or the query failed")
    in_pods: float | None
    if not in_pods_term:
        in_pods = None
    elif pod_polls:
        in_pods = prom.concurrency_live(t)
    elif averaged:
        in_pods = prom.concurrency_avg(t, window, _avg_step(window))
    else:
        in_pods = prom.concurrency(t)
    held = prom.held(t)
    if count_held and in_pods is not None:
        in_pods += held or 0.0
    return Signals(
        queue_depth=q,
        wait_p95=prom.wait_p95(t, window),
        arrival_rate=prom.admitted_rate(t, window),
        utilisation=prom.utilisation(t, window),
        completion_rate=prom.completed_rate(t, window),
        request_cost=prom.request_cost(t, window),
        permits=prom.model.permits,
        offered_rate=prom.offered_rate(t, window),
        offered_trend=prom.offered_trend(t) if predictive else None,
        ready_replicas=prom.ready(t),
        pods_ready=prom.pods_ready(t) if scaler_reads or averaged else None,
        startup_seconds=prom.startup(t) if scaler_reads or averaged else None,
        requests_in_pods=in_pods,
        requests_in_pods_now=prom.concurrency(t) if in_pods_term and averaged and not pod_polls else None,
        # the gateway's held requests (issue 20: the policy's hold term; 0 without an edge)
        held=None if count_held else held,
        # the gateway's arrivals (answers + the held count's growth): every arrival reaches the edge
        edge_rate=prom.offered_rate(t, window) if held else None,
    )


def _avg_step(window: int) -> int:
    """``sluiceway_core.signals.average_step`` of a ``window``-second window, in seconds."""
    return max(1, round(parse_duration(average_step(f"{window}s"))))


@dataclass
class OursBuiltin:
    """The operator's builtin engine: the policy on a timer, writing ``spec.replicas`` directly."""

    spec: ScalingSpec
    interval: int = 30
    predictive: bool = False
    name: str = "ours-builtin"
    #: the operator's queries: ``Queries.build(ns, name)``, window 2m
    rate_window: int = 120
    pod_polls: bool = False
    _history: ScaleHistory = field(default_factory=ScaleHistory)
    _last: int | None = None

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        current = pool.target if self._last is None else self._last
        signals = _signals(t, prom, self.predictive, self.rate_window, self.pod_polls)
        d = desired_replicas(signals, self.spec, current, self._history, float(t))
        self._history = d.history
        self._last = d.replicas
        return d.replicas


@dataclass
class OursGateway:
    """Ours with the gateway of issues 19/20 deployed: the operator's builtin engine deciding every
    ``interval`` seconds (``--signals-interval 2s``, the KPA's tick) and writing ``spec.replicas``;
    the requests in the pods and the offered rate are the gateway's exact counts (the last second,
    and the last ``gateway_window`` seconds), the other signals Prometheus' as for ``ours-builtin``.
    Not the product today: it needs the gateway deployed and the engine reading its counts."""

    spec: ScalingSpec
    interval: int = 2
    name: str = "ours-gateway"
    rate_window: int = 120
    gateway_window: int = 10
    _history: ScaleHistory = field(default_factory=ScaleHistory)
    _last: int | None = None

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        current = pool.target if self._last is None else self._last
        signals = _signals(t, prom, False, self.rate_window)
        if signals.ok:
            signals = replace(
                signals,
                requests_in_pods=prom.gateway_in_pods(t),
                offered_rate=prom.gateway_offered(t, self.gateway_window),
            )
        d = desired_replicas(signals, self.spec, current, self._history, float(t))
        self._history = d.history
        self._last = d.replicas
        return d.replicas


@dataclass
class OursKeda:
    """Sluiceway's scaler behind KEDA: each HPA sync (15 s) reads the scaler's metric (desired
    replicas, AverageValue target 1), then the HPA applies its tolerance and the rendered behaviour.
    KEDA's polling loop also calls the scaler every ``pollingInterval`` (30 s, offset from the HPA's
    sync); that answer is not applied, but the scaler records it (its ``current`` becomes the last
    answer, its history gets the entry), as ``sluiceway_scaler.service`` does for every call."""

    spec: ScalingSpec
    hpa_behavior: HpaBehavior
    interval: int = 1  # the loop below keeps the HPA's and KEDA's own periods
    predictive: bool = False
    name: str = "ours-keda"
    #: the scaler's ``rateWindow``: its default is 1m (sluiceway_scaler.metadata), the operator
    #: renders none
    rate_window: int = 60
    hpa_sync: int = HPA_SYNC
    polling: int = KEDA_POLLING
    polling_offset: int = 7
    #: the scaler reads the requests in the pods from the pods themselves (``podMetricsUrls``)
    pod_polls: bool = False
    #: the scaler adds the gateway's held requests to the requests in the pods (issue 20)
    count_held: bool = False
    #: the scaler reads the requests in the pods (``Signals.requests_in_pods``). False, as the scaler
    #: ships: ``sluiceway_scaler.prom`` does not read the term (the window average flapped the
    #: sandbox e2e, docs/autoscaling.md); ``tests/scaler/test_scalesim_reads.py`` pins the two read sets
    in_pods_term: bool = False
    #: with ``in_pods_term``: the window average (``Queries.requests_in_pods_avg``) with the instant
    #: sample beyond its noise; False: the instant sum alone
    averaged: bool = True
    _history: ScaleHistory = field(default_factory=ScaleHistory)
    _last: int | None = None
    _hpa: Hpa | None = None
    _cost: float | None = None

    def _scaler(self, t: int, prom: Prometheus, pool: PodPool) -> int:
        current = pool.target if self._last is None else self._last
        signals = _signals(
            t, prom, self.predictive, self.rate_window, self.pod_polls, self.count_held, averaged=self.averaged,
            in_pods_term=self.in_pods_term or self.pod_polls, scaler_reads=True,
        )
        # the scaler remembers the last request cost it measured (sluiceway_scaler.service): back
        # from zero nothing was served in the rate window, and the hold term sizes with it
        if signals.request_cost is not None:
            self._cost = signals.request_cost
        elif signals.held and self._cost is not None:
            signals = replace(signals, request_cost=self._cost)
        d = desired_replicas(signals, self.spec, current, self._history, float(t))
        self._history = d.history
        self._last = d.replicas
        return d.replicas

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        if self._hpa is None:
            self._hpa = Hpa(self.spec.min_replicas, self.spec.max_replicas, self.hpa_behavior)
        # ``t`` is the second after the simulated one (``sim.run`` calls ``decide(t + 1)``); the HPA
        # syncs on the same simulated seconds as the peers' HPAs (``interval = HPA_SYNC``), so every
        # HPA in the cluster reads the scrape of its own second (issue 21: ours synced one second
        # earlier and read a scrape 14 s older than the peers did)
        second = t - 1
        if self.polling and second % self.polling == self.polling_offset % self.polling:
            self._scaler(t, prom, pool)  # KEDA's polling loop: asked, not applied
        if second % self.hpa_sync:
            return None
        metric = float(self._scaler(t, prom, pool))
        ratio = metric / max(1, pool.total)
        raw = pool.target if self._hpa.within_tolerance(ratio) else ceil_div(metric, 1.0)
        return self._hpa.apply(t, pool.target, raw)


#: ``behavior.scaleUp.tolerance`` the operator renders with engine ``keda``
#: (``sluiceway_operator.render.HPA_SCALE_UP_TOLERANCE``; ``tests/scalesim/test_peers.py`` pins the two)
SCALE_UP_TOLERANCE = 0.0


def rendered_behavior(
    spec: ScalingSpec,
    *,
    windows_add_up: bool,
    scaler_paces: bool = True,
    up_tolerance: float | None = SCALE_UP_TOLERANCE,
) -> HpaBehavior:
    """The HPA behaviour the operator renders for ``engine: keda``. ``windows_add_up=False`` is the
    rendering at commit 029d718 (the HPA repeats the scaler's 300 s scale-down window, so a drop
    waits for both); ``True`` leaves the scale-down window to the scaler alone.

    ``scaler_paces=True`` leaves the scale-down pace to the scaler as well: the HPA's scale-down
    policy is its default, 100 % per 15 s. The scaler's release (``ScaleDownPolicy.release_window``)
    needs it: an HPA pacing at the spec's 2 % per minute holds the released count back.
    ``False``: the HPA repeats the spec's pace (max(1 pod, 2 %) per 60 s).

    ``up_tolerance``: the rendered ``scaleUp.tolerance`` (0: the HPA follows any rise of the
    scaler's answer); None, the HPA's 10 % both ways, as rendered before issue 21."""
    down = spec.scale_down
    if windows_add_up and scaler_paces:
        down = replace(down, max_pods=None, max_percent=100.0, period=15.0)
    return HpaBehavior(
        up_window=0.0,
        up_pods=spec.scale_up.max_pods,
        up_percent=spec.scale_up.max_percent,
        up_period=15.0,
        up_select="Max",
        down_window=0.0 if windows_add_up else down.stabilization_window,
        down_pods=down.max_pods,
        down_percent=down.max_percent,
        down_period=down.period,
        down_select="Max" if down.max_percent is not None else "Min",
        up_tolerance=up_tolerance,
    )


@dataclass
class OursZero:
    """Ours with ``minReplicas: 0`` behind the gateway's hold queue (issue 20): KEDA owns 0 <-> 1,
    the HPA (``inner``, ours-keda) 1 <-> N.

    - **Activation**: the scaler's ``StreamIsActive`` (``external-push``, polled every
      ``activationPollInterval``, 1 s) reports active while the gateway holds a request, a request is
      in a pod, or one arrived in the last second (one refused at once for its deadline included: a
      service whose requests all have deadlines shorter than its start-up must still wake up); KEDA
      scales 0 -> 1 on the push.
    - **Scale to zero**: KEDA's ``cooldownPeriod`` = ``spec.autoscaling.scaleToZeroAfter`` after the
      last active report, and never while a request is held or in flight or a pod is loading.
    - While at zero the HPA is off (``ScalingDisabled``), so ``inner`` is not asked."""

    inner: OursKeda
    scale_to_zero_after: float = 300.0
    interval: int = 1
    name: str = "ours-keda"
    _last_active: float = -math.inf

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        s = t - 1
        pending = prom.edge_pending(t) or 0.0
        active = pending > 1e-9 or (s >= 0 and prom.rec.arrived[s] > 0)
        if active:
            self._last_active = s
        if pool.target == 0:
            return 1 if active else None
        if not active and pool.starting == 0 and s - self._last_active >= self.scale_to_zero_after:
            return 0
        return self.inner.decide(t, prom, pool)


@dataclass
class KedaHttp:
    """KEDA's HTTP add-on: the interceptor counts the requests pending per route (held + in the
    pods) and its scaler pushes them to KEDA (``external-push``, every 200 ms: exact and current
    here). KEDA activates 0 -> 1 when the count is above 0 and scales to 0 once ``scaledownPeriod``
    (300 s, KEDA's ``cooldownPeriod``) has passed since the last active report; 1 <-> N is the HPA's
    legacy path on the count against ``target`` per replica (AverageValue)."""

    target: float
    min_replicas: int
    max_replicas: int
    scaledown_period: float = 300.0
    interval: int = 1
    name: str = "keda-http"
    hpa_sync: int = HPA_SYNC
    _hpa: Hpa | None = None
    _last_active: float = -math.inf

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        if self._hpa is None:
            self._hpa = Hpa(max(1, self.min_replicas), self.max_replicas, None)
        s = t - 1
        pending = prom.edge_pending(t) or 0.0
        if pending > 1e-9:
            self._last_active = s
        if pool.target == 0:
            return 1 if pending > 1e-9 else None
        if self.min_replicas == 0 and s - self._last_active >= self.scaledown_period:
            return 0
        if s % self.hpa_sync:
            return None
        ratio = pending / (self.target * max(1, pool.total))
        raw = pool.target if self._hpa.within_tolerance(ratio) else ceil_div(pending, self.target)
        return self._hpa.apply(t, pool.target, raw)


# --------------------------------------------------------------------------------------- peers
@dataclass
class KedaPrometheus:
    """KEDA's ``prometheus`` trigger (``metricType: AverageValue``, ``ignoreNullValues: true``, no
    ``advanced.horizontalPodAutoscalerConfig``: the HPA's legacy path). Each HPA sync (15 s) reads the
    query live through KEDA's metrics server: ``ceil(value / threshold)`` unless ``value / (threshold
    x status.replicas)`` is within the 10 % tolerance; a failed query keeps the replica count. KEDA's
    own 30 s polling loop only activates 0 <-> 1, which ``minReplicaCount >= 1`` switches off.

    ``query`` is ``concurrency`` (requests in the pods, running + queued: the in-flight trigger),
    ``rate`` (``sum(rate(sluiceway_requests_total[1m]))``: every request offered) or ``queue``
    (``sum(sluiceway_queue_depth)``: waiting requests only)."""

    query: str
    threshold: float
    min_replicas: int
    max_replicas: int
    interval: int = HPA_SYNC
    name: str = ""
    rate_window: int = 60
    _hpa: Hpa | None = None

    def __post_init__(self) -> None:
        if self.query not in ("concurrency", "rate", "queue"):
            raise ValueError(f"unknown KEDA query {self.query!r}")
        self.name = self.name or f"keda-{self.query}"

    def value(self, t: int, prom: Prometheus) -> float | None:
        if self.query == "concurrency":
            return prom.concurrency(t)
        if self.query == "rate":
            return prom.offered_rate(t, self.rate_window)
        return prom.queue_depth(t)

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        if self._hpa is None:
            self._hpa = Hpa(self.min_replicas, self.max_replicas, None)
        if prom.scrape_at(t) >= 0 and prom.failed(t):
            return None  # the scaler errs: the HPA's metric is invalid, no scaling
        v = self.value(t, prom)
        value = 0.0 if v is None else v  # ignoreNullValues: an empty result reads 0
        ratio = value / (self.threshold * max(1, pool.total))  # status.replicas counts starting pods
        raw = pool.target if self._hpa.within_tolerance(ratio) else ceil_div(value, self.threshold)
        return self._hpa.apply(t, pool.target, raw)


def KedaPrometheusQueue(threshold: float, min_replicas: int, max_replicas: int) -> KedaPrometheus:
    """The queue-depth-only trigger (kept to show why it collapses)."""
    return KedaPrometheus("queue", threshold, min_replicas, max_replicas, name="keda-queue")


@dataclass
class HpaUtilisation:
    """HPA on GPU utilisation: a Pods metric (DCGM-style 60 s average per pod). The HPA's readiness
    filter is CPU-only, so warming pods that already export a 0 utilisation count in the mean and in
    the pod count (``calcPlainMetricReplicas``); pods whose scrape failed are missing."""

    target: float
    min_replicas: int
    max_replicas: int
    interval: int = HPA_SYNC
    name: str = "hpa-utilisation"
    _hpa: Hpa | None = None

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        if self._hpa is None:
            self._hpa = Hpa(self.min_replicas, self.max_replicas, None)
        u = prom.utilisation(t, 60)
        pods = prom.ready(t)
        if u is None or not pods:
            return None  # no metrics: the HPA keeps the replica count
        ratio = u / self.target
        raw = pool.target if self._hpa.within_tolerance(ratio) else math.ceil(ratio * pods - 1e-9)
        return self._hpa.apply(t, pool.target, raw)


@dataclass
class Kpa:
    """Knative Pod Autoscaler with its defaults (``config/core/configmaps/autoscaler.yaml``;
    ``pkg/autoscaler/scaling/autoscaler.go``); container concurrency = the pod's permits.

    Every 2 s: ``TV = 0.7 x containerConcurrency``; the collector's 1-s samples of the revision's
    *total* concurrency averaged over the stable (60 s) and panic (6 s = 10 %) windows;
    ``DSPC = ceil(stable / TV)``, ``DPPC = ceil(panic / TV)``, each clamped to
    ``[floor(ready / max-scale-down-rate), ceil(max-scale-up-rate x ready)]``; panic starts or extends
    while ``DPPC / ready >= 2.0`` and ends a stable window after the last trigger; in panic the
    desired count is ``max(DSPC, DPPC)`` and never falls. target-burst-capacity 200 decides only
    whether the activator sits in the request path (``EBC = floor(ready x CC - TBC - panic)`` < 0);
    the activator adds no capacity, so it is not modelled beyond that."""

    container_concurrency: int
    min_replicas: int
    max_replicas: int
    interval: int = 2
    name: str = "knative-kpa"
    target_pct: float = 0.7
    stable: int = 60
    panic: int = 6
    panic_threshold: float = 2.0
    max_up_rate: float = 1000.0
    max_down_rate: float = 2.0
    target_burst_capacity: float = 200.0
    #: ``scale-to-zero-grace-period`` (30 s): with ``min_replicas`` 0, a want of 0 is applied only
    #: once it has lasted this long (the activator put in the path first); until then 1 pod stays
    scale_to_zero_grace: float = 30.0
    _panic_time: float | None = None
    _max_panic_pods: int = 0
    _zero_since: float | None = None

    def step(self, t: int, stable_total: float, panic_total: float, ready_pods: int) -> int:
        """One decision from the window averages of the total concurrency (pure but for the panic
        state)."""
        tv = max(0.01, self.container_concurrency * self.target_pct)
        ready = float(max(1, ready_pods))
        max_up = math.ceil(self.max_up_rate * ready)
        max_down = math.floor(ready / self.max_down_rate)
        dspc = math.ceil(stable_total / tv - 1e-9)
        dppc = math.ceil(panic_total / tv - 1e-9)
        stable_pods = int(min(max(dspc, max_down), max_up))
        panic_pods = int(min(max(dppc, max_down), max_up))
        over = dppc / ready >= self.panic_threshold
        if over:
            self._panic_time = t
        elif self._panic_time is not None and t > self._panic_time + self.stable:
            self._panic_time = None
            self._max_panic_pods = 0
        want = stable_pods
        if self._panic_time is not None:
            want = max(want, panic_pods)
            if want > self._max_panic_pods:
                self._max_panic_pods = want
            else:
                want = self._max_panic_pods
        return min(self.max_replicas, max(self.min_replicas, want))

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        stable = prom.total_concurrency(t, self.stable)
        panic = prom.total_concurrency(t, self.panic)
        if stable is None or panic is None:
            return None
        want = self.step(t, stable, panic, pool.ready)
        if want > 0 or pool.target == 0:
            self._zero_since = None
            return want
        # scale to zero (``pkg/reconciler/autoscaling/kpa/scaler.go``): after the grace period
        if self._zero_since is None:
            self._zero_since = t
        return 0 if t - self._zero_since >= self.scale_to_zero_grace else 1


@dataclass
class RayServe:
    """Ray Serve's queue-length policy with its documented defaults (``AutoscalingConfig``: target 2
    ongoing requests per replica, look-back 30 s, metrics pushed every 10 s, upscale delay 30 s,
    downscale delay 600 s, smoothing factors 1). ``e = total / (target x running)``, desired
    ``ceil(running x (1 + (e - 1) x f))`` (one less when that equals ``running`` but
    ``ceil(running x e)`` is lower); decisions counted per 0.1 s tick in Ray, here per second with
    the same delays in seconds."""

    min_replicas: int
    max_replicas: int
    target_ongoing: float = 2.0
    look_back: int = 30
    metrics_interval: int = 10
    upscale_delay: int = 30
    downscale_delay: int = 600
    upscaling_factor: float = 1.0
    downscaling_factor: float = 1.0
    interval: int = 1
    name: str = "ray-serve"
    _up: int = 0
    _down: int = 0
    _last_metric: float | None = None
    _last_push: int = -(10**9)

    def desired(self, total: float, running: int) -> int:
        running = max(1, running)
        e = total / (self.target_ongoing * running)
        f = self.upscaling_factor if e >= 1 else self.downscaling_factor
        desired = math.ceil(running * (1 + (e - 1) * f) - 1e-9)
        if math.ceil(running * e - 1e-9) < running and desired == running:
            desired -= 1
        return min(self.max_replicas, max(self.min_replicas, desired))

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        if t - self._last_push >= self.metrics_interval:
            self._last_push = t
            self._last_metric = prom.total_concurrency(t, self.look_back)
        if pool.ready == 0 and self.min_replicas == 0:
            # no replica running: a request queued at a handle scales to max(ceil(upscaling_factor),
            # current target) at once (``_calculate_desired_num_replicas``; the handle reports it
            # without waiting for the 10 s push since ray PR #38351)
            live = prom.total_concurrency(t, 1)
            if pool.target == 0 and live is not None and live > 0:
                self._up = self._down = 0
                return max(math.ceil(self.upscaling_factor), 1)
            return None
        if self._last_metric is None or pool.ready == 0:
            return None
        desired = self.desired(self._last_metric, pool.ready)
        current = pool.target
        if desired > current:
            self._up += 1
            self._down = 0
            if self._up > self.upscale_delay:
                self._up = 0
                return desired
        elif desired < current:
            self._down += 1
            self._up = 0
            if self._down > self.downscale_delay:
                self._down = 0
                return desired
        else:
            self._up = self._down = 0
        return None


@dataclass
class Oracle:
    """Knows the future: asks, the 95th percentile start-up time early, for the replicas the busiest
    second of the coming interval needs at ``utilisation``."""

    rate: np.ndarray
    model: ServiceModel
    min_replicas: int
    max_replicas: int
    interval: int = 15
    utilisation: float = 0.85
    name: str = "oracle"

    def __post_init__(self) -> None:
        self._ahead = int(self.model.startup.quantile(0.95)) + self.interval

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        ahead = self._ahead
        window = self.rate[t : t + ahead + 1]
        if window.size == 0:
            return None
        need = ceil_div(float(window.max()), self.model.replica_rate * self.utilisation)
        # Keep what is needed now too (pods started early must not be dropped before the peak).
        now_need = ceil_div(float(self.rate[t]), self.model.replica_rate * self.utilisation)
        return min(self.max_replicas, max(self.min_replicas, need, now_need))
