"""The chart through the real helm (built by tools/build-helm.sh): ``helm lint --strict``, the
schema's errors for typos and wrong types, ``helm template`` with defaults and with every optional
feature on (every object passes kubernetes-validate strict for Kubernetes 1.34; the
monitoring.coreos.com kinds against a structural schema of the fields used), labels, hardening,
the scaler's arguments and the RBAC split."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart_support import (
    ALL_ON,
    CHART,
    K8S_VERSION,
    KEDA_API,
    MONITORING_API,
    find,
    helm_binary,
    pod_specs,
    run_helm,
    template,
    write_values,
)

LABEL_KEYS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)


@pytest.fixture(scope="module")
def helm() -> str:
    path, why = helm_binary()
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm")


@pytest.fixture(scope="module")
def defaults(helm: str, home: Path) -> list[dict[str, Any]]:
    return template(helm, home, None, "--include-crds")


@pytest.fixture(scope="module")
def all_on(helm: str, home: Path) -> list[dict[str, Any]]:
    return template(helm, home, ALL_ON, "--include-crds")


# -- lint and schema errors ---------------------------------------------------------------------


def test_helm_lint_strict(helm: str, home: Path) -> None:
    for values in (None, ALL_ON):
        args = ["lint", "--strict", str(CHART)]
        if values:
            args += ["-f", str(write_values(home / "lint-values.yaml", values))]
        out = run_helm(helm, home, *args)
        assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "operater.namespaces={a}"], "at '': additional properties 'operater' not allowed"),
        (["--set", "scaler.port=grpc"], "at '/scaler/port': got string, want integer"),
        (["--set-string", "scaler.replicas=2"], "at '/scaler/replicas': got string, want integer"),
        (["--set", "operator.logFormat=xml"], "at '/operator/logFormat': value must be one of"),
        (["--set", "image.digest=latest"], "at '/image/digest': 'latest' does not match pattern"),
        # your own certificates: both Secrets or neither (the chart generates them)
        (["--set", "scaler.tls.secretName=s"], "at '/scaler/tls/kedaClientSecret': minLength: got 0, want 1"),
        (["--set", "scaler.tls.kedaClientSecret=k"], "at '/scaler/tls/secretName': minLength: got 0, want 1"),
        (["--set", "scaler.workers=0"], "at '/scaler/workers': minimum: got 0, want 1"),
        (
            ["--set", "operator.policy.allowedServiceAccounts={a,b c}"],
            "at '/operator/policy/allowedServiceAccounts/1': 'b c' does not match pattern",
        ),
        (["--set", "scaler.quota.leaseSeconds=120"], "at '/scaler/quota/leaseSeconds': maximum: got 120, want 60"),
        (
            ["--set", "networkPolicy.enabled=true"],
            "at '/networkPolicy/inferencePods/namespaces': minItems: got 0, want 1",
        ),
    ],
)
def test_bad_values_fail_lint_and_template_with_a_clear_message(
    helm: str, home: Path, args: list[str], message: str
) -> None:
    lint = run_helm(helm, home, "lint", "--strict", str(CHART), *args)
    assert lint.returncode != 0
    assert message in lint.stdout + lint.stderr, lint.stdout + lint.stderr
    tmpl = run_helm(helm, home, "template", "sw", str(CHART), *args)
    assert tmpl.returncode != 0
    assert message in tmpl.stderr, tmpl.stderr


# -- rendered objects ---------------------------------------------------------------------------

#: The fields of the monitoring.coreos.com objects this chart renders (a structural subset of the
#: prometheus-operator CRDs; unknown fields are errors).
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array"},
    },
}
_META = {"type": "object", "required": ["name", "namespace", "labels"]}
_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
MONITORING_SCHEMAS: dict[str, dict[str, Any]] = {
    "PrometheusRule": {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "metadata": _META,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["groups"],
                "properties": {
                    "groups": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["name", "rules"],
                            "properties": {
                                "name": {"type": "string", "minLength": 1},
                                "interval": _DURATION,
                                "rules": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "required": ["expr"],
                                        "properties": {
                                            "record": {"type": "string"},
                                            "alert": {"type": "string"},
                                            "expr": {"type": "string", "minLength": 1},
                                            "for": _DURATION,
                                            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                            "annotations": {
                                                "type": "object",
                                                "additionalProperties": {"type": "string"},
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    }
                },
            },
        },
    },
    "PodMonitor": {
        "type": "object",
        "properties": {
            "metadata": _META,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["selector", "podMetricsEndpoints"],
                "properties": {
                    "selector": _LABEL_SELECTOR,
                    "namespaceSelector": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array"}},
                    },
                    "podMetricsEndpoints": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["port"],
                            "properties": {
                                "port": {"type": "string"},
                                "path": {"type": "string"},
                                "interval": _DURATION,
                                "relabelings": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "properties": {
                                            "sourceLabels": {"type": "array", "items": {"type": "string"}},
                                            "targetLabel": {"type": "string"},
                                            # monitoring.coreos.com/v1 RelabelConfig
                                            "regex": {"type": "string"},
                                            "replacement": {"type": "string"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
    "ServiceMonitor": {
        "type": "object",
        "properties": {
            "metadata": _META,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["selector", "endpoints"],
                "properties": {
                    "selector": _LABEL_SELECTOR,
                    "namespaceSelector": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array"}},
                    },
                    "endpoints": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["port"],
                            "properties": {
                                "port": {"type": "string"},
                                "path": {"type": "string"},
                                "interval": _DURATION,
                            },
                        },
                    },
                },
            },
        },
    },
}


#: The fields of the keda.sh objects this chart renders (KEDA v2.21's ClusterTriggerAuthentication,
#: the parts used; unknown fields are errors).
KEDA_SCHEMAS: dict[str, dict[str, Any]] = {
    "ClusterTriggerAuthentication": {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": KEDA_API},
            "kind": {"const": "ClusterTriggerAuthentication"},
            "metadata": {"type": "object", "required": ["name", "labels"], "not": {"required": ["namespace"]}},
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["secretTargetRef"],
                "properties": {
                    "secretTargetRef": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["parameter", "name", "key"],
                            "properties": {
                                "parameter": {"type": "string"},
                                "name": {"type": "string", "minLength": 1},
                                "key": {"type": "string", "minLength": 1},
                            },
                        },
                    }
                },
            },
        },
    },
}


def _validate(docs: list[dict[str, Any]]) -> None:
    for d in docs:
        if d["apiVersion"] == MONITORING_API:
            jsonschema.validate(d, MONITORING_SCHEMAS[d["kind"]])
        elif d["apiVersion"] == KEDA_API:  # a CRD kind unknown to kubernetes-validate
            jsonschema.validate(d, KEDA_SCHEMAS[d["kind"]])
        else:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)


def test_default_objects_are_valid(defaults: list[dict[str, Any]]) -> None:
    _validate(defaults)
    kinds = sorted(d["kind"] for d in defaults)
    assert kinds == sorted(
        [
            "CustomResourceDefinition",
            "ServiceAccount",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "Deployment",
            "Service",
            "ConfigMap",
            # mutual TLS of the scaler, on by default: generated server and KEDA client Secrets,
            # and the ClusterTriggerAuthentication KEDA reads its client certificate from
            "Secret",
            "Secret",
            "ClusterTriggerAuthentication",
        ]
    ), kinds
    assert not any(d["apiVersion"] == MONITORING_API or d["kind"] == "NetworkPolicy" for d in defaults)


def test_every_optional_feature_renders_valid_objects(all_on: list[dict[str, Any]]) -> None:
    _validate(all_on)
    kinds = {d["kind"] for d in all_on}
    assert {"PrometheusRule", "PodMonitor", "ServiceMonitor", "NetworkPolicy", "Role", "RoleBinding"} <= kinds
    find(all_on, "ConfigMap", "sluiceway-dashboard")


def test_labels_on_every_object(defaults: list[dict[str, Any]], all_on: list[dict[str, Any]]) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for d in defaults + all_on:
        if d["kind"] == "CustomResourceDefinition":
            continue  # crds/ is not templated by helm: a byte copy of crds/
        labels = d["metadata"].get("labels") or {}
        for key in LABEL_KEYS:
            assert labels.get(key), f"{d['kind']}/{d['metadata']['name']} lacks {key}"
        assert labels["app.kubernetes.io/instance"] == "sw"
        assert labels["app.kubernetes.io/version"] == chart["appVersion"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == f"sluiceway-{chart['version']}"
    for d in all_on:
        if d["kind"] == "Deployment":
            tpl_labels = d["spec"]["template"]["metadata"]["labels"]
            assert all(tpl_labels.get(k) for k in LABEL_KEYS)
            assert d["spec"]["selector"]["matchLabels"].items() <= tpl_labels.items()


def test_pods_are_hardened(all_on: list[dict[str, Any]], defaults: list[dict[str, Any]]) -> None:
    for docs in (defaults, all_on):
        names = []
        for name, spec in pod_specs(docs):
            names.append(name)
            psc = spec["securityContext"]
            assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 65532
            assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
            for c in spec["containers"]:
                sc = c["securityContext"]
                assert sc["readOnlyRootFilesystem"] is True
                assert sc["allowPrivilegeEscalation"] is False
                assert sc["capabilities"]["drop"] == ["ALL"]
                assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
                assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
        assert sorted(names) == ["sluiceway-operator", "sluiceway-scaler"]
    scaler = find(all_on, "Deployment", "sluiceway-scaler")["spec"]["template"]["spec"]
    assert scaler["automountServiceAccountToken"] is False


def test_image_digest_tag_and_pull_secrets(defaults: list[dict[str, Any]], all_on: list[dict[str, Any]]) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    op = find(defaults, "Deployment", "sluiceway-operator")["spec"]["template"]["spec"]
    assert op["containers"][0]["image"] == f"ghcr.io/sluiceway/sluiceway:{chart['appVersion']}"
    op = find(all_on, "Deployment", "sluiceway-operator")["spec"]["template"]["spec"]
    assert op["containers"][0]["image"] == "ghcr.io/sluiceway/sluiceway@sha256:" + "a" * 64
    assert op["imagePullSecrets"] == [{"name": "regcred"}]


def _env(deployment: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def _args(docs: list[dict[str, Any]]) -> list[str]:
    args: list[str] = find(docs, "Deployment", "sluiceway-scaler")["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_operator_settings_reach_the_operator(all_on: list[dict[str, Any]], defaults: list[dict[str, Any]]) -> None:
    env = _env(find(all_on, "Deployment", "sluiceway-operator"))
    assert env["SLUICEWAY_NAMESPACES"] == "team-a,team-b"
    assert env["SLUICEWAY_PROMETHEUS_URL"] == "http://prometheus.monitoring.svc:9090"
    assert env["SLUICEWAY_SCALER_ADDRESS"] == "sluiceway-scaler.sluiceway-system.svc:9090"
    assert _env(find(defaults, "Deployment", "sluiceway-operator"))["SLUICEWAY_NAMESPACES"] == ""


def test_quota_coordinator_reaches_the_operator(
    all_on: list[dict[str, Any]], defaults: list[dict[str, Any]], helm: str, home: Path, tmp_path: Path
) -> None:
    """scaler.quota.enabled: the operator points the pods at the scaler's quota port, with the
    scaler's lease; the operator reads the settings and renders a pod config the pod accepts."""
    from sluiceway_core.config import PodConfig
    from sluiceway_operator.render import Environment, Owner, render
    from sluiceway_operator.settings import config_from_env
    from sluiceway_operator.spec import parse_spec

    env = _env(find(all_on, "Deployment", "sluiceway-operator"))
    assert env["SLUICEWAY_QUOTA_COORDINATOR_URL"] == "http://sluiceway-scaler.sluiceway-system.svc:9092"
    assert env["SLUICEWAY_QUOTA_LEASE_SECONDS"] == "3"
    assert "SLUICEWAY_QUOTA_COORDINATOR_URL" not in _env(find(defaults, "Deployment", "sluiceway-operator"))
    other = template(helm, home, {"scaler": {"quota": {"enabled": True, "port": 7000, "leaseSeconds": 2.5}}})
    other_env = _env(find(other, "Deployment", "sluiceway-operator"))
    assert other_env["SLUICEWAY_QUOTA_COORDINATOR_URL"] == "http://sluiceway-scaler.sluiceway-system.svc:7000"
    assert other_env["SLUICEWAY_QUOTA_LEASE_SECONDS"] == "2.5"
    assert "--quota-lease-seconds" in _args(other) and "2.5" in _args(other)

    assert other_env["SLUICEWAY_QUOTA_KEY_FILE"] == "/etc/sluiceway/quota-key/key"  # the chart's Secret
    key = tmp_path / "key"
    key.write_text("k" * 64)
    cfg = config_from_env(other_env | {"SLUICEWAY_QUOTA_KEY_FILE": str(key)})
    spec = parse_spec(
        {"model": {"image": "i:1", "format": "demo", "source": "demo"}, "access": {"defaults": {"rate": "5/s"}}}
    )
    rendered = render(
        Owner("demo", "team-a", "u"),
        spec,
        {},
        Environment(
            quota_coordinator_url=cfg.quota_coordinator_url,
            quota_lease_seconds=cfg.quota_lease_seconds,
            quota_key=cfg.quota_key,
        ),
    )
    quota = rendered.pod_config.quota
    assert quota is not None and quota.coordinator_url == "http://sluiceway-scaler.sluiceway-system.svc:7000"
    assert quota.lease_seconds == 2.5
    cm = next(m for m in rendered.manifests if m["kind"] == "ConfigMap")
    assert PodConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"])) == rendered.pod_config


