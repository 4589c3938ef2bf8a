"""Issue 22, section 1: ``sluiceway-pod fetch`` from ``http://`` against a real local HTTP server with
``Range`` support (a threaded stdlib server on loopback) that can break a transfer part-way."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sluiceway_pod.fetch import EXIT_CODES

BODY = os.urandom(3 * 1024 * 1024 + 17)


class Store(BaseHTTPRequestHandler):
    """``/model.onnx``: BODY, honouring ``Range: bytes=N-``; the first ``break_first`` GETs send
    half of what they promise and close. ``/secret``: 403. Anything else: 404."""

    break_first = 0
    stall = 0.0  # seconds a broken transfer stays open and silent before it closes
    stall_release = threading.Event()
    served: list[str] = []  # one test at a time uses the class

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/release/"):  # a release URL that sends clients to its CDN
            Store.served.append(f"redirect {self.headers.get('Authorization') is not None}")
            self.send_response(302)
            self.send_header("Location", "/model.onnx?cdn-token=abc")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/secret"):
            self.send_error(403, "Forbidden")
            return
        if not self.path.startswith("/model.onnx"):
            self.send_error(404, "Not Found")
            return
        start = 0
        rng = self.headers.get("Range")
        if rng:
            start = int(rng.removeprefix("bytes=").split("-")[0])
        part = BODY[start:]
        Store.served.append(rng or "full")
        self.send_response(206 if rng else 200)
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(BODY) - 1}/{len(BODY)}")
        self.send_header("Content-Length", str(len(part)))
        self.send_header("ETag", '"v1"')
        self.end_headers()
        if Store.break_first > 0:
            Store.break_first -= 1
            self.wfile.write(part[: len(part) // 2])
            self.wfile.flush()
            if Store.stall > 0:  # a partition: the connection stays open and silent
                Store.stall_release.wait(Store.stall)
            self.close_connection = True
            return
        self.wfile.write(part)


@pytest.fixture
def store() -> Iterator[str]:
    Store.break_first, Store.served, Store.stall = 0, [], 0.0
    Store.stall_release = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Store)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    Store.stall_release.set()
    server.shutdown()
    server.server_close()


def fetch(dest: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "sluiceway_pod.cli", "fetch", "--dest", str(dest), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_a_broken_transfer_resumes_with_range_and_is_verified(store: str, tmp_path: Path) -> None:
    Store.break_first = 2
    digest = hashlib.sha256(BODY).hexdigest()
    out = fetch(tmp_path, "--uri", f"{store}/model.onnx", "--sha256", digest, "--backoff", "0.05",
                "--progress-seconds", "0")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "model.onnx").read_bytes() == BODY
    half = len(BODY) // 2
    assert Store.served == ["full", f"bytes={half}-", f"bytes={half + (len(BODY) - half) // 2}-"]
    assert f"resuming at {half} bytes" in out.stdout and "(verified)" in out.stdout
    assert "MiB (" in out.stdout  # progress lines: done / total MiB (percent) rate
    print(out.stdout.splitlines()[-1])


def test_reasons_and_exit_codes(store: str, tmp_path: Path) -> None:
    cases = [
        (["--uri", f"{store}/missing.onnx"], "no-such-key"),
        (["--uri", f"{store}/secret/model.onnx"], "access-denied"),
        (["--uri", f"{store}/model.onnx", "--sha256", "0" * 64], "digest-mismatch"),
        (["--uri", f"{store}/model.onnx", "--max-bytes", "1000"], "out-of-space"),
        (["--uri", "ftp://example.invalid/model.onnx"], "bad-request"),
    ]
    for args, reason in cases:
        out = fetch(tmp_path / reason, *args)
        assert out.returncode == EXIT_CODES[reason], (reason, out.stderr)
        assert out.stderr.startswith(f"sluiceway-pod fetch: failed ({reason}): "), out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_user_info_and_query_strings_are_never_printed(store: str, tmp_path: Path) -> None:
    host = store.removeprefix("http://")
    out = fetch(tmp_path, "--uri", f"http://admin:pa55word@{host}/secret/m.onnx?X-Amz-Signature=deadbeef&token=t0k3n")
    assert out.returncode == 11, out.stderr
    text = out.stdout + out.stderr
    for leaked in ("pa55word", "admin", "deadbeef", "t0k3n"):
        assert leaked not in text, text


def test_a_store_that_keeps_breaking_gives_up_with_its_reason(store: str, tmp_path: Path) -> None:
    Store.break_first = 10
    out = fetch(tmp_path, "--uri", f"{store}/model.onnx", "--retries", "2", "--backoff", "0.05")
    assert out.returncode == EXIT_CODES["store-unreachable"], out.stderr
    assert "the transfer broke at" in out.stderr and "gave up after 3 attempts" in out.stderr, out.stderr


def test_redirects_are_followed(store: str, tmp_path: Path) -> None:
    host = store.removeprefix("http://")
    digest = hashlib.sha256(BODY).hexdigest()
    out = fetch(tmp_path, "--uri", f"http://u:p@{host}/release/v1/model.onnx", "--sha256", digest)
    assert out.returncode == 0, out.stderr
    assert Store.served == ["redirect True", "full"]
    assert (tmp_path / "model.onnx").read_bytes() == BODY


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by itself (so it is its own CA bundle)."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fetch-test-store")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_pem, key_pem = tmp / "cert.pem", tmp / "key.pem"
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ))
    return cert_pem, key_pem


def test_https_with_a_private_ca(tmp_path: Path) -> None:
    import ssl

    pytest.importorskip("cryptography", reason="needs cryptography to make the test certificate")
    cert, key = _self_signed(tmp_path)
    Store.break_first, Store.served = 0, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Store)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}/model.onnx"
        untrusted = fetch(tmp_path / "a", "--uri", url, "--retries", "3")
        assert untrusted.returncode == EXIT_CODES["store-error"], untrusted.stderr
        assert "TLS certificate not trusted" in untrusted.stderr and "retry" not in untrusted.stdout
        ok = fetch(tmp_path / "b", "--uri", url, "--ca-file", str(cert), "--sha256", hashlib.sha256(BODY).hexdigest())
        assert ok.returncode == 0, ok.stderr
        assert (tmp_path / "b" / "model.onnx").read_bytes() == BODY
    finally:
        server.shutdown()
        server.server_close()


def test_a_stalled_transfer_times_out_and_resumes(store: str, tmp_path: Path) -> None:
    """A store that goes silent mid-body (a network partition, not a reset): the read stalls past
    --timeout, the transfer is retried from where it stopped."""
    Store.break_first, Store.stall = 1, 30.0
    out = fetch(tmp_path, "--uri", f"{store}/model.onnx", "--timeout", "1", "--backoff", "0.05",
                "--sha256", hashlib.sha256(BODY).hexdigest())
    assert out.returncode == 0, out.stderr
    assert "the transfer broke at" in out.stdout and "TimeoutError" in out.stdout, out.stdout
    assert f"resuming at {len(BODY) // 2} bytes" in out.stdout, out.stdout
