"""Issue 22, section 1: ``sluiceway-pod fetch --uri oci://…`` against a real OCI registry.

The registry is the distribution project's own (``github.com/distribution/distribution/v3``
cmd/registry, built by ``tools/build-registry.sh``), a real Go process on loopback with filesystem
storage under tmp and a config file written here. Models are pushed with the distribution push API
(POST/PUT blob uploads, PUT manifest) in the layout ``oras push`` writes: one layer per file, named
by its ``org.opencontainers.image.title`` annotation. Auth is tested with the registry's htpasswd
(Basic, bcrypt entries made with the standard library's ``crypt``) and its token auth (Bearer: a
token service here signs ES256 JWTs the registry verifies against a JWKS file). A missing tag,
wrong credentials, a tampered blob, layouts the fetcher refuses and a registry killed mid-download
each end with their own reason and exit status; credentials appear nowhere.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from netports import free_port
from podtools import ROOT
from sluiceway_pod.fetch import EXIT_CODES, MARKER

MIB = 1024 * 1024
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
EMPTY = b"{}"  # the ORAS config blob (application/vnd.oci.empty.v1+json)


def _registry_bin() -> str:
    out = subprocess.run([str(ROOT / "tools" / "build-registry.sh"), "--dir"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"the OCI registry is not built: run tools/build-registry.sh (looked in {out.stdout.strip()})")
    return out.stdout.strip() + "/registry"


def _bcrypt(password: str) -> str:
    """An htpasswd bcrypt entry (libxcrypt's $2b$, through the standard library's crypt)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

    if crypt.METHOD_BLOWFISH not in crypt.methods:
        pytest.skip("this libc's crypt() has no bcrypt: the htpasswd test needs it")
    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))


def _b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


