"""The scaler's own Prometheus metrics, all ``sluiceway_scaler_*``, built against an injected registry.

Label values are bounded: ``method`` is one of the four RPCs, ``code`` a gRPC status name, ``reason``
an error or hold reason from a fixed set, ``direction`` one of up/down/same/held. No per-ScaledObject
labels (their number is unbounded); the logs name the ScaledObject instead.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

HOLD_REASONS = ("source_unavailable", "garbage", "empty", "nan")


class ScalerMetrics:
    """Create once per process (or per test) with its own registry. Thread-safe (prometheus_client)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.rpcs = Counter(
            "sluiceway_scaler_rpcs_total", "gRPC calls served, by method and status code",
            ["method", "code"], registry=registry,
        )
        self.decisions = Counter(
            "sluiceway_scaler_decisions_total",
            "Scaling decisions by direction relative to the current replicas (held = data missing)",
            ["direction"], registry=registry,
        )
        self.held = Counter(
            "sluiceway_scaler_held_total",
            "Decisions that held the current replicas because data was missing, by reason",
            ["reason"], registry=registry,
        )
        self.prometheus_queries = Counter(
            "sluiceway_scaler_prometheus_queries_total",
            "Prometheus queries by outcome (ok, error, empty, nan)",
            ["outcome"], registry=registry,
        )
        self.query_seconds = Histogram(
            "sluiceway_scaler_prometheus_query_seconds", "Time to read one set of signals from Prometheus",
            registry=registry, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.signal_reads = Counter(
            "sluiceway_scaler_signal_reads_total",
            "Signal sets used by an RPC, by source: prometheus (one set of queries) or cache (the set "
            "read for the same trigger less than the cache lifetime ago, e.g. by the GetMetrics that "
            "KEDA sends right before IsActive)",
            ["source"], registry=registry,
        )
        self.pod_polls = Counter(
            "sluiceway_scaler_pod_polls_total",
            "Direct pod /metrics polls for activation, by outcome (ok, error)",
            ["outcome"], registry=registry,
        )
        self.active_streams = Gauge(
            "sluiceway_scaler_active_streams", "Open StreamIsActive streams", registry=registry,
        )
        self.tracked = Gauge(
            "sluiceway_scaler_tracked_scaledobjects", "ScaledObjects with decision history in memory",
            registry=registry,
        )
