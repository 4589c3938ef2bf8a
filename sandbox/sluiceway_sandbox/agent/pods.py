"""One worker thread per Pod bound to the node: network namespace, volumes, containers, probes,
restarts, status, and graceful termination (preStop, SIGTERM, grace period, SIGKILL)."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import logging
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..kubeclient import Kube, KubeError
from ..layout import Layout
from ..netns import NetworkError, pod_network_down, pod_network_up
from ..services import hosts_file
from ..state import read_pid
from . import runtime
from .envvars import EnvError, build_env, decode_secret, expand_all
from .images import ImageError, Images
from .probes import ProbeTracker, Result, resolve_port, run_probe
from .volumes import Mount, VolumeError, materialise, mounts_for

log = logging.getLogger("sluiceway.sandbox.agent")
JSON = dict[str, Any]
#: How often configMap, secret, downwardAPI and projected volumes are synced with the API (the
#: kubelet's periodic sync, issue 22): a changed Secret reaches a running pod's files within this
#: plus one API read. The kubelet takes up to its sync period (1 min) plus its cache TTL; the
#: sandbox uses 10 s so that a key rotation test waits seconds, not minutes. ``--volume-sync-seconds``.
VOLUME_SYNC_SECONDS = 10.0
#: The kubelet's default ``terminationMessagePath`` and the most of it a status carries.
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_MESSAGE_MAX = 4096
#: Log lines ``FallbackToLogsOnError`` takes (the kubelet: 80 lines, at most 2048 bytes).
FALLBACK_LINES, FALLBACK_BYTES = 80, 2048
#: How long a projected ServiceAccount token is reused before a new one is requested (tokens are
#: valid about an hour; the kubelet renews at 80% of their life).
TOKEN_REFRESH_SECONDS = 600.0


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def termination_message(spec: JSON, message_file: Path | None, log: Path, exit_code: int) -> str:
    """What a container left at its ``terminationMessagePath`` (the file bound there, at most
    :data:`TERMINATION_MESSAGE_MAX` bytes), or with ``FallbackToLogsOnError`` and a failure and an
    empty file, the tail of its log: the kubelet's ``terminated.message``."""
    text = ""
    if message_file is not None:
        with contextlib.suppress(OSError), open(message_file, "rb") as fh:
            text = fh.read(TERMINATION_MESSAGE_MAX).decode(errors="replace")
    if not text and exit_code != 0 and spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
        with contextlib.suppress(OSError), open(log, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - FALLBACK_BYTES))
            tail = fh.read().decode(errors="replace").splitlines()[-FALLBACK_LINES:]
        text = "\n".join(tail)[-FALLBACK_BYTES:] if tail else ""
    return text


@dataclass
class NodeContext:
    """What every pod worker shares."""

    layout: Layout
    kube: Kube
    images: Images
    allocatable: Mapping[str, str]
    allocate_ip: Callable[[str, str | None], str]
    release_ip: Callable[[str], None]
    backoff_cap: float = 20.0
    #: (layout, pod uid, ip) -> netns name, and its undo: injected so tests can run without root
    network_up: Callable[[Layout, str, str], str] = pod_network_up
    network_down: Callable[[str], None] = pod_network_down
    #: seconds between volume syncs of a running pod (:data:`VOLUME_SYNC_SECONDS`)
    volume_sync_seconds: float = VOLUME_SYNC_SECONDS


@dataclass
class Container:
    spec: JSON
    init: bool = False
    proc: subprocess.Popen[bytes] | None = None
    pid_file: Path | None = None
    #: the file bound at ``terminationMessagePath`` (emptied at each start)
    message_file: Path | None = None
    log_file: Path | None = None
    started_at: str | None = None
    started_mono: float = 0.0
    restarts: int = 0
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    terminated: JSON | None = None
    last_terminated: JSON | None = None
    ready: bool = False
    started: bool = False
    backoff_until: float = 0.0
    probe_killed: bool = False  # killed by a failing liveness/startup probe: restart unless Never
    probes: dict[str, ProbeTracker] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def named_ports(self) -> dict[str, int]:
        return {p["name"]: int(p["containerPort"]) for p in self.spec.get("ports") or [] if p.get("name")}

    def status(self) -> JSON:
        st: JSON
        if self.proc is not None and self.proc.poll() is None:
            st = {"running": {"startedAt": self.started_at}}
        elif self.terminated is not None and self.waiting is None:
            st = {"terminated": self.terminated}
        else:
            reason, message = self.waiting or ("ContainerCreating", "")
            st = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        out: JSON = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restarts,
            "started": self.started,
            "state": st,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        if self.proc is not None:
            out["containerID"] = f"sandbox://{self.proc.pid}"
        return out


