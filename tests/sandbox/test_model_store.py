"""Issue 22 in the sandbox: a model from a real object store, its failures, and a key rotation under load.

One sandbox for the module (``sluiceway sandbox up --no-keda``, with the operator's drift loop every
10 s so that a rotated tenant Secret is re-rendered within seconds; see the last test). s3proxy, a
real S3-compatible server (``tools/build-s3.sh``, Java 17, filesystem backend, SigV4 checked), runs
on the host side of the sandbox bridge (198.18.0.1, where the pods reach the API server and
Prometheus too); the pods reach it over their default route.

* ``test_a_model_from_the_store_is_fetched_and_served``: an ONNX model made here is uploaded under a
  prefix; an InferenceService with ``storageUri: s3://models/scorer/v1/`` and its credentials Secret
  (labelled ``sluiceway.io/model-credentials``) is rendered by the real operator; the agent runs the
  ``storage-initializer`` init container (``sluiceway-pod fetch``) into the emptyDir, then the pod;
  requests to the pod are answered 200 with the model's own outputs; ``ModelFetched=True``.
* ``test_store_failures_give_their_condition_and_a_visible_reason``: wrong credentials, a missing
  key and a digest mismatch, each its own InferenceService: ``ModelFetched=False`` with the reason,
  the pod's init container backing off with the fetch's line in ``lastState.terminated.message``,
  the model's container never started, and no credential in the status, Events or any log.
* ``test_a_store_killed_mid_download_is_reported_then_resumed``: the store is reached through a
  throttling relay (so the transfer takes seconds); s3proxy is SIGKILLed mid-body:
  ``ModelFetched=False``/``store-unreachable`` after the fetch's retries; s3proxy restarted, the
  next run of the init container resumes from its ``.part`` (``Range``) and the pod serves.
* ``test_a_tenant_key_rotated_under_load_restarts_nothing``: the sandbox demo's service (2
  replicas) under keep-alive clients through its Service (kube-proxy); ``search``'s key replaced in
  its Secret; the pods keep their UIDs, PIDs and restart counts; the old key gets 401 within the
  agent's volume sync period after the operator re-rendered the keys Secret; the new key is
  answered 200; no request but the old key's gets a non-2xx.

Needs root, the sandbox's Go binaries, java and the s3proxy jar: skipped naming the missing one.
Every wait has a deadline and fails with the last state seen.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import http.client
import json
import os
import secrets
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from netports import free_port
from s3tools import S3Store, s3proxy_jar
from sandbox_support import SAMPLE, cli, is_ready, missing, pods, summary, wait_for
from sluiceway_core import metric_names as m
from sluiceway_pod.fetch import Credentials
from sluiceway_sandbox import netns
from sluiceway_sandbox.agent.pods import VOLUME_SYNC_SECONDS
from sluiceway_sandbox.kubeclient import Kube
from sluiceway_sandbox.layout import POD_IMAGE, Layout, layout_for
from sluiceway_sandbox.loadgen import DEFAULT_BODY, service_address

NS = "sluiceway-models"
KEYS_NS = "sluiceway-keys"
BUCKET = "models"
DRIFT_SECONDS = 10  # the operator's drift loop (chart operator.driftInterval) in this module
RELOAD_SECONDS = 2.0  # the pod's reload poll (sluiceway_pod.reload.DEFAULT_PERIOD)
MIB = 1024 * 1024
BIG = 32 * MIB  # the file cut by the kill
RELAY_RATE = 4 * MIB  # bytes/s through the relay: the big file takes 8 s
KILL_AFTER = 6 * MIB  # the store is killed once one response has passed this many bytes
API = "/apis/sluiceway.io/v1alpha1"
#: seconds between one keep-alive client's requests: 9 clients x 2.5/s = 22.5/s, within one demo pod's
#: 40/s even if kube-proxy put every connection on one pod, and alerts' 7.5/s within its 20/s quota
PERIOD = 0.4
#: From the keys Secret's re-render to every pod refusing the old key: the agent's volume sync period,
#: the pod's reload poll, and 3 s for the API read and a loaded machine.
ROTATION_BOUND = VOLUME_SYNC_SECONDS + RELOAD_SECONDS + 3.0

pytestmark = [pytest.mark.slow, pytest.mark.sandbox, pytest.mark.timeout(300)]


# --- the store ---------------------------------------------------------------------------------------


class Relay:
    """A TCP relay on ``host`` to the store, answers throttled to ``rate`` bytes/s per connection;
    ``passed`` is set once one connection has carried ``threshold`` bytes back (the moment to kill
    the store mid-body). Threads: one acceptor, two pumps per connection; all daemons."""

    def __init__(self, host: str, upstream: tuple[str, int], rate: float, threshold: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.upstream, self.rate, self.threshold = upstream, rate, threshold
        self.passed = threading.Event()
        self.most = 0  # the most bytes one connection carried back
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self.sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            up = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            client.close()  # the store is down: the client sees the connection closed
            return
        threading.Thread(target=self._pump, args=(client, up, False), daemon=True).start()
        self._pump(up, client, True)

    def _pump(self, src: socket.socket, dst: socket.socket, down: bool) -> None:
        sent = 0
        start = time.monotonic()
        try:
            while True:
                data = src.recv(64 * 1024)
                if not data:
                    break
                dst.sendall(data)
                if down:
                    sent += len(data)
                    self.most = max(self.most, sent)
                    if sent >= self.threshold:
                        self.passed.set()
                    ahead = sent / self.rate - (time.monotonic() - start)
                    if ahead > 0:
                        time.sleep(ahead)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()


# --- the model ----------------------------------------------------------------------------------------


def make_onnx() -> tuple[bytes, Callable[[np.ndarray], np.ndarray]]:
    """scores = features @ W + b, features [batch, 4] -> scores [batch, 3]; and the same in numpy."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(22)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["features", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["scores"])],
        "scorer",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString(), lambda x: x @ w + b


