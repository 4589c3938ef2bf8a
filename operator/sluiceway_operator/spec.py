"""The validated model of an ``InferenceService`` spec. Pure: no I/O, safe from any thread.

The CRD (``crds/inferenceservices.sluiceway.io.yaml``) is the source of truth: the API server
applies its defaults and CEL rules before the operator sees an object. This model repeats the same
defaults (``tests/operator/test_operator_spec.py`` checks that they agree with the CRD) so that the pure
builders can be used and tested without an API server, and it adds the checks a schema cannot
express. Units are converted here once: durations to seconds, rates to tokens per second,
quantities to bytes.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from sluiceway_core.config import PYTHON_SPEC, SYNTHETIC_SPEC
from sluiceway_core.units import UnitError, parse_duration, parse_quantity

from .affinity import check_affinity

__all__ = ["InferenceServiceSpec", "SpecError", "parse_spec"]

# The API server's own grammars (k8s.io/apimachinery/pkg/util/validation), so that nothing the
# operator renders is refused by it. The CRD carries the same patterns; these repeat them for specs
# that reach the operator another way (tests, an older CRD).
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_QUALIFIED_NAME = re.compile(rf"(({_DNS_LABEL}(\.{_DNS_LABEL})*)/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
#: The pod's model grammar (``sluiceway_core.config.SYNTHETIC_SPEC``/``PYTHON_SPEC``; the CRD's CEL
#: says the same).
_MODEL_SOURCE = re.compile(rf"demo|{SYNTHETIC_SPEC.pattern}|/.*|{PYTHON_SPEC.pattern}", re.S)
#: Paths the pod mounts itself (config, key hashes, scratch): a model volume must not hide them.
RESERVED_PATHS = ("/tmp", "/etc/sluiceway", "/var/run/secrets/sluiceway")
#: The pod config's limit on priority class names (sluiceway_core.config.PrioritiesConfig).
PRIORITY_CLASS = re.compile(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?")


def _subdomain(v: str) -> str:
    if len(v) > 253 or not _DNS_SUBDOMAIN.fullmatch(v):
        raise ValueError(f"{v!r} is not a valid object name (a DNS-1123 subdomain, at most 253 characters)")
    return v


def _qualified_name(v: str) -> str:
    prefix, _, name = v.rpartition("/")
    if len(prefix) > 253 or len(name) > 63 or not _QUALIFIED_NAME.fullmatch(v):
        raise ValueError(f"{v!r} is not a valid label key (optional DNS prefix '/', name of at most 63 characters)")
    return v


def _label_value(v: str) -> str:
    if len(v) > 63 or not _LABEL_VALUE.fullmatch(v):
        raise ValueError(f"{v!r} is not a valid label value (at most 63 alphanumerics, '-', '_', '.')")
    return v


def _quantity(v: int | str) -> int | str:
    """The one quantity grammar (``sluiceway_core.units.parse_quantity``, the CRD's pattern)."""
    try:
        parse_quantity(v)
    except UnitError as err:
        raise ValueError(f"{err} (a non-negative quantity such as 500m, 2, 1.5Gi or 1e9)") from None
    return v


def _model_source(v: str) -> str:
    if not _MODEL_SOURCE.fullmatch(v):
        raise ValueError(
            f"{v!r} is not a model the pod can load: 'demo', 'synthetic:<milliseconds>', an absolute "
            "TorchScript path or 'package.module:factory'"
        )
    return v


def _mount_path(v: str) -> str:
    if not re.fullmatch(r"(/[^/:]+)+", v) or re.search(r"(^|/)\.\.?(/|$)", v):
        raise ValueError(f"{v!r} must be an absolute path without ':', '.' or '..' segments or a trailing '/'")
    for reserved in RESERVED_PATHS:
        if reserved == v or reserved.startswith(v + "/") or v.startswith(reserved + "/"):
            raise ValueError(f"{v!r} would hide {reserved}, which the pod needs")
    return v


def _extended_resource(v: str) -> str:
    if "/" not in v or "kubernetes.io/" in v:
        raise ValueError(f"{v!r} must be an extended resource name such as nvidia.com/gpu")
    return _qualified_name(v)


SubdomainName = Annotated[str, AfterValidator(_subdomain)]
LabelKey = Annotated[str, AfterValidator(_qualified_name)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
ModelSource = Annotated[str, AfterValidator(_model_source)]


class SpecError(ValueError):
    """The spec cannot be turned into a working service. ``str()`` names the field."""


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


Duration = str
Quantity = Annotated[int | str, AfterValidator(_quantity)]


class PvcSpec(_Model):
    claim_name: SubdomainName
    mount_path: Annotated[str, AfterValidator(_mount_path)] = "/models"


class FallbackSpec(_Model):
    source: ModelSource
    permits: int = Field(default=1, ge=1, le=64)


Datatype = Literal["BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"]
#: Shape entries: ``-1`` (any size) or a size; the CRD allows up to 8 dimensions.
Dim = Annotated[int, Field(ge=-1, le=2**31 - 1)]


class OutputTensorSpec(_Model):
    """One declared tensor (``model.outputs[]``); the CRD's schema and CEL say the same."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^\S+$")
    datatype: Datatype = "FP32"
    shape: list[Dim] = Field(min_length=1, max_length=8)

    @model_validator(mode="after")
    def _dims(self) -> OutputTensorSpec:
        if any(d == 0 for d in self.shape):
            raise ValueError(f"{self.name}: shape dimensions must be -1 (any size) or >= 1, got {self.shape}")
        return self


class InputTensorSpec(OutputTensorSpec):
    """One declared input (``model.inputs[]``). ``maxShape`` bounds the ``-1`` dimensions: larger
    requests get 400 and the warm-up memory probe runs at this shape."""

    max_shape: list[Annotated[int, Field(ge=1, le=2**31 - 1)]] | None = Field(default=None, min_length=1, max_length=8)

    @model_validator(mode="after")
    def _max_shape(self) -> InputTensorSpec:
        if self.max_shape is None:
            return self
        if len(self.max_shape) != len(self.shape):
            raise ValueError(
                f"{self.name}: maxShape {self.max_shape} must have the rank of shape {self.shape} "
                "(one entry per dimension)"
            )
        if any(d != -1 and m != d for d, m in zip(self.shape, self.max_shape, strict=True)):
            raise ValueError(
                f"{self.name}: maxShape {self.max_shape} must equal shape {self.shape} in every fixed dimension "
                "(only -1 dimensions may vary)"
            )
        return self


def _unique_names(kind: str) -> Any:
    def check(v: list[OutputTensorSpec] | None) -> list[OutputTensorSpec] | None:
        names = [s.name for s in v or []]
        if len(set(names)) != len(names):
            raise ValueError(f"model.{kind} names must be unique")
        return v

    return AfterValidator(check)


#: ``model.storageUri`` (the CRD's pattern): ``pvc://<claim>/<path>``, ``s3://<bucket>/<key or
#: prefix/>``, ``http(s)://<host>/<path>``, ``oci://<registry>/<repository>:<tag>`` (or
#: ``@sha256:<digest>``; ``oci+http://`` for a plain-http registry); never user info or a query
#: string (credentials).
STORAGE_URI = re.compile(
    r"pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(/[^/\s?#]+)*/?"
    r"|s3://[a-z0-9][-a-z0-9.]{1,61}[a-z0-9](/[^\s?#]*)?"
    r"|https?://[^\s/?#@]+(/[^\s?#]*)?"
    r"|oci(\+http)?://[^\s/?#@]+/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})"
)
_FACTORY = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
#: The pod's safetensors form, ``module:factory@/path/model.safetensors``.
_SAFETENSORS_SOURCE = re.compile(rf"{_FACTORY.pattern}@/.+\.safetensors")
#: Files the pod loads from a path (sluiceway_pod.formats); the formats that name a path.
PATH_FORMATS = ("torchscript", "pt2", "onnx")


def _storage_uri(v: str) -> str:
    if len(v) > 2048 or not STORAGE_URI.fullmatch(v):
        raise ValueError(
            f"{v!r} is not a storageUri: pvc://<claim>/<path>, s3://<bucket>/<key or prefix/>, "
            "http(s)://<host>/<path> or oci://<registry>/<repository>:<tag> (or @sha256:<digest>), without user "
            "info or query string (credentials go in model.s3.credentialsSecret or model.oci.credentialsSecret)"
        )
    if re.search(r"(^|/)\.\.?(/|$)", v.split("://", 1)[1]):
        raise ValueError(f"storageUri {v!r} must not contain '.' or '..' path segments")
    return v


class S3Spec(_Model):
    """``model.s3``: the S3-compatible store of an ``s3://`` storageUri."""

    endpoint: str | None = Field(default=None, max_length=2048, pattern=r"^https?://[^\s/?#@]+/?$")
    region: str | None = Field(default=None, max_length=64, pattern=r"^[a-z0-9-]+$")
    path_style: bool = True
    credentials_secret: SubdomainName | None = None


class OciSpec(_Model):
    """``model.oci``: the registry of an ``oci://`` storageUri (its credentials)."""

    credentials_secret: SubdomainName | None = None


class ModelSpec(_Model):
    image: str = Field(min_length=1, max_length=512, pattern=r"^\S+$")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    format: Literal["torchscript", "pt2", "onnx", "safetensors", "python", "synthetic", "demo"] = "torchscript"
    #: The short form (exclusive with ``storage_uri``).
    source: str | None = Field(default=None, min_length=1, max_length=1024)
    storage_uri: Annotated[str, AfterValidator(_storage_uri)] | None = None
    s3: S3Spec | None = None
    oci: OciSpec | None = None
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    storage_size_limit: Quantity = "10Gi"
    factory: str | None = Field(default=None, max_length=256, pattern=rf"^{_FACTORY.pattern}$")
    name: str | None = None
    version: str = "1"
    warmup_iterations: int = Field(default=3, ge=1, le=1000)
    inputs: Annotated[list[InputTensorSpec] | None, _unique_names("inputs"), Field(max_length=32)] = None
    outputs: Annotated[list[OutputTensorSpec] | None, _unique_names("outputs"), Field(max_length=32)] = None
    persistent_volume_claim: PvcSpec | None = None
    fallback: FallbackSpec | None = None

    @model_validator(mode="after")
    def _format_matches_source(self) -> ModelSpec:
        """The CRD's CEL rules on ``model``, in the same order."""
        if (self.source is None) == (self.storage_uri is None):
            raise ValueError("set exactly one of model.source (the short form) and model.storageUri")
        if self.source is not None:
            src = self.source
            ok = {
                "synthetic": bool(SYNTHETIC_SPEC.fullmatch(src)),
                "demo": src == "demo",
                "python": bool(PYTHON_SPEC.fullmatch(src)),
                "safetensors": bool(_SAFETENSORS_SOURCE.fullmatch(src)),
            }.get(self.format, src.startswith("/"))
            if not ok:
                raise ValueError(f"model.source {src!r} does not match format {self.format}")
        elif self.format in ("synthetic", "demo", "python"):
            raise ValueError(f"format {self.format} needs model.source, not a storageUri")
        if (
            self.format == "safetensors"
            and self.storage_uri is not None
            and (self.factory is None or not self.storage_uri.endswith(".safetensors"))
        ):
            raise ValueError(
                "format safetensors with a storageUri needs model.factory and a storageUri naming the .safetensors file"
            )
        if self.factory is not None and self.format != "safetensors":
            raise ValueError("model.factory is only used with format safetensors")
        if self.storage_uri is not None and self.persistent_volume_claim is not None:
            raise ValueError(
                "model.storageUri and model.persistentVolumeClaim exclude each other (pvc://claim/path is the "
                "storageUri form)"
            )
        if self.s3 is not None and not (self.storage_uri or "").startswith("s3://"):
            raise ValueError("model.s3 is only used with an s3:// storageUri")
        if self.oci is not None and not (self.storage_uri or "").startswith("oci"):
            raise ValueError("model.oci is only used with an oci:// storageUri")
        if self.sha256 is not None and (self.storage_uri is None or self.storage_uri.startswith("pvc://")):
            raise ValueError("model.sha256 is only used with an s3://, http(s):// or oci:// storageUri")
        try:
            if parse_quantity(self.storage_size_limit) <= 0:
                raise ValueError("model.storageSizeLimit must be positive")
        except UnitError as err:
            raise ValueError(f"model.storageSizeLimit: {err}") from None
        return self

    @property
    def scheme(self) -> str | None:
        """``pvc``, ``s3``, ``http``/``https``, ``oci``/``oci+http`` of the storageUri; None for the short
        form."""
        return self.storage_uri.split("://", 1)[0] if self.storage_uri is not None else None

    @property
    def fetched(self) -> bool:
        """Whether a storage initializer fetches the model (s3, http(s) and oci)."""
        return self.scheme in ("s3", "http", "https", "oci", "oci+http")


#: What ``resources.gpus > 1`` gets (the CRD's CEL says the same).
GPUS_MESSAGE = (
    "resources.gpus must be 0 or 1: a pod runs its model on one device until multi-device runners exist; "
    "ask for more replicas instead"
)


def _gpus(v: int) -> int:
    if v > 1:
        raise ValueError(GPUS_MESSAGE)
    return v


class ResourcesSpec(_Model):
    gpus: Annotated[int, Field(ge=0, le=16), AfterValidator(_gpus)] = 1
    gpu_resource_name: Annotated[str, AfterValidator(_extended_resource)] = "nvidia.com/gpu"
    cpu: Quantity = "1"
    memory: Quantity = "4Gi"


class Toleration(_Model):
    """A core/v1 Toleration, with the API server's rules (the CRD's CEL says the same)."""

    key: LabelKey | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: LabelValue | None = None
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None

    @model_validator(mode="after")
    def _rules(self) -> Toleration:
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key needs operator Exists")
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists must have no value")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect NoExecute")
        return self


class PlacementSpec(_Model):
    node_selector: dict[LabelKey, LabelValue] | None = Field(default=None, max_length=64)
    tolerations: list[Toleration] | None = Field(default=None, max_length=32)
    affinity: Annotated[dict[str, Any], AfterValidator(check_affinity)] | None = None
    priority_class_name: SubdomainName | None = None
    runtime_class_name: SubdomainName | None = None


class ConcurrencySpec(_Model):
    permits: int | Literal["auto"] = "auto"
    memory_reserve: Quantity = "1Gi"
    safety_factor_percent: int = Field(default=80, ge=1, le=100)
    cpu_default: int = Field(default=2, ge=1, le=256)
    max_permits: int = Field(default=64, ge=1, le=1024)
    probe_duration: Duration = "2s"
    probe_share_percent: int = Field(default=95, ge=1, le=100)
    adaptive: bool = True
    adaptive_interval: Duration = "1s"


class QueueSpec(_Model):
    max_depth: int | Literal["auto"] = 64
    target_wait: Duration = "2s"
    min_auto_depth: int = Field(default=1, ge=1)
    max_auto_depth: int = Field(default=10_000, ge=1)


class TimeoutsSpec(_Model):
    queue: Duration = "5s"
    request: Duration = "35s"
    drain: Duration = "30s"


class PrioritiesSpec(_Model):
    classes: list[Annotated[str, Field(pattern=PRIORITY_CLASS.pattern.join("^$"))]] = Field(
        default_factory=lambda: ["critical", "standard", "batch"], min_length=1, max_length=16
    )
    default: str = "standard"
    aging: Duration = "1s"


class BatchingSpec(_Model):
    max_batch_size: int | Literal["auto"] = 1
    max_wait: Duration = "5ms"
    max_auto_batch_size: int = Field(default=32, ge=1, le=4096)


class LimitsSpec(_Model):
    rate: str | None = None
    burst: int | None = Field(default=None, ge=1)
    max_concurrent: int | None = Field(default=None, ge=1)
    max_queued: int | None = Field(default=None, ge=1)
    weight: int = Field(default=1, ge=1, le=1000)
    max_priority: str | None = None


class AccessSpec(_Model):
    #: None (unset): anonymous access is on only while no tenant has a key (the pod decides, see
    #: ``sluiceway_core.config.TenantsConfig.anonymous_allowed``); True/False as set.
    allow_anonymous: bool | None = None
    anonymous_tenant: str = "anonymous"
    defaults: LimitsSpec = Field(default_factory=LimitsSpec)


class SecretKeyRef(_Model):
    name: SubdomainName
    key: str = "key"


class TenantSpec(LimitsSpec):
    name: str
    key_secret_ref: SecretKeyRef | None = None


class CacheSpec(_Model):
    enabled: bool = True
    max_entries: int = Field(default=1024, ge=1)
    ttl: Duration = "60s"


class DegradationSpec(_Model):
    enabled: bool = False
    wait_threshold: Duration = "1s"
    cache: CacheSpec = Field(default_factory=CacheSpec)


class ScaleUpSpec(_Model):
    stabilization_window: Duration = "0s"
    max_pods_per_period: int = Field(default=4, ge=1)
    max_percent_per_period: int = Field(default=100, ge=1)
    period: Duration = "15s"


#: The rate window of the sluiceway scaler's load terms (its ``rateWindow`` default, which the
#: operator does not override): engine keda needs a scale-down window of at least this plus one
#: scrape interval (the CRD's CEL says the same; issue 21).
SCALER_RATE_WINDOW = 60.0

#: Longest ``autoscaling.scaleDown.releaseWindow`` (the CRD's CEL says the same).
MAX_RELEASE_WINDOW = 86_400.0


class ScaleDownSpec(_Model):
    stabilization_window: Duration = "90s"
    max_pods_per_period: int = Field(default=1, ge=1)
    max_percent_per_period: int = Field(default=2, ge=1, le=100)
    period: Duration = "60s"
    #: ``sluiceway_core.policy.ScaleDownPolicy.release_window``; ``0s`` turns the release off.
    release_window: Duration = "20m"

    @property
    def release_window_seconds(self) -> float | None:
        """The policy's ``release_window``: seconds, or None when off (``0s``)."""
        seconds = parse_duration(self.release_window)
        return seconds if seconds > 0 else None


class AutoscalingSpec(_Model):
    engine: Literal["keda", "prometheus", "builtin", "none"] = "keda"
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=4, ge=1)
    #: With ``minReplicas: 0``: idle time before the last pod goes (KEDA's ``cooldownPeriod``; its
    #: default, 300 s, is this default too).
    scale_to_zero_after: Duration = "5m"
    target_queue_depth_per_replica: int = Field(default=8, ge=1)
    target_wait_p95: Duration = "2s"
    prometheus_address: str | None = None
    scaler_address: str | None = None
    polling_interval: Duration = "15s"
    fallback_replicas: int | None = None
    scale_up: ScaleUpSpec = Field(default_factory=ScaleUpSpec)
    scale_down: ScaleDownSpec = Field(default_factory=ScaleDownSpec)


