"""The only module that talks to the Kubernetes API.

Blocking calls through the official ``kubernetes`` client (urllib3 pool, thread-safe); one
:class:`Kube` is shared by kopf's handler threads and the loops' worker threads. The only state here
is the CRD-existence cache, guarded by a lock; serialising the work on one InferenceService is the
caller's job (:mod:`.reconcile`).

Writes are server-side applies under the fixed field manager ``sluiceway-operator`` with
``force=true``: the operator owns exactly the fields it renders and nothing else. The Deployment's
``spec.replicas`` has its own manager, ``sluiceway-operator-replicas`` (engines ``none`` and
``builtin``), so the Deployment's apply never removes it and switching to an autoscaler keeps the
count (the Kubernetes docs' SSA ownership transfer; :meth:`Kube.hand_over_replicas` moves it from
the old single manager).

Which API answers mean "this child is refused" (a spec problem: :class:`ChildRejected`) and which
mean "try again" (:class:`ApiError`) is decided here, in :func:`is_refusal`.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from . import FIELD_MANAGER, GROUP, KIND, VERSION

__all__ = [
    "MODEL_CREDENTIALS_LABEL",
    "MODEL_CREDENTIALS_REASON",
    "POD_SECRET_LABEL",
    "POD_SECRET_REASON",
    "REPLICAS_MANAGER",
    "TENANT_KEY_LABEL",
    "TENANT_KEY_REASON",
    "ApiError",
    "Kube",
    "SecretProblem",
    "controlled_by",
    "is_refusal",
]

#: Field manager of the Deployment's ``spec.replicas`` (engines none and builtin).
REPLICAS_MANAGER = f"{FIELD_MANAGER}-replicas"

#: (apiVersion, kind) -> (URL prefix, plural)
_RESOURCES: dict[tuple[str, str], tuple[str, str]] = {
    ("v1", "ConfigMap"): ("/api/v1", "configmaps"),
    ("v1", "Secret"): ("/api/v1", "secrets"),
    ("v1", "Service"): ("/api/v1", "services"),
    ("v1", "ServiceAccount"): ("/api/v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", "Role"): ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    ("apps/v1", "Deployment"): ("/apis/apps/v1", "deployments"),
    ("policy/v1", "PodDisruptionBudget"): ("/apis/policy/v1", "poddisruptionbudgets"),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("/apis/networking.k8s.io/v1", "networkpolicies"),
    ("keda.sh/v1alpha1", "ScaledObject"): ("/apis/keda.sh/v1alpha1", "scaledobjects"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("/apis/monitoring.coreos.com/v1", "servicemonitors"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): ("/apis/gateway.networking.k8s.io/v1", "httproutes"),
    (f"{GROUP}/{VERSION}", KIND): (f"/apis/{GROUP}/{VERSION}", "inferenceservices"),
}

KEDA_CRD = "scaledobjects.keda.sh"
SERVICE_MONITOR_CRD = "servicemonitors.monitoring.coreos.com"
HTTP_ROUTE_CRD = "httproutes.gateway.networking.k8s.io"


class ApiError(RuntimeError):
    """The API server refused or failed a call (transient or not); ``status`` is the HTTP code."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def is_refusal(err: ApiError) -> bool:
    """Whether the API server refused the object itself (invalid, not transient): 400/422, or the
    500 that server-side apply answers when an object does not fit the type's schema."""
    if err.status in (400, 422):
        return True
    text = str(err)
    return err.status == 500 and ("failed to create typed" in text or "typed patch" in text)


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether ``obj`` has a controller ownerReference to ``uid``."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("controller") for r in refs)


def _owns_replicas(obj: Mapping[str, Any], manager: str) -> bool:
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        fields = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if entry.get("manager") == manager and entry.get("operation") == "Apply" and "f:replicas" in fields:
            return True
    return False


#: The opt-in label a Secret needs before ``tenants[].keySecretRef`` may read it.
TENANT_KEY_LABEL = "sluiceway.io/tenant-key"
#: The one condition reason for any unusable ``keySecretRef``.
TENANT_KEY_REASON = "TenantKeyUnavailable"
#: The opt-in label a Secret needs before ``model.s3.credentialsSecret`` may name it.
MODEL_CREDENTIALS_LABEL = "sluiceway.io/model-credentials"
#: The one condition reason for an unusable ``model.s3.credentialsSecret``.
MODEL_CREDENTIALS_REASON = "ModelCredentialsUnavailable"
#: The opt-in label a Secret needs before ``spec.pod`` (env, envFrom, volumes) may name it.
POD_SECRET_LABEL = "sluiceway.io/pod-secret"
POD_SECRET_REASON = "PodSecretUnavailable"


