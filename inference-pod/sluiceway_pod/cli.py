"""``sluiceway-pod``: the inference pod's command line.

    sluiceway-pod serve [--config FILE] [--host H] [--port P] [--metrics-port P] [--model SPEC]
                        [--model-name NAME] [--concurrency N|auto] [--max-queue N|auto]
                        [--queue-timeout S] [--exec-timeout S]
    sluiceway-pod check-config [--config FILE]     print the effective configuration, or the error

Flags override the config file, which overrides ``SLUICEWAY_*`` environment variables. An invalid
configuration exits 2, naming the bad field.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from sluiceway_core.config import ConfigError, load_config


def _int_or_auto(v: str) -> int | str:
    return v if v == "auto" else int(v)


def _flags(ns: argparse.Namespace) -> dict[str, Any]:
    tree: dict[str, Any] = {}

    def put(path: tuple[str, ...], value: Any) -> None:
        if value is None:
            return
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = value

    put(("server", "host"), ns.host)
    put(("server", "port"), ns.port)
    put(("server", "metricsPort"), ns.metrics_port)
    put(("model", "spec"), ns.model)
    put(("model", "name"), ns.model_name)
    put(("concurrency", "permits"), ns.concurrency)
    put(("queue", "maxDepth"), ns.max_queue)
    put(("queue", "timeoutSeconds"), ns.queue_timeout)
    put(("queue", "execTimeoutSeconds"), ns.exec_timeout)
    return tree


DESCRIPTION = "sluiceway-pod: serve one model over the Open Inference Protocol v2, with admission control."

EPILOG = """\
Configuration precedence: flags > config file > SLUICEWAY_* environment variables > defaults.
Environment variables nest with a double underscore, e.g. SLUICEWAY_QUEUE__TIMEOUT_SECONDS=2;
SLUICEWAY_CONFIG names the config file. An invalid configuration exits with status 2 and names
the bad field.

Ports: inference on --port (default 8080), /metrics and the health probes on --metrics-port
(default 9091).

Examples:
  sluiceway-pod serve --model demo
  sluiceway-pod serve --model synthetic:20 --concurrency 2 --max-queue auto
  sluiceway-pod check-config --config pod.yaml
"""

COMMANDS = {
    "serve": (
        "serve the model until SIGTERM",
        "Load and warm up the model, then serve inference until SIGTERM (drains, then exits 0).",
    ),
    "check-config": (
        "print the effective configuration, or the error",
        "Merge flags, the config file and the environment, validate, and print the result as YAML "
        "(exit 0), or print the error naming the bad field (exit 2).",
    ),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sluiceway-pod",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (short, long) in COMMANDS.items():
        s = sub.add_parser(
            name, help=short, description=long, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        s.add_argument("--config", metavar="FILE", help="YAML or JSON config file (the operator's ConfigMap)")
        s.add_argument("--host", help="address to listen on (default 0.0.0.0)")
        s.add_argument("--port", type=int, help="inference port (default 8080)")
        s.add_argument("--metrics-port", type=int, help="port for /metrics and the health probes (default 9091)")
        s.add_argument("--model", metavar="SPEC", help="demo | synthetic:<ms> | /path/model.pt | module:factory")
        s.add_argument("--model-name", metavar="NAME", help="the name clients use in /v2/models/<NAME>")
        s.add_argument(
            "--concurrency", type=_int_or_auto, metavar="N|auto", help="device permits, or auto (memory-sized)"
        )
        s.add_argument("--max-queue", type=_int_or_auto, metavar="N|auto", help="queue bound, or auto (N*T/S)")
        s.add_argument("--queue-timeout", type=float, metavar="SECONDS", help="longest queue wait, then 503")
        s.add_argument("--exec-timeout", type=float, metavar="SECONDS", help="longest execution, then 504")
    return p


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    try:
        cfg = load_config(ns.config, _flags(ns))
    except (ConfigError, OSError) as e:
        print(f"sluiceway-pod: invalid configuration: {e}", file=sys.stderr)
        return 2
    if ns.command == "check-config":
        print(cfg.to_yaml(), end="")
        return 0
    logging.basicConfig(level=cfg.server.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .server import run

    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())