class DisruptionSpec(_Model):
    max_unavailable: int = Field(default=1, ge=0)


class MonitoringSpec(_Model):
    service_monitor: bool = True
    #: Extra labels of the rendered ServiceMonitor (e.g. ``release``, which kube-prometheus-stack
    #: selects on), over the operator's ``SLUICEWAY_SERVICEMONITOR_LABELS``.
    service_monitor_labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=16)
    interval: Duration = "15s"


class AccessLogSpec(_Model):
    """``observability.accessLog``: the pod's sampled access log (``server.accessLog``)."""

    enabled: bool = False
    sample_percent: int | None = Field(default=None, ge=0, le=100)

    @model_validator(mode="after")
    def _needs_enabled(self) -> AccessLogSpec:
        if self.sample_percent is not None and not self.enabled:
            raise ValueError("accessLog.samplePercent needs accessLog.enabled: true (the access log is off by default)")
        return self


class TracingSpec(_Model):
    """``observability.tracing``: the pod's OpenTelemetry spans (``tracing`` of the pod config)."""

    enabled: bool = True
    endpoint: str | None = Field(default=None, max_length=2048, pattern=r"^https?://[^\s/]+(/\S*)?$")
    sample_percent: int | None = Field(default=None, ge=0, le=100)
    service_name: str | None = Field(
        default=None, min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    )

    @model_validator(mode="after")
    def _off_means_off(self) -> TracingSpec:
        if not self.enabled and (
            self.endpoint is not None or self.sample_percent is not None or self.service_name is not None
        ):
            raise ValueError(
                "tracing.enabled: false turns tracing off: leave out endpoint, samplePercent and serviceName"
            )
        return self


