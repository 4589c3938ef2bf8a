"""Pure builders: a validated spec -> the manifests of one InferenceService's children.

No I/O and no clock: every input is an argument, so the output is a function of them (golden-tested
in ``tests/operator/test_operator_render.py``). Safe to call from any thread.

Children, all named after the InferenceService and owned by it (controller owner reference):

========================  ==================  ===============================================
kind                      name                what
========================  ==================  ===============================================
ConfigMap                 ``<name>-config``   the pod config (``config.yaml``), rendered and
                                              validated by :class:`sluiceway_core.config.PodConfig`
Secret                    ``<name>-keys``     ``keys.txt``: the salt and ``<hmac-of-key> <tenant>``
                                              lines; ``quota-token``: the quota charter's
                                              signature (with the quota coordinator)
Deployment                ``<name>``          the inference pods
Service                   ``<name>``          port ``http`` (8080) only: what clients call
Service                   ``<name>-metrics``  headless (no cluster IP), port ``metrics`` (9091):
                                              what the ServiceMonitor selects
PodDisruptionBudget       ``<name>``          ``maxUnavailable`` from the spec
ScaledObject (KEDA)       ``<name>``          engines ``keda`` and ``prometheus``, if KEDA exists
ServiceMonitor            ``<name>``          if the Prometheus-operator CRD exists; labels:
                                              the operator's defaults, then the spec's
ServiceAccount            ``<name>-gateway``  with ``spec.gateway.enabled``: the gateway's
                                              identity (its API token reads EndpointSlices)
Role, RoleBinding         ``<name>-gateway``  get/list/watch EndpointSlices in the namespace,
                                              nothing else
ConfigMap                 ``<name>-gateway``  ``gateway.yaml``: the gateway's config file
Deployment                ``<name>-gateway``  ``sluiceway-gateway serve``
Service                   ``<name>-gateway``  port ``http`` (8080): ``status.endpoint``
PodDisruptionBudget       ``<name>-gateway``  one gateway pod evicted at a time
Secret                    ``<name>-edge``     with the gateway: key ``token``, the edge token
                                              (:func:`derive_edge_token`), mounted in the
                                              gateway and the pods at ``/etc/sluiceway/edge/``
Service                   ``<name>-gateway-   with the gateway: headless, port ``metrics``,
                          metrics``           what the ServiceMonitor selects for the gateway
NetworkPolicy             ``<name>``          with the gateway (``gateway.networkPolicy``):
                                              port ``http`` of the pods from the gateway only
HTTPRoute (Gateway API)   ``<name>-gateway``  with ``gateway.httpRoute.parentRefs``, if the
                                              Gateway API CRDs exist: the parents' traffic to
                                              the gateway's Service, port ``http``
========================  ==================  ===============================================
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from sluiceway_core.config import ConfigError, PodConfig, build_config
from sluiceway_core.keys import keys_text as salted_keys_text
from sluiceway_core.quota import TenantQuota
from sluiceway_core.quota_charter import QuotaCharter, sign_charter
from sluiceway_core.signals import Queries
from sluiceway_core.units import parse_duration, parse_quantity, parse_rate

from . import GROUP, KIND, VERSION
from .spec import InferenceServiceSpec, InputTensorSpec, LimitsSpec, OutputTensorSpec, SpecError

__all__ = [
    "CONFIG_HASH_ANNOTATION",
    "HTTP_PORT",
    "METRICS_PORT",
    "PRESTOP_SLEEP_SECONDS",
    "SCALER_TRIGGER_TYPE",
    "Environment",
    "Owner",
    "Rendered",
    "build_config_map",
    "build_deployment",
    "build_edge_secret",
    "build_gateway_children",
    "build_gateway_config",
    "build_gateway_metrics_service",
    "build_http_route",
    "build_keys_secret",
    "build_metrics_service",
    "build_network_policy",
    "build_pdb",
    "build_pod_config",
    "build_quota",
    "build_quota_charter",
    "build_replicas",
    "build_scaled_object",
    "build_service",
    "build_service_monitor",
    "build_storage_initializer",
    "build_tensor",
    "clamp_replicas",
    "config_hash",
    "derive_edge_token",
    "edge_secret_name",
    "endpoint_url",
    "gateway_name",
    "has_shared_quota",
    "keys_text",
    "model_spec",
    "pod_config_hash",
    "pod_labels",
    "quota_token",
    "render",
    "scale_down_hpa_policies",
    "termination_grace_seconds",
]

HTTP_PORT = 8080
#: The pod serves ``/metrics`` on this separate port (container port ``metrics``, pod config
#: ``server.metricsPort``); the inference port does not serve it.
METRICS_PORT = 9091
CONFIG_DIR = "/etc/sluiceway"
CONFIG_FILE = "config.yaml"
KEYS_DIR = "/var/run/secrets/sluiceway"
KEYS_FILE = "keys.txt"
#: The quota charter's signature in the ``<name>-keys`` Secret (mounted with it under KEYS_DIR).
QUOTA_TOKEN_KEY = "quota-token"
#: The Deployment's ``maxSurge``: pods beyond the replica count during a rollout.
MAX_SURGE = 1
CONFIG_HASH_ANNOTATION = "sluiceway.io/config-hash"
INSTANCE_LABEL = "sluiceway.io/inferenceservice"
#: On the ``<name>-metrics`` Service only: what the ServiceMonitor selects.
METRICS_SERVICE_LABEL = "sluiceway.io/metrics"
#: On the inference pods of a service with the gateway: the chart's optional NetworkPolicy
#: (``networkPolicy.inferencePods``, http from the whole namespace) leaves these pods to the
#: operator's own, which admits only the gateway to their http port.
BEHIND_GATEWAY_LABEL = "sluiceway.io/behind-gateway"
RUN_AS = 65532
#: Extra seconds of termination grace beyond the preStop sleep and the drain budget (exit).
GRACE_SLACK_SECONDS = 10
#: preStop sleep: the pod keeps serving while the endpoints controller and the proxies remove it
#: from the Service, and only then gets SIGTERM and drains. Grace = preStop + drain + slack.
PRESTOP_SLEEP_SECONDS = 5


#: The gateway's config file in its ConfigMap (``sluiceway-gateway serve --config``).
GATEWAY_CONFIG_FILE = "gateway.yaml"
#: The gateway's drain budget (``sluiceway-gateway serve --drain-seconds``).
GATEWAY_DRAIN_SECONDS = 10
#: The gateway answers a request without a deadline header by this long after the pod's own
#: end-to-end budget (``timeouts.request``), so the pod's 504 reaches the client first.
GATEWAY_TIMEOUT_SLACK_SECONDS = 5
RBAC_API = "rbac.authorization.k8s.io/v1"
#: The edge token (``sluiceway_core.edge``): the Secret ``<name>-edge`` and its one key, mounted
#: (no subPath: a rotation reaches the running pods) in the gateway and the pods at EDGE_DIR.
EDGE_DIR = "/etc/sluiceway/edge"
EDGE_TOKEN_KEY = "token"
EDGE_TOKEN_FILE = f"{EDGE_DIR}/{EDGE_TOKEN_KEY}"
#: The gateway replicas' quota token (the signature of :func:`build_edge_quota_charter`): a second
#: key of ``<name>-edge``, mounted in the gateway only (the pods mount the ``token`` key alone).
EDGE_QUOTA_TOKEN_KEY = "quota-token"
EDGE_QUOTA_TOKEN_FILE = f"{EDGE_DIR}/{EDGE_QUOTA_TOKEN_KEY}"
#: The gateway Role's only rule: EndpointSlice reads in the InferenceService's namespace.
GATEWAY_RULE: Mapping[str, Any] = {
    "apiGroups": ["discovery.k8s.io"],
    "resources": ["endpointslices"],
    "verbs": ["get", "list", "watch"],
}


@dataclass(frozen=True)
class Owner:
    """The InferenceService being rendered."""

    name: str
    namespace: str
    uid: str


@dataclass(frozen=True)
class Environment:
    """What the cluster and the operator's settings add to the spec."""

    #: host:port of the sluiceway external scaler (used when the spec sets none).
    scaler_address: str = "sluiceway-scaler.sluiceway-system.svc:9090"
    #: Prometheus base URL (used when the spec sets none).
    prometheus_url: str | None = None
    #: Whether the KEDA ScaledObject CRD exists.
    keda: bool = False
    #: Whether the Prometheus-operator ServiceMonitor CRD exists.
    service_monitor: bool = False
    #: Whether the Gateway API HTTPRoute CRD exists (``httproutes.gateway.networking.k8s.io``).
    http_route: bool = False
    #: ClusterTriggerAuthentication holding KEDA's client certificate for the scaler's mutual TLS
    #: (KEDA reads caCert/tlsClientCert/tlsClientKey only from a TriggerAuthentication).
    scaler_authentication: str | None = None
    #: Base URL of the scaler's tenant-quota lease coordinator; set, tenant quotas hold for the
    #: whole service (pod config ``quota``), else each pod enforces the whole quota by itself.
    quota_coordinator_url: str | None = None
    #: The coordinator's lease period in seconds (the scaler's ``--quota-lease-seconds``).
    quota_lease_seconds: float = 3.0
    #: The key that signs quota charters (shared with the coordinator only); required with
    #: ``quota_coordinator_url``. Never printed.
    quota_key: bytes | None = field(default=None, repr=False)
    #: Labels of every ServiceMonitor (the operator's ``SLUICEWAY_SERVICEMONITOR_LABELS``, e.g. the
    #: ``release`` label kube-prometheus-stack selects on); the spec's own come on top.
    service_monitor_labels: Mapping[str, str] = field(default_factory=dict)
    #: The pods' log format when ``spec.observability.logFormat`` is unset (``SLUICEWAY_POD_LOG_FORMAT``).
    pod_log_format: str = "plain"
    #: The pods' OTLP/HTTP endpoint when ``spec.observability.tracing.endpoint`` is unset
    #: (``SLUICEWAY_POD_TRACING_ENDPOINT``); None = tracing off.
    pod_tracing_endpoint: str | None = None
    #: The gateway's image (``SLUICEWAY_GATEWAY_IMAGE``, chart ``operator.gatewayImage``): the
    #: ``sluiceway`` package with the ``gateway`` extra.
    gateway_image: str = "ghcr.io/sluiceway/sluiceway:0.1.0"


