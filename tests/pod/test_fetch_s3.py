"""Issue 22, section 1 (the pod's half): ``sluiceway-pod fetch`` against a real S3-compatible server.

The server is s3proxy (Maven Central, ``tools/build-s3.sh``) on its filesystem backend, a real Java
process on loopback that checks SigV4 signatures. A model uploaded to a bucket is fetched and
served; wrong credentials, a missing key, a digest mismatch, a size limit and a server killed
mid-download each end with their own reason and exit status, and the credentials appear nowhere.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netports import free_port
from s3tools import S3Store, s3proxy_jar
from sluiceway_pod.fetch import EXIT_CODES, Credentials

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Store]:
    creds = Credentials("AKID" + secrets.token_hex(8).upper(), "s3cret-" + secrets.token_hex(16))
    server = S3Store(s3proxy_jar(), tmp_path_factory.mktemp("s3"), "127.0.0.1", free_port(), creds)
    server.start()
    status, text = server.request("PUT", "/models")
    assert status == 200, text
    yield server
    server.kill()


def fetch(
    s3: S3Store, dest: Path, *args: str, creds: Credentials | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    c = creds or s3.creds
    env = {**os.environ, "AWS_ACCESS_KEY_ID": c.access_key, "AWS_SECRET_ACCESS_KEY": c.secret_key}
    cmd = [sys.executable, "-m", "sluiceway_pod.cli", "fetch", "--dest", str(dest), "--endpoint", s3.endpoint, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def no_secrets(out: subprocess.CompletedProcess[str], *creds: Credentials) -> None:
    text = out.stdout + out.stderr
    for c in creds:
        assert c.secret_key not in text and c.access_key not in text, text


def test_a_model_uploaded_to_a_bucket_is_fetched_and_served(s3: S3Store, tmp_path: Path) -> None:
    from test_formats_http import assert_fetched_model_serves, make_onnx

    src = tmp_path / "src"
    src.mkdir()
    _, direct = make_onnx(src)
    model = (src / "model.onnx").read_bytes()
    s3.put_object("models", "scorer/v1/model.onnx", model)
    s3.put_object("models", "scorer/v1/meta/labels.txt", b"a\nb\nc\nd\n")
    dest = tmp_path / "mnt" / "models"
    digest = hashlib.sha256(model).hexdigest()
    out = fetch(s3, dest, "--uri", "s3://models/scorer/v1/", "--sha256", f"model.onnx={digest}")
    assert out.returncode == 0, out.stderr
    no_secrets(out, s3.creds)
    assert "model.onnx" in out.stdout and "(verified)" in out.stdout and "fetch: done" in out.stdout
    assert (dest / "meta" / "labels.txt").read_bytes() == b"a\nb\nc\nd\n"
    assert not list(dest.rglob("*.part"))

    again = fetch(s3, dest, "--uri", "s3://models/scorer/v1/")  # the same URI into the same directory
    assert again.returncode == 0 and "already in" in again.stdout, again.stdout + again.stderr

    assert_fetched_model_serves(tmp_path, dest, direct)
    # the cache marker does not hide a digest that no longer matches: it fetches and checks again
    changed = fetch(s3, dest, "--uri", "s3://models/scorer/v1/", "--sha256", "model.onnx=" + "0" * 64)
    assert changed.returncode == EXIT_CODES["digest-mismatch"], changed.stdout + changed.stderr


def test_a_single_object_with_its_digest(s3: S3Store, tmp_path: Path) -> None:
    body = os.urandom(300_000)
    s3.put_object("models", "single/weights.bin", body)
    out = fetch(s3, tmp_path, "--uri", "s3://models/single/weights.bin", "--sha256", hashlib.sha256(body).hexdigest())
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "weights.bin").read_bytes() == body


def test_wrong_credentials_are_access_denied_and_never_printed(s3: S3Store, tmp_path: Path) -> None:
    s3.put_object("models", "denied/model.onnx", b"\x08\x08")
    wrong = Credentials(s3.creds.access_key, "not-the-secret-" + secrets.token_hex(8))
    unknown = Credentials("AKIDUNKNOWN" + secrets.token_hex(4).upper(), "other-" + secrets.token_hex(8))
    for creds in (wrong, unknown):
        for uri in ("s3://models/denied/model.onnx", "s3://models/denied/"):
            out = fetch(s3, tmp_path, "--uri", uri, creds=creds)
            assert out.returncode == EXIT_CODES["access-denied"] == 11, out.stderr
            assert out.stderr.startswith("sluiceway-pod fetch: failed (access-denied): "), out.stderr
            assert len(out.stderr.strip().splitlines()) == 1, out.stderr
            no_secrets(out, creds, s3.creds)


def test_a_missing_key_and_a_missing_bucket_are_no_such_key(s3: S3Store, tmp_path: Path) -> None:
    for uri in ("s3://models/nothing/here.onnx", "s3://models/nothing/", "s3://no-such-bucket/model.onnx"):
        out = fetch(s3, tmp_path, "--uri", uri)
        assert out.returncode == EXIT_CODES["no-such-key"] == 10, (uri, out.stderr)
        assert "failed (no-such-key)" in out.stderr, out.stderr
        no_secrets(out, s3.creds)


def test_a_digest_mismatch_keeps_nothing(s3: S3Store, tmp_path: Path) -> None:
    s3.put_object("models", "tampered/model.onnx", b"\x08\x07tampered")
    out = fetch(s3, tmp_path, "--uri", "s3://models/tampered/model.onnx", "--sha256", "ab" * 32)
    assert out.returncode == EXIT_CODES["digest-mismatch"] == 12, out.stderr
    assert "failed (digest-mismatch): model.onnx: sha256 is " in out.stderr, out.stderr
    assert [p.name for p in tmp_path.iterdir()] == []


def test_a_model_larger_than_max_bytes_is_out_of_space(s3: S3Store, tmp_path: Path) -> None:
    s3.put_object("models", "big/model.bin", b"\x00" * 200_000)
    out = fetch(s3, tmp_path, "--uri", "s3://models/big/", "--max-bytes", "100000")
    assert out.returncode == EXIT_CODES["out-of-space"] == 13, out.stderr
    assert "failed (out-of-space)" in out.stderr and "--max-bytes 100000" in out.stderr, out.stderr


def test_a_store_killed_mid_download_fails_then_the_next_run_resumes(s3: S3Store, tmp_path: Path) -> None:
    body = os.urandom(64 * MIB)  # far more than the socket buffers hold, so the kill cuts the body
    digest = hashlib.sha256(body).hexdigest()
    s3.put_object("models", "slow/model.bin", body)
    args = ["--uri", "s3://models/slow/model.bin", "--sha256", digest, "--retries", "2", "--backoff", "0.2",
            "--timeout", "5", "--progress-seconds", "0.5"]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": s3.creds.access_key, "AWS_SECRET_ACCESS_KEY": s3.creds.secret_key}
    cmd = [sys.executable, "-m", "sluiceway_pod.cli", "fetch", "--dest", str(tmp_path), "--endpoint", s3.endpoint,
           "--limit-rate", str(8 * MIB), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    part = tmp_path / "model.bin.part"
    deadline = time.monotonic() + 60
    while not (part.exists() and part.stat().st_size > 4 * MIB):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    s3.kill()  # SIGKILL: the connection drops mid-body
    try:
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == EXIT_CODES["store-unreachable"] == 14, stderr
        assert stderr.startswith("sluiceway-pod fetch: failed (store-unreachable): "), stderr
        assert "gave up after 3 attempts" in stderr, stderr
        assert "retry 1/2" in stdout and "retry 2/2" in stdout and " MiB (" in stdout, stdout
        kept = part.stat().st_size
        assert 4 * MIB < kept < len(body) - 16 * MIB
    finally:
        s3.start()
    out = fetch(s3, tmp_path, *args)
    assert out.returncode == 0, out.stderr
    assert f"resuming at {kept} bytes" in out.stdout, out.stdout
    assert (tmp_path / "model.bin").read_bytes() == body
    print(f"killed at {kept} of {len(body)} bytes; resumed and verified")


def test_an_unreachable_store_is_retried_then_fails(tmp_path: Path) -> None:
    port = free_port()  # nothing listens
    cmd = [sys.executable, "-m", "sluiceway_pod.cli", "fetch", "--uri", "s3://models/m.onnx", "--dest", str(tmp_path),
           "--endpoint", f"http://127.0.0.1:{port}", "--retries", "1", "--backoff", "0.1",
           "--termination-log", str(tmp_path / "termination-log")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 14, out.stderr
    assert "failed (store-unreachable)" in out.stderr and "gave up after 2 attempts" in out.stderr, out.stderr
    assert (tmp_path / "termination-log").read_text() == out.stderr


def test_credentials_from_a_mounted_secret_directory(s3: S3Store, tmp_path: Path) -> None:
    s3.put_object("models", "secretdir/model.onnx", b"\x08\x09model")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "AWS_ACCESS_KEY_ID").write_text(s3.creds.access_key + "\n")
    (secret / "AWS_SECRET_ACCESS_KEY").write_text(s3.creds.secret_key + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    cmd = [sys.executable, "-m", "sluiceway_pod.cli", "fetch", "--uri", "s3://models/secretdir/", "--dest",
           str(tmp_path / "dest"), "--endpoint", s3.endpoint, "--credentials-dir", str(secret)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "dest" / "model.onnx").read_bytes() == b"\x08\x09model"
    no_secrets(out, s3.creds)
    (secret / "AWS_SECRET_ACCESS_KEY").unlink()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and "need both" in out.stderr, out.stderr