def test_scaler_tls_gives_keda_its_client_certificate(
    all_on: list[dict[str, Any]], defaults: list[dict[str, Any]], helm: str, home: Path, tmp_path: Path
) -> None:
    """KEDA v2.21 reads an external scaler's caCert/tlsClientCert/tlsClientKey only from a
    TriggerAuthentication: with TLS on, the chart renders the ClusterTriggerAuthentication the
    operator's triggers name (SLUICEWAY_SCALER_AUTHENTICATION)."""
    cta = find(all_on, "ClusterTriggerAuthentication", "sluiceway-scaler")
    assert cta["apiVersion"] == "keda.sh/v1alpha1"
    assert "namespace" not in cta["metadata"]  # cluster-scoped; the Secret is in KEDA's namespace
    assert cta["spec"]["secretTargetRef"] == [
        {"parameter": "caCert", "name": "sluiceway-keda-client", "key": "ca.crt"},
        {"parameter": "tlsClientCert", "name": "sluiceway-keda-client", "key": "tls.crt"},
        {"parameter": "tlsClientKey", "name": "sluiceway-keda-client", "key": "tls.key"},
    ]
    assert (
        _env(find(all_on, "Deployment", "sluiceway-operator"))["SLUICEWAY_SCALER_AUTHENTICATION"] == "sluiceway-scaler"
    )
    # mutual TLS is the default: the generated KEDA client Secret, named by the same CTA
    generated = find(defaults, "ClusterTriggerAuthentication", "sluiceway-scaler")["spec"]["secretTargetRef"]
    assert {r["name"] for r in generated} == {"sluiceway-keda-client"}
    assert _env(find(defaults, "Deployment", "sluiceway-operator"))["SLUICEWAY_SCALER_AUTHENTICATION"] == (
        "sluiceway-scaler"
    )
    plain = template(helm, home, {"scaler": {"tls": {"enabled": False}}})
    assert not [d for d in plain if d["kind"] in ("ClusterTriggerAuthentication", "Secret")]
    assert "SLUICEWAY_SCALER_AUTHENTICATION" not in _env(find(plain, "Deployment", "sluiceway-operator"))
    from sluiceway_operator.settings import config_from_env

    key = tmp_path / "key"
    key.write_text("k" * 64)  # the chart mounts its quota key there; any 32+ bytes will do here
    auth = tmp_path / "auth.json"  # the chart mounts the prometheusAuth file there (test_chart_promauth.py)
    auth.write_text('{"prometheus": []}')
    env = _env(find(all_on, "Deployment", "sluiceway-operator")) | {
        "SLUICEWAY_QUOTA_KEY_FILE": str(key),
        "SLUICEWAY_PROMETHEUS_AUTH_FILE": str(auth),
    }
    assert config_from_env(env).scaler_authentication == "sluiceway-scaler"