class ObservabilitySpec(_Model):
    """``observability``: the pods' logs and traces; unset fields take the operator's defaults
    (``SLUICEWAY_POD_LOG_FORMAT``, ``SLUICEWAY_POD_TRACING_ENDPOINT``)."""

    log_format: Literal["plain", "json"] | None = None
    access_log: AccessLogSpec = Field(default_factory=AccessLogSpec)
    tracing: TracingSpec = Field(default_factory=TracingSpec)


GatewayRouting = Literal["leastWait", "powerOfTwo", "random"]


class GatewayResourcesSpec(_Model):
    """Each gateway pod's CPU request and memory request and limit (no GPU)."""

    cpu: Quantity = "500m"
    memory: Quantity = "256Mi"


#: ``gateway.hold.maxBytes`` at most (held bodies live in the gateway's memory; the gateway's own
#: model has no upper bound, the CRD's CEL says the same).
MAX_HOLD_BYTES = 16 * 1024**3


class GatewayHoldSpec(_Model):
    """``gateway.hold``: the gateway's hold queue bounds (its config's ``hold`` section,
    ``sluiceway_gateway.config.HoldConfig``; the same defaults). ``startupSeconds`` is not here: the
    operator renders it from ``gateway.startupEstimate`` or the measured ``status.startup``."""

    max_requests: int = Field(default=1024, ge=0, le=1_000_000)
    max_bytes: Quantity = "64Mi"
    #: Of each bound one tenant may hold, in percent (the gateway's ``tenantShare`` is a fraction).
    tenant_share_percent: int = Field(default=50, ge=1, le=100)
    handoff_queue_per_pod: int = Field(default=1, ge=0, le=10_000)
    retry_after: Duration = "5s"

    @property
    def max_bytes_value(self) -> int:
        return math.ceil(parse_quantity(self.max_bytes))

    @property
    def enabled(self) -> bool:
        return self.max_requests > 0 and self.max_bytes_value > 0