# --- fixtures -----------------------------------------------------------------------------------------


@dataclass
class Box:
    layout: Layout
    kube: Kube
    store: S3Store | None = None
    bad: Credentials | None = None
    model: bytes = b""
    direct: Callable[[np.ndarray], np.ndarray] | None = None
    secrets_seen: list[str] = field(default_factory=list)  # every credential the tests used


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    why = missing()
    if why:
        pytest.skip(why)
    jar = s3proxy_jar()
    layout = layout_for(tmp_path_factory.mktemp("sandbox"))
    if layout.bridge in netns.list_links(layout.bridge):
        pytest.fail(f"bridge {layout.bridge} exists: another sandbox is up (sluiceway sandbox down first)")
    store: S3Store | None = None
    t0 = time.monotonic()
    try:
        out = cli(layout, "up", "--no-build", "--no-keda", "--timeout", "120",
                  "--set", f"operator.driftInterval={DRIFT_SECONDS}", timeout=200)
        assert out.returncode == 0, f"sandbox up failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        print(f"\nsandbox up in {time.monotonic() - t0:.1f} s")
        kube = Kube.as_identity(layout, "admin")
        creds = Credentials("AKID" + secrets.token_hex(8).upper(), "s3cret-" + secrets.token_hex(16))
        store = S3Store(jar, tmp_path_factory.mktemp("s3"), layout.bridge_ip, free_port(layout.bridge_ip), creds)
        store.start()
        status, text = store.request("PUT", f"/{BUCKET}")
        assert status == 200, text
        model, direct = make_onnx()
        store.put_object(BUCKET, "scorer/v1/model.onnx", model)
        store.put_object(BUCKET, "scorer/v1/meta/labels.txt", b"a\nb\nc\n")
        bad = Credentials(creds.access_key, "wrong-" + secrets.token_hex(16))
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        for name, c in (("store-creds", creds), ("bad-creds", bad)):
            kube.apply(credentials_secret(name, c))
        yield Box(layout, kube, store, bad, model, direct, [creds.secret_key, bad.secret_key, creds.access_key])
    finally:
        if store is not None:
            store.kill()
        down = cli(layout, "down", timeout=150)
        left = netns.list_netns()
        assert down.returncode == 0, down.stderr
        assert left == [], f"network namespaces left after down: {left}"


