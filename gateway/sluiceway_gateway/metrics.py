"""The gateway's metrics, ``sluiceway_gateway_*``, built in one place against an injected registry.

Labels are bounded: ``pod`` takes at most :data:`MAX_POD_LABELS` distinct values (then ``other``),
``reason`` comes from the gateway's error taxonomy or the pods' refusal reasons (a fixed set, unknown
ones become ``other``), ``code`` is the status class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from sluiceway_core.metric_names import GATEWAY_WANT_OF_POD_REASONS

MAX_POD_LABELS = 64
#: the ``retries`` reason of a request resent because its pod's connection died before the pod
#: started it (no start signal came: docs/gateway.md, failure modes)
RETRY_POD_LOST_UNSTARTED = "pod_lost_unstarted"
KNOWN_REASONS = frozenset({
    "invalid_input", "unauthenticated", "priority_forbidden", "not_found", "body_timeout", "payload_too_large",
    "headers_too_large", "rate_limited", "tenant_queue_full", "too_many_connections", "no_ready_pods",
    "upstream_lost", "deadline", "gateway_draining", "header_timeout", "slow_reader", "internal",
    "queue_full", "displaced", "not_ready", "draining", "connect_failed", "hold_full", "hold_tenant_full",
    "hold_timeout", "no_capacity_in_time", "client_closed", "connection_limit", RETRY_POD_LOST_UNSTARTED,
})
HOLD_BOUNDS = frozenset({"full", "bytes_full", "tenant_full", "tenant_bytes_full"})
HOLD_OUTCOMES = ("handed_off", "expired", "shutdown", "cancelled", "client_closed", "no_capacity_in_time")
RELOAD_RESULTS = ("applied", "rejected", "restart_required")


@dataclass(frozen=True)
class PodSeries:
    routed: Any
    in_flight: Any


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.routed = Counter("sluiceway_gateway_routed_total", "Requests sent to a pod (each attempt)",
                              ["pod"], registry=registry)
        self.answers = Counter("sluiceway_gateway_answers_total", "Answers to clients by status class",
                               ["code"], registry=registry)
        self.retries = Counter("sluiceway_gateway_retries_total", "Requests sent to a second pod, by why",
                               ["reason"], registry=registry)
        self.refused = Counter("sluiceway_gateway_refused_total", "Requests the gateway answered with an error",
                               ["reason"], registry=registry)
        self.decision = Histogram("sluiceway_gateway_decision_seconds", "Time to choose a pod",
                                  buckets=(1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2),
                                  registry=registry)
        self.in_flight = Gauge("sluiceway_gateway_in_flight", "Requests in flight to pods", registry=registry)
        self.pod_in_flight = Gauge("sluiceway_gateway_pod_in_flight", "Requests in flight per pod", ["pod"],
                                   registry=registry)
        self.endpoints = Gauge("sluiceway_gateway_endpoints", "Known pods by state", ["state"], registry=registry)
        self.polls = Counter("sluiceway_gateway_polls_total", "Readiness polls of quiet pods", ["result"],
                             registry=registry)
        self.held = Gauge("sluiceway_gateway_held_requests", "Requests in the hold queue", registry=registry)
        self.held_bytes = Gauge("sluiceway_gateway_held_bytes", "Bytes of the requests in the hold queue",
                                registry=registry)
        self.hold_seconds = Histogram("sluiceway_gateway_hold_seconds", "Time a request spent held, by outcome",
                                      ["outcome"],
                                      buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
                                      registry=registry)
        self.hold_refused = Counter("sluiceway_gateway_hold_refused_total",
                                    "Requests refused at the hold queue's bounds, by bound", ["reason"],
                                    registry=registry)
        self.early_refused = Counter(
            "sluiceway_gateway_hold_early_refused_total",
            "Requests answered 503 no_capacity_in_time at once: the predicted ready time was past their deadline",
            registry=registry)
        self.ready_prediction_error = Histogram(
            "sluiceway_gateway_ready_prediction_error_seconds",
            "A starting pod's actual time to ready (from first seen starting) less the predicted one "
            "(hold.startupSeconds): positive, later than predicted",
            buckets=(-60, -30, -10, -5, -2, -1, -0.5, -0.25, 0, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=registry)
        self.cold_predicted = Gauge(
            "sluiceway_gateway_cold_start_predicted_seconds",
            "The predicted length of the latest cold start (first request held with no pod at all to the first "
            "pod ready), made when it began", registry=registry)
        self.cold_actual = Gauge(
            "sluiceway_gateway_cold_start_actual_seconds",
            "The measured length of the latest finished cold start", registry=registry)
        self.cold_error = Histogram(
            "sluiceway_gateway_cold_start_prediction_error_seconds",
            "A cold start's measured length less its prediction: positive, later than predicted",
            buckets=(-60, -30, -10, -5, -2, -1, -0.5, -0.25, 0, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=registry)
        self.reloads = Counter("sluiceway_gateway_config_reload_total",
                               "Reloads of the keys file and the tenants section, by result", ["result"],
                               registry=registry)
        self.reload_failing = Gauge("sluiceway_gateway_config_reload_failing",
                                    "1 while the keys file or the config file on disk is rejected",
                                    registry=registry)
        for result in RELOAD_RESULTS:
            self.reloads.labels(result)
        for outcome in HOLD_OUTCOMES:
            self.hold_seconds.labels(outcome)
        for bound in sorted(HOLD_BOUNDS):
            self.hold_refused.labels(bound)
        for reason in GATEWAY_WANT_OF_POD_REASONS:  # increase() cannot see a series' first sample
            self.refused.labels(reason)
        self._pods: dict[str, PodSeries] = {}
        self._codes: dict[int, Any] = {}

    def pod(self, key: str) -> PodSeries:
        """The per-pod series (resolved once per pod: no label lookup per request)."""
        got = self._pods.get(key)
        if got is None:
            label = key if len(self._pods) < MAX_POD_LABELS else "other"
            got = self._pods[key] = PodSeries(self.routed.labels(label), self.pod_in_flight.labels(label))
        return got

    def answered(self, status: int) -> None:
        child = self._codes.get(status)
        if child is None:
            child = self._codes[status] = self.answers.labels(self.code(status))
        child.inc()

    @staticmethod
    def reason(reason: str) -> str:
        return reason if reason in KNOWN_REASONS else "other"

    @staticmethod
    def code(status: int) -> str:
        return f"{status // 100}xx" if 100 <= status < 600 else "other"
