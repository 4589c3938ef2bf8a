"""The PromQL that reads one InferenceService's signals: one definition for the scaler, the
planner, the operator's status and builtin engine, and the rendered KEDA ``prometheus`` triggers.

Every series is selected by the labels the scrape config sets on an InferenceService's pods:
``namespace="<ns>", inferenceservice="<name>"``. The gateway's series (issue 20: ``held``,
``refused_no_pod``) are selected by the same labels and by their ``sluiceway_gateway_*`` names: its
pods carry the InferenceService's label (``sluiceway.io/inferenceservice``), and its scrape job
relabels them as the pods' job does, adding ``component="gateway"``; the queries that count
targets (``up``) leave that component out, so the gateway's replicas never count as pods.
Pure: builds strings, runs nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import metric_names as m
from .units import format_duration

__all__ = ["GATEWAY_COMPONENT", "Queries", "average_step", "selector", "starting_bound"]

#: A pod loading longer than this many times the measured start-up, plus a minute, no longer counts
#: as starting (:func:`starting_bound`).
STARTING_BOUND_FACTOR = 3.0
STARTING_BOUND_SLACK = 60.0


def starting_bound(startup_seconds: float | None) -> float | None:
    """How long a pod may load before the activation stops counting it as starting: three times the
    pods' measured start-up (``Queries.startup_seconds``, the median of their own phases) plus a
    minute (the scheduling and image pull those phases leave out). ``None`` when the start-up is
    unknown (no pod has been ready): no bound, only the crash-loop rule."""
    if startup_seconds is None or not (0 < startup_seconds < float("inf")):
        return None
    return STARTING_BOUND_FACTOR * startup_seconds + STARTING_BOUND_SLACK

_LABEL_VALUE_BAD = ('"', "\\", "\n")


#: The label the gateway's scrape job sets on its targets (docs/autoscaling.md, "Scale to zero").
GATEWAY_COMPONENT = 'component="gateway"'


#: PromQL's duration units (``model.ParseDuration``): a window may be ``1d`` or ``1h30m``.
_PROM_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
_PROM_DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")
_PROM_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


def average_step(window: str) -> str:
    """The resolution of the window averages (``Queries.requests_in_pods_avg``): a twelfth of the
    window, at least 1 s, so a 1m window is averaged over 12 points (5 s apart: every 15 s scrape
    seen three times, a 2 s scrape every other time) and a 5s window over 5. An explicit step: a
    subquery without one takes the global ``evaluation_interval`` (1m by default), which would
    average a 1m window over one point. Raises ValueError on a window that is not a duration."""
    if not _PROM_DURATION.match(window):
        raise ValueError(f"window must be a PromQL duration like 1m or 1h30m, got {window!r}")
    seconds = sum(int(n) * _PROM_UNITS[u] for n, u in _PROM_PART.findall(window))
    if not seconds > 0:
        raise ValueError(f"window must be positive, got {window!r}")
    return format_duration(max(1.0, round(seconds / 12)))


def selector(namespace: str, inference_service: str) -> str:
    """The label matchers of one service. Raises ValueError on characters PromQL would misread."""
    for v in (namespace, inference_service):
        if any(c in v for c in _LABEL_VALUE_BAD):
            raise ValueError(f"label value must not contain quotes, backslashes or newlines: {v!r}")
    return f'namespace="{namespace}",inferenceservice="{inference_service}"'


@dataclass(frozen=True)
class Queries:
    """The PromQL read for one InferenceService over one rate window."""

    queue_depth: str
    wait_p95: str
    arrival_rate: str
    completion_rate: str
    pods_up: str
    service_time: str
    concurrency: str
    utilisation: str
    memory_bound: str = ""
    # service-wide tenant quotas (issue 11), one series per tenant label
    tenant_admitted_rate: str = ""
    tenant_rate_limited_rate: str = ""
    tenant_quota_share: str = ""
    quota_fallback_pods: str = ""
    offered_rate: str = ""
    request_cost: str = ""
    #: Requests in the pods, running and queued, summed (issue 21: the policy's concurrency term).
    requests_in_pods: str = ""
    #: The same averaged over the rate window (issue 21: what the KEDA scaler reads into
    #: ``Signals.requests_in_pods``): a clump of arrivals at a few requests in flight moves it by its
    #: share of the window, not by its height.
    requests_in_pods_avg: str = ""
    #: Pods that have been ready since their process started (each exports its ``ready`` start phase
    #: from then on, also while it drains): ``Signals.pods_ready``, and the activation's "pods
    #: still starting" (``sum(up == 1)`` less this).
    pods_ready: str = ""
    #: The pods' own start-up, in seconds: the median over the pods that report it of the sum of
    #: their start phases (fetched, loaded, warmed, ready): ``Signals.startup_seconds``.
    startup_seconds: str = ""
    #: Requests the gateway holds now, summed over its replicas (issue 20: ``Signals.held``).
    held: str = ""
    #: Requests per second arriving at the gateway: its answers' rate plus the growth of what it
    #: holds (``Signals.edge_rate``; the requests in flight to pods are left out).
    edge_rate: str = ""
    #: Requests the gateway refused for want of a pod within the rate window: at the hold queue's
    #: bounds, none ready without a hold queue, held to their deadline (``Signals.refused_no_pod``).
    refused_no_pod: str = ""
    #: Pods still starting, for the activation (issue 20: never deactivate while a pod loads): pods
    #: up that have never been ready, less the crash-looping ones, whose target went down at least
    #: twice within ``crash_window`` (``resets(up[w]) >= 2``: a process that died while loading,
    #: restarted, died again; a pod starting for the first time only goes up). See
    #: :meth:`starting_pods` for the bound on a pod that loads for ever.
    pods_starting: str = ""
    #: The selectors :meth:`starting_pods` adds the bound with (the pods' targets).
    pods_selector: str = ""

    def starting_pods(self, bound_seconds: float | None) -> str:
        """``pods_starting``, and with ``bound_seconds`` also less the pods that have been up and
        not ready for longer than it (up ``bound`` ago, their target never down since: stuck
        loading). ``None``: no bound (the start-up is unknown). Raises ValueError on a bound that is
        not a positive finite number."""
        if bound_seconds is None:
            return self.pods_starting
        if not (bound_seconds > 0 and bound_seconds < float("inf")):
            raise ValueError(f"bound must be a positive number of seconds, got {bound_seconds!r}")
        b = format_duration(max(1.0, float(round(bound_seconds))))
        up = f"up{{{self.pods_selector}}}"
        stuck = f"(({up} offset {b}) == 1 unless on (instance) (resets({up}[{b}]) > 0))"
        # inside the count: ``pods_starting`` is ``count(...)``
        return f"{self.pods_starting[:-1]} unless on (instance) {stuck})"

    @classmethod
    def build(
        cls, namespace: str, inference_service: str, window: str = "2m", crash_window: str = "10m"
    ) -> Queries:
        """``crash_window``: how far back a pod's target going down twice marks it crash-looping
        (Kubernetes' restart back-off grows to 5 minutes: 10 minutes sees two crashes of a pod
        that keeps crashing). Raises ValueError on a label value PromQL would misread or a window
        that is not a PromQL duration."""
        s = selector(namespace, inference_service)
        average_step(crash_window)  # validates it
        pods = f'{s},component!="gateway"'  # targets (``up``) of the pods only
        want = "|".join(m.GATEWAY_WANT_OF_POD_REASONS)
        in_pods = f"sum({m.CONCURRENCY_IN_USE}{{{s}}}) + (sum({m.QUEUE_DEPTH}{{{s}}}) or vector(0))"
        return cls(
            # Pods that are up but have not created a queue-depth series yet count as 0; if no pod
            # is up the result is empty (-> hold), never 0.
            queue_depth=f"sum({m.QUEUE_DEPTH}{{{s}}}) or (sum(up{{{pods}}} == 1) * 0)",
            # NaN when nothing waited inside the window.
            wait_p95=(
                "histogram_quantile(0.95, sum by (le) "
                f"(rate({m.QUEUE_WAIT_SECONDS}_bucket{{{s}}}[{window}])))"
            ),
            arrival_rate=f"sum(rate({m.ENQUEUED}{{{s}}}[{window}]))",
            completion_rate=f"sum(rate({m.DEQUEUED}{{{s}}}[{window}]))",
            pods_up=f"sum(up{{{pods}}} == 1)",
            service_time=(
                f"sum(rate({m.INFERENCE_SECONDS}_sum{{{s}}}[{window}]))"
                f" / sum(rate({m.INFERENCE_SECONDS}_count{{{s}}}[{window}]))"
            ),
            # GPU permits in force per pod (the largest over pods).
            concurrency=f"max({m.CONCURRENCY_LIMIT}{{{s}}})",
            # Requests offered per second that more replicas could serve: every answer (each is
            # counted once) less the refusals no replica count changes (client mistakes, a tenant's
            # own quota: metric_names.NOT_DEMAND_REASONS). Empty when no pod reports: hold.
            offered_rate=(
                f"sum(rate({m.REQUESTS}{{{s}}}[{window}]))"
                f' - (sum(rate({m.REJECTED}{{{s},reason=~"{"|".join(m.NOT_DEMAND_REASONS)}"}}[{window}]))'
                " or vector(0))"
            ),
            # Requests in the pods now, running (permits held) and queued, summed over the pods
            # (``Signals.requests_in_pods``). Empty when no pod reports: the term is skipped.
            requests_in_pods=in_pods,
            # ... averaged over the window: the sum evaluated every ``average_step`` (a subquery) and
            # averaged, so a pod that stopped leaves the sum at its stale marker (averaging each
            # pod's series first would count a stopped pod's requests, moved to the others, twice)
            requests_in_pods_avg=f"avg_over_time(({in_pods})[{window}:{average_step(window)}])",
            pods_ready=f'count({m.START_PHASE_SECONDS}{{{s},phase="ready"}})',
            # one series per pod target (joined on ``instance``, the target's address: a container
            # restarted in the same pod keeps it), so ``count`` is the pods, not their series
            pods_starting=(
                f"count((up{{{pods}}} == 1)"
                f' unless on (instance) {m.START_PHASE_SECONDS}{{{s},phase="ready"}}'
                f" unless on (instance) (resets(up{{{pods}}}[{crash_window}]) >= 2))"
            ),
            pods_selector=pods,
            # per pod, the phases it went through (a pod fetched nothing without a storage
            # initializer); only pods that reached ``ready`` have a whole start to report
            startup_seconds=(
                f"quantile(0.5, sum by (pod) ({m.START_PHASE_SECONDS}{{{s}}})"
                f' and on (pod) {m.START_PHASE_SECONDS}{{{s},phase="ready"}})'
            ),
            # The gateway's hold queue (empty when no gateway is scraped: the signal is unknown).
            held=f"sum({m.GATEWAY_HELD}{{{s}}})",
            edge_rate=(
                f"sum(rate({m.GATEWAY_ANSWERS}{{{s}}}[{window}]))"
                f" + (sum(deriv({m.GATEWAY_HELD}{{{s}}}[{window}])) or vector(0))"
            ),
            refused_no_pod=(
                f"(sum(increase({m.GATEWAY_HOLD_REFUSED}{{{s}}}[{window}])) or vector(0))"
                f' + (sum(increase({m.GATEWAY_REFUSED}{{{s},reason=~"{want}"}}[{window}])) or vector(0))'
            ),
            # Device seconds per answered request (batches share their device time).
            request_cost=(
                f"sum(rate({m.INFERENCE_SECONDS}_sum{{{s}}}[{window}]))"
                f' / sum(rate({m.REQUESTS}{{{s},code="200"}}[{window}]))'
            ),
            # Permits that fit device memory per pod (the smallest over pods); the chosen
            # permits (``concurrency``) never exceed it.
            memory_bound=f"min({m.CONCURRENCY_MEMORY_BOUND}{{{s}}})",
            # per tenant, service-wide: requests answered 2xx per second (next to the spec's rate),
            # refusals by the token buckets, the sum of the pods' quota shares (1 when the leases
            # cover the quota) and the pods running on the fallback share (quota / replicas)
            tenant_admitted_rate=f'sum by (tenant) (rate({m.REQUESTS}{{{s},code=~"2.."}}[{window}]))',
            tenant_rate_limited_rate=(
                f'sum by (tenant) (rate({m.REJECTED}{{{s},reason="rate_limited"}}[{window}]))'
            ),
            tenant_quota_share=f"sum by (tenant) ({m.TENANT_QUOTA_SHARE}{{{s}}})",
            quota_fallback_pods=f"sum({m.QUOTA_FALLBACK}{{{s}}})",
            # device-seconds per second (busy permits, batches) over the permits in force
            utilisation=(
                f"sum(rate({m.INFERENCE_SECONDS}_sum{{{s}}}[{window}])) / sum({m.CONCURRENCY_LIMIT}{{{s}}})"
            ),
        )
