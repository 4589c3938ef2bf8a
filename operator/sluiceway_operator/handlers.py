"""Thin kopf handlers: one level-based reconcile, called for create, update, resume and by a timer.

Concurrency model: all handlers are sync functions, so kopf runs them in its thread pool. kopf
serialises the change handlers (create/update/resume) of one object; the drift timer of that object
runs in its own task and may overlap them. Both call :func:`reconcile`, which reads the current
state, renders the desired children (pure) and server-side applies them, so overlapping runs
converge on the same result. Different objects are reconciled in parallel.

The reconcile never stores handler results in ``status`` (handlers return ``None``); it writes the
whole status through kopf's ``patch``.

The timer is registered without a finalizer: it holds no external state, so deleting an
InferenceService never waits for the operator (children go by garbage collection).
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Any

import kopf
from sluiceway_core.keys import hash_key
from sluiceway_core.signals import Queries
from sluiceway_core.units import parse_duration

from . import GROUP, PLURAL, VERSION
from .kube import KEDA_CRD, SERVICE_MONITOR_CRD, ApiError, Kube, SecretProblem
from .prom import PrometheusError, query_scalar
from .render import Environment, Owner, endpoint_url, render
from .settings import OperatorConfig, apply_kopf_settings
from .spec import InferenceServiceSpec, SpecError, parse_spec
from .status import Observed, compute_status

__all__ = ["reconcile", "register"]

#: The builtin engine keeps the GPU permits at most this busy (the scaler's default, 80 %).
BUILTIN_TARGET_UTILISATION = 0.8


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key_hashes(
    kube: Kube, namespace: str, spec: InferenceServiceSpec
) -> dict[str, str] | list[SecretProblem]:
    hashes: dict[str, str] = {}
    problems: list[SecretProblem] = []
    for tenant in spec.keyed_tenants:
        ref = tenant.key_secret_ref
        assert ref is not None
        value = kube.read_secret_value(namespace, ref.name, ref.key)
        if isinstance(value, SecretProblem):
            problems.append(SecretProblem(value.reason, f"tenant {tenant.name}: {value.message}"))
        else:
            hashes[tenant.name] = hash_key(value)
    return problems or hashes


def _builtin_replicas(spec: InferenceServiceSpec, current: int, signals: Any, memo: Any) -> tuple[int, str]:
    """Apply the shared scaling policy (``sluiceway_core.policy``)."""
    from sluiceway_core.policy import (
        ScaleDownPolicy,
        ScaleHistory,
        ScaleUpPolicy,
        ScalingSpec,
        desired_replicas,
    )

    a = spec.autoscaling
    scaling = ScalingSpec(
        min_replicas=a.min_replicas,
        max_replicas=a.max_replicas,
        target_queue_per_replica=float(a.target_queue_depth_per_replica),
        target_wait_p95=parse_duration(a.target_wait_p95),
        target_utilisation=BUILTIN_TARGET_UTILISATION,
        scale_up=ScaleUpPolicy(
            max_pods=a.scale_up.max_pods_per_period, max_percent=float(a.scale_up.max_percent_per_period)
        ),
        scale_down=ScaleDownPolicy(
            stabilization_window=parse_duration(a.scale_down.stabilization_window),
            max_pods=a.scale_down.max_pods_per_period,
            period=parse_duration(a.scale_down.period),
        ),
    )
    history = getattr(memo, "scale_history", None) or ScaleHistory()
    decision = desired_replicas(signals, scaling, current, history, time.monotonic())
    memo.scale_history = decision.history
    return decision.replicas, f"{decision.replicas} replicas: {decision.reason}"


def reconcile(
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    config: OperatorConfig,
    kube: Kube,
) -> None:
    """Level-based: read, render, apply, prune, report. Raises kopf.TemporaryError on API errors."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    generation = int(meta.get("generation") or 0)
    owner = Owner(name=name, namespace=namespace, uid=uid)
    previous = dict(body.get("status") or {})
    raw_spec = dict(body.get("spec") or {})
    engine = str((raw_spec.get("autoscaling") or {}).get("engine", "keda"))
    config_error: tuple[str, str] | None = None
    spec: InferenceServiceSpec | None = None
    digest: str | None = None
    try:
        try:
            spec = parse_spec(raw_spec)
        except SpecError as err:
            config_error = ("InvalidSpec", str(err))
        keda = kube.crd_exists(KEDA_CRD)
        monitors = kube.crd_exists(SERVICE_MONITOR_CRD)
        deployment = kube.get("apps/v1", "Deployment", namespace, name)
        prom_url = None
        readings: dict[str, float | None] = {}
        prom_error: str | None = None
        builtin_note: str | None = None
        replicas: int | None = None
        if spec is not None:
            engine = spec.autoscaling.engine
            prom_url = spec.autoscaling.prometheus_address or config.prometheus_url
            if prom_url:
                queries = Queries.build(namespace, name)
                try:
                    readings = {
                        "queue": query_scalar(prom_url, queries.queue_depth),
                        "wait": query_scalar(prom_url, queries.wait_p95),
                        "permits": query_scalar(prom_url, queries.concurrency),
                        "utilisation": query_scalar(prom_url, queries.utilisation),
                    }
                except PrometheusError as err:
                    prom_error = str(err)
                if prom_error is None and engine == "builtin" and readings.get("queue") is None:
                    prom_error = "no sluiceway_queue_depth series for this InferenceService in Prometheus"
            if engine == "builtin":
                from sluiceway_core.policy import Signals

                current = int(((deployment or {}).get("spec") or {}).get("replicas") or 0)
                if deployment is None:
                    current = max(spec.autoscaling.min_replicas, 1)
                queue = readings.get("queue")
                if prom_url and prom_error is None and queue is not None:
                    signals = Signals(
                        queue_depth=queue, wait_p95=readings.get("wait"), utilisation=readings.get("utilisation")
                    )
                else:  # missing data holds the replicas: never scale down on an empty answer
                    detail = prom_error or (
                        "no sluiceway_queue_depth series in Prometheus" if prom_url else "Prometheus not configured"
                    )
                    signals = Signals(queue_depth=None, ok=False, detail=detail)
                replicas, builtin_note = _builtin_replicas(spec, current, signals, memo)
            hashes = _key_hashes(kube, namespace, spec)
            if isinstance(hashes, list):
                config_error = (hashes[0].reason, "; ".join(p.message for p in hashes))
            else:
                env = Environment(
                    scaler_address=config.scaler_address,
                    prometheus_url=config.prometheus_url,
                    keda=keda,
                    service_monitor=monitors,
                )
                try:
                    rendered = render(owner, spec, hashes, env, replicas=replicas)
                except SpecError as err:
                    config_error = ("InvalidConfig", str(err))
                else:
                    digest = rendered.config_hash
                    for manifest in rendered.manifests:
                        kube.apply(manifest)
                    for api_version, kind in rendered.absent:
                        if kube.delete_owned(api_version, kind, namespace, name, uid):
                            logger.info(f"pruned {kind} {namespace}/{name}")
                    deployment = kube.get("apps/v1", "Deployment", namespace, name)
        scaled_object = kube.get("keda.sh/v1alpha1", "ScaledObject", namespace, name) if keda else None
    except ApiError as err:
        raise kopf.TemporaryError(str(err), delay=10) from err

    if digest is None:
        digest = previous.get("configHash")
    observed = Observed(
        generation=generation,
        endpoint=endpoint_url(owner),
        engine=engine,
        spec_replicas=spec.replicas if spec is not None else int(raw_spec.get("replicas") or 1),
        spec_permits=spec.concurrency.permits if spec is not None else "auto",
        config_error=config_error,
        config_hash=digest,
        deployment=deployment,
        keda_installed=keda,
        scaled_object=scaled_object,
        prometheus_configured=bool(prom_url),
        prometheus_error=prom_error,
        queue_depth=readings.get("queue"),
        wait_p95=readings.get("wait"),
        live_permits=readings.get("permits"),
        builtin_note=builtin_note,
    )
    status = compute_status(observed, previous.get("conditions"), _now())
    patch.status.update(status)
    if config_error is not None:
        old = next((c for c in previous.get("conditions") or [] if c.get("type") == "ConfigValid"), None)
        if old is None or old.get("status") != "False" or old.get("message") != config_error[1]:
            kube.post_event(body, "Warning", config_error[0], config_error[1])
            logger.warning(f"ConfigValid=False ({config_error[0]}): {config_error[1]}")


