"""Image -> entrypoint: only known images run; anything else fails with a reason naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from sluiceway_sandbox.agent.images import ImageError, Images, repository


def test_repository_strips_tag_and_digest() -> None:
    assert repository("ghcr.io/sluiceway/sluiceway-pod:0.1.0") == "ghcr.io/sluiceway/sluiceway-pod"
    assert repository("ghcr.io/sluiceway/sluiceway@sha256:abc") == "ghcr.io/sluiceway/sluiceway"
    assert repository("localhost:5000/x/y:1") == "localhost:5000/x/y"


def test_unknown_image_fails_with_err_image_never_pull() -> None:
    with pytest.raises(ImageError) as err:
        Images().argv("nginx:1.25", [], [])
    assert err.value.reason == "ErrImageNeverPull"
    assert "nginx:1.25" in err.value.message and "ghcr.io/sluiceway/sluiceway-pod" in err.value.message


def test_known_image_maps_to_this_environments_console_script(tmp_path: Path) -> None:
    (tmp_path / "sluiceway-scaler").write_text("#!/bin/sh\n")
    argv = Images(bin_dir=tmp_path).argv("ghcr.io/sluiceway/sluiceway:0.1.0", ["sluiceway-scaler"], ["serve"])
    assert argv == [str(tmp_path / "sluiceway-scaler"), "serve"]


def test_known_image_refuses_a_command_it_does_not_provide(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="provides sluiceway-pod"):
        Images(bin_dir=tmp_path).argv("ghcr.io/sluiceway/sluiceway-pod", ["/bin/sh", "-c", "x"], [])
    with pytest.raises(ImageError, match="no default entrypoint"):
        Images(bin_dir=tmp_path).argv("ghcr.io/sluiceway/sluiceway-pod", [], ["serve"])


def test_binary_images_ignore_command_and_pass_args(tmp_path: Path) -> None:
    images = Images(bin_dir=tmp_path, binaries={"ghcr.io/kedacore/keda": tmp_path / "keda-operator"})
    argv = images.argv("ghcr.io/kedacore/keda:2.21.0", ["/keda"], ["--leader-elect=false"])
    assert argv == [str(tmp_path / "keda-operator"), "--leader-elect=false"]
