"""StreamIsActive, the push path KEDA opens for ``external-push`` triggers: first answer at once, then
only changes; a Prometheus fault never pushes ``false``; the stream keeps its trigger's state alive."""

from __future__ import annotations

import time

import grpc
import pytest
from fakeprom import FakePrometheus
from scaler_support import FakeClock, ref, start_scaler


def test_stream_pushes_changes_and_holds_through_faults() -> None:
    # one pod up and ready since its start (its ready start phase), idle, none starting
    # (``Queries.starting_pods`` first: the stand-in answers the first key found in a query)
    prom = FakePrometheus({"count((up{": 0, "sluiceway_queue_depth": 0, "up{": 1, "sluiceway_enqueued_total": 0,
                           "sluiceway_start_phase_seconds": 1})
    md = {"inferenceService": "demo", "prometheusAddress": prom.url, "targetQueueDepthPerReplica": "4",
          "activationPollInterval": "100ms", "queryTimeout": "500ms"}
    try:
        with start_scaler(prometheus=(prom.url,)) as s:
            stream = s.stub.StreamIsActive(ref(**md), timeout=8)
            assert next(stream).result is False
            prom.values["sluiceway_queue_depth"] = 3
            assert next(stream).result is True
            assert s.metrics.registry.get_sample_value("sluiceway_scaler_active_streams") == 1.0
            prom.values["sluiceway_queue_depth"] = 0
            prom.mode = "notjson"  # the data says idle, but it cannot be read: nothing is pushed
            with pytest.raises(grpc.RpcError) as e:
                next(stream)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert prom.requests > 10  # it kept polling
    finally:
        prom.close()


def test_open_stream_keeps_its_state_from_being_pruned() -> None:
    prom = FakePrometheus({"sluiceway_queue_depth": 8, "up{": 1})
    clock = FakeClock()
    md = {"inferenceService": "demo", "prometheusAddress": prom.url, "targetQueueDepthPerReplica": "4",
          "activationPollInterval": "50ms"}
    try:
        with start_scaler(prometheus=(prom.url,), clock=clock) as s:
            stream = s.stub.StreamIsActive(ref(**md), timeout=30)
            assert next(stream).result is True
            other = ref(**(md | {"inferenceService": "other"}))
            for hour in range(1, 4):  # three hours pass while the stream is open
                clock.advance(3601)
                before = prom.requests
                deadline = time.monotonic() + 20
                while prom.requests == before and time.monotonic() < deadline:
                    time.sleep(0.05)  # the stream polled at least once in this hour
                assert prom.requests > before
                s.stub.IsActive(other, timeout=10)  # another trigger's call prunes what is unseen
                # The stream's trigger survives; "other" from the hour before does not.
                assert s.service.tracked() == 2, hour
            stream.cancel()
    finally:
        prom.close()