def credentials_secret(name: str, c: Credentials) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS, "labels": {"sluiceway.io/model-credentials": "true"}},
        "type": "Opaque",
        "stringData": {"AWS_ACCESS_KEY_ID": c.access_key, "AWS_SECRET_ACCESS_KEY": c.secret_key},
    }


def isvc(name: str, uri: str, endpoint: str, secret: str = "store-creds", sha256: str | None = None) -> dict[str, Any]:
    model: dict[str, Any] = {
        "image": f"{POD_IMAGE}:0.1.0",
        "format": "onnx",
        "storageUri": uri,
        "storageSizeLimit": "256Mi",
        "s3": {"endpoint": endpoint, "region": "us-east-1", "pathStyle": True, "credentialsSecret": secret},
    }
    if sha256 is not None:
        model["sha256"] = sha256
    return {
        "apiVersion": "sluiceway.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "model": model,
            "resources": {"gpus": 0, "cpu": "500m", "memory": "512Mi"},
            "concurrency": {"permits": 2},
            "access": {"allowAnonymous": True},
            "autoscaling": {"engine": "none"},
            "replicas": 1,
        },
    }


# --- reading the state --------------------------------------------------------------------------------


def condition(kube: Kube, name: str, kind: str = "ModelFetched", ns: str = NS) -> dict[str, Any]:
    obj = kube.get(f"{API}/namespaces/{ns}/inferenceservices/{name}")
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c.get("type") == kind), {})


def init_status(pod: dict[str, Any]) -> dict[str, Any]:
    inits = (pod.get("status") or {}).get("initContainerStatuses") or []
    return next((s for s in inits if s.get("name") == "storage-initializer"), {})


def service_pods(kube: Kube, name: str, ns: str = NS) -> list[dict[str, Any]]:
    return [p for p in pods(kube, ns) if p["metadata"]["name"].startswith(f"{name}-")
            and not p["metadata"].get("deletionTimestamp")]


def state(kube: Kube, name: str) -> str:
    """What a failed wait prints: the condition and the pods' init/main container states."""
    lines = [f"ModelFetched: {condition(kube, name)}"]
    for p in service_pods(kube, name):
        st = p.get("status") or {}
        lines.append(f"{p['metadata']['name']} {st.get('phase')} init={json.dumps(init_status(p))[:800]} "
                     f"main={json.dumps(st.get('containerStatuses'))[:400]}")
    return "\n".join(lines)


