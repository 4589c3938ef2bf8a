"""The one scaling policy: signals + spec + history -> desired replicas.

Shared by the KEDA external scaler (:mod:`sluiceway_scaler.service`) and the operator's built-in
engine. Pure: no I/O, no clock (``now`` is passed in), no mutation (the new history comes back inside
the :class:`Decision`). Safe to call from any thread.

The rule, in order:

1. **Missing data holds.** If the signals are not ``ok`` or the queue depth is unknown, the answer is
   ``current`` (``held=True``). The held value is recorded in the history, so after an outage the
   service still waits a full stabilisation window before it shrinks.
2. **Raw recommendation** = the larger of

   * backlog: ``ceil(queue_depth / target_queue_per_replica)``, and
   * wait: ``ceil(ready * wait_p95 / target_wait_p95)`` (proportional, like an HPA ``Value``
     metric); skipped when there is no wait target or no wait data (no request waited in the
     window: the histogram has no observations);
   * utilisation: ``ceil(ready * utilisation / target_utilisation)``, where ``ready`` is
     ``Signals.ready_replicas`` when known (else ``current``): the pods that produced the
     measurement, as the HPA uses its ready pod count;
   * demand: ``ceil(offered * request_cost / (permits * target_utilisation))`` (Little's law;
     ``request_cost`` is device seconds per answered request). A saturated pod's utilisation
     reads 1 whatever the demand; the offered rate (answered or refused) measures it. It applies
     whenever measured (``sustained_demand``, issue 21; before, only while requests were refused,
     i.e. the offered rate exceeded the completed rate by more than 2 %). While requests are
     refused the backlog term is capped at it: saturated pods hold full queues whatever the
     demand, and counting that as demand overshoots;
   * requests in the pods (``Signals.requests_in_pods``, running + queued, a gauge: the
     concurrency Knative's KPA and KEDA's in-flight triggers scale on):
     ``ceil(in_pods / (permits * target_utilisation))``. It reads the load now and does not fade
     while the load lasts;
   * predictive (only with ``predict_seconds`` set; off by default): the offered rate projected
     ``predict_seconds`` ahead along its trend, over what one replica completes at the target
     utilisation: ``ceil(current * utilisation * projected / completed / target_utilisation)``.
     Used only while the offered rate is rising. ``predict_seconds`` is meant to be the pods'
     start-up time, so capacity asked for now is ready when the load arrives (see docs/scalesim.md).
   * hold (issue 20; ``Signals.held`` > 0, the requests the gateway holds because no ready pod can
     take them, and ``hold_drain_seconds`` set): the pods that drain the held requests within
     ``hold_drain_seconds`` once they serve while serving the requests still arriving at the
     gateway (``edge_rate``), ``ceil((held / drain + edge_rate) x cost / (permits x target))``
     with ``request_cost`` when measured (the demand term needs a serving pod and is silent at
     zero; this one is not); unknown (a service back from zero has served nothing in
     the rate window) each held request counts as a permit held for the whole drain time,
     ``ceil(held / (permits x target))`` (the KPA's reading of the activator's count); permits
     unknown (no pod reports them at zero): 1 a pod. It is a
     count of pods, not an increment: the pods asked for earlier and still starting count toward
     it, so the polls during a start-up ask for more only when the held requests outgrow what the
     pods on their way will drain. It works with no pod scraped (at zero: ``ready_replicas`` 0),
     is exempt from the scale-up step (rule 3), and is **not recorded** in the history: once the
     gateway holds nothing the scale-down window, the shortage hold and the release see only the
     other terms (the held requests are drained; what the pods carry now is measured by the
     requests-in-pods and demand terms). ``Decision.hold`` names its value.

   bounded by ``[min_replicas, max_replicas]``. The history records this bounded recommendation,
   all terms included, and the scale-down window (step 4) holds it, as the HPA's stabilisation
   does: a count raised by a shortage (backlog, wait, requests in the pods) is not given back the
   moment the queue drains into the pods that serve while the new ones still start (issue 21: a
   policy that remembered the load terms only dropped 4 -> 2 in the sandbox e2e, killing starting
   pods, and let a raised count go 1 s into a 10 s window). With load terms (a utilisation
   target), the part of a recorded recommendation above its load terms is held for
   ``shortage_hold`` (90 s: a rate window, a scrape and a sync) only; after that the window holds
   the load terms' part (``HistoryEntry.load``). A shortage over-asks (saturated pods hold full
   queues, 13.75x the pods that serve), which brings the fastest-starting pods early; once the load
   terms have measured the load for a rate window they say what it needs.

   Burst headroom: when the load terms' recommendation (utilisation, demand, prediction; recorded
   apart as ``HistoryEntry.load``) is ``burst_rise`` (25 %, and 2 pods) above the lowest of the
   ``burst_span`` (180 s) before it, the load has jumped (``ScaleHistory.jumped_at``);
   for ``burst_memory`` (20 min) the load terms size for ``burst_utilisation`` (0.7) instead of
   ``target_utilisation``, so the next step finds room while its pods start.
3. **Fast up.** Above ``current`` the recommendation applies at once (the scale-up window is 0),
   limited only by an optional step: at most ``max(current + max_pods, current * (1 + max_percent))``.
   While pods asked for earlier are still starting (``ready_replicas < current``), the step is
   taken from the ready count instead, and never lowers ``current``: a backlog that capacity already
   on its way will absorb is not paid for again on every poll (the simulator showed that without
   this the fleet overshoots to ``max_replicas`` when pods take minutes to start). The measured
   load (the demand and requests-in-pods terms) is exempt: a flash crowd gets what it needs at once.
4. **Slow down.** Below ``current`` the answer is the highest recommendation seen within the last
   ``stabilization_window`` seconds (HPA semantics; as held by step 2), and it may not drop more than
   ``max(max_pods, max_percent %)`` below the highest replica count decided within the last
   ``period`` seconds.
5. **Release.** When every recommendation of the last ``release_window`` seconds (default 20 min)
   is below ``current``, the pace of step 4 no longer holds the count above the highest of them: a
   surplus that outlasted the window (the tail of a flash crowd) goes at once, while a lull shorter
   than it (between bursts) keeps its capacity. Held decisions record ``current``, so an outage
   postpones the release by a full window; a history shorter than the window (a restarted scaler)
   never releases. With load terms, the release window holds only while the load has come back:
   when the load terms jump back to a level within a jump of one they had before the lull they
   rose from (``ScaleHistory.returned_at``), for ``recur_memory`` (1 h); otherwise it is
   ``max(stabilization_window + period, shortage_hold)``, so a surplus the load never asks for
   again (a flash crowd's) goes once the window has passed it. ``release_window=None`` still turns
   every release off; the window and the pace stay what the spec says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

__all__ = [
    "Decision",
    "HistoryEntry",
    "ScaleDownPolicy",
    "ScaleHistory",
    "ScaleUpPolicy",
    "ScalingSpec",
    "Signals",
    "desired_replicas",
]

# Slack for float noise before ceil(): 2.0000000001 pods is 2 pods.
_EPS = 1e-9


@dataclass(frozen=True)
class Signals:
    """What the service looks like now, over all its pods.

    ``ok=False`` means the data could not be read (source down, empty or NaN result). ``None`` in a
    field means that signal is unknown. ``wait_p95=None`` with ``ok=True`` means no request waited in
    the window (the quantile is undefined), which the policy treats as "no wait signal".
    """

    queue_depth: float | None
    wait_p95: float | None = None
    arrival_rate: float | None = None
    completion_rate: float | None = None
    #: Busy share of the GPU permits over the rate window (device-seconds per second / permits).
    utilisation: float | None = None
    #: Requests offered per second (admitted or not) and its slope in requests/s per second.
    offered_rate: float | None = None
    offered_trend: float | None = None
    #: Device seconds per answered request, and GPU permits per pod (for the demand term).
    request_cost: float | None = None
    permits: int | None = None
    #: Pods that serve (scraped and up). Below the current replica count, pods are still starting.
    ready_replicas: int | None = None
    #: Requests in the pods, running and queued, summed over the pods (None: not read): the
    #: concurrency that Knative's KPA and KEDA's in-flight triggers scale on.
    requests_in_pods: float | None = None
    #: The same now, an instant sample (None: not read). Where ``requests_in_pods`` is a window
    #: average (the KEDA scaler's ``Queries.requests_in_pods_avg``), the term takes this instead
    #: when it is above the average by more than twice its Poisson noise (``now - 2 sqrt(now) >
    #: average``): a clump of arrivals at a few requests in flight stays within the noise and leaves
    #: the average in charge (4 over 1.25: 4 - 4 = 0), a crowd of hundreds does not wait for the
    #: average to catch up.
    requests_in_pods_now: float | None = None
    #: Requests the gateway holds (no ready pod can take them), summed over its replicas (issue 20;
    #: None: not read, or no gateway).
    held: float | None = None
    #: Requests per second arriving at the gateway, held or sent to a pod (its answers' rate plus the
    #: held count's growth; None: not read): the flow the hold term serves while it drains.
    edge_rate: float | None = None
    #: Requests the gateway refused for want of a pod within the rate window (the scaler's
    #: activation reads it; the policy does not). None: not read.
    refused_no_pod: float | None = None
    #: Pods that have been ready since their start (serving, or draining): unlike
    #: ``ready_replicas`` (``sum(up == 1)``) it leaves out the pods that are scraped while their
    #: model still loads (``Queries.pods_ready``; None: not read).
    pods_ready: int | None = None
    #: The pods' measured start-up in seconds, from their process start to ready
    #: (``Queries.startup_seconds``: the median over the pods of their start phases; None: not read,
    #: or no pod has reported a whole start).
    startup_seconds: float | None = None
    ok: bool = True
    detail: str = ""


@dataclass(frozen=True)
class ScaleUpPolicy:
    """Scale-up limit per decision. Both ``None``: unlimited (jump straight to the recommendation)."""

    max_pods: int | None = None
    max_percent: float | None = None


@dataclass(frozen=True)
class ScaleDownPolicy:
    """Scale-down stabilisation: window in seconds, and per ``period`` at most ``max_pods`` removed
    or ``max_percent`` of the replicas, whichever allows more (like an HPA ``selectPolicy: Max``).
    Both ``None``: no rate limit.

    ``release_window`` (seconds, ``None``: off): once every recommendation of that long window is
    below the replica count, the rate limit no longer holds the count above the highest of them.
    Short lulls between bursts keep their capacity (the rate limit); a surplus that has lasted the
    whole release window is released at once, like Ray Serve's downscale delay. No effect unless it
    is longer than ``stabilization_window``, nor before the history spans it."""

    #: 90 s: the scaler's rate window (1 min) plus a scrape (15 s) and an HPA sync (15 s), the
    #: shortest window in which the load terms have measured the load (``shortage_hold``); the
    #: HPA's and the CRD's 300 s held a flash crowd's decline for five minutes (the KPA, with a
    #: 60 s stable window, dominated ours on flash; docs/scalesim.md, issue 21)
    stabilization_window: float = 90.0
    max_pods: int | None = None
    period: float = 60.0
    max_percent: float | None = None
    #: 20 min: longer than the gaps between bursts that should keep their capacity (the
    #: simulator's on/off trace: 15 min), chosen with bench/scalesim/grid.py (docs/scalesim.md)
    release_window: float | None = 1200.0


@dataclass(frozen=True)
class ScalingSpec:
    min_replicas: int
    max_replicas: int
    target_queue_per_replica: float | None = None
    target_wait_p95: float | None = None
    #: Keep the permits this busy (0..1]. Holds replicas under steady load, where the queue reads ~0.
    target_utilisation: float | None = None
    #: Predictive term: project the offered rate this many seconds ahead (None: off).
    predict_seconds: float | None = None
    #: The demand term applies whenever it is measured, not only while requests are refused
    #: (issue 21). False: the rule before it.
    sustained_demand: bool = True
    #: Burst headroom (issue 21): while the load has jumped recently (a recorded load
    #: recommendation ``burst_rise`` above the lowest of the ``burst_span`` seconds before it, within
    #: the last ``burst_memory`` seconds), the load terms size for this utilisation instead of
    #: ``target_utilisation``: a load that steps is given the room a step needs while the next pods
    #: start (Knative's 70 % target, but only where the load has shown it jumps). None: off, the
    #: default since issue 21's last revision: on, it sits on the KPA's frontier (more on time on
    #: stairs and on/off at more GPU-hours) and the KPA dominated it on short stairs or short flash
    #: at some sizes and seeds (docs/scalesim.md, "Against the goal"); 0.7 turns it on.
    burst_utilisation: float | None = None
    burst_rise: float = 0.25
    #: about the pods' start-up: a rise slower than this is met by scaling, not by headroom
    burst_span: float = 180.0
    burst_memory: float = 1200.0
    #: Shortage hold (issue 21): with load terms (a utilisation target), the part of a
    #: recommendation above them (raised by a shortage: backlog, wait, requests in the pods) is held
    #: by the scale-down window for this many seconds only, then the load terms carry the count.
    #: Long enough for a rate window (1-2 min) plus a scrape to measure the load that raised it.
    #: None: held for the whole window (the rule before).
    shortage_hold: float | None = 90.0
    #: Recurrence (issue 21): with load terms, the scale-down pace and the release window hold a
    #: surplus through a lull only while the load has come back to a level it had left, within this
    #: many seconds (``ScaleHistory.returned_at``); otherwise the surplus goes after the scale-down
    #: window. None: always hold (the rule before).
    recur_memory: float | None = 3600.0
    #: Hold term (issue 20): size the pods that drain the gateway's held requests within this many
    #: seconds of serving (the time a held request has left once a pod serves: the hold's deadline
    #: less a start-up). None: off (the held count is ignored, as before).
    hold_drain_seconds: float | None = 60.0
    #: Start-up (issue 20/22): pods still starting count as capacity that arrives at their predicted
    #: ready time (asked for + ``Signals.startup_seconds``); the shortage terms ask for no more
    #: than the current count while the pods serving and those on their way drain the backlog before
    #: a pod asked for now could serve (``_arriving``). Off by default: in the simulator it saves
    #: GPU-hours where a load returns (on/off) and costs on-time share where it keeps rising (the
    #: pods' own start phases leave out scheduling and image pull; docs/scalesim.md).
    count_starting: bool = False
    scale_up: ScaleUpPolicy = field(default_factory=ScaleUpPolicy)
    scale_down: ScaleDownPolicy = field(default_factory=ScaleDownPolicy)

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ValueError("min_replicas must be >= 0")
        if self.max_replicas < max(1, self.min_replicas):
            raise ValueError("max_replicas must be >= max(1, min_replicas)")
        if self.target_queue_per_replica is None and self.target_wait_p95 is None:
            raise ValueError("set target_queue_per_replica and/or target_wait_p95")
        if self.target_queue_per_replica is not None and not self.target_queue_per_replica > 0:
            raise ValueError("target_queue_per_replica must be > 0")
        if self.target_wait_p95 is not None and not self.target_wait_p95 > 0:
            raise ValueError("target_wait_p95 must be > 0")
        if self.target_utilisation is not None and not 0 < self.target_utilisation <= 1:
            raise ValueError("target_utilisation must be within (0, 1]")
        if self.burst_utilisation is not None and not 0 < self.burst_utilisation <= 1:
            raise ValueError("burst_utilisation must be within (0, 1]")
        if not self.burst_rise > 0 or not self.burst_span > 0 or not self.burst_memory > 0:
            raise ValueError("burst_rise, burst_span and burst_memory must be > 0")
        if self.shortage_hold is not None and not self.shortage_hold >= 0:
            raise ValueError("shortage_hold must be >= 0")
        if self.recur_memory is not None and not self.recur_memory > 0:
            raise ValueError("recur_memory must be > 0")
        if self.predict_seconds is not None and not self.predict_seconds > 0:
            raise ValueError("predict_seconds must be > 0")
        if self.hold_drain_seconds is not None and not self.hold_drain_seconds > 0:
            raise ValueError("hold_drain_seconds must be > 0")
        up, down = self.scale_up, self.scale_down
        if up.max_pods is not None and up.max_pods < 1:
            raise ValueError("scale_up.max_pods must be >= 1")
        if up.max_percent is not None and not up.max_percent > 0:
            raise ValueError("scale_up.max_percent must be > 0")
        if down.stabilization_window < 0:
            raise ValueError("scale_down.stabilization_window must be >= 0")
        if down.max_pods is not None and down.max_pods < 1:
            raise ValueError("scale_down.max_pods must be >= 1")
        if down.max_percent is not None and not 0 < down.max_percent <= 100:
            raise ValueError("scale_down.max_percent must be within (0, 100]")
        if not down.period > 0:
            raise ValueError("scale_down.period must be > 0")
        if down.release_window is not None and not down.release_window > 0:
            raise ValueError("scale_down.release_window must be > 0")


@dataclass(frozen=True)
class HistoryEntry:
    at: float
    recommendation: int
    replicas: int
    #: the load terms' recommendation (utilisation, demand, prediction), for the burst headroom's
    #: jump detection; None: not recorded (then ``recommendation`` stands in)
    load: int | None = None


@dataclass(frozen=True)
class ScaleHistory:
    """Recent recommendations and decisions, oldest first. Only entries the policy still needs."""

    entries: tuple[HistoryEntry, ...] = ()
    #: when the recorded load last jumped (``ScalingSpec.burst_rise`` within ``burst_span``); None: not seen
    jumped_at: float | None = None
    #: when the load last jumped back to a level it had held before a lull (``ScalingSpec.recur_memory``)
    returned_at: float | None = None

    def recorded(
        self,
        entry: HistoryEntry,
        keep_seconds: float,
        jumped_at: float | None = None,
        returned_at: float | None = None,
    ) -> ScaleHistory:
        horizon = entry.at - keep_seconds
        kept = tuple(e for e in self.entries if e.at >= horizon)
        return ScaleHistory(
            (*kept, entry),
            self.jumped_at if jumped_at is None else jumped_at,
            self.returned_at if returned_at is None else returned_at,
        )


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str
    raw_recommendation: int
    held: bool
    history: ScaleHistory
    #: the hold term's pods when it applied (gateway-held requests), else None
    hold: int | None = None


def _ceil(x: float) -> int:
    return math.ceil(x - _EPS) if x > 0 else 0


def _raw(
    signals: Signals, spec: ScalingSpec, current: int, arriving: str | None = None
) -> tuple[int, str, int | None, int]:
    """The raw recommendation, its explanation, the measured load's value (demand or requests in
    the pods; None: n/a) and the load terms' recommendation (utilisation, demand, prediction; the
    raw recommendation when there are none), which the burst headroom watches for jumps.
    ``arriving``: the pods on their way drain the backlog before a new pod could serve
    (:func:`_arriving`, its explanation): the shortage terms are capped at ``current``."""
    parts: list[tuple[int, str]] = []  # shortage terms
    load_parts: list[tuple[int, str]] = []
    assert signals.queue_depth is not None
    # The proportional terms scale the pods that produced the measurement: the ready ones when
    # known (like the HPA's readyPodCount). Multiplying by ``current`` while pods are still
    # starting would compound the same measurement on every poll.
    serving = current if signals.ready_replicas is None else min(current, signals.ready_replicas)
    demand = _demand(signals, spec, serving)
    if spec.target_queue_per_replica is not None:
        n = _ceil(max(0.0, signals.queue_depth) / spec.target_queue_per_replica)
        target = spec.target_queue_per_replica
        text = f"backlog {signals.queue_depth:g}/{target:g} per replica -> {n}"
        if demand is not None and demand[2] and n > demand[0]:
            # Saturated pods hold a full queue whatever the demand; when the demand is measured,
            # the backlog asks for no more than it (the new capacity drains the queue).
            n = demand[0]
            text += f", capped at the measured demand {n}"
        parts.append((n, text))
    if spec.target_wait_p95 is not None and signals.wait_p95 is not None:
        base = max(serving, 1)
        n = _ceil(base * max(0.0, signals.wait_p95) / spec.target_wait_p95)
        parts.append((n, f"wait p95 {signals.wait_p95:.3g}s vs {spec.target_wait_p95:g}s x {base} -> {n}"))
    if spec.target_utilisation is not None and signals.utilisation is not None and serving > 0:
        u = max(0.0, signals.utilisation)
        n = _ceil(serving * u / spec.target_utilisation)
        load_parts.append((n, f"utilisation {u:.2f} vs {spec.target_utilisation:.2f} x {serving} -> {n}"))
    in_pods = _in_pods(signals, spec)
    if in_pods is not None:
        parts.append(in_pods)
    if arriving is not None and any(n > current for n, _ in parts):
        parts = [(min(n, current), text + (f", capped at {current}: {arriving}" if n > current else ""))
                 for n, text in parts]
        in_pods = (min(in_pods[0], current), in_pods[1]) if in_pods is not None else None
    if demand is not None:
        load_parts.append((demand[0], demand[1]))
    predicted = _predicted(signals, spec, serving)
    if predicted is not None:
        load_parts.append(predicted)
    parts += load_parts
    if not parts:
        return 0, "no wait observed and no backlog target", None, 0
    best = max(parts, key=lambda p: p[0])
    # The load terms alone: a jump of the load (burst headroom) is a rise of these, not a queue.
    load = [n for n, _ in load_parts]
    settled = max(load) if load else best[0]
    # The measured load (demand and requests in the pods) is exempt from the scale-up step taken
    # from the ready pods (rule 3): it is what the service needs now, not a backlog to be paid again.
    measured = [x[0] for x in (demand, in_pods) if x is not None]
    return best[0], "; ".join(p[1] for p in parts), max(measured) if measured else None, settled


def _demand(signals: Signals, spec: ScalingSpec, serving: int) -> tuple[int, str, bool] | None:
    """The demand term: the replicas the offered rate needs at the target utilisation (Little's
    law: busy permits = offered rate x device seconds per request), and whether requests are being
    refused now (offered above completed by more than 2 %). With ``spec.sustained_demand`` off it
    applies only while refused. None when off (no utilisation target) or not applicable."""
    if spec.target_utilisation is None or serving <= 0:
        return None
    offered, cost, permits = signals.offered_rate, signals.request_cost, signals.permits
    done = signals.completion_rate if signals.completion_rate is not None else signals.arrival_rate
    if offered is None or cost is None or permits is None or done is None or cost <= 0 or permits <= 0:
        return None
    refusing = offered > done * 1.02
    if not refusing and not spec.sustained_demand:
        return None
    n = _ceil(offered * cost / (permits * spec.target_utilisation))
    tu = spec.target_utilisation
    return n, f"demand {offered:.3g}/s offered x {cost:.3g}s / ({permits} permits x {tu:.2f}) -> {n}", refusing


def _in_pods(signals: Signals, spec: ScalingSpec) -> tuple[int, str] | None:
    """The concurrency term: the replicas that hold the requests in the pods (running and queued)
    at the target utilisation of their permits, ``ceil(in_pods / (permits x target))``. It reads
    the load now (a gauge, not a rate over a window) and does not fade while the load lasts, unlike
    the backlog and wait terms once new capacity has absorbed the queue. None when off or unknown."""
    tu, permits, n_in = spec.target_utilisation, signals.permits, signals.requests_in_pods
    if tu is None or permits is None or permits <= 0 or n_in is None or not spec.sustained_demand:
        return None
    n_in = max(0.0, n_in)
    now = signals.requests_in_pods_now
    how = ""
    if now is not None and now > 0 and now - 2 * math.sqrt(now) > n_in:
        how = f" (now, above the window's average {n_in:.4g} by more than twice its noise)"
        n_in = now
    n = _ceil(n_in / (permits * tu))
    return n, f"{n_in:.4g} requests in the pods{how} / ({permits} permits x {tu:.2f}) -> {n}"


def _asked_at(history: ScaleHistory, current: int, now: float) -> list[float]:
    """When each of the ``current`` pods was asked for, oldest first, as the recorded decisions
    show it: a rise adds pods asked for at its time, a fall takes away the newest (a Deployment
    scales down the pods not ready first, the newest). Pods from before the history (or all of
    them, with none) count as asked for at its first entry (``now`` without one): late, so they
    are credited with no more than the history shows."""
    entries = history.entries
    stack: list[float] = [entries[0].at] * entries[0].replicas if entries else []
    for e in entries[1:]:
        if e.replicas > len(stack):
            stack += [e.at] * (e.replicas - len(stack))
        else:
            del stack[e.replicas:]
    first = entries[0].at if entries else now
    if current > len(stack):
        stack = [first] * (current - len(stack)) + stack
    return stack[len(stack) - current:] if current else []


def _arriving(
    signals: Signals, spec: ScalingSpec, current: int, history: ScaleHistory, now: float
) -> str | None:
    """Whether the pods serving and the pods still starting drain the backlog before a pod asked
    for now could serve (its explanation), else None.

    With ``S`` the measured start-up (``Signals.startup_seconds``), ``r`` the pods ready
    (``Signals.pods_ready``, else ``ready_replicas``), the newest ``current - r`` pods asked for
    (:func:`_asked_at`) still starting, each predicted ready at its asked time + ``S``, and ``mu``
    = permits / request cost what one serving pod completes per second: the backlog (queued in the
    pods and held at the gateway) at ``now + S``, when a new pod could first serve, is
    ``B + (offered - r x mu) x S - mu x sum(now - asked)`` over the starting pods still within
    their prediction (each serves from its predicted ready time until ``now + S``). The backlog's
    slope only falls as pods arrive, so when this is <= 0 the backlog is gone by then and stays
    gone: a pod asked for now would come too late to drain it. A pod past its prediction (late,
    failing) is credited with nothing, as if it came no sooner than a new one. None when off,
    nothing starts, or the start-up, the cost, the permits or the offered rate is unknown."""
    S, cost, permits, offered = signals.startup_seconds, signals.request_cost, signals.permits, signals.offered_rate
    ready = signals.pods_ready if signals.pods_ready is not None else signals.ready_replicas
    if not spec.count_starting or ready is None or current - ready <= 0 or signals.queue_depth is None:
        return None
    if S is None or cost is None or permits is None or offered is None or not (S > 0 and cost > 0 and permits > 0):
        return None
    mu = permits / cost
    if max(0.0, offered) > ready * mu * (spec.target_utilisation or 1.0):
        # the ready pods fall behind the flow: the backlog grows until the starting pods serve, by
        # as much more as they are late, and their scheduling and image pull are not in ``S``
        return None
    starting = _asked_at(history, current, now)[max(0, ready):]
    credit = sum(now - at for at in starting if at + S > now)
    backlog = max(0.0, signals.queue_depth) + max(0.0, signals.held or 0.0)
    left = backlog + (max(0.0, offered) - ready * mu) * S - mu * credit
    if left > 0:
        return None
    on_time = sum(1 for at in starting if at + S > now)
    return (
        f"{len(starting)} pods starting ({on_time} within the {S:.3g}s start-up) and {ready} ready drain "
        f"{backlog:.4g} queued at {offered:.3g}/s before a pod asked now could serve"
    )


def _hold(signals: Signals, spec: ScalingSpec) -> tuple[int, str] | None:
    """The hold term (module docstring): the pods that drain the gateway's held requests within
    ``hold_drain_seconds`` at the target utilisation (permits unknown: 1 a pod). None when off or
    nothing held."""
    drain, held = spec.hold_drain_seconds, signals.held
    if drain is None or held is None or not held > 0:
        return None
    # at zero no pod reports its permits: one a pod (the most pods for the held requests)
    permits = signals.permits if signals.permits is not None and signals.permits > 0 else 1
    tu = spec.target_utilisation or 1.0
    cost = signals.request_cost
    if cost is not None and cost > 0:
        # busy permits: the held requests over the drain time (a request longer than it holds a
        # permit for all of it) plus the flow arriving meanwhile (Little's law, as the demand term)
        flow = max(0.0, signals.edge_rate or 0.0)
        n = _ceil((held / drain + flow) * min(cost, drain) / (permits * tu))
        how = f"{cost:.3g}s each, {flow:.3g}/s arriving"
    else:
        n = _ceil(held / (permits * tu))
        how = "cost unknown: a permit each"
    return n, f"hold {held:.4g} held at the gateway, drained in {drain:g}s ({how}) -> {n}"


def _predicted(signals: Signals, spec: ScalingSpec, current: int) -> tuple[int, str] | None:
    """The predictive term (module docstring), or None when off or not applicable."""
    if spec.predict_seconds is None or current <= 0:
        return None
    u, offered, trend, done = signals.utilisation, signals.offered_rate, signals.offered_trend, signals.arrival_rate
    if u is None or offered is None or trend is None or done is None or trend <= 0 or done <= 0 or u <= 0:
        return None
    projected = offered + trend * spec.predict_seconds
    target = spec.target_utilisation or 1.0
    n = _ceil(current * u * projected / done / target)
    return n, f"offered {offered:.3g}/s rising {trend:.3g}/s^2 -> {projected:.3g}/s in {spec.predict_seconds:g}s -> {n}"


def _release_window(down: ScaleDownPolicy, recurring: bool = True, hold: float | None = None) -> float | None:
    """The release window when it applies: it needs a pace to lift and must be longer than the
    stabilisation window. Without recurrence (``ScalingSpec.recur_memory``) it is the stabilisation
    window plus one period, and no shorter than the shortage hold: the surplus goes once the window
    has passed it and the load terms have measured the load."""
    paced = down.max_pods is not None or down.max_percent is not None
    window = down.release_window
    if paced and window is not None and not recurring:
        return min(window, max(down.stabilization_window + down.period, hold or 0.0))
    return window if paced and window is not None and window > down.stabilization_window else None


def _released(
    history: ScaleHistory,
    down: ScaleDownPolicy,
    now: float,
    bounded: int,
    held: list[int],
    recurring: bool,
    hold: float | None,
) -> int | None:
    """The highest (held) recommendation of the release window, or None when the release does not
    apply or the history does not yet span the window (a restarted scaler must not release at once)."""
    window = _release_window(down, recurring, hold)
    if window is None or not history.entries:
        return None
    start = now - window
    if history.entries[0].at > start:
        return None
    return max([bounded, *(h for e, h in zip(history.entries, held, strict=True) if e.at >= start)])


def _held(history: ScaleHistory, spec: ScalingSpec, now: float) -> list[int]:
    """What each recorded decision still asks the scale-down window to hold: its whole
    recommendation, or, once older than ``shortage_hold`` and where the load terms were recorded
    (a utilisation target), only the load terms' part (``HistoryEntry.load``)."""
    hold = spec.shortage_hold
    if hold is None or spec.target_utilisation is None:
        return [e.recommendation for e in history.entries]
    return [
        e.recommendation if e.load is None or now - e.at <= hold else min(e.recommendation, e.load)
        for e in history.entries
    ]


