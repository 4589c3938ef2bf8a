"""Every Prometheus metric of the pod, built against an injected registry.

Names are the contract the scaler, the rules file and dashboards depend on. Label values are
bounded: ``tenant`` is a configured tenant, the anonymous tenant or ``other``; ``priority`` is a
configured class; ``code`` an HTTP status; ``reason`` an error reason; ``mode`` a degradation mode.

Concurrency: metric objects are thread-safe (prometheus-client); the observer methods are called
from the event loop, ``inference`` from the loop after a batch completes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from sluiceway_core import metric_names as names

from .admission import Ticket
from .tenancy import Tenant

WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
INFER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

#: Hot reload of tenants and keys (:mod:`sluiceway_pod.reload`) and the start phases
#: (:mod:`sluiceway_pod.startphases`): names in :mod:`sluiceway_core.metric_names`.
CONFIG_RELOAD = names.CONFIG_RELOAD
CONFIG_RELOAD_FAILING = names.CONFIG_RELOAD_FAILING
RELOAD_RESULTS = ("applied", "rejected", "restart_required")
START_PHASE_SECONDS = names.START_PHASE_SECONDS


class PodMetrics:
    """Every metric of the pod. It is also the admission core's observer: it implements the
    :class:`~sluiceway_pod.admission.Observer` protocol that :class:`~sluiceway_pod.admission.AdmissionCore`
    calls."""

    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        self.model = model
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        m = ["model"]
        mtp = ["model", "tenant", "priority"]
        self.queue_depth = Gauge(
            names.QUEUE_DEPTH, "Requests waiting in the admission queue.", mtp, registry=registry
        )
        self.enqueued = Counter(names.ENQUEUED, "Requests admitted into the queue.", m, registry=registry)
        self.dequeued = Counter(
            names.DEQUEUED,
            "Requests that left the queue (dispatched, expired or withdrawn).",
            m,
            registry=registry,
        )
        self.requests = Counter(
            names.REQUESTS,
            "Inference requests answered, by HTTP status.",
            [*mtp, "code"],
            registry=registry,
        )
        self.rejected = Counter(
            names.REJECTED, "Requests refused or failed, by reason.", [*mtp, "reason"], registry=registry
        )
        self.queue_wait = Histogram(
            names.QUEUE_WAIT_SECONDS,
            "Time spent waiting in the queue.",
            mtp,
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.inference = Histogram(
            names.INFERENCE_SECONDS, "Device time per batch.", m, buckets=INFER_BUCKETS, registry=registry
        )
        self.limit = Gauge(names.CONCURRENCY_LIMIT, "GPU permits in force.", m, registry=registry)
        self.memory_bound = Gauge(
            names.CONCURRENCY_MEMORY_BOUND,
            "Permits that fit device memory (permits: auto on a device with a memory probe).",
            m,
            registry=registry,
        )
        self.in_use = Gauge(
            names.CONCURRENCY_IN_USE, "GPU permits held by running batches.", m, registry=registry
        )
        self.gpu_memory = Gauge(
            names.GPU_MEMORY_ALLOCATED, "Device memory allocated by torch.", m, registry=registry
        )
        self.oom = Counter(names.OOM, "Device out-of-memory errors caught.", m, registry=registry)
        self.batch_size = Histogram(
            names.BATCH_SIZE, "Requests per executed batch.", m, buckets=BATCH_BUCKETS, registry=registry
        )
        self.degraded = Counter(
            names.DEGRADED, "Requests answered in a degraded mode.", ["model", "mode"], registry=registry
        )
        self.ready = Gauge(
            names.READY, "1 when the model is warm and the pod accepts work.", m, registry=registry
        )
        self.stuck = Gauge(
            names.STUCK_PERMITS,
            "Permits held by device work running past the execution budget plus the stuck grace.",
            m,
            registry=registry,
        )
        # service-wide quotas (issue 11): set by sluiceway_pod.quota_client when a coordinator is configured
        self.quota_share = Gauge(
            names.TENANT_QUOTA_SHARE, "This pod's fraction of the tenant's service-wide quota.", ["model", "tenant"],
            registry=registry,
        )
        self.quota_lease_age = Gauge(
            names.QUOTA_LEASE_AGE_SECONDS, "Seconds since this pod's quota lease was granted.", m, registry=registry
        )
        self.quota_fallback = Gauge(
            names.QUOTA_FALLBACK, "1 while the pod enforces quota / replicas (lease not renewed).", m,
            registry=registry,
        )
        self.inflight_body_bytes = Gauge(
            names.INFLIGHT_BODY_BYTES,
            "Bytes of request bodies admitted and not yet given back (bounded by server.maxInflightBodyBytes).",
            m,
            registry=registry,
        )
        self.config_reload = Counter(
            CONFIG_RELOAD,
            "Reloads of the tenants section and the keys file, by result: applied, rejected (the file "
            "on disk is unusable; the keys and limits in force stay), restart_required (a change "
            "outside tenants, which applies only after a restart).",
            ["model", "result"],
            registry=registry,
        )
        self.config_reload_failing = Gauge(
            CONFIG_RELOAD_FAILING,
            "1 while the tenants config or keys file on disk is rejected (the previous ones stay in force).",
            m,
            registry=registry,
        )
        self.start_phase = Gauge(
            START_PHASE_SECONDS,
            "Seconds each phase of this pod's start took: fetched (the storage initializer), loaded "
            "(process start to model loaded), warmed (warm-up and the permits probe), ready (the rest, "
            "to ready).",
            ["model", "phase"],
            registry=registry,
        )
        for r in RELOAD_RESULTS:
            self.config_reload.labels(model, r)
        for g in (self.limit, self.in_use, self.gpu_memory, self.ready, self.stuck, self.config_reload_failing):
            g.labels(model)
        for c in (self.enqueued, self.dequeued, self.oom):
            c.labels(model)
        self.batch_size.labels(model)
        self.inference.labels(model)

    def declare(self, tenant_labels: Iterable[str], priorities: Iterable[str]) -> None:
        """Create the zero-valued queue-depth series up front, so an idle pod already reports 0
        (autoscalers must be able to tell "empty" from "no data")."""
        for tenant in tenant_labels:
            for prio in priorities:
                self.queue_depth.labels(self.model, tenant, prio)

    def track_body_budget(self, fn: Callable[[], float]) -> None:
        """The body budget's current holding, read at scrape time (nothing on the hot path)."""
        self.inflight_body_bytes.labels(self.model).set_function(fn)

    def track_gpu_memory(self, fn: Callable[[], float]) -> None:
        self.gpu_memory.labels(self.model).set_function(fn)

    # ---- Observer protocol ----------------------------------------------------------------
    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(model, *labels)``, looked up once per label set (label values are
        bounded, see above): ``labels()`` costs a lock and a tuple on every call of the hot path."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self.model, *labels)
        return child

    def enqueued_hook(self, t: Ticket[Any]) -> None:
        self.child(self.enqueued).inc()
        self.child(self.queue_depth, t.tenant.label, t.priority_label).inc()

    def dequeued_hook(self, t: Ticket[Any], waited: float) -> None:
        self.child(self.dequeued).inc()
        self.child(self.queue_depth, t.tenant.label, t.priority_label).dec()
        self.child(self.queue_wait, t.tenant.label, t.priority_label).observe(waited)

    def observer(self) -> _Observer:
        return _Observer(self)

    def answered(self, tenant_label: str, priority: str, code: int) -> None:
        self.child(self.requests, tenant_label, priority, str(code)).inc()


class _Observer:
    def __init__(self, m: PodMetrics) -> None:
        self.m = m

    def enqueued(self, t: Ticket[Any]) -> None:
        self.m.enqueued_hook(t)

    def dequeued(self, t: Ticket[Any], waited: float) -> None:
        self.m.dequeued_hook(t, waited)

    def rejected(self, reason: str, tenant: Tenant, priority: str) -> None:
        self.m.child(self.m.rejected, tenant.label, priority, reason).inc()

    def permits(self, limit: int, in_use: int) -> None:
        self.m.child(self.m.limit).set(limit)
        self.m.child(self.m.in_use).set(in_use)

    def batch(self, size: int) -> None:
        self.m.child(self.m.batch_size).observe(size)

    def served(self, seconds: float) -> None:
        self.m.child(self.m.inference).observe(seconds)
