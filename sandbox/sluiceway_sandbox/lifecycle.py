"""``sandbox up | down | status | logs``: bring the whole system up on this machine, idempotently, and
take every piece down again by PID and by name prefix (also after a crashed ``up``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import controlplane, helm, kubeproxy, netns, pki, prometheus
from .controlplane import kubeconfig_path, write_kubeconfig
from .kubeclient import Kube, KubeError
from .layout import Layout
from .state import read_pid, recorded, stop

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sluiceway"
Progress = Callable[[str], None]
#: host processes, in start order (``down`` stops them in reverse)
HOST_PROCESSES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "names",
    "agent",
    "kube-proxy",
    "prometheus",
)


class SandboxError(RuntimeError):
    """``up`` could not finish: the message says which step and what was last seen."""


@dataclass(frozen=True)
class UpOptions:
    build: bool = True
    gpus: int = 0
    cpu: int = 32
    keda: bool = True
    chart_values: tuple[tuple[str, str], ...] = ()
    timeout: float = 300.0


def _print(msg: str) -> None:
    print(msg, flush=True)


def wait_until(
    check: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.5,
    detail: Callable[[], str] | None = None,
) -> Any:
    """Poll ``check`` until truthy; SandboxError naming ``what``, the last value and ``detail()``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (KubeError, OSError) as err:
            last = err
        else:
            if last:
                return last
        time.sleep(interval)
    extra = f"; {detail()}" if detail is not None else ""
    raise SandboxError(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}{extra}")


def require_host() -> None:
    if os.geteuid() != 0:
        raise SandboxError("the sandbox creates network namespaces and iptables rules: run it as root")
    missing = netns.missing_tools()
    if missing:
        raise SandboxError(f"missing commands {', '.join(missing)}: apt-get install iproute2 iptables util-linux")


def _python_module(layout: Layout, module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, "--state-dir", str(layout.state_dir), *args]