class TokenService:
    """A Bearer token service (the docker token protocol): Basic credentials in, an ES256 JWT out,
    signed with a key the registry trusts through its ``jwks`` file. Threads: one per request."""

    def __init__(self, root: Path, user: str, password: str) -> None:
        from cryptography.hazmat.primitives.asymmetric import ec

        self.key = ec.generate_private_key(ec.SECP256R1())
        nums = self.key.public_key().public_numbers()
        jwk = {"kty": "EC", "crv": "P-256", "kid": "test-key", "alg": "ES256", "use": "sig",
               "x": _b64url(nums.x.to_bytes(32, "big")), "y": _b64url(nums.y.to_bytes(32, "big"))}
        self.jwks = root / "jwks.json"
        self.jwks.write_text(json.dumps({"keys": [jwk]}))
        self.user, self.password = user, password
        self.requests: list[str] = []  # "user scope" of each token request (never the password)
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                q = parse_qs(urlsplit(self.path).query)
                got = self.headers.get("authorization", "")
                want = "Basic " + base64.b64encode(f"{service.user}:{service.password}".encode()).decode()
                service.requests.append(f"{got[:5]} {q.get('scope', [''])[0]}")
                if got != want:  # echoes the credentials it was sent, as some services do: the fetcher scrubs them
                    sent = base64.b64decode(got[6:]).decode() if got.startswith("Basic ") else "none"
                    self.send_response(401)
                    self.send_header("content-type", "application/json")
                    self.end_headers()
                    message = json.dumps({"errors": [{"code": "UNAUTHORIZED", "message": f"bad credentials {sent}"}]})
                    self.wfile.write(message.encode())
                    return
                body = json.dumps({"token": service.sign(q.get("scope", []), q.get("service", [""])[0])}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/token"

    def sign(self, scopes: list[str], audience: str) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        access = []
        for s in scopes:
            kind, name, actions = s.split(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        claims = {"iss": "sluiceway-test", "sub": self.user, "aud": audience, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": secrets.token_hex(8), "access": access}
        head = {"alg": "ES256", "typ": "JWT", "kid": "test-key"}
        signing = f"{_b64url(json.dumps(head).encode())}.{_b64url(json.dumps(claims).encode())}"
        r, s_ = decode_dss_signature(self.key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing}.{_b64url(r.to_bytes(32, 'big') + s_.to_bytes(32, 'big'))}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Registry:
    binary: str
    root: Path
    port: int
    auth: dict[str, object] = field(default_factory=dict)  # the config's auth section
    push_auth: str | None = None  # the Authorization header the pushes send
    tokens: TokenService | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        conf = {
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.root / "data")}, "delete": {"enabled": True}},
            "http": {"addr": self.host, "secret": "test-" + secrets.token_hex(8)},
            **({"auth": self.auth} if self.auth else {}),
        }
        path = self.root / "config.yml"
        path.write_text(json.dumps(conf))  # YAML is a superset of JSON
        log = (self.root / "registry.log").open("ab")
        self.proc = subprocess.Popen([self.binary, "serve", str(path)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                status, _, _ = self.request("GET", "/v2/", auth=False)
                if status in (200, 401):
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the registry did not start:\n{(self.root / 'registry.log').read_text()[-3000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None, auth: bool = True
    ) -> tuple[int, dict[str, str], bytes]:
        h = dict(headers or {})
        if auth and self.push_auth:
            h["authorization"] = self.push_auth
        conn = http.client.HTTPConnection(self.host, timeout=30)
        try:
            conn.request(method, path, body=body, headers=h)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def bearer_for(self, repo: str) -> None:
        """Push with a token for ``repo`` from the token service (as a client's login would)."""
        assert self.tokens is not None
        self.push_auth = "Bearer " + self.tokens.sign([f"repository:{repo}:pull,push"], "sluiceway-registry")

    def push_blob(self, repo: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        status, headers, text = self.request("POST", f"/v2/{repo}/blobs/uploads/")
        assert status == 202, (status, text)
        loc = urlsplit(headers["location"])
        path = loc.path + "?" + (loc.query + "&" if loc.query else "") + f"digest={digest}"
        status, _, text = self.request("PUT", path, data, {"content-type": "application/octet-stream"})
        assert status == 201, (status, text)
        return digest

    def push_manifest(self, repo: str, ref: str, manifest: dict[str, object], media: str = MANIFEST) -> str:
        body = json.dumps(manifest).encode()
        status, _, text = self.request("PUT", f"/v2/{repo}/manifests/{ref}", body, {"content-type": media})
        assert status == 201, (status, text)
        return "sha256:" + hashlib.sha256(body).hexdigest()

    def push_files(self, repo: str, tag: str, files: dict[str, bytes], **layer_notes: dict[str, str]) -> str:
        """Push ``files`` as ``oras push`` does (one layer each, titled by the file's name)."""
        config = self.push_blob(repo, EMPTY)
        layers = []
        for name, data in files.items():
            notes = {"org.opencontainers.image.title": name, **layer_notes.get(name, {})}
            if notes["org.opencontainers.image.title"] == "":
                del notes["org.opencontainers.image.title"]
            layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": self.push_blob(repo, data),
                           "size": len(data), "annotations": notes})
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "artifactType": "application/vnd.sluiceway.model.v1",
                    "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": config, "size": 2},
                    "layers": layers}
        return self.push_manifest(repo, tag, manifest)

    def blob_file(self, digest: str) -> Path:
        hexd = digest.split(":", 1)[1]
        return self.root / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"


def _start(tmp: Path, auth: dict[str, object] | None = None) -> Registry:
    reg = Registry(_registry_bin(), tmp, free_port(), auth or {})
    reg.start()
    return reg


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = _start(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.kill()


@dataclass(frozen=True)
class Login:
    user: str
    password: str


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, Login]]:
    """A registry with htpasswd auth (Basic)."""
    root = tmp_path_factory.mktemp("locked")
    login = Login("puller-" + secrets.token_hex(4), "pw-" + secrets.token_hex(12))
    (root / "htpasswd").write_text(f"{login.user}:{_bcrypt(login.password)}\n")
    reg = _start(root, {"htpasswd": {"realm": "sluiceway-test", "path": str(root / "htpasswd")}})
    reg.push_auth = "Basic " + base64.b64encode(f"{login.user}:{login.password}".encode()).decode()
    yield reg, login
    reg.kill()


