"""Shared fixtures. The helpers live in ``podtools`` (a unique module name: every test folder may have
its own ``conftest``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from podtools import PodProcess, start_pod


@pytest.fixture
def pod_factory(tmp_path: Path) -> Iterator[Any]:
    pods: list[PodProcess] = []

    def make(*args: str, **kw: Any) -> PodProcess:
        pod = start_pod(tmp_path, *args, **kw)
        pods.append(pod)
        return pod

    yield make
    for p in pods:
        p.terminate(30)
