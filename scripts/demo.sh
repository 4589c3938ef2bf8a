#!/usr/bin/env bash
# The main job: the whole system on this machine, as a platform team would run it — a real control
# plane, Helm installing charts/sluiceway (operator and scaler as Pods under the chart's RBAC), KEDA
# and Prometheus built from their Go modules, a node agent running Pods as local processes in
# network namespaces — then a sample InferenceService with its gateway on, under a load ramp from
# keep-alive clients through the gateway's Service, with a live display, a report, a PNG, and a
# teardown. Extra arguments go to `sluiceway demo` (--keep, --short,
# --clients keepalive|per-request, ...).
# The first run on a new machine builds the Go binaries into ~/.cache/sluiceway (tens of minutes on
# 2 cores, with progress); later runs start in about half a minute. Needs root (network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
SLUICEWAY_SKIP_GO=1 bash scripts/setup.sh
exec sluiceway demo "$@"
