"""Issue 18 at the chart's seams (helm template, the real helm binary): the mutual TLS the chart
generates works with the scaler's real gRPC server and KEDA's client certificate; the quota key
Secret and its mounts; one scaler replica with Recreate while quotas are on; the quota port's
NetworkPolicy; the operator's policy and Prometheus allow-list as its environment."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import grpc
import pytest
from chart_support import find, helm_binary, template
from cryptography import x509


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
    return template(helm, home, None)


@pytest.fixture(scope="module")
def quotas(helm: str, home: Path) -> list[dict[str, Any]]:
    return template(helm, home, {"scaler": {"quota": {"enabled": True}}})


def _pod(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, "Deployment", name)["spec"]["template"]["spec"]
    return spec


def _env(docs: list[dict[str, Any]], name: str) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in _pod(docs, name)["containers"][0]["env"]}


def _data(secret: dict[str, Any]) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def test_generated_mutual_tls_admits_keda_only(defaults: list[dict[str, Any]], tmp_path: Path) -> None:
    """The default install: the scaler serves mutual TLS with the chart's certificates, KEDA's client
    certificate (in KEDA's namespace) is accepted, a client without one is refused."""
    from sluiceway_scaler import externalscaler_pb2 as pb
    from sluiceway_scaler import externalscaler_pb2_grpc as pb_grpc
    from sluiceway_scaler.service import ExternalScalerService, TlsFiles, serve

    server = _data(find(defaults, "Secret", "sluiceway-scaler-tls", "sluiceway-system"))
    client = _data(find(defaults, "Secret", "sluiceway-keda-client", "keda"))
    assert server["ca.crt"] == client["ca.crt"]
    cert = x509.load_pem_x509_certificate(server["tls.crt"])
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    # the address the operator gives KEDA (SLUICEWAY_SCALER_ADDRESS) is among the names
    host = _env(defaults, "sluiceway-operator")["SLUICEWAY_SCALER_ADDRESS"].rsplit(":", 1)[0]
    assert host == "sluiceway-scaler.sluiceway-system.svc" and host in names
    for key, data in server.items():
        (tmp_path / key).write_bytes(data)
    tls = TlsFiles(tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt")
    from prometheus_client import CollectorRegistry
    from sluiceway_scaler.metrics import ScalerMetrics

    service = ExternalScalerService(ScalerMetrics(CollectorRegistry()))
    srv, port = serve(service, "127.0.0.1", 0, workers=4, tls=tls)
    options = (("grpc.ssl_target_name_override", host),)
    md = {"inferenceService": "demo", "prometheusAddress": "http://p:9090", "targetQueueDepthPerReplica": "4"}
    r = pb.ScaledObjectRef(name="demo", namespace="team-a", scalerMetadata=md)
    try:
        keda = grpc.ssl_channel_credentials(client["ca.crt"], client["tls.key"], client["tls.crt"])
        with grpc.secure_channel(f"127.0.0.1:{port}", keda, options) as ch:
            with pytest.raises(grpc.RpcError) as e:  # reached the service: the address is not allowed
                pb_grpc.ExternalScalerStub(ch).GetMetricSpec(r, timeout=10)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value.details()
        anonymous = grpc.ssl_channel_credentials(client["ca.crt"])
        with grpc.secure_channel(f"127.0.0.1:{port}", anonymous, options) as ch:
            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.ExternalScalerStub(ch).GetMetricSpec(r, timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE  # the handshake fails
    finally:
        service.stop()
        srv.stop(1).wait()


def test_own_certificates_are_used_as_given(helm: str, home: Path) -> None:
    docs = template(helm, home, {"scaler": {"tls": {"secretName": "mine", "kedaClientSecret": "keda-mine"}}})
    assert not [d for d in docs if d["kind"] == "Secret"]
    vol = next(v for v in _pod(docs, "sluiceway-scaler")["volumes"] if v["name"] == "tls")
    assert vol["secret"]["secretName"] == "mine"
    refs = find(docs, "ClusterTriggerAuthentication", "sluiceway-scaler")["spec"]["secretTargetRef"]
    assert {r["name"] for r in refs} == {"keda-mine"}


def test_quota_key_secret_and_mounts(quotas: list[dict[str, Any]], defaults: list[dict[str, Any]]) -> None:
    from sluiceway_core.quota_charter import MIN_KEY_BYTES

    secret = find(quotas, "Secret", "sw-sluiceway-quota-key", "sluiceway-system")
    key = _data(secret)["key"]
    assert len(key) >= MIN_KEY_BYTES and key.isalnum()
    path = "/etc/sluiceway/quota-key/key"
    assert _env(quotas, "sluiceway-operator")["SLUICEWAY_QUOTA_KEY_FILE"] == path
    scaler = _pod(quotas, "sluiceway-scaler")
    args = scaler["containers"][0]["args"]
    assert args[args.index("--quota-key-file") + 1] == path
    for name in ("sluiceway-operator", "sluiceway-scaler"):
        pod = _pod(quotas, name)
        mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "quota-key")
        assert mount == {"name": "quota-key", "mountPath": "/etc/sluiceway/quota-key", "readOnly": True}
        vol = next(v for v in pod["volumes"] if v["name"] == "quota-key")
        assert vol["secret"] == {"secretName": "sw-sluiceway-quota-key", "items": [{"key": "key", "path": "key"}]}
    # without quotas: no key, no mount
    assert not [d for d in defaults if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-quota-key")]
    assert "SLUICEWAY_QUOTA_KEY_FILE" not in _env(defaults, "sluiceway-operator")


def test_one_scaler_replica_recreated_while_quotas_are_on(
    helm: str, home: Path, quotas: list[dict[str, Any]], defaults: list[dict[str, Any]]
) -> None:
    from chart_support import CHART, run_helm

    assert find(quotas, "Deployment", "sluiceway-scaler")["spec"]["strategy"] == {"type": "Recreate"}
    assert "strategy" not in find(defaults, "Deployment", "sluiceway-scaler")["spec"]
    out = run_helm(helm, home, "template", "sw", str(CHART), "--set", "scaler.quota.enabled=true,scaler.replicas=2")
    assert out.returncode != 0
    assert "scaler.replicas is 2 but scaler.quota.enabled needs exactly 1" in out.stderr
    assert "leases would sum above the quota" in out.stderr
    scaled = template(helm, home, {"scaler": {"replicas": 3}})  # without quotas more replicas are fine
    assert find(scaled, "Deployment", "sluiceway-scaler")["spec"]["replicas"] == 3


def test_quota_port_admits_operator_labelled_pods_only(helm: str, home: Path) -> None:
    from sluiceway_operator.render import gateway_labels, pod_labels

    values = {"scaler": {"quota": {"enabled": True}}, "networkPolicy": {"enabled": True, "inferencePods": {
        "enabled": False}}}
    docs = template(helm, home, values)
    rules = find(docs, "NetworkPolicy", "sluiceway-scaler")["spec"]["ingress"]
    grpc_rule = next(r for r in rules if r["ports"] == [{"port": "grpc", "protocol": "TCP"}])
    assert grpc_rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}}]
    quota = next(r for r in rules if r["ports"] == [{"port": "quota", "protocol": "TCP"}])
    pods_peer, gateway_peer = quota["from"]  # the pods, and the gateway's replicas (their edge leases)
    for peer, labels in ((pods_peer, pod_labels("demo")), (gateway_peer, gateway_labels("demo"))):
        assert peer["namespaceSelector"] == {}  # every namespace when operator.namespaces is empty
        selector = peer["podSelector"]  # what the operator puts on an InferenceService's pods / gateway
        assert all(labels.get(k) == v for k, v in selector["matchLabels"].items())
        assert all(e["operator"] == "Exists" and e["key"] in labels for e in selector["matchExpressions"])
        # a pod that only sets the old label (app.kubernetes.io/name) no longer matches
        assert set(selector["matchLabels"]) > {"app.kubernetes.io/name"}
    assert not all(gateway_labels("demo").get(k) == v for k, v in pods_peer["podSelector"]["matchLabels"].items())


