"""A real S3-compatible store for the tests: s3proxy (Maven Central, ``tools/build-s3.sh``) on its
filesystem backend, a Java process that checks SigV4 signatures.

Shared by the pod's fetch tests (on loopback) and the sandbox's model-store tests (on the sandbox
bridge). :class:`S3Store` starts, kills and restarts the server on the same data; ``request`` signs
the upload side. Not thread-safe: one test thread drives it.
"""

from __future__ import annotations

import datetime as dt
import http.client
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from podtools import ROOT
from sluiceway_pod.fetch import Credentials, sigv4_headers

#: How long s3proxy may take to answer its first request (a JVM start on a loaded 2-core machine).
START_SECONDS = 90.0


def s3proxy_jar() -> str:
    """The s3proxy jar's path, or a skip that names what is missing."""
    if shutil.which("java") is None:
        pytest.skip("needs java (17+) to run s3proxy: apt-get install openjdk-17-jre-headless")
    out = subprocess.run([str(ROOT / "tools" / "build-s3.sh"), "--dir"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.skip(f"the s3proxy jar is not fetched: run tools/build-s3.sh (looked for {out.stdout.strip()})")
    return out.stdout.strip()


@dataclass
class S3Store:
    """s3proxy on ``host:port`` (filesystem backend under ``root``); restartable on the same data."""

    jar: str
    root: Path
    host: str
    port: int
    creds: Credentials
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        """Start the server and wait until it answers; a server that does not is killed and the test
        fails with the end of its log."""
        conf = self.root / "s3proxy.conf"
        conf.write_text(
            f"s3proxy.endpoint={self.endpoint}\n"
            "s3proxy.authorization=aws-v2-or-v4\n"
            f"s3proxy.identity={self.creds.access_key}\n"
            f"s3proxy.credential={self.creds.secret_key}\n"
            "jclouds.provider=filesystem\n"
            f"jclouds.filesystem.basedir={self.root / 'data'}\n"
        )
        (self.root / "data").mkdir(exist_ok=True)
        log = self.root / "s3proxy.log"
        with log.open("ab") as fh:
            self.proc = subprocess.Popen(
                ["java", "-jar", self.jar, "--properties", str(conf)], stdout=fh, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + START_SECONDS
        last: object = None
        while time.monotonic() < deadline:
            try:
                last = self.request("GET", "/")[0]
                if last in (200, 403):
                    return
            except OSError as err:
                last = err
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.kill()
        pytest.fail(f"s3proxy did not start within {START_SECONDS:.0f} s (last: {last!r}):\n{log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """One SigV4-signed request (the upload side: buckets and objects)."""
        host = f"{self.host}:{self.port}"
        enc = quote(path, safe="/-_.~")
        headers = sigv4_headers(method, host, enc, {}, self.creds, "us-east-1", dt.datetime.now(dt.UTC), body=body)
        conn = http.client.HTTPConnection(host, timeout=60)
        try:
            conn.request(method, enc, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def put_object(self, bucket: str, key: str, body: bytes) -> None:
        status, text = self.request("PUT", f"/{bucket}/{key}", body)
        assert status == 200, text[:500]
