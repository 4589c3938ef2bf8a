"""Authenticating to Prometheus (issue 23 §1): the shared client (``sluiceway_core.promclient`` with
``sluiceway_core.promauth``), the scaler's ``--prometheus-auth-file``.

Against a real Prometheus (the Debian binary) started with ``--web.config.file`` that requires all
of: TLS with a server certificate from a test CA, a client certificate from that CA, and basic auth.
Each missing or wrong piece is refused, and no secret appears in any message. Bearer tokens and
custom headers (``X-Scope-OrgID``), which Prometheus itself does not check, against a real loopback
HTTP server that answers only with the right ones (as an authenticating proxy in front of
Mimir/Cortex does), including a token rotated on disk between two queries.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from scaler_support import PROMETHEUS, ROOT, free_port
from sluiceway_core.promauth import PromAuth, PromAuthError, load_prom_auth, parse_prom_auth
from sluiceway_core.promclient import PromUnavailable, instant_query
from sluiceway_core.urls import UrlAllowList
from sluiceway_scaler.prom import PrometheusSource
from tlscerts import CA, write

PASSWORD = "pw-SECRET-7f3a"
TOKEN = "tok-SECRET-91c2"


def _bcrypt(password: str) -> str:
    """Prometheus' basic_auth_users want bcrypt: libxcrypt's through the stdlib ``crypt`` module
    (deprecated in 3.11, and the one bcrypt at hand without another package)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt as _crypt

        return _crypt.crypt(password, _crypt.mksalt(_crypt.METHOD_BLOWFISH, rounds=1 << 4))


