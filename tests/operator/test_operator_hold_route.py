"""``spec.gateway.hold`` and ``spec.gateway.httpRoute`` against a real control plane.

The CRD (issue 20): the hold queue's bounds are accepted with the gateway's defaults and refused
out of bounds with the CRD's messages; what the API server stores renders into a ``hold`` section
the gateway's own loader reads. The HTTPRoute (issue 19 §3): the operator runs for real under the
chart's least-privilege rules; without the Gateway API CRDs it reports ``HTTPRouteReady=False``
(``GatewayAPINotInstalled``) and applies the rest; with ``httproutes.gateway.networking.k8s.io``
from ``sigs.k8s.io/gateway-api`` (tools/fetch-gateway-api.sh) it server-side applies the HTTPRoute
to the gateway's Service, owned by the InferenceService, and prunes it when the field goes.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubetools import (
    KEDA_STANDIN_CRD,
    ROOT,
    Admin,
    ControlPlane,
    establish_crd,
    operator_kubeconfig,
    run_operator,
    wait_for,
)
from operator_support import TEST_EDGE_TOKEN, load_crd
from sluiceway_operator.kube import ApiError, Kube
from sluiceway_operator.render import Environment, Owner, render
from sluiceway_operator.spec import parse_spec

pytestmark = [pytest.mark.apiserver, pytest.mark.slow, pytest.mark.timeout(300)]

NS = "sluiceway-route"
OP_NS = "sluiceway-system"
GVP = f"/apis/sluiceway.io/v1alpha1/namespaces/{NS}/inferenceservices"
ROUTE_CRD = "httproutes.gateway.networking.k8s.io"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def _gateway_api_dir() -> Path:
    out = subprocess.run(
        ["bash", str(ROOT / "tools" / "fetch-gateway-api.sh"), "--dir"], capture_output=True, text=True, check=False
    )
    d = Path(out.stdout.strip())
    if out.returncode != 0:
        pytest.skip(f"the Gateway API CRDs are not fetched into {d}: run tools/fetch-gateway-api.sh (scripts/setup.sh)")
    return d


@pytest.fixture(scope="module")
def admin(control_plane: ControlPlane) -> Iterator[Admin]:
    a = Admin(Kube(control_plane.client()))
    establish_crd(a, load_crd())
    establish_crd(a, KEDA_STANDIN_CRD)
    for ns in (NS, OP_NS):
        if a.get(f"/api/v1/namespaces/{ns}") is None:
            a.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    yield a
    if a.get(f"{CRD_PATH}/{ROUTE_CRD}") is not None:  # leave the session's control plane as found
        a.call("DELETE", f"{CRD_PATH}/{ROUTE_CRD}")
        wait_for(lambda: a.get(f"{CRD_PATH}/{ROUTE_CRD}") is None, 60, what="the HTTPRoute CRD deleted")


def _isvc(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"image": "registry.example/sluiceway-pod:test", "format": "synthetic", "source": "synthetic:10"}
    }
    base.update(spec)
    return {"apiVersion": "sluiceway.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": name}, "spec": base}


def _path(name: str = "") -> str:
    return f"{GVP}/{name}" if name else GVP


def _cond(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any] | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


# ------------------------------------------------------------------------------------- the CRD

ON = {"enabled": True}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"gateway": {**ON, "hold": {"maxBytes": "256Mi"}}},
            "gateway.hold.maxBytes must be less than gateway.resources.memory",
        ),
        (
            {"gateway": {**ON, "hold": {"maxBytes": 268435456}}},
            "gateway.hold.maxBytes must be less than gateway.resources.memory",
        ),
        (
            {"gateway": {**ON, "hold": {"maxBytes": "17Gi"}, "resources": {"memory": "64Gi"}}},
            "gateway.hold.maxBytes must be a quantity within [0, 16Gi]",
        ),
        ({"gateway": {**ON, "hold": {"maxBytes": "-1Mi"}}}, "spec.gateway.hold.maxBytes"),
        ({"gateway": {**ON, "hold": {"maxBytes": "lots"}}}, "spec.gateway.hold.maxBytes"),
        ({"gateway": {**ON, "hold": {"maxRequests": -1}}}, "spec.gateway.hold.maxRequests"),
        ({"gateway": {**ON, "hold": {"maxRequests": 1000001}}}, "spec.gateway.hold.maxRequests"),
        ({"gateway": {**ON, "hold": {"tenantSharePercent": 0}}}, "spec.gateway.hold.tenantSharePercent"),
        ({"gateway": {**ON, "hold": {"tenantSharePercent": 101}}}, "spec.gateway.hold.tenantSharePercent"),
        ({"gateway": {**ON, "hold": {"handoffQueuePerPod": 10001}}}, "spec.gateway.hold.handoffQueuePerPod"),
        ({"gateway": {**ON, "hold": {"retryAfter": "0s"}}}, "gateway.hold.retryAfter must be within [1s, 1h]"),
        ({"gateway": {**ON, "hold": {"retryAfter": "2h"}}}, "gateway.hold.retryAfter must be within [1s, 1h]"),
        ({"gateway": {**ON, "hold": {"retryAfter": "1.5s"}}}, "spec.gateway.hold.retryAfter"),
        (
            {"autoscaling": {"minReplicas": 0}, "gateway": {**ON, "hold": {"maxRequests": 0}}},
            "autoscaling.minReplicas 0 needs gateway.hold.maxRequests and gateway.hold.maxBytes above 0",
        ),
        (
            {"autoscaling": {"minReplicas": 0}, "gateway": {**ON, "hold": {"maxBytes": 0}}},
            "autoscaling.minReplicas 0 needs gateway.hold.maxRequests and gateway.hold.maxBytes above 0",
        ),
        (
            {"autoscaling": {"minReplicas": 0}, "gateway": {**ON, "hold": {"maxBytes": "0Mi"}}},
            "autoscaling.minReplicas 0 needs gateway.hold.maxRequests and gateway.hold.maxBytes above 0",
        ),
        ({"gateway": {"httpRoute": {"parentRefs": [{"name": "g"}]}}}, "gateway.httpRoute needs gateway.enabled: true"),
        (
            {"gateway": {**ON, "httpRoute": {"hostnames": ["a.example"]}}},
            "gateway.httpRoute.hostnames needs parentRefs",
        ),
        ({"gateway": {**ON, "httpRoute": {"parentRefs": []}}}, "spec.gateway.httpRoute.parentRefs"),
        (
            {"gateway": {**ON, "httpRoute": {"parentRefs": [{"name": "Bad_Name"}]}}},
            "spec.gateway.httpRoute.parentRefs[0].name",
        ),
        ({"gateway": {**ON, "httpRoute": {"parentRefs": [{"name": "g", "port": 0}]}}}, "parentRefs[0].port"),
        (
            {"gateway": {**ON, "httpRoute": {"parentRefs": [{"sectionName": "s"}]}}},
            "parentRefs[0].name: Required value",
        ),
        (
            {"gateway": {**ON, "httpRoute": {"parentRefs": [{"name": "g"}], "hostnames": ["a..b"]}}},
            "httpRoute.hostnames[0]",
        ),
        ({"gateway": {**ON, "httpRoute": {"parentRefs": [{"name": "g"}] * 33}}}, "spec.gateway.httpRoute.parentRefs"),
    ],
)
def test_crd_refuses_bad_hold_and_route_with_the_message(admin: Admin, spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiError) as info:
        admin.create(_path(), _isvc("bad", **spec), dry_run=True)
    assert info.value.status == 422
    assert message in str(info.value)


def test_crd_defaults_the_hold_to_the_gateways_and_the_stored_spec_renders_it(admin: Admin) -> None:
    """What the API server stores (its defaults: the gateway's own) and what a user sets reach the
    gateway's config as its loader reads it (``sluiceway_gateway.config``)."""
    from sluiceway_gateway.config import HoldConfig, build_gateway_config

    def stored_hold(gateway: dict[str, Any], **spec: Any) -> Any:
        stored = admin.create(_path(), _isvc("hold", gateway=gateway, **spec), dry_run=True)["spec"]
        rendered = render(Owner("hold", NS, "u"), parse_spec(stored), {}, Environment(), edge_token=TEST_EDGE_TOKEN)
        cm = next(m for m in rendered.manifests if (m["kind"], m["metadata"]["name"]) == ("ConfigMap", "hold-gateway"))
        return stored["gateway"]["hold"], build_gateway_config(yaml.safe_load(cm["data"]["gateway.yaml"])).hold

    spec_hold, hold = stored_hold(ON)
    assert spec_hold == {
        "maxRequests": 1024,
        "maxBytes": "64Mi",
        "tenantSharePercent": 50,
        "handoffQueuePerPod": 1,
        "retryAfter": "5s",
    }
    assert hold == HoldConfig()
    custom = {
        "maxRequests": 0,
        "maxBytes": 1000000000,
        "tenantSharePercent": 100,
        "handoffQueuePerPod": 0,
        "retryAfter": "1h",
    }
    spec_hold, hold = stored_hold({**ON, "hold": custom, "resources": {"memory": "2Gi"}})
    assert spec_hold == custom
    assert hold == HoldConfig(
        max_requests=0, max_bytes=10**9, tenant_share=1.0, handoff_queue_per_pod=0, retry_after_seconds=3600.0
    )
    _, hold = stored_hold({**ON, "hold": {"maxBytes": "16Gi"}, "resources": {"memory": "17Gi"}})
    assert hold.max_bytes == 16 * 1024**3
    # scale to zero with the hold on; the route's fields as written (another namespace's Gateway
    # is only a reference: its allowedRoutes decide)
    route = {
        "parentRefs": [{"name": "public"}, {"name": "edge", "namespace": "infra", "sectionName": "https", "port": 443}],
        "hostnames": ["m.example.com", "*.example.org"],
    }
    stored = admin.create(
        _path(), _isvc("zero", autoscaling={"minReplicas": 0}, gateway={**ON, "httpRoute": route}), dry_run=True
    )["spec"]
    assert stored["gateway"]["httpRoute"] == route
    # off, nothing is held: the memory rule does not apply
    admin.create(_path(), _isvc("off", gateway={"hold": {"maxBytes": "1Gi"}}), dry_run=True)


# ------------------------------------------------------------------------------------ the operator


#: An HTTPRoute CRD as Gateway API before v1.0 had it: v1beta1 only (schema-less stand-in).
OLD_ROUTE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    # a *.k8s.io group needs this annotation (the real CRD carries it too)
    "metadata": {
        "name": ROUTE_CRD,
        "annotations": {"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/gateway-api/pull/891"},
    },
    "spec": {
        "group": "gateway.networking.k8s.io",
        "scope": "Namespaced",
        "names": {"kind": "HTTPRoute", "plural": "httproutes", "singular": "httproute", "listKind": "HTTPRouteList"},
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}


def _route(admin: Admin, name: str) -> dict[str, Any] | None:
    return admin.get(f"/apis/gateway.networking.k8s.io/v1/namespaces/{NS}/httproutes/{name}")  # type: ignore[no-any-return]


def test_http_route_applied_owned_pruned_and_a_missing_crd_is_a_condition(
    control_plane: ControlPlane, admin: Admin
) -> None:
    crds = _gateway_api_dir()
    if admin.get(f"{CRD_PATH}/{ROUTE_CRD}") is not None:
        admin.call("DELETE", f"{CRD_PATH}/{ROUTE_CRD}")
        wait_for(lambda: admin.get(f"{CRD_PATH}/{ROUTE_CRD}") is None, 30, what="the HTTPRoute CRD deleted")
    kubeconfig = operator_kubeconfig(control_plane, admin, OP_NS)
    route = {
        "parentRefs": [{"name": "public"}, {"name": "shared", "namespace": "infra", "sectionName": "https"}],
        "hostnames": ["models.example.com"],
    }
    admin.create(_path(), _isvc("routed", autoscaling={"engine": "none"}, gateway={**ON, "httpRoute": route}))
    uid = admin.get(_path("routed"))["metadata"]["uid"]

    # 1. No Gateway API: a condition with the reason; everything else applied; no retry storm.
    log_a = control_plane.workdir / "operator-route-a.log"
    started = time.monotonic()
    with run_operator(kubeconfig, log_a, NS, "--drift-interval", "2", "--signals-interval", "2"):
        cond = wait_for(
            lambda: (c := _cond(admin.get(_path("routed")), "HTTPRouteReady")) and c["status"] == "False" and c,
            60,
            what="HTTPRouteReady=False",
        )
        assert cond["reason"] == "GatewayAPINotInstalled"
        assert ROUTE_CRD in cond["message"]
        assert admin.get(f"/api/v1/namespaces/{NS}/services/routed-gateway") is not None
        valid = _cond(admin.get(_path("routed")), "ConfigValid")
        assert valid is not None and valid["status"] == "True"
        time.sleep(5)  # two more drift repairs: the same condition, never a failing apply retried
        again = _cond(admin.get(_path("routed")), "HTTPRouteReady")
        assert again is not None and again["lastTransitionTime"] == cond["lastTransitionTime"]
        ran = time.monotonic() - started
    text = log_a.read_text(errors="replace")
    # no HTTPRoute call at all (nothing to apply, nothing to prune), and the CRD looked up once per
    # cache period (Kube.crd_exists, 30 s), not once per reconcile: no retry storm
    assert "/apis/gateway.networking.k8s.io/" not in text and "TemporaryError" not in text, text[-3000:]
    lookups = text.count(f"customresourcedefinitions/{ROUTE_CRD}")
    print(f"HTTPRoute CRD lookups by the operator in {ran:.0f} s without the CRD: {lookups}")
    assert 1 <= lookups <= 2 + int(ran // 30), lookups

    # 1b. An HTTPRoute CRD that serves no v1 (Gateway API before v1.0): the same condition, no
    # apply to a version that is not served (a 404 retried forever).
    establish_crd(admin, OLD_ROUTE_CRD)
    log_old = control_plane.workdir / "operator-route-old.log"
    with run_operator(kubeconfig, log_old, NS, "--drift-interval", "2", "--signals-interval", "2"):
        time.sleep(6)  # a fresh operator's first spec pass and two drift repairs
        cond = _cond(admin.get(_path("routed")), "HTTPRouteReady")
        assert cond is not None and (cond["status"], cond["reason"]) == ("False", "GatewayAPINotInstalled")
        assert "serves no v1" in cond["message"]
    text = log_old.read_text(errors="replace")
    assert "/apis/gateway.networking.k8s.io/" not in text and "TemporaryError" not in text, text[-3000:]
    admin.call("DELETE", f"{CRD_PATH}/{ROUTE_CRD}")
    wait_for(lambda: admin.get(f"{CRD_PATH}/{ROUTE_CRD}") is None, 60, what="the v1beta1-only CRD deleted")

    # 2. The CRD installed (a fresh operator: its CRD cache is new): the route, applied and owned.
    establish_crd(admin, yaml.safe_load((crds / "gateway.networking.k8s.io_httproutes.yaml").read_text()))
    log_b = control_plane.workdir / "operator-route-b.log"
    with run_operator(kubeconfig, log_b, NS, "--drift-interval", "2", "--signals-interval", "2"):
        obj = wait_for(lambda: _route(admin, "routed-gateway"), 60, what="the HTTPRoute")
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("InferenceService", "routed", uid, True)
        managers = {m["manager"] for m in obj["metadata"]["managedFields"] if m["operation"] == "Apply"}
        assert managers == {"sluiceway-operator"}
        (rule,) = obj["spec"]["rules"]
        (backend,) = rule["backendRefs"]
        assert (backend["kind"], backend["name"], backend["port"]) == ("Service", "routed-gateway", 8080)
        service = admin.get(f"/api/v1/namespaces/{NS}/services/routed-gateway")
        assert service["spec"]["ports"][0]["port"] == backend["port"]
        assert [(p["name"], p.get("namespace"), p.get("sectionName")) for p in obj["spec"]["parentRefs"]] == [
            ("public", None, None),
            ("shared", "infra", "https"),
        ]
        assert obj["spec"]["hostnames"] == ["models.example.com"]
        wait_for(
            lambda: (c := _cond(admin.get(_path("routed")), "HTTPRouteReady")) and c["status"] == "True",
            30,
            what="HTTPRouteReady=True",
        )
        # 3. The field removed: the route pruned, the condition gone.
        admin.call("PATCH", _path("routed"), body=[{"op": "remove", "path": "/spec/gateway/httpRoute"}])
        wait_for(lambda: _route(admin, "routed-gateway") is None, 30, what="the HTTPRoute pruned")
        wait_for(lambda: _cond(admin.get(_path("routed")), "HTTPRouteReady") is None, 30, what="no HTTPRouteReady")
        assert admin.get(f"/api/v1/namespaces/{NS}/services/routed-gateway") is not None  # the gateway stays
    admin.call("DELETE", _path("routed"))
