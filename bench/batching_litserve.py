"""LitServe peer of ``bench.batching``: the same seeded MLP, LitServe's own dynamic batching.

Needs ``pip install litserve``. One worker on CPU; ``max_batch_size`` and ``batch_timeout`` as given.
The API class lives at module level: LitServe pickles it into its worker process.

    python -m bench.batching_litserve --port 8093 --max-batch 8 --wait 0.005
"""

from __future__ import annotations

import argparse

import litserve as ls
import numpy as np
import torch

from .batching import mlp


class MLPAPI(ls.LitAPI):  # type: ignore[misc]
    def setup(self, device: str) -> None:
        self.net = mlp()

    # LitServe builds its endpoint from these signatures: ``request`` keeps that name, unannotated.
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        return np.asarray(request["inputs"][0]["data"], dtype=np.float32)

    def batch(self, inputs):  # type: ignore[no-untyped-def]
        return np.stack(inputs)

    def predict(self, x):  # type: ignore[no-untyped-def]
        with torch.inference_mode():
            return self.net(torch.from_numpy(np.atleast_2d(x))).numpy()

    def unbatch(self, output):  # type: ignore[no-untyped-def]
        return list(output)

    def encode_response(self, output):  # type: ignore[no-untyped-def]
        y = np.asarray(output).reshape(1, -1)
        return {"model_name": "demo", "model_version": "1", "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": list(y.shape), "data": y.ravel().tolist()}]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.batching_litserve")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--wait", type=float, default=0.005)
    ns = p.parse_args(argv)
    api = MLPAPI(max_batch_size=ns.max_batch, batch_timeout=ns.wait, api_path="/v2/models/demo/infer")
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, timeout=60)
    server.run(host="127.0.0.1", port=ns.port, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()
