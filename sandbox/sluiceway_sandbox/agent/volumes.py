"""Pod volumes materialised under the pod's directory (emptyDir, configMap, secret, downwardAPI,
projected with serviceAccountToken), then bind-mounted at their mountPaths inside the pod's private
mount namespace (see ``runtime``). Unsupported volume types fail the pod with a clear message."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .envvars import EnvError, field_value

JSON = dict[str, Any]
Lookup = Callable[[str, str, str], Mapping[str, str] | None]
#: (namespace, serviceaccount, audience or None, expirationSeconds, pod) -> token
TokenFn = Callable[[str, str, str | None, int, JSON], str]


class VolumeError(Exception):
    """The pod cannot start: a volume type the sandbox lacks, or a missing ConfigMap/Secret."""


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool


def _write(path: Path, content: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(content)
    tmp.chmod(mode)
    tmp.replace(path)


def _project_keys(target: Path, data: Mapping[str, str], items: list[JSON] | None, mode: int, what: str) -> None:
    if items:
        for it in items:
            if it["key"] not in data:
                raise VolumeError(f"{what} has no key {it['key']!r}")
            _write(target / it["path"], data[it["key"]], int(it.get("mode", mode)))
    else:
        for k, v in data.items():
            _write(target / k, v, mode)


def _source(src: JSON, target: Path, pod: JSON, lookup: Lookup, token: TokenFn, default_mode: int) -> None:
    ns = pod["metadata"]["namespace"]
    if "configMap" in src or "secret" in src:
        kind = "configmap" if "configMap" in src else "secret"
        ref = src.get("configMap") or src.get("secret") or {}
        name = ref.get("name") or ref.get("secretName") or ""
        data = lookup(kind, ns, name)
        what = f"{kind} {ns}/{name}"
        if data is None:
            if ref.get("optional"):
                return
            raise VolumeError(f"{what} not found")
        mode = int(ref.get("defaultMode", default_mode))
        _project_keys(target, data, ref.get("items"), mode, what)
    elif "downwardAPI" in src:
        for it in src["downwardAPI"].get("items") or []:
            if "fieldRef" not in it:
                raise VolumeError("downwardAPI volume: only fieldRef items are supported")
            try:
                value = field_value(pod, it["fieldRef"]["fieldPath"])
            except EnvError as err:
                raise VolumeError(str(err)) from err
            _write(target / it["path"], value, int(it.get("mode", default_mode)))
    elif "serviceAccountToken" in src:
        sat = src["serviceAccountToken"]
        sa = pod["spec"].get("serviceAccountName") or "default"
        tok = token(ns, sa, sat.get("audience"), int(sat.get("expirationSeconds", 3607)), pod)
        _write(target / sat["path"], tok, 0o600)
    else:
        raise VolumeError(f"unsupported projected source {sorted(src)}")


def materialise(pod_dir: Path, pod: JSON, lookup: Lookup, token: TokenFn) -> dict[str, Path]:
    """Write every volume of ``pod`` under ``pod_dir/volumes/<name>``; return name -> directory."""
    out: dict[str, Path] = {}
    for vol in pod["spec"].get("volumes") or []:
        name = vol["name"]
        target = pod_dir / "volumes" / name
        target.mkdir(parents=True, exist_ok=True)
        if "emptyDir" in vol:
            os.chmod(target, 0o1777)
        elif "configMap" in vol:
            _source(
                {"configMap": vol["configMap"]},
                target,
                pod,
                lookup,
                token,
                int(vol["configMap"].get("defaultMode", 0o644)),
            )
        elif "secret" in vol:
            _source({"secret": vol["secret"]}, target, pod, lookup, token, int(vol["secret"].get("defaultMode", 0o644)))
        elif "downwardAPI" in vol:
            _source(vol, target, pod, lookup, token, int(vol["downwardAPI"].get("defaultMode", 0o644)))
        elif "projected" in vol:
            mode = int(vol["projected"].get("defaultMode", 0o644))
            for src in vol["projected"].get("sources") or []:
                _source(src, target, pod, lookup, token, mode)
        else:
            kinds = sorted(k for k in vol if k != "name")
            raise VolumeError(f"volume {name!r}: type {', '.join(kinds)} is not supported by the sandbox agent")
        out[name] = target
    return out


def mounts_for(container: JSON, volumes: Mapping[str, Path]) -> list[Mount]:
    out = []
    for vm in container.get("volumeMounts") or []:
        src = volumes.get(vm["name"])
        if src is None:
            raise VolumeError(f"volumeMount {vm['name']!r} names no volume of the pod")
        if vm.get("subPath"):
            src = src / vm["subPath"]
        out.append(Mount(src, vm["mountPath"], bool(vm.get("readOnly", False))))
    return out
