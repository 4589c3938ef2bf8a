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
  operator renders.
- :class:`OursBuiltin`: the same policy applied by the operator's timer straight to the Deployment.
- :class:`KedaPrometheusQueue`: KEDA's Prometheus trigger on the summed queue depth, its defaults
  (AverageValue threshold = target per replica, no behaviour → legacy HPA).
- :class:`HpaUtilisation`: HPA on GPU utilisation (a Pods/Resource metric, target 80 %).
- :class:`Kpa`: Knative's KPA (stable 60 s / panic 6 s, tick 2 s, target 70 % of the container
  concurrency, scale-down at most to half per tick).
- :class:`RayServe`: Ray Serve's defaults (target ongoing requests 2, look-back 30 s, upscale delay
  30 s, downscale delay 600 s).
- :class:`Oracle`: knows the future arrival rate and the slowest start-up; provisions for the
  busiest second ahead at 85 % utilisation.
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

from .model import PodPool, ServiceModel, ceil_div
from .observe import Prometheus

__all__ = [
    "Controller",
    "Hpa",
    "HpaBehavior",
    "HpaUtilisation",
    "KedaPrometheusQueue",
    "Kpa",
    "Oracle",
    "OursBuiltin",
    "OursKeda",
    "RayServe",
    "default_spec",
    "spec_at_029d718",
]


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
        return (1 - self.tolerance) <= ratio <= (1 + self.tolerance)

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
    targetWaitP95 2s, utilisation 80 %, scale up 4 pods or 100 % per 15 s, scale down window 300 s,
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
            stabilization_window=300.0, max_pods=1, period=60.0, max_percent=2.0, release_window=1200.0
        ),
    )
    return replace(spec, **over)  # type: ignore[arg-type]


def spec_at_029d718(max_replicas: int) -> ScalingSpec:
    """The defaults before the simulator: scale down at most 1 pod per 60 s whatever the size."""
    base = default_spec(max_replicas)
    return replace(base, scale_down=replace(base.scale_down, max_percent=None, release_window=None))


def _signals(t: int, prom: Prometheus, predictive: bool, window: int) -> Signals:
    """The reads of ``sluiceway_core.signals.Queries`` over a ``window``-second rate window."""
    q = prom.queue_depth(t)
    if q is None:
        return Signals(queue_depth=None, ok=False, detail="no scrape yet")
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
    )


@dataclass
class OursBuiltin:
    """The operator's builtin engine: the policy on a timer, writing ``spec.replicas`` directly."""

    spec: ScalingSpec
    interval: int = 30
    predictive: bool = False
    name: str = "ours-builtin"
    #: the operator's queries: ``Queries.build(ns, name)``, window 2m
    rate_window: int = 120
    _history: ScaleHistory = field(default_factory=ScaleHistory)
    _last: int | None = None

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        current = pool.target if self._last is None else self._last
        signals = _signals(t, prom, self.predictive, self.rate_window)
        d = desired_replicas(signals, self.spec, current, self._history, float(t))
        self._history = d.history
        self._last = d.replicas
        return d.replicas


@dataclass
class OursKeda:
    """Sluiceway's scaler behind KEDA: each HPA sync reads the scaler's metric (desired replicas,
    AverageValue target 1), then the HPA applies its tolerance and the rendered behaviour."""

    spec: ScalingSpec
    hpa_behavior: HpaBehavior
    interval: int = 15  # HPA sync period; KEDA's metrics server asks the scaler on every read
    predictive: bool = False
    name: str = "ours-keda"
    #: the scaler's ``rateWindow``: its default is 1m (sluiceway_scaler.metadata), the operator
    #: renders none
    rate_window: int = 60
    _history: ScaleHistory = field(default_factory=ScaleHistory)
    _last: int | None = None
    _hpa: Hpa | None = None

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        if self._hpa is None:
            self._hpa = Hpa(self.spec.min_replicas, self.spec.max_replicas, self.hpa_behavior)
        current = pool.target if self._last is None else self._last
        signals = _signals(t, prom, self.predictive, self.rate_window)
        d = desired_replicas(signals, self.spec, current, self._history, float(t))
        self._history = d.history
        self._last = d.replicas
        metric = float(d.replicas)
        ratio = metric / max(1, pool.total)
        raw = pool.target if self._hpa.within_tolerance(ratio) else ceil_div(metric, 1.0)
        return self._hpa.apply(t, pool.target, raw)


def rendered_behavior(spec: ScalingSpec, *, windows_add_up: bool, scaler_paces: bool = True) -> HpaBehavior:
    """The HPA behaviour the operator renders for ``engine: keda``. ``windows_add_up=False`` is the
    rendering at commit 029d718 (the HPA repeats the scaler's 300 s scale-down window, so a drop
    waits for both); ``True`` leaves the scale-down window to the scaler alone.

    ``scaler_paces=True`` leaves the scale-down pace to the scaler as well: the HPA's scale-down
    policy is its default, 100 % per 15 s. The scaler's release (``ScaleDownPolicy.release_window``)
    needs it: an HPA pacing at the spec's 2 % per minute holds the released count back.
    ``False``: the HPA repeats the spec's pace (max(1 pod, 2 %) per 60 s)."""
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
    )


