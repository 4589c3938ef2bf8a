"""``sluiceway-scaler serve``: run the KEDA external scaler and its own /metrics endpoint.

The process runs the gRPC server's worker threads (see :mod:`sluiceway_scaler.service`) plus
prometheus_client's metrics HTTP thread; the main thread only waits for SIGTERM/SIGINT and then
stops the server with a grace period.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from prometheus_client import CollectorRegistry, start_http_server

from sluiceway_scaler.metrics import ScalerMetrics
from sluiceway_scaler.service import ExternalScalerService, serve

log = logging.getLogger("sluiceway_scaler")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sluiceway-scaler", description="KEDA external scaler for Sluiceway")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the ExternalScaler gRPC API")
    s.add_argument("--host", default="0.0.0.0", help="gRPC listen address (default 0.0.0.0)")
    s.add_argument("--port", type=int, default=9090, help="gRPC port (default 9090; 0 picks a free one)")
    s.add_argument("--metrics-port", type=int, default=9091, help="/metrics port (default 9091; -1 disables)")
    s.add_argument("--workers", type=int, default=64,
                   help="gRPC worker threads; each open StreamIsActive holds one (default 64)")
    s.add_argument("--grace", type=float, default=5.0, help="seconds to finish calls on shutdown")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=args.log_level.upper(), format=fmt)
    if not 0 <= args.port <= 65535 or args.workers < 1:
        print("error: --port must be within 0..65535 and --workers >= 1", file=sys.stderr)
        return 2
    registry = CollectorRegistry()
    metrics = ScalerMetrics(registry)
    if args.metrics_port >= 0:
        start_http_server(args.metrics_port, addr=args.host, registry=registry)
    service = ExternalScalerService(metrics)
    server, port = serve(service, args.host, args.port, args.workers)
    # Printed on stdout so that tests and scripts can find a port picked with --port 0.
    print(f"sluiceway-scaler listening on {args.host}:{port}", flush=True)
    done = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    done.wait()
    service.stop()
    server.stop(args.grace).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
