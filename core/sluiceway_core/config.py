"""The pod configuration: one pydantic model, the contract between operator and pod.

The operator renders an ``InferenceService`` into this model and writes it (camelCase, YAML) into
the pod's ConfigMap; ``sluiceway-pod serve --config FILE`` reads it back. Field names accept both
camelCase (the rendered form) and snake_case.

Precedence when the pod starts: command-line flags > config file > ``SLUICEWAY_*`` environment
variables > defaults. Environment variables nest with ``__``: ``SLUICEWAY_QUEUE__TIMEOUT_SECONDS=2``.
A few short aliases exist for the common knobs (``SLUICEWAY_MODEL``, ``SLUICEWAY_PORT``, ...), see
:data:`ENV_ALIASES`.

This module does no I/O except :func:`load_config`, which reads the file and the environment.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

Auto = Literal["auto"]


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class TensorSpecConfig(_Model):
    """One declared input or output tensor. ``-1`` in ``shape`` means any size."""

    name: str = Field(min_length=1)
    datatype: Literal["BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"] = "FP32"
    shape: list[int] = Field(default_factory=lambda: [-1])
    max_shape: list[int] | None = Field(
        default=None,
        description="the largest shape accepted (same rank as shape; equal where shape is fixed); "
        "larger requests get 400, and the warm-up memory probe runs at this shape",
    )

    @model_validator(mode="after")
    def _max_shape_ok(self) -> TensorSpecConfig:
        if self.max_shape is None:
            return self
        if len(self.max_shape) != len(self.shape):
            raise ValueError(f"maxShape {self.max_shape} must have the rank of shape {self.shape}")
        for d, m in zip(self.shape, self.max_shape, strict=True):
            if m < 1 or (d != -1 and m != d):
                raise ValueError(f"maxShape {self.max_shape} must be >= 1 and equal shape {self.shape} where fixed")
        return self


#: ``synthetic:<milliseconds>`` (a decimal, no sign or exponent). The CRD's CEL rules carry the same
#: regular expression (tests/operator/test_operator_apiserver.py checks both on the same strings).
SYNTHETIC_SPEC = re.compile(r"synthetic:[0-9]+(\.[0-9]+)?")
#: ``package.module:factory``; a module named ``synthetic`` is not one (``synthetic:`` is the prefix
#: of the synthetic model).
PYTHON_SPEC = re.compile(r"(?!synthetic:)[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")


def check_model_spec(v: str) -> str:
    """The pod's model grammar, for the model and its fallback. Raises ValueError."""
    if not v:
        raise ValueError("model spec must not be empty")
    if v.startswith("synthetic:"):
        if not SYNTHETIC_SPEC.fullmatch(v):
            raise ValueError(f"synthetic spec needs milliseconds ('synthetic:<ms>'), got {v!r}")
        ms = float(v.split(":", 1)[1])
        if not 0 <= ms <= 600_000:
            raise ValueError("synthetic milliseconds must be within 0..600000")
    return v


class ModelConfig(_Model):
    """Which model to serve.

    ``spec`` is one of ``demo``, ``synthetic:<ms>`` (:data:`SYNTHETIC_SPEC`), a TorchScript file path,
    or ``module:factory`` (:data:`PYTHON_SPEC`).
    """

    spec: str = "demo"
    name: str = Field(default="demo", pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
    version: str = "1"
    inputs: list[TensorSpecConfig] | None = None
    outputs: list[TensorSpecConfig] | None = None
    warmup_iterations: int = Field(default=3, ge=1, le=1000)

    @field_validator("spec")
    @classmethod
    def _spec_ok(cls, v: str) -> str:
        return check_model_spec(v)


class AccessLogConfig(_Model):
    """One log line per inference request at the pod (logger ``sluiceway.access``): tenant, model,
    status, reason, queue wait, execution time, request id, bytes; never the API key or the body.
    Off by default; ``sampleRate`` of the requests are logged when on (refusals included)."""

    enabled: bool = False
    sample_rate: float = Field(default=1.0, ge=0, le=1)


class TracingConfig(_Model):
    """OpenTelemetry tracing at the pod: off unless ``endpoint`` is set (an OTLP/HTTP traces URL,
    e.g. ``http://collector:4318/v1/traces``). ``sampleRatio`` of the traces that the caller did not
    already decide (a ``traceparent`` with its sampled flag is followed)."""

    endpoint: str | None = Field(default=None, min_length=1)
    sample_ratio: float = Field(default=1.0, ge=0, le=1)
    service_name: str = Field(default="sluiceway-pod", min_length=1)


class ServerConfig(_Model):
    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=1, le=65535)
    metrics_port: int = Field(default=9091, ge=1, le=65535)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    max_inflight_body_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="request bodies admitted but not yet decoded (binary-tensor bodies: not yet answered), "
        "all connections together -> 429",
    )
    drain_seconds: float = Field(default=30.0, gt=0, le=3600)
    drain_delay_seconds: float = Field(
        default=0.0, ge=0, le=600, description="after SIGTERM: not ready, but still admitting, this long"
    )
    max_connections: int = Field(default=1024, ge=1, le=1_000_000, description="open HTTP connections -> 503")
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=600, description="request line and headers")
    body_timeout_seconds: float = Field(default=30.0, gt=0, le=3600, description="whole request body -> 408")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["plain", "json"] = Field(default="plain", description="json: one JSON object per line")
    access_log: AccessLogConfig = Field(default_factory=AccessLogConfig)


