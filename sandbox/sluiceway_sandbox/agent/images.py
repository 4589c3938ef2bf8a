"""Image -> local entrypoint map. Only known image repositories (tag and digest ignored) run; any
other image fails the container with ``ErrImageNeverPull`` and a message naming the image."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..layout import CONTROLLER_IMAGE, POD_IMAGE

#: console scripts each Sluiceway image provides (installed by ``pip install -e .``). The controller
#: image is also the gateway's (the operator's ``gateway_image``, chart ``operator.gatewayImage``,
#: defaults to it): the ``sluiceway`` package with the ``gateway`` extra.
PYTHON_IMAGES: dict[str, tuple[str, ...]] = {
    CONTROLLER_IMAGE: ("sluiceway-operator", "sluiceway-scaler", "sluiceway-gateway", "sluiceway"),
    POD_IMAGE: ("sluiceway-pod",),
}


class ImageError(Exception):
    """The container cannot start: ``reason`` goes to its waiting state."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def repository(image: str) -> str:
    """``ghcr.io/x/y:tag@sha256:..`` -> ``ghcr.io/x/y``."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)
    if ":" in last[-1]:
        last[-1] = last[-1].split(":", 1)[0]
    return "/".join(last)


@dataclass(frozen=True)
class Images:
    """Known images. ``binaries`` maps an image repository to one executable (KEDA's Go programs);
    its container ``command`` is ignored and ``args`` passed to it."""

    bin_dir: Path = Path(sys.executable).parent
    binaries: Mapping[str, Path] | None = None

    def known(self) -> list[str]:
        return sorted([*PYTHON_IMAGES, *(self.binaries or {})])

    def argv(self, image: str, command: Sequence[str], args: Sequence[str]) -> list[str]:
        repo = repository(image)
        if self.binaries and repo in self.binaries:
            return [str(self.binaries[repo]), *args]
        scripts = PYTHON_IMAGES.get(repo)
        if scripts is None:
            raise ImageError(
                "ErrImageNeverPull",
                f"sandbox has no entrypoint for image {image!r} (known: {', '.join(self.known())})",
            )
        if not command:
            raise ImageError(
                "CreateContainerError",
                f"image {repo} has no default entrypoint in the sandbox: set command to one of {', '.join(scripts)}",
            )
        exe = Path(command[0]).name
        if exe not in scripts:
            raise ImageError(
                "CreateContainerError",
                f"image {repo} provides {', '.join(scripts)}, not {command[0]!r}",
            )
        path = self.bin_dir / exe
        if not path.exists():
            raise ImageError("CreateContainerError", f"{path} is not installed (pip install -e .)")
        return [str(path), *command[1:], *args]
