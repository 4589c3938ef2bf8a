"""The ``sluiceway_*`` metric names that cross process boundaries. Pure constants.

The pod exports them (``sluiceway_pod.metrics``); the scaler, the operator's status and builtin
engine, the Prometheus rules, the Grafana dashboard and the sandbox's live display read them
(through :mod:`sluiceway_core.signals`). Histograms are named by their base name; Prometheus adds
``_bucket``, ``_sum`` and ``_count``. Every series carries a ``model`` label; Prometheus adds
``namespace``, ``inferenceservice`` and ``pod`` when it scrapes an inference pod.
"""

from __future__ import annotations

__all__ = [
    "BATCH_SIZE",
    "CONCURRENCY_IN_USE",
    "CONCURRENCY_LIMIT",
    "CONCURRENCY_MEMORY_BOUND",
    "DEGRADED",
    "DEQUEUED",
    "ENQUEUED",
    "GATEWAY_ANSWERS",
    "GATEWAY_HELD",
    "GATEWAY_HELD_BYTES",
    "GATEWAY_HOLD_REFUSED",
    "GATEWAY_REFUSED",
    "GATEWAY_WANT_OF_POD_REASONS",
    "GPU_MEMORY_ALLOCATED",
    "INFERENCE_SECONDS",
    "NOT_DEMAND_REASONS",
    "OOM",
    "QUEUE_DEPTH",
    "QUEUE_WAIT_SECONDS",
    "QUOTA_FALLBACK",
    "QUOTA_LEASE_AGE_SECONDS",
    "READY",
    "REJECTED",
    "REQUESTS",
    "SCRAPE_LABELS",
    "STUCK_PERMITS",
    "TENANT_QUOTA_SHARE",
]

QUEUE_DEPTH = "sluiceway_queue_depth"
ENQUEUED = "sluiceway_enqueued_total"
DEQUEUED = "sluiceway_dequeued_total"
REQUESTS = "sluiceway_requests_total"
REJECTED = "sluiceway_rejected_total"
#: ``reason`` labels of ``REJECTED`` that more replicas would not serve: client mistakes, and the
#: tenant's own limits (its quota holds service-wide, so more pods admit none of them). The scaler's
#: demand term leaves them out of the offered rate; everything else refused (queue full, deadlines,
#: draining pods, ...) is demand. tests/scaler/test_rules.py checks them against the pod's reasons.
NOT_DEMAND_REASONS = (
    "invalid_input",
    "payload_too_large",
    "body_timeout",
    "model_not_found",
    "unauthenticated",
    "priority_forbidden",
    "tenant_queue_full",
    "rate_limited",
)
QUEUE_WAIT_SECONDS = "sluiceway_queue_wait_seconds"
INFERENCE_SECONDS = "sluiceway_inference_seconds"
CONCURRENCY_LIMIT = "sluiceway_concurrency_limit"
#: Permits that fit device memory (``permits: auto``); the limit in force never exceeds it.
CONCURRENCY_MEMORY_BOUND = "sluiceway_concurrency_memory_bound"
CONCURRENCY_IN_USE = "sluiceway_concurrency_in_use"
GPU_MEMORY_ALLOCATED = "sluiceway_gpu_memory_allocated_bytes"
OOM = "sluiceway_oom_total"
BATCH_SIZE = "sluiceway_batch_size"
DEGRADED = "sluiceway_degraded_total"
READY = "sluiceway_ready"
#: Permits held by device work still running past the execution budget plus a grace (a hung device);
#: when it equals the permit limit the pod's liveness probe fails.
STUCK_PERMITS = "sluiceway_stuck_permits"
#: Service-wide quotas (issue 11): this pod's fraction of a tenant's quota (of its rate, or of its
#: maxConcurrent when it has no rate), the age of the pod's quota lease, and 1 while the pod runs on
#: the fallback share (quota / replicas) because it could not renew.
TENANT_QUOTA_SHARE = "sluiceway_tenant_quota_share"
QUOTA_LEASE_AGE_SECONDS = "sluiceway_quota_lease_age_seconds"
QUOTA_FALLBACK = "sluiceway_quota_fallback"
#: Bytes of request bodies admitted and not yet given back (``server.maxInflightBodyBytes`` bounds it).
INFLIGHT_BODY_BYTES = "sluiceway_inflight_body_bytes"
#: Hot reload of tenants and keys from the mounted volumes (the pod's ``reload`` module): reloads by
#: result (applied, rejected, restart_required) and 1 while the files on disk are rejected.
CONFIG_RELOAD = "sluiceway_config_reload_total"
CONFIG_RELOAD_FAILING = "sluiceway_config_reload_failing"
#: How long each phase of a pod's last start took (fetched, loaded, warmed, ready), in seconds.
START_PHASE_SECONDS = "sluiceway_start_phase_seconds"

#: The gateway's hold queue (issue 20; ``sluiceway_gateway.metrics``): requests and bytes held now
#: because no ready pod can take them, summed over the gateway's replicas by the scaler's queries.
GATEWAY_HELD = "sluiceway_gateway_held_requests"
GATEWAY_HELD_BYTES = "sluiceway_gateway_held_bytes"
#: Requests refused at the hold queue's bounds, by bound (``reason``: full, bytes_full, ...); the
#: gateway creates every bound's series at 0, so Prometheus sees the first refusal as an increase.
GATEWAY_HOLD_REFUSED = "sluiceway_gateway_hold_refused_total"
#: Every answer of the gateway to a client, by status class (``code``).
GATEWAY_ANSWERS = "sluiceway_gateway_answers_total"
#: Every error answer of the gateway, by ``reason`` (its error taxonomy).
GATEWAY_REFUSED = "sluiceway_gateway_refused_total"
#: ``reason`` labels of ``GATEWAY_REFUSED`` that mean "no pod could take the request", besides the
#: hold queue's bounds (``GATEWAY_HOLD_REFUSED``): no pod ready and no hold queue, or a request
#: held to its deadline, or refused at once because the predicted ready time is past its deadline.
#: The scaler's activation counts them with the bounds' refusals: a service whose requests are all
#: refused at once (deadlines shorter than its start-up) must still wake. The gateway creates each
#: at 0, so Prometheus's increase() sees the first one.
GATEWAY_WANT_OF_POD_REASONS = ("no_ready_pods", "hold_timeout", "no_capacity_in_time")

# Labels that Prometheus's relabeling puts on every scraped inference-pod series.
SCRAPE_LABELS = ("namespace", "inferenceservice", "pod")
