"""KEDA external scaler gRPC service.

Concurrency model: a synchronous ``grpc.server`` on a ``ThreadPoolExecutor`` of ``--workers``
threads. Each unary call runs on one worker thread and does blocking I/O (Prometheus queries through
:mod:`sluiceway_scaler.prom`, pod polls through :mod:`sluiceway_scaler.podpoll`). Each open
``StreamIsActive`` holds one worker thread for its whole life (KEDA opens one per ``external-push``
ScaledObject), so streams are bounded (issue 18 item 10): :func:`serve` keeps a reserve of
:func:`unary_reserve` threads that no stream may take, and a stream past ``workers - reserve`` is
refused at once with ``RESOURCE_EXHAUSTED`` naming ``--workers``. Open streams therefore never starve
``GetMetrics``/``IsActive``. Shared state is one dict of per-trigger entries behind one lock; the lock
is held only while the policy runs, never during I/O. Each entry has its own fetch lock, held while
its signals are read, so concurrent calls for one trigger share a read.

The state is bounded whatever names callers send: at most ``max_entries`` trigger identities
(``--max-triggers``; a new one past the cap is refused with ``RESOURCE_EXHAUSTED`` after the unseen
ones are pruned), and at most :data:`PER_OBJECT` identities per ScaledObject (a changed spec makes a
new identity; the least recently seen of that ScaledObject is dropped).

Security (item 13): every RPC checks, before any I/O, that the addresses the trigger names are on
the allow-list and that KEDA's TLS keys match the connection (:mod:`sluiceway_scaler.access`).
:func:`serve` listens with TLS, or mutual TLS when a CA is given (:class:`TlsFiles`).

State is keyed by the full trigger identity: the ScaledObject's namespace and name plus
:attr:`~sluiceway_scaler.metadata.TriggerConfig.identity` (service, namespace, addresses, rate
window, spec). A trigger that names another Prometheus, or another spec, never shares history with
this one. Entries not seen for ``forget_after`` seconds (an hour) are dropped; the clock is injected.
There are no per-address clients to drop: :mod:`sluiceway_core.httpget` opens one connection per
query and closes it.

One set of queries per poll: with a ``type: external`` trigger KEDA calls ``IsActive`` right after
every ``GetMetrics``. The signals read for a trigger are kept ``signal_ttl`` seconds (1 s, shorter
than any KEDA polling interval) and answer both calls; ``sluiceway_scaler_signal_reads_total``
counts reads by source.

``StreamMetricSpec`` (in KEDA's v2.21 proto) is not implemented on purpose: the metric spec never
changes for a trigger, gRPC answers UNIMPLEMENTED and KEDA then skips it.

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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import grpc
from sluiceway_core.policy import Decision, HistoryEntry, ScaleHistory, Signals, desired_replicas
from sluiceway_core.signals import Queries
from sluiceway_core.urls import UrlAllowList

from sluiceway_scaler import externalscaler_pb2 as pb
from sluiceway_scaler import externalscaler_pb2_grpc as pb_grpc
from sluiceway_scaler.access import AllowList, Transport, check_transport
from sluiceway_scaler.errors import (
    NoDecisionYet,
    Overloaded,
    ScalerError,
    SourceUnavailable,
    UnknownMetric,
    grpc_code,
    reason_of,
)
from sluiceway_scaler.metadata import TriggerConfig, parse_metadata
from sluiceway_scaler.metrics import ScalerMetrics
from sluiceway_scaler.podpoll import PodActivity, poll_pods
from sluiceway_scaler.prom import Busy, PrometheusSource

__all__ = [
    "FORGET_AFTER",
    "MAX_ENTRIES",
    "PER_OBJECT",
    "SIGNAL_TTL",
    "ExternalScalerService",
    "TlsFiles",
    "serve",
    "unary_reserve",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a trigger's signals answer further calls (GetMetrics then IsActive in one KEDA poll).
SIGNAL_TTL = 1.0
#: Seconds after which the state of a trigger that no call named any more is dropped.
FORGET_AFTER = 3600.0
_PRUNE_EVERY = 60.0
#: Trigger identities kept in memory at most (``--max-triggers``); one ScaledObject normally has one.
MAX_ENTRIES = 4096
#: Identities kept per ScaledObject (namespace, name): the newest ones; older specs are dropped.
PER_OBJECT = 4


def unary_reserve(workers: int) -> int:
    """Worker threads no stream may hold, kept for the unary calls: a quarter of the pool, at least 2
    (all of it when the pool has fewer than 3 threads)."""
    return min(workers, max(2, workers // 4))


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for the gRPC listener. With ``ca`` the server requires client certificates signed by it."""

    cert: Path
    key: Path
    ca: Path | None = None

    @property
    def mode(self) -> str:
        return "mutual TLS" if self.ca is not None else "TLS"

    def credentials(self) -> grpc.ServerCredentials:
        """Read the files now. Raises OSError naming an unreadable file."""
        key, cert = self.key.read_bytes(), self.cert.read_bytes()
        ca = self.ca.read_bytes() if self.ca is not None else None
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
        )


