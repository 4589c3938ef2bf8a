"""Volume materialisation (and its periodic sync with the kubelet's ``..data`` layout) and mount ordering."""

from __future__ import annotations

import base64
import os
import shutil
import stat
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from sluiceway_sandbox.agent.images import Images
from sluiceway_sandbox.agent.pods import VOLUME_SYNC_SECONDS, NodeContext, PodWorker
from sluiceway_sandbox.agent.runtime import host_paths, order_mounts, prologue
from sluiceway_sandbox.agent.volumes import Mount, VolumeError, atomic_write, materialise, mounts_for
from sluiceway_sandbox.layout import Layout

POD = {
    "metadata": {"name": "p", "namespace": "ns1", "uid": "u1", "labels": {"a": "b"}},
    "spec": {"serviceAccountName": "runner", "volumes": []},
    "status": {"podIP": "198.18.1.9"},
}
DATA = {
    ("configmap", "ns1", "cfg"): {"config.yaml": "x: 1\n", "other": "o"},
    ("secret", "ns1", "keys"): {"keys.txt": "k1\n"},
    ("configmap", "ns1", "kube-root-ca.crt"): {"ca.crt": "-----CA-----\n"},
}
TOKENS: list[tuple[str, str, str | None, int]] = []


def lookup(kind: str, ns: str, name: str) -> dict[str, str] | None:
    return DATA.get((kind, ns, name))


def token(ns: str, sa: str, audience: str | None, expiration: int, pod: dict) -> str:  # type: ignore[type-arg]
    TOKENS.append((ns, sa, audience, expiration))
    return f"token-for-{ns}-{sa}"


def pod_with(*volumes: dict) -> dict:  # type: ignore[type-arg]
    return {**POD, "spec": {**POD["spec"], "volumes": list(volumes)}}


def test_configmap_secret_emptydir(tmp_path: Path) -> None:
    pod = pod_with(
        {"name": "config", "configMap": {"name": "cfg", "items": [{"key": "config.yaml", "path": "c.yaml"}]}},
        {"name": "keys", "secret": {"secretName": "keys", "defaultMode": 0o400}},
        {"name": "tmp", "emptyDir": {}},
    )
    vols = materialise(tmp_path, pod, lookup, token)
    assert (vols["config"] / "c.yaml").read_text() == "x: 1\n"
    assert not (vols["config"] / "other").exists()  # items select keys
    assert (vols["keys"] / "keys.txt").read_text() == "k1\n"
    assert stat.S_IMODE((vols["keys"] / "keys.txt").stat().st_mode) == 0o400
    assert vols["tmp"].is_dir() and stat.S_IMODE(vols["tmp"].stat().st_mode) == 0o1777


def test_projected_service_account_volume_as_admission_injects_it(tmp_path: Path) -> None:
    TOKENS.clear()
    pod = pod_with(
        {
            "name": "kube-api-access-x",
            "projected": {
                "defaultMode": 0o644,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {
                        "downwardAPI": {
                            "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                        }
                    },
                ],
            },
        }
    )
    vols = materialise(tmp_path, pod, lookup, token)
    d = vols["kube-api-access-x"]
    assert (d / "token").read_text() == "token-for-ns1-runner"
    assert (d / "ca.crt").read_text() == "-----CA-----\n"
    assert (d / "namespace").read_text() == "ns1"
    assert TOKENS == [("ns1", "runner", None, 3607)]


def test_missing_configmap_and_unsupported_types_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(VolumeError, match="configmap ns1/absent not found"):
        materialise(tmp_path, pod_with({"name": "c", "configMap": {"name": "absent"}}), lookup, token)
    optional = pod_with({"name": "c", "configMap": {"name": "absent", "optional": True}})
    assert materialise(tmp_path, optional, lookup, token)["c"].is_dir()
    with pytest.raises(VolumeError, match="persistentVolumeClaim is not supported"):
        materialise(tmp_path, pod_with({"name": "m", "persistentVolumeClaim": {"claimName": "x"}}), lookup, token)


def test_mounts_for_resolves_names_and_subpaths(tmp_path: Path) -> None:
    vols = {"config": tmp_path / "config"}
    c = {"volumeMounts": [{"name": "config", "mountPath": "/etc/x", "readOnly": True, "subPath": "a"}]}
    assert mounts_for(c, vols) == [Mount(tmp_path / "config" / "a", "/etc/x", True)]
    with pytest.raises(VolumeError, match="names no volume"):
        mounts_for({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}, vols)