#: Gateway API's grammars (its CRD's patterns): a DNS subdomain, a DNS label, a hostname.
_GW_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_GW_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_HOSTNAME = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class ParentRefSpec(_Model):
    """A Gateway API ``ParentReference`` to a Gateway (group ``gateway.networking.k8s.io``, kind
    ``Gateway``): a reference only; the Gateway's ``allowedRoutes`` decides whether it attaches."""

    name: str = Field(min_length=1, max_length=253, pattern=_GW_SUBDOMAIN)
    namespace: str | None = Field(default=None, min_length=1, max_length=63, pattern=_GW_LABEL)
    section_name: str | None = Field(default=None, min_length=1, max_length=253, pattern=_GW_SUBDOMAIN)
    port: int | None = Field(default=None, ge=1, le=65535)


class HTTPRouteSpec(_Model):
    """``gateway.httpRoute``: with ``parentRefs``, the operator renders a Gateway API ``HTTPRoute``
    ``<name>-gateway`` to the gateway's Service (when the Gateway API CRDs are installed)."""

    parent_refs: list[ParentRefSpec] | None = Field(default=None, min_length=1, max_length=32)
    hostnames: list[Annotated[str, Field(min_length=1, max_length=253, pattern=_HOSTNAME)]] | None = Field(
        default=None, min_length=1, max_length=16
    )

    @model_validator(mode="after")
    def _needs_parents(self) -> HTTPRouteSpec:
        if self.hostnames is not None and self.parent_refs is None:
            raise ValueError(
                "gateway.httpRoute.hostnames needs parentRefs: a route without a parent Gateway is not rendered"
            )
        return self


