"""The control plane as processes: etcd, kube-apiserver (RBAC + Node authorizer, ServiceAccount token
signing, aggregation layer), kube-controller-manager and kube-scheduler, from ``tools/build-kube.sh``.
``build_*`` functions are pure (argv lists); ``start``/``wait_ready`` do the I/O."""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from .layout import Layout
from .pki import front_proxy_ca, pair
from .state import Recorded, read_pid, spawn, stop

#: controllers the sandbox needs (kube-controller-manager names, v1.34).
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "garbage-collector-controller",
    "horizontal-pod-autoscaler-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "namespace-controller",
    "disruption-controller",
    "node-lifecycle-controller",
    "clusterrole-aggregation-controller",
    "pod-garbage-collector-controller",
    "job-controller",
    "statefulset-controller",
    "ttl-after-finished-controller",
)
#: Kubernetes 1.34 feature gates the sandbox turns on in the API server and the controller manager:
#: ``HPAConfigurableTolerance`` (alpha in 1.34, beta and on by default from 1.35) keeps the
#: ``behavior.scaleUp.tolerance`` the operator renders into KEDA's HPA (the API server drops an
#: alpha field whose gate is off) and makes the HPA controller use it.
FEATURE_GATES = "HPAConfigurableTolerance=true"

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


def write_kubeconfig(layout: Layout, path: Path, stem: str, server: str | None = None) -> Path:
    p = pair(layout, stem)
    cfg: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "sluiceway-sandbox",
                "cluster": {"server": server or layout.apiserver_url, "certificate-authority": str(layout.ca_cert)},
            }
        ],
        "users": [{"name": stem, "user": {"client-certificate": str(p.cert), "client-key": str(p.key)}}],
        "contexts": [{"name": "sluiceway-sandbox", "context": {"cluster": "sluiceway-sandbox", "user": stem}}],
        "current-context": "sluiceway-sandbox",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    path.chmod(0o600)
    return path


def kubeconfig_path(layout: Layout, stem: str) -> Path:
    return layout.kubeconfig if stem == "admin" else layout.pki_dir / f"{stem}.kubeconfig"


def build_etcd(layout: Layout, bindir: Path) -> list[str]:
    peer = f"http://127.0.0.1:{layout.etcd_peer_port}"
    return [
        str(bindir / "etcd"),
        "--name",
        "sandbox",
        "--data-dir",
        str(layout.etcd_dir),
        "--listen-client-urls",
        layout.etcd_url,
        "--advertise-client-urls",
        layout.etcd_url,
        "--listen-peer-urls",
        peer,
        "--initial-advertise-peer-urls",
        peer,
        "--initial-cluster",
        f"sandbox={peer}",
        "--unsafe-no-fsync",
        "--log-level",
        "warn",
    ]


def build_apiserver(layout: Layout, bindir: Path) -> list[str]:
    srv, fp = pair(layout, "apiserver"), pair(layout, "front-proxy-client")
    kc = pair(layout, "apiserver-kubelet-client")
    return [
        str(bindir / "kube-apiserver"),
        f"--etcd-servers={layout.etcd_url}",
        f"--bind-address={layout.bridge_ip}",
        f"--advertise-address={layout.bridge_ip}",
        f"--secure-port={layout.apiserver_port}",
        f"--tls-cert-file={srv.cert}",
        f"--tls-private-key-file={srv.key}",
        f"--client-ca-file={layout.ca_cert}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--anonymous-auth=false",
        f"--service-account-issuer=https://kubernetes.default.svc.{layout.cluster_domain}",
        f"--service-account-key-file={layout.sa_pub}",
        f"--service-account-signing-key-file={layout.sa_key}",
        f"--service-cluster-ip-range={layout.service_cidr}",
        f"--requestheader-client-ca-file={front_proxy_ca(layout).cert}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={fp.cert}",
        f"--proxy-client-key-file={fp.key}",
        "--enable-aggregator-routing=true",
        f"--kubelet-client-certificate={kc.cert}",
        f"--kubelet-client-key={kc.key}",
        "--allow-privileged=true",
        f"--feature-gates={FEATURE_GATES}",
        "--profiling=false",
        "--v=1",
    ]


