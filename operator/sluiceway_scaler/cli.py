"""``sluiceway-scaler serve``: run the KEDA external scaler and its own /metrics endpoint.

The process runs the gRPC server's worker threads (see :mod:`sluiceway_scaler.service`) plus
prometheus_client's metrics HTTP thread; the main thread only waits for SIGTERM/SIGINT and then
stops the server with a grace period.

Security flags (docs/autoscaling.md): ``--allowed-prometheus URL`` and ``--allowed-pod-metrics URL``
(repeatable; with none, every address is refused), ``--tls-cert``/``--tls-key`` (TLS) and
``--tls-ca`` (mutual TLS: clients must present a certificate signed by it), ``--quota-key-file`` (the
key that signs the operator's quota charters; read once at start, its content never logged),
``--prometheus-auth-file`` (credentials per Prometheus URL: bearer token, basic auth, TLS client
certificate, CA, custom headers; the format of :mod:`sluiceway_core.promauth`, which the operator
reads from ``SLUICEWAY_PROMETHEUS_AUTH_FILE``; checked at start, secrets never logged).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from sluiceway_core.logformat import FORMATS, configure_logging
from sluiceway_core.promauth import PromAuthError, load_prom_auth
from sluiceway_core.quota_charter import load_key
from sluiceway_core.urls import UrlAllowList

from sluiceway_scaler.access import AllowList
from sluiceway_scaler.metrics import ScalerMetrics
from sluiceway_scaler.prom import PrometheusSource
from sluiceway_scaler.quota_server import QuotaCoordinator, serve_quota
from sluiceway_scaler.service import MAX_ENTRIES, ExternalScalerService, TlsFiles, serve

log = logging.getLogger("sluiceway_scaler")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sluiceway-scaler", description="KEDA external scaler for Sluiceway")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the ExternalScaler gRPC API")
    s.add_argument("--host", default="0.0.0.0", help="gRPC listen address (default 0.0.0.0)")
    s.add_argument("--port", type=int, default=9090, help="gRPC port (default 9090; 0 picks a free one)")
    s.add_argument("--metrics-port", type=int, default=9091, help="/metrics port (default 9091; -1 disables)")
    s.add_argument("--workers", type=int, default=64,
                   help="gRPC worker threads; each open StreamIsActive holds one, and a quarter (at least 2) "
                        "is kept for GetMetrics/IsActive: streams past the rest are refused (default 64)")
    s.add_argument("--max-triggers", type=int, default=MAX_ENTRIES,
                   help=f"trigger identities whose state is kept; new ones past it are refused (default {MAX_ENTRIES})")
    s.add_argument("--grace", type=float, default=5.0, help="seconds to finish calls on shutdown")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.add_argument("--log-format", default="plain", choices=FORMATS,
                   help="plain: 'time level logger: message'; json: one object per line with time, level, "
                        "logger, message (and exception) (default plain; chart: logFormat)")
    s.add_argument("--quota-port", type=int, default=-1,
                   help="serve the tenant-quota lease coordinator (HTTP) on this port (-1 disables; 0 picks one)")
    s.add_argument("--quota-lease-seconds", type=float, default=3.0, help="quota lease period (default 3)")
    s.add_argument("--quota-key-file", type=Path,
                   help="the quota key (>= 32 bytes) that signs the operator's quota charters; without it the "
                        "coordinator refuses every lease (chart: /etc/sluiceway/quota-key/key)")
    s.add_argument("--allowed-prometheus", action="append", default=[], metavar="URL",
                   help="a Prometheus base URL triggers may name in prometheusAddress (repeatable; "
                        "exact match after normalising; with none, every address is refused)")
    s.add_argument("--allowed-pod-metrics", action="append", default=[], metavar="URL",
                   help="a pod /metrics URL triggers may name in podMetricsUrls (repeatable; default none)")
    s.add_argument(
        "--prometheus-auth-file",
        type=Path,
        metavar="FILE",
        help="credentials per Prometheus base URL (YAML/JSON: bearerTokenFile, basicAuth, tls "
        "caFile/certFile/keyFile, headers such as X-Scope-OrgID; docs/install.md); secrets are "
        "read from the files it names, never logged (chart: prometheusAuth)",
    )
    s.add_argument("--tls-cert", type=Path, help="PEM server certificate: serve gRPC over TLS")
    s.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    s.add_argument("--tls-ca", type=Path,
                   help="PEM CA bundle: require client certificates signed by it (mutual TLS)")
    return p


def _tls(args: argparse.Namespace) -> TlsFiles | None:
    if args.tls_ca is not None and (args.tls_cert is None or args.tls_key is None):
        raise ValueError("--tls-ca needs --tls-cert and --tls-key")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key must be given together")
    if args.tls_cert is None:
        return None
    return TlsFiles(args.tls_cert, args.tls_key, args.tls_ca)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    if not 0 <= args.port <= 65535 or args.workers < 1 or args.max_triggers < 1:
        print("error: --port must be within 0..65535, --workers and --max-triggers >= 1", file=sys.stderr)
        return 2
    try:
        allowed = AllowList.build(args.allowed_prometheus, args.allowed_pod_metrics)
        tls = _tls(args)
        quota_key = load_key(args.quota_key_file) if args.quota_key_file is not None else None
        auth = load_prom_auth(args.prometheus_auth_file) if args.prometheus_auth_file is not None else None
    except (ValueError, PromAuthError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    registry = CollectorRegistry()
    metrics = ScalerMetrics(registry)
    source = PrometheusSource(metrics, allow=UrlAllowList(allowed.prometheus), auth=auth)
    service = ExternalScalerService(metrics, source, allowed=allowed, max_entries=args.max_triggers)
    try:
        server, port = serve(service, args.host, args.port, args.workers, tls=tls)
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.metrics_port >= 0:
        start_http_server(args.metrics_port, addr=args.host, registry=registry)
    # Printed on stdout so that tests and scripts can find a port picked with --port 0.
    print(f"sluiceway-scaler listening on {args.host}:{port}", flush=True)
    if args.quota_port >= 0:  # tenant quotas (issue 11): see sluiceway_scaler.quota_server
        coordinator = QuotaCoordinator(args.quota_lease_seconds, key=quota_key)
        _quota, qport, _ = serve_quota(coordinator, args.host, args.quota_port)
        print(f"sluiceway-scaler quota coordinator listening on {args.host}:{qport}", flush=True)
    # The handler only appends to a list: no lock. Setting a threading.Event there deadlocked when
    # the signal came while the main thread held the Event's own lock on its way into wait() (a CI
    # rehearsal's SIGTERM right after the last start-up line: the process never exited); the main
    # thread polls instead, and time.sleep returns early for a signal.
    stopping: list[int] = []

    def _stop(signum: int, _frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if not allowed.prometheus:
        log.warning("no --allowed-prometheus: every trigger's prometheusAddress is refused")
    log.info(
        "gRPC over %s; allowed Prometheus: %s; allowed pod metrics: %s",
        tls.mode if tls is not None else "plaintext (no --tls-cert)",
        ", ".join(sorted(allowed.prometheus)) or "none",
        ", ".join(sorted(allowed.pod_metrics)) or "none",
    )
    if auth is not None:
        log.info("Prometheus credentials: %s", auth.describe())
    while not stopping:
        time.sleep(0.2)
    log.info("signal %d: stopping", stopping[0])
    service.stop()
    server.stop(args.grace).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