@dataclass
class Secured:
    url: str
    files: dict[str, Path]
    workdir: Path

    def auth(self, **entry: Any) -> PromAuth:
        return parse_prom_auth({"prometheus": [{"url": self.url, **entry}]})

    def full(self, password_file: str = "password") -> dict[str, Any]:
        f = self.files
        return {
            "basicAuth": {"username": "sluiceway", "passwordFile": str(f[password_file])},
            "tls": {"caFile": str(f["ca.crt"]), "certFile": str(f["client.crt"]), "keyFile": str(f["client.key"])},
        }


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    if not Path(PROMETHEUS).exists():
        pytest.skip(f"prometheus binary not found at {PROMETHEUS}: apt-get install -y prometheus")
    d = tmp_path_factory.mktemp("secured-prometheus")
    ca, other = CA(), CA("unrelated-ca")
    server, client, stranger = (
        ca.issue("localhost", server=True),
        ca.issue("sluiceway", server=False),
        other.issue("stranger", server=False),
    )
    files = write(
        d,
        **{
            "ca.crt": ca.cert,
            "server.crt": server.cert,
            "server.key": server.key,
            "client.crt": client.cert,
            "client.key": client.key,
            "stranger.crt": stranger.cert,
            "stranger.key": stranger.key,
            "password": PASSWORD.encode() + b"\n",
            "wrong-password": b"not-the-password\n",
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
    (d / "prometheus.yml").write_text(yaml.safe_dump({"global": {"scrape_interval": "15s"}}))
    port = free_port()
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
    s = Secured(f"https://127.0.0.1:{port}", files, d)
    auth = s.auth(**s.full())
    allow = UrlAllowList.build("test", [s.url])
    try:
        end = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (d / "prometheus.log").read_text()
            try:
                instant_query(s.url, "vector(1)", allow=allow, timeout=2, auth=auth)
                break
            except PromUnavailable:
                if time.monotonic() > end:
                    raise
                time.sleep(0.2)
        yield s
    finally:
        proc.terminate()
        proc.wait(15)


def _query(s: Secured, auth: PromAuth | None, promql: str = "vector(42)") -> list[dict[str, Any]]:
    return instant_query(s.url, promql, allow=UrlAllowList.build("test", [s.url]), timeout=5, auth=auth)


def test_tls_client_certificate_and_basic_auth_reach_a_prometheus_that_requires_them(secured: Secured) -> None:
    (sample,) = _query(secured, secured.auth(**secured.full()))
    assert sample["value"][1] == "42"


def test_the_scaler_source_reads_through_the_credentials(secured: Secured) -> None:
    allow = UrlAllowList.build("test", [secured.url])
    source = PrometheusSource(allow=allow, auth=secured.auth(**secured.full()))
    assert source.scalar(secured.url, "vector(3)", 5) == 3.0
    bare = PrometheusSource(allow=allow)
    with pytest.raises(Exception, match=r"Prometheus at https://127\.0\.0\.1"):
        bare.scalar(secured.url, "vector(3)", 5)


def test_each_missing_or_wrong_piece_is_refused_without_echoing_secrets(secured: Secured) -> None:
    f = secured.files
    ca_only = {"tls": {"caFile": str(f["ca.crt"])}}
    with_cert = {"tls": {"caFile": str(f["ca.crt"]), "certFile": str(f["client.crt"]), "keyFile": str(f["client.key"])}}
    stranger = {
        "basicAuth": {"username": "sluiceway", "passwordFile": str(f["password"])},
        "tls": {"caFile": str(f["ca.crt"]), "certFile": str(f["stranger.crt"]), "keyFile": str(f["stranger.key"])},
    }
    cases: list[tuple[str, PromAuth | None, str]] = [
        ("no credentials at all (the system CAs do not know the server)", None, "SSL"),
        ("the CA but no client certificate", secured.auth(**ca_only), "Prometheus at"),
        ("a client certificate but no basic auth", secured.auth(**with_cert), "HTTP 401: Prometheus wants credentials"),
        ("the wrong password", secured.auth(**secured.full("wrong-password")), "HTTP 401: Prometheus refused"),
        ("a certificate from another CA", secured.auth(**stranger), "Prometheus at"),
    ]
    for what, auth, expected in cases:
        with pytest.raises(PromUnavailable) as info:
            _query(secured, auth)
        message = str(info.value)
        assert expected in message, (what, message)
        assert PASSWORD not in message and "not-the-password" not in message, (what, message)


class _Gate(http.server.BaseHTTPRequestHandler):
    """A Prometheus-shaped answer only for the expected bearer token and tenant header."""

    seen: list[dict[str, str]] = []
    token = TOKEN

    def do_GET(self) -> None:
        self.seen.append({k: v for k, v in self.headers.items()})
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            self.send_response(401)
            self.end_headers()
            return
        tenant = self.headers.get("X-Scope-OrgID", "")
        body = {
            "status": "success",
            "data": {"resultType": "vector", "result": [{"metric": {"tenant": tenant}, "value": [0, "7"]}]},
        }
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _gate() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gate)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/prometheus"
    finally:
        server.shutdown()
        server.server_close()


def test_bearer_token_and_tenant_header_from_files_and_a_rotated_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    with _gate() as url:
        auth = parse_prom_auth(
            {"prometheus": [{"url": url, "bearerTokenFile": str(token), "headers": {"X-Scope-OrgID": "team-a"}}]}
        )
        allow = UrlAllowList.build("test", [url])
        (sample,) = instant_query(url, "up", allow=allow, timeout=5, auth=auth)
        assert sample["metric"] == {"tenant": "team-a"}
        assert _Gate.seen[-1]["Authorization"] == f"Bearer {TOKEN}"
        # the Secret is rotated: the old token is refused, the file's new one is read at the next query
        _Gate.token = "rotated-SECRET"
        with pytest.raises(PromUnavailable, match="HTTP 401: Prometheus refused the credentials") as info:
            instant_query(url, "up", allow=allow, timeout=5, auth=auth)
        assert TOKEN not in str(info.value)
        token.write_text("rotated-SECRET\n")
        (sample,) = instant_query(url, "up", allow=allow, timeout=5, auth=auth)
        # another address on the allow-list gets no credentials (entries are per URL)
        other = url.rsplit("/", 1)[0]
        with pytest.raises(PromUnavailable, match="wants credentials"):
            instant_query(other, "up", allow=UrlAllowList.build("test", [other]), timeout=5, auth=auth)
        assert "Authorization" not in _Gate.seen[-1]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"prometheus": [{"url": "http://p:9090", "bearerTokenFle": "/x"}]}, "unknown keys ['bearerTokenFle']"),
        ({"prometheus": [{"url": "http://p:9090", "tls": {"caFile": "/x"}}]}, "tls: only for an https:// URL"),
        ({"prometheus": [{"url": "ftp://p"}]}, "prometheus[0].url"),
        ({"prometheus": [{"url": "https://p", "tls": {"certFile": "/x"}}]}, "certFile and keyFile go together"),
        ({"prometheus": [{"url": "https://p", "basicAuth": {"username": "u"}}]}, "passwordFile is required"),
        ({"prometheus": [{"url": "https://p", "headers": {"X-A": "1\r\nEvil: 2"}}]}, "without line breaks"),
        ({"prometheus": [{"url": "https://p", "headers": {"Bad Name": "1"}}]}, "is not an HTTP header name"),
        ({"servers": []}, "the one key 'prometheus'"),
    ],
)
def test_malformed_auth_files_are_refused_naming_the_key(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(PromAuthError) as info:
        parse_prom_auth(doc)
    assert message in str(info.value)


def test_unreadable_or_conflicting_secret_files_are_refused_at_load(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("line-one-SECRET\nline-two-SECRET\n")
    path = tmp_path / "auth.yaml"
    for entry, message in (
        ({"bearerTokenFile": str(tmp_path / "missing")}, "cannot read"),
        ({"bearerTokenFile": str(token)}, "must hold one non-empty line"),
        (
            {"bearerTokenFile": str(token), "basicAuth": {"username": "u", "passwordFile": str(token)}},
            "exclude each other",
        ),
        ({"bearerTokenFile": "token", "headers": {"authorization": "x"}}, "Authorization is set by"),
    ):
        path.write_text(yaml.safe_dump({"prometheus": [{"url": "https://p.example", **entry}]}))
        with pytest.raises(PromAuthError) as info:
            load_prom_auth(path)
        assert message in str(info.value) and str(path) in str(info.value), info.value
        assert "SECRET" not in str(info.value)


def _cli(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'core'}{os.pathsep}{ROOT / 'operator'}")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sluiceway_scaler.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            "-1",
            *args,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_scaler_cli_loads_the_auth_file_and_stops_on_a_bad_one(secured: Secured, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"prometheus": [{"url": secured.url, "bearerTokenFile": str(tmp_path / "no")}]}))
    proc = _cli("--allowed-prometheus", secured.url, "--prometheus-auth-file", str(bad))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert str(bad) in out and "cannot read" in out, out
    good = tmp_path / "good.json"  # JSON is YAML: either works
    good.write_text(json.dumps({"prometheus": [{"url": secured.url, **secured.full()}]}))
    proc = _cli("--allowed-prometheus", secured.url, "--prometheus-auth-file", str(good))
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        while not any("Prometheus credentials" in ln for ln in lines):
            lines.append(proc.stdout.readline())
            assert lines[-1] and len(lines) < 20, lines
    finally:
        proc.terminate()
        lines.append(proc.communicate(timeout=15)[0])
    out = "".join(lines)
    assert f"{secured.url} (basic; ca; client-cert)" in out, out
    assert PASSWORD not in out


def test_the_planner_reads_a_prometheus_that_requires_credentials(secured: Secured, tmp_path: Path) -> None:
    """`sluiceway plan --prometheus URL --prometheus-auth-file F`: the same credentials file as the scaler's."""
    auth_file = tmp_path / "auth.yaml"
    auth_file.write_text(yaml.safe_dump({"prometheus": [{"url": secured.url, **secured.full()}]}))
    base = ["sluiceway", "plan", "--target-wait-p95", "500ms", "--prometheus", secured.url,
            "--inference-service", "nothing-here", "--namespace", "none"]
    without = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert without.returncode == 2 and "error:" in without.stderr, without
    with_auth = subprocess.run([*base, "--prometheus-auth-file", str(auth_file)], capture_output=True, text=True,
                               timeout=60)
    out = with_auth.stdout + with_auth.stderr
    print(f"planner without credentials: {without.stderr.strip()!r}; with them: {out.strip()[:200]!r}")
    assert "Prometheus had no data" in out, out  # it reached Prometheus, which knows no such service
    assert PASSWORD not in out and PASSWORD not in without.stderr
