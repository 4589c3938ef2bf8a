"""Pure status computation: what was observed -> the ``status`` of an InferenceService.

Follows the API conventions: ``observedGeneration`` plus ``conditions[]`` (Ready, ConfigValid,
ModelFetched with a storage initializer, PodsHealthy, Available, AutoscalingReady, HTTPRouteReady
with ``gateway.httpRoute.parentRefs``, and MetricsAvailable, which Ready does not include), each
with a CamelCase reason and a message; no ``phase``. A condition's ``lastTransitionTime`` only
changes when its status changes. No I/O, no clock (``now`` is passed).
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CRASH_RESTARTS",
    "METRICS_MISSING_SECONDS",
    "POD_MESSAGE_MAX",
    "START_PHASES",
    "UNSCHEDULABLE_SECONDS",
    "Cond",
    "Observed",
    "PodProblem",
    "TenantQuota",
    "build_pod_problems",
    "build_pods_healthy",
    "build_startup",
    "compute_status",
    "fetch_message",
    "format_rate",
    "format_wait",
    "merge_conditions",
    "newest_ready_pod",
    "scheduled_seconds",
    "scrub_message",
]


#: How long the signals path may find no series while pods are ready before MetricsAvailable=False.
METRICS_MISSING_SECONDS = 120.0


@dataclass(frozen=True)
class Cond:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str


@dataclass(frozen=True)
class TenantQuota:
    """One tenant's quota as the spec states it (service-wide with the quota coordinator)."""

    name: str
    rate: str | None = None  # the spec's text, e.g. "20/s"
    max_concurrent: int | None = None


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile saw. ``config_error`` is ``(reason, message)`` when ConfigValid=False."""

    generation: int
    endpoint: str
    engine: str
    spec_replicas: int
    spec_permits: int | str
    config_error: tuple[str, str] | None = None
    config_hash: str | None = None
    deployment: Mapping[str, Any] | None = None
    keda_installed: bool = False
    scaled_object: Mapping[str, Any] | None = None
    prometheus_configured: bool = False
    prometheus_error: str | None = None
    queue_depth: float | None = None
    wait_p95: float | None = None
    live_permits: float | None = None
    #: Permits that fit device memory (``sluiceway_concurrency_memory_bound``), when exported.
    memory_bound_permits: float | None = None
    builtin_note: str | None = None
    #: False until the signals timer has read Prometheus once (after a start of the operator).
    signals_read: bool = True
    #: The spec's tenants and their quotas (spec path).
    tenant_quotas: tuple[TenantQuota, ...] = ()
    #: ``access.defaults``' quota, which holds every tenant the spec does not list (name unused).
    default_quota: TenantQuota | None = None
    #: "service" when the pods lease their shares from the quota coordinator, else "pod".
    quota_scope: str | None = None
    #: Requests answered 2xx per second over all pods, per tenant label (Prometheus); None = unknown.
    tenant_admitted: Mapping[str, float] | None = None
    #: Whether Prometheus has this service's series (``sluiceway_queue_depth``); None = not read.
    series_found: bool | None = None
    #: Seconds the series have been missing while pods were ready; None = not missing.
    series_missing_seconds: float | None = None
    #: Whether a storage initializer fetches the model (``model.storageUri`` s3/http(s)).
    model_fetch: bool = False
    #: The inference pods of the Deployment (their containers' states, their scheduling).
    pods: Sequence[Mapping[str, Any]] = ()
    #: When the pods were listed (``PodsHealthy`` times how long a pod has been unschedulable);
    #: None: the pods were not read and the condition is left out.
    pods_read_at: datetime.datetime | None = None
    #: ``status.startup`` (:func:`build_startup`) as last measured; None = none measured yet.
    startup: Mapping[str, Any] | None = None
    #: Parents of the spec's HTTPRoute (``gateway.httpRoute.parentRefs``); 0: none asked, and no
    #: ``HTTPRouteReady`` condition.
    route_parents: int = 0
    #: Whether the Gateway API's HTTPRoute CRD is installed and serves ``v1``.
    route_crd: bool = False


def format_wait(seconds: float) -> str:
    """``0.1234`` -> ``"123ms"``; ``2.5`` -> ``"2.5s"``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    return f"{seconds:.3g}s"