@dataclass(frozen=True)
class Rendered:
    """Everything one reconcile applies, plus facts the status reports."""

    manifests: list[dict[str, Any]]
    config_hash: str
    pod_config: PodConfig
    #: (apiVersion, kind, name) of children that are *not* desired and are pruned if present.
    absent: list[tuple[str, str, str]] = field(default_factory=list)
    #: The Deployment's replica count when the operator owns it (engines ``none`` and
    #: ``builtin``), applied with :func:`build_replicas`; ``None`` when an autoscaler owns it.
    replicas: int | None = None


def _component_labels(app: str, name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": app,
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": "sluiceway-operator",
        INSTANCE_LABEL: name,
    }


def pod_labels(name: str) -> dict[str, str]:
    return _component_labels("sluiceway-pod", name)


def selector_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "sluiceway-pod", INSTANCE_LABEL: name}


def gateway_name(owner: Owner) -> str:
    return f"{owner.name}-gateway"


def gateway_labels(name: str) -> dict[str, str]:
    """The gateway's children and pods: never the pods' ``app.kubernetes.io/name``, so neither the
    pods' Service nor their PDB selects a gateway pod."""
    return _component_labels("sluiceway-gateway", name)


def gateway_selector_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "sluiceway-gateway", INSTANCE_LABEL: name}


def edge_secret_name(owner: Owner) -> str:
    return f"{owner.name}-edge"


def derive_edge_token(key: bytes, owner: Owner) -> str:
    """The service's edge token from the operator's quota key: HMAC-SHA256 over
    ``edge:<namespace>/<name>`` (hex). The same for every reconcile and every operator replica; a
    different one for every service, and none can be derived from another without the key."""
    return hmac.new(key, f"edge:{owner.namespace}/{owner.name}".encode(), hashlib.sha256).hexdigest()


def build_edge_secret(owner: Owner, token: str | None, quota_token: str | None = None) -> dict[str, Any]:
    """``<name>-edge``: the edge token (``sluiceway_core.edge``), read by the gateway and the pods, and
    with ``quota_token`` the gateway replicas' charter signature (:func:`edge_quota_token`), mounted
    in the gateway only. ``None``: the Secret emptied (the gateway turned off; the operator may not
    delete Secrets)."""
    data = {EDGE_TOKEN_KEY: base64.b64encode(token.encode()).decode()} if token is not None else {}
    if token is not None and quota_token is not None:
        data[EDGE_QUOTA_TOKEN_KEY] = base64.b64encode(quota_token.encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(owner, edge_secret_name(owner)),
        "type": "Opaque",
        "data": data,
    }


def _edge_volume(owner: Owner, *, token_only: bool = False) -> dict[str, Any]:
    """The ``<name>-edge`` Secret as a volume (no subPath: a rotation reaches the running pods); the
    inference pods get its ``token`` key only, never the gateway's quota token."""
    secret: dict[str, Any] = {"secretName": edge_secret_name(owner)}
    if token_only:
        secret["items"] = [{"key": EDGE_TOKEN_KEY, "path": EDGE_TOKEN_KEY}]
    return {"name": "edge", "secret": secret}


EDGE_MOUNT: Mapping[str, Any] = {"name": "edge", "mountPath": EDGE_DIR, "readOnly": True}


def endpoint_url(owner: Owner, gateway: bool = False) -> str:
    """``status.endpoint``: the gateway's Service when it is on, else the pods' Service."""
    host = gateway_name(owner) if gateway else owner.name
    return f"http://{host}.{owner.namespace}.svc:{HTTP_PORT}"


