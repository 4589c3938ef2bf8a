"""Pod volumes materialised under the pod's directory (emptyDir, configMap, secret, downwardAPI,
projected with serviceAccountToken), then bind-mounted at their mountPaths inside the pod's private
mount namespace (see ``runtime``). Unsupported volume types fail the pod with a clear message.

Like the kubelet, the agent keeps configMap, secret, downwardAPI and projected volumes up to date
while the pod runs (issue 22): the pod worker calls :func:`materialise` again every sync period, and
each volume is rewritten with the kubelet's atomic layout (:func:`atomic_write`: ``..data`` swapped
by a rename), so a changed Secret reaches a running pod's files without a restart, all at once. The
bind mount is of the volume's directory, so the swap inside it is visible in the pod; a ``subPath``
mount is bound to one file and, as with the kubelet, does not follow updates.

Concurrency: called from the pod's worker thread only; readers (the pod's processes) see the old or
the new ``..data``, never a mix."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import stat
import tempfile
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


#: A volume's files, as written: relative path -> (content, mode).
Payload = dict[str, tuple[str, int]]
DATA_DIR = "..data"
_DATA_TMP = "..data_tmp"


def _put(payload: Payload, rel: str, content: str, mode: int) -> None:
    parts = [p for p in rel.split("/") if p]
    if not parts or any(p in (".", "..") or p.startswith("..") for p in parts):
        raise VolumeError(f"volume path {rel!r} is not a plain relative path")
    payload["/".join(parts)] = (content, mode)


def _project_keys(payload: Payload, data: Mapping[str, str], items: list[JSON] | None, mode: int, what: str) -> None:
    if items:
        for it in items:
            if it["key"] not in data:
                raise VolumeError(f"{what} has no key {it['key']!r}")
            _put(payload, it["path"], data[it["key"]], int(it.get("mode", mode)))
    else:
        for k, v in data.items():
            _put(payload, k, v, mode)


def _source(src: JSON, payload: Payload, pod: JSON, lookup: Lookup, token: TokenFn, default_mode: int) -> None:
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
        _project_keys(payload, data, ref.get("items"), mode, what)
    elif "downwardAPI" in src:
        for it in src["downwardAPI"].get("items") or []:
            if "fieldRef" not in it:
                raise VolumeError("downwardAPI volume: only fieldRef items are supported")
            try:
                value = field_value(pod, it["fieldRef"]["fieldPath"])
            except EnvError as err:
                raise VolumeError(str(err)) from err
            _put(payload, it["path"], value, int(it.get("mode", default_mode)))
    elif "serviceAccountToken" in src:
        sat = src["serviceAccountToken"]
        sa = pod["spec"].get("serviceAccountName") or "default"
        tok = token(ns, sa, sat.get("audience"), int(sat.get("expirationSeconds", 3607)), pod)
        _put(payload, sat["path"], tok, 0o600)
    else:
        raise VolumeError(f"unsupported projected source {sorted(src)}")


def _on_disk(target: Path) -> Payload | None:
    """The payload ``..data`` points at now (None: no ``..data`` yet)."""
    data = target / DATA_DIR
    if not data.is_symlink():
        return None
    root = target / os.readlink(data)
    out: Payload = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            path = Path(dirpath) / f
            rel = path.relative_to(root).as_posix()
            try:
                out[rel] = (path.read_text(), stat.S_IMODE(path.stat().st_mode))
            except (OSError, UnicodeDecodeError):
                return {}  # unreadable: rewrite it
    return out


def atomic_write(target: Path, payload: Payload, now: Callable[[], dt.datetime] | None = None) -> bool:
    """Make ``target`` hold exactly ``payload`` the way the kubelet's atomic writer does, so a reader
    sees either the old set of files or the new one, never a mix. Returns False (nothing written)
    when it already holds it.

    Layout: the files live in ``..<timestamp>/`` (written completely first), ``..data`` is a
    symlink to that directory, swapped by renaming a new symlink over it (atomic), and each
    top-level name is a symlink ``name -> ..data/name``, so a file's path never changes while its
    content does. Names no longer in the payload lose their symlink; the old timestamped directory is
    removed last (a reader holding a file open keeps reading the old content)."""
    if _on_disk(target) == payload:
        return False
    target.mkdir(parents=True, exist_ok=True)
    stamp = (now or (lambda: dt.datetime.now(dt.UTC)))().strftime("..%Y_%m_%d_%H_%M_%S.")
    ts = Path(tempfile.mkdtemp(prefix=stamp, dir=target))
    os.chmod(ts, 0o755)
    for rel, (content, mode) in payload.items():
        path = ts / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(mode)
    data = target / DATA_DIR
    old = os.readlink(data) if data.is_symlink() else None
    tmp = target / _DATA_TMP
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(ts.name, tmp)
    os.replace(tmp, data)  # the switch: rename(2) over the old symlink
    tops = {rel.split("/", 1)[0] for rel in payload}
    for name in tops:
        link = target / name
        if link.is_symlink():
            if os.readlink(link) == f"{DATA_DIR}/{name}":
                continue
            link.unlink()
        elif link.is_dir():
            shutil.rmtree(link)  # a file of the layout before ..data (an older agent)
        elif link.exists():
            link.unlink()
        os.symlink(f"{DATA_DIR}/{name}", link)
    for entry in target.iterdir():
        if entry.name.startswith(".."):
            if entry.name not in (DATA_DIR, ts.name) and (entry.name == old or entry.is_dir()):
                shutil.rmtree(entry, ignore_errors=True)
        elif entry.name not in tops and entry.is_symlink() and os.readlink(entry).startswith(f"{DATA_DIR}/"):
            entry.unlink()  # a key removed from the ConfigMap/Secret
    return True


def payload_of(vol: JSON, pod: JSON, lookup: Lookup, token: TokenFn) -> Payload | None:
    """The files of a configMap, secret, downwardAPI or projected volume (None: another type)."""
    payload: Payload = {}
    if "configMap" in vol:
        _source(
            {"configMap": vol["configMap"]},
            payload,
            pod,
            lookup,
            token,
            int(vol["configMap"].get("defaultMode", 0o644)),
        )
    elif "secret" in vol:
        _source({"secret": vol["secret"]}, payload, pod, lookup, token, int(vol["secret"].get("defaultMode", 0o644)))
    elif "downwardAPI" in vol:
        _source(vol, payload, pod, lookup, token, int(vol["downwardAPI"].get("defaultMode", 0o644)))
    elif "projected" in vol:
        mode = int(vol["projected"].get("defaultMode", 0o644))
        for src in vol["projected"].get("sources") or []:
            _source(src, payload, pod, lookup, token, mode)
    else:
        return None
    return payload


def materialise(pod_dir: Path, pod: JSON, lookup: Lookup, token: TokenFn) -> dict[str, Path]:
    """Write every volume of ``pod`` under ``pod_dir/volumes/<name>``; return name -> directory.

    Called at pod setup and again every sync period (the kubelet's periodic sync): configMap,
    secret, downwardAPI and projected volumes are (re)written with :func:`atomic_write`, only when
    their content changed; emptyDirs are made once and left alone. A volume whose source cannot be
    read raises VolumeError and keeps what it held (the volumes before it are already updated)."""
    out: dict[str, Path] = {}
    for vol in pod["spec"].get("volumes") or []:
        name = vol["name"]
        target = pod_dir / "volumes" / name
        target.mkdir(parents=True, exist_ok=True)
        if "emptyDir" in vol:
            os.chmod(target, 0o1777)
        else:
            payload = payload_of(vol, pod, lookup, token)
            if payload is None:
                kinds = sorted(k for k in vol if k != "name")
                raise VolumeError(f"volume {name!r}: type {', '.join(kinds)} is not supported by the sandbox agent")
            atomic_write(target, payload)
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
