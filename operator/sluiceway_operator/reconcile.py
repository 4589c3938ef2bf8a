"""The operator's two loops, split by concern, and the per-object state they share under a lock.

* :meth:`Reconciler.apply_children` - the **spec path** (kopf create/update/resume, and the drift
  ticker): read the referenced Secrets, render every child (pure), refuse names this
  InferenceService does not control, server-side *dry-run* every child, and only when all of them
  pass apply them, set the replica count (engines none/builtin), prune unwanted children and write
  the status. No Prometheus on this path: it is fast and only talks to the API server.
* :meth:`Reconciler.refresh_signals` - the **signals path** (the signals ticker): read Prometheus
  for the status columns, and for engine ``builtin`` run the shared scaling policy and set the
  replica count.

Concurrency model: kopf runs the (sync) change handlers in its thread pool and never runs two of
them for the same object at once; the tickers (:mod:`.ticker`) run the same methods from their own
worker threads. Every method takes the object's :class:`ObjectState` lock for its whole run, so the
spec path, the drift repair and the signals path of one InferenceService never interleave, while
different InferenceServices proceed in parallel. :class:`ObjectState` is the only mutable state; it
is reached only through :meth:`Reconciler.state`, whose map is guarded by its own lock. Decisions
use an injected monotonic clock.

Status: each path records its outcome in the state and writes the *whole* status (merge patch of
the status subresource) computed from both outcomes, so the two never overwrite each other's
conditions. A problem (ConfigValid=False) posts exactly one Warning Event until it changes.
"""

from __future__ import annotations

import base64
import datetime
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sluiceway_core.keys import hash_key, new_salt, parse_keys_text
from sluiceway_core.metric_names import START_PHASE_SECONDS
from sluiceway_core.policy import (
    ScaleDownPolicy,
    ScaleHistory,
    ScaleUpPolicy,
    ScalingSpec,
    Signals,
    desired_replicas,
)
from sluiceway_core.promclient import PromTimeout
from sluiceway_core.signals import Queries, selector
from sluiceway_core.units import parse_duration

from . import GROUP, KIND, VERSION
from .kube import (
    HTTP_ROUTE_CRD,
    KEDA_CRD,
    REPLICAS_MANAGER,
    SERVICE_MONITOR_CRD,
    ApiError,
    Kube,
    SecretProblem,
    controlled_by,
    is_refusal,
)
from .policy import POLICY_REASON, PROMETHEUS_REASON, check_policy
from .prom import PrometheusError, query_scalar, query_vector
from .render import (
    CONFIG_HASH_ANNOTATION,
    EDGE_TOKEN_KEY,
    KEYS_FILE,
    OCI_CREDENTIAL_KEYS,
    RBAC_API,
    S3_CREDENTIAL_KEYS,
    Environment,
    Owner,
    build_edge_secret,
    build_replicas,
    clamp_replicas,
    edge_secret_name,
    endpoint_url,
    has_shared_quota,
    render,
    selector_labels,
)
from .settings import OperatorConfig
from .spec import InferenceServiceSpec, SpecError, parse_spec
from .status import Observed, TenantQuota, build_startup, compute_status, newest_ready_pod

__all__ = ["ApplyOutcome", "ObjectState", "Reconciler", "SignalsOutcome", "builtin_scaling_spec"]

log = logging.getLogger(__name__)

#: An edge token the operator made (64 hex digits) or any the gateway and pods would accept.
_EDGE_TOKEN = re.compile(r"[A-Za-z0-9_-]{32,512}")
#: A Pod's name (a DNS subdomain) as it may appear in a PromQL label matcher.
_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")

#: The builtin engine keeps the GPU permits at most this busy (the scaler's default, 80 %).
BUILTIN_TARGET_UTILISATION = 0.8


#: The rate window of the builtin engine's queries (``Queries.build``: offered, completion and
#: admitted rates, the request cost).
BUILTIN_RATE_WINDOW = "2m"