def _metadata(owner: Owner, name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": dict(labels) if labels is not None else pod_labels(owner.name),
        "ownerReferences": [
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": owner.name,
                "uid": owner.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def _limits(limits: LimitsSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"weight": limits.weight}
    if limits.rate is not None:
        out["rate"] = parse_rate(limits.rate)
    for key in ("burst", "max_concurrent", "max_queued", "max_priority"):
        value = getattr(limits, key)
        if value is not None:
            out[key] = value
    return out


def has_shared_quota(spec: InferenceServiceSpec) -> bool:
    """Whether any tenant (listed, or anyone through ``access.defaults``) has a rate or
    concurrency quota: what the coordinator distributes among the pods."""
    return any(
        limits.rate is not None or limits.max_concurrent is not None
        for limits in [spec.access.defaults, *(spec.tenants or [])]
    )


def _max_pods(spec: InferenceServiceSpec) -> int:
    """The most pods of the Deployment at once: ``replicas`` (engine none) or ``maxReplicas``, plus
    the rollout's surge."""
    a = spec.autoscaling
    most = max(1, spec.replicas if a.engine == "none" else a.max_replicas)
    return most + spec.rollout.surge_pods(most)


def build_quota_charter(owner: Owner, spec: InferenceServiceSpec) -> QuotaCharter | None:
    """The operator's signed view of the service's quotas (:mod:`sluiceway_core.quota_charter`): the
    quota of every tenant a pod can serve (listed tenants with their own limits, the anonymous
    tenant with ``access.defaults`` when anonymous access is on and it is not listed), as the pod
    computes them (``TenantRegistry.quotas``); None when no tenant has a quota."""
    quotas: dict[str, TenantQuota] = {}
    for tn in spec.tenants or []:
        quotas[tn.name] = TenantQuota(parse_rate(tn.rate) if tn.rate else None, tn.burst, tn.max_concurrent)
    access = spec.access
    anonymous = access.allow_anonymous if access.allow_anonymous is not None else not spec.keyed_tenants
    if anonymous and access.anonymous_tenant not in quotas:
        d = access.defaults
        quotas[access.anonymous_tenant] = TenantQuota(parse_rate(d.rate) if d.rate else None, d.burst, d.max_concurrent)
    quotas = {t: q for t, q in quotas.items() if q.rate is not None or q.max_concurrent is not None}
    if not quotas:
        return None
    return QuotaCharter(f"{owner.namespace}/{owner.name}", quotas, _max_pods(spec))


def build_quota(owner: Owner, spec: InferenceServiceSpec, env: Environment) -> dict[str, Any] | None:
    """The pod config's ``quota`` section, or None (no coordinator, or no quota to share).

    ``assumed_replicas`` is the divisor of the fallback share before a pod's first lease:
    ``spec.replicas`` with engine ``none``, else ``maxReplicas``, the most pods that can run at
    once, so that pods started while the coordinator is unreachable never enforce more than the
    quota together (``minReplicas`` would let each pod the autoscaler adds enforce the whole quota:
    tests/quota/test_quota_with_autoscaling.py). Never the live count: it is in the config, whose
    hash rolls the pods, and a count that follows scaling would roll them on every scale. After its
    first lease a pod divides by the count the coordinator reports.

    ``charter`` is :func:`build_quota_charter` (public: the quotas are in the spec anyway); its
    signature, :func:`quota_token`, goes into the pod's Secret only, read from ``token_file``.
    """
    if env.quota_coordinator_url is None or not has_shared_quota(spec):
        return None
    charter = build_quota_charter(owner, spec)
    a = spec.autoscaling
    out: dict[str, Any] = {
        "coordinator_url": env.quota_coordinator_url,
        "service": f"{owner.namespace}/{owner.name}",
        "lease_seconds": env.quota_lease_seconds,
        "assumed_replicas": max(1, spec.replicas if a.engine == "none" else a.max_replicas),
        "token_file": f"{KEYS_DIR}/{QUOTA_TOKEN_KEY}",
    }
    if charter is not None:
        out["charter"] = charter.to_json()
    return out


def quota_token(owner: Owner, spec: InferenceServiceSpec, env: Environment) -> str | None:
    """The charter's signature (a secret of this service: the ``<name>-keys`` Secret only), or None
    when the pod config has no charter. Raises :class:`SpecError` when there is no key."""
    if env.quota_coordinator_url is None or not has_shared_quota(spec):
        return None
    charter = build_quota_charter(owner, spec)
    if charter is None:
        return None
    if env.quota_key is None:
        raise SpecError("the operator has no quota key (SLUICEWAY_QUOTA_KEY_FILE) to sign the quota charter")
    return sign_charter(env.quota_key, charter)


def edge_quota_service(owner: Owner) -> str:
    """The gateway replicas' lease pool: ``<namespace>/<name>.edge``, a name no InferenceService can
    have (its name is a DNS-1035 label: no dot), so the pods' leases and the gateway's never mix."""
    return f"{owner.namespace}/{owner.name}.edge"


def build_edge_quota_charter(owner: Owner, spec: InferenceServiceSpec) -> QuotaCharter | None:
    """The charter the gateway's replicas lease under (``sluiceway_gateway.admission``): each tenant's
    ``rate`` and ``burst`` as in :func:`build_quota_charter` (the edge leases no concurrency: the pods
    split ``maxConcurrent``), at most ``gateway.replicas + 1`` participants (the rollout's surge).
    None without the gateway, or when no tenant has a rate."""
    if not spec.gateway.enabled:
        return None
    pods = build_quota_charter(owner, spec)
    quotas = {t: TenantQuota(q.rate, q.bucket, None) for t, q in (pods.quotas if pods else {}).items()
              if q.rate is not None}
    if not quotas:
        return None
    return QuotaCharter(edge_quota_service(owner), quotas, spec.gateway.replicas + 1)


def build_edge_quota(owner: Owner, spec: InferenceServiceSpec, env: Environment) -> dict[str, Any] | None:
    """The gateway config's ``quota`` section (camelCase), or None: with the coordinator, the gateway's
    replicas split each tenant's rate and burst by leases as the pods do (``assumedReplicas``: the
    gateway's replica count, the fallback divisor before a first lease)."""
    charter = build_edge_quota_charter(owner, spec)
    if env.quota_coordinator_url is None or charter is None:
        return None
    return {
        "coordinatorUrl": env.quota_coordinator_url,
        "service": charter.service,
        "leaseSeconds": env.quota_lease_seconds,
        "assumedReplicas": spec.gateway.replicas,
        "charter": charter.to_json(),
        "tokenFile": EDGE_QUOTA_TOKEN_FILE,
    }


def edge_quota_token(owner: Owner, spec: InferenceServiceSpec, env: Environment) -> str | None:
    """The signature of :func:`build_edge_quota_charter` (a secret: the ``<name>-edge`` Secret only),
    or None when the gateway's config has no ``quota``. Raises :class:`SpecError` without a key."""
    if build_edge_quota(owner, spec, env) is None:
        return None
    charter = build_edge_quota_charter(owner, spec)
    assert charter is not None
    if env.quota_key is None:
        raise SpecError("the operator has no quota key (SLUICEWAY_QUOTA_KEY_FILE) to sign the quota charter")
    return sign_charter(env.quota_key, charter)


def build_tensor(tensor: OutputTensorSpec) -> dict[str, Any]:
    """A declared tensor as the pod config's ``model.inputs[]``/``outputs[]`` entry."""
    out: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
    if isinstance(tensor, InputTensorSpec) and tensor.max_shape is not None:
        out["max_shape"] = list(tensor.max_shape)
    return out


def build_pod_config(owner: Owner, spec: InferenceServiceSpec, env: Environment | None = None) -> PodConfig:
    """The pod's config, validated by the pod's own model. Raises :class:`SpecError`."""
    m = spec.model
    t = spec.timeouts
    queue_s = parse_duration(t.queue)
    tenants = []
    for tn in spec.tenants or []:
        entry = _limits(tn)
        entry["name"] = tn.name
        tenants.append(entry)
    degradation: dict[str, Any] = {
        "enabled": spec.degradation.enabled,
        "wait_threshold_seconds": parse_duration(spec.degradation.wait_threshold),
        "cache": {
            "enabled": spec.degradation.cache.enabled,
            "max_entries": spec.degradation.cache.max_entries,
            "ttl_seconds": parse_duration(spec.degradation.cache.ttl),
        },
    }
    raw_model: dict[str, Any] = {
        "spec": model_spec(spec),
        "name": m.name or owner.name,
        "version": m.version,
        "warmup_iterations": m.warmup_iterations,
    }
    if m.inputs is not None:
        raw_model["inputs"] = [build_tensor(s) for s in m.inputs]
    if m.outputs is not None:
        raw_model["outputs"] = [build_tensor(s) for s in m.outputs]
    if m.fallback is not None:
        degradation["fallback"] = {"spec": m.fallback.source, "permits": m.fallback.permits}
    raw: dict[str, Any] = {
        "model": raw_model,
        "server": {
            "host": "0.0.0.0",
            "port": HTTP_PORT,
            "metrics_port": METRICS_PORT,
            "drain_seconds": parse_duration(t.drain),
            "log_level": spec.log_level,
            **build_server_observability(spec, env),
        },
        "concurrency": {
            "permits": spec.concurrency.permits,
            "memory_reserve_bytes": parse_quantity(spec.concurrency.memory_reserve),
            "safety_factor": spec.concurrency.safety_factor_percent / 100,
            "cpu_default": spec.concurrency.cpu_default,
            "max_permits": spec.concurrency.max_permits,
            "probe_seconds": parse_duration(spec.concurrency.probe_duration),
            "probe_share": spec.concurrency.probe_share_percent / 100,
            "adaptive": spec.concurrency.adaptive,
            "adaptive_interval_seconds": parse_duration(spec.concurrency.adaptive_interval),
        },
        "queue": {
            "max_depth": spec.queue.max_depth,
            "target_wait_seconds": parse_duration(spec.queue.target_wait),
            "timeout_seconds": queue_s,
            "exec_timeout_seconds": parse_duration(t.request) - queue_s,
            "min_auto_depth": spec.queue.min_auto_depth,
            "max_auto_depth": spec.queue.max_auto_depth,
        },
        "priorities": {
            "classes": list(spec.priorities.classes),
            "default": spec.priorities.default,
            "aging_seconds": parse_duration(spec.priorities.aging),
        },
        "batching": {
            "max_batch_size": spec.batching.max_batch_size,
            "max_batch_wait_ms": parse_duration(spec.batching.max_wait) * 1000,
            "max_auto_batch_size": spec.batching.max_auto_batch_size,
        },
        "tenants": {
            "anonymous_tenant": spec.access.anonymous_tenant,
            "defaults": _limits(spec.access.defaults),
            "tenants": tenants,
        },
        "degradation": degradation,
    }
    if spec.access.allow_anonymous is not None:  # unset: the pod's rule (off when tenants have keys)
        raw["tenants"]["allow_anonymous"] = spec.access.allow_anonymous
    if spec.keyed_tenants:
        raw["tenants"]["keys_file"] = f"{KEYS_DIR}/{KEYS_FILE}"
    if spec.gateway.enabled:  # the pods trust the tenant and priority the gateway admitted
        raw["edge"] = {"token_file": EDGE_TOKEN_FILE}
    tracing = build_tracing(owner, spec, env)
    if tracing is not None:
        raw["tracing"] = tracing
    quota = build_quota(owner, spec, env) if env is not None else None
    if quota is not None:
        raw["quota"] = quota
    try:
        return build_config(raw)
    except ConfigError as err:
        raise SpecError(f"the pod config is invalid: {err}") from None


#: Where an s3/http(s) model is fetched to (an emptyDir) and a pvc:// claim is mounted.
MODEL_STORE_DIR = "/mnt/models"
#: The storage initializer's init container (its terminated state feeds ``ModelFetched``).
STORAGE_INITIALIZER = "storage-initializer"
TERMINATION_LOG = "/dev/termination-log"
#: The Secret keys a ``model.s3.credentialsSecret`` holds (what ``sluiceway-pod fetch`` reads).
S3_CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
S3_SESSION_TOKEN_KEY = "AWS_SESSION_TOKEN"
#: The Secret keys a ``model.oci.credentialsSecret`` holds (Basic, or the Bearer token exchange).
OCI_CREDENTIAL_KEYS = ("REGISTRY_USERNAME", "REGISTRY_PASSWORD")


def _pvc_uri(uri: str) -> tuple[str, str]:
    """``pvc://claim/some/path`` -> (``claim``, ``some/path``)."""
    claim, _, path = uri.removeprefix("pvc://").partition("/")
    return claim, path.rstrip("/")


def model_spec(spec: InferenceServiceSpec) -> str:
    """The pod config's ``model.spec``: the short form as written; a ``pvc://`` path under the
    claim's mount; an s3/http(s) model is the fetched directory (the pod loads the one model file
    in it). With format safetensors the weights file goes after ``module:factory@``."""
    m = spec.model
    if m.source is not None:
        return m.source
    assert m.storage_uri is not None
    if m.scheme == "pvc":
        path = _pvc_uri(m.storage_uri)[1]
        location = f"{MODEL_STORE_DIR}/{path}" if path else MODEL_STORE_DIR
    else:
        location = MODEL_STORE_DIR
    if m.format == "safetensors":
        name = m.storage_uri.rstrip("/").rsplit("/", 1)[-1]
        file = location if m.scheme == "pvc" else f"{MODEL_STORE_DIR}/{name}"
        return f"{m.factory}@{file}"
    return location


def build_storage_initializer(spec: InferenceServiceSpec) -> dict[str, Any] | None:
    """The init container that fetches an s3/http(s)/oci model into the model store (``sluiceway-pod
    fetch``, the pod's own image), or None. Credentials reach it only as ``secretKeyRef``
    environment variables (never in an argument, the ConfigMap or the status); its failure line goes
    to the termination log, which the operator reports as ``ModelFetched=False``."""
    m = spec.model
    if not m.fetched:
        return None
    assert m.storage_uri is not None
    command = [
        "sluiceway-pod",
        "fetch",
        "--uri",
        m.storage_uri,
        "--dest",
        MODEL_STORE_DIR,
        "--max-bytes",
        str(int(parse_quantity(m.storage_size_limit))),
        "--termination-log",
        TERMINATION_LOG,
    ]
    if m.sha256 is not None:
        command += ["--sha256", m.sha256]
    env: list[dict[str, Any]] = [{"name": "HOME", "value": "/tmp"}]
    if m.s3 is not None:
        if m.s3.endpoint is not None:
            command += ["--endpoint", m.s3.endpoint]
        if m.s3.region is not None:
            command += ["--region", m.s3.region]
        command += ["--addressing", "path" if m.s3.path_style else "virtual"]
        if m.s3.credentials_secret is not None:
            for key in S3_CREDENTIAL_KEYS:
                env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": m.s3.credentials_secret, "key": key}}})
            env.append(
                {
                    "name": S3_SESSION_TOKEN_KEY,
                    "valueFrom": {
                        "secretKeyRef": {"name": m.s3.credentials_secret, "key": S3_SESSION_TOKEN_KEY, "optional": True}
                    },
                }
            )
    if m.oci is not None and m.oci.credentials_secret is not None:
        for key in OCI_CREDENTIAL_KEYS:
            env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": m.oci.credentials_secret, "key": key}}})
    r = spec.resources
    return {
        "name": STORAGE_INITIALIZER,
        "image": m.image,
        "imagePullPolicy": m.image_pull_policy,
        "command": command,
        "env": env,
        "resources": {
            "requests": {"cpu": str(r.cpu), "memory": str(r.memory)},
            "limits": {"memory": str(r.memory)},
        },
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "model-store", "mountPath": MODEL_STORE_DIR}, {"name": "tmp", "mountPath": "/tmp"}],
    }


