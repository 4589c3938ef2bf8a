"""The kube-proxy stand-in's pure parts: DNAT rules from Services + EndpointSlices, hosts files."""

from __future__ import annotations

from pathlib import Path

from sluiceway_sandbox.layout import Layout
from sluiceway_sandbox.services import build_hosts, build_rules

LAYOUT = Layout(state_dir=Path("/nonexistent"))


def svc(ns: str, name: str, ip: str, *ports: tuple[str, int]) -> dict:  # type: ignore[type-arg]
    return {
        "metadata": {"namespace": ns, "name": name},
        "spec": {"clusterIP": ip, "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports]},
    }


def eps(ns: str, name: str, port: tuple[str, int], *endpoints: tuple[str, bool]) -> dict:  # type: ignore[type-arg]
    return {
        "metadata": {"namespace": ns, "name": f"{name}-abc", "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": port[0], "port": port[1], "protocol": "TCP"}],
        "endpoints": [{"addresses": [a], "conditions": {"ready": r}} for a, r in endpoints],
    }


def test_rules_spread_over_ready_endpoints_only() -> None:
    services = [svc("d", "ramp", "198.19.0.20", ("http", 8080), ("metrics", 9091))]
    slices = [eps("d", "ramp", ("http", 8080), ("198.18.1.1", True), ("198.18.1.2", True), ("198.18.1.3", False))]
    rules = build_rules(LAYOUT, services, slices)
    dnat = [r for r in rules if "DNAT" in r]
    assert len(dnat) == 2  # the unready endpoint gets no traffic; metrics has no endpoints
    assert "--probability 0.50000" in dnat[0] and "198.18.1.1:8080" in dnat[0]
    assert "statistic" not in dnat[1] and "198.18.1.2:8080" in dnat[1]
    assert all("-d 198.19.0.20/32 -p tcp -m tcp --dport 8080" in r for r in dnat)
    assert rules[0].endswith("-j MARK --set-xmark 0x4000/0x4000")  # pod->service traffic masqueraded


def test_headless_and_udp_services_are_skipped() -> None:
    headless = svc("d", "h", "None", ("http", 80))
    udp = svc("d", "u", "198.19.0.30", ("dns", 53))
    udp["spec"]["ports"][0]["protocol"] = "UDP"
    rules = build_rules(LAYOUT, [headless, udp], [eps("d", "u", ("dns", 53), ("198.18.1.1", True))])
    assert [r for r in rules if "DNAT" in r] == []


def test_hosts_names_short_name_only_in_own_namespace() -> None:
    services = [svc("a", "api", "198.19.0.5", ("http", 80)), svc("b", "db", "198.19.0.6", ("pg", 5432))]
    text = build_hosts("a", services, "cluster.local")
    assert "198.19.0.5\tapi.a.svc.cluster.local api.a.svc api.a api\n" in text
    assert "198.19.0.6\tdb.b.svc.cluster.local db.b.svc db.b\n" in text
    assert text.startswith("127.0.0.1\tlocalhost")