def format_rate(per_second: float) -> str:
    """``97.46`` -> ``"97.5/s"``; ``1234.5`` -> ``"1234/s"``; ``0.031`` -> ``"0.031/s"``."""
    return (f"{per_second:.0f}" if per_second >= 100 else f"{per_second:.3g}") + "/s"


def _tenant_rows(o: Observed) -> list[dict[str, Any]]:
    """Each tenant of the spec, plus every tenant label Prometheus reports (anonymous, other):
    the quota next to the admitted rate service-wide, sorted by name. No rate when unknown."""
    quotas = {q.name: q for q in o.tenant_quotas}
    names = sorted(set(quotas) | set(o.tenant_admitted or {}))
    rows = []
    for name in names:
        row: dict[str, Any] = {"name": name}
        q = quotas.get(name, o.default_quota)
        if q is not None and q.rate is not None:
            row["quotaRate"] = q.rate
        if q is not None and q.max_concurrent is not None:
            row["maxConcurrent"] = q.max_concurrent
        if o.tenant_admitted is not None:
            row["admittedRate"] = format_rate(o.tenant_admitted.get(name, 0.0))
        rows.append(row)
    return rows


def _find(conditions: Sequence[Mapping[str, Any]] | None, ctype: str) -> Mapping[str, Any] | None:
    for c in conditions or ():
        if c.get("type") == ctype:
            return c
    return None


def _config_valid(o: Observed) -> Cond:
    if o.config_error is not None:
        reason, message = o.config_error
        return Cond("ConfigValid", "False", reason, message)
    return Cond("ConfigValid", "True", "ConfigRendered", f"pod config rendered (hash {o.config_hash})")


def _available(o: Observed) -> Cond:
    d = o.deployment
    if d is None:
        return Cond("Available", "False", "DeploymentMissing", "the Deployment does not exist yet")
    status = d.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    cond = _find(status.get("conditions"), "Available")
    if cond is None:
        return Cond("Available", "Unknown", "DeploymentPending", "the Deployment reports no availability yet")
    msg = f"{ready} of {int(status.get('replicas') or 0)} pods ready"
    if cond.get("message"):
        msg += f"; {cond['message']}"
    return Cond("Available", str(cond.get("status", "Unknown")), str(cond.get("reason") or "Deployment"), msg)


def _autoscaling(o: Observed) -> Cond:
    if o.engine == "none":
        return Cond(
            "AutoscalingReady",
            "True",
            "AutoscalingDisabled",
            f"replicas fixed at {o.spec_replicas} by spec.replicas",
        )
    if o.engine in ("keda", "prometheus"):
        if not o.keda_installed:
            return Cond(
                "AutoscalingReady",
                "False",
                "KedaNotInstalled",
                f"engine {o.engine} needs KEDA (CRD scaledobjects.keda.sh); install KEDA or set "
                "autoscaling.engine to builtin or none",
            )
        if o.scaled_object is None:
            return Cond("AutoscalingReady", "Unknown", "ScaledObjectMissing", "the ScaledObject does not exist yet")
        ready = _find((o.scaled_object.get("status") or {}).get("conditions"), "Ready")
        if ready is None or ready.get("status") in (None, "Unknown"):
            return Cond(
                "AutoscalingReady",
                "Unknown",
                "ScaledObjectPending",
                "waiting for KEDA to report on the ScaledObject",
            )
        return Cond(
            "AutoscalingReady",
            str(ready["status"]),
            str(ready.get("reason") or "ScaledObject"),
            str(ready.get("message") or ""),
        )
    # builtin
    if not o.prometheus_configured:
        return Cond(
            "AutoscalingReady",
            "False",
            "PrometheusNotConfigured",
            "engine builtin needs autoscaling.prometheusAddress or the operator's --prometheus-url",
        )
    if not o.signals_read:
        return Cond("AutoscalingReady", "Unknown", "SignalsPending", "waiting for the first read of the signals")
    if o.prometheus_error is not None:
        return Cond("AutoscalingReady", "False", "SignalsUnavailable", f"holding replicas: {o.prometheus_error}")
    return Cond("AutoscalingReady", "True", "BuiltinEngine", o.builtin_note or "the operator scales the Deployment")