def register(registry: kopf.OperatorRegistry, config: OperatorConfig, kube: Kube | None = None) -> None:
    """Register the handlers for one operator run. ``kube`` is created lazily at startup if None."""
    holder: dict[str, Kube] = {}
    if kube is not None:
        holder["kube"] = kube

    @kopf.on.login(registry=registry)
    def _login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A custom registry does not get kopf's default login handlers: use the kubernetes client's
        # configuration (in-cluster ServiceAccount, else KUBECONFIG / ~/.kube/config).
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        apply_kopf_settings(settings)
        if "kube" not in holder:
            holder["kube"] = Kube()

    def _reconcile(
        body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any
    ) -> None:
        reconcile(body, patch, memo, logger, config, holder["kube"])

    for decorator in (
        kopf.on.create(GROUP, VERSION, PLURAL, id="reconcile-create", registry=registry),
        kopf.on.update(GROUP, VERSION, PLURAL, id="reconcile-update", registry=registry),
        kopf.on.resume(GROUP, VERSION, PLURAL, id="reconcile-resume", registry=registry),
        kopf.timer(
            GROUP,
            VERSION,
            PLURAL,
            id="drift",
            interval=config.drift_interval,
            initial_delay=config.drift_interval,
            registry=registry,
        ),
    ):
        decorator(_reconcile)
    # kopf gives every timer a finalizer; ours holds no external state, so drop it (see docstring).
    spawning = registry._spawning  # no public API for this; covered by an integration test.
    for i, handler in enumerate(spawning._handlers):
        if handler.id == "drift":
            spawning._handlers[i] = dataclasses.replace(handler, requires_finalizer=False)