def _client_component(layout: Layout, kubeconfig: str, port: int, cert_dir: str) -> list[str]:
    """The flags the controller manager and the scheduler share: one kubeconfig for everything,
    no leader election, a serving port on loopback with self-made certificates in ``cert_dir``."""
    kc = kubeconfig_path(layout, kubeconfig)
    return [
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={layout.pki_dir / cert_dir}",
        "--profiling=false",
        "--v=1",
    ]


def build_controller_manager(layout: Layout, bindir: Path) -> list[str]:
    return [
        str(bindir / "kube-controller-manager"),
        *_client_component(layout, "controller-manager", layout.controller_manager_port, "kcm-serving"),
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={layout.sa_key}",
        f"--root-ca-file={layout.ca_cert}",
        f"--controllers={','.join(CONTROLLERS)}",
        f"--feature-gates={FEATURE_GATES}",
        "--horizontal-pod-autoscaler-sync-period=5s",
        "--horizontal-pod-autoscaler-downscale-stabilization=30s",
        "--concurrent-gc-syncs=5",
    ]


def build_scheduler(layout: Layout, bindir: Path) -> list[str]:
    return [
        str(bindir / "kube-scheduler"),
        *_client_component(layout, "scheduler", layout.scheduler_port, "scheduler-serving"),
    ]


def running(layout: Layout, name: str) -> Recorded | None:
    rec = read_pid(layout.pid_file(name))
    return rec if rec is not None and rec.alive() else None


def start(layout: Layout, name: str, argv: list[str], env: dict[str, str] | None = None) -> Recorded:
    """Start ``name`` unless its recorded process still runs with the same command line (idempotent
    ``up``); a process started with another command line is restarted."""
    argv_file = layout.pids_dir / f"{name}.argv"
    rec = running(layout, name)
    if rec is not None:
        try:
            same = json.loads(argv_file.read_text()) == argv
        except (OSError, ValueError):
            same = False
        if same:
            return rec
        stop(rec, grace=30)
    layout.pids_dir.mkdir(parents=True, exist_ok=True)
    argv_file.write_text(json.dumps(argv))
    spawn(name, argv, layout.log_file(name), layout.pid_file(name), env=env)
    out = read_pid(layout.pid_file(name))
    assert out is not None
    return out


def readyz(layout: Layout, timeout: float = 5.0) -> str:
    """'' when ``/readyz`` answers 200 for the admin, else what went wrong."""
    adm = pair(layout, "admin")
    ctx = ssl.create_default_context(cafile=str(layout.ca_cert))
    ctx.load_cert_chain(str(adm.cert), str(adm.key))
    try:
        with urllib.request.urlopen(f"{layout.apiserver_url}/readyz", context=ctx, timeout=timeout) as r:
            return "" if r.status == 200 else f"status {r.status}"
    except OSError as err:
        return str(err)


def wait_ready(layout: Layout, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        for name in ("etcd", "kube-apiserver"):
            if running(layout, name) is None:
                tail = layout.log_file(name).read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited; last log lines:\n{tail}")
        last = readyz(layout)
        if not last:
            return
        time.sleep(0.5)
    tail = layout.log_file("kube-apiserver").read_text(errors="replace")[-2000:]
    raise TimeoutError(f"kube-apiserver not ready after {timeout:.0f}s: {last}\n{tail}")


def bin_dir(root: Path, build: bool, progress: Any = None) -> Path:
    """The control-plane binaries' directory; builds them (minutes, once) when ``build``."""
    script = root / "tools" / "build-kube.sh"
    out = subprocess.run(["bash", str(script), "--dir"], capture_output=True, text=True, check=False)
    d = Path(out.stdout.strip())
    if out.returncode == 0:
        return d
    if not build:
        raise FileNotFoundError(f"control plane not built in {d}: run tools/build-kube.sh")
    if progress:
        progress(
            "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd (first run only, ~15 min)"
        )
    res = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=True)
    return Path(res.stdout.strip().splitlines()[-1])
