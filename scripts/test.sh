#!/usr/bin/env bash
# The whole test suite: set-up, lint, strict typing, then pytest (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ruff check .
mypy core/sluiceway_core inference-pod/sluiceway_pod operator/sluiceway_operator operator/sluiceway_scaler \
  sandbox/sluiceway_sandbox sandbox/sluiceway_cli gateway/sluiceway_gateway
lint-imports
python3 -m pytest -q -p no:cacheprovider --durations=30 "$@"
