"""Where the sandbox keeps everything, and which addresses it uses: one frozen value, no I/O.

Addresses: the pod network is 198.18.0.0/16 (bridge ``slwbr0`` at 198.18.0.1 in the root network
namespace; pods get 198.18.1.x upwards), the Service network 198.19.0.0/16 (the ``kubernetes``
Service is 198.19.0.1). Both lie inside 198.18.0.0/15, the range reserved for network
benchmarking (RFC 2544), so the sandbox never collides with a real network. Everything the host
runs (etcd, controllers) listens on loopback; what pods must reach (the API server, Prometheus)
listens on the bridge address, which the host reaches too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_STATE_DIR = Path.home() / ".cache" / "sluiceway" / "sandbox"
STATE_DIR_ENV = "SLUICEWAY_SANDBOX_DIR"

CONTROLLER_IMAGE = "ghcr.io/sluiceway/sluiceway"
POD_IMAGE = "ghcr.io/sluiceway/sluiceway-pod"
KEDA_OPERATOR_IMAGE = "ghcr.io/kedacore/keda"
KEDA_ADAPTER_IMAGE = "ghcr.io/kedacore/keda-metrics-apiserver"


@dataclass(frozen=True)
class Layout:
    """Paths and addresses of one sandbox. Build it with :func:`layout_for`."""

    state_dir: Path
    bridge: str = "slwbr0"
    bridge_ip: str = "198.18.0.1"
    pod_cidr: str = "198.18.0.0/16"
    pod_prefix_len: int = 16
    service_cidr: str = "198.19.0.0/16"
    kubernetes_service_ip: str = "198.19.0.1"
    apiserver_port: int = 6443
    etcd_port: int = 23379
    etcd_peer_port: int = 23380
    controller_manager_port: int = 23257
    scheduler_port: int = 23259
    prometheus_port: int = 9090
    node_name: str = "sandbox-node"
    cluster_domain: str = "cluster.local"
    iptables_chain: str = "SLUICEWAY-SERVICES"

    # --- directories -------------------------------------------------------------------------
    @property
    def pki_dir(self) -> Path:
        return self.state_dir / "pki"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def pids_dir(self) -> Path:
        return self.state_dir / "pids"

    @property
    def pods_dir(self) -> Path:
        """One directory per pod UID: volumes, hosts file, container logs."""
        return self.state_dir / "pods"

    @property
    def etcd_dir(self) -> Path:
        return self.state_dir / "etcd"

    @property
    def prometheus_dir(self) -> Path:
        return self.state_dir / "prometheus"

    @property
    def keda_dir(self) -> Path:
        return self.state_dir / "keda"

    # --- files -------------------------------------------------------------------------------
    @property
    def bin_dir(self) -> Path:
        """Links to the sandbox's client tools (``kubectl``, built with the control plane): put it on
        ``PATH`` (``up`` prints the line)."""
        return self.state_dir / "bin"

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (absolute; ``KUBECONFIG=<this>`` is what ``up`` prints last)."""
        return self.state_dir / "admin.kubeconfig"

    @property
    def ca_cert(self) -> Path:
        return self.pki_dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.pki_dir / "ca.key"

    @property
    def sa_key(self) -> Path:
        return self.pki_dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.pki_dir / "sa.pub"

    @property
    def network_state(self) -> Path:
        """JSON record of every netns, veth, iptables rule the sandbox made (read by ``down``)."""
        return self.state_dir / "network.json"

    # --- addresses ---------------------------------------------------------------------------
    @property
    def apiserver_url(self) -> str:
        """The API server, as the host and as pods reach it (it listens on the bridge address)."""
        return f"https://{self.bridge_ip}:{self.apiserver_port}"

    @property
    def apiserver_url_for_pods(self) -> str:
        return f"https://{self.kubernetes_service_ip}:443"

    @property
    def prometheus_url(self) -> str:
        """Prometheus, reachable from the host and from pods (listens on the bridge address)."""
        return f"http://{self.bridge_ip}:{self.prometheus_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def pod_dir(self, uid: str) -> Path:
        return self.pods_dir / uid

    def log_file(self, name: str) -> Path:
        return self.logs_dir / f"{name}.log"

    def pid_file(self, name: str) -> Path:
        return self.pids_dir / f"{name}.pid"


def layout_for(state_dir: str | Path | None = None) -> Layout:
    """The layout for ``state_dir``, else ``$SLUICEWAY_SANDBOX_DIR``, else ~/.cache/sluiceway/sandbox."""
    chosen = state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
    return Layout(state_dir=Path(chosen).expanduser().resolve())
