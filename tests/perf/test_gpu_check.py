"""bench/gpu_check.py runs its CPU-runnable form end to end: ``--device cpu --quick`` drives real
pods (and the thread-pool peer) over HTTP with the same checks it runs on a GPU, device memory
simulated through the runtime's MemoryProbe interface. The GPU run itself needs a CUDA machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gpu_check_cpu_quick(tmp_path: Path) -> None:
    out = tmp_path / "gc.json"
    res = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--quick", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=540,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert "errors" not in doc
    # the OOM story: the guard-less pool fails requests with OOM, the pod with permits: auto does not
    oom = doc["oom"]
    assert oom["pool16"]["codes"].get("500:oom", 0) > 0
    auto = oom["auto"]["waves"][0]
    assert auto["ok"] == 48 and oom["auto"]["ooms_caught"] == 0
    assert oom["auto"]["info"]["concurrency_memory_bound"] <= 11  # (1 GiB * 0.8) / (1 GiB / 14)
    forced = oom["16"]["waves"]
    assert forced[1]["codes"] == {"200": 48}  # after the first wave's OOMs shrank it
    # variable shapes: without maxShape the probe sees 1x3x1x1 and over-admits; with it, no OOM
    shape = doc["shape"]
    unsized, sized = (shape[k] for k in shape if k not in ("side", "channels"))
    assert unsized["info"]["concurrency_memory_bound"] > sized["info"]["concurrency_memory_bound"]
    assert unsized["limit_end"] < unsized["info"]["concurrency_memory_bound"]  # real peaks pulled it down
    assert sized["ooms_caught"] == 0 and sized["ok"] == 48
    # correctness with batching, codec ratio measured
    assert doc["correct"]["answered"] == 64 and doc["correct"]["max_rel_err"] < 1e-4
    assert doc["codec"]["binary"]["rps"] > 0 and doc["codec"]["json"]["rps"] > 0
    assert set(doc["sweep"]) == {"1", "2", "auto"}
