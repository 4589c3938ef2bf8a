"""``down`` after a crashed ``up``: every recorded process stopped by PID (never a recycled one), every
``slw-*`` namespace, veth, the bridge and kube-proxy's iptables chains (``KUBE-*``) removed, ip_forward
restored."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sluiceway_sandbox import netns
from sluiceway_sandbox.layout import layout_for
from sluiceway_sandbox.lifecycle import down
from sluiceway_sandbox.state import recorded, spawn, write_pid

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or bool(netns.missing_tools()),
    reason=f"needs root and {', '.join(netns.missing_tools()) or 'ip/iptables'} (network namespaces)",
)


def test_down_cleans_up_what_a_crashed_up_left(tmp_path: Path) -> None:
    layout = layout_for(tmp_path / "state")
    if layout.bridge in netns.list_links(layout.bridge) or netns.list_netns():
        pytest.skip(f"a sandbox is up on this machine (bridge {layout.bridge}); run sluiceway sandbox down")
    layout.state_dir.mkdir(parents=True)
    forward_before = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
    try:
        netns.bridge_up(layout)
        netns.pod_network_up(layout, "0123456789abcdef-pod", netns.ip_for_index(layout, 0))
        # what a kube-proxy killed mid-run leaves: its chains and the jumps to them
        for args in (["-t", "nat", "-N", "KUBE-SERVICES"], ["-t", "nat", "-I", "PREROUTING", "-j", "KUBE-SERVICES"],
                     ["-t", "filter", "-N", "KUBE-FORWARD"], ["-t", "filter", "-I", "FORWARD", "-m", "comment",
                     "--comment", "kubernetes forwarding rules", "-j", "KUBE-FORWARD"]):
            subprocess.run(["iptables", *args], check=True, capture_output=True)
        # a "control plane" process and a "container" process, as a crashed up leaves them
        host = spawn(
            "etcd",
            [sys.executable, "-c", "import time; time.sleep(300)"],
            layout.log_file("etcd"),
            layout.pid_file("etcd"),
        )
        pod_dir = layout.pod_dir("0123456789abcdef-pod")
        cont = spawn("c", [sys.executable, "-c", "import time; time.sleep(300)"], pod_dir / "c.log", pod_dir / "c.pid")
        # a PID file whose process is gone and whose PID may be reused: must not be signalled
        write_pid(layout.pid_file("stale"), os.getpid())
        (layout.pid_file("stale")).write_text(f"{os.getpid()} 1\n")  # wrong start time
        assert netns.list_netns() and netns.list_links(netns.VETH_PREFIX)
    finally:
        messages: list[str] = []
        down(layout, progress=messages.append)
    assert host.wait(timeout=30) is not None and cont.wait(timeout=30) is not None
    assert not any(r.alive() for r in recorded(layout.pids_dir))
    assert netns.list_netns() == [] and netns.list_links(netns.VETH_PREFIX) == []
    assert layout.bridge not in netns.list_links(layout.bridge)
    nat = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True, check=True).stdout
    assert layout.iptables_chain not in nat
    assert "KUBE-" not in subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == forward_before
    assert any("removed bridge" in m for m in messages), messages