def _recurring(history: ScaleHistory, spec: ScalingSpec, now: float) -> bool:
    """Whether the pace and the release window may hold a surplus through a lull: always without
    load terms or with ``recur_memory`` off; else only while the load came back within the memory."""
    if spec.recur_memory is None or spec.target_utilisation is None:
        return True
    return history.returned_at is not None and now - history.returned_at <= spec.recur_memory


def _returns(history: ScaleHistory, spec: ScalingSpec, now: float, recorded: int) -> bool:
    """Whether a jump of the load (``_jumps``) came back to a level the load had before its lull:
    a load recommendation at least ``recorded / (1 + burst_rise)`` recorded before the lowest
    point of the ``burst_span`` that the jump rose from."""
    start = now - spec.burst_span
    span = [(e.load if e.load is not None else e.recommendation, e.at) for e in history.entries if e.at >= start]
    if not span:
        return False
    low, low_at = min(span, key=lambda x: (x[0], -x[1]))
    before = [e.load if e.load is not None else e.recommendation for e in history.entries if e.at < low_at]
    return bool(before) and max(before) * (1 + spec.burst_rise) >= recorded > low


def _bursting(history: ScaleHistory, spec: ScalingSpec, now: float) -> bool:
    """Whether the burst headroom applies: on, a utilisation target below it, and a jump of the
    recorded load within the last ``burst_memory`` seconds."""
    if spec.burst_utilisation is None or spec.target_utilisation is None:
        return False
    if spec.burst_utilisation >= spec.target_utilisation or history.jumped_at is None:
        return False
    return now - history.jumped_at <= spec.burst_memory


