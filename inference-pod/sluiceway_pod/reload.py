"""Hot reload of the tenant keys and limits (issue 22, §3): no restart when a key rotates or a rate changes.

The keys file (``tenants.keysFile``, the key-hash Secret) and the ``tenants`` section of the config
file (the operator's ConfigMap) are mounted volumes, which the kubelet updates in place by writing a
new timestamped directory and swapping the ``..data`` symlink to it. The reloader reads both files
*through* their paths every ``period`` seconds (default :data:`DEFAULT_PERIOD`), compares their
content hashes (a symlink swap may keep an old mtime), and when the tenants or the keys parsed from
them differ from those in force, swaps them in (:meth:`sluiceway_pod.tenancy.TenantRegistry.replace`).

What reloads: every field under ``tenants`` (keys file path, anonymous access, defaults, the listed
tenants and their limits). Everything else in the config file needs a restart (the operator rolls
the Deployment for it): a change there is logged once and counted (``restart_required``), and not
applied.

Failures never crash and never half-apply: a file that is missing, unreadable, larger than
:data:`MAX_FILE_BYTES` (Kubernetes' own size limit for a ConfigMap or Secret), not UTF-8, not valid
YAML/JSON, not a valid configuration, or a keys file with a bad line keeps the keys and limits in
force; the reason is logged once per distinct content (without the content: the keys file names its
bad line by number only) and ``sluiceway_config_reload_total{result="rejected"}`` counts it, while
``sluiceway_config_reload_failing`` is 1.

Concurrency model: :class:`TenantReloader` is one task on the server's event loop. Each poll reads
and parses in a worker thread (:func:`read_tenant_files`: bounded work, no shared state) and applies
the result back on the loop in one synchronous call, so no request sees half a reload; requests
admitted before it keep their admission. Time comes from the injected clock and sleep.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sluiceway_core.config import ConfigError, PodConfig, TenantsConfig, build_config, env_overrides
from sluiceway_core.keys import KeyFile, parse_keys_text
from sluiceway_core.reloadfiles import MAX_FILE_BYTES, PollingReloader, ReloadError, parse_mapping, read_capped

from .clock import Clock

log = logging.getLogger("sluiceway.reload")

#: Seconds between polls. The kubelet itself takes up to its sync period plus its cache TTL (about
#: a minute by default) to update a mounted volume; polling faster costs two small reads.
DEFAULT_PERIOD = 2.0


@dataclass(frozen=True)
class Source:
    """Where the configuration came from at start: read again the same way on every poll."""

    config_file: str | None
    flags: Mapping[str, Any]
    environ: Mapping[str, str]


@dataclass(frozen=True)
class TenantFiles:
    """What one poll read: the tenants and keys, and the rest of the configuration (for the
    restart-required check). ``digest`` covers the bytes of both files."""

    digest: str
    tenants: TenantsConfig
    keys: KeyFile
    config: PodConfig


def read_tenant_files(source: Source, limit: int = MAX_FILE_BYTES) -> TenantFiles:
    """Read and parse the config file and the keys file it names. Raises ReloadError."""
    h = hashlib.sha256()
    layer: dict[str, Any] = {}
    if source.config_file is not None:
        raw = read_capped(source.config_file, limit)
        h.update(len(raw).to_bytes(8, "big") + raw)
        layer = parse_mapping(source.config_file, raw)
    try:
        config = build_config(env_overrides(source.environ), layer, source.flags)
    except ConfigError as e:
        raise ReloadError(f"{source.config_file or 'the configuration'}: {e}") from None
    keys = KeyFile(None, ())
    path = config.tenants.keys_file
    if path is not None:
        raw = read_capped(path, limit)
        h.update(raw)
        try:
            keys = parse_keys_text(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ReloadError(f"{path}: not UTF-8") from None
        except ValueError as e:  # names the line by number, never its content
            raise ReloadError(f"{path}: {e}") from None
    return TenantFiles(h.hexdigest(), config.tenants, keys, config)


def outside_tenants(running: PodConfig, new: PodConfig) -> list[str]:
    """Top-level config sections other than ``tenants`` that differ (they need a restart)."""
    a = running.model_dump(exclude={"tenants"})
    b = new.model_dump(exclude={"tenants"})
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


class TenantReloader(PollingReloader):
    """Polls the files and swaps tenants and keys in when they change. ``result(name)`` is called
    once per outcome worth counting: ``applied``, ``rejected``, ``restart_required``; ``failing``
    with True while the files on disk are rejected, False once they are good again."""

    def __init__(
        self,
        source: Source,
        running: PodConfig,
        current: Callable[[], tuple[TenantsConfig, KeyFile]],
        apply: Callable[[TenantsConfig, KeyFile], None],
        *,
        clock: Clock,
        period: float = DEFAULT_PERIOD,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        result: Callable[[str], None] = lambda _r: None,
        failing: Callable[[bool], None] = lambda _f: None,
        limit: int = MAX_FILE_BYTES,
    ) -> None:
        super().__init__(now=clock.now, period=period, sleep=sleep, result=result, failing=failing, owner="pod",
                         logger=log)
        self.source = source
        self.running = running
        self._current = current
        self._apply = apply
        self.clock = clock
        self.limit = limit
        self._warned: tuple[str, ...] = ()  # sections outside tenants last reported as changed
        self.applied = 0

    async def poll(self) -> str:
        """One poll: ``unchanged``, ``applied`` or ``rejected``."""
        try:
            files = await asyncio.to_thread(read_tenant_files, self.source, self.limit)
        except ReloadError as e:
            return self._reject(str(e), None)
        if files.digest == self._seen:
            return "unchanged"
        self._failing(False)
        outside = tuple(outside_tenants(self.running, files.config))
        if outside and outside != self._warned:
            log.warning(
                "config file: %s changed; only the tenants section reloads, the rest applies after a restart",
                ", ".join(outside),
            )
            self._result("restart_required")
        self._warned = outside
        if (files.tenants, files.keys) == self._current():
            self._seen = files.digest
            return "unchanged"
        try:
            self._apply(files.tenants, files.keys)
        except ValueError as e:
            return self._reject(f"tenants: {e}", files.digest)
        self._seen = files.digest
        self.applied += 1
        log.info(
            "reloaded tenants: %d listed, %d keys, anonymous %s",
            len(files.tenants.tenants),
            len(files.keys.entries),
            "on" if files.tenants.anonymous_allowed else "off",
        )
        self._result("applied")
        return "applied"