def build_server_observability(spec: InferenceServiceSpec, env: Environment | None) -> dict[str, Any]:
    """The pod config's ``server.logFormat`` and ``server.accessLog``: the spec's
    ``observability``, else the operator's default log format. Only what differs from the pod's
    defaults is rendered, so the config hash of a service that sets none of it stays as it was."""
    o = spec.observability
    out: dict[str, Any] = {}
    log_format = o.log_format or (env.pod_log_format if env is not None else "plain")
    if log_format != "plain":  # the pod's default stays unrendered: an operator upgrade rolls no pods
        out["log_format"] = log_format
    if o.access_log.enabled:
        percent = 100 if o.access_log.sample_percent is None else o.access_log.sample_percent
        out["access_log"] = {"enabled": True, "sample_rate": percent / 100}
    return out


def build_tracing(owner: Owner, spec: InferenceServiceSpec, env: Environment | None) -> dict[str, Any] | None:
    """The pod config's ``tracing``: on when the spec or the operator's default names an endpoint
    and the spec does not say ``enabled: false``; ``service.name`` defaults to the InferenceService's
    name. None = tracing off (the pod's default)."""
    t = spec.observability.tracing
    endpoint = t.endpoint or (env.pod_tracing_endpoint if env is not None else None)
    if not t.enabled or endpoint is None:
        return None
    percent = 100 if t.sample_percent is None else t.sample_percent
    return {"endpoint": endpoint, "sample_ratio": percent / 100, "service_name": t.service_name or owner.name}


def keys_text(key_hashes: Mapping[str, str], salt: bytes | None) -> str:
    """``keys.txt`` (:func:`sluiceway_core.keys.keys_text`): the salt line and one
    ``<hmac-hex> <tenant>`` line per tenant, sorted by tenant; empty when no tenant has a key."""
    if not key_hashes:
        return ""
    if salt is None:
        raise SpecError("tenant key hashes need the service's salt")
    return salted_keys_text(salt, key_hashes)


def pod_config_hash(cfg: PodConfig) -> str:
    """The pod template's ``sluiceway.io/config-hash``: what the pods read only at start, so a change
    rolls them. The ``tenants`` section of ``config.yaml`` (keys aside: limits, weights, priority
    ceilings, anonymous access, the defaults) and the key file ``keys.txt`` are not in it: the pods
    reload both in place when the kubelet updates the mounted ConfigMap and Secret, so a rotated key
    or a changed rate never restarts a GPU pod. The key file's path stays in (a restart setting).
    With the quota coordinator the ``quota`` section (its charter holds the quotas) stays in too."""
    data = cfg.model_dump(mode="json", by_alias=True, exclude_none=True)
    tenants = data.pop("tenants", None) or {}
    data["tenants"] = {"keysFile": tenants.get("keysFile")}
    return config_hash(yaml.safe_dump(data, sort_keys=True), "")


def config_hash(config_yaml: str, keys: str) -> str:
    """Hash of a config text and a key file (:func:`pod_config_hash`, :func:`gateway_config_hash`)."""
    h = hashlib.sha256()
    h.update(config_yaml.encode())
    h.update(b"\0")
    h.update(keys.encode())
    return h.hexdigest()[:16]


def build_config_map(owner: Owner, config_yaml: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner, f"{owner.name}-config"),
        "data": {CONFIG_FILE: config_yaml},
    }


def build_keys_secret(owner: Owner, keys: str, token: str | None = None) -> dict[str, Any]:
    """Key hashes only (never the keys), and the quota charter's signature when there is one.
    Always present so the pod template never changes shape."""
    data = {KEYS_FILE: base64.b64encode(keys.encode()).decode()}
    if token is not None:
        data[QUOTA_TOKEN_KEY] = base64.b64encode(token.encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(owner, f"{owner.name}-keys"),
        "type": "Opaque",
        "data": data,
    }


def termination_grace_seconds(spec: InferenceServiceSpec) -> int:
    """preStop sleep + the drain budget + slack: SIGTERM comes after preStop, then the pod drains."""
    return PRESTOP_SLEEP_SECONDS + math.ceil(parse_duration(spec.timeouts.drain)) + GRACE_SLACK_SECONDS


