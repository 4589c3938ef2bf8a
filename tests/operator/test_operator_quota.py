"""Service-wide tenant quotas (issue 11), the operator's part: the settings, the pod config's
``quota`` section and ``POD_NAME``, and the per-tenant status (spec quota next to the admitted rate
Prometheus shows over all pods).

The signals test answers the operator's PromQL from a small HTTP server on loopback that speaks the
Prometheus query API (an extra unit test of the wiring; the real Prometheus path of the same
queries is test_operator_prometheus.py).
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from operator_support import TEST_KEYS, TEST_QUOTA_KEY, TEST_SALT, load_case, load_crd
from sluiceway_core.config import PodConfig
from sluiceway_core.keys import hash_key
from sluiceway_core.quota import QuotaError
from sluiceway_core.quota_charter import verify_charter
from sluiceway_core.signals import Queries
from sluiceway_core.urls import UrlAllowList
from sluiceway_operator.policy import Policy
from sluiceway_operator.prom import PrometheusError, query_vector
from sluiceway_operator.reconcile import Reconciler
from sluiceway_operator.render import Environment, Owner, render
from sluiceway_operator.settings import OperatorConfig, config_from_env
from sluiceway_operator.spec import parse_spec
from sluiceway_operator.status import Observed, TenantQuota, compute_status
from test_operator_reconcile_unit import FakeKube

COORDINATOR = "http://sluiceway-scaler.sluiceway-system.svc:9092"
QUOTA_ENV = Environment(keda=True, quota_coordinator_url=COORDINATOR, quota_lease_seconds=4.0, quota_key=TEST_QUOTA_KEY)


def _render(case: str, env: Environment, **patch: Any) -> Any:
    cr = load_case(case)
    cr["spec"].update(copy.deepcopy(patch))
    spec = parse_spec(cr["spec"])
    owner = Owner(cr["metadata"]["name"], cr["metadata"]["namespace"], "uid-q")
    hashes = {t.name: hash_key(TEST_KEYS[t.name], TEST_SALT) for t in spec.keyed_tenants}
    return render(owner, spec, hashes, env, salt=TEST_SALT)


def _parts(rendered: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    by_kind = {m["kind"]: m for m in rendered.manifests}
    config = yaml.safe_load(by_kind["ConfigMap"]["data"]["config.yaml"])
    (container,) = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"]
    return config, container


def test_settings_read_the_coordinator_from_the_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(TEST_QUOTA_KEY + b"\n")
    cfg = config_from_env(
        {
            "SLUICEWAY_QUOTA_COORDINATOR_URL": COORDINATOR,
            "SLUICEWAY_QUOTA_LEASE_SECONDS": "5",
            "SLUICEWAY_QUOTA_KEY_FILE": str(key_file),
        }
    )
    assert (cfg.quota_coordinator_url, cfg.quota_lease_seconds, cfg.quota_key) == (COORDINATOR, 5.0, TEST_QUOTA_KEY)
    assert TEST_QUOTA_KEY.decode() not in repr(cfg)  # the key is never printed
    bare = config_from_env({})
    assert (bare.quota_coordinator_url, bare.quota_lease_seconds) == (None, 3.0)
    for bad in ("soon", "0.1", "120"):
        with pytest.raises(ValueError, match=r"SLUICEWAY_QUOTA_LEASE_SECONDS must be seconds within 0\.5\.\.60"):
            config_from_env({"SLUICEWAY_QUOTA_LEASE_SECONDS": bad})
    with pytest.raises(ValueError, match="SLUICEWAY_QUOTA_COORDINATOR_URL must be an http"):
        config_from_env({"SLUICEWAY_QUOTA_COORDINATOR_URL": "sluiceway-scaler:9092"})


def test_the_coordinator_without_a_readable_key_is_refused_at_start(tmp_path: Path) -> None:
    """Issue 18 item 2: no unsigned charters. Failed before the fix: config_from_env accepted it."""
    with pytest.raises(ValueError, match="SLUICEWAY_QUOTA_KEY_FILE"):
        config_from_env({"SLUICEWAY_QUOTA_COORDINATOR_URL": COORDINATOR})
    with pytest.raises(ValueError, match="cannot read the quota key file"):
        config_from_env({"SLUICEWAY_QUOTA_COORDINATOR_URL": COORDINATOR, "SLUICEWAY_QUOTA_KEY_FILE": "/nonexistent"})
    short = tmp_path / "short"
    short.write_bytes(b"too-short")
    with pytest.raises(ValueError, match="fewer than 32 bytes"):
        config_from_env({"SLUICEWAY_QUOTA_COORDINATOR_URL": COORDINATOR, "SLUICEWAY_QUOTA_KEY_FILE": str(short)})


def test_the_charter_is_signed_into_the_secret_and_nowhere_else() -> None:
    """The pod's Secret carries the charter's signature under quota-token (verified by the
    coordinator's rule, verify_charter); the ConfigMap, the Deployment and the status never do."""
    rendered = _render("full", QUOTA_ENV)
    by_kind = {m["kind"]: m for m in rendered.manifests}
    config, _ = _parts(rendered)
    token = base64.b64decode(by_kind["Secret"]["data"]["quota-token"]).decode()
    charter = verify_charter(TEST_QUOTA_KEY, config["quota"]["charter"], token)
    assert charter.service == "vision/resnet" and charter.max_pods == 11
    with pytest.raises(QuotaError):
        verify_charter(b"another-key-of-at-least-32-bytes-long", config["quota"]["charter"], token)
    for kind, manifest in by_kind.items():
        if kind != "Secret":
            assert token not in json.dumps(manifest), kind
    # A changed quota is a changed charter, hence a changed signature.
    more = _render("full", QUOTA_ENV, tenants=[{"name": "search", "keySecretRef": {"name": "k"}, "rate": "200/s"}])
    other = base64.b64decode(next(m for m in more.manifests if m["kind"] == "Secret")["data"]["quota-token"])
    assert other.decode() != token
    # Without a coordinator: no token.
    plain = _render("full", Environment(keda=True))
    assert "quota-token" not in next(m for m in plain.manifests if m["kind"] == "Secret")["data"]


def test_the_reconciler_keeps_the_token_out_of_status_events_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    kube = FakeKube()
    kube.read_secret_value = lambda namespace, name, key: "k"  # type: ignore[method-assign]
    config = OperatorConfig(quota_coordinator_url=COORDINATOR, quota_key=TEST_QUOTA_KEY, policy=Policy.open())
    body = {
        "metadata": {"name": "a", "namespace": "n", "uid": "u1", "generation": 1},
        "spec": {
            "model": {"image": "i:1", "format": "demo", "source": "demo"},
            "autoscaling": {"engine": "none"},
            "tenants": [{"name": "t", "keySecretRef": {"name": "s"}, "rate": "20/s"}],
        },
    }
    with caplog.at_level(logging.DEBUG):
        Reconciler(config, kube).apply_children(body)  # type: ignore[arg-type]
    secret = next(m for kind, m in kube.applied_manifests if kind == "Secret")
    token = base64.b64decode(secret["data"]["quota-token"]).decode()
    assert len(token) == 64
    assert token not in json.dumps(kube.status) + json.dumps(kube.events) + caplog.text


def test_the_operator_refuses_a_bad_setting_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluiceway_operator.cli import main

    monkeypatch.setenv("SLUICEWAY_QUOTA_LEASE_SECONDS", "soon")
    with pytest.raises(SystemExit, match="sluiceway-operator: SLUICEWAY_QUOTA_LEASE_SECONDS"):
        main(["run"])


def test_tenant_limits_with_a_coordinator_render_the_quota_section_and_pod_name() -> None:
    rendered = _render("full", QUOTA_ENV)
    config, container = _parts(rendered)
    assert config["quota"] == {
        "coordinatorUrl": COORDINATOR,
        "service": "vision/resnet",
        "leaseSeconds": 4.0,
        "assumedReplicas": 10,  # maxReplicas: pods started without a lease never exceed the quota together
        "tokenFile": "/var/run/secrets/sluiceway/quota-token",
        "charter": {
            "service": "vision/resnet",
            "quotas": {"search": {"rate": 100.0, "burst": 200, "maxConcurrent": 8}},
            "maxPods": 11,  # maxReplicas + the rollout's surge
        },
    }
    q = PodConfig.model_validate(config).quota
    assert q is not None and q.coordinator_url == COORDINATOR and q.service == "vision/resnet"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    deployment = next(m for m in rendered.manifests if m["kind"] == "Deployment")
    kubernetes_validate.validate(deployment, "1.34.0", strict=True)


def test_fixed_replicas_are_the_assumed_count() -> None:
    limits = {"access": {"defaults": {"rate": "10/s"}}, "autoscaling": {"engine": "none"}, "replicas": 3}
    config, _ = _parts(_render("minimal", QUOTA_ENV, **limits))
    assert config["quota"]["assumedReplicas"] == 3


@pytest.mark.parametrize(
    ("case", "env", "patch"),
    [
        ("full", Environment(keda=True), {}),  # no coordinator: every pod enforces the whole quota
        ("minimal", QUOTA_ENV, {}),  # no limits to share
        ("minimal", QUOTA_ENV, {"access": {"defaults": {"weight": 3, "maxQueued": 5}}}),  # no rate/concurrency
    ],
)
def test_no_quota_section_without_a_coordinator_or_limits(case: str, env: Environment, patch: dict[str, Any]) -> None:
    config, container = _parts(_render(case, env, **patch))
    assert "quota" not in config
    assert all(e["name"] != "POD_NAME" for e in container["env"])


def test_default_limits_alone_are_shared_too() -> None:
    config, _ = _parts(_render("minimal", QUOTA_ENV, access={"defaults": {"maxConcurrent": 2}}))
    assert config["quota"]["service"] == "ml/tiny"
    assert config["quota"]["assumedReplicas"] == 4  # the CRD's default maxReplicas


# ------------------------------------------------------------------------------------------ status


def _obs(**kw: Any) -> Observed:
    base: dict[str, Any] = dict(
        generation=1, endpoint="http://a.n.svc:8080", engine="none", spec_replicas=1, spec_permits="auto"
    )
    base.update(kw)
    return Observed(**base)


QUOTAS = (TenantQuota("search", "100/s", 8), TenantQuota("reports", None, None))


def test_status_shows_each_tenants_quota_next_to_its_admitted_rate() -> None:
    st = compute_status(
        _obs(tenant_quotas=QUOTAS, quota_scope="service", tenant_admitted={"search": 97.46, "anonymous": 0.5}),
        None,
        "T",
    )
    assert st["quotaScope"] == "service"
    assert st["tenants"] == [
        {"name": "anonymous", "admittedRate": "0.5/s"},
        {"name": "reports", "admittedRate": "0/s"},
        {"name": "search", "quotaRate": "100/s", "maxConcurrent": 8, "admittedRate": "97.5/s"},
    ]
    # Prometheus unknown: the quotas alone, no invented rates
    st = compute_status(_obs(tenant_quotas=QUOTAS, quota_scope="pod"), None, "T")
    assert st["tenants"] == [{"name": "reports"}, {"name": "search", "quotaRate": "100/s", "maxConcurrent": 8}]
    # tenants the spec does not list (anonymous, other) are held to access.defaults
    st = compute_status(
        _obs(tenant_quotas=QUOTAS, default_quota=TenantQuota("", "5/s", None), tenant_admitted={"anonymous": 4.0}),
        None,
        "T",
    )
    assert st["tenants"][0] == {"name": "anonymous", "quotaRate": "5/s", "admittedRate": "4/s"}
    bare = compute_status(_obs(), None, "T")
    assert bare["tenants"] is None and bare["quotaScope"] is None  # null: the merge patch removes them


def test_the_crd_status_schema_holds_the_tenant_rows() -> None:
    status = load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    st = compute_status(_obs(tenant_quotas=QUOTAS, quota_scope="service", tenant_admitted={"search": 1.0}), None, "T")
    assert set(st) <= set(status)
    rows = status["tenants"]["items"]["properties"]
    for row in st["tenants"]:
        assert set(row) <= set(rows)
    for prop in (*rows.values(), status["tenants"], status["quotaScope"]):
        assert prop.get("description"), prop


# ------------------------------------------------------------------------------- signals wiring


class _PromAPI(BaseHTTPRequestHandler):
    answers: dict[str, list[dict[str, Any]]] = {}
    seen: list[str] = []

    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
        self.seen.append(query)
        result = self.answers.get(query, [])
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def prom() -> Iterator[tuple[str, type[_PromAPI]]]:
    handler = type("Prom", (_PromAPI,), {"answers": {}, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def _sample(tenant: str, value: str) -> dict[str, Any]:
    return {"metric": {"tenant": tenant}, "value": [0, value]}


def test_query_vector_maps_a_label_to_values(prom: tuple[str, type[_PromAPI]]) -> None:
    url, handler = prom
    handler.answers["q"] = [_sample("a", "1.5"), _sample("b", "NaN"), {"metric": {}, "value": [0, "2"]}]
    allow = UrlAllowList.build("test", [url, "http://127.0.0.1:9"])
    assert query_vector(url, "q", "tenant", allow=allow) == {"a": 1.5}
    assert query_vector(url, "empty", "tenant", allow=allow) == {}
    with pytest.raises(PrometheusError):
        query_vector("http://127.0.0.1:9", "q", "tenant", allow=allow, timeout=2)


def test_signals_loop_publishes_service_wide_admitted_rates(prom: tuple[str, type[_PromAPI]]) -> None:
    url, handler = prom
    q = Queries.build("n", "a")
    handler.answers[q.tenant_admitted_rate] = [_sample("t", "19.96"), _sample("anonymous", "0")]
    kube = FakeKube()
    kube.read_secret_value = lambda namespace, name, key: "k"  # type: ignore[method-assign]
    reconciler = Reconciler(
        OperatorConfig(
            prometheus_url=url, quota_coordinator_url=COORDINATOR, quota_key=TEST_QUOTA_KEY, policy=Policy.open()
        ),
        kube,
    )
    body = {
        "metadata": {"name": "a", "namespace": "n", "uid": "u1", "generation": 1},
        "spec": {
            "model": {"image": "i:1", "format": "demo", "source": "demo"},
            "autoscaling": {"engine": "none"},
            "tenants": [{"name": "t", "keySecretRef": {"name": "s"}, "rate": "20/s", "maxConcurrent": 2}],
        },
    }
    reconciler.apply_children(body)
    assert kube.status["quotaScope"] == "service"
    assert kube.status["tenants"] == [{"name": "t", "quotaRate": "20/s", "maxConcurrent": 2}]
    outcome = reconciler.refresh_signals(body)
    assert outcome is not None and outcome.tenant_admitted == {"t": 19.96, "anonymous": 0.0}
    assert q.tenant_admitted_rate in handler.seen
    assert kube.status["tenants"] == [
        {"name": "anonymous", "admittedRate": "0/s"},
        {"name": "t", "quotaRate": "20/s", "maxConcurrent": 2, "admittedRate": "20/s"},
    ]


def test_gateway_replicas_lease_the_edge_charter_signed_into_the_edge_secret_only() -> None:
    """Issue 19: with the coordinator and the gateway, the gateway's config carries a ``quota`` section
    under ``<ns>/<name>.edge`` (rate and burst only, at most replicas + 1 participants, the gateway's
    replica count as the fallback divisor) whose signature is the ``quota-token`` key of
    ``<name>-edge``, mounted in the gateway only (the pods mount the ``token`` key alone); each
    gateway pod knows its name (``POD_NAME``). Without the coordinator there is no ``quota``."""
    rendered = _render("gateway", QUOTA_ENV)
    named = {(m["kind"], m["metadata"]["name"]): m for m in rendered.manifests}
    gw_config = yaml.safe_load(named[("ConfigMap", "edge-gateway")]["data"]["gateway.yaml"])
    quota = gw_config["quota"]
    from sluiceway_gateway.config import GatewayConfig

    parsed = GatewayConfig.model_validate(gw_config).quota  # what the gateway reads
    assert parsed is not None and parsed.service == "serving/edge.edge" and parsed.assumed_replicas == 2
    assert quota["coordinatorUrl"] == COORDINATOR
    edge_secret = named[("Secret", "edge-edge")]["data"]
    token = base64.b64decode(edge_secret["quota-token"]).decode()
    charter = verify_charter(TEST_QUOTA_KEY, quota["charter"], token)
    assert charter.max_pods == 3 and {t: (q.rate, q.bucket, q.max_concurrent) for t, q in charter.quotas.items()} == {
        "search": (50.0, 100, None), "reports": (5.0, 5, None)}
    # the pods' own charter is another service: the two lease pools never mix
    pods_config = yaml.safe_load(named[("ConfigMap", "edge-config")]["data"]["config.yaml"])
    assert pods_config["quota"]["service"] == "serving/edge" != charter.service
    gw_pod = named[("Deployment", "edge-gateway")]["spec"]["template"]["spec"]
    (container,) = gw_pod["containers"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    assert quota["tokenFile"] == "/etc/sluiceway/edge/quota-token"
    assert next(v for v in gw_pod["volumes"] if v["name"] == "edge")["secret"] == {"secretName": "edge-edge"}
    pods_volumes = named[("Deployment", "edge")]["spec"]["template"]["spec"]["volumes"]
    pods_edge = next(v for v in pods_volumes if v["name"] == "edge")
    assert pods_edge["secret"]["items"] == [{"key": "token", "path": "token"}]
    for (kind, _name), manifest in named.items():
        if kind != "Secret":
            assert token not in json.dumps(manifest), kind
    bare_env = Environment(keda=True, quota_key=TEST_QUOTA_KEY)  # a key, no coordinator
    bare = {(m["kind"], m["metadata"]["name"]): m for m in _render("gateway", bare_env).manifests}
    assert "quota" not in yaml.safe_load(bare[("ConfigMap", "edge-gateway")]["data"]["gateway.yaml"])
    assert "quota-token" not in bare[("Secret", "edge-edge")]["data"]
