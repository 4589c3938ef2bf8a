"""OpenTelemetry tracing at the pod (``tracing.endpoint``; off by default).

Per infer request that reaches the data plane (the ASGI path) one SERVER span ``infer``, the child
of the caller's ``traceparent`` (W3C trace context) when it sent one, with two child spans:
``queue-wait`` (admitted into the queue until dispatched to a permit) and ``execution`` (dispatched
until answered). The children are recorded when the request is answered, with the times the
admission core measured (its monotonic clock, mapped to wall-clock nanoseconds), so nothing on the
hot path creates spans while the request waits. Refusals written pre-encoded on the headers
(:mod:`sluiceway_pod.transport`) get no span.

Spans are exported over OTLP/HTTP (protobuf) by the SDK's batch processor (its own thread, a bounded
queue of 2048 spans: when the collector is slow, spans are dropped, requests are not held).
Sampling: ``ParentBased(TraceIdRatioBased(sampleRatio))``: a caller's sampled flag is followed.

The ``opentelemetry-sdk`` and ``opentelemetry-exporter-otlp-proto-http`` packages are imported only
when tracing is on (the ``pod`` extra lists them).

Concurrency model: :meth:`PodTracer.start` and :meth:`PodTracer.finish` run on the event loop;
the exporter runs in the SDK's worker thread; :meth:`PodTracer.shutdown` flushes (blocking: call it
in a worker thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from sluiceway_core.config import TracingConfig


class PodTracer:
    def __init__(self, cfg: TracingConfig, now: Callable[[], float], model: str) -> None:
        # lazy: only a pod with tracing on needs the SDK
        from opentelemetry import trace  # type: ignore[import-not-found,unused-ignore]
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import Resource  # type: ignore[import-not-found,unused-ignore]
        from opentelemetry.sdk.trace import TracerProvider  # type: ignore[import-not-found,unused-ignore]
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # type: ignore[import-not-found,unused-ignore]
        from opentelemetry.sdk.trace.sampling import (  # type: ignore[import-not-found,unused-ignore]
            ParentBased,
            TraceIdRatioBased,
        )
        from opentelemetry.trace.propagation.tracecontext import (  # type: ignore[import-not-found,unused-ignore]
            TraceContextTextMapPropagator,
        )

        self._trace: Any = trace
        self._now = now
        self.model = model
        self.provider: Any = TracerProvider(
            resource=Resource.create({"service.name": cfg.service_name}),
            sampler=ParentBased(TraceIdRatioBased(cfg.sample_ratio)),
        )
        self.provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=cfg.endpoint, timeout=5), schedule_delay_millis=1000)
        )
        self._tracer: Any = self.provider.get_tracer("sluiceway_pod")
        self._propagator: Any = TraceContextTextMapPropagator()
        self._server: Any = trace.SpanKind.SERVER
        self._error: Any = trace.Status(trace.StatusCode.ERROR)

    def start(self, headers: Mapping[str, str]) -> Any:
        """The request's span, child of the ``traceparent`` in ``headers`` (lower-case names)."""
        ctx = self._propagator.extract(headers) if "traceparent" in headers else None
        return self._tracer.start_span(
            "infer", context=ctx, kind=self._server, attributes={"sluiceway.model": self.model}
        )

    def finish(
        self,
        span: Any,
        *,
        status: int,
        tenant: str | None,
        reason: str | None,
        request_id: str,
        enqueued: float,
        dispatched: float,
        finished: float,
    ) -> None:
        """End ``span`` with its two children (times on the injected monotonic clock; 0 = never)."""
        if span.is_recording():
            span.set_attribute("http.response.status_code", status)
            span.set_attribute("sluiceway.request_id", request_id)
            if tenant is not None:
                span.set_attribute("sluiceway.tenant", tenant)
            if reason is not None:
                span.set_attribute("sluiceway.reason", reason)
            if status >= 500:
                span.set_status(self._error)
            if enqueued:
                now_m, now_ns = self._now(), time.time_ns()

                def wall(m: float) -> int:
                    return now_ns - int((now_m - m) * 1e9)

                ctx = self._trace.set_span_in_context(span)
                end_q = dispatched or finished or now_m
                q = self._tracer.start_span("queue-wait", context=ctx, start_time=wall(enqueued))
                q.end(end_time=wall(end_q))
                if dispatched:
                    e = self._tracer.start_span("execution", context=ctx, start_time=wall(dispatched))
                    e.end(end_time=wall(finished or now_m))
        span.end()

    def shutdown(self) -> None:
        """Flush and stop the exporter (blocks up to its timeout)."""
        self.provider.shutdown()


def build_tracer(cfg: TracingConfig, now: Callable[[], float], model: str) -> PodTracer | None:
    """None when tracing is off (no ``endpoint``)."""
    return PodTracer(cfg, now, model) if cfg.endpoint else None
