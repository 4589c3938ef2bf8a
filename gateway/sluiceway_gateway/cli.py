"""``sluiceway-gateway serve``: the service edge in front of the inference pods.

Concurrency model: one process, one asyncio event loop (uvloop when installed) carrying the client
side, the pod connections, discovery, the poller and the metrics port; SIGTERM stops accepting, waits
for requests in flight (``--drain-seconds``), then exits. The keys file, the ``tenants`` section and
``hold.startupSeconds`` reload without a restart (:mod:`~sluiceway_gateway.reload`, one more task on
the loop), with or without tenants.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sluiceway_core.lease_client import QuotaClient, pod_name
from sluiceway_core.logformat import FORMATS, configure_logging

from .app import Gateway
from .config import GatewayConfig, GatewayConfigError, load_gateway_config, with_startup_seconds
from .endpoints import EndpointSource, StaticEndpoints
from .reload import TenantReloader
from .server import Request, Responder, ServerLimits, ServerState, serve

USAGE_EXAMPLES = """\
examples:
  sluiceway-gateway serve --config gateway.yaml
  sluiceway-gateway serve --endpoint 127.0.0.1:8001 --endpoint 127.0.0.1:8002 --port 8080
  sluiceway-gateway serve --watch-namespace demo --service demo-pods --routing powerOfTwo

config (YAML, camelCase): listen {host, port, metricsPort}, endpoints [host:port] or
watch {namespace, service, portName, apiServer, tokenFile, caFile}, routing (leastWait|powerOfTwo|random),
pollAfterMs, limits {...}, tenants (the pod's tenants block: keysFile, tenants, defaults), priorities.
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sluiceway-gateway", description="Sluiceway's service edge: routes each "
                                "request to the least-loaded inference pod and admits tenants for the whole service.",
                                epilog=USAGE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the gateway", epilog=USAGE_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--config", metavar="FILE", help="gateway YAML")
    s.add_argument("--host", help="listen address")
    s.add_argument("--port", type=int, help="listen port")
    s.add_argument("--metrics-port", type=int, help="/metrics port")
    s.add_argument("--endpoint", action="append", metavar="HOST:PORT", help="a pod (repeatable): static endpoints")
    s.add_argument("--watch-namespace", metavar="NS", help="follow EndpointSlices in this namespace")
    s.add_argument("--service", metavar="NAME", help="the pods' Service (with --watch-namespace)")
    s.add_argument("--routing", choices=["leastWait", "powerOfTwo", "random"])
    s.add_argument("--drain-seconds", type=float, default=10.0, help="wait for requests in flight on SIGTERM")
    s.add_argument("--loop", default="auto", choices=["auto", "uvloop", "asyncio"],
                   help="event loop: uvloop when installed (auto), or the standard one (bench/gateway_overhead.py)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.add_argument("--log-format", default="plain", choices=list(FORMATS),
                   help="plain (default) or json: one object per line (time, level, logger, message)")
    return p


def _overrides(ns: argparse.Namespace) -> dict[str, Any]:
    o: dict[str, Any] = {}
    for flag, key in (("host", "listen.host"), ("port", "listen.port"), ("metrics_port", "listen.metricsPort"),
                      ("routing", "routing"), ("endpoint", "endpoints")):
        v = getattr(ns, flag)
        if v is not None:
            o[key] = v
    if ns.watch_namespace or ns.service:
        if not (ns.watch_namespace and ns.service):
            raise GatewayConfigError("--watch-namespace and --service go together")
        o["watch.namespace"], o["watch.service"] = ns.watch_namespace, ns.service
    return o


def build_source(config: GatewayConfig) -> EndpointSource:
    if config.watch is not None:
        from .kube import EndpointSliceWatch

        return EndpointSliceWatch(config.watch)
    return StaticEndpoints(config.endpoints)


class _Clock:
    """The gateway's clock as the lease client reads it."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now


def limits_of(config: GatewayConfig) -> ServerLimits:
    lim = config.limits
    return ServerLimits(lim.max_connections, lim.header_timeout_seconds, lim.body_timeout_seconds,
                        lim.max_body_bytes, lim.max_header_bytes, lim.max_headers, lim.max_pipelined)


async def run(config: GatewayConfig, drain_seconds: float, config_file: str | None = None,
              overrides: dict[str, Any] | None = None) -> None:
    registry = CollectorRegistry()
    gw = Gateway(config, build_source(config), registry)
    reloader = None
    if config_file is not None:  # keys, tenant limits and the start-up estimate reload in place
        m = gw.metrics
        adm = gw.admission

        def apply_startup(seconds: float | None) -> None:
            gw.config = with_startup_seconds(gw.config, seconds)

        reloader = TenantReloader(config_file, overrides or {}, config,
                                  adm.current if adm is not None else None, adm.replace if adm is not None else None,
                                  apply_startup=apply_startup, clock=gw.clock, period=config.reload_seconds,
                                  result=lambda r: m.reloads.labels(r).inc(),
                                  failing=lambda f: m.reload_failing.set(1 if f else 0))
        reloader.start()
    state = ServerState(gw.handle, limits_of(config))
    state.on_refused = lambda reason: gw.metrics.refused.labels(gw.metrics.reason(reason)).inc()
    lease = None
    if config.quota is not None and config.quota.coordinator_url is not None and gw.admission is not None:
        # several replicas: this one leases its part of each tenant's rate and burst (admission.py)
        lease = QuotaClient(config.quota, gw.admission, gw.admission.tenant_load, _Clock(gw.clock),
                            pod=pod_name(), leaving=lambda: state.closing)
        await lease.start()

    async def metrics_handler(req: Request, out: Responder) -> None:
        if req.path == "/metrics":
            out.send(200, [(b"content-type", CONTENT_TYPE_LATEST.encode())], generate_latest(registry))
        else:
            await gw.handle(req, out) if req.path.startswith("/v2/health/") else out.send(404, [], b"")

    mstate = ServerState(metrics_handler, limits_of(config))
    server = await serve(state, config.listen.host, config.listen.port)
    mserver = await serve(mstate, config.listen.host, config.listen.metrics_port)
    background = asyncio.get_running_loop().create_task(gw.run_background())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ports = [s.getsockname()[1] for s in server.sockets]
    logging.getLogger("sluiceway.gateway").info("gateway listening on %s:%s (routing %s)", config.listen.host,
                                                ports[0] if ports else "?", config.routing)
    await stop.wait()
    server.close()
    state.closing = True
    await gw.drain(drain_seconds)
    background.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await background
    if reloader is not None:
        await reloader.stop()
    if lease is not None:
        await lease.stop()
    mserver.close()
    gw.pool.close()


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    configure_logging(ns.log_level, ns.log_format)
    try:
        overrides = _overrides(ns)
        config = load_gateway_config(ns.config, overrides)
    except GatewayConfigError as err:
        print(f"sluiceway-gateway: {err}", file=sys.stderr)
        return 2
    uvloop: Any = None
    if ns.loop != "asyncio":
        try:
            import uvloop
        except ImportError:  # the plain asyncio loop works, slower
            if ns.loop == "uvloop":
                print("sluiceway-gateway: --loop uvloop but uvloop is not installed", file=sys.stderr)
                return 2
    if uvloop is None:
        asyncio.run(run(config, ns.drain_seconds, ns.config, overrides))
    else:
        uvloop.run(run(config, ns.drain_seconds, ns.config, overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