def fetch(
    reg: Registry, ref: str, dest: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("REGISTRY_", "AWS_"))}
    cmd = [sys.executable, "-m", "sluiceway_pod.cli", "fetch", "--uri", f"oci+http://{reg.host}/{ref}",
           "--dest", str(dest), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env={**clean, **(env or {})}, timeout=timeout)


def no_secrets(out: subprocess.CompletedProcess[str], login: Login) -> None:
    text = out.stdout + out.stderr
    basic = base64.b64encode(f"{login.user}:{login.password}".encode()).decode()
    for s in (login.password, login.user, basic):
        assert s not in text, text


def failed(out: subprocess.CompletedProcess[str], reason: str) -> None:
    assert out.returncode == EXIT_CODES[reason], (out.returncode, out.stdout, out.stderr)
    assert out.stderr.startswith(f"sluiceway-pod fetch: failed ({reason}): "), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_an_onnx_model_pushed_as_an_artifact_is_fetched_and_served(registry: Registry, tmp_path: Path) -> None:
    from test_formats_http import assert_fetched_model_serves, make_onnx

    src = tmp_path / "src"
    src.mkdir()
    _, direct = make_onnx(src)
    model = (src / "model.onnx").read_bytes()
    digest = registry.push_files("models/scorer", "v1", {"model.onnx": model, "labels.txt": b"a\nb\nc\nd\n"})
    dest = tmp_path / "mnt" / "models"
    out = fetch(registry, "models/scorer:v1", dest)
    assert out.returncode == 0, out.stderr
    assert f"manifest {digest}, 2 file(s)" in out.stdout, out.stdout
    assert out.stdout.count("(verified)") == 2 and "fetch: done" in out.stdout, out.stdout
    assert (dest / "model.onnx").read_bytes() == model
    assert (dest / "labels.txt").read_bytes() == b"a\nb\nc\nd\n"
    assert json.loads((dest / MARKER).read_text())["manifest"] == digest.split(":")[1]
    assert not list(dest.rglob("*.part*"))

    again = fetch(registry, "models/scorer:v1", dest)  # the tag still names that manifest: a no-op
    assert again.returncode == 0 and "already in" in again.stdout, again.stdout + again.stderr

    assert_fetched_model_serves(tmp_path, dest, direct)

    # pinned by digest, into another directory
    pinned = fetch(registry, f"models/scorer@{digest}", tmp_path / "pinned")
    assert pinned.returncode == 0, pinned.stderr
    assert (tmp_path / "pinned" / "model.onnx").read_bytes() == model
    # the tag moves: the same URI into the same directory fetches the new manifest
    registry.push_files("models/scorer", "v1", {"model.onnx": model, "labels.txt": b"w\nx\ny\nz\n"})
    moved = fetch(registry, "models/scorer:v1", dest)
    assert moved.returncode == 0 and "already in" not in moved.stdout, moved.stdout + moved.stderr
    assert (dest / "labels.txt").read_bytes() == b"w\nx\ny\nz\n"


def test_a_missing_tag_repository_or_digest_is_no_such_key(registry: Registry, tmp_path: Path) -> None:
    registry.push_files("models/present", "v1", {"m.bin": b"\x01\x02"})
    for ref in ("models/present:v2", "models/absent:v1", "models/present@sha256:" + "0" * 64):
        out = fetch(registry, ref, tmp_path)
        failed(out, "no-such-key")
        assert "MANIFEST_UNKNOWN" in out.stderr or "NAME_UNKNOWN" in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_bad_reference_is_a_bad_request(registry: Registry, tmp_path: Path) -> None:
    for ref in ("models/scorer", "Models/scorer:v1", "models/scorer@sha256:abc", "models/../x:v1"):
        failed(fetch(registry, ref, tmp_path), "bad-request")