#: The Gateway API CRD the HTTPRoute needs.
HTTP_ROUTE_CRD = "httproutes.gateway.networking.k8s.io"


def _http_route(o: Observed) -> Cond:
    """``HTTPRouteReady`` (only with ``gateway.httpRoute.parentRefs``): the HTTPRoute applied, or why
    not. Whether each parent Gateway accepts it is the Gateway controller's word, in the
    HTTPRoute's own ``status.parents``."""
    t = "HTTPRouteReady"
    if o.config_error is not None:
        return Cond(t, "Unknown", "SpecNotApplied", "the spec is not applied (see ConfigValid)")
    if not o.route_crd:
        return Cond(
            t,
            "False",
            "GatewayAPINotInstalled",
            f"gateway.httpRoute.parentRefs is set but the Gateway API CRD {HTTP_ROUTE_CRD} is not installed "
            "or serves no v1: install the Gateway API CRDs (v1.0 or later, standard channel) or remove "
            "gateway.httpRoute; the rest of the service is applied",
        )
    return Cond(
        t,
        "True",
        "HTTPRouteApplied",
        f"HTTPRoute to the gateway's Service applied with {o.route_parents} parent(s); whether each Gateway "
        "accepts it is in the HTTPRoute's status.parents",
    )


def _metrics_available(o: Observed) -> Cond:
    """Whether Prometheus has this service's series: False once none came for
    :data:`METRICS_MISSING_SECONDS` while pods were ready (a Prometheus that does not select the
    ServiceMonitor: the autoscaler then holds, with nothing else to show why)."""
    t = "MetricsAvailable"
    if not o.prometheus_configured:
        return Cond(t, "Unknown", "PrometheusNotConfigured", "no Prometheus to read (the operator's --prometheus-url)")
    if not o.signals_read:
        return Cond(t, "Unknown", "SignalsPending", "waiting for the first read of the signals")
    if o.series_found is None:
        error = o.prometheus_error or "not read"
        return Cond(t, "Unknown", "PrometheusUnavailable", f"cannot read Prometheus: {error}")
    if o.series_found:
        return Cond(t, "True", "MetricsSeriesFound", "Prometheus has this InferenceService's series")
    ready = int(((o.deployment or {}).get("status") or {}).get("readyReplicas") or 0)
    if ready == 0:
        return Cond(t, "Unknown", "NoReadyPods", "no series in Prometheus, and no ready pod to scrape yet")
    missing = o.series_missing_seconds or 0.0
    if missing >= METRICS_MISSING_SECONDS:
        minutes = METRICS_MISSING_SECONDS / 60
        return Cond(
            t,
            "False",
            "NoMetricsSeries",
            f"no series for this InferenceService in Prometheus for {minutes:g} minutes: is it scraped? "
            f"({ready} pods ready; the ServiceMonitor needs the labels your Prometheus selects, e.g. release: "
            "spec.monitoring.serviceMonitorLabels or the chart's operator.serviceMonitorLabels)",
        )
    return Cond(t, "Unknown", "SeriesPending", f"no series in Prometheus yet ({missing:.0f}s with pods ready)")


