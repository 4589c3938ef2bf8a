"""Reading mounted configuration files for a hot reload, shared by the pod (``sluiceway_pod.reload``)
and the gateway (``sluiceway_gateway.reload``): bounded reads through the kubelet's ``..data``
symlink and a YAML/JSON mapping parse whose errors never quote the file's content.

Pure functions plus a bounded file read; no state. Safe to call from any thread.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

#: Kubernetes refuses a ConfigMap or Secret over 1 MiB, so no mounted file is larger.
MAX_FILE_BYTES = 1024 * 1024


class ReloadError(Exception):
    """A file the reload cannot use. The message names the file and the reason, never its content."""


def read_capped(path: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The file's bytes, read through any symlinks (``..data``); ReloadError when it is larger than
    ``limit`` (at most ``limit + 1`` bytes are read) or cannot be read."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as e:
        raise ReloadError(f"{path}: cannot be read: {e.strerror or type(e).__name__}") from None
    if len(data) > limit:
        raise ReloadError(f"{path}: larger than {limit} bytes")
    return data


def parse_mapping(path: str, data: bytes) -> dict[str, Any]:
    """The file's top-level mapping (JSON for ``*.json``, else YAML; empty: ``{}``); ReloadError naming
    the line of a syntax error, never the content."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ReloadError(f"{path}: not UTF-8") from None
    try:
        doc = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise ReloadError(f"{path}: not valid YAML/JSON{at}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ReloadError(f"{path}: the top level must be a mapping")
    return doc
