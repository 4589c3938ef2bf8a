"""``sluiceway sandbox up [--keep] | down | status | logs POD``."""

from __future__ import annotations

import argparse
import sys

from .layout import STATE_DIR_ENV, layout_for
from .lifecycle import SandboxError, UpOptions, down, log_files, status, up


def parser(prog: str = "sluiceway sandbox") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog,
        description="The whole Sluiceway system on this machine: control plane, node agent, Helm, KEDA, Prometheus.",
    )
    ap.add_argument(
        "--state-dir", default=None, help=f"state directory (default ${STATE_DIR_ENV} or ~/.cache/sluiceway/sandbox)"
    )
    sub = ap.add_subparsers(dest="action", required=True)
    u = sub.add_parser("up", help="start everything (idempotent); last line: KUBECONFIG=<path>")
    u.add_argument(
        "--keep", action="store_true", help="leave it running even if a step fails (default: a failed up tears down)"
    )
    u.add_argument("--no-build", action="store_true", help="fail instead of building missing Go binaries")
    u.add_argument("--gpus", type=int, default=0, help="nvidia.com/gpu capacity of the sandbox node (default 0)")
    u.add_argument("--cpu", type=int, default=32, help="cpu capacity of the sandbox node (default 32)")
    u.add_argument("--no-keda", action="store_true", help="skip KEDA (autoscaling engine keda unavailable)")
    u.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra chart value")
    u.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each component")
    d = sub.add_parser("down", help="stop every process, remove namespaces, veths, bridge and rules")
    d.add_argument("--keep-data", action="store_true", help="keep etcd data for a later up")
    sub.add_parser("status", help="what runs")
    lg = sub.add_parser("logs", help="container logs of a pod (NAME or NAMESPACE/NAME)")
    lg.add_argument("pod")
    return ap


def main(argv: list[str] | None = None, prog: str = "sluiceway sandbox") -> int:
    args = parser(prog).parse_args(argv)
    layout = layout_for(args.state_dir)
    if args.action == "up":
        values = []
        for item in args.set:
            k, sep, v = item.partition("=")
            if not sep:
                print(f"--set expects KEY=VALUE, got {item!r}", file=sys.stderr)
                return 2
            values.append((k, v))
        opts = UpOptions(
            build=not args.no_build,
            gpus=args.gpus,
            cpu=args.cpu,
            keda=not args.no_keda,
            chart_values=tuple(values),
            timeout=args.timeout,
        )
        try:
            up(layout, opts)
        except (SandboxError, RuntimeError, OSError, TimeoutError) as err:
            print(f"sandbox up failed: {err}", file=sys.stderr)
            if not args.keep:
                print("tearing down (use --keep to leave it for inspection)", file=sys.stderr)
                down(layout, progress=lambda m: print(m, file=sys.stderr), wipe=False)
            return 1
        return 0
    if args.action == "down":
        down(layout, wipe=not args.keep_data)
        return 0
    if args.action == "status":
        for line in status(layout):
            print(line)
        return 0
    files = log_files(layout, args.pod)
    if not files:
        print(f"no logs for pod {args.pod!r} under {layout.logs_dir / 'pods'}", file=sys.stderr)
        return 1
    for f in files:
        print(f"==> {f.stem} ({f}) <==")
        sys.stdout.write(f.read_text(errors="replace"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
