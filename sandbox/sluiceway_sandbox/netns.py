"""The sandbox network: a bridge in the root namespace, one network namespace + veth pair per pod,
and the FORWARD rule that lets pod traffic cross the bridge. Every name carries a fixed prefix (netns
``slw-``, host-side veth ``slwv``; kube-proxy's chains ``KUBE-*``) so ``down`` finds and removes all
of it, also after a crash, without a record. Commands: ``ip`` (iproute2) and ``iptables`` (Debian package).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from . import kubeproxy
from .layout import Layout

NETNS_PREFIX = "slw-"
VETH_PREFIX = "slwv"
_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


class NetworkError(RuntimeError):
    pass


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=30)
    if check and out.returncode != 0:
        raise NetworkError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def missing_tools() -> list[str]:
    return [t for t in ("ip", "iptables", "iptables-restore", "nsenter") if shutil.which(t) is None]


def netns_name(pod_uid: str) -> str:
    return NETNS_PREFIX + pod_uid[:13]


def veth_names(pod_uid: str) -> tuple[str, str]:
    h = hashlib.sha256(pod_uid.encode()).hexdigest()[:8]
    return VETH_PREFIX + h, "eth0"


# --- bridge + global rules -----------------------------------------------------------------------
def bridge_up(layout: Layout) -> None:
    """Create the bridge (idempotent), route the Service range to it, enable forwarding (pod ->
    Service -> pod traffic is routed through the root namespace). The Service rules are
    kube-proxy's (:mod:`.kubeproxy`)."""
    if _run(["ip", "link", "show", layout.bridge], check=False).returncode != 0:
        _run(["ip", "link", "add", layout.bridge, "type", "bridge"])
    addr = f"{layout.bridge_ip}/{layout.pod_prefix_len}"
    if addr not in _run(["ip", "-o", "addr", "show", "dev", layout.bridge]).stdout:
        _run(["ip", "addr", "add", addr, "dev", layout.bridge])
    _run(["ip", "link", "set", layout.bridge, "up"])
    _run(["ip", "route", "replace", layout.service_cidr, "dev", layout.bridge, "src", layout.bridge_ip])
    saved = layout.state_dir / "ip_forward.saved"
    if not saved.exists():
        saved.write_text(_FORWARD.read_text().strip())
    _FORWARD.write_text("1\n")
    # Forwarded pod traffic must not be dropped by a restrictive FORWARD policy.
    fwd = ["-i", layout.bridge, "-o", layout.bridge, "-j", "ACCEPT"]
    if _run(["iptables", "-C", "FORWARD", *fwd], check=False).returncode != 0:
        _run(["iptables", "-I", "FORWARD", *fwd])


def bridge_down(layout: Layout) -> list[str]:
    """Remove every pod namespace, veth, the bridge, kube-proxy's chains; restore ip_forward.
    Idempotent."""
    removed: list[str] = []
    for ns in list_netns():
        _run(["ip", "netns", "delete", ns], check=False)
        removed.append(f"netns {ns}")
    for link in list_links(VETH_PREFIX):
        _run(["ip", "link", "delete", link], check=False)
        removed.append(f"veth {link}")
    removed += kubeproxy.remove_rules()
    chain = layout.iptables_chain  # the chains of the kube-proxy stand-in, from sandboxes before it
    for hook, target in (("PREROUTING", chain), ("OUTPUT", chain), ("POSTROUTING", chain + "-POST")):
        while _run(["iptables", "-t", "nat", "-D", hook, "-j", target], check=False).returncode == 0:
            removed.append(f"iptables nat {hook} -j {target}")
    for c in (chain, chain + "-POST"):
        if _run(["iptables", "-t", "nat", "-F", c], check=False).returncode == 0:
            _run(["iptables", "-t", "nat", "-X", c], check=False)
            removed.append(f"iptables nat chain {c}")
    fwd = ["-i", layout.bridge, "-o", layout.bridge, "-j", "ACCEPT"]
    while _run(["iptables", "-D", "FORWARD", *fwd], check=False).returncode == 0:
        removed.append("iptables FORWARD bridge rule")
    if _run(["ip", "link", "show", layout.bridge], check=False).returncode == 0:
        _run(["ip", "link", "delete", layout.bridge], check=False)
        removed.append(f"bridge {layout.bridge}")
    saved = layout.state_dir / "ip_forward.saved"
    if saved.exists():
        _FORWARD.write_text(saved.read_text().strip() + "\n")
        saved.unlink()
    return removed