def _http_probe(path: str, period: int, failures: int) -> dict[str, Any]:
    """Probes go to the metrics port: the pod serves them there too, outside the inference port's
    connection limit, so a flood of tenants cannot fail liveness."""
    return {
        "httpGet": {"path": path, "port": "metrics"},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def build_deployment(
    owner: Owner, spec: InferenceServiceSpec, digest: str, *, pod_name_env: bool = False
) -> dict[str, Any]:
    """The Deployment, without ``spec.replicas``: the replica count is applied on its own, under a
    separate field manager (:func:`build_replicas`), so switching engines never drops it."""
    r = spec.resources
    resources: dict[str, Any] = {
        "requests": {"cpu": str(r.cpu), "memory": str(r.memory)},
        "limits": {"memory": str(r.memory)},
    }
    if r.gpus > 0:
        resources["requests"][r.gpu_resource_name] = str(r.gpus)
        resources["limits"][r.gpu_resource_name] = str(r.gpus)
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "keys", "mountPath": KEYS_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": f"{owner.name}-config"}},
        {"name": "keys", "secret": {"secretName": f"{owner.name}-keys"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    pvc = spec.model.persistent_volume_claim
    if pvc is not None:
        mounts.append({"name": "model", "mountPath": pvc.mount_path, "readOnly": True})
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True}})
    if spec.model.scheme == "pvc":
        assert spec.model.storage_uri is not None
        claim = _pvc_uri(spec.model.storage_uri)[0]
        mounts.append({"name": "model", "mountPath": MODEL_STORE_DIR, "readOnly": True})
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
    initializer = build_storage_initializer(spec)
    if initializer is not None:
        mounts.append({"name": "model-store", "mountPath": MODEL_STORE_DIR, "readOnly": True})
        volumes.append({"name": "model-store", "emptyDir": {"sizeLimit": str(spec.model.storage_size_limit)}})
    if spec.gateway.enabled:
        mounts.append(dict(EDGE_MOUNT))
        volumes.append(_edge_volume(owner, token_only=True))
    extra = spec.pod
    if extra is not None and extra.shm_size is not None:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": str(extra.shm_size)}})
    if extra is not None:
        mounts += [m.model_dump(by_alias=True, exclude_none=True) for m in extra.volume_mounts or []]
        volumes += [dict(v) for v in extra.volumes or []]
    container: dict[str, Any] = {
        "name": "sluiceway-pod",
        "image": spec.model.image,
        "imagePullPolicy": spec.model.image_pull_policy,
        "command": [
            "sluiceway-pod",
            "serve",
            "--config",
            f"{CONFIG_DIR}/{CONFIG_FILE}",
            # a model that fails to load writes why there (PodsHealthy shows it)
            "--termination-log",
            TERMINATION_LOG,
        ],
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "env": [{"name": "HOME", "value": "/tmp"}]
        + (
            # the quota client names its leases after the pod (sluiceway_core.config.QuotaConfig)
            [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}] if pod_name_env else []
        )
        # spec.pod's own, after the operator's (whose names it may not use)
        + [e.model_dump(by_alias=True, exclude_none=True) for e in (extra.env or [] if extra is not None else [])],
        "resources": resources,
        "startupProbe": _http_probe("/v2/health/live", 5, 120),
        "livenessProbe": _http_probe("/v2/health/live", 10, 3),
        "readinessProbe": _http_probe("/v2/health/ready", 5, 2),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_SECONDS}}},
        # A model that fails to load writes its error to the termination file (--termination-log);
        # a serving process that dies writes none: the kubelet then takes the log's tail. Either
        # way the PodsHealthy condition shows the last line (scrubbed, bounded; status.py).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    if extra is not None and extra.env_from:
        container["envFrom"] = [f.model_dump(by_alias=True, exclude_none=True) for f in extra.env_from]
    pod_spec: dict[str, Any] = {
        **({"initContainers": [initializer]} if initializer is not None else {}),
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "enableServiceLinks": False,
        # User models run here: no Kubernetes API credentials in the pod.
        "automountServiceAccountToken": False,
    }
    ids = extra.security_context if extra is not None else None
    if ids is not None and ids.platform_assigns_ids:
        for key in ("runAsUser", "runAsGroup", "fsGroup"):
            del pod_spec["securityContext"][key]
    elif ids is not None:
        for key, value in (("runAsUser", ids.run_as_user), ("runAsGroup", ids.run_as_group), ("fsGroup", ids.fs_group)):
            if value is not None:
                pod_spec["securityContext"][key] = value
    if extra is not None and extra.topology_spread_constraints:
        pod_spec["topologySpreadConstraints"] = [dict(c) for c in extra.topology_spread_constraints]
    if spec.service_account_name:
        pod_spec["serviceAccountName"] = spec.service_account_name
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    p = spec.placement
    if p is not None:
        if p.node_selector:
            pod_spec["nodeSelector"] = dict(p.node_selector)
        if p.tolerations:
            pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in p.tolerations]
        if p.affinity:
            pod_spec["affinity"] = p.affinity
        if p.priority_class_name:
            pod_spec["priorityClassName"] = p.priority_class_name
        if p.runtime_class_name:
            pod_spec["runtimeClassName"] = p.runtime_class_name
    dep_spec: dict[str, Any] = {
        "selector": {"matchLabels": selector_labels(owner.name)},
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": spec.rollout.max_surge, "maxUnavailable": spec.rollout.max_unavailable},
        },
        "template": {
            "metadata": {
                # spec.pod's labels and annotations first: the operator's own (selector, hash) always win
                "labels": {
                    **((extra.labels or {}) if extra is not None else {}),
                    **pod_labels(owner.name),
                    **({BEHIND_GATEWAY_LABEL: "true"} if spec.gateway.enabled and spec.gateway.network_policy else {}),
                },
                "annotations": {
                    **((extra.annotations or {}) if extra is not None else {}),
                    CONFIG_HASH_ANNOTATION: digest,
                },
            },
            "spec": pod_spec,
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, owner.name),
        "spec": dep_spec,
    }


def build_replicas(owner: Owner, replicas: int) -> dict[str, Any]:
    """A replicas-only apply of the Deployment, for the replicas field manager.

    The Kubernetes docs' "transferring ownership" for server-side apply: ``spec.replicas`` is
    owned by its own manager (``sluiceway-operator-replicas``), never by the manager that applies
    the Deployment, so the Deployment's apply never removes it. When an autoscaler takes over,
    this apply stops and the field keeps its value until the HPA changes it.
    """
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": owner.name, "namespace": owner.namespace},
        "spec": {"replicas": replicas},
    }


def clamp_replicas(spec: InferenceServiceSpec, replicas: int | None) -> int:
    """The builtin engine's count within ``[minReplicas, maxReplicas]`` (``minReplicas`` if unknown)."""
    a = spec.autoscaling
    return min(a.max_replicas, max(a.min_replicas, replicas if replicas is not None else a.min_replicas))


def build_service(owner: Owner) -> dict[str, Any]:
    """What clients call: the inference port only. ``/metrics`` names every tenant and is not on it
    (:func:`build_metrics_service`)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, owner.name),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner.name),
            "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def metrics_service_name(owner: Owner) -> str:
    return f"{owner.name}-metrics"


def build_metrics_service(owner: Owner) -> dict[str, Any]:
    """``<name>-metrics``: headless (no cluster IP, nothing load-balances to it), port ``metrics``;
    the endpoints a ServiceMonitor (or a plain ``kubernetes_sd`` endpoints job) scrapes."""
    meta = _metadata(owner, metrics_service_name(owner))
    meta["labels"] = {**meta["labels"], METRICS_SERVICE_LABEL: "true"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(owner.name),
            "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}],
        },
    }


def build_pdb(owner: Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(owner, owner.name),
        "spec": {
            "maxUnavailable": spec.disruption.max_unavailable,
            "selector": {"matchLabels": selector_labels(owner.name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def _seconds(text: str) -> int:
    return math.ceil(parse_duration(text))


def _num(x: float) -> str:
    """A KEDA metadata number: integers without a fraction, others as short decimals."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


#: KEDA opens ``StreamIsActive`` (the scaler's push path) only for ``external-push``; with
#: ``external`` it polls ``IsActive`` after every ``GetMetrics``. The HPA path (GetMetricSpec /
#: GetMetrics) is the same for both types.
SCALER_TRIGGER_TYPE = "external-push"


def scale_down_windows(spec: InferenceServiceSpec) -> tuple[int, int]:
    """``(hpa_seconds, scaler_seconds)``: how the spec's scale-down window is split.

    Both the HPA's ``behavior.scaleDown`` window and the sluiceway scaler's
    ``scaleDownWindowSeconds`` stabilise, and a drop shows after their *sum*. With engine ``keda``
    the scaler holds the whole window (it also holds on missing data) and the HPA's is 0; with
    engine ``prometheus`` (KEDA's own triggers, no window of their own) the HPA holds all of it.
    The two always add up to ``autoscaling.scaleDown.stabilizationWindow``.
    """
    window = _seconds(spec.autoscaling.scale_down.stabilization_window)
    return (0, window) if spec.autoscaling.engine == "keda" else (window, 0)


