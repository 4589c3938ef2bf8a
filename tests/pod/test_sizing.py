"""Memory sizing for variable shapes, the warm-up throughput probe and the adaptive permit limit
(pure: in-process, a simulated device memory read through the runtime's MemoryProbe interface)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from perf.perfmodels import HungryRunner
from sluiceway_core.config import ConfigError, build_config
from sluiceway_core.queueing import queue_bound
from sluiceway_pod.adaptive import LimitController
from sluiceway_pod.clock import ManualClock
from sluiceway_pod.errors import InvalidInput
from sluiceway_pod.models import TensorSpec, example_request, exceeds_max_shape
from sluiceway_pod.protocol import decode_request
from sluiceway_pod.runtime import measure
from sluiceway_pod.sizing import PeakTracker, SimulatedDeviceMemory, choose_permits, probe_levels

MB = 1_000_000


def _cfg(**concurrency: object) -> object:
    return build_config({
        "model": {"spec": "unused", "warmupIterations": 1},
        "concurrency": {"permits": "auto", "memoryReserveBytes": 0, "safetyFactor": 1.0, "probeSeconds": 0,
                        **concurrency},
        "queue": {"maxDepth": "auto", "targetWaitSeconds": 1.0},
    })


def test_max_shape_is_validated_against_shape() -> None:
    build_config({"model": {"inputs": [{"name": "x", "shape": [-1, 3, -1], "maxShape": [8, 3, 64]}]}})
    for bad in ([8, 4, 64], [8, 3], [0, 3, 64]):
        with pytest.raises(ConfigError, match="maxShape"):
            build_config({"model": {"inputs": [{"name": "x", "shape": [-1, 3, -1], "maxShape": bad}]}})


def test_request_beyond_max_shape_is_refused_with_a_reason() -> None:
    spec = TensorSpec("INPUT0", "FP32", (-1, -1), (4, 100))
    assert exceeds_max_shape(spec, [4, 100]) is None
    msg = exceeds_max_shape(spec, [2, 101])
    assert msg is not None and "maxShape [4, 100]" in msg and "dims [1]" in msg
    body = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[5,1],"data":[1,2,3,4,5]}]}'
    with pytest.raises(InvalidInput, match="exceeds maxShape"):
        decode_request(body, None, [spec])
    ok = decode_request(body.replace(b"[5,1]", b"[1,5]").replace(b"1,2,3,4,5", b"1,2,3,4,5"), None, [spec])
    assert ok.inputs["INPUT0"].shape == (1, 5)


def test_probe_input_uses_max_shape_not_ones() -> None:
    specs = [TensorSpec("img", "FP32", (-1, 3, -1, -1), (2, 3, 64, 48))]
    assert example_request(specs, 2)["img"].shape == (2, 3, 64, 48)
    assert example_request([TensorSpec("img", "FP32", (-1, 3, -1, -1))], 1)["img"].shape == (1, 3, 1, 1)


def test_memory_bound_comes_from_the_largest_declared_request() -> None:
    """The seed's bug: a (-1, -1) input probed at 1x1 looks free, so permits go to maxPermits and real
    requests run out of memory. With maxShape the probe sees the largest request."""
    total = 100 * MB
    unsized = HungryRunner(total, 1000, 1.0)
    sized = HungryRunner(total, 1000, 1.0, inputs=[TensorSpec("INPUT0", "FP32", (-1, -1), (2, 5000))])
    cfg = _cfg(maxPermits=64)
    s_unsized = measure(unsized, cfg)  # type: ignore[arg-type]
    s_sized = measure(sized, cfg)  # type: ignore[arg-type]
    assert s_unsized.peak_bytes_per_request == 1000  # a 1x1 probe
    assert s_unsized.permits == 64
    assert s_sized.peak_bytes_per_request == 2 * 5000 * 1000  # 10 MB: the largest request
    assert s_sized.memory_bound == s_sized.permits == 10  # 100 MB / 10 MB
    assert s_sized.rows_per_request == 2


def test_batch_in_force_sets_peak_and_queue_service_time() -> None:
    """maxDepth: auto divides by the service time of the batch size in force, not of batch 1."""

    class RowTimed(HungryRunner):
        def predict(self, requests):  # type: ignore[no-untyped-def]
            self.hold = 0.010 * len(requests)  # a batch of B takes B times as long
            return super().predict(requests)

    r = RowTimed(1000 * MB, 1000, 2.0, inputs=[TensorSpec("INPUT0", "FP32", (-1, -1), (1, 1000))])
    cfg = build_config({
        "model": {"spec": "unused", "warmupIterations": 2},
        "concurrency": {"permits": 2, "memoryReserveBytes": 0, "safetyFactor": 1.0},
        "batching": {"maxBatchSize": 8},
        "queue": {"maxDepth": "auto", "targetWaitSeconds": 1.0},
    })
    s = measure(r, cfg)  # type: ignore[arg-type]
    assert s.max_batch_size == 8
    assert s.service_time_request is not None and s.service_time > 3 * s.service_time_request
    assert s.max_depth == queue_bound(2 * 8, 1.0, s.service_time)
    assert s.peak_bytes_per_batch == 8 * 1000 * 1000
    assert s.memory_bound == 64  # 1000 MB / 8 MB = 125 permits fit; maxPermits (64) caps it


def test_throughput_probe_picks_fewer_permits_when_more_buy_nothing() -> None:
    spec = [TensorSpec("INPUT0", "FP32", (-1, -1), (1, 1000))]
    # a share of 0.8 instead of 0.95: the box running this test is shared, timing noise is large
    cfg = _cfg(maxPermits=8, probeSeconds=1.2, probeShare=0.8)
    parallel = measure(HungryRunner(8 * MB, 1000, 20.0, inputs=spec), cfg)  # type: ignore[arg-type]
    serial = measure(HungryRunner(8 * MB, 1000, 20.0, serial=True, inputs=spec), cfg)  # type: ignore[arg-type]
    assert parallel.memory_bound == serial.memory_bound == 8
    assert parallel.probe_rates is not None and sorted(parallel.probe_rates) == [1, 2, 4, 8]
    # each level doubles the parallel model's rate; the serial one gets its best rate from 1 permit
    # (bounds, not exact values: the shared box running this test adds scheduling noise)
    assert parallel.permits >= 4
    assert serial.permits <= 2 and serial.permits < parallel.permits


def test_choose_permits_and_levels() -> None:
    assert probe_levels(1) == [1]
    assert probe_levels(9) == [1, 2, 4, 8, 9]
    assert choose_permits({1: 35.0, 2: 36.0, 4: 35.5, 8: 36.1}, 0.95) == 1
    assert choose_permits({1: 10.0, 2: 19.0, 4: 30.0, 8: 31.0}, 0.95) == 4


def test_peak_tracker_divides_by_concurrent_batches() -> None:
    mem = SimulatedDeviceMemory(100 * MB)
    mem.allocate(5 * MB)  # weights
    tracker = PeakTracker(mem, mem.allocated(), window=60.0)
    tracker.begin()
    mem.allocate(10 * MB)
    tracker.begin()
    mem.allocate(10 * MB)
    mem.release(10 * MB)
    est, concurrent = tracker.end()
    assert concurrent == 2 and est == 10 * MB
    mem.release(10 * MB)
    est, _ = tracker.end()
    assert est == 10 * MB
    # idle: the window restarted, so a smaller batch now shows its own peak
    tracker.begin()
    mem.allocate(4 * MB)
    mem.release(4 * MB)
    assert tracker.end()[0] == 4 * MB


def _controller(clock: ManualClock, limit: int = 8) -> LimitController:
    # budget 100, warm-up peak 10 per batch -> memory bound 10
    return LimitController(limit=limit, budget=100.0, warmup_peak=10.0, rtt0=0.010, max_permits=64,
                           clock=clock.now, interval=1.0, cooldown=2.0)


def test_limit_shrinks_at_once_when_peaks_rise_and_grows_back_slowly() -> None:
    clock = ManualClock()
    c = _controller(clock)
    assert (c.memory_bound, c.limit) == (10, 8)
    d = c.observe(0.010, 25.0, in_use=8)  # one batch needed 25: only 4 fit
    assert d is not None and d.reason == "peak-rose" and (c.memory_bound, c.limit) == (4, 4)
    # the next interval still sees large peaks: stays down
    clock.advance(1.0)
    c.observe(0.010, 24.0, in_use=4)
    assert c.limit == 4
    # peaks fall back to the warm-up size: the bound returns, the limit climbs one per interval
    limits = []
    for _ in range(8):
        clock.advance(1.0)
        c.observe(0.010, 9.0, in_use=c.limit)  # saturated, batch time unchanged
        limits.append(c.limit)
    assert c.memory_bound == 10
    assert limits == [5, 6, 7, 8, 9, 10, 10, 10]  # +1 per interval, never above the bound
    assert all(b.new_limit - b.old_limit <= 1 for b in c.decisions)


def test_limit_does_not_grow_when_permits_are_not_used() -> None:
    clock = ManualClock()
    c = _controller(clock, limit=3)
    for _ in range(5):
        clock.advance(1.0)
        c.observe(0.010, 9.0, in_use=1)  # demand needs one permit
    assert c.limit == 3


def test_vegas_shrinks_when_more_permits_only_lengthen_batches() -> None:
    clock = ManualClock()
    c = _controller(clock)
    limits = []
    for _ in range(6):
        clock.advance(1.0)
        # a device with parallelism 2: each batch takes limit/2 times as long
        c.observe(0.010 * c.limit / 2, 9.0, in_use=c.limit)
        limits.append(c.limit)
    assert limits[0] == 7 and limits == sorted(limits, reverse=True)
    assert c.limit in (4, 5)  # parallelism 2 plus at most beta (3) permits waiting inside the device
    assert any(d.reason == "vegas-shrink" for d in c.decisions)


def test_oom_caps_the_bound_then_lifts_it_while_peaks_show_room() -> None:
    clock = ManualClock()
    c = _controller(clock)
    d = c.on_oom(in_use=8, limit_now=7)
    assert d.reason == "oom" and c.limit == 7 and c.memory_bound == 7
    for _ in range(3):
        clock.advance(1.0)
        c.observe(0.010, 9.0, in_use=c.limit)
    assert c.memory_bound <= 8  # lifted by at most one per cooldown (2 s)
    for _ in range(12):
        clock.advance(1.0)
        c.observe(0.010, 9.0, in_use=c.limit)
    assert c.memory_bound == 10 and c.limit == 10


def test_simulated_memory_fails_like_a_device() -> None:
    mem = SimulatedDeviceMemory(10, others=2)
    mem.allocate(8)
    with pytest.raises(MemoryError):
        mem.allocate(1)
    assert mem.free_total() == (0, 10) and mem.failures == 1


def test_hungry_runner_holds_memory_concurrently() -> None:
    r = HungryRunner(25 * MB, 1000, 50.0)
    x = {"INPUT0": np.ones((1, 10_000), dtype=np.float32)}  # 10 MB each
    errors: list[BaseException] = []

    def call() -> None:
        try:
            r.predict([x])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 1 and type(errors[0]).__name__ == "DeviceOOMSignal"