def test_scaler_arguments(helm: str, home: Path, defaults: list[dict[str, Any]], all_on: list[dict[str, Any]]) -> None:
    # No Prometheus configured: no allow-list flag (the scaler's own default applies); mutual TLS on.
    bounds = ["--workers", "64", "--max-triggers", "4096", "--log-format", "plain"]
    mtls = ["--tls-cert", "/etc/sluiceway/tls/tls.crt", "--tls-key", "/etc/sluiceway/tls/tls.key",
            "--tls-ca", "/etc/sluiceway/tls/ca.crt"]
    assert _args(defaults) == ["serve", "--port", "9090", "--metrics-port", "9091", *bounds, *mtls]
    # The chart's Prometheus is the default allow-list.
    only_url = template(helm, home, {"operator": {"prometheusUrl": "http://prom.mon.svc:9090"}})
    assert _args(only_url)[11:-6] == ["--allowed-prometheus", "http://prom.mon.svc:9090"]
    # An explicit list adds to it (once each).
    both = template(
        helm,
        home,
        {
            "operator": {"prometheusUrl": "http://prom.mon.svc:9090"},
            "scaler": {"allowedPrometheusUrls": ["http://b:9090"]},
        },
    )
    assert _args(both)[11:-6] == [
        "--allowed-prometheus",
        "http://prom.mon.svc:9090",
        "--allowed-prometheus",
        "http://b:9090",
    ]
    # TLS adds the three files mounted from the Secret.
    args = _args(all_on)
    assert args == [
        "serve",
        "--port",
        "9090",
        "--metrics-port",
        "9091",
        *bounds,
        "--allowed-prometheus",
        "http://prometheus.monitoring.svc:9090",
        "--allowed-prometheus",
        "https://thanos.example:10902",
        "--prometheus-auth-file",
        "/etc/sluiceway/prometheus-auth/config/auth.json",
        "--tls-cert",
        "/etc/sluiceway/tls/tls.crt",
        "--tls-key",
        "/etc/sluiceway/tls/tls.key",
        "--tls-ca",
        "/etc/sluiceway/tls/ca.crt",
        "--quota-port",
        "9092",
        "--quota-lease-seconds",
        "3",
        "--quota-key-file",
        "/etc/sluiceway/quota-key/key",
    ]
    spec = find(all_on, "Deployment", "sluiceway-scaler")["spec"]["template"]["spec"]
    tls = next(v for v in spec["volumes"] if v["name"] == "tls")
    assert tls["secret"]["secretName"] == "sluiceway-scaler-tls"
    assert {i["key"] for i in tls["secret"]["items"]} == {"tls.crt", "tls.key", "ca.crt"}
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "tls")
    assert mount == {"name": "tls", "mountPath": "/etc/sluiceway/tls", "readOnly": True}
    # The sluiceway-scaler CLI accepts exactly these flags (a parse, no server started).
    from sluiceway_scaler.cli import _parser

    parsed = _parser().parse_args(args)
    assert parsed.allowed_prometheus == ["http://prometheus.monitoring.svc:9090", "https://thanos.example:10902"]
    assert str(parsed.tls_ca) == "/etc/sluiceway/tls/ca.crt"
    assert parsed.quota_port == 9092
    ports = {p["name"]: p["port"] for p in find(all_on, "Service", "sluiceway-scaler")["spec"]["ports"]}
    assert ports == {"grpc": 9090, "metrics": 9091, "quota": 9092}
    assert "quota" not in {p["name"] for p in find(defaults, "Service", "sluiceway-scaler")["spec"]["ports"]}


