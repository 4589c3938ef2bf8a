"""A LitServe peer (optional: needs ``pip install litserve``) with the same stand-in and OIP path.

One LitServe worker on CPU computes with :class:`sluiceway_pod.models.SyntheticRunner`, so its
service rate is the pod's. LitServe has no queue bound; its only overload knob is ``timeout``: a
request that waited longer gets 504 (set here to the benchmark's client deadline, its best case).

Concurrency model: LitServe's own, i.e. an HTTP server process and one inference worker process,
connected by queues (all pinned to the same core by the benchmark). The worker counts the requests
it starts computing in ``--counter-file`` (one decimal number, overwritten in place), which the
benchmark reads for its wasted-work column.

    python -m bench.baseline_litserve --port 8091 --service-ms 20 --timeout 0.2
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import litserve as ls
import numpy as np
from sluiceway_pod.models import SyntheticRunner, TensorSpec


class SyntheticAPI(ls.LitAPI):  # type: ignore[misc]
    def __init__(self, service_ms: float, counter_file: str | None, **kw: Any) -> None:
        super().__init__(**kw)
        self.service_ms = service_ms
        self.counter_file = counter_file

    def setup(self, device: str) -> None:
        self.runner = SyntheticRunner(self.service_ms, [TensorSpec("INPUT0", "FP32", (-1, -1))],
                                      [TensorSpec("OUTPUT0", "FP32", (-1, -1))], "cpu")
        self.count = 0
        self.fd = os.open(self.counter_file, os.O_RDWR | os.O_CREAT, 0o644) if self.counter_file else None

    # LitServe builds its endpoint from these two signatures: ``request`` must keep that name and
    # stay unannotated (a raw JSON body), and so must encode_response's return.
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        inp = request["inputs"][0]
        return np.asarray(inp["data"], dtype=np.float32).reshape(inp["shape"])

    def predict(self, x: np.ndarray) -> np.ndarray:
        self.count += 1
        if self.fd is not None:
            os.pwrite(self.fd, f"{self.count:>20d}\n".encode(), 0)
        return self.runner.predict([{"INPUT0": x}])[0]["OUTPUT0"]

    def encode_response(self, output):  # type: ignore[no-untyped-def]
        data = output.ravel().tolist()
        out = {"name": "OUTPUT0", "datatype": "FP32", "shape": list(output.shape), "data": data}
        return {"model_name": "demo", "model_version": "1", "outputs": [out]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.baseline_litserve")
    p.add_argument("--port", type=int, default=8091)
    p.add_argument("--service-ms", type=float, default=20.0)
    p.add_argument("--timeout", type=float, default=0.2, help="LitServe's queue timeout (-> 504)")
    p.add_argument("--counter-file")
    ns = p.parse_args(argv)
    api = SyntheticAPI(ns.service_ms, ns.counter_file, api_path="/v2/models/demo/infer")
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, timeout=ns.timeout)
    server.run(host="127.0.0.1", port=ns.port, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()
