"""A minimal kube-proxy stand-in: Services' ClusterIP:port -> ready endpoints from EndpointSlices as
iptables DNAT rules (nat PREROUTING for pods, OUTPUT for the host), spread at random with the
``statistic`` match, and per-namespace hosts files that pods see as ``/etc/hosts`` (``<svc>``,
``<svc>.<ns>``, ``<svc>.<ns>.svc``, ``<svc>.<ns>.svc.<domain>``). TCP only; no NodePort, no
session affinity, no DNS server. Runs as ``system:kube-proxy`` (the default RBAC's node-proxier).

``build_rules``/``build_hosts`` are pure; ``run`` is the loop (poll every second, apply on change).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .kubeclient import Kube, KubeError
from .layout import Layout, layout_for
from .netns import MASQ_MARK, apply_nat_rules

log = logging.getLogger("sluiceway.sandbox.proxy")
JSON = dict[str, Any]


def _ready_endpoints(slices: Iterable[JSON], port_name: str, target: int | str) -> list[tuple[str, int]]:
    out: set[tuple[str, int]] = set()
    for sl in slices:
        if sl.get("addressType", "IPv4") != "IPv4":
            continue
        port = None
        for p in sl.get("ports") or []:
            if (p.get("name") or "") == port_name and (p.get("protocol") or "TCP") == "TCP":
                port = p.get("port")
        if port is None:
            continue
        for ep in sl.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            if cond.get("ready") is False or cond.get("terminating") is True:
                continue
            for addr in ep.get("addresses") or []:
                out.add((addr, int(port)))
    return sorted(out)


def _slices_by_service(slices: Iterable[JSON]) -> dict[tuple[str, str], list[JSON]]:
    by: dict[tuple[str, str], list[JSON]] = {}
    for sl in slices:
        meta = sl.get("metadata") or {}
        svc = (meta.get("labels") or {}).get("kubernetes.io/service-name")
        if svc:
            by.setdefault((meta.get("namespace", ""), svc), []).append(sl)
    return by


def _cluster_ip(svc: JSON) -> str | None:
    ip = (svc.get("spec") or {}).get("clusterIP")
    return ip if ip and ip != "None" else None


def build_rules(layout: Layout, services: Iterable[JSON], slices: Iterable[JSON]) -> list[str]:
    """The proxy chain's rules (iptables-restore lines) for these Services and EndpointSlices."""
    chain = layout.iptables_chain
    by = _slices_by_service(slices)
    rules: list[str] = []
    for svc in sorted(services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])):
        cip = _cluster_ip(svc)
        if cip is None:
            continue
        key = (svc["metadata"]["namespace"], svc["metadata"]["name"])
        for port in (svc.get("spec") or {}).get("ports") or []:
            if (port.get("protocol") or "TCP") != "TCP":
                continue
            eps = _ready_endpoints(by.get(key, []), port.get("name") or "", port.get("targetPort", port["port"]))
            match = f"-A {chain} -d {cip}/32 -p tcp -m tcp --dport {port['port']}"
            comment = f'-m comment --comment "{key[0]}/{key[1]}:{port.get("name") or port["port"]}"'
            n = len(eps)
            for i, (ip, p) in enumerate(eps):
                stat = f" -m statistic --mode random --probability {1.0 / (n - i):.5f}" if i < n - 1 else ""
                rules.append(f"{match} {comment}{stat} -j DNAT --to-destination {ip}:{p}")
    # Pod -> Service -> pod traffic (hairpin included) is masqueraded to the bridge address, so
    # replies come back through the root namespace where conntrack undoes the DNAT.
    rules.insert(0, f"-A {chain} -s {layout.pod_cidr} -d {layout.service_cidr} -j MARK --set-xmark {MASQ_MARK}")
    return rules


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


def sync_once(layout: Layout, kube: Kube, last: Mapping[str, Any]) -> dict[str, Any]:
    services = kube.get("/api/v1/services")["items"]
    slices = kube.get("/apis/discovery.k8s.io/v1/endpointslices")["items"]
    rules = build_rules(layout, services, slices)
    if rules != last.get("rules"):
        apply_nat_rules(layout, rules)
        log.info("applied %d service rules", len(rules))
    namespaces = {s["metadata"]["namespace"] for s in services}
    hosts_dir = layout.state_dir / "hosts"
    if hosts_dir.is_dir():
        namespaces |= {p.name for p in hosts_dir.iterdir()}
    for ns in namespaces:
        write_in_place(hosts_file(layout, ns), build_hosts(ns, services, layout.cluster_domain))
    return {"rules": rules}


def run(layout: Layout, interval: float = 1.0) -> None:
    kube = Kube.as_identity(layout, "proxy")
    last: dict[str, Any] = {}
    while True:
        try:
            last = sync_once(layout, kube, last)
        except (KubeError, OSError, RuntimeError) as err:
            log.warning("proxy sync failed: %s", err)
        time.sleep(interval)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="sluiceway-sandbox-proxy")
    ap.add_argument("--state-dir", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(layout_for(args.state_dir))


if __name__ == "__main__":
    main()