#: ``behavior.scaleUp.tolerance`` with engine ``keda``: the HPA acts on any rise of the scaler's
#: answer. The HPA's default (kube-controller-manager ``--horizontal-pod-autoscaler-tolerance``,
#: 0.1) ignores a desired count within 10 % of the current one, which suits a raw, noisy metric;
#: the scaler's metric is a count it has already stabilised, and the dead band let a rising load run
#: the pods at up to 88 % instead of the 80 % target (bench/scalesim, docs/scalesim.md: long diurnal
#: was dominated by KEDA's concurrency trigger and the HPA on utilisation with it). Scale-down
#: keeps the HPA's tolerance. The field needs the HPAConfigurableTolerance feature gate (alpha in
#: Kubernetes 1.33-1.34, beta and on by default from 1.35); without it the API server drops the
#: field and the HPA keeps its 10 %.
HPA_SCALE_UP_TOLERANCE = "0"

#: The HPA's default scale-down policy: follow the metric's answer within one sync period or so.
HPA_UNPACED_SCALE_DOWN = ({"type": "Percent", "value": 100, "periodSeconds": 15},)


def scale_down_hpa_policies(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The HPA's ``behavior.scaleDown.policies``: who paces the scale-down, once.

    With engine ``keda`` the sluiceway scaler paces (``scaleDownMaxPods``/``MaxPercent`` per
    ``scaleDownPeriodSeconds``) and releases a surplus that outlasted
    ``scaleDownReleaseWindowSeconds`` (``sluiceway_core.policy``, steps 4 and 5); an HPA that paced
    again would hold the released count back at 2 % a minute (bench/scalesim, row
    ``ours-keda-hpa-paced``), so it follows the scaler's answer (100 % per 15 s, the HPA's default).
    With engine ``prometheus`` (KEDA's own triggers) the HPA is the only pacer: the spec's pace.
    """
    down = spec.autoscaling.scale_down
    if spec.autoscaling.engine == "keda":
        return [dict(p) for p in HPA_UNPACED_SCALE_DOWN]
    period = _seconds(down.period)
    return [
        {"type": "Pods", "value": down.max_pods_per_period, "periodSeconds": period},
        {"type": "Percent", "value": down.max_percent_per_period, "periodSeconds": period},
    ]


def build_scaled_object(owner: Owner, spec: InferenceServiceSpec, env: Environment) -> dict[str, Any]:
    """KEDA ScaledObject: fast up, slow down, never below current replicas on signal loss.

    ``pollingInterval`` is how often KEDA reads the signals: every trigger has ``useCachedMetrics``,
    so KEDA reads each trigger once per interval and answers the HPA's requests from that reading
    (without it, KEDA uses the interval only for scaling from and to zero, and its admission webhook
    warns that it is not relevant: kedacore/keda#7271). The HPA still acts once per its sync period
    (kube-controller-manager ``--horizontal-pod-autoscaler-sync-period``, 15 s by default).
    ``cooldownPeriod`` matters only for ``minReplicaCount: 0`` (KEDA's 1 -> 0 after that long since the
    scaler last answered active): ``autoscaling.scaleToZeroAfter`` then, not rendered otherwise.
    """
    a = spec.autoscaling
    wait_target = parse_duration(a.target_wait_p95)
    prometheus = a.prometheus_address or env.prometheus_url
    hpa_window, scaler_window = scale_down_windows(spec)
    scale_up: dict[str, Any] = {"stabilizationWindowSeconds": _seconds(a.scale_up.stabilization_window)}
    if a.engine == "keda":
        # The scaler answers a replica count it has already stabilised: the HPA's 10 % dead band
        # above it only delays a rise (HPA_SCALE_UP_TOLERANCE).
        scale_up["tolerance"] = HPA_SCALE_UP_TOLERANCE
    behavior = {
        "scaleUp": {
            **scale_up,
            "selectPolicy": "Max",
            "policies": [
                {
                    "type": "Pods",
                    "value": a.scale_up.max_pods_per_period,
                    "periodSeconds": _seconds(a.scale_up.period),
                },
                {
                    "type": "Percent",
                    "value": a.scale_up.max_percent_per_period,
                    "periodSeconds": _seconds(a.scale_up.period),
                },
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": hpa_window,
            # the policy allowing more removal applies, as in the scaler (sluiceway_core.policy)
            "selectPolicy": "Max",
            "policies": scale_down_hpa_policies(spec),
        },
    }
    so_spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": owner.name},
        "pollingInterval": _seconds(a.polling_interval),
        "minReplicaCount": a.min_replicas,
        "maxReplicaCount": a.max_replicas,
        "advanced": {
            "restoreToOriginalReplicaCount": False,
            "horizontalPodAutoscalerConfig": {"name": f"keda-hpa-{owner.name}", "behavior": behavior},
        },
    }
    if a.min_replicas == 0:  # only then does KEDA's cooldown decide anything
        so_spec["cooldownPeriod"] = _seconds(a.scale_to_zero_after)
    if a.engine == "keda":
        metadata: dict[str, str] = {
            "scalerAddress": a.scaler_address or env.scaler_address,
            "namespace": owner.namespace,
            "inferenceService": owner.name,
            "targetQueueDepthPerReplica": str(a.target_queue_depth_per_replica),
            "targetWaitP95Seconds": _num(wait_target),
            "minReplicas": str(a.min_replicas),
            "maxReplicas": str(a.max_replicas),
            "scaleUpMaxPods": str(a.scale_up.max_pods_per_period),
            "scaleUpMaxPercent": str(a.scale_up.max_percent_per_period),
            "scaleDownWindowSeconds": str(scaler_window),
            "scaleDownMaxPods": str(a.scale_down.max_pods_per_period),
            "scaleDownMaxPercent": str(a.scale_down.max_percent_per_period),
            "scaleDownPeriodSeconds": str(_seconds(a.scale_down.period)),
            # 0: off (sluiceway_scaler.metadata); the CRD keeps it longer than the window
            "scaleDownReleaseWindowSeconds": _num(a.scale_down.release_window_seconds or 0),
        }
        if prometheus:
            metadata["prometheusAddress"] = prometheus
        trigger: dict[str, Any] = {
            "type": SCALER_TRIGGER_TYPE,
            "metricType": "AverageValue",
            "useCachedMetrics": True,
            "metadata": metadata,
        }
        if env.scaler_authentication:
            trigger["authenticationRef"] = {"name": env.scaler_authentication, "kind": "ClusterTriggerAuthentication"}
        so_spec["triggers"] = [trigger]
        # Fallback needs AverageValue triggers; the external trigger is one.
        so_spec["fallback"] = {
            "failureThreshold": 3,
            "replicas": a.fallback_replicas if a.fallback_replicas is not None else max(a.min_replicas, 1),
            "behavior": "currentReplicasIfHigher",
        }
    else:  # prometheus: KEDA's own triggers
        # ignoreNullValues "false": an empty answer (no series, Prometheus lost the pods) is an
        # error, not 0, so the HPA holds the replica count instead of scaling down (the HPA never
        # scales down while a metric fails). No ``fallback``: KEDA allows it only when every
        # trigger is AverageValue, and wait p95 is a Value metric.
        if not prometheus:
            raise SpecError(
                "autoscaling.engine prometheus needs autoscaling.prometheusAddress (or the operator's --prometheus-url)"
            )
        so_spec["triggers"] = [
            {
                "type": "prometheus",
                "name": "queue-depth",
                "metricType": "AverageValue",
                "useCachedMetrics": True,
                "metadata": {
                    "serverAddress": prometheus,
                    "query": Queries.build(owner.namespace, owner.name).queue_depth,
                    "threshold": str(a.target_queue_depth_per_replica),
                    "ignoreNullValues": "false",
                },
            },
            {
                "type": "prometheus",
                "name": "wait-p95",
                "metricType": "Value",
                "useCachedMetrics": True,
                "metadata": {
                    "serverAddress": prometheus,
                    "query": Queries.build(owner.namespace, owner.name).wait_p95,
                    "threshold": _num(wait_target),
                    "ignoreNullValues": "false",
                },
            },
        ]
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": _metadata(owner, owner.name),
        "spec": so_spec,
    }


def build_service_monitor(
    owner: Owner, spec: InferenceServiceSpec, defaults: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Selects the ``<name>-metrics`` Service and, with the gateway, ``<name>-gateway-metrics``.
    Every series gets ``namespace``, ``pod`` (the Prometheus operator's own target labels) and
    ``inferenceservice``; the gateway's also ``component="gateway"``. Labels: ``defaults`` (the
    operator's), then the spec's ``monitoring.serviceMonitorLabels``, then the operator's own (which
    always win)."""
    meta = _metadata(owner, owner.name)
    meta["labels"] = {**(defaults or {}), **spec.monitoring.service_monitor_labels, **meta["labels"]}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": {INSTANCE_LABEL: owner.name, METRICS_SERVICE_LABEL: "true"}},
            "endpoints": [
                {
                    "port": "metrics",
                    "path": "/metrics",
                    "interval": spec.monitoring.interval,
                    "relabelings": [
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_label_sluiceway_io_inferenceservice"],
                            "targetLabel": "inferenceservice",
                        },
                        # the gateway's targets (<name>-gateway-metrics): component="gateway", so
                        # that counting the pods' targets (up) leaves them out (sluiceway_core.signals)
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
                            "regex": "sluiceway-gateway",
                            "targetLabel": "component",
                            "replacement": "gateway",
                        },
                    ],
                }
            ],
        },
    }