def _jumps(history: ScaleHistory, spec: ScalingSpec, now: float, recorded: int) -> bool:
    """Whether the load recommendation recorded now is a jump: at least ``burst_rise`` (and two
    pods, so that 1 <-> 2 at a trickle is no jump) above the lowest recorded in the
    ``burst_span`` seconds before it."""
    if spec.target_utilisation is None:
        return False
    start = now - spec.burst_span
    lows = [e.recommendation if e.load is None else e.load for e in history.entries if e.at >= start]
    if not lows:
        return False
    low = min(lows)
    return recorded >= low * (1 + spec.burst_rise) and recorded - low >= 2


def desired_replicas(
    signals: Signals, spec: ScalingSpec, current: int, history: ScaleHistory, now: float
) -> Decision:
    """Decide the replica count. See the module docstring for the rule."""
    if current < 0:
        raise ValueError("current must be >= 0")
    down = spec.scale_down
    keep = max(down.stabilization_window, down.period)
    if spec.burst_utilisation is not None:
        keep = max(keep, spec.burst_span)
    release = _release_window(down)
    if spec.recur_memory is not None and spec.target_utilisation is not None:
        # the history must show the level the load had before a lull, a release window back
        keep = max(keep, down.release_window or 0.0, spec.burst_span)
    if release is not None:
        # one entry older than the release window must stay, to show the history spans it
        keep = max(keep, release + down.period)

    if not signals.ok or signals.queue_depth is None or math.isnan(signals.queue_depth):
        why = signals.detail or "signals missing"
        entry = HistoryEntry(now, current, current)
        return Decision(current, f"held at {current}: {why}", current, True, history.recorded(entry, keep))

    burst = _bursting(history, spec, now)
    sized = spec
    if burst:
        assert spec.burst_utilisation is not None and spec.target_utilisation is not None
        sized = replace(spec, target_utilisation=spec.burst_utilisation)
    arriving = _arriving(signals, spec, current, history, now)
    raw, why, demand, settled = _raw(signals, sized, current, arriving)
    if burst:
        why += f"; the load jumped at {history.jumped_at:g}s: sized for {spec.burst_utilisation:.2f} utilisation"
    bounded = min(spec.max_replicas, max(spec.min_replicas, raw))
    load_rec = min(spec.max_replicas, max(spec.min_replicas, settled))
    if bounded != raw:
        why += f"; bounded to [{spec.min_replicas}, {spec.max_replicas}] -> {bounded}"
    # The hold term applies now and is not recorded (module docstring): ``asked`` is this decision's
    # recommendation, ``bounded`` the one the history keeps.
    hold = _hold(signals, spec)
    asked = bounded
    held_pods: int | None = None
    if hold is not None:
        held_pods = hold[0]
        why += f"; {hold[1]}"
        if hold[0] > raw:
            asked = min(spec.max_replicas, max(spec.min_replicas, hold[0]))
            why += f" (not recorded) -> {asked}"
            demand = max(demand or 0, asked)  # measured now: exempt from the step (rule 3)

    if asked > current:
        replicas = asked
        up = spec.scale_up
        limits = []
        if up.max_pods is not None:
            limits.append(current + up.max_pods)
        if up.max_percent is not None:
            limits.append(math.ceil(current * (1 + up.max_percent / 100.0)))
        ready = signals.ready_replicas
        if ready is not None and ready < current:
            # Pods asked for earlier are still starting: step from the replicas that serve, so the
            # same backlog is not paid for again every poll while capacity is on its way.
            base = max(1, ready)
            limits = [base + up.max_pods] if up.max_pods is not None else []
            if up.max_percent is not None:
                limits.append(math.ceil(base * (1 + up.max_percent / 100.0)))
            if not limits:
                limits = [2 * base]
            # ... except up to the measured demand: a flash crowd must not wait for pods to start
            # before the next step is asked for.
            cap = max(*limits, min(demand or 0, replicas))
            if replicas > cap:
                replicas = max(cap, current)
                why += f"; {current - ready} pods still starting: step from {ready} ready -> {replicas}"
        elif limits:
            step_cap = max(max(limits), current + 1, min(held_pods or 0, replicas))
            if replicas > step_cap:
                replicas = step_cap
                why += f"; scale-up step limited to {replicas}"
    elif asked < current:
        held = _held(history, spec, now)
        recurring = _recurring(history, spec, now)
        window_start = now - spec.scale_down.stabilization_window
        seen = [h for e, h in zip(history.entries, held, strict=True) if e.at >= window_start]
        replicas = max([asked, *seen])
        if replicas > asked:
            why += f"; stabilised at {replicas} (highest in {spec.scale_down.stabilization_window:g}s)"
        if down.max_pods is not None or down.max_percent is not None:
            period_start = now - down.period
            recent = [e.replicas for e in history.entries if e.at >= period_start]
            top = max([current, *recent])
            allowed = max(
                down.max_pods or 0,
                math.floor(top * down.max_percent / 100.0) if down.max_percent is not None else 0,
                1,
            )
            floor = top - allowed
            released = _released(history, down, now, asked, held, recurring, spec.shortage_hold)
            if replicas < floor and released is not None and released < floor:
                replicas = max(replicas, released)
                window = _release_window(down, recurring, spec.shortage_hold)
                note = "" if recurring else " (the load has not come back after a lull)"
                why += f"; highest recommendation in {window:g}s is {released}{note}: released to {replicas}"
            elif replicas < floor:
                replicas = floor
                why += f"; scale-down limited to {allowed} pods per {down.period:g}s -> {replicas}"
        # Bounds win over stabilisation: never above max even if the history says so.
        replicas = min(spec.max_replicas, max(spec.min_replicas, min(replicas, current)))
    else:
        replicas = asked

    entry = HistoryEntry(now, bounded, replicas, load_rec)
    rose = _jumps(history, spec, now, load_rec)
    jumped = now if rose and spec.burst_utilisation is not None else None
    returned = now if rose and spec.recur_memory is not None and _returns(history, spec, now, load_rec) else None
    return Decision(replicas, why, raw, False, history.recorded(entry, keep, jumped, returned), held_pods)
