"""``sluiceway-operator run``: start the kopf operator.

Flags override the ``SLUICEWAY_*`` environment variables (see :mod:`.settings`). The process runs
one asyncio event loop (kopf) plus kopf's thread pool for the sync handlers.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence

import kopf
from sluiceway_core.promauth import PromAuthError

from .handlers import register
from .settings import OperatorConfig, config_from_env

__all__ = ["main"]

_LOG_FORMATS = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sluiceway-operator", description="The sluiceway InferenceService operator")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="reconcile InferenceServices until interrupted")
    run.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=None,
        help="namespace to watch (repeatable); default: SLUICEWAY_NAMESPACES or all",
    )
    run.add_argument("-A", "--all-namespaces", action="store_true", help="watch the whole cluster")
    run.add_argument("--prometheus-url", default=None, help="Prometheus base URL for status and the builtin engine")
    run.add_argument("--scaler-address", default=None, help="host:port of the sluiceway KEDA external scaler")
    run.add_argument("--drift-interval", type=float, default=None, help="seconds between drift repairs")
    run.add_argument(
        "--signals-interval",
        type=float,
        default=None,
        help="seconds between Prometheus reads (status columns, builtin engine)",
    )
    run.add_argument("--log-format", choices=sorted(_LOG_FORMATS), default=None)
    run.add_argument("--liveness", default=None, help="liveness endpoint URL, e.g. http://0.0.0.0:8081/healthz")
    run.add_argument("-v", "--verbose", action="store_true")
    return p


def config_from_args(args: argparse.Namespace, base: OperatorConfig) -> OperatorConfig:
    cfg = base
    if args.all_namespaces:
        cfg = dataclasses.replace(cfg, namespaces=())
    elif args.namespace:
        cfg = dataclasses.replace(cfg, namespaces=tuple(args.namespace))
    for attr in ("prometheus_url", "scaler_address", "drift_interval", "signals_interval", "log_format", "liveness"):
        value = getattr(args, attr)
        if value is not None:
            cfg = dataclasses.replace(cfg, **{attr: value})
    if cfg.drift_interval <= 0 or cfg.signals_interval <= 0:
        raise SystemExit("sluiceway-operator: --drift-interval and --signals-interval must be > 0")
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        env_cfg = config_from_env()
        cfg = config_from_args(args, env_cfg)
    except PromAuthError as err:  # one line naming the file and the entry, never a secret
        print(f"sluiceway-operator: SLUICEWAY_PROMETHEUS_AUTH_FILE: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # a malformed SLUICEWAY_* variable or flag, or a missing quota key
        raise SystemExit(f"sluiceway-operator: {err}") from None
    kopf.configure(verbose=args.verbose, log_format=_LOG_FORMATS[cfg.log_format])
    if cfg.prom_auth is not None:
        logging.getLogger(__name__).info("Prometheus credentials: %s", cfg.prom_auth.describe())
    registry = kopf.OperatorRegistry()
    register(registry, cfg)
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=cfg.clusterwide,
        namespaces=list(cfg.namespaces),
        liveness_endpoint=cfg.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