def builtin_scaling_spec(spec: InferenceServiceSpec, decision_interval: float = 15.0) -> ScalingSpec:
    """The builtin engine's policy settings, from ``spec.autoscaling`` (pure). ``decision_interval``
    is the operator's signals interval (``SLUICEWAY_SIGNALS_INTERVAL``): a shortage term's count
    is held for the rate window plus a scrape (``monitoring.interval``) plus one decision, the time
    the load terms need to see what the new pods serve."""
    a = spec.autoscaling
    hold = parse_duration(BUILTIN_RATE_WINDOW) + parse_duration(spec.monitoring.interval) + decision_interval
    return ScalingSpec(
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
            max_percent=float(a.scale_down.max_percent_per_period),
            release_window=a.scale_down.release_window_seconds,
        ),
        shortage_hold=hold,
    )


@dataclass(frozen=True)
class ApplyOutcome:
    """What the spec path decided for one generation."""

    generation: int
    engine: str
    spec_replicas: int
    spec_permits: int | str
    config_error: tuple[str, str] | None
    config_hash: str | None
    keda: bool
    #: The spec's tenants and their quotas, and where they hold ("service" or "pod").
    tenant_quotas: tuple[TenantQuota, ...] = ()
    default_quota: TenantQuota | None = None
    quota_scope: str | None = None
    #: Whether ``spec.gateway.enabled``: ``status.endpoint`` is then the gateway's Service.
    gateway: bool = False
    #: Whether a storage initializer fetches the model: ``ModelFetched`` is then reported.
    model_fetch: bool = False
    #: ``gateway.httpRoute.parentRefs`` of the spec (0: no HTTPRoute asked), and whether the
    #: Gateway API's HTTPRoute CRD exists: ``HTTPRouteReady`` is then reported.
    route_parents: int = 0
    route_crd: bool = False


@dataclass(frozen=True)
class SignalsOutcome:
    """What the signals path read."""

    prometheus_configured: bool
    prometheus_error: str | None = None
    queue_depth: float | None = None
    wait_p95: float | None = None
    live_permits: float | None = None
    memory_bound_permits: float | None = None
    builtin_note: str | None = None
    #: Requests answered 2xx per second over all pods, per tenant; None = not read.
    tenant_admitted: Mapping[str, float] | None = None
    #: Whether Prometheus has the service's ``sluiceway_queue_depth`` series; None = not read.
    series_found: bool | None = None