#: The storage initializer's container name (``render.STORAGE_INITIALIZER``).
STORAGE_INITIALIZER = "storage-initializer"
_FETCH_REASON = re.compile(r"failed \(([a-z-]+)\)")
_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")
_QUERY = re.compile(r"\?\S*?(?=:\s|\s|$)")
#: Longest fetch message a condition carries.
FETCH_MESSAGE_MAX = 512


def fetch_message(text: str) -> str:
    """The last non-empty line of an init container's termination message (what ``sluiceway-pod
    fetch`` writes: ``sluiceway-pod fetch: failed (REASON): DETAIL``), with any URL user info or
    query string removed (fetch already scrubs credentials; this holds for any other text too) and
    at most :data:`FETCH_MESSAGE_MAX` characters."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    last = _QUERY.sub("", _USERINFO.sub("", last))
    return last[:FETCH_MESSAGE_MAX]


def _model_fetched(o: Observed) -> Cond:
    """``ModelFetched`` from the pods' storage-initializer states: False/``ModelFetchFailed`` with the
    fetch's reason and line when the latest run of any pod's initializer failed (also while it is
    retried), True when every pod's initializer finished, else Unknown/``FetchPending``."""
    t = "ModelFetched"
    done = failed = 0
    first: str | None = None
    for pod in o.pods:
        name = str((pod.get("metadata") or {}).get("name") or "?")
        inits = (pod.get("status") or {}).get("initContainerStatuses") or []
        status = next((s for s in inits if s.get("name") == STORAGE_INITIALIZER), None)
        if status is None:
            continue
        now = (status.get("state") or {}).get("terminated")
        if now is not None and now.get("exitCode") == 0:
            done += 1
            continue
        term = now if now is not None else (status.get("lastState") or {}).get("terminated")
        if term is None or term.get("exitCode") == 0:
            continue
        failed += 1
        if first is None:
            line = fetch_message(str(term.get("message") or ""))
            m = _FETCH_REASON.search(line)
            reason = m.group(1) if m else str(term.get("reason") or "error")
            first = f"pod {name}: storage initializer failed ({reason}), exit {term.get('exitCode')}" + (
                f": {line}" if line else ""
            )
    if failed:
        more = f" ({failed} pods failing)" if failed > 1 else ""
        return Cond(t, "False", "ModelFetchFailed", f"{first}{more}")
    if o.pods and done == len(o.pods):
        return Cond(t, "True", "ModelFetched", f"the model was fetched by {done} of {len(o.pods)} pods")
    return Cond(t, "Unknown", "FetchPending", f"the model was fetched by {done} of {len(o.pods)} pods so far")


# -- PodsHealthy: why a pod cannot start (issue 20) -------------------------------------------------

