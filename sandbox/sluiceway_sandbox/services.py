"""Service names for pods: one hosts file per namespace, bind-mounted by the agent as each pod's
``/etc/hosts`` (``<svc>``, ``<svc>.<ns>``, ``<svc>.<ns>.svc``, ``<svc>.<ns>.svc.<domain>`` -> the
ClusterIP), rewritten in place (same inode) so running pods see new Services. The sandbox has no DNS
server; this is its stand-in for one. Routing to the ClusterIPs is the real kube-proxy's job
(:mod:`sluiceway_sandbox.kubeproxy`), not this module's.

Concurrency: one process, one thread: poll the Services every second, rewrite files that changed.
It reads Services as ``system:kube-proxy`` (the default RBAC's ``system:node-proxier`` may list them).
``build_hosts`` is pure; ``run`` is the loop.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .kubeclient import Kube, KubeError
from .layout import Layout, layout_for

log = logging.getLogger("sluiceway.sandbox.names")
JSON = dict[str, Any]


def _cluster_ip(svc: JSON) -> str | None:
    ip = (svc.get("spec") or {}).get("clusterIP")
    return ip if ip and ip != "None" else None


def build_hosts(namespace: str, services: Iterable[JSON], domain: str) -> str:
    """An /etc/hosts for pods of ``namespace``: every Service's names mapped to its ClusterIP."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    for svc in sorted(services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])):
        cip = _cluster_ip(svc)
        if cip is None:
            continue
        name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
        names = [f"{name}.{ns}.svc.{domain}", f"{name}.{ns}.svc", f"{name}.{ns}"]
        if ns == namespace:
            names.append(name)
        lines.append(f"{cip}\t{' '.join(names)}")
    return "\n".join(lines) + "\n"


def hosts_file(layout: Layout, namespace: str) -> Path:
    return layout.state_dir / "hosts" / namespace


def write_in_place(path: Path, text: str) -> bool:
    """Rewrite ``path`` keeping its inode (pods bind-mount it); True if it changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    with open(path, "w") as fh:
        fh.write(text)
    return True


def sync_once(layout: Layout, kube: Kube) -> None:
    services = kube.get("/api/v1/services")["items"]
    namespaces = {s["metadata"]["namespace"] for s in services}
    hosts_dir = layout.state_dir / "hosts"
    if hosts_dir.is_dir():
        namespaces |= {p.name for p in hosts_dir.iterdir()}
    for ns in namespaces:
        if write_in_place(hosts_file(layout, ns), build_hosts(ns, services, layout.cluster_domain)):
            log.info("hosts file of namespace %s rewritten", ns)


def run(layout: Layout, interval: float = 1.0) -> None:
    kube = Kube.as_identity(layout, "proxy")
    while True:
        try:
            sync_once(layout, kube)
        except (KubeError, OSError, RuntimeError) as err:
            log.warning("names sync failed: %s", err)
        time.sleep(interval)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="sluiceway-sandbox-names")
    ap.add_argument("--state-dir", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(layout_for(args.state_dir))


if __name__ == "__main__":
    main()
