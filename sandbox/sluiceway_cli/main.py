"""``sluiceway plan ...`` (capacity planner), ``sluiceway sandbox ...``, ``sluiceway demo ...``."""

from __future__ import annotations

import sys

USAGE = """usage: sluiceway {plan,sandbox,demo} ...

  plan      capacity plan from a load profile (sluiceway plan --help)
  sandbox   the whole system on this machine: up [--keep] | down | status | logs POD
  demo      sandbox up, a sample InferenceService, a load ramp, a report and a plot
"""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "plan":
        from sluiceway_scaler.plan_cli import main as plan_main

        return plan_main(args)
    if command == "sandbox":
        from sluiceway_sandbox.cli import main as sandbox_main

        return sandbox_main(rest)
    if command == "demo":
        from sluiceway_sandbox.demo import main as demo_main

        return demo_main(rest)
    print(f"sluiceway: unknown command {command!r}\n{USAGE}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":
    sys.exit(main())
