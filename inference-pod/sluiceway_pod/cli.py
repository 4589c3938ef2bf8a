"""``sluiceway-pod``: the inference pod's command line.

    sluiceway-pod serve [--config FILE] [--host H] [--port P] [--model SPEC] [--model-name NAME]
                        [--concurrency N|auto] [--max-queue N|auto] [--queue-timeout S] [--exec-timeout S]
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
    put(("model", "spec"), ns.model)
    put(("model", "name"), ns.model_name)
    put(("concurrency", "permits"), ns.concurrency)
    put(("queue", "maxDepth"), ns.max_queue)
    put(("queue", "timeoutSeconds"), ns.queue_timeout)
    put(("queue", "execTimeoutSeconds"), ns.exec_timeout)
    return tree


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sluiceway-pod", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("serve", "check-config"):
        s = sub.add_parser(name)
        s.add_argument("--config", help="YAML/JSON config file (the operator's ConfigMap)")
        s.add_argument("--host")
        s.add_argument("--port", type=int)
        s.add_argument("--model", help="demo | synthetic:<ms> | /path/model.pt | module:factory")
        s.add_argument("--model-name")
        s.add_argument("--concurrency", type=_int_or_auto, help="GPU permits, or auto (memory-sized)")
        s.add_argument("--max-queue", type=_int_or_auto, help="queue bound, or auto (N*T/S)")
        s.add_argument("--queue-timeout", type=float, help="seconds a request may wait -> 503")
        s.add_argument("--exec-timeout", type=float, help="seconds a request may run -> 504")
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