SCALED_OBJECT = ("keda.sh/v1alpha1", "ScaledObject")
SERVICE_MONITOR = ("monitoring.coreos.com/v1", "ServiceMonitor")
#: (apiVersion, kind) of every gateway child, each named ``<name>-gateway``, in apply order.
GATEWAY_KINDS = (
    ("v1", "ServiceAccount"),
    (RBAC_API, "Role"),
    (RBAC_API, "RoleBinding"),
    ("v1", "ConfigMap"),
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("policy/v1", "PodDisruptionBudget"),
)


def gateway_startup_seconds(spec: InferenceServiceSpec, startup: Mapping[str, Any] | None) -> float | None:
    """The gateway's ``hold.startupSeconds``: the measured ``status.startup.totalSeconds`` (the sum of
    the phases of the current revision's last start), rounded up to a whole second so that a new
    measurement a few milliseconds off does not rewrite the ConfigMap; until one is measured,
    ``spec.gateway.startupEstimate``; else None (no prediction). Within the gateway's (0, 3600]."""
    total = (startup or {}).get("totalSeconds")
    if isinstance(total, (int, float)) and not isinstance(total, bool) and math.isfinite(total) and total >= 0:
        return float(min(3600, max(1, math.ceil(total))))
    if spec.gateway.startup_estimate is not None:
        return float(min(3600, max(1, math.ceil(parse_duration(spec.gateway.startup_estimate)))))
    return None


def build_gateway_hold(spec: InferenceServiceSpec, startup_seconds: float | None = None) -> dict[str, Any]:
    """The gateway config's ``hold`` section (``sluiceway_gateway.config.HoldConfig``, camelCase) from
    ``spec.gateway.hold``: every bound written out (the spec's defaults are the gateway's), the
    tenant share as a fraction, ``retryAfter`` in seconds; ``startupSeconds`` only when known."""
    h = spec.gateway.hold
    hold: dict[str, Any] = {
        "maxRequests": h.max_requests,
        "maxBytes": h.max_bytes_value,
        "tenantShare": h.tenant_share_percent / 100,
        "handoffQueuePerPod": h.handoff_queue_per_pod,
        "retryAfterSeconds": parse_duration(h.retry_after),
    }
    if startup_seconds is not None:
        hold["startupSeconds"] = startup_seconds
    return hold