def test_a_mount_over_tmp_comes_after_mounts_whose_sources_it_would_hide() -> None:
    tmp = Mount(Path("/tmp/state/pods/u/volumes/tmp"), "/tmp", False)
    sa = Mount(Path("/tmp/state/pods/u/volumes/sa"), "/var/run/secrets/kubernetes.io/serviceaccount", True)
    parent, child = Mount(Path("/srv/a"), "/data", False), Mount(Path("/srv/b"), "/data/sub", False)
    ordered = order_mounts([tmp, child, sa, parent])
    assert ordered.index(sa) < ordered.index(tmp)
    assert ordered.index(parent) < ordered.index(child)
    script = prologue([tmp, sa], Path("/tmp/state/hosts/ns1"), None, "/work")
    assert script.index("/etc/hosts") < script.index("mount --bind /tmp/state/pods/u/volumes/tmp /tmp")
    assert "mount -o remount,bind,ro /var/run/secrets/kubernetes.io/serviceaccount" in script
    assert script.rstrip().endswith('exec "$@"') and "cd /work" in script


def test_a_mount_over_tmp_keeps_the_checkout_and_python_visible() -> None:
    """CI may clone the repository (and a virtualenv may live) under /tmp; the chart's pods mount an
    emptyDir on /tmp. The entrypoints must still find the interpreter and the editable checkout."""
    tmp = Mount(Path("/var/lib/state/pods/u/volumes/tmp"), "/tmp", False)
    script = prologue([tmp], None, None, None, ["/tmp/clone", "/usr/local", "/tmp/venv"])
    lines = script.splitlines()
    over = lines.index("mount --bind /var/lib/state/pods/u/volumes/tmp /tmp")
    park = [i for i, ln in enumerate(lines) if ln.endswith(("/run/sluiceway-keep/0", "/run/sluiceway-keep/1"))]
    back = [i for i, ln in enumerate(lines) if "mount --bind /run/sluiceway-keep/" in ln]
    assert len(park) == 2 and all(i < over for i in park)  # parked before the emptyDir hides them
    assert len(back) == 2 and all(i > over for i in back)  # and bound back at their own paths after
    assert "mount --bind /run/sluiceway-keep/0 /tmp/clone" in script
    assert "/usr/local" not in script  # not under any mount: left alone
    assert host_paths() and all(p != "/" for p in host_paths())


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare (util-linux)")
def test_a_read_only_volume_may_hold_another_volumes_mount_point(tmp_path: Path) -> None:
    """As the kubelet allows since Kubernetes 1.10 (API data volumes mounted within each other): the
    operator mounts the gateway's config (a read-only configMap) at /etc/sluiceway and its edge token
    (a read-only secret) at /etc/sluiceway/edge. The prologue, run for real in a private mount
    namespace, binds both and the parent stays read-only."""
    config, edge, root = tmp_path / "config", tmp_path / "edge", tmp_path / "root"
    for d, name in ((config, "gateway.yaml"), (edge, "token")):
        d.mkdir()
        (d / name).write_text(f"{name}-content\n")
    parent, child = str(root / "etc" / "sluiceway"), str(root / "etc" / "sluiceway" / "edge")
    script = prologue([Mount(edge, child, True), Mount(config, parent, True)], None, None, None)
    check = f"cat {parent}/gateway.yaml {child}/token; touch {parent}/x 2>/dev/null && echo writable || echo ro"
    out = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", "sh", "-c", check],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["gateway.yaml-content", "token-content", "ro"], out.stdout


# ---------------------------------------------------------------- issue 22: volumes follow their sources


def _vol(tmp: Path, data: dict[str, str], mode: int = 0o400) -> Path:
    DATA[("secret", "ns1", "rotating")] = dict(data)
    pod = pod_with({"name": "keys", "secret": {"secretName": "rotating", "defaultMode": mode}})
    return materialise(tmp, pod, lookup, token)["keys"]


def test_a_changed_secret_is_swapped_in_with_the_kubelets_data_symlink(tmp_path: Path) -> None:
    d = _vol(tmp_path, {"keys.txt": "old\n", "gone.txt": "g"})
    first = os.readlink(d / "..data")
    assert os.readlink(d / "keys.txt") == "..data/keys.txt" and first.startswith("..")
    assert (d / "keys.txt").read_text() == "old\n"
    _vol(tmp_path, {"keys.txt": "new\n", "added.txt": "a"})
    assert (d / "keys.txt").read_text() == "new\n"  # the same path, the new content
    assert stat.S_IMODE((d / "keys.txt").stat().st_mode) == 0o400
    assert (d / "added.txt").read_text() == "a" and not (d / "gone.txt").exists()
    assert not os.path.lexists(d / "gone.txt")  # the removed key's symlink is gone too
    second = os.readlink(d / "..data")
    assert second != first and not (d / first).exists()  # the old generation is removed
    assert sorted(p.name for p in d.iterdir()) == sorted(["..data", second, "keys.txt", "added.txt"])
    _vol(tmp_path, {"keys.txt": "new\n", "added.txt": "a"})
    assert os.readlink(d / "..data") == second  # unchanged content: nothing rewritten
    assert not atomic_write(d, {"keys.txt": ("new\n", 0o400), "added.txt": ("a", 0o400)})
    assert atomic_write(d, {"keys.txt": ("new\n", 0o440), "added.txt": ("a", 0o400)})  # a mode change counts


