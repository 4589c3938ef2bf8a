"""Issue 10, bad input: schemathesis over the pod's own OpenAPI document (served on the metrics port),
against a real pod over HTTP. No 5xx except the documented 503/504; every 4xx carries a message."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from podtools import PodProcess, start_pod
from sluiceway_pod.models import TensorSpec
from sluiceway_pod.openapi import openapi_document

pytestmark = pytest.mark.slow

SPECS = [TensorSpec("INPUT0", "FP32", (-1, -1))]
schema = schemathesis.openapi.from_dict(openapi_document("demo", SPECS))
CASES: list[int] = []


@pytest.fixture(scope="module")
def fuzz_pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodProcess]:
    pod = start_pod(
        tmp_path_factory.mktemp("fuzz"), "--model", "synthetic:1", "--concurrency", "2", "--max-queue", "64"
    )
    try:
        served = httpx.get(f"{pod.admin_url}/openapi.json", timeout=10).json()
        assert served == openapi_document("demo", SPECS)  # the document under test is the one served
        yield pod
    finally:
        assert pod.terminate(30) == 0


@schema.parametrize()
@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_fuzz_the_inference_api(case: Any, fuzz_pod: PodProcess) -> None:
    response = case.call(base_url=fuzz_pod.url, timeout=15)
    CASES.append(response.status_code)
    status = response.status_code
    assert status < 500 or status in (503, 504), (case.method, case.path, status, response.text)
    if 400 <= status < 500:
        doc = response.json()
        message = doc.get("error") or doc.get("detail")
        assert isinstance(message, str) and message.strip(), (status, response.text)


def test_the_fuzzing_ran_at_least_1000_cases_and_the_pod_is_still_well(fuzz_pod: PodProcess) -> None:
    print(f"schemathesis: {len(CASES)} cases, statuses {sorted(set(CASES))}")
    assert len(CASES) >= 1000, len(CASES)
    assert httpx.get(f"{fuzz_pod.url}/v2/health/live", timeout=5).status_code == 200
    assert fuzz_pod.metric("sluiceway_concurrency_in_use") == 0
    assert fuzz_pod.metric("sluiceway_queue_depth") == 0
