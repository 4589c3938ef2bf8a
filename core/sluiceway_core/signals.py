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

from dataclasses import dataclass

from . import metric_names as m

__all__ = ["GATEWAY_COMPONENT", "Queries", "selector"]

_LABEL_VALUE_BAD = ('"', "\\", "\n")


#: The label the gateway's scrape job sets on its targets (docs/autoscaling.md, "Scale to zero").
GATEWAY_COMPONENT = 'component="gateway"'


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
    #: Requests the gateway holds now, summed over its replicas (issue 20: ``Signals.held``).
    held: str = ""
    #: Requests per second arriving at the gateway: its answers' rate plus the growth of what it
    #: holds (``Signals.edge_rate``; the requests in flight to pods are left out).
    edge_rate: str = ""
    #: Requests the gateway refused for want of a pod within the rate window: at the hold queue's
    #: bounds, none ready without a hold queue, held to their deadline (``Signals.refused_no_pod``).
    refused_no_pod: str = ""

    @classmethod
    def build(cls, namespace: str, inference_service: str, window: str = "2m") -> Queries:
        s = selector(namespace, inference_service)
        pods = f'{s},component!="gateway"'  # targets (``up``) of the pods only
        want = "|".join(m.GATEWAY_WANT_OF_POD_REASONS)
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
            requests_in_pods=(
                f"sum({m.CONCURRENCY_IN_USE}{{{s}}}) + (sum({m.QUEUE_DEPTH}{{{s}}}) or vector(0))"
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