@dataclass
class ObjectState:
    """Per-InferenceService memory. Touch only while holding ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    applied: ApplyOutcome | None = None
    signals: SignalsOutcome | None = None
    scale_history: ScaleHistory | None = None
    #: The (reason, message) last posted as a Warning Event.
    posted: tuple[str, str] | None = None
    #: The status last written (its conditions keep their lastTransitionTime).
    status: dict[str, Any] | None = None
    #: Since when (``clock``) the signals path found no series while pods were ready.
    series_missing_since: float | None = None
    #: MetricsAvailable's status ("True"/"False") last posted as an Event.
    metrics_posted: str | None = None
    #: ``status.startup`` as last measured (:func:`.status.build_startup`).
    startup: dict[str, Any] | None = None


def controlled_pod(pod: Mapping[str, Any], deployment: Mapping[str, Any]) -> bool:
    """Whether ``pod`` belongs to ``deployment``: its ReplicaSet's name is the Deployment's name
    and a hash (the labels alone could be copied by anyone who creates pods)."""
    dep = deployment["metadata"]["name"]
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(
        r.get("kind") == "ReplicaSet" and r.get("controller") and str(r.get("name", "")).startswith(f"{dep}-")
        for r in refs
    )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reconciler:
    """Both paths for every InferenceService of one operator process (see the module docstring)."""

    def __init__(
        self,
        config: OperatorConfig,
        kube: Kube,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.config = config
        self.kube = kube
        self.clock = clock
        #: Compared with the times the API server writes (how long a pod has been unschedulable).
        self.wall_clock = wall_clock
        self._states: dict[str, ObjectState] = {}
        self._states_lock = threading.Lock()

    # -- state ----------------------------------------------------------------------------------

    def state(self, uid: str) -> ObjectState:
        with self._states_lock:
            st = self._states.get(uid)
            if st is None:
                st = self._states[uid] = ObjectState()
            return st

    def forget(self, uid: str) -> None:
        with self._states_lock:
            self._states.pop(uid, None)

    # -- the loops' entry points ----------------------------------------------------------------

    def _current(self, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The object as the API server has it now (a watch may lag, e.g. after an API-server
        restart); None if it is gone, replaced (another uid) or being deleted."""
        meta = body["metadata"]
        obj = self.kube.get(f"{GROUP}/{VERSION}", KIND, meta["namespace"], meta["name"])
        if obj is None or obj["metadata"].get("uid") != meta["uid"] or obj["metadata"].get("deletionTimestamp"):
            return None
        return obj

    def drift_tick(self, body: Mapping[str, Any]) -> ApplyOutcome | None:
        """The drift loop: the spec path on the object's current state (repairs drift)."""
        current = self._current(body)
        return self.apply_children(current) if current is not None else None

    def signals_tick(self, body: Mapping[str, Any]) -> SignalsOutcome | None:
        """The signals loop: :meth:`refresh_signals` on the object's current state."""
        current = self._current(body)
        return self.refresh_signals(current) if current is not None else None

    # -- the spec path --------------------------------------------------------------------------

    def apply_children(self, body: Mapping[str, Any]) -> ApplyOutcome:
        """Render, check, dry-run, apply, prune, report. Raises :class:`ApiError` when transient."""
        meta = body["metadata"]
        st = self.state(meta["uid"])
        with st.lock:
            outcome = self._apply_locked(body, st)
            st.applied = outcome
            self._write_status(body, st)
            return outcome

    def _apply_locked(self, body: Mapping[str, Any], st: ObjectState) -> ApplyOutcome:
        meta = body["metadata"]
        name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
        owner = Owner(name=name, namespace=namespace, uid=uid)
        raw_spec = dict(body.get("spec") or {})
        generation = int(meta.get("generation") or 0)
        keda = self.kube.crd_exists(KEDA_CRD)
        # cached (Kube.crd_versions): without the CRD serving v1 the route is left out and the
        # status says why, never an apply that fails and retries
        route_crd = self.kube.crd_serves(HTTP_ROUTE_CRD, "v1")

        def outcome(
            spec: InferenceServiceSpec | None, error: tuple[str, str] | None, digest: str | None
        ) -> ApplyOutcome:
            if spec is None:
                engine = str((raw_spec.get("autoscaling") or {}).get("engine", "keda"))
                return ApplyOutcome(generation, engine, int(raw_spec.get("replicas") or 1), "auto", error, digest, keda)
            shared = self.config.quota_coordinator_url is not None and has_shared_quota(spec)
            return ApplyOutcome(
                generation,
                spec.autoscaling.engine,
                spec.replicas,
                spec.concurrency.permits,
                error,
                digest,
                keda,
                tenant_quotas=tuple(TenantQuota(tn.name, tn.rate, tn.max_concurrent) for tn in spec.tenants or []),
                default_quota=TenantQuota("", spec.access.defaults.rate, spec.access.defaults.max_concurrent),
                quota_scope="service" if shared else "pod",
                gateway=spec.gateway.enabled,
                model_fetch=spec.model.fetched,
                route_parents=len(spec.gateway.route_parents),
                route_crd=route_crd,
            )

        previous_hash = st.applied.config_hash if st.applied else (body.get("status") or {}).get("configHash")
        try:
            spec = parse_spec(raw_spec)
        except SpecError as err:
            return outcome(None, ("InvalidSpec", str(err)), previous_hash)
        refused = check_policy(spec, self.config.policy, self.config.scaler_address)
        if refused:
            return outcome(spec, (POLICY_REASON, "; ".join(refused)), previous_hash)
        address = spec.autoscaling.prometheus_address
        if address and not self.config.prometheus_allow_list.allows(address):
            return outcome(spec, (PROMETHEUS_REASON, self._prometheus_refusal(address)), previous_hash)
        salt = self._salt(namespace, name, uid)
        hashes = self._key_hashes(namespace, spec, salt)
        if isinstance(hashes, list):
            return outcome(spec, (hashes[0].reason, "; ".join(p.message for p in hashes)), previous_hash)
        stores = [(spec.model.s3, S3_CREDENTIAL_KEYS), (spec.model.oci, OCI_CREDENTIAL_KEYS)]
        for store, keys in stores:
            if store is not None and store.credentials_secret is not None:
                problem = self.kube.check_model_credentials(namespace, store.credentials_secret, keys)
                if problem is not None:
                    return outcome(spec, (problem.reason, problem.message), previous_hash)
        if spec.pod is not None:
            problems = [
                p for p in (self.kube.check_pod_secret(namespace, n) for n in spec.pod.secret_names()) if p is not None
            ]
            if problems:
                return outcome(spec, (problems[0].reason, "; ".join(p.message for p in problems)), previous_hash)
        env = Environment(
            scaler_address=self.config.scaler_address,
            prometheus_url=self.config.prometheus_url,
            keda=keda,
            service_monitor=self.kube.crd_exists(SERVICE_MONITOR_CRD),
            http_route=route_crd,
            scaler_authentication=self.config.scaler_authentication,
            quota_coordinator_url=self.config.quota_coordinator_url,
            quota_lease_seconds=self.config.quota_lease_seconds,
            quota_key=self.config.quota_key,
            service_monitor_labels=dict(self.config.service_monitor_labels),
            pod_log_format=self.config.pod_log_format,
            pod_tracing_endpoint=self.config.pod_tracing_endpoint,
            gateway_image=self.config.gateway_image,
        )
        deployment = self.kube.get("apps/v1", "Deployment", namespace, name)
        current = int(((deployment or {}).get("spec") or {}).get("replicas") or 0) if deployment else None
        try:
            edge = self._edge_token(namespace, name, uid) if spec.gateway.enabled and env.quota_key is None else None
            # the measured start phases (signals path), else those the status shows (a restarted
            # operator): the gateway's hold.startupSeconds, reloaded in place, never a rollout
            startup = st.startup if st.startup is not None else (body.get("status") or {}).get("startup")
            measured = startup if isinstance(startup, Mapping) else None
            rendered = render(owner, spec, hashes, env, replicas=current, salt=salt, edge_token=edge, startup=measured)
        except SpecError as err:
            return outcome(spec, ("InvalidConfig", str(err)), previous_hash)

        # Never adopt: an object of a child's name that this InferenceService does not control.
        conflicts = []
        for m in rendered.manifests:
            existing = (
                deployment
                if m["kind"] == "Deployment" and m["metadata"]["name"] == name
                else self.kube.get(m["apiVersion"], m["kind"], namespace, m["metadata"]["name"])
            )
            if existing is not None and not controlled_by(existing, uid):
                conflicts.append(f"{m['kind']} {namespace}/{m['metadata']['name']}")
        if conflicts:
            message = (
                f"{', '.join(conflicts)} already exist(s) and is not controlled by this InferenceService; "
                "rename the InferenceService or remove the object(s)"
            )
            return outcome(spec, ("NameConflict", message), previous_hash)

        # Everything the API server would refuse is found before anything is written. A RoleBinding
        # to a Role not created yet is the one exception: the API server's escalation check needs the
        # Role (it answers 403, not a refusal), so it is checked by its real apply, after the Role's.
        for m in rendered.manifests:
            if m["kind"] == "RoleBinding" and not self._role_exists(namespace, m):
                continue
            try:
                self.kube.apply(m, dry_run=True)
            except ApiError as err:
                if not is_refusal(err):
                    raise
                return outcome(
                    spec,
                    (
                        "ChildRejected",
                        f"{m['kind']} {namespace}/{m['metadata']['name']} refused by the API server: {err}",
                    ),
                    previous_hash,
                )

        if deployment is not None:
            self.kube.hand_over_replicas(deployment)
        for m in rendered.manifests:
            try:
                self.kube.apply(m)
            except ApiError as err:  # refused although the dry run passed (admission changed)
                if not is_refusal(err):
                    raise
                return outcome(
                    spec,
                    (
                        "ChildRejected",
                        f"{m['kind']} {namespace}/{m['metadata']['name']} refused by the API server: {err}",
                    ),
                    previous_hash,
                )
        if rendered.replicas is not None and rendered.replicas != current:
            self.kube.apply(build_replicas(owner, rendered.replicas), manager=REPLICAS_MANAGER)
        for api_version, kind, child in rendered.absent:
            if self.kube.delete_owned(api_version, kind, namespace, child, uid):
                log.info("pruned %s %s/%s", kind, namespace, child)
        if not spec.gateway.enabled:
            # The operator may not delete Secrets (its rules: get, create, patch): the gateway's
            # edge token is removed from <name>-edge instead, which goes with its InferenceService.
            held = self.kube.get("v1", "Secret", namespace, edge_secret_name(owner))
            if held is not None and controlled_by(held, uid) and held.get("data"):
                self.kube.apply(build_edge_secret(owner, None))
                log.info("emptied Secret %s/%s (gateway off)", namespace, edge_secret_name(owner))
        return outcome(spec, None, rendered.config_hash)

    def _role_exists(self, namespace: str, binding: Mapping[str, Any]) -> bool:
        ref = binding["roleRef"]
        return ref["kind"] != "Role" or self.kube.get(RBAC_API, "Role", namespace, ref["name"]) is not None

    def _prometheus_refusal(self, address: str) -> str:
        return (
            f"spec.autoscaling.prometheusAddress {address!r} is not on the operator's Prometheus allow-list "
            f"({self.config.prometheus_allow_list.describe()}); add it to SLUICEWAY_ALLOWED_PROMETHEUS "
            "(chart: operator.allowedPrometheusUrls) or leave the field empty"
        )

    def _salt(self, namespace: str, name: str, uid: str) -> bytes:
        """The service's key salt: the one in the keys Secret this object rendered before (so the
        hashes, and the pods, stay the same across reconciles), else a fresh one."""
        secret = self.kube.get("v1", "Secret", namespace, f"{name}-keys")
        if secret is not None and controlled_by(secret, uid):
            try:
                text = base64.b64decode((secret.get("data") or {}).get(KEYS_FILE, "")).decode()
                salt = parse_keys_text(text).salt
            except (ValueError, UnicodeDecodeError):
                salt = None
            if salt is not None:
                return salt
        return new_salt()

    def _edge_token(self, namespace: str, name: str, uid: str) -> str:
        """Without a quota key: the edge token this object's ``<name>-edge`` Secret holds (so the
        gateway and the pods keep theirs across reconciles and operator restarts), else a fresh
        random one (256 bits). Never logged."""
        secret = self.kube.get("v1", "Secret", namespace, edge_secret_name(Owner(name, namespace, uid)))
        if secret is not None and controlled_by(secret, uid):
            try:
                token = base64.b64decode((secret.get("data") or {}).get(EDGE_TOKEN_KEY, ""), validate=True).decode()
            except (ValueError, UnicodeDecodeError):
                token = ""
            if _EDGE_TOKEN.fullmatch(token):
                return token
        return secrets.token_hex(32)

    def _key_hashes(
        self, namespace: str, spec: InferenceServiceSpec, salt: bytes
    ) -> dict[str, str] | list[SecretProblem]:
        hashes: dict[str, str] = {}
        problems: list[SecretProblem] = []
        for tenant in spec.keyed_tenants:
            ref = tenant.key_secret_ref
            assert ref is not None
            value = self.kube.read_secret_value(namespace, ref.name, ref.key)
            if isinstance(value, SecretProblem):
                problems.append(SecretProblem(value.reason, f"tenant {tenant.name}: {value.message}"))
            else:
                hashes[tenant.name] = hash_key(value, salt)
        return problems or hashes

    # -- the signals path -----------------------------------------------------------------------

    def refresh_signals(self, body: Mapping[str, Any]) -> SignalsOutcome | None:
        """Read Prometheus; for engine builtin, decide and set the replicas. None if the spec is
        invalid (the spec path reports that). Raises :class:`ApiError` when transient."""
        meta = body["metadata"]
        try:
            spec = parse_spec(dict(body.get("spec") or {}))
        except SpecError:
            return None
        st = self.state(meta["uid"])
        with st.lock:
            outcome = self._signals_locked(body, spec, st)
            st.signals = outcome
            self._write_status(body, st)
            return outcome

    def _signals_locked(self, body: Mapping[str, Any], spec: InferenceServiceSpec, st: ObjectState) -> SignalsOutcome:
        meta = body["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        prom_url = spec.autoscaling.prometheus_address or self.config.prometheus_url
        readings: dict[str, float | None] = {}
        prom_error: str | None = None
        series_found: bool | None = None
        allow = self.config.prometheus_allow_list
        # One deadline for the whole pass (up to ten queries), so a server that answers each query
        # just inside its own timeout still cannot hold this worker (and the object's lock) longer.
        deadline = self.clock() + self.config.prometheus_timeout

        def remaining() -> float:
            left = deadline - self.clock()
            if left <= 0:
                raise PromTimeout(
                    f"Prometheus at {prom_url}: no complete answers within {self.config.prometheus_timeout:g}s"
                )
            return left

        def scalar(promql: str) -> float | None:
            assert prom_url is not None
            return query_scalar(prom_url, promql, allow=allow, timeout=remaining(), auth=self.config.prom_auth)

        if prom_url and not allow.allows(prom_url):
            prom_error = self._prometheus_refusal(prom_url)  # never fetched
        elif prom_url:
            q = Queries.build(namespace, name, BUILTIN_RATE_WINDOW)
            try:
                readings = {
                    "queue": scalar(q.queue_depth),
                    "wait": scalar(q.wait_p95),
                    "permits": scalar(q.concurrency),
                    "utilisation": scalar(q.utilisation),
                    "memory_bound": scalar(q.memory_bound) if q.memory_bound else None,
                }
                if spec.autoscaling.engine == "builtin":  # the policy's demand term and ready pods
                    readings |= {
                        "ready": scalar(q.pods_up),
                        "offered": scalar(q.offered_rate),
                        "completed": scalar(q.completion_rate),
                        "cost": scalar(q.request_cost),
                        # running + queued in the pods: the policy's concurrency term
                        "in_pods": scalar(q.requests_in_pods) if q.requests_in_pods else None,
                    }
            except PrometheusError as err:  # its message never holds the answer's bytes
                prom_error = str(err)
            if prom_error is None:
                series_found = readings.get("queue") is not None
            if prom_error is None and spec.autoscaling.engine == "builtin" and readings.get("queue") is None:
                prom_error = "no sluiceway_queue_depth series for this InferenceService in Prometheus"
        admitted: dict[str, float] | None = None
        if prom_url and prom_error is None and (spec.tenants or has_shared_quota(spec)):
            # its own read: a failure here leaves the rates unknown, never holds the builtin engine
            try:
                admitted = query_vector(
                    prom_url,
                    Queries.build(namespace, name).tenant_admitted_rate,
                    "tenant",
                    allow=allow,
                    timeout=remaining(),
                    auth=self.config.prom_auth,
                )
            except PrometheusError as err:
                log.warning("%s/%s: per-tenant admitted rates unavailable: %s", namespace, name, err)
        if prom_url and prom_error is None:
            try:
                self._measure_startup(Owner(name, namespace, meta["uid"]), prom_url, st, remaining)
            except PrometheusError as err:  # the last measurement stays; the engine is not held
                log.warning("%s/%s: start phases unavailable: %s", namespace, name, err)
        note: str | None = None
        if spec.autoscaling.engine == "builtin":
            note = self._builtin(spec, Owner(name, namespace, meta["uid"]), readings, prom_url, prom_error, st)
        return SignalsOutcome(
            prometheus_configured=bool(prom_url),
            prometheus_error=prom_error,
            queue_depth=readings.get("queue"),
            wait_p95=readings.get("wait"),
            live_permits=readings.get("permits"),
            memory_bound_permits=readings.get("memory_bound"),
            builtin_note=note,
            tenant_admitted=admitted,
            series_found=series_found,
        )

    def _measure_startup(self, owner: Owner, prom_url: str, st: ObjectState, remaining: Callable[[], float]) -> None:
        """``status.startup`` from the newest ready pod of the current revision: its scheduled phase
        from the Pod, the others from its ``sluiceway_start_phase_seconds{phase}`` series. Read once
        per pod (again while the pod has not reported ``ready``); lock held."""
        deployment = self.kube.get("apps/v1", "Deployment", owner.namespace, owner.name)
        if deployment is None or not controlled_by(deployment, owner.uid):
            return
        if not int((deployment.get("status") or {}).get("readyReplicas") or 0):
            return
        pods = [
            p
            for p in self.kube.list_pods(owner.namespace, selector_labels(owner.name))
            if controlled_pod(p, deployment)
        ]
        pod = newest_ready_pod(pods, deployment)
        pod_name = str(((pod or {}).get("metadata") or {}).get("name") or "")
        if pod is None or not _POD_NAME.fullmatch(pod_name):
            return
        if st.startup is not None and st.startup.get("pod") == pod_name:
            return  # measured (a pod's start does not change)
        promql = f'max by (phase) ({START_PHASE_SECONDS}{{{selector(owner.namespace, owner.name)},pod="{pod_name}"}})'
        phases = query_vector(
            prom_url,
            promql,
            "phase",
            allow=self.config.prometheus_allow_list,
            timeout=remaining(),
            auth=self.config.prom_auth,
        )
        tpl = (deployment.get("spec") or {}).get("template") or {}
        revision = ((tpl.get("metadata") or {}).get("annotations") or {}).get(CONFIG_HASH_ANNOTATION)
        startup = build_startup(pod, phases, revision if isinstance(revision, str) else None, _now())
        if startup is not None:
            st.startup = startup

    def _builtin(
        self,
        spec: InferenceServiceSpec,
        owner: Owner,
        readings: Mapping[str, float | None],
        prom_url: str | None,
        prom_error: str | None,
        st: ObjectState,
    ) -> str | None:
        """The shared policy (``sluiceway_core.policy``); missing data holds the replicas."""
        deployment = self.kube.get("apps/v1", "Deployment", owner.namespace, owner.name)
        if deployment is None or not controlled_by(deployment, owner.uid):
            return None  # the spec path creates it (or reports the conflict)
        current = int((deployment.get("spec") or {}).get("replicas") or 0)
        queue = readings.get("queue")
        if prom_url and prom_error is None and queue is not None:
            ready, permits, in_pods = readings.get("ready"), readings.get("permits"), readings.get("in_pods")
            signals = Signals(
                queue_depth=queue,
                wait_p95=readings.get("wait"),
                utilisation=readings.get("utilisation"),
                offered_rate=readings.get("offered"),
                completion_rate=readings.get("completed"),
                request_cost=readings.get("cost"),
                permits=int(permits) if permits is not None and permits >= 1 else None,
                ready_replicas=int(ready) if ready is not None and ready >= 0 else None,
                requests_in_pods=in_pods if in_pods is not None and in_pods >= 0 else None,
            )
        else:
            detail = prom_error or (
                "no sluiceway_queue_depth series in Prometheus" if prom_url else "Prometheus not configured"
            )
            signals = Signals(queue_depth=None, ok=False, detail=detail)
        scaling = builtin_scaling_spec(spec, self.config.signals_interval)
        decision = desired_replicas(signals, scaling, current, st.scale_history or ScaleHistory(), self.clock())
        st.scale_history = decision.history
        replicas = clamp_replicas(spec, decision.replicas)
        if replicas != current:
            self.kube.apply(build_replicas(owner, replicas), manager=REPLICAS_MANAGER)
        return f"{replicas} replicas: {decision.reason}"

    # -- status ---------------------------------------------------------------------------------

    def _write_status(self, body: Mapping[str, Any], st: ObjectState) -> None:
        """The whole status from both outcomes; one Warning Event per new problem. Lock held."""
        meta = body["metadata"]
        name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
        applied = st.applied
        if applied is None:
            return  # the spec path writes first (it runs on resume after every start)
        deployment = self.kube.get("apps/v1", "Deployment", namespace, name)
        if deployment is not None and not controlled_by(deployment, uid):
            deployment = None
        scaled_object = None
        if applied.keda and applied.engine in ("keda", "prometheus"):
            scaled_object = self.kube.get("keda.sh/v1alpha1", "ScaledObject", namespace, name)
            if scaled_object is not None and not controlled_by(scaled_object, uid):
                scaled_object = None
        # the Deployment's pods: ModelFetched (storage initializer) and PodsHealthy (why a pod cannot start)
        pods: list[dict[str, Any]] = []
        if deployment is not None:
            pods = [p for p in self.kube.list_pods(namespace, selector_labels(name)) if controlled_pod(p, deployment)]
        sig = st.signals
        ready = int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)
        if sig is None or sig.series_found is None:
            pass  # not read: the clock of the missing series neither starts nor stops
        elif sig.series_found or ready == 0:
            st.series_missing_since = None
        elif st.series_missing_since is None:
            st.series_missing_since = self.clock()
        missing = None if st.series_missing_since is None else self.clock() - st.series_missing_since
        observed = Observed(
            generation=applied.generation,
            endpoint=endpoint_url(Owner(name, namespace, uid), gateway=applied.gateway),
            engine=applied.engine,
            spec_replicas=applied.spec_replicas,
            spec_permits=applied.spec_permits,
            config_error=applied.config_error,
            config_hash=applied.config_hash,
            deployment=deployment,
            keda_installed=applied.keda,
            scaled_object=scaled_object,
            prometheus_configured=sig.prometheus_configured if sig else bool(self.config.prometheus_url),
            prometheus_error=sig.prometheus_error if sig else None,
            queue_depth=sig.queue_depth if sig else None,
            wait_p95=sig.wait_p95 if sig else None,
            live_permits=sig.live_permits if sig else None,
            memory_bound_permits=sig.memory_bound_permits if sig else None,
            builtin_note=sig.builtin_note if sig else None,
            signals_read=sig is not None,
            tenant_quotas=applied.tenant_quotas,
            default_quota=applied.default_quota,
            quota_scope=applied.quota_scope,
            tenant_admitted=sig.tenant_admitted if sig else None,
            series_found=sig.series_found if sig else None,
            series_missing_seconds=missing,
            model_fetch=applied.model_fetch,
            route_parents=applied.route_parents,
            route_crd=applied.route_crd,
            pods=pods,
            pods_read_at=self.wall_clock(),
            startup=st.startup,
        )
        previous = (st.status or body.get("status") or {}).get("conditions")
        status = compute_status(observed, previous, _now())
        if status != st.status:
            self.kube.patch_status(namespace, name, status)
            st.status = status
        self._post_metrics_transition(body, st, previous, status)
        problem = applied.config_error
        if problem is not None and problem != st.posted:
            old = next(
                (c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == "ConfigValid"), None
            )
            repeated = (
                st.posted is None
                and old is not None
                and old.get("status") == "False"
                and old.get("message") == problem[1]
            )
            if not repeated:  # not already posted by this process, nor before a restart
                self.kube.post_event(body, "Warning", problem[0], problem[1])
                log.warning("%s/%s ConfigValid=False (%s): %s", namespace, name, problem[0], problem[1])
        st.posted = problem

    def _post_metrics_transition(
        self,
        body: Mapping[str, Any],
        st: ObjectState,
        previous: Any,
        status: Mapping[str, Any],
    ) -> None:
        """One Event per MetricsAvailable transition between True and False (Warning when the series
        went missing, Normal when they came); none for Unknown, none again after a restart for a
        status the object already shows. Lock held."""
        cond = next((c for c in status.get("conditions") or [] if c.get("type") == "MetricsAvailable"), None)
        if cond is None or cond["status"] not in ("True", "False"):
            return
        if st.metrics_posted is None:  # this process has posted nothing: what did the object show?
            old = next((c for c in previous or [] if c.get("type") == "MetricsAvailable"), None)
            st.metrics_posted = old.get("status") if old is not None else None
        now = cond["status"]
        if now == st.metrics_posted:
            return
        if now == "False" or st.metrics_posted == "False":
            meta = body["metadata"]
            kind = "Warning" if now == "False" else "Normal"
            self.kube.post_event(body, kind, cond["reason"], cond["message"])
            log.log(
                logging.WARNING if now == "False" else logging.INFO,
                "%s/%s MetricsAvailable=%s (%s): %s",
                meta["namespace"],
                meta["name"],
                now,
                cond["reason"],
                cond["message"],
            )
        st.metrics_posted = now