def infer(ip: str, name: str, x: np.ndarray) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"inputs": [{"name": "features", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()
    req = urllib.request.Request(f"http://{ip}:8080/v2/models/{name}/infer", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, {"error": err.read().decode(errors="replace")[:300]}


def ready_pod(kube: Kube, name: str, timeout: float) -> dict[str, Any]:
    def one() -> dict[str, Any] | None:
        ready = [p for p in service_pods(kube, name) if is_ready(p)]
        return ready[0] if ready else None

    pod: dict[str, Any] = wait_for(one, timeout, f"a ready pod of {NS}/{name}", lambda: state(kube, name))
    return pod


def assert_answers(box: Box, name: str, pod: dict[str, Any]) -> None:
    assert box.direct is not None
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 4
    for _ in range(5):
        code, out = infer(pod["status"]["podIP"], name, x)
        assert code == 200, out
        (scores,) = [o for o in out["outputs"] if o["name"] == "scores"]
        assert scores["shape"] == [2, 3], scores
        np.testing.assert_allclose(np.array(scores["data"], dtype=np.float32).reshape(2, 3), box.direct(x),
                                   rtol=1e-5, atol=1e-5)


def all_logs(layout: Layout) -> dict[str, str]:
    return {str(f): f.read_text(errors="replace") for f in layout.logs_dir.rglob("*") if f.is_file()}


def assert_no_credentials(box: Box, names: list[str]) -> None:
    """No credential in the services' status, the namespace's Events, the rendered children, or any
    log the sandbox keeps (the agent's, the control plane's, every container's)."""
    kube = box.kube
    where = {f"status of {n}": json.dumps(kube.get(f"{API}/namespaces/{NS}/inferenceservices/{n}").get("status"))
             for n in names}
    where["events"] = json.dumps(kube.get(f"/api/v1/namespaces/{NS}/events")["items"])
    where["configmaps"] = json.dumps(kube.get(f"/api/v1/namespaces/{NS}/configmaps")["items"])
    where["deployments"] = json.dumps(kube.get(f"/apis/apps/v1/namespaces/{NS}/deployments")["items"])
    where.update(all_logs(box.layout))
    for text in box.secrets_seen:
        hits = [w for w, content in where.items() if text in content]
        assert not hits, f"a store credential appears in: {hits}"


# --- the tests ----------------------------------------------------------------------------------------


def test_a_model_from_the_store_is_fetched_and_served(box: Box) -> None:
    assert box.store is not None
    t0 = time.monotonic()
    box.kube.apply(isvc("scorer", f"s3://{BUCKET}/scorer/v1/", box.store.endpoint))
    pod = ready_pod(box.kube, "scorer", 120)
    t_ready = time.monotonic() - t0
    init = init_status(pod)
    term = (init.get("state") or {}).get("terminated") or {}
    assert term.get("exitCode") == 0 and term.get("reason") == "Completed", init
    assert init.get("restartCount") == 0, init
    assert_answers(box, "scorer", pod)
    cond = wait_for(lambda: (c := condition(box.kube, "scorer")).get("status") == "True" and c, 60,
                    "ModelFetched=True", lambda: state(box.kube, "scorer"))
    logs = all_logs(box.layout)
    fetch_log = "".join(v for k, v in logs.items() if "scorer-" in k and k.endswith("storage-initializer.log"))
    assert "model.onnx" in fetch_log, fetch_log[-2000:]
    print(f"\nscorer: Ready {t_ready:.1f} s after apply (fetch, load, warm-up); 5 requests answered 200 with "
          f"the model's outputs; {cond['reason']}: {cond['message']}")
    print("storage-initializer log:\n  " + "\n  ".join(fetch_log.strip().splitlines()[-4:]))


FAILURES = [
    # name, storageUri, credentials Secret, sha256, the fetch's reason
    ("wrong-creds", f"s3://{BUCKET}/scorer/v1/", "bad-creds", None, "access-denied"),
    ("missing-key", f"s3://{BUCKET}/scorer/v9/", "store-creds", None, "no-such-key"),
    ("bad-digest", f"s3://{BUCKET}/scorer/v1/model.onnx", "store-creds", "0" * 64, "digest-mismatch"),
]


def test_store_failures_give_their_condition_and_a_visible_reason(box: Box) -> None:
    assert box.store is not None
    t0 = time.monotonic()
    for name, uri, secret, sha, _ in FAILURES:
        box.kube.apply(isvc(name, uri, box.store.endpoint, secret, sha))
    lines = []
    for name, _, _, _, reason in FAILURES:
        def failed(name: str = name, reason: str = reason) -> dict[str, Any] | None:
            c = condition(box.kube, name)
            return c if c.get("status") == "False" and f"({reason})" in c.get("message", "") else None

        cond = wait_for(failed, 90, f"ModelFetched=False ({reason}) on {name}", lambda n=name: state(box.kube, n))
        assert cond["reason"] == "ModelFetchFailed", cond
        ready = condition(box.kube, name, "Ready")
        assert ready.get("status") == "False" and ready.get("reason") == "ModelFetchFailed", ready
        (pod,) = service_pods(box.kube, name)
        init = init_status(pod)
        last = (init.get("lastState") or {}).get("terminated") or (init.get("state") or {}).get("terminated") or {}
        assert f"sluiceway-pod fetch: failed ({reason})" in last.get("message", ""), init
        assert last.get("exitCode") not in (None, 0), init
        main = (pod.get("status") or {}).get("containerStatuses") or []
        assert all("running" not in (c.get("state") or {}) for c in main), main  # never started
        init_cond = next(c for c in pod["status"]["conditions"] if c["type"] == "Initialized")
        assert init_cond["status"] == "False", pod["status"]["conditions"]
        lines.append(f"  {name:12} {time.monotonic() - t0:5.1f} s  init {json.dumps(init.get('state') or {})[:70]} "
                     f"restarts={init.get('restartCount')}\n    {cond['message']}")
    assert_no_credentials(box, [n for n, *_ in FAILURES])
    print("\nModelFetched=False on each (seconds after the three were applied), the pod's init container:")
    print("\n".join(lines))
    print(f"no credential ({len(box.secrets_seen)} secrets) in the statuses, Events, ConfigMaps, Deployments "
          f"or {len(all_logs(box.layout))} log files")
    for name, *_ in FAILURES:
        box.kube.delete(f"{API}/namespaces/{NS}/inferenceservices/{name}")


def test_a_store_killed_mid_download_is_reported_then_resumed(box: Box) -> None:
    store = box.store
    assert store is not None
    store.put_object(BUCKET, "big/v1/model.onnx", box.model)
    store.put_object(BUCKET, "big/v1/weights.bin", os.urandom(BIG))  # beside the model: fetched after it (sorted)
    relay = Relay(store.host, (store.host, store.port), RELAY_RATE, KILL_AFTER)
    try:
        t0 = time.monotonic()
        box.kube.apply(isvc("killed", f"s3://{BUCKET}/big/v1/", f"http://{store.host}:{relay.port}"))
        wait_for(relay.passed.is_set, 120, f"{KILL_AFTER} bytes of the big file through the relay",
                 lambda: f"most bytes on one connection: {relay.most}\n{state(box.kube, 'killed')}")
        store.kill()
        t_kill = time.monotonic()
        cut_at = relay.most

        def unreachable() -> dict[str, Any] | None:
            c = condition(box.kube, "killed")
            return c if c.get("status") == "False" and "(store-unreachable)" in c.get("message", "") else None

        cond = wait_for(unreachable, 150, "ModelFetched=False (store-unreachable)", lambda: state(box.kube, "killed"))
        t_cond = time.monotonic()
        (pod,) = service_pods(box.kube, "killed")
        init = init_status(pod)
        last = (init.get("lastState") or {}).get("terminated") or (init.get("state") or {}).get("terminated") or {}
        assert last.get("exitCode") == 14 and "failed (store-unreachable)" in last.get("message", ""), init
        store.start()
        t_back = time.monotonic()
        pod = ready_pod(box.kube, "killed", 150)
        t_ready = time.monotonic()
        assert_answers(box, "killed", pod)
        init = init_status(pod)
        assert ((init.get("state") or {}).get("terminated") or {}).get("exitCode") == 0, init
        log = "".join(v for k, v in all_logs(box.layout).items()
                      if "killed-" in k and k.endswith("storage-initializer.log"))
        assert "weights.bin: resuming at" in log, log[-3000:]
        resumed = next(ln for ln in log.splitlines() if "weights.bin: resuming at" in ln)
        wait_for(lambda: condition(box.kube, "killed").get("status") == "True", 60, "ModelFetched=True",
                 lambda: state(box.kube, "killed"))
        assert_no_credentials(box, ["killed"])
    finally:
        relay.close()
    print(f"\nkilled s3proxy {t_kill - t0:.1f} s after apply, once one response had passed {cut_at} of {BIG} bytes; "
          f"ModelFetched=False {t_cond - t_kill:.1f} s later: {cond['message']}")
    print(f"s3proxy restarted; the pod Ready {t_ready - t_back:.1f} s later after init restarts="
          f"{init.get('restartCount')}; the next run: {resumed.strip()}")
    box.kube.delete(f"{API}/namespaces/{NS}/inferenceservices/killed")


# --- key rotation under load --------------------------------------------------------------------------


@dataclass
class Hit:
    who: str
    t: float  # monotonic
    status: int


class KeepAliveClient(threading.Thread):
    """One keep-alive connection to ``address``, a request every ``period`` seconds with ``key()``;
    every answer recorded (a connection error is status -1 and reconnects)."""

    def __init__(self, who: str, address: str, key: Callable[[], str], period: float, hits: list[Hit],
                 stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.who, self.address, self.key, self.period = who, address, key, period
        self.hits, self.stop_event = hits, stop

    def run(self) -> None:
        host, port = self.address.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        while not self.stop_event.is_set():
            t = time.monotonic()
            try:
                conn.request("POST", "/v2/models/ramp/infer", body=DEFAULT_BODY,
                             headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.key()}"})
                resp = conn.getresponse()
                resp.read()
                status = resp.status
            except (OSError, http.client.HTTPException):
                status = -1
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
            self.hits.append(Hit(self.who, t, status))
            self.stop_event.wait(max(0.0, self.period - (time.monotonic() - t)))
        conn.close()


def reload_applied(ip: str) -> float:
    with urllib.request.urlopen(f"http://{ip}:9091/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith(m.CONFIG_RELOAD + "{") and 'result="applied"' in ln)


def pod_identity(kube: Kube) -> dict[str, tuple[str, str, int]]:
    """name -> (uid, containerID (the PID), restartCount) of the demo's pods."""
    out = {}
    for p in pods(kube, KEYS_NS):
        if p["metadata"].get("deletionTimestamp"):
            continue
        (c,) = (p.get("status") or {}).get("containerStatuses") or [{}]
        out[p["metadata"]["name"]] = (p["metadata"]["uid"], c.get("containerID", ""), int(c.get("restartCount", -1)))
    return out


def poll(check: Callable[[], bool], timeout: float, what: str, detail: Callable[[], str] | None = None) -> float:
    """When ``check`` first held (monotonic), polled every 0.2 s; fails after ``timeout`` with the last
    state seen (``wait_for`` polls every second: too coarse for the times this test reports)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            if check():
                return time.monotonic()
            last = False
        except Exception as err:  # an API or metrics read failing under load: keep polling
            last = err
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}"
                + (f"\n{detail()}" if detail else ""))


def test_a_tenant_key_rotated_under_load_restarts_nothing(box: Box) -> None:
    kube = box.kube
    docs = []
    for d in (d for d in yaml.safe_load_all(SAMPLE.read_text()) if d):
        d = copy.deepcopy(d)
        if d["kind"] == "Namespace":
            d["metadata"]["name"] = KEYS_NS
        else:
            d["metadata"]["namespace"] = KEYS_NS
        if d["kind"] == "InferenceService":
            d["spec"]["autoscaling"] = {"engine": "none"}
            d["spec"]["replicas"] = 2
        docs.append(d)
    for d in docs:
        kube.apply(d)
    keys = {d["metadata"]["name"]: d["stringData"]["key"] for d in docs if d["kind"] == "Secret"}
    old, new = keys["search-key"], "sandbox-search-rotated-" + secrets.token_hex(8)
    wait_for(lambda: len([p for p in pods(kube, KEYS_NS) if is_ready(p)]) == 2, 120, "2 ready pods of ramp",
             lambda: summary(kube, KEYS_NS))
    before = pod_identity(kube)
    assert all(r == 0 for _, _, r in before.values()), before
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods(kube, KEYS_NS) if is_ready(p)}
    reloads0 = {n: reload_applied(ip) for n, ip in ips.items()}
    keys_path = f"/api/v1/namespaces/{KEYS_NS}/secrets/ramp-keys"
    rendered0 = kube.get(keys_path)["metadata"]["resourceVersion"]
    address = service_address(kube, KEYS_NS, "ramp")
    hits: list[Hit] = []
    stop = threading.Event()
    clients = [KeepAliveClient("alerts", address, lambda: keys["alerts-key"], PERIOD, hits, stop) for _ in range(3)]
    clients += [KeepAliveClient("search-old", address, lambda: old, PERIOD, hits, stop) for _ in range(3)]
    for c in clients:
        c.start()
    new_clients: list[KeepAliveClient] = []
    try:
        time.sleep(5.0)  # every connection open, the load steady
        t_secret = time.monotonic()
        kube.merge_patch(f"/api/v1/namespaces/{KEYS_NS}/secrets/search-key", {"stringData": {"key": new}})
        t_rendered = poll(lambda: kube.get(keys_path)["metadata"]["resourceVersion"] != rendered0,
                          DRIFT_SECONDS * 3 + 10, "the operator's re-rendered ramp-keys Secret")
        reloaded: dict[str, float] = {}

        def all_reloaded() -> bool:
            for n, ip in ips.items():
                if n not in reloaded and reload_applied(ip) > reloads0[n]:
                    reloaded[n] = time.monotonic()
            return len(reloaded) == len(ips)

        poll(all_reloaded, ROTATION_BOUND, "every pod's reload of the new keys", lambda: f"reloaded: {reloaded}")
        t_all = max(reloaded.values())
        # the new key, once every pod has it: keep-alive clients of their own
        new_clients = [KeepAliveClient("search-new", address, lambda: new, PERIOD, hits, stop) for _ in range(3)]
        for c in new_clients:
            c.start()
        time.sleep(10.0)
        # straight to each pod too (the Service's connections may favour one)
        direct = {n: (infer_key(ip, old), infer_key(ip, new)) for n, ip in ips.items()}
    finally:
        stop.set()
        for c in clients + new_clients:
            c.join(timeout=15)
    after = pod_identity(kube)
    assert after == before, (before, after)
    assert all(d == (401, 200) for d in direct.values()), direct
    by: dict[str, list[Hit]] = {}
    for h in hits:
        by.setdefault(h.who, []).append(h)
    bad = [h for h in hits if h.who != "search-old" and not 200 <= h.status < 300]
    assert not bad, f"non-2xx answers to keys that were valid: {bad[:10]} ({len(bad)} in all)"
    old_hits = by["search-old"]
    assert all(h.status in (200, 401) for h in old_hits), {h.status for h in old_hits}
    assert all(h.status == 200 for h in old_hits if h.t < t_secret), "the old key refused before the rotation"
    assert all(h.status == 401 for h in old_hits if h.t >= t_all + 0.5), "the old key still accepted after reload"
    first_401 = min(h.t for h in old_hits if h.status == 401)
    # 3 clients x 2.5/s: about 75 new-key requests in the 10 s, and more of alerts over the whole run
    assert len(by.get("search-new", [])) >= 40 and len(by["alerts"]) >= 100, {k: len(v) for k, v in by.items()}
    assert first_401 - t_rendered <= ROTATION_BOUND and t_all - t_rendered <= ROTATION_BOUND
    codes = {who: {s: sum(1 for h in hs if h.status == s) for s in sorted({h.status for h in hs})}
             for who, hs in sorted(by.items())}
    print(f"\nkey rotation under load: {len(clients)} keep-alive clients through {address} (kube-proxy), "
          f"then {len(new_clients)} with the new key; 2 pods")
    print(f"  Secret updated -> operator re-rendered ramp-keys: {t_rendered - t_secret:.1f} s "
          f"(drift loop every {DRIFT_SECONDS} s)")
    print(f"  ramp-keys re-rendered -> each pod's reload seen in its metrics: "
          f"{', '.join(f'{t - t_rendered:.1f} s' for t in sorted(reloaded.values()))} "
          f"(agent sync every {VOLUME_SYNC_SECONDS:g} s + pod reload every {RELOAD_SECONDS:g} s; "
          f"bound {ROTATION_BOUND:g} s)")
    print(f"  ramp-keys re-rendered -> first 401 to the old key: {first_401 - t_rendered:.1f} s; "
          f"every old-key request from {t_all - t_rendered:.1f} s on: 401")
    print(f"  answers by client: {codes}; pods before/after: same UIDs, PIDs, restartCount 0: {sorted(after.values())}")


def infer_key(ip: str, key: str) -> int:
    req = urllib.request.Request(f"http://{ip}:8080/v2/models/ramp/infer", data=DEFAULT_BODY,
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_the_relay_throttles_and_signals(tmp_path: Path) -> None:
    """The relay this module kills the store behind (no sandbox): bytes pass unchanged at about its
    rate, and ``passed`` is set once one answer carried the threshold."""
    payload = os.urandom(600_000)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        conn.recv(16)
        conn.sendall(payload)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    relay = Relay("127.0.0.1", srv.getsockname(), rate=1_000_000, threshold=300_000)
    try:
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as c:
            c.sendall(b"hi")
            got = b""
            while chunk := c.recv(65536):
                got += chunk
        took = time.monotonic() - t0
    finally:
        relay.close()
        srv.close()
    assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
    assert relay.passed.is_set() and relay.most == len(payload)
    assert took >= 0.5, took  # 600 kB at 1 MB/s: not before 0.54 s
