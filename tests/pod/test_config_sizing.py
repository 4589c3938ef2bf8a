"""Config precedence and start-up sizing (pure: no server)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from sluiceway_core.config import ConfigError, PodConfig, build_config, load_config
from sluiceway_core.queueing import queue_bound
from sluiceway_pod.models import load_runner
from sluiceway_pod.runtime import measure, permits_from_memory


def test_precedence_flags_over_file_over_env(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"queue": {"timeoutSeconds": 3, "maxDepth": 10}, "server": {"port": 9000}}))
    env = {
        "SLUICEWAY_QUEUE_TIMEOUT": "7",
        "SLUICEWAY_PORT": "7000",
        "SLUICEWAY_MODEL": "synthetic:5",
        "SLUICEWAY_QUEUE__EXEC_TIMEOUT_SECONDS": "11",
        "UNRELATED": "x",
    }
    cfg = load_config(f, {"queue": {"maxDepth": 20}}, env)
    assert cfg.queue.max_depth == 20  # flag beats file
    assert cfg.queue.timeout_seconds == 3  # file beats env
    assert cfg.server.port == 9000
    assert cfg.model.spec == "synthetic:5"  # env beats default
    assert cfg.queue.exec_timeout_seconds == 11  # nested env form
    assert load_config(None, None, {"SLUICEWAY_CONFIG": str(f)}).queue.max_depth == 10


def test_snake_and_camel_case_both_work_and_render_camel() -> None:
    a = build_config({"queue": {"max_depth": 5}}, {"queue": {"targetWaitSeconds": 1}})
    assert a.queue.max_depth == 5 and a.queue.target_wait_seconds == 1
    rendered = yaml.safe_load(a.to_yaml())
    assert rendered["queue"]["maxDepth"] == 5
    assert PodConfig.model_validate(rendered) == a  # the rendered form round-trips


@pytest.mark.parametrize(
    ("layer", "needle"),
    [
        ({"queue": {"maxDepth": 0}}, "queue.maxDepth"),
        ({"concurrency": {"permits": 0}}, "concurrency.permits"),
        ({"priorities": {"classes": ["a", "a"], "default": "a"}}, "unique"),
        ({"priorities": {"default": "vip"}}, "default priority 'vip'"),
        ({"priorities": {"classes": ["Gold", "standard"], "default": "standard"}}, "lower-case"),
        ({"tenants": {"tenants": [{"name": "x"}, {"name": "x"}]}}, "tenant names must be unique"),
        ({"tenants": {"allowAnonymous": False}}, "nobody could call"),
        ({"model": {"spec": "synthetic:-4"}}, "model.spec"),
        ({"queue": {"bogus": 1}}, "queue.bogus"),
    ],
)
def test_invalid_config_names_the_field(layer: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        build_config(layer)
    assert needle in str(err.value)


def test_memory_sized_permits_formula() -> None:
    gib = 1024**3
    # (10 GiB free - 1 GiB reserve) / 2 GiB per request * 0.8 = 3.6 -> 3
    assert permits_from_memory(10 * gib, gib, 2 * gib, 0.8, 64) == 3
    assert permits_from_memory(gib, 2 * gib, gib, 0.8, 64) == 1  # never below 1
    assert permits_from_memory(100 * gib, 0, 1, 1.0, 64) == 64  # capped


def test_cpu_auto_permits_and_auto_queue_bound() -> None:
    cfg = build_config(
        {
            "model": {"spec": "synthetic:20", "warmupIterations": 2},
            "concurrency": {"permits": "auto", "cpuDefault": 3},
            "queue": {"maxDepth": "auto", "targetWaitSeconds": 1.0},
        }
    )
    sizing = measure(load_runner(cfg.model), cfg)
    assert sizing.permits == 3  # CPU: the documented default
    assert sizing.service_time >= 0.019
    assert sizing.max_depth == queue_bound(3, 1.0, sizing.service_time)  # N*T/S
    assert sizing.max_depth <= 150