class GatewaySpec(_Model):
    """``gateway``: the service edge (``sluiceway-gateway``, docs/gateway.md) in front of the pods.

    Enabled, the operator renders its ConfigMap, Deployment, Service ``<name>-gateway``, PDB,
    ServiceAccount, Role (EndpointSlice reads in the namespace) and RoleBinding, and
    ``status.endpoint`` is the gateway's Service; the pods' Service stays. With
    ``httpRoute.parentRefs`` also an ``HTTPRoute`` ``<name>-gateway``."""

    enabled: bool = False
    replicas: int = Field(default=1, ge=1, le=32)
    routing: GatewayRouting = "leastWait"
    #: The gateway's ``hold.startupSeconds`` until ``status.startup`` has a measurement.
    startup_estimate: Duration | None = None
    resources: GatewayResourcesSpec = Field(default_factory=GatewayResourcesSpec)
    #: A NetworkPolicy ``<name>``: the pods' inference port admits only this service's gateway pods.
    network_policy: bool = True
    hold: GatewayHoldSpec = Field(default_factory=GatewayHoldSpec)
    http_route: HTTPRouteSpec | None = None

    @property
    def route_parents(self) -> list[ParentRefSpec]:
        """The HTTPRoute's parents; empty: no HTTPRoute."""
        return list(self.http_route.parent_refs or []) if self.enabled and self.http_route is not None else []

    @model_validator(mode="after")
    def _gateway_rules(self) -> GatewaySpec:
        if self.http_route is not None and self.http_route.parent_refs and not self.enabled:
            raise ValueError(
                "gateway.httpRoute needs gateway.enabled: true: the HTTPRoute's backend is the gateway's Service"
            )
        if self.hold.max_bytes_value > MAX_HOLD_BYTES:
            raise ValueError("gateway.hold.maxBytes must be at most 16Gi")
        if self.enabled and self.hold.max_bytes_value >= parse_quantity(self.resources.memory):
            raise ValueError(
                "gateway.hold.maxBytes must be less than gateway.resources.memory: held requests live in the "
                "gateway's memory"
            )
        return self


#: Volume names the operator uses in the inference pods.
RESERVED_VOLUMES = ("config", "keys", "tmp", "model", "model-store", "dshm", "edge")
#: The volume sources ``pod.volumes`` may use (the CRD's CEL says the same).
VOLUME_SOURCES = ("configMap", "secret", "emptyDir", "persistentVolumeClaim", "projected", "downwardAPI")
#: Paths ``pod.volumeMounts`` must not hide (RESERVED_PATHS plus the model store and /dev/shm).
POD_RESERVED_PATHS = (*RESERVED_PATHS, "/mnt/models", "/dev/shm")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