def test_rbac_namespaced_vs_clusterwide(defaults: list[dict[str, Any]], all_on: list[dict[str, Any]]) -> None:
    rules = yaml.safe_load((CHART / "files" / "operator-rules.yaml").read_text())
    cluster_only = [r for r in rules if "apiextensions.k8s.io" in r["apiGroups"]]
    namespaced = [r for r in rules if r not in cluster_only]
    # Cluster-wide: one ClusterRole with every rule, no Roles.
    assert find(defaults, "ClusterRole", "sluiceway-operator")["rules"] == rules
    assert not [d for d in defaults if d["kind"] in ("Role", "RoleBinding")]
    # Namespaced: a Role + RoleBinding per watched namespace; the ClusterRole reads CRDs only.
    assert find(all_on, "ClusterRole", "sluiceway-operator")["rules"] == cluster_only
    for ns in ("team-a", "team-b"):
        assert find(all_on, "Role", "sluiceway-operator", ns)["rules"] == namespaced
        binding = find(all_on, "RoleBinding", "sluiceway-operator", ns)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "sluiceway-operator", "namespace": "sluiceway-system"}
        ]
        assert binding["roleRef"]["kind"] == "Role"
    assert {d["metadata"]["namespace"] for d in all_on if d["kind"] == "Role"} == {"team-a", "team-b"}


