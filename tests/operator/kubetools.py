"""A real Kubernetes control plane for the operator tests: etcd + kube-apiserver + kube-controller-manager.

Binaries come from ``tools/build-kube.sh`` (cached under ~/.cache/sluiceway). Everything listens on
127.0.0.1 on free ports; RBAC is on and the admin authenticates with a static token. The
controller-manager makes garbage collection, the Deployment/ReplicaSet controllers and the
ServiceAccount controllers real. No kubelet: pods stay Pending.

Set ``SLUICEWAY_KUBE_BIN`` to use binaries from elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from netports import free_port as _free_port
from sluiceway_operator.kube import ApiError, Kube

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
for _p in (ROOT / "operator", ROOT / "inference-pod"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

ADMIN_TOKEN = "sluiceway-admin-token"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")



def kube_bin_dir() -> tuple[Path | None, str]:
    """(directory, why-not) for the control-plane binaries."""
    env = os.environ.get("SLUICEWAY_KUBE_BIN")
    if env:
        d = Path(env)
    else:
        out = subprocess.run(
            ["bash", str(ROOT / "tools" / "build-kube.sh"), "--dir"],
            capture_output=True,
            text=True,
            check=False,
        )
        d = Path(out.stdout.strip())
    for b in BINARIES:
        if not (d / b).is_file():
            return None, f"{b} not built in {d}: run tools/build-kube.sh"
    return d, ""


def write_kubeconfig(path: Path, server: str, token: str) -> None:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "user", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(cfg))


@dataclass
class ControlPlane:
    server: str
    kubeconfig: Path
    workdir: Path
    logs: dict[str, Path]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    commands: dict[str, list[str]] = field(default_factory=dict)

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver (a fault): clients see connection refused until it is started."""
        p = self.procs["kube-apiserver"]
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def start_apiserver(self, timeout: float = 90) -> None:
        """Start kube-apiserver again with the same flags, port and etcd; wait until ready."""
        with open(self.logs["kube-apiserver"], "ab") as fh:
            self.procs["kube-apiserver"] = subprocess.Popen(
                self.commands["kube-apiserver"], stdout=fh, stderr=subprocess.STDOUT
            )
        _wait_ready(self.server, timeout, {"kube-apiserver": self.procs["kube-apiserver"]})

    def client(self, kubeconfig: Path | None = None) -> Any:
        import kubernetes

        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(kubeconfig or self.kubeconfig), client_configuration=cfg)
        return kubernetes.client.ApiClient(cfg)

    def log_tail(self, name: str, lines: int = 40) -> str:
        text = self.logs[name].read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def _wait_ready(server: str, timeout: float, procs: dict[str, subprocess.Popen[bytes]]) -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        for name, p in procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}")
        req = urllib.request.Request(f"{server}/readyz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError as err:
            last = str(err)
        time.sleep(0.5)
    raise TimeoutError(f"kube-apiserver not ready after {timeout}s: {last}")


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    bindir, why = kube_bin_dir()
    if bindir is None:
        pytest.skip(why)
    d = tmp_path_factory.mktemp("kube")
    subprocess.run(["openssl", "genrsa", "-out", str(d / "sa.key"), "2048"], check=True, capture_output=True)
    (d / "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n')
    etcd_port, peer_port, api_port, kcm_port = (_free_port() for _ in range(4))
    server = f"https://127.0.0.1:{api_port}"
    kubeconfig = d / "admin.kubeconfig"
    write_kubeconfig(kubeconfig, server, ADMIN_TOKEN)
    logs = {n: d / f"{n}.log" for n in BINARIES}
    commands = {
        "etcd": [
            str(bindir / "etcd"),
            "--name",
            "default",
            "--data-dir",
            str(d / "etcd"),
            "--listen-client-urls",
            f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-cluster",
            f"default=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",
            "--log-level",
            "warn",
        ],
        "kube-apiserver": [
            str(bindir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--cert-dir={d / 'pki'}",
            f"--token-auth-file={d / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={d / 'sa.key'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=false",
            "--v=1",
        ],
        "kube-controller-manager": [
            str(bindir / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--service-account-private-key-file={d / 'sa.key'}",
            "--controllers=*",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={kcm_port}",
            f"--cert-dir={d / 'kcm-pki'}",
            "--concurrent-gc-syncs=5",
            "--v=1",
        ],
    }
    procs: dict[str, subprocess.Popen[bytes]] = {}
    handles = []
    try:
        for name in ("etcd", "kube-apiserver"):
            fh = open(logs[name], "wb")  # noqa: SIM115 - closed in finally
            handles.append(fh)
            procs[name] = subprocess.Popen(commands[name], stdout=fh, stderr=subprocess.STDOUT)
        try:
            _wait_ready(server, 90, procs)
        except (RuntimeError, TimeoutError) as err:
            tails = "\n".join(f"--- {n}\n{logs[n].read_text(errors='replace')[-3000:]}" for n in procs)
            pytest.fail(f"control plane did not start: {err}\n{tails}")
        fh = open(logs["kube-controller-manager"], "wb")  # noqa: SIM115
        handles.append(fh)
        procs["kube-controller-manager"] = subprocess.Popen(
            commands["kube-controller-manager"], stdout=fh, stderr=subprocess.STDOUT
        )
        yield ControlPlane(server=server, kubeconfig=kubeconfig, workdir=d, logs=logs, procs=procs, commands=commands)
    finally:
        for name in reversed(list(procs)):
            p = procs[name]
            p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for fh in handles:
            fh.close()
        if not os.environ.get("SLUICEWAY_KEEP_KUBE"):
            shutil.rmtree(d / "etcd", ignore_errors=True)


def wait_for(check: Callable[[], Any], timeout: float = 30.0, interval: float = 0.25, what: str = "") -> Any:
    """Poll ``check`` until it returns something truthy; fail with its last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except AssertionError as err:
            last = err
        else:
            if last:
                return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what or check}: last={last!r}")


class Admin:
    """Raw admin calls (cluster setup and assertions), through the operator's own facade."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def call(self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None) -> Any:
        ctype = "application/json-patch+json" if method == "PATCH" else "application/json"
        return self.kube._call(method, path, body=body, query=query, content_type=ctype)

    def get(self, path: str) -> Any:
        try:
            return self.call("GET", path)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def create(self, path: str, body: Any, dry_run: bool = False) -> Any:
        return self.call("POST", path, body=body, query=[("dryRun", "All")] if dry_run else None)


def establish_crd(admin: Admin, crd: dict[str, Any]) -> None:
    name = crd["metadata"]["name"]
    if admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") is None:
        admin.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

    def established() -> bool:
        obj = admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conds = (obj or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    wait_for(established, 30, what=f"CRD {name} established")


def operator_command(namespace: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sluiceway_operator.cli", "run", "-n", namespace, *extra, "-v"]


def operator_env(kubeconfig: Path) -> dict[str, str]:
    env = dict(
        os.environ,
        KUBECONFIG=str(kubeconfig),
        PYTHONPATH=os.pathsep.join(
            [str(ROOT / "operator"), str(ROOT / "inference-pod"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.pop("SLUICEWAY_PROMETHEUS_URL", None)
    # The operator's policy (issue 18 item 8): the tests' images and placement fields are allowed;
    # the policy itself is tested in test_operator_policy.py.
    env["SLUICEWAY_ALLOWED_IMAGE_REGISTRIES"] = "registry.example/,ghcr.io/sluiceway/"
    for var in (
        "SLUICEWAY_ALLOWED_SERVICE_ACCOUNTS",
        "SLUICEWAY_ALLOWED_PRIORITY_CLASSES",
        "SLUICEWAY_ALLOWED_TOLERATION_KEYS",
        "SLUICEWAY_ALLOWED_RUNTIME_CLASSES",
        "SLUICEWAY_ALLOWED_NODE_SELECTOR_KEYS",
    ):
        env[var] = "*"
    return env


def stop_process(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM, up to ``grace`` seconds to exit, then SIGKILL; returns once the process is reaped."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def run_operator(kubeconfig: Path, log: Path, namespace: str, *extra: str) -> Iterator[Path]:
    """Run ``sluiceway-operator run`` for real in a subprocess, watching ``namespace``; on exit,
    check its log for crashes and RBAC denials (it runs under a least-privilege ServiceAccount)."""
    env = operator_env(kubeconfig)
    cmd = operator_command(namespace, *extra)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        try:
            time.sleep(1)
            if proc.poll() is not None:
                pytest.fail(f"operator exited: {log.read_text()[-3000:]}")
            yield log
        finally:
            stop_process(proc)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text or "TemporaryError" in text, text[-4000:]
    assert "Forbidden" not in text and " 403" not in text, text[-4000:]


KEDA_STANDIN_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "scaledobjects.keda.sh"},
    "spec": {
        "group": "keda.sh",
        "scope": "Namespaced",
        "names": {
            "kind": "ScaledObject",
            "plural": "scaledobjects",
            "singular": "scaledobject",
            "listKind": "ScaledObjectList",
        },
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}


def _create_once(admin: Admin, path: str, body: Any) -> Any:
    try:
        return admin.create(path, body)
    except ApiError as err:
        if err.status != 409:
            raise
        return None


def operator_kubeconfig(control_plane: ControlPlane, admin: Admin, op_ns: str) -> Path:
    """A ServiceAccount bound to the chart's ClusterRole rules; its token in a kubeconfig."""
    rules = yaml.safe_load((ROOT / "charts" / "sluiceway" / "files" / "operator-rules.yaml").read_text())
    sa = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "sluiceway-operator", "namespace": op_ns},
    }
    _create_once(admin, f"/api/v1/namespaces/{op_ns}/serviceaccounts", sa)
    _create_once(
        admin,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "sluiceway-operator"},
            "rules": rules,
        },
    )
    _create_once(
        admin,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "sluiceway-operator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "sluiceway-operator",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "sluiceway-operator", "namespace": op_ns}],
        },
    )
    token = admin.create(
        f"/api/v1/namespaces/{op_ns}/serviceaccounts/sluiceway-operator/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 7200},
        },
    )["status"]["token"]
    path = control_plane.workdir / "operator.kubeconfig"
    write_kubeconfig(path, control_plane.server, token)
    return path