def test_layouts_the_fetcher_refuses_are_store_errors(registry: Registry, tmp_path: Path) -> None:
    cases = {
        "untitled": ({"m.bin": b"1"}, {"m.bin": {"org.opencontainers.image.title": ""}}, "has no org.opencontainers"),
        "dotdot": ({"..": b"2"}, {}, "is not a plain file name"),
        "slash": ({"sub/m.bin": b"3"}, {}, "is not a plain file name"),
        "absolute": ({"/etc/m.bin": b"4"}, {}, "is not a plain file name"),
        "directory": ({"weights": b"5"}, {"weights": {"io.deis.oras.content.unpack": "true"}}, "directory archive"),
    }
    for repo, (files, notes, says) in cases.items():
        registry.push_files(f"bad/{repo}", "v1", files, **notes)
        out = fetch(registry, f"bad/{repo}:v1", tmp_path / repo)
        failed(out, "store-error")
        assert says in out.stderr, out.stderr
        assert not (tmp_path / repo).exists() or list((tmp_path / repo).iterdir()) == []
    # an index names manifests, not files
    one = registry.push_files("bad/index", "one", {"m.bin": b"6"})
    size = registry.request("HEAD", f"/v2/bad/index/manifests/{one}")[1]["content-length"]
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"mediaType": MANIFEST, "digest": one, "size": int(size)}]}
    registry.push_manifest("bad/index", "v1", index, "application/vnd.oci.image.index.v1+json")
    out = fetch(registry, "bad/index:v1", tmp_path / "index")
    failed(out, "store-error")
    assert "names an index" in out.stderr, out.stderr


def test_a_blob_tampered_on_the_registrys_disk_is_a_digest_mismatch_and_nothing_is_kept(
    registry: Registry, tmp_path: Path
) -> None:
    body = os.urandom(200_000)
    registry.push_files("models/tampered", "v1", {"model.bin": body})
    blob = registry.blob_file("sha256:" + hashlib.sha256(body).hexdigest())
    blob.write_bytes(bytes(b ^ 0xFF for b in body[:16]) + body[16:])  # same size, other bytes
    out = fetch(registry, "models/tampered:v1", tmp_path)
    failed(out, "digest-mismatch")
    assert "model.bin: sha256 is " in out.stderr and "(the manifest's digest)" in out.stderr, out.stderr
    assert [p.name for p in tmp_path.iterdir()] == []  # no file, no .part, no marker


def test_basic_auth_from_a_mounted_secret_and_wrong_credentials(
    locked: tuple[Registry, Login], tmp_path: Path
) -> None:
    reg, login = locked
    reg.push_files("private/model", "v1", {"model.bin": b"\x08\x09private"})
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "REGISTRY_USERNAME").write_text(login.user + "\n")
    (secret / "REGISTRY_PASSWORD").write_text(login.password + "\n")
    out = fetch(reg, "private/model:v1", tmp_path / "dest", "--credentials-dir", str(secret))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "dest" / "model.bin").read_bytes() == b"\x08\x09private"
    no_secrets(out, login)
    from_env = fetch(reg, "private/model:v1", tmp_path / "env",
                     env={"REGISTRY_USERNAME": login.user, "REGISTRY_PASSWORD": login.password})
    assert from_env.returncode == 0, from_env.stderr
    no_secrets(from_env, login)

    wrong = Login(login.user, "not-the-password-" + secrets.token_hex(6))
    for who in (wrong, Login("nobody-" + secrets.token_hex(4), "other-" + secrets.token_hex(6))):
        out = fetch(reg, "private/model:v1", tmp_path / "denied",
                    env={"REGISTRY_USERNAME": who.user, "REGISTRY_PASSWORD": who.password})
        failed(out, "access-denied")
        no_secrets(out, who)
        no_secrets(out, login)
    anonymous = fetch(reg, "private/model:v1", tmp_path / "denied")
    failed(anonymous, "access-denied")
    assert "needs credentials" in anonymous.stderr, anonymous.stderr
    half = fetch(reg, "private/model:v1", tmp_path / "denied", env={"REGISTRY_USERNAME": login.user})
    failed(half, "bad-request")