@dataclass(frozen=True)
class SecretProblem:
    """Why a referenced Secret cannot be used: ``reason`` is a condition reason."""

    reason: str
    message: str


def _path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    prefix, plural = _RESOURCES[(api_version, kind)]
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name else path


class Kube:
    """A thin facade over one :class:`kubernetes.client.ApiClient`."""

    def __init__(self, api_client: Any | None = None, crd_cache_seconds: float = 30.0) -> None:
        if api_client is None:
            config: Any = kubernetes.config
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = kubernetes.client.ApiClient()
        self.api: Any = api_client
        self._crd_cache: dict[str, tuple[float, frozenset[str] | None]] = {}
        self._crd_ttl = crd_cache_seconds
        self._lock = threading.Lock()

    # -- raw calls ------------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        try:
            params = self.api.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or [],
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = self.api.call_api(*params, _request_timeout=30)
            data = resp.read()
        except ApiException as err:
            raise ApiError(f"{method} {path}: {err.status} {err.reason}: {err.body}", err.status) from None
        except OSError as err:  # connection problems
            raise ApiError(f"{method} {path}: {err}") from None
        if not 200 <= resp.status < 300:
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
            with contextlib.suppress(ValueError, AttributeError):
                text = str(json.loads(text)["message"])  # a metav1.Status: its message is the point
            raise ApiError(f"{method} {path}: {resp.status} {resp.reason}: {text[:2000]}", resp.status)
        return json.loads(data) if data else None

    # -- children -------------------------------------------------------------------------------

    def apply(
        self, manifest: Mapping[str, Any], *, dry_run: bool = False, manager: str = FIELD_MANAGER
    ) -> dict[str, Any]:
        """Server-side apply one object (``dry_run``: validated and admitted, not stored)."""
        meta = manifest["metadata"]
        path = _path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", manager), ("force", "true")]
        if dry_run:
            query.append(("dryRun", "All"))
        result: dict[str, Any] = self._call(
            "PATCH", path, body=dict(manifest), query=query, content_type="application/apply-patch+yaml"
        )
        return result

    def hand_over_replicas(self, deployment: Mapping[str, Any]) -> bool:
        """If the Deployment's own manager owns ``spec.replicas`` (an operator before the split),
        give the field to :data:`REPLICAS_MANAGER` at its current value first, so the next apply
        without it does not remove it (SSA "transferring ownership"). True if it did."""
        if not _owns_replicas(deployment, FIELD_MANAGER):
            return False
        meta = deployment["metadata"]
        replicas = int((deployment.get("spec") or {}).get("replicas") or 1)
        self.apply(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "spec": {"replicas": replicas},
            },
            manager=REPLICAS_MANAGER,
        )
        return True

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch the InferenceService's status subresource."""
        self._call(
            "PATCH",
            _path(f"{GROUP}/{VERSION}", KIND, namespace, name) + "/status",
            body={"status": dict(status)},
            content_type="application/merge-patch+json",
        )

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self._call("GET", _path(api_version, kind, namespace, name))
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return obj

    def delete_owned(self, api_version: str, kind: str, namespace: str, name: str, owner_uid: str) -> bool:
        """Delete a child that is no longer desired, only if this owner controls it."""
        obj = self.get(api_version, kind, namespace, name)
        if obj is None:
            return False
        if not controlled_by(obj, owner_uid):
            return False
        try:
            self._call("DELETE", _path(api_version, kind, namespace, name))
        except ApiError as err:
            if err.status != 404:
                raise
        return True

    # -- inputs ---------------------------------------------------------------------------------

    def read_secret_value(self, namespace: str, name: str, key: str) -> str | SecretProblem:
        """The decoded value (trailing whitespace stripped) of a tenant-key Secret, or one generic
        problem. Only Secrets labelled ``sluiceway.io/tenant-key: "true"`` are read (the label is
        the Secret owner's consent); the message is the same whether the Secret is missing,
        unlabelled, lacks the key or holds no usable value, so a status never tells which Secrets
        and keys exist."""
        problem = SecretProblem(
            TENANT_KEY_REASON,
            f"keySecretRef {name}/{key} cannot be used: it must name a Secret labelled "
            f'{TENANT_KEY_LABEL}: "true" that holds a non-empty UTF-8 value under that key',
        )
        obj = self.get("v1", "Secret", namespace, name)
        if obj is None or ((obj.get("metadata") or {}).get("labels") or {}).get(TENANT_KEY_LABEL) != "true":
            return problem
        data = obj.get("data") or {}
        if key not in data:
            return problem
        try:
            value = base64.b64decode(data[key]).decode("utf-8").rstrip()
        except (ValueError, UnicodeDecodeError):
            return problem
        return value or problem

    def check_model_credentials(self, namespace: str, name: str, keys: tuple[str, ...]) -> SecretProblem | None:
        """None if ``name`` is a Secret labelled ``sluiceway.io/model-credentials: "true"`` holding
        every key in ``keys``, else one generic problem (the same message whatever is wrong, so a
        status never tells which Secrets exist). The values are never read into memory here."""
        problem = SecretProblem(
            MODEL_CREDENTIALS_REASON,
            f"model.s3.credentialsSecret {name} cannot be used: it must name a Secret of this namespace labelled "
            f'{MODEL_CREDENTIALS_LABEL}: "true" that holds the keys {", ".join(keys)}',
        )
        obj = self.get("v1", "Secret", namespace, name)
        if obj is None or ((obj.get("metadata") or {}).get("labels") or {}).get(MODEL_CREDENTIALS_LABEL) != "true":
            return problem
        data = obj.get("data") or {}
        return None if all(data.get(k) for k in keys) else problem

    def check_pod_secret(self, namespace: str, name: str) -> SecretProblem | None:
        """None if ``name`` is a Secret labelled ``sluiceway.io/pod-secret: "true"`` (its owner's
        consent to ``spec.pod`` handing it to the pods), else one generic problem."""
        obj = self.get("v1", "Secret", namespace, name)
        if obj is not None and ((obj.get("metadata") or {}).get("labels") or {}).get(POD_SECRET_LABEL) == "true":
            return None
        return SecretProblem(
            POD_SECRET_REASON,
            f'spec.pod names Secret {name}: it must be a Secret of this namespace labelled {POD_SECRET_LABEL}: "true"',
        )

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        """The pods matching ``selector`` (``list pods`` in the namespace)."""
        query = [("labelSelector", ",".join(f"{k}={v}" for k, v in sorted(selector.items())))]
        answer = self._call("GET", f"/api/v1/namespaces/{namespace}/pods", query=query) or {}
        items: list[dict[str, Any]] = answer.get("items") or []
        return items

    def crd_exists(self, name: str) -> bool:
        """Whether a CRD is installed (cached for ``crd_cache_seconds``)."""
        return self.crd_versions(name) is not None

    def crd_serves(self, name: str, version: str) -> bool:
        """Whether a CRD is installed and serves ``version`` (an older Gateway API serves no
        ``v1``: an apply to it would be a 404 retried forever). Cached as :meth:`crd_exists`."""
        return version in (self.crd_versions(name) or ())

    def crd_versions(self, name: str) -> frozenset[str] | None:
        """The versions a CRD serves, or None when it is not installed (cached for
        ``crd_cache_seconds``)."""
        now = time.monotonic()
        with self._lock:
            hit = self._crd_cache.get(name)
            if hit is not None and now - hit[0] < self._crd_ttl:
                return hit[1]
        try:
            crd = self._call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
            versions: frozenset[str] | None = frozenset(
                str(v.get("name")) for v in (crd.get("spec") or {}).get("versions") or [] if v.get("served")
            )
        except ApiError as err:
            if err.status != 404:
                raise
            versions = None
        with self._lock:
            self._crd_cache[name] = (now, versions)
        return versions

    # -- events ---------------------------------------------------------------------------------

    def post_event(self, owner: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        """A core/v1 Event about the InferenceService (best effort: failures are swallowed)."""
        meta = owner["metadata"]
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": event_type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        with contextlib.suppress(ApiError):
            self._call("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body=body)