def test_monitoring_objects(all_on: list[dict[str, Any]]) -> None:
    rule = find(all_on, "PrometheusRule", "sluiceway")
    source = yaml.safe_load((CHART / "files" / "scaler-rules.yaml").read_text())
    assert rule["spec"]["groups"] == source["groups"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    pm = find(all_on, "PodMonitor", "sluiceway-inference-pods")["spec"]
    # the inference pods and the operator's gateways (issue 19 §3), the gateway's series marked
    assert pm["selector"] == {
        "matchExpressions": [
            {"key": "app.kubernetes.io/name", "operator": "In", "values": ["sluiceway-pod", "sluiceway-gateway"]}
        ]
    }
    assert pm["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    endpoint = pm["podMetricsEndpoints"][0]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    assert set(relabel) == {"namespace", "inferenceservice", "pod", "component"}
    assert relabel["component"] == {
        "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
        "regex": "sluiceway-gateway",
        "targetLabel": "component",
        "replacement": "gateway",
    }
    sm = find(all_on, "ServiceMonitor", "sluiceway-scaler")["spec"]
    assert sm["endpoints"][0]["port"] == "metrics"
    assert sm["selector"]["matchLabels"] == {"app.kubernetes.io/name": "sluiceway-scaler"}
    dash = find(all_on, "ConfigMap", "sluiceway-dashboard")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dash["data"]["sluiceway.json"].strip() == (CHART / "files" / "dashboard.json").read_text().strip()


def test_prometheus_rule_parses_with_promtool(all_on: list[dict[str, Any]], tmp_path: Path) -> None:
    import shutil

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found: apt-get install -y prometheus")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": find(all_on, "PrometheusRule", "sluiceway")["spec"]["groups"]}))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_network_policies(all_on: list[dict[str, Any]]) -> None:
    for ns in ("team-a", "team-b"):
        pol = find(all_on, "NetworkPolicy", "sluiceway-inference-pods", ns)["spec"]
        # not the pods behind a gateway: the operator's NetworkPolicy <name> admits only the gateway
        assert pol["podSelector"] == {
            "matchLabels": {"app.kubernetes.io/name": "sluiceway-pod"},
            "matchExpressions": [{"key": "sluiceway.io/behind-gateway", "operator": "DoesNotExist"}],
        }
        assert pol["policyTypes"] == ["Ingress"]
        http, metrics = pol["ingress"]
        assert http["ports"] == [{"port": "http", "protocol": "TCP"}]
        assert http["from"] == [{"podSelector": {}}]  # the namespace's own pods
        assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
        assert metrics["from"] == [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
            }
        ]
    scaler = find(all_on, "NetworkPolicy", "sluiceway-scaler", "sluiceway-system")["spec"]
    grpc, metrics, quota = scaler["ingress"]
    assert grpc["ports"] == [{"port": "grpc", "protocol": "TCP"}]
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert quota["ports"] == [{"port": "quota", "protocol": "TCP"}]
    # only pods carrying the labels the operator sets, in the watched namespaces
    operator_labelled = {
        "matchLabels": {
            "app.kubernetes.io/name": "sluiceway-pod",
            "app.kubernetes.io/managed-by": "sluiceway-operator",
        },
        "matchExpressions": [{"key": "sluiceway.io/inferenceservice", "operator": "Exists"}],
    }
    gateway_labelled = {**operator_labelled, "matchLabels": {**operator_labelled["matchLabels"],  # type: ignore[dict-item]
                                                             "app.kubernetes.io/name": "sluiceway-gateway"}}
    assert quota["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}, "podSelector": selector}
        for selector in (operator_labelled, gateway_labelled)  # the gateway's replicas lease the edge's part
        for ns in ("team-a", "team-b")
    ]
    assert grpc["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}}]
    operator = find(all_on, "NetworkPolicy", "sluiceway-operator", "sluiceway-system")["spec"]
    assert operator["ingress"] == []


def test_http_clients_are_selectable(helm: str, home: Path) -> None:
    values = copy.deepcopy(ALL_ON)
    peer = {"namespaceSelector": {"matchLabels": {"team": "search"}}}
    values["networkPolicy"] = {"enabled": True, "inferencePods": {"httpFrom": [peer], "namespaces": ["ml"]}}
    docs = template(helm, home, values)
    _validate(docs)
    pol = find(docs, "NetworkPolicy", "sluiceway-inference-pods", "ml")["spec"]
    assert pol["ingress"][0]["from"] == [peer]
    assert not [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["namespace"] == "team-a"]


def test_template_guards_hold_without_the_schema(helm: str, home: Path) -> None:
    """The templates refuse the same mistakes when schema validation is skipped."""
    for args, message in (
        (["--set", "scaler.tls.secretName=s"], "scaler.tls.secretName and scaler.tls.kedaClientSecret go together"),
        (
            ["--set", "scaler.quota.enabled=true,scaler.replicas=2"],
            "leases would sum above the quota",
        ),
        (
            ["--set", "scaler.enabled=false,scaler.quota.enabled=true"],
            "scaler.quota.enabled needs scaler.enabled",
        ),
        (["--set", "networkPolicy.enabled=true"], "networkPolicy.inferencePods needs namespaces"),
    ):
        out = run_helm(helm, home, "template", "sw", str(CHART), "--skip-schema-validation", *args)
        assert out.returncode != 0
        assert message in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("values", "scaler", "operator"),
    [
        (None, "plain", "plain"),
        ({"logFormat": "json"}, "json", "json"),
        ({"logFormat": "json", "operator": {"logFormat": "full"}}, "json", "full"),
        ({"operator": {"logFormat": "json"}}, "plain", "json"),
    ],
)
def test_log_format_reaches_the_scaler_and_the_operator(
    helm: str, home: Path, values: dict[str, Any] | None, scaler: str, operator: str
) -> None:
    """``logFormat`` (plain | json) is the scaler's ``--log-format`` and the operator's
    ``SLUICEWAY_LOG_FORMAT``; ``operator.logFormat`` (plain | full | json) overrides it for the operator."""
    docs = template(helm, home, values)
    args = _args(docs)
    assert args[args.index("--log-format") + 1] == scaler
    from sluiceway_scaler.cli import _parser

    assert _parser().parse_args(args).log_format == scaler
    env = _env(find(docs, "Deployment", "sluiceway-operator"))
    assert env["SLUICEWAY_LOG_FORMAT"] == operator


def test_a_bad_log_format_is_refused_by_the_schema(helm: str, home: Path) -> None:
    out = run_helm(helm, home, "template", "sw", str(CHART), "--set", "logFormat=full")
    assert out.returncode != 0 and "logFormat" in out.stderr, out.stderr