def test_operator_policy_and_prometheus_allow_list_reach_the_operator(
    helm: str, home: Path, defaults: list[dict[str, Any]]
) -> None:
    from sluiceway_operator.policy import DEFAULTS, policy_from_env

    env = _env(defaults, "sluiceway-operator")
    assert env["SLUICEWAY_ALLOWED_PROMETHEUS"] == ""
    # the chart's defaults are the operator's secure defaults, field by field
    policy = policy_from_env(env)
    for field, default in DEFAULTS.items():
        assert getattr(policy, field) == default, field
    values = {
        "operator": {
            "allowedPrometheusUrls": ["http://a:9090", "https://b:443"],
            "policy": {
                "allowedImageRegistries": ["ghcr.io/acme/", "*"],
                "allowedServiceAccounts": [],
                "allowedPriorityClasses": ["high"],
                "allowedTolerationKeys": ["x", "z"],
                "allowedRuntimeClasses": ["nvidia"],
                "allowedNodeSelectorKeys": ["k"],
            },
        }
    }
    env = _env(template(helm, home, values), "sluiceway-operator")
    assert env["SLUICEWAY_ALLOWED_PROMETHEUS"] == "http://a:9090,https://b:443"
    assert env["SLUICEWAY_ALLOWED_IMAGE_REGISTRIES"] == "ghcr.io/acme/,*"
    assert env["SLUICEWAY_ALLOWED_SERVICE_ACCOUNTS"] == ""  # set and empty: nothing allowed
    policy = policy_from_env(env)
    assert policy.service_accounts == () and policy.priority_classes == ("high",)
    assert policy.toleration_keys == ("x", "z") and policy.runtime_classes == ("nvidia",)
    assert policy.node_selector_keys == ("k",)


@pytest.mark.parametrize("keda", [True, False])
def test_sandbox_chart_values(helm: str, home: Path, keda: bool) -> None:
    """The sandbox installs the chart after KEDA (mutual TLS by default, KEDA's CRD and namespace
    exist); without KEDA it turns the scaler's TLS off, since nothing could call it over mTLS."""
    from chart_support import CHART, run_helm
    from sluiceway_sandbox.lifecycle import chart_values

    values = chart_values("http://198.18.0.1:9090", keda, (("scaler.quota.enabled", "true"),))
    sets = ",".join(f"{k}={v}" for k, v in values.items())
    out = run_helm(helm, home, "template", "sluiceway", str(CHART), "-n", "sluiceway-system", "--set", sets)
    assert out.returncode == 0, out.stderr
    import yaml

    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    args = _pod(docs, "sluiceway-scaler")["containers"][0]["args"]
    assert ("--tls-ca" in args) is keda
    assert bool([d for d in docs if d["kind"] == "ClusterTriggerAuthentication"]) is keda
    assert "--quota-key-file" in args  # the sandbox's quota coordinator gets the chart's key
    find(docs, "Secret", "sluiceway-quota-key", "sluiceway-system")