class EnvVar(_Model):
    """A core/v1 EnvVar; ``valueFrom`` is passed through (the API server checks it)."""

    name: str = Field(max_length=256)
    value: str | None = Field(default=None, max_length=32768)
    value_from: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _rules(self) -> EnvVar:
        if not _ENV_NAME.fullmatch(self.name):
            raise ValueError(f"{self.name!r} is not an environment variable name")
        if self.name in ("HOME", "POD_NAME") or self.name.startswith("SLUICEWAY_"):
            raise ValueError(
                "pod.env must not set HOME, POD_NAME or SLUICEWAY_* (the operator's configuration of the pod)"
            )
        if self.value is not None and self.value_from is not None:
            raise ValueError("an env entry has value or valueFrom, not both")
        return self


class _Ref(_Model):
    name: SubdomainName
    optional: bool | None = None


class EnvFromSource(_Model):
    prefix: str | None = Field(default=None, max_length=256)
    config_map_ref: _Ref | None = None
    secret_ref: _Ref | None = None

    @model_validator(mode="after")
    def _rules(self) -> EnvFromSource:
        if (self.config_map_ref is None) == (self.secret_ref is None):
            raise ValueError("an envFrom entry names exactly one of configMapRef and secretRef")
        if self.prefix is not None and self.prefix.startswith("SLUICEWAY_"):
            raise ValueError("envFrom prefix must not start with SLUICEWAY_")
        return self


def _volume(v: dict[str, Any]) -> dict[str, Any]:
    name = v.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) or len(name) > 63:
        raise ValueError(f"pod volume name {name!r} must be a DNS label")
    if name in RESERVED_VOLUMES:
        raise ValueError(f"pod volume names {', '.join(RESERVED_VOLUMES)} are the operator's")
    sources = [k for k in v if k != "name"]
    if len(sources) != 1 or sources[0] not in VOLUME_SOURCES:
        raise ValueError(
            f"pod volume {name}: exactly one of {', '.join(VOLUME_SOURCES)} (hostPath and other sources are not "
            f"allowed), not {sources}"
        )
    projected = v.get("projected") or {}
    if any(isinstance(p, dict) and "serviceAccountToken" in p for p in projected.get("sources") or []):
        raise ValueError(
            f"pod volume {name}: no serviceAccountToken projection (the inference pods get no API credentials)"
        )
    return v


class VolumeMount(_Model):
    name: str = Field(max_length=63)
    mount_path: str = Field(max_length=1024)
    read_only: bool | None = None
    sub_path: str | None = Field(default=None, max_length=1024, pattern=r"^[^/]([^:]*[^/])?$")

    @model_validator(mode="after")
    def _rules(self) -> VolumeMount:
        p = self.mount_path
        if not re.fullmatch(r"(/[^/:]+)+", p) or re.search(r"(^|/)\.\.?(/|$)", p):
            raise ValueError(f"{p!r} must be an absolute path without ':', '.' or '..' segments or a trailing '/'")
        for reserved in (*POD_RESERVED_PATHS, "/dev"):
            if reserved == p or reserved.startswith(p + "/") or p.startswith(reserved + "/"):
                raise ValueError(f"mountPath {p!r} would hide a path the pod needs ({reserved})")
        if self.sub_path is not None and re.search(r"(^|/)\.\.(/|$)", self.sub_path):
            raise ValueError("subPath must not contain '..'")
        return self


class PodSecurityOverrides(_Model):
    platform_assigns_ids: bool = False
    run_as_user: int | None = Field(default=None, ge=1, le=2**31 - 1)
    run_as_group: int | None = Field(default=None, ge=1, le=2**31 - 1)
    fs_group: int | None = Field(default=None, ge=1, le=2**31 - 1)

    @model_validator(mode="after")
    def _rules(self) -> PodSecurityOverrides:
        if self.platform_assigns_ids and (
            self.run_as_user is not None or self.run_as_group is not None or self.fs_group is not None
        ):
            raise ValueError(
                "platformAssignsIds leaves the ids to the platform: set no runAsUser, runAsGroup or fsGroup"
            )
        return self


def _pod_labels(v: dict[str, str]) -> dict[str, str]:
    for k in v:
        if k.startswith(("app.kubernetes.io/", "sluiceway.io/")):
            raise ValueError(
                "pod.labels must not set app.kubernetes.io/* or sluiceway.io/* keys: the operator's selector labels"
            )
    return v


def _pod_annotations(v: dict[str, str]) -> dict[str, str]:
    for k in v:
        _qualified_name(k)
        if k.startswith("sluiceway.io/"):
            raise ValueError("pod.annotations must not set sluiceway.io/* keys (the config hash is the operator's)")
    return v