def build_gateway_config(
    owner: Owner,
    spec: InferenceServiceSpec,
    cfg: PodConfig,
    startup_seconds: float | None = None,
    quota: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The gateway's config file (``gateway/sluiceway_gateway/config.py``, camelCase): discovery
    through the EndpointSlices of the pods' Service (port ``http``), the spec's routing, and the
    pods' own ``tenants`` and ``priorities`` blocks, so that the gateway admits exactly as the pods
    do (the same key-hash file, mounted at the same path) but for the whole service; with
    ``startup_seconds`` (:func:`gateway_startup_seconds`) the hold queue's start-up estimate
    (``hold.startupSeconds``, which the gateway reloads in place: not in :func:`gateway_config_hash`);
    with ``quota`` (:func:`build_edge_quota`) the replicas' leases of each tenant's rate and burst."""
    timeout = min(3600.0, parse_duration(spec.timeouts.request) + GATEWAY_TIMEOUT_SLACK_SECONDS)
    leases = {} if quota is None else {"quota": dict(quota)}
    return {
        "hold": build_gateway_hold(spec, startup_seconds),
        **leases,
        "listen": {"host": "0.0.0.0", "port": HTTP_PORT, "metricsPort": METRICS_PORT},
        "watch": {"namespace": owner.namespace, "service": owner.name, "portName": "http"},
        "routing": spec.gateway.routing,
        "limits": {"requestTimeoutSeconds": timeout},
        # only what the operator set in the pods' config (the gateway's model has the same defaults)
        "tenants": cfg.tenants.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True),
        "priorities": cfg.priorities.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True),
        "edge": {"tokenFile": EDGE_TOKEN_FILE},
    }


def gateway_metrics_service_name(owner: Owner) -> str:
    return f"{gateway_name(owner)}-metrics"


def build_gateway_metrics_service(owner: Owner) -> dict[str, Any]:
    """``<name>-gateway-metrics``: the gateway's ``/metrics`` as the pods' are published
    (:func:`build_metrics_service`): headless, port ``metrics``, the labels the InferenceService's
    ServiceMonitor selects (``sluiceway.io/inferenceservice``, ``sluiceway.io/metrics``), so the
    ``sluiceway_gateway_*`` series get ``namespace``, ``pod`` and ``inferenceservice`` too."""
    meta = _metadata(owner, gateway_metrics_service_name(owner), gateway_labels(owner.name))
    meta["labels"] = {**meta["labels"], METRICS_SERVICE_LABEL: "true"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",
            "selector": gateway_selector_labels(owner.name),
            "ports": [{"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}],
        },
    }


NETWORK_POLICY = ("networking.k8s.io/v1", "NetworkPolicy")
HTTP_ROUTE = ("gateway.networking.k8s.io/v1", "HTTPRoute")


def build_http_route(owner: Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    """``<name>-gateway``: a Gateway API HTTPRoute from ``gateway.httpRoute.parentRefs`` (Gateways;
    another namespace's only if its ``allowedRoutes`` admit this one: a reference is not a grant)
    with the optional ``hostnames``, every path to the gateway's Service on port ``http``. Only
    the fields the spec sets are written (Gateway API's CRD defaults the rest: group and kind of a
    parent, the path match ``PathPrefix /``)."""
    route = spec.gateway.http_route
    parents = []
    for p in spec.gateway.route_parents:
        ref: dict[str, Any] = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": p.name}
        if p.namespace is not None:
            ref["namespace"] = p.namespace
        if p.section_name is not None:
            ref["sectionName"] = p.section_name
        if p.port is not None:
            ref["port"] = p.port
        parents.append(ref)
    body: dict[str, Any] = {
        "parentRefs": parents,
        "rules": [{"backendRefs": [{"group": "", "kind": "Service", "name": gateway_name(owner), "port": HTTP_PORT}]}],
    }
    if route is not None and route.hostnames:
        body["hostnames"] = list(route.hostnames)
    return {
        "apiVersion": HTTP_ROUTE[0],
        "kind": HTTP_ROUTE[1],
        "metadata": _metadata(owner, gateway_name(owner), gateway_labels(owner.name)),
        "spec": body,
    }


def build_network_policy(owner: Owner) -> dict[str, Any]:
    """``<name>``: the pods' inference port (``http``) admits only this service's gateway pods; the
    metrics port (``metrics``: the kubelet's probes, Prometheus, ``/metrics``) admits any caller, as
    without a policy (a cluster that restricts it to Prometheus adds its own policy: the chart's
    ``networkPolicy.inferencePods``). Ingress only; the pods' egress is not restricted."""
    return {
        "apiVersion": NETWORK_POLICY[0],
        "kind": NETWORK_POLICY[1],
        "metadata": _metadata(owner, owner.name),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(owner.name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": gateway_selector_labels(owner.name)}}],
                    "ports": [{"port": "http", "protocol": "TCP"}],
                },
                {"ports": [{"port": "metrics", "protocol": "TCP"}]},
            ],
        },
    }


def gateway_config_hash(config_yaml: str) -> str:
    """What the gateway reads only at start, so a change rolls it: its config without the ``tenants``
    section (the key file's path aside) and without the key file: the gateway reloads both in place
    when the kubelet updates the mounted ConfigMap and Secret (``sluiceway_gateway.reload``), as the
    pods do (:func:`pod_config_hash`)."""
    data = yaml.safe_load(config_yaml) or {}
    tenants = data.pop("tenants", None) or {}
    data["tenants"] = {"keysFile": tenants.get("keysFile")}
    hold = data.pop("hold", None) or {}
    hold.pop("startupSeconds", None)  # reloaded in place: a new start-up measurement rolls nothing
    if hold:
        data["hold"] = hold
    return config_hash(yaml.safe_dump(data, sort_keys=True), "")


def build_gateway_children(
    owner: Owner,
    spec: InferenceServiceSpec,
    cfg: PodConfig,
    keys: str,
    env: Environment,
    startup_seconds: float | None = None,
) -> list[dict[str, Any]]:
    """The gateway's children in apply order (:data:`GATEWAY_KINDS`).

    The gateway reads EndpointSlices with its own ServiceAccount's token (a Role in this namespace
    with get/list/watch on ``endpointslices`` and nothing else); it mounts the pods' ``<name>-keys``
    Secret (``keys.txt`` only, not the quota token) at the pods' path, so the edge checks the same
    key hashes. Readiness is ``/v2/health/live``: a gateway with no ready pod behind it stays in its
    Service and answers 503 ``no_ready_pods`` rather than refusing connections.
    """
    name = gateway_name(owner)
    labels = gateway_labels(owner.name)
    selector = gateway_selector_labels(owner.name)
    g = spec.gateway
    quota = build_edge_quota(owner, spec, env)
    config_yaml = yaml.safe_dump(build_gateway_config(owner, spec, cfg, startup_seconds, quota), sort_keys=True)
    log_format = spec.observability.log_format or env.pod_log_format
    container: dict[str, Any] = {
        "name": "sluiceway-gateway",
        "image": env.gateway_image,
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "sluiceway-gateway",
            "serve",
            "--config",
            f"{CONFIG_DIR}/{GATEWAY_CONFIG_FILE}",
            "--drain-seconds",
            str(GATEWAY_DRAIN_SECONDS),
            "--log-format",
            log_format,
        ],
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "env": [
            {"name": "HOME", "value": "/tmp"},
            # its name in the quota coordinator's lease pool
            *([{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}] if quota else []),
        ],
        "resources": {
            "requests": {"cpu": str(g.resources.cpu), "memory": str(g.resources.memory)},
            "limits": {"memory": str(g.resources.memory)},
        },
        "livenessProbe": _http_probe("/v2/health/live", 10, 3),
        "readinessProbe": _http_probe("/v2/health/live", 5, 2),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_SECONDS}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "keys", "mountPath": KEYS_DIR, "readOnly": True},
            dict(EDGE_MOUNT),
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": name,
        "automountServiceAccountToken": True,  # the EndpointSlice watch
        "containers": [container],
        "volumes": [
            {"name": "config", "configMap": {"name": name}},
            {
                "name": "keys",
                "secret": {"secretName": f"{owner.name}-keys", "items": [{"key": KEYS_FILE, "path": KEYS_FILE}]},
            },
            _edge_volume(owner),
            {"name": "tmp", "emptyDir": {}},
        ],
        "terminationGracePeriodSeconds": PRESTOP_SLEEP_SECONDS + GATEWAY_DRAIN_SECONDS + GRACE_SLACK_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "enableServiceLinks": False,
    }
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(owner, name, labels)},
        {
            "apiVersion": RBAC_API,
            "kind": "Role",
            "metadata": _metadata(owner, name, labels),
            "rules": [{k: list(v) for k, v in GATEWAY_RULE.items()}],
        },
        {
            "apiVersion": RBAC_API,
            "kind": "RoleBinding",
            "metadata": _metadata(owner, name, labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(owner, name, labels),
            "data": {GATEWAY_CONFIG_FILE: config_yaml},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _metadata(owner, name, labels),
            "spec": {
                "replicas": g.replicas,
                "selector": {"matchLabels": selector},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                "template": {
                    "metadata": {
                        "labels": labels,
                        "annotations": {CONFIG_HASH_ANNOTATION: gateway_config_hash(config_yaml)},
                    },
                    "spec": pod_spec,
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _metadata(owner, name, labels),
            "spec": {
                "type": "ClusterIP",
                "selector": selector,
                "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
            },
        },
        build_gateway_metrics_service(owner),
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _metadata(owner, name, labels),
            "spec": {
                "maxUnavailable": 1,
                "selector": {"matchLabels": selector},
                "unhealthyPodEvictionPolicy": "AlwaysAllow",
            },
        },
    ]


def render(
    owner: Owner,
    spec: InferenceServiceSpec,
    key_hashes: Mapping[str, str],
    env: Environment,
    replicas: int | None = None,
    salt: bytes | None = None,
    edge_token: str | None = None,
    startup: Mapping[str, Any] | None = None,
) -> Rendered:
    """All children, in apply order (config first, Deployment after what it mounts).

    ``replicas`` is the builtin engine's current decision (clamped to the spec's bounds;
    ``minReplicas`` when None); engine ``none`` uses ``spec.replicas``; keda and prometheus leave
    the count to the HPA (``Rendered.replicas`` is None). ``key_hashes`` are
    ``sluiceway_core.keys.hash_key(key, salt)``; ``salt`` is needed when there are any. Raises
    :class:`SpecError`.

    With the gateway, the edge token is :func:`derive_edge_token` of ``env.quota_key`` when the
    operator has one, else ``edge_token`` (the caller's: the one kept in the ``<name>-edge`` Secret,
    or a fresh random one); neither is a :class:`SpecError`.

    ``startup`` is the object's ``status.startup`` (the measured start phases): the gateway's
    ``hold.startupSeconds`` (:func:`gateway_startup_seconds`); a new one changes only the gateway's
    ConfigMap, which the gateway reloads in place.
    """
    cfg = build_pod_config(owner, spec, env)
    edge: str | None = None
    if spec.gateway.enabled:
        edge = derive_edge_token(env.quota_key, owner) if env.quota_key is not None else edge_token
        if edge is None:
            raise SpecError("the gateway needs an edge token: the operator has no quota key and none was given")
    cfg_yaml = cfg.to_yaml()
    keys = keys_text(key_hashes, salt)
    token = quota_token(owner, spec, env)
    digest = pod_config_hash(cfg)
    engine = spec.autoscaling.engine
    owned_replicas: int | None
    if engine == "none":
        owned_replicas = spec.replicas
    elif engine == "builtin":
        owned_replicas = clamp_replicas(spec, replicas)
    else:
        owned_replicas = None
    manifests = [
        build_config_map(owner, cfg_yaml),
        build_keys_secret(owner, keys, token),
        *([build_edge_secret(owner, edge, edge_quota_token(owner, spec, env))] if edge is not None else []),
        build_deployment(owner, spec, digest, pod_name_env=cfg.quota is not None),
        build_service(owner),
        build_metrics_service(owner),
        build_pdb(owner, spec),
    ]
    absent: list[tuple[str, str, str]] = []
    if spec.gateway.enabled:
        manifests.extend(build_gateway_children(owner, spec, cfg, keys, env, gateway_startup_seconds(spec, startup)))
    else:
        absent.extend((api, kind, gateway_name(owner)) for api, kind in GATEWAY_KINDS)
        absent.append(("v1", "Service", gateway_metrics_service_name(owner)))
    if spec.gateway.enabled and spec.gateway.network_policy:
        manifests.append(build_network_policy(owner))
    else:
        absent.append((*NETWORK_POLICY, owner.name))
    if spec.gateway.route_parents and env.http_route:
        manifests.append(build_http_route(owner, spec))
    elif env.http_route:
        absent.append((*HTTP_ROUTE, gateway_name(owner)))
    if engine in ("keda", "prometheus") and env.keda:
        manifests.append(build_scaled_object(owner, spec, env))
    elif env.keda:
        absent.append((*SCALED_OBJECT, owner.name))
    if spec.monitoring.service_monitor and env.service_monitor:
        manifests.append(build_service_monitor(owner, spec, env.service_monitor_labels))
    elif env.service_monitor:
        absent.append((*SERVICE_MONITOR, owner.name))
    return Rendered(manifests=manifests, config_hash=digest, pod_config=cfg, absent=absent, replicas=owned_replicas)