class ConcurrencyConfig(_Model):
    """GPU permits: how many requests (or batches) may run on the device at once.

    ``auto`` measures the peak memory of one batch (at the inputs' ``maxShape``) during warm-up:
    the memory bound is ``floor((free - memoryReserveBytes) * safetyFactor / peak)``, at least 1.
    A closed-loop probe at 1, 2, 4, ... permits up to that bound (``probeSeconds``) then picks the
    smallest count reaching ``probeShare`` of the best throughput; with ``adaptive`` the running pod
    keeps moving it (shrinks when measured peaks rise or on OOM, grows back one permit per
    ``adaptiveIntervalSeconds`` while there is room; a TCP-Vegas check on batch latency), never above
    the memory bound. Without a device memory probe (CPU), ``auto`` is ``cpuDefault``.
    """

    permits: int | Auto = Field(default="auto")
    memory_reserve_bytes: int = Field(default=1024**3, ge=0)
    safety_factor: float = Field(default=0.8, gt=0, le=1)
    cpu_default: int = Field(default=2, ge=1, le=256)
    max_permits: int = Field(default=64, ge=1, le=1024)
    probe_seconds: float = Field(
        default=2.0, ge=0, le=600, description="auto: closed-loop throughput probe budget at warm-up; 0 = off"
    )
    probe_share: float = Field(default=0.95, gt=0, le=1, description="auto: smallest permits reaching this share")
    adaptive: bool = Field(default=True, description="auto: keep adjusting permits from measured peaks and latency")
    adaptive_interval_seconds: float = Field(default=1.0, gt=0, le=3600)

    @field_validator("permits")
    @classmethod
    def _permits_ok(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("permits must be >= 1 or 'auto'")
        return v


class QueueConfig(_Model):
    """The bounded queue and the two time budgets.

    ``maxDepth: auto`` derives the bound from ``targetWaitSeconds`` with the N*T/S rule
    (permits * target wait / service time), measured at warm-up.
    """

    max_depth: int | Auto = Field(default=64)
    target_wait_seconds: float = Field(default=2.0, gt=0, le=3600)
    timeout_seconds: float = Field(default=5.0, gt=0, le=3600, description="queue-wait budget -> 503")
    exec_timeout_seconds: float = Field(default=30.0, gt=0, le=3600, description="execution budget -> 504")
    stuck_grace_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="past the execution budget: a permit counts as stuck"
    )
    min_auto_depth: int = Field(default=1, ge=1)
    max_auto_depth: int = Field(default=10_000, ge=1)

    @field_validator("max_depth")
    @classmethod
    def _depth_ok(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 1_000_000:
            raise ValueError("maxDepth must be within 1..1000000 or 'auto'")
        return v


class PrioritiesConfig(_Model):
    """Priority classes, highest first, chosen per request by ``X-Sluiceway-Priority``.

    A waiting request rises one class every ``agingSeconds`` (see docs/scheduling.md for the
    resulting bound on the lowest class's wait).
    """

    classes: list[str] = Field(default_factory=lambda: ["critical", "standard", "batch"], min_length=1)
    default: str = "standard"
    aging_seconds: float = Field(default=1.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _check(self) -> PrioritiesConfig:
        if len(set(self.classes)) != len(self.classes):
            raise ValueError("priority class names must be unique")
        bad = [c for c in self.classes if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?", c)]
        if bad:
            raise ValueError(f"priority class names must be lower-case DNS labels: {bad}")
        if self.default not in self.classes:
            raise ValueError(f"default priority {self.default!r} is not one of {self.classes}")
        return self


class BatchingConfig(_Model):
    """Dynamic batching. ``maxBatchSize: 1`` turns it off; ``auto`` sizes it from the memory probe."""

    max_batch_size: int | Auto = 1
    max_batch_wait_ms: float = Field(default=5.0, ge=0, le=10_000)
    max_auto_batch_size: int = Field(default=32, ge=1, le=4096)

    @field_validator("max_batch_size")
    @classmethod
    def _bs_ok(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 4096:
            raise ValueError("maxBatchSize must be within 1..4096 or 'auto'")
        return v


class TenantLimits(_Model):
    """Per-tenant admission limits. ``None`` means unlimited for that knob."""

    rate: float | None = Field(default=None, gt=0, description="token refill per second")
    burst: int | None = Field(default=None, ge=1)
    max_concurrent: int | None = Field(default=None, ge=1)
    max_queued: int | None = Field(default=None, ge=1)
    weight: int = Field(default=1, ge=1, le=1000)
    max_priority: str | None = None


class TenantConfig(TenantLimits):
    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class TenantsConfig(_Model):
    """Who may call, and with what limits.

    ``keysFile`` holds lines ``<sha256-hex-of-key> <tenant>``: hashes only, never keys.
    With ``allowAnonymous`` a request without ``Authorization`` is served as ``anonymousTenant``.
    Unset, anonymous access is on only while there is no ``keysFile`` (see :attr:`anonymous_allowed`).
    """

    keys_file: str | None = None
    allow_anonymous: bool | None = None
    anonymous_tenant: str = "anonymous"
    defaults: TenantLimits = Field(default_factory=TenantLimits)
    tenants: list[TenantConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> TenantsConfig:
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenant names must be unique")
        if self.allow_anonymous is False and self.keys_file is None:
            raise ValueError("allowAnonymous is false but no keysFile is configured: nobody could call")
        return self

    @property
    def anonymous_allowed(self) -> bool:
        """Anonymous access in force: as set, else off whenever tenants have keys."""
        return self.allow_anonymous if self.allow_anonymous is not None else self.keys_file is None


class CacheConfig(_Model):
    enabled: bool = True
    max_entries: int = Field(default=1024, ge=1, le=10_000_000)
    ttl_seconds: float = Field(default=60.0, gt=0)


class FallbackModelConfig(_Model):
    spec: str
    permits: int = Field(default=1, ge=1, le=64)

    @field_validator("spec")
    @classmethod
    def _spec_ok(cls, v: str) -> str:
        return check_model_spec(v)


class DegradationConfig(_Model):
    """The degradation ladder, used when the predicted queue wait exceeds ``waitThresholdSeconds``
    (or the queue is full): fallback model, then the response cache, then reject."""

    enabled: bool = False
    wait_threshold_seconds: float = Field(default=1.0, gt=0)
    fallback: FallbackModelConfig | None = None
    cache: CacheConfig = Field(default_factory=CacheConfig)


class QuotaConfig(_Model):
    """Service-wide tenant quotas: where the quota coordinator is and who this pod is.

    Without ``coordinatorUrl`` each pod enforces the whole quota by itself (right for one replica).
    With it, the pod leases its share of every tenant's quota (see docs/scheduling.md); the pod's
    name comes from ``POD_NAME`` (the downward API), else the host name.
    """

    coordinator_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    service: str | None = Field(default=None, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?/[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
    lease_seconds: float = Field(default=3.0, ge=0.5, le=60)
    assumed_replicas: int = Field(default=1, ge=1, le=10_000, description="fallback divisor before a first lease")
    #: The operator's signed view of this service's quotas (:mod:`sluiceway_core.quota_charter`,
    #: ``QuotaCharter.to_json``); the pod sends it with every renewal, with the signature read from
    #: ``token_file`` (the pod's Secret), and the coordinator trusts only what the signature covers.
    charter: dict[str, Any] | None = None
    token_file: str | None = Field(default=None, description="file holding the charter's signature")

    @model_validator(mode="after")
    def _both(self) -> QuotaConfig:
        if self.coordinator_url is not None and self.service is None:
            raise ValueError("quota.service ('<namespace>/<name>') is required with quota.coordinatorUrl")
        return self


class EdgeConfig(_Model):
    """Trust between the gateway and the pods (:mod:`sluiceway_core.edge`): the per-service edge token's
    file (the Secret ``<name>-edge``, key ``token``, mounted at ``/etc/sluiceway/edge/token``).
    In the gateway: sent with every request it admitted. In a pod: a request presenting it is taken
    as the gateway's, with the tenant and priority it names. Absent: no gateway is trusted."""

    token_file: str = Field(min_length=1)


class PodConfig(_Model):
    """Everything one inference pod needs. Rendered by the operator, read by ``sluiceway-pod``."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)
    queue: QueueConfig = Field(default_factory=QueueConfig)
    priorities: PrioritiesConfig = Field(default_factory=PrioritiesConfig)
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    tenants: TenantsConfig = Field(default_factory=TenantsConfig)
    degradation: DegradationConfig = Field(default_factory=DegradationConfig)
    quota: QuotaConfig | None = None  # None: every pod enforces the whole quota (one replica)
    edge: EdgeConfig | None = None  # None: no gateway is trusted (every request shows its own API key)
    tracing: TracingConfig = Field(default_factory=TracingConfig)

    @model_validator(mode="after")
    def _cross(self) -> PodConfig:
        for t in self.tenants.tenants:
            if t.max_priority is not None and t.max_priority not in self.priorities.classes:
                raise ValueError(f"tenant {t.name}: maxPriority {t.max_priority!r} is not a priority class")
        mp = self.tenants.defaults.max_priority
        if mp is not None and mp not in self.priorities.classes:
            raise ValueError(f"tenants.defaults.maxPriority {mp!r} is not a priority class")
        return self

    def to_yaml(self) -> str:
        """The canonical rendered form (camelCase, sorted keys): what the operator writes."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return yaml.safe_dump(data, sort_keys=True)


# --------------------------------------------------------------------------------------------------
# Loading: defaults < env < file < flags.

ENV_PREFIX = "SLUICEWAY_"
#: Short environment names for the most common knobs.
ENV_ALIASES: Mapping[str, tuple[str, ...]] = {
    "MODEL": ("model", "spec"),
    "MODEL_NAME": ("model", "name"),
    "HOST": ("server", "host"),
    "PORT": ("server", "port"),
    "CONCURRENCY": ("concurrency", "permits"),
    "MAX_QUEUE": ("queue", "maxDepth"),
    "QUEUE_TIMEOUT": ("queue", "timeoutSeconds"),
    "EXEC_TIMEOUT": ("queue", "execTimeoutSeconds"),
}


class ConfigError(ValueError):
    """The configuration is invalid. ``str()`` names the bad field(s)."""


def _set_path(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = tree
    for key in path[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[path[-1]] = value


def _parse_scalar(raw: str) -> Any:
    """Environment values are YAML scalars: ``2`` -> int, ``true`` -> bool, ``auto`` -> str."""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _camel(path_part: str) -> str:
    return to_camel(path_part.lower())


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key in (ENV_PREFIX + "CONFIG",):
            continue
        rest = key[len(ENV_PREFIX) :]
        if rest in ENV_ALIASES:
            _set_path(tree, ENV_ALIASES[rest], _parse_scalar(raw))
        elif "__" in rest:
            _set_path(tree, tuple(_camel(p) for p in rest.split("__")), _parse_scalar(raw))
    return tree


def deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _normalise_keys(tree: Any) -> Any:
    """Accept snake_case in files and flags by converting every key to camelCase."""
    if isinstance(tree, dict):
        return {(_camel(k) if "_" in k else k): _normalise_keys(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_normalise_keys(v) for v in tree]
    return tree


def format_validation_error(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def build_config(*layers: Mapping[str, Any]) -> PodConfig:
    """Merge layers (lowest precedence first) and validate. Raises :class:`ConfigError`."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged = deep_merge(merged, _normalise_keys(dict(layer)))
    try:
        return PodConfig.model_validate(merged)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: not valid YAML/JSON: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return data


def load_config(
    file: str | os.PathLike[str] | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> PodConfig:
    """Load with precedence flags > file > env > defaults. ``flags`` is a nested dict."""
    env = os.environ if environ is None else environ
    if file is None and env.get(ENV_PREFIX + "CONFIG"):
        file = env[ENV_PREFIX + "CONFIG"]
    layers: list[Mapping[str, Any]] = [env_overrides(env)]
    if file is not None:
        layers.append(read_config_file(file))
    if flags:
        layers.append(flags)
    return build_config(*layers)
