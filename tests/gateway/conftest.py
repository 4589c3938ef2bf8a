"""Fixtures for the gateway tests: real pods (``pod_factory``) behind a real gateway process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gwtools import GatewayProcess, start_gateway


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[GatewayProcess] = []

    def make(config: dict[str, Any], args: tuple[str, ...] = ()) -> GatewayProcess:
        gw = start_gateway(tmp_path, config, args=args)
        started.append(gw)
        return gw

    yield make
    for gw in started:
        gw.stop()