def chart_values(prometheus_url: str, keda: bool, extra: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
    """The ``--set`` values of the sandbox's chart install. Without KEDA there is no client for the
    scaler's mutual TLS (and no ClusterTriggerAuthentication CRD to hold it): it is turned off.
    ``extra`` (``sluiceway sandbox up --set``) wins."""
    values = {"operator.prometheusUrl": prometheus_url}
    if not keda:
        values["scaler.tls.enabled"] = "false"
    return {**values, **dict(extra)}


def apply_all(kube: Kube, objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        if obj.get("kind") == "CustomResourceDefinition":
            kube.apply(obj)
            name = obj["metadata"]["name"]

            def established(name: str = name) -> bool:
                crd = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                return any(
                    c["type"] == "Established" and c["status"] == "True"
                    for c in (crd.get("status") or {}).get("conditions") or []
                )

            wait_until(established, 30, f"CRD {name} established")
            continue
        kube.apply(obj)


def _deployment_ready(kube: Kube, ns: str, name: str) -> bool:
    dep = kube.get_or_none(f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")
    if dep is None:
        return False
    st = dep.get("status") or {}
    return int(st.get("readyReplicas") or 0) >= int((dep.get("spec") or {}).get("replicas", 1))


def _pods_summary(kube: Kube, ns: str) -> str:
    try:
        pods = kube.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    except (KubeError, OSError) as err:
        return str(err)
    out = []
    for p in pods:
        cs = (p.get("status") or {}).get("containerStatuses") or []
        states = ",".join(f"{c['name']}:{next(iter(c.get('state') or {'?': 0}))}" for c in cs)
        out.append(f"{p['metadata']['name']} {p.get('status', {}).get('phase')} [{states}]")
    return "; ".join(out) or "no pods"


def _start_prometheus(layout: Layout, kube: Kube, binary: Path) -> None:
    apply_all(kube, prometheus.prometheus_manifests())
    token = kube.create(
        f"/api/v1/namespaces/{prometheus.NAMESPACE}/serviceaccounts/{prometheus.SERVICE_ACCOUNT}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}},
    )["status"]["token"]
    workdir = layout.prometheus_dir
    workdir.mkdir(parents=True, exist_ok=True)
    token_file = workdir / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    if controlplane.running(layout, "prometheus") is not None:
        return
    cfg = prometheus.prometheus_config(layout.apiserver_url, layout.ca_cert, token_file)
    proc = prometheus.start_prometheus(
        cfg, workdir, f"{layout.bridge_ip}:{layout.prometheus_port}", layout.log_file("prometheus"), binary=binary
    )
    from .state import write_pid

    write_pid(layout.pid_file("prometheus"), proc.pid)


def link_kubectl(layout: Layout, kube_bin: Path) -> Path | None:
    """Link ``<state>/bin/kubectl`` to the kubectl that ``tools/build-kube.sh`` built from the same
    ``k8s.io/kubernetes`` module as the control plane (so client and server versions match; Debian's
    kubectl is too old for the CRD's CEL rules). Returns the link, or None (and removes a stale
    link) when that build has no kubectl. Single-threaded: ``up`` calls it once."""
    link = layout.bin_dir / "kubectl"
    target = kube_bin / "kubectl"
    if link.is_symlink() or link.exists():
        link.unlink()
    if not target.is_file():
        return None
    layout.bin_dir.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


def kubectl_lines(layout: Layout, kubectl: Path | None) -> list[str]:
    """What ``up`` and ``status`` print about kubectl: where it is and the PATH line to use it."""
    if kubectl is None:
        return ["  kubectl     not built with the control plane: run tools/build-kube.sh, then sandbox up again"]
    return [f"  kubectl     {kubectl}   (export PATH={layout.bin_dir}:$PATH)"]


def up(layout: Layout, opts: UpOptions, progress: Progress = _print) -> None:
    t0 = time.monotonic()
    require_host()
    for d in (layout.state_dir, layout.logs_dir, layout.pids_dir, layout.pods_dir):
        d.mkdir(parents=True, exist_ok=True)
    progress(f"state directory: {layout.state_dir}")
    kube_bin = controlplane.bin_dir(ROOT, opts.build, progress)
    kubectl = link_kubectl(layout, kube_bin)
    proxy_bin = kubeproxy.binary(ROOT, opts.build, progress)
    helm_bin = helm.helm_binary(ROOT, opts.build, progress)
    keda_bins: dict[str, Path] = {}
    if opts.keda:
        progress("KEDA: locating binaries (built from github.com/kedacore/keda/v2 on first use, ~7 min)")
        from . import keda

        keda_bins = keda.keda_binaries(build=opts.build)
    progress("Prometheus: locating binaries (built from github.com/prometheus/prometheus on first use)")
    prom_bin = prometheus.prometheus_binary(build=opts.build)
    progress("certificates and kubeconfigs")
    pki.ensure_all(layout)
    write_kubeconfig(layout, layout.kubeconfig, "admin")
    for stem in ("controller-manager", "scheduler", "proxy", "node"):
        write_kubeconfig(layout, kubeconfig_path(layout, stem), stem)
    progress(
        f"network: bridge {layout.bridge} {layout.bridge_ip}/{layout.pod_prefix_len}, services {layout.service_cidr}"
    )
    netns.bridge_up(layout)
    progress("control plane: etcd, kube-apiserver")
    controlplane.start(layout, "etcd", controlplane.build_etcd(layout, kube_bin))
    controlplane.start(layout, "kube-apiserver", controlplane.build_apiserver(layout, kube_bin))
    controlplane.wait_ready(layout, timeout=min(opts.timeout, 180))
    progress("control plane: kube-controller-manager, kube-scheduler; Service names; node agent")
    controlplane.start(layout, "kube-controller-manager", controlplane.build_controller_manager(layout, kube_bin))
    controlplane.start(layout, "kube-scheduler", controlplane.build_scheduler(layout, kube_bin))
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    controlplane.start(layout, "names", _python_module(layout, "sluiceway_sandbox.services"), env=env)
    agent_args = ["--cpu", str(opts.cpu), "--gpus", str(opts.gpus)]
    for image, path in keda_bins.items():
        agent_args += ["--binary", f"{image}={path}"]
    controlplane.start(layout, "agent", _python_module(layout, "sluiceway_sandbox.agent", *agent_args), env=env)
    kube = Kube.as_identity(layout, "admin")

    def node_ready() -> bool:
        node = kube.get_or_none(f"/api/v1/nodes/{layout.node_name}")
        conds = ((node or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    wait_until(node_ready, 90, f"node {layout.node_name} Ready (agent log: {layout.log_file('agent')})")
    progress(f"kube-proxy (iptables mode, masquerade-all) for node {layout.node_name}")
    config, changed = kubeproxy.write_config(layout, kubeconfig_path(layout, "proxy"))
    old = controlplane.running(layout, "kube-proxy")
    if changed and old is not None:  # it exits by itself on a new file: restart it here, not at random
        stop(old, grace=10)
    controlplane.start(layout, "kube-proxy", kubeproxy.build_argv(proxy_bin, config), env=env)

    def proxy_healthy() -> bool:
        if controlplane.running(layout, "kube-proxy") is None:
            tail = layout.log_file("kube-proxy").read_text(errors="replace")[-1500:]
            raise SandboxError(f"kube-proxy exited; last log lines:\n{tail}")
        with urllib.request.urlopen(f"http://127.0.0.1:{kubeproxy.HEALTHZ_PORT}/healthz", timeout=3) as r:
            return bool(r.status == 200)

    wait_until(proxy_healthy, 60, f"kube-proxy healthy (log: {layout.log_file('kube-proxy')})")
    wait_until(
        lambda: kube.get_or_none("/api/v1/namespaces/default/serviceaccounts/default"),
        60,
        "ServiceAccount default/default (kube-controller-manager)",
    )
    progress(f"prometheus: {layout.prometheus_url} (pod discovery with ServiceAccount monitoring/prometheus)")
    _start_prometheus(layout, kube, prom_bin)

    def prometheus_ready() -> bool:
        if controlplane.running(layout, "prometheus") is None:
            tail = layout.log_file("prometheus").read_text(errors="replace")[-1500:]
            raise SandboxError(f"prometheus exited; last log lines:\n{tail}")
        with urllib.request.urlopen(f"{layout.prometheus_url}/-/ready", timeout=3) as r:
            return bool(r.status == 200)

    wait_until(prometheus_ready, 60, f"Prometheus ready at {layout.prometheus_url}")
    if opts.keda:
        # Before the chart: its scaler serves mutual TLS by default, with a ClusterTriggerAuthentication
        # (KEDA's CRD) and KEDA's client certificate in KEDA's namespace, both of which must exist.
        from . import keda

        progress("KEDA: CRDs, RBAC, operator and metrics adapter, APIService v1beta1.external.metrics.k8s.io")
        apply_all(kube, keda.keda_manifests(layout))
    progress(f"helm: installing {CHART} as release {helm.RELEASE} in {helm.NAMESPACE}")
    values = chart_values(layout.prometheus_url, opts.keda, opts.chart_values)
    helm.install(helm_bin, layout, CHART, values)
    waits = [(helm.NAMESPACE, "sluiceway-operator"), (helm.NAMESPACE, "sluiceway-scaler")]
    if opts.keda:
        waits += [("keda", "keda-operator"), ("keda", "keda-metrics-apiserver")]
    for ns, name in waits:

        def ready(ns: str = ns, name: str = name) -> bool:
            return _deployment_ready(kube, ns, name)

        def pods(ns: str = ns) -> str:
            return f"pods in {ns}: {_pods_summary(kube, ns)}"

        wait_until(ready, opts.timeout, f"Deployment {ns}/{name} ready", detail=pods)
        progress(f"ready: {ns}/{name}")
    if opts.keda:

        def available() -> bool:
            svc = kube.get("/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.external.metrics.k8s.io")
            return any(
                c["type"] == "Available" and c["status"] == "True"
                for c in (svc.get("status") or {}).get("conditions") or []
            )

        wait_until(available, 120, "APIService v1beta1.external.metrics.k8s.io Available")
    progress(f"sandbox up in {time.monotonic() - t0:.1f}s")
    progress(f"  API server  {layout.apiserver_url}   Prometheus {layout.prometheus_url}")
    progress(f"  logs        {layout.logs_dir}   (sluiceway sandbox logs POD)")
    for line in kubectl_lines(layout, kubectl):
        progress(line)
    progress("  try         kubectl get infsvc,pods -A ; sluiceway sandbox status ; sluiceway sandbox down")
    print(f"KUBECONFIG={layout.kubeconfig}", flush=True)


def down(layout: Layout, progress: Progress = _print, wipe: bool = True) -> None:
    """Stop every process (agent first so it stops its pods, then leftovers by PID file), remove
    namespaces, veths, bridge and rules; wipe cluster state (etcd, pods) unless ``wipe`` is False."""
    agent = read_pid(layout.pid_file("agent"))
    if agent is not None and stop(agent, grace=30):
        progress("stopped agent (and its pods)")
    for rec in [r for d in (layout.pods_dir.glob("*") if layout.pods_dir.is_dir() else []) for r in recorded(d)]:
        if stop(rec, grace=5):
            progress(f"stopped container process {rec.pid} ({rec.path.parent.name}/{rec.name})")
    names = list(HOST_PROCESSES)
    for rec in sorted(recorded(layout.pids_dir), key=lambda r: -names.index(r.name) if r.name in names else 0):
        if stop(rec, grace=10):
            progress(f"stopped {rec.name} (pid {rec.pid})")
    if os.geteuid() == 0:
        for item in netns.bridge_down(layout):
            progress(f"removed {item}")
    if wipe:
        for d in (layout.etcd_dir, layout.pods_dir, layout.state_dir / "hosts", layout.prometheus_dir / "data"):
            shutil.rmtree(d, ignore_errors=True)
    progress("sandbox down")


def status(layout: Layout) -> list[str]:
    lines = []
    for rec in recorded(layout.pids_dir):
        lines.append(f"{rec.name:26} pid {rec.pid:<8} {'running' if rec.alive() else 'NOT RUNNING'}")
    containers = [r for d in (layout.pods_dir.glob("*") if layout.pods_dir.is_dir() else []) for r in recorded(d)]
    for rec in containers:
        lines.append(f"container {rec.name:16} pid {rec.pid:<8} {'running' if rec.alive() else 'NOT RUNNING'}")
    lines.append(
        f"network namespaces: {len(netns.list_netns())}; bridge {layout.bridge}: "
        f"{'present' if layout.bridge in netns.list_links(layout.bridge) else 'absent'}"
    )
    if layout.kubeconfig.exists() and controlplane.running(layout, "kube-apiserver") is not None:
        kube = Kube.as_identity(layout, "admin")
        try:
            for p in kube.get("/api/v1/pods")["items"]:
                st = p.get("status") or {}
                ready = any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or [])
                lines.append(
                    f"pod {p['metadata']['namespace']}/{p['metadata']['name']}: {st.get('phase')} "
                    f"ready={ready} ip={st.get('podIP')}"
                )
        except (KubeError, OSError) as err:
            lines.append(f"API server not answering: {err}")
        link = layout.bin_dir / "kubectl"
        lines += kubectl_lines(layout, link if link.exists() else None)
        lines.append(f"KUBECONFIG={layout.kubeconfig}")
    return lines


def log_files(layout: Layout, pod: str) -> list[Path]:
    """Container logs of the pod named ``pod`` (or ``ns/pod``; a unique prefix such as a Deployment's
    name also matches), newest pod first."""
    ns, _, name = pod.rpartition("/")
    base = layout.logs_dir / "pods"
    if not base.is_dir():
        return []
    entries = []
    for d in base.iterdir():
        d_ns, _, rest = d.name.partition("_")
        d_name = rest.rsplit("_", 1)[0]
        if ns and d_ns != ns:
            continue
        entries.append((d_name, d))
    exact = [d for n, d in entries if n == name]
    chosen = exact or [d for n, d in entries if n.startswith(name)]
    chosen.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    return sorted(chosen[0].glob("*.log")) if chosen else []


def host_log(layout: Layout, name: str) -> Path:
    return layout.log_file(name)


def run_checked(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout
