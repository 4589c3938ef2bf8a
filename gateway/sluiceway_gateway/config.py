"""The gateway's configuration: one pydantic model read from YAML (camelCase or snake_case keys).

No I/O except :func:`load_gateway_config`, which reads the file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel
from sluiceway_core.config import EdgeConfig, PrioritiesConfig, QuotaConfig, TenantsConfig

Routing = Literal["leastWait", "powerOfTwo", "random"]
_ADDR = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}$")


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class ListenConfig(_Model):
    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=0, le=65535)
    metrics_port: int = Field(default=9091, ge=0, le=65535)


class LimitsConfig(_Model):
    """The client side's hostile-client bounds (the pod's, see docs/pod.md) and the upstream bounds."""

    max_connections: int = Field(default=4096, ge=1, le=1_000_000, description="open client connections -> 503")
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=600)
    body_timeout_seconds: float = Field(default=30.0, gt=0, le=3600, description="whole request body -> 408")
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=1024 * 1024)
    max_headers: int = Field(default=100, ge=8, le=10_000)
    max_pipelined: int = Field(default=16, ge=1, le=1024, description="parsed requests waiting per connection")
    request_timeout_seconds: float = Field(default=60.0, gt=0, le=3600, description="without a deadline header")
    connect_timeout_seconds: float = Field(default=1.0, gt=0, le=60)
    max_idle_per_pod: int = Field(default=256, ge=0, le=100_000)
    idle_seconds: float = Field(default=2.0, gt=0, le=600, description="pooled upstream connection reuse window")
    max_response_buffer_bytes: int = Field(default=1024 * 1024, ge=4096, description="refusal bodies read whole")


class HoldConfig(_Model):
    """The hold queue (docs/gateway.md): requests kept while no ready pod can take them."""

    max_requests: int = Field(default=1024, ge=0, le=1_000_000, description="held requests; 0 turns holding off")
    max_bytes: int = Field(default=64 * 1024 * 1024, ge=0, description="held request bytes (head + body)")
    tenant_share: float = Field(default=0.5, gt=0, le=1.0,
                                description="of each bound one tenant may hold (with tenants configured)")
    handoff_queue_per_pod: int = Field(default=1, ge=0, le=10_000,
                                       description="hand-off in flight per pod beyond its permits")
    retry_after_seconds: float = Field(default=5.0, gt=0, le=3600,
                                       description="Retry-After of a refusal while no pod is ready")
    #: how long a pod takes from first seen starting to ready; ``None``: no prediction, no early 503
    startup_seconds: float | None = Field(default=None, gt=0, le=3600,
                                          description="start-up estimate for the predicted ready time")
    #: a cold start (from zero) as the gateway waits for it, less the pods' own start-up: the
    #: scaler's activation, the pod's creation and scheduling, the readiness probe's period and the
    #: EndpointSlice update; used until the gateway has measured a cold start itself
    cold_start_overhead_seconds: float = Field(default=6.0, ge=0, le=3600,
                                               description="added to startupSeconds before a cold start is measured")

    @property
    def enabled(self) -> bool:
        return self.max_requests > 0 and self.max_bytes > 0


class KubeWatchConfig(_Model):
    """EndpointSlices of one Service through the API server."""

    namespace: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    service: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    port_name: str | None = None
    api_server: str | None = Field(default=None, pattern=r"^https?://[^\s/]+$", description="default: in-cluster")
    token_file: str | None = None
    ca_file: str | None = None
    insecure_skip_tls_verify: bool = False


class GatewayConfig(_Model):
    listen: ListenConfig = Field(default_factory=ListenConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    hold: HoldConfig = Field(default_factory=HoldConfig)
    routing: Routing = "leastWait"
    #: ``host:port`` of each pod (tests, benchmarks); exclusive with ``watch``
    endpoints: list[str] = Field(default_factory=list)
    watch: KubeWatchConfig | None = None
    poll_after_ms: float = Field(default=100.0, gt=0, le=60_000, description="poll a pod not heard from this long")
    #: admission at the edge; ``None``: the gateway admits every request (the pods still decide)
    tenants: TenantsConfig | None = None
    priorities: PrioritiesConfig = Field(default_factory=PrioritiesConfig)
    #: the per-service edge token sent to the pods with every request admitted here (with ``tenants``);
    #: ``None``: the pods check every request themselves
    edge: EdgeConfig | None = None
    #: several gateway replicas split each tenant's rate and burst by leases from the quota coordinator
    #: (the operator renders it with the charter of ``<namespace>/<name>.edge``); ``None``: this
    #: replica holds the whole quota (right for one replica)
    quota: QuotaConfig | None = None
    #: seconds between rereads of the keys file and the ``tenants`` section (no restart needed)
    reload_seconds: float = Field(default=2.0, gt=0, le=3600, description="tenant keys and limits reload poll")
    seed: int | None = None

    @field_validator("endpoints")
    @classmethod
    def _addresses(cls, v: list[str]) -> list[str]:
        bad = [a for a in v if not _ADDR.match(a)]
        if bad:
            raise ValueError(f"endpoints must be host:port: {bad}")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> GatewayConfig:
        if self.endpoints and self.watch is not None:
            raise ValueError("set either endpoints (static) or watch (EndpointSlices), not both")
        if not self.endpoints and self.watch is None:
            raise ValueError("no endpoints: set endpoints or watch")
        if self.quota is not None and self.quota.coordinator_url is not None and self.tenants is None:
            raise ValueError("quota.coordinatorUrl needs tenants: there is nothing to split without them")
        if self.tenants is not None:
            for t in self.tenants.tenants:
                if t.max_priority is not None and t.max_priority not in self.priorities.classes:
                    raise ValueError(f"tenant {t.name}: maxPriority {t.max_priority!r} is not a priority class")
        return self


def with_startup_seconds(config: GatewayConfig, seconds: float | None) -> GatewayConfig:
    """``config`` with another ``hold.startupSeconds`` (a reload: the operator renders the measured
    start-up there, :mod:`~sluiceway_gateway.reload`); everything else unchanged. Raises ValueError
    for a value ``HoldConfig`` refuses."""
    hold = HoldConfig.model_validate({**config.hold.model_dump(), "startup_seconds": seconds})
    return config.model_copy(update={"hold": hold})


class GatewayConfigError(ValueError):
    """The configuration is invalid; ``str()`` names the bad field(s)."""


def load_gateway_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> GatewayConfig:
    tree: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as err:
            raise GatewayConfigError(f"{path}: {err}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise GatewayConfigError(f"{path}: expected a mapping at the top")
        tree = dict(loaded or {})
    return build_gateway_config(tree, overrides)


def build_gateway_config(tree: dict[str, Any], overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """The configuration from a parsed file and dotted-key overrides (the command line); raises
    :class:`GatewayConfigError` naming the bad fields."""
    tree = dict(tree)
    for key, value in (overrides or {}).items():
        node = tree
        parts = key.split(".")
        for p in parts[:-1]:
            child = node.get(p)
            if not isinstance(child, dict):
                child = node[p] = {}
            node = child
        node[parts[-1]] = value
    try:
        return GatewayConfig.model_validate(tree)
    except ValidationError as err:
        lines = [f"{'.'.join(str(x) for x in e['loc']) or '<top>'}: {e['msg']}" for e in err.errors()]
        raise GatewayConfigError("invalid gateway config:\n  " + "\n  ".join(lines)) from None