@dataclass
class _Entry:
    """Everything remembered about one trigger identity."""

    seen: float
    history: ScaleHistory = field(default_factory=ScaleHistory)
    replicas: int | None = None
    active: bool | None = None
    pods: PodActivity | None = None
    signals: tuple[Signals, int | None] | None = None
    read_at: float = 0.0
    fetch: threading.Lock = field(default_factory=threading.Lock)
    #: the last request cost and permits the pods reported: the hold term sizes with them at zero
    cost: float | None = None
    permits: int | None = None
    #: requests in the pods and pods starting (read only when the rest says idle), and when
    busy: Busy | None = None
    busy_at: float = 0.0


def _strip_index(name: str) -> str:
    """KEDA may prefix metric names with ``s<N>-``; accept both forms."""
    head, sep, tail = name.partition("-")
    if sep and head.startswith("s") and head[1:].isdigit():
        return tail
    return name


def _active(signals: Signals) -> bool | None:
    """Activation from the Prometheus signals: the gateway holds a request or refused one for want
    of a pod within the rate window (issue 20: read even with no pod scraped, at zero), or a pod has
    a queue or admitted requests in the window. ``None`` (unknown: the last answer stands) when no
    pod is scraped and the gateway shows nothing."""
    gateway = (signals.held or 0.0) > 0 or (signals.refused_no_pod or 0.0) > 0
    if not signals.ok or signals.queue_depth is None:
        # no pod scraped: the gateway's word when it has one; otherwise unknown (a pod scrape that
        # broke must not deactivate a serving service)
        return True if gateway else None
    return gateway or signals.queue_depth > 0 or (signals.arrival_rate or 0.0) > 0


def _remembered(signals: Signals, entry: _Entry) -> Signals:
    """Keep the pods' request cost and permits, and fill them in while the gateway holds requests
    and no pod reports them (back from zero nothing was served in the rate window): the hold term
    sizes the pods with the service's own figures. Caller holds the lock."""
    if signals.request_cost is not None:
        entry.cost = signals.request_cost
    if signals.permits is not None:
        entry.permits = signals.permits
    if not signals.held:
        return signals
    return replace(
        signals,
        request_cost=signals.request_cost if signals.request_cost is not None else entry.cost,
        permits=signals.permits if signals.permits is not None else entry.permits,
    )


def _hold_reason(signals: Signals) -> str:
    return signals.detail.split(":", 1)[0] or "empty"


