"""The sandbox's Prometheus configuration: valid for the real ``promtool``, pod discovery only (no
static targets), and the relabeling the chart's PodMonitor asks for."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from sluiceway_sandbox.prometheus import (
    PrometheusError,
    prometheus_bin_dir,
    prometheus_command,
    prometheus_config,
    prometheus_manifests,
    start_prometheus,
)


def _promtool() -> str:
    """The promtool built with Prometheus (Debian's lacks Kubernetes discovery: see
    test_debian_promtool_lacks_kubernetes_sd)."""
    try:
        return str(prometheus_bin_dir(build=False) / "promtool")
    except PrometheusError as err:
        pytest.skip(f"promtool from tools/build-prometheus.sh not built: {err}")


def _files(tmp_path: Path) -> tuple[Path, Path]:
    ca, token = tmp_path / "ca.crt", tmp_path / "token"
    ca.write_text("placeholder; promtool checks that the file exists\n")
    token.write_text("token\n")
    return ca, token


def test_promtool_accepts_the_generated_config(tmp_path: Path) -> None:
    promtool = _promtool()
    ca, token = _files(tmp_path)
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(prometheus_config("https://198.18.0.1:6443", ca, token, "2s"))
    out = subprocess.run([promtool, "check", "config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


def test_promtool_rejects_a_broken_config(tmp_path: Path) -> None:
    """The check above can fail: a config naming a token file that does not exist is refused."""
    promtool = _promtool()
    ca, _ = _files(tmp_path)
    cfg = tmp_path / "prometheus.yml"
    text = prometheus_config("https://198.18.0.1:6443", ca, tmp_path / "missing-token", "2s")
    cfg.write_text(text.replace("scrape_timeout: 2s", "scrape_timeout: 5s"))  # timeout > interval: invalid
    out = subprocess.run([promtool, "check", "config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0, out.stdout + out.stderr


def test_debian_promtool_lacks_kubernetes_sd(tmp_path: Path) -> None:
    """Why the sandbox builds Prometheus: Debian's build has no kubernetes_sd_configs. If this
    starts failing, Debian's package became usable and tools/build-prometheus.sh may go."""
    import shutil

    debian = shutil.which("promtool")
    if debian is None or not debian.startswith("/usr/bin/"):
        pytest.skip("Debian's promtool (/usr/bin/promtool) not installed")
    ca, token = _files(tmp_path)
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(prometheus_config("https://198.18.0.1:6443", ca, token, "2s"))
    out = subprocess.run([debian, "check", "config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "kubernetes_sd_configs not found" in out.stdout + out.stderr


def test_discovery_and_relabeling(tmp_path: Path) -> None:
    ca, token = _files(tmp_path)
    cfg = yaml.safe_load(prometheus_config("https://198.18.0.1:6443", ca, token, "2s"))
    assert cfg["global"]["scrape_interval"] == "2s"
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == {"sluiceway-pods", "sluiceway-scaler"}
    for job in jobs.values():
        assert "static_configs" not in job
        (sd,) = job["kubernetes_sd_configs"]
        assert sd["role"] == "pod"
        assert sd["api_server"] == "https://198.18.0.1:6443"
        assert sd["tls_config"] == {"ca_file": str(ca), "insecure_skip_verify": False}
        assert sd["authorization"] == {"type": "Bearer", "credentials_file": str(token)}
    pods = jobs["sluiceway-pods"]["relabel_configs"]
    keeps = {r["source_labels"][0]: r["regex"] for r in pods if r["action"] == "keep"}
    assert keeps == {
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "sluiceway-pod|sluiceway-gateway",
        "__meta_kubernetes_pod_container_port_name": "metrics",
        "__meta_kubernetes_pod_phase": "Running",
    }
    targets = {r["target_label"]: r["source_labels"][0] for r in pods if r["action"] == "replace"}
    assert targets == {
        "namespace": "__meta_kubernetes_namespace",
        "inferenceservice": "__meta_kubernetes_pod_label_sluiceway_io_inferenceservice",
        "pod": "__meta_kubernetes_pod_name",
        "component": "__meta_kubernetes_pod_label_app_kubernetes_io_name",
    }
    (gateway,) = [r for r in pods if r.get("target_label") == "component"]
    assert (gateway["regex"], gateway["replacement"]) == ("sluiceway-gateway", "gateway")  # as the chart's PodMonitor
    scaler_keep = [r["regex"] for r in jobs["sluiceway-scaler"]["relabel_configs"] if r["action"] == "keep"]
    assert "sluiceway-scaler" in scaler_keep
    only_pods = yaml.safe_load(prometheus_config("https://198.18.0.1:6443", ca, token, scrape_scaler=False))
    assert [j["job_name"] for j in only_pods["scrape_configs"]] == ["sluiceway-pods"]


@pytest.mark.parametrize(
    ("server", "interval"), [("http://198.18.0.1:6443", "2s"), ("https://198.18.0.1:6443", ""), ("https://x", "s")]
)
def test_bad_arguments_are_refused(tmp_path: Path, server: str, interval: str) -> None:
    ca, token = _files(tmp_path)
    with pytest.raises(PrometheusError):
        prometheus_config(server, ca, token, interval)


def test_rbac_is_read_only_on_pods() -> None:
    objs = prometheus_manifests()
    kinds = [o["kind"] for o in objs]
    assert kinds == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
    (rule,) = objs[2]["rules"]
    assert rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    subject = objs[3]["subjects"][0]
    assert (subject["namespace"], subject["name"]) == ("monitoring", "prometheus")


def test_listen_address_is_confined(tmp_path: Path) -> None:
    with pytest.raises(PrometheusError, match="loopback or the sandbox bridge"):
        start_prometheus("{}", tmp_path, "0.0.0.0:9090", tmp_path / "log", binary=Path("/bin/false"))
    cmd = prometheus_command(tmp_path / "p.yml", tmp_path / "d", "127.0.0.1:1", binary=Path("/usr/bin/prometheus"))
    assert "--web.listen-address=127.0.0.1:1" in cmd
