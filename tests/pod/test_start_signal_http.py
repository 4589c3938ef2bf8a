"""The pod's start signal (issue 19): a ``103`` with ``X-Sluiceway-Started`` when a request the gateway
vouched for (its edge token) and that asked for it (``X-Sluiceway-Start-Signal: 1``) starts
executing; none for a direct client, none for a request refused or answered before it starts.

Real ``sluiceway-pod`` processes over loopback; the answers are read off a raw socket (httpx, like
any HTTP/1.1 client, hides informational answers).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httptools
import pytest
from podtools import PodProcess

pytestmark = pytest.mark.slow

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                               "data": [1.0, 2.0, 3.0, 4.0]}]}).encode()
KEY = "k-direct"


class Message:
    def __init__(self, at: float, status: int, headers: dict[str, str]) -> None:
        self.at = at
        self.status = status
        self.headers = headers

    def __repr__(self) -> str:
        return f"Message({self.status}, {self.headers})"


def exchange(port: int, headers: dict[str, str], path: str = "/v2/models/demo/infer",
             timeout: float = 20.0, out: list[Message] | None = None) -> list[Message]:
    """One POST on a fresh connection; every message the pod wrote until the final answer, in order
    (appended to ``out`` as each one's headers arrive, when given)."""
    out = [] if out is None else out
    done = threading.Event()

    class Collector:
        names: list[tuple[str, str]]

        def on_message_begin(self) -> None:
            self.names = []

        def on_header(self, name: bytes, value: bytes) -> None:
            self.names.append((name.decode("latin-1").lower(), value.decode("latin-1")))

        def on_headers_complete(self) -> None:
            out.append(Message(time.monotonic(), parser.get_status_code(), dict(self.names)))

        def on_message_complete(self) -> None:
            if out and out[-1].status >= 200:
                done.set()

    parser = httptools.HttpResponseParser(Collector())
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    raw = (f"POST {path} HTTP/1.1\r\nhost: pod\r\ncontent-type: application/json\r\n{head}"
           f"content-length: {len(BODY)}\r\n\r\n").encode() + BODY
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(raw)
        while not done.is_set():
            data = s.recv(65536)
            if not data:
                break
            parser.feed_data(data)
    assert done.is_set(), f"no final answer, got {out}"
    return out


def edge_setup(tmp: Path) -> tuple[str, str, str]:
    """(token, token file, keys file): the edge token, and one API key (``k-direct``, tenant ``free``)."""
    token = secrets.token_hex(32)
    token_file = tmp / "edge-token"
    token_file.write_text(token + "\n")
    keys = tmp / "pod-keys"
    keys.write_text(f"{hashlib.sha256(KEY.encode()).hexdigest()} free\n")
    return token, str(token_file), str(keys)


def signal_pod(pod_factory: Any, tmp: Path, model: str = "synthetic:0", **extra: Any) -> tuple[PodProcess, str]:
    token, token_file, keys = edge_setup(tmp)
    config: dict[str, Any] = {
        "model": {"spec": model},
        "tenants": {"keysFile": keys, "allowAnonymous": False, "tenants": [{"name": "free"}]},
        "edge": {"tokenFile": token_file},
        **extra,
    }
    return pod_factory(config=config), token


def edge_headers(token: str, signal: bool = True) -> dict[str, str]:
    h = {"x-sluiceway-edge-token": token, "x-sluiceway-tenant": "free"}
    if signal:
        h["x-sluiceway-start-signal"] = "1"
    return h


def test_the_start_signal_comes_only_with_the_edge_token_and_only_when_work_starts(
    pod_factory: Any, tmp_path: Path
) -> None:
    pod, token = signal_pod(pod_factory, tmp_path)
    # the gateway's request, asking for the signal: 103 + X-Sluiceway-Started, then the answer
    got = exchange(pod.port, edge_headers(token))
    print("edge token + ask:", [(m.status, m.headers.get("x-sluiceway-started")) for m in got])
    assert [m.status for m in got] == [103, 200]
    assert got[0].headers.get("x-sluiceway-started") == "1"
    # a direct client sending the ask (its API key, no edge token): the header is ignored, no 1xx
    direct = exchange(pod.port, {"authorization": f"Bearer {KEY}", "x-sluiceway-start-signal": "1"})
    print("direct client + ask:", [m.status for m in direct])
    assert [m.status for m in direct] == [200]
    # a direct client that also names a tenant: still its own key, still no 1xx
    direct2 = exchange(pod.port, {"authorization": f"Bearer {KEY}", "x-sluiceway-tenant": "free",
                                  "x-sluiceway-start-signal": "1"})
    assert [m.status for m in direct2] == [200]
    # a wrong edge token with the ask: 401 on the headers, no 1xx
    wrong = exchange(pod.port, {**edge_headers(token), "x-sluiceway-edge-token": "x" * 64})
    assert [m.status for m in wrong] == [401]
    # the edge token without the ask: no 1xx
    assert [m.status for m in exchange(pod.port, edge_headers(token, signal=False))] == [200]
    # refused before any work (unknown model): no 1xx
    refused = exchange(pod.port, edge_headers(token), path="/v2/models/other/infer")
    assert [m.status for m in refused] == [404]


def test_a_queued_request_signals_when_it_starts_not_when_it_is_admitted(
    pod_factory: Any, tmp_path: Path
) -> None:
    """One permit, 800 ms a request: the second request, admitted into the queue while the first
    runs, has no 103 then, and gets it once it runs; a third whose deadline passes in the queue is
    answered without a 103."""
    pod, token = signal_pod(pod_factory, tmp_path, "synthetic:800",
                            concurrency={"permits": 1, "adaptive": False})
    results: dict[str, list[Message]] = {"first": [], "second": [], "expired": []}

    def run(name: str, headers: dict[str, str]) -> None:
        exchange(pod.port, headers, out=results[name])

    first = threading.Thread(target=run, args=("first", edge_headers(token)))
    first.start()
    end = time.monotonic() + 10
    while pod.metric("sluiceway_concurrency_in_use") < 1 and time.monotonic() < end:
        time.sleep(0.01)
    second = threading.Thread(target=run, args=("second", edge_headers(token)))
    second.start()
    while pod.metric("sluiceway_queue_depth") < 1 and time.monotonic() < end:
        time.sleep(0.01)
    queued_then = [m.status for m in results["second"]]  # admitted, waiting: no 103 yet
    first_then = [m.status for m in results["first"]]
    expired = threading.Thread(target=run, args=("expired", {**edge_headers(token),
                                                             "x-sluiceway-deadline-ms": "200"}))
    expired.start()
    for t in (first, second, expired):
        t.join(20)
    print({k: [m.status for m in v] for k, v in results.items()}, "while queued:", queued_then,
          "the first then:", first_then)
    assert first_then == [103]  # the first was running (and had not answered) when the second was seen queued
    assert queued_then == []
    assert [m.status for m in results["first"]] == [103, 200]
    assert [m.status for m in results["second"]] == [103, 200]
    assert results["second"][0].at >= results["first"][0].at
    statuses = [m.status for m in results["expired"]]
    assert len(statuses) == 1 and statuses[0] >= 400, statuses  # answered before it started: no 1xx


def test_every_request_of_a_batch_gets_its_start_signal(pod_factory: Any, tmp_path: Path) -> None:
    pod, token = signal_pod(pod_factory, tmp_path, "synthetic:50",
                            concurrency={"permits": 1, "adaptive": False},
                            batching={"maxBatchSize": 4, "maxBatchWaitMs": 400})
    results: list[list[Message]] = []
    lock = threading.Lock()

    def run() -> None:
        got = exchange(pod.port, edge_headers(token))
        with lock:
            results.append(got)

    before = pod.metric("sluiceway_batch_size_count")
    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    batches = pod.metric("sluiceway_batch_size_count") - before
    print("answers:", [[m.status for m in r] for r in results], "batches:", batches)
    assert sorted([m.status for m in r] for r in results) == [[103, 200]] * 3
    assert all(r[0].headers.get("x-sluiceway-started") == "1" for r in results)
    assert batches < 3  # at least two of them ran in one batch
