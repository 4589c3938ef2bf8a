"""Golden-file tests of the pure builders: InferenceService -> manifests, no cluster.

Regenerate the golden files after an intended change with ``SLUICEWAY_REGEN_GOLDEN=1``; the diff
then shows up in review.
"""

from __future__ import annotations

import os
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml
from operator_support import CASES, GOLDEN, TEST_EDGE_TOKEN, TEST_KEYS, TEST_SALT, case_names, load_case
from sluiceway_core.config import PodConfig
from sluiceway_core.keys import hash_key
from sluiceway_operator.render import CONFIG_HASH_ANNOTATION, Environment, Owner, render
from sluiceway_operator.spec import SpecError, parse_spec

K8S_VERSION = "1.34.0"
ENV = Environment(
    scaler_address="sluiceway-scaler.sluiceway-system.svc:9090",
    prometheus_url=None,
    keda=True,
    service_monitor=True,
    http_route=True,
)


def _render_case(name: str, env: Environment = ENV, replicas: int | None = 2) -> Any:
    cr = load_case(name)
    spec = parse_spec(cr["spec"])
    owner = Owner(cr["metadata"]["name"], cr["metadata"]["namespace"], f"uid-{name}")
    hashes = {t.name: hash_key(TEST_KEYS[t.name], TEST_SALT) for t in spec.keyed_tenants}
    return render(owner, spec, hashes, env, replicas=replicas, salt=TEST_SALT, edge_token=TEST_EDGE_TOKEN)