class PodTemplateSpec(_Model):
    """``spec.pod``: what the inference pods may add; the operator owns the rest (docs/operator.md)."""

    env: list[EnvVar] | None = Field(default=None, max_length=64)
    env_from: list[EnvFromSource] | None = Field(default=None, max_length=16)
    volumes: list[Annotated[dict[str, Any], AfterValidator(_volume)]] | None = Field(default=None, max_length=32)
    volume_mounts: list[VolumeMount] | None = Field(default=None, max_length=32)
    labels: Annotated[dict[LabelKey, LabelValue], AfterValidator(_pod_labels)] | None = Field(
        default=None, max_length=32
    )
    annotations: (
        Annotated[dict[str, Annotated[str, Field(max_length=4096)]], AfterValidator(_pod_annotations)] | None
    ) = Field(default=None, max_length=32)
    topology_spread_constraints: list[dict[str, Any]] | None = Field(default=None, max_length=8)
    shm_size: Quantity | None = None
    security_context: PodSecurityOverrides | None = None

    @model_validator(mode="after")
    def _rules(self) -> PodTemplateSpec:
        names = [e.name for e in self.env or []]
        if len(set(names)) != len(names):
            raise ValueError("pod.env names must be unique")
        volumes = [str(v["name"]) for v in self.volumes or []]
        if len(set(volumes)) != len(volumes):
            raise ValueError("pod.volumes names must be unique")
        for m in self.volume_mounts or []:
            if m.name not in volumes:
                raise ValueError("every pod.volumeMounts name must be a pod.volumes name")
        if self.shm_size is not None and parse_quantity(self.shm_size) <= 0:
            raise ValueError("shmSize must be positive")
        return self

    def secret_names(self) -> list[str]:
        """Every Secret this template hands to the pods (env, envFrom, volumes, projections)."""
        out: list[str] = []
        for e in self.env or []:
            ref = (e.value_from or {}).get("secretKeyRef") or {}
            if isinstance(ref, dict) and isinstance(ref.get("name"), str):
                out.append(ref["name"])
        out += [f.secret_ref.name for f in self.env_from or [] if f.secret_ref is not None]
        for v in self.volumes or []:
            secret = v.get("secret") or {}
            if isinstance(secret, dict) and isinstance(secret.get("secretName"), str):
                out.append(secret["secretName"])
            for p in (v.get("projected") or {}).get("sources") or []:
                ref = p.get("secret") if isinstance(p, dict) else None
                if isinstance(ref, dict) and isinstance(ref.get("name"), str):
                    out.append(ref["name"])
        return sorted(set(out))


_SURGE = re.compile(r"[0-9]+%?")


def _surge(v: int | str) -> int | str:
    if isinstance(v, int):
        if v < 0:
            raise ValueError("must not be negative")
        return v
    if not _SURGE.fullmatch(v):
        raise ValueError(f"{v!r} must be a number or a percentage")
    return v


Surge = Annotated[int | str, AfterValidator(_surge)]