def test_bearer_token_auth(tmp_path: Path) -> None:
    pytest.importorskip("cryptography", reason="the test's token service signs JWTs with the cryptography package")
    login = Login("puller-" + secrets.token_hex(4), "pw-" + secrets.token_hex(12))
    tokens = TokenService(tmp_path, login.user, login.password)
    token = {"realm": tokens.realm, "service": "sluiceway-registry", "issuer": "sluiceway-test",
             "jwks": str(tokens.jwks)}
    auth: dict[str, object] = {"token": token}
    try:
        (tmp_path / "reg").mkdir()
        reg = _start(tmp_path / "reg", auth)
    except Exception:
        tokens.stop()
        raise
    reg.tokens = tokens
    try:
        reg.bearer_for("secure/model")
        body = os.urandom(100_000)
        reg.push_files("secure/model", "v1", {"model.bin": body})
        env = {"REGISTRY_USERNAME": login.user, "REGISTRY_PASSWORD": login.password}
        out = fetch(reg, "secure/model:v1", tmp_path / "dest", env=env)
        assert out.returncode == 0, out.stderr
        assert (tmp_path / "dest" / "model.bin").read_bytes() == body
        no_secrets(out, login)
        assert "Basic repository:secure/model:pull" in tokens.requests, tokens.requests

        wrong = {**env, "REGISTRY_PASSWORD": "wrong-" + login.password}
        bad = fetch(reg, "secure/model:v1", tmp_path / "bad", env=wrong)
        failed(bad, "access-denied")
        assert "the token service" in bad.stderr, bad.stderr
        no_secrets(bad, login)
        # anonymous: the token service refuses to issue one (it wants credentials)
        failed(fetch(reg, "secure/model:v1", tmp_path / "anon"), "access-denied")
    finally:
        reg.kill()
        tokens.stop()


def test_a_registry_killed_mid_download_and_restarted_is_resumed(tmp_path: Path) -> None:
    (tmp_path / "reg").mkdir()
    reg = _start(tmp_path / "reg")
    try:
        body = os.urandom(64 * MIB)  # far more than the socket buffers hold, so the kill cuts the body
        reg.push_files("models/big", "v1", {"model.bin": body})
        dest = tmp_path / "dest"
        cmd = [sys.executable, "-m", "sluiceway_pod.cli", "fetch", "--uri", f"oci+http://{reg.host}/models/big:v1",
               "--dest", str(dest), "--limit-rate", str(8 * MIB), "--retries", "8", "--backoff", "0.2",
               "--timeout", "5", "--progress-seconds", "0.5"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        part = dest / "model.bin.part"
        deadline = time.monotonic() + 60
        while not (part.exists() and part.stat().st_size > 4 * MIB):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        reg.kill()  # SIGKILL: the connection drops mid-body
        reg.start()  # the same storage, the same port
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stdout + stderr
        assert "retry 1/8" in stdout and "resuming at " in stdout, stdout
        kept = int(stdout.split("resuming at ", 1)[1].split()[0])
        assert 4 * MIB < kept < len(body), kept
        assert (dest / "model.bin").read_bytes() == body
        print(f"killed at {kept} of {len(body)} bytes; resumed and verified")
    finally:
        reg.kill()


# ---------------------------------------------------------------- pure parts (no registry)


def test_references_parse_and_bad_ones_are_bad_requests() -> None:
    from sluiceway_pod.fetch import FetchError, OciRef, parse_oci

    assert parse_oci("oci://r.example/models/scorer:v1") == OciRef("https", "r.example", "models/scorer", "v1")
    assert parse_oci("oci+http://127.0.0.1:5000/a/b/c@" + "sha256:" + "ab" * 32).scheme == "http"
    assert parse_oci("oci://127.0.0.1:5000/a:v1", insecure=True) == OciRef("http", "127.0.0.1:5000", "a", "v1")
    for bad in ("oci://r.example/models", "oci://r.example/M:v1", "oci://u:p@r.example/a:v1", "oci:///a:v1",
                "oci://r.example/a@sha256:00", "oci://r.example/a:v1#x", "oci://r.example/a:-v1"):
        with pytest.raises(FetchError) as info:
            parse_oci(bad)
        assert info.value.reason == "bad-request", bad


def test_bearer_and_basic_challenges_parse() -> None:
    from sluiceway_pod.fetch import parse_challenge

    scheme, params = parse_challenge(
        'Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push"'
    )
    assert scheme == "bearer"
    assert params == {"realm": "https://auth.example/token", "service": "registry.example",
                      "scope": "repository:a/b:pull,push"}
    assert parse_challenge('Basic realm="sluiceway-test"') == ("basic", {"realm": "sluiceway-test"})
