"""Hot reload of the gateway's tenant keys and limits: no restart when a key rotates or a rate changes.

The same rules as the pods' (``sluiceway_pod.reload``, docs/pod.md), read by the gateway's own code
(the gateway imports no pod code): the keys file (``tenants.keysFile``, the key-hash Secret) and the
``tenants`` section of the gateway's config file (the operator's ConfigMap) are mounted volumes the
kubelet updates by swapping the ``..data`` symlink to a new directory. Every ``reloadSeconds`` the
reloader reads both files *through* their paths, compares their content hash (a symlink swap may keep
an old mtime) and, when the tenants or keys parsed from them differ from those in force, swaps them
into the edge admission (:meth:`~sluiceway_gateway.admission.EdgeAdmission.replace`: each tenant's
token bucket keeps its tokens, its outstanding count stays).

What reloads: every field under ``tenants``, and ``hold.startupSeconds`` (the start-up estimate the
operator renders from the pods' measured start phases, ``status.startup``: a new measurement must
reach the gateway without a restart, so it is kept out of the gateway Deployment's config hash and
applied here through ``apply_startup``). Everything else in the config file (and turning ``tenants``
on or off) needs a restart: a change there is logged once, counted (``restart_required``) and not
applied. Without ``tenants`` (``current``/``apply`` None) only the start-up estimate reloads.

Failures never crash and never half-apply: a file missing, unreadable, over :data:`MAX_FILE_BYTES`
(Kubernetes' own limit for a ConfigMap or Secret), not UTF-8, not YAML/JSON, not a valid gateway
configuration, or a keys file with a bad line keeps the keys and limits in force; the reason is logged
once per distinct content, never the content (a bad keys line is named by number), and
``sluiceway_gateway_config_reload_total{result="rejected"}`` counts it while
``sluiceway_gateway_config_reload_failing`` is 1.

Concurrency model: :class:`TenantReloader` is one task on the gateway's event loop. Each poll reads and
parses in a worker thread (:func:`read_tenant_files`: bounded work, no shared state) and applies the
result back on the loop in one synchronous call, so no request sees half a reload; requests admitted
before it keep their tickets. Time comes from the injected clock and sleep.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sluiceway_core.config import TenantsConfig
from sluiceway_core.keys import KeyFile, parse_keys_text
from sluiceway_core.reloadfiles import MAX_FILE_BYTES, PollingReloader, ReloadError, parse_mapping, read_capped

from .config import GatewayConfig, GatewayConfigError, build_gateway_config

log = logging.getLogger("sluiceway.gateway.reload")


Current = Callable[[], tuple[TenantsConfig, KeyFile]]
Apply = Callable[[TenantsConfig, KeyFile], None]
ApplyStartup = Callable[[float | None], None]


@dataclass(frozen=True)
class TenantFiles:
    """What one poll read; ``digest`` covers the bytes of both files."""

    digest: str
    config: GatewayConfig
    keys: KeyFile


def read_tenant_files(config_file: str, overrides: Mapping[str, Any], limit: int = MAX_FILE_BYTES) -> TenantFiles:
    """Read and parse the config file (with the same command-line overrides as at start) and the
    keys file it names. Raises ReloadError."""
    raw = read_capped(config_file, limit)
    h = hashlib.sha256(len(raw).to_bytes(8, "big") + raw)
    try:
        config = build_gateway_config(parse_mapping(config_file, raw), dict(overrides))
    except GatewayConfigError as e:  # names the fields, not the values
        raise ReloadError(f"{config_file}: {e}") from None
    keys = KeyFile(None, ())
    path = config.tenants.keys_file if config.tenants is not None else None
    if path is not None:
        kraw = read_capped(path, limit)
        h.update(kraw)
        try:
            keys = parse_keys_text(kraw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ReloadError(f"{path}: not UTF-8") from None
        except ValueError as e:  # names the line by number, never its content
            raise ReloadError(f"{path}: {e}") from None
    return TenantFiles(h.hexdigest(), config, keys)


#: What reloads in place besides ``tenants``: the ``hold`` section's fields named here.
RELOADED_HOLD_FIELDS = frozenset({"startup_seconds"})


def outside_tenants(running: GatewayConfig, new: GatewayConfig) -> list[str]:
    """Top-level sections that need a restart and differ: all but ``tenants`` and
    ``hold.startupSeconds``, and ``tenants`` too when it is turned on or off."""
    a = running.model_dump(exclude={"tenants": True, "hold": set(RELOADED_HOLD_FIELDS)})
    b = new.model_dump(exclude={"tenants": True, "hold": set(RELOADED_HOLD_FIELDS)})
    out = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if (running.tenants is None) != (new.tenants is None):
        out.append("tenants (turned on or off)")
    return out


class TenantReloader(PollingReloader):
    """Polls the files and swaps tenants and keys in when they change, and the start-up estimate
    (``apply_startup``, when given). ``result(name)`` is called once per outcome worth counting:
    ``applied``, ``rejected``, ``restart_required``; ``failing`` with True while the files on disk are
    rejected, False once they are good again. ``current``/``apply`` None: no tenants to reload."""

    def __init__(
        self,
        config_file: str,
        overrides: Mapping[str, Any],
        running: GatewayConfig,
        current: Current | None,
        apply: Apply | None,
        *,
        apply_startup: ApplyStartup | None = None,
        clock: Callable[[], float],
        period: float,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        result: Callable[[str], None] = lambda _r: None,
        failing: Callable[[bool], None] = lambda _f: None,
        limit: int = MAX_FILE_BYTES,
    ) -> None:
        super().__init__(now=clock, period=period, sleep=sleep, result=result, failing=failing, owner="gateway",
                         logger=log)
        self.config_file = config_file
        self.overrides = dict(overrides)
        self.running = running
        self._current = current
        self._apply = apply
        self._apply_startup = apply_startup
        self._startup = running.hold.startup_seconds  # the estimate in force
        self.clock = clock
        self.limit = limit
        self._warned: tuple[str, ...] = ()
        self.applied = 0

    async def poll(self) -> str:
        """One poll: ``unchanged``, ``applied`` or ``rejected``."""
        try:
            files = await asyncio.to_thread(read_tenant_files, self.config_file, self.overrides, self.limit)
        except ReloadError as e:
            return self._reject(str(e), None)
        if files.digest == self._seen:
            return "unchanged"
        self._failing(False)
        outside = tuple(outside_tenants(self.running, files.config))
        if outside and outside != self._warned:
            log.warning("config file: %s changed; only the tenants section reloads, the rest applies after a "
                        "restart", ", ".join(outside))
            self._result("restart_required")
        self._warned = outside
        tenants = files.config.tenants
        startup = files.config.hold.startup_seconds
        new_tenants = (tenants is not None and self.running.tenants is not None and self._current is not None
                       and self._apply is not None and (tenants, files.keys) != self._current())
        new_startup = self._apply_startup is not None and startup != self._startup
        if not (new_tenants or new_startup):
            self._seen = files.digest
            return "unchanged"
        if new_tenants:
            assert tenants is not None and self._apply is not None
            try:
                self._apply(tenants, files.keys)
            except ValueError as e:
                return self._reject(f"tenants: {e}", files.digest)
            log.info("reloaded tenants: %d listed, %d keys, anonymous %s", len(tenants.tenants),
                     len(files.keys.entries), "on" if tenants.anonymous_allowed else "off")
        if new_startup:
            assert self._apply_startup is not None
            self._apply_startup(startup)  # a validated HoldConfig value: cannot be refused
            log.info("reloaded hold.startupSeconds: %s -> %s", self._startup, startup)
            self._startup = startup
        self._seen = files.digest
        self.applied += 1
        self._result("applied")
        return "applied"
