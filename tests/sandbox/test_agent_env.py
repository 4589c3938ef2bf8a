"""The agent's container environment: downward API, $(VAR) expansion, ConfigMap/Secret refs."""

from __future__ import annotations

import pytest
from sluiceway_sandbox.agent.envvars import EnvError, build_env, expand, expand_all

POD = {
    "metadata": {"name": "p-1", "namespace": "ns1", "uid": "u-1", "labels": {"app": "x"}},
    "spec": {"nodeName": "sandbox-node", "serviceAccountName": "runner"},
    "status": {"podIP": "198.18.1.7", "hostIP": "198.18.0.1"},
}
DATA = {("configmap", "ns1", "cm"): {"A": "1", "B": "two"}, ("secret", "ns1", "s"): {"TOKEN": "t0k"}}


def lookup(kind: str, ns: str, name: str) -> dict[str, str] | None:
    return DATA.get((kind, ns, name))


def test_expand_follows_kubernetes_rules() -> None:
    env = {"A": "1", "B": "b"}
    assert expand("$(A)-$(B)", env) == "1-b"
    assert expand("$(MISSING)", env) == "$(MISSING)"  # undefined stays as written
    assert expand("$$(A)", env) == "$(A)"  # $$ escapes
    assert expand("cost $5", env) == "cost $5"


def test_downward_api_and_expansion_in_order() -> None:
    container = {
        "name": "c",
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "URL", "value": "http://$(POD_IP):8080/$(NAME)"},
            {"name": "LATER", "value": "$(DEFINED_AFTER)"},
            {"name": "DEFINED_AFTER", "value": "x"},
        ],
        "args": ["--bind", "$(POD_IP)", "--ns=$(NS)"],
    }
    env = build_env(POD, container, {"PATH": "/bin"}, lookup)
    assert env["POD_IP"] == "198.18.1.7"
    assert (env["NAME"], env["NS"], env["SA"], env["APP"]) == ("p-1", "ns1", "runner", "x")
    assert env["URL"] == "http://198.18.1.7:8080/p-1"
    assert env["LATER"] == "$(DEFINED_AFTER)"  # only earlier variables expand
    assert expand_all(container["args"], env) == ["--bind", "198.18.1.7", "--ns=ns1"]


def test_env_from_and_key_refs() -> None:
    container = {
        "name": "c",
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "TOKEN"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k", "optional": True}}},
        ],
    }
    env = build_env(POD, container, {}, lookup)
    assert env["CM_A"] == "1" and env["CM_B"] == "two" and env["TOKEN"] == "t0k"
    assert "OPT" not in env


def test_missing_key_is_a_config_error() -> None:
    container = {"name": "c", "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "nope"}}}]}
    with pytest.raises(EnvError, match="no key 'nope'"):
        build_env(POD, container, {}, lookup)


def test_pod_ip_before_assignment_is_an_error() -> None:
    pod = {**POD, "status": {}}
    container = {"name": "c", "env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}
    with pytest.raises(EnvError, match=r"status\.podIP"):
        build_env(pod, container, {}, lookup)


def test_resource_field_ref_rounds_up_by_divisor() -> None:
    container = {
        "name": "c",
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
        "env": [
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu"}}},
            {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        ],
    }
    env = build_env(POD, container, {}, lookup, {"cpu": "32"})
    assert env["CPU"] == "1"  # 0.25 rounds up to 1, as the kubelet does
    assert env["MEM_MI"] == "1024"
    assert env["CPU_LIMIT"] == "32"  # no limit: node allocatable