def test_a_reader_never_sees_a_half_written_generation(tmp_path: Path) -> None:
    """Two files that always change together: a reader that resolves ``..data`` once and reads both
    sees one generation of both, never one new and one old, nor an empty or missing file."""
    d = _vol(tmp_path, {"a": "0", "b": "0"})
    seen: list[tuple[str, str]] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                gen = os.path.realpath(d / "..data")
                seen.append((Path(gen, "a").read_text(), Path(gen, "b").read_text()))
            except FileNotFoundError:
                continue  # that generation was removed between realpath and open: read again

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(1, 200):
            atomic_write(d, {"a": (str(i) * 50, 0o644), "b": (str(i) * 50, 0o644)})
    finally:
        stop.set()
        t.join(10)
    assert len(seen) > 10
    torn = [(a[:5], b[:5]) for a, b in seen if a != b or not a]
    assert not torn, torn[:5]


def test_a_volume_of_the_old_layout_is_taken_over_and_a_missing_source_keeps_the_files(tmp_path: Path) -> None:
    d = tmp_path / "volumes" / "keys"
    d.mkdir(parents=True)
    (d / "keys.txt").write_text("written in place by an older agent\n")
    _vol(tmp_path, {"keys.txt": "k\n"})
    assert (d / "keys.txt").is_symlink() and (d / "keys.txt").read_text() == "k\n"
    del DATA[("secret", "ns1", "rotating")]
    pod = pod_with({"name": "keys", "secret": {"secretName": "rotating"}})
    with pytest.raises(VolumeError, match="not found"):
        materialise(tmp_path, pod, lookup, token)
    assert (d / "keys.txt").read_text() == "k\n"  # as the kubelet does: the last content stays


def test_bad_volume_paths_are_refused(tmp_path: Path) -> None:
    DATA[("configmap", "ns1", "evil")] = {"k": "v"}
    for path in ("../escape", "..data", "a/../../b", ""):
        pod = pod_with({"name": "c", "configMap": {"name": "evil", "items": [{"key": "k", "path": path}]}})
        with pytest.raises(VolumeError, match="not a plain relative path"):
            materialise(tmp_path, pod, lookup, token)


class _Kube:
    """The API as the pod worker reads it: one Secret that changes, and TokenRequests counted."""

    def __init__(self) -> None:
        self.secret = {"keys.txt": "v1\n"}
        self.tokens = 0

    def get_or_none(self, path: str) -> Any:
        if path == "/api/v1/namespaces/ns1/secrets/keys":
            return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in self.secret.items()}}
        return None

    def create(self, path: str, body: Any) -> Any:
        self.tokens += 1
        return {"status": {"token": f"t{self.tokens}"}}


def test_the_pod_worker_syncs_a_rotated_secret_and_reuses_its_token(tmp_path: Path) -> None:
    kube = _Kube()
    ctx = NodeContext(
        layout=Layout(state_dir=tmp_path),
        kube=kube,  # type: ignore[arg-type]
        images=Images(bin_dir=tmp_path),
        allocatable={"cpu": "4"},
        allocate_ip=lambda uid, preferred: "198.18.1.9",
        release_ip=lambda uid: None,
    )
    assert ctx.volume_sync_seconds == VOLUME_SYNC_SECONDS == 10.0
    pod = {
        "metadata": {"name": "web", "namespace": "ns1", "uid": "uid-1"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox"}],
            "volumes": [
                {"name": "keys", "secret": {"secretName": "keys"}},
                {"name": "sa", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
            ],
        },
    }
    w = PodWorker(ctx, pod)
    w._refresh_volumes()
    keys = w.volumes["keys"] / "keys.txt"
    assert keys.read_text() == "v1\n"
    kube.secret = {"keys.txt": "v2\n"}
    w._refresh_volumes()
    assert keys.read_text() == "v2\n"
    assert (w.volumes["sa"] / "token").read_text() == "t1" and kube.tokens == 1  # not one per sync