#: A pod the scheduler has refused for this long counts as unschedulable (shorter waits are a
#: cluster autoscaler adding a node, or a scale-up racing a scale-down).
UNSCHEDULABLE_SECONDS = 60.0
#: A serving container that is not ready, has restarted at least this often and last exited
#: non-zero is crash-looping even between the kubelet's back-offs (while it runs again).
CRASH_RESTARTS = 2
#: Longest text taken from a container's termination message or a kubelet/scheduler message.
POD_MESSAGE_MAX = 300
#: The kubelet's waiting reasons of a container that cannot start, most telling first.
_CANNOT_START = (
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "InvalidImageName",
    "ImagePullBackOff",
    "ErrImagePull",
)
_SECRETISH = re.compile(
    r"(?i)\b(token|password|passwd|secret|api[_-]?key|access[_-]?key|authorization|bearer)(\s*[=:]\s*|\s+)(?:(?:bearer|basic)\s+)?\S+"
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def scrub_message(text: str, limit: int = POD_MESSAGE_MAX) -> str:
    """The last non-empty line of ``text`` (a termination message is a log tail: the last line is
    the error), without control characters, URL user info or query strings, with the value after
    ``token``, ``password``, ``secret``, ``api_key``, ``access_key``, ``authorization`` or
    ``bearer`` replaced by ``<redacted>``, and at most ``limit`` characters (an ellipsis marks a
    cut)."""
    lines = [ln.strip() for ln in _CONTROL.sub(" ", text).splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    last = _QUERY.sub("", _USERINFO.sub("", last))
    last = _SECRETISH.sub(lambda m: f"{m.group(1)}{m.group(2) if m.group(2).strip() else '='}<redacted>", last)
    return last if len(last) <= limit else last[: limit - 1] + "\u2026"


@dataclass(frozen=True)
class PodProblem:
    """Why one pod cannot start: ``reason`` is a condition reason (the kubelet's waiting reason,
    ``CrashLoopBackOff``, or ``Unschedulable``), ``message`` names the pod and container."""

    reason: str
    pod: str
    message: str


def _container_problem(pod: str, c: Mapping[str, Any]) -> PodProblem | None:
    state = c.get("state") or {}
    waiting = state.get("waiting") or {}
    last = (c.get("lastState") or {}).get("terminated") or {}
    now_term = state.get("terminated") or {}
    restarts = int(c.get("restartCount") or 0)
    failed = last if int(last.get("exitCode") or 0) != 0 else now_term if int(now_term.get("exitCode") or 0) else {}
    waiting_reason = str(waiting.get("reason") or "")
    if waiting_reason in _CANNOT_START and waiting_reason != "CrashLoopBackOff":
        detail = scrub_message(str(waiting.get("message") or ""))
        return PodProblem(
            waiting_reason,
            pod,
            f"pod {pod} container {c.get('name')}: {waiting_reason}" + (f": {detail}" if detail else ""),
        )
    crashing = waiting_reason == "CrashLoopBackOff" or (
        bool(failed) and restarts >= CRASH_RESTARTS and not c.get("ready")
    )
    if not crashing:
        return None
    text = f"pod {pod} container {c.get('name')}: CrashLoopBackOff, {restarts} restarts"
    if failed:
        text += f", last exit {failed.get('exitCode')}"
        if failed.get("reason"):
            text += f" ({scrub_message(str(failed['reason']), 64)})"
        detail = scrub_message(str(failed.get("message") or ""))
        if detail:
            text += f": {detail}"
    return PodProblem("CrashLoopBackOff", pod, text)


def _unschedulable(pod: str, p: Mapping[str, Any], now: datetime.datetime) -> PodProblem | None:
    for c in (p.get("status") or {}).get("conditions") or []:
        if c.get("type") != "PodScheduled" or c.get("status") != "False" or c.get("reason") != "Unschedulable":
            continue
        since = _time(c.get("lastTransitionTime"))
        if since is None or (now - since).total_seconds() < UNSCHEDULABLE_SECONDS:
            return None
        waited = (now - since).total_seconds()
        detail = scrub_message(str(c.get("message") or ""))
        return PodProblem(
            "Unschedulable", pod, f"pod {pod} cannot be scheduled for {waited:.0f}s" + (f": {detail}" if detail else "")
        )
    return None


def build_pod_problems(pods: Sequence[Mapping[str, Any]], now: datetime.datetime) -> list[PodProblem]:
    """Why pods cannot start, as the kubelet and the scheduler wrote it in their status (pure): a
    serving container crash-looping (``CrashLoopBackOff`` waiting, or not ready after
    :data:`CRASH_RESTARTS` restarts with a non-zero last exit: the reason, exit code and the last
    line of its termination message, scrubbed), one that cannot be created or pulled (the
    kubelet's waiting reason and message), or a pod refused by the scheduler for at least
    :data:`UNSCHEDULABLE_SECONDS`. The storage initializer is left to ``ModelFetched``; pods being
    deleted are skipped. Crash loops first, then the other container problems, then scheduling."""
    rank = {r: i for i, r in enumerate(_CANNOT_START)}
    out: list[PodProblem] = []
    for p in pods:
        meta = p.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        name = str(meta.get("name") or "?")
        found = [
            x
            for x in (_container_problem(name, c) for c in (p.get("status") or {}).get("containerStatuses") or [])
            if x is not None
        ]
        if not found:
            late = _unschedulable(name, p, now)
            found = [late] if late is not None else []
        out.extend(found[:1])
    return sorted(out, key=lambda x: (rank.get(x.reason, len(rank)), x.pod))


def build_pods_healthy(pods: Sequence[Mapping[str, Any]], now: datetime.datetime) -> Cond:
    """``PodsHealthy``: False with the first problem's reason and message (and how many pods have
    one) when :func:`build_pod_problems` finds any; else True/``NoFailingPods``."""
    t = "PodsHealthy"
    problems = build_pod_problems(pods, now)
    if problems:
        first = problems[0]
        more = f" ({len(problems)} of {len(pods)} pods cannot start)" if len(problems) > 1 else ""
        return Cond(t, "False", first.reason, first.message + more)
    live = sum(1 for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp"))
    return Cond(t, "True", "NoFailingPods", f"no pod is crash-looping or unschedulable ({live} pods)")


def _ready(parts: Sequence[Cond]) -> Cond:
    for c in parts:
        if c.status == "False" or (c.status == "Unknown" and c.type != "AutoscalingReady"):
            return Cond("Ready", "False" if c.status == "False" else "Unknown", c.reason, f"{c.type}: {c.message}")
    return Cond("Ready", "True", "Ready", "configured, available and autoscaled as asked")


def merge_conditions(
    previous: Sequence[Mapping[str, Any]] | None, new: Sequence[Cond], generation: int, now: str
) -> list[dict[str, Any]]:
    """metav1.Condition dicts; ``lastTransitionTime`` kept when the status did not change."""
    out = []
    for c in new:
        old = _find(previous, c.type)
        changed = old is None or old.get("status") != c.status
        out.append(
            {
                "type": c.type,
                "status": c.status,
                "observedGeneration": generation,
                "lastTransitionTime": now if changed or old is None else old.get("lastTransitionTime", now),
                "reason": c.reason,
                "message": c.message,
            }
        )
    return out


def compute_status(o: Observed, previous_conditions: Sequence[Mapping[str, Any]] | None, now: str) -> dict[str, Any]:
    """The full ``status`` to write (a merge patch of the status subresource)."""
    cv, av, au = _config_valid(o), _available(o), _autoscaling(o)
    # in Ready's order: what is configured, fetched, started, available, autoscaled
    parts = [cv]
    if o.model_fetch:
        parts.append(_model_fetched(o))
    if o.pods_read_at is not None:
        parts.append(build_pods_healthy(o.pods, o.pods_read_at))
    parts += [av, au]
    if o.route_parents:
        parts.append(_http_route(o))
    conds = [_ready(parts), *parts, _metrics_available(o)]
    dstatus = (o.deployment or {}).get("status") or {}
    concurrency = str(round(o.live_permits)) if o.live_permits is not None else str(o.spec_permits)
    status: dict[str, Any] = {
        "observedGeneration": o.generation,
        "conditions": merge_conditions(previous_conditions, conds, o.generation, now),
        "replicas": int(dstatus.get("replicas") or 0),
        "readyReplicas": int(dstatus.get("readyReplicas") or 0),
        "endpoint": o.endpoint,
        "concurrency": concurrency,
        "autoscalingEngine": o.engine,
        "queueDepth": round(o.queue_depth) if o.queue_depth is not None else None,
        "waitP95": format_wait(o.wait_p95) if o.wait_p95 is not None else None,
    }
    if o.memory_bound_permits is not None:
        status["concurrencyMemoryBound"] = str(round(o.memory_bound_permits))
    if o.config_hash is not None:
        status["configHash"] = o.config_hash
    # None (null in the merge patch) removes what an earlier spec had
    rows = _tenant_rows(o)
    status["tenants"] = rows or None
    status["quotaScope"] = o.quota_scope if rows else None
    if o.startup is not None:
        status["startup"] = dict(o.startup)
    return status


# -- status.startup: a cold start in phases (issue 22 §1) ------------------------------------------

#: In order: the Pod's (scheduled, from its PodScheduled condition to its first container's start)
#: and the pod's own (``sluiceway_start_phase_seconds{phase}``, ``sluiceway_pod.startphases``).
START_PHASES = ("scheduled", "fetched", "loaded", "warmed", "ready")
_HASH_ANNOTATION = "sluiceway.io/config-hash"


def _time(text: Any) -> datetime.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _condition_time(pod: Mapping[str, Any], ctype: str) -> datetime.datetime | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return _time(c.get("lastTransitionTime"))
    return None


def _images(spec: Mapping[str, Any]) -> list[Any]:
    return [c.get("image") for c in spec.get("containers") or []]


def newest_ready_pod(pods: Sequence[Mapping[str, Any]], deployment: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ready pod of the Deployment's current revision (its template's config hash and images)
    that became ready last; None when there is none."""
    tpl = (deployment.get("spec") or {}).get("template") or {}
    want_hash = ((tpl.get("metadata") or {}).get("annotations") or {}).get(_HASH_ANNOTATION)
    want_images = _images(tpl.get("spec") or {})
    best: tuple[datetime.datetime, Mapping[str, Any]] | None = None
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or (meta.get("annotations") or {}).get(_HASH_ANNOTATION) != want_hash:
            continue
        if _images(pod.get("spec") or {}) != want_images:
            continue
        ready = _condition_time(pod, "Ready")
        if ready is not None and (best is None or ready > best[0]):
            best = (ready, pod)
    return best[1] if best else None


def scheduled_seconds(pod: Mapping[str, Any]) -> float | None:
    """From the Pod's ``PodScheduled`` condition to its first container's start (the storage
    initializer's when there is one): image pulls and volume set-up. None when either is unknown."""
    status = pod.get("status") or {}
    scheduled = _condition_time(pod, "PodScheduled")
    statuses = status.get("initContainerStatuses") or status.get("containerStatuses") or []
    started = None
    if statuses:
        state = statuses[0].get("state") or {}
        last = statuses[0].get("lastState") or {}
        for s in (state.get("terminated"), state.get("running"), last.get("terminated")):
            if isinstance(s, Mapping) and _time(s.get("startedAt")) is not None:
                started = _time(s.get("startedAt"))
                break
    if scheduled is None or started is None:
        return None
    seconds = (started - scheduled).total_seconds()
    return seconds if seconds >= 0 else None


def build_startup(
    pod: Mapping[str, Any], phases: Mapping[str, float], revision: str | None, measured_at: str
) -> dict[str, Any] | None:
    """``status.startup``: the seconds each phase of ``pod``'s start took (:data:`START_PHASES`; a
    phase the pod did not go through, such as ``fetched`` without a storage initializer, is left
    out), their total, the pod, the revision (config hash) and when it was measured. None until the
    pod has reported its ``ready`` phase."""
    if not isinstance(phases.get("ready"), float | int) or not math.isfinite(phases["ready"]):
        return None
    out: dict[str, float] = {}
    scheduled = scheduled_seconds(pod)
    if scheduled is not None:
        out["scheduled"] = round(scheduled, 3)
    for name in START_PHASES[1:]:
        value = phases.get(name)
        if value is not None and math.isfinite(value) and value >= 0:
            out[name] = round(float(value), 3)
    meta = pod.get("metadata") or {}
    startup: dict[str, Any] = {
        "pod": meta.get("name"),
        "phases": out,
        "totalSeconds": round(sum(out.values()), 3),
        "measuredAt": measured_at,
    }
    ready_at = _condition_time(pod, "Ready")
    if ready_at is not None:
        startup["readyAt"] = ready_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    if revision is not None:
        startup["revision"] = revision
    return startup