class PodWorker(threading.Thread):
    def __init__(self, ctx: NodeContext, pod: JSON) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.ctx = ctx
        self.pod = pod
        self.uid: str = meta["uid"]
        self.ns: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self.dir = ctx.layout.pod_dir(self.uid)
        self.logs = ctx.layout.logs_dir / "pods" / f"{self.ns}_{self.pod_name}_{self.uid[:8]}"
        self.ip: str | None = None
        self.netns: str | None = None
        self.volumes: dict[str, Path] = {}
        self.init = [Container(c, init=True) for c in pod["spec"].get("initContainers") or []]
        self.containers = [Container(c) for c in pod["spec"]["containers"]]
        self.lock = threading.Lock()
        self.gone = threading.Event()  # the Pod object no longer exists
        self.done = threading.Event()
        self.phase = "Pending"
        self.start_time: str | None = None
        self.transitions: dict[str, tuple[str, str]] = {}
        self.last_status: str = ""
        self.report_retry_at = 0.0
        self.setup_error: tuple[str, str] | None = None
        self.setup_ok = False
        self.terminal = False
        #: (namespace, serviceaccount, audience, expiration) -> (token, when requested): a volume
        #: sync every few seconds must not request a token every time
        self._tokens: dict[tuple[str, str, str | None, int], tuple[str, float]] = {}
        self._sync_error: str | None = None

    # --- inputs from the watch -------------------------------------------------------------------
    def update(self, pod: JSON) -> None:
        with self.lock:
            self.pod = pod

    def deleted(self) -> None:
        self.gone.set()

    def _snapshot(self) -> JSON:
        with self.lock:
            return self.pod

    # --- API helpers -----------------------------------------------------------------------------
    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.ns}/pods/{self.pod_name}"

    def lookup(self, kind: str, ns: str, name: str) -> dict[str, str] | None:
        plural = "configmaps" if kind == "configmap" else "secrets"
        obj = self.ctx.kube.get_or_none(f"/api/v1/namespaces/{ns}/{plural}/{name}")
        if obj is None:
            return None
        if kind == "secret":
            return decode_secret(obj.get("data") or {})
        data = dict(obj.get("data") or {})
        for k, v in (obj.get("binaryData") or {}).items():
            data[k] = base64.b64decode(v).decode(errors="replace")
        return data

    def token(self, ns: str, sa: str, audience: str | None, expiration: int, pod: JSON) -> str:
        """A token for a projected volume: the one requested within :data:`TOKEN_REFRESH_SECONDS`,
        else a new one (TokenRequest)."""
        key = (ns, sa, audience, expiration)
        held = self._tokens.get(key)
        now = time.monotonic()
        if held is not None and now - held[1] < TOKEN_REFRESH_SECONDS:
            return held[0]
        tok = self._request_token(ns, sa, audience, expiration)
        self._tokens[key] = (tok, now)
        return tok

    def _request_token(self, ns: str, sa: str, audience: str | None, expiration: int) -> str:
        spec: JSON = {
            "expirationSeconds": max(expiration, 600),
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": self.pod_name, "uid": self.uid},
        }
        if audience:
            spec["audiences"] = [audience]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        out = self.ctx.kube.create(f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token", body)
        return str(out["status"]["token"])

    def event(self, reason: str, message: str, kind: str = "Normal") -> None:
        ts = now_iso()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self.pod_name}.", "namespace": self.ns},
            "involvedObject": {
                "kind": "Pod",
                "namespace": self.ns,
                "name": self.pod_name,
                "uid": self.uid,
                "apiVersion": "v1",
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": "sluiceway-sandbox-agent", "host": self.ctx.layout.node_name},
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "count": 1,
        }
        try:
            self.ctx.kube.create(f"/api/v1/namespaces/{self.ns}/events", body)
        except (KubeError, OSError) as err:
            log.debug("event %s not posted: %s", reason, err)

    # --- the loop --------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._run()
        except Exception:
            log.exception("pod worker %s/%s crashed", self.ns, self.pod_name)
            self._kill_all(0)
        finally:
            self._teardown()
            self.done.set()

    def _deleting(self) -> bool:
        return bool(self._snapshot()["metadata"].get("deletionTimestamp"))

    def _run(self) -> None:
        next_setup = 0.0
        next_refresh = time.monotonic() + self.ctx.volume_sync_seconds
        while not self.gone.is_set():
            if self._deleting():
                self._terminate_gracefully()
                return
            now = time.monotonic()
            if not self.setup_ok and now >= next_setup:
                self._setup()
                next_setup = now + 3.0
            if self.setup_ok and not self.terminal:
                self._step(now)
                if now >= next_refresh:
                    self._refresh_volumes()
                    next_refresh = now + self.ctx.volume_sync_seconds
            self._report()
            self.gone.wait(0.25)
        self._kill_all(0)

    def _setup(self) -> None:
        pod = self._snapshot()
        try:
            if self.netns is None:
                self.ip, self.netns = self._network(pod)
                self.start_time = now_iso()
                self.transitions["PodReadyToStartContainers"] = ("True", now_iso())
                with self.lock:
                    self.pod.setdefault("status", {}).update(
                        podIP=self.ip,
                        podIPs=[{"ip": self.ip}],
                        hostIP=self.ctx.layout.bridge_ip,
                        hostIPs=[{"ip": self.ctx.layout.bridge_ip}],
                    )
                self._report(force=True)
            pod = self._snapshot()
            self.volumes = materialise(self.dir, pod, self.lookup, self.token)
            hf = hosts_file(self.ctx.layout, self.ns)
            if not hf.exists():
                hf.parent.mkdir(parents=True, exist_ok=True)
                hf.write_text("127.0.0.1\tlocalhost\n")
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
            for c in [*self.init, *self.containers]:
                self._argv(c)  # image and config errors surface now, before anything starts
            self.setup_ok = True
            self.setup_error = None
        except (ImageError, EnvError, VolumeError, NetworkError, KubeError, OSError) as err:
            reason = getattr(err, "reason", None) or (
                "CreateContainerConfigError" if isinstance(err, (EnvError, VolumeError)) else "ContainerCreating"
            )
            message = getattr(err, "message", None) or str(err)
            if self.setup_error != (reason, message):
                self.event("Failed", message, "Warning")
                log.warning("%s/%s: %s: %s", self.ns, self.pod_name, reason, message)
            self.setup_error = (reason, message)
            for c in [*self.init, *self.containers]:
                c.waiting = (reason, message)

    def _network(self, pod: JSON) -> tuple[str, str]:
        """Allocate the pod's IP and set its network up as one step (issue 18 item 12): if the setup
        fails, the half-made namespace is removed and the IP released before the error propagates,
        so the next attempt starts from nothing instead of skipping the network with an IP held."""
        ip = self.ctx.allocate_ip(self.uid, (pod.get("status") or {}).get("podIP"))
        try:
            return ip, self.ctx.network_up(self.ctx.layout, self.uid, ip)
        except BaseException:
            self.ctx.network_down(self.uid)
            self.ctx.release_ip(self.uid)
            raise

    def _refresh_volumes(self) -> None:
        """Sync ConfigMap/Secret/downwardAPI/projected volumes with the API, as the kubelet's
        periodic sync does: a volume whose content changed is swapped atomically (``..data``), the
        others are left alone; ServiceAccount tokens are renewed every :data:`TOKEN_REFRESH_SECONDS`.
        A source that cannot be read keeps what the volume held, with one warning per new error."""
        try:
            self.volumes = materialise(self.dir, self._snapshot(), self.lookup, self.token)
            self._sync_error = None
        except (EnvError, VolumeError, KubeError, OSError) as err:
            if str(err) != self._sync_error:
                log.warning("%s/%s: volume sync failed, volumes kept as they are: %s", self.ns, self.pod_name, err)
            self._sync_error = str(err)

    def _argv(self, c: Container) -> runtime.Launch:
        pod = self._snapshot()
        lay = self.ctx.layout
        base = runtime.base_env(
            [str(self.ctx.images.bin_dir)],
            {
                "HOSTNAME": self.pod_name,
                "HOME": "/root",
                "PYTHONUNBUFFERED": "1",
                "KUBERNETES_SERVICE_HOST": lay.kubernetes_service_ip,
                "KUBERNETES_SERVICE_PORT": "443",
                "KUBERNETES_SERVICE_PORT_HTTPS": "443",
                "KUBERNETES_PORT": f"tcp://{lay.kubernetes_service_ip}:443",
                "KUBERNETES_PORT_443_TCP": f"tcp://{lay.kubernetes_service_ip}:443",
                "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
                "KUBERNETES_PORT_443_TCP_PORT": "443",
                "KUBERNETES_PORT_443_TCP_ADDR": lay.kubernetes_service_ip,
            },
        )
        env = build_env(pod, c.spec, base, self.lookup, self.ctx.allocatable)
        command = expand_all(c.spec.get("command") or [], env)
        args = expand_all(c.spec.get("args") or [], env)
        argv = self.ctx.images.argv(c.spec.get("image", ""), command, args)
        return runtime.Launch(argv, env, c.spec.get("workingDir"))

    def _start(self, c: Container, now: float) -> None:
        try:
            spec = self._argv(c)
            mounts: list[Mount] = mounts_for(c.spec, self.volumes)
        except (ImageError, EnvError, VolumeError) as err:
            c.waiting = (getattr(err, "reason", "CreateContainerConfigError"), str(err))
            c.backoff_until = now + 3
            return
        assert self.netns is not None
        c.pid_file = self.dir / f"{c.name}.pid"
        # the termination message: a file of this container's, bound at its path (as the kubelet
        # does), read when it exits
        c.message_file = self.dir / "termination" / c.name
        c.message_file.parent.mkdir(parents=True, exist_ok=True)
        c.message_file.write_bytes(b"")
        path = str(c.spec.get("terminationMessagePath") or TERMINATION_LOG)
        mounts = [*mounts, Mount(c.message_file, path, False)]
        c.log_file = self.logs / f"{c.name}.log"
        c.proc = runtime.launch(
            self.netns,
            spec,
            mounts,
            hosts_file(self.ctx.layout, self.ns),
            self.dir / "resolv.conf",
            c.log_file,
            c.pid_file,
        )
        c.started_at = now_iso()
        c.started_mono = now
        c.waiting = None
        c.terminated = None
        c.ready = False
        c.probe_killed = False
        c.probes = {
            kind: ProbeTracker(c.spec[key], now)
            for kind, key in (
                ("startup", "startupProbe"),
                ("liveness", "livenessProbe"),
                ("readiness", "readinessProbe"),
            )
            if c.spec.get(key)
        }
        c.started = "startup" not in c.probes
        if not c.init and "readiness" not in c.probes:
            c.ready = True
        log.info("%s/%s: started %s (pid %d): %s", self.ns, self.pod_name, c.name, c.proc.pid, spec.argv)
        self.event("Started", f"Started container {c.name}")

    def _exited(self, c: Container, code: int, reason: str | None = None) -> None:
        c.terminated = {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": reason or ("Completed" if code == 0 else "Error"),
            "startedAt": c.started_at,
            "finishedAt": now_iso(),
            "containerID": f"sandbox://{c.proc.pid}" if c.proc else "",
        }
        if c.log_file is not None:
            message = termination_message(c.spec, c.message_file, c.log_file, code)
            if message:
                c.terminated["message"] = message
        c.ready = False
        c.started = False
        c.proc = None
        if c.pid_file is not None:
            with contextlib.suppress(FileNotFoundError):
                c.pid_file.unlink()

    def _restart_allowed(self, c: Container) -> bool:
        policy = self._snapshot()["spec"].get("restartPolicy", "Always")
        code = int((c.terminated or {}).get("exitCode", 1))
        failed = code != 0 or c.probe_killed
        if c.init:
            # an init container that finished is done; a failed one is retried unless Never
            return failed and policy != "Never"
        return bool(policy == "Always" or (policy == "OnFailure" and failed))

    def _step(self, now: float) -> None:
        # init containers first, one at a time, each to completion
        for c in self.init:
            if c.terminated is not None and c.terminated["exitCode"] == 0 and c.proc is None:
                continue
            self._drive(c, now)
            return
        for c in self.containers:
            self._drive(c, now)
        self._update_phase()

    def _drive(self, c: Container, now: float) -> None:
        if c.proc is None:
            if c.terminated is not None and not self._restart_allowed(c):
                return
            if now < c.backoff_until:
                return
            if c.terminated is not None:
                c.last_terminated = c.terminated
                c.restarts += 1
            self._start(c, now)
            return
        code = c.proc.poll()
        if code is not None:
            self._exited(c, code)
            if self._restart_allowed(c):
                # as the kubelet: the run that ended shows in lastState while the restart waits
                c.last_terminated = c.terminated
                delay = min(self.ctx.backoff_cap, 1.0 * 2 ** min(c.restarts, 6))
                c.backoff_until = now + delay
                c.waiting = ("CrashLoopBackOff", f"back-off {delay:.0f}s restarting failed container={c.name}")
            return
        self._probe(c, now)

    def _probe(self, c: Container, now: float) -> None:
        assert self.ip is not None and c.proc is not None
        named = c.named_ports()
        start = c.probes.get("startup")
        if start is not None and not c.started:
            if start.due(now):
                verdict = start.record(run_probe(start.probe, self.ip, named, c.proc.pid), time.monotonic())
                if verdict is True:
                    c.started = True
                elif verdict is False:
                    self._kill_for_restart(c, "startup", start.last_message)
            return
        live = c.probes.get("liveness")
        if (
            live is not None
            and live.due(now)
            and live.record(run_probe(live.probe, self.ip, named, c.proc.pid), time.monotonic()) is False
        ):
            self._kill_for_restart(c, "liveness", live.last_message)
            return
        ready = c.probes.get("readiness")
        if ready is not None and ready.due(now) and not c.init:
            verdict = ready.record(run_probe(ready.probe, self.ip, named, c.proc.pid), time.monotonic())
            if verdict is not None:
                c.ready = verdict
                if not verdict:
                    self.event("Unhealthy", f"Readiness probe failed: {ready.last_message}", "Warning")

    def _kill_for_restart(self, c: Container, kind: str, message: str) -> None:
        self.event("Unhealthy", f"{kind.capitalize()} probe failed: {message}", "Warning")
        self.event("Killing", f"Container {c.name} failed {kind} probe, will be restarted")
        assert c.proc is not None
        grace = float(self._snapshot()["spec"].get("terminationGracePeriodSeconds", 30))
        rec = read_pid(c.pid_file) if c.pid_file else None
        code = runtime.terminate(c.proc, rec, grace)
        self._exited(c, code)
        c.probe_killed = True
        if self._restart_allowed(c):
            # a probe-killed container restarts (OnFailure included), with the crash back-off
            delay = min(self.ctx.backoff_cap, 1.0 * 2 ** min(c.restarts, 6))
            c.backoff_until = time.monotonic() + delay
            c.waiting = ("CrashLoopBackOff", f"back-off {delay:.0f}s restarting failed container={c.name}")

    def _update_phase(self) -> None:
        cs = self.containers
        policy = self._snapshot()["spec"].get("restartPolicy", "Always")
        all_done = all(c.proc is None and c.terminated is not None for c in cs)
        if all_done and policy != "Always":
            failed = any(c.terminated and (c.terminated["exitCode"] != 0 or c.probe_killed) for c in cs)
            if policy == "Never" or not failed:
                self.phase = "Failed" if failed else "Succeeded"
                self.terminal = True
                return
        if any(c.proc is not None or c.restarts > 0 or c.terminated is not None for c in cs):
            self.phase = "Running"

    # --- status ----------------------------------------------------------------------------------
    def _condition(self, kind: str, ok: bool, reason: str = "") -> JSON:
        value = "True" if ok else "False"
        prev = self.transitions.get(kind)
        if prev is None or prev[0] != value:
            self.transitions[kind] = (value, now_iso())
        cond: JSON = {
            "type": kind,
            "status": value,
            "lastTransitionTime": self.transitions[kind][1],
            "lastProbeTime": None,
        }
        if reason and not ok:
            cond["reason"] = reason
        return cond

    def build_status(self) -> JSON:
        init_done = all(c.terminated is not None and c.terminated["exitCode"] == 0 for c in self.init)
        ready = self.setup_ok and all(c.ready for c in self.containers) and not self._deleting()
        not_ready = [c.name for c in self.containers if not c.ready]
        st: JSON = {
            "phase": self.phase,
            "conditions": [
                self._condition("PodReadyToStartContainers", self.ip is not None),
                self._condition("Initialized", init_done, "ContainersNotInitialized"),
                self._condition("ContainersReady", ready, "ContainersNotReady"),
                self._condition("Ready", ready, "ContainersNotReady"),
            ],
            "containerStatuses": [c.status() for c in self.containers],
            "qosClass": (self._snapshot().get("status") or {}).get("qosClass", "Burstable"),
        }
        if self.init:
            st["initContainerStatuses"] = [c.status() for c in self.init]
        if not ready and not_ready and not self._deleting():
            st["conditions"][3]["message"] = f"containers with unready status: [{' '.join(not_ready)}]"
        if self.ip is not None:
            st.update(
                podIP=self.ip,
                podIPs=[{"ip": self.ip}],
                hostIP=self.ctx.layout.bridge_ip,
                hostIPs=[{"ip": self.ctx.layout.bridge_ip}],
            )
        if self.start_time:
            st["startTime"] = self.start_time
        return st

    def _report(self, force: bool = False) -> None:
        if self.gone.is_set():
            return
        st = self.build_status()
        text = json.dumps(st, sort_keys=True)
        if text == self.last_status and not force:
            return
        if not force and time.monotonic() < self.report_retry_at:
            return
        try:
            self.ctx.kube.request(
                "PATCH", self.path + "/status", {"status": st}, content_type="application/strategic-merge-patch+json"
            )
            self.last_status = text
        except KubeError as err:
            if err.status == 404:
                self.gone.set()
            else:
                log.warning("%s/%s: status update failed: %s", self.ns, self.pod_name, err)
                self.report_retry_at = time.monotonic() + 2.0
        except OSError as err:
            log.warning("%s/%s: status update failed: %s", self.ns, self.pod_name, err)
            self.report_retry_at = time.monotonic() + 2.0

    # --- termination -----------------------------------------------------------------------------
    def _pre_stop(self, c: Container, budget: float) -> None:
        hook = ((c.spec.get("lifecycle") or {}).get("preStop")) or {}
        if not hook or c.proc is None or budget <= 0:
            return
        try:
            if "sleep" in hook:
                time.sleep(min(float(hook["sleep"]["seconds"]), budget))
            elif "exec" in hook:
                subprocess.run(
                    ["nsenter", "-t", str(c.proc.pid), "-n", "-m", "--", *hook["exec"]["command"]],
                    capture_output=True,
                    timeout=budget,
                    check=False,
                )
            elif "httpGet" in hook and self.ip is not None:
                hg = hook["httpGet"]
                port = resolve_port(hg["port"], c.named_ports())
                url = f"http://{hg.get('host') or self.ip}:{port}{hg.get('path') or '/'}"
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(url, timeout=budget).close()
        except (subprocess.TimeoutExpired, ValueError, OSError) as err:
            self.event("FailedPreStopHook", f"PreStop hook of {c.name} failed: {err}", "Warning")

    def _stop_container(self, c: Container, deadline: float) -> None:
        if c.proc is None:
            return
        self._pre_stop(c, deadline - time.monotonic())
        rec = read_pid(c.pid_file) if c.pid_file else None
        code = runtime.terminate(c.proc, rec, deadline - time.monotonic())
        self._exited(c, code)

    def _terminate_gracefully(self) -> None:
        meta = self._snapshot()["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self._snapshot()["spec"].get("terminationGracePeriodSeconds", 30)
        deadline = time.monotonic() + float(grace)
        running = [c for c in [*self.init, *self.containers] if c.proc is not None]
        if running:
            self.event("Killing", f"Stopping containers {', '.join(c.name for c in running)} (grace {grace}s)")
        self._report()
        threads = [threading.Thread(target=self._stop_container, args=(c, deadline)) for c in running]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._report()
        self._teardown()
        with contextlib.suppress(KubeError, OSError):
            self.ctx.kube.delete(
                self.path,
                {
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": self.uid},
                },
            )
        self.gone.set()

    def _kill_all(self, grace: float) -> None:
        for c in [*self.init, *self.containers]:
            if c.proc is not None:
                rec = read_pid(c.pid_file) if c.pid_file else None
                self._exited(c, runtime.terminate(c.proc, rec, grace))

    def _teardown(self) -> None:
        self._kill_all(0)
        if self.ip is not None:
            self.ctx.network_down(self.uid)
            self.ctx.release_ip(self.uid)
            self.ip = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def summary(self) -> Result:
        return Result(self.setup_ok, f"{self.ns}/{self.pod_name} {self.phase} ip={self.ip}")
