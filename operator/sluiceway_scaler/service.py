"""KEDA external scaler gRPC service.

Concurrency model: a synchronous ``grpc.server`` on a ``ThreadPoolExecutor``. Each unary call runs
on one worker thread and does blocking I/O (Prometheus queries through :mod:`sluiceway_scaler.prom`,
pod polls through :mod:`sluiceway_scaler.podpoll`). Each open ``StreamIsActive`` holds one worker
thread for its whole life (KEDA opens one per ScaledObject), so the pool must be larger than the
number of ScaledObjects served (``--workers``). Shared state is one dict of per-ScaledObject
decision state behind one lock; the lock is held only while the policy runs, never during I/O.

How KEDA/HPA arrive at our replica count: ``GetMetricSpec`` announces one metric with
``targetSizeFloat = 1`` and ``GetMetrics`` returns ``metricValueFloat = desired replicas`` from
:func:`~sluiceway_core.policy.desired_replicas`. With the trigger's ``metricType: AverageValue``
(KEDA's default) the HPA computes ``ceil(value / target) = desired replicas``. ``Value`` would
multiply by the current replica count, so it must not be used. The HPA's 10 % tolerance still
applies (from 10 replicas up, a change of one replica may be ignored until the next one).

Missing data: the policy holds the last value this scaler returned for the ScaledObject. If there is
none yet (scaler just started and Prometheus is down) ``GetMetrics`` fails with ``UNAVAILABLE`` so
KEDA's ``fallback`` (which the operator sets so that it never shrinks) takes over.

The policy's ``current`` is the last decision returned for the ScaledObject (what the HPA was told),
initially the number of pods Prometheus sees up. Using the live pod count instead would let a
decision collapse while new pods are still starting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import grpc
from sluiceway_core.policy import Decision, ScaleHistory, desired_replicas

from sluiceway_scaler import externalscaler_pb2 as pb
from sluiceway_scaler import externalscaler_pb2_grpc as pb_grpc
from sluiceway_scaler.errors import NoDecisionYet, ScalerError, UnknownMetric, grpc_code, reason_of
from sluiceway_scaler.metadata import TriggerConfig, parse_metadata
from sluiceway_scaler.metrics import ScalerMetrics
from sluiceway_scaler.podpoll import PodActivity, poll_pods
from sluiceway_scaler.prom import PrometheusSource, Queries

__all__ = ["ExternalScalerService", "serve"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class _State:
    history: ScaleHistory
    replicas: int
    active: bool | None = None
    pods: PodActivity | None = None


def _strip_index(name: str) -> str:
    """KEDA may prefix metric names with ``s<N>-``; accept both forms."""
    head, sep, tail = name.partition("-")
    if sep and head.startswith("s") and head[1:].isdigit():
        return tail
    return name


class ExternalScalerService(pb_grpc.ExternalScalerServicer):
    def __init__(
        self,
        metrics: ScalerMetrics,
        source: PrometheusSource | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics
        self._source = source or PrometheusSource(metrics)
        self._clock = clock
        self._lock = threading.Lock()
        self._state: dict[tuple[str, str, str], _State] = {}
        self._stopping = threading.Event()

    def stop(self) -> None:
        """End open streams (called on server shutdown)."""
        self._stopping.set()

    # --- plumbing ---------------------------------------------------------------------------
    def _call(self, method: str, context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
        try:
            result = fn()
        except Exception as e:
            code = grpc_code(e)
            self._metrics.rpcs.labels(method, code.name).inc()
            if isinstance(e, ScalerError):
                log.warning("%s failed (%s): %s", method, reason_of(e), e.message)
                self._abort(context, code, e.message)
            log.exception("%s failed", method)
            self._abort(context, code, f"internal error: {type(e).__name__}: {e}")
        self._metrics.rpcs.labels(method, "OK").inc()
        return result

    @staticmethod
    def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
        context.abort(code, message)
        raise AssertionError("unreachable: context.abort raises")

    @staticmethod
    def _config(ref: Any) -> TriggerConfig:
        return parse_metadata(dict(ref.scalerMetadata), ref.namespace)

    @staticmethod
    def _key(ref: Any, cfg: TriggerConfig) -> tuple[str, str, str]:
        return (ref.namespace or cfg.namespace, ref.name, cfg.metric_name)

    # --- decisions --------------------------------------------------------------------------
    def decide(self, ref: Any) -> tuple[TriggerConfig, Decision]:
        """Read the signals, run the policy, remember the decision. Raises ScalerError."""
        cfg = self._config(ref)
        key = self._key(ref, cfg)
        queries = Queries.build(cfg.namespace, cfg.inference_service, cfg.rate_window)
        signals, pods_up = self._source.read_signals(cfg.prometheus_address, queries, cfg.query_timeout)
        now = self._clock()
        with self._lock:
            st = self._state.get(key)
            if st is not None:
                current = st.replicas
            elif signals.ok and pods_up is not None:
                current = pods_up
            elif signals.ok:
                current = cfg.spec.min_replicas
            else:
                self._metrics.held.labels(signals.detail.split(":", 1)[0] or "empty").inc()
                raise NoDecisionYet(
                    f"{key[0]}/{key[1]}: no data and no earlier decision to hold ({signals.detail}); "
                    "KEDA fallback applies"
                )
            decision = desired_replicas(signals, cfg.spec, current, st.history if st else ScaleHistory(), now)
            if st is None:
                st = self._state[key] = _State(decision.history, decision.replicas)
                self._metrics.tracked.set(len(self._state))
            else:
                st.history, st.replicas = decision.history, decision.replicas
        if decision.held:
            self._metrics.decisions.labels("held").inc()
            self._metrics.held.labels(signals.detail.split(":", 1)[0] or "empty").inc()
            log.warning("%s/%s: %s", key[0], key[1], decision.reason)
        else:
            n = decision.replicas
            direction = "up" if n > current else "down" if n < current else "same"
            self._metrics.decisions.labels(direction).inc()
            log.info("%s/%s: %d -> %d (%s)", key[0], key[1], current, decision.replicas, decision.reason)
        return cfg, decision

    def activity(self, ref: Any, previous: PodActivity | None) -> tuple[bool | None, PodActivity | None]:
        """Whether there is demand: ``None`` when unknown. Direct pod poll if configured, else Prometheus."""
        cfg = self._config(ref)
        if cfg.pod_metrics_urls:
            now = poll_pods(cfg.pod_metrics_urls, cfg.query_timeout, self._metrics)
            if now is None:
                return None, previous
            return now.active_since(previous), now
        queries = Queries.build(cfg.namespace, cfg.inference_service, cfg.rate_window)
        signals, _ = self._source.read_signals(cfg.prometheus_address, queries, cfg.query_timeout)
        if not signals.ok or signals.queue_depth is None:
            return None, None
        return signals.queue_depth > 0 or (signals.arrival_rate or 0.0) > 0, None

    # --- RPCs -------------------------------------------------------------------------------
    def IsActive(self, request: Any, context: grpc.ServicerContext) -> Any:
        def run() -> Any:
            cfg = self._config(request)
            key = self._key(request, cfg)
            with self._lock:
                st = self._state.get(key)
                prev = st.pods if st else None
                last = st.active if st else None
            active, pods = self.activity(request, prev)
            with self._lock:
                st = self._state.get(key)
                if st is not None:
                    st.pods = pods
                    if active is not None:
                        st.active = active
            if active is None:
                # Unknown never deactivates: the last known answer, or true.
                self._metrics.held.labels("source_unavailable").inc()
                active = True if last is None else last
            return pb.IsActiveResponse(result=active)

        return self._call("IsActive", context, run)

    def StreamIsActive(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        cfg = self._call("StreamIsActive", context, lambda: self._config(request))
        self._metrics.active_streams.inc()
        try:
            sent: bool | None = None
            prev: PodActivity | None = None
            while context.is_active() and not self._stopping.is_set():
                try:
                    active, prev = self.activity(request, prev)
                except ScalerError as e:  # metadata validated above; keep the stream alive
                    log.warning("StreamIsActive %s/%s: %s", request.namespace, request.name, e.message)
                    active = None
                if active is None:
                    active = True if sent is None else sent  # unknown never deactivates
                if active != sent:
                    sent = active
                    log.info("StreamIsActive %s/%s -> %s", cfg.namespace, request.name, active)
                    yield pb.IsActiveResponse(result=active)
                self._stopping.wait(cfg.activation_poll_interval)
        finally:
            self._metrics.active_streams.dec()

    def GetMetricSpec(self, request: Any, context: grpc.ServicerContext) -> Any:
        def run() -> Any:
            cfg = self._config(request)
            spec = pb.MetricSpec(metricName=cfg.metric_name, targetSize=1, targetSizeFloat=1.0)
            return pb.GetMetricSpecResponse(metricSpecs=[spec])

        return self._call("GetMetricSpec", context, run)

    def GetMetrics(self, request: Any, context: grpc.ServicerContext) -> Any:
        def run() -> Any:
            ref = request.scaledObjectRef
            cfg = self._config(ref)
            asked = _strip_index(request.metricName)
            if asked and asked != cfg.metric_name:
                raise UnknownMetric(
                    f"unknown metric {request.metricName!r}; this trigger serves {cfg.metric_name!r}"
                )
            _, decision = self.decide(ref)
            value = pb.MetricValue(
                metricName=cfg.metric_name,
                metricValue=decision.replicas,
                metricValueFloat=float(decision.replicas),
            )
            return pb.GetMetricsResponse(metricValues=[value])

        return self._call("GetMetrics", context, run)


def serve(
    service: ExternalScalerService, host: str = "0.0.0.0", port: int = 9090, workers: int = 64
) -> tuple[grpc.Server, int]:
    """Start (not block) a gRPC server for ``service``; returns it and the bound port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="scaler"))
    pb_grpc.add_ExternalScalerServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    server.start()
    return server, bound
