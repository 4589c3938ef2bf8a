"""The infer fast path (raw ASGI, no FastAPI per request): which paths it takes, and that it answers
like the FastAPI route over real HTTP (the rest of tests/pod exercises it on every infer call)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sluiceway_pod.fastpath import infer_model_name


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/v2/models/demo/infer", "demo"),
        ("/v2/models/demo/versions/1/infer", "demo"),
        ("/v2/models//infer", None),
        ("/v2/models/demo/versions//infer", None),
        ("/v2/models/demo/ready", None),
        ("/v2/models/a/b/infer", None),
        ("/v2/models/demo/infer/", None),
        ("/v1/models/demo/infer", None),
    ],
)
def test_infer_paths(path: str, name: str | None) -> None:
    assert infer_model_name(path) == name


def test_fast_path_answers_like_the_route(pod_factory: Any) -> None:
    pod = pod_factory("--model", "synthetic:1", "--concurrency", "1")
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1.5, 2.5]}]}
    with httpx.Client(timeout=10) as c:
        r = c.post(f"{pod.url}/v2/models/demo/versions/1/infer", json=body)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.5, 2.5]
        assert r.headers["content-type"] == "application/json"
        assert int(r.headers["content-length"]) == len(r.content)
        r = c.post(f"{pod.url}/v2/models/other/infer", json=body)
        assert r.status_code == 404 and r.json()["reason"]
        r = c.post(f"{pod.url}/v2/models/demo/infer", content=b"{not json")
        assert r.status_code == 400
        # every other path still goes to the FastAPI app
        assert c.get(f"{pod.url}/v2/models/demo").json()["name"] == "demo"
        r = c.get(f"{pod.url}/v2/models/demo/infer")  # the infer paths take POST only
        assert r.status_code == 405 and r.headers["allow"] == "POST"
