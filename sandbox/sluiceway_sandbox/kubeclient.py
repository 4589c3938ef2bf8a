"""A small, synchronous Kubernetes REST client over urllib3 (client-certificate auth, JSON in and out,
watch streams, server-side apply). The sandbox's processes (agent, proxy, CLI) share it; each
authenticates with its own certificate, so RBAC and the Node authorizer apply to them as in a cluster.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3
import yaml

from .layout import Layout
from .pki import pair

JSON = dict[str, Any]


class KubeError(Exception):
    """An API call answered with a non-2xx status."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        self.status = status
        try:
            self.reason = str(json.loads(body).get("reason", ""))
            message = str(json.loads(body).get("message", body))
        except ValueError:
            self.reason, message = "", body
        super().__init__(f"{method} {path} -> {status}: {message[:500]}")


class Kube:
    def __init__(self, server: str, ca: Path, cert: Path, key: Path, timeout: float = 30.0) -> None:
        self.server = server.rstrip("/")
        self.http = urllib3.PoolManager(
            maxsize=8, ca_certs=str(ca), cert_file=str(cert), key_file=str(key), cert_reqs="CERT_REQUIRED"
        )
        self.timeout = timeout
        self._discovery: dict[tuple[str, str], tuple[str, bool]] = {}
        self._lock = threading.Lock()

    @classmethod
    def as_identity(cls, layout: Layout, stem: str) -> Kube:
        """A client authenticated with ``<state>/pki/<stem>.crt`` (admin, node, proxy, ...)."""
        p = pair(layout, stem)
        return cls(layout.apiserver_url, layout.ca_cert, p.cert, p.key)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self._do(method, path, data, query, content_type, timeout)

    def _do(
        self,
        method: str,
        path: str,
        data: bytes | None,
        query: dict[str, str] | None,
        ctype: str,
        timeout: float | None,
    ) -> Any:
        url = self.server + path
        if query:
            url += "?" + urlencode(query)
        resp = self.http.request(
            method,
            url,
            body=data,
            headers={"Content-Type": ctype, "Accept": "application/json"},
            timeout=timeout or self.timeout,
            retries=False,
        )
        text = resp.data.decode(errors="replace")
        if resp.status >= 300:
            raise KubeError(resp.status, method, path, text)
        return json.loads(text) if text else None

    def get(self, path: str, query: dict[str, str] | None = None) -> Any:
        return self.request("GET", path, query=query)

    def get_or_none(self, path: str) -> Any:
        try:
            return self.get(path)
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    def create(self, path: str, body: JSON) -> Any:
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: JSON) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: JSON | None = None) -> Any:
        try:
            return self.request("DELETE", path, body)
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    def watch(self, path: str, query: dict[str, str], timeout_seconds: int = 60) -> Iterator[JSON]:
        """Yield watch events (``{"type": ..., "object": ...}``) until the server closes the stream."""
        q = dict(query, watch="true", timeoutSeconds=str(timeout_seconds), allowWatchBookmarks="true")
        url = self.server + path + "?" + urlencode(q)
        resp = self.http.request(
            "GET",
            url,
            preload_content=False,
            timeout=urllib3.Timeout(connect=10, read=timeout_seconds + 15),
            retries=False,
        )
        try:
            if resp.status >= 300:
                raise KubeError(resp.status, "WATCH", path, resp.read().decode(errors="replace"))
            buf = b""
            for chunk in resp.stream(4096, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.release_conn()

    # --- server-side apply of arbitrary manifests -------------------------------------------------
    def _resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        key = (api_version, kind)
        with self._lock:
            if key in self._discovery:
                return self._discovery[key]
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        for r in self.get(base).get("resources", []):
            if "/" not in r["name"]:
                with self._lock:
                    self._discovery[(api_version, r["kind"])] = (r["name"], bool(r["namespaced"]))
        with self._lock:
            if key not in self._discovery:
                raise KubeError(404, "DISCOVER", base, f"no resource of kind {kind} in {api_version}")
            return self._discovery[key]

    def path_of(self, obj: JSON, with_name: bool = True) -> str:
        api_version, kind = obj["apiVersion"], obj["kind"]
        plural, namespaced = self._resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        meta = obj.get("metadata", {})
        if namespaced:
            base += f"/namespaces/{meta.get('namespace') or 'default'}"
        base += f"/{plural}"
        return f"{base}/{meta['name']}" if with_name else base

    def apply(self, obj: JSON, manager: str = "sluiceway-sandbox") -> Any:
        """Server-side apply (create or update), forcing ownership of the fields it sets."""
        return self.request(
            "PATCH",
            self.path_of(obj),
            yaml.safe_dump(obj).encode(),
            query={"fieldManager": manager, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    def delete_object(self, obj: JSON) -> Any:
        return self.delete(self.path_of(obj))
