"""``sluiceway-pod``: the inference pod's command line.

    sluiceway-pod serve [--config FILE] [--host H] [--port P] [--metrics-port P] [--model SPEC]
                        [--model-name NAME] [--concurrency N|auto] [--max-queue N|auto]
                        [--queue-timeout S] [--exec-timeout S]
    sluiceway-pod check-config [--config FILE]     print the effective configuration, or the error
    sluiceway-pod fetch --uri URI --dest DIR [--sha256 HEX] [--max-bytes N] ...
                                                   the storage initializer (see sluiceway_pod.fetch)

Flags override the config file, which overrides ``SLUICEWAY_*`` environment variables. An invalid
configuration exits 2, naming the bad field.
"""

from __future__ import annotations

import argparse
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
    put(("server", "logFormat"), ns.log_format)
    return tree


def _reload_seconds(flag: float | None, env: str | None, default: float) -> float:
    """The reload period: the flag, else ``SLUICEWAY_RELOAD_SECONDS``, else ``default``. 0 is off."""
    value = flag
    if value is None and env:
        try:
            value = float(env)
        except ValueError:
            raise ValueError(f"SLUICEWAY_RELOAD_SECONDS: {env!r} is not a number of seconds") from None
    if value is None:
        return default
    if not 0 <= value <= 3600:
        raise ValueError(f"--reload-seconds: {value:g} is not within 0..3600")
    return value


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
  sluiceway-pod fetch --uri s3://models/mlp/ --dest /mnt/models --endpoint http://store:9000
"""

FETCH_EPILOG = """\
Stores: s3://bucket/key (one object) or s3://bucket/prefix/ (every object under it), http(s)://.../file,
oci://registry/repository:tag (or @sha256:<digest>; oci+http:// for a plain-http registry): an ORAS
artifact, one file per layer titled org.opencontainers.image.title, each checked against its digest.
S3 credentials: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN; registry credentials:
REGISTRY_USERNAME, REGISTRY_PASSWORD; from the environment, or files of those names in
--credentials-dir (a mounted Secret). They are never printed.
Endpoint and region also from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL and AWS_REGION.

A broken transfer resumes with Range (--retries times, then fails). Progress lines go to stdout.
Exit status: 0 done, 2 bad arguments, 10 no such key, 11 access denied, 12 digest mismatch,
13 out of space (--max-bytes or a full disk), 14 store unreachable or died mid-download,
15 other store error. The reason is one line on stderr (and in --termination-log).

Examples:
  sluiceway-pod fetch --uri https://example.com/m.onnx --dest /mnt/models --sha256 <64 hex>
  AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \\
    sluiceway-pod fetch --uri s3://models/mlp/ --dest /mnt/models --endpoint http://store:9000
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
        if name == "serve":
            s.add_argument("--termination-log", metavar="FILE",
                           help="when the model fails to load, write why here (the container's terminationMessagePath)")
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
        s.add_argument(
            "--log-format", choices=["plain", "json"], help="plain text, or one JSON object per line (default plain)"
        )
        s.add_argument(
            "--reload-seconds",
            type=float,
            metavar="SECONDS",
            help="how often the tenants section and the keys file are checked for changes and reloaded "
            "(default SLUICEWAY_RELOAD_SECONDS, else 2; 0 turns the reload off)",
        )
    f = sub.add_parser(
        "fetch",
        help="download a model from object storage (the storage initializer)",
        description="Download a model into --dest before the pod starts: verify digests, resume a broken "
        "download, print progress, and fail with a one-line reason and a distinct exit status.",
        epilog=FETCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    f.add_argument("--uri", required=True,
                   help="s3://bucket/key, s3://bucket/prefix/, http(s)://host/path, or oci://registry/repo:tag")
    f.add_argument("--dest", required=True, metavar="DIR", help="directory to download into (an emptyDir)")
    f.add_argument(
        "--sha256", action="append", metavar="HEX|NAME=HEX", help="expected digest (NAME=HEX per file of a prefix)"
    )
    f.add_argument("--max-bytes", type=int, metavar="N", help="refuse (out-of-space) a model larger than this")
    f.add_argument("--endpoint", metavar="URL", help="S3 endpoint (default AWS_ENDPOINT_URL_S3, AWS's)")
    f.add_argument("--region", help="S3 region for signing (default AWS_REGION or us-east-1)")
    f.add_argument("--addressing", choices=["path", "virtual"], help="S3 bucket addressing (default path)")
    f.add_argument("--ca-file", metavar="PEM", help="CA bundle for https stores (default AWS_CA_BUNDLE, the system's)")
    f.add_argument("--credentials-dir", metavar="DIR",
                   help="read AWS_* / REGISTRY_* credential files from here (a Secret)")
    f.add_argument("--retries", type=int, metavar="N", help="retries of a broken transfer (default 5)")
    f.add_argument("--backoff", type=float, metavar="SECONDS", help="first retry delay, doubling (default 0.5)")
    f.add_argument("--timeout", type=float, metavar="SECONDS", help="connect/read stall timeout (default 30)")
    f.add_argument("--limit-rate", type=int, metavar="BYTES_PER_S", help="cap the download rate")
    f.add_argument("--progress-seconds", type=float, metavar="SECONDS", help="between progress lines (default 2)")
    f.add_argument("--termination-log", metavar="FILE", help="also write the failure line here")
    return p


def main(argv: list[str] | None = None) -> int:
    import time

    started = (time.monotonic(), time.time())  # the origin of the start phases (sluiceway_pod.startphases)
    ns = parser().parse_args(argv)
    if ns.command == "fetch":
        from .fetch import main as fetch_main

        return fetch_main(ns, termination_log=ns.termination_log)
    try:
        cfg = load_config(ns.config, _flags(ns))
    except (ConfigError, OSError) as e:
        print(f"sluiceway-pod: invalid configuration: {e}", file=sys.stderr)
        return 2
    if ns.command == "check-config":
        print(cfg.to_yaml(), end="")
        return 0
    from .logs import configure_logging

    configure_logging(cfg.server.log_level, cfg.server.log_format)
    import os

    from .reload import DEFAULT_PERIOD, Source
    from .server import run

    path = ns.config or os.environ.get("SLUICEWAY_CONFIG") or None
    try:
        period = _reload_seconds(ns.reload_seconds, os.environ.get("SLUICEWAY_RELOAD_SECONDS"), DEFAULT_PERIOD)
    except ValueError as e:
        print(f"sluiceway-pod: invalid configuration: {e}", file=sys.stderr)
        return 2
    return run(cfg, Source(path, _flags(ns), dict(os.environ)), period, started, termination_log=ns.termination_log)


if __name__ == "__main__":
    sys.exit(main())
