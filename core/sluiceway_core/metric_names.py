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
    "DEGRADED",
    "DEQUEUED",
    "ENQUEUED",
    "GPU_MEMORY_ALLOCATED",
    "INFERENCE_SECONDS",
    "OOM",
    "QUEUE_DEPTH",
    "QUEUE_WAIT_SECONDS",
    "READY",
    "REJECTED",
    "REQUESTS",
    "SCRAPE_LABELS",
]

QUEUE_DEPTH = "sluiceway_queue_depth"
ENQUEUED = "sluiceway_enqueued_total"
DEQUEUED = "sluiceway_dequeued_total"
REQUESTS = "sluiceway_requests_total"
REJECTED = "sluiceway_rejected_total"
QUEUE_WAIT_SECONDS = "sluiceway_queue_wait_seconds"
INFERENCE_SECONDS = "sluiceway_inference_seconds"
CONCURRENCY_LIMIT = "sluiceway_concurrency_limit"
CONCURRENCY_IN_USE = "sluiceway_concurrency_in_use"
GPU_MEMORY_ALLOCATED = "sluiceway_gpu_memory_allocated_bytes"
OOM = "sluiceway_oom_total"
BATCH_SIZE = "sluiceway_batch_size"
DEGRADED = "sluiceway_degraded_total"
READY = "sluiceway_ready"

# Labels that Prometheus's relabeling puts on every scraped inference-pod series.
SCRAPE_LABELS = ("namespace", "inferenceservice", "pod")
