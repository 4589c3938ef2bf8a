"""The end-to-end test: the whole system on this machine, real parts except the kubelet.

``sluiceway sandbox up`` (CLI, as a user runs it) -> helm-installed operator and scaler Pods Running
under their ServiceAccounts with no 403 in their logs -> the sandbox demo InferenceService applied ->
its pod Ready -> load above one replica's capacity -> 429s, no 5xx other than 503/504 with reasons
-> KEDA + the HPA controller raise replicas -> the agent starts the new process and it gets Ready
-> load stops -> replicas fall after the short windows -> CR deleted -> processes gone, no
namespace and no listener left on the pods' addresses -> ``sluiceway sandbox down`` removes every
process, namespace, veth, the bridge and the rules.

Needs root, ``ip``/``iptables``/``nsenter``, and the Go-built binaries (``scripts/setup.sh`` builds
them): skipped with the missing piece named otherwise. Bounded: every wait has a deadline and fails
with the last state seen.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sluiceway_sandbox import netns
from sluiceway_sandbox.kubeclient import Kube
from sluiceway_sandbox.layout import Layout, layout_for
from sluiceway_sandbox.loadgen import Client, EndpointWatcher, Phase, build_schedule, run_load_in_thread, summarize
from sluiceway_sandbox.state import proc_start_time, recorded

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "sandbox-demo.yaml"
NS, NAME = "sluiceway-demo", "ramp"
CAPACITY = 40.0  # requests/s of one replica, from the sample (2 permits / 50 ms)

pytestmark = [pytest.mark.slow, pytest.mark.sandbox, pytest.mark.timeout(420)]


def _missing() -> str:
    if os.geteuid() != 0:
        return "the sandbox needs root (network namespaces, iptables)"
    tools = netns.missing_tools()
    if tools:
        return f"missing commands: {', '.join(tools)} (apt-get install iproute2 iptables)"
    for script, what in (
        ("build-kube.sh", "kube-apiserver/kube-controller-manager/kube-scheduler/etcd"),
        ("build-helm.sh", "helm"),
        ("build-keda.sh", "keda-operator/keda-adapter"),
        ("build-prometheus.sh", "prometheus (with Kubernetes service discovery)"),
    ):
        path = ROOT / "tools" / script
        if not path.exists():
            return f"tools/{script} missing"
        out = subprocess.run(["bash", str(path), "--dir"], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            return f"{what} not built in {out.stdout.strip()}: run tools/{script} (scripts/setup.sh does)"
    if not SAMPLE.exists():
        return f"{SAMPLE} missing"
    return ""


def wait_for(check: Callable[[], Any], timeout: float, what: str, detail: Callable[[], str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as err:  # an API hiccup while the box is loaded: keep polling
            last = err
        else:
            if last:
                return last
        time.sleep(1.0)
    extra = f"\n{detail()}" if detail else ""
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}{extra}")


def cli(layout: Layout, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluiceway_cli.main", "sandbox", "--state-dir", str(layout.state_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Layout]:
    why = _missing()
    if why:
        pytest.skip(why)
    layout = layout_for(tmp_path_factory.mktemp("sandbox"))
    if layout.bridge in netns.list_links(layout.bridge):
        pytest.fail(f"bridge {layout.bridge} exists: another sandbox is up (sluiceway sandbox down first)")
    try:
        out = cli(layout, "up", "--no-build", "--timeout", "150", timeout=300)
        assert out.returncode == 0, f"sandbox up failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        print(out.stdout)
        lines = out.stdout.strip().splitlines()
        assert lines[-1] == f"KUBECONFIG={layout.kubeconfig}", lines[-5:]
        assert Path(lines[-1].split("=", 1)[1]).is_absolute()
        # idempotent: a second up keeps every running process and ends the same way
        before = {r.name: (r.pid, r.start) for r in recorded(layout.pids_dir)}
        again = cli(layout, "up", "--no-build", "--timeout", "150", timeout=300)
        assert again.returncode == 0, f"second up failed:\n{again.stdout[-3000:]}\n{again.stderr[-3000:]}"
        assert again.stdout.strip().splitlines()[-1] == lines[-1]
        assert {r.name: (r.pid, r.start) for r in recorded(layout.pids_dir)} == before
        yield layout
    finally:
        down = cli(layout, "down", timeout=180)
        assert down.returncode == 0, down.stderr
        left = [r for r in recorded(layout.pids_dir) if r.alive()]
        assert not left, f"processes left after down: {left}"
        assert netns.list_netns() == [], netns.list_netns()
        assert netns.list_links(netns.VETH_PREFIX) == []
        assert layout.bridge not in netns.list_links(layout.bridge)
        rules = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True, check=False).stdout
        assert layout.iptables_chain not in rules


def pods(kube: Kube, ns: str, selector: str = "") -> list[dict[str, Any]]:
    q = {"labelSelector": selector} if selector else None
    return list(kube.get(f"/api/v1/namespaces/{ns}/pods", q)["items"])


def is_ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds) and not pod["metadata"].get(
        "deletionTimestamp"
    )


def container_pids(pod: dict[str, Any]) -> list[int]:
    out = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        cid = cs.get("containerID", "")
        if cid.startswith("sandbox://"):
            out.append(int(cid.removeprefix("sandbox://")))
    return out


def summary(kube: Kube, ns: str) -> str:
    lines = []
    for p in pods(kube, ns):
        st = p.get("status") or {}
        cs = [(c["name"], c.get("ready"), list(c.get("state") or {})) for c in st.get("containerStatuses") or []]
        lines.append(f"{p['metadata']['name']} {st.get('phase')} ready={is_ready(p)} {cs}")
    return "\n".join(lines) or "no pods"


def component_logs(layout: Layout, prefix: str) -> str:
    base = layout.logs_dir / "pods"
    return "".join(
        f.read_text(errors="replace") for d in base.glob(f"sluiceway-system_{prefix}*") for f in d.glob("*.log")
    )


def listening(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((ip, port)) == 0


def test_whole_loop(sandbox: Layout) -> None:
    layout = sandbox
    kube = Kube.as_identity(layout, "admin")
    # 1. helm-installed controllers run as Pods, Ready, under the chart's ServiceAccounts.
    ctl = pods(kube, "sluiceway-system")
    names = {p["metadata"]["name"].rsplit("-", 2)[0]: p for p in ctl}
    assert {"sluiceway-operator", "sluiceway-scaler"} <= set(names), summary(kube, "sluiceway-system")
    assert names["sluiceway-operator"]["spec"]["serviceAccountName"] == "sluiceway-operator"
    assert all(is_ready(p) for p in ctl), summary(kube, "sluiceway-system")

    # 2. the InferenceService from the sample, and its first pod Ready.
    docs = [d for d in yaml.safe_load_all(SAMPLE.read_text()) if d]
    for d in docs:
        kube.apply(d)
    keys = {s["metadata"]["name"]: s["stringData"]["key"] for s in docs if s["kind"] == "Secret" and "stringData" in s}
    t_apply = time.monotonic()
    watcher = EndpointWatcher(kube, NS, NAME)
    wait_for(watcher.poll, 180, f"a ready endpoint of {NS}/{NAME}", lambda: summary(kube, NS))
    print(f"first ready endpoint {time.monotonic() - t_apply:.1f}s after the CR was applied")
    first = pods(kube, NS)
    first_pids = [pid for p in first for pid in container_pids(p)]
    assert first_pids and all(proc_start_time(pid) for pid in first_pids), summary(kube, NS)

    def hpa() -> Any:
        return kube.get_or_none(f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/keda-hpa-{NAME}")

    wait_for(
        hpa,
        120,
        f"KEDA's HPA keda-hpa-{NAME}",
        lambda: str(kube.get_or_none(f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects/{NAME}")),
    )

    # 3. load at about 3x one replica's capacity until a second pod serves (bounded to 150 s).
    clients = [
        Client("search", keys["search-key"], "interactive", 0.7),
        Client("reports", keys["reports-key"], "batch", 0.3),
    ]
    schedule = build_schedule([Phase("overload", 150, 3 * CAPACITY)], clients, seed=8)

    def desired() -> int:
        dep = kube.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}")
        return int(dep["spec"].get("replicas") or 0)

    with watcher:
        thread, outcomes, stop = run_load_in_thread(schedule, clients, watcher.endpoints, f"/v2/models/{NAME}/infer")
        t_load = time.monotonic()
        try:
            wait_for(
                lambda: desired() >= 2,
                120,
                "replicas >= 2 through KEDA + HPA",
                lambda: f"hpa: {(hpa() or {}).get('status')}\n{summary(kube, NS)}",
            )
            wait_for(
                lambda: sum(1 for p in pods(kube, NS) if is_ready(p)) >= 2,
                120,
                "a second Ready inference pod",
                lambda: summary(kube, NS),
            )
            t_second = time.monotonic() - t_load
            time.sleep(3)  # some traffic reaches the new pod
        finally:
            stop.set()
            thread.join(timeout=60)
    result = summarize(list(outcomes), time.monotonic() - t_load)
    print(
        f"load: {result.sent} sent, {result.ok} ok, codes {result.codes}, reasons {result.reasons}; "
        f"second ready pod {t_second:.1f}s after overload began"
    )
    assert result.ok > 0, result
    assert int(result.codes.get("429", 0)) > 0, f"no 429 under 3x overload: {result.codes}"
    assert result.unexpected_5xx == 0, result.reasons
    assert result.shed_without_reason == 0, result.reasons
    second = [p for p in pods(kube, NS) if p["metadata"]["uid"] not in {q["metadata"]["uid"] for q in first}]
    new_pids = [pid for p in second for pid in container_pids(p)]
    assert new_pids and all(proc_start_time(pid) for pid in new_pids), summary(kube, NS)
    new_ips = {(p.get("status") or {}).get("podIP") for p in second}
    assert any(o.endpoint.rpartition(":")[0] in new_ips and 200 <= o.status < 300 for o in outcomes), (
        f"no request answered by a new pod {new_ips}"
    )

    # 4. load off: replicas fall back after the short windows.
    wait_for(lambda: desired() == 1, 180, "replicas back to 1", lambda: str((hpa() or {}).get("status")))
    wait_for(lambda: len(pods(kube, NS)) == 1, 90, "the extra pod gone", lambda: summary(kube, NS))

    # 5. CR deleted: every inference process gone, no namespace, nothing listening on their addresses.
    all_pods = first + second
    ips = [(p.get("status") or {}).get("podIP") for p in all_pods]
    pids = first_pids + new_pids
    kube.delete(f"/apis/sluiceway.io/v1alpha1/namespaces/{NS}/inferenceservices/{NAME}")
    wait_for(lambda: not pods(kube, NS), 120, f"pods of {NS}/{NAME} gone", lambda: summary(kube, NS))
    wait_for(lambda: not any(proc_start_time(pid) for pid in pids), 30, f"processes {pids} gone")
    live_ns = set(netns.list_netns())
    assert not {netns.netns_name(p["metadata"]["uid"]) for p in all_pods} & live_ns
    for ip in ips:
        assert ip and not listening(ip, 8080) and not listening(ip, 9091), ip

    # 6. status and logs, as a user reads them.
    st = cli(layout, "status", timeout=60)
    assert st.returncode == 0 and f"KUBECONFIG={layout.kubeconfig}" in st.stdout, st.stdout + st.stderr
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "agent", "proxy", "prometheus"):
        assert any(line.startswith(name) and line.endswith("running") for line in st.stdout.splitlines()), st.stdout
    logs = cli(layout, "logs", "sluiceway-system/sluiceway-scaler", timeout=60)
    assert logs.returncode == 0 and "==> scaler" in logs.stdout, logs.stderr

    # 7. no RBAC denial in the controllers' logs (they ran under the chart's ServiceAccounts).
    for prefix in ("sluiceway-operator", "sluiceway-scaler"):
        text = component_logs(layout, prefix)
        assert text, f"no logs for {prefix}"
        assert " 403" not in text and "Forbidden" not in text, text[-3000:]
