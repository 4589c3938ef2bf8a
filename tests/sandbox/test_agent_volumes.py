"""Volume materialisation and mount ordering."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from sluiceway_sandbox.agent.runtime import host_paths, order_mounts, prologue
from sluiceway_sandbox.agent.volumes import Mount, VolumeError, materialise, mounts_for

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