class ExternalScalerService(pb_grpc.ExternalScalerServicer):
    def __init__(
        self,
        metrics: ScalerMetrics,
        source: PrometheusSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        allowed: AllowList | None = None,
        signal_ttl: float = SIGNAL_TTL,
        forget_after: float = FORGET_AFTER,
        max_entries: int = MAX_ENTRIES,
        max_streams: int | None = None,
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self._allowed = allowed if allowed is not None else AllowList()
        self._source = source or PrometheusSource(metrics, allow=UrlAllowList(self._allowed.prometheus))
        self._ttl = signal_ttl
        self._forget_after = forget_after
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str, tuple[object, ...]], _Entry] = {}
        self._pruned_at = clock()
        self._stopping = threading.Event()
        self._max_entries = max_entries
        self._max_streams = max_streams
        self._streams = 0

    def limit_streams(self, n: int) -> None:
        """At most ``n`` open streams (set by :func:`serve` from its pool size)."""
        with self._lock:
            self._max_streams = n

    def _open_stream(self) -> None:
        with self._lock:
            if self._max_streams is not None and self._streams >= self._max_streams:
                raise Overloaded(
                    f"too many open StreamIsActive streams ({self._streams}); the scaler keeps its other "
                    "worker threads for GetMetrics/IsActive: raise sluiceway-scaler --workers "
                    "(chart: scaler.workers) or use type: external triggers"
                )
            self._streams += 1

    def _close_stream(self) -> None:
        with self._lock:
            self._streams -= 1

    def stop(self) -> None:
        """End open streams (called on server shutdown)."""
        self._stopping.set()

    def tracked(self) -> int:
        """How many trigger identities have state in memory."""
        with self._lock:
            return len(self._entries)

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

    def _config(self, ref: Any, context: grpc.ServicerContext) -> TriggerConfig:
        """Validate the metadata, its TLS keys against this call's transport, and the addresses
        against the allow-list. No I/O happens before this returns."""
        metadata = dict(ref.scalerMetadata)
        cfg = parse_metadata(metadata, ref.namespace)
        check_transport(metadata, Transport.from_auth_context(context.auth_context()))
        self._allowed.check(cfg)
        return cfg

    def _entry(self, ref: Any, cfg: TriggerConfig) -> _Entry:
        """The trigger's entry (created if new), marked seen now; prunes unseen entries now and then."""
        key = (ref.namespace, ref.name, cfg.identity)
        now = self._clock()
        with self._lock:
            try:
                entry = self._entries.get(key)
                if entry is not None:
                    entry.seen = now  # before pruning: a call names its trigger now
                if now - self._pruned_at >= _PRUNE_EVERY:
                    self._prune(now)
                if entry is None:
                    entry = self._new_entry(key, now)
            finally:
                n = len(self._entries)
        self._metrics.tracked.set(n)
        return entry

    def _prune(self, now: float) -> None:
        """Drop entries unseen for ``forget_after``. Caller holds the lock."""
        self._pruned_at = now
        horizon = now - self._forget_after
        for k in [k for k, e in self._entries.items() if e.seen < horizon]:
            del self._entries[k]

    def _new_entry(self, key: tuple[str, str, tuple[object, ...]], now: float) -> _Entry:
        """Create the entry for a new identity within the bounds. Caller holds the lock."""
        same = [(e.seen, k) for k, e in self._entries.items() if k[:2] == key[:2]]
        if len(same) >= PER_OBJECT:  # a ScaledObject's older specs: keep the newest identities
            for _, k in sorted(same, key=lambda p: p[0])[: len(same) - PER_OBJECT + 1]:
                del self._entries[k]
        if len(self._entries) >= self._max_entries:
            self._prune(now)
        if len(self._entries) >= self._max_entries:
            raise Overloaded(
                f"the scaler holds state for {len(self._entries)} triggers, its limit; a new ScaledObject "
                "is refused until unseen ones expire (an hour): raise sluiceway-scaler --max-triggers "
                "(chart: scaler.maxTriggers)"
            )
        entry = self._entries[key] = _Entry(seen=now)
        return entry

    def _signals(self, cfg: TriggerConfig, entry: _Entry) -> tuple[Signals, int | None]:
        """The trigger's signals: from the entry if read less than ``signal_ttl`` ago, else one set of
        Prometheus queries. Never raises (failures are ``Signals(ok=False)``)."""
        with entry.fetch:
            if entry.signals is not None and self._clock() - entry.read_at < self._ttl:
                self._metrics.signal_reads.labels("cache").inc()
                return entry.signals
            queries = Queries.build(cfg.namespace, cfg.inference_service, cfg.rate_window)
            got = self._source.read_signals(cfg.prometheus_address, queries, cfg.query_timeout)
            entry.signals, entry.read_at = got, self._clock()
            self._metrics.signal_reads.labels("prometheus").inc()
            return got

    # --- decisions --------------------------------------------------------------------------
    def decide(self, ref: Any, cfg: TriggerConfig) -> Decision:
        """Read the signals, run the policy, remember the decision. Raises ScalerError."""
        entry = self._entry(ref, cfg)
        signals, pods_up = self._signals(cfg, entry)
        now = self._clock()
        name = f"{ref.namespace}/{ref.name}"
        with self._lock:
            signals = _remembered(signals, entry)
            history = entry.history
            if entry.replicas is not None:
                current = entry.replicas
            elif signals.ok:
                # A new trigger starts from the pods Prometheus sees up, and waits a full window
                # before it shrinks below them (as if it had decided that count just now).
                current = pods_up if pods_up is not None else cfg.spec.min_replicas
                history = ScaleHistory((HistoryEntry(now, current, current),))
            else:
                self._metrics.held.labels(_hold_reason(signals)).inc()
                raise NoDecisionYet(
                    f"{name}: no data and no earlier decision to hold ({signals.detail}); KEDA fallback applies"
                )
            decision = desired_replicas(signals, cfg.spec, current, history, now)
            entry.history, entry.replicas = decision.history, decision.replicas
        if decision.held:
            self._metrics.decisions.labels("held").inc()
            self._metrics.held.labels(_hold_reason(signals)).inc()
            log.warning("%s: %s", name, decision.reason)
        else:
            n = decision.replicas
            direction = "up" if n > current else "down" if n < current else "same"
            self._metrics.decisions.labels(direction).inc()
            log.info("%s: %d -> %d (%s)", name, current, decision.replicas, decision.reason)
        return decision

    def _busy(self, cfg: TriggerConfig, entry: _Entry) -> Busy | None:
        """Requests in the pods and pods still starting, from Prometheus (at most ``signal_ttl`` old);
        ``None`` when it cannot be read."""
        with entry.fetch:
            if entry.busy is not None and self._clock() - entry.busy_at < self._ttl:
                return entry.busy
            queries = Queries.build(cfg.namespace, cfg.inference_service, cfg.rate_window, cfg.crash_window)
            try:
                busy = self._source.read_busy(cfg.prometheus_address, queries, cfg.query_timeout)
            except SourceUnavailable as e:
                log.warning("prometheus read failed: %s", e.message)
                return None
            entry.busy, entry.busy_at = busy, self._clock()
            return busy

    def activity(
        self, cfg: TriggerConfig, entry: _Entry, previous: PodActivity | None
    ) -> tuple[bool | None, PodActivity | None]:
        """Whether there is demand: ``None`` when unknown. Direct pod poll if configured (with the
        gateway's hold queue from Prometheus when the pods show none), else the trigger's (shared)
        Prometheus signals (:func:`_active`). Never ``False`` (which lets KEDA go to zero after
        ``cooldownPeriod``) while a request is held at the gateway, queued or running in a pod, or a
        pod is still starting: before answering ``False`` from Prometheus the scaler reads the
        requests in the pods and the pods not ready yet (:class:`~sluiceway_scaler.prom.Busy`; an
        unreadable answer is unknown); the pod poll sees them in the pods' own ``/metrics``. A pod
        counts as starting only while it is not crash-looping and has not loaded longer than
        :func:`sluiceway_core.signals.starting_bound` of the measured start-up
        (``Queries.starting_pods``); a pod poll that shows only a pod loading asks Prometheus the
        same (a crash-looping service goes to zero after ``scaleToZeroAfter``)."""
        if cfg.pod_metrics_urls:
            now = poll_pods(cfg.pod_metrics_urls, cfg.query_timeout, self._metrics)
            polled = None if now is None else now.active_since(previous)
            if polled and now is not None and now.only_starting(previous):
                # a pod loading is all there is: Prometheus knows whether it is crash-looping or
                # loading past its bound (issue 20); unreadable keeps the pods' word
                busy = self._busy(cfg, entry)
                if busy is not None and busy.starting == 0 and busy.in_pods <= 0:
                    polled = False
            if not polled:
                # at zero the pods cannot be read: the gateway's hold queue through Prometheus
                gateway, _ = self._signals(cfg, entry)
                if (gateway.held or 0.0) > 0 or (gateway.refused_no_pod or 0.0) > 0:
                    polled = True
            return polled, (previous if now is None else now)
        signals, _ = self._signals(cfg, entry)
        active = _active(signals)
        if active is False:
            busy = self._busy(cfg, entry)
            if busy is None:
                return None, None
            if busy.in_pods > 0 or busy.starting > 0:
                return True, None
        return active, None

    # --- RPCs -------------------------------------------------------------------------------
    def IsActive(self, request: Any, context: grpc.ServicerContext) -> Any:
        def run() -> Any:
            cfg = self._config(request, context)
            entry = self._entry(request, cfg)
            with self._lock:
                prev, last = entry.pods, entry.active
            active, pods = self.activity(cfg, entry, prev)
            with self._lock:
                entry.pods = pods
                if active is not None:
                    entry.active = active
            if active is None:
                # Unknown never deactivates: the last known answer, or true.
                self._metrics.held.labels("source_unavailable").inc()
                active = True if last is None else last
            return pb.IsActiveResponse(result=active)

        return self._call("IsActive", context, run)

    def StreamIsActive(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """For ``type: external-push`` triggers: KEDA keeps this stream open and acts on each message.
        Polls every ``activationPollInterval``; sends the first answer, then only changes."""
        def admit() -> TriggerConfig:
            cfg = self._config(request, context)
            self._open_stream()
            return cfg

        cfg = self._call("StreamIsActive", context, admit)
        self._metrics.active_streams.inc()
        try:
            sent: bool | None = None
            prev: PodActivity | None = None
            while context.is_active() and not self._stopping.is_set():
                try:
                    entry = self._entry(request, cfg)  # an open stream keeps its trigger's state alive
                    active, prev = self.activity(cfg, entry, prev)
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
            self._close_stream()
            self._metrics.active_streams.dec()

    def GetMetricSpec(self, request: Any, context: grpc.ServicerContext) -> Any:
        def run() -> Any:
            cfg = self._config(request, context)
            spec = pb.MetricSpec(metricName=cfg.metric_name, targetSize=1, targetSizeFloat=1.0)
            return pb.GetMetricSpecResponse(metricSpecs=[spec])

        return self._call("GetMetricSpec", context, run)

    def GetMetrics(self, request: Any, context: grpc.ServicerContext) -> Any:
        def run() -> Any:
            ref = request.scaledObjectRef
            cfg = self._config(ref, context)
            asked = _strip_index(request.metricName)
            if asked and asked != cfg.metric_name:
                raise UnknownMetric(
                    f"unknown metric {request.metricName!r}; this trigger serves {cfg.metric_name!r}"
                )
            decision = self.decide(ref, cfg)
            value = pb.MetricValue(
                metricName=cfg.metric_name,
                metricValue=decision.replicas,
                metricValueFloat=float(decision.replicas),
            )
            return pb.GetMetricsResponse(metricValues=[value])

        return self._call("GetMetrics", context, run)


def serve(
    service: ExternalScalerService,
    host: str = "0.0.0.0",
    port: int = 9090,
    workers: int = 64,
    tls: TlsFiles | None = None,
) -> tuple[grpc.Server, int]:
    """Start (not block) a gRPC server for ``service``, plaintext or (mutual) TLS; returns it and
    the bound port. Streams may hold ``workers - unary_reserve(workers)`` threads at most. Raises
    OSError when a TLS file cannot be read or the port cannot be bound."""
    creds = tls.credentials() if tls is not None else None
    service.limit_streams(workers - unary_reserve(workers))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="scaler"))
    pb_grpc.add_ExternalScalerServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    address = f"{host}:{port}"
    try:
        bound = server.add_secure_port(address, creds) if creds is not None else server.add_insecure_port(address)
    except RuntimeError as e:
        raise OSError(f"cannot bind {address}: {e}") from e
    if bound == 0:
        raise OSError(f"cannot bind {address}")
    server.start()
    return server, bound
