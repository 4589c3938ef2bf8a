#!/usr/bin/env bash
# One pod alone (no Kubernetes): serve the built-in demo model and show it working end to end on loopback:
# readiness, model metadata (with the concurrency in force), one JSON inference, one tritonclient
# (binary) inference, a 429 under a burst, the metrics, and a clean drain on SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."
SLUICEWAY_SKIP_GO=1 bash scripts/setup.sh
PORT=${PORT:-8080}
METRICS_PORT=${METRICS_PORT:-9091}
log=$(mktemp)
sluiceway-pod serve --model demo --host 127.0.0.1 --port "$PORT" --metrics-port "$METRICS_PORT" --max-queue 4 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 300); do curl -sf "localhost:$PORT/v2/health/ready" >/dev/null && break; sleep 0.2; done
echo "== ready:    $(curl -s localhost:$PORT/v2/health/ready)"
echo "== metadata: $(curl -s localhost:$PORT/v2/models/demo)"
echo "== infer (JSON):"
curl -s -X POST "localhost:$PORT/v2/models/demo/infer" -H 'content-type: application/json' \
  -d '{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}]}'
echo
echo "== infer (tritonclient, binary tensors):"
python3 - "$PORT" <<'PY'
import sys
import numpy as np
import tritonclient.http as tc
c = tc.InferenceServerClient(url=f"127.0.0.1:{sys.argv[1]}")
x = np.arange(32, dtype=np.float32).reshape(2, 16) / 10
i = tc.InferInput("INPUT0", [2, 16], "FP32"); i.set_data_from_numpy(x, binary_data=True)
print(c.infer("demo", [i]).as_numpy("OUTPUT0"))
PY
echo "== a burst of 200 concurrent requests against a queue bound of 4 (answer codes):"
python3 - "$PORT" <<'PY'
import asyncio, collections, sys
import httpx
body = {"inputs": [{"name": "INPUT0", "shape": [64, 16], "datatype": "FP32", "data": [0.5] * 1024}]}
async def main():
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=200)) as c:
        rs = await asyncio.gather(*[c.post(f"http://127.0.0.1:{sys.argv[1]}/v2/models/demo/infer", json=body)
                                    for _ in range(200)])
    print(dict(collections.Counter(r.status_code for r in rs)))
asyncio.run(main())
PY
echo "== metrics (served on the metrics port only, never on the inference port):"
curl -sf "localhost:$METRICS_PORT/metrics" | grep -E '^sluiceway_(requests_total|rejected_total|concurrency_limit|queue_depth)'
echo "   inference port /metrics: HTTP $(curl -s -o /dev/null -w '%{http_code}' "localhost:$PORT/metrics")"
kill -TERM $pid
wait $pid && echo "== drained, exit code 0"
sed -n '1,200p' "$log" | grep -E 'ready on|drain' || true