def _golden_form(rendered: Any) -> list[dict[str, Any]]:
    """The manifests with the pod config reduced to what the operator sets.

    The ConfigMap carries the whole pod config, including every default of
    ``sluiceway_core.config`` that the operator does not set; those (and so the config hash) change
    whenever the pod's defaults do. The golden files hold only the operator's decisions
    (``exclude_unset``); the full text and the hash are checked against the pod's own model below.
    """
    import copy

    from sluiceway_gateway.config import GatewayConfig
    from sluiceway_operator.render import GATEWAY_CONFIG_FILE, gateway_config_hash, pod_config_hash

    out = copy.deepcopy(rendered.manifests)
    for m in out:
        if m["kind"] == "ConfigMap" and GATEWAY_CONFIG_FILE in m["data"]:
            # the gateway's own model loads it (gateway/sluiceway_gateway/config.py)
            GatewayConfig.model_validate(yaml.safe_load(m["data"][GATEWAY_CONFIG_FILE]))
            gateway_cm = m["data"][GATEWAY_CONFIG_FILE]
        elif m["kind"] == "ConfigMap":
            full = m["data"]["config.yaml"]
            assert PodConfig.model_validate(yaml.safe_load(full)) == rendered.pod_config
            m["data"]["config.yaml"] = yaml.safe_dump(
                rendered.pod_config.model_dump(mode="json", by_alias=True, exclude_unset=True), sort_keys=True
            )
        if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-gateway"):
            ann = m["spec"]["template"]["metadata"]["annotations"]
            assert ann[CONFIG_HASH_ANNOTATION] == gateway_config_hash(gateway_cm)
            ann[CONFIG_HASH_ANNOTATION] = "<gateway-config-hash>"
        elif m["kind"] == "Deployment":
            ann = m["spec"]["template"]["metadata"]["annotations"]
            assert ann[CONFIG_HASH_ANNOTATION] == rendered.config_hash
            ann[CONFIG_HASH_ANNOTATION] = "<config-hash>"
    cm = next(m for m in rendered.manifests if m["kind"] == "ConfigMap")
    assert rendered.config_hash == pod_config_hash(PodConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"])))
    return out


@pytest.mark.parametrize("name", case_names())
def test_golden(name: str) -> None:
    rendered = _render_case(name)
    text = yaml.safe_dump_all(_golden_form(rendered), sort_keys=True)
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("SLUICEWAY_REGEN_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with SLUICEWAY_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{name}: rendering changed; SLUICEWAY_REGEN_GOLDEN=1 to accept"


@pytest.mark.parametrize("name", case_names())
def test_core_manifests_validate_strict(name: str) -> None:
    """Every core manifest passes kubernetes-validate in strict mode (no unknown fields)."""
    checked = 0
    for manifest in _render_case(name).manifests:
        if manifest["apiVersion"] in ("keda.sh/v1alpha1", "monitoring.coreos.com/v1", "gateway.networking.k8s.io/v1"):
            continue  # CRDs unknown to kubernetes-validate; checked by shape below
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        checked += 1
    # ConfigMap, Secret, Deployment, Service, the metrics Service, PDB; with the gateway also its
    # ServiceAccount, Role, RoleBinding, ConfigMap, Deployment, Service, PDB, metrics Service, the
    # edge Secret and the pods' NetworkPolicy
    assert checked == (16 if parse_spec(load_case(name)["spec"]).gateway.enabled else 6)


def test_crd_validates_strict() -> None:
    from operator_support import load_crd

    kubernetes_validate.validate(load_crd(), K8S_VERSION, strict=True)


def test_invalid_manifest_is_caught_by_validator() -> None:
    """The validator is not a no-op: a typo in a rendered field fails strict validation."""
    dep = next(m for m in _render_case("minimal").manifests if m["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolicee"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


def _by_kind(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["kind"]: m for m in manifests}


def test_every_child_is_owned_and_labelled() -> None:
    for m in _render_case("full").manifests:
        (ref,) = m["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": "sluiceway.io/v1alpha1",
            "kind": "InferenceService",
            "name": "resnet",
            "uid": "uid-full",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert m["metadata"]["labels"]["sluiceway.io/inferenceservice"] == "resnet"
        assert m["metadata"]["namespace"] == "vision"


def test_configmap_round_trips_through_pod_config() -> None:
    rendered = _render_case("full")
    cm = _by_kind(rendered.manifests)["ConfigMap"]
    cfg = PodConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
    assert cfg == rendered.pod_config
    assert cfg.queue.timeout_seconds == 2.0
    assert cfg.queue.exec_timeout_seconds == 10.0  # request 12s - queue 2s
    assert cfg.queue.max_depth == "auto"
    assert cfg.concurrency.safety_factor == 0.7
    assert cfg.concurrency.memory_reserve_bytes == 2 * 1024**3
    assert cfg.tenants.defaults.rate == 0.5  # 30/m
    assert cfg.tenants.keys_file == "/var/run/secrets/sluiceway/keys.txt"
    assert [t.name for t in cfg.tenants.tenants] == ["search", "reports"]
    assert cfg.degradation.fallback is not None and cfg.degradation.fallback.spec == "synthetic:5"
    assert cfg.model.name == "resnet50"


def test_keys_secret_has_hashes_never_keys() -> None:
    import base64

    secret = _by_kind(_render_case("full").manifests)["Secret"]
    text = base64.b64decode(secret["data"]["keys.txt"]).decode()
    assert text == (
        f"hmac-sha256 {TEST_SALT.hex()}\n"
        f"{hash_key(TEST_KEYS['reports'], TEST_SALT)} reports\n{hash_key(TEST_KEYS['search'], TEST_SALT)} search\n"
    )
    for key in TEST_KEYS.values():
        assert key not in yaml.safe_dump(secret)


def test_deployment_is_hardened_and_probed() -> None:
    dep = _by_kind(_render_case("full").manifests)["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["sluiceway-pod", "serve", "--config", "/etc/sluiceway/config.yaml",
                            "--termination-log", "/dev/termination-log"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    # Probes on the metrics port, outside the inference port's connection limit.
    assert {c[p]["httpGet"]["port"] for p in ("startupProbe", "livenessProbe", "readinessProbe")} == {"metrics"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {"name": "tmp", "emptyDir": {}} in pod["volumes"]
    assert pod["automountServiceAccountToken"] is False  # user models get no API credentials
    # preStop sleep (endpoints go first), then SIGTERM and the 45s drain, then slack.
    assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert pod["terminationGracePeriodSeconds"] == 5 + 45 + 10
    assert len(dep["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]) == 16


@pytest.mark.parametrize(("name", "replicas"), [("minimal", None), ("promtriggers", None), ("fixed", 3)])
def test_operator_owns_replicas_only_without_autoscaler(name: str, replicas: int | None) -> None:
    rendered = _render_case(name)
    assert rendered.replicas == replicas
    # The Deployment's own apply never carries the count (a separate field manager owns it).
    assert "replicas" not in _by_kind(rendered.manifests)["Deployment"]["spec"]


def test_replicas_apply_holds_only_the_count() -> None:
    from sluiceway_operator.render import build_replicas

    assert build_replicas(Owner("demo", "default", "u"), 3) == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "demo", "namespace": "default"},
        "spec": {"replicas": 3},
    }


def test_builtin_engine_owns_replicas_within_bounds() -> None:
    assert _render_case("builtin", replicas=2).replicas == 2
    assert _render_case("builtin", replicas=9).replicas == 3
    assert _render_case("builtin", replicas=None).replicas == 1


def test_config_change_changes_hash_and_nothing_else_does() -> None:
    cr = load_case("minimal")
    owner = Owner("tiny", "ml", "u")
    base = render(owner, parse_spec(cr["spec"]), {}, ENV)
    same = render(owner, parse_spec(cr["spec"]), {}, ENV)
    assert base.config_hash == same.config_hash
    changed_spec = dict(cr["spec"], timeouts={"queue": "3s"})
    changed = render(owner, parse_spec(changed_spec), {}, ENV)
    assert changed.config_hash != base.config_hash
    # the pods reload keys and tenant limits in place (issue 22 §3): a key alone does not roll them
    rotated = render(owner, parse_spec(cr["spec"]), {"x": hash_key("k", TEST_SALT)}, ENV, salt=TEST_SALT)
    assert rotated.config_hash == base.config_hash


def test_metrics_on_their_own_port() -> None:
    """The pod serves /metrics on 9091 (port name ``metrics``); only the headless ``<name>-metrics``
    Service carries it (issue 23: the client Service exposed every tenant's name), and the
    ServiceMonitor scrapes it there."""
    rendered = _render_case("full")
    kinds = _by_kind(rendered.manifests)
    (c,) = kinds["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9091, "protocol": "TCP"} in c["ports"]
    assert rendered.pod_config.server.metrics_port == 9091
    assert rendered.pod_config.server.port == 8080
    services = {m["metadata"]["name"]: m for m in rendered.manifests if m["kind"] == "Service"}
    assert [p["name"] for p in services["resnet"]["spec"]["ports"]] == ["http"]
    assert services["resnet"]["spec"]["ports"][0]["targetPort"] == "http"
    (metrics,) = services["resnet-metrics"]["spec"]["ports"]
    assert (metrics["name"], metrics["port"], metrics["targetPort"]) == ("metrics", 9091, "metrics")
    (endpoint,) = kinds["ServiceMonitor"]["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")


def test_scaled_object_is_fast_up_slow_down_with_fallback() -> None:
    so = _by_kind(_render_case("full").manifests)["ScaledObject"]["spec"]
    behavior = so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    # The spec's 10m window is held by the scaler alone: HPA 0 + scaler 600 = 600 (not 1200).
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 0
    assert so["triggers"][0]["metadata"]["scaleDownWindowSeconds"] == "600"
    # The scaler paces the scale-down (and releases a long surplus); the HPA follows its answer at
    # once (its default policy, 100 % per 15 s) instead of pacing it a second time.
    assert behavior["scaleDown"]["policies"] == [{"type": "Percent", "value": 100, "periodSeconds": 15}]
    md = so["triggers"][0]["metadata"]
    assert (md["scaleDownMaxPods"], md["scaleDownPeriodSeconds"]) == ("2", "120")
    assert md["scaleDownMaxPercent"] == "2"  # the CRD default, chosen with bench/scalesim
    assert md["scaleDownReleaseWindowSeconds"] == "1800"  # the spec's 30m
    assert so["fallback"]["behavior"] == "currentReplicasIfHigher"
    (trigger,) = so["triggers"]
    # KEDA opens StreamIsActive (the scaler's push path) only for external-push.
    assert trigger["type"] == "external-push"
    assert trigger["metadata"]["scalerAddress"] == "sluiceway-scaler.sluiceway-system.svc:9090"
    assert trigger["metadata"]["targetWaitP95Seconds"] == "0.75"
    assert all(isinstance(v, str) for v in trigger["metadata"].values())
    assert (so["minReplicaCount"], so["maxReplicaCount"]) == (2, 10)


@pytest.mark.parametrize("name", ["full", "minimal", "promtriggers"])
def test_scale_down_windows_add_up_to_the_spec(name: str) -> None:
    rendered = _render_case(name)
    so = _by_kind(rendered.manifests)["ScaledObject"]["spec"]
    spec = parse_spec(load_case(name)["spec"])
    from sluiceway_core.units import parse_duration

    want = parse_duration(spec.autoscaling.scale_down.stabilization_window)
    hpa = so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
    scaler = sum(int(t["metadata"].get("scaleDownWindowSeconds", 0)) for t in so["triggers"])
    assert hpa + scaler == want


@pytest.mark.parametrize("name", ["full", "minimal", "promtriggers"])
def test_only_fields_keda_uses_with_min_replicas_at_least_one(name: str) -> None:
    """KEDA's webhook warns that cooldownPeriod is irrelevant when minReplicaCount >= 1 and that
    pollingInterval is unless useCachedMetrics is on (kedacore/keda#7271): no cooldownPeriod, and
    pollingInterval only with useCachedMetrics on every trigger (issue 23: the interval is live)."""
    so = _by_kind(_render_case(name).manifests)["ScaledObject"]["spec"]
    assert so["minReplicaCount"] >= 1
    assert "cooldownPeriod" not in so
    assert "pollingInterval" in so and all(t.get("useCachedMetrics") is True for t in so["triggers"])


def test_keda_engine_scaler_alone_paces_the_scale_down() -> None:
    """The scaler's pace and release (sluiceway_core.policy steps 4-5) reach the pods only if the
    HPA does not pace again: an HPA at 2 % a minute would hold a released surplus back (the
    simulator's ``ours-keda-hpa-paced`` row, docs/scalesim.md)."""
    so = _by_kind(_render_case("minimal").manifests)["ScaledObject"]["spec"]
    behavior = so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"] == {
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
    }
    # Scale-up stays as the spec says (the CRD defaults: 4 pods or 100 % per 15 s).
    assert behavior["scaleUp"]["policies"] == [
        {"type": "Pods", "value": 4, "periodSeconds": 15},
        {"type": "Percent", "value": 100, "periodSeconds": 15},
    ]
    md = so["triggers"][0]["metadata"]
    assert (md["scaleDownMaxPods"], md["scaleDownMaxPercent"], md["scaleDownPeriodSeconds"]) == ("1", "2", "60")
    assert md["scaleDownReleaseWindowSeconds"] == "1200"  # the CRD default 20m


def test_keda_engine_hpa_follows_every_rise_of_the_scalers_answer() -> None:
    """With engine keda the HPA's scale-up tolerance is 0: the scaler's metric is a replica count it
    has already stabilised, and the HPA's default 10 % dead band let a rising load run the pods above
    the utilisation target (bench/scalesim: long diurnal was dominated with it, docs/scalesim.md).
    Scale-down keeps the HPA's tolerance; KEDA's own triggers (engine prometheus) keep it both ways."""
    keda = _by_kind(_render_case("minimal").manifests)["ScaledObject"]["spec"]
    behavior = keda["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["tolerance"] == "0"
    assert "tolerance" not in behavior["scaleDown"]
    prom = _by_kind(_render_case("promtriggers").manifests)["ScaledObject"]["spec"]
    prom_behavior = prom["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert "tolerance" not in prom_behavior["scaleUp"] and "tolerance" not in prom_behavior["scaleDown"]


def test_release_window_off_renders_zero() -> None:
    spec = parse_spec({**load_case("minimal")["spec"], "autoscaling": {"scaleDown": {"releaseWindow": "0s"}}})
    manifests = render(Owner("tiny", "ml", "u"), spec, {}, ENV).manifests
    (trigger,) = _by_kind(manifests)["ScaledObject"]["spec"]["triggers"]
    assert trigger["metadata"]["scaleDownReleaseWindowSeconds"] == "0"


def test_prometheus_engine_hpa_paces_the_scale_down() -> None:
    """KEDA's own triggers have no pace of their own: the HPA keeps the spec's (no release)."""
    so = _by_kind(_render_case("promtriggers").manifests)["ScaledObject"]["spec"]
    down = so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] == 90  # the CRD default
    assert down["selectPolicy"] == "Max"  # whichever removes more, as the scaler does
    assert down["policies"] == [
        {"type": "Pods", "value": 1, "periodSeconds": 60},
        {"type": "Percent", "value": 2, "periodSeconds": 60},
    ]


def test_prometheus_engine_errors_on_missing_data() -> None:
    """ignoreNullValues false: an empty answer is an error (the HPA holds), never a 0 (scale down)."""
    so = _by_kind(_render_case("promtriggers").manifests)["ScaledObject"]["spec"]
    assert [t["metadata"]["ignoreNullValues"] for t in so["triggers"]] == ["false", "false"]
    assert "fallback" not in so  # KEDA refuses fallback with a Value trigger


def test_prometheus_engine_triggers() -> None:
    so = _by_kind(_render_case("promtriggers").manifests)["ScaledObject"]["spec"]
    depth, wait = so["triggers"]
    assert (depth["metricType"], depth["metadata"]["threshold"]) == ("AverageValue", "8")
    assert 'inferenceservice="bert"' in depth["metadata"]["query"]
    assert (wait["metricType"], wait["metadata"]["threshold"]) == ("Value", "1.5")
    assert "histogram_quantile(0.95" in wait["metadata"]["query"]


def test_optional_children_follow_cluster_capabilities() -> None:
    bare = Environment(keda=False, service_monitor=False)
    kinds = [m["kind"] for m in _render_case("minimal", env=bare).manifests]
    assert kinds == ["ConfigMap", "Secret", "Deployment", "Service", "Service", "PodDisruptionBudget"]
    fixed = _render_case("fixed")
    assert ("keda.sh/v1alpha1", "ScaledObject", "demo") in fixed.absent
    assert ("monitoring.coreos.com/v1", "ServiceMonitor", "demo") in fixed.absent


def test_prometheus_engine_without_address_is_a_spec_error() -> None:
    cr = load_case("promtriggers")
    spec = dict(cr["spec"], autoscaling={"engine": "prometheus"})
    with pytest.raises(SpecError, match="prometheusAddress"):
        render(Owner("bert", "nlp", "u"), parse_spec(spec), {}, ENV)


def test_scaler_tls_uses_the_cluster_trigger_authentication() -> None:
    """With the scaler on mutual TLS, KEDA can only present its client certificate through a
    TriggerAuthentication: the trigger must name the one the chart installs."""
    cr = yaml.safe_load((CASES / "minimal.yaml").read_text())
    owner = Owner(cr["metadata"]["name"], cr["metadata"]["namespace"], "uid-1")
    plain = render(owner, parse_spec(cr["spec"]), {}, Environment(keda=True))
    tls = render(owner, parse_spec(cr["spec"]), {}, Environment(keda=True, scaler_authentication="sluiceway-scaler"))

    def trigger(r: Any) -> dict[str, Any]:
        so = next(m for m in r.manifests if m["kind"] == "ScaledObject")
        return dict(so["spec"]["triggers"][0])

    assert "authenticationRef" not in trigger(plain)
    assert trigger(tls)["authenticationRef"] == {"name": "sluiceway-scaler", "kind": "ClusterTriggerAuthentication"}


def _pod_registry(rendered: Any, tmp_path: Any) -> Any:
    """The pod's own tenant registry, built from the rendered ConfigMap and keys Secret."""
    import base64

    from sluiceway_pod.clock import ManualClock
    from sluiceway_pod.tenancy import TenantRegistry

    by_kind = _by_kind(rendered.manifests)
    cfg = PodConfig.model_validate(yaml.safe_load(by_kind["ConfigMap"]["data"]["config.yaml"]))
    tenants = cfg.tenants
    if tenants.keys_file is not None:  # the Secret's file, where this test can read it
        keys = tmp_path / "keys.txt"
        keys.write_text(base64.b64decode(by_kind["Secret"]["data"]["keys.txt"]).decode())
        tenants = tenants.model_copy(update={"keys_file": str(keys)})
    return TenantRegistry(tenants, cfg.priorities.classes, ManualClock(), default_priority=cfg.priorities.default)


def test_keyed_tenants_without_allow_anonymous_refuse_anonymous_callers(tmp_path: Any) -> None:
    """Issue 10 item 6: with keyed tenants and allowAnonymous unset, the rendered pod refuses a
    request without a key (the operator no longer writes ``allowAnonymous: true``)."""
    from sluiceway_pod.errors import Unauthenticated

    cr = load_case("full")
    del cr["spec"]["access"]["allowAnonymous"]
    spec = parse_spec(cr["spec"])
    assert spec.access.allow_anonymous is None
    owner = Owner("resnet", "vision", "u")
    hashes = {t.name: hash_key(TEST_KEYS[t.name], TEST_SALT) for t in spec.keyed_tenants}
    rendered = render(owner, spec, hashes, ENV, salt=TEST_SALT)
    cm = _by_kind(rendered.manifests)["ConfigMap"]
    assert "allowAnonymous" not in yaml.safe_load(cm["data"]["config.yaml"])["tenants"]
    registry = _pod_registry(rendered, tmp_path)
    with pytest.raises(Unauthenticated):
        registry.authenticate(None)
    assert registry.authenticate(f"Bearer {TEST_KEYS['search']}").name == "search"

    # explicitly on: keyed tenants and anonymous callers both served
    cr["spec"]["access"]["allowAnonymous"] = True
    on = render(owner, parse_spec(cr["spec"]), hashes, ENV, salt=TEST_SALT)
    assert _pod_registry(on, tmp_path).authenticate(None).name == "anonymous"


def test_no_keyed_tenants_keeps_anonymous_access_on(tmp_path: Any) -> None:
    rendered = _render_case("minimal")
    assert parse_spec(load_case("minimal")["spec"]).access.allow_anonymous is None
    assert _pod_registry(rendered, tmp_path).authenticate(None).name == "anonymous"


# ------------------------------------------------------------------ issue 13: shapes and adaptive permits


def test_declared_shapes_and_adaptive_permits_reach_the_pod_config() -> None:
    rendered = _render_case("shapes")
    cm = _by_kind(rendered.manifests)["ConfigMap"]
    cfg = PodConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
    assert cfg == rendered.pod_config
    image, scale = cfg.model.inputs or []
    assert (image.name, image.datatype) == ("image", "FP16")
    assert (image.shape, image.max_shape) == ([-1, 3, -1, -1], [4, 3, 512, 512])
    assert (scale.name, scale.datatype, scale.shape, scale.max_shape) == ("scale", "FP32", [-1, 1], None)
    (mask,) = cfg.model.outputs or []
    assert (mask.name, mask.datatype, mask.shape) == ("mask", "UINT8", [-1, -1, -1])
    c = cfg.concurrency
    assert (c.permits, c.max_permits, c.probe_seconds, c.probe_share, c.adaptive, c.adaptive_interval_seconds) == (
        "auto",
        16,
        3.0,
        0.9,
        True,
        2.0,
    )
    # Without declared tensors the pod keeps the model's own declaration (nothing rendered).
    minimal = _render_case("minimal").pod_config.model
    assert minimal.inputs is None and minimal.outputs is None


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_rendered_max_shape_is_enforced_by_a_real_pod(tmp_path: Any) -> None:
    """The ConfigMap the operator renders, loaded by a real ``sluiceway-pod`` process: a request
    within the declared maxShape is served, one beyond it in any variable dimension gets 400."""
    import httpx
    from podtools import free_port, infer_body, start_pod

    spec = parse_spec(
        {
            "model": {
                "image": "registry.example/sluiceway-pod:test",
                "format": "synthetic",
                "source": "synthetic:1",
                "inputs": [{"name": "INPUT0", "shape": [-1, -1], "maxShape": [4, 8]}],
            },
            "concurrency": {"probeDuration": "0s", "adaptiveInterval": "500ms"},
            "autoscaling": {"engine": "none"},
        }
    )
    rendered = render(Owner("shapes", "ml", "u"), spec, {}, ENV)
    config = yaml.safe_load(_by_kind(rendered.manifests)["ConfigMap"]["data"]["config.yaml"])
    # Only the listen addresses differ from a cluster: flags beat the file (loopback, free ports).
    pod = start_pod(tmp_path, "--metrics-port", str(free_port()), config=config)
    try:
        with httpx.Client(timeout=30) as c:
            meta = c.get(f"{pod.url}/v2/models/shapes").json()
            assert meta["inputs"][0]["shape"] == [-1, -1], meta
            assert c.post(pod.infer_url, json=infer_body(rows=4, cols=8)).status_code == 200
            for rows, cols in ((5, 8), (4, 9)):
                r = c.post(pod.infer_url, json=infer_body(rows=rows, cols=cols))
                assert r.status_code == 400, r.text
                assert "exceeds maxShape [4, 8]" in r.json()["error"], r.text
    finally:
        pod.terminate(30)


# -- spec.gateway (issue 19 §3) ----------------------------------------------------------------------


def _gateway_children(rendered: Any) -> dict[str, dict[str, Any]]:
    return {m["kind"]: m for m in rendered.manifests if m["metadata"]["name"].endswith("-gateway")}


def test_gateway_children_run_the_gateway_cli_on_its_own_config(tmp_path: Any) -> None:
    """The Deployment's command is one ``sluiceway-gateway`` parses, and the ConfigMap is a file its
    loader accepts: EndpointSlices of the pods' Service, the spec's routing, the pods' tenants and
    key-hash file (the same Secret, keys.txt only)."""
    from sluiceway_gateway.cli import parser
    from sluiceway_gateway.config import load_gateway_config

    rendered = _render_case("gateway")
    kinds = _gateway_children(rendered)
    assert list(kinds) == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ]
    dep = kinds["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == ENV.gateway_image
    assert c["command"][0] == "sluiceway-gateway"
    args = parser().parse_args(c["command"][1:])
    assert (args.command, args.config, args.drain_seconds) == ("serve", "/etc/sluiceway/gateway.yaml", 10.0)
    config_file = tmp_path / "gateway.yaml"
    config_file.write_text(kinds["ConfigMap"]["data"]["gateway.yaml"])
    cfg = load_gateway_config(config_file)
    assert cfg.routing == "powerOfTwo"
    assert cfg.watch is not None and (cfg.watch.namespace, cfg.watch.service, cfg.watch.port_name) == (
        "serving",
        "edge",
        "http",
    )
    assert cfg.tenants == rendered.pod_config.tenants  # admission at the edge as the pods have it
    assert cfg.tenants is not None and cfg.tenants.keys_file == "/var/run/secrets/sluiceway/keys.txt"
    assert cfg.priorities.classes == ["interactive", "batch"]
    assert cfg.limits.request_timeout_seconds == 25.0  # timeouts.request 20s + 5s: the pod's 504 first
    keys_volume = next(v for v in pod["volumes"] if v["name"] == "keys")
    assert keys_volume["secret"] == {"secretName": "edge-keys", "items": [{"key": "keys.txt", "path": "keys.txt"}]}
    assert {"name": "keys", "mountPath": "/var/run/secrets/sluiceway", "readOnly": True} in c["volumeMounts"]
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == ("edge-gateway", True)
    assert dep["spec"]["replicas"] == 2
    assert c["resources"] == {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "512Mi"}}


def test_gateway_role_reads_only_endpoint_slices_and_binds_only_its_account() -> None:
    kinds = _gateway_children(_render_case("gateway"))
    assert kinds["Role"]["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}
    ]
    binding = kinds["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "edge-gateway"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "edge-gateway", "namespace": "serving"}]


def test_gateway_pods_and_inference_pods_never_select_each_other() -> None:
    """The pods' Service (what the gateway watches) and PDB select only inference pods; the gateway's
    Service and PDB only gateway pods."""
    rendered = _render_case("gateway")
    gw = _gateway_children(rendered)
    pods = {(m["kind"], m["metadata"]["name"]): m for m in rendered.manifests}
    gateway_pod = gw["Deployment"]["spec"]["template"]["metadata"]["labels"]
    inference_pod = pods[("Deployment", "edge")]["spec"]["template"]["metadata"]["labels"]

    def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in selector.items())

    for key in (("Service", "edge"), ("Service", "edge-metrics")):
        assert selects(pods[key]["spec"]["selector"], inference_pod)
        assert not selects(pods[key]["spec"]["selector"], gateway_pod)
    assert not selects(pods[("PodDisruptionBudget", "edge")]["spec"]["selector"]["matchLabels"], gateway_pod)
    assert selects(gw["Service"]["spec"]["selector"], gateway_pod)
    assert not selects(gw["Service"]["spec"]["selector"], inference_pod)
    assert not selects(gw["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"], inference_pod)


def test_gateway_off_prunes_every_gateway_child() -> None:
    rendered = _render_case("minimal")
    assert not _gateway_children(rendered)
    assert {(a, k, n) for a, k, n in rendered.absent if n == "tiny-gateway"} == {
        ("v1", "ServiceAccount", "tiny-gateway"),
        ("rbac.authorization.k8s.io/v1", "Role", "tiny-gateway"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", "tiny-gateway"),
        ("v1", "ConfigMap", "tiny-gateway"),
        ("apps/v1", "Deployment", "tiny-gateway"),
        ("v1", "Service", "tiny-gateway"),
        ("policy/v1", "PodDisruptionBudget", "tiny-gateway"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute", "tiny-gateway"),  # with the Gateway API CRDs
    }


# -- spec.model.storageUri (issue 22 §1/§2) -----------------------------------------------------------


def _deployment(spec: dict[str, Any], name: str = "scorer") -> dict[str, Any]:
    rendered = render(Owner(name, "models", "u"), parse_spec(spec), {}, ENV)
    dep: dict[str, Any] = next(m for m in rendered.manifests if m["kind"] == "Deployment")
    return dep


def test_storage_initializer_runs_the_pods_fetch_cli_with_credentials_only_from_the_secret(tmp_path: Any) -> None:
    """The init container's command is one ``sluiceway-pod fetch`` parses into the store's options;
    the credentials reach it only as secretKeyRef variables, never as a value anywhere in the
    children; the pods load the fetched directory read-only."""
    from sluiceway_pod.cli import parser
    from sluiceway_pod.fetch import options_from

    rendered = _render_case("storage")
    dep = _by_kind(rendered.manifests)["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["name"] == "storage-initializer" and init["image"] == "registry.example/sluiceway-pod:0.1.0"
    assert init["command"][0] == "sluiceway-pod"
    ns = parser().parse_args(init["command"][1:])
    env = {"AWS_ACCESS_KEY_ID": "AKIDTEST", "AWS_SECRET_ACCESS_KEY": "secret-test-value"}
    opts = options_from(ns, env)
    assert (opts.uri, opts.dest, opts.max_bytes) == ("s3://models/scorer/v3/model.onnx", "/mnt/models", 2 * 1024**3)
    assert (opts.endpoint, opts.region, opts.addressing) == ("http://minio.storage.svc:9000", "eu-west-1", "path")
    assert opts.sha256 == {"": "0f343b0931126a20f133d67c2b018a3b1bbf5e8ec8e1a0f9c1bd3a3e1c5f6a7b"}
    assert ns.termination_log == "/dev/termination-log" and init["terminationMessagePath"] == "/dev/termination-log"
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in init["env"] if "valueFrom" in e}
    assert refs == {
        "AWS_ACCESS_KEY_ID": {"name": "scorer-store", "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": "scorer-store", "key": "AWS_SECRET_ACCESS_KEY"},
        "AWS_SESSION_TOKEN": {"name": "scorer-store", "key": "AWS_SESSION_TOKEN", "optional": True},
    }
    (main,) = pod["containers"]
    assert not [e for e in main["env"] if e["name"].startswith("AWS_")]  # the model's code never gets them
    assert {"name": "model-store", "mountPath": "/mnt/models", "readOnly": True} in main["volumeMounts"]
    assert {"name": "model-store", "emptyDir": {"sizeLimit": "2Gi"}} in pod["volumes"]
    assert rendered.pod_config.model.spec == "/mnt/models"  # the pod loads the one model file in it
    assert "scorer-store" not in yaml.safe_dump(_by_kind(rendered.manifests)["ConfigMap"])


@pytest.mark.parametrize(
    ("model", "want_spec", "volume"),
    [
        (
            {"format": "torchscript", "storageUri": "pvc://weights/resnet/model.pt"},
            "/mnt/models/resnet/model.pt",
            {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}},
        ),
        (
            {"format": "safetensors", "storageUri": "pvc://weights/m.safetensors", "factory": "mypkg.nets:build"},
            "mypkg.nets:build@/mnt/models/m.safetensors",
            {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}},
        ),
        (
            {"format": "safetensors", "storageUri": "https://h.example/m.safetensors", "factory": "mypkg.nets:build"},
            "mypkg.nets:build@/mnt/models/m.safetensors",
            {"name": "model-store", "emptyDir": {"sizeLimit": "10Gi"}},
        ),
        (
            {"format": "pt2", "storageUri": "s3://models/scorer/v1/"},
            "/mnt/models",
            {"name": "model-store", "emptyDir": {"sizeLimit": "10Gi"}},
        ),
        ({"format": "onnx", "source": "/models/scorer.onnx"}, "/models/scorer.onnx", None),
        ({"format": "safetensors", "source": "p.n:b@/models/m.safetensors"}, "p.n:b@/models/m.safetensors", None),
    ],
)
def test_storage_uri_schemes_and_formats_reach_the_pod(
    model: dict[str, Any], want_spec: str, volume: dict[str, Any] | None
) -> None:
    spec = {"model": {"image": "registry.example/p:1", **model}, "resources": {"gpus": 0}}
    rendered = render(Owner("m", "models", "u"), parse_spec(spec), {}, ENV)
    assert rendered.pod_config.model.spec == want_spec
    pod = _by_kind(rendered.manifests)["Deployment"]["spec"]["template"]["spec"]
    if volume is not None:
        assert volume in pod["volumes"]
    assert ("initContainers" in pod) == model.get("storageUri", "").startswith(("s3://", "http"))
    for manifest in rendered.manifests:
        if manifest["apiVersion"] not in ("keda.sh/v1alpha1", "monitoring.coreos.com/v1"):
            kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"format": "onnx"}, "set exactly one of model.source"),
        ({"format": "onnx", "source": "/m.onnx", "storageUri": "s3://models/m.onnx"}, "set exactly one of model"),
        ({"format": "onnx", "storageUri": "https://user:pw@h.example/m.onnx"}, "without user info or query string"),
        ({"format": "onnx", "storageUri": "https://h.example/m.onnx?X-Amz-Signature=a"}, "without user info or query"),
        ({"format": "onnx", "storageUri": "s3://models/../m.onnx"}, "'.' or '..' path segments"),
        ({"format": "safetensors", "storageUri": "s3://models/m.safetensors"}, "needs model.factory"),
        ({"format": "onnx", "storageUri": "https://h.example/m.onnx", "s3": {}}, "model.s3 is only used with an s3://"),
        ({"format": "onnx", "storageUri": "pvc://w/m.onnx", "sha256": "0" * 64}, "model.sha256 is only used"),
        ({"format": "demo", "storageUri": "s3://models/m.onnx"}, "format demo needs model.source"),
        ({"format": "onnx", "source": "model.onnx"}, "does not match format onnx"),
    ],
)
def test_bad_model_sources_are_spec_errors(model: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_spec({"model": {"image": "registry.example/p:1", **model}})


def test_more_than_one_gpu_is_refused() -> None:
    with pytest.raises(SpecError, match="one device until multi-device runners exist"):
        parse_spec({"model": {"image": "i", "format": "demo", "source": "demo"}, "resources": {"gpus": 2}})


# -- spec.pod and spec.rollout (issue 22 §3) -------------------------------------------------------------


def test_pod_template_additions_keep_what_the_operator_owns() -> None:
    """spec.pod adds env, envFrom, volumes, labels, annotations, spread, /dev/shm and drops the ids;
    the command, ports, probes, config/key/tmp mounts, selector labels, hash and hardening stay."""
    base = _by_kind(_render_case("minimal").manifests)["Deployment"]["spec"]["template"]
    dep = _by_kind(_render_case("podtemplate").manifests)["Deployment"]
    tpl = dep["spec"]["template"]
    pod, (c,) = tpl["spec"], tpl["spec"]["containers"]
    (c0,) = base["spec"]["containers"]
    owned_fields = ("command", "ports", "startupProbe", "livenessProbe", "readinessProbe", "lifecycle")
    owned_fields += ("securityContext",)
    for owned in owned_fields:
        assert c[owned] == c0[owned], owned
    assert c["env"][0] == {"name": "HOME", "value": "/tmp"}
    assert {"name": "OMP_NUM_THREADS", "value": "4"} in c["env"]
    assert c["envFrom"] == [{"prefix": "RANKER_", "configMapRef": {"name": "ranker-settings"}}]
    assert c["volumeMounts"][:3] == c0["volumeMounts"]  # config, keys, /tmp first, unchanged
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in pod["volumes"]
    assert {"name": "vocab", "configMap": {"name": "ranker-vocab"}} in pod["volumes"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= tpl["metadata"]["labels"].items()
    assert tpl["metadata"]["labels"]["team"] == "search"
    assert tpl["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] == _render_case("podtemplate").config_hash
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["automountServiceAccountToken"] is False
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_explicit_ids_and_percent_surge() -> None:
    spec = {
        "model": {"image": "i", "format": "demo", "source": "demo"},
        "pod": {"securityContext": {"runAsUser": 1000, "fsGroup": 2000}},
        "rollout": {"maxSurge": "25%", "maxUnavailable": 0},
        "autoscaling": {"engine": "none"},
        "replicas": 8,
    }
    parsed = parse_spec(spec)
    dep = _by_kind(render(Owner("d", "n", "u"), parsed, {}, ENV).manifests)["Deployment"]
    sc = dep["spec"]["template"]["spec"]["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"], sc["fsGroup"], sc["runAsNonRoot"]) == (1000, 65532, 2000, True)
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == "25%"
    assert parsed.rollout.surge_pods(8) == 2 and parsed.rollout.surge_pods(9) == 3  # rounds up, as the Deployment


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        ({"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}, "hostPath and other sources are not allowed"),
        (
            {"volumes": [{"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]},
            "no serviceAccountToken projection",
        ),
        ({"volumes": [{"name": "config", "emptyDir": {}}]}, "are the operator's"),
        ({"volumes": [{"name": "edge", "emptyDir": {}}]}, "are the operator's"),
        (
            {
                "volumes": [{"name": "v", "emptyDir": {}}],
                "volumeMounts": [{"name": "v", "mountPath": "/etc/sluiceway"}],
            },
            "would hide a path the pod needs",
        ),
        ({"volumeMounts": [{"name": "nope", "mountPath": "/data"}]}, "every pod.volumeMounts name must be"),
        ({"env": [{"name": "SLUICEWAY_QUEUE_MAX_DEPTH", "value": "1"}]}, "must not set HOME, POD_NAME or SLUICEWAY_*"),
        ({"labels": {"app.kubernetes.io/name": "x"}}, "must not set app.kubernetes.io/* or sluiceway.io/* keys"),
        ({"annotations": {"sluiceway.io/config-hash": "x"}}, "must not set sluiceway.io/* keys"),
        ({"securityContext": {"platformAssignsIds": True, "runAsUser": 5}}, "platformAssignsIds leaves the ids"),
        ({"envFrom": [{"prefix": "SLUICEWAY_", "configMapRef": {"name": "c"}}]}, "must not start with SLUICEWAY_"),
    ],
)
def test_pod_template_refusals(pod: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_spec({"model": {"image": "i", "format": "demo", "source": "demo"}, "pod": pod})


def test_rollout_needs_surge_or_unavailable() -> None:
    with pytest.raises(SpecError, match="must not both be 0"):
        parse_spec({"model": {"image": "i", "format": "demo", "source": "demo"}, "rollout": {"maxSurge": 0}})


def test_pod_secret_names_are_every_reference() -> None:
    pod = parse_spec(load_case("podtemplate")["spec"]).pod
    assert pod is not None and pod.secret_names() == ["ranker-features"]
    spec = parse_spec(
        {
            "model": {"image": "i", "format": "demo", "source": "demo"},
            "pod": {
                "envFrom": [{"secretRef": {"name": "a"}}],
                "volumes": [
                    {"name": "s", "secret": {"secretName": "b"}},
                    {"name": "p", "projected": {"sources": [{"secret": {"name": "c"}}, {"configMap": {"name": "d"}}]}},
                ],
            },
        }
    )
    assert spec.pod is not None and spec.pod.secret_names() == ["a", "b", "c"]


# -- key rotation without restart (issue 22 §3, the operator's half) ---------------------------------------


def test_keys_and_tenant_limits_do_not_roll_the_pods_but_restart_settings_do() -> None:
    """The pods reload the key file and the config's tenants section in place (the kubelet updates
    mounted Secrets and ConfigMaps): a rotated key, a new keyed tenant or a changed rate must not
    change the pod template's config hash; a setting read only at start (the queue timeout) must."""
    cr = load_case("full")
    owner = Owner("resnet", "vision", "u")
    spec = parse_spec(cr["spec"])
    hashes = {t.name: hash_key(TEST_KEYS[t.name], TEST_SALT) for t in spec.keyed_tenants}
    base = render(owner, spec, hashes, ENV, salt=TEST_SALT)
    rotated = render(owner, spec, {**hashes, "search": hash_key("a-new-key", TEST_SALT)}, ENV, salt=TEST_SALT)
    assert rotated.config_hash == base.config_hash
    assert rotated.manifests[1] != base.manifests[1]  # the Secret changed, in place
    tenants = [dict(t) for t in cr["spec"]["tenants"]]
    tenants[0]["rate"] = "1/s"
    tenants.append({"name": "newcomer", "keySecretRef": {"name": "newcomer-key"}, "rate": "2/s"})
    limits = parse_spec({**cr["spec"], "tenants": tenants})
    more = {**hashes, "newcomer": hash_key("newcomer-key-value", TEST_SALT)}
    changed = render(owner, limits, more, ENV, salt=TEST_SALT)
    assert changed.config_hash == base.config_hash
    assert changed.manifests[0] != base.manifests[0]  # the ConfigMap changed, in place
    restart = parse_spec({**cr["spec"], "timeouts": {**cr["spec"]["timeouts"], "queue": "3s"}})
    assert render(owner, restart, hashes, ENV, salt=TEST_SALT).config_hash != base.config_hash


# -- the edge token, the NetworkPolicy, the gateway scraped (issue 19 §2-§3) -----------------------


def _gateway_render(env: Environment = ENV, edge_token: str | None = TEST_EDGE_TOKEN, **patch: Any) -> Any:
    cr = load_case("gateway")
    spec = parse_spec({**cr["spec"], **patch})
    hashes = {t.name: hash_key(TEST_KEYS[t.name], TEST_SALT) for t in spec.keyed_tenants}
    return render(Owner("edge", "serving", "u"), spec, hashes, env, salt=TEST_SALT, edge_token=edge_token)


def _named(rendered: Any, kind: str, name: str) -> dict[str, Any] | None:
    return next((m for m in rendered.manifests if (m["kind"], m["metadata"]["name"]) == (kind, name)), None)


def test_edge_token_is_derived_from_the_quota_key_mounted_in_both_and_named_in_both_configs() -> None:
    import base64
    import dataclasses
    import hashlib
    import hmac

    from operator_support import TEST_QUOTA_KEY
    from sluiceway_core.edge import DEFAULT_TOKEN_FILE
    from sluiceway_gateway.config import GatewayConfig

    keyed = dataclasses.replace(ENV, quota_key=TEST_QUOTA_KEY)
    rendered = _gateway_render(keyed, edge_token="ignored-when-the-operator-has-a-key-000000")
    secret = _named(rendered, "Secret", "edge-edge")
    assert secret is not None and secret["type"] == "Opaque" and list(secret["data"]) == ["token"]
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert token == hmac.new(TEST_QUOTA_KEY, b"edge:serving/edge", hashlib.sha256).hexdigest()
    other = _named(
        render(
            Owner("edge", "other-ns", "u"),
            parse_spec(load_case("gateway")["spec"]),
            {t: hash_key(k, TEST_SALT) for t, k in TEST_KEYS.items()},
            keyed,
            salt=TEST_SALT,
        ),
        "Secret",
        "edge-edge",
    )
    assert other is not None and base64.b64decode(other["data"]["token"]).decode() != token  # per service
    # mounted (no subPath: a rotation reaches running pods) in the pods and the gateway
    for dep_name in ("edge", "edge-gateway"):
        dep = _named(rendered, "Deployment", dep_name)
        assert dep is not None
        pod = dep["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert {"name": "edge", "mountPath": "/etc/sluiceway/edge", "readOnly": True} in c["volumeMounts"], dep_name
        assert not any("subPath" in m for m in c["volumeMounts"] if m["name"] == "edge")
        # the pods get the token only; the gateway the whole Secret (its quota token too, when leasing)
        items = {"items": [{"key": "token", "path": "token"}]} if dep_name == "edge" else {}
        assert {"name": "edge", "secret": {"secretName": "edge-edge", **items}} in pod["volumes"], dep_name
    assert rendered.pod_config.edge is not None and rendered.pod_config.edge.token_file == DEFAULT_TOKEN_FILE
    gw_cm = _named(rendered, "ConfigMap", "edge-gateway")
    assert gw_cm is not None
    gw = GatewayConfig.model_validate(yaml.safe_load(gw_cm["data"]["gateway.yaml"]))
    assert gw.edge is not None and gw.edge.token_file == "/etc/sluiceway/edge/token"
    # the token itself is in the Secret only: no ConfigMap, no other child carries it
    for m in rendered.manifests:
        if m is not secret:
            assert token not in yaml.safe_dump(m), m["kind"]


def test_edge_token_without_a_quota_key_is_the_callers_and_none_is_a_spec_error() -> None:
    import base64

    rendered = _gateway_render(edge_token="kept-token-" + "a" * 40)
    secret = _named(rendered, "Secret", "edge-edge")
    assert secret is not None and base64.b64decode(secret["data"]["token"]).decode() == "kept-token-" + "a" * 40
    with pytest.raises(SpecError, match="edge token"):
        _gateway_render(edge_token=None)


def test_without_the_gateway_no_edge_secret_field_mount_or_network_policy() -> None:
    rendered = _render_case("minimal")
    assert not [
        m for m in rendered.manifests if m["kind"] in ("Secret", "NetworkPolicy") and "edge" in m["metadata"]["name"]
    ]
    assert not [m for m in rendered.manifests if m["kind"] == "NetworkPolicy"]
    assert rendered.pod_config.edge is None
    assert "edge" not in rendered.manifests[0]["data"]["config.yaml"]
    dep = _named(rendered, "Deployment", "tiny")
    assert dep is not None
    assert all(v["name"] != "edge" for v in dep["spec"]["template"]["spec"]["volumes"])
    assert ("networking.k8s.io/v1", "NetworkPolicy", "tiny") in rendered.absent
    assert ("v1", "Service", "tiny-gateway-metrics") in rendered.absent


def test_network_policy_admits_only_the_gateway_to_the_inference_port() -> None:
    rendered = _gateway_render()
    pol = _named(rendered, "NetworkPolicy", "edge")
    assert pol is not None
    inference = _named(rendered, "Deployment", "edge")
    gateway = _named(rendered, "Deployment", "edge-gateway")
    assert inference is not None and gateway is not None

    def selects(selector: dict[str, str], dep: dict[str, Any]) -> bool:
        labels = dep["spec"]["template"]["metadata"]["labels"]
        return all(labels.get(k) == v for k, v in selector.items())

    spec = pol["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert selects(spec["podSelector"]["matchLabels"], inference)
    assert not selects(spec["podSelector"]["matchLabels"], gateway)
    http, metrics = spec["ingress"]
    assert http["ports"] == [{"port": "http", "protocol": "TCP"}]
    (peer,) = http["from"]
    assert list(peer) == ["podSelector"]  # this namespace only, the gateway's pods only
    assert selects(peer["podSelector"]["matchLabels"], gateway)
    assert not selects(peer["podSelector"]["matchLabels"], inference)
    assert metrics == {"ports": [{"port": "metrics", "protocol": "TCP"}]}  # probes, Prometheus: as without it
    off = _gateway_render(gateway={**load_case("gateway")["spec"]["gateway"], "networkPolicy": False})
    assert _named(off, "NetworkPolicy", "edge") is None
    assert ("networking.k8s.io/v1", "NetworkPolicy", "edge") in off.absent


def test_the_service_monitor_scrapes_the_gateway_with_the_pods_labels() -> None:
    """The one ServiceMonitor selects the gateway's headless metrics Service too; its relabelings give
    the gateway's series inferenceservice (pod label) and component="gateway"."""
    import re as _re

    rendered = _gateway_render()
    sm = _named(rendered, "ServiceMonitor", "edge")
    svc = _named(rendered, "Service", "edge-gateway-metrics")
    pods_svc = _named(rendered, "Service", "edge-metrics")
    gateway = _named(rendered, "Deployment", "edge-gateway")
    inference = _named(rendered, "Deployment", "edge")
    assert sm is not None and svc is not None and pods_svc is not None and gateway is not None and inference
    want = sm["spec"]["selector"]["matchLabels"]
    for s in (svc, pods_svc):
        assert all(s["metadata"]["labels"].get(k) == v for k, v in want.items())
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9091, "targetPort": "metrics", "protocol": "TCP"}]
    gw_labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert all(gw_labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    pod_labels = inference["spec"]["template"]["metadata"]["labels"]
    assert not all(pod_labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    (endpoint,) = sm["spec"]["endpoints"]
    relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    assert relabel["inferenceservice"]["sourceLabels"] == ["__meta_kubernetes_pod_label_sluiceway_io_inferenceservice"]
    comp = relabel["component"]
    src = comp["sourceLabels"][0].removeprefix("__meta_kubernetes_pod_label_")
    # Prometheus anchors the regex; only the gateway's pods get the label
    assert _re.fullmatch(
        comp["regex"], gw_labels[next(k for k in gw_labels if _re.sub(r"[^A-Za-z0-9]", "_", k) == src)]
    )
    assert not _re.fullmatch(
        comp["regex"], pod_labels[next(k for k in pod_labels if _re.sub(r"[^A-Za-z0-9]", "_", k) == src)]
    )
    assert comp["replacement"] == "gateway"


def test_pods_behind_the_gateway_are_labelled_for_the_charts_network_policy() -> None:
    """The chart's optional policy (http from the whole namespace) selects sluiceway pods without
    ``sluiceway.io/behind-gateway``; NetworkPolicies add up, so it must not select the pods the
    operator's own policy closes to all but the gateway."""
    labels = lambda r: _named(r, "Deployment", "edge")["spec"]["template"]["metadata"]["labels"]  # noqa: E731
    assert labels(_gateway_render())["sluiceway.io/behind-gateway"] == "true"
    off = _gateway_render(gateway={**load_case("gateway")["spec"]["gateway"], "networkPolicy": False})
    assert "sluiceway.io/behind-gateway" not in labels(off)
    dep = _named(_render_case("minimal"), "Deployment", "tiny")
    assert dep is not None and "sluiceway.io/behind-gateway" not in dep["spec"]["template"]["metadata"]["labels"]


def test_keys_and_tenant_limits_do_not_roll_the_gateway_but_its_restart_settings_do() -> None:
    """The gateway reloads its key file and its config's tenants section in place, as the pods do
    (gateway/sluiceway_gateway/reload.py): a rotated key or a changed rate keeps its pod template;
    a setting it reads only at start (routing) rolls it."""
    cr = load_case("gateway")
    owner = Owner("edge", "serving", "u")

    def gateway_hash(spec_patch: dict[str, Any], extra_keys: dict[str, str] | None = None) -> str:
        spec = parse_spec({**cr["spec"], **spec_patch})
        hashes = {t.name: hash_key(TEST_KEYS[t.name], TEST_SALT) for t in spec.keyed_tenants}
        rendered = render(owner, spec, {**hashes, **(extra_keys or {})}, ENV, salt=TEST_SALT,
                          edge_token=TEST_EDGE_TOKEN)
        dep = _named(rendered, "Deployment", "edge-gateway")
        assert dep is not None
        return str(dep["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION])

    base = gateway_hash({})
    first = cr["spec"]["tenants"][0]["name"]
    assert gateway_hash({}, {first: hash_key("a-rotated-key", TEST_SALT)}) == base
    tenants = [dict(t) for t in cr["spec"]["tenants"]]
    tenants[0]["rate"] = "1/s"
    assert gateway_hash({"tenants": tenants}) == base
    other = "random" if cr["spec"]["gateway"].get("routing") != "random" else "leastWait"
    assert gateway_hash({"gateway": {**cr["spec"]["gateway"], "routing": other}}) != base


def _render_with_startup(name: str, startup: dict[str, Any] | None) -> Any:
    cr = load_case(name)
    spec = parse_spec(cr["spec"])
    owner = Owner(cr["metadata"]["name"], cr["metadata"]["namespace"], f"uid-{name}")
    hashes = {t.name: hash_key(TEST_KEYS[t.name], TEST_SALT) for t in spec.keyed_tenants}
    return render(owner, spec, hashes, ENV, replicas=2, salt=TEST_SALT, edge_token=TEST_EDGE_TOKEN, startup=startup)


def _gateway_startup(rendered: Any) -> float | None:
    from sluiceway_gateway.config import GatewayConfig

    cm = next(m for m in rendered.manifests if m["metadata"]["name"].endswith("-gateway") and m["kind"] == "ConfigMap")
    return GatewayConfig.model_validate(yaml.safe_load(cm["data"]["gateway.yaml"])).hold.startup_seconds


def test_scale_to_zero_renders_min_replica_count_zero_and_the_cooldown() -> None:
    """Issue 20: ``minReplicas: 0`` is KEDA's ``minReplicaCount: 0`` and ``scaleToZeroAfter`` its
    ``cooldownPeriod`` (before: the scale-down window, 300 s, whatever the spec said); the scaler's
    trigger carries the same bounds; the fallback never asks for 0 pods."""
    so = _by_kind(_render_case("scaletozero").manifests)["ScaledObject"]["spec"]
    assert so["minReplicaCount"] == 0
    assert so["cooldownPeriod"] == 600
    md = so["triggers"][0]["metadata"]
    assert (md["minReplicas"], md["maxReplicas"]) == ("0", "4")
    assert so["fallback"]["replicas"] == 1


def test_the_measured_start_up_is_the_gateways_estimate_and_a_new_one_rolls_nothing() -> None:
    """``hold.startupSeconds`` is ``status.startup.totalSeconds`` (rounded up to a whole second), or
    ``gateway.startupEstimate`` until one is measured, or absent. A new measurement changes the
    gateway's ConfigMap only (which the gateway reloads in place): both Deployments, and so their
    pods, stay byte for byte what they were."""
    estimate = _render_with_startup("scaletozero", None)
    measured = _render_with_startup("scaletozero", {"totalSeconds": 7.593, "phases": {"loaded": 7.0}})
    later = _render_with_startup("scaletozero", {"totalSeconds": 31.2})
    assert (_gateway_startup(estimate), _gateway_startup(measured), _gateway_startup(later)) == (40.0, 8.0, 32.0)
    assert _gateway_startup(_render_with_startup("gateway", None)) is None  # no estimate, none measured
    assert _gateway_startup(_render_with_startup("gateway", {"totalSeconds": 0.2})) == 1.0
    for garbage in ({"totalSeconds": "soon"}, {"totalSeconds": float("nan")}, {"totalSeconds": True}, {}):
        assert _gateway_startup(_render_with_startup("scaletozero", garbage)) == 40.0
    for a, b in ((estimate, measured), (measured, later)):
        changed = [(m["kind"], m["metadata"]["name"]) for m, n in zip(a.manifests, b.manifests, strict=True) if m != n]
        assert changed == [("ConfigMap", "idle-gateway")]


# -- spec.gateway.hold (issue 20) and the HTTPRoute (issue 19 §3) -------------------------------------


def _gateway_config(rendered: Any) -> Any:
    from sluiceway_gateway.config import build_gateway_config

    cm = next(m for m in rendered.manifests if m["metadata"]["name"].endswith("-gateway") and m["kind"] == "ConfigMap")
    return build_gateway_config(yaml.safe_load(cm["data"]["gateway.yaml"]))


def test_hold_bounds_reach_the_gateways_hold_config_exactly() -> None:
    """``spec.gateway.hold`` is read by the gateway's own loader as its ``hold`` section: the bytes
    as a count, the tenant share as a fraction, retryAfter in seconds; the operator's start-up
    estimate stays where it was (``startupSeconds``). Without ``hold`` the gateway's defaults are
    written out (the spec's defaults are the gateway's)."""
    from sluiceway_gateway.config import HoldConfig

    hold = _gateway_config(_render_case("edgeroute")).hold
    assert hold == HoldConfig(
        max_requests=200,
        max_bytes=256 * 1024**2,
        tenant_share=0.25,
        handoff_queue_per_pod=2,
        retry_after_seconds=10.0,
        startup_seconds=30.0,
    )
    assert _gateway_config(_render_case("gateway")).hold == HoldConfig()
    assert _gateway_config(_render_case("scaletozero")).hold == HoldConfig(startup_seconds=40.0)
    off = _gateway_config(_gateway_render(gateway={"enabled": True, "hold": {"maxRequests": 0}})).hold
    assert off.max_requests == 0 and not off.enabled


def test_a_hold_bound_change_rolls_the_gateway() -> None:
    """The gateway reads its hold bounds only at start (gateway/sluiceway_gateway/reload.py reloads
    ``startupSeconds`` alone), so a new bound changes its pod template's config hash; the default
    written out does not."""
    gw = load_case("gateway")["spec"]["gateway"]

    def gateway_hash(rendered: Any) -> str:
        dep = _named(rendered, "Deployment", "edge-gateway")
        assert dep is not None
        return str(dep["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION])

    base = gateway_hash(_gateway_render())
    for hold in ({"maxRequests": 10}, {"maxBytes": "1Mi"}, {"tenantSharePercent": 90}, {"retryAfter": "1s"}):
        assert gateway_hash(_gateway_render(gateway={**gw, "hold": hold})) != base, hold
    assert gateway_hash(_gateway_render(gateway={**gw, "hold": {"maxBytes": "64Mi", "retryAfter": "5s"}})) == base


def test_http_route_to_the_gateways_service_owned_and_pruned() -> None:
    """With parentRefs (and the Gateway API CRD): an HTTPRoute ``<name>-gateway`` whose only backend
    is the gateway's Service on its http port, owned by the InferenceService; without parentRefs it
    is pruned; without the CRD it is neither rendered nor pruned (nothing to call)."""
    rendered = _render_case("edgeroute")
    route = _named(rendered, "HTTPRoute", "routed-gateway")
    assert route is not None and route["apiVersion"] == "gateway.networking.k8s.io/v1"
    service = _named(rendered, "Service", "routed-gateway")
    assert service is not None
    (port,) = service["spec"]["ports"]
    assert route["spec"]["rules"] == [
        {"backendRefs": [{"group": "", "kind": "Service", "name": "routed-gateway", "port": port["port"]}]}
    ]
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public"},
        {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": "shared-edge",
            "namespace": "infra",
            "sectionName": "https",
            "port": 443,
        },
    ]
    assert route["spec"]["hostnames"] == ["models.example.com", "*.models.example.com"]
    (ref,) = route["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["controller"]) == ("InferenceService", "routed", True)
    assert ("gateway.networking.k8s.io/v1", "HTTPRoute", "routed-gateway") not in rendered.absent

    spec = load_case("edgeroute")["spec"]
    without = {**spec, "gateway": {k: v for k, v in spec["gateway"].items() if k != "httpRoute"}}
    owner = Owner("routed", "serving", "u")
    pruned = render(owner, parse_spec(without), {}, ENV, edge_token=TEST_EDGE_TOKEN)
    assert _named(pruned, "HTTPRoute", "routed-gateway") is None
    assert ("gateway.networking.k8s.io/v1", "HTTPRoute", "routed-gateway") in pruned.absent
    no_hosts = {**spec, "gateway": {**spec["gateway"], "httpRoute": {"parentRefs": [{"name": "public"}]}}}
    hostless = render(owner, parse_spec(no_hosts), {}, ENV, edge_token=TEST_EDGE_TOKEN)
    route = _named(hostless, "HTTPRoute", "routed-gateway")
    assert route is not None and "hostnames" not in route["spec"]

    import dataclasses

    no_crd = dataclasses.replace(ENV, http_route=False)
    for s in (spec, without):
        r = render(owner, parse_spec(s), {}, no_crd, edge_token=TEST_EDGE_TOKEN)
        assert _named(r, "HTTPRoute", "routed-gateway") is None
        assert all(kind != "HTTPRoute" for _, kind, _ in r.absent)
