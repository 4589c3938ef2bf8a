"""The operator reads Prometheus with credentials (``SLUICEWAY_PROMETHEUS_AUTH_FILE``, issue 23 §1).

A real Prometheus (the Debian binary) that requires TLS with a server certificate from a test CA, a
client certificate from that CA and basic auth (the web config of
``tests/scaler/test_prometheus_auth.py``, built with its helpers), scraping a real ``sluiceway-pod``
process with the ``namespace`` / ``inferenceservice`` labels of the InferenceService under test.
The operator's signals path (:meth:`Reconciler.refresh_signals`, the code the signals ticker runs)
reads the pod's series with the credentials file, and fails without it, with no secret and nothing
the server sent in the error. The CLI loads the file once at start and stops with exit status 2 and
one line naming the file on a bad one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubetools import ROOT
from podtools import PodProcess, free_port, start_pod
from promtools import PROMETHEUS, PrometheusProcess, prometheus_missing
from sluiceway_core.promauth import PromAuth, load_prom_auth
from sluiceway_core.promclient import PromUnavailable, instant_query
from sluiceway_core.urls import UrlAllowList
from sluiceway_operator.policy import Policy
from sluiceway_operator.reconcile import Reconciler
from sluiceway_operator.settings import OperatorConfig, config_from_env
from test_operator_reconcile_unit import FakeKube

sys.path.insert(0, str(ROOT / "tests" / "scaler"))
from test_prometheus_auth import PASSWORD, _bcrypt  # the scaler tests' secured Prometheus
from tlscerts import CA, write

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.slow,
    pytest.mark.skipif(prometheus_missing() is not None, reason=prometheus_missing() or ""),
]

NS, NAME = "sluiceway-auth", "secured"


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodProcess]:
    p = start_pod(tmp_path_factory.mktemp("pod"), "--model", "synthetic:5")
    try:
        yield p
    finally:
        p.terminate(30)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, pod: PodProcess) -> Iterator[tuple[str, Path]]:
    """(the secured Prometheus' URL, an auth file with everything it requires)."""
    d = tmp_path_factory.mktemp("secured-prometheus")
    ca = CA()
    server, client = ca.issue("localhost", server=True), ca.issue("sluiceway", server=False)
    files = write(
        d,
        **{
            "ca.crt": ca.cert,
            "server.crt": server.cert,
            "server.key": server.key,
            "client.crt": client.cert,
            "client.key": client.key,
            "password": PASSWORD.encode() + b"\n",
        },
    )
    web = {
        "tls_server_config": {
            "cert_file": str(files["server.crt"]),
            "key_file": str(files["server.key"]),
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": str(files["ca.crt"]),
        },
        "basic_auth_users": {"sluiceway": _bcrypt(PASSWORD)},
    }
    (d / "web.yml").write_text(yaml.safe_dump(web))
    port = free_port()
    # promtools writes the scrape config (the pod's metrics port, the InferenceService's labels)
    PrometheusProcess(port, d, [f"127.0.0.1:{pod.metrics_port}"], labels={"namespace": NS, "inferenceservice": NAME})
    url = f"https://127.0.0.1:{port}"
    auth_file = d / "auth.yaml"
    auth_file.write_text(
        yaml.safe_dump(
            {
                "prometheus": [
                    {
                        "url": url,
                        "basicAuth": {"username": "sluiceway", "passwordFile": str(files["password"])},
                        "tls": {
                            "caFile": str(files["ca.crt"]),
                            "certFile": str(files["client.crt"]),
                            "keyFile": str(files["client.key"]),
                        },
                    }
                ]
            }
        )
    )
    auth = load_prom_auth(auth_file)
    with (d / "prometheus.log").open("ab") as log:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={d / 'prometheus.yml'}",
                f"--storage.tsdb.path={d / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--web.config.file={d / 'web.yml'}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    allow = UrlAllowList.build("test", [url])
    try:
        end = time.monotonic() + 90
        while True:  # until the pod's queue-depth series has been scraped
            assert proc.poll() is None, (d / "prometheus.log").read_text()
            try:
                if instant_query(url, "sluiceway_queue_depth", allow=allow, timeout=2, auth=auth):
                    break
            except PromUnavailable:
                pass
            assert time.monotonic() < end, "the secured Prometheus never scraped the pod"
            time.sleep(0.3)
        yield url, auth_file
    finally:
        proc.terminate()
        proc.wait(15)


def _body() -> dict[str, Any]:
    return {
        "metadata": {"name": NAME, "namespace": NS, "uid": "u-auth", "generation": 1},
        "spec": {"model": {"image": "i:1", "format": "demo", "source": "demo"}},
        "status": {},
    }


def _signals(url: str, auth: PromAuth | None) -> Any:
    cfg = OperatorConfig(prometheus_url=url, policy=Policy.open(), prom_auth=auth)
    return Reconciler(cfg, FakeKube()).refresh_signals(_body())  # type: ignore[arg-type]


def test_signals_path_reads_a_prometheus_that_requires_credentials(secured: tuple[str, Path]) -> None:
    url, auth_file = secured
    cfg = config_from_env({"SLUICEWAY_PROMETHEUS_URL": url, "SLUICEWAY_PROMETHEUS_AUTH_FILE": str(auth_file)})
    assert cfg.prom_auth is not None and PASSWORD not in repr(cfg)
    with_file = _signals(url, cfg.prom_auth)
    print(f"with the auth file: {with_file}")
    assert with_file.prometheus_error is None, with_file
    assert with_file.series_found is True and with_file.queue_depth == 0.0, with_file
    assert with_file.live_permits is not None and with_file.live_permits >= 1, with_file

    without = _signals(url, None)
    print(f"without it: prometheus_error={without.prometheus_error!r}")
    assert without.prometheus_error is not None and without.series_found is None, without
    assert url in without.prometheus_error
    for leaked in (PASSWORD, "Unauthorized", "certificate required"):
        assert leaked not in without.prometheus_error


def _cli(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(str(ROOT / p) for p in ("core", "operator"))
    return subprocess.run(
        [sys.executable, "-m", "sluiceway_operator.cli", "run", "--namespace", "nowhere"],
        env={**os.environ, "PYTHONPATH": path, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_stops_with_status_2_naming_the_file_never_a_secret(tmp_path: Path) -> None:
    bad = tmp_path / "auth.yaml"
    bad.write_text(yaml.safe_dump({"prometheus": [{"url": "https://p.example", "password": "pw-SECRET-7f3a"}]}))
    done = _cli({"SLUICEWAY_PROMETHEUS_AUTH_FILE": str(bad)})
    print(f"rc={done.returncode} stderr={done.stderr!r}")
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "unknown keys" in lines[0], lines
    assert "SECRET" not in done.stderr + done.stdout
    missing = _cli({"SLUICEWAY_PROMETHEUS_AUTH_FILE": str(tmp_path / "absent.yaml")})
    assert missing.returncode == 2 and str(tmp_path / "absent.yaml") in missing.stderr, missing
