"""Service names for pods: the per-namespace hosts files (routing is the real kube-proxy's)."""

from __future__ import annotations

from sluiceway_sandbox.services import build_hosts


def svc(ns: str, name: str, ip: str, *ports: tuple[str, int]) -> dict:  # type: ignore[type-arg]
    return {
        "metadata": {"namespace": ns, "name": name},
        "spec": {"clusterIP": ip, "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports]},
    }


def test_hosts_names_short_name_only_in_own_namespace() -> None:
    services = [svc("a", "api", "198.19.0.5", ("http", 80)), svc("b", "db", "198.19.0.6", ("pg", 5432))]
    text = build_hosts("a", services, "cluster.local")
    assert "198.19.0.5\tapi.a.svc.cluster.local api.a.svc api.a api\n" in text
    assert "198.19.0.6\tdb.b.svc.cluster.local db.b.svc db.b\n" in text
    assert text.startswith("127.0.0.1\tlocalhost")


def test_headless_services_get_no_name() -> None:
    text = build_hosts("a", [svc("a", "h", "None", ("http", 80))], "cluster.local")
    assert "h.a" not in text