def list_netns() -> list[str]:
    out = _run(["ip", "-j", "netns", "list"], check=False)
    try:
        items = json.loads(out.stdout or "[]")
    except ValueError:
        items = []
    return sorted(i["name"] for i in items if i.get("name", "").startswith(NETNS_PREFIX))


def list_links(prefix: str) -> list[str]:
    out = _run(["ip", "-j", "link", "show"], check=False)
    try:
        items = json.loads(out.stdout or "[]")
    except ValueError:
        items = []
    return sorted(i["ifname"] for i in items if i.get("ifname", "").startswith(prefix))


# --- per pod -------------------------------------------------------------------------------------
def ip_for_index(layout: Layout, index: int) -> str:
    """Pod addresses start at .1.1 of the pod range (the bridge holds .0.1)."""
    net = ipaddress.ip_network(layout.pod_cidr)
    addr = net.network_address + 257 + index
    if addr not in net or addr == net.broadcast_address:
        raise NetworkError(f"pod range {layout.pod_cidr} exhausted")
    return str(addr)


def pod_address_count(layout: Layout) -> int:
    """How many pod addresses the range holds (from .1.1, less the broadcast address)."""
    return max(0, ipaddress.ip_network(layout.pod_cidr).num_addresses - 257 - 1)


def next_free_index(used: set[int], last: int, size: int) -> int:
    """The first index of ``range(size)`` not in ``used`` after ``last`` (the last one given),
    wrapping round: addresses go round the range as the CNI's host-local IPAM gives them, so a pod
    does not get the address of a pod just gone. Others kept that address's old MAC in their
    neighbour cache, and their connections to the new pod went nowhere until the entry expired
    (15 to 45 s: the gateway's hand-off lag after a scale to zero and back, issue 20). Raises
    ``ValueError`` when every index is used."""
    for step in range(1, size + 1):
        i = (last + step) % size
        if i not in used:
            return i
    raise ValueError(f"pod address range exhausted ({size} addresses)")


def index_of_ip(layout: Layout, ip: str) -> int | None:
    """Inverse of :func:`ip_for_index`; None for an address outside the pod range."""
    net = ipaddress.ip_network(layout.pod_cidr)
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return None
    index = int(addr) - int(net.network_address) - 257
    return index if addr in net and index >= 0 else None


def pod_network_up(layout: Layout, pod_uid: str, ip: str) -> str:
    """Create the pod's namespace, veth to the bridge, address and default route. Returns the netns."""
    ns = netns_name(pod_uid)
    host, inner = veth_names(pod_uid)
    if ns not in list_netns():
        _run(["ip", "netns", "add", ns])
    if _run(["ip", "link", "show", host], check=False).returncode != 0:
        tmp = "slwt" + host[len(VETH_PREFIX) :]
        _run(["ip", "link", "add", host, "type", "veth", "peer", "name", tmp])
        _run(["ip", "link", "set", tmp, "netns", ns])
        _run(["ip", "-n", ns, "link", "set", tmp, "name", inner])
    _run(["ip", "link", "set", host, "master", layout.bridge])
    _run(["ip", "link", "set", host, "type", "bridge_slave", "hairpin", "on"], check=False)
    _run(["ip", "link", "set", host, "up"])
    _run(["ip", "-n", ns, "addr", "replace", f"{ip}/{layout.pod_prefix_len}", "dev", inner])
    _run(["ip", "-n", ns, "link", "set", inner, "up"])
    _run(["ip", "-n", ns, "link", "set", "lo", "up"])
    _run(["ip", "-n", ns, "route", "replace", "default", "via", layout.bridge_ip])
    return ns


def pod_network_down(pod_uid: str) -> None:
    ns = netns_name(pod_uid)
    host, _ = veth_names(pod_uid)
    _run(["ip", "netns", "delete", ns], check=False)
    _run(["ip", "link", "delete", host], check=False)