# --------------------------------------------------------------------------------------- peers
@dataclass
class KedaPrometheusQueue:
    """KEDA ``prometheus`` trigger, query = summed queue depth, threshold = target per replica."""

    threshold: float
    min_replicas: int
    max_replicas: int
    interval: int = 15
    name: str = "keda-prometheus"
    _hpa: Hpa | None = None

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        if self._hpa is None:
            self._hpa = Hpa(self.min_replicas, self.max_replicas, None)
        q = prom.queue_depth(t)
        value = 0.0 if q is None else q  # ignoreNullValues: true (KEDA's default)
        ratio = value / (self.threshold * max(1, pool.total))
        raw = pool.target if self._hpa.within_tolerance(ratio) else ceil_div(value, self.threshold)
        return self._hpa.apply(t, pool.target, raw)


@dataclass
class HpaUtilisation:
    """HPA on GPU utilisation (per-pod average over ready pods, DCGM-style 60 s average)."""

    target: float
    min_replicas: int
    max_replicas: int
    interval: int = 15
    name: str = "hpa-utilisation"
    _hpa: Hpa | None = None

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        if self._hpa is None:
            self._hpa = Hpa(self.min_replicas, self.max_replicas, None)
        u = prom.utilisation(t, 60)
        if u is None or pool.ready == 0:
            return None  # no metrics: the HPA keeps the replica count
        ratio = u / self.target
        raw = pool.target if self._hpa.within_tolerance(ratio) else math.ceil(ratio * pool.ready - 1e-9)
        return self._hpa.apply(t, pool.target, raw)


@dataclass
class Kpa:
    """Knative Pod Autoscaler with its defaults; container concurrency = the pod's permits."""

    container_concurrency: int
    min_replicas: int
    max_replicas: int
    interval: int = 2
    name: str = "knative-kpa"
    target_pct: float = 0.7
    stable: int = 60
    panic: int = 6
    panic_threshold: float = 2.0
    max_down_rate: float = 2.0
    _panic_until: float = -1.0
    _panic_max: int = 0

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        tv = max(0.01, self.container_concurrency * self.target_pct)
        stable = prom.concurrency_per_pod(t, self.stable)
        panic = prom.concurrency_per_pod(t, self.panic)
        if stable is None or panic is None:
            return None
        ready = max(1, pool.ready)
        # The KPA averages total concurrency over the window; per-pod x ready approximates it.
        dspc = math.ceil(stable * ready / tv - 1e-9)
        dppc = math.ceil(panic * ready / tv - 1e-9)
        max_up = math.ceil(1000 * ready)
        max_down = math.floor(ready / self.max_down_rate)
        dspc = min(max_up, max(max_down, dspc))
        dppc = min(max_up, max(max_down, dppc))
        if dppc / ready >= self.panic_threshold:
            if self._panic_until < t:
                self._panic_max = pool.target
            self._panic_until = t + self.stable
        if self._panic_until >= t:
            want = max(dspc, dppc, self._panic_max)
            self._panic_max = want
        else:
            want = dspc
        return min(self.max_replicas, max(self.min_replicas, want))


@dataclass
class RayServe:
    """Ray Serve's queue-length policy with its defaults (decisions counted per 0.1 s tick in Ray;
    here per second, with the same delays in seconds)."""

    min_replicas: int
    max_replicas: int
    target_ongoing: float = 2.0
    look_back: int = 30
    metrics_interval: int = 10
    upscale_delay: int = 30
    downscale_delay: int = 600
    interval: int = 1
    name: str = "ray-serve"
    _up: int = 0
    _down: int = 0
    _last_metric: float | None = None
    _last_push: int = -(10**9)

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        if t - self._last_push >= self.metrics_interval:
            self._last_push = t
            self._last_metric = prom.concurrency_per_pod(t, self.look_back)
        if self._last_metric is None or pool.ready == 0:
            return None
        running = pool.ready
        e = self._last_metric * running / (self.target_ongoing * running)
        desired = math.ceil(running * (1 + (e - 1)) - 1e-9)
        desired = min(self.max_replicas, max(self.min_replicas, desired))
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
    """Knows the future: asks, ``lookahead`` seconds early, for the replicas the busiest second of
    the coming interval needs at ``utilisation``."""

    rate: np.ndarray
    model: ServiceModel
    min_replicas: int
    max_replicas: int
    interval: int = 15
    utilisation: float = 0.85
    name: str = "oracle"

    def decide(self, t: int, prom: Prometheus, pool: PodPool) -> int | None:
        ahead = int(self.model.startup.hi) + self.interval
        window = self.rate[t : t + ahead + 1]
        if window.size == 0:
            return None
        need = ceil_div(float(window.max()), self.model.replica_rate * self.utilisation)
        # Keep what is needed now too (pods started early must not be dropped before the peak).
        now_need = ceil_div(float(self.rate[t]), self.model.replica_rate * self.utilisation)
        return min(self.max_replicas, max(self.min_replicas, need, now_need))
