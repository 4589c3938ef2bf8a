"""Issue 22 §3, fast unit tests of the tenant reload: the registry swap, the admission core following a
reloaded tenant, and the reloader's reads through a kubelet-style ``..data`` symlink (real files)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubelet_volume import kubelet_write
from sluiceway_core.config import TenantsConfig
from sluiceway_core.keys import KeyFile, hash_key, keys_text
from sluiceway_pod.admission import AdmissionCore, AdmissionSettings
from sluiceway_pod.clock import ManualClock
from sluiceway_pod.reload import Source, TenantReloader, read_tenant_files
from sluiceway_pod.tenancy import TenantRegistry

CLASSES = ["critical", "standard", "batch"]
SALT = bytes(range(32))


def tenants(*listed: dict[str, Any], keys_file: str | None = None) -> TenantsConfig:
    return TenantsConfig.model_validate({"keysFile": keys_file, "tenants": list(listed)})


def keyfile(keys: dict[str, str]) -> KeyFile:
    return KeyFile(SALT, tuple((bytes.fromhex(hash_key(k, SALT)), t) for t, k in keys.items()))


def registry(cfg: TenantsConfig, clock: ManualClock) -> TenantRegistry:
    return TenantRegistry(cfg, CLASSES, clock, default_priority="standard")


def test_a_reload_changes_rates_without_refilling_a_bucket() -> None:
    clock = ManualClock()
    reg = registry(tenants({"name": "a", "rate": 1, "burst": 3}), clock)
    a = reg.tenant("a")
    assert [reg.take_token(a) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert reg.take_token(a) > 0  # empty
    reg.replace(tenants({"name": "a", "rate": 2, "burst": 10}), KeyFile(None, ()))
    a2 = reg.tenant("a")
    assert a2.rate == 2 and a2.burst == 10 and a2 is not a
    assert reg.take_token(a2) > 0  # a reload gives no free tokens
    clock.advance(0.5)  # the new rate: one token per half second
    assert reg.take_token(a2) == 0.0
    reg.replace(tenants({"name": "a"}), KeyFile(None, ()))  # no rate any more: unlimited
    a3 = reg.tenant("a")
    assert all(reg.take_token(a3) == 0.0 for _ in range(100))


def test_a_reload_swaps_keys_and_refuses_a_class_this_pod_lacks() -> None:
    clock = ManualClock()
    reg = registry(tenants({"name": "a"}), clock)
    reg.replace(tenants({"name": "a"}, {"name": "b"}), keyfile({"a": "ka", "b": "kb"}))
    assert reg.authenticate("Bearer kb").name == "b"
    assert "b" in reg.known_labels
    before = reg.state()
    with pytest.raises(ValueError, match="not a priority class here"):
        reg.replace(tenants({"name": "a", "maxPriority": "gold"}), keyfile({"a": "ka"}))
    assert reg.state() == before and reg.authenticate("Bearer kb").name == "b"  # nothing changed
    reg.replace(tenants({"name": "a"}), keyfile({"a": "ka"}))
    with pytest.raises(Exception, match="unknown API key"):
        reg.authenticate("Bearer kb")
    assert "b" in reg.known_labels  # its exported series keep their label


def test_the_admission_core_follows_a_reloaded_concurrency_cap() -> None:
    clock = ManualClock()
    reg = registry(tenants({"name": "a", "maxConcurrent": 1}), clock)
    core: AdmissionCore[int] = AdmissionCore(
        AdmissionSettings(
            permits=2,
            max_depth=100,
            queue_timeout=1e9,
            num_classes=3,
            aging_seconds=1.0,
            max_batch_size=1,
            max_batch_wait=0.0,
            initial_service_time=0.01,
        ),
        clock,
        take_token=reg.take_token,
        concurrency_cap=reg.concurrency_cap,
    )

    def noop(_r: Any, _e: Any) -> None:
        pass

    a = reg.tenant("a")
    core.admit(a, 1, 0, noop)
    core.admit(a, 1, 1, noop)
    assert core.next_batch() is not None
    assert core.next_batch() is None  # the cap of 1 holds the second back
    reg.replace(tenants({"name": "a", "maxConcurrent": 2}), KeyFile(None, ()))
    core.admit(reg.tenant("a"), 1, 2, noop)  # a request after the reload carries the new limits
    assert core.next_batch() is not None  # the second now runs beside the first


def _write(tmp: Path, listed: list[dict[str, Any]], keys: dict[str, str]) -> Source:
    kubelet_write(tmp / "keys", {"keys.txt": keys_text(SALT, {t: hash_key(k, SALT) for t, k in keys.items()}).encode()})
    cfg = {"tenants": {"keysFile": str(tmp / "keys" / "keys.txt"), "tenants": listed}}
    kubelet_write(tmp / "cfg", {"pod.yaml": yaml.safe_dump(cfg).encode()})
    return Source(str(tmp / "cfg" / "pod.yaml"), {}, {})


def test_reads_go_through_the_data_symlink_and_compare_content(tmp_path: Path) -> None:
    src = _write(tmp_path, [{"name": "a"}], {"a": "key-one"})
    first = read_tenant_files(src)
    _write(tmp_path, [{"name": "a"}], {"a": "key-two"})  # same size, same mtime, new ..data target
    second = read_tenant_files(src)
    assert first.digest != second.digest and first.keys != second.keys
    assert second.keys.lookup("key-two") == "a" and second.keys.lookup("key-one") is None


def test_the_reloader_applies_rejects_once_and_keeps_state(tmp_path: Path, caplog: Any) -> None:
    src = _write(tmp_path, [{"name": "a"}], {"a": "key-one"})
    files = read_tenant_files(src)
    state: list[tuple[TenantsConfig, KeyFile]] = [(files.tenants, files.keys)]
    results: list[str] = []
    failing: list[bool] = []
    rl = TenantReloader(
        src,
        files.config,
        lambda: state[-1],
        lambda t, k: state.append((t, k)),
        clock=ManualClock(),
        result=results.append,
        failing=failing.append,
        limit=4096,
    )

    async def polls() -> list[str]:
        out = [await rl.poll()]
        _write(tmp_path, [{"name": "a"}], {"a": "key-two"})
        out.append(await rl.poll())
        kubelet_write(tmp_path / "keys", {"keys.txt": b"x" * 5000})  # over the limit
        out += [await rl.poll(), await rl.poll()]
        kubelet_write(tmp_path / "keys", {"keys.txt": b"zz not-a-hash\n"})
        out.append(await rl.poll())
        _write(tmp_path, [{"name": "a", "rate": 5}], {"a": "key-two"})
        out.append(await rl.poll())
        return out

    with caplog.at_level(logging.ERROR, logger="sluiceway.reload"):
        outcomes = asyncio.run(polls())
    assert outcomes == ["unchanged", "applied", "rejected", "rejected", "rejected", "applied"]
    assert results == ["applied", "rejected", "rejected", "applied"]  # the same bad file counts once
    assert len(state) == 3 and state[-1][0].tenants[0].rate == 5
    assert failing[-1] is False and True in failing
    errors = [r.getMessage() for r in caplog.records]
    assert len(errors) == 2 and "larger than 4096 bytes" in errors[0] and "line 1" in errors[1]
    assert not any("zz" in e or "not-a-hash" in e for e in errors)  # never the content
