"""The real kube-proxy (iptables mode), built by ``tools/build-kube-proxy.sh`` from the same
``k8s.io/kubernetes`` module as the control plane, is the sandbox's Service routing: ClusterIP:port ->
ready endpoints from EndpointSlices, one random choice per *connection* (the ``statistic`` match),
exactly as on a real node.

What the sandbox's network needs of it (``build_config``):

* ``masqueradeAll``: every packet to a ClusterIP is masqueraded. Pods sit on one bridge; without it a
  backend pod would answer a client pod straight across the bridge, around the conntrack entry that
  undid the DNAT (and a pod reaching itself through its Service, hairpin, would not work).
* ``hostnameOverride`` = the agent's Node (``sandbox-node``, InternalIP = the bridge address): the Node
  object the agent registers is how kube-proxy learns the node IP.
* Nothing on the host is retuned: no conntrack sysctls (``maxPerCore: 0``, timeouts ``0s``), no
  ``route_localnet`` (``localhostNodePorts: false``), OOM score left alone; health and metrics on
  loopback ports only; NodePorts only on the bridge address.

It runs as ``system:kube-proxy`` (the default RBAC's ``system:node-proxier``) with the stand-in's old
kubeconfig (``pki/proxy.kubeconfig``). It needs no ``conntrack`` command: v1.34 clears stale entries
over netlink.

``down`` removes what it leaves behind (its ``KUBE-*`` chains in every table, IPv4 and IPv6) with
:func:`build_cleanup`, which needs neither the binary nor a record of ``up``.

Pure: :func:`build_config`, :func:`build_argv`, :func:`build_cleanup`. I/O: :func:`binary`,
:func:`write_config`, :func:`remove_rules` (single-threaded: ``up``/``down`` call them once).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from .layout import Layout

__all__ = [
    "CHAIN_PREFIX",
    "HEALTHZ_PORT",
    "METRICS_PORT",
    "binary",
    "build_argv",
    "build_cleanup",
    "build_config",
    "remove_rules",
    "write_config",
]

#: every chain kube-proxy's iptables mode makes starts with this
CHAIN_PREFIX = "KUBE-"
HEALTHZ_PORT = 23256
METRICS_PORT = 23249
_BUILTIN = frozenset({"INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"})


def build_config(layout: Layout, kubeconfig: Path) -> dict[str, Any]:
    """The ``KubeProxyConfiguration`` (kubeproxy.config.k8s.io/v1alpha1) the sandbox runs."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 20, "burst": 40},
        "hostnameOverride": layout.node_name,
        "bindAddress": layout.bridge_ip,
        "healthzBindAddress": f"127.0.0.1:{HEALTHZ_PORT}",
        "metricsBindAddress": f"127.0.0.1:{METRICS_PORT}",
        "mode": "iptables",
        "iptables": {
            "masqueradeAll": True,
            "masqueradeBit": 14,
            "localhostNodePorts": False,
            "syncPeriod": "30s",
            "minSyncPeriod": "1s",
        },
        "clusterCIDR": layout.pod_cidr,
        "detectLocalMode": "ClusterCIDR",
        "nodePortAddresses": [f"{layout.bridge_ip}/32"],
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "oomScoreAdj": 0,
        "configSyncPeriod": "15m0s",
    }


def config_path(layout: Layout) -> Path:
    return layout.state_dir / "kube-proxy.yaml"


def build_argv(bindir: Path, config: Path) -> list[str]:
    return [str(bindir / "kube-proxy"), f"--config={config}", "--v=1"]


def write_config(layout: Layout, kubeconfig: Path) -> tuple[Path, bool]:
    """Write the configuration file; True if its content changed. An unchanged file is not touched:
    kube-proxy exits when its configuration file is written (an idempotent ``up`` keeps it running)."""
    path = config_path(layout)
    text = yaml.safe_dump(build_config(layout, kubeconfig), sort_keys=False)
    try:
        if path.read_text() == text:
            return path, False
    except FileNotFoundError:
        pass
    path.write_text(text)
    return path, True


def binary(root: Path, build: bool, progress: Callable[[str], None] | None = None) -> Path:
    """The directory of the built kube-proxy; builds it (about a minute when the control plane's
    packages are in Go's build cache) when ``build``."""
    script = root / "tools" / "build-kube-proxy.sh"
    out = subprocess.run(["bash", str(script), "--dir"], capture_output=True, text=True, check=False)
    if out.returncode == 0:
        return Path(out.stdout.strip())
    if not build:
        raise FileNotFoundError(f"kube-proxy not built in {out.stdout.strip()}: run tools/build-kube-proxy.sh")
    if progress:
        progress("building kube-proxy (first run only)")
    res = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=True)
    return Path(res.stdout.strip().splitlines()[-1])


def build_cleanup(save: str, prefix: str = CHAIN_PREFIX) -> list[list[str]]:
    """Arguments for ``iptables`` (or ``ip6tables``) that remove every chain named ``prefix*`` in the
    ``iptables-save`` text ``save``: first the rules of the built-in chains that jump to one, then
    each chain flushed, then each deleted (a chain is deleted only once nothing refers to it)."""
    table = ""
    jumps: list[list[str]] = []
    chains: list[tuple[str, str]] = []
    for line in save.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":") and line[1:].startswith(prefix):
            chains.append((table, line[1:].split()[0]))
        elif line.startswith("-A "):
            parts = line.split()
            chain = parts[1]
            if chain in _BUILTIN and any(
                parts[i] in ("-j", "-g") and i + 1 < len(parts) and parts[i + 1].startswith(prefix)
                for i in range(len(parts))
            ):
                jumps.append(["-t", table, "-D", chain, *_unquote(line.split(None, 2)[2])])
    flush = [["-t", t, "-F", c] for t, c in chains]
    delete = [["-t", t, "-X", c] for t, c in chains]
    return jumps + flush + delete


def _unquote(spec: str) -> list[str]:
    """iptables-save quotes comments with double quotes; split the rest on blanks."""
    import shlex

    return shlex.split(spec)


def remove_rules(tools: tuple[str, ...] = ("iptables", "ip6tables")) -> list[str]:
    """Remove every ``KUBE-*`` chain and the jumps to them, IPv4 and IPv6 (idempotent). Returns
    what was removed, for ``down``'s report."""
    removed: list[str] = []
    for tool in tools:
        try:
            save = subprocess.run([f"{tool}-save"], capture_output=True, text=True, check=False, timeout=30)
        except FileNotFoundError:
            continue
        if save.returncode != 0:
            continue
        cmds = build_cleanup(save.stdout)
        for args in cmds:
            subprocess.run([tool, *args], capture_output=True, text=True, check=False, timeout=30)
        n = sum(1 for a in cmds if a[2] == "-X")
        if n:
            removed.append(f"{tool}: {n} kube-proxy chains ({CHAIN_PREFIX}*)")
    return removed