class RolloutSpec(_Model):
    """``spec.rollout``: the Deployment's rolling update."""

    max_surge: Surge = 1
    max_unavailable: Surge = 0

    @model_validator(mode="after")
    def _rules(self) -> RolloutSpec:
        if str(self.max_surge) in ("0", "0%") and str(self.max_unavailable) in ("0", "0%"):
            raise ValueError("rollout.maxSurge and rollout.maxUnavailable must not both be 0")
        return self

    def surge_pods(self, replicas: int) -> int:
        """Pods above ``replicas`` a rollout may add (a percentage rounds up, as the Deployment does)."""
        if isinstance(self.max_surge, int):
            return self.max_surge
        text = self.max_surge
        if text.endswith("%"):
            return -(-replicas * int(text[:-1]) // 100)
        return int(text)


class InferenceServiceSpec(_Model):
    """``spec`` of an InferenceService, defaults applied. Cross-field rules mirror the CRD's CEL."""

    model: ModelSpec
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    placement: PlacementSpec | None = None
    service_account_name: SubdomainName | None = None
    image_pull_secrets: list[SubdomainName] | None = None
    replicas: int = Field(default=1, ge=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    concurrency: ConcurrencySpec = Field(default_factory=ConcurrencySpec)
    queue: QueueSpec = Field(default_factory=QueueSpec)
    timeouts: TimeoutsSpec = Field(default_factory=TimeoutsSpec)
    priorities: PrioritiesSpec = Field(default_factory=PrioritiesSpec)
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    access: AccessSpec = Field(default_factory=AccessSpec)
    tenants: list[TenantSpec] | None = None
    degradation: DegradationSpec = Field(default_factory=DegradationSpec)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    disruption: DisruptionSpec = Field(default_factory=DisruptionSpec)
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    observability: ObservabilitySpec = Field(default_factory=ObservabilitySpec)
    gateway: GatewaySpec = Field(default_factory=GatewaySpec)
    pod: PodTemplateSpec | None = None
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)

    @model_validator(mode="after")
    def _cross(self) -> InferenceServiceSpec:
        for field_path, text in self._durations():
            try:
                parse_duration(text)
            except UnitError as err:
                raise ValueError(f"{field_path}: {err}") from None
        t = self.timeouts
        if not 0 < parse_duration(t.queue) < parse_duration(t.request):
            raise ValueError("timeouts.queue must be shorter than timeouts.request")
        if parse_duration(self.queue.target_wait) > parse_duration(t.queue):
            raise ValueError("queue.targetWait must not exceed timeouts.queue")
        c = self.concurrency
        if parse_duration(c.probe_duration) > 600:
            raise ValueError("concurrency.probeDuration must be at most 10m")
        if not 0 < parse_duration(c.adaptive_interval) <= 3600:
            raise ValueError("concurrency.adaptiveInterval must be within (0, 1h]")
        a = self.autoscaling
        if a.min_replicas < 1 and not self.gateway.enabled:
            raise ValueError(
                "autoscaling.minReplicas 0 needs gateway.enabled: true: while no pod exists only the gateway "
                "holds requests (and wakes the scaler); without it they would be refused or lost"
            )
        if a.min_replicas < 1 and a.engine != "keda":
            raise ValueError(
                "autoscaling.minReplicas 0 needs engine keda: only the sluiceway scaler wakes a service at zero "
                "from the gateway's held requests (StreamIsActive); engine builtin cannot scale from zero, engine "
                "prometheus reads the pods' queues, which do not exist at zero, and engine none uses spec.replicas"
            )
        if not 1 <= parse_duration(a.scale_to_zero_after) <= 86_400:
            raise ValueError("autoscaling.scaleToZeroAfter must be within [1s, 24h]")
        if a.min_replicas < 1 and not self.gateway.hold.enabled:
            raise ValueError(
                "autoscaling.minReplicas 0 needs gateway.hold.maxRequests and gateway.hold.maxBytes above 0: at zero "
                "only the requests the gateway holds wake the service"
            )
        if not 1 <= parse_duration(self.gateway.hold.retry_after) <= 3600:
            raise ValueError("gateway.hold.retryAfter must be within [1s, 1h]")
        estimate = self.gateway.startup_estimate
        if estimate is not None and not 1 <= parse_duration(estimate) <= 3600:
            raise ValueError("gateway.startupEstimate must be within [1s, 1h]")
        if a.min_replicas > a.max_replicas:
            raise ValueError("autoscaling.minReplicas must be <= autoscaling.maxReplicas")
        down_window = parse_duration(a.scale_down.stabilization_window)
        if a.engine == "keda" and down_window < SCALER_RATE_WINDOW + parse_duration(self.monitoring.interval):
            raise ValueError(
                "with engine keda, autoscaling.scaleDown.stabilizationWindow must be at least the scaler's rate "
                "window (1m) plus monitoring.interval: the load terms still average earlier, lighter phases, so a "
                "shorter window lets a steady overload read low and the service flaps"
            )
        release = a.scale_down.release_window_seconds
        if release is not None and release > MAX_RELEASE_WINDOW:
            raise ValueError("autoscaling.scaleDown.releaseWindow must be at most 24h")
        if release is not None and release <= parse_duration(a.scale_down.stabilization_window):
            raise ValueError(
                "autoscaling.scaleDown.releaseWindow must be 0s (off) or longer than "
                "autoscaling.scaleDown.stabilizationWindow (the policy ignores a shorter one)"
            )
        classes = self.priorities.classes
        if len(set(classes)) != len(classes):
            raise ValueError("priorities.classes names must be unique")
        if self.priorities.default not in classes:
            raise ValueError("priorities.default must be one of priorities.classes")
        names = [tn.name for tn in self.tenants or []]
        if len(set(names)) != len(names):
            raise ValueError("tenant names must be unique")
        for tn in self.tenants or []:
            if tn.max_priority is not None and tn.max_priority not in classes:
                raise ValueError(f"tenant {tn.name}: maxPriority {tn.max_priority!r} is not a priority class")
            if tn.key_secret_ref is None and tn.name != self.access.anonymous_tenant:
                raise ValueError(f"tenant {tn.name}: only the anonymous tenant may omit keySecretRef")
        return self

    def _durations(self) -> list[tuple[str, str]]:
        a = self.autoscaling
        return [
            ("concurrency.probeDuration", self.concurrency.probe_duration),
            ("concurrency.adaptiveInterval", self.concurrency.adaptive_interval),
            ("queue.targetWait", self.queue.target_wait),
            ("timeouts.queue", self.timeouts.queue),
            ("timeouts.request", self.timeouts.request),
            ("timeouts.drain", self.timeouts.drain),
            ("priorities.aging", self.priorities.aging),
            ("batching.maxWait", self.batching.max_wait),
            ("degradation.waitThreshold", self.degradation.wait_threshold),
            ("degradation.cache.ttl", self.degradation.cache.ttl),
            ("autoscaling.targetWaitP95", a.target_wait_p95),
            ("autoscaling.pollingInterval", a.polling_interval),
            ("autoscaling.scaleUp.stabilizationWindow", a.scale_up.stabilization_window),
            ("autoscaling.scaleUp.period", a.scale_up.period),
            ("autoscaling.scaleDown.stabilizationWindow", a.scale_down.stabilization_window),
            ("autoscaling.scaleDown.period", a.scale_down.period),
            ("autoscaling.scaleDown.releaseWindow", a.scale_down.release_window),
            ("autoscaling.scaleToZeroAfter", a.scale_to_zero_after),
            *([("gateway.startupEstimate", self.gateway.startup_estimate)] if self.gateway.startup_estimate else []),
            ("gateway.hold.retryAfter", self.gateway.hold.retry_after),
            ("monitoring.interval", self.monitoring.interval),
        ]

    @property
    def keyed_tenants(self) -> list[TenantSpec]:
        """Tenants identified by an API key (the anonymous tenant may have none)."""
        return [tn for tn in self.tenants or [] if tn.key_secret_ref is not None]


def parse_spec(spec: Any) -> InferenceServiceSpec:
    """Validate a raw ``spec`` mapping. Raises :class:`SpecError` naming the field(s)."""
    try:
        return InferenceServiceSpec.model_validate(spec)
    except ValidationError as err:
        parts = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"])
            msg = str(e["msg"]).removeprefix("Value error, ")
            parts.append(f"spec.{loc}: {msg}" if loc else f"spec: {msg}")
        raise SpecError("; ".join(parts)) from None
