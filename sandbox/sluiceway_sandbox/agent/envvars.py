"""Container environment as the kubelet builds it: the ``kubernetes`` Service variables, ``envFrom``,
``env`` with ``$(VAR)`` expansion and ``valueFrom`` (downward API field and resource refs,
ConfigMap and Secret keys); and ``$(VAR)`` expansion of command and args."""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

JSON = dict[str, Any]
#: (kind "configmap"|"secret", namespace, name) -> data (already decoded) or None if absent.
Lookup = Callable[[str, str, str], Mapping[str, str] | None]

_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class EnvError(Exception):
    """``CreateContainerConfigError``: a referenced field, ConfigMap or Secret key is missing."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion: ``$(VAR)`` -> value when defined (else left as written), ``$$`` -> ``$``."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _REF.sub(sub, text)


def field_value(pod: JSON, path: str) -> str:
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": status.get("podIP"),
        "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs") or []) or status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.hostIPs": ",".join(i["ip"] for i in status.get("hostIPs") or []) or status.get("hostIP"),
    }
    if path in simple:
        value = simple[path]
        if value is None:
            raise EnvError(f"field {path} is not set yet")
        return str(value)
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise EnvError(f"unsupported fieldRef {path!r}")


_SUFFIX = {
    "m": Decimal("0.001"),
    "k": Decimal(1000),
    "M": Decimal(1000) ** 2,
    "G": Decimal(1000) ** 3,
    "T": Decimal(1000) ** 4,
    "Ki": Decimal(1024),
    "Mi": Decimal(1024) ** 2,
    "Gi": Decimal(1024) ** 3,
    "Ti": Decimal(1024) ** 4,
}


def quantity(text: str) -> Decimal:
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text).strip())
    if not m or (m.group(2) and m.group(2) not in _SUFFIX):
        raise EnvError(f"bad quantity {text!r}")
    return Decimal(m.group(1)) * _SUFFIX.get(m.group(2), Decimal(1))


def resource_value(container: JSON, ref: JSON, node_allocatable: Mapping[str, str]) -> str:
    """``resourceFieldRef``: ``limits.cpu``/``requests.memory``... divided by ``divisor``, rounded up
    (the kubelet's rule); an unset limit falls back to node allocatable."""
    res = ref["resource"]
    kind, _, name = res.partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    if value is None and kind == "limits":
        value = node_allocatable.get(name)
    if value is None and kind == "requests":
        value = "0"
    if value is None:
        raise EnvError(f"resource {res} unknown")
    divisor = quantity(ref.get("divisor") or "1")
    return str(max(math.ceil(quantity(value) / divisor), 0 if quantity(value) == 0 else 1))


def decode_secret(data: Mapping[str, str]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}


def build_env(
    pod: JSON,
    container: JSON,
    base: Mapping[str, str],
    lookup: Lookup,
    node_allocatable: Mapping[str, str] | None = None,
) -> dict[str, str]:
    ns = pod["metadata"]["namespace"]
    env = dict(base)
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        for kind, key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            ref = src.get(key)
            if ref is None:
                continue
            data = lookup(kind, ns, ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise EnvError(f"{kind} {ns}/{ref['name']} not found")
            for k, v in data.items():
                env[prefix + k] = v
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item or "valueFrom" not in item:
            env[name] = expand(str(item.get("value", "")), env)
            continue
        vf = item["valueFrom"]
        if "fieldRef" in vf:
            env[name] = field_value(pod, vf["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in vf:
            env[name] = resource_value(container, vf["resourceFieldRef"], node_allocatable or {})
        else:
            kind, key = ("configmap", "configMapKeyRef") if "configMapKeyRef" in vf else ("secret", "secretKeyRef")
            ref = vf[key]
            data = lookup(kind, ns, ref["name"])
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    continue
                raise EnvError(f"{kind} {ns}/{ref['name']} has no key {ref['key']!r}")
            env[name] = data[ref["key"]]
    return env


def expand_all(items: Sequence[str], env: Mapping[str, str]) -> list[str]:
    return [expand(str(s), env) for s in items]
