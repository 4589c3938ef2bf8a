"""``python -m sluiceway_sandbox.agent``: run the node agent (the sandbox's kubelet stand-in)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from ..kubeclient import Kube, KubeError
from ..layout import Layout, layout_for
from ..netns import (
    NetworkError,
    index_of_ip,
    ip_for_index,
    list_netns,
    next_free_index,
    pod_address_count,
    pod_network_down,
)
from ..state import recorded, stop
from .images import Images
from .node import build_node, capacity, register, renew_lease
from .pods import VOLUME_SYNC_SECONDS, NodeContext, PodWorker

log = logging.getLogger("sluiceway.sandbox.agent")
JSON = dict[str, Any]


class Agent:
    def __init__(
        self,
        layout: Layout,
        cpu: int,
        gpus: int,
        binaries: dict[str, Path],
        version: str,
        volume_sync_seconds: float = VOLUME_SYNC_SECONDS,
    ) -> None:
        self.layout = layout
        self.kube = Kube.as_identity(layout, "node")
        self.cap = capacity(cpu, gpus)
        self.version = version
        self.workers: dict[str, PodWorker] = {}
        self.ips: dict[str, int] = {}
        #: the index of the last address given: the next goes after it (:func:`next_free_index`)
        self.last_ip = -1
        self.ip_lock = threading.Lock()
        self.stopping = threading.Event()
        self.ctx = NodeContext(
            layout=layout,
            kube=self.kube,
            images=Images(binaries=binaries),
            allocatable=self.cap,
            allocate_ip=self.allocate_ip,
            release_ip=self.release_ip,
            volume_sync_seconds=volume_sync_seconds,
        )

    def allocate_ip(self, uid: str, preferred: str | None = None) -> str:
        """A free pod address, the next after the last given (round the range: a pod never gets the
        address of one just gone, :func:`~sluiceway_sandbox.netns.next_free_index`); ``preferred``
        (the address the Pod already reports, after an agent restart) is kept when free, since a
        Pod's IP never changes."""
        with self.ip_lock:
            if uid not in self.ips:
                used = set(self.ips.values())
                want = index_of_ip(self.layout, preferred) if preferred else None
                if want is not None and want not in used:
                    self.ips[uid] = want
                else:
                    try:
                        self.ips[uid] = next_free_index(used, self.last_ip, pod_address_count(self.layout))
                    except ValueError as err:
                        raise NetworkError(str(err)) from None
                    self.last_ip = self.ips[uid]
            return ip_for_index(self.layout, self.ips[uid])

    def release_ip(self, uid: str) -> None:
        with self.ip_lock:
            self.ips.pop(uid, None)

    def clean_leftovers(self) -> None:
        """Pods of an earlier agent run: stop their processes and namespaces; they restart fresh."""
        for pod_dir in self.layout.pods_dir.glob("*") if self.layout.pods_dir.is_dir() else []:
            for rec in recorded(pod_dir):
                stop(rec, grace=2)
        for ns in list_netns():
            pod_network_down(ns.removeprefix("slw-"))

    def heartbeat(self) -> None:
        last_status = 0.0
        while not self.stopping.is_set():
            try:
                renew_lease(self.kube, self.layout)
                if time.monotonic() - last_status > 60:
                    register(self.kube, build_node(self.layout, self.cap, self.version))
                    last_status = time.monotonic()
            except (KubeError, OSError) as err:
                log.warning("lease/status renewal failed: %s", err)
            self.stopping.wait(10)

    def handle(self, kind: str, pod: JSON) -> None:
        uid = pod["metadata"]["uid"]
        w = self.workers.get(uid)
        if kind == "DELETED":
            if w is not None:
                w.deleted()
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") and w is None:
            return
        if w is None:
            w = PodWorker(self.ctx, pod)
            self.workers[uid] = w
            log.info("pod %s/%s bound here: starting", pod["metadata"]["namespace"], pod["metadata"]["name"])
            w.start()
        else:
            w.update(pod)

    def reap(self) -> None:
        for uid, w in list(self.workers.items()):
            if w.done.is_set():
                del self.workers[uid]

    def watch_pods(self) -> None:
        path = "/api/v1/pods"
        sel = {"fieldSelector": f"spec.nodeName={self.layout.node_name}"}
        while not self.stopping.is_set():
            try:
                listing = self.kube.get(path, sel)
                seen = set()
                for pod in listing["items"]:
                    seen.add(pod["metadata"]["uid"])
                    self.handle("MODIFIED", pod)
                for uid, w in list(self.workers.items()):
                    if uid not in seen:
                        w.deleted()
                rv = listing["metadata"]["resourceVersion"]
                for ev in self.kube.watch(path, dict(sel, resourceVersion=rv), timeout_seconds=120):
                    self.reap()
                    if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self.handle(ev["type"], ev["object"])
                    elif ev["type"] == "ERROR":
                        break
            except (KubeError, OSError, ValueError) as err:
                log.warning("pod watch failed, relisting: %s", err)
                time.sleep(1)

    def shutdown(self) -> None:
        self.stopping.set()
        for w in list(self.workers.values()):
            w.deleted()
        for w in list(self.workers.values()):
            w.join(timeout=15)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="sluiceway-sandbox-agent", description=__doc__)
    ap.add_argument("--state-dir", default=None)
    ap.add_argument("--cpu", type=int, default=32, help="cpu capacity the Node advertises (default 32)")
    ap.add_argument("--gpus", type=int, default=0, help="nvidia.com/gpu capacity the Node advertises")
    ap.add_argument(
        "--binary",
        action="append",
        default=[],
        metavar="IMAGE=PATH",
        help="map an image repository to an executable (KEDA's programs)",
    )
    ap.add_argument("--version", default="v1.34.4-sandbox")
    ap.add_argument(
        "--volume-sync-seconds",
        type=float,
        default=VOLUME_SYNC_SECONDS,
        metavar="SECONDS",
        help="how often ConfigMap/Secret volumes of running pods are synced with the API "
        f"(default {VOLUME_SYNC_SECONDS:g}; the kubelet: its 1 min sync period plus its cache TTL)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s: %(message)s")
    layout = layout_for(args.state_dir)
    binaries = {}
    for item in args.binary:
        image, _, path = item.partition("=")
        binaries[image] = Path(path)
    if not 0.5 <= args.volume_sync_seconds <= 3600:
        ap.error("--volume-sync-seconds must be within 0.5..3600")
    agent = Agent(layout, args.cpu, args.gpus, binaries, args.version, args.volume_sync_seconds)
    agent.clean_leftovers()

    def on_term(signum: int, frame: object) -> None:
        log.info("signal %d: stopping every pod", signum)
        agent.shutdown()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    while True:
        try:
            register(agent.kube, build_node(layout, agent.cap, args.version))
            renew_lease(agent.kube, layout)
            break
        except (KubeError, OSError) as err:
            log.warning("node registration failed, retrying: %s", err)
            time.sleep(1)
    threading.Thread(target=agent.heartbeat, name="heartbeat", daemon=True).start()
    agent.watch_pods()


if __name__ == "__main__":
    main()
